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

The transport is **stateless**: every POST is one JSON-RPC message answered on its own
(no ``Mcp-Session-Id``, no GET stream), so any of several services on one PostgreSQL can
answer any request, each request carries (and is checked with) its credential, and no
stream outlives its request's slot of the in-flight bound. The gate keeps no state
between requests: the plan, the registry and the sandbox are the ledger's.

Two doors share it:

- ``/mcp``: every MCP tool of the plan by its registered name, JSON answers.
- ``/mcp/{server}``: one registered server as an MCP client configured with that server
  itself expects it (``mcp_gate.server_tools``): its tools under its own names, its
  resources, prompts, completions and log level forwarded to the plan's server. A tool
  call is answered as an SSE stream when the client accepts one, carrying the server's
  log and progress messages while the call runs (``Backchannel``: the call runs in a
  worker thread and the server on the warm servers' loop; ``send`` brings each message
  to this loop in order); a client that accepts only JSON gets the result alone.
  A client that accepts event streams gets an MCP session (the SDK's, served only to
  the credential that opened it): during a call, the server's sampling and elicitation
  requests are asked of the agent's client on the call's stream and its answers given
  back (``Backchannel.ask``, from the warm servers' loop to this one). Without a
  session (a stateless request) they are refused and recorded. A request of the
  stateless revision (2026-07-28) is answered in it: the plane speaks it to the server
  too, a server's questions come back as ``input_required`` with a ``requestState`` the
  door seals (``seal_rounds``: bound to the request and to who asked) around the
  server's own and the round it answers, and a retry's answers are recorded, once per
  round, before the server has them (``commands.plane.input_rounds``). Resource
  subscriptions are not declared: no stream outlives a request (a GET is 405).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import warnings
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio
import mcp_types as types
import sqlalchemy.exc
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

import ledger
from commands.plane.core import Plane
from commands.plane.mcp_answers import forwarded_meta
from commands.plane.mcp_gate import (
    Forwarded,
    GateCall,
    asked_of,
    gate_call,
    offered_tools,
    round_of,
    server_call,
    server_request,
    server_tools,
)
from commands.plane.proxy_verbs import INSTRUCTIONS
from commands.runner.mcp_client import (
    ASKABLE,
    BACKCHANNEL,
    Backchannel,
    Declined,
    Resume,
    answers_of,
)
from ledger import LedgerError
from ledger.errors import LedgerOpenError
from ledger.intake import LIMITS

from .routes import Outcome

# The SDK's ``mcp`` package is imported where the gate is built, not here: importing it
# loads uvicorn's command line (click) through ``sse_starlette``, and importing the service
# loads no CLI framework (tests/commands/service/test_service.py); a running service has
# uvicorn loaded anyway. ``mcp_types`` (the protocol's types) loads neither.
if TYPE_CHECKING:
    from mcp.server.lowlevel import Server
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

__all__ = ["SCOPE_PLAN", "SCOPE_SERVER", "SCOPE_SLOT", "McpGate", "Slot", "session_owner"]

T = TypeVar("T")
log = logging.getLogger("evidence.service")
SERVER_NAME = "evidence-plane"
# Where the app leaves what it checked for the handlers: the ASGI scope of the request,
# which the SDK's transport hands each handler (``ctx.request``).
SCOPE_PLAN = "evidence.plan"
SCOPE_SLOT = "evidence.slot"
SCOPE_SERVER = "evidence.server"  # /mcp/{server}: the server's name
SESSION_IDLE_S = 600.0  # a server door's MCP session unused this long ends
STATE_TTL_S = 600.0  # a door's requestState is answered within this, or asked anew
CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"  # 2026-07-28 envelope
MAX_SESSIONS = 1000
R = TypeVar("R", bound=BaseModel)


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
    """The MCP servers the service offers at ``/mcp`` and ``/mcp/{server}``, and their
    transports."""

    def __init__(self, host: Host, *, sessions: bool = True) -> None:
        from mcp.server.lowlevel import Server

        self.host = host
        self.server: Server[Any] = Server(
            SERVER_NAME,
            version=ledger.__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )
        # One server's door: what it forwards is declared whatever the server declares
        # (an initialize may reach any service, which starts no server for it); a
        # server without it answers the forwarded request with its own error. (The SDK
        # warns that logging is deprecated in 2026-07-28: the door speaks 2025-11-25.)
        from mcp.shared.exceptions import MCPDeprecationWarning

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            self.door = self._door()
        self.manager = _manager(self.server, json_response=True)
        # A client that accepts event streams gets a session (Mcp-Session-Id): a
        # server's request during a call is asked of it on the call's stream and its
        # answer comes back on the session (``Backchannel.ask``).
        self.door_sse = _manager(self.door, json_response=False, stateless=not sessions)
        self.door_json = _manager(self.door, json_response=True)

    def _door(self) -> Server[Any]:
        from mcp.server.lowlevel import Server

        return Server(
            SERVER_NAME,
            version=ledger.__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=self.door_tools,
            on_call_tool=self.door_call,
            on_list_resources=self._forwarding(
                types.ListResourcesRequest, types.ListResourcesResult
            ),
            on_list_resource_templates=self._forwarding(
                types.ListResourceTemplatesRequest, types.ListResourceTemplatesResult
            ),
            on_read_resource=self._forwarding(types.ReadResourceRequest, types.ReadResourceResult),
            on_list_prompts=self._forwarding(types.ListPromptsRequest, types.ListPromptsResult),
            on_get_prompt=self._forwarding(types.GetPromptRequest, types.GetPromptResult),
            on_completion=self._forwarding(types.CompleteRequest, types.CompleteResult),
            on_set_logging_level=self._forwarding(types.SetLevelRequest, types.EmptyResult),
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The transports' life (their task groups): entered in the app's lifespan."""
        async with self.manager.run(), self.door_sse.run(), self.door_json.run():
            yield

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one checked request (``SCOPE_PLAN`` and ``SCOPE_SLOT`` in its scope, and
        ``SCOPE_SERVER`` at one server's door)."""
        if scope.get(SCOPE_SERVER) is None:
            await self.manager.handle_request(scope, receive, send)
            return
        from mcp.server.streamable_http import check_accept_headers
        from starlette.requests import Request

        _json, sse = check_accept_headers(Request(scope))
        door = self.door_sse if sse else self.door_json
        await door.handle_request(scope, receive, send)

    # -- the handlers ---------------------------------------------------------------------

    async def _plane(self, ctx: Any, fn: Callable[[Plane, str], T]) -> T:
        """``fn(plane, the credential's plan)`` in a worker thread, holding the
        request's slot until the thread ends."""
        from mcp.shared.exceptions import MCPError

        scope = _scope(ctx)
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
    ) -> types.CallToolResult | types.InputRequiredResult:
        arguments: Any = params.arguments if params.arguments is not None else {}
        meta = params.meta

        def operate(plane: Plane, plan_id: str) -> GateCall:
            return gate_call(plane, plan_id, params.name, arguments, meta)

        # As at a server's door: for an agent of the stateless revision the server's
        # questions are answered as input_required (this door has no stream: a request
        # of 2025-11-25 offers nothing to ask, and a question is refused and recorded).
        async with _relayed(ctx, meta, _resumed(ctx, params, rounds=True)):
            called = await self._plane(ctx, operate)
        return self._answer(called)

    def _answer(self, called: GateCall) -> types.CallToolResult | types.InputRequiredResult:
        self.host.count(Outcome({}, gates=called.gates, validation=called.validation))
        if called.result is None:  # the tool's server could not serve the call
            from mcp.shared.exceptions import MCPError

            raise MCPError(code=types.INTERNAL_ERROR, message=called.fault or "no result")
        return called.result

    # -- one server's door ----------------------------------------------------------------

    async def door_tools(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        server = _server(ctx)
        tools = await self._plane(ctx, lambda plane, plan_id: server_tools(plane, plan_id, server))
        return types.ListToolsResult(tools=tools)

    async def door_call(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        """A call at the server's door, with what the server says meanwhile relayed on
        the request's stream (``_relayed``); for an agent of the stateless revision, the
        server's questions answered as ``input_required`` and its answers given back."""
        server = _server(ctx)
        arguments: Any = params.arguments if params.arguments is not None else {}
        meta = params.meta

        def operate(plane: Plane, plan_id: str) -> GateCall:
            return server_call(plane, plan_id, server, params.name, arguments, meta)

        async with _relayed(ctx, meta, _resumed(ctx, params, rounds=True)):
            called = await self._plane(ctx, operate)
        return self._answer(called)

    def _forwarding(self, request_type: Any, result_type: type[R]) -> Callable[[Any, Any], Any]:
        """The handler of a request the server's door forwards as it came (for an agent
        of the stateless revision, a read's questions and answers too: ``asked_of``)."""

        async def handler(ctx: Any, params: Any) -> R | types.InputRequiredResult:
            from mcp.shared.exceptions import MCPError

            # the client's _meta without the plane's keys nor the protocol's envelope (a
            # 2026-07-28 request's; the plane's own session to the server is its own)
            meta = getattr(params, "meta", None) if params is not None else None
            if meta:
                params = params.model_copy(update={"meta": forwarded_meta(meta)})
            resume = _resumed(ctx, params, rounds=False)
            if resume is not None:  # the server's own state, out of the door's
                params = params.model_copy(update={"request_state": resume.state})
            server, request = _server(ctx), request_type(params=params)
            asks = _modern(ctx) and hasattr(params, "request_state")  # a read that may ask
            expected: Any = answers_of(result_type) if asks else result_type

            def forward(plane: Plane, plan_id: str) -> Forwarded:
                return server_request(plane, plan_id, server, request, expected)

            # On the same kept server as the session's calls (what the client offers
            # picks it), so a log level it sets is the one its calls run at.
            async with _relayed(ctx, meta, resume):
                answer = await self._plane(ctx, forward)
            if answer.result is None:
                raise MCPError(code=answer.code, message=answer.message)
            if answer.result.get("resultType") == "input_required":
                return asked_of(None, answer.result)
            return result_type.model_validate(answer.result)

        return handler

    def seal_rounds(self, secret: bytes) -> None:
        """Seal the ``requestState`` the server's door gives an agent of the stateless
        revision (the SDK's ``RequestStateBoundary``: AES-GCM under a key derived from
        ``secret``, which every service of the ledger derives alike from the plane key),
        bound to the request's method, name and arguments and to who asked (credential,
        plan, server), for ``STATE_TTL_S``; a state it did not seal, or sealed for
        another, is refused (-32602) before any handler runs. Called once the service
        has its key."""
        from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity

        security = RequestStateSecurity(keys=[secret], ttl=STATE_TTL_S, bind_principal=_principal)
        self.door.middleware.append(RequestStateBoundary(security, default_audience=SERVER_NAME))


def _manager(
    server: Any, *, json_response: bool, stateless: bool = True
) -> StreamableHTTPSessionManager:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    return StreamableHTTPSessionManager(
        server,
        json_response=json_response,
        stateless=stateless,
        # A session left unused ends (its client starts a new one); at most so many.
        session_idle_timeout=SESSION_IDLE_S,
        max_sessions=MAX_SESSIONS,
        # The same cap as every body an agent sends (the SDK answers 413 beyond it).
        max_request_body_size=LIMITS["agent"].cap,
        # The door (``door.py``) checks Host and Origin before anything else, for every
        # route; behind a reverse proxy the Host is the proxy's to set.
        security_settings=None,
    )


def session_owner(credential_id: str) -> Any:
    """The request's principal as the SDK's transport compares it with a session's
    opener: the credential (its id; never its secret)."""
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.auth.provider import AccessToken

    return AuthenticatedUser(AccessToken(token=credential_id, client_id=credential_id, scopes=[]))


def _principal(ctx: Any) -> str | None:
    """Who a door's ``requestState`` is for: the credential, its plan, the server."""
    scope = _scope(ctx)
    user = scope.get("user")
    credential = getattr(getattr(user, "access_token", None), "client_id", None)
    if not isinstance(credential, str):
        return None  # never: the app checks every request's credential first
    return "\n".join((credential, str(scope.get(SCOPE_PLAN)), str(scope.get(SCOPE_SERVER))))


def _modern(ctx: Any) -> bool:
    """The request speaks the stateless revision (its questions come back as results)."""
    return getattr(ctx, "protocol_version", None) in MODERN_PROTOCOL_VERSIONS


def _resumed(ctx: Any, params: Any, *, rounds: bool) -> Resume | None:
    """A stateless revision's retry: the agent's answers, the server's state out of the
    door's (which the door's boundary unsealed: it sealed it), and, for a tool call
    (``rounds``), the round they close. None for any other request."""
    from mcp.shared.exceptions import MCPError

    if not _modern(ctx) or params is None:
        return None
    given = getattr(params, "input_responses", None)
    state = getattr(params, "request_state", None)
    if given is None and state is None:
        return None
    try:
        round_id, upstream = round_of(state)
    except LedgerError as exc:
        raise MCPError(code=types.INVALID_PARAMS, message=str(exc)) from None
    answers = {
        str(key): value.model_dump(by_alias=True, mode="json", exclude_none=True)
        if isinstance(value, BaseModel)
        else value
        for key, value in (given or {}).items()
    }
    return Resume(answers if given is not None else None, upstream, round_id if rounds else None)


def _scope(ctx: Any) -> Scope:
    return getattr(ctx.request, "scope", None) or {}


def _server(ctx: Any) -> str:
    return str(_scope(ctx).get(SCOPE_SERVER) or "")


@contextlib.asynccontextmanager
async def _relayed(ctx: Any, meta: Any, resume: Resume | None = None) -> AsyncIterator[None]:
    """While a call runs: its ``Backchannel`` (the client's ``_meta`` for the server,
    whether it asked for progress) in the context the call's worker thread copies, and
    a task passing what the server says to the client on the request's stream, in
    order, until the call is answered (what came before its end, included)."""
    loop = asyncio.get_running_loop()
    sending, said = anyio.create_memory_object_stream[dict[str, Any]](math.inf)

    def put(entry: dict[str, Any]) -> None:  # on the loop, in the order sent
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            sending.send_nowait(entry)

    def send(entry: dict[str, Any]) -> None:  # from the call's threads
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
            loop.call_soon_threadsafe(put, entry)

    asked = dict(meta or {})
    modern = _modern(ctx)
    back = Backchannel(
        forwarded_meta(asked),
        "progress_token" in asked,
        send,
        None if modern else _asker(ctx, loop),
        _declared(asked) if modern else _offers(ctx),
        modern=modern,
        resume=resume,
    )
    token = BACKCHANNEL.set(back)
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_relay, ctx, said)
            try:
                yield
            finally:
                sending.close()
    finally:
        BACKCHANNEL.reset(token)


def _declared(meta: dict[str, Any]) -> frozenset[str]:
    """What the agent's client of the stateless revision declares it answers (its
    request's envelope): the plane's session to the server declares the same."""
    found = meta.get(CLIENT_CAPABILITIES)
    if not isinstance(found, dict):
        return frozenset()
    return frozenset(kind for kind in ASKABLE if isinstance(found.get(kind), dict))


def _offers(ctx: Any) -> frozenset[str]:
    """What the agent's client offers that a server may ask of it during a call: only
    on a session (a stateless request has no way back for the answer)."""
    if not getattr(ctx.session, "can_send_request", False):
        return frozenset()
    offered = {
        "sampling": types.ClientCapabilities(sampling=types.SamplingCapability()),
        "elicitation": types.ClientCapabilities(elicitation=types.ElicitationCapability()),
    }
    with contextlib.suppress(Exception):  # a session that never said: nothing offered
        return frozenset(k for k, c in offered.items() if ctx.session.check_client_capability(c))
    return frozenset()


def _asker(ctx: Any, loop: asyncio.AbstractEventLoop) -> Any:
    """``Backchannel.ask`` for the call ``ctx`` serves: the server's request asked of
    the agent's client on the call's stream (on this loop), awaited from the loop the
    server's session runs on."""
    from mcp.shared.exceptions import MCPError
    from mcp.shared.message import ServerMessageMetadata

    async def on_this_loop(kind: str, asked: dict[str, Any]) -> dict[str, Any]:
        related = ServerMessageMetadata(related_request_id=ctx.request_id)
        request: Any
        result_type: Any
        if kind == "sampling":
            request = types.CreateMessageRequest.model_validate(
                {"method": "sampling/createMessage", "params": asked}
            )
            result_type = types.CreateMessageResult
        else:
            request = types.ElicitRequest.model_validate(
                {"method": "elicitation/create", "params": asked}
            )
            result_type = types.ElicitResult
        try:
            answer = await ctx.session.send_request(request, result_type, metadata=related)
        except MCPError as exc:
            error = exc.error.model_dump(by_alias=True, mode="json", exclude_none=True)
            raise Declined(error) from None
        except Exception as exc:  # no way to ask, or the client went away: not relayed
            error = {"code": types.INTERNAL_ERROR, "message": type(exc).__name__}
            raise Declined(error, asked=False) from None
        return dict(answer.model_dump(by_alias=True, mode="json", exclude_none=True))

    async def ask(kind: str, asked: dict[str, Any]) -> dict[str, Any]:
        found = asyncio.run_coroutine_threadsafe(on_this_loop(kind, asked), loop)
        return await asyncio.wrap_future(found)

    return ask


async def _relay(ctx: Any, said: Any) -> None:
    """Each log and progress message to the client, on the call's stream (a client that
    went away misses the rest; the record keeps them all)."""
    async with said:
        async for entry in said:
            params = entry.get("params") or {}
            with contextlib.suppress(Exception):
                if entry.get("kind") == "log":
                    notice = types.LoggingMessageNotification(
                        params=types.LoggingMessageNotificationParams.model_validate(params)
                    )
                    await ctx.session.send_notification(notice, ctx.request_id)
                elif entry.get("kind") == "progress":
                    await ctx.session.report_progress(
                        params.get("progress", 0), params.get("total"), params.get("message")
                    )


def _internal(exc: BaseException) -> str:
    """The message of the JSON-RPC error for what broke a handler (the log says more)."""
    if isinstance(exc, LedgerOpenError | sqlalchemy.exc.DBAPIError):
        log.warning("database error on /mcp: %s", exc)
        return "the database does not answer; retry later"
    log.error("internal error on /mcp", exc_info=exc)
    return f"internal error ({type(exc).__name__}); see the service's log"
