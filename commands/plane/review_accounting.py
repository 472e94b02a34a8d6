"""The accounting rules of an advisory review (docs/reviews.md, "The accounting"): the
evaluator's ``validation_accounting`` must copy every source finding exactly, decide
each exactly once (include into a group, or exclude), and define each group with exactly
the findings included into it.

Pure: an accounting and the review's source findings in, every ``Violation`` out (sorted
by pointer, then message). What is recorded is ``commands.plane.reviews``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from projections.documents import to_json
from projections.states import ReviewState

from .review_contract import ACCOUNTING_SCHEMA, FINDING_FIELDS, Violation, decode, schema_violations

__all__ = ["accounting_answer", "accounting_rules", "accounting_violations", "source_findings"]

_BASE = "/validation_accounting"


def source_findings(doc: ReviewState) -> list[dict[str, Any]]:
    """Every host-numbered finding of every candidate, in label then number order: what
    the evaluator copies into ``validation_accounting.source_findings``."""
    return [
        dict(f)
        for label in sorted(doc.candidates, key=lambda x: (len(x), x))
        for f in to_json(doc.candidates[label])["findings"]
    ]


def accounting_answer(
    data: bytes | str | Mapping[str, Any], doc: ReviewState
) -> tuple[Any, list[Violation]]:
    """An evaluator's answer decoded, and every rule it breaks for the review ``doc``
    (what ``account_review`` would record as a rejected attempt; empty: it would commit)."""
    value, problems = decode(data)
    return value, problems if value is None else problems + accounting_rules(value, doc)


def accounting_rules(value: Any, doc: ReviewState) -> list[Violation]:
    """Every rule the decoded accounting ``value`` breaks for the review ``doc``."""
    return accounting_violations(value, source_findings(doc))


def accounting_violations(accounting: Any, sources: Sequence[Mapping[str, Any]]) -> list[Violation]:
    """Every rule the accounting breaks (empty when it is valid)."""
    schema = schema_violations(ACCOUNTING_SCHEMA, accounting)
    if schema:
        return schema  # the rules below need the shape
    body = accounting["validation_accounting"]
    by_id = {s["id"]: s for s in sources}
    found = _copy_violations(body["source_findings"], by_id)
    decided, included_in = _decision_violations(body, by_id)
    found += decided
    found += _group_violations(body["groups"], included_in)
    return sorted(set(found), key=lambda v: (v.pointer, v.message))


# 1. The source findings, copied exactly, each once.


def _copy_violations(
    copies: Sequence[Mapping[str, Any]], by_id: Mapping[str, Mapping[str, Any]]
) -> list[Violation]:
    found: list[Violation] = []
    copied: dict[str, int] = {}
    for i, copy in enumerate(copies):
        where = f"{_BASE}/source_findings/{i}"
        source = by_id.get(copy["id"])
        if source is None:
            found.append(Violation(f"{where}/id", f"{copy['id']} is not a source finding"))
            continue
        if copy["id"] in copied:
            found.append(
                Violation(
                    f"{where}/id",
                    f"{copy['id']} is copied twice (also at "
                    f"{_BASE}/source_findings/{copied[copy['id']]})",
                )
            )
            continue
        copied[copy["id"]] = i
        found += _field_differences(where, copy, source)
    found += _unaccounted(by_id, copied, f"{_BASE}/source_findings", "source finding {} is missing")
    return found


def _field_differences(
    where: str, copy: Mapping[str, Any], source: Mapping[str, Any]
) -> list[Violation]:
    return [
        Violation(f"{where}/{name}", f"differs from source finding {copy['id']}")
        for name in FINDING_FIELDS
        if copy[name] != source[name]
    ]


def _unaccounted(
    by_id: Mapping[str, Any], seen: Mapping[str, int], pointer: str, message: str
) -> list[Violation]:
    """One violation at ``pointer`` for each source finding not ``seen``."""
    return [Violation(pointer, message.format(s)) for s in by_id if s not in seen]


# 2. Every source finding decided exactly once; include needs a group, exclude not.


def _decision_violations(
    body: Mapping[str, Any], by_id: Mapping[str, Mapping[str, Any]]
) -> tuple[list[Violation], dict[str, set[str]]]:
    """The decisions' violations, and the findings each group has included into it."""
    found: list[Violation] = []
    decided: dict[str, int] = {}
    group_ids = [g["id"] for g in body["groups"]]
    included_in: dict[str, set[str]] = {}
    for i, decision in enumerate(body["decisions"]):
        where = f"{_BASE}/decisions/{i}"
        finding = decision["finding"]
        if finding in by_id and finding in decided:
            found.append(
                Violation(
                    f"{where}/finding",
                    f"{finding} is decided twice (also at {_BASE}/decisions/{decided[finding]})",
                )
            )
            continue
        if finding not in by_id:
            found.append(Violation(f"{where}/finding", f"{finding} is not a source finding"))
        decided.setdefault(finding, i)
        found += _group_choice(where, decision, group_ids, included_in)
    found += _unaccounted(by_id, decided, f"{_BASE}/decisions", "no decision for source finding {}")
    return found, included_in


def _group_choice(
    where: str,
    decision: Mapping[str, Any],
    group_ids: Sequence[str],
    included_in: dict[str, set[str]],
) -> list[Violation]:
    """An include names a defined group (the finding is then recorded as included into
    it); an exclude names none."""
    finding = decision["finding"]
    group = decision.get("group")
    if decision["decision"] != "include":
        if group is None:
            return []
        return [Violation(f"{where}/group", f"exclude of {finding} forbids a group")]
    if group is None:
        return [Violation(where, f"include of {finding} needs a group")]
    if group not in group_ids:
        return [Violation(f"{where}/group", f"no group {group!r}")]
    included_in.setdefault(group, set()).add(finding)
    return []


# 3. Each group's members are exactly the findings included into it.


def _group_violations(
    groups: Sequence[Mapping[str, Any]], included_in: Mapping[str, set[str]]
) -> list[Violation]:
    found: list[Violation] = []
    seen_groups: dict[str, int] = {}
    member_of: dict[str, str] = {}
    for i, group in enumerate(groups):
        where = f"{_BASE}/groups/{i}"
        if group["id"] in seen_groups:
            found.append(Violation(f"{where}/id", f"group {group['id']!r} is defined twice"))
            continue
        seen_groups[group["id"]] = i
        expected = included_in.get(group["id"], set())
        found += _member_violations(where, group, expected, member_of)
        found += [
            Violation(
                f"{where}/members",
                f"{finding} is included into group {group['id']!r} but is not a member",
            )
            for finding in sorted(expected - set(group["members"]))
        ]
    return found


def _member_violations(
    where: str, group: Mapping[str, Any], expected: set[str], member_of: dict[str, str]
) -> list[Violation]:
    """Each member in one group only, and included into it by a decision."""
    found: list[Violation] = []
    for j, member in enumerate(group["members"]):
        if member in member_of:
            found.append(
                Violation(
                    f"{where}/members/{j}",
                    f"{member} is already a member of group {member_of[member]!r}",
                )
            )
            continue
        member_of[member] = group["id"]
        if member not in expected:
            found.append(
                Violation(
                    f"{where}/members/{j}",
                    f"{member} is not included into group {group['id']!r} by a decision",
                )
            )
    return found
