"""Which keys and signatures the plane trusts — the rules the plane decides by and
``evidence audit`` checks against, so both read them from here:

- people's keys (``KeyRing``): a key counts only when the plane key endorsed it (and an
  operator signed an approver's registration); a revocation only when an operator
  signed it;
- policy (``needs_operator``, ``KeyRing.policy_problem``): registrations, attachments,
  skills, key changes, agent credentials and gate-weakening plan settings carry an
  operator's signature;
- a human decision (``decision_problem``), an apply token (``token_signed``), a review's
  report (``review_problem``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ledger.events import (
    ApproverKeyAdded,
    ApproverKeyRevoked,
    AttachmentCreated,
    AttachmentDetached,
    CredentialIssued,
    CredentialRevoked,
    DecisionRecorded,
    EventPayload,
    GlobalConfig,
    PlanCreated,
    PolicySignature,
    ReviewReportCommitted,
    SkillDefined,
    TokenMinted,
    ToolRegistered,
)
from ledger.keys import public_key_from_b64

from .signing import (
    SigningError,
    approver_record,
    decision_record,
    policy_record,
    review_record,
    verify_record,
)

__all__ = [
    "POLICY_TYPES",
    "ApproverKey",
    "KeyRing",
    "decision_problem",
    "endorsed",
    "needs_operator",
    "review_problem",
    "token_signed",
    "weakens_a_gate",
]


@dataclass
class ApproverKey:
    name: str
    public_key: str
    status: str
    role: str = "approver"


# Policy: what an operator signs, and the plane decides from only when it verifies.
POLICY_TYPES = (
    ToolRegistered,  # and ValidationRegistered, its subclass
    SkillDefined,
    AttachmentCreated,
    AttachmentDetached,
    ApproverKeyAdded,
    ApproverKeyRevoked,
    PlanCreated,
    CredentialIssued,  # who may act for a plan through the service
    CredentialRevoked,
)


def weakens_a_gate(config: GlobalConfig) -> bool:
    """A plan setting that weakens a gate is policy: no required validation needed, or
    work run without the kernel's confinement."""
    return not config.require_validation or getattr(config, "confinement", "landlock") == "none"


def needs_operator(p: EventPayload) -> bool:
    """Whether ``p`` is policy an operator must sign. An operator key's own registration
    is the plane key's alone (its endorsement); a plan's creation only when its config
    weakens a gate."""
    if isinstance(p, PlanCreated):
        return weakens_a_gate(p.global_config)
    if isinstance(p, ApproverKeyAdded):
        return p.role != "operator"
    return isinstance(p, POLICY_TYPES)


class KeyRing:
    """People's keys as the plane trusts them, folded in log order: a key counts only
    when the plane key endorsed it (and, for an approver's, an operator signed its
    registration); a revocation only when an operator signed it. ``take`` folds one
    approver-stream event (returning why it does not count, or None); ``policy_problem``
    says why a policy event's signature does not hold against the keys so far."""

    def __init__(self, plane_public_key: Ed25519PublicKey | None) -> None:
        self.plane = plane_public_key
        self.keys: dict[str, ApproverKey] = {}

    def take(self, p: EventPayload) -> str | None:
        if isinstance(p, ApproverKeyAdded):
            if self.plane is None or not endorsed(p, self.plane):
                return (
                    f"{p.role} key {p.fingerprint[:16]}… of {p.name!r} is endorsed by the plane key"
                )
            problem = self.policy_problem(p)
            if problem is not None:
                return problem
            self.keys[p.fingerprint] = ApproverKey(p.name, p.public_key, "active", p.role)
        elif isinstance(p, ApproverKeyRevoked):
            problem = self.policy_problem(p)
            if problem is not None:
                return problem
            key = self.keys.get(p.fingerprint)
            if key is not None and key.name == p.name:
                key.status = "revoked"
        return None

    def policy_problem(self, p: EventPayload) -> str | None:
        if not needs_operator(p):
            return None
        signed = getattr(p, "signed", msgspec.UNSET)
        what = p.type_name()
        if not isinstance(signed, PolicySignature):
            return f"{what} is policy: it carries an operator's signature"
        key = self.keys.get(signed.fingerprint)
        if key is None or key.role != "operator" or key.name != signed.operator:
            return f"{what} is signed with an endorsed key of operator {signed.operator!r}"
        if key.status != "active":
            return f"{what} is signed with an operator key active at its position"
        try:
            ok = verify_record(
                public_key_from_b64(key.public_key),
                policy_record(p),
                signed.signature,
                domain="policy",
            )
        except (SigningError, ValueError):
            ok = False
        return None if ok else f"{what}'s operator signature verifies"


def endorsed(p: ApproverKeyAdded, plane_public_key: Ed25519PublicKey) -> bool:
    """Whether the plane key signed this key's registration (domain ``approver`` or
    ``operator``, by its role)."""
    try:
        return verify_record(
            plane_public_key,
            approver_record(p.name, p.public_key, p.fingerprint),
            p.endorsement,
            domain="operator" if p.role == "operator" else "approver",
        )
    except (SigningError, ValueError):
        return False


def token_signed(p: TokenMinted, plane_public_key: Ed25519PublicKey) -> bool:
    """Whether the plane key signed this token's claims (the token's own signature)."""
    claims = {
        "token_id": p.token_id,
        "plan_id": p.plan_id,
        "attempt": p.attempt,
        "results_digest": p.results_digest,
        "issued_at": p.issued_at,
        "expires_at": p.expires_at,
    }
    if p.trees_sha256 is not None:
        claims["trees_sha256"] = p.trees_sha256
    try:
        return verify_record(plane_public_key, claims, p.signature, domain="token")
    except (SigningError, ValueError):
        return False


def review_problem(
    events: Sequence[EventPayload], plane_public_key: Ed25519PublicKey
) -> str | None:
    """Why a review's report is not one the plane vouches for (None when it is): its
    ``review.report_committed`` must carry the plane key's signature over the task, the
    report's digest and the chain of every earlier payload of the review's stream (a
    review appended past the plane — no reviewer, no evaluator — has none)."""
    for i, p in enumerate(events):
        if isinstance(p, ReviewReportCommitted):
            if p.plane_signature is None:
                return "its report commit carries no plane signature"
            record = review_record(p.task_id, p.report_sha256, list(events[:i]))
            try:
                ok = verify_record(plane_public_key, record, p.plane_signature, domain="review")
            except (SigningError, ValueError):
                ok = False
            return None if ok else "the plane's signature over the review does not verify"
    return "it has no committed report"


def decision_problem(
    p: DecisionRecorded, escalation_leaf: bytes | None, key: ApproverKey | None
) -> str | None:
    """Why a recorded decision is not a human's (None when its signature holds): the key
    must be the named approver's, active at the decision's position, and sign the record
    binding decision, plan, the escalation's leaf hash, choice, guidance and reason."""
    if escalation_leaf is None:
        return f"decision {p.decision_id} follows its escalation"
    if p.escalation_hash != escalation_leaf.hex():
        return f"decision {p.decision_id} is signed over its escalation's leaf hash"
    if key is None or key.name != p.approver or key.role != "approver":
        return f"decision {p.decision_id} is signed with a registered key of {p.approver!r}"
    if key.status != "active":
        return f"decision {p.decision_id} is signed with a key active at its position"
    try:
        record = decision_record(
            p.decision_id, p.plan_id, p.choice, p.guidance, p.escalation_hash, p.signed_at, p.reason
        )
        ok = verify_record(
            public_key_from_b64(key.public_key), record, p.signature, domain="decision"
        )
    except (SigningError, ValueError):
        ok = False
    if not ok:
        return f"decision {p.decision_id}'s signature verifies"
    return None
