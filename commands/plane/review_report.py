"""An advisory review's report (docs/reviews.md, "The report"): rendered from the
request, the candidate reports and a valid accounting into RFC 8785 bytes that depend
on nothing about who submitted, or in which order (no labels, no source ids; findings
ordered by content).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ledger.canonical import canonical_json

from .review_contract import FINDING_FIELDS, REPORT_FORMAT

__all__ = ["MergerAnswer", "render_report", "scrub"]

_SEVERITY_RANK = {"critical": 0, "high": 1, "minor": 2}
_SOURCE_ID = re.compile(r"\b[A-Z]{1,3}-F\d{3,}\b")
_REVIEWER_WORD = r"(?:[Rr]eviewer|[Cc]andidate|[Rr]eport|[Ll]abel)(?P<plural>s?)"


def scrub(text: str, labels: Sequence[str]) -> str:
    """Rationale text without source ids (``A-F001`` -> ``[finding]``) or reviewer labels
    (``reviewer A``/``candidates A and B`` -> ``a reviewer``/``reviewers``): the report
    must not depend on who submitted first."""
    text = _SOURCE_ID.sub("[finding]", text)
    if labels:
        label = "(?:" + "|".join(sorted(map(re.escape, labels), key=len, reverse=True)) + ")"
        refs = re.compile(
            rf"\b{_REVIEWER_WORD}\s+{label}(?P<more>(?:\s*(?:,|and|&|/|or)\s*"
            rf"{label})*)\b"
        )

        def replace(match: re.Match[str]) -> str:
            return "reviewers" if match["plural"] or match["more"] else "a reviewer"

        text = refs.sub(replace, text)
    return text


def _content(finding: Mapping[str, Any]) -> dict[str, Any]:
    return {k: finding[k] for k in FINDING_FIELDS}


def _content_key(finding: Mapping[str, Any]) -> tuple[int, bytes]:
    return _SEVERITY_RANK[finding["severity"]], canonical_json(_content(finding))


@dataclass(frozen=True)
class MergerAnswer:
    """What a hosted review's merger said: its ``summary``, or why there is none."""

    summary: str | None
    problem: str | None = None


def render_report(
    request: Mapping[str, Any],
    candidates: Mapping[str, Mapping[str, Any]],
    accounting: Mapping[str, Any],
    *,
    merger: MergerAnswer | None = None,
) -> bytes:
    """The report's RFC 8785 bytes, from the request, the candidates and a VALID accounting.

    Nothing in it depends on submission order: findings appear without ids or labels,
    ordered by content (severity, then canonical JSON), groups merged in that order,
    rationale text scrubbed, verified statements and limitations sorted and deduplicated.

    With ``merger`` (a hosted review with a merger configured) the report also has
    ``summary``: the merger's text, scrubbed like a rationale, or null when it gave none
    (why is then one of the limitations). The findings never depend on it.
    """
    labels = list(candidates)
    sources = {f["id"]: f for c in candidates.values() for f in c["findings"]}
    body = accounting["validation_accounting"]
    rationale_of = {d["finding"]: scrub(d["rationale"], labels) for d in body["decisions"]}
    valid = [c for c in candidates.values() if c["valid"]]
    report: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "advisory": True,  # never a gate: a review informs, it does not decide
        "request": dict(request),
        "candidates": {"submitted": len(candidates), "valid": len(valid)},
        "findings": _merged_groups(body["groups"], sources, rationale_of, labels),
        "exclusions": _exclusions(body["decisions"], sources, rationale_of),
        "verified": sorted({s for c in valid for s in c["verified"]}),
        "limitations": _limitations(candidates, merger),
    }
    if merger is not None:
        report["summary"] = None if merger.summary is None else scrub(merger.summary, labels)
    return canonical_json(report)


def _merged_groups(
    groups: Sequence[Mapping[str, Any]],
    sources: Mapping[str, Mapping[str, Any]],
    rationale_of: Mapping[str, str],
    labels: Sequence[str],
) -> list[dict[str, Any]]:
    """Each group as one finding (its most severe member's severity and summary), with
    every member's content and every rationale; ordered by content."""
    merged = []
    for group in groups:
        members = sorted((sources[m] for m in group["members"]), key=_content_key)
        reasons = {rationale_of[m] for m in group["members"]}
        if "rationale" in group:
            reasons.add(scrub(group["rationale"], labels))
        merged.append(
            {
                "severity": members[0]["severity"],  # the most severe member
                "summary": members[0]["summary"],
                "reports": len(members),
                "findings": [_content(m) for m in members],
                "rationale": sorted(reasons),
            }
        )
    merged.sort(key=lambda g: (_SEVERITY_RANK[g["severity"]], canonical_json(g)))
    return merged


def _exclusions(
    decisions: Sequence[Mapping[str, Any]],
    sources: Mapping[str, Mapping[str, Any]],
    rationale_of: Mapping[str, str],
) -> list[dict[str, Any]]:
    """Each excluded finding's content with its rationale; ordered by content."""
    return sorted(
        (
            {"finding": _content(sources[d["finding"]]), "rationale": rationale_of[d["finding"]]}
            for d in decisions
            if d["decision"] == "exclude"
        ),
        key=lambda e: (_SEVERITY_RANK[e["finding"]["severity"]], canonical_json(e)),
    )


def _limitations(
    candidates: Mapping[str, Mapping[str, Any]], merger: MergerAnswer | None
) -> list[str]:
    """Every candidate's limitations, and the merger's missing summary; sorted, once each."""
    limitations = {s for c in candidates.values() for s in c["limitations"]}
    if merger is not None and merger.problem is not None:
        limitations.add(f"the merger gave no summary: {merger.problem}")
    return sorted(limitations)
