"""Who is asking: the bearer credential an operator issued for one plan (RFC 6750).

Every agent route needs ``Authorization: Bearer TOKEN``; the token is checked by the
plane (``commands.plane.credentials.authenticate``: an issuance an operator signed, the
secret, not revoked, not expired), read-only, before anything else of the request is
read. The credential names the plan the request acts on: the agent never chooses it, and
a request that names another plan (its ``plan`` query parameter or body member) is
forbidden rather than quietly served for the credential's own.

- no or malformed header, unknown, revoked or expired token: 401 with
  ``WWW-Authenticate: Bearer`` (RFC 6750; ``error="invalid_token"`` when a token was
  given), its ``error_description`` the reason and how a credential is obtained, its
  ``resource_metadata`` the URL of the service's protected-resource metadata (RFC 9728,
  as the MCP authorization specification asks: ``resource_metadata``);
- a credential of another role, or a request naming another plan: 403.

No OAuth authorization server issues these credentials, an operator does: the
metadata names none (docs/service.md, "MCP over HTTP").
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from commands.plane.core import Plane
from commands.plane.credentials import CredentialState, Unauthenticated, authenticate
from ledger import LedgerError

__all__ = [
    "AGENT_ROLE",
    "OBTAIN",
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
# How an agent comes by a credential, said in every 401 (error_description)
OBTAIN = "an operator issues an agent's credential for its plan: evidence credential issue"
# RFC 6750 section 3: error_description is %x20-21 / %x23-5B / %x5D-7E (no " and no \)
_NOT_DESCRIPTION = re.compile(r"[^\x20-\x21\x23-\x5b\x5d-\x7e]")
MAX_DESCRIPTION = 400
URL_SAFE = ":/?#[]@!$&'()*+,;=%~"  # kept as they are in a URL (RFC 3986): no quote, no backslash


class Forbidden(LedgerError):
    """An authenticated credential asked for what it does not cover (one line: why)."""


def challenge(reason: str, *, token_given: bool, resource_metadata: str) -> str:
    """The ``WWW-Authenticate`` value of a 401: ``Bearer`` with the realm, the error
    (RFC 6750: none when no token was given), the reason and how a credential is
    obtained (``error_description``), and where the protected-resource metadata is
    (``resource_metadata``, RFC 9728 section 5.1)."""
    description = _NOT_DESCRIPTION.sub("'", f"{reason}; {OBTAIN}")[:MAX_DESCRIPTION]
    params = [f'realm="{REALM}"']
    if token_given:
        params.append('error="invalid_token"')
    params.append(f'error_description="{description}"')
    # a URL (quoted, so no " or \ in it): the request's own, its Host checked at the door
    params.append(f'resource_metadata="{quote(resource_metadata, safe=URL_SAFE)}"')
    return "Bearer " + ", ".join(params)


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
