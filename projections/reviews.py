"""The pure fold of ``review:{task_id}`` streams (advisory reviews, seed 002).

The review state (``states.ReviewState``): the normalised request, each anonymised
candidate by label (its host-numbered findings, or, for a report that failed the
candidate schema, the errors that made it a limitation), the accounting attempts and
their rejections, the accepted accounting, the committed report digest, and a status:

``started`` (collecting candidates) -> ``repair`` (one rejected accounting) ->
``accounted`` -> ``completed``; or ``failed`` (a second rejected accounting).

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
    ReviewReportCommitted,
    ReviewStarted,
)

from .folding import StreamFold
from .states import CandidateState, ReportState, ReviewState

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
