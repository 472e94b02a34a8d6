"""A plan's timeline: every event of its stream with a one-line summary; and why its
validations failed (``Failure``: the message or error, and the tails of what the program
printed, read from the recorded raw output)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from commands.errors import CommandRefused
from commands.runner.results import output_tails
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
    McpFetched,
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
from ledger.store import LogReader


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
    McpFetched: lambda p: f"read {p.what} {_short(p.name)} of {p.server} ({p.size} bytes)",
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


class ConfinementSummary(msgspec.Struct, kw_only=True):
    """How a plan's programs ran: its policy (``global_config.confinement``: ``landlock``
    or ``none``) and how many of its recorded runs (``tool.called``,
    ``validation.result_recorded``) say ``landlock`` or ``unconfined``; runs that say
    neither (recorded calls, events before the field) are not counted."""

    policy: str
    landlock: int = 0
    unconfined: int = 0

    def text(self) -> str:
        runs = f"{self.landlock} run(s) confined by Landlock, {self.unconfined} unconfined"
        if self.policy == "none":
            return f"none (opted out: its programs run UNCONFINED); {runs}"
        return f"landlock; {runs}"


def confinement_summary(events: Sequence[RecordedEvent]) -> ConfinementSummary:
    """``ConfinementSummary`` of one plan stream's events."""
    found = ConfinementSummary(policy="landlock")
    for event in events:
        p = event.payload
        if isinstance(p, PlanCreated) and p.global_config.confinement == "none":
            found.policy = "none"
        elif isinstance(p, ToolCalled | ValidationResultRecorded):
            if p.confinement == "landlock":
                found.landlock += 1
            elif p.confinement == "unconfined":
                found.unconfined += 1
    return found


def plan_history(store: LogReader, plan_id: str) -> list[RecordedEvent]:
    events = store.read_stream(f"plan:{plan_id}")
    if not events:
        raise CommandRefused(f"unknown plan {plan_id!r}")
    return events


# -- why a validation failed -------------------------------------------------------------


class Failure(msgspec.Struct, kw_only=True):
    """A validation result that is no pass, and why: its message (a verdict ``false``)
    or its error (no verdict), and the tails of what its program printed (from the
    recorded raw output; ``commands.runner.results.output_tails``)."""

    position: int
    run_id: str
    validation: str
    mode: str
    verdict: bool | None  # False, or None (no verdict: see cause)
    cause: str | None
    message: str | None
    error: str | None
    stdout_tail: str | None
    stderr_tail: str | None


BlobReader = Callable[[str], bytes | None]


def failure_of(event: RecordedEvent, get_blob: BlobReader) -> Failure | None:
    """The failure a ``validation.result_recorded`` event records, None for a pass (or
    another event)."""
    p = event.payload
    if not isinstance(p, ValidationResultRecorded) or p.verdict is True:
        return None
    raw = get_blob(p.raw_output_sha256) if p.raw_output_sha256 else None
    stderr = get_blob(p.stderr_sha256) if p.stderr_sha256 else None
    stdout_tail, stderr_tail = output_tails(
        bytes(raw) if raw is not None else None, bytes(stderr) if stderr is not None else None
    )
    return Failure(
        position=event.position,
        run_id=p.run_id,
        validation=p.validation,
        mode=p.mode,
        verdict=p.verdict,
        cause=p.cause,
        message=p.message,
        error=p.error,
        stdout_tail=stdout_tail,
        stderr_tail=stderr_tail,
    )


def last_run_failures(events: Sequence[RecordedEvent], get_blob: BlobReader) -> list[Failure]:
    """The failures of the plan's latest validation run with results."""
    last = next(
        (
            e.payload.run_id
            for e in reversed(events)
            if isinstance(e.payload, ValidationResultRecorded)
        ),
        None,
    )
    found = [
        failure_of(e, get_blob)
        for e in events
        if isinstance(e.payload, ValidationResultRecorded) and e.payload.run_id == last
    ]
    return [f for f in found if f is not None]


def failure_lines(failure: Failure, indent: str = "  ") -> list[str]:
    """A failure as lines for a person: what failed and why, then each stream's tail,
    indented. The text is the log's: show it through ``inert(..., multiline=True)``."""
    verdict = "FAIL" if failure.verdict is False else f"no verdict ({failure.cause})"
    why = failure.message if failure.verdict is False else failure.error
    lines = [f"{failure.validation} [{failure.mode}]: {verdict}" + (f": {why}" if why else "")]
    if failure.verdict is False and failure.error:
        lines.append(f"{indent}error: {failure.error}")
    for name, tail in (("stderr", failure.stderr_tail), ("stdout", failure.stdout_tail)):
        if tail:
            count = tail.count("\n") + 1
            lines.append(f"{indent}{name}, last {count} line(s):")
            lines.extend(f"{indent}  | {line}" for line in tail.split("\n"))
    return lines
