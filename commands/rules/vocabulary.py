"""The plans' vocabulary every reader uses — the plane's handlers, the CLI, the report,
the auditor: the outcomes a run can have, and how a plan ended."""

from __future__ import annotations

from typing import get_args

from ledger.events.validation import Outcome
from projections.states import PlanState

__all__ = ["OUTCOMES", "terminal_label", "terminal_state"]

OUTCOMES: tuple[str, ...] = get_args(Outcome)


def terminal_state(doc: PlanState | None) -> str | None:
    """How a plan ended, in the one vocabulary every reader uses (run summaries, `plan
    list/show/history`, the report, `stats`): ``applied``; ``applied (unvalidated)`` when
    the run its token came from had no required validation (a plan created with
    ``require_validation: false``); ``compensated`` when a strict-mode deviation ended it
    and requested compensation; ``failed`` when it ended any other way; None while it has
    not ended."""
    if doc is None:
        return None
    return terminal_label(doc.terminal, doc.unvalidated, doc.compensation is not None)


def terminal_label(
    terminal: str | None, unvalidated: bool, compensated: bool = False
) -> str | None:
    """``terminal_state`` from a plan's ``terminal``, ``unvalidated`` and whether it has a
    ``compensation`` (as a replay step or a plain plan document has them)."""
    if terminal == "applied" and unvalidated:
        return "applied (unvalidated)"
    if terminal == "failed" and compensated:
        return "compensated"
    return terminal
