"""What the audit remembers about each plan while it walks the log (``PlanWalk``, its
runs ``Run``), and what the plan checks read of the log-wide walk (``LogView``)."""

from __future__ import annotations

from typing import Protocol

from commands.rules.approvals import Approvals
from commands.rules.trust import ApproverKey
from ledger.events import (
    Truncation,
    ValidationResultRecorded,
    ValidationRunCompleted,
    ValidationRunStarted,
)
from projections.documents import State
from projections.states import PlanState

__all__ = ["LogView", "PlanWalk", "Run"]


class LogView(Protocol):
    """The log-wide walk as the plan checks see it, as of the event being audited."""

    def policy_docs(self) -> dict[str, State | None]: ...

    def approver_key(self, fingerprint: str) -> ApproverKey | None: ...

    def approvals(self) -> Approvals | None:
        """The approval policy and plans' operators as the plane trusts them (None:
        without the plane key, nothing of policy is trusted, so they are unchecked)."""


class Run:
    __slots__ = (
        "attempt",
        "completed",
        "invalidated_at",
        "position",
        "resolved",
        "results",
        "run_id",
    )

    def __init__(self, payload: ValidationRunStarted, position: int) -> None:
        self.run_id = payload.run_id
        self.attempt = payload.attempt
        self.resolved = list(payload.resolved)
        self.position = position
        self.results: list[ValidationResultRecorded] = []
        self.completed: ValidationRunCompleted | None = None
        self.invalidated_at: int | None = None  # the first event after it that supersedes


class PlanWalk:
    """What the audit remembers about one plan while walking its events."""

    def __init__(self) -> None:
        self.doc: PlanState | None = None  # None: no document yet
        self.runs: dict[str, Run] = {}
        self.last_run: Run | None = None
        self.last_completed: Run | None = None
        self.escalations: dict[str, int] = {}  # decision_id -> position
        self.escalation_leaf: dict[str, bytes] = {}  # decision_id -> leaf hash
        self.escalation_halt: dict[str, str] = {}  # decision_id -> canonical halt after it
        self.pending_escalation: str | None = None
        self.decided: dict[str, tuple[int, str]] = {}  # decision_id -> (position, choice)
        self.last_escalation: str | None = None
        self.minted: dict[str, int] = {}
        self.consumed: dict[str, int] = {}
        self.apply_at: int | None = None  # Apply began (the token consumed)
        self.changes_at: int | None = None  # where its change set was recorded
        self.forged_changes = False  # its change set is not what passed: never resumed
        # A failed gate check whose routing is being collected: (position, event id,
        # expected event types, the types seen so far caused by it).
        self.routing: tuple[int, str, list[list[str]], list[str]] | None = None
        # (step, output digest) of each tool call whose stdout went over its cap: the
        # output gate on those bytes must judge them truncated (never parse them).
        self.truncated: dict[tuple[str | None, str], Truncation] = {}

    def supersede_last_run(self, position: int) -> None:
        """Mark the last run superseded at ``position`` (a new run, a fix, a tool call),
        unless something superseded it before."""
        if self.last_run is not None and self.last_run.invalidated_at is None:
            self.last_run.invalidated_at = position
