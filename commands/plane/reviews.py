"""Advisory reviews under the advisory review contract (docs/reviews.md), kept in the ledger.

- ``start_review``: the request is normalised (every string trimmed, optional lists
  ``[]``) and checked against the contract's closed request schema and the cross-field
  verification rule. Every violation is reported with its pointer and nothing is
  appended; a valid request is recorded (``review.started``) and its task id returned
  only after the commit (durable preflight).
- ``submit_candidate``: a reviewer's report against the closed candidate schema. Labels
  A, B, C … follow submission order; the host numbers findings ``A-F001`` …. A report
  that fails the schema is recorded as that reviewer's limitation, never dropped.
- ``account_review``: the evaluator's accounting of every source finding, exactly once.
  A violating accounting is recorded as a failed attempt; one repair is allowed, a
  second failure fails the review. An accepted accounting is rendered into the report
  (``render_report``: deterministic, label- and id-free) and committed with its SHA-256,
  the report bytes in the blob store, in the same transaction.
- ``review_result``: the committed report, its hash verified, handed out once (the
  hand-out is recorded: when, to whom; every later call is refused saying so).

A hosted review (``commands.plane.review_host``: ``evidence review run``) goes through
the same steps, taken by the review host with the programs' answers
(``record_candidate``, ``record_accounting``); hand submissions to it are refused.

A review linked to a plan adds one informational ``validation.result_recorded`` to the
plan when it ends: evidence on the plan, never a gate (see docs/reviews.md).

This module is the review's lifecycle (what is recorded, and when); the rest lives in
sibling modules, every public name importable from here too: the contract's schemas and
the request (``review_contract``), the accounting rules (``review_accounting``), the
report (``review_report``), reading and handing out (``review_results``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec
from ulid import ULID

from commands.rules.signing import load_or_create_plane_key, review_record, sign_record
from ledger import ConcurrencyError, EventPayload, NewEvent, StreamAppend
from ledger.canonical import canonical_json
from ledger.events import (
    Finding,
    ReviewAccounted,
    ReviewAccountingRejected,
    ReviewCandidateSubmitted,
    ReviewFailed,
    ReviewReportCommitted,
    ReviewStarted,
    ValidationResultRecorded,
)
from ledger.timestamps import utc_now
from projections import delta, fold
from projections.documents import to_json
from projections.plan_rules import broken_rule
from projections.states import HostState, ReviewState

from .core import RETRIES, CommandRefused, Plane, StreamState
from .review_accounting import accounting_answer, accounting_rules, source_findings
from .review_accounting import accounting_violations as accounting_violations
from .review_contract import (
    ACCOUNTING_SCHEMA,
    ACCOUNTING_VERSION,
    CANDIDATE_ACCEPTED,
    CANDIDATE_SCHEMA,
    CANDIDATE_VERSION,
    CANDIDATE_VERSION_ALIASES,
    FINDING_FIELDS,
    MERGER_SCHEMA,
    MERGER_VERSION,
    REPORT_FORMAT,
    REQUEST_SCHEMA,
    ReviewRequestInvalid,
    RoleFailure,
    Violation,
    decode,
    normalize_request,
    parse_answer,
    schema_violations,
    trimmed,
)
from .review_contract import NEW_SHAPE_EXAMPLE as NEW_SHAPE_EXAMPLE
from .review_report import MergerAnswer, render_report
from .review_report import scrub as scrub
from .review_results import REVIEW_EVENTS as REVIEW_EVENTS
from .review_results import (
    AlreadyHandedOut,
    ReportVerificationError,
    get_review,
    list_reviews,
    require_review,
    review_result,
)
from .review_results import ReviewResult as ReviewResult
from .review_results import default_recipient as default_recipient

__all__ = [
    "ACCOUNTING_SCHEMA",
    "ACCOUNTING_VERSION",
    "CANDIDATE_SCHEMA",
    "CANDIDATE_VERSION",
    "CANDIDATE_VERSION_ALIASES",
    "MERGER_SCHEMA",
    "MERGER_VERSION",
    "REPORT_FORMAT",
    "REQUEST_SCHEMA",
    "AccountingOutcome",
    "AlreadyHandedOut",
    "MergerAnswer",
    "ReportVerificationError",
    "ReviewRequestInvalid",
    "RoleFailure",
    "Submission",
    "Violation",
    "account_review",
    "accounting_answer",
    "fail_review",
    "get_review",
    "list_reviews",
    "normalize_request",
    "parse_answer",
    "record_accounting",
    "record_candidate",
    "render_report",
    "review_result",
    "source_findings",
    "start_review",
    "submit_candidate",
]

VALIDATION_NAME = "fusion_validate"  # the name a plan's informational result carries
MAX_ACCOUNTING_ATTEMPTS = 2  # the first attempt and one repair


# -- the start ---------------------------------------------------------------------------


def start_review(
    plane: Plane,
    request: bytes | str | Mapping[str, Any],
    *,
    plan_id: str | None = None,
    actor: str = "system",
) -> str:
    """Record a valid request; the returned task id is the receipt (already committed)."""
    normalised = normalize_request(request)
    if plan_id is not None:
        plane.projections.catch_up()
        if plane.projections.document("plans", plan_id) is None:
            raise CommandRefused(f"unknown plan {plan_id!r}")
    task_id = str(ULID())
    started = ReviewStarted(
        task_id=task_id,
        plan_id=plan_id,
        request=normalised,
        request_sha256=hashlib.sha256(canonical_json(normalised)).hexdigest(),
    )

    def decide(state: StreamState) -> list[EventPayload]:
        if state.exists:  # a fresh ULID: cannot happen, but never overwrite a review
            raise CommandRefused(f"review {task_id} already exists")
        return [started]

    plane.run(f"review:{task_id}", decide, actor=actor)
    return task_id


# -- candidates ----------------------------------------------------------------------------


def label_for(index: int) -> str:
    """0 -> A, 25 -> Z, 26 -> AA … (bijective base 26)."""
    label = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        label = chr(ord("A") + rest) + label
    return label


@dataclass
class Submission:
    task_id: str
    label: str
    valid: bool
    finding_ids: list[str]
    errors: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "label": self.label,
            "valid": self.valid,
            "findings": self.finding_ids,
            "errors": self.errors,
        }


def _not_hosted(doc: ReviewState, what: str) -> None:
    """A hosted review takes its reports only from the reviewer programs it runs."""
    if isinstance(doc.host, HostState):
        raise CommandRefused(
            f"review {doc.task_id} is run by the review host (evidence review run): "
            f"its {what} come from the configured reviewers, never by hand"
        )


def submit_candidate(
    plane: Plane,
    task_id: str,
    report: bytes | str | Mapping[str, Any],
    *,
    reviewer: str,
    actor: str | None = None,
) -> Submission:
    """Record a candidate report under the next label; an invalid one as a limitation."""
    return record_candidate(plane, task_id, report, reviewer=reviewer, actor=actor, hosted=False)


def record_candidate(
    plane: Plane,
    task_id: str,
    report: bytes | str | Mapping[str, Any] | None,
    *,
    reviewer: str,
    actor: str | None,
    hosted: bool,
    failure: RoleFailure | None = None,
) -> Submission:
    """``submit_candidate``, and the review host's way in (``hosted``: only for a hosted
    review). ``failure``: the reviewer gave no usable report (it timed out, crashed,
    wrote to its read-only view …); recorded as that reviewer's limitation, its detail
    in ``errors`` only (the report's limitation names no program and quotes none)."""
    reviewer = reviewer.strip()
    if not reviewer:
        raise CommandRefused("--reviewer must not be empty")
    value: Any = None
    if failure is None:
        value, problems = decode(report)
        value = trimmed(value)
        violations = problems + (
            [] if problems and value is None else schema_violations(CANDIDATE_ACCEPTED, value)
        )
        errors = [str(v) for v in sorted(set(violations), key=lambda v: (v.pointer, v.message))]
        limitation = (
            f"a candidate report failed the {CANDIDATE_VERSION} schema "
            f"({len(errors)} violation(s)): {'; '.join(errors)}"
        )
    else:
        errors = [failure.detail]
        limitation = f"a candidate reviewer returned no usable report: {failure.summary}"
    made: dict[str, Submission] = {}

    def decide(state: StreamState) -> list[EventPayload]:
        doc = require_review(state, task_id)
        if hosted != isinstance(doc.host, HostState):
            _not_hosted(doc, "candidate reports")
            raise CommandRefused(f"review {task_id} is not run by the review host")
        if doc.status != "started":
            raise CommandRefused(
                f"review {task_id} is {doc.status}: candidate reports "
                "are accepted only before accounting"
            )
        if any(c.reviewer == reviewer for c in doc.candidates.values()):
            raise CommandRefused(f"reviewer {reviewer!r} already submitted to review {task_id}")
        label = label_for(len(doc.candidates))
        if errors:
            # Not dropped: the reviewer's failure is itself evidence about the review.
            event = ReviewCandidateSubmitted(
                task_id=task_id,
                label=label,
                reviewer=reviewer,
                valid=False,
                errors=errors,
                limitations=[limitation],
            )
        else:
            findings = [
                Finding(id=f"{label}-F{i:03d}", **{k: f[k] for k in FINDING_FIELDS})
                for i, f in enumerate(value["findings"], start=1)
            ]
            event = ReviewCandidateSubmitted(
                task_id=task_id,
                label=label,
                reviewer=reviewer,
                valid=True,
                findings=findings,
                verified=value["verified"],
                limitations=value["limitations"],
            )
        made["submission"] = Submission(
            task_id, label, not errors, [f.id for f in event.findings], errors
        )
        return [event]

    plane.run(f"review:{task_id}", decide, actor=actor or reviewer)
    return made["submission"]


# -- accounting ----------------------------------------------------------------------------


@dataclass
class AccountingOutcome:
    task_id: str
    accepted: bool
    attempt: int
    status: str
    violations: list[Violation] = field(default_factory=list)
    report_sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "accepted": self.accepted,
            "attempt": self.attempt,
            "status": self.status,
            "report_sha256": self.report_sha256,
            "violations": [v.to_json() for v in self.violations],
        }


def account_review(
    plane: Plane,
    task_id: str,
    accounting: bytes | str | Mapping[str, Any],
    *,
    actor: str = "evaluator",
) -> AccountingOutcome:
    """Check the evaluator's accounting; commit the report or record the failed attempt."""
    return record_accounting(plane, task_id, accounting, actor=actor, hosted=False)


def record_accounting(
    plane: Plane,
    task_id: str,
    accounting: bytes | str | Mapping[str, Any] | None,
    *,
    actor: str,
    hosted: bool,
    failure: RoleFailure | None = None,
    merger: MergerAnswer | None = None,
) -> AccountingOutcome:
    """``account_review``, and the review host's way in (``hosted``): ``failure`` is an
    evaluator that gave no answer (a failed attempt), ``merger`` what the merger said
    (its summary goes into the report)."""
    if failure is None:
        value, problems = decode(accounting)
    else:
        value, problems = None, [Violation("", failure.detail)]
    stream = f"review:{task_id}"
    conflict: ConcurrencyError | None = None
    for _ in range(RETRIES):
        plane.projections.catch_up()
        state = plane.state(stream)
        doc = require_review(state, task_id)
        if hosted != isinstance(doc.host, HostState):
            _not_hosted(doc, "accountings")
            raise CommandRefused(f"review {task_id} is not run by the review host")
        if doc.status not in ("started", "repair"):
            raise CommandRefused(f"review {task_id} is {doc.status}: no accounting is accepted now")
        if not doc.candidates:
            raise CommandRefused(f"review {task_id} has no candidate report to account for")
        attempt = doc.accounting_attempts + 1
        violations = problems if value is None else problems + accounting_rules(value, doc)
        try:
            if violations:
                return _reject(plane, state, attempt, violations, actor)
            return _commit(plane, state, value, attempt, actor, merger)
        except ConcurrencyError as exc:
            conflict = exc  # another writer moved a stream: decide again on the fresh state
    # The stream kept moving: the last conflict reaches the caller (one error line, try
    # again).
    assert conflict is not None  # RETRIES > 0
    raise conflict


def _reject(
    plane: Plane, state: StreamState, attempt: int, violations: list[Violation], actor: str
) -> AccountingOutcome:
    task_id = state.existing(ReviewState).task_id
    events: list[EventPayload] = [
        ReviewAccountingRejected(
            task_id=task_id, attempt=attempt, violations=[str(v) for v in violations]
        )
    ]
    status = "repair"
    plan_event: list[EventPayload] = []
    if attempt >= MAX_ACCOUNTING_ATTEMPTS:
        reason = f"the accounting repair attempt failed too ({len(violations)} violation(s))"
        events.append(ReviewFailed(task_id=task_id, reason=reason))
        status = "failed"
        plan_event = _plan_result(plane, state, error=reason)
    _append(plane, [(state, events), *_plan_appends(plane, state, plan_event)], [], actor)
    return AccountingOutcome(task_id, False, attempt, status, violations)


def _commit(
    plane: Plane,
    state: StreamState,
    accounting: dict[str, Any],
    attempt: int,
    actor: str,
    merger: MergerAnswer | None,
) -> AccountingOutcome:
    doc = state.existing(ReviewState)
    task_id = doc.task_id
    report = render_report(doc.request, to_json(doc)["candidates"], accounting, merger=merger)
    digest = hashlib.sha256(report).hexdigest()
    counts = msgspec.json.decode(report)
    accounted = ReviewAccounted(task_id=task_id, attempt=attempt, accounting=accounting)
    earlier = [e.payload for e in plane.store.read_stream(state.stream)][: state.version]
    committed = ReviewReportCommitted(
        task_id=task_id,
        report_sha256=digest,
        report_size=len(report),
        findings=len(counts["findings"]),
        exclusions=len(counts["exclusions"]),
        # The plane vouches for the review it ran: the report and every event before it.
        plane_signature=sign_record(
            load_or_create_plane_key(plane.store.url),
            review_record(task_id, digest, [*earlier, accounted]),
            domain="review",
        ),
    )
    events: list[EventPayload] = [accounted, committed]
    plan_event = _plan_result(plane, state, committed=committed)
    _append(plane, [(state, events), *_plan_appends(plane, state, plan_event)], [report], actor)
    return AccountingOutcome(task_id, True, attempt, "completed", [], digest)


# -- the plan link -------------------------------------------------------------------------


def _plan_result(
    plane: Plane,
    state: StreamState,
    *,
    committed: ReviewReportCommitted | None = None,
    error: str | None = None,
) -> list[EventPayload]:
    """The informational result a linked plan gets: no verdict (advisory), its own
    run_id (the task id, never a validation run's), so no outcome counts it."""
    doc = state.existing(ReviewState)
    if doc.plan_id is None:
        return []
    task_id = doc.task_id
    started_at = plane.store.read_stream(state.stream)[0].recorded_at
    ended_at = utc_now()
    duration = datetime.fromisoformat(ended_at[:-1]) - datetime.fromisoformat(started_at[:-1])
    data: dict[str, Any] = {
        "review_task_id": task_id,
        "advisory": True,
        "status": "completed" if committed else "failed",
    }
    if committed is not None:
        data.update(
            report_sha256=committed.report_sha256,
            findings=committed.findings,
            exclusions=committed.exclusions,
        )
        message = (
            f"advisory review {task_id}: {committed.findings} finding(s), "
            f"{committed.exclusions} exclusion(s)"
        )
    else:
        message = f"advisory review {task_id} failed"
    return [
        ValidationResultRecorded(
            plan_id=doc.plan_id,
            run_id=task_id,
            attachment_id=task_id,
            validation=VALIDATION_NAME,
            mode="informational",
            verdict=None,
            message=message,
            data=data,
            error=error,
            raw_output_sha256=committed.report_sha256 if committed else None,
            started_at=started_at,
            ended_at=ended_at,
            duration_ms=max(0, round(duration.total_seconds() * 1000)),
        )
    ]


def _plan_appends(
    plane: Plane, state: StreamState, events: list[EventPayload]
) -> list[tuple[StreamState, list[EventPayload]]]:
    if not events:
        return []
    return [(plane.state(f"plan:{state.existing(ReviewState).plan_id}"), events)]


def _append(
    plane: Plane,
    appends: Sequence[tuple[StreamState, Sequence[EventPayload]]],
    blobs: list[bytes],
    actor: str,
) -> None:
    """``Plane.append`` over several streams in ONE transaction (the review's end and the
    plan's result are committed together or not at all)."""
    batch = []
    for state, payloads in appends:
        doc, events = state.doc, []
        for payload in payloads:
            rule = broken_rule(state.stream, doc, payload)
            if rule is not None:
                raise CommandRefused(f"refused: {rule}")
            after = fold(state.stream, doc, payload)
            events.append(NewEvent(payload=payload, actor=actor, delta=delta(doc, after)))
            doc = after
        batch.append(StreamAppend(state.stream, events, state.version))
    with plane.store.write() as tx:
        recorded = tx.append_batch(batch, blobs=blobs)
        plane.projections.apply_inline(tx, recorded)


# -- the end of a review --------------------------------------------------------------------

TERMINAL_STATUSES = ("completed", "failed")


def fail_review(plane: Plane, task_id: str, reason: str, *, actor: str) -> ReviewState:
    """End a review that cannot finish (a hosted review's host gave up or died), with
    its linked plan's informational result in the same transaction. A review that has
    already ended is left as it is. Returns the review as it now stands."""
    stream = f"review:{task_id}"
    conflict: ConcurrencyError | None = None
    for _ in range(RETRIES):
        plane.projections.catch_up()
        state = plane.state(stream)
        doc = require_review(state, task_id)
        if doc.status in TERMINAL_STATUSES:
            return doc
        plan_event = _plan_result(plane, state, error=reason)
        events: list[EventPayload] = [ReviewFailed(task_id=task_id, reason=reason)]
        try:
            _append(plane, [(state, events), *_plan_appends(plane, state, plan_event)], [], actor)
        except ConcurrencyError as exc:
            conflict = exc
            continue
        return get_review(plane, task_id)
    assert conflict is not None  # RETRIES > 0
    raise conflict
