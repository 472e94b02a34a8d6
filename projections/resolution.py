"""Attachment resolution: which validations gate work on a resource.

The union of the direct attachments on the resource, the project-scoped ones whose
project matches and the plan-scoped ones whose plan matches. Attachments of the same
validation with identical canonical arguments collapse to the most specific scope
(plan > project > direct); different arguments all apply. Detached attachments are
gone. A pure function of the attachment and tool documents, so resolution as of any
position is the same function over documents folded to that position.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ledger.events import ResolvedAttachment

from .states import AttachmentState, PlanState, ToolSpec, ToolState, given

SCOPE_RANK = {"direct": 0, "project": 1, "plan": 2}  # higher is more specific


def resolve(
    attachments: Iterable[AttachmentState],
    tools: Mapping[str, ToolState],
    *,
    resource: str,
    project: str | None = None,
    plan: str | None = None,
) -> list[ResolvedAttachment]:
    winners: dict[tuple[str, str], AttachmentState] = {}
    for a in attachments:
        if a.status != "attached" or a.resource != resource:
            continue
        scope = a.scope
        if scope == "project" and (project is None or a.project != project):
            continue
        if scope == "plan" and (plan is None or a.plan != plan):
            continue
        same = (a.validation, a.args_sha256)
        held = winners.get(same)
        if held is None or _more_specific(a, held):
            winners[same] = a
    resolved = []
    for a in winners.values():
        tool = tools.get(a.validation)
        spec = tool.spec if tool is not None else ToolSpec()
        resolved.append(
            ResolvedAttachment(
                attachment_id=a.attachment_id,
                scope=a.scope,
                validation=a.validation,
                validation_version=tool.version if tool is not None else a.validation_version,
                mode=given(spec.mode, "required"),
                resource=a.resource,
                args=a.args,
                args_sha256=a.args_sha256,
                wraps=given(spec.wraps),
                wraps_version=given(spec.wraps_version),
                transform=given(spec.transform),
            )
        )
    resolved.sort(key=_order)
    return resolved


def resolve_plan(
    attachments: Iterable[AttachmentState], tools: Mapping[str, ToolState], plan: PlanState
) -> list[ResolvedAttachment]:
    """Every attachment that applies to a plan now: each of its resources, its project,
    itself (an attachment counts once however many of its resources it names)."""
    listed = list(attachments)
    seen: dict[str, ResolvedAttachment] = {}
    for resource in plan.resources:
        for row in resolve(
            listed, tools, resource=resource, project=plan.project, plan=plan.plan_id
        ):
            seen.setdefault(row.attachment_id, row)
    return sorted(seen.values(), key=_order)


def pin_binding(
    pinned: Iterable[ResolvedAttachment], applicable: Iterable[ResolvedAttachment]
) -> list[ResolvedAttachment]:
    """A plan's binding set on entering Execute: every member it already pinned, as it
    was pinned, plus each applicable attachment it did not hold yet. Nothing leaves,
    nothing is weakened: a detach or a re-registration binds later plans only."""
    kept = {r.attachment_id: r for r in pinned}
    for row in applicable:
        kept.setdefault(row.attachment_id, row)
    return sorted(kept.values(), key=_order)


def _order(r: ResolvedAttachment) -> tuple[str, int, str]:
    return (r.validation, -SCOPE_RANK[r.scope], r.attachment_id)


def _more_specific(a: AttachmentState, held: AttachmentState) -> bool:
    """The most specific scope wins; within one scope the earliest attachment (ULIDs sort
    by creation time) stands for its identical twins."""
    rank_a, rank_held = SCOPE_RANK[a.scope], SCOPE_RANK[held.scope]
    return rank_a > rank_held or (rank_a == rank_held and a.attachment_id < held.attachment_id)
