"""The plane's MCP gate as the service offers it (``/mcp``, docs/service.md "MCP over
HTTP"): what an agent's MCP client is offered and what one ``tools/call`` does. The
plane side only — synchronous, no transport (``commands.service.mcp`` serves it over
streamable HTTP, for the plan of the request's credential).

**What is offered.** The plan's MCP tools the *operator* registered: a tool in the
registry whose MCP server the plane launches or reaches itself (``mcp_command`` or
``mcp_url``: ``launches_mcp``) and which the plan's skills let it call — under its
**registered name** (unique in the registry, the name the ledger, ``/v1/call`` and
``evidence call`` use; two servers' ``read_file`` never collide), with the input and
output schemas it was registered with (its declared ones). The agent never names a
server or a command: the servers are the operator's. Beside them the plane's agent-side
verbs (``evidence.plan_status``, ``evidence.validate``, ``evidence.record_fix``,
``evidence.apply``; never ``authorize``).

**One call** of a tool goes through ``call_tool`` exactly as ``evidence call`` does:
the input gate, the plane calling the tool's MCP server itself (a stdio server in the
plan's sandbox, confined), the output gate, all recorded; the sandbox keeps nothing of
a call that did not pass. The answer has the stdio proxy's shapes
(``commands.plane.mcp_answers``): a refusal is a tool error with the deviations (its
JSON in ``_meta``), the tool's own error is passed on, a passing call answers the
tool's result as its server gave it. A server that cannot serve the call halts the plan
(``environment_error``), as in the proxy, and is a JSON-RPC error (``GateCall.fault``).

A name the registry does not know is an invented tool (recorded as such: a failed
iteration); a registered tool the gate does not offer (a command tool, a validation, an
MCP tool the plane cannot launch) is refused with nothing recorded, as ``evidence call``
refuses a tool it cannot run: it is never run through this door.

**One server's door** (``/mcp/{server}``: ``server_tools``, ``server_call``,
``server_request``) is what ``evidence mcp proxy`` is for one upstream, without the
agent holding the plane: that server's tools under the names the server gives them (as
an MCP client that was configured with the server itself expects), the same gate on
every call, and the server's resources, prompts, completions and log level forwarded
on the plan's server, each resource read and prompt fetch recorded (``mcp.fetched``)
before the agent gets it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import mcp_types as types

from commands.errors import said_by
from commands.runner.mcp_client import BACKCHANNEL
from ledger import LedgerError
from projections.states import PlanState, ToolState

from . import input_rounds
from .core import CommandRefused, Plane
from .gates import NO_PARAMETERS, GateOutcome
from .hooks import MAX_TOOL_NAME, json_bytes, open_for_calls
from .mcp_answers import (
    OUTPUT_SCHEMA_META,
    call_verb,
    gate_failed,
    plane_tools,
    refused,
    step_of,
    upstream_failed,
    with_plan_state,
)
from .phases import require_execute, require_plan
from .proxy import MCP_TOOL_NAME, agent_name, check_fetched_name, record_fetch
from .proxy_verbs import PLANE_TOOLS
from .proxy_verbs import PREFIX as PLANE_PREFIX
from .runs import CallReport, call_tool, declares_output, forward_to_server, launches_mcp

__all__ = [
    "GATE",
    "Forwarded",
    "GateCall",
    "asked_of",
    "gate_call",
    "offered_tools",
    "offers",
    "round_of",
    "server_call",
    "server_request",
    "server_tools",
]

# How the gate names itself in a refusal of a plan state ("… tool calls only in Execute").
GATE = "the plane's MCP gate makes"


@dataclass(frozen=True)
class GateCall:
    """What one ``tools/call`` answers: a result (the tool's, or a tool error), or a
    ``fault`` (the tool's server could not serve it: a JSON-RPC error's message). The
    checks it recorded and a validation's outcome are for the service's metrics."""

    result: types.CallToolResult | types.InputRequiredResult | None
    fault: str | None = None
    gates: tuple[GateOutcome | None, ...] = ()
    validation: str | None = None


def offers(doc: ToolState) -> bool:
    """Whether the gate offers this registered tool (the plan's skills aside): a tool
    (not a validation) whose MCP server the plane launches or reaches itself, with a name
    no verb of the plane's has."""
    return (
        doc.kind == "tool"
        and launches_mcp(doc.spec)
        and not doc.name.startswith(PLANE_PREFIX)
        and len(doc.name) <= MAX_TOOL_NAME
    )


def _as_mcp_tool(doc: ToolState) -> types.Tool:
    """The tool as its MCP definition: its registered name and description, the input
    schema it was registered with (none: no parameters, what the gate checks), and its
    output schema when it declares one (a tool registered to return the MCP tool result
    itself declares none)."""
    spec = doc.spec
    declared_input = spec.declared_input_schema
    if not isinstance(declared_input, dict):
        declared_input = spec.input_schema if isinstance(spec.input_schema, dict) else None
    output: dict[str, Any] | None = None
    if declares_output(spec):
        found = spec.declared_output_schema
        output = found if isinstance(found, dict) else None
    return types.Tool(
        name=doc.name,
        description=spec.description or None,
        input_schema=declared_input or dict(NO_PARAMETERS),
        output_schema=output,
    )


def offered_tools(plane: Plane, plan_id: str) -> list[types.Tool]:
    """The plan's tools the gate offers (by registered name), then the plane's verbs."""
    log = plane.log()
    plan = log.state(f"plan:{plan_id}").of(PlanState)
    tools = [
        _as_mcp_tool(doc)
        for doc in log.registered_tools()
        if offers(doc) and (plan is None or plan.may_call(doc.name))
    ]
    return [*tools, *plane_tools()]


def gate_call(
    plane: Plane,
    plan_id: str,
    name: str,
    arguments: Any,
    meta: Mapping[str, Any] | None = None,
) -> GateCall:
    """One ``tools/call`` of ``name`` for plan ``plan_id``. A refusal of the plane's
    (the plan's state, a malformed ``_meta``, a tool not offered) is a tool error
    ``error: …`` with nothing appended."""
    try:
        verb = PLANE_TOOLS.get(name)
        if verb is not None:
            result = call_verb(plane, plan_id, verb, arguments)
            data = result.structured_content or {}
            found = data.get("validation") if not result.is_error else None
            done = GateCall(result, validation=found.get("outcome") if found else None)
        else:
            done = _call(plane, plan_id, name, arguments, meta)
    except LedgerError as exc:
        return GateCall(refused(said_by(exc, "mcp")))
    return _with_state(done, plane, plan_id)


def _with_state(done: GateCall, plane: Plane, plan_id: str) -> GateCall:
    """The answer with where the plan stands now (``with_plan_state``)."""
    if not isinstance(done.result, types.CallToolResult):
        return done
    return replace(done, result=with_plan_state(done.result, plane, plan_id))


AGENT_SCHEMA_REFUSED = (
    f"_meta {OUTPUT_SCHEMA_META!r}: a step's own output declaration is not accepted "
    "through the service; the registry's output schema judges (an operator narrows it "
    "by registering the tool again)"
)


def _call(
    plane: Plane, plan_id: str, name: str, arguments: Any, meta: Mapping[str, Any] | None
) -> GateCall:
    if not 0 < len(name) <= MAX_TOOL_NAME or not name.isprintable():
        raise CommandRefused(f"a tool's name is 1 to {MAX_TOOL_NAME} printable characters")
    open_for_calls(plane, plan_id, GATE)
    if meta is not None and OUTPUT_SCHEMA_META in meta:
        # Never compiled here: a schema of the agent's making is work of its choosing
        # (a 15 MiB enum, thousands of patterns) in the one process every agent shares.
        raise CommandRefused(AGENT_SCHEMA_REFUSED)
    step, _none = step_of(meta)
    doc = plane.log().tool(name)
    if doc is not None and not offers(doc):
        raise CommandRefused(
            f"{doc.kind} {name!r} is not offered here: only tools whose MCP server the "
            "plane launches are called through its MCP gate"
        )
    raw_params = json_bytes(arguments)
    back = BACKCHANNEL.get()
    resume = back.resume if back is not None else None
    if resume is not None and (resume.responses is not None or resume.round_id is not None):
        # the agent's answers, recorded (and their round closed) before the server has them
        input_rounds.given(plane, plan_id, name, raw_params, resume.responses or {},
                           resume.round_id)  # fmt: skip
    report = call_tool(plane, plan_id, name, raw_params, step=step)
    return _answered(name, report)


def _answered(name: str, report: CallReport) -> GateCall:
    gates = (report.input_gate, report.output_gate)
    if report.asked is not None and report.mcp_result is not None:
        return GateCall(asked_of(report.asked.round_id, report.mcp_result), gates=gates)
    if not report.input_gate.passed:
        blocked = gate_failed(report.input_gate, "blocked", "the call was not forwarded")
        return GateCall(blocked, gates=gates)
    halt = report.halt
    if halt is not None:  # the server could not be started, reached, or answer in time
        return GateCall(
            None,
            fault=f"{halt.reason}; the plan is halted with {halt.halt_type} ({halt.hint})",
            gates=gates,
        )
    if report.tool_failed and report.output_gate is not None:
        return GateCall(upstream_failed(_result_of(report), report.output_gate), gates=gates)
    if not report.ok:  # the output gate failed (an answer over the cap among others)
        failed = report.output_gate or report.input_gate
        rejected = gate_failed(failed, "rejected", "the output does not become state")
        return GateCall(rejected, gates=gates)
    return GateCall(_result_of(report), gates=gates)


def asked_of(round_id: str | None, result: dict[str, Any]) -> types.InputRequiredResult:
    """A server's questions as the gate passes them on: its ``requestState`` replaced by
    the gate's own (``ROUND``: the round the answers will close, the server's state),
    which the door seals, bound to the agent's credential and the call's arguments."""
    inner = {"round": round_id, "state": result.get("requestState")}
    questions = {**result, "requestState": json.dumps(inner, separators=(",", ":"))}
    return types.InputRequiredResult.model_validate(questions)


def round_of(state: str | None) -> tuple[str | None, str | None]:
    """The round and the server's state in a gate's own state (``asked_of``; the door
    checked that it sealed it): (None, None) without one."""
    if state is None:
        return None, None
    try:
        inner = json.loads(state)
    except ValueError:
        inner = None
    if not isinstance(inner, dict):
        raise CommandRefused("requestState: not a state this gate gave")
    found, upstream = inner.get("round"), inner.get("state")
    return (
        found if isinstance(found, str) else None,
        upstream if isinstance(upstream, str) else None,
    )


def _result_of(report: CallReport) -> types.CallToolResult:
    """The tool's result as its server answered it (every tool the gate offers is
    called on its MCP server: the result is there once it answered within its cap)."""
    assert report.mcp_result is not None
    return types.CallToolResult.model_validate(report.mcp_result)


# -- one server's door ---------------------------------------------------------------------

# The requests a server's door records (what the agent reads): method -> (what, the
# parameter naming it).
FETCHES = {"resources/read": ("resource", "uri"), "prompts/get": ("prompt", "name")}


@dataclass(frozen=True)
class Forwarded:
    """The server's answer to a forwarded request (its result as JSON), or the JSON-RPC
    error the agent gets instead (``code``, ``message``)."""

    result: dict[str, Any] | None
    code: int = 0
    message: str = ""


def _server_docs(plane: Plane, server: str) -> dict[str, ToolState]:
    """The tools of MCP server ``server`` the gate offers (the plan's skills aside), by
    the names the server gives them. A name the proxy would not offer (not printable
    ASCII, a plane verb's) is left out; of two tools with one MCP name, the first by
    registered name."""
    found: dict[str, ToolState] = {}
    for doc in sorted(plane.log().registered_tools(), key=lambda d: d.name):
        name = doc.spec.mcp_tool_name or ""
        if (
            doc.spec.mcp_server == server
            and offers(doc)
            and MCP_TOOL_NAME.fullmatch(name)
            and not name.startswith(PLANE_PREFIX)
        ):
            found.setdefault(name, doc)
    return found


def server_tools(plane: Plane, plan_id: str, server: str) -> list[types.Tool]:
    """What ``/mcp/{server}`` offers: the server's tools the plan may call, under the
    server's names for them and with their registered schemas, then the plane's verbs."""
    plan = plane.log().state(f"plan:{plan_id}").of(PlanState)
    tools = [
        _as_mcp_tool(doc).model_copy(update={"name": name})
        for name, doc in _server_docs(plane, server).items()
        if plan is None or plan.may_call(doc.name)
    ]
    return [*tools, *plane_tools()]


def server_call(
    plane: Plane,
    plan_id: str,
    server: str,
    name: str,
    arguments: Any,
    meta: Mapping[str, Any] | None = None,
) -> GateCall:
    """One ``tools/call`` at ``/mcp/{server}``: ``name`` is the server's name of the
    tool, gated as ``gate_call`` gates its registered name; a name the server's door
    does not know is an invented tool, recorded as an agent CLI names it
    (``mcp__SERVER__NAME``), as the proxy records one."""
    if name in PLANE_TOOLS:
        return gate_call(plane, plan_id, name, arguments, meta)
    doc = _server_docs(plane, server).get(name)
    registered = doc.name if doc is not None else agent_name(server, name)
    return gate_call(plane, plan_id, registered, arguments, meta)


def server_request(
    plane: Plane, plan_id: str, server: str, request: Any, result_type: Any
) -> Forwarded:
    """A request of the agent's to MCP server ``server`` other than a tool call
    (``request``, a model of ``mcp_types``; ``result_type`` its result's), forwarded as
    it came to the plan's server, launched and confined as for a call of one of its
    tools the plan may call. Only in Execute (a server the plane launches runs in the
    plan's sandbox); a pending decision does not stop it (it changes nothing). A
    resource read or a prompt fetch is recorded before the agent gets it. A server that
    fails the request halts nothing (no step rests on it): the agent gets the error."""
    method = str(request.method)
    fetch = FETCHES.get(method)
    try:
        name = str(getattr(request.params, fetch[1])) if fetch else ""
        if fetch:
            check_fetched_name(fetch[0], name)
        plan = require_plan(plane.state(f"plan:{plan_id}"), plan_id)
        require_execute(plan, plan_id, "the MCP servers the plane launches answer")
        docs = [d for d in _server_docs(plane, server).values() if plan.may_call(d.name)]
        if not docs:
            raise CommandRefused(
                f"no tool of MCP server {server!r} is offered to plan {plan_id}: the door "
                "forwards only to a server of the plan's tools"
            )

        async def forward(session: Any) -> Any:
            return await session.send_request(request, result_type)

        called = forward_to_server(plane, plan, docs[0], method, forward)
        if called.input_required is not None:  # questions first: nothing to record yet
            return Forwarded(called.input_required)
        if called.result is None:
            said = called.error or "its answer is larger than the tool's output cap"
            return Forwarded(None, called.error_code or types.INTERNAL_ERROR, said)
        if fetch:
            back = BACKCHANNEL.get()  # the answers to the server's questions it came with
            given = back.resume.responses if back is not None and back.resume else None
            record_fetch(plane, plan_id, server, fetch[0], name, called.result, given)
    except LedgerError as exc:
        return Forwarded(None, types.INVALID_REQUEST, said_by(exc, "mcp"))
    return Forwarded(called.result)
