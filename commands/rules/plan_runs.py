"""What a plan's recorded runs say, read from its stream: how its programs ran
(``ConfinementSummary``) and why its latest validation run failed (``Failure``: the
message or error, and the tails of what the program printed, read from the recorded raw
output). The plane answers them to the agent (``evidence.plan_status``), the auditor
puts them in its report, the CLI shows them: one reading for every door."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from commands.errors import CommandRefused
from commands.runner.results import output_tails
from ledger import RecordedEvent
from ledger.events import PlanCreated, ToolCalled, ValidationResultRecorded
from ledger.store import LogReader, Store

__all__ = [
    "BlobReader",
    "ConfinementSummary",
    "Failure",
    "confinement_summary",
    "failure_lines",
    "failure_of",
    "last_run_failures",
    "plan_history",
    "plan_runs",
]


# What a plan's runs say is read from these of its events only (a long plan's stream is
# mostly gate checks, which neither reads).
RUN_TYPES = tuple(t.type_name() for t in (PlanCreated, ToolCalled, ValidationResultRecorded))


def plan_runs(store: Store, plan_id: str) -> list[RecordedEvent]:
    """The plan's events that ``confinement_summary`` and ``last_run_failures`` read."""
    return store.read_stream_types(f"plan:{plan_id}", RUN_TYPES)


def plan_history(store: LogReader, plan_id: str) -> list[RecordedEvent]:
    events = store.read_stream(f"plan:{plan_id}")
    if not events:
        raise CommandRefused(f"unknown plan {plan_id!r}")
    return events


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
