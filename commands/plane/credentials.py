"""Agent credentials: how an agent reaches its plan through the plane's service without
holding any key (docs/service.md).

An operator issues a credential for one plan (``issue_credential``): a bearer token
``evd_<credential_id>_<secret>``, shown once; the log keeps only the secret's SHA-256,
the plan, the role (``agent``) and the expiry, in ``credential.issued``, which is policy
an operator signs like a registration. ``authenticate`` accepts a token only when its
issuance verifies under an operator key in force at its position, its secret matches,
it has not expired and no signed revocation followed. Whatever the agent appends to the
database without an operator key (an issuance of its own, a revocation undone) is
ignored here and reported by ``evidence audit`` (``policy_signature``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from ulid import ULID

from ledger.errors import LedgerError
from ledger.events import CredentialIssued, CredentialRevoked, EventPayload
from ledger.timestamps import rfc3339
from projections.documents import fold_credential
from projections.states import CredentialState, PlanState

from .core import CommandRefused, Plane, StreamState

__all__ = [
    "MAX_TTL",
    "CredentialState",
    "CredentialView",
    "IssuedCredential",
    "Unauthenticated",
    "authenticate",
    "credentials_of",
    "issue_credential",
    "revoke_credential",
]

PREFIX = "evd_"
MAX_TTL = timedelta(days=30)
# evd_ + a ULID + _ + 43 characters of base64url (256 bits)
_ID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")
_TOKEN = re.compile(rf"evd_({_ID.pattern})_([A-Za-z0-9_-]{{43}})")
_DIGEST = re.compile(r"[0-9a-f]{64}")


class Unauthenticated(LedgerError):
    """A token that names no credential the plane accepts (one line: why)."""


@dataclass(frozen=True)
class IssuedCredential:
    """What ``issue_credential`` gives the operator: the token (shown once, never kept)."""

    credential_id: str
    plan_id: str
    token: str
    expires_at: str


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _now() -> datetime:
    return datetime.now(UTC)


def issue_credential(
    plane: Plane,
    plan_id: str,
    *,
    ttl: timedelta,
    actor: str = "operator",
    credential_id: str | None = None,
    secret_sha256: str | None = None,
) -> IssuedCredential:
    """A credential for ``plan_id`` valid for ``ttl`` (at most ``MAX_TTL``), signed by
    this process's operator key as all policy is. Refused for an unknown or ended plan.

    With ``credential_id`` and ``secret_sha256`` (an operator elsewhere made the secret
    and keeps it: ``commands.operator_client``), the credential is issued for that
    secret's digest, and its token is not known here (``token`` is empty)."""
    if not timedelta(0) < ttl <= MAX_TTL:
        raise CommandRefused(f"a credential's lifetime is more than 0 and at most {MAX_TTL}")
    plan = plane.log().state(f"plan:{plan_id}").of(PlanState)
    if plan is None:
        raise CommandRefused(f"unknown plan {plan_id!r}")
    if plan.terminal is not None:
        raise CommandRefused(f"plan {plan_id} has ended ({plan.terminal}): no agent acts for it")
    if (credential_id is None) != (secret_sha256 is None):
        raise CommandRefused("a credential made elsewhere gives both its id and its digest")
    secret = ""
    if credential_id is None or secret_sha256 is None:
        credential_id, secret = str(ULID()), secrets.token_urlsafe(32)
        secret_sha256 = _digest(secret)
    elif not _ID.fullmatch(credential_id) or not _DIGEST.fullmatch(secret_sha256):
        raise CommandRefused("a credential's id is a ULID and its digest 64 hex digits")
    expires_at = rfc3339(_now() + ttl)
    issued = CredentialIssued(
        credential_id=credential_id,
        plan_id=plan_id,
        secret_sha256=secret_sha256,
        expires_at=expires_at,
    )

    def decide(state: StreamState) -> list[EventPayload]:
        if state.doc is not None:
            raise CommandRefused(f"credential {credential_id} exists")
        return [issued]

    plane.run(f"credential:{credential_id}", decide, actor=actor)
    token = f"{PREFIX}{credential_id}_{secret}" if secret else ""
    return IssuedCredential(credential_id, plan_id, token, expires_at)


def revoke_credential(
    plane: Plane, credential_id: str, reason: str = "", *, actor: str = "operator"
) -> CredentialState:
    """Revoke a credential (signed by this process's operator key)."""
    if not _ID.fullmatch(credential_id):
        raise CommandRefused(f"{credential_id[:40]!r} is not a credential id (a ULID)")

    def decide(state: StreamState) -> list[EventPayload]:
        doc = state.of(CredentialState)
        if doc is None:
            raise CommandRefused(f"unknown credential {credential_id!r}")
        if doc.status == "revoked":
            raise CommandRefused(f"credential {credential_id} is already revoked")
        return [CredentialRevoked(credential_id=credential_id, reason=reason)]

    plane.run(f"credential:{credential_id}", decide, actor=actor)
    found = _trusted_state(plane, credential_id)
    assert found is not None
    return found


def _trusted_state(plane: Plane, credential_id: str) -> CredentialState | None:
    """The credential folded from its signed events only: an event the plane cannot
    trust (no operator's signature in force at its position) is skipped."""
    doc = plane.log().policy_doc(f"credential:{credential_id}")
    return doc if isinstance(doc, CredentialState) else None


def authenticate(plane: Plane, token: str) -> CredentialState:
    """The active credential ``token`` names; ``Unauthenticated`` (with why) otherwise."""
    found = _TOKEN.fullmatch(token.strip())
    if found is None:
        raise Unauthenticated("not an evidence credential (evd_<id>_<secret>)")
    credential_id, secret = found.groups()
    doc = _trusted_state(plane, credential_id)
    if doc is None:
        raise Unauthenticated("no such credential (or none an operator signed)")
    if not hmac.compare_digest(doc.secret_sha256, _digest(secret)):
        raise Unauthenticated("no such credential (or none an operator signed)")
    if doc.status != "active":
        raise Unauthenticated(f"credential {credential_id} is revoked")
    if datetime.fromisoformat(doc.expires_at) <= _now():
        raise Unauthenticated(f"credential {credential_id} expired at {doc.expires_at}")
    return doc


@dataclass(frozen=True)
class CredentialView:
    """A credential as listed: its state, and whether the plane trusts its issuance."""

    state: CredentialState
    trusted: bool


def credentials_of(plane: Plane, plan_id: str | None = None) -> list[CredentialView]:
    """Every credential issued (for ``plan_id``, if given), in log order, with whether
    the plane trusts it (an operator's signature in force at its issuance); an untrusted
    one is shown as its own events say, and authenticates nobody."""
    log = plane.log()
    views: list[CredentialView] = []
    for event in plane.store.read_all(types=[CredentialIssued.type_name()]):
        p = event.payload
        if not isinstance(p, CredentialIssued) or (plan_id is not None and p.plan_id != plan_id):
            continue
        trusted = _trusted_state(plane, p.credential_id) if log.policy_ok(event) else None
        if trusted is not None:
            views.append(CredentialView(trusted, True))
        else:
            untrusted = fold_credential(None, p)
            assert untrusted is not None
            views.append(CredentialView(untrusted, False))
    return views
