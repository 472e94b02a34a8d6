"""Validation runs: ``validate_plan`` runs exactly the plan's binding set, pinned when it
entered Execute (recorded again *before* running), each validation at its pinned version
and in its own copy of the run's one snapshot of the sandbox, whose trees the run
records and its token binds (writes are detected and never survive); it records every
result and the run's outcome, classified by ``projections.outcomes``. A run in which no
required validation ran is no pass unless the plan opted out. A non-pass outcome halts
the plan; a blocker also fails the attempt, and the next validation needs a recorded
fix first. (Tool calls and halts: ``commands.plane.runs``.)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec
from ulid import ULID

from commands.errors import NextStep
from commands.rules.verdicts import results_digest
from commands.runner.confine import Confinement
from commands.runner.guards import TreeGuard
from commands.runner.results import output_tails
from commands.runner.sandbox import RunSnapshot, decode_trees, encode_trees, resource_kind
from commands.runner.trees import ResourceKind, manifest_digest, manifest_of
from commands.runner.validations import ValidationRun, run_parallel, run_validation
from ledger import RecordedEvent
from ledger.events import (
    AttemptFailed,
    Escalated,
    EventPayload,
    PlanHalted,
    ResolvedAttachment,
    StrategyRevisionRequested,
    ValidationResultRecorded,
    ValidationRunCompleted,
    ValidationRunStarted,
)
from ledger.events.validation import Outcome
from projections.outcomes import NEXT_ACTION, RULES_VERSION, classify
from projections.states import PlanState, given, to_json

from . import tracing
from .authority import Authority
from .confinement import validation_confinement
from .core import CommandRefused, Plane, StreamState
from .failure_loop import after_blocker
from .gates import sha256_hex
from .lifecycle import token_for_pass
from .runs import (
    MAX_PARALLEL,
    Sandbox,
    _cap_of,
    _execute_plan,
    _truncations,
    sandbox_of,
)


@dataclass
class ValidationReport:
    plan_id: str
    run_id: str
    attempt: int
    outcome: Outcome
    raw_halt_type: str
    reason: str
    resolved: list[ResolvedAttachment]
    results: list[ValidationResultRecorded] = field(default_factory=list)
    events: list[RecordedEvent] = field(default_factory=list)
    token: str | None = None  # handed to the agent on a pass; the log keeps its digest
    # attachment -> (stdout tail, stderr tail) of each result that is no pass
    tails: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)

    @property
    def informational_failures(self) -> list[str]:
        return sorted(
            {
                r.validation
                for r in self.results
                if r.mode == "informational" and r.verdict is not True
            }
        )

    def to_json(self) -> dict[str, Any]:
        who, then = NEXT_ACTION[self.outcome]
        scopes = {r.attachment_id: r.scope for r in self.resolved}
        return {
            "plan_id": self.plan_id,
            "run_id": self.run_id,
            "attempt": self.attempt,
            "outcome": self.outcome,
            "raw_halt_type": self.raw_halt_type,
            "reason": self.reason,
            "who_acts": who,
            "next_action": then,
            "rules_version": RULES_VERSION,
            "token": self.token,
            "escalation": next(
                (
                    {"decision_id": e.payload.decision_id, "options": e.payload.options}
                    for e in self.events
                    if isinstance(e.payload, Escalated)
                ),
                None,
            ),
            "strategy_revision": next(
                (
                    e.payload.revision
                    for e in self.events
                    if isinstance(e.payload, StrategyRevisionRequested)
                ),
                None,
            ),
            "informational_failures": self.informational_failures,
            "results": [
                {
                    **msgspec.to_builtins(r),
                    "scope": scopes.get(r.attachment_id),
                    "stdout_tail": self.tails.get(r.attachment_id, (None, None))[0],
                    "stderr_tail": self.tails.get(r.attachment_id, (None, None))[1],
                }
                for r in self.results
            ],
        }


def binding_of(plan: PlanState) -> list[ResolvedAttachment]:
    """The plan's pinned binding set (``plan.execute_entered``): what ``validate`` runs."""
    return list(plan.binding)


def validate_plan(
    plane: Plane,
    plan_id: str,
    *,
    actor: str = "plane",
    max_workers: int = MAX_PARALLEL,
    sandbox: Sandbox | None = None,
) -> ValidationReport:
    """Run the plan's pinned binding set and classify the outcome. The run judges one
    snapshot of the sandbox (``RunSnapshot``): its trees are what the run records and
    its token binds, and every validation reads a copy of it. Traced (``tracing``) as
    ``validation run``."""
    with tracing.operation(
        "validation run",
        lambda: {"evidence.operation": "validation_run", "evidence.plan.id": plan_id},
        records=ValidationRunCompleted.type_name(),
    ) as op:
        report = _validate_plan(
            plane, plan_id, actor=actor, max_workers=max_workers, sandbox=sandbox
        )
        if op is not None:
            op.set(
                {
                    "evidence.validation.run_id": report.run_id,
                    "evidence.validation.outcome": report.outcome,
                    "error.type": None if report.outcome == "pass" else report.outcome,
                }
            )
        return report


def _validate_plan(
    plane: Plane, plan_id: str, *, actor: str, max_workers: int, sandbox: Sandbox | None
) -> ValidationReport:
    log = plane.log()
    plan = _validatable(log.state(f"plan:{plan_id}"), plan_id)
    _cap_of(None)  # an invalid EVIDENCE_MAX_OUTPUT_BYTES: refused before the run starts
    binding = binding_of(plan)
    require = plan.global_config.require_validation
    copies = sandbox_of(plane, plan, sandbox)
    # Refused before the run starts where the kernel cannot confine the validations.
    confinement = validation_confinement(plane, plan)
    directories = {r: copies[r] for r in plan.resources if r in copies}
    kinds = _resource_kinds(plane, plan)
    run_id = str(ULID())
    attempt = plan.attempt
    # Never the live sandbox: the agent writes it at will, so what was read from it for
    # the record and what a validation's copy was made from could differ.
    with RunSnapshot.taken(plane.sandbox(plan).run_snapshots, run_id, directories) as snap:
        trees, digests = _trees(snap, directories, kinds)

        def start(state: StreamState) -> list[EventPayload]:
            doc = _validatable(state, plan_id)
            if doc.binding != plan.binding:
                raise CommandRefused(f"plan {plan_id} moved on meanwhile; validate again")
            return [
                ValidationRunStarted(
                    plan_id=plan_id,
                    run_id=run_id,
                    attempt=doc.attempt,
                    revision=doc.revision,
                    resolved=binding,
                    resource_digests=digests,
                    trees_sha256=sha256_hex(trees),
                )
            ]

        # A validation that writes through an absolute path could reach the real
        # resource: it is snapshotted, and a write to it is restored.
        guards = [(r, TreeGuard(Path(r))) for r in directories if kinds.get(r) == "dir"]
        # Durable before anything runs: the pinned set is what the run will be judged on.
        try:
            plane.run(f"plan:{plan_id}", start, actor=actor, blobs=[trees])
        except BaseException:
            for _resource, guard in guards:
                guard.discard()
            raise
        jobs = [_job(log, r, snap.copies.get(r.resource), confinement) for r in binding]
        runs = _run_on_snapshot(jobs, binding, snap, guards, max_workers)
    results = [
        _result(plan_id, run_id, r, run, _level(log, r, confinement))
        for r, run in zip(binding, runs, strict=True)
    ]
    outcome, raw, reason = classify(
        (msgspec.to_builtins(r) for r in results), require_validation=require
    )
    report = ValidationReport(plan_id, run_id, attempt, outcome, raw, reason, binding, results)
    report.tails = {  # why each one failed, as every door answers it
        r.attachment_id: output_tails(run.raw_output, run.stderr)
        for r, run in zip(binding, runs, strict=True)
        if run.verdict is not True
    }
    completed = ValidationRunCompleted(
        plan_id=plan_id,
        run_id=run_id,
        attempt=attempt,
        outcome=outcome,
        rules_version=RULES_VERSION,
        results_digest=results_digest(results),
        informational_failures=report.informational_failures,
        vacuous=not any(r.mode == "required" for r in results),
    )
    minted: dict[str, str] = {}

    def finish(state: StreamState) -> list[EventPayload]:
        # Decided on the plan as it is now: counters move with concurrent writers.
        doc = state.existing(PlanState)
        if doc.current_run != run_id:
            raise CommandRefused(
                f"validation run {run_id} of plan {plan_id} was superseded "
                "by a newer run; its results are not recorded"
            )
        if doc.pending_decision is not None:
            return [*results, completed]  # a decision became pending: it decides first
        then = _after_run(plane, doc, completed, (outcome, raw, reason), sha256_hex(trees), minted)
        return [*results, completed, *then]

    outputs = [run.raw_output for run in runs if run.raw_output is not None]
    outputs += [run.stderr for run in runs if run.stderr]
    report.events = plane.run(f"plan:{plan_id}", finish, actor=actor, blobs=outputs)
    _escalated(report)
    report.token = minted.get("token")
    return report


def _trees(
    snap: RunSnapshot, directories: Mapping[str, Path], kinds: Mapping[str, ResourceKind]
) -> tuple[bytes, dict[str, str]]:
    """The run's snapshot as the record keeps it: every resource's tree (one blob) and
    each tree's digest."""
    trees = encode_trees(
        {
            r: (kinds[r], manifest_of(snap.judged[r], kinds[r], os.path.basename(r)))
            for r in directories
        }
    )
    return trees, {r: manifest_digest(tree) for r, (_k, tree) in decode_trees(trees).items()}


def _escalated(report: ValidationReport) -> None:
    """A blocker that spent the last strategy revision escalated: the report says so."""
    if any(e.type == "plan.escalated" for e in report.events):
        report.outcome, report.raw_halt_type = "escalate", "escalated"
        report.reason = next(
            e.payload.reason for e in report.events if isinstance(e.payload, Escalated)
        )


def _result(
    plan_id: str, run_id: str, r: ResolvedAttachment, run: ValidationRun, confinement: Any
) -> ValidationResultRecorded:
    """One validation's result as the run records it (its outputs kept as blobs)."""
    return ValidationResultRecorded(
        plan_id=plan_id,
        run_id=run_id,
        attachment_id=r.attachment_id,
        validation=r.validation,
        mode=r.mode,
        verdict=run.verdict,
        message=run.message,
        data=run.data,
        cause=run.cause,
        error=run.error,
        changed_paths=run.changed_paths,
        raw_output_sha256=sha256_hex(run.raw_output) if run.raw_output is not None else None,
        stderr_sha256=sha256_hex(run.stderr) if run.stderr else msgspec.UNSET,
        started_at=run.started_at,
        ended_at=run.ended_at,
        duration_ms=run.duration_ms,
        **_truncations(run),
        confinement=confinement,
    )


def _after_run(
    plane: Plane,
    doc: PlanState,
    completed: ValidationRunCompleted,
    classified: tuple[Outcome, str, str],
    trees_sha256: str,
    minted: dict[str, str],
) -> list[EventPayload]:
    """What a completed run leads to (``classified``: its outcome, raw halt type and
    reason): a pass mints the Apply token (kept in ``minted``), anything else halts,
    and a blocker fails the attempt and runs the failure loop."""
    outcome, raw, reason = classified
    plan_id, run_id, attempt = completed.plan_id, completed.run_id, completed.attempt
    if outcome == "pass":
        token, event = token_for_pass(plane, doc, run_id, completed.results_digest, trees_sha256)
        minted["token"] = token
        return [event]
    who, then = NEXT_ACTION[outcome]
    halt = PlanHalted(
        plan_id=plan_id,
        halt_type=outcome,
        final_decision=outcome,
        raw_halt_type=raw,
        reason=reason,
        hint=f"{who}: {then}",
        phase="execute",
        attempt=attempt,
        result_refs=[run_id],
    )
    if outcome != "blocker":
        return [halt]
    failed = AttemptFailed(
        plan_id=plan_id,
        attempt=attempt,
        iteration=doc.iteration,
        failure_class="validation",
        reason=reason,
    )
    loop = after_blocker(doc, reason, run_id)
    # An escalation is the run's one halt (escalate, not blocker + escalation): the
    # outcome tells the reader a human acts next.
    return [failed, *loop] if any(isinstance(e, Escalated) for e in loop) else [halt, failed, *loop]


def _run_on_snapshot(
    jobs: list[Callable[[], ValidationRun]],
    binding: list[ResolvedAttachment],
    snap: RunSnapshot,
    guards: list[tuple[str, TreeGuard]],
    max_workers: int,
) -> list[ValidationRun]:
    """The run's validations (``jobs``, each in its own copy of the snapshot); a write
    that reached the real resource (``guards``: restored) or the snapshot (what the
    validations after it read) voids the results on that resource."""
    try:
        runs = run_parallel(jobs, max_workers=max_workers)
    finally:
        reached = {resource: guard.restore_if_changed() for resource, guard in guards}
    written = snap.changed()
    return [
        _voided(run, reached.get(r.resource), written.get(r.resource))
        for r, run in zip(binding, runs, strict=True)
    ]


def _voided(
    run: ValidationRun, reached: list[str] | None, written: list[str] | None
) -> ValidationRun:
    if reached:
        error = (
            "the original resource changed during the run; it was restored from the "
            "snapshot taken before"
        )
    elif written:
        error = (
            "the run's snapshot of the sandbox changed during the run: what the "
            "validations read is not what the run judged"
        )
    else:
        return run
    return msgspec.structs.replace(
        run,
        verdict=None,
        cause="read_only_violation",
        message=None,
        data=None,
        changed_paths=reached or written or [],
        error=error,
    )


def _resource_kinds(plane: Plane, plan: PlanState) -> dict[str, ResourceKind]:
    """Each resource's kind as the plan's snapshot at Execute recorded it (as it is now
    for a plan recorded before snapshots)."""
    if plan.snapshot_sha256 is not msgspec.UNSET:
        blob = plane.store.get_blob(plan.snapshot_sha256)
        if blob is None:
            raise CommandRefused(
                f"plan {plan.plan_id}'s snapshot (blob {plan.snapshot_sha256}) is missing; "
                "`evidence verify` names it"
            )
        try:
            return {r: kind for r, (kind, _tree) in decode_trees(bytes(blob)).items()}
        except ValueError as exc:
            raise CommandRefused(f"plan {plan.plan_id}'s snapshot is damaged ({exc})") from None
    return {r: resource_kind(r) for r in plan.resources}


def _validatable(state: StreamState, plan_id: str) -> PlanState:
    doc = _execute_plan(state, plan_id)
    if doc.needs_fix:
        raise CommandRefused(
            f"plan {plan_id}'s last validation failed: record the fix before re-validating",
            NextStep("record_fix", plan_id),
        )
    return doc


def _level(
    log: Authority, attachment: ResolvedAttachment, confinement: Confinement
) -> Literal["landlock", "unconfined"] | msgspec.UnsetType:
    """What a result records of its program's confinement: absent for a validation on
    an MCP server the plane only reaches (``mcp_url``: it runs no program of its own)."""
    spec = log.tool_version(attachment.validation, attachment.validation_version)
    if spec is not None and spec.executor == "mcp" and not given(spec.mcp_command):
        return msgspec.UNSET
    return confinement.level


def _job(
    log: Authority,
    attachment: ResolvedAttachment,
    workdir: Path | None,
    confinement: Confinement | None = None,
) -> Callable[[], ValidationRun]:
    """The pinned version of the validation (and of the tool it wraps), from the log."""
    # The runner reads a program's definition as its plain document.
    spec = to_json(log.tool_version(attachment.validation, attachment.validation_version))
    found = (
        log.tool_version(attachment.wraps, attachment.wraps_version) if attachment.wraps else None
    )
    wrapped = to_json(found) if found is not None else None

    def job() -> ValidationRun:
        return run_validation(
            spec,
            attachment.args,
            attachment.resource,
            workdir=workdir,
            wrapped_tool=wrapped,
            confinement=confinement,
        )

    return job
