"""The MCP gate proxy's transport (docs/agents.md): an MCP server on stdio for the
agent, an MCP client of the upstream server (a subprocess on stdio, or a streamable-HTTP
URL), the plane between them (``commands.plane.proxy``). Built on the official ``mcp``
SDK (2.x).

Each ``tools/call``: the input gate first — a deviation or an invented tool is an MCP
tool error (``isError``, the deviations as text and as JSON in ``_meta``) and the call
is never forwarded; else it is forwarded and its result recorded and checked by the
output gate. A refused call (plan ended, halted, not in Execute) is a tool error too.
The answers' shapes are ``commands.plane.mcp_answers``, shared with the service's MCP
endpoint (``/mcp``), so both gates answer alike.
An upstream fault (crash, timeout, protocol error) halts the plan with
``environment_error`` and answers an MCP error: the agent never hangs.

Beside the upstream's tools the agent is offered the plane's own agent-side verbs
(``commands.plane.proxy_verbs``); none of them can record a decision.

An agent may name the step a call belongs to, and declare that step's output, in the
request's ``_meta``: ``evidence/step`` (an id) and ``evidence/output_schema`` (a JSON
Schema the output gate checks after the tool's registered one: it only narrows).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import warnings
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, cast

import anyio
import mcp_types as types
import msgspec
from mcp import ClientSession, MCPDeprecationWarning, stdio_server
from mcp.client.session import IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from commands.cli.mcp_relay import CallExchange, Relay, forwarding, notification_options
from commands.errors import said_by
from commands.plane.confinement import upstream_confinement, work_confinement
from commands.plane.core import CommandRefused, Plane
from commands.plane.mcp_answers import (
    call_verb,
    forwarded_meta,
    gate_failed,
    plane_tools,
    refused,
    step_of,
    upstream_failed,
    with_plan_state,
)
from commands.plane.plans import get_plan
from commands.plane.proxy import (
    Registered,
    UpstreamTool,
    gate_proxy_call,
    record_fetch,
    record_oversized_result,
    record_proxy_result,
    record_upstream_fault,
    register_upstream_tools,
    server_name,
)
from commands.plane.proxy_verbs import INSTRUCTIONS, PLANE_TOOLS
from commands.rules.vocabulary import terminal_state
from commands.runner.bounded_stdio import BoundedStdio, bounded_stdio_client
from commands.runner.confine import Confinement, launched
from commands.runner.guards import KeptSnapshots
from commands.runner.mcp_client import answered_error, refused_meanwhile
from commands.runner.process import output_cap
from ledger import LedgerError
from projections.states import PlanState

DEFAULT_TIMEOUT_S = 60.0


def _warn(message: str) -> None:
    """A line on stderr, which MCP clients keep as the server's log."""
    print(f"evidence mcp proxy: {' '.join(message.split())}", file=sys.stderr, flush=True)


async def _list_all(upstream: ClientSession) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    while True:
        page = await upstream.list_tools(
            params=types.PaginatedRequestParams(cursor=cursor) if cursor else None
        )
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


class GateProxy:
    """The proxy's state: the upstream's tools as registered, and its fault, if any."""

    def __init__(
        self, plane: Plane, plan_id: str, upstream: ClientSession, timeout_s: float, relay: Relay
    ):
        self.plane, self.plan_id, self.upstream, self.timeout_s = (
            plane,
            plan_id,
            upstream,
            timeout_s,
        )
        self.relay = relay
        self.server = ""
        self.upstream_id = ""  # the upstream's command line (as given) or URL: its identity
        self.offered: list[types.Tool] = []
        self.registered = Registered()
        self.stale = False  # the upstream said its tool list changed: list it again
        self.fault: str | None = None  # every call after an upstream fault is an MCP error
        self.bounded: BoundedStdio | None = None  # a stdio upstream's transport
        self._in_flight: set[anyio.CancelScope] = set()

    async def on_upstream_message(self, message: IncomingMessage) -> None:
        await self.relay.on_notification(message)
        if isinstance(message, types.ToolListChangedNotification):
            self.stale = True
        elif isinstance(message, Exception):  # the upstream broke the protocol
            said = " ".join(str(message).split())[:300]
            self.fault = self.fault or f"protocol error: {type(message).__name__}: {said}"
            for scope in self._in_flight:
                scope.cancel()

    async def refresh(self) -> None:
        """List the upstream's tools and register them (a new version where changed)."""
        self.stale = False
        listed = await _list_all(self.upstream)
        mine = [t for t in listed if t.name in PLANE_TOOLS]
        for tool in mine:
            _warn(f"tool {tool.name!r} of {self.server!r} is not offered: the proxy's own verb")
        listed = [t for t in listed if t.name not in PLANE_TOOLS]
        self.registered = register_upstream_tools(
            self.plane,
            self.server,
            [
                UpstreamTool(t.name, t.input_schema, t.output_schema, t.description or "")
                for t in listed
            ],
            upstream=self.upstream_id,
        )
        for name, why in self.registered.refused.items():
            _warn(f"tool {name[:80]!r} of {self.server!r} is not offered: {why}")
        self.offered = [t for t in listed if t.name in self.registered.names]

    async def fetched(self, what: str, name: str, answer: dict[str, Any]) -> None:
        """A resource read or a prompt fetch, recorded before the agent gets it (an
        ended plan refuses it: the agent gets an MCP error instead)."""
        try:
            record_fetch(self.plane, self.plan_id, self.server, what, name, answer)
        except LedgerError as exc:
            raise MCPError(code=types.INVALID_REQUEST, message=said_by(exc, "mcp")) from None

    async def list_tools(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        self.relay.seen(ctx)
        if self.stale and self.fault is None:
            await self.refresh()
        return types.ListToolsResult(tools=[*self.offered, *plane_tools()])

    async def call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        arguments: Any = params.arguments if params.arguments is not None else {}
        verb = PLANE_TOOLS.get(params.name)
        # One look at the policy for the whole call, as the service's requests take:
        # its reads outside the ledger lock share one (a revocation binds the next
        # call); what is appended still reads the policy under the lock.
        with self.plane.one_look():
            try:
                if verb is not None:
                    self.relay.seen(ctx)
                    result = call_verb(self.plane, self.plan_id, verb, arguments)
                else:
                    with self.relay.call(ctx) as exchange:
                        result = await self._forward(params, arguments, exchange)
            except LedgerError as exc:
                return refused(said_by(exc, "mcp"))
            return with_plan_state(result, self.plane, self.plan_id)

    async def _forward(
        self, params: types.CallToolRequestParams, arguments: Any, exchange: CallExchange
    ) -> types.CallToolResult:
        if self.fault is not None:
            raise MCPError(
                code=types.INTERNAL_ERROR,
                message=f"the MCP server {self.server!r} is unavailable ({self.fault}); "
                "restart the proxy",
            )
        if self.stale:
            await self.refresh()
        step, output_schema = step_of(params.meta)
        gate = gate_proxy_call(
            self.plane,
            self.plan_id,
            self.server,
            self.registered.names,
            params.name,
            arguments,
            step=step,
        )
        if gate.blocked:
            return gate_failed(gate.outcome, "blocked", "the call was not forwarded")
        # The plan's sandbox as it was before the call: put back unless the call passes
        # both gates (an upstream working in the sandbox keeps no rejected write).
        plan = self.plane.state(f"plan:{self.plan_id}").of(PlanState)
        copies = self.plane.sandbox(plan).existing() if plan is not None else {}
        guards = [self.plane.guard_sandbox(self.plan_id, c) for c in copies.values()]
        report = None
        try:
            result = await self._send(params, arguments, exchange)
            oversized = self.bounded.take_truncation(result) if self.bounded else None
            if oversized is not None:
                prefix, truncation = oversized
                report = record_oversized_result(
                    self.plane, self.plan_id, gate, arguments, prefix, truncation, step=step
                )
            else:
                report = record_proxy_result(
                    self.plane,
                    self.plan_id,
                    gate,
                    arguments,
                    result.model_dump(by_alias=True, mode="json", exclude_none=True),
                    structured=params.name in self.registered.structured,
                    step=step,
                    output_schema=output_schema,
                    exchange=exchange.messages,
                )
        finally:
            for guard in guards:
                if report is not None and report.ok:
                    guard.discard()
                else:
                    guard.restore_if_changed()
        if report.tool_failed and report.output_gate is not None:
            return upstream_failed(result, report.output_gate)
        if not report.ok:
            failed = report.output_gate or report.input_gate
            return gate_failed(failed, "rejected", "the output does not become state")
        return result

    async def _send(
        self, params: types.CallToolRequestParams, arguments: Any, exchange: CallExchange
    ) -> types.CallToolResult:
        """Forward one call (with the agent's ``_meta`` but the plane's own keys; its
        progress relayed when it asked for progress); a crash, a timeout or a protocol
        error halts the plan with environment_error and is an MCP error for the agent
        (never a hang)."""
        tool = params.name
        meta = cast("types.RequestParamsMeta | None", forwarded_meta(params.meta))
        request = types.CallToolRequest(
            params=types.CallToolRequestParams(name=tool, arguments=arguments, _meta=meta)
        )
        asked_progress = params.meta is not None and "progress_token" in params.meta
        progress = self.relay.progress_of(exchange) if asked_progress else None
        what: str | None = None
        with anyio.CancelScope() as scope:
            self._in_flight.add(scope)
            try:
                with anyio.fail_after(self.timeout_s):
                    return await self.upstream.send_request(
                        request,
                        types.CallToolResult,
                        request_read_timeout_seconds=self.timeout_s,
                        progress_callback=progress,
                    )
            except TimeoutError:
                what = f"no answer within {self.timeout_s:g} s"
            except MCPError as exc:
                if refused_meanwhile(exchange.messages):
                    # It failed the call over a request the gate could not relay (kept in
                    # the exchange): the tool's own failure, not a broken upstream.
                    text = answered_error(tool, exc.error.code, exc.error.message)
                    return types.CallToolResult(
                        content=[types.TextContent(type="text", text=text)], is_error=True
                    )
                what = f"{type(exc).__name__}: {exc}"
            except Exception as exc:  # the upstream died or answered something else
                what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            finally:
                self._in_flight.discard(scope)
        self.fault = self.fault or what or "the connection was lost"
        with contextlib.suppress(LedgerError):  # the plan may have ended meanwhile
            record_upstream_fault(self.plane, self.plan_id, self.server, tool, self.fault)
        raise MCPError(
            code=types.INTERNAL_ERROR,
            message=f"the MCP server {self.server!r} failed ({self.fault}); the plan is "
            "halted with environment_error",
        )


@contextlib.asynccontextmanager
async def _connect(
    command: Sequence[str],
    url: str | None,
    workdir: Path | None = None,
    confinement: Confinement | None = None,
) -> AsyncIterator[tuple[Any, Any, BoundedStdio | None]]:
    """The upstream's streams, and for a stdio upstream the bounded transport's state
    (its answers over the output cap are drained, never held: memory stays bounded)."""
    if url is not None:
        async with streamable_http_client(url) as (read, write):
            yield read, write, None
    else:
        cap = output_cap(None)
        with launched(command, confinement, None) as (launch, env):
            # Confined: its own temporary directory on top of the SDK's default
            # environment (the transport merges what is given with it).
            temp = {k: v for k, v in (env or {}).items() if k in ("TMPDIR", "TMP", "TEMP")}
            async with bounded_stdio_client(
                launch, cap=cap, cwd=workdir, env=temp, errlog=sys.stderr
            ) as streams:
                yield streams


def _upstream_confinement(
    plane: Plane, plan: PlanState | None, command: Sequence[str]
) -> Confinement:
    """A stdio upstream is confined as the plan's tools are: it writes the plan's
    sandbox copies (made when the plan entered Execute: an upstream started before has
    none to write) and reads the allow-list and the files its command names. Over TCP
    it reaches what the operator declared (``network``) on the tools registered with
    this very command (``mcp_command``), nothing else: whoever starts the proxy names the
    command, but only a registration grants reach. Refused (nothing recorded) where the
    kernel cannot confine it and the plan did not opt out."""
    if plan is None:  # a plan stream with no plan.created: no sandbox, no opt-out
        confinement = upstream_confinement(plane)
    else:
        write: list[Path] = []
        if plan.snapshot_sha256 is not msgspec.UNSET:
            write = list(plane.sandbox(plan).ensure().copies.values())
        confinement = work_confinement(plane, plan, write, "the MCP server")
    return confinement.running(command, _declared_network(plane, command))


def _declared_network(plane: Plane, command: Sequence[str]) -> dict[str, list[int]]:
    """The TCP ports the operator's registrations of ``command`` declare, together."""
    found: dict[str, set[int]] = {"connect": set(), "bind": set()}
    for doc in plane.log().registered_tools():
        spec = doc.spec
        if spec.mcp_command != list(command) or spec.network is msgspec.UNSET:
            continue
        if spec.source.startswith("mcp:"):
            continue  # registered from the server's own listing: not the operator's word
        found["connect"].update(spec.network.connect)
        found["bind"].update(spec.network.bind)
    return {key: sorted(ports) for key, ports in found.items()}


SANDBOX_PLACEHOLDER = "{sandbox}"


def _upstream_workdir(plane: Plane, plan_id: str) -> Path | None:
    """Where a stdio upstream works: the plan's sandbox copy of its first resource (made
    when the plan entered Execute), never the real resource; None before Execute."""
    plan = plane.state(f"plan:{plan_id}").of(PlanState)
    if plan is None or plan.snapshot_sha256 is msgspec.UNSET:
        return None
    copies = plane.sandbox(plan).ensure().copies
    return copies[plan.resources[0]]


def _in_sandbox(command: Sequence[str], workdir: Path | None) -> list[str]:
    """The upstream command with ``{sandbox}`` replaced by the plan's sandbox copy (so a
    filesystem server is pointed at the copy, not the real resource)."""
    if workdir is None:
        if any(SANDBOX_PLACEHOLDER in arg for arg in command):
            raise CommandRefused(
                "the upstream command names {sandbox}, but the plan has not entered Execute "
                "(its sandbox is made then)"
            )
        return list(command)
    return [arg.replace(SANDBOX_PLACEHOLDER, str(workdir)) for arg in command]


def _removed_on_sigterm(snapshots: KeptSnapshots, stack: contextlib.AsyncExitStack) -> None:
    """A client that ends the proxy with SIGTERM (MCP clients do, after closing its
    input) ends it as before, at once, but not with a copy of the sandbox left behind:
    the kept snapshots are removed first, then the signal takes its default course."""

    def removed(signum: int, _frame: object) -> None:
        snapshots.remove_now()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    previous = signal.signal(signal.SIGTERM, removed)
    stack.callback(signal.signal, signal.SIGTERM, previous)


async def serve(
    plane: Plane,
    plan_id: str,
    command: Sequence[str] = (),
    *,
    url: str | None = None,
    server: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Run the proxy until the agent closes its stdin (or the upstream cannot start)."""
    doc = get_plan(plane, plan_id)
    ended = terminal_state(doc)
    if ended is not None:
        raise CommandRefused(f"plan {plan_id} has ended ({ended}): no call can be made in it")
    workdir = _upstream_workdir(plane, plan_id) if url is None else None
    upstream_id = url if url is not None else shlex.join(command)
    template, command = command, _in_sandbox(command, workdir)
    confinement = _upstream_confinement(plane, doc, template) if url is None else None
    async with contextlib.AsyncExitStack() as stack:
        # The sandbox's snapshot is kept across the agent's calls, copied again only
        # when the tree changed (``guards``), and removed with the proxy.
        plane.snapshots = KeptSnapshots()
        stack.callback(plane.snapshots.close)
        _removed_on_sigterm(plane.snapshots, stack)
        read, write, bounded = await stack.enter_async_context(
            _connect(command, url, workdir, confinement)
        )
        proxy: GateProxy | None = None

        async def on_message(message: IncomingMessage) -> None:
            if proxy is not None:
                await proxy.on_upstream_message(message)

        relay = Relay()
        upstream = await stack.enter_async_context(
            ClientSession(
                read,
                write,
                message_handler=on_message,
                logging_callback=relay.on_log,
                sampling_callback=relay.on_sampling,
                elicitation_callback=relay.on_elicitation,
            )
        )
        proxy = GateProxy(plane, plan_id, upstream, timeout_s, relay)
        proxy.upstream_id = upstream_id
        proxy.bounded = bounded
        with anyio.fail_after(timeout_s):
            init = await upstream.initialize()
            proxy.server = server or server_name(init.server_info.name)
            await proxy.refresh()
        declared = init.capabilities
        with warnings.catch_warnings():  # logging is deprecated in 2026-07-28, not before
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            agent_side = Server(
                "evidence-mcp-proxy",
                version="0.1.0",
                instructions=INSTRUCTIONS,
                on_list_tools=proxy.list_tools,
                on_call_tool=proxy.call_tool,
                **forwarding(upstream, declared, relay, proxy.fetched),
            )
        options = agent_side.create_initialization_options(notification_options(declared))
        async with stdio_server() as (agent_read, agent_write):
            await agent_side.run(agent_read, agent_write, options)
