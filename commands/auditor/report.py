"""The auditor's HTML report of one plan: gather a plain data structure from the log
(here), then render it as one self-contained HTML page (``report_html``).

``gather_report`` reads through the small interface replay and audit use (``head()``,
``read_all(to_position=...)``, ``read_stream(stream, as_of=...)``, ``get_blob(digest)``),
so any source offering it (the database, an offline bundle) can be reported on. The byte
level verification is not part of that interface: the caller passes its result (or a
callable computing it), e.g. ``lambda: verify_store(store)``.

``report_html.render_html`` returns the page: inline CSS only, no script, no external resource (a
Content-Security-Policy forbids loading any), every value HTML-escaped and made inert
(control and invisible formatting characters as visible escapes, as on the terminal).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from commands.errors import CommandRefused
from commands.rules.plan_runs import (
    BlobReader,
    ConfinementSummary,
    confinement_summary,
    failure_of,
)
from commands.rules.trust import ApproverKey, decision_problem
from commands.rules.vocabulary import terminal_state
from ledger import LogReader, RecordedEvent
from ledger.bundle import BundleReport
from ledger.events import (
    DecisionRecorded,
    Escalated,
    FixRecorded,
    GateChecked,
    PlanHalted,
    TokenConsumed,
    TokenMinted,
    ToolCalled,
    ValidationResultRecorded,
    ValidationRunCompleted,
    ValidationRunStarted,
)
from ledger.timestamps import utc_now
from ledger.verify import VerifyReport
from projections.documents import fold_approver, fold_plan
from projections.outcomes import classify
from projections.states import ApproverState, PlanState

from .audit import AuditReport, replay_plan
from .audit import audit as run_audit
from .history import summaries

__all__ = [
    "PlanReport",
    "gather_report",
]


# The byte-level check of what is read: a database's, or an offline bundle's.
Verification = VerifyReport | BundleReport


# ------------------------------------------------------------------------- the data


class TimelineRow(msgspec.Struct, kw_only=True):
    position: int
    recorded_at: str
    actor: str
    type: str
    phase: str | None  # the plan's phase after the event
    summary: str


class DeviationRow(msgspec.Struct, kw_only=True):
    pointer: str
    kind: str
    message: str


class GateRow(msgspec.Struct, kw_only=True):
    position: int
    recorded_at: str
    gate: str
    tool: str
    tool_version: int | None
    step: str | None
    verdict: str
    attempt: int
    iteration: int
    strict_mode: bool
    deviations: list[DeviationRow]


class ResultRow(msgspec.Struct, kw_only=True):
    position: int
    validation: str
    mode: str
    verdict: str  # pass | fail | no verdict (cause)
    message: str | None
    duration_ms: int
    run_id: str
    attempt: int
    confinement: str | None = None  # landlock | unconfined; None: not recorded
    # Why it failed, beyond the message: the error of a result with no verdict, and the
    # tails of what its program printed (from its raw output; none for a pass).
    error: str | None = None
    stdout_tail: str | None = None
    stderr_tail: str | None = None


class RunRow(msgspec.Struct, kw_only=True):
    run_id: str
    position: int
    attempt: int
    revision: int
    resolved: int  # how many attachments the run resolved
    outcome: str | None  # None while the run is open
    rules_version: int | None
    rederived: str | None  # the outcome by the current rules
    results: list[ResultRow]
    vacuous: bool = False  # no required validation ran (recorded at completion)


class AppliedFile(msgspec.Struct, kw_only=True):
    """One file Apply wrote (or is writing, if it was interrupted)."""

    resource: str | None
    path: str | None
    sha256: str | None


class BindingRow(msgspec.Struct, kw_only=True):
    """One member of the plan's binding set, pinned at Execute."""

    validation: str | None
    version: int | None
    mode: str | None
    scope: str | None
    resource: str | None
    attachment_id: str | None


class DecisionRow(msgspec.Struct, kw_only=True):
    decision_id: str
    escalated_at: int
    escalation_reason: str
    options: list[str]
    position: int | None  # None: still pending
    approver: str | None
    choice: str | None
    guidance: str | None
    reason: str | None
    signed_at: str | None
    key_fingerprint: str | None
    signature: str  # verified | pending | what is wrong


class TokenRow(msgspec.Struct, kw_only=True):
    token_id: str
    status: str  # minted | superseded | consumed
    attempt: int
    run_id: str
    minted_at: int
    issued_at: str
    expires_at: str
    consumed_at: int | None


class HaltRow(msgspec.Struct, kw_only=True):
    position: int
    halt_type: str
    raw_halt_type: str
    reason: str
    terminal: bool


class ProblemRow(msgspec.Struct, kw_only=True):
    position: int | None
    kind: str
    detail: str


class VerificationSummary(msgspec.Struct, kw_only=True):
    ok: bool
    size: int
    root: str
    checked_events: int
    checked_blobs: int
    problems: list[ProblemRow]


class AuditSummary(msgspec.Struct, kw_only=True):
    ok: bool
    size: int
    checked: dict[str, int]
    violations: list[ProblemRow]  # kind = the invariant; detail = expected / found


class PlanReport(msgspec.Struct, kw_only=True):
    plan_id: str
    # Optional: a plan stream forged without its plan.created still gets a report.
    project: str | None
    resources: list[str]
    phase: str | None
    revision: int | None
    attempt: int | None
    outcome: str | None  # the plan's canonical outcome, as its document has it
    last_outcome: str | None  # the last validation run's
    terminal: str | None  # applied, applied (unvalidated), failed
    unvalidated: bool  # the last run had no required validation (require_validation false)
    strict_mode: bool | None
    binding: list[BindingRow]  # the binding set pinned at Execute
    applied_files: list[AppliedFile]  # the change set Apply wrote (or is writing)
    source: str
    size: int  # the log was read as of this position
    root: str
    generated_at: str
    timeline: list[TimelineRow]
    gates: list[GateRow]
    runs: list[RunRow]
    decisions: list[DecisionRow]
    tokens: list[TokenRow]
    halts: list[HaltRow]
    verification: VerificationSummary
    audit: AuditSummary
    # How the plan's programs ran (its policy, confined and unconfined runs)
    confinement: ConfinementSummary | None = None


# --------------------------------------------------------------------- gathering


def gather_report(
    source: LogReader,
    plan_id: str,
    *,
    verification: Verification | Callable[[], Verification],
    audit_report: AuditReport | Callable[[], AuditReport] | None = None,
    source_label: str = "",
    generated_at: str | None = None,
) -> PlanReport:
    """Everything the report shows about ``plan_id``, read as of the current head.

    ``verification`` is the byte-level check of the log: ``verify_store``'s report for a
    database, a bundle's ``BundleReport`` for a bundle (or a callable returning one).
    ``audit_report`` defaults to ``audit(source, plan=plan_id)``.
    Raises ``CommandRefused`` for an unknown plan.
    """
    head = source.head()
    size = head.size
    events = source.read_stream(f"plan:{plan_id}", as_of=size)
    if not events:
        raise CommandRefused(f"unknown plan {plan_id!r}")
    # The plan fold is total: a forged stream (no plan.created first, say) folds to what
    # it can, the report shows it, and the audit below says what is wrong with it.
    steps = replay_plan(source, plan_id, as_of=size)
    doc = fold_plan.fold_all(e.payload for e in events)  # the state of steps[-1]
    timeline = [
        TimelineRow(
            position=s.position,
            recorded_at=s.recorded_at,
            actor=s.actor,
            type=s.type,
            phase=s.phase,
            summary=line,
        )
        for s, line in zip(steps, summaries(events), strict=True)
    ]
    if callable(verification):
        verification = verification()
    if audit_report is None:
        audit_report = run_audit(source, plan=plan_id)
    elif callable(audit_report):
        audit_report = audit_report()
    return PlanReport(
        plan_id=plan_id,
        **_plan_fields(doc),
        source=source_label,
        size=size,
        root=head.root.hex(),
        generated_at=generated_at or utc_now(),
        timeline=timeline,
        gates=_gates(events),
        runs=_runs(events, source.get_blob),
        decisions=_decisions(source, events, size),
        tokens=_tokens(events),
        halts=_halts(events),
        confinement=confinement_summary(events),
        verification=_verification(verification),
        audit=_audit_summary(audit_report),
    )


def _plan_fields(doc: PlanState | None) -> dict[str, Any]:
    """What the report says of the plan itself (nothing of a stream that folds to none)."""
    if doc is None:
        none = ("project", "phase", "revision", "attempt", "outcome", "last_outcome")
        return {
            **dict.fromkeys(none),
            "resources": [],
            "terminal": terminal_state(None),
            "unvalidated": False,
            "strict_mode": None,
            "binding": _binding(None),
            "applied_files": [],
        }
    changes = doc.applied or doc.applying
    return {
        "project": doc.project,
        "resources": list(doc.resources),
        "phase": doc.phase,
        "revision": doc.revision,
        "attempt": doc.attempt,
        "outcome": doc.outcome,
        "last_outcome": doc.last_outcome,
        "terminal": terminal_state(doc),
        "unvalidated": bool(doc.unvalidated),
        "strict_mode": doc.global_config.strict_mode,
        "binding": _binding(doc),
        "applied_files": [
            AppliedFile(resource=f.resource, path=f.path, sha256=f.sha256)
            for f in (changes.files if changes is not None else [])
        ],
    }


def _audit_summary(report: AuditReport) -> AuditSummary:
    return AuditSummary(
        ok=report.ok,
        size=report.size,
        checked=dict(report.checked),
        violations=[
            ProblemRow(
                position=v.position,
                kind=v.invariant,
                detail=f"expected {v.expected}; found {v.found}",
            )
            for v in report.violations
        ],
    )


def _binding(doc: PlanState | None) -> list[BindingRow]:
    return [
        BindingRow(
            validation=b.validation,
            version=b.validation_version,
            mode=b.mode,
            scope=b.scope,
            resource=b.resource,
            attachment_id=b.attachment_id,
        )
        for b in (doc.binding if doc is not None else ())
    ]


def _verification(v: Verification) -> VerificationSummary:
    if isinstance(v, BundleReport):
        checked_events, checked_blobs = v.events, v.blobs
    else:
        checked_events, checked_blobs = v.checked_events, v.checked_blobs
    return VerificationSummary(
        ok=v.ok,
        size=v.size or 0,
        root=v.root or "",
        checked_events=checked_events,
        checked_blobs=checked_blobs,
        problems=[
            ProblemRow(position=p.position, kind=p.kind, detail=p.detail) for p in v.problems
        ],
    )


def _gates(events: list[RecordedEvent]) -> list[GateRow]:
    rows = []
    for e in events:
        p = e.payload
        if not isinstance(p, GateChecked):
            continue
        deviations = [
            DeviationRow(
                pointer=d.pointer or "/",
                kind=d.kind,
                message=f"expected {d.expected}; found {d.actual_type}"
                + (f" (schema {d.schema_pointer})" if d.schema_pointer else ""),
            )
            for d in p.deviations
        ]
        rows.append(
            GateRow(
                position=e.position,
                recorded_at=e.recorded_at,
                gate=p.gate,
                tool=p.tool,
                tool_version=p.tool_version,
                step=p.step,
                verdict=p.verdict,
                attempt=p.attempt,
                iteration=p.iteration,
                strict_mode=p.strict_mode,
                deviations=deviations,
            )
        )
    return rows


def _verdict(p: ValidationResultRecorded) -> str:
    if p.verdict is None:
        return f"no verdict ({p.cause})"
    return "pass" if p.verdict else "fail"


def _runs(events: list[RecordedEvent], get_blob: BlobReader) -> list[RunRow]:
    runs: dict[str, RunRow] = {}
    recorded: dict[str, list[ValidationResultRecorded]] = {}
    for e in events:
        p = e.payload
        if isinstance(p, ValidationRunStarted):
            runs[p.run_id] = RunRow(
                run_id=p.run_id,
                position=e.position,
                attempt=p.attempt,
                revision=p.revision,
                resolved=len(p.resolved),
                outcome=None,
                rules_version=None,
                rederived=None,
                results=[],
            )
            recorded[p.run_id] = []
        elif isinstance(p, ValidationResultRecorded) and p.run_id in runs:
            run = runs[p.run_id]
            recorded[p.run_id].append(p)
            failure = failure_of(e, get_blob)
            run.results.append(
                ResultRow(
                    position=e.position,
                    validation=p.validation,
                    mode=p.mode,
                    verdict=_verdict(p),
                    message=p.message,
                    duration_ms=p.duration_ms,
                    run_id=p.run_id,
                    attempt=run.attempt,
                    confinement=p.confinement if isinstance(p.confinement, str) else None,
                    error=p.error,
                    stdout_tail=failure.stdout_tail if failure is not None else None,
                    stderr_tail=failure.stderr_tail if failure is not None else None,
                )
            )
        elif isinstance(p, ValidationRunCompleted) and p.run_id in runs:
            run = runs[p.run_id]
            run.outcome, run.rules_version = p.outcome, p.rules_version
            run.vacuous = p.vacuous
            # Shown next to the recorded outcome so drift is visible at a glance.
            run.rederived = classify(msgspec.to_builtins(r) for r in recorded[p.run_id])[0]
    return list(runs.values())


def _decisions(source: LogReader, events: list[RecordedEvent], size: int) -> list[DecisionRow]:
    escalations: dict[str, RecordedEvent] = {}
    rows: dict[str, DecisionRow] = {}
    for e in events:
        p = e.payload
        if isinstance(p, Escalated):
            escalations[p.decision_id] = e
            rows[p.decision_id] = DecisionRow(
                decision_id=p.decision_id,
                escalated_at=e.position,
                escalation_reason=p.reason,
                options=list(p.options),
                position=None,
                approver=None,
                choice=None,
                guidance=None,
                reason=None,
                signed_at=None,
                key_fingerprint=None,
                signature="pending",
            )
        elif isinstance(p, DecisionRecorded):
            escalation = escalations.get(p.decision_id)
            row = rows.get(p.decision_id) or DecisionRow(
                decision_id=p.decision_id,
                escalated_at=0,
                escalation_reason="",
                options=[],
                position=None,
                approver=None,
                choice=None,
                guidance=None,
                reason=None,
                signed_at=None,
                key_fingerprint=None,
                signature="",
            )
            rows[p.decision_id] = msgspec.structs.replace(
                row,
                position=e.position,
                approver=p.approver,
                choice=p.choice,
                guidance=p.guidance,
                reason=p.reason,
                signed_at=p.signed_at,
                key_fingerprint=p.key_fingerprint,
                signature=_signature_status(source, e, escalation, size),
            )
    return list(rows.values())


def _signature_status(
    source: LogReader, event: RecordedEvent, escalation: RecordedEvent | None, size: int
) -> str:
    """Re-check the decision's Ed25519 signature as the plane does
    (``authority.decision_problem``): by the approver key registered in the log before
    the decision, over the record pinned to the escalation's leaf hash (which a bundle
    carries too). ``verified``, or the rule the decision breaks."""
    p: DecisionRecorded = event.payload  # type: ignore[assignment]
    approver: ApproverState | None = None
    for e in source.read_stream(f"approver:{p.approver}", as_of=min(event.position, size)):
        approver = fold_approver(approver, e.payload)
    key = approver.keys.get(p.key_fingerprint) if approver is not None else None
    problem = decision_problem(
        p,
        escalation.leaf_hash if escalation is not None else None,
        ApproverKey(approver.name, key.public_key, key.status)
        if approver is not None and key is not None
        else None,
    )
    return "verified" if problem is None else f"broken: expected {problem}"


def _tokens(events: list[RecordedEvent]) -> list[TokenRow]:
    tokens: dict[str, TokenRow] = {}
    current: str | None = None
    for e in events:
        p = e.payload
        if isinstance(p, TokenMinted):
            if current is not None and tokens[current].status == "minted":
                tokens[current].status = "superseded"
            tokens[p.token_id] = TokenRow(
                token_id=p.token_id,
                status="minted",
                attempt=p.attempt,
                run_id=p.run_id,
                minted_at=e.position,
                issued_at=p.issued_at,
                expires_at=p.expires_at,
                consumed_at=None,
            )
            current = p.token_id
        elif isinstance(p, TokenConsumed) and p.token_id in tokens:
            row = tokens[p.token_id]
            row.status = "consumed"
            row.consumed_at = row.consumed_at or e.position
        elif (
            isinstance(p, ValidationRunStarted | FixRecorded | ToolCalled)
            and current is not None
            and tokens[current].status == "minted"
        ):
            # The same events the plan fold treats as superseding a minted token.
            tokens[current].status = "superseded"
    return list(tokens.values())


def _halts(events: list[RecordedEvent]) -> list[HaltRow]:
    return [
        HaltRow(
            position=e.position,
            halt_type=e.payload.halt_type,
            raw_halt_type=e.payload.raw_halt_type,
            reason=e.payload.reason,
            terminal=e.payload.terminal,
        )
        for e in events
        if isinstance(e.payload, PlanHalted)
    ]
