"""One answer per agent verb, whichever door asks.

An agent reaches the plane through three doors: the CLI (``--json``), the JSON API
(``evidence serve``'s ``/v1/*``) and MCP (the stdio proxy and ``/mcp``, whose verbs
answer this JSON as ``structuredContent``). Each verb's answer is built here, once, and
every door prints it as it is: a door may add its own envelope (MCP's ``_meta``), never
change the answer. tests/commands/plane/test_doors_answer_alike.py compares the three for
every verb.

An answer that records a step the plan counts (a gate check, a call, a validation run)
carries ``plan_state`` (``commands.plane.plans.plan_brief``): where the plan stands now
that the step is recorded, so an agent never acts on an older state than the one its own
step left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from commands.rules.plan_runs import (
    ConfinementSummary,
    Failure,
    confinement_summary,
    last_run_failures,
    plan_runs,
)
from ledger.errors import LedgerError
from ledger.events import ResolvedAttachment
from projections.documents import to_json
from projections.states import PlanState

from .core import Plane
from .phases import would_bind
from .plans import current_plan, plan_brief, sandbox_paths

if TYPE_CHECKING:  # `evidence plan show` loads no gate, runner nor schema checker
    from .gates import GateOutcome
    from .runs import CallReport
    from .validation_runs import ValidationReport

__all__ = [
    "PlanStatus",
    "applied_answer",
    "call_answer",
    "execute_answer",
    "fix_answer",
    "gate_answer",
    "plan_status",
    "strategy_answer",
    "validation_answer",
]


@dataclass(frozen=True)
class PlanStatus:
    """A plan as the agent and its operator see it: its state, where its sandbox is, the
    validations it would pin at Execute (in Strategize, else None), how its programs
    ran, and why its latest validation run failed."""

    plan: PlanState | None  # None: a stream with no plan.created (only a raw append)
    sandbox: dict[str, str]
    would_bind: list[ResolvedAttachment] | None
    confinement: ConfinementSummary
    failures: list[Failure]

    def to_json(self) -> dict[str, Any]:
        return {
            "plan": to_json(self.plan),
            "sandbox": self.sandbox,
            "would_bind": None if self.would_bind is None else _each(self.would_bind),
            "confinement": to_json(self.confinement),
            "failures": _each(self.failures),
        }


def _each(items: list[Any]) -> list[Any]:
    return [to_json(item) for item in items]


PlanReader = Callable[[Plane, str], PlanState | None]


def plan_status(plane: Plane, plan_id: str, read: PlanReader = current_plan) -> PlanStatus:
    """The plan's status; refused for a plan with no events. An agent's door reads the
    plan folded from its stream now (``current_plan``: never older than the agent's last
    answer, and refused where its log breaks a rule, as the plane refuses to act on it);
    a reader of any log (``evidence plan show``) passes ``get_plan``, the read model,
    which shows such a plan (``evidence audit`` reports it)."""
    doc = read(plane, plan_id)
    events = plan_runs(plane.store, plan_id)
    return PlanStatus(
        plan=doc,
        sandbox=sandbox_paths(plane, doc),
        would_bind=_would_bind(plane, doc),
        confinement=confinement_summary(events),
        failures=last_run_failures(events, plane.store.get_blob),
    )


def _would_bind(plane: Plane, doc: PlanState | None) -> list[ResolvedAttachment] | None:
    """In Strategize: the validations the plan would pin at Execute now (None else, or
    when its log cannot be folded: the status is still answered)."""
    if doc is None or doc.phase != "strategize" or doc.terminal is not None:
        return None
    try:
        return would_bind(plane, doc.plan_id)
    except LedgerError:
        return None


def strategy_answer(plane: Plane, doc: PlanState) -> dict[str, Any]:
    """A recorded strategy: the plan, and the validations it would pin at Execute (what
    the strategy must plan for)."""
    return {"plan": to_json(doc), "would_bind": _each(would_bind(plane, doc.plan_id))}


def execute_answer(plane: Plane, doc: PlanState) -> dict[str, Any]:
    """Execute entered: the plan and where its sandbox is."""
    return {"plan": to_json(doc), "sandbox": sandbox_paths(plane, doc)}


def fix_answer(doc: PlanState) -> dict[str, Any]:
    return {"plan": to_json(doc)}


def applied_answer(doc: PlanState) -> dict[str, Any]:
    """Apply done: the plan and the files it wrote."""
    files = doc.applied.files if doc.applied is not None else []
    return {"plan": to_json(doc), "files": _each(files)}


def gate_answer(plane: Plane, plan_id: str, outcome: GateOutcome) -> dict[str, Any]:
    return {"gate": outcome.to_json(), "plan_state": plan_brief(plane, plan_id)}


def call_answer(plane: Plane, plan_id: str, report: CallReport) -> dict[str, Any]:
    return {**report.to_json(), "plan_state": plan_brief(plane, plan_id)}


def validation_answer(plane: Plane, plan_id: str, report: ValidationReport) -> dict[str, Any]:
    return {"validation": report.to_json(), "plan_state": plan_brief(plane, plan_id)}
