"""Plan handlers: create a plan; read plans from the plans read model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from commands.names import check_identifier, check_plan_resource
from commands.rules.vocabulary import terminal_state
from ledger.events import GlobalConfig, PlanCreated
from projections.states import HaltState, PendingDecision, PlanState

from .core import CommandRefused, Plane, StreamState

# The six canonical outcomes: a run's outcome, a halt's type (docs/concepts.md).


def parse_global_config(raw: Mapping[str, Any] | None) -> GlobalConfig:
    """Strict: unknown keys and wrong types are refused, nothing is coerced."""
    try:
        return msgspec.convert(dict(raw or {}), GlobalConfig, strict=True)
    except msgspec.ValidationError as exc:
        raise CommandRefused(f"invalid global_config: {exc}") from None


def create_plan(
    plane: Plane,
    plan_id: str,
    *,
    project: str,
    resources: Sequence[str],
    config: Mapping[str, Any] | None = None,
    skills: Sequence[str] = (),
    actor: str = "system",
) -> PlanState:
    """Create a plan in phase Strategize; refused if the plan id is taken. With
    ``skills``, the plan may call only their tools and validations (each skill must be
    defined; its version is pinned when the plan enters Execute)."""
    check_identifier(plan_id, "plan id")
    check_identifier(project, "project")
    if not resources:
        raise CommandRefused("a plan needs at least one --resource")
    resources = [check_plan_resource(resource) for resource in resources]  # a path exists
    if len(set(resources)) != len(resources):
        raise CommandRefused("a resource is listed twice (as its canonical identity)")
    global_config = parse_global_config(config)
    for skill in skills:
        check_identifier(skill, "skill name")
    if len(set(skills)) != len(skills):
        raise CommandRefused("a skill is listed twice")

    def decide(state: StreamState) -> list[PlanCreated]:
        if state.exists:
            raise CommandRefused(f"plan {plan_id!r} already exists")
        assert state.log is not None
        unknown = sorted(set(skills) - set(state.log.skill_pins(skills)))
        if unknown:
            raise CommandRefused(
                f"unknown skill(s) {', '.join(map(repr, unknown))}: define them first "
                "(evidence skill define FILE)"
            )
        return [
            PlanCreated(
                plan_id=plan_id,
                project=project,
                resources=list(resources),
                global_config=global_config,
                skills=list(skills) if skills else msgspec.UNSET,
            )
        ]

    plane.run(f"plan:{plan_id}", decide, actor=actor)
    return plane.state(f"plan:{plan_id}").existing(PlanState)


def get_plan(plane: Plane, plan_id: str) -> PlanState | None:
    """The plan's state; None for a plan stream with no ``plan.created`` (only a raw
    append makes one: it is in the log, so it is shown, and ``evidence audit`` reports
    it). Refused for a plan with no events at all."""
    found = plane.projections.document("plans", plan_id)
    if found is None:
        raise CommandRefused(f"unknown plan {plan_id!r}")
    return found[0]


def current_plan(plane: Plane, plan_id: str) -> PlanState | None:
    """The plan's state folded from its stream now, as ``get_plan`` answers it: what
    the last committed answer left, however far a read model lags behind it (the
    service's follower catches them up a moment after its answers)."""
    state = plane.state(f"plan:{plan_id}")
    if not state.exists:
        raise CommandRefused(f"unknown plan {plan_id!r}")
    return state.of(PlanState)


def plan_brief(plane: Plane, plan_id: str) -> dict[str, Any]:
    """Where the plan stands now, in brief (``current_plan``): what every answer that
    may have moved it carries, so an agent never acts on an older state than the one
    its own last step left."""
    doc = current_plan(plane, plan_id)
    if doc is None:
        raise CommandRefused(f"unknown plan {plan_id!r}")
    pending = doc.pending_decision
    return {
        "phase": doc.phase,
        "revision": doc.revision,
        "attempt": doc.attempt,
        "needs_fix": doc.needs_fix,
        "terminal": doc.terminal,
        "pending_decision": pending.decision_id if pending is not None else None,
        **(_waiting_for(pending) if pending is not None else {}),
    }


def _waiting_for(pending: PendingDecision) -> dict[str, Any]:
    """What a pending decision waits for, beyond its id: when it expires, and with k of
    n approvers, how many must sign one choice and how many have signed."""
    found: dict[str, Any] = {}
    if isinstance(pending.expires_at, str):
        found["decision_expires_at"] = pending.expires_at
    if isinstance(pending.approvals_required, int):
        found["approvals_required"] = pending.approvals_required
        found["approvals_given"] = len(pending.approvals or {})
    return found


def sandbox_paths(plane: Plane, doc: PlanState | None) -> dict[str, str]:
    """Where the plan's work happens until Apply, by resource (none before Execute)."""
    if doc is None or not doc.plan_id or doc.attempt == 0:
        return {}
    return {r: str(p) for r, p in plane.sandbox(doc).existing().items()}


def list_plans(plane: Plane, *, project: str | None = None) -> dict[str, PlanState | None]:
    """Every plan's state, by plan id (in id order); None for one whose stream has no
    ``plan.created``."""
    plane.projections.catch_up()
    where = [] if project is None else [lambda t: t.c.project == project]
    return plane.projections.keyed_documents("plans", *where)


def plan_state(doc: PlanState) -> str:
    """Where a plan stands, one word: its ``terminal_state`` once it ended, else
    ``escalated`` (a human decision is pending), ``halted`` (a halt stands) or ``open``."""
    ended = terminal_state(doc)
    if ended is not None:
        return ended
    if doc.pending_decision is not None:
        return "escalated"
    return "halted" if current_halt(doc) is not None else "open"


def current_halt(doc: PlanState) -> HaltState | None:
    """The plan's halt while it stands: an applied plan's earlier halts are history
    (``plan history`` shows them), not its state."""
    return None if doc.terminal == "applied" else doc.halt
