"""The failure loop, signed human decisions, tokens and Apply (seeds 000 and 001).

State always comes from the plan's document (the plans read model), never from memory:

- a ``blocker`` fails the attempt; the agent records a fix (``record_fix``) and
  re-validates. When ``retry_limit`` failed validations accumulate within one strategy,
  the same append reverts the plan to Strategize (a strategy revision) while
  ``max_strategy_revisions`` allow, and otherwise **escalates**: a pending decision with a
  ULID, its options, and a halt ``escalate``;
- ``authorize`` records a human decision signed (Ed25519) with a registered, unrevoked
  approver key the agent process does not hold: ``revise`` sends the plan back to
  Strategize with guidance and fresh budgets, ``abandon`` ends it. Only a pending
  escalation can be decided: there is no decision that passes a blocker (INV3);
- a ``pass`` mints a token signed with the plane's own key (INV1), bound to plan,
  attempt and results digest; ``apply`` verifies it and consumes it with the Apply in
  one append at the expected stream version, so two applies cannot both succeed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ulid import ULID

from ledger.events import (
    ApproverKeyAdded,
    ApproverKeyRevoked,
    DecisionRecorded,
    Escalated,
    EventPayload,
    FixRecorded,
    PlanApplied,
    PlanHalted,
    StrategyRevisionRequested,
    TokenConsumed,
    TokenMinted,
)
from ledger.signing import (
    SigningError,
    decision_record,
    fingerprint,
    load_or_create_plane_key,
    load_private_key,
    load_public_key,
    mint_token,
    public_key_b64,
    public_key_from_b64,
    sign_record,
    token_digest,
    verify_record,
    verify_token,
)
from ledger.timestamps import rfc3339
from projections.documents import Document

from .names import check_identifier
from .phases import require_plan
from .plane import CommandRefused, Plane, StreamState

TOKEN_TTL = timedelta(hours=1)
DECISION_OPTIONS = ["revise", "abandon"]


def _now() -> datetime:
    return datetime.now(UTC)


# -- the failure loop ---------------------------------------------------------------------


def after_blocker(plan: Document, reason: str) -> list[EventPayload]:
    """What a failed attempt leads to, once it is counted: nothing more, a strategy
    revision, or an escalation (appended with the failure itself)."""
    config = plan["global_config"]
    failed = plan["retries_used"] + 1  # this failure included
    if failed < config["retry_limit"]:
        return []
    if plan["revisions_used"] < config["max_strategy_revisions"]:
        return [StrategyRevisionRequested(
            plan_id=plan["plan_id"], revision=plan["revision"] + 1, failed_attempts=failed,
            reason=f"retry limit {config['retry_limit']} reached: {reason}")]
    decision_id = str(ULID())
    why = (f"retry limit {config['retry_limit']} reached and strategy revisions "
           f"({config['max_strategy_revisions']}) exhausted: {reason}")
    return [
        Escalated(plan_id=plan["plan_id"], decision_id=decision_id, options=DECISION_OPTIONS,
                  reason=why, revision=plan["revision"], attempt=plan["attempt"]),
        PlanHalted(plan_id=plan["plan_id"], halt_type="escalate", final_decision="escalate",
                   raw_halt_type="escalated", reason=why,
                   hint=f"human: evidence authorize {decision_id} --key FILE "
                        "(--revise TEXT | --abandon)",
                   phase="execute", attempt=plan["attempt"]),
    ]


def require_no_pending_decision(doc: Document, plan_id: str) -> None:
    pending = doc["pending_decision"]
    if pending is not None:
        raise CommandRefused(f"plan {plan_id} awaits a human decision: evidence authorize "
                             f"{pending['decision_id']} --key FILE (--revise TEXT | --abandon)")


def record_fix(plane: Plane, plan_id: str, note: str, *, diff: bytes | None = None,
               actor: str = "agent") -> Document:
    """The agent's fix before it re-validates (the diff, if any, goes to the blob store)."""
    if not note.strip():
        raise CommandRefused("--note is empty")

    def decide(state: StreamState) -> list[FixRecorded]:
        doc = require_plan(state, plan_id)
        require_no_pending_decision(doc, plan_id)
        if doc["phase"] != "execute":
            raise CommandRefused(f"plan {plan_id} is in {doc['phase'].capitalize()}: fixes "
                                 "are recorded in Execute")
        return [FixRecorded(plan_id=plan_id, attempt=doc["attempt"], note=note,
                            diff_sha256=hashlib.sha256(diff).hexdigest() if diff else None)]

    plane.run(f"plan:{plan_id}", decide, actor=actor, blobs=[diff] if diff else [])
    return plane.projections.document("plans", plan_id)[0]  # type: ignore[index]


# -- tokens (INV1) ------------------------------------------------------------------------


def token_for_pass(plane: Plane, plan: Document, run_id: str,
                   results_digest: str) -> tuple[str, TokenMinted]:
    """Mint a token for a passing run: the string for the agent, the event for the log."""
    key = load_or_create_plane_key(plane.store.url)
    issued = _now()
    claims: dict[str, Any] = {
        "token_id": str(ULID()), "plan_id": plan["plan_id"], "attempt": plan["attempt"],
        "results_digest": results_digest, "issued_at": rfc3339(issued),
        "expires_at": rfc3339(issued + TOKEN_TTL)}
    token = mint_token(key, **claims)
    return token, TokenMinted(token_sha256=token_digest(token), run_id=run_id, **claims)


def apply_plan(plane: Plane, plan_id: str, token: str, *, actor: str = "agent",
               changed_paths: list[str] | None = None) -> Document:
    """Apply with a valid token: signature, plan, expiry, single use; consumed atomically."""
    public = load_or_create_plane_key(plane.store.url).public_key()
    try:
        claims = verify_token(public, token, plan_id=plan_id, now=_now())
    except SigningError as exc:
        raise CommandRefused(f"token refused: {exc}") from None

    def decide(state: StreamState) -> list[EventPayload]:
        doc = require_plan(state, plan_id)
        held = doc["token"]
        if held is None or held["token_id"] != claims.token_id:
            raise CommandRefused("token refused: it is not the token this plan's last "
                                 "passing run minted")
        if held["status"] == "consumed":
            raise CommandRefused("token refused: it was already used (tokens are single-use)")
        if held["status"] != "minted":
            raise CommandRefused("token refused: the plan moved on since it was minted (a "
                                 "new run, fix or tool call); re-validate")
        if doc["phase"] != "execute" or doc["last_outcome"] != "pass":
            raise CommandRefused(f"plan {plan_id} is not at a passing end of Execute")
        return [TokenConsumed(plan_id=plan_id, token_id=claims.token_id),
                PlanApplied(plan_id=plan_id, token_id=claims.token_id,
                            changed_paths=changed_paths or [])]

    plane.run(f"plan:{plan_id}", decide, actor=actor, caused_by_first=True)
    return plane.projections.document("plans", plan_id)[0]  # type: ignore[index]


# -- approver keys ------------------------------------------------------------------------


def add_approver_key(plane: Plane, name: str, public_key_file: Path, *,
                     actor: str = "operator") -> Document:
    check_identifier(name, "approver name")
    try:
        public = load_public_key(public_key_file)
    except SigningError as exc:
        raise CommandRefused(str(exc)) from None
    print_ = fingerprint(public)
    for approver in plane.projections.documents("approvers"):
        if print_ in approver.get("keys", {}):
            raise CommandRefused(f"key {print_[:16]}… is already registered for "
                                 f"{approver['name']!r}")

    def decide(_state: StreamState) -> list[ApproverKeyAdded]:
        return [ApproverKeyAdded(name=name, public_key=public_key_b64(public),
                                 fingerprint=print_)]

    plane.run(f"approver:{name}", decide, actor=actor)
    return plane.state(f"approver:{name}").doc


def revoke_approver(plane: Plane, name: str, *, reason: str = "",
                    actor: str = "operator") -> Document:
    def decide(state: StreamState) -> list[ApproverKeyRevoked]:
        active = [fp for fp, key in state.doc.get("keys", {}).items()
                  if key["status"] == "active"]
        if not active:
            raise CommandRefused(f"approver {name!r} has no active key")
        return [ApproverKeyRevoked(name=name, fingerprint=fp, reason=reason) for fp in active]

    plane.run(f"approver:{name}", decide, actor=actor)
    return plane.state(f"approver:{name}").doc


# -- human decisions ----------------------------------------------------------------------


@dataclass
class Pending:
    plan_id: str
    decision_id: str
    options: list[str]
    reason: str


def pending_decisions(plane: Plane) -> list[Pending]:
    plane.projections.catch_up()
    return [Pending(d["plan_id"], d["pending_decision"]["decision_id"],
                    d["pending_decision"]["options"], d["pending_decision"]["reason"])
            for d in plane.projections.documents("plans") if d.get("pending_decision")]


def authorize(plane: Plane, decision_id: str, key_file: Path, *, choice: str,
              guidance: str | None = None, reason: str | None = None,
              actor: str = "human") -> DecisionRecorded:
    """Sign and record a decision on a pending escalation — and on nothing else."""
    if choice not in DECISION_OPTIONS:
        raise CommandRefused(f"a decision is one of {', '.join(DECISION_OPTIONS)}")
    if choice == "revise" and not (guidance or "").strip():
        raise CommandRefused("--revise needs the guidance text")
    try:
        private = load_private_key(key_file)
    except SigningError as exc:
        raise CommandRefused(str(exc)) from None
    print_ = fingerprint(private.public_key())
    pending = next((p for p in pending_decisions(plane) if p.decision_id == decision_id), None)
    if pending is None:
        raise CommandRefused(
            f"no pending escalation {decision_id!r}: only a pending escalation can be "
            "decided (a blocker is never overridable; a decided escalation stays decided)")
    approver = _approver_of(plane, print_)
    escalation = next(e for e in plane.store.read_stream(f"plan:{pending.plan_id}")
                      if isinstance(e.payload, Escalated)
                      and e.payload.decision_id == decision_id)
    signed_at = rfc3339(_now())
    record = decision_record(decision_id, pending.plan_id, choice,
                             guidance if choice == "revise" else None,
                             escalation.chain_hash.hex(), signed_at)
    signature = sign_record(private, record, domain="decision")
    decided = DecisionRecorded(
        plan_id=pending.plan_id, decision_id=decision_id, choice=choice,  # type: ignore[arg-type]
        guidance=record["guidance"], reason=reason, escalation_hash=record["escalation_hash"],
        signed_at=signed_at, approver=approver["name"], key_fingerprint=print_,
        signature=signature)

    def decide(state: StreamState) -> list[DecisionRecorded]:
        doc = require_plan(state, pending.plan_id)
        if (doc["pending_decision"] or {}).get("decision_id") != decision_id:
            raise CommandRefused(f"escalation {decision_id} is no longer pending")
        # The plane checks the signature against the registered key, as an auditor would.
        key = _approver_of(plane, print_)["key"]
        if not verify_record(public_key_from_b64(key["public_key"]), record, signature,
                             domain="decision"):
            raise CommandRefused("the decision's signature does not verify")
        return [decided]

    plane.run(f"plan:{pending.plan_id}", decide, actor=f"{actor}:{approver['name']}")
    return decided


def _approver_of(plane: Plane, print_: str) -> dict[str, Any]:
    plane.projections.catch_up()
    for approver in plane.projections.documents("approvers"):
        key = approver.get("keys", {}).get(print_)
        if key is not None:
            if key["status"] != "active":
                raise CommandRefused(f"the key of approver {approver['name']!r} was revoked")
            return {"name": approver["name"], "key": key}
    raise CommandRefused("this key belongs to no registered approver (evidence keys add "
                         "NAME PUBKEY_FILE)")
