"""Agent credentials: an operator issues a bearer credential for one plan; the plane
accepts it only while its issuance verifies under an operator key, its secret matches, it
has not expired and was not revoked. An agent holding the database file but no operator
key can neither mint one (its issuance is ignored and audited) nor undo a revocation."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from pathlib import Path

import msgspec
import pytest

from commands.auditor.audit import audit
from commands.plane import CommandRefused, Plane
from commands.plane.credentials import (
    Unauthenticated,
    authenticate,
    credentials_of,
    issue_credential,
    revoke_credential,
)
from commands.plane.phases import record_strategy
from commands.plane.plans import create_plan
from commands.rules.signing import OPERATOR_KEY_ENV, load_or_create_plane_key
from ledger.events import CredentialRevoked
from tests.helpers import assert_refused, forge, forge_credential, run_cli

HOUR = timedelta(hours=1)


def _secret(token: str) -> str:
    return token[len("evd_") + 26 + 1 :]  # after evd_, the ULID and an underscore


def _plane(url: str) -> Plane:
    plane = Plane.open(url)
    create_plan(plane, "P-1", project="api", resources=["repo:api"])
    create_plan(plane, "P-2", project="api", resources=["repo:api"])
    return plane


def _policy_violations(plane: Plane) -> list[str]:
    key = load_or_create_plane_key(plane.store.url).public_key()
    report = audit(plane.store, plane_public_key=key)
    return [v.expected for v in report.violations if v.invariant == "policy_signature"]


def test_an_issued_credential_authenticates_for_its_plan_only(db_url: str) -> None:
    with _plane(db_url) as plane:
        issued = issue_credential(plane, "P-1", ttl=HOUR)
        assert issued.token.startswith(f"evd_{issued.credential_id}_")
        found = authenticate(plane, issued.token)
        assert (found.plan_id, found.role, found.status) == ("P-1", "agent", "active")
        # The log keeps the digest of the secret, never the secret.
        (event,) = plane.store.read_stream(f"credential:{issued.credential_id}")
        secret = _secret(issued.token)
        assert event.payload.secret_sha256 == hashlib.sha256(secret.encode()).hexdigest()
        assert secret not in json.dumps(msgspec.to_builtins(event.payload))
        assert event.payload.signed is not msgspec.UNSET  # policy: an operator signed it
        assert _policy_violations(plane) == []


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # another secret
        lambda t: "evd_" + "0" * 26 + "_" + _secret(t),  # another id
        lambda t: t.replace("evd_", "evx_"),  # not a credential
        lambda _t: "",
    ],
)
def test_a_wrong_token_is_unauthenticated_and_appends_nothing(db_url: str, mangle) -> None:  # type: ignore[no-untyped-def]
    with _plane(db_url) as plane:
        issued = issue_credential(plane, "P-1", ttl=HOUR)
        before = plane.store.head().size
        with pytest.raises(Unauthenticated):
            authenticate(plane, mangle(issued.token))
        assert plane.store.head().size == before


def test_revoked_and_expired_credentials_are_refused(db_url: str) -> None:
    with _plane(db_url) as plane:
        revoked = issue_credential(plane, "P-1", ttl=HOUR)
        revoke_credential(plane, revoked.credential_id, "rotated")
        with pytest.raises(Unauthenticated, match="revoked"):
            authenticate(plane, revoked.token)
        with pytest.raises(CommandRefused, match="already revoked"):
            revoke_credential(plane, revoked.credential_id)
        short = issue_credential(plane, "P-1", ttl=timedelta(microseconds=1))
        with pytest.raises(Unauthenticated, match="expired"):
            authenticate(plane, short.token)
        with pytest.raises(CommandRefused, match="lifetime"):
            issue_credential(plane, "P-1", ttl=timedelta(days=31))
        with pytest.raises(CommandRefused, match="unknown plan"):
            issue_credential(plane, "P-9", ttl=HOUR)


def test_the_agent_cannot_mint_a_credential_without_an_operator_key(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its own key the plane refuses to issue; appended past the plane, an unsigned
    issuance authenticates nobody, and audit reports it."""
    with _plane(db_url) as plane:
        issue_credential(plane, "P-1", ttl=HOUR)  # the operator's (bootstraps the operator)
        monkeypatch.setenv(OPERATOR_KEY_ENV, str(tmp_path / "agent.key"))
        with pytest.raises(CommandRefused, match="no operator's"):
            issue_credential(plane, "P-2", ttl=HOUR)
        token = forge_credential(plane.store, "P-2")
        with pytest.raises(Unauthenticated, match="none an operator signed"):
            authenticate(plane, token)
        assert any("credential.issued" in v for v in _policy_violations(plane))
        listed = {v.state.credential_id: v.trusted for v in credentials_of(plane)}
        assert listed[token.split("_")[1]] is False


def test_a_revocation_cannot_be_undone_or_forged_away(db_url: str) -> None:
    """An unsigned revocation revokes nothing (so the agent cannot lock out a plan's
    other agent either); a signed one holds whatever follows it."""
    with _plane(db_url) as plane:
        issued = issue_credential(plane, "P-1", ttl=HOUR)
        forge(
            plane.store,
            f"credential:{issued.credential_id}",
            CredentialRevoked(credential_id=issued.credential_id, reason="forged"),
        )
        assert authenticate(plane, issued.token).status == "active"
        assert any("credential.revoked" in v for v in _policy_violations(plane))


def test_the_credential_cli(sqlite_url: str) -> None:
    with _plane(sqlite_url) as plane:
        record_strategy(plane, "P-1", "work")
    issued = run_cli(
        "credential", "issue", "--plan", "P-1", "--ttl", "2h", "--json", "--db", sqlite_url
    )
    assert issued.returncode == 0, issued.stderr
    doc = json.loads(issued.stdout)["credential"]
    assert doc["plan_id"] == "P-1" and doc["token"].startswith("evd_")
    listed = run_cli("credential", "list", "--plan", "P-1", "--json", "--db", sqlite_url)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)["credentials"]
    assert row["credential_id"] == doc["credential_id"] and row["status"] == "active"
    assert "token" not in row and "secret_sha256" not in row
    assert doc["token"] not in listed.stdout
    revoked = run_cli("credential", "revoke", doc["credential_id"], "--db", sqlite_url)
    assert revoked.returncode == 0, revoked.stderr
    assert_refused(
        run_cli("credential", "issue", "--plan", "P-1", "--ttl", "forever", "--db", sqlite_url),
        "--ttl",
    )
    assert_refused(
        run_cli("credential", "revoke", doc["credential_id"], "--db", sqlite_url),
        "already revoked",
    )
    for hostile in ("../../x", "\x1b[2J", "A" * 5000, ""):
        refused = run_cli("credential", "revoke", hostile, "--db", sqlite_url)
        assert_refused(refused, "not a credential id")
        assert len(refused.stderr) < 200
