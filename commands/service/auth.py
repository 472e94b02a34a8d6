"""Who is asking: the bearer credential an operator issued for one plan (RFC 6750).

Every agent route needs ``Authorization: Bearer TOKEN``; the token is checked by the
plane (``commands.plane.credentials.authenticate``: an issuance an operator signed, the
secret, not revoked, not expired), read-only, before anything else of the request is
read. The credential names the plan the request acts on: the agent never chooses it, and
a request that names another plan (its ``plan`` query parameter or body member) is
forbidden rather than quietly served for the credential's own.

- no or malformed header, unknown, revoked or expired token: 401 with
  ``WWW-Authenticate: Bearer`` (``error="invalid_token"`` when a token was given);
- a credential of another role, or a request naming another plan: 403.
"""

from __future__ import annotations

import re
from typing import Any

from commands.plane.core import Plane
from commands.plane.credentials import CredentialState, Unauthenticated, authenticate
from ledger import LedgerError

__all__ = [
    "AGENT_ROLE",
    "Forbidden",
    "Unauthenticated",
    "bearer_token",
    "challenge",
    "check_plan",
    "credential_for",
]

AGENT_ROLE = "agent"
REALM = "evidence"
MAX_TOKEN = 512  # a credential is about 75 characters; anything far longer is no token
# RFC 6750 section 2.1: the scheme is case-insensitive, the token is b64token.
_BEARER = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +([A-Za-z0-9\-._~+/]+=*) *")


class Forbidden(LedgerError):
    """An authenticated credential asked for what it does not cover (one line: why)."""


def challenge(token_given: bool) -> str:
    """The ``WWW-Authenticate`` value of a 401."""
    base = f'Bearer realm="{REALM}"'
    return f'{base}, error="invalid_token"' if token_given else base


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization`` header; ``Unauthenticated`` when there is none
    or it is no bearer token."""
    if header is None or not header.strip():
        raise Unauthenticated("no credential: send Authorization: Bearer TOKEN")
    found = _BEARER.fullmatch(header)
    if found is None or len(found.group(1)) > MAX_TOKEN:
        raise Unauthenticated("the Authorization header is not Bearer TOKEN")
    return found.group(1)


def credential_for(plane: Plane, token: str) -> CredentialState:
    """The active agent credential of ``token`` (reads only: a refusal appends nothing)."""
    credential = authenticate(plane, token)
    if credential.role != AGENT_ROLE:
        raise Forbidden(f"credential {credential.credential_id} is no agent's ({credential.role})")
    return credential


def check_plan(credential: CredentialState, named: Any) -> None:
    """A plan the request names must be the credential's (absent: the credential's)."""
    if named is not None and named != credential.plan_id:
        raise Forbidden(
            f"this credential acts for plan {credential.plan_id} only; the request names "
            f"plan {str(named)[:128]!r}"
        )
