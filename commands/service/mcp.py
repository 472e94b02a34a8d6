"""The plane's MCP gate over streamable HTTP: ``POST /mcp`` (docs/service.md, "MCP over
HTTP").

An agent's MCP client connects to ``{service}/mcp`` with ``Authorization: Bearer
TOKEN`` on every request, instead of launching ``evidence mcp proxy`` as the agent's
user: the plane key and the database stay with the service. The app (``app.py``)
checks each request as it checks the JSON routes — the bearer token, the in-flight
bound, the credential (401 / 403 / 503, nothing appended) — and hands it, with the
credential's plan, to the official SDK's transport (``StreamableHTTPSessionManager``)
and this module's MCP server, whose handlers call the plane (``commands.plane.mcp_gate``)
in the service's worker threads with a pooled plane.

The transport is **stateless, with JSON answers**: every POST is one JSON-RPC message
answered on its own (no ``Mcp-Session-Id``, no SSE stream, no GET), so any of several
services on one PostgreSQL can answer any request, each request carries (and is
checked with) its credential, and no stream holds a slot of the in-flight bound open.
The gate keeps no state between requests: the plan, the registry and the sandbox are
the ledger's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import mcp_types as types
import sqlalchemy.exc
from starlette.types import Receive, Scope, Send

import ledger
from commands.plane.core import Plane
from commands.plane.mcp_gate import GateCall, gate_call, offered_tools
from commands.plane.proxy_verbs import INSTRUCTIONS
from ledger.errors import LedgerOpenError
from ledger.intake import LIMITS

from .routes import Outcome

# The SDK's ``mcp`` package is imported where the gate is built, not here: importing it
# loads uvicorn's command line (click) through ``sse_starlette``, and importing the
# service loads no CLI framework (tests/test_service.py); a running service has uvicorn
# loaded anyway. ``mcp_types`` (the protocol's types) loads neither.
if TYPE_CHECKING:
    from mcp.server.lowlevel import Server
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

__all__ = ["SCOPE_PLAN", "SCOPE_SLOT", "McpGate", "Slot"]

T = TypeVar("T")
log = logging.getLogger("evidence.service")
SERVER_NAME = "evidence-plane"
# Where the app leaves what it checked for the handlers: the ASGI scope of the request,
# which the SDK's transport hands each handler (``ctx.request``).
SCOPE_PLAN = "evidence.plan"
SCOPE_SLOT = "evidence.slot"


class Slot:
    """One request's place in the in-flight bound, held until the request has been
    answered *and* every plane operation it started has finished (a client that goes
    away does not stop a worker thread: its slot is kept until the thread ends). Used on
    the event loop's thread only."""

    def __init__(self, free: Callable[[], None]) -> None:
        self._free = free
        self._holders = 1  # the request itself

    def hold(self) -> None:
        self._holders += 1

    def release(self) -> None:
        self._holders -= 1
        if self._holders == 0:
            self._free()


class Host(Protocol):
    """What the gate needs of the service (``app.Service``)."""

    async def in_thread(self, fn: Callable[[Plane], T]) -> T: ...

    def count(self, outcome: Outcome) -> None: ...


class McpGate:
    """The MCP server the service offers at ``/mcp``, and its transport."""

    def __init__(self, host: Host) -> None:
        from mcp.server.lowlevel import Server
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        self.host = host
        self.server: Server[Any] = Server(
            SERVER_NAME,
            version=ledger.__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )
        self.manager: StreamableHTTPSessionManager = StreamableHTTPSessionManager(
            self.server,
            json_response=True,
            stateless=True,
            # The same cap as every body an agent sends (the SDK answers 413 beyond it).
            max_request_body_size=LIMITS["agent"].cap,
            # No DNS-rebinding check of Host and Origin: every request needs the bearer
            # credential, which a page in a browser does not hold; and behind a reverse
            # proxy the Host is the proxy's to set.
            security_settings=None,
        )

    def running(self) -> AbstractAsyncContextManager[None]:
        """The transport's life (its task group): entered in the app's lifespan."""
        return self.manager.run()

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one checked request (``SCOPE_PLAN`` and ``SCOPE_SLOT`` in its scope)."""
        await self.manager.handle_request(scope, receive, send)

    # -- the handlers ---------------------------------------------------------------------

    async def _plane(self, ctx: Any, fn: Callable[[Plane, str], T]) -> T:
        """``fn(plane, the credential's plan)`` in a worker thread, holding the
        request's slot until the thread ends."""
        from mcp.shared.exceptions import MCPError

        scope = getattr(ctx.request, "scope", None) or {}
        plan_id, slot = scope.get(SCOPE_PLAN), scope.get(SCOPE_SLOT)
        if not isinstance(plan_id, str) or not isinstance(slot, Slot):
            # Never: the app checks every request before the transport sees it.
            raise MCPError(code=types.INTERNAL_ERROR, message="the request was not checked")
        slot.hold()
        try:
            return await self.host.in_thread(lambda plane: fn(plane, plan_id))
        except MCPError:
            raise
        except Exception as exc:  # the database, a defect: a JSON-RPC error, logged
            raise MCPError(code=types.INTERNAL_ERROR, message=_internal(exc)) from exc
        finally:
            slot.release()

    async def list_tools(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = await self._plane(ctx, offered_tools)
        return types.ListToolsResult(tools=tools)

    async def call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        arguments: Any = params.arguments if params.arguments is not None else {}
        meta = params.meta

        def operate(plane: Plane, plan_id: str) -> GateCall:
            return gate_call(plane, plan_id, params.name, arguments, meta)

        called = await self._plane(ctx, operate)
        self.host.count(Outcome({}, gates=called.gates, validation=called.validation))
        if called.result is None:  # the tool's server could not serve the call
            from mcp.shared.exceptions import MCPError

            raise MCPError(code=types.INTERNAL_ERROR, message=called.fault or "no result")
        return called.result


def _internal(exc: BaseException) -> str:
    """The message of the JSON-RPC error for what broke a handler (the log says more)."""
    if isinstance(exc, LedgerOpenError | sqlalchemy.exc.DBAPIError):
        log.warning("database error on /mcp: %s", exc)
        return "the database does not answer; retry later"
    log.error("internal error on /mcp", exc_info=exc)
    return f"internal error ({type(exc).__name__}); see the service's log"
