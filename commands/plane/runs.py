"""Tool calls and halts: the plane runs real programs and records
what they did — it never fabricates a result (a validation that gave no verdict is
recorded as such, never as a failure or a pass).

- ``call_tool``: input gate -> the tool's program as a real subprocess, or its MCP
  server's tool called through the SDK client (or an output an orchestrator ran itself)
  -> output gate; the call and its output bytes are recorded. A program or an MCP
  server that cannot be invoked halts the plan with ``environment_error``.
- validation runs: ``commands.plane.validation_runs``.
- ``record_halt``: an orchestrator's own halt, its raw type mapped to the canonical
  outcome (unknown raw types are non-verdicts, never blockers); an escalate halt is a
  pending decision, as the failure loop's.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
from ulid import ULID

from commands.runner.confine import Confinement
from commands.runner.guards import Guard
from commands.runner.mcp_client import (
    LEGACY_MCP_TOOL_RESULT_SHA256,
    Forward,
    McpCall,
    call_mcp_tool,
    capped,
    is_tool_error,
    json_bytes,
    mcp_tool_result_schema,
    refused_error,
)
from commands.runner.mcp_client import tool_output as mcp_tool_output
from commands.runner.process import (
    ArgvError,
    fill_argv,
    output_cap,
    run_command,
    tool_output,
)
from commands.runner.results import RESULT_SCHEMA
from commands.runner.said import Said
from commands.runner.sandbox import resource_kind
from commands.runner.validations import run_validation
from commands.schemas.prepare import prepare_schema
from ledger.events import (
    EventPayload,
    Exchange,
    McpInputRequired,
    PlanHalted,
    ToolCalled,
    Truncation,
)
from ledger.intake import InputError
from ledger.timestamps import utc_now
from projections.outcomes import NEXT_ACTION, canonical_halt
from projections.states import PlanState, ToolSpec, ToolState, given, to_json

from . import input_rounds, tracing
from .confinement import validation_confinement, work_confinement
from .core import CommandRefused, Plane, StreamState
from .failure_loop import authorize_hint, escalation
from .gates import GateOutcome, as_bytes, gate_input, gate_output, sha256_hex
from .lifecycle import refuse_hard_links
from .phases import require_execute, require_no_pending_decision, require_plan

DEFAULT_TIMEOUT_S = 300.0
# The raw halt type of an MCP server that fails a call (environment_error), the same as
# the MCP proxy records for its upstream's faults.
MCP_FAULT = "backend_unavailable"
MAX_PARALLEL = 4


def _truncations(run: Any) -> dict[str, Truncation]:
    """The ``*_truncated`` fields of an event: only the streams that went over their cap
    (the fields are absent otherwise, so an event without truncation keeps its bytes)."""
    return {
        name: found
        for name in ("stdout_truncated", "stderr_truncated")
        if (found := getattr(run, name)) is not None
    }


def _cap_of(spec: Mapping[str, Any] | None) -> int:
    """The output cap a program of ``spec`` runs with; an invalid
    ``EVIDENCE_MAX_OUTPUT_BYTES`` refuses the command before anything is recorded."""
    try:
        return output_cap(spec)
    except InputError as exc:
        raise CommandRefused(str(exc)) from None


Sandbox = Mapping[str, Path]  # resource -> the directory work on it happens in


def sandbox_of(plane: Plane, plan: PlanState, sandbox: Sandbox | None = None) -> Sandbox:
    """Where the plan's work happens until Apply: its sandbox (made on first use if the
    plan entered Execute elsewhere), never the real resource; refused when it holds a
    hard link (``refuse_hard_links``)."""
    copies = sandbox if sandbox is not None else plane.sandbox(plan).ensure().copies
    refuse_hard_links(plan.plan_id, copies)
    return copies


def workdir_of(plan: PlanState, sandbox: Sandbox) -> Path | None:
    """The copy of the plan's first resource (every resource has one: a directory's copy,
    a single file's directory, a named resource's private directory)."""
    for resource in plan.resources:
        found = sandbox.get(resource)
        if found is not None:
            return found
    return None


def _execute_plan(state: StreamState, plan_id: str) -> PlanState:
    doc = require_plan(state, plan_id)
    require_no_pending_decision(doc, plan_id)
    require_execute(doc, plan_id, "tool calls and validations happen")
    return doc


# -- tool calls --------------------------------------------------------------------------


@dataclass(frozen=True)
class Exchanged:
    """What a tool's MCP server sent the agent's client during a call besides its result:
    the messages as one JSON array (kept as a blob) and their counts."""

    messages: bytes
    counts: Exchange


EXCHANGE_KINDS = ("log", "progress", "sampling", "elicitation")


def exchanged(messages: Sequence[Mapping[str, Any]]) -> Exchanged | None:
    """What the upstream said to the agent's client during a call (each message a
    ``{"kind": KIND, ...}`` object, a refused request with ``"refused": true``) as the
    call records it, within the budget of ``Said``; None when it said nothing else."""
    said = messages if isinstance(messages, Said) else Said.of(messages)
    if not said:
        return None
    counts = {kind: said.counts[kind] for kind in EXCHANGE_KINDS}
    found = Exchange(**counts, refused=said.refused, dropped=said.dropped or msgspec.UNSET)
    return Exchanged(json_bytes(list(said)), found)


@dataclass(frozen=True)
class Recorded:
    """A call's output as the orchestrator that made the call recorded it (the plane did
    not run it). ``truncation``: ``output`` is the kept prefix of an output over its cap
    (never parsed). ``tool_error``: the tool's own error (an MCP result with
    ``isError``), checked as an MCP tool result. ``exchange``: what its MCP server said
    to the agent's client meanwhile."""

    output: bytes | str | Any
    truncation: Truncation | None = None
    tool_error: bool = False
    exchange: Exchanged | None = None


@dataclass
class CallReport:
    input_gate: GateOutcome
    call: ToolCalled | None = None
    output_gate: GateOutcome | None = None
    halt: PlanHalted | None = None
    output: bytes | None = None
    # The MCP tool result as the server answered it, for a call the plane made on the
    # tool's MCP server (what an MCP gate passes on to the agent once the call passed);
    # or its questions for the agent's client, when it asked instead (``asked``).
    mcp_result: dict[str, Any] | None = None
    asked: McpInputRequired | None = None

    @property
    def ok(self) -> bool:
        """Both gates passed and the tool did not fail: the call's result counts."""
        output = self.output_gate
        passed = self.input_gate.passed and output is not None and output.passed
        return passed and not self.tool_failed

    @property
    def tool_failed(self) -> bool:
        """The tool answered with an error of its own (``tool.called`` ``tool_error``)."""
        return self.call is not None and self.call.tool_error is True

    def to_json(self) -> dict[str, Any]:
        return {
            "input_gate": self.input_gate.to_json(),
            "call": msgspec.to_builtins(self.call) if self.call else None,
            "output_gate": self.output_gate.to_json() if self.output_gate else None,
            "halt": msgspec.to_builtins(self.halt) if self.halt else None,
        }


def call_tool(
    plane: Plane,
    plan_id: str,
    tool: str,
    params: bytes | str | Any,
    *,
    step: str | None = None,
    output_schema: Any = None,
    recorded_output: bytes | str | Any | None = None,
    recorded: Recorded | None = None,
    sandbox: Sandbox | None = None,
    actor: str = "agent",
    input_gate: GateOutcome | None = None,
) -> CallReport:
    """Input gate, run (or take the recorded output), output gate; all recorded.

    ``input_gate``: the passing input gate check already recorded for exactly these
    parameters of this tool at this step (an agent hook's pre-tool check); it is not
    checked again. ``recorded_output`` is ``recorded=Recorded(output)``: the output of a
    call the caller made itself.

    Traced (``tracing``) as the GenAI tool execution ``execute_tool {tool}``, its
    gates and its run the spans within it."""
    call_id = str(ULID())
    step = step or f"call-{call_id}"
    with tracing.operation(
        f"execute_tool {tool}",
        lambda: {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": call_id,
            "evidence.operation": "call",
            "evidence.plan.id": plan_id,
            "evidence.step": step,
        },
        records=ToolCalled.type_name(),
    ) as op:
        report = _call_tool(
            plane, plan_id, tool, params, call_id=call_id, step=step,
            output_schema=output_schema, recorded_output=recorded_output, recorded=recorded,
            sandbox=sandbox, actor=actor, input_gate=input_gate,
        )  # fmt: skip
        if op is not None:
            op.set(_call_outcome(report))
        return report


def _call_outcome(report: CallReport) -> dict[str, Any]:
    """What a traced call's span says of its end (``error.type``: why it did not pass)."""
    failed = None
    if not report.input_gate.passed:
        failed = "input_gate"
    elif report.halt is not None:
        failed = "halted"
    elif report.tool_failed:
        failed = "tool_error"
    elif report.output_gate is not None and not report.output_gate.passed:
        failed = "output_gate"
    return {"evidence.call.ok": report.ok, "error.type": failed}


def _call_tool(
    plane: Plane,
    plan_id: str,
    tool: str,
    params: bytes | str | Any,
    *,
    call_id: str,
    step: str,
    output_schema: Any,
    recorded_output: bytes | str | Any | None,
    recorded: Recorded | None,
    sandbox: Sandbox | None,
    actor: str,
    input_gate: GateOutcome | None,
) -> CallReport:
    if recorded_output is not None:
        recorded = Recorded(recorded_output)
    raw_params = as_bytes(params)
    log = plane.log()
    found = log.state(f"plan:{plan_id}")
    plan = found.of(PlanState)
    if plan is not None:  # refuse before recording anything when no call is possible
        _execute_plan(found, plan_id)
    tool_doc = log.tool(tool)
    _refuse_unrunnable(tool, tool_doc, recorded)
    output_schema, narrowing = _judged_by(tool_doc, output_schema)
    if recorded is None and tool_doc is not None:
        _cap_of(to_json(tool_doc.spec))  # refused here, before the input gate is recorded
    # Where the call would run, made before anything is recorded: a workdir that cannot
    # hold the sandbox refuses the command with the ledger unchanged.
    copies = sandbox_of(plane, plan, sandbox) if plan is not None else None
    # How its program would run: refused here, before anything is recorded, where the
    # kernel cannot confine it and the plan did not opt out.
    confinement = None
    if recorded is None and plan is not None and tool_doc is not None and copies is not None:
        confinement = _call_confinement(plane, plan, tool_doc, copies)
    report = CallReport(_input_gate(plane, plan_id, tool, raw_params, step, actor, input_gate))
    if not report.input_gate.passed:
        return report  # an invented tool or bad parameters: the call is never made
    assert plan is not None and tool_doc is not None and copies is not None  # it passed
    # The sandbox as it was before the call: put back unless the call passes both gates
    # (a recorded call runs nothing here: whoever ran it guarded it, as the proxy does).
    guards = [plane.guard_sandbox(plan_id, c) for c in copies.values()] if recorded is None else []
    site = _Site(plane, plan, tool_doc, raw_params, copies, recorded, call_id, step, actor,
                 confinement)  # fmt: skip
    try:
        _run_call(site, report, output_schema=output_schema, narrowing=narrowing)
    finally:
        _after_call(plane, plan, guards, report, keep_names=sandbox is not None)
    return report


def _refuse_unrunnable(tool: str, tool_doc: ToolState | None, recorded: Recorded | None) -> None:
    """A registered tool the plane has no way to run, and no recorded output: refused
    before anything is recorded."""
    if recorded is not None or tool_doc is None or tool_doc.kind == "validation":
        return
    if not tool_doc.spec.command and not launches_mcp(tool_doc.spec):
        raise CommandRefused(
            f"tool {tool!r} has no command to run here, nor an MCP server the plane can "
            "launch (`mcp_command` or `mcp_url`): record the output of the call you made "
            "with --record-output"
        )


def _judged_by(tool_doc: ToolState | None, given: Any) -> tuple[Any, Any]:
    """(the schema the output is judged by, the caller's narrowing of it).

    The output is judged by the registry: the tool's own output schema (a validation's
    structured return, an MCP tool result for an MCP tool declaring none). A schema the
    caller gives (`call --output-schema`, a plan file step's `output`, the proxy's
    `_meta`) only narrows: it is checked after the registry's, never instead of it."""
    if tool_doc is not None and tool_doc.kind == "validation":
        # A validation called as a tool returns its structured return: closed, with
        # `data` any object (what the nodes downstream of it read).
        return RESULT_SCHEMA, given
    if tool_doc is not None and tool_doc.spec.output_schema is None:
        # The registry declares nothing for it (an MCP tool gets the MCP result shape
        # later): the caller's declaration is the only one, as before.
        return given, None
    return None, given


def _input_gate(
    plane: Plane,
    plan_id: str,
    tool: str,
    raw_params: bytes,
    step: str,
    actor: str,
    given: GateOutcome | None,
) -> GateOutcome:
    """The call's input gate: checked and recorded now, or the passing check a hook
    already recorded for exactly this tool and step (anything else is refused)."""
    if given is None:
        return gate_input(
            plane, plan_id, tool, raw_params, step=step, actor=actor, call_follows=True
        )
    if not (given.passed and given.check.tool == tool and given.check.step == step):
        raise CommandRefused(f"the input gate given is no pass of tool {tool!r} at step {step!r}")
    return given


def _after_call(
    plane: Plane, plan: PlanState, guards: list[Guard], report: CallReport, *,
    keep_names: bool,
) -> None:  # fmt: skip
    """The sandbox as the call leaves it: kept if the call passed, else put back; a
    named resource's private directory keeps nothing (unless the caller gave its own
    sandbox)."""
    for guard in guards:
        if report.ok:
            guard.discard()
        else:
            guard.restore_if_changed()
    # (A server that asked for input is kept: the agent's answer comes back to it, and
    # a server of the stateless revision keeps what it needs in the state it sent.)
    if plane.mcp_sessions is not None and report.call is not None and not report.ok:
        # A server whose call did not pass keeps nothing of it: not what it wrote in
        # the sandbox (put back above), nor what it holds in memory. The next call
        # starts it afresh on the restored copy.
        plane.mcp_sessions.drop(plan.plan_id)
    if not keep_names:
        plane.sandbox(plan).clear_names({r: resource_kind(r) for r in plan.resources})


@dataclass(frozen=True)
class _Site:
    """One call that passed its input gate, as every phase of running and recording it
    reads it: the plan and tool, the parameters' bytes, where it runs (the sandbox's
    copies, confined so), the output the caller recorded instead (if any), the call's
    id and step, and who asked."""

    plane: Plane
    plan: PlanState
    tool_doc: ToolState
    raw_params: bytes
    copies: Sandbox
    recorded: Recorded | None
    call_id: str
    step: str
    actor: str
    confinement: Confinement | None


def _run_call(site: _Site, report: CallReport, *, output_schema: Any, narrowing: Any) -> None:
    plane, plan, tool_doc, recorded = site.plane, site.plan, site.tool_doc, site.recorded
    plan_id, tool, spec = plan.plan_id, tool_doc.name, tool_doc.spec
    step, actor, call_id, raw_params = site.step, site.actor, site.call_id, site.raw_params
    run_started = tracing.now_ns()
    ran = _execute(site, report)
    if ran is None:
        return  # halted: the program or its server could not be had
    output, executor, tool_error, said = ran.output, ran.executor, ran.tool_error, ran.said
    streams = ran.streams
    if executor == "mcp" and output_schema is None and spec.output_schema is None:
        # No declaration of its own: an MCP tool returns an MCP tool result.
        output_schema = mcp_tool_result_schema()
    run_ended = tracing.now_ns()
    exchange = recorded.exchange if recorded is not None else exchanged(said)
    if exchange is not None and exchange.counts.refused:
        tool_error = True  # it answered without what it asked the agent's client for
    if tool_error:
        # The tool's own failure: checked as the MCP tool result it is, never against
        # the tool's declaration (a deviation there would be counted as the agent's).
        output_schema, narrowing = mcp_tool_result_schema(), None
    called = _called(site, ran, tool_error, exchange)

    # Only a command tool's stdout or an MCP tool's output can be truncated (a
    # validation called as a tool gives the plane's own encoding of its result).
    truncated = (
        streams.get("stdout_truncated") if executor in ("command", "mcp", "recorded") else None
    )
    # The call and the verdict on its output: one transaction.
    report.output_gate = gate_output(
        plane,
        plan_id,
        step,
        output,
        schema=output_schema,
        actor=actor,
        truncated=truncated,
        call=called,
        call_blobs=[raw_params, output, *([exchange.messages] if exchange else [])],
        instead_of_registered=True,  # decided above: the registry's, or the MCP result's
    )
    report.call, report.output = called, output
    if run_started:  # traced: the run, now that its record is appended
        tracing.past(
            f"run {tool}",
            run_started,
            run_ended,
            {
                "evidence.operation": "tool_run",
                "evidence.plan.id": plan_id,
                "evidence.step": step,
                "evidence.executor": executor,
                "gen_ai.tool.name": tool,
                "gen_ai.tool.call.id": call_id,
                "error.type": "tool_error" if tool_error else None,
            },
            records=ToolCalled.type_name(),
        )
    if narrowing is not None and report.output_gate.passed and not tool_error:
        # The caller's declaration narrows what passed the registry's: a second check,
        # recorded on its own (a deviation from it fails the call like any other).
        report.output_gate = gate_output(
            plane,
            plan_id,
            step,
            output,
            schema=narrowing,
            actor=actor,
            truncated=truncated,
            instead_of_registered=True,
        )


def _called(site: _Site, ran: _Ran, tool_error: bool, exchange: Exchanged | None) -> ToolCalled:
    """The call's record: what was called, with what, how it ran and what it said."""
    plan, tool_doc, confinement = site.plan, site.tool_doc, site.confinement
    return ToolCalled(
        plan_id=plan.plan_id,
        call_id=site.call_id,
        tool=tool_doc.name,
        tool_version=tool_doc.version,
        step=site.step,
        attempt=plan.attempt,
        executor=ran.executor,  # type: ignore[arg-type]
        params_sha256=sha256_hex(site.raw_params),
        output_sha256=sha256_hex(ran.output),
        exit_code=ran.exit_code,
        started_at=ran.started,
        ended_at=ran.ended,
        duration_ms=_duration_ms(ran.started, ran.ended),
        stdout_truncated=ran.streams.get("stdout_truncated", msgspec.UNSET),
        stderr_truncated=ran.streams.get("stderr_truncated", msgspec.UNSET),
        confinement=confinement.level if confinement is not None else msgspec.UNSET,
        tool_error=True if tool_error else msgspec.UNSET,
        exchange_sha256=sha256_hex(exchange.messages) if exchange else msgspec.UNSET,
        exchange=exchange.counts if exchange else msgspec.UNSET,
    )


@dataclass
class _Ran:
    """What running a call gave, whichever way it ran (``_execute``)."""

    output: bytes
    executor: str  # command, validation, mcp or recorded (``ToolCalled.executor``)
    started: str
    ended: str
    streams: dict[str, Truncation] = field(default_factory=dict)
    exit_code: int | None = None
    tool_error: bool = False
    said: Said = field(default_factory=Said)  # what an MCP server said meanwhile


def _execute(site: _Site, report: CallReport) -> _Ran | None:
    """Run the call its way: take the recorded output, run a validation in its copy,
    call the MCP server, or run the command. None when it halted the plan
    (``report.halt``)."""
    plane, plan, tool_doc, recorded = site.plane, site.plan, site.tool_doc, site.recorded
    if recorded is not None:
        now = utc_now()
        streams = {"stdout_truncated": recorded.truncation} if recorded.truncation else {}
        return _Ran(as_bytes(recorded.output), "recorded", now, now, streams,
                    tool_error=recorded.tool_error)  # fmt: skip
    if tool_doc.kind == "validation":
        # Read-only exactly as in `validate`: it runs in a throwaway copy of the sandbox.
        output, started, ended, streams = _call_validation(
            plane, plan, tool_doc, site.raw_params, site.copies, site.confinement
        )
        return _Ran(output, "validation", started, ended, streams)
    if launches_mcp(tool_doc.spec):
        called = _call_mcp(site)
        if isinstance(called, PlanHalted):
            report.halt = called
            return None
        if isinstance(called, _Asked):  # questions instead of a result: no output yet
            report.asked, report.mcp_result = called.event, called.result
            return None
        output, started, ended, streams, tool_error, report.mcp_result, said = called
        return _Ran(output, "mcp", started, ended, streams, tool_error=tool_error, said=said)
    return _run_command_tool(site, report)


def _run_command_tool(site: _Site, report: CallReport) -> _Ran | None:
    """The tool's command as a real subprocess in the sandbox; a program that is not
    there halts the plan (``program_missing``) and answers None."""
    plane, plan, copies, confinement = site.plane, site.plan, site.copies, site.confinement
    tool, spec, raw_params = site.tool_doc.name, site.tool_doc.spec, site.raw_params
    try:
        argv = fill_argv(spec.command or [], msgspec.json.decode(raw_params))
    except ArgvError as exc:
        raise CommandRefused(f"cannot build the command line of {tool!r}: {exc}") from None
    timeout = spec.timeout_ms / 1000 if spec.timeout_ms else DEFAULT_TIMEOUT_S
    result = run_command(
        argv,
        cwd=workdir_of(plan, copies),
        timeout_s=timeout,
        max_output_bytes=_cap_of(to_json(spec)),
        confinement=confinement,
    )
    if result.missing_program is not None:
        report.halt = record_halt(
            plane,
            plan.plan_id,
            "program_missing",
            f"tool {tool!r} could not be invoked: {result.missing_program!r} was not found",
            hint=f"install `{result.missing_program}` where the plan runs "
            "(it is not on PATH), then re-run unchanged",
            actor=site.actor,
        )
        return None
    # A stdout over the cap is its kept bytes, never parsed: the gate finds no JSON.
    output, _value = tool_output(result)
    return _Ran(output, "command", result.started_at, result.ended_at, _truncations(result),
                exit_code=result.exit_code)  # fmt: skip


def _call_confinement(
    plane: Plane, plan: PlanState, tool_doc: ToolState, copies: Sandbox
) -> Confinement | None:
    """How the call's program runs: a validation read-only (in its throwaway copy), a
    command or an MCP server the plane launches in the sandbox (its copies writable);
    None for a server the plane only reaches (``mcp_url``: it runs elsewhere)."""
    if tool_doc.kind == "validation":
        return validation_confinement(plane, plan)
    spec = tool_doc.spec
    if launches_mcp(spec) and not given(spec.mcp_command):
        return None
    template = given(spec.mcp_command) if launches_mcp(spec) else spec.command
    confinement = work_confinement(plane, plan, copies.values())
    network = None if spec.network is msgspec.UNSET else msgspec.to_builtins(spec.network)
    return confinement.running(template, network)


def launches_mcp(spec: ToolSpec) -> bool:
    """The plane can call this tool's MCP server itself (it says how to launch it)."""
    return bool(given(spec.mcp_command) or given(spec.mcp_url))


@functools.cache
def _mcp_tool_result_sha256() -> str:
    return prepare_schema(mcp_tool_result_schema()).sha256


def declares_output(spec: ToolSpec) -> bool:
    """The tool declares its own output, which an MCP server returns as
    ``structuredContent``; a tool declared to return the MCP tool result itself (as the
    MCP proxy registers one whose server lists no output schema) does not."""
    if spec.output_schema_sha256 is None:
        return False
    return spec.output_schema_sha256 not in (
        _mcp_tool_result_sha256(),
        LEGACY_MCP_TOOL_RESULT_SHA256,
    )


_McpRan = tuple[bytes, str, str, dict[str, Truncation], bool, dict[str, Any], Said]


@dataclass(frozen=True)
class _Asked:
    """The server asked the agent's client for input instead of answering (recorded)."""

    event: McpInputRequired
    result: dict[str, Any]


def _call_mcp(site: _Site) -> PlanHalted | _Asked | _McpRan:
    """Call the tool on its MCP server (a stdio server runs in the sandbox, as a
    command tool does), with what the server asked of the plane's client and was
    refused (``Said``). Its output, within the tool's output cap, is what the MCP
    proxy's output gate takes of a result: ``structuredContent`` when the tool declares
    its output, else the whole result. A server that cannot be started, dies, fails or
    hangs halts the plan with ``environment_error``."""
    plane, plan, tool_doc, actor = site.plane, site.plan, site.tool_doc, site.actor
    spec, tool, raw_params = tool_doc.spec, tool_doc.name, site.raw_params
    arguments = msgspec.json.decode(raw_params)
    if not isinstance(arguments, dict):  # the registry keeps MCP tools' inputs objects
        raise CommandRefused(f"the arguments of MCP tool {tool!r} must be an object")
    command = given(spec.mcp_command)
    launch = _mcp_reach(plane, plan, tool_doc, site.copies, site.confinement)
    cap = launch["cap"]
    call = call_mcp_tool(
        spec.mcp_tool_name or "",
        arguments,
        # Registered from a file: its copy of the schemas must still be the server's.
        declared=(spec.declared_input_schema, spec.declared_output_schema)
        if not spec.source.startswith("mcp:")
        else None,
        **launch,
    )
    if call.truncation is not None and call.kept is not None:
        # Over the cap: the kept prefix of the answer, never parsed (a command's stdout).
        streams = {"stdout_truncated": call.truncation}
        return call.kept, call.started_at, call.ended_at, streams, False, {}, Said()
    if call.input_required is not None:
        meanwhile = exchanged(call.exchange if isinstance(call.exchange, Said) else Said())
        asked = input_rounds.asked(
            plane, plan, tool, site.step, raw_params, call.input_required, call.duration_ms,
            (meanwhile.messages, meanwhile.counts) if meanwhile else None,
        )  # fmt: skip
        return _Asked(asked, call.input_required)
    result = call.result if call.result is not None else refused_error(call)
    if result is None:
        server = spec.mcp_server
        if call.fault == "schema_drift":
            return record_halt(
                plane,
                plan.plan_id,
                "schema_drift",
                f"tool {tool!r} was not called: MCP server {server!r}: {call.error}"[:2000],
                hint=f"operator: register {tool!r} again from the server's own declaration, "
                "then re-run",
                actor=actor,
            )
        if call.fault == "missing_program" and command:
            return record_halt(
                plane,
                plan.plan_id,
                "program_missing",
                f"tool {tool!r} could not be invoked: MCP server {server!r} could not be "
                f"started: {call.error}"[:2000],
                hint=f"install `{command[0]}` where the plan runs (it is not on PATH), "
                "then re-run unchanged",
                actor=actor,
            )
        return record_halt(
            plane,
            plan.plan_id,
            MCP_FAULT,
            f"MCP server {server!r} failed on a call of {tool!r}: {call.error}"[:2000],
            hint="check the MCP server (it could not be started or reached, crashed, "
            "failed, timed out or broke the protocol), then re-run unchanged",
            actor=actor,
        )
    value = mcp_tool_output(result, declares_output(spec))
    output, truncation = capped(json_bytes(value), cap)
    streams = {"stdout_truncated": truncation} if truncation is not None else {}
    tool_error = is_tool_error(result)
    said = call.exchange if isinstance(call.exchange, Said) else Said()
    return output, call.started_at, call.ended_at, streams, tool_error, result, said


def _mcp_reach(
    plane: Plane,
    plan: PlanState,
    tool_doc: ToolState,
    copies: Sandbox,
    confinement: Confinement | None,
) -> dict[str, Any]:
    """How the plane reaches a tool's MCP server for ``plan`` (``call_mcp_tool``'s
    launch arguments): its command in the plan's sandbox, confined, or its URL; on the
    server the service keeps open for the plan, when it keeps servers."""
    spec = tool_doc.spec
    return {
        "command": given(spec.mcp_command),
        "url": given(spec.mcp_url),
        "cwd": workdir_of(plan, copies),
        "timeout_s": spec.timeout_ms / 1000 if spec.timeout_ms else DEFAULT_TIMEOUT_S,
        "confinement": confinement,
        "cap": _cap_of(to_json(spec)),
        "warm": plane.mcp_sessions,  # the service's: its server kept open for the plan
        "owner": plan.plan_id,
    }


def forward_to_server(
    plane: Plane, plan: PlanState, tool_doc: ToolState, method: str, forward: Forward
) -> McpCall:
    """Ask the MCP server of ``tool_doc`` a request other than a tool call (``forward``:
    a resource read, a prompt, a completion, a log level) for ``plan``, launched and
    confined exactly as for a call of that tool, on the same kept server. Nothing is
    recorded here (a gate records what it gives the agent to read)."""
    copies = sandbox_of(plane, plan)
    confinement = _call_confinement(plane, plan, tool_doc, copies)
    launch = _mcp_reach(plane, plan, tool_doc, copies, confinement)
    return call_mcp_tool(method, {}, forward=forward, **launch)


def record_unregistered_call(
    plane: Plane,
    plan_id: str,
    tool: str,
    params: bytes | str | Any,
    output: bytes | str | Any,
    *,
    step: str | None = None,
    actor: str = "agent",
) -> ToolCalled:
    """Record the call of a tool the registry does not know, which an agent made and an
    agent hook let through (``--unknown-tools record``): ``tool.called`` with
    ``unregistered``, no tool version and no gate (nothing declares its structure). The
    parameters and the output are kept as blobs."""
    raw_params, raw_output = as_bytes(params), as_bytes(output)
    if plane.log().tool(tool) is not None:
        raise CommandRefused(f"tool {tool!r} is registered: its calls pass the gates")
    call_id = str(ULID())
    now = utc_now()
    recorded: dict[str, ToolCalled] = {}

    def decide(state: StreamState) -> list[EventPayload]:
        doc = _execute_plan(state, plan_id)
        recorded["event"] = ToolCalled(
            plan_id=plan_id,
            call_id=call_id,
            tool=tool,
            tool_version=None,
            step=step or f"call-{call_id}",
            attempt=doc.attempt,
            executor="recorded",
            params_sha256=sha256_hex(raw_params),
            output_sha256=sha256_hex(raw_output),
            started_at=now,
            ended_at=now,
            duration_ms=0,
            unregistered=True,
        )
        return [recorded["event"]]

    plane.run(f"plan:{plan_id}", decide, actor=actor, blobs=[raw_params, raw_output])
    return recorded["event"]


def _call_validation(
    plane: Plane,
    plan: PlanState,
    tool_doc: ToolState,
    raw_params: bytes,
    copies: Sandbox,
    confinement: Confinement | None = None,
) -> tuple[bytes, str, str, dict[str, Truncation]]:
    """A validation called as a tool: its structured return (what the output gate
    checks), or, with no verdict, what went wrong (which fails that gate)."""
    spec = tool_doc.spec
    wraps = given(spec.wraps)
    wrapped = plane.log().tool_version(wraps, given(spec.wraps_version)) if wraps else None
    resource = next((r for r in plan.resources if r in copies), plan.resources[0])
    # The runner reads a program's definition as its plain document.
    run = run_validation(
        to_json(spec),
        msgspec.json.decode(raw_params),
        resource,
        workdir=copies.get(resource),
        wrapped_tool=to_json(wrapped) if wrapped is not None else None,
        confinement=confinement,
    )
    if run.verdict is None:
        value: dict[str, Any] = {"cause": run.cause, "error": run.error}
    else:
        value = {"passed": run.verdict}
        value.update(
            {k: v for k, v in (("message", run.message), ("data", run.data)) if v is not None}
        )
    return msgspec.json.encode(value), run.started_at, run.ended_at, _truncations(run)


# -- halts -------------------------------------------------------------------------------


def record_halt(
    plane: Plane,
    plan_id: str,
    raw_type: str,
    reason: str,
    *,
    hint: str | None = None,
    terminal: bool = False,
    actor: str = "orchestrator",
) -> PlanHalted:
    """Record a halt; its canonical value comes from the raw type (unknown: non-verdict)."""
    if not raw_type.strip() or not reason.strip():
        raise CommandRefused("a halt needs a --raw-type and a --reason")
    canonical = canonical_halt(raw_type)
    if canonical == "escalate" and terminal:
        raise CommandRefused(
            f"raw type {raw_type!r} escalates to a human, who decides: an "
            "escalate halt cannot be terminal"
        )
    halted: dict[str, PlanHalted] = {}

    def decide(state: StreamState) -> list[EventPayload]:
        doc = require_plan(state, plan_id)
        events: list[EventPayload] = []
        decision_hint = None
        if canonical == "escalate" and doc.pending_decision is None:
            # Every escalate halt is a pending decision, exactly as the failure loop's.
            escalated = escalation(doc, reason)
            events.append(escalated)
            decision_hint = authorize_hint(escalated.decision_id)
        halted["event"] = PlanHalted(
            plan_id=plan_id,
            halt_type=canonical,
            final_decision=canonical,
            raw_halt_type=raw_type,
            reason=reason,
            hint=hint
            or decision_hint
            or f"{NEXT_ACTION[canonical][0]}: {NEXT_ACTION[canonical][1]}",
            phase=doc.phase,
            attempt=doc.attempt,
            terminal=terminal,
        )
        return [*events, halted["event"]]

    plane.run(f"plan:{plan_id}", decide, actor=actor)
    return halted["event"]


def _duration_ms(started: str, ended: str) -> int:
    def parse(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    return max(0, round((parse(ended) - parse(started)).total_seconds() * 1000))
