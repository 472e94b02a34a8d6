"""Stream documents: the state of one stream as a plain JSON document, and the pure
fold that advances it by one event.

Every stream kind (``tool:``, ``skill:``, ``attachment:``, ``plan:`` …) has a fold
``(document, payload) -> document``. Command handlers use it to compute each event's
structural delta (the RFC 6902 patch from the document before to the document after),
and the read models store the folded documents. Applying the deltas alone to ``{}``
therefore rebuilds the same document as the fold: that is what an auditor checks.

Folds never mutate their input and never read anything but the document and payload.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jsonpatch
import msgspec

from ledger.events import (
    ApproverKeyAdded,
    ApproverKeyRevoked,
    AttachmentCreated,
    AttachmentDetached,
    AttemptFailed,
    ChangesRecorded,
    CompensationCompleted,
    CompensationRequested,
    DecisionRecorded,
    Escalated,
    EventPayload,
    ExecuteEntered,
    FixRecorded,
    GateChecked,
    PlanApplied,
    PlanCreated,
    PlanHalted,
    SkillDefined,
    StrategyRecorded,
    StrategyRevisionRequested,
    TokenConsumed,
    TokenMinted,
    ToolCalled,
    ToolRegistered,
    ValidationRegistered,
    ValidationRunCompleted,
    ValidationRunStarted,
)

from .reviews import fold_review

Document = dict[str, Any]
Fold = Callable[[Document, EventPayload], Document]

# Fields of a registration that describe the registration, not the tool.
_REGISTRATION_FIELDS = ("type", "name", "version")


def tool_spec(payload: ToolRegistered) -> Document:
    """The tool (or validation) definition carried by a registration event."""
    spec = msgspec.to_builtins(payload)
    for field in _REGISTRATION_FIELDS:
        spec.pop(field, None)
    return spec


def fold_tool(doc: Document, payload: EventPayload) -> Document:
    """``tool:{name}``: the current definition, its version, and every version kept."""
    if not isinstance(payload, ToolRegistered):  # ValidationRegistered is a subclass
        return doc
    spec = tool_spec(payload)
    versions = dict(doc.get("versions", {}))
    versions[str(payload.version)] = spec
    return {
        "name": payload.name,
        "kind": "validation" if isinstance(payload, ValidationRegistered) else "tool",
        "version": payload.version,
        "spec": spec,
        "versions": versions,
    }


def fold_skill(doc: Document, payload: EventPayload) -> Document:
    if not isinstance(payload, SkillDefined):
        return doc
    return {
        "name": payload.name,
        "version": payload.version,
        "description": payload.description,
        "members": list(payload.members),
    }


def fold_attachment(doc: Document, payload: EventPayload) -> Document:
    if isinstance(payload, AttachmentCreated):
        if doc:
            return doc  # created twice: audit reports it; the first stands
        created = msgspec.to_builtins(payload)
        created.pop("type")
        created["status"] = "attached"
        return created
    if isinstance(payload, AttachmentDetached) and doc:
        return {**doc, "status": "detached", "detach_reason": payload.reason}
    return doc


def new_plan(payload: PlanCreated) -> Document:
    return {
        "plan_id": payload.plan_id,
        "project": payload.project,
        "resources": list(payload.resources),
        "global_config": msgspec.to_builtins(payload.global_config),
        "phase": "strategize",
        "revision": 0,
        "attempt": 0,
        "iteration": 0,
        "retries_used": 0,
        "strategy": None,
        "guidance": None,
        "binding": [],
        "steps": {},
        "gate_checks": 0,
        "gate_failures": 0,
        "halt": None,
        "compensation": None,
        "terminal": None,
        "tool_calls": 0,
        "current_run": None,
        "last_run": None,
        "last_outcome": None,
        "outcome": None,
        "unvalidated": False,
        "needs_fix": False,
        "informational_failures": [],
        "fixes": 0,
        "revisions_used": 0,
        "pending_decision": None,
        "decisions": {},
        "token": None,
        "applying": None,
        "applied": None,
    }


def fold_plan(doc: Document, payload: EventPayload) -> Document:
    """``plan:{plan_id}``: phase, strategy, binding set, counters, halt, decisions, token.

    Total: an event the plan's state cannot take (anything before ``plan.created``, a
    second creation, a consumed token that was never minted) leaves the document as it
    is; ``projections.plan_rules`` names the broken rule, and audit reports it."""
    if isinstance(payload, PlanCreated):
        return doc if doc else new_plan(payload)
    if not doc:
        return doc
    if isinstance(payload, StrategyRecorded):
        return {**doc, "strategy": payload.strategy, "revision": payload.revision,
                "guidance": payload.guidance}
    if isinstance(payload, ExecuteEntered):
        # The first Execute starts attempt 1; a failed attempt already moved to the next.
        return {**doc, "phase": "execute", "attempt": max(doc["attempt"], 1), "iteration": 1,
                "retries_used": 0, "needs_fix": False, "token": _superseded(doc["token"]),
                "binding": [msgspec.to_builtins(b) for b in payload.binding]}
    if isinstance(payload, GateChecked):
        changed = {"gate_checks": doc["gate_checks"] + 1,
                   "gate_failures": doc["gate_failures"] + (payload.verdict == "fail")}
        if payload.gate == "input" and payload.verdict == "pass" and payload.step:
            changed["steps"] = {**doc["steps"], payload.step: {
                "tool": payload.tool, "tool_version": payload.tool_version}}
        return {**doc, **changed}
    if isinstance(payload, AttemptFailed):
        if payload.failure_class == "model_behavior":
            return {**doc, "iteration": payload.iteration + 1}
        # A failed validation run: the next attempt starts with a fix, then re-validates.
        return {**doc, "retries_used": doc["retries_used"] + 1,
                "attempt": payload.attempt + 1, "iteration": 1, "needs_fix": True}
    if isinstance(payload, ValidationRunStarted):
        return {**doc, "current_run": payload.run_id, "token": _superseded(doc["token"])}
    if isinstance(payload, FixRecorded):
        return {**doc, "fixes": doc["fixes"] + 1, "needs_fix": False,
                "token": _superseded(doc["token"])}
    if isinstance(payload, StrategyRevisionRequested):
        return {**doc, "phase": "strategize", "revision": payload.revision, "strategy": None,
                "revisions_used": doc["revisions_used"] + 1, "halt": None,
                "token": _superseded(doc["token"])}
    if isinstance(payload, Escalated):
        return {**doc, "pending_decision": {"decision_id": payload.decision_id,
                                            "options": list(payload.options),
                                            "reason": payload.reason},
                "token": _superseded(doc["token"])}
    if isinstance(payload, DecisionRecorded):
        decided = {**doc, "pending_decision": None, "token": _superseded(doc["token"]),
                   "decisions": {**doc["decisions"], payload.decision_id: payload.choice}}
        if payload.choice == "revise":
            return {**decided, "phase": "strategize", "revision": doc["revision"] + 1,
                    "strategy": None, "guidance": payload.guidance, "retries_used": 0,
                    "revisions_used": 0, "halt": None, "needs_fix": False, "outcome": None}
        return {**decided, "terminal": "failed"}
    if isinstance(payload, TokenMinted):
        return {**doc, "token": {"token_id": payload.token_id,
                                 "token_sha256": payload.token_sha256,
                                 "attempt": payload.attempt, "run_id": payload.run_id,
                                 "expires_at": payload.expires_at, "status": "minted"}}
    if isinstance(payload, TokenConsumed):
        token = doc["token"]
        if token is None or token["token_id"] != payload.token_id:
            return doc
        return {**doc, "token": {**token, "status": "consumed"}}
    if isinstance(payload, ChangesRecorded):
        return {**doc, "applying": {
            "token_id": payload.token_id, "changes_sha256": payload.changes_sha256,
            "files": [{"resource": c.resource, "path": c.path, "sha256": c.sha256}
                      for c in payload.changes]}}
    if isinstance(payload, PlanApplied):
        return {**doc, "phase": "apply", "terminal": "applied", "halt": None,
                "applying": None, "applied": doc.get("applying")}
    if isinstance(payload, ValidationRunCompleted):
        return {**doc, "current_run": None, "last_run": payload.run_id,
                "last_outcome": payload.outcome, "outcome": payload.outcome,
                "unvalidated": payload.vacuous,
                "informational_failures": list(payload.informational_failures)}
    if isinstance(payload, ToolCalled):
        return {**doc, "tool_calls": doc["tool_calls"] + 1, "token": _superseded(doc["token"])}
    if isinstance(payload, CompensationRequested):
        return {**doc, "compensation": {"status": "requested", "reason": payload.reason}}
    if isinstance(payload, CompensationCompleted):
        status = "completed" if payload.succeeded else "failed"
        return {**doc, "compensation": {**(doc["compensation"] or {"reason": None}),
                                        "status": status}}
    if isinstance(payload, PlanHalted):
        halt = {"halt_type": payload.halt_type, "raw_halt_type": payload.raw_halt_type,
                "reason": payload.reason, "hint": payload.hint, "terminal": payload.terminal}
        return {**doc, "halt": halt, "outcome": payload.halt_type,
                "token": _superseded(doc["token"]),
                "terminal": "failed" if payload.terminal else doc["terminal"]}
    return doc


def _superseded(token: Document | None) -> Document | None:
    """A minted, unused token stops being valid when the work, its evidence or the plan's
    course moves on: a new run, a fix, a tool call, a halt, an escalation or a decision, a
    strategy revision, a new Execute (INV1: nothing may invalidate what it was minted
    on; seed 001: a token is never handed on across an escalation)."""
    if token is not None and token["status"] == "minted":
        return {**token, "status": "superseded"}
    return token


def fold_approver(doc: Document, payload: EventPayload) -> Document:
    """``approver:{name}``: the approver's public keys by fingerprint, active or revoked."""
    if isinstance(payload, ApproverKeyAdded):
        keys = {**doc.get("keys", {}), payload.fingerprint: {
            "public_key": payload.public_key, "status": "active"}}
        return {"name": payload.name, "keys": keys}
    if isinstance(payload, ApproverKeyRevoked):
        key = doc.get("keys", {}).get(payload.fingerprint)
        if key is None:
            return doc  # revoking a key never added: audit reports it
        return {**doc, "keys": {**doc["keys"], payload.fingerprint: {
            **key, "status": "revoked"}}}
    return doc


FOLDS: dict[str, Fold] = {
    "approver": fold_approver,
    "tool": fold_tool,
    "skill": fold_skill,
    "attachment": fold_attachment,
    "plan": fold_plan,
    "review": fold_review,
}


def stream_kind(stream: str) -> str:
    return stream.partition(":")[0]


def fold(stream: str, doc: Document, payload: EventPayload) -> Document:
    """Advance ``stream``'s document by one event (unknown kinds keep ``{}``)."""
    step = FOLDS.get(stream_kind(stream))
    return step(doc, payload) if step else doc


def fold_all(stream: str, payloads: Iterable[EventPayload]) -> Document:
    doc: Document = {}
    for payload in payloads:
        doc = fold(stream, doc, payload)
    return doc


def apply_deltas(deltas: Iterable[list[Any]]) -> Document:
    """Rebuild a stream document from its events' deltas alone (the auditor's way)."""
    doc: Any = {}
    for delta in deltas:
        doc = jsonpatch.apply_patch(doc, delta, in_place=False)
    return doc


def delta(before: Document, after: Document) -> list[Any]:
    """The RFC 6902 patch from ``before`` to ``after``."""
    return jsonpatch.make_patch(before, after).patch
