"""Which keys and signatures the plane trusts — the rules the plane decides by and
``evidence audit`` checks against, so both read them from here:

- people's keys (``KeyRing``): a key counts only when the plane key endorsed it (and an
  operator signed an approver's registration); a revocation only when an operator
  signed it, and for good;
- where a signature counts (``KeyRing``): a signed event stands where it was signed
  for — this ledger (its ``ledger.identified``), its stream, its version — and a
  signature in the first release's format only before the ledger's identification,
  where it first stood; a copy anywhere else is ``Replayed``;
- policy (``needs_operator``, ``KeyRing.policy_problem``): registrations, attachments,
  skills, key changes, agent credentials and gate-weakening plan settings carry an
  operator's signature;
- a human decision (``decision_problem``), an apply token (``token_signed``), a review's
  report (``review_problem``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ledger.events import (
    ApprovalPolicySet,
    ApproverKeyAdded,
    ApproverKeyRevoked,
    AttachmentCreated,
    AttachmentDetached,
    CredentialIssued,
    CredentialRevoked,
    DecisionRecorded,
    EscalationExpired,
    EventPayload,
    GlobalConfig,
    LedgerIdentified,
    PlanCreated,
    PolicySignature,
    RecordedEvent,
    ReviewReportCommitted,
    SignedPlace,
    SkillDefined,
    TokenMinted,
    ToolRegistered,
    ValidationRegistered,
)
from ledger.keys import public_key_from_b64
from projections.documents import State, fold
from projections.plan_rules import broken_rule

from .approvals import Approvals
from .signing import (
    Domain,
    Place,
    SigningError,
    approver_record,
    decision_record,
    expiry_record,
    identity_record,
    policy_record,
    review_record,
    verify_record,
)

__all__ = [
    "POLICY_TYPES",
    "POLICY_TYPE_NAMES",
    "ApproverKey",
    "BrokenRule",
    "Identity",
    "KeyRing",
    "PolicyFold",
    "Replayed",
    "Unendorsed",
    "decision_problem",
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
# (``POLICY_TYPE_NAMES``, below: every type a ``PolicyFold`` judges.)
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
    ApprovalPolicySet,  # how escalations are decided
)


# Every type a ``PolicyFold`` judges: policy, the ledger's identification (the context
# every signature is judged in), and plans' creations (policy when they weaken a gate; a
# first-release signature counts once in any stream, so every one is seen in order).
POLICY_TYPE_NAMES: tuple[str, ...] = (
    LedgerIdentified.type_name(),
    *(t.type_name() for t in POLICY_TYPES),
    ValidationRegistered.type_name(),
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


class Replayed(str):
    """Why a signed event does not count, when its signature is genuine but made for
    another place (another ledger, stream or version, or used before): a copy.
    ``evidence audit`` reports it as ``replayed_signature``."""

    __slots__ = ()


class Unendorsed(str):
    """Why a key registration does not count: the plane key did not endorse it
    (``evidence audit``: ``approver_endorsement``)."""

    __slots__ = ()


class BrokenRule(str):
    """Why a policy event does not count: its stream's rules (``plan_rules``) refuse it
    (``evidence audit``: ``illegal_transition``)."""

    __slots__ = ()


class Identity(NamedTuple):
    """The ledger's id as the plane key named it, and where (``ledger.identified``)."""

    ledger_id: str
    position: int


class KeyRing:
    """People's keys as the plane trusts them, folded in log order, and the context
    every signature is judged in: the ledger's identity (``identify``) and the
    first-release signatures already seen (each counts once, where it first stands).

    A key counts only when the plane key endorsed it (and, for an approver's, an
    operator signed its registration); a revocation only when an operator signed it,
    and it is final: a revoked key never counts again. ``take`` folds one
    approver-stream event (returning why it does not count, or None);
    ``policy_problem`` says why a policy event's signature does not hold against the
    keys so far. Each event is judged once, in log order."""

    def __init__(
        self, plane_public_key: Ed25519PublicKey | Callable[[], Ed25519PublicKey] | None
    ) -> None:
        # The plane's public key, or how to load it (only once a signature needs it).
        self._plane = plane_public_key
        self.keys: dict[str, ApproverKey] = {}
        self.identity: Identity | None = None
        self.revoked: dict[str, int] = {}  # fingerprint -> position of its revocation
        self._first: dict[str, int] = {}  # first-release signature -> where it first stood
        self._secrets: dict[str, str] = {}  # credential secret digest -> its credential

    def copy(self) -> KeyRing:
        """An independent copy (folding on into it leaves this one as it is)."""
        twin = KeyRing(self._plane)
        twin.keys = {fp: dataclasses.replace(key) for fp, key in self.keys.items()}
        twin.identity = self.identity
        twin.revoked = dict(self.revoked)
        twin._first = dict(self._first)
        twin._secrets = dict(self._secrets)
        return twin

    @property
    def plane(self) -> Ed25519PublicKey | None:
        if callable(self._plane):
            self._plane = self._plane()
        return self._plane

    # -- the ledger's identity ---------------------------------------------------------

    def identify(self, event: RecordedEvent) -> str | None:
        """Take a ``ledger.identified``: the first one the plane key signed for where it
        stands (its position, stream and version) names the ledger."""
        p = event.payload
        assert isinstance(p, LedgerIdentified)
        if self.identity is not None:
            return f"the ledger was identified once, at position {self.identity.position}"
        plane = self.plane
        if plane is None:
            return "the ledger's identification is signed by the plane key"
        place = Place(p.ledger_id, event.stream, event.stream_version, event.type)
        try:
            ok = verify_record(
                plane,
                identity_record(p.ledger_id, p.position),
                p.signature,
                domain="ledger",
                place=place,
            )
        except (SigningError, ValueError):
            ok = False
        if not ok:
            return "the ledger's identification is signed by the plane key"
        if p.position != event.position or event.stream != LedgerIdentified.STREAM:
            return Replayed(
                f"the ledger's identification stands where the plane key signed it "
                f"(position {p.position}, not {event.position})"
            )
        self.identity = Identity(p.ledger_id, event.position)
        return None

    # -- people's keys -----------------------------------------------------------------

    def take(self, event: RecordedEvent) -> str | None:
        p = event.payload
        if isinstance(p, ApproverKeyAdded):
            problem = self.endorsement_problem(event) or self.policy_problem(event)
            if problem is not None:
                return problem
            if p.fingerprint in self.revoked:
                return (
                    f"{p.role} key {p.fingerprint[:16]}… was revoked at position "
                    f"{self.revoked[p.fingerprint]}: a revocation is final"
                )
            self.keys[p.fingerprint] = ApproverKey(p.name, p.public_key, "active", p.role)
        elif isinstance(p, ApproverKeyRevoked):
            problem = self.policy_problem(event)
            if problem is not None:
                return problem
            key = self.keys.get(p.fingerprint)
            if key is not None and key.name == p.name:
                key.status = "revoked"
                self.revoked.setdefault(p.fingerprint, event.position)
        return None

    def endorsement_problem(self, event: RecordedEvent) -> str | None:
        """Why a key registration is not the plane key's (None when it is, where it
        stands)."""
        p = event.payload
        assert isinstance(p, ApproverKeyAdded)
        refused = Unendorsed(
            f"{p.role} key {p.fingerprint[:16]}… of {p.name!r} is endorsed by the plane key"
        )
        plane = self.plane
        if plane is None:
            return refused
        record = approver_record(p.name, p.public_key, p.fingerprint)
        domain: Domain = "operator" if p.role == "operator" else "approver"

        def verifies(place: Place | None) -> bool:
            return _verifies(plane, record, p.endorsement, domain, place)

        return self._placement(event, p.place, p.endorsement, verifies, refused)

    # -- policy ------------------------------------------------------------------------

    def policy_problem(self, event: RecordedEvent) -> str | None:
        p = event.payload
        if not needs_operator(p):
            return None
        what = p.type_name()
        signed = getattr(p, "signed", msgspec.UNSET)
        if not isinstance(signed, PolicySignature):
            return f"{what} is policy: it carries an operator's signature"
        key = self.keys.get(signed.fingerprint)
        if key is None or key.role != "operator" or key.name != signed.operator:
            return f"{what} is signed with an endorsed key of operator {signed.operator!r}"
        if key.status != "active":
            return f"{what} is signed with an operator key active at its position"
        try:
            public = public_key_from_b64(key.public_key)
        except (SigningError, ValueError):
            return f"{what}'s operator signature verifies"
        record = policy_record(p)

        def verifies(place: Place | None) -> bool:
            return _verifies(public, record, signed.signature, "policy", place)

        problem = self._placement(
            event, signed.place, signed.signature, verifies, f"{what}'s operator signature verifies"
        )
        if problem is None and p.default_stream() != event.stream:
            problem = f"{what} stands in its own stream ({p.default_stream()}), not {event.stream}"
        if problem is None and isinstance(p, CredentialIssued):
            problem = self._secret_problem(p)
        return problem

    def _secret_problem(self, p: CredentialIssued) -> str | None:
        """A credential's secret is bound to its id: issued under one id only."""
        holder = self._secrets.setdefault(p.secret_sha256, p.credential_id)
        if holder != p.credential_id:
            return Replayed(
                f"credential {holder}'s secret is issued once, not again as {p.credential_id}"
            )
        return None

    # -- where a signature stands ------------------------------------------------------

    def _placement(
        self,
        event: RecordedEvent,
        stated: SignedPlace | msgspec.UnsetType,
        signature: str,
        verifies: Callable[[Place | None], bool],
        refused: str,
    ) -> str | None:
        """Whether a genuine signature stands where it was made: a bound one at the
        place it states, in this ledger after its identification; one in the first
        release's format (no place) only before the identification, where it first
        stood."""
        identity = self.identity
        if not isinstance(stated, SignedPlace):
            if not verifies(None):
                return refused
            if identity is not None and event.position > identity.position:
                return Replayed(
                    f"{refused}: a signature in the first release's format stands only "
                    f"before the ledger's identification (position {identity.position})"
                )
            first = self._first.setdefault(signature, event.position)
            if first != event.position:
                return Replayed(f"{refused}: a signature counts once (first at position {first})")
            return None
        if not verifies(Place.signed(stated, event.type)):
            return refused
        if identity is None or stated.ledger != identity.ledger_id:
            return Replayed(
                f"{refused}: signed for ledger {stated.ledger}, not this one "
                f"({identity.ledger_id if identity is not None else 'not identified yet'})"
            )
        if (stated.stream, stated.version) != (event.stream, event.stream_version):
            return Replayed(
                f"{refused}: signed for {stated.stream} v{stated.version}, it stands at "
                f"{event.stream} v{event.stream_version}"
            )
        return None


_UNFOLDED = ("plan", "ledger")  # kinds whose documents a policy fold does not keep


class PolicyFold:
    """Policy as the plane trusts it, folded in log order from the events of
    ``POLICY_TYPE_NAMES``: the keys (``ring``) and each policy stream's document folded
    from the events that count only (``docs``). The plane's ``PolicyCache`` and
    ``evidence audit`` judge with it, so they judge alike."""

    def __init__(
        self, plane_public_key: Ed25519PublicKey | Callable[[], Ed25519PublicKey] | None
    ) -> None:
        self.ring = KeyRing(plane_public_key)
        self.docs: dict[str, State | None] = {}
        self.approvals = Approvals()  # the approval policy and plans' operators, by position

    def copy(self) -> PolicyFold:
        twin = PolicyFold(None)
        twin.ring, twin.docs = self.ring.copy(), dict(self.docs)
        twin.approvals = self.approvals.copy()
        return twin

    def take(self, event: RecordedEvent) -> str | None:
        """Judge one event (in log order) and fold it when it counts; why it does not
        count otherwise: its stream's rules over the trusted document so far (a
        registration never goes back a version, a detached attachment stays detached),
        then its signatures where it stands."""
        p = event.payload
        folded = event.stream.partition(":")[0] not in _UNFOLDED
        problem: str | None
        if isinstance(p, LedgerIdentified):
            problem = self.ring.identify(event)
        elif isinstance(p, ApproverKeyAdded | ApproverKeyRevoked):
            # The stream's rules first: the ring keeps what it takes.
            problem = self._rule(event) or self.ring.take(event)
        else:
            problem = self.ring.policy_problem(event) or (self._rule(event) if folded else None)
        if problem is None and folded:
            self.docs[event.stream] = fold(event.stream, self.docs.get(event.stream), p)
        if problem is None and (not isinstance(p, PlanCreated) or needs_operator(p)):
            self.approvals.take(event)  # a plan's signer counts where the signature was checked
        return problem

    def _rule(self, event: RecordedEvent) -> str | None:
        rule = broken_rule(event.stream, self.docs.get(event.stream), event.payload)
        return None if rule is None else BrokenRule(rule)


def _verifies(
    key: Ed25519PublicKey,
    record: dict[str, Any],
    signature: str,
    domain: Domain,
    place: Place | None,
) -> bool:
    try:
        return verify_record(key, record, signature, domain=domain, place=place)
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


def expiry_problem(
    p: EscalationExpired, escalation_leaf: bytes | None, plane_public_key: Ed25519PublicKey
) -> str | None:
    """Why an escalation's expiry is not the plane's (None when its signature holds): the
    plane key signs the escalation's leaf hash and the time."""
    if escalation_leaf is None or p.escalation_hash != escalation_leaf.hex():
        return f"escalation {p.decision_id}'s expiry is signed over its escalation's leaf hash"
    record = expiry_record(p.decision_id, p.plan_id, p.escalation_hash, p.expired_at)
    if not _verifies(plane_public_key, record, p.signature, "expiry", None):
        return f"escalation {p.decision_id}'s expiry is signed by the plane key"
    return None


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
