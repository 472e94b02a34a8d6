"""Plan handlers: create a plan; read plans from the plans read model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ledger.events import GlobalConfig, PlanCreated
from projections.documents import Document

from .names import check_identifier, check_resource
from .plane import CommandRefused, Plane, StreamState


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
    actor: str = "system",
) -> Document:
    """Create a plan in phase Strategize; refused if the plan id is taken."""
    check_identifier(plan_id, "plan id")
    check_identifier(project, "project")
    if not resources:
        raise CommandRefused("a plan needs at least one --resource")
    for resource in resources:
        check_resource(resource)
    if len(set(resources)) != len(resources):
        raise CommandRefused("a resource is listed twice")
    global_config = parse_global_config(config)

    def decide(state: StreamState) -> list[PlanCreated]:
        if state.exists:
            raise CommandRefused(f"plan {plan_id!r} already exists")
        return [PlanCreated(plan_id=plan_id, project=project, resources=list(resources),
                            global_config=global_config)]

    plane.run(f"plan:{plan_id}", decide, actor=actor)
    return plane.state(f"plan:{plan_id}").doc


def get_plan(plane: Plane, plan_id: str) -> Document:
    found = plane.projections.document("plans", plan_id)
    if found is None:
        raise CommandRefused(f"unknown plan {plan_id!r}")
    return found[0]


def list_plans(plane: Plane, *, project: str | None = None) -> list[Document]:
    plane.projections.catch_up()
    if project is None:
        return plane.projections.documents("plans")
    return plane.projections.documents("plans", lambda t: t.c.project == project)
