"""Advisory reviews under the fusion_validate contract (seed 002). Advisory: never a gate."""

from __future__ import annotations

from typing import Literal

import msgspec

from .base import JSON, EventPayload


class Finding(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    id: str  # host-assigned, e.g. A-F001
    severity: Literal["critical", "high", "minor"]
    location: str
    evidence: str
    impact: str
    summary: str


class ReviewStarted(EventPayload, tag="review.started", kw_only=True, frozen=True):
    """A normalised review request passed preflight; the receipt is its task id."""

    STREAM = "review:{task_id}"
    DELTA = "creates the review document with status started"

    task_id: str
    plan_id: str | None = None
    request: dict[str, JSON]
    request_sha256: str


class ReviewCandidateSubmitted(
    EventPayload, tag="review.candidate_submitted", kw_only=True, frozen=True
):
    """A reviewer's candidate report; an invalid one becomes that reviewer's limitation."""

    STREAM = "review:{task_id}"
    DELTA = "adds the candidate under /candidates/<label>"

    task_id: str
    label: str  # anonymised: A, B, C ... in submission order
    reviewer: str  # who submitted (kept for audit; reports and evaluators see the label)
    valid: bool
    findings: list[Finding] = []
    verified: list[str] = []
    limitations: list[str] = []
    errors: list[str] = []


class ReviewAccountingRejected(
    EventPayload, tag="review.accounting_rejected", kw_only=True, frozen=True
):
    """An evaluator accounting broke the rules; every violation is listed (with its
    RFC 6901 pointer into the accounting). One repair attempt follows the first."""

    STREAM = "review:{task_id}"
    DELTA = "increments /accounting_attempts, sets /rejections/<n> and status repair"

    task_id: str
    attempt: int
    violations: list[str]


class ReviewAccounted(EventPayload, tag="review.accounted", kw_only=True, frozen=True):
    """The evaluator's accounting was accepted: each source finding exactly once."""

    STREAM = "review:{task_id}"
    DELTA = "sets /accounting, /accounting_attempts and status accounted"

    task_id: str
    attempt: int
    accounting: dict[str, JSON]


class ReviewReportCommitted(EventPayload, tag="review.report_committed", kw_only=True, frozen=True):
    """The deterministic report was rendered and committed with its SHA-256."""

    STREAM = "review:{task_id}"
    DELTA = "sets /report (sha256, size, counts) and status completed"
    BLOB_FIELDS = ("report_sha256",)

    task_id: str
    report_sha256: str  # also the blob digest of the report bytes
    report_size: int
    findings: int  # merged findings in the report
    exclusions: int


class ReviewFailed(EventPayload, tag="review.failed", kw_only=True, frozen=True):
    """The review failed (e.g. the accounting repair attempt failed too)."""

    STREAM = "review:{task_id}"
    DELTA = "sets /failure and status failed"

    task_id: str
    reason: str
