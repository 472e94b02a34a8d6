"""The pure fold of ``review:{task_id}`` streams (advisory reviews, seed 002).

The review document: the normalised request, each anonymised candidate by label (its
host-numbered findings, or, for a report that failed the candidate schema, the errors
that made it a limitation), the accounting attempts and their rejections, the accepted
accounting, the committed report digest, and a status:

``started`` (collecting candidates) -> ``repair`` (one rejected accounting) ->
``accounted`` -> ``completed``; or ``failed`` (a second rejected accounting).

It imports only ``ledger.events``: ``projections.documents`` registers it in ``FOLDS``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ledger.events import (
    EventPayload,
    ReviewAccounted,
    ReviewAccountingRejected,
    ReviewCandidateSubmitted,
    ReviewFailed,
    ReviewReportCommitted,
    ReviewStarted,
)

ReviewDocument = dict[str, Any]


def fold_review(doc: ReviewDocument, payload: EventPayload) -> ReviewDocument:
    """``review:{task_id}``: advance the review document by one event (never mutates).

    Total: an event before ``review.started`` (only a raw append makes one) leaves the
    document as it is."""
    if isinstance(payload, ReviewStarted):
        return {
            "task_id": payload.task_id,
            "plan_id": payload.plan_id,
            "status": "started",
            "request": payload.request,
            "request_sha256": payload.request_sha256,
            "candidates": {},
            "accounting_attempts": 0,
            "rejections": [],
            "accounting": None,
            "report": None,
            "failure": None,
        }
    if not doc:
        return doc
    if isinstance(payload, ReviewCandidateSubmitted):
        candidate = {
            "reviewer": payload.reviewer,
            "valid": payload.valid,
            "findings": [msgspec.to_builtins(f) for f in payload.findings],
            "verified": list(payload.verified),
            "limitations": list(payload.limitations),
            "errors": list(payload.errors),
        }
        return {**doc, "candidates": {**doc["candidates"], payload.label: candidate}}
    if isinstance(payload, ReviewAccountingRejected):
        return {**doc, "status": "repair", "accounting_attempts": payload.attempt,
                "rejections": [*doc["rejections"], list(payload.violations)]}
    if isinstance(payload, ReviewAccounted):
        return {**doc, "status": "accounted", "accounting_attempts": payload.attempt,
                "accounting": payload.accounting}
    if isinstance(payload, ReviewReportCommitted):
        return {**doc, "status": "completed", "report": {
            "sha256": payload.report_sha256, "size": payload.report_size,
            "findings": payload.findings, "exclusions": payload.exclusions}}
    if isinstance(payload, ReviewFailed):
        return {**doc, "status": "failed", "failure": payload.reason}
    return doc
