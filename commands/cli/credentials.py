"""``evidence credential``: agent credentials for the plane's service (operators)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import TYPE_CHECKING

import click

from .common import (
    db_option,
    emit_json,
    emit_listing,
    format_option,
    json_option,
    open_plane,
    print_table,
    server_options,
)
from .terminal import inert

if TYPE_CHECKING:
    from commands.plane.credentials import CredentialState, IssuedCredential

_TTL = re.compile(r"([1-9][0-9]{0,6})([mhd])")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}


def _ttl(_ctx: click.Context, _param: click.Parameter, value: str) -> timedelta:
    from commands.plane.credentials import MAX_TTL

    found = _TTL.fullmatch(value)
    if found is None:
        raise click.BadParameter(f"{value!r}: a number of m, h or d, such as 30m, 8h or 7d")
    ttl = timedelta(**{_UNITS[found.group(2)]: int(found.group(1))})
    if ttl > MAX_TTL:
        raise click.BadParameter(f"{value!r}: at most {MAX_TTL.days}d")
    return ttl


def _listed(state: CredentialState, trusted: bool) -> dict[str, object]:
    """A credential as listed: never its secret's digest (it is no one's business)."""
    return {
        "credential_id": state.credential_id,
        "plan_id": state.plan_id,
        "role": state.role,
        "expires_at": state.expires_at,
        "status": state.status,
        "trusted": trusted,
    }


@click.group()
def credential() -> None:
    """Agent credentials: what an agent shows the plane's service.

    An operator issues one for a plan; the agent sends it as a bearer token, and acts on
    that plan only. The token is printed once; the ledger keeps its digest.
    """


@credential.command("issue")
@click.option("--plan", "plan_id", required=True, help="The plan the agent acts for.")
@click.option(
    "--ttl",
    default="8h",
    show_default=True,
    callback=_ttl,
    help="How long it is valid: 30m, 8h, 7d (at most 30d).",
)
@db_option
@server_options
@json_option
def issue(
    plan_id: str, ttl: timedelta, server: str | None, operator_key: str | None, as_json: bool
) -> None:
    """Issue a credential for PLAN; print its token (once).

    Policy: signed with this process's operator key. With --server, through the
    service: the secret is made here and never sent (the ledger keeps its digest).

    \b
    Examples:
      evidence credential issue --plan P-17 --ttl 30m --json
      evidence credential issue --plan P-17 --server unix:/run/evidence/serve.sock
    """
    from commands.plane.credentials import issue_credential

    if server is not None:
        issued = _issue_remotely(server, operator_key, plan_id, ttl)
    else:
        issued = issue_credential(open_plane(), plan_id, ttl=ttl)
    if as_json:
        emit_json(
            {
                "credential": {
                    "credential_id": issued.credential_id,
                    "plan_id": issued.plan_id,
                    "expires_at": issued.expires_at,
                    "token": issued.token,
                }
            }
        )
    else:
        click.echo(f"credential {issued.credential_id} for plan {inert(plan_id)}")
        click.echo(f"expires {issued.expires_at}")
        click.echo(f"token (shown once): {issued.token}")


def _issue_remotely(
    server: str, operator_key: str | None, plan_id: str, ttl: timedelta
) -> IssuedCredential:
    """The credential made here (its id and secret), issued through the service."""
    import hashlib
    import secrets

    from ulid import ULID

    from commands.plane.credentials import PREFIX, IssuedCredential
    from ledger.events import CredentialIssued

    from .operator_remote import act, expecting, remote

    credential_id, secret = str(ULID()), secrets.token_urlsafe(32)
    digest = hashlib.sha256(secret.encode()).hexdigest()

    expect = expecting(
        CredentialIssued, "the credential asked for",
        credential_id=credential_id, plan_id=plan_id, secret_sha256=digest,
    )  # fmt: skip
    args = {
        "plan_id": plan_id,
        "ttl_s": int(ttl.total_seconds()),
        "credential_id": credential_id,
        "secret_sha256": digest,
    }
    answer = act(remote(server, operator_key), "credential.issue", args, expect)
    expires_at = str(answer["prepared"][0]["payload"]["expires_at"])
    return IssuedCredential(credential_id, plan_id, f"{PREFIX}{credential_id}_{secret}", expires_at)


@credential.command("revoke")
@click.argument("credential_id")
@click.option("--reason", default="", help="Why (recorded).")
@db_option
@server_options
@json_option
def revoke(
    credential_id: str, reason: str, server: str | None, operator_key: str | None, as_json: bool
) -> None:
    """Revoke CREDENTIAL_ID: the service refuses it from now on.

    \b
    Examples:
      evidence credential revoke 01JF3Q9V4X2M8N6P5R7S9T1W3Y --reason rotated
    """
    from commands.plane.credentials import revoke_credential

    if server is not None:
        _revoke_remotely(server, operator_key, credential_id, reason, as_json)
        return
    state = revoke_credential(open_plane(), credential_id, reason)
    if as_json:
        emit_json({"credential": _listed(state, True)})
    else:
        click.echo(f"credential {credential_id}: revoked")


def _revoke_remotely(
    server: str, operator_key: str | None, credential_id: str, reason: str, as_json: bool
) -> None:
    """The revocation through the service, signed here (that credential's only)."""
    from ledger.events import CredentialRevoked

    from .operator_remote import act, expecting, remote

    what = f"the revocation of {credential_id}"
    expect = expecting(CredentialRevoked, what, credential_id=credential_id)
    args = {"credential_id": credential_id, "reason": reason}
    act(remote(server, operator_key), "credential.revoke", args, expect)
    if as_json:
        emit_json({"credential": {"credential_id": credential_id, "status": "revoked"}})
    else:
        click.echo(f"credential {credential_id}: revoked")


@credential.command("list")
@click.option("--plan", "plan_id", help="Only this plan's credentials.")
@db_option
@format_option()
def list_(plan_id: str | None, fmt: str) -> None:
    """Credentials issued (never their secrets); which the plane trusts.

    \b
    Examples:
      evidence credential list --plan P-17
      evidence credential list --format jsonl
    """
    from commands.plane.credentials import credentials_of

    rows = [_listed(v.state, v.trusted) for v in credentials_of(open_plane(), plan_id)]
    emit_listing(
        fmt,
        {"credentials": rows},
        rows,
        lambda: print_table(
            ["credential", "plan", "expires_at", "status", "trusted"],
            [
                [str(r["credential_id"]), str(r["plan_id"]), str(r["expires_at"]),
                 str(r["status"]), "yes" if r["trusted"] else "NO (unsigned)"]
                for r in rows
            ],
        ),
    )  # fmt: skip
