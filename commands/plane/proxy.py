"""The MCP gate proxy's plane side (no MCP transport here: ``commands.cli.mcp``).

- ``register_upstream_tools``: each tool an upstream MCP server lists is registered as a
  tool with ``mcp_server`` / ``mcp_tool_name`` (its schemas normalised closed, as every
  tool's are; a new version when the upstream's schema changed, nothing when not).
- ``gate_proxy_call``: the input gate on a ``tools/call`` before it is forwarded,
  exactly as the pre-tool hook checks it (an unknown tool is an invented tool).
- ``record_proxy_result``: the forwarded call and the upstream's result recorded as the
  post-tool hook records it (``tool.called``, executor ``recorded``, output as a blob;
  the output gate on the result's ``structuredContent``).
- ``record_upstream_fault``: the upstream crashed, timed out or broke the protocol: the
  plan halts with ``environment_error`` (raw ``backend_unavailable``), never a verdict.

Every function answers a refusal (unknown or ended plan, plan not in Execute) with
``CommandRefused`` before anything is appended.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ledger.events import PlanHalted

from .core import Plane
from .hooks import MCP_PREFIX, HookCall, HookVerdict, post_tool, pre_tool, resolve_tool
from .registry import register_tool
from .runs import record_halt

FAULT_RAW_TYPE = "backend_unavailable"  # -> environment_error (projections.outcomes)
_NOT_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class UpstreamTool:
    """One tool as the upstream lists it (its schemas as JSON values)."""

    name: str
    input_schema: Any
    output_schema: Any = None
    description: str = ""


def server_name(value: str) -> str:
    """An upstream's name usable in a registered tool's name: letters, digits, ``._-``."""
    name = _NOT_NAME.sub("-", value).strip("-._")[:64]
    return name or "mcp"


def agent_name(server: str, tool: str) -> str:
    """How the hooks' resolver names an MCP server's tool: ``mcp__SERVER__TOOL``."""
    return f"{MCP_PREFIX}{server}__{tool}"


def register_upstream_tools(
    plane: Plane, server: str, tools: Sequence[UpstreamTool], *, actor: str = "system"
) -> dict[str, str]:
    """Register every upstream tool; returns the MCP tool name -> the registered name.
    A tool already registered for this server and MCP tool name keeps its name (a new
    version when its schemas changed); a new one is registered as ``SERVER.TOOL``."""
    names: dict[str, str] = {}
    for tool in tools:
        existing = resolve_tool(plane, agent_name(server, tool.name))
        name = existing or f"{server}.{server_name(tool.name)}"[:128]
        register_tool(
            plane,
            {
                "name": name,
                "description": tool.description,
                "mcp_server": server,
                "mcp_tool_name": tool.name,
                "input_schema": tool.input_schema,
                "output_schema": tool.output_schema,
            },
            actor=actor,
        )
        names[tool.name] = name
    return names


def gate_proxy_call(
    plane: Plane, plan_id: str, server: str, tool: str, arguments: Any, *, step: str
) -> HookVerdict:
    """The input gate on a ``tools/call`` of ``tool`` on ``server``; ``blocked``: never
    forward it."""
    return pre_tool(plane, plan_id, HookCall(agent_name(server, tool), arguments, step))


def record_proxy_result(
    plane: Plane,
    plan_id: str,
    server: str,
    tool: str,
    arguments: Any,
    result: Mapping[str, Any],
    *,
    step: str,
) -> HookVerdict:
    """Record the forwarded call with the upstream's result (its MCP JSON: ``content``,
    ``structuredContent``, ``isError``) and gate its output."""
    call = HookCall(agent_name(server, tool), arguments, step, dict(result))
    return post_tool(plane, plan_id, call)


def record_upstream_fault(
    plane: Plane, plan_id: str, server: str, tool: str, what: str
) -> PlanHalted:
    """The upstream could not answer a forwarded call (crash, timeout, protocol error)."""
    return record_halt(
        plane,
        plan_id,
        FAULT_RAW_TYPE,
        f"MCP server {server!r} failed on a call of {tool!r}: {what}"[:2000],
        hint="check the MCP server (it crashed, timed out or broke the protocol), restart "
        "the proxy, then re-run unchanged",
        actor="agent",
    )
