"""Reading advisory reviews, and handing out a review's report: each review folded
from the log (reviews have no read model), and the committed report verified (its
SHA-256, the plane's signature) before it is handed out, once (docs/reviews.md).
"""

from __future__ import annotations

import getpass
import hashlib
import os
from dataclasses import dataclass
from typing import Any

import msgspec

from commands.names import check_identifier
from commands.rules.trust import review_problem
from ledger import EventPayload, LedgerError
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
from ledger.timestamps import utc_now
from projections import fold
from projections.documents import State
from projections.states import HandOutState, ReviewState

from .core import CommandRefused, Plane, StreamState

__all__ = [
    "REVIEW_EVENTS",
    "AlreadyHandedOut",
    "ReportVerificationError",
    "ReviewResult",
    "default_recipient",
    "get_review",
    "list_reviews",
    "require_review",
    "review_result",
]


class ReportVerificationError(LedgerError):
    """The stored report does not hash to the committed SHA-256 (or is gone): a verdict."""

    def __init__(
        self, task_id: str, expected: str, actual: str | None, forged: str | None = None
    ) -> None:
        self.task_id, self.expected, self.actual = task_id, expected, actual
        found = f"the stored bytes hash to {actual}" if actual else "the report blob is missing"
        if forged is not None:
            found = f"the plane does not vouch for it ({forged})"
        super().__init__(
            f"review {task_id}: report fails verification: committed sha256 {expected}, {found}"
        )


def require_review(state: StreamState, task_id: str) -> ReviewState:
    """The review on ``state``; refused when there is none."""
    doc = state.of(ReviewState)
    if doc is None:
        raise CommandRefused(f"unknown review {task_id!r}")
    return doc


REVIEW_EVENTS = (
    ReviewStarted,
    ReviewCandidateSubmitted,
    ReviewAccountingRejected,
    ReviewAccounted,
    ReviewReportCommitted,
    ReviewFailed,
    ReviewHostScheduled,
    ReviewHostStarted,
    ReviewRoleRan,
    ReviewHandedOut,
)


def get_review(plane: Plane, task_id: str) -> ReviewState:
    return require_review(plane.state(f"review:{task_id}"), task_id)


def list_reviews(
    plane: Plane, *, plan_id: str | None = None, status: str | None = None
) -> list[ReviewState]:
    """Every review, oldest first (folded from the log: reviews have no read model)."""
    names = [cls.type_name() for cls in REVIEW_EVENTS]
    docs: dict[str, State | None] = {}
    for event in plane.store.read_all(types=names):
        docs[event.stream] = fold(event.stream, docs.get(event.stream), event.payload)
    return [
        d
        for d in docs.values()
        if isinstance(d, ReviewState)
        and (plan_id is None or d.plan_id == plan_id)
        and (status is None or d.status == status)
    ]


class AlreadyHandedOut(CommandRefused):
    """The report was handed out before: it is handed out once (exit 2)."""

    def __init__(self, task_id: str, handed_out: HandOutState) -> None:
        self.task_id, self.at, self.to = task_id, handed_out.at, handed_out.to
        super().__init__(
            f"review {task_id}: the report was already handed out, at {handed_out.at} to "
            f"{handed_out.to}; a report is handed out once"
        )


@dataclass
class ReviewResult:
    task_id: str
    report_sha256: str
    report_bytes: bytes
    handed_out_at: str
    recipient: str

    @property
    def report(self) -> dict[str, Any]:
        return msgspec.json.decode(self.report_bytes)

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "report_sha256": self.report_sha256,
            "verified": True,
            "handed_out": {"at": self.handed_out_at, "to": self.recipient},
            "report": self.report,
        }


def default_recipient() -> str:
    """Who receives a report when the caller does not say: the login name of this
    process (``uid:N`` where the system has no name for it)."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return f"uid:{os.getuid()}"


def review_result(plane: Plane, task_id: str, *, recipient: str | None = None) -> ReviewResult:
    """The committed report, whole, after checking its bytes against the committed hash,
    handed out once: ``review.handed_out`` (to ``recipient``, now) is committed before the
    report is returned. Raises ``ReportVerificationError`` (a verdict; nothing recorded,
    nothing handed out) when the bytes differ or are gone, and ``AlreadyHandedOut`` (a
    refusal naming when and to whom) on every call after the first."""
    recipient = check_identifier(recipient or default_recipient(), "recipient")
    doc = get_review(plane, task_id)
    if isinstance(doc.handed_out, HandOutState):
        raise AlreadyHandedOut(task_id, doc.handed_out)
    if doc.status != "completed":
        detail = f": {doc.failure}" if doc.failure else ""
        raise CommandRefused(f"review {task_id} has no report (status {doc.status}{detail})")
    assert doc.report is not None  # a completed review has its committed report
    expected = doc.report.sha256
    data = plane.store.get_blob(expected)
    if data is None:
        raise ReportVerificationError(task_id, expected, None)
    data = bytes(data)
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise ReportVerificationError(task_id, expected, actual)
    forged = review_problem(
        [e.payload for e in plane.store.read_stream(f"review:{task_id}")], plane.plane_public_key()
    )
    if forged is not None:
        raise ReportVerificationError(task_id, expected, actual, forged)
    at = utc_now()

    def decide(state: StreamState) -> list[EventPayload]:
        # Decided under the ledger lock: of two concurrent callers, one gets the report.
        now = require_review(state, task_id)
        if isinstance(now.handed_out, HandOutState):
            raise AlreadyHandedOut(task_id, now.handed_out)
        return [
            ReviewHandedOut(task_id=task_id, report_sha256=expected, recipient=recipient, at=at)
        ]

    plane.run(f"review:{task_id}", decide, actor=recipient)
    return ReviewResult(task_id, expected, data, at, recipient)
