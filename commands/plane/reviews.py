"""Advisory reviews under the advisory review contract (docs/reviews.md), kept in the ledger.

- ``start_review``: the request is normalised (every string trimmed, optional lists
  ``[]``) and checked against the contract's closed request schema and the cross-field
  verification rule. Every violation is reported with its pointer and nothing is
  appended; a valid request is recorded (``review.started``) and its task id returned
  only after the commit (durable preflight).
- ``submit_candidate``: a reviewer's report against the closed candidate schema. Labels
  A, B, C … follow submission order; the host numbers findings ``A-F001`` …. A report
  that fails the schema is recorded as that reviewer's limitation, never dropped.
- ``account_review``: the evaluator's accounting of every source finding, exactly once.
  A violating accounting is recorded as a failed attempt; one repair is allowed, a
  second failure fails the review. An accepted accounting is rendered into the report
  (``render_report``: deterministic, label- and id-free) and committed with its SHA-256,
  the report bytes in the blob store, in the same transaction.
- ``review_result``: the committed report, its hash verified, handed out once (the
  hand-out is recorded: when, to whom; every later call is refused saying so).

A hosted review (``commands.plane.review_host``: ``evidence review run``) goes through
the same steps, taken by the review host with the programs' answers
(``record_candidate``, ``record_accounting``); hand submissions to it are refused.

A review linked to a plan adds one informational ``validation.result_recorded`` to the
plan when it ends: evidence on the plan, never a gate (see docs/reviews.md).
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec
from ulid import ULID

from commands.names import check_identifier
from commands.rules.signing import load_or_create_plane_key, review_record, sign_record
from commands.rules.trust import review_problem
from commands.schemas.checker import check
from ledger import ConcurrencyError, EventPayload, LedgerError, NewEvent, StreamAppend
from ledger.canonical import canonical_json
from ledger.events import (
    Finding,
    ReviewAccounted,
    ReviewAccountingRejected,
    ReviewCandidateSubmitted,
    ReviewFailed,
    ReviewHandedOut,
    ReviewHostScheduled,
    ReviewHostStarted,
    ReviewReportCommitted,
    ReviewRoleRan,
    ReviewStarted,
    ValidationResultRecorded,
)
from ledger.events.gates import Deviation
from ledger.timestamps import utc_now
from projections import delta, fold
from projections.documents import State, to_json
from projections.plan_rules import broken_rule
from projections.states import HandOutState, HostState, ReviewState

from .core import RETRIES, CommandRefused, Plane, StreamState

__all__ = [
    "ACCOUNTING_SCHEMA",
    "ACCOUNTING_VERSION",
    "CANDIDATE_SCHEMA",
    "CANDIDATE_VERSION",
    "CANDIDATE_VERSION_ALIASES",
    "MERGER_SCHEMA",
    "MERGER_VERSION",
    "REPORT_FORMAT",
    "REQUEST_SCHEMA",
    "AccountingOutcome",
    "AlreadyHandedOut",
    "MergerAnswer",
    "ReportVerificationError",
    "ReviewRequestInvalid",
    "RoleFailure",
    "Submission",
    "Violation",
    "account_review",
    "accounting_answer",
    "fail_review",
    "get_review",
    "list_reviews",
    "normalize_request",
    "parse_answer",
    "record_accounting",
    "record_candidate",
    "render_report",
    "review_result",
    "source_findings",
    "start_review",
    "submit_candidate",
]

CANDIDATE_VERSION = "fusion-validation-candidate.v1"
# The advisory-review contract's own id for the same schema: accepted as an alias.
CANDIDATE_VERSION_ALIASES = ("pi-background-tasks.fusion-validation-candidate.v1",)
ACCOUNTING_VERSION = "fusion-validation-accounting.v1"
MERGER_VERSION = "fusion-validation-merger.v1"
REPORT_FORMAT = "fusion-validation-report.v1"
VALIDATION_NAME = "fusion_validate"  # the name a plan's informational result carries
MAX_ACCOUNTING_ATTEMPTS = 2  # the first attempt and one repair

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
_FINDING_FIELDS = ["severity", "location", "evidence", "impact", "summary"]

CANDIDATE_SCHEMA: dict[str, Any] = {
    "additionalProperties": False,
    "properties": {
        "schema_version": {"const": CANDIDATE_VERSION},
        "findings": {
            "items": {
                "additionalProperties": False,
                "properties": _FINDING_PROPERTIES,
                "required": _FINDING_FIELDS,
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
_CANDIDATE_ACCEPTED: dict[str, Any] = {
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
                        "required": ["id", *_FINDING_FIELDS],
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


class ReportVerificationError(LedgerError):
    """The stored report does not hash to the committed SHA-256 (or is gone): a verdict."""

    def __init__(
        self, task_id: str, expected: str, actual: str | None, forged: str | None = None
    ) -> None:
        self.task_id, self.expected, self.actual = task_id, expected, actual
        found = f"the stored bytes hash to {actual}" if actual else "the report blob is missing"
        if forged is not None:
            found = f"the plane does not vouch for it ({forged})"
        super().__init__(
            f"review {task_id}: report fails verification: committed sha256 {expected}, {found}"
        )


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


def _schema_violations(schema: dict[str, Any], instance: Any) -> list[Violation]:
    return [_from_deviation(d) for d in check(schema, instance)]


def _decode(data: bytes | str | Mapping[str, Any] | Any) -> tuple[Any, list[Violation]]:
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


def _trimmed(value: Any) -> Any:
    """Every string value trimmed, at any depth (keys are structure: untouched)."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list):
        return [_trimmed(v) for v in value]
    if isinstance(value, dict):
        return {k: _trimmed(v) for k, v in value.items()}
    return value


# -- the request -------------------------------------------------------------------------


def normalize_request(data: bytes | str | Mapping[str, Any]) -> dict[str, Any]:
    """The normalised request, or ``ReviewRequestInvalid`` listing every violation.

    Strings are trimmed before the schema check, so whitespace-only text fails
    ``minLength``; ``knownLimitations``/``exclusions`` default to ``[]``; ``verification``
    becomes ``{status, evidence[, reason]}`` with ``evidence`` always a list.
    """
    value, violations = _decode(data)
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
    value = _trimmed(value)
    violations += _schema_violations(REQUEST_SCHEMA, value)
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


def start_review(
    plane: Plane,
    request: bytes | str | Mapping[str, Any],
    *,
    plan_id: str | None = None,
    actor: str = "system",
) -> str:
    """Record a valid request; the returned task id is the receipt (already committed)."""
    normalised = normalize_request(request)
    if plan_id is not None:
        plane.projections.catch_up()
        if plane.projections.document("plans", plan_id) is None:
            raise CommandRefused(f"unknown plan {plan_id!r}")
    task_id = str(ULID())
    started = ReviewStarted(
        task_id=task_id,
        plan_id=plan_id,
        request=normalised,
        request_sha256=hashlib.sha256(canonical_json(normalised)).hexdigest(),
    )

    def decide(state: StreamState) -> list[EventPayload]:
        if state.exists:  # a fresh ULID: cannot happen, but never overwrite a review
            raise CommandRefused(f"review {task_id} already exists")
        return [started]

    plane.run(f"review:{task_id}", decide, actor=actor)
    return task_id


# -- candidates ----------------------------------------------------------------------------


def label_for(index: int) -> str:
    """0 -> A, 25 -> Z, 26 -> AA … (bijective base 26)."""
    label = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        label = chr(ord("A") + rest) + label
    return label


@dataclass
class Submission:
    task_id: str
    label: str
    valid: bool
    finding_ids: list[str]
    errors: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "label": self.label,
            "valid": self.valid,
            "findings": self.finding_ids,
            "errors": self.errors,
        }


def _require_review(state: StreamState, task_id: str) -> ReviewState:
    doc = state.of(ReviewState)
    if doc is None:
        raise CommandRefused(f"unknown review {task_id!r}")
    return doc


def _not_hosted(doc: ReviewState, what: str) -> None:
    """A hosted review takes its reports only from the reviewer programs it runs."""
    if isinstance(doc.host, HostState):
        raise CommandRefused(
            f"review {doc.task_id} is run by the review host (evidence review run): "
            f"its {what} come from the configured reviewers, never by hand"
        )


def submit_candidate(
    plane: Plane,
    task_id: str,
    report: bytes | str | Mapping[str, Any],
    *,
    reviewer: str,
    actor: str | None = None,
) -> Submission:
    """Record a candidate report under the next label; an invalid one as a limitation."""
    return record_candidate(plane, task_id, report, reviewer=reviewer, actor=actor, hosted=False)


def record_candidate(
    plane: Plane,
    task_id: str,
    report: bytes | str | Mapping[str, Any] | None,
    *,
    reviewer: str,
    actor: str | None,
    hosted: bool,
    failure: RoleFailure | None = None,
) -> Submission:
    """``submit_candidate``, and the review host's way in (``hosted``: only for a hosted
    review). ``failure``: the reviewer gave no usable report (it timed out, crashed,
    wrote to its read-only view …); recorded as that reviewer's limitation, its detail
    in ``errors`` only (the report's limitation names no program and quotes none)."""
    reviewer = reviewer.strip()
    if not reviewer:
        raise CommandRefused("--reviewer must not be empty")
    value: Any = None
    if failure is None:
        value, problems = _decode(report)
        value = _trimmed(value)
        violations = problems + (
            [] if problems and value is None else _schema_violations(_CANDIDATE_ACCEPTED, value)
        )
        errors = [str(v) for v in sorted(set(violations), key=lambda v: (v.pointer, v.message))]
        limitation = (
            f"a candidate report failed the {CANDIDATE_VERSION} schema "
            f"({len(errors)} violation(s)): {'; '.join(errors)}"
        )
    else:
        errors = [failure.detail]
        limitation = f"a candidate reviewer returned no usable report: {failure.summary}"
    made: dict[str, Submission] = {}

    def decide(state: StreamState) -> list[EventPayload]:
        doc = _require_review(state, task_id)
        if hosted != isinstance(doc.host, HostState):
            _not_hosted(doc, "candidate reports")
            raise CommandRefused(f"review {task_id} is not run by the review host")
        if doc.status != "started":
            raise CommandRefused(
                f"review {task_id} is {doc.status}: candidate reports "
                "are accepted only before accounting"
            )
        if any(c.reviewer == reviewer for c in doc.candidates.values()):
            raise CommandRefused(f"reviewer {reviewer!r} already submitted to review {task_id}")
        label = label_for(len(doc.candidates))
        if errors:
            # Not dropped: the reviewer's failure is itself evidence about the review.
            event = ReviewCandidateSubmitted(
                task_id=task_id,
                label=label,
                reviewer=reviewer,
                valid=False,
                errors=errors,
                limitations=[limitation],
            )
        else:
            findings = [
                Finding(id=f"{label}-F{i:03d}", **{k: f[k] for k in _FINDING_FIELDS})
                for i, f in enumerate(value["findings"], start=1)
            ]
            event = ReviewCandidateSubmitted(
                task_id=task_id,
                label=label,
                reviewer=reviewer,
                valid=True,
                findings=findings,
                verified=value["verified"],
                limitations=value["limitations"],
            )
        made["submission"] = Submission(
            task_id, label, not errors, [f.id for f in event.findings], errors
        )
        return [event]

    plane.run(f"review:{task_id}", decide, actor=actor or reviewer)
    return made["submission"]


def source_findings(doc: ReviewState) -> list[dict[str, Any]]:
    """Every host-numbered finding of every candidate, in label then number order: what
    the evaluator copies into ``validation_accounting.source_findings``."""
    return [
        dict(f)
        for label in sorted(doc.candidates, key=lambda x: (len(x), x))
        for f in to_json(doc.candidates[label])["findings"]
    ]


# -- accounting ----------------------------------------------------------------------------


def accounting_answer(
    data: bytes | str | Mapping[str, Any], doc: ReviewState
) -> tuple[Any, list[Violation]]:
    """An evaluator's answer decoded, and every rule it breaks for the review ``doc``
    (what ``account_review`` would record as a rejected attempt; empty: it would commit)."""
    value, problems = _decode(data)
    return value, problems if value is None else problems + _accounting_rules(value, doc)


def _accounting_rules(value: Any, doc: ReviewState) -> list[Violation]:
    return accounting_violations(value, source_findings(doc))


def parse_answer(data: bytes | str, schema: dict[str, Any]) -> tuple[Any, list[Violation]]:
    """A reviewer program's JSON answer, strings trimmed, against a closed ``schema``:
    the value and every violation (the value is None when it is no JSON document)."""
    value, problems = _decode(data)
    if value is None:
        return None, problems
    value = _trimmed(value)
    return value, problems + _schema_violations(schema, value)


def accounting_violations(accounting: Any, sources: Sequence[Mapping[str, Any]]) -> list[Violation]:
    """Every rule the accounting breaks (empty when it is valid)."""
    schema = _schema_violations(ACCOUNTING_SCHEMA, accounting)
    if schema:
        return schema  # the rules below need the shape
    body = accounting["validation_accounting"]
    base = "/validation_accounting"
    found: list[Violation] = []
    by_id = {s["id"]: s for s in sources}

    # 1. The source findings, copied exactly, each once.
    copied: dict[str, int] = {}
    for i, copy in enumerate(body["source_findings"]):
        where = f"{base}/source_findings/{i}"
        source = by_id.get(copy["id"])
        if source is None:
            found.append(Violation(f"{where}/id", f"{copy['id']} is not a source finding"))
            continue
        if copy["id"] in copied:
            found.append(
                Violation(
                    f"{where}/id",
                    f"{copy['id']} is copied twice (also at "
                    f"{base}/source_findings/{copied[copy['id']]})",
                )
            )
            continue
        copied[copy["id"]] = i
        for name in _FINDING_FIELDS:
            if copy[name] != source[name]:
                found.append(
                    Violation(f"{where}/{name}", f"differs from source finding {copy['id']}")
                )
    for source_id in by_id:
        if source_id not in copied:
            found.append(
                Violation(f"{base}/source_findings", f"source finding {source_id} is missing")
            )

    # 2. Every source finding decided exactly once; include needs a group, exclude not.
    decided: dict[str, int] = {}
    group_ids = [g["id"] for g in body["groups"]]
    included_in: dict[str, set[str]] = {}
    for i, decision in enumerate(body["decisions"]):
        where = f"{base}/decisions/{i}"
        finding = decision["finding"]
        if finding not in by_id:
            found.append(Violation(f"{where}/finding", f"{finding} is not a source finding"))
        elif finding in decided:
            found.append(
                Violation(
                    f"{where}/finding",
                    f"{finding} is decided twice (also at {base}/decisions/{decided[finding]})",
                )
            )
            continue
        decided.setdefault(finding, i)
        group = decision.get("group")
        if decision["decision"] == "include":
            if group is None:
                found.append(Violation(where, f"include of {finding} needs a group"))
            elif group not in group_ids:
                found.append(Violation(f"{where}/group", f"no group {group!r}"))
            else:
                included_in.setdefault(group, set()).add(finding)
        elif group is not None:
            found.append(Violation(f"{where}/group", f"exclude of {finding} forbids a group"))
    for source_id in by_id:
        if source_id not in decided:
            found.append(
                Violation(f"{base}/decisions", f"no decision for source finding {source_id}")
            )

    # 3. Each group's members are exactly the findings included into it.
    seen_groups: dict[str, int] = {}
    member_of: dict[str, str] = {}
    for i, group in enumerate(body["groups"]):
        where = f"{base}/groups/{i}"
        if group["id"] in seen_groups:
            found.append(Violation(f"{where}/id", f"group {group['id']!r} is defined twice"))
            continue
        seen_groups[group["id"]] = i
        members = group["members"]
        expected = included_in.get(group["id"], set())
        for j, member in enumerate(members):
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
        for finding in sorted(expected - set(members)):
            found.append(
                Violation(
                    f"{where}/members",
                    f"{finding} is included into group {group['id']!r} but is not a member",
                )
            )
    return sorted(set(found), key=lambda v: (v.pointer, v.message))


@dataclass
class AccountingOutcome:
    task_id: str
    accepted: bool
    attempt: int
    status: str
    violations: list[Violation] = field(default_factory=list)
    report_sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "accepted": self.accepted,
            "attempt": self.attempt,
            "status": self.status,
            "report_sha256": self.report_sha256,
            "violations": [v.to_json() for v in self.violations],
        }


def account_review(
    plane: Plane,
    task_id: str,
    accounting: bytes | str | Mapping[str, Any],
    *,
    actor: str = "evaluator",
) -> AccountingOutcome:
    """Check the evaluator's accounting; commit the report or record the failed attempt."""
    return record_accounting(plane, task_id, accounting, actor=actor, hosted=False)


def record_accounting(
    plane: Plane,
    task_id: str,
    accounting: bytes | str | Mapping[str, Any] | None,
    *,
    actor: str,
    hosted: bool,
    failure: RoleFailure | None = None,
    merger: MergerAnswer | None = None,
) -> AccountingOutcome:
    """``account_review``, and the review host's way in (``hosted``): ``failure`` is an
    evaluator that gave no answer (a failed attempt), ``merger`` what the merger said
    (its summary goes into the report)."""
    if failure is None:
        value, problems = _decode(accounting)
    else:
        value, problems = None, [Violation("", failure.detail)]
    stream = f"review:{task_id}"
    conflict: ConcurrencyError | None = None
    for _ in range(RETRIES):
        plane.projections.catch_up()
        state = plane.state(stream)
        doc = _require_review(state, task_id)
        if hosted != isinstance(doc.host, HostState):
            _not_hosted(doc, "accountings")
            raise CommandRefused(f"review {task_id} is not run by the review host")
        if doc.status not in ("started", "repair"):
            raise CommandRefused(f"review {task_id} is {doc.status}: no accounting is accepted now")
        if not doc.candidates:
            raise CommandRefused(f"review {task_id} has no candidate report to account for")
        attempt = doc.accounting_attempts + 1
        violations = problems if value is None else problems + _accounting_rules(value, doc)
        try:
            if violations:
                return _reject(plane, state, attempt, violations, actor)
            return _commit(plane, state, value, attempt, actor, merger)
        except ConcurrencyError as exc:
            conflict = exc  # another writer moved a stream: decide again on the fresh state
    # The stream kept moving: the last conflict reaches the caller (one error line, try
    # again).
    assert conflict is not None  # RETRIES > 0
    raise conflict


def _reject(
    plane: Plane, state: StreamState, attempt: int, violations: list[Violation], actor: str
) -> AccountingOutcome:
    task_id = state.existing(ReviewState).task_id
    events: list[EventPayload] = [
        ReviewAccountingRejected(
            task_id=task_id, attempt=attempt, violations=[str(v) for v in violations]
        )
    ]
    status = "repair"
    plan_event: list[EventPayload] = []
    if attempt >= MAX_ACCOUNTING_ATTEMPTS:
        reason = f"the accounting repair attempt failed too ({len(violations)} violation(s))"
        events.append(ReviewFailed(task_id=task_id, reason=reason))
        status = "failed"
        plan_event = _plan_result(plane, state, error=reason)
    _append(plane, [(state, events), *_plan_appends(plane, state, plan_event)], [], actor)
    return AccountingOutcome(task_id, False, attempt, status, violations)


def _commit(
    plane: Plane,
    state: StreamState,
    accounting: dict[str, Any],
    attempt: int,
    actor: str,
    merger: MergerAnswer | None,
) -> AccountingOutcome:
    doc = state.existing(ReviewState)
    task_id = doc.task_id
    report = render_report(doc.request, to_json(doc)["candidates"], accounting, merger=merger)
    digest = hashlib.sha256(report).hexdigest()
    counts = msgspec.json.decode(report)
    accounted = ReviewAccounted(task_id=task_id, attempt=attempt, accounting=accounting)
    earlier = [e.payload for e in plane.store.read_stream(state.stream)][: state.version]
    committed = ReviewReportCommitted(
        task_id=task_id,
        report_sha256=digest,
        report_size=len(report),
        findings=len(counts["findings"]),
        exclusions=len(counts["exclusions"]),
        # The plane vouches for the review it ran: the report and every event before it.
        plane_signature=sign_record(
            load_or_create_plane_key(plane.store.url),
            review_record(task_id, digest, [*earlier, accounted]),
            domain="review",
        ),
    )
    events: list[EventPayload] = [accounted, committed]
    plan_event = _plan_result(plane, state, committed=committed)
    _append(plane, [(state, events), *_plan_appends(plane, state, plan_event)], [report], actor)
    return AccountingOutcome(task_id, True, attempt, "completed", [], digest)


# -- the report ------------------------------------------------------------------------------

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
    return {k: finding[k] for k in _FINDING_FIELDS}


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
    merged = []
    for group in body["groups"]:
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
    exclusions: list[dict[str, Any]] = sorted(
        (
            {"finding": _content(sources[d["finding"]]), "rationale": rationale_of[d["finding"]]}
            for d in body["decisions"]
            if d["decision"] == "exclude"
        ),
        key=lambda e: (_SEVERITY_RANK[e["finding"]["severity"]], canonical_json(e)),
    )
    valid = [c for c in candidates.values() if c["valid"]]
    limitations = {s for c in candidates.values() for s in c["limitations"]}
    if merger is not None and merger.problem is not None:
        limitations.add(f"the merger gave no summary: {merger.problem}")
    report: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "advisory": True,  # never a gate: a review informs, it does not decide
        "request": dict(request),
        "candidates": {"submitted": len(candidates), "valid": len(valid)},
        "findings": merged,
        "exclusions": exclusions,
        "verified": sorted({s for c in valid for s in c["verified"]}),
        "limitations": sorted(limitations),
    }
    if merger is not None:
        report["summary"] = None if merger.summary is None else scrub(merger.summary, labels)
    return canonical_json(report)


# -- the plan link -------------------------------------------------------------------------


def _plan_result(
    plane: Plane,
    state: StreamState,
    *,
    committed: ReviewReportCommitted | None = None,
    error: str | None = None,
) -> list[EventPayload]:
    """The informational result a linked plan gets: no verdict (advisory), its own
    run_id (the task id, never a validation run's), so no outcome counts it."""
    doc = state.existing(ReviewState)
    if doc.plan_id is None:
        return []
    task_id = doc.task_id
    started_at = plane.store.read_stream(state.stream)[0].recorded_at
    ended_at = utc_now()
    duration = datetime.fromisoformat(ended_at[:-1]) - datetime.fromisoformat(started_at[:-1])
    data: dict[str, Any] = {
        "review_task_id": task_id,
        "advisory": True,
        "status": "completed" if committed else "failed",
    }
    if committed is not None:
        data.update(
            report_sha256=committed.report_sha256,
            findings=committed.findings,
            exclusions=committed.exclusions,
        )
        message = (
            f"advisory review {task_id}: {committed.findings} finding(s), "
            f"{committed.exclusions} exclusion(s)"
        )
    else:
        message = f"advisory review {task_id} failed"
    return [
        ValidationResultRecorded(
            plan_id=doc.plan_id,
            run_id=task_id,
            attachment_id=task_id,
            validation=VALIDATION_NAME,
            mode="informational",
            verdict=None,
            message=message,
            data=data,
            error=error,
            raw_output_sha256=committed.report_sha256 if committed else None,
            started_at=started_at,
            ended_at=ended_at,
            duration_ms=max(0, round(duration.total_seconds() * 1000)),
        )
    ]


def _plan_appends(
    plane: Plane, state: StreamState, events: list[EventPayload]
) -> list[tuple[StreamState, list[EventPayload]]]:
    if not events:
        return []
    return [(plane.state(f"plan:{state.existing(ReviewState).plan_id}"), events)]


def _append(
    plane: Plane,
    appends: Sequence[tuple[StreamState, Sequence[EventPayload]]],
    blobs: list[bytes],
    actor: str,
) -> None:
    """``Plane.append`` over several streams in ONE transaction (the review's end and the
    plan's result are committed together or not at all)."""
    batch = []
    for state, payloads in appends:
        doc, events = state.doc, []
        for payload in payloads:
            rule = broken_rule(state.stream, doc, payload)
            if rule is not None:
                raise CommandRefused(f"refused: {rule}")
            after = fold(state.stream, doc, payload)
            events.append(NewEvent(payload=payload, actor=actor, delta=delta(doc, after)))
            doc = after
        batch.append(StreamAppend(state.stream, events, state.version))
    with plane.store.write() as tx:
        recorded = tx.append_batch(batch, blobs=blobs)
        plane.projections.apply_inline(tx, recorded)


# -- the end of a review --------------------------------------------------------------------

TERMINAL_STATUSES = ("completed", "failed")


def fail_review(plane: Plane, task_id: str, reason: str, *, actor: str) -> ReviewState:
    """End a review that cannot finish (a hosted review's host gave up or died), with
    its linked plan's informational result in the same transaction. A review that has
    already ended is left as it is. Returns the review as it now stands."""
    stream = f"review:{task_id}"
    conflict: ConcurrencyError | None = None
    for _ in range(RETRIES):
        plane.projections.catch_up()
        state = plane.state(stream)
        doc = _require_review(state, task_id)
        if doc.status in TERMINAL_STATUSES:
            return doc
        plan_event = _plan_result(plane, state, error=reason)
        events: list[EventPayload] = [ReviewFailed(task_id=task_id, reason=reason)]
        try:
            _append(plane, [(state, events), *_plan_appends(plane, state, plan_event)], [], actor)
        except ConcurrencyError as exc:
            conflict = exc
            continue
        return get_review(plane, task_id)
    assert conflict is not None  # RETRIES > 0
    raise conflict


# -- reading -------------------------------------------------------------------------------

REVIEW_EVENTS = (
    ReviewStarted,
    ReviewCandidateSubmitted,
    ReviewAccountingRejected,
    ReviewAccounted,
    ReviewReportCommitted,
    ReviewFailed,
    ReviewHostScheduled,
    ReviewHostStarted,
    ReviewRoleRan,
    ReviewHandedOut,
)


def get_review(plane: Plane, task_id: str) -> ReviewState:
    return _require_review(plane.state(f"review:{task_id}"), task_id)


def list_reviews(
    plane: Plane, *, plan_id: str | None = None, status: str | None = None
) -> list[ReviewState]:
    """Every review, oldest first (folded from the log: reviews have no read model)."""
    names = [cls.type_name() for cls in REVIEW_EVENTS]
    docs: dict[str, State | None] = {}
    for event in plane.store.read_all(types=names):
        docs[event.stream] = fold(event.stream, docs.get(event.stream), event.payload)
    return [
        d
        for d in docs.values()
        if isinstance(d, ReviewState)
        and (plan_id is None or d.plan_id == plan_id)
        and (status is None or d.status == status)
    ]


class AlreadyHandedOut(CommandRefused):
    """The report was handed out before: it is handed out once (exit 2)."""

    def __init__(self, task_id: str, handed_out: HandOutState) -> None:
        self.task_id, self.at, self.to = task_id, handed_out.at, handed_out.to
        super().__init__(
            f"review {task_id}: the report was already handed out, at {handed_out.at} to "
            f"{handed_out.to}; a report is handed out once"
        )


@dataclass
class ReviewResult:
    task_id: str
    report_sha256: str
    report_bytes: bytes
    handed_out_at: str
    recipient: str

    @property
    def report(self) -> dict[str, Any]:
        return msgspec.json.decode(self.report_bytes)

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "report_sha256": self.report_sha256,
            "verified": True,
            "handed_out": {"at": self.handed_out_at, "to": self.recipient},
            "report": self.report,
        }


def default_recipient() -> str:
    """Who receives a report when the caller does not say: the login name of this
    process (``uid:N`` where the system has no name for it)."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return f"uid:{os.getuid()}"


def review_result(plane: Plane, task_id: str, *, recipient: str | None = None) -> ReviewResult:
    """The committed report, whole, after checking its bytes against the committed hash,
    handed out once: ``review.handed_out`` (to ``recipient``, now) is committed before the
    report is returned. Raises ``ReportVerificationError`` (a verdict; nothing recorded,
    nothing handed out) when the bytes differ or are gone, and ``AlreadyHandedOut`` (a
    refusal naming when and to whom) on every call after the first."""
    recipient = check_identifier(recipient or default_recipient(), "recipient")
    doc = get_review(plane, task_id)
    if isinstance(doc.handed_out, HandOutState):
        raise AlreadyHandedOut(task_id, doc.handed_out)
    if doc.status != "completed":
        detail = f": {doc.failure}" if doc.failure else ""
        raise CommandRefused(f"review {task_id} has no report (status {doc.status}{detail})")
    assert doc.report is not None  # a completed review has its committed report
    expected = doc.report.sha256
    data = plane.store.get_blob(expected)
    if data is None:
        raise ReportVerificationError(task_id, expected, None)
    data = bytes(data)
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise ReportVerificationError(task_id, expected, actual)
    forged = review_problem(
        [e.payload for e in plane.store.read_stream(f"review:{task_id}")], plane.plane_public_key()
    )
    if forged is not None:
        raise ReportVerificationError(task_id, expected, actual, forged)
    at = utc_now()

    def decide(state: StreamState) -> list[EventPayload]:
        # Decided under the ledger lock: of two concurrent callers, one gets the report.
        now = _require_review(state, task_id)
        if isinstance(now.handed_out, HandOutState):
            raise AlreadyHandedOut(task_id, now.handed_out)
        return [
            ReviewHandedOut(task_id=task_id, report_sha256=expected, recipient=recipient, at=at)
        ]

    plane.run(f"review:{task_id}", decide, actor=recipient)
    return ReviewResult(task_id, expected, data, at, recipient)
