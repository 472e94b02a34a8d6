"""Tool calls, validation runs and halts: the plane runs real programs and records
what they did — it never fabricates a result (seed 001).

- ``call_tool``: input gate -> the tool's program as a real subprocess (or an output an
  orchestrator ran itself) -> output gate; the call and its output bytes are recorded. A
  program that cannot be invoked halts the plan with ``environment_error``.
- ``validate_plan``: resolve the attachments that apply to every resource of the plan,
  record that set *before* running, run the validations in parallel (each in its own
  copy of the resource, so writes are detected and never survive), record every result
  and the run's outcome, classified by ``projections.outcomes``; a non-pass outcome
  halts the plan (a blocker also fails the attempt).
- ``record_halt``: an orchestrator's own halt, its raw type mapped to the canonical
  outcome (unknown raw types are non-verdicts, never blockers).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
from ulid import ULID

from ledger import RecordedEvent
from ledger.canonical import canonical_json
from ledger.events import (
    AttemptFailed,
    EventPayload,
    PlanHalted,
    ResolvedAttachment,
    ToolCalled,
    ValidationResultRecorded,
    ValidationRunCompleted,
    ValidationRunStarted,
)
from ledger.timestamps import utc_now
from projections.documents import Document
from projections.outcomes import NEXT_ACTION, RULES_VERSION, canonical_halt, classify
from projections.resolution import resolve

from .gates import GateOutcome, as_bytes, gate_input, gate_output
from .lifecycle import after_blocker, require_no_pending_decision, token_for_pass
from .phases import require_plan
from .plane import CommandRefused, Plane, StreamState
from .runner import (
    ArgvError,
    TreeGuard,
    ValidationRun,
    fill_argv,
    run_command,
    run_parallel,
    run_validation,
    tool_output,
    tree_digest,
)

DEFAULT_TIMEOUT_S = 300.0
MAX_PARALLEL = 4


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


Sandbox = Mapping[str, Path]  # resource -> the directory work on it happens in


def directory_of(resource: str, sandbox: Sandbox | None) -> Path | None:
    """Where work on ``resource`` happens: its sandbox copy when the plan runs in one
    (until Apply), else the resource itself when it names an existing directory."""
    if sandbox and resource in sandbox:
        return sandbox[resource]
    return Path(resource) if os.path.isdir(resource) else None


def workdir_of(plan: Document, sandbox: Sandbox | None = None) -> Path | None:
    """The first of the plan's resources that is a directory (or has a sandbox copy)."""
    for resource in plan["resources"]:
        found = directory_of(resource, sandbox)
        if found is not None:
            return found
    return None


def _execute_plan(state: StreamState, plan_id: str) -> Document:
    doc = require_plan(state, plan_id)
    require_no_pending_decision(doc, plan_id)
    if doc["phase"] != "execute":
        raise CommandRefused(f"plan {plan_id} is in {doc['phase'].capitalize()}: tool calls "
                             "and validations happen only in Execute")
    return doc


# -- tool calls --------------------------------------------------------------------------


@dataclass
class CallReport:
    input_gate: GateOutcome
    call: ToolCalled | None = None
    output_gate: GateOutcome | None = None
    halt: PlanHalted | None = None
    output: bytes | None = None

    @property
    def ok(self) -> bool:
        return (self.input_gate.passed and self.output_gate is not None
                and self.output_gate.passed)

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
    sandbox: Sandbox | None = None,
    actor: str = "agent",
) -> CallReport:
    """Input gate, run (or take the recorded output), output gate; all recorded."""
    raw_params = as_bytes(params)
    call_id = str(ULID())
    step = step or f"call-{call_id}"
    plan = plane.projections.document("plans", plan_id)
    if plan is not None:  # refuse before recording anything when no call is possible
        _execute_plan(StreamState(f"plan:{plan_id}", plan[0], plan[1]), plan_id)
    tool_doc = plane.projections.document("tools", tool)
    if recorded_output is None and tool_doc is not None and not tool_doc[0]["spec"].get(
            "command"):
        raise CommandRefused(f"tool {tool!r} has no command to run here: record the output "
                             "of the call you made with --record-output")
    report = CallReport(gate_input(plane, plan_id, tool, raw_params, step=step, actor=actor))
    if not report.input_gate.passed:
        return report  # an invented tool or bad parameters: the call is never made
    spec = tool_doc[0]["spec"] if tool_doc else {}
    started = ended = utc_now()
    exit_code: int | None = None
    if recorded_output is not None:
        output, executor = as_bytes(recorded_output), "recorded"
    else:
        try:
            argv = fill_argv(spec["command"], msgspec.json.decode(raw_params))
        except ArgvError as exc:
            raise CommandRefused(f"cannot build the command line of {tool!r}: {exc}") from None
        timeout = spec["timeout_ms"] / 1000 if spec.get("timeout_ms") else DEFAULT_TIMEOUT_S
        result = run_command(argv, cwd=workdir_of(plan[0], sandbox) if plan else None,
                             timeout_s=timeout)
        if result.missing_program is not None:
            report.halt = record_halt(
                plane, plan_id, "program_missing",
                f"tool {tool!r} could not be invoked: {result.missing_program!r} was not "
                "found", hint=f"install `{result.missing_program}` where the plan runs "
                "(it is not on PATH), then re-run unchanged", actor=actor)
            return report
        output, _value = tool_output(result)
        executor, exit_code = "command", result.exit_code
        started, ended = result.started_at, result.ended_at
    called = ToolCalled(
        plan_id=plan_id, call_id=call_id, tool=tool, tool_version=tool_doc[0]["version"],
        step=step, attempt=plan[0]["attempt"] if plan else 0, executor=executor,
        params_sha256=_sha256(raw_params), output_sha256=_sha256(output),
        exit_code=exit_code, started_at=started, ended_at=ended,
        duration_ms=_duration_ms(started, ended))

    def decide(state: StreamState) -> list[EventPayload]:
        _execute_plan(state, plan_id)
        return [called]

    plane.run(f"plan:{plan_id}", decide, actor=actor, blobs=[raw_params, output])
    report.call, report.output = called, output
    report.output_gate = gate_output(plane, plan_id, step, output, schema=output_schema,
                                     actor=actor)
    return report


# -- validation runs ---------------------------------------------------------------------


@dataclass
class ValidationReport:
    plan_id: str
    run_id: str
    attempt: int
    outcome: str
    raw_halt_type: str
    reason: str
    resolved: list[ResolvedAttachment]
    results: list[ValidationResultRecorded] = field(default_factory=list)
    events: list[RecordedEvent] = field(default_factory=list)
    token: str | None = None  # handed to the agent on a pass; the log keeps its digest

    @property
    def informational_failures(self) -> list[str]:
        return sorted({r.validation for r in self.results
                       if r.mode == "informational" and r.verdict is not True})

    def to_json(self) -> dict[str, Any]:
        who, then = NEXT_ACTION[self.outcome]
        scopes = {r.attachment_id: r.scope for r in self.resolved}
        return {
            "plan_id": self.plan_id, "run_id": self.run_id, "attempt": self.attempt,
            "outcome": self.outcome, "raw_halt_type": self.raw_halt_type,
            "reason": self.reason, "who_acts": who, "next_action": then,
            "rules_version": RULES_VERSION,
            "token": self.token,
            "escalation": next(({"decision_id": e.payload.decision_id,
                                 "options": e.payload.options} for e in self.events
                                if e.type == "plan.escalated"), None),
            "strategy_revision": next((e.payload.revision for e in self.events
                                       if e.type == "plan.strategy_revision_requested"),
                                      None),
            "informational_failures": self.informational_failures,
            "results": [{**msgspec.to_builtins(r), "scope": scopes.get(r.attachment_id)}
                        for r in self.results],
        }


def resolve_for_plan(plane: Plane, plan: Document) -> list[ResolvedAttachment]:
    """Every attachment that applies to the plan: each resource, its project, itself."""
    engine = plane.projections
    tools = {d["name"]: d for d in engine.documents("tools", lambda t: t.c.kind == "validation")}
    seen: dict[str, ResolvedAttachment] = {}
    for resource in plan["resources"]:
        attachments = engine.documents("attachments", lambda t, r=resource: t.c.resource == r)
        for row in resolve(attachments, tools, resource=resource, project=plan["project"],
                           plan=plan["plan_id"]):
            seen.setdefault(row.attachment_id, row)
    return list(seen.values())


def validate_plan(plane: Plane, plan_id: str, *, actor: str = "plane",
                  max_workers: int = MAX_PARALLEL,
                  sandbox: Sandbox | None = None) -> ValidationReport:
    """Run the validations that apply to the plan and classify the outcome."""
    plane.projections.catch_up()
    found = plane.projections.document("plans", plan_id)
    plan = _execute_plan(StreamState(f"plan:{plan_id}", found[0] if found else {},
                                     found[1] if found else 0), plan_id)
    resolved = resolve_for_plan(plane, plan)
    directories = {r: d for r in plan["resources"]
                   if (d := directory_of(r, sandbox)) is not None}
    digests = {r: tree_digest(d) for r, d in directories.items()}
    run_id = str(ULID())
    attempt = plan["attempt"]

    def start(state: StreamState) -> list[EventPayload]:
        _execute_plan(state, plan_id)
        return [ValidationRunStarted(plan_id=plan_id, run_id=run_id, attempt=attempt,
                                     revision=plan["revision"], resolved=resolved,
                                     resource_digests=digests)]

    # Durable before anything runs: the resolved set is what the run will be judged on.
    plane.run(f"plan:{plan_id}", start, actor=actor)
    guards = {r: TreeGuard(d) for r, d in directories.items()}
    try:
        runs = run_parallel([_job(plane, r, directories.get(r.resource)) for r in resolved],
                        max_workers=max_workers)
    finally:
        reached = {r: guard.restore_if_changed() for r, guard in guards.items()}
    for i, attachment in enumerate(resolved):
        if reached.get(attachment.resource):  # a write reached the original: restored
            runs[i] = msgspec.structs.replace(
                runs[i], verdict=None, cause="read_only_violation", message=None,
                data=None, changed_paths=reached[attachment.resource],
                error="the original resource changed during the run; it was restored "
                      "from the snapshot taken before")
    results = [
        ValidationResultRecorded(
            plan_id=plan_id, run_id=run_id, attachment_id=r.attachment_id,
            validation=r.validation, mode=r.mode, verdict=run.verdict, message=run.message,
            data=run.data, cause=run.cause, error=run.error,
            changed_paths=run.changed_paths,
            raw_output_sha256=_sha256(run.raw_output) if run.raw_output is not None else None,
            started_at=run.started_at, ended_at=run.ended_at, duration_ms=run.duration_ms)
        for r, run in zip(resolved, runs, strict=True)
    ]
    outcome, raw, reason = classify(msgspec.to_builtins(r) for r in results)
    report = ValidationReport(plan_id, run_id, attempt, outcome, raw, reason, resolved,
                              results)
    completed = ValidationRunCompleted(
        plan_id=plan_id, run_id=run_id, attempt=attempt, outcome=outcome,
        rules_version=RULES_VERSION, results_digest=results_digest(results),
        informational_failures=report.informational_failures)
    minted: dict[str, str] = {}

    def finish(state: StreamState) -> list[EventPayload]:
        # Decided on the plan as it is now: counters move with concurrent writers.
        doc = state.doc
        follow: list[EventPayload] = []
        if outcome == "pass":
            token, event = token_for_pass(plane, doc, run_id, completed.results_digest)
            minted["token"] = token
            follow.append(event)
        else:
            who, then = NEXT_ACTION[outcome]
            follow.append(PlanHalted(
                plan_id=plan_id, halt_type=outcome, final_decision=outcome,
                raw_halt_type=raw, reason=reason, hint=f"{who}: {then}", phase="execute",
                attempt=attempt, result_refs=[run_id]))
        if outcome == "blocker":
            follow.append(AttemptFailed(plan_id=plan_id, attempt=attempt,
                                        iteration=doc["iteration"],
                                        failure_class="validation", reason=reason))
            follow.extend(after_blocker(doc, reason))
        return [*results, completed, *follow]

    outputs = [run.raw_output for run in runs if run.raw_output is not None]
    report.events = plane.run(f"plan:{plan_id}", finish, actor=actor, blobs=outputs)
    report.token = minted.get("token")
    return report


def results_digest(results: list[ValidationResultRecorded]) -> str:
    """SHA-256 over what the verdicts were made of: a token binds to this (INV1)."""
    return _sha256(canonical_json(sorted(
        ([r.attachment_id, r.validation, r.mode, r.verdict, r.cause, r.raw_output_sha256]
         for r in results), key=lambda row: row[0])))


def _job(plane: Plane, attachment: ResolvedAttachment,
         workdir: Path | None) -> Callable[[], ValidationRun]:
    validation = plane.projections.document("tools", attachment.validation)
    spec = validation[0]["spec"] if validation else {}
    wrapped = None
    if spec.get("wraps"):
        tool = plane.projections.document("tools", spec["wraps"])
        if tool is not None:
            versions = tool[0]["versions"]
            wrapped = versions.get(str(spec.get("wraps_version")), tool[0]["spec"])
    def job() -> ValidationRun:
        return run_validation(spec, attachment.args, attachment.resource, workdir=workdir,
                              wrapped_tool=wrapped)

    return job


# -- halts -------------------------------------------------------------------------------


def record_halt(plane: Plane, plan_id: str, raw_type: str, reason: str, *,
                hint: str | None = None, terminal: bool = False,
                actor: str = "orchestrator") -> PlanHalted:
    """Record a halt; its canonical value comes from the raw type (unknown: non-verdict)."""
    if not raw_type.strip() or not reason.strip():
        raise CommandRefused("a halt needs a --raw-type and a --reason")
    halted: dict[str, PlanHalted] = {}

    def decide(state: StreamState) -> list[PlanHalted]:
        doc = require_plan(state, plan_id)
        canonical = canonical_halt(raw_type)
        halted["event"] = PlanHalted(
            plan_id=plan_id, halt_type=canonical, final_decision=canonical,
            raw_halt_type=raw_type, reason=reason,
            hint=hint or f"{NEXT_ACTION[canonical][0]}: {NEXT_ACTION[canonical][1]}",
            phase=doc["phase"], attempt=doc["attempt"], terminal=terminal)
        return [halted["event"]]

    plane.run(f"plan:{plan_id}", decide, actor=actor)
    return halted["event"]




def _duration_ms(started: str, ended: str) -> int:
    def parse(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    return max(0, round((parse(ended) - parse(started)).total_seconds() * 1000))
