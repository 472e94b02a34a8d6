"""Agent hooks: the pre- and post-tool-use hooks of an agent CLI (Claude Code's
``PreToolUse`` / ``PostToolUse``) put the structural gates in front of the agent's own
tool calls (docs/agents.md).

- ``pre_tool``: the input gate on the proposed call, recorded exactly as ``gate input``
  records it; a deviation blocks the call.
- ``post_tool``: the call and its output recorded as ``call --record-output`` records it
  (``tool.called``, executor ``recorded``), and the output gate on the response. The
  input gate the pre-tool hook recorded for the same call (same ``tool_use_id``, tool,
  version and parameter bytes) is not checked twice; without one it is checked here.
- A tool the registry does not know is an invented tool (``--unknown-tools deny``, the
  default), or, with ``record``, let through and recorded as the call of an
  unregistered tool (``tool.called`` with ``unregistered``) when it returns.

How the agent's tool name maps to the registry: the exact registered name first; else a
name ``mcp__SERVER__TOOL`` (Claude Code's name for an MCP server's tool) is the one
registered tool with ``mcp_server: SERVER`` and ``mcp_tool_name: TOOL``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from commands.text import inert
from ledger.events import GateChecked, ToolCalled
from ledger.intake import limit_bytes, parse_json
from projections.states import PlanState

from .core import CommandRefused, Plane
from .gates import GateOutcome, as_bytes, gate_input, routing_line
from .phases import require_execute, require_no_pending_decision, require_plan
from .runs import CallReport, call_tool, record_unregistered_call

UnknownTools = Literal["record", "deny"]
HookKind = Literal["pre", "post"]

# hook_event_name, when the caller sends one (Claude Code does).
EVENT_NAMES: dict[HookKind, str] = {"pre": "PreToolUse", "post": "PostToolUse"}
MAX_TOOL_NAME = 256
STEP_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
MCP_PREFIX = "mcp__"
# Where the hook input comes from, as refusals name it: the agent CLI's stdin, whether
# the hook command reads it itself or relays it to the plane's service unchanged.
HOOK_SOURCE = "stdin (the hook input)"
# The hook convention: exit 2 blocks the call (PreToolUse) or shows the reasons to the
# agent (PostToolUse); a refused command exits 2 as well, so both stop it.
EXIT_PASS, EXIT_BLOCK = 0, 2


@dataclass(frozen=True)
class HookCall:
    """The fields of a hook's input the plane uses (any other key is ignored)."""

    tool_name: str
    tool_input: Any
    tool_use_id: str | None = None
    tool_response: Any = None


def parse_hook_input(value: Any, kind: HookKind, source: str = "the hook input") -> HookCall:
    """The hook input (already parsed by the input layer), its used fields checked
    strictly: ``tool_name`` a non-empty string without control characters,
    ``tool_input`` present (its structure is the gate's to judge), ``tool_response``
    present after the call, ``tool_use_id`` absent or a plain id, ``hook_event_name``
    absent or the event of this hook."""
    if not isinstance(value, Mapping):
        raise CommandRefused(f"{source}: a JSON object is expected")
    event = value.get("hook_event_name")
    if event is not None and event != EVENT_NAMES[kind]:
        raise CommandRefused(
            f"{source}: hook_event_name is {str(event)[:80]!r}; this hook reads "
            f"{EVENT_NAMES[kind]} (check the hook configuration)"
        )
    name = value.get("tool_name")
    if (
        not isinstance(name, str)
        or not name
        or len(name) > MAX_TOOL_NAME
        or any(ord(c) < 32 or 127 <= ord(c) < 160 for c in name)
    ):
        raise CommandRefused(
            f"{source}: tool_name must be a non-empty string of at most {MAX_TOOL_NAME} "
            "characters without control characters"
        )
    if "tool_input" not in value:
        raise CommandRefused(f"{source}: tool_input is missing")
    if kind == "post" and "tool_response" not in value:
        raise CommandRefused(f"{source}: tool_response is missing (a PostToolUse input has it)")
    use_id = value.get("tool_use_id")
    if use_id is not None and (not isinstance(use_id, str) or not STEP_ID.fullmatch(use_id)):
        raise CommandRefused(
            f"{source}: tool_use_id must be letters, digits and . _ : - "
            "(starting with a letter or digit, at most 128 characters)"
        )
    return HookCall(name, value["tool_input"], use_id, value.get("tool_response"))


def read_hook_input(data: bytes, kind: HookKind, source: str = HOOK_SOURCE) -> HookCall:
    """The hook input's bytes through the input layer (the cap on agent bytes, one
    strict JSON document: depth, numbers, duplicate keys, strict UTF-8), its used fields
    checked strictly. The CLI hooks read them from stdin, the service from the request
    body: one reading, so both refuse the same bytes with the same words."""
    limit_bytes(data, "agent", source)
    return parse_hook_input(parse_json(data, source, kind=None), kind, source)


@dataclass
class HookVerdict:
    """What a hook decided: ``blocked`` is the hook's "block" answer (exit 2)."""

    blocked: bool
    tool: str | None  # the registered tool the agent's name maps to
    gate: GateOutcome | None = None  # the gate check that decided (pre), or failed (post)
    report: CallReport | None = None  # post: the recorded call and its output gate
    unregistered: ToolCalled | None = None  # post, --unknown-tools record


@dataclass(frozen=True)
class HookAnswer:
    """What a hook command answers the agent CLI: its exit status and its stderr (stdout
    is always empty). ``evidence hook`` prints it; the service sends it as JSON for a
    thin client to exit with — the same bytes either way."""

    exit: int
    stderr: str

    def to_json(self) -> dict[str, Any]:
        return {"exit": self.exit, "stderr": self.stderr}


_WORDS: dict[HookKind, tuple[str, str]] = {
    "pre": ("blocked", "the call is not made"),
    "post": ("rejected", "the output does not become state"),
}


def hook_answer(verdict: HookVerdict, plan_id: str, kind: HookKind) -> HookAnswer:
    """The answer to a verdict: exit 0 and nothing said when the call may go on (or was
    recorded and passed); else exit 2 with ``blocked: …`` / ``rejected: …``, one line
    per deviation and the routing line, each made inert (they hold the agent's names)."""
    if not verdict.blocked:
        return HookAnswer(EXIT_PASS, "")
    gate = verdict.gate
    assert gate is not None  # a hook blocks only on a failed gate check
    check = gate.check
    word, consequence = _WORDS[kind]
    if verdict.tool is None:
        what = f"tool {check.tool!r} is not registered (--unknown-tools deny)"
    else:
        what = f"the {check.gate} gate failed for tool {check.tool!r}"
    lines = [
        f"{word}: {what} in plan {plan_id}: {len(check.deviations)} deviation(s); {consequence}",
        *(
            f"  {d.pointer or '/'}: {d.kind} (expected {d.expected}; got {d.actual_type})"
            for d in check.deviations
        ),
        routing_line(gate),
    ]
    return HookAnswer(EXIT_BLOCK, "".join(inert(line) + "\n" for line in lines))


def refused_answer(message: str) -> HookAnswer:
    """The answer to a refused command: exit 2 and the CLI's one ``error: …`` line."""
    return HookAnswer(EXIT_BLOCK, f"error: {inert(message)}\n")


def resolve_tool(plane: Plane, name: str) -> str | None:
    """The registered tool the agent calls ``name``: the exact name, else for
    ``mcp__SERVER__TOOL`` the one tool registered with that MCP server and tool name
    (two are ambiguous: refused). None when the registry knows neither."""
    log = plane.log()
    if log.tool(name) is not None:
        return name
    if name.startswith(MCP_PREFIX):
        server, sep, tool = name[len(MCP_PREFIX) :].partition("__")
        if server and sep and tool:
            found = log.mcp_tools(server, tool)
            if len(found) > 1:
                raise CommandRefused(
                    f"tool {name!r} is ambiguous: {', '.join(found)} are all registered as "
                    f"{tool!r} on MCP server {server!r}"
                )
            if found:
                return found[0]
    return None


def hook_output(response: Any) -> Any:
    """What the output gate checks of a tool response: an MCP result's
    ``structuredContent`` (an object with a ``content`` list and ``structuredContent``:
    MCP output schemas describe the structured content); any other response as the JSON
    value it is — a text response is a JSON string, never parsed into something else."""
    if (
        isinstance(response, Mapping)
        and isinstance(response.get("content"), list)
        and "structuredContent" in response
    ):
        return response["structuredContent"]
    return response


def pre_tool(
    plane: Plane,
    plan_id: str,
    call: HookCall,
    *,
    unknown: UnknownTools = "deny",
    actor: str = "agent",
) -> HookVerdict:
    """The input gate on a proposed call. An unregistered tool is an invented tool
    (``deny``), or let through with nothing appended yet (``record``: the post-tool hook
    records the call when it returns)."""
    doc = open_for_calls(plane, plan_id, "agent hooks gate")
    tool = resolve_tool(plane, call.tool_name)
    if tool is None and _records_unknown(doc, unknown):
        return HookVerdict(blocked=False, tool=None)
    outcome = gate_input(
        plane,
        plan_id,
        tool or call.tool_name,
        json_bytes(call.tool_input),
        step=call.tool_use_id,
        actor=actor,
    )
    return HookVerdict(blocked=not outcome.passed, tool=tool, gate=outcome)


def post_tool(
    plane: Plane,
    plan_id: str,
    call: HookCall,
    *,
    unknown: UnknownTools = "deny",
    actor: str = "agent",
) -> HookVerdict:
    """Record a call the agent made and gate its output (``strict_mode`` routes a
    deviation to compensation, as ``call`` does)."""
    doc = open_for_calls(plane, plan_id, "agent hooks gate")
    raw_params = json_bytes(call.tool_input)
    output = json_bytes(hook_output(call.tool_response))
    tool = resolve_tool(plane, call.tool_name)
    if call.tool_use_id is not None:
        _refuse_recorded_twice(plane, plan_id, call.tool_use_id)
    if tool is None:
        if _records_unknown(doc, unknown):
            called = record_unregistered_call(
                plane,
                plan_id,
                call.tool_name,
                raw_params,
                output,
                step=call.tool_use_id,
                actor=actor,
            )
            return HookVerdict(blocked=False, tool=None, unregistered=called)
        # The call ran anyway (no pre-tool hook stopped it): an invented tool, recorded.
        outcome = gate_input(
            plane, plan_id, call.tool_name, raw_params, step=call.tool_use_id, actor=actor
        )
        return HookVerdict(blocked=True, tool=None, gate=outcome)
    prior = _pre_tool_check(plane, plan_id, tool, call.tool_use_id, raw_params)
    report = call_tool(
        plane,
        plan_id,
        tool,
        raw_params,
        step=call.tool_use_id,
        recorded_output=output,
        actor=actor,
        input_gate=prior,
    )
    failed = report.input_gate if not report.input_gate.passed else report.output_gate
    return HookVerdict(blocked=not report.ok, tool=tool, gate=failed, report=report)


def _records_unknown(doc: PlanState, unknown: UnknownTools) -> bool:
    """``--unknown-tools record`` lets an unregistered tool through, except in a plan
    with skills: a tool the registry does not know is in none of them."""
    return unknown == "record" and doc.skills is msgspec.UNSET


def json_bytes(value: Any) -> bytes:
    """The bytes a gate checks and the log keeps of a value of the hook input: its JSON
    (a string is a JSON string here, never raw JSON text)."""
    return as_bytes(msgspec.json.encode(value))


def open_for_calls(plane: Plane, plan_id: str, who: str) -> PlanState:
    """The plan an agent's door (a hook, the MCP proxy) works for: known, not ended, in
    Execute, no decision pending. Refused before anything is appended otherwise (the
    door then blocks the call); ``who`` names the door in the refusal."""
    doc = require_plan(plane.log().state(f"plan:{plan_id}"), plan_id)
    require_no_pending_decision(doc, plan_id)
    require_execute(doc, plan_id, f"{who} tool calls")
    return doc


def _refuse_recorded_twice(plane: Plane, plan_id: str, step: str) -> None:
    for event in plane.store.read_stream(f"plan:{plan_id}"):
        p = event.payload
        if isinstance(p, ToolCalled) and p.step == step:
            raise CommandRefused(
                f"the call {step} of plan {plan_id} is already recorded (position {event.position})"
            )


def _pre_tool_check(
    plane: Plane, plan_id: str, tool: str, step: str | None, raw_params: bytes
) -> GateOutcome | None:
    """The pre-tool hook's passing input gate check of this very call — the last input
    check at its step, of this tool at its current version, on these exact bytes — or
    None (the input gate is then checked on the post-tool input)."""
    if step is None:
        return None
    found = plane.log().tool(tool)
    last = None
    for event in plane.store.read_stream(f"plan:{plan_id}"):
        p = event.payload
        if isinstance(p, GateChecked) and p.gate == "input" and p.step == step:
            last = event
    if last is None or found is None:
        return None
    check = last.payload
    assert isinstance(check, GateChecked)
    digest = hashlib.sha256(raw_params).hexdigest()
    if (
        check.verdict == "pass"
        and check.tool == tool
        and check.tool_version == found.version
        and check.checked_sha256 == digest
    ):
        return GateOutcome(check, None, [last], recorded=False)
    return None
