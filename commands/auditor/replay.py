"""Replay: one plan's stream folded event by event, its state after each (from the
log only: ``projections.documents.fold_plan``, no read model)."""

from __future__ import annotations

from typing import Any

import msgspec

from commands.errors import CommandRefused
from ledger import LogReader
from projections.documents import Document, fold_plan, to_json
from projections.states import PlanState

from .history import summarize

__all__ = ["ReplayStep", "plan_state", "replay_plan", "retries_left"]


class ReplayStep(msgspec.Struct, kw_only=True):
    """The plan's state right after one of its events."""

    position: int
    stream_version: int
    recorded_at: str
    actor: str
    type: str
    summary: str
    phase: str | None
    revision: int | None
    attempt: int | None
    retries_left: int | None
    outcome: str | None
    token: dict[str, Any] | None
    terminal: str | None
    document: Document  # the whole folded plan document


_COLUMNS = ("phase", "revision", "attempt", "retries_left", "outcome", "token", "terminal")


def plan_state(doc: PlanState | None) -> dict[str, Any]:
    """The replay columns of a folded plan state (all None for a forged stream with no
    ``plan.created`` first: replay shows it, the audit reports it)."""
    if doc is None:
        return dict.fromkeys(_COLUMNS)
    token = doc.token
    return {
        "phase": doc.phase,
        "revision": doc.revision,
        "attempt": doc.attempt,
        "retries_left": retries_left(doc.global_config.retry_limit, doc.retries_used),
        "outcome": doc.last_outcome,
        "token": {"token_id": token.token_id, "status": token.status} if token else None,
        "terminal": doc.terminal,
    }


def retries_left(retry_limit: int, failed: int) -> int:
    """Fix-then-revalidate cycles still allowed in this strategy: ``retry_limit`` of
    them follow its first failed validation."""
    return max(0, retry_limit + 1 - max(failed, 1))


def replay_plan(store: LogReader, plan_id: str, as_of: int | None = None) -> list[ReplayStep]:
    """Fold plan ``plan_id``'s stream event by event (up to position ``as_of``)."""
    if as_of is not None and as_of < 1:
        raise CommandRefused(f"--as-of {as_of}: positions start at 1")
    stream = f"plan:{plan_id}"
    events = store.read_stream(stream, as_of=as_of)
    if not events:
        where = f" as of position {as_of}" if as_of is not None else ""
        raise CommandRefused(f"unknown plan {plan_id!r}{where}")
    doc: PlanState | None = None
    steps = []
    for event in events:
        doc = fold_plan(doc, event.payload)
        steps.append(
            ReplayStep(
                position=event.position,
                stream_version=event.stream_version,
                recorded_at=event.recorded_at,
                actor=event.actor,
                type=event.type,
                summary=summarize(event.payload),
                document=to_json(doc),
                **plan_state(doc),
            )
        )
    return steps
