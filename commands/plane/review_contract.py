"""The advisory review contract (docs/reviews.md): its schema versions and closed
schemas (the request, a candidate report, an accounting, a merger's answer), the
violations a document breaks, and the request's normalisation.

Every rule here is pure: documents in, ``Violation`` lists (RFC 6901 pointers) out.
What is recorded, and when, is ``commands.plane.reviews``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from commands.schemas.checker import check
from ledger.events.gates import Deviation

from .core import CommandRefused

__all__ = [
    "ACCOUNTING_SCHEMA",
    "ACCOUNTING_VERSION",
    "CANDIDATE_ACCEPTED",
    "CANDIDATE_SCHEMA",
    "CANDIDATE_VERSION",
    "CANDIDATE_VERSION_ALIASES",
    "FINDING_FIELDS",
    "MERGER_SCHEMA",
    "MERGER_VERSION",
    "NEW_SHAPE_EXAMPLE",
    "REPORT_FORMAT",
    "REQUEST_SCHEMA",
    "ReviewRequestInvalid",
    "RoleFailure",
    "Violation",
    "decode",
    "normalize_request",
    "parse_answer",
    "schema_violations",
    "trimmed",
]

CANDIDATE_VERSION = "fusion-validation-candidate.v1"
# The advisory-review contract's own id for the same schema: accepted as an alias.
CANDIDATE_VERSION_ALIASES = ("pi-background-tasks.fusion-validation-candidate.v1",)
ACCOUNTING_VERSION = "fusion-validation-accounting.v1"
MERGER_VERSION = "fusion-validation-merger.v1"
REPORT_FORMAT = "fusion-validation-report.v1"

_TRIMMED = "Non-empty string. Runtime normalization trims and rejects whitespace-only text."
_LIST_TRIMMED = "Array of non-empty strings. Runtime normalization trims every item."


def _text(description: str = _TRIMMED) -> dict[str, Any]:
    return {"description": description, "minLength": 1, "type": "string"}


def _texts(description: str | None = None, *, min_items: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"items": _text(), "type": "array"}
    if description:
        schema["description"] = description
    if min_items is not None:
        schema["minItems"] = min_items
    return schema


# The contract's request schema, exactly (docs/reviews.md, "The request").
REQUEST_SCHEMA: dict[str, Any] = {
    "additionalProperties": False,
    "properties": {
        "acceptanceCriteria": _texts(min_items=1),
        "background": _texts(_LIST_TRIMMED),
        "changeSummary": _text(),
        "exclusions": _texts(_LIST_TRIMMED),
        "knownLimitations": _texts(_LIST_TRIMMED),
        "objective": _text(),
        "scope": _texts(min_items=1),
        "verification": {
            "additionalProperties": False,
            "properties": {
                "evidence": {
                    "items": {
                        "additionalProperties": False,
                        "properties": {"check": _text(), "outcome": _text()},
                        "required": ["check", "outcome"],
                        "type": "object",
                    },
                    "type": "array",
                },
                "reason": _text(),
                "status": {
                    "description": "Google-compatible enum. Use 'provided' only with evidence; "
                    "use 'not_run' only with reason and no evidence.",
                    "enum": ["provided", "not_run"],
                    "type": "string",
                },
            },
            "required": ["status"],
            "type": "object",
        },
    },
    "required": [
        "acceptanceCriteria",
        "background",
        "changeSummary",
        "objective",
        "scope",
        "verification",
    ],
    "type": "object",
}

_FINDING_PROPERTIES: dict[str, Any] = {
    "severity": {"enum": ["critical", "high", "minor"], "type": "string"},
    "location": _text(),
    "evidence": _text(),
    "impact": _text(),
    "summary": _text(),
}
FINDING_FIELDS = ["severity", "location", "evidence", "impact", "summary"]

CANDIDATE_SCHEMA: dict[str, Any] = {
    "additionalProperties": False,
    "properties": {
        "schema_version": {"const": CANDIDATE_VERSION},
        "findings": {
            "items": {
                "additionalProperties": False,
                "properties": _FINDING_PROPERTIES,
                "required": FINDING_FIELDS,
                "type": "object",
            },
            "type": "array",
        },
        "verified": _texts(),
        "limitations": _texts(),
    },
    "required": ["schema_version", "findings", "verified", "limitations"],
    "type": "object",
}
# What a submitted candidate report is checked against: CANDIDATE_SCHEMA (the one handed
# to reviewer programs, which asks for CANDIDATE_VERSION), its id or an alias accepted.
CANDIDATE_ACCEPTED: dict[str, Any] = {
    **CANDIDATE_SCHEMA,
    "properties": {
        **CANDIDATE_SCHEMA["properties"],
        "schema_version": {"enum": [CANDIDATE_VERSION, *CANDIDATE_VERSION_ALIASES]},
    },
}

_ID = {"minLength": 1, "type": "string"}
ACCOUNTING_SCHEMA: dict[str, Any] = {
    "additionalProperties": False,
    "properties": {
        "schema_version": {"const": ACCOUNTING_VERSION},
        "validation_accounting": {
            "additionalProperties": False,
            "properties": {
                "source_findings": {
                    "items": {
                        "additionalProperties": False,
                        "properties": {"id": _ID, **_FINDING_PROPERTIES},
                        "required": ["id", *FINDING_FIELDS],
                        "type": "object",
                    },
                    "type": "array",
                },
                "decisions": {
                    "items": {
                        "additionalProperties": False,
                        "properties": {
                            "finding": _ID,
                            "decision": {"enum": ["include", "exclude"], "type": "string"},
                            "group": _ID,
                            "rationale": {"minLength": 1, "type": "string"},
                        },
                        "required": ["finding", "decision", "rationale"],
                        "type": "object",
                    },
                    "type": "array",
                },
                "groups": {
                    "items": {
                        "additionalProperties": False,
                        "properties": {
                            "id": _ID,
                            "members": {"items": _ID, "minItems": 1, "type": "array"},
                            "rationale": {"minLength": 1, "type": "string"},
                        },
                        "required": ["id", "members"],
                        "type": "object",
                    },
                    "type": "array",
                },
            },
            "required": ["source_findings", "decisions", "groups"],
            "type": "object",
        },
    },
    "required": ["schema_version", "validation_accounting"],
    "type": "object",
}

# A hosted review's merger (no tools) answers with a summary of the accounted findings.
MERGER_SCHEMA: dict[str, Any] = {
    "additionalProperties": False,
    "properties": {"schema_version": {"const": MERGER_VERSION}, "summary": _text()},
    "required": ["schema_version", "summary"],
    "type": "object",
}

# What a legacy ``{prompt}`` caller should send instead (shown in the migration error).
NEW_SHAPE_EXAMPLE = (
    '{"objective": "...", "background": ["..."], "changeSummary": "...", '
    '"scope": ["..."], "acceptanceCriteria": ["..."], '
    '"verification": {"status": "provided", "evidence": [{"check": "...", "outcome": "..."}]}'
    ' | {"status": "not_run", "reason": "..."}, '
    '"knownLimitations": ["..."], "exclusions": ["..."]}'
)


# -- violations ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    """One broken rule, at an RFC 6901 pointer into the document that broke it."""

    pointer: str
    message: str

    def __str__(self) -> str:
        return f"{self.pointer or '/'}: {self.message}"

    def to_json(self) -> dict[str, str]:
        return {"pointer": self.pointer, "message": self.message}


@dataclass(frozen=True)
class RoleFailure:
    """Why a reviewer program's answer cannot be used: ``summary`` may reach the report
    (it names no program and quotes nothing it printed), ``detail`` stays in the log."""

    summary: str
    detail: str


class ReviewRequestInvalid(CommandRefused):
    """The request broke the contract: every violation, nothing appended."""

    def __init__(self, violations: Sequence[Violation]) -> None:
        self.violations = list(violations)
        listed = "; ".join(str(v) for v in self.violations)
        super().__init__(f"invalid review request ({len(self.violations)} violation(s)): {listed}")


def _from_deviation(d: Deviation) -> Violation:
    if d.kind == "constraint" and d.expected == "length >= 1" and d.actual_type == "string":
        return Violation(d.pointer, "must not be empty or whitespace-only")
    if d.kind == "missing_required":
        return Violation(d.pointer, f"missing ({d.expected})")
    if d.kind == "extra_field":
        return Violation(d.pointer, "not allowed: the schema is closed")
    if d.kind == "constraint":
        return Violation(d.pointer, f"expected {d.expected}")
    return Violation(d.pointer, f"{d.kind}: expected {d.expected}, got {d.actual_type}")


def schema_violations(schema: dict[str, Any], instance: Any) -> list[Violation]:
    return [_from_deviation(d) for d in check(schema, instance)]


def decode(data: bytes | str | Mapping[str, Any] | Any) -> tuple[Any, list[Violation]]:
    """JSON bytes/text (duplicate member names are violations) or a decoded value."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if not isinstance(data, bytes | bytearray | memoryview):
        return data, []
    raw = bytes(data)
    problems = [_from_deviation(d) for d in check({}, raw)]
    if any(d.message.endswith("got invalid_json") for d in problems):
        return None, [Violation("", "not a JSON document")]
    return json.loads(raw), problems


def trimmed(value: Any) -> Any:
    """Every string value trimmed, at any depth (keys are structure: untouched)."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list):
        return [trimmed(v) for v in value]
    if isinstance(value, dict):
        return {k: trimmed(v) for k, v in value.items()}
    return value


# -- the request -------------------------------------------------------------------------


def normalize_request(data: bytes | str | Mapping[str, Any]) -> dict[str, Any]:
    """The normalised request, or ``ReviewRequestInvalid`` listing every violation.

    Strings are trimmed before the schema check, so whitespace-only text fails
    ``minLength``; ``knownLimitations``/``exclusions`` default to ``[]``; ``verification``
    becomes ``{status, evidence[, reason]}`` with ``evidence`` always a list.
    """
    value, violations = decode(data)
    if isinstance(value, dict) and "prompt" in value:
        # A legacy call: the new contract is not a superset of it, so say how to move.
        raise ReviewRequestInvalid(
            [
                Violation(
                    "/prompt",
                    "legacy {prompt} requests are no longer accepted: split the prompt "
                    f"into the structured request, e.g. {NEW_SHAPE_EXAMPLE}",
                )
            ]
        )
    value = trimmed(value)
    violations += schema_violations(REQUEST_SCHEMA, value)
    violations += _verification_violations(value)
    if violations:
        raise ReviewRequestInvalid(sorted(set(violations), key=lambda v: (v.pointer, v.message)))
    verification = value["verification"]
    normalised_verification: dict[str, Any] = {
        "status": verification["status"],
        "evidence": verification.get("evidence", []),
    }
    if "reason" in verification:
        normalised_verification["reason"] = verification["reason"]
    return {
        "objective": value["objective"],
        "background": value["background"],
        "changeSummary": value["changeSummary"],
        "scope": value["scope"],
        "acceptanceCriteria": value["acceptanceCriteria"],
        "verification": normalised_verification,
        "knownLimitations": value.get("knownLimitations", []),
        "exclusions": value.get("exclusions", []),
    }


def _verification_violations(request: Any) -> list[Violation]:
    """The cross-field rule, checked whenever ``status`` is readable (so it is reported
    together with any schema violation elsewhere)."""
    verification = request.get("verification") if isinstance(request, dict) else None
    if not isinstance(verification, dict):
        return []
    status = verification.get("status")
    evidence = verification.get("evidence")
    has_evidence = isinstance(evidence, list) and len(evidence) > 0
    has_reason = "reason" in verification
    found: list[Violation] = []
    if status == "provided":
        if not has_evidence:
            found.append(
                Violation("/verification/evidence", "status provided needs non-empty evidence")
            )
        if has_reason:
            found.append(Violation("/verification/reason", "status provided forbids reason"))
    elif status == "not_run":
        if not has_reason:
            found.append(Violation("/verification/reason", "status not_run needs a reason"))
        if has_evidence:
            found.append(
                Violation("/verification/evidence", "status not_run forbids non-empty evidence")
            )
    return found


def parse_answer(data: bytes | str, schema: dict[str, Any]) -> tuple[Any, list[Violation]]:
    """A reviewer program's JSON answer, strings trimmed, against a closed ``schema``:
    the value and every violation (the value is None when it is no JSON document)."""
    value, problems = decode(data)
    if value is None:
        return None, problems
    value = trimmed(value)
    return value, problems + schema_violations(schema, value)
