"""The plane's refusal: bad input, or a step the plan's state does not allow.

A refusal that has a next step names it as a verb of the plane (``NextStep``), not as a
command: each door says it in its own terms (``said_by``) — the CLI as a command line,
the JSON API as a route, the MCP gate as an ``evidence.*`` verb — so no caller is told
to run something its door does not have. ``str()`` is the CLI's (and the Python API's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ledger import LedgerError

Door = Literal["cli", "api", "mcp"]
Verb = Literal["record_strategy", "execute", "record_fix", "apply", "authorize"]

# What each door calls each verb. {plan}: the plan; {decision}: a pending decision.
_SAID: dict[Verb, dict[Door, str]] = {
    "record_strategy": {
        "cli": "evidence plan strategize {plan} --strategy TEXT",
        "api": 'POST /v1/strategy {{"strategy": TEXT}}',
        "mcp": "evidence.record_strategy with the strategy",
    },
    "execute": {
        "cli": "evidence plan execute {plan}",
        "api": "POST /v1/execute",
        "mcp": "evidence.execute",
    },
    "record_fix": {
        "cli": "evidence fix {plan} --note TEXT",
        "api": 'POST /v1/fix {{"note": TEXT}}',
        "mcp": "evidence.record_fix with a note",
    },
    "apply": {
        "cli": "evidence apply {plan} --token TOKEN",
        "api": 'POST /v1/apply {{"token": TOKEN}}',
        "mcp": "evidence.apply with the token",
    },
    "authorize": {
        "cli": "a human: evidence authorize {decision} --key FILE (--revise TEXT | --abandon)",
        "api": "a human approver decides ({decision}); until then the plan waits",
        "mcp": "a human approver decides ({decision}); until then the plan waits",
    },
}


@dataclass(frozen=True)
class NextStep:
    """The step a refusal points the caller to, named by the plane's verb."""

    verb: Verb
    plan_id: str
    decision_id: str = ""

    def said_by(self, door: Door) -> str:
        return _SAID[self.verb][door].format(plan=self.plan_id, decision=self.decision_id)


class CommandRefused(LedgerError):
    """Bad input, or a step the current state does not allow. Nothing was appended.
    ``next_step``, when there is one, is what the caller may do instead."""

    def __init__(self, reason: str, next_step: NextStep | None = None) -> None:
        self.reason, self.next_step = reason, next_step
        super().__init__(self.said_by("cli"))

    def said_by(self, door: Door) -> str:
        if self.next_step is None:
            return self.reason
        return f"{self.reason} (next: {self.next_step.said_by(door)})"


def said_by(exc: BaseException, door: Door) -> str:
    """The refusal ``exc`` as the door ``door`` says it to its caller."""
    return exc.said_by(door) if isinstance(exc, CommandRefused) else str(exc)
