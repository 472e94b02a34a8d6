"""Advisory reviews under the advisory review contract (docs/reviews.md). Advisory: never a
gate."""

from __future__ import annotations

from typing import Literal

import msgspec

from .base import JSON, EventPayload
from .gates import Truncation


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
    # The plane key's signature (domain review) over {task_id, report_sha256, chain}:
    # ``chain`` is the SHA-256 of the canonical JSON of every earlier payload of the
    # review's stream. The plane vouches for the review it ran; `review result` hands
    # out no report without it, and `audit` reports one that does not verify.
    plane_signature: str | None = None


class ReviewFailed(EventPayload, tag="review.failed", kw_only=True, frozen=True):
    """The review failed (e.g. the accounting repair attempt failed too)."""

    STREAM = "review:{task_id}"
    DELTA = "sets /failure and status failed"

    task_id: str
    reason: str


# -- the review host (``evidence review run``): the reviewers run as programs -------------


class ReviewHostScheduled(EventPayload, tag="review.host_scheduled", kw_only=True, frozen=True):
    """The durable preflight of a hosted review, committed with its ``review.started``
    before anything runs: the reviewer programs, exactly as the host will run them, and
    the repository the candidates read."""

    STREAM = "review:{task_id}"
    DELTA = "sets /host (the reviewers, their digest, the repository)"

    task_id: str
    reviewers: dict[str, JSON]  # the normalised reviewers configuration
    reviewers_sha256: str  # SHA-256 of its RFC 8785 bytes
    repository: str  # absolute path; the request's scope is relative to it


class ReviewHostStarted(EventPayload, tag="review.host_started", kw_only=True, frozen=True):
    """The host process took the review: where it runs, and the digest of the scope the
    candidates were given a copy of."""

    STREAM = "review:{task_id}"
    DELTA = "sets /host/pid, /host/hostname and /host/scope_sha256"

    task_id: str
    pid: int
    hostname: str
    scope_sha256: str  # the scope's paths, kinds, modes and contents when copied


class ReviewRoleRan(EventPayload, tag="review.role_ran", kw_only=True, frozen=True):
    """One reviewer program ran (candidate, evaluator, repair or merger): how it ended
    and what it printed (stdout kept as a blob). What its answer counted for follows in
    the review's own events."""

    STREAM = "review:{task_id}"
    DELTA = "appends a summary to /host/runs"
    BLOB_FIELDS = ("stdout_sha256",)

    task_id: str
    role: Literal["candidate", "evaluator", "repair", "merger"]
    name: str  # the candidate's configured name; the role's name for the others
    argv: list[str]
    exit_code: int | None  # None: it timed out, was killed or never started
    error: str | None = None  # why its answer cannot be used, when it cannot
    changed_paths: list[str] = []  # a candidate's writes to its read-only view
    stdout_sha256: str  # blob: the bytes kept of its stdout
    stdout_truncated: Truncation | None = None
    started_at: str
    ended_at: str
    duration_ms: int


class ReviewHandedOut(EventPayload, tag="review.handed_out", kw_only=True, frozen=True):
    """The verified report was handed out: once, to ``recipient``, at ``at``."""

    STREAM = "review:{task_id}"
    DELTA = "sets /handed_out (at, to)"

    task_id: str
    report_sha256: str  # the report handed out (verified against the committed digest)
    recipient: str
    at: str  # RFC 3339 UTC
