"""The pure fold of ``review:{task_id}`` streams (advisory reviews, docs/reviews.md).

The review state (``states.ReviewState``): the normalised request, each anonymised
candidate by label (its host-numbered findings, or, for a report that failed the
candidate schema, the errors that made it a limitation), the accounting attempts and
their rejections, the accepted accounting, the committed report digest, and a status:

``started`` (collecting candidates) -> ``repair`` (one rejected accounting) ->
``accounted`` -> ``completed``; or ``failed`` (a second rejected accounting, or the
review host could not finish). A hosted review (``review.host_scheduled``) also has
``host``: the reviewer programs, the host process and a summary of each program's run;
a completed review's report, once handed out, ``handed_out`` (when, to whom).

It imports only ``ledger.events``: ``projections.documents`` registers it in ``FOLDS``.
Total: an event before ``review.started`` (only a raw append makes one) leaves ``None``.
"""

from __future__ import annotations

from msgspec.structs import replace

from ledger.events import (
    ReviewAccounted,
    ReviewAccountingRejected,
    ReviewCandidateSubmitted,
    ReviewFailed,
    ReviewHandedOut,
    ReviewHostScheduled,
    ReviewHostStarted,
    ReviewReportCommitted,
    ReviewRoleRan,
    ReviewStarted,
)

from .folding import StreamFold
from .states import (
    CandidateState,
    HandOutState,
    HostState,
    ReportState,
    ReviewState,
    RoleRunState,
)

fold_review: StreamFold[ReviewState] = StreamFold("review", ReviewState)


@fold_review.on_any(ReviewStarted)
def _started(_doc: ReviewState | None, p: ReviewStarted) -> ReviewState:
    return ReviewState(
        task_id=p.task_id,
        plan_id=p.plan_id,
        status="started",
        request=p.request,
        request_sha256=p.request_sha256,
    )


@fold_review.on(ReviewCandidateSubmitted)
def _candidate(doc: ReviewState, p: ReviewCandidateSubmitted) -> ReviewState:
    candidate = CandidateState(
        reviewer=p.reviewer,
        valid=p.valid,
        findings=list(p.findings),
        verified=list(p.verified),
        limitations=list(p.limitations),
        errors=list(p.errors),
    )
    return replace(doc, candidates={**doc.candidates, p.label: candidate})


@fold_review.on(ReviewAccountingRejected)
def _rejected(doc: ReviewState, p: ReviewAccountingRejected) -> ReviewState:
    return replace(
        doc,
        status="repair",
        accounting_attempts=p.attempt,
        rejections=[*doc.rejections, list(p.violations)],
    )


@fold_review.on(ReviewAccounted)
def _accounted(doc: ReviewState, p: ReviewAccounted) -> ReviewState:
    return replace(doc, status="accounted", accounting_attempts=p.attempt, accounting=p.accounting)


@fold_review.on(ReviewReportCommitted)
def _committed(doc: ReviewState, p: ReviewReportCommitted) -> ReviewState:
    return replace(
        doc,
        status="completed",
        report=ReportState(
            sha256=p.report_sha256, size=p.report_size, findings=p.findings, exclusions=p.exclusions
        ),
    )


@fold_review.on(ReviewFailed)
def _failed(doc: ReviewState, p: ReviewFailed) -> ReviewState:
    return replace(doc, status="failed", failure=p.reason)


@fold_review.on(ReviewHostScheduled)
def _scheduled(doc: ReviewState, p: ReviewHostScheduled) -> ReviewState:
    if isinstance(doc.host, HostState):
        return doc  # the preflight's own programs stay: a later one changes nothing
    host = HostState(
        reviewers=p.reviewers, reviewers_sha256=p.reviewers_sha256, repository=p.repository
    )
    return replace(doc, host=host)


@fold_review.on(ReviewHostStarted)
def _host_started(doc: ReviewState, p: ReviewHostStarted) -> ReviewState:
    if not isinstance(doc.host, HostState):
        return doc  # only a raw append puts it on a review nobody scheduled
    host = replace(doc.host, pid=p.pid, hostname=p.hostname, scope_sha256=p.scope_sha256)
    return replace(doc, host=host)


@fold_review.on(ReviewRoleRan)
def _role_ran(doc: ReviewState, p: ReviewRoleRan) -> ReviewState:
    if not isinstance(doc.host, HostState):
        return doc
    run = RoleRunState(
        role=p.role,
        name=p.name,
        exit_code=p.exit_code,
        error=p.error,
        duration_ms=p.duration_ms,
        stdout_sha256=p.stdout_sha256,
    )
    return replace(doc, host=replace(doc.host, runs=[*doc.host.runs, run]))


@fold_review.on(ReviewHandedOut)
def _handed_out(doc: ReviewState, p: ReviewHandedOut) -> ReviewState:
    if isinstance(doc.handed_out, HandOutState):
        return doc  # handed out once: the first hand-out is the one on record
    return replace(doc, handed_out=HandOutState(at=p.at, to=p.recipient))
