"""Operators through the service (`/v1/operator/prepare`, `/v1/operator/commit`,
docs/service.md "Operators through the service"), against a real `evidence serve` on a
unix socket: an operator whose key is on their own machine (no database, no plane key
there) registers a tool, attaches a validation and issues a credential with the CLI's
`--server`, the events signed where they sit.

The attacks, each at the routes themselves: a request signed by a key that is no
operator's (an agent's own), or too old; a commit whose event was changed after it was
signed; the same signed event committed twice, or into another stream; an operator key
revoked since. None appends anything.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import msgspec
import pytest

import ledger
from commands.plane import Plane
from commands.plane.lifecycle import add_approver_key, revoke_approver
from commands.plane.registry import register_tool
from commands.rules.operator_requests import authorization
from commands.rules.signing import Place, policy_record, sign_record
from ledger.events import (
    AttachmentCreated,
    CredentialIssued,
    DecisionRecorded,
    PolicySignature,
    SignedPlace,
)
from ledger.keys import fingerprint, generate_key_pair, load_private_key
from tests.conformance import harness
from tests.helpers import invoke, run_cli

PASS = [sys.executable, "-c", "print('{{}}')"]


@pytest.fixture
def service(sqlite_url: str, socket_dir: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A ledger whose host operator registered validation `lint` and endorsed Alice's
    operator key (made on Alice's machine: her key never leaves it), and `evidence
    serve` on it at a unix socket: the socket's URL and Alice's key."""
    alice = tmp_path / "alice" / "operator.key"
    alice.parent.mkdir()
    generate_key_pair(alice)
    with Plane.open(sqlite_url) as plane:
        register_tool(plane, {"name": "probe", "command": PASS})  # the host's operator
        add_approver_key(plane, "alice", Path(f"{alice}.pub"), role="operator")
    invoke("validation", "register", _validation(tmp_path), "--db", sqlite_url)
    run_cli("plan", "create", "P-1", "--project", "p", "--resource", "repo:p", "--db", sqlite_url)
    sock = socket_dir / "serve.sock"
    serve = [sys.executable, "-m", "commands.cli", "serve", "--db", sqlite_url, "--uds", str(sock)]
    env = {k: v for k, v in os.environ.items() if k != "EVIDENCE_DB"}
    with harness.serving(serve, stderr=tmp_path / "serve.log", env=env) as url:
        yield url, alice


def _validation(tmp_path: Path) -> str:
    path = tmp_path / "lint.json"
    path.write_text(json.dumps({"name": "lint", "command": PASS, "mode": "required"}))
    return str(path)


def _elsewhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Alice's machine: no ledger, and no plane key or operator key of the host's."""
    monkeypatch.delenv("EVIDENCE_DB", raising=False)
    monkeypatch.setenv("EVIDENCE_PLANE_KEY", str(tmp_path / "nowhere" / "plane.key"))
    monkeypatch.delenv("EVIDENCE_OPERATOR_KEY", raising=False)


def test_an_operator_elsewhere_registers_attaches_and_issues_through_the_service(
    service: tuple[str, Path], sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, alice = service
    tool = tmp_path / "calc.json"
    tool.write_text(json.dumps({"name": "calc", "command": PASS}))
    _elsewhere(monkeypatch, tmp_path)
    remote = ("--server", url, "--operator-key", str(alice))
    registered = invoke("tool", "register", str(tool), *remote)
    assert registered.exit_code == 0, registered.output
    assert "registered tool calc version 1" in registered.stdout
    attached = invoke("attach", "lint", "--resource", "repo:p", *remote)
    assert attached.exit_code == 0, attached.output
    spare = invoke("attach", "lint", "--resource", "repo:q", *remote).stdout.strip()
    detached = invoke("detach", spare, "--reason", "not needed", "--json", *remote)
    assert detached.exit_code == 0, detached.output
    assert json.loads(detached.stdout)["attachment"]["status"] == "detached"
    monkeypatch.setenv("EVIDENCE_OPERATOR_KEY", str(alice))
    issued = invoke("credential", "issue", "--plan", "P-1", "--server", url, "--json")
    assert issued.exit_code == 0, issued.output
    token = json.loads(issued.stdout)["credential"]["token"]
    assert not (tmp_path / "nowhere").exists()  # no plane key was made or read here
    # The agent's credential works at the service; the secret never went there.
    answer = _http(url).get("/v1/plan", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    with ledger.open(sqlite_url, create=False) as store:
        events = list(store.read_all())
        signed = [
            e.payload.signed.operator
            for e in events
            if e.stream in ("tool:calc", f"attachment:{attached.stdout.strip()}")
            or e.stream.startswith("credential:")
        ]
        assert signed == ["alice", "alice", "alice"]
        detaching = [e for e in events if e.type == "attachment.detached"]
        assert [e.payload.signed.operator for e in detaching] == ["alice"]
        secret = token.rsplit("_", 1)[1]
        assert all(secret.encode() not in (store.get_blob(d) or b"") for d in _digests(events))
    audit = run_cli("audit", "--db", sqlite_url)
    assert audit.returncode == 0, audit.stdout + audit.stderr


def _digests(events: list[ledger.RecordedEvent]) -> list[str]:
    return [
        v
        for e in events
        for k, v in msgspec.to_builtins(e.payload).items()
        if k.endswith("_sha256") and isinstance(v, str)
    ]


def _http(url: str) -> httpx2.Client:
    transport = httpx2.HTTPTransport(uds=url.removeprefix("unix:"))
    return httpx2.Client(transport=transport, base_url="http://localhost", timeout=30)


def _post(url: str, key: Any, path: str, body: dict[str, Any], at: int | None = None) -> Any:
    data = json.dumps(body).encode()
    headers = {"Authorization": authorization(key, "POST", path, data, at)}
    return _http(url).post(path, content=data, headers=headers)


def _issue(plan_id: str = "P-1") -> dict[str, Any]:
    from ulid import ULID

    return {
        "verb": "credential.issue",
        "args": {
            "plan_id": plan_id,
            "ttl_s": 3600,
            "credential_id": str(ULID()),
            "secret_sha256": "ab" * 32,
        },
    }


def _sign(key: Any, operator: str, item: dict[str, Any], **changed: Any) -> dict[str, Any]:
    payload = msgspec.convert(item["payload"], CredentialIssued)
    place = Place(**item["place"])
    signature = sign_record(key, policy_record(payload), domain="policy", place=place)
    signed = msgspec.structs.replace(
        payload,
        signed=PolicySignature(
            operator=operator,
            fingerprint=fingerprint(key.public_key()),
            signature=signature,
            place=SignedPlace(ledger=place.ledger, stream=place.stream, version=place.version),
        ),
        **changed,
    )
    return dict(msgspec.to_builtins(signed))


def _head(sqlite_url: str) -> int:
    with ledger.open(sqlite_url, create=False) as store:
        return store.head().size


def test_only_an_operator_keys_fresh_signature_opens_the_routes(
    service: tuple[str, Path], sqlite_url: str, tmp_path: Path
) -> None:
    url, alice = service
    key = load_private_key(alice)
    generate_key_pair(tmp_path / "agent.key")
    agents = load_private_key(tmp_path / "agent.key")
    before = _head(sqlite_url)
    assert _post(url, agents, "/v1/operator/prepare", _issue()).status_code == 401
    stale = int(time.time()) - 3600
    assert _post(url, key, "/v1/operator/prepare", _issue(), at=stale).status_code == 401
    unsigned = _http(url).post("/v1/operator/prepare", json=_issue())
    assert unsigned.status_code == 401
    # Signed for another body: the signature covers the body's digest.
    data = json.dumps(_issue()).encode()
    headers = {"Authorization": authorization(key, "POST", "/v1/operator/prepare", b"{}")}
    swapped = _http(url).post("/v1/operator/prepare", content=data, headers=headers)
    assert swapped.status_code == 401
    assert _head(sqlite_url) == before


def test_a_signed_event_is_appended_once_where_it_was_signed_and_unchanged(
    service: tuple[str, Path], sqlite_url: str
) -> None:
    url, alice = service
    key = load_private_key(alice)
    before = _head(sqlite_url)
    prepared = _post(url, key, "/v1/operator/prepare", _issue()).json()
    assert prepared["operator"] == "alice" and not prepared["unchanged"]
    assert _head(sqlite_url) == before  # a prepare appends nothing
    [item] = prepared["prepared"]
    stream, version = prepared["stream"], prepared["version"]

    def commit(payload: dict[str, Any], into: str = stream) -> Any:
        body = {"stream": into, "version": version, "payloads": [payload]}
        return _post(url, key, "/v1/operator/commit", body)

    changed = commit(_sign(key, "alice", item, plan_id="P-2"))  # changed after signing
    assert changed.status_code == 409 and "does not verify" in changed.json()["error"]
    elsewhere = commit(_sign(key, "alice", item), into="credential:01J00000000000000000000000")
    assert elsewhere.status_code == 409, elsewhere.text  # another stream than it was signed for
    assert _head(sqlite_url) == before
    good = commit(_sign(key, "alice", item))
    assert good.status_code == 200, good.text
    assert [a["type"] for a in good.json()["appended"]] == ["credential.issued"]
    again = commit(_sign(key, "alice", item))  # the same signed event, committed again
    assert again.status_code == 409 and "prepare it again" in again.json()["error"]
    assert _head(sqlite_url) == before + 1


def test_a_revoked_operator_key_opens_nothing(service: tuple[str, Path], sqlite_url: str) -> None:
    url, alice = service
    key = load_private_key(alice)
    prepared = _post(url, key, "/v1/operator/prepare", _issue()).json()
    with Plane.open(sqlite_url) as plane:
        revoke_approver(plane, "alice", reason="left the team")
    body = {
        "stream": prepared["stream"],
        "version": prepared["version"],
        "payloads": [_sign(key, "alice", prepared["prepared"][0])],
    }
    assert _post(url, key, "/v1/operator/commit", body).status_code == 401
    assert _post(url, key, "/v1/operator/prepare", _issue()).status_code == 401
    with ledger.open(sqlite_url, create=False) as store:
        assert not [e for e in store.read_all() if isinstance(e.payload, AttachmentCreated)]


# -- approvers ----------------------------------------------------------------------------


@pytest.fixture
def escalated(sqlite_url: str, socket_dir: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """Plan P-1 escalated (no retries, no revisions left) with approver alice, whose key
    is on her machine, and `evidence serve` on the ledger: the socket's URL and her key."""
    from commands.plane.validation_runs import validate_plan
    from tests.helpers import status_plan

    with Plane.open(sqlite_url) as plane:
        status_plan(plane, tmp_path, {"retry_limit": 0, "max_strategy_revisions": 0})
        assert validate_plan(plane, "P-1").outcome == "escalate"
    sock = socket_dir / "serve.sock"
    serve = [sys.executable, "-m", "commands.cli", "serve", "--db", sqlite_url, "--uds", str(sock)]
    env = {k: v for k, v in os.environ.items() if k != "EVIDENCE_DB"}
    with harness.serving(serve, stderr=tmp_path / "serve.log", env=env) as url:
        yield url, tmp_path / "alice.key"


def test_an_approver_elsewhere_lists_and_decides_through_the_service(
    escalated: tuple[str, Path], sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, alice = escalated
    host_key = os.environ["EVIDENCE_PLANE_KEY"]
    _elsewhere(monkeypatch, tmp_path)
    listed = invoke("authorize", "--server", url, "--key", str(alice), "--json")
    assert listed.exit_code == 0, listed.output
    [pending] = json.loads(listed.stdout)["decisions"]
    assert pending["plan_id"] == "P-1"
    decided = invoke(
        "authorize", pending["decision_id"], "--server", url, "--key", str(alice),
        "--revise", "write good", "--reason", "the check is right",
    )  # fmt: skip
    assert decided.exit_code == 0, decided.output
    assert "revise by alice" in decided.stdout
    again = invoke(
        "authorize", pending["decision_id"], "--server", url, "--key", str(alice), "--abandon"
    )
    assert again.exit_code == 2 and "no pending escalation" in again.stderr
    with ledger.open(sqlite_url, create=False) as store:
        last = list(store.read_stream("plan:P-1"))[-1].payload
    assert isinstance(last, DecisionRecorded) and last.approver == "alice"
    assert (last.choice, last.guidance) == ("revise", "write good")
    audit = run_cli("audit", "--db", sqlite_url, env={"EVIDENCE_PLANE_KEY": host_key})
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_only_an_approvers_signature_decides_and_only_as_signed(
    escalated: tuple[str, Path], sqlite_url: str, tmp_path: Path
) -> None:
    """An operator's key is no approver's; a decision whose record was changed after
    the approver signed it (abandon signed, revise sent) does not verify."""
    url, alice = escalated
    key = load_private_key(alice)
    operator = tmp_path / "ops.key"
    generate_key_pair(operator)
    with Plane.open(sqlite_url) as plane:
        add_approver_key(plane, "ops", Path(f"{operator}.pub"), role="operator")
    ops = load_private_key(operator)
    assert _post(url, ops, "/v1/approver/pending", {}).status_code == 401
    [pending] = _post(url, key, "/v1/approver/pending", {}).json()["decisions"]
    asked = {"decision_id": pending["decision_id"], "choice": "abandon"}
    record = _post(url, key, "/v1/approver/prepare", asked).json()["record"]
    signature = sign_record(key, record, domain="decision")
    changed = {**record, "choice": "revise", "guidance": "anything"}
    body = {"record": changed, "fingerprint": fingerprint(key.public_key()), "signature": signature}
    before = _head(sqlite_url)
    refused = _post(url, key, "/v1/approver/decide", body)
    assert refused.status_code == 409 and "does not verify" in refused.json()["error"]
    assert _head(sqlite_url) == before
    body["record"] = record
    assert _post(url, key, "/v1/approver/decide", body).status_code == 200


@pytest.fixture
def two_of_three(sqlite_url: str, socket_dir: Path, tmp_path: Path) -> Iterator[str]:
    """P-1 escalated needing 2 of its 3 approvers (alice, bob, carol: each key on its
    owner's machine), and `evidence serve` on the ledger: the socket's URL."""
    from commands.plane.validation_runs import validate_plan
    from tests.helpers import status_plan

    config = {"retry_limit": 0, "max_strategy_revisions": 0, "approvals_required": 2}
    with Plane.open(sqlite_url) as plane:
        status_plan(plane, tmp_path, config)
        for name in ("bob", "carol"):
            generate_key_pair(tmp_path / f"{name}.key")
            add_approver_key(plane, name, Path(f"{tmp_path / name}.key.pub"))
        assert validate_plan(plane, "P-1").outcome == "escalate"
    sock = socket_dir / "serve.sock"
    serve = [sys.executable, "-m", "commands.cli", "serve", "--db", sqlite_url, "--uds", str(sock)]
    env = {k: v for k, v in os.environ.items() if k != "EVIDENCE_DB"}
    with harness.serving(serve, stderr=tmp_path / "serve.log", env=env) as url:
        yield url


def test_two_of_three_approvers_decide_through_the_service(
    two_of_three: str, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each approver lists what waits (with the failing results it is about) and signs
    where they sit; the first signature waits for a second, the second decides."""
    url = two_of_three
    host_key = os.environ["EVIDENCE_PLANE_KEY"]
    _elsewhere(monkeypatch, tmp_path)

    def as_(name: str, *args: str) -> Any:
        return invoke("authorize", *args, "--server", url, "--key", str(tmp_path / f"{name}.key"))

    listed = as_("carol", "--json")
    assert listed.exit_code == 0, listed.output
    [pending] = json.loads(listed.stdout)["decisions"]
    assert pending["approvals_required"] == 2 and "approvals" not in pending
    [failure] = pending["failures"]
    assert failure["validation"] == "status" and "bad" in failure["message"]
    decision = pending["decision_id"]
    first = as_("alice", decision, "--abandon", "--json")
    assert first.exit_code == 0 and json.loads(first.stdout)["stands"] is False, first.output
    [waiting] = json.loads(as_("carol", "--json").stdout)["decisions"]
    assert waiting["approvals"] == {"alice": "abandon"}
    second = as_("bob", decision, "--abandon")
    assert second.exit_code == 0, second.output
    assert f"decision {decision}: abandon by bob; plan ended" in second.stdout
    assert json.loads(as_("carol", "--json").stdout)["decisions"] == []
    audit = run_cli("audit", "--db", sqlite_url, env={"EVIDENCE_PLANE_KEY": host_key})
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_the_other_operator_verbs_through_the_service(
    service: tuple[str, Path], sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A validation registered, a skill defined, a credential revoked and the approval
    policy set from Alice's machine; the revoked credential is refused at the service
    from then on."""
    url, alice = service
    host_key = os.environ["EVIDENCE_PLANE_KEY"]
    validation = tmp_path / "check.json"
    validation.write_text(json.dumps({"name": "check", "command": PASS, "mode": "required"}))
    skill = tmp_path / "qa.json"
    skill.write_text(json.dumps({"name": "qa", "members": ["probe", "check"]}))
    _elsewhere(monkeypatch, tmp_path)
    monkeypatch.setenv("EVIDENCE_OPERATOR_KEY", str(alice))
    registered = invoke("validation", "register", str(validation), "--server", url)
    assert registered.exit_code == 0, registered.output
    assert "registered validation check version 1" in registered.stdout
    defined = invoke("skill", "define", str(skill), "--server", url, "--json")
    assert defined.exit_code == 0, defined.output
    assert json.loads(defined.stdout) == {"skill": {"name": "qa", "version": 1}, "changed": True}
    issued = invoke("credential", "issue", "--plan", "P-1", "--server", url, "--json")
    credential = json.loads(issued.stdout)["credential"]
    bearer = {"Authorization": f"Bearer {credential['token']}"}
    assert _http(url).get("/v1/plan", headers=bearer).status_code == 200
    revoked = invoke("credential", "revoke", credential["credential_id"], "--server", url)
    assert revoked.exit_code == 0, revoked.output
    assert _http(url).get("/v1/plan", headers=bearer).status_code == 401
    policy = invoke("approvals", "set", "--min", "2", "--separate-duties", "--server", url)
    assert policy.exit_code == 0, policy.output
    assert policy.stdout == "min approvals: 2\nduties: separate\n"
    with ledger.open(sqlite_url, create=False) as store:
        signers = {
            e.stream: e.payload.signed.operator
            for e in store.read_all()
            if e.stream in ("tool:check", "skill:qa", "approval_policy")
            or e.stream == f"credential:{credential['credential_id']}"
        }
    assert set(signers.values()) == {"alice"} and len(signers) == 4
    monkeypatch.setenv("EVIDENCE_PLANE_KEY", host_key)  # on the service's host
    shown = invoke("approvals", "show", "--json", "--db", sqlite_url)
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout) == {
        "approval_policy": {"min_approvals": 2, "separate_duties": True}
    }


def test_an_operator_elsewhere_adds_and_revokes_an_approvers_key(
    service: tuple[str, Path], sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dave's key, made on his machine, added by Alice through the service (its plane key
    endorses it, Alice signs the registration): Dave's requests open the approver's
    routes; once Alice revoked it, they do not. An operator key is not added this way."""
    url, alice = service
    host_key = os.environ["EVIDENCE_PLANE_KEY"]
    dave = tmp_path / "dave" / "dave.key"
    dave.parent.mkdir()
    generate_key_pair(dave)
    _elsewhere(monkeypatch, tmp_path)
    remote = ("--server", url, "--operator-key", str(alice))
    added = invoke("keys", "add", "dave", f"{dave}.pub", *remote)
    assert added.exit_code == 0, added.output
    assert added.stdout == "approver dave: key added\n"
    key = load_private_key(dave)
    assert _post(url, key, "/v1/approver/pending", {}).status_code == 200
    again = invoke("keys", "add", "dave", f"{dave}.pub", *remote)
    assert again.exit_code == 2 and "already registered" in again.stderr
    operator = invoke("keys", "add", "eve", f"{dave}.pub", "--role", "operator", *remote)
    assert operator.exit_code == 2 and "plane key's alone" in operator.stderr
    revoked = invoke("keys", "revoke", "dave", "--reason", "left", *remote)
    assert revoked.exit_code == 0, revoked.output
    assert _post(url, key, "/v1/approver/pending", {}).status_code == 401
    with ledger.open(sqlite_url, create=False) as store:
        signed = [e.payload.signed.operator for e in store.read_stream("approver:dave")]
    assert signed == ["alice", "alice"]
    audit = run_cli("audit", "--db", sqlite_url, env={"EVIDENCE_PLANE_KEY": host_key})
    assert audit.returncode == 0, audit.stdout + audit.stderr
