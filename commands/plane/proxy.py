"""The MCP gate proxy's plane side (no MCP transport here: ``commands.cli.mcp_proxy``).

- ``register_upstream_tools``: each tool an upstream MCP server lists is registered as a
  tool with ``mcp_server`` / ``mcp_tool_name`` (its schemas normalised closed, as every
  tool's are; a new version when the upstream's schema changed, nothing when not). A
  tool the registry refuses (a schema it cannot check) is left out: the agent is never
  offered a tool the plane cannot gate.
- ``gate_proxy_call``: the input gate on a ``tools/call`` before it is forwarded; a tool
  the proxy did not register is an invented tool.
- ``record_proxy_result``: the forwarded call and the upstream's result recorded as
  ``call --record-output`` records it (``tool.called``, executor ``recorded``, the
  output as a blob), then the output gate. What it checks is
  ``commands.runner.mcp_client.tool_output``: as for an MCP tool the plane calls.
- ``record_fetch``: a resource the agent read or a prompt it got through the proxy
  (``mcp.fetched``, the answer kept as a blob).
- ``record_upstream_fault``: the upstream crashed, timed out or broke the protocol: the
  plan halts with ``environment_error`` (raw ``backend_unavailable``), never a verdict.

Every function answers a refusal (unknown or ended plan, plan not in Execute, a decision
pending) with ``CommandRefused`` before anything is appended.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from ulid import ULID

from commands.errors import said_by
from commands.runner.mcp_client import (
    capped,
    is_tool_error,
    mcp_tool_result_schema,
    tool_output,
)
from commands.runner.process import output_cap
from ledger.errors import LedgerError
from ledger.events import McpFetched, PlanHalted, Truncation

from .authority import Authority
from .core import CommandRefused, Plane, StreamState
from .gates import GateOutcome, gate_input
from .hooks import MCP_PREFIX, json_bytes, open_for_calls
from .input_rounds import MAX_ANSWERS
from .phases import require_plan
from .proxy_verbs import PREFIX as PLANE_PREFIX
from .registry import register_tool
from .runs import MCP_FAULT, CallReport, Recorded, call_tool, exchanged, record_halt

# The longest resource URI or prompt name a read records (the agent chooses it: one event
# each, so the log keeps no megabyte of it).
MAX_FETCHED_NAME = 4096
_NOT_NAME = re.compile(r"[^A-Za-z0-9._-]+")
# An upstream tool name the proxy offers: printable ASCII without spaces (MCP advises
# letters, digits and ``_-.``); anything else could pass for another name on a terminal.
MCP_TOOL_NAME = re.compile(r"[!-~]{1,128}")


@dataclass(frozen=True)
class UpstreamTool:
    """One tool as the upstream lists it (its schemas as JSON values)."""

    name: str
    input_schema: Any
    output_schema: Any = None
    description: str = ""


@dataclass
class Registered:
    """What ``register_upstream_tools`` did: the MCP tool name -> the registered name,
    whether the upstream declares its structured output, and the tools left out."""

    names: dict[str, str] = field(default_factory=dict)
    structured: set[str] = field(default_factory=set)
    refused: dict[str, str] = field(default_factory=dict)  # MCP tool name -> why


def server_name(value: str) -> str:
    """An upstream's name usable in a registered tool's name: letters, digits, ``._-``."""
    name = _NOT_NAME.sub("-", value).strip("-._")[:64]
    return name or "mcp"


def agent_name(server: str, tool: str) -> str:
    """How an agent CLI names an MCP server's tool: ``mcp__SERVER__TOOL`` (the name an
    invented tool is recorded under)."""
    return f"{MCP_PREFIX}{server}__{tool}"


def register_upstream_tools(
    plane: Plane,
    server: str,
    tools: Sequence[UpstreamTool],
    *,
    upstream: str = "",
    actor: str = "system",
) -> Registered:
    """Register every upstream tool. One already registered for this server and MCP
    tool name keeps its name (a new version when its schemas changed); a new one is
    registered as ``SERVER.TOOL``. A tool without ``outputSchema`` is declared to return
    an MCP tool result (``mcp_tool_result_schema``: the SDK's types).

    ``upstream`` (the server's command line or URL) is the server's identity: its tools
    record it (``source: mcp:UPSTREAM``), and a server name whose tools came from
    another upstream is refused — an upstream cannot take another server's name and
    re-register its tools with looser schemas."""
    done = Registered()
    log = plane.log()
    source = f"mcp:{upstream}" if upstream else ""
    sources = log.server_sources(server)
    owners = {s for s in sources if s.startswith("mcp:")} - {source} if source else set()
    if owners:
        raise CommandRefused(
            f"MCP server name {server!r} belongs to another upstream ({sorted(owners)[0][4:]}): "
            "an upstream never takes another server's name; give this one its own (--server NAME)"
        )
    # An operator registered tools of this server (from a file, with their bounds): the
    # upstream is gated by each as it stands, never re-registers or widens it.
    by_operator = bool(source) and any(not s.startswith("mcp:") for s in sources)
    for tool in tools:
        if by_operator and _operators(log, server, tool, done):
            continue
        if not MCP_TOOL_NAME.fullmatch(tool.name):
            done.refused[tool.name] = "its name is not 1-128 printable ASCII characters"
            continue
        if tool.name.startswith(PLANE_PREFIX):
            # The agent would take it for one of the plane's own verbs.
            done.refused[tool.name] = f"names starting {PLANE_PREFIX!r} are the plane's own"
            continue
        existing = log.mcp_tools(server, tool.name)
        name = existing[0] if len(existing) == 1 else f"{server}.{server_name(tool.name)}"[:128]
        if name in done.names.values():  # two MCP names, one registry name: neither guesses
            done.refused[tool.name] = f"its registry name {name!r} is taken by another tool"
            continue
        structured = tool.output_schema is not None
        try:
            register_tool(
                plane,
                {
                    "name": name,
                    "description": tool.description,
                    "mcp_server": server,
                    "mcp_tool_name": tool.name,
                    **({"source": source} if source else {}),
                    "input_schema": tool.input_schema,
                    "output_schema": tool.output_schema if structured else mcp_tool_result_schema(),
                },
                actor=actor,
            )
        except LedgerError as exc:
            done.refused[tool.name] = said_by(exc, "mcp")
            continue
        done.names[tool.name] = name
        if structured:
            done.structured.add(tool.name)
    return done


def _operators(log: Authority, server: str, tool: UpstreamTool, done: Registered) -> bool:
    """Offer an upstream tool under the operator's registration of it, unchanged (True);
    False when the operator registered none (the upstream's own registration follows)."""
    existing = log.mcp_tools(server, tool.name)
    spec = log.tool_version(existing[0], None) if len(existing) == 1 else None
    if spec is None or spec.source.startswith("mcp:"):
        return False
    done.names[tool.name] = existing[0]
    if tool.output_schema is not None:
        done.structured.add(tool.name)
    return True


@dataclass(frozen=True)
class ProxyGate:
    """The input gate's outcome on one forwarded call; ``tool`` is None for an invented
    tool."""

    tool: str | None
    outcome: GateOutcome

    @property
    def blocked(self) -> bool:
        return not self.outcome.passed


def gate_proxy_call(
    plane: Plane,
    plan_id: str,
    server: str,
    registered: Mapping[str, str],
    tool: str,
    arguments: Any,
    *,
    step: str,
) -> ProxyGate:
    """The input gate on a ``tools/call`` of ``tool``; ``blocked``: never forward it."""
    open_for_calls(plane, plan_id, "the MCP proxy forwards")
    name = registered.get(tool)
    outcome = gate_input(
        plane, plan_id, name or agent_name(server, tool), json_bytes(arguments), step=step,
        call_follows=True,
    )  # fmt: skip
    return ProxyGate(name, outcome)


def record_proxy_result(
    plane: Plane,
    plan_id: str,
    gate: ProxyGate,
    arguments: Any,
    result: Mapping[str, Any],
    *,
    structured: bool,
    step: str,
    output_schema: Any = None,
    exchange: Sequence[Mapping[str, Any]] = (),
) -> CallReport:
    """Record the forwarded call with what ``tool_output`` takes of the upstream's
    result, and gate it (the tool's declaration, narrowed by ``output_schema`` when the
    agent declared the step's output). A result the upstream marks as an error is its
    own failure: recorded whole and checked as an MCP tool result (``tool_error``), as is
    one given after a request of the upstream the gate could not relay (``exchange``).
    Output over the cap keeps its prefix, as a command's stdout does (an upstream on
    stdio never gets here with one: its transport drained it)."""
    assert gate.tool is not None and not gate.blocked
    output, truncation = capped(json_bytes(tool_output(result, structured)), output_cap(None))
    return call_tool(
        plane,
        plan_id,
        gate.tool,
        json_bytes(arguments),
        step=step,
        recorded=Recorded(output, truncation, is_tool_error(result), exchanged(exchange)),
        output_schema=output_schema,
        input_gate=gate.outcome,
    )


def record_oversized_result(
    plane: Plane,
    plan_id: str,
    gate: ProxyGate,
    arguments: Any,
    prefix: bytes,
    truncation: Truncation,
    *,
    step: str,
) -> CallReport:
    """Record a forwarded call whose answer went over the output cap: the kept prefix
    with its ``Truncation``, which the output gate fails as a command's stdout over its
    cap fails (a prefix is never parsed)."""
    assert gate.tool is not None and not gate.blocked
    return call_tool(
        plane,
        plan_id,
        gate.tool,
        json_bytes(arguments),
        step=step,
        recorded=Recorded(prefix, truncation),
        input_gate=gate.outcome,
    )


def check_fetched_name(what: str, name: str) -> None:
    """Refused unless ``name``, a resource's URI or a prompt's name of the agent's
    choosing, is short and printable (one event records it)."""
    if len(name) > MAX_FETCHED_NAME or not name.isprintable():
        raise CommandRefused(
            f"a {what}'s name or URI is at most {MAX_FETCHED_NAME} printable characters"
        )


def record_fetch(
    plane: Plane,
    plan_id: str,
    server: str,
    what: str,
    name: str,
    answer: Mapping[str, Any],
    given: Mapping[str, Any] | None = None,
) -> McpFetched:
    """Record what a gate gives the agent to read — a resource's contents or a prompt —
    before the agent gets it (the answer's JSON kept as a blob), with the answers to the
    server's questions it came with (``given``, kept as a blob too: a person's answer
    that shaped what the agent reads). Refused in an unknown or ended plan, while Apply
    is under way, and in a plan with skills when none of the server's tools is in
    them."""
    check_fetched_name(what, name)
    content = json_bytes(answer)
    kept = [content]
    answers: dict[str, Any] = {}
    if given:
        if len(given) > MAX_ANSWERS:
            raise CommandRefused(f"at most {MAX_ANSWERS} answers in one request")
        kept.append(json_bytes(dict(given)))
        answers = {
            "given_sha256": hashlib.sha256(kept[1]).hexdigest(),
            "given": sorted(str(key) for key in given),
        }
    fetched = McpFetched(
        plan_id=plan_id,
        fetch_id=str(ULID()),
        server=server,
        what=what,  # type: ignore[arg-type]  # "resource" or "prompt": the gate's own word
        name=name,
        size=len(content),
        content_sha256=hashlib.sha256(content).hexdigest(),
        **answers,
    )

    def decide(state: StreamState) -> list[McpFetched]:
        plan = require_plan(state, plan_id)
        if plan.skills is not msgspec.UNSET and state.log is not None:
            # Reads follow the skills as calls do: from a server only when the plan may
            # call one of its tools (none before Execute pins the skills).
            offered = [d.name for d in state.log.registered_tools() if d.spec.mcp_server == server]
            if not any(plan.may_call(name) for name in offered):
                raise CommandRefused(
                    f"a plan with skills reads only from MCP servers whose tools its skills "
                    f"name: none of {server!r}'s tools is in them"
                )
        return [fetched]

    plane.run(f"plan:{plan_id}", decide, actor="agent", blobs=kept)
    return fetched


def record_upstream_fault(
    plane: Plane, plan_id: str, server: str, tool: str, what: str
) -> PlanHalted:
    """The upstream could not answer a forwarded call (crash, timeout, protocol error)."""
    return record_halt(
        plane,
        plan_id,
        MCP_FAULT,
        f"MCP server {server!r} failed on a call of {tool!r}: {what}"[:2000],
        hint="check the MCP server (it crashed, timed out or broke the protocol), restart "
        "the proxy, then re-run unchanged",
        actor="agent",
    )
