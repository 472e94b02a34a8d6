"""Signatures mean one thing, once: every signed event is bound to its ledger, its stream
and its place there, and what is revoked stays revoked.

The agent holds no operator, approver or plane key, but it can copy any signed event it
reads: re-append it into the same stream, into another stream or another plan, after a
revocation, or from another ledger. Each attack below is such a copy, made through the
public ``Store`` API as an agent holding the database file can; each is ignored by the
plane and named by ``evidence audit`` (``replayed_signature``)."""

from __future__ import annotations

import hashlib
import sys
from datetime import timedelta
from pathlib import Path

import msgspec
import pytest

from commands.auditor.audit import audit
from commands.plane import CommandRefused, Plane
from commands.plane.attachments import attach, detach
from commands.plane.authority import TamperedPlan
from commands.plane.credentials import (
    IssuedCredential,
    Unauthenticated,
    authenticate,
    issue_credential,
    revoke_credential,
)
from commands.plane.lifecycle import add_approver_key, authorize, revoke_approver
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import define_skill, register_tool, register_validation
from commands.plane.validation_runs import validate_plan
from commands.rules.signing import (
    Place,
    endorse_key,
    key_registration,
    load_or_create_operator_key,
    load_or_create_plane_key,
    policy_record,
    sign_record,
)
from commands.rules.trust import needs_operator
from ledger import RecordedEvent, Store
from ledger.events import (
    ApproverKeyAdded,
    CredentialIssued,
    EventPayload,
    GlobalConfig,
    LedgerIdentified,
    PlanCreated,
    PolicySignature,
)
from ledger.keys import fingerprint, generate_key_pair
from tests.helpers import forge, invoke, status_plan

PASS = [sys.executable, "-c", "print('{{\"passed\": true}}')"]
HOUR = timedelta(hours=1)


def copy_event(store: Store, event: RecordedEvent, stream: str | None = None) -> int:
    """Re-append ``event``'s payload, signatures and all, byte for byte, into ``stream``
    (its own by default), as the agent can. Returns the copy's position."""
    return forge(store, stream or event.stream, event.payload)[0]


def last(store: Store, stream: str) -> RecordedEvent:
    return store.read_stream(stream)[-1]


def replays(plane: Plane) -> dict[int, str]:
    """Where audit (with the plane's public key) names a replayed signature."""
    report = audit(
        plane.store, plane_public_key=load_or_create_plane_key(plane.store.url).public_key()
    )
    return {
        v.position: v.expected for v in report.violations if v.invariant == "replayed_signature"
    }


def gate_id(plane: Plane) -> str:
    (attached,) = [
        e
        for e in plane.store.read_all(types=["attachment.created"])
        if e.payload.validation == "status"
    ]
    return attached.payload.attachment_id


# -- the registry ---------------------------------------------------------------------


def test_a_detach_copied_into_the_gates_stream_detaches_nothing(
    db_url: str, tmp_path: Path
) -> None:
    with Plane.open(db_url) as plane:
        project = status_plan(plane, tmp_path, {}, execute=False)
        register_validation(plane, {"name": "lint", "mode": "informational", "command": PASS})
        other = attach(plane, "lint", resource=str(project))
        detach(plane, other.attachment_id, reason="not needed")
        gate = gate_id(plane)
        copied = copy_event(
            plane.store,
            last(plane.store, f"attachment:{other.attachment_id}"),
            f"attachment:{gate}",
        )
        plan = enter_execute(plane, "P-1")
        assert [(b.validation, b.mode) for b in plan.binding] == [("status", "required")]
        assert copied in replays(plane)


def test_an_old_registration_replayed_after_a_newer_one_replaces_nothing(
    db_url: str, tmp_path: Path
) -> None:
    with Plane.open(db_url) as plane:
        register_validation(plane, {"name": "gate", "mode": "informational", "command": PASS})
        first = last(plane.store, "tool:gate")
        register_validation(plane, {"name": "gate", "mode": "required", "command": PASS})
        copied = copy_event(plane.store, first)
        tool = plane.log().tool("gate")
        assert tool is not None and tool.version == 2 and tool.spec.mode == "required"
        assert copied in replays(plane)


def test_another_validations_registration_copied_into_a_pinned_gate_changes_nothing(
    db_url: str, tmp_path: Path
) -> None:
    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, {})  # Execute: status v1 pinned
        register_validation(plane, {"name": "always", "mode": "required", "command": PASS})
        forged = last(plane.store, "tool:always")
        copied = copy_event(plane.store, forged, "tool:status")
        spec = plane.log().tool_version("status", 1)
        assert spec is not None and spec.command != PASS
        tool = plane.log().tool("status")
        assert tool is not None and tool.version == 1
        report = validate_plan(plane, "P-1")  # status.txt says "bad": the real gate judges
        assert report.outcome != "pass"
        assert copied in replays(plane)


def test_replayed_skill_definitions_widen_no_skill(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        for name in ("read", "write", "delete"):
            register_tool(plane, {"name": name, "command": PASS})
        define_skill(plane, {"name": "editor", "members": ["read", "write", "delete"]})
        wide = last(plane.store, "skill:editor")
        define_skill(plane, {"name": "editor", "members": ["read"]})  # narrowed: version 2
        define_skill(plane, {"name": "admin", "members": ["read", "write", "delete"]})
        admin = last(plane.store, "skill:admin")
        older = copy_event(plane.store, wide)
        other = copy_event(plane.store, admin, "skill:editor")
        create_plan(plane, "P-1", project="p", resources=["repo:x"], skills=["editor"])
        record_strategy(plane, "P-1", "read only")
        plan = enter_execute(plane, "P-1")
        assert plan.skill_pins is not None
        assert plan.skill_pins["editor"].members == ["read"]
        found = replays(plane)
        assert older in found and other in found


# -- keys -----------------------------------------------------------------------------


def test_a_revoked_approver_key_stays_revoked(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, {"retry_limit": 0, "max_strategy_revisions": 0})
        registration = last(plane.store, "approver:alice")
        revoke_approver(plane, "alice", reason="left")
        copied = copy_event(plane.store, registration)
        assert plane.log().approver_keys()[registration.payload.fingerprint].status == "revoked"
        report = validate_plan(plane, "P-1")
        escalation = report.to_json()["escalation"]
        assert escalation is not None
        with pytest.raises(CommandRefused, match="revoked"):
            authorize(
                plane,
                escalation["decision_id"],
                tmp_path / "alice.key",
                choice="revise",
                guidance="write good",
            )
        assert copied in replays(plane)


def test_a_revoked_operator_key_stays_revoked(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Plane.open(db_url) as plane:
        register_tool(plane, {"name": "t", "command": PASS})  # bootstraps operator "operator"
        (first,) = plane.store.read_stream("approver:operator")
        generate_key_pair(tmp_path / "second.key")
        add_approver_key(plane, "second", tmp_path / "second.key.pub", role="operator")
        monkeypatch.setenv("EVIDENCE_OPERATOR_KEY", str(tmp_path / "second.key"))
        revoke_approver(plane, "operator", reason="rotated")
        copied = copy_event(plane.store, first)
        # Policy signed with the rotated-out key, as its holder (or a thief) would.
        monkeypatch.delenv("EVIDENCE_OPERATOR_KEY")
        with pytest.raises(CommandRefused, match="not an active operator key"):
            register_tool(plane, {"name": "u", "command": PASS})
        assert plane.log().tool("u") is None
        assert copied in replays(plane)


# -- credentials ----------------------------------------------------------------------


def _credential_plan(plane: Plane) -> None:
    create_plan(plane, "P-1", project="p", resources=["repo:x"])


def _issued(plane: Plane) -> tuple[IssuedCredential, RecordedEvent]:
    """Plan P-1 and an agent credential for it: the token and its signed issuance."""
    _credential_plan(plane)
    issued = issue_credential(plane, "P-1", ttl=HOUR)
    return issued, last(plane.store, f"credential:{issued.credential_id}")


def test_a_revoked_credential_copied_under_a_new_id_authenticates_nobody(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        issued, issuance = _issued(plane)
        revoke_credential(plane, issued.credential_id)
        new_id = "01J00000000000000000000001"
        copied = copy_event(plane.store, issuance, f"credential:{new_id}")
        secret = issued.token.rsplit("_", 1)[1]
        for token in (issued.token, f"evd_{new_id}_{secret}"):
            with pytest.raises(Unauthenticated):
                authenticate(plane, token)
        assert copied in replays(plane)


def test_a_credential_issuance_replayed_after_its_revocation_stays_revoked(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        issued, issuance = _issued(plane)
        revoke_credential(plane, issued.credential_id)
        copied = copy_event(plane.store, issuance)
        with pytest.raises(Unauthenticated, match="revoked"):
            authenticate(plane, issued.token)
        assert copied in replays(plane)


def test_the_service_refuses_a_revived_credential(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from starlette.testclient import TestClient

    from commands.service import create_app

    with Plane.open(sqlite_url) as plane:
        issued, issuance = _issued(plane)
        revoke_credential(plane, issued.credential_id)
        new_id = "01J00000000000000000000002"
        copy_event(plane.store, issuance, f"credential:{new_id}")
    secret = issued.token.rsplit("_", 1)[1]
    with TestClient(create_app(sqlite_url)) as client:
        for token in (issued.token, f"evd_{new_id}_{secret}"):
            answer = client.get("/v1/plan", headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code == 401, answer.text


# -- another plan, another ledger -----------------------------------------------------


def test_a_signed_weakening_plan_creation_cloned_into_another_plan_is_refused(
    db_url: str,
) -> None:
    with Plane.open(db_url) as plane:
        create_plan(
            plane, "P-1", project="p", resources=["repo:x"], config={"require_validation": False}
        )
        created = last(plane.store, "plan:P-1")
        copied = copy_event(plane.store, created, "plan:P-2")
        with pytest.raises(TamperedPlan):
            record_strategy(plane, "P-2", "no validation needed")
        assert copied in replays(plane)


def test_policy_signed_for_another_ledger_is_not_policy_here(db_url: str, tmp_path: Path) -> None:
    """Staging and production share the operator key (and, in this suite, the plane key
    too: the strongest case): staging's registration, copied to production at the very
    stream and version it was signed for, still names staging's ledger."""
    staging_url = f"sqlite:///{tmp_path / 'staging.db'}"
    with Plane.open(db_url) as production:
        register_tool(production, {"name": "t", "command": PASS})  # the same operator
        register_validation(
            production, {"name": "gate", "mode": "required", "command": [*PASS, "real"]}
        )
        with Plane.open(staging_url) as staging:
            register_tool(staging, {"name": "t", "command": PASS})
            register_validation(staging, {"name": "gate", "mode": "required", "command": PASS})
            register_validation(
                staging, {"name": "gate", "mode": "required", "command": [*PASS, "2"]}
            )
            v2 = last(staging.store, "tool:gate")
            identification = staging.store.read_stream("ledger")[0]
        copied = copy_event(production.store, v2)  # tool:gate v2, as signed
        copy_event(production.store, identification)
        tool = production.log().tool("gate")
        assert tool is not None and tool.version == 1
        assert production.log().identity() != staging_identity(staging_url)
        assert copied in replays(production)


def staging_identity(url: str) -> object:
    with Plane.open(url) as plane:
        return plane.log().identity()


# -- the CLI --------------------------------------------------------------------------


def test_audit_names_the_replay_from_the_cli(sqlite_url: str, tmp_path: Path) -> None:
    with Plane.open(sqlite_url) as plane:
        project = status_plan(plane, tmp_path, {}, execute=False)
        register_validation(plane, {"name": "lint", "mode": "informational", "command": PASS})
        other = attach(plane, "lint", resource=str(project))
        detach(plane, other.attachment_id)
        copy_event(
            plane.store,
            last(plane.store, f"attachment:{other.attachment_id}"),
            f"attachment:{gate_id(plane)}",
        )
        public = tmp_path / "plane.pub"
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        key = load_or_create_plane_key(plane.store.url).public_key()
        public.write_bytes(key.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    audited = invoke("audit", "--plane-key", str(public), "--db", sqlite_url)
    assert audited.exit_code == 1, audited.output
    assert "replayed_signature" in audited.stdout


# -- the signed message, byte for byte ------------------------------------------------


def test_a_third_party_recomputes_the_signed_message_from_the_docs(sqlite_url: str) -> None:
    """docs/events.md "Signed messages", followed with nothing but the standard library's
    JSON (sorted keys, no whitespace: RFC 8785 for these values) and raw Ed25519."""
    import base64
    import json

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    def jcs(value: object) -> bytes:
        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()

    def message(domain: str, type_name: str, place: dict, record: object) -> bytes:
        bound = {"ledger": place["ledger"], "record": record, "stream": place["stream"]}
        bound |= {"type": type_name, "version": place["version"]}
        return f"evidence-ledger/v2/{domain}/{type_name}\n".encode() + jcs(bound)

    with Plane.open(sqlite_url) as plane:
        register_tool(plane, {"name": "t", "command": PASS})
        identified, added, registered = plane.store.read_all()
        plane_key = load_or_create_plane_key(plane.store.url).public_key()
    ledger_id = identified.payload.ledger_id
    for event, place in (
        (identified, {"ledger": ledger_id, "stream": "ledger", "version": 1}),
        (added, added.to_json()["payload"]["place"]),
        (registered, registered.to_json()["payload"]["signed"]["place"]),
    ):
        assert place == {"ledger": ledger_id, "stream": event.stream, "version": 1}
    plane_key.verify(
        base64.b64decode(identified.payload.signature),
        message(
            "ledger",
            "ledger.identified",
            {"ledger": ledger_id, "stream": "ledger", "version": 1},
            {"ledger_id": ledger_id, "position": 1},
        ),
    )
    p = added.to_json()["payload"]
    plane_key.verify(
        base64.b64decode(p["endorsement"]),
        message(
            "operator",
            "approver_key.added",
            p["place"],
            {k: p[k] for k in ("fingerprint", "name", "public_key")},
        ),
    )
    operator = Ed25519PublicKey.from_public_bytes(base64.b64decode(p["public_key"]))
    record = registered.to_json()["payload"]
    signed = record.pop("signed")
    operator.verify(
        base64.b64decode(signed["signature"]),
        message("policy", "tool.registered", signed["place"], record),
    )


# -- rules that hold even for events signed where they stand --------------------------
# Each event below carries genuine signatures made for the very place it stands at (the
# test holds the operator's and the plane's keys, as no agent does): what keeps them out
# is a rule, not a signature.


def signed_here(
    plane: Plane, stream: str, payload: EventPayload, *, operator_name: str | None = None
) -> int:
    """``payload`` signed for the next version of ``stream`` as the plane would sign it
    (endorsed by the plane key if it is a key, signed by this process's operator key if
    it is policy: as ``operator_name``, else as the first operator), appended there past
    the plane. Returns its position."""
    identity = plane.log().identity()
    assert identity is not None
    place = Place(identity.ledger_id, stream, plane.store.stream_version(stream) + 1, "")
    place = place._replace(type=payload.type_name())
    if isinstance(payload, ApproverKeyAdded):
        payload = endorse_key(load_or_create_plane_key(plane.store.url), payload, place)
    if needs_operator(payload):
        key = load_or_create_operator_key(plane.store.url)
        assert key is not None
        operators = [k for k in plane.log().approver_keys().values() if k.role == "operator"]
        payload = msgspec.structs.replace(
            payload,
            signed=PolicySignature(
                operator=operator_name or operators[0].name,
                fingerprint=fingerprint(key.public_key()),
                signature=sign_record(key, policy_record(payload), domain="policy", place=place),
                place=place.stated(),
            ),
        )
    return forge(plane.store, stream, payload)[0]


def test_a_revoked_key_signed_in_again_stays_revoked(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, {})
        alice = last(plane.store, "approver:alice").payload
        revoke_approver(plane, "alice")
        again = key_registration("alice", alice.public_key, alice.fingerprint, "approver")
        position = signed_here(plane, "approver:alice", again)
        assert plane.log().approver_keys()[alice.fingerprint].status == "revoked"
        assert position in policy_problems(plane)


def test_a_credentials_secret_is_issued_under_one_id(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        issued, first_event = _issued(plane)
        first = first_event.payload
        new_id = "01J00000000000000000000004"
        reused = msgspec.structs.replace(first, credential_id=new_id, signed=msgspec.UNSET)
        position = signed_here(plane, f"credential:{new_id}", reused)
        secret = issued.token.rsplit("_", 1)[1]
        with pytest.raises(Unauthenticated):
            authenticate(plane, f"evd_{new_id}_{secret}")
        assert authenticate(plane, issued.token).credential_id == issued.credential_id
        assert position in replays(plane)


def test_an_event_stands_in_its_own_stream(db_url: str) -> None:
    """An issuance naming credential A, signed for credential B's stream: not B's."""
    with Plane.open(db_url) as plane:
        issued, issuance_event = _issued(plane)
        issuance = issuance_event.payload
        elsewhere = "01J00000000000000000000005"
        unsigned = msgspec.structs.replace(issuance, signed=msgspec.UNSET)
        position = signed_here(plane, f"credential:{elsewhere}", unsigned)
        secret = issued.token.rsplit("_", 1)[1]
        with pytest.raises(Unauthenticated):
            authenticate(plane, f"evd_{elsewhere}_{secret}")
        assert position in policy_problems(plane)


def test_a_registration_never_goes_back_a_version(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        register_validation(plane, {"name": "gate", "mode": "informational", "command": PASS})
        first = last(plane.store, "tool:gate").payload
        register_validation(plane, {"name": "gate", "mode": "required", "command": PASS})
        back = msgspec.structs.replace(first, signed=msgspec.UNSET)  # version 1 again
        signed_here(plane, "tool:gate", back)
        tool = plane.log().tool("gate")
        assert tool is not None and tool.version == 2 and tool.spec.mode == "required"


def test_a_copy_whose_stated_place_is_rewritten_does_not_verify(
    db_url: str, tmp_path: Path
) -> None:
    """The place is signed: staging's registration, copied to production's stream and
    version with its stated ledger rewritten to production's, breaks its signature."""
    staging_url = f"sqlite:///{tmp_path / 'staging.db'}"
    with Plane.open(db_url) as production:
        register_validation(
            production, {"name": "gate", "mode": "required", "command": [*PASS, "real"]}
        )
        with Plane.open(staging_url) as staging:
            register_validation(staging, {"name": "gate", "mode": "required", "command": PASS})
            register_validation(staging, {"name": "gate", "mode": "informational", "command": PASS})
            v2 = last(staging.store, "tool:gate").payload
        here = production.log().identity()
        assert here is not None and isinstance(v2.signed, PolicySignature)
        moved = msgspec.structs.replace(
            v2.signed, place=msgspec.structs.replace(v2.signed.place, ledger=here.ledger_id)
        )
        position = forge(production.store, "tool:gate", msgspec.structs.replace(v2, signed=moved))[
            0
        ]
        tool = production.log().tool("gate")
        assert tool is not None and tool.version == 1 and tool.spec.mode == "required"
        assert policy_problems(production)[position] == "policy_signature"


def policy_problems(plane: Plane) -> dict[int | None, str]:
    report = audit(
        plane.store, plane_public_key=load_or_create_plane_key(plane.store.url).public_key()
    )
    return {
        v.position: v.invariant
        for v in report.violations
        if v.invariant in ("policy_signature", "replayed_signature", "illegal_transition")
    }


def test_an_identification_the_plane_key_did_not_sign_names_nothing(
    db_url: str, tmp_path: Path
) -> None:
    """On a ledger not yet identified, the agent appends an identification of its own
    (naming staging's id), then staging's registration: neither counts."""
    staging_url = f"sqlite:///{tmp_path / 'staging.db'}"
    with Plane.open(staging_url) as staging:
        register_validation(staging, {"name": "gate", "mode": "required", "command": PASS})
        staging_id = staging.log().identity()
        registration = last(staging.store, "tool:gate")
    assert staging_id is not None
    with Plane.open(db_url) as plane:
        forge(
            plane.store,
            "ledger",
            LedgerIdentified(ledger_id=staging_id.ledger_id, position=1, signature="A" * 88),
        )
        register_tool(plane, {"name": "t", "command": PASS})  # the plane identifies it
        copy_event(plane.store, registration)
        identity = plane.log().identity()
        assert identity is not None and identity.ledger_id != staging_id.ledger_id
        assert plane.log().tool("gate") is None


def test_an_identification_copied_to_another_position_names_nothing(
    db_url: str, tmp_path: Path
) -> None:
    staging_url = f"sqlite:///{tmp_path / 'staging.db'}"
    with Plane.open(staging_url) as staging:
        register_validation(staging, {"name": "gate", "mode": "required", "command": PASS})
        identification = staging.store.read_stream("ledger")[0]
        staging_id = staging.log().identity()
    with Plane.open(db_url) as plane:
        create_plan(plane, "P-1", project="p", resources=["repo:x"])  # no signature yet
        position = copy_event(plane.store, identification)
        assert position > 1
        assert plane.log().identity() is None
        register_tool(plane, {"name": "t", "command": PASS})
        assert plane.log().identity() != staging_id
        assert position in replays(plane)


def test_policy_signed_by_a_rotated_out_operator_key_is_nobodys(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first operator's key is rotated out; then it signs a credential's issuance,
    for the very place it stands at: nobody's (issue 41)."""
    with Plane.open(db_url) as plane:
        _credential_plan(plane)
        issue_credential(plane, "P-1", ttl=HOUR)  # bootstraps operator "operator"
        generate_key_pair(tmp_path / "second.key")
        add_approver_key(plane, "second", tmp_path / "second.key.pub", role="operator")
        monkeypatch.setenv("EVIDENCE_OPERATOR_KEY", str(tmp_path / "second.key"))
        revoke_approver(plane, "operator", reason="rotated")
        monkeypatch.delenv("EVIDENCE_OPERATOR_KEY")  # the rotated-out key signs again
        credential = "01J00000000000000000000006"
        secret = "s" * 43
        issued = CredentialIssued(
            credential_id=credential,
            plan_id="P-1",
            secret_sha256=hashlib.sha256(secret.encode()).hexdigest(),
            expires_at="2099-01-01T00:00:00.000000Z",
        )
        position = signed_here(plane, f"credential:{credential}", issued, operator_name="operator")
        with pytest.raises(Unauthenticated):
            authenticate(plane, f"evd_{credential}_{secret}")
        assert policy_problems(plane)[position] == "policy_signature"


def test_a_credential_signed_in_again_after_its_revocation_stays_revoked(db_url: str) -> None:
    """Even an issuance an operator signs for the next place of a revoked credential's
    stream revives nothing: a credential is issued once (issue 41)."""
    with Plane.open(db_url) as plane:
        _credential_plan(plane)
        issued = issue_credential(plane, "P-1", ttl=HOUR)
        stream = f"credential:{issued.credential_id}"
        issuance = last(plane.store, stream).payload
        revoke_credential(plane, issued.credential_id)
        signed_here(plane, stream, msgspec.structs.replace(issuance, signed=msgspec.UNSET))
        with pytest.raises(Unauthenticated, match="revoked"):
            authenticate(plane, issued.token)


def test_an_unsigned_plan_without_confinement_is_refused(db_url: str) -> None:
    """The agent's own plan.created with confinement: none weakens a gate: policy, and
    unsigned, so the plane acts on no such plan (issue 41)."""
    with Plane.open(db_url) as plane:
        forge(
            plane.store,
            "plan:P-9",
            PlanCreated(
                plan_id="P-9",
                project="p",
                resources=["repo:x"],
                global_config=GlobalConfig(confinement="none"),
            ),
        )
        with pytest.raises(TamperedPlan, match="operator"):
            record_strategy(plane, "P-9", "run my tools unconfined")
