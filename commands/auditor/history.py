"""A plan's timeline: every event of its stream with a one-line summary (what its runs
say, confinement and failures, is ``commands.rules.plan_runs``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ledger import RecordedEvent
from ledger.events import (
    AttemptFailed,
    ChangesRecorded,
    CompensationCompleted,
    CompensationRequested,
    DecisionRecorded,
    Escalated,
    EscalationExpired,
    EventPayload,
    ExecuteEntered,
    FixRecorded,
    GateChecked,
    McpFetched,
    McpInputGiven,
    McpInputRequired,
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


def _tool_called(p: ToolCalled) -> str:
    """A call's line: its exit code and duration only when it has them. A call the
    orchestrator recorded (``--record-output``) ran nowhere the plane saw: no exit code,
    no duration of its own; an MCP call has no exit code."""
    if p.executor == "recorded":
        return f"tool {p.tool} (recorded by the orchestrator)"
    shown = [f"exit {p.exit_code}"] if p.exit_code is not None else []
    return f"tool {p.tool} ({p.executor}) " + ", ".join([*shown, f"{p.duration_ms} ms"])


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
    ToolCalled: lambda p: (
        _tool_called(p) + (", UNCONFINED" if p.confinement == "unconfined" else "")
    ),
    McpFetched: lambda p: (
        f"read {p.what} {_short(p.name)} of {p.server} ({p.size} bytes)"
        + (f", after answering {', '.join(p.given)}" if isinstance(p.given, list) else "")
    ),
    McpInputRequired: lambda p: (
        f"tool {p.tool} asked the agent's client first (round {p.round_id[-6:]}): "
        + ", ".join(f"{key} ({method})" for key, method in sorted(p.asked.items()))
    ),
    McpInputGiven: lambda p: (
        f"answers given to {p.tool}"
        + (f" (round {p.round_id[-6:]})" if isinstance(p.round_id, str) else "")
        + ": "
        + (", ".join(p.given) or "none")
    ),
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
        + (", UNCONFINED" if p.confinement == "unconfined" else "")
    ),
    ValidationRunCompleted: lambda p: (
        f"outcome {p.outcome} (rules v{p.rules_version})"
        + (", vacuous: no required validation ran" if p.vacuous else "")
    ),
    FixRecorded: lambda p: f"fix for attempt {p.attempt}: {_short(p.note)}",
    StrategyRevisionRequested: lambda p: f"strategy revision {p.revision}: {p.reason}",
    Escalated: lambda p: (
        f"escalated: decision {p.decision_id} ({', '.join(p.options)})"
        + (f", {p.approvals_required} approvers" if isinstance(p.approvals_required, int) else "")
    ),
    EscalationExpired: lambda p: (
        f"escalation {p.decision_id} expired at {p.expired_at} with no decision: plan denied"
    ),
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
