"""The MCP gate proxy's transport (docs/agents.md): an MCP server on stdio for the
agent, an MCP client of the upstream server (a subprocess on stdio), the plane between
them (``commands.plane.proxy``). Built on the official ``mcp`` SDK (2.x).

Each ``tools/call``: the input gate first — a deviation or an invented tool is an MCP
tool error (``isError``, the deviations as text and ``structuredContent``) and the call
is never forwarded; else it is forwarded and its result recorded and checked by the
output gate. A refused call (plan ended, halted, not in Execute) is a tool error too.
An upstream fault (crash, timeout, protocol error) halts the plan with
``environment_error`` and answers an MCP error: the agent never hangs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import anyio
import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client, stdio_server
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from ulid import ULID

from commands.plane.core import Plane
from commands.plane.hooks import HookVerdict
from commands.plane.proxy import (
    UpstreamTool,
    gate_proxy_call,
    record_proxy_result,
    record_upstream_fault,
    register_upstream_tools,
    server_name,
)
from ledger import LedgerError

DEFAULT_TIMEOUT_S = 60.0


def _deviation_result(verdict: HookVerdict, word: str, consequence: str) -> types.CallToolResult:
    gate = verdict.gate
    assert gate is not None
    check = gate.check
    deviations = [
        {
            "pointer": d.pointer,
            "kind": d.kind,
            "expected": d.expected,
            "actual_type": d.actual_type,
        }
        for d in check.deviations
    ]
    lines = [
        f"{word}: the {check.gate} gate failed for tool {check.tool!r}: "
        f"{len(deviations)} deviation(s); {consequence}",
        *(
            f"  {d['pointer'] or '/'}: {d['kind']} (expected {d['expected']}; "
            f"got {d['actual_type']})"
            for d in deviations
        ),
    ]
    if gate.routed:
        lines.append(f"routed: {gate.routed}")
    return types.CallToolResult(
        content=[types.TextContent(text="\n".join(lines))],
        structured_content={
            "gate": check.gate,
            "tool": check.tool,
            "verdict": check.verdict,
            "routed": gate.routed,
            "deviations": deviations,
        },
        is_error=True,
    )


def _refused(message: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=f"error: {message}")],
        structured_content={"error": message},
        is_error=True,
    )


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


async def serve(
    plane: Plane,
    plan_id: str,
    command: Sequence[str],
    *,
    server: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Run the proxy until the agent closes its stdin (or the upstream cannot start)."""
    params = StdioServerParameters(command=command[0], args=list(command[1:]))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as upstream:
        with anyio.fail_after(timeout_s):
            init = await upstream.initialize()
            listed = await _list_all(upstream)
        name = server or server_name(init.server_info.name)
        register_upstream_tools(
            plane,
            name,
            [
                UpstreamTool(t.name, t.input_schema, t.output_schema, t.description or "")
                for t in listed
            ],
        )

        async def on_list_tools(
            ctx: Any, params: types.PaginatedRequestParams | None
        ) -> types.ListToolsResult:
            return types.ListToolsResult(tools=listed)

        fault: list[str] = []  # the upstream's fault: every later call is an MCP error

        async def on_call_tool(
            ctx: Any, params: types.CallToolRequestParams
        ) -> types.CallToolResult:
            if fault:
                raise MCPError(
                    code=types.INTERNAL_ERROR,
                    message=f"the MCP server {name!r} is unavailable ({fault[0]}); restart "
                    "the proxy",
                )
            arguments: Any = params.arguments if params.arguments is not None else {}
            step = f"mcp-{ULID()}"
            try:
                verdict = gate_proxy_call(plane, plan_id, name, params.name, arguments, step=step)
            except LedgerError as exc:
                return _refused(str(exc))
            if verdict.blocked:
                return _deviation_result(verdict, "blocked", "the call was not forwarded")
            try:
                with anyio.fail_after(timeout_s):
                    result = await upstream.send_request(
                        types.CallToolRequest(
                            params=types.CallToolRequestParams(
                                name=params.name, arguments=arguments
                            )
                        ),
                        types.CallToolResult,
                        request_read_timeout_seconds=timeout_s,
                    )
            except Exception as exc:  # crash, timeout, protocol error: never a hang
                what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                fault.append(what)
                with contextlib.suppress(LedgerError):  # the plan may have ended already
                    record_upstream_fault(plane, plan_id, name, params.name, what)
                raise MCPError(
                    code=types.INTERNAL_ERROR,
                    message=f"the MCP server {name!r} failed ({what}); the plan is halted "
                    "with environment_error",
                ) from None
            raw = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            raw.pop("resultType", None)
            try:
                recorded = record_proxy_result(
                    plane, plan_id, name, params.name, arguments, raw, step=step
                )
            except LedgerError as exc:
                return _refused(str(exc))
            if recorded.blocked:
                return _deviation_result(recorded, "rejected", "the output does not become state")
            return result

        proxy = Server(
            "evidence-mcp-proxy",
            version="0.1.0",
            on_list_tools=on_list_tools,
            on_call_tool=on_call_tool,
        )
        async with stdio_server() as (agent_read, agent_write):
            await proxy.run(agent_read, agent_write, proxy.create_initialization_options())
