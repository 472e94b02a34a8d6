"""A plan's timeline: every event of its stream with a one-line summary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ledger import RecordedEvent
from ledger.events import (
    AttemptFailed,
    CompensationRequested,
    EventPayload,
    ExecuteEntered,
    GateChecked,
    PlanCreated,
    PlanHalted,
    StrategyRecorded,
)

from .plane import CommandRefused, Plane


def _gate(p: GateChecked) -> str:
    subject = f"tool {p.tool}" if p.gate == "input" else f"step {p.step}"
    if p.verdict == "pass":
        return f"{p.gate} gate, {subject}: pass"
    kinds = sorted({d.kind for d in p.deviations})
    return (f"{p.gate} gate, {subject}: fail, {len(p.deviations)} deviation(s) "
            f"({', '.join(kinds)})")


def _halt(p: PlanHalted) -> str:
    terminal = ", terminal" if p.terminal else ""
    return f"halt {p.halt_type} (raw {p.raw_halt_type}{terminal}): {p.reason}"


def _short(text: str, width: int = 60) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


SUMMARIES: dict[type, Callable[[Any], str]] = {
    PlanCreated: lambda p: (f"created in Strategize (project {p.project}, "
                            f"resources {' '.join(p.resources)})"),
    StrategyRecorded: lambda p: f"strategy, revision {p.revision}: {_short(p.strategy)}",
    ExecuteEntered: lambda p: f"entered Execute (revision {p.revision})",
    GateChecked: _gate,
    AttemptFailed: lambda p: (f"attempt {p.attempt} iteration {p.iteration} failed "
                              f"({p.failure_class}): {p.reason}"),
    CompensationRequested: lambda p: f"compensation requested: {p.reason}",
    PlanHalted: _halt,
}


def summarize(payload: EventPayload) -> str:
    describe = SUMMARIES.get(type(payload))
    if describe is not None:
        return describe(payload)
    return payload.type_name()


def plan_history(plane: Plane, plan_id: str) -> list[RecordedEvent]:
    events = plane.store.read_stream(f"plan:{plan_id}")
    if not events:
        raise CommandRefused(f"unknown plan {plan_id!r}")
    return events
