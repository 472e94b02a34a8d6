"""Phase handlers: record a strategy (Strategize), enter Execute (the binding set and the
skills pinned)."""

from __future__ import annotations

import hashlib
import shutil

from msgspec import UNSET, UnsetType

from commands.errors import NextStep
from commands.runner.sandbox import encode_trees
from ledger.events import ExecuteEntered, ResolvedAttachment, SkillPin, StrategyRecorded
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
            f"plan {plan_id} awaits a human decision",
            NextStep("authorize", plan_id, pending.decision_id),
        )


def require_execute(doc: PlanState, plan_id: str, what: str) -> None:
    """Refused unless the plan is in Execute, where ``what`` happens; from Strategize
    the refusal names the step that leads there."""
    if doc.phase == "execute":
        return
    step = None
    if doc.phase == "strategize":
        step = NextStep("execute" if doc.strategy else "record_strategy", plan_id)
    raise CommandRefused(
        f"plan {plan_id} is in {doc.phase.capitalize()}: {what} only in Execute", step
    )


def record_strategy(
    plane: Plane, plan_id: str, strategy: str, *, actor: str = "system"
) -> PlanState:
    """Record (or replace) the strategy of the current revision, in Strategize."""
    if not strategy.strip():
        raise CommandRefused("the strategy is empty")

    def decide(state: StreamState) -> list[StrategyRecorded]:
        doc = require_plan(state, plan_id)
        require_no_pending_decision(doc, plan_id)  # an escalation is a human's to answer
        if doc.phase != "strategize":
            raise CommandRefused(
                f"plan {plan_id} is in {doc.phase.capitalize()}: a "
                "strategy is recorded in Strategize"
            )
        return [StrategyRecorded(plan_id=plan_id, revision=doc.revision, strategy=strategy)]

    plane.run(f"plan:{plan_id}", decide, actor=actor)
    return plane.state(f"plan:{plan_id}").existing(PlanState)


def _skill_pins(state: StreamState, doc: PlanState) -> dict[str, SkillPin] | UnsetType:
    """The plan's skills as pinned at its first Execute (kept by every later one)."""
    if doc.skills is UNSET:
        return UNSET
    if doc.skill_pins is not UNSET:
        return doc.skill_pins
    assert state.log is not None
    pins = state.log.skill_pins(doc.skills)
    missing = sorted(set(doc.skills) - set(pins))
    if missing:  # only a writer past the plane can make one: skills are never deleted
        raise CommandRefused(f"plan {doc.plan_id}'s skill(s) {', '.join(missing)} are not defined")
    return pins


def would_bind(plane: Plane, plan_id: str) -> list[ResolvedAttachment]:
    """The binding set the plan would pin if it entered Execute now: what it holds,
    plus every attachment that applies to it (what the strategy must plan for)."""
    log = plane.log()
    doc = require_plan(log.state(f"plan:{plan_id}"), plan_id)
    return pin_binding(doc.binding, log.applicable(doc))


def enter_execute(plane: Plane, plan_id: str, *, actor: str = "system") -> PlanState:
    """Strategize -> Execute; needs a recorded strategy. Pins the plan's binding set: the
    members it already holds, unchanged, plus every attachment that applies now (read
    from the log in this transaction). The first Execute makes the plan's sandbox and
    records its **snapshot** (the manifests of the copies, a blob): Apply writes only
    the difference between a validated tree and it."""
    found = plane.state(f"plan:{plan_id}").of(PlanState)
    snapshot: bytes | None = None
    sandbox = plane.sandbox(found) if found is not None else None
    first = found is not None and found.snapshot_sha256 is UNSET and found.phase == "strategize"
    if first and sandbox is not None:
        shutil.rmtree(sandbox.root, ignore_errors=True)  # a copy left by a crash is stale
        snapshot = encode_trees(sandbox.ensure().snapshot())
    digest = hashlib.sha256(snapshot).hexdigest() if snapshot is not None else None

    def decide(state: StreamState) -> list[ExecuteEntered]:
        doc = require_plan(state, plan_id)
        require_no_pending_decision(doc, plan_id)
        if doc.phase != "strategize":
            raise CommandRefused(f"plan {plan_id} is in {doc.phase.capitalize()}, not Strategize")
        if not doc.strategy:
            raise CommandRefused(
                f"plan {plan_id} has no strategy", NextStep("record_strategy", plan_id)
            )
        if (doc.snapshot_sha256 is UNSET) != (digest is not None):
            raise CommandRefused(f"plan {plan_id} moved on meanwhile; enter Execute again")
        assert state.log is not None
        binding = pin_binding(doc.binding, state.log.applicable(doc))
        return [
            ExecuteEntered(
                plan_id=plan_id,
                revision=doc.revision,
                binding=binding,
                skills=_skill_pins(state, doc),
                snapshot_sha256=digest,
            )
        ]

    try:
        plane.run(f"plan:{plan_id}", decide, actor=actor, blobs=[snapshot] if snapshot else [])
    except BaseException:
        if first and sandbox is not None:
            shutil.rmtree(sandbox.root, ignore_errors=True)
        raise
    doc = plane.state(f"plan:{plan_id}").existing(PlanState)
    plane.sandbox(doc).ensure()  # the copy every call, fix and validation works in
    return doc
