"""Attachment resolution (seed 000): which validations gate work on a resource.

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

from .documents import Document

SCOPE_RANK = {"direct": 0, "project": 1, "plan": 2}  # higher is more specific


def resolve(
    attachments: Iterable[Document],
    tools: Mapping[str, Document],
    *,
    resource: str,
    project: str | None = None,
    plan: str | None = None,
) -> list[ResolvedAttachment]:
    winners: dict[tuple[str, str], Document] = {}
    for a in attachments:
        if a.get("status") != "attached" or a["resource"] != resource:
            continue
        scope = a["scope"]
        if scope == "project" and (project is None or a["project"] != project):
            continue
        if scope == "plan" and (plan is None or a["plan"] != plan):
            continue
        same = (a["validation"], a["args_sha256"])
        held = winners.get(same)
        if held is None or _more_specific(a, held):
            winners[same] = a
    resolved = []
    for a in winners.values():
        tool = tools.get(a["validation"], {})
        spec = tool.get("spec", {})
        resolved.append(ResolvedAttachment(
            attachment_id=a["attachment_id"],
            scope=a["scope"],
            validation=a["validation"],
            validation_version=tool.get("version", a["validation_version"]),
            mode=spec.get("mode", "required"),
            resource=a["resource"],
            args=a["args"],
            args_sha256=a.get("args_sha256"),
            wraps=spec.get("wraps"),
            wraps_version=spec.get("wraps_version"),
            transform=spec.get("transform"),
        ))
    resolved.sort(key=_order)
    return resolved


def resolve_plan(attachments: Iterable[Document], tools: Mapping[str, Document],
                 plan: Document) -> list[ResolvedAttachment]:
    """Every attachment that applies to a plan now: each of its resources, its project,
    itself (an attachment counts once however many of its resources it names)."""
    listed = list(attachments)
    seen: dict[str, ResolvedAttachment] = {}
    for resource in plan.get("resources", []):
        for row in resolve(listed, tools, resource=resource, project=plan.get("project"),
                           plan=plan.get("plan_id")):
            seen.setdefault(row.attachment_id, row)
    return sorted(seen.values(), key=_order)


def pin_binding(pinned: Iterable[ResolvedAttachment],
                applicable: Iterable[ResolvedAttachment]) -> list[ResolvedAttachment]:
    """A plan's binding set on entering Execute: every member it already pinned, as it
    was pinned, plus each applicable attachment it did not hold yet. Nothing leaves,
    nothing is weakened: a detach or a re-registration binds later plans only."""
    kept = {r.attachment_id: r for r in pinned}
    for row in applicable:
        kept.setdefault(row.attachment_id, row)
    return sorted(kept.values(), key=_order)


def _order(r: ResolvedAttachment) -> tuple[str, int, str]:
    return (r.validation, -SCOPE_RANK[r.scope], r.attachment_id)


def _more_specific(a: Document, held: Document) -> bool:
    """The most specific scope wins; within one scope the earliest attachment (ULIDs sort
    by creation time) stands for its identical twins."""
    rank_a, rank_held = SCOPE_RANK[a["scope"]], SCOPE_RANK[held["scope"]]
    return rank_a > rank_held or (
        rank_a == rank_held and a["attachment_id"] < held["attachment_id"]
    )
