"""Phase handlers: record a strategy, enter Execute (seed 000's plan lifecycle)."""

from __future__ import annotations

from ledger.events import ExecuteEntered, StrategyRecorded
from projections.resolution import pin_binding
from projections.states import PlanState

from .core import CommandRefused, Plane, StreamState


def require_plan(state: StreamState, plan_id: str) -> PlanState:
    """The plan's state; refused when it does not exist or has ended."""
    doc = state.of(PlanState)
    if doc is None:
        raise CommandRefused(f"unknown plan {plan_id!r}")
    if doc.terminal is not None:
        raise CommandRefused(
            f"plan {plan_id} has ended ({doc.terminal}): nothing more can be recorded for it"
        )
    return doc


def require_no_pending_decision(doc: PlanState, plan_id: str) -> None:
    """Refused while the plan awaits a human's decision (an escalation)."""
    pending = doc.pending_decision
    if pending is not None:
        raise CommandRefused(
            f"plan {plan_id} awaits a human decision: evidence authorize "
            f"{pending.decision_id} --key FILE (--revise TEXT | --abandon)"
        )


def record_strategy(
    plane: Plane, plan_id: str, strategy: str, *, actor: str = "system"
) -> PlanState:
    """Record (or replace) the strategy of the current revision, in Strategize."""
    if not strategy.strip():
        raise CommandRefused("--strategy is empty")

    def decide(state: StreamState) -> list[StrategyRecorded]:
        doc = require_plan(state, plan_id)
        if doc.phase != "strategize":
            raise CommandRefused(
                f"plan {plan_id} is in {doc.phase.capitalize()}: a "
                "strategy is recorded in Strategize"
            )
        return [StrategyRecorded(plan_id=plan_id, revision=doc.revision, strategy=strategy)]

    plane.run(f"plan:{plan_id}", decide, actor=actor)
    return plane.state(f"plan:{plan_id}").existing(PlanState)


def enter_execute(plane: Plane, plan_id: str, *, actor: str = "system") -> PlanState:
    """Strategize -> Execute; needs a recorded strategy. Pins the plan's binding set: the
    members it already holds, unchanged, plus every attachment that applies now (read
    from the log in this transaction)."""

    def decide(state: StreamState) -> list[ExecuteEntered]:
        doc = require_plan(state, plan_id)
        if doc.phase != "strategize":
            raise CommandRefused(f"plan {plan_id} is in {doc.phase.capitalize()}, not Strategize")
        if not doc.strategy:
            raise CommandRefused(
                f"plan {plan_id} has no strategy: record one with "
                f"`evidence plan strategize {plan_id} --strategy TEXT`"
            )
        assert state.log is not None
        binding = pin_binding(doc.binding, state.log.applicable(doc))
        return [ExecuteEntered(plan_id=plan_id, revision=doc.revision, binding=binding)]

    plane.run(f"plan:{plan_id}", decide, actor=actor)
    doc = plane.state(f"plan:{plan_id}").existing(PlanState)
    plane.sandbox(doc).ensure()  # the copy every call, fix and validation works in
    return doc
