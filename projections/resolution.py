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
        resolved.append(ResolvedAttachment(
            attachment_id=a["attachment_id"],
            scope=a["scope"],
            validation=a["validation"],
            validation_version=tool.get("version", a["validation_version"]),
            mode=tool.get("spec", {}).get("mode", "required"),
            resource=a["resource"],
            args=a["args"],
        ))
    resolved.sort(key=lambda r: (r.validation, -SCOPE_RANK[r.scope], r.attachment_id))
    return resolved


def _more_specific(a: Document, held: Document) -> bool:
    """The most specific scope wins; within one scope the earliest attachment (ULIDs sort
    by creation time) stands for its identical twins."""
    rank_a, rank_held = SCOPE_RANK[a["scope"]], SCOPE_RANK[held["scope"]]
    return rank_a > rank_held or (
        rank_a == rank_held and a["attachment_id"] < held["attachment_id"]
    )
