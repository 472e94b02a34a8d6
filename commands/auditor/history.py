"""A plan's timeline: every event of its stream with a one-line summary."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from commands.plane.core import CommandRefused, Plane
from ledger import RecordedEvent
from ledger.events import (
    AttemptFailed,
    ChangesRecorded,
    CompensationCompleted,
    CompensationRequested,
    DecisionRecorded,
    Escalated,
    EventPayload,
    ExecuteEntered,
    FixRecorded,
    GateChecked,
    PlanApplied,
    PlanCreated,
    PlanHalted,
    StrategyRecorded,
    StrategyRevisionRequested,
    TokenConsumed,
    TokenMinted,
    ToolCalled,
    ValidationResultRecorded,
    ValidationRunCompleted,
    ValidationRunStarted,
)


def _gate(p: GateChecked) -> str:
    subject = f"tool {p.tool}" if p.gate == "input" else f"step {p.step}"
    if p.verdict == "pass":
        return f"{p.gate} gate, {subject}: pass"
    kinds = sorted({d.kind for d in p.deviations})
    return f"{p.gate} gate, {subject}: fail, {len(p.deviations)} deviation(s) ({', '.join(kinds)})"


def _halt(p: PlanHalted) -> str:
    terminal = ", terminal" if p.terminal else ""
    return f"halt {p.halt_type} (raw {p.raw_halt_type}{terminal}): {p.reason}"


def _short(text: str, width: int = 60) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


SUMMARIES: dict[type, Callable[[Any], str]] = {
    PlanCreated: lambda p: (
        f"created in Strategize (project {p.project}, resources {' '.join(p.resources)})"
    ),
    StrategyRecorded: lambda p: f"strategy, revision {p.revision}: {_short(p.strategy)}",
    ExecuteEntered: lambda p: (
        f"entered Execute (revision {p.revision}), {len(p.binding)} validation(s) pinned"
    ),
    GateChecked: _gate,
    AttemptFailed: lambda p: (
        f"attempt {p.attempt} iteration {p.iteration} failed ({p.failure_class}): {p.reason}"
    ),
    CompensationRequested: lambda p: f"compensation requested: {p.reason}",
    PlanHalted: _halt,
    ToolCalled: lambda p: f"tool {p.tool} ({p.executor}) exit {p.exit_code}, {p.duration_ms} ms",
    ValidationRunStarted: lambda p: (
        f"validation run {p.run_id[-6:]} of attempt {p.attempt}: {len(p.resolved)} attachment(s)"
    ),
    ValidationResultRecorded: lambda p: (
        f"{p.validation} [{p.mode}]: "
        + (
            ("pass" if p.verdict else "fail")
            if p.verdict is not None
            else f"no verdict ({p.cause})"
        )
        + (f" — {_short(p.message)}" if p.message else "")
    ),
    ValidationRunCompleted: lambda p: (
        f"outcome {p.outcome} (rules v{p.rules_version})"
        + (", vacuous: no required validation ran" if p.vacuous else "")
    ),
    FixRecorded: lambda p: f"fix for attempt {p.attempt}: {_short(p.note)}",
    StrategyRevisionRequested: lambda p: f"strategy revision {p.revision}: {p.reason}",
    Escalated: lambda p: f"escalated: decision {p.decision_id} ({', '.join(p.options)})",
    DecisionRecorded: lambda p: (
        f"decision {p.decision_id}: {p.choice} by {p.approver}"
        + (f" — {_short(p.guidance)}" if p.guidance else "")
    ),
    TokenMinted: lambda p: f"token {p.token_id} minted (attempt {p.attempt})",
    TokenConsumed: lambda p: f"token {p.token_id} consumed",
    ChangesRecorded: lambda p: f"change set recorded: {len(p.changes)} path(s) to put in place",
    PlanApplied: lambda p: f"applied ({len(p.changed_paths)} path(s) changed)",
    CompensationCompleted: lambda p: (
        f"compensation {'completed' if p.succeeded else 'failed'} (exit codes {p.exit_codes})"
    ),
}


def summarize(payload: EventPayload) -> str:
    """One event's line, from its payload alone."""
    describe = SUMMARIES.get(type(payload))
    if describe is not None:
        return describe(payload)
    return payload.type_name()


def summaries(events: Sequence[RecordedEvent]) -> list[str]:
    """The lines of one stream's events, in order: ``summarize``, and what a line needs
    from the events before it — an Apply after a vacuous run (no required validation,
    passed only because the plan opted out) is an *unvalidated* Apply."""
    lines = []
    vacuous = False
    for event in events:
        p = event.payload
        if isinstance(p, ValidationRunCompleted):
            vacuous = p.vacuous
        if isinstance(p, PlanApplied) and vacuous:
            lines.append(f"applied, unvalidated ({len(p.changed_paths)} path(s) changed)")
        else:
            lines.append(summarize(p))
    return lines


def plan_history(plane: Plane, plan_id: str) -> list[RecordedEvent]:
    events = plane.store.read_stream(f"plan:{plan_id}")
    if not events:
        raise CommandRefused(f"unknown plan {plan_id!r}")
    return events
