"""Policy has owners: registrations, attachments, detachments, skills, approver keys and
gate-weakening plan settings are signed by an operator key the plane key endorsed. The
agent being gated holds neither: with its own key every policy command is refused, and
what it appends past the plane through the public `Store` API is ignored by the plane
and reported by `audit` (`policy_signature`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from commands.auditor.audit import audit
from commands.plane import CommandRefused, Plane
from commands.plane.attachments import attach, detach
from commands.plane.lifecycle import authorize, revoke_approver
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import define_skill, register_tool, register_validation
from commands.plane.validation_runs import validate_plan
from commands.rules.signing import OPERATOR_KEY_ENV, load_or_create_plane_key
from ledger.events import (
    ApproverKeyRevoked,
    AttachmentCreated,
    AttachmentDetached,
    GlobalConfig,
    PlanCreated,
    SkillDefined,
    ValidationRegistered,
)
from ledger.keys import generate_key_pair
from tests.helpers import forge, invoke, status_plan, work

PASS = [sys.executable, "-c", "print('{{\"passed\": true}}')"]


@pytest.fixture
def as_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Switch this process to the agent's own key (it never holds the operator's)."""

    def switch() -> None:
        monkeypatch.setenv(OPERATOR_KEY_ENV, str(tmp_path / "agent-operator.key"))

    return switch


def _policy_violations(plane: Plane) -> list[str]:
    report = audit(
        plane.store, plane_public_key=load_or_create_plane_key(plane.store.url).public_key()
    )
    return [v.expected for v in report.violations if v.invariant == "policy_signature"]


def test_the_first_policy_bootstraps_the_operator_and_signs(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        register_validation(plane, {"name": "gate", "mode": "required", "command": PASS})
        events = list(plane.store.read_all())
        assert [e.type for e in events] == [
            "ledger.identified",
            "approver_key.added",
            "validation.registered",
        ]
        assert events[1].payload.role == "operator"
        assert events[2].payload.signed.operator == events[1].payload.name
        assert _policy_violations(plane) == []


@pytest.mark.parametrize(
    "attempt",
    ["register", "attach", "detach", "revoke", "skill", "weaken"],
)
def test_with_its_own_key_the_agent_changes_no_policy(
    db_url: str, tmp_path: Path, as_agent, attempt: str
) -> None:
    with Plane.open(db_url) as plane:
        project = status_plan(plane, tmp_path, {}, execute=False)
        define_skill(plane, {"name": "reader", "members": ["status"]})
        [attached] = [
            e.payload.attachment_id
            for e in plane.store.read_all()
            if isinstance(e.payload, AttachmentCreated)
        ]
        before = plane.store.head().size
        as_agent()
        with pytest.raises(CommandRefused, match="no operator's of this ledger"):
            if attempt == "register":
                register_validation(plane, {"name": "status", "mode": "required", "command": PASS})
            elif attempt == "attach":
                attach(plane, "status", resource=str(project), args={})
            elif attempt == "detach":
                detach(plane, attached)
            elif attempt == "revoke":
                revoke_approver(plane, "alice")
            elif attempt == "skill":
                define_skill(plane, {"name": "reader", "members": ["status"], "description": "x"})
            else:
                create_plan(
                    plane,
                    "P-2",
                    project="api",
                    resources=[str(project)],
                    config={"require_validation": False},
                )
        assert plane.store.head().size == before


def test_a_forged_always_pass_registration_is_ignored_and_audited(
    db_url: str, tmp_path: Path
) -> None:
    """Before Execute the agent appends version 2 of the operator's required validation,
    an always-pass program, straight into the database."""
    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, {}, execute=False)
        real = plane.log().tool("status")
        assert real is not None
        forged = ValidationRegistered(
            **{
                **{f: getattr(real.spec, f) for f in ("mode", "executor")},
                "name": "status",
                "version": 2,
                "command": PASS,
                "output_schema": real.spec.output_schema,
            }
        )
        forge(plane.store, "tool:status", forged)
        assert plane.log().tool("status").version == 1  # the plane does not see it
        doc = enter_execute(plane, "P-1")
        assert [b.validation_version for b in doc.binding] == [1]
        report = validate_plan(plane, "P-1")
        assert report.outcome == "blocker"  # the operator's check ran: status is bad
        assert any("carries an operator's signature" in v for v in _policy_violations(plane))


def test_forged_detach_and_attach_change_no_binding(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        project = status_plan(plane, tmp_path, {}, execute=False)
        register_validation(plane, {"name": "mine", "mode": "required", "command": PASS})
        [attached] = [
            e.payload for e in plane.store.read_all() if isinstance(e.payload, AttachmentCreated)
        ]
        forge(
            plane.store,
            f"attachment:{attached.attachment_id}",
            AttachmentDetached(attachment_id=attached.attachment_id),
        )
        mine = AttachmentCreated(
            attachment_id="01JZZZZZZZZZZZZZZZZZZZZZZZ",
            validation="mine",
            validation_version=1,
            resource=str(project),
            scope="direct",
            args_sha256=attached.args_sha256,
        )
        forge(plane.store, f"attachment:{mine.attachment_id}", mine)
        doc = enter_execute(plane, "P-1")
        assert [b.validation for b in doc.binding] == ["status"]
        (work(plane) / "status.txt").write_text("bad\n")
        assert validate_plan(plane, "P-1").outcome == "blocker"
        assert len(_policy_violations(plane)) == 2


def test_a_forged_revocation_does_not_silence_the_human(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, {"retry_limit": 0, "max_strategy_revisions": 0})
        approver = plane.log().approver_keys()
        [fp] = [f for f, k in approver.items() if k.name == "alice"]
        forge(plane.store, "approver:alice", ApproverKeyRevoked(name="alice", fingerprint=fp))
        assert plane.log().approver_keys()[fp].status == "active"
        report = validate_plan(plane, "P-1")  # status is bad: escalates (no budgets)
        assert report.outcome == "escalate"
        decision_id = plane.state("plan:P-1").doc.pending_decision.decision_id
        decided = authorize(plane, decision_id, tmp_path / "alice.key", choice="abandon")
        assert decided.approver == "alice"
        assert any("approver_key.revoked" in v for v in _policy_violations(plane))


def test_a_forged_skill_redefinition_does_not_widen_a_plan(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        register_tool(
            plane, {"name": "read", "command": ["true"], "input_schema": {"type": "object"}}
        )
        register_tool(
            plane, {"name": "write", "command": ["true"], "input_schema": {"type": "object"}}
        )
        define_skill(plane, {"name": "reader", "members": ["read"]})
        create_plan(plane, "P-1", project="api", resources=["repo:api"], skills=["reader"])
        forge(
            plane.store,
            "skill:reader",
            SkillDefined(name="reader", version=2, members=["read", "write"]),
        )
        record_strategy(plane, "P-1", "read")
        doc = enter_execute(plane, "P-1")
        assert doc.may_call("read") and not doc.may_call("write")
        assert len(_policy_violations(plane)) == 1


def test_an_unsigned_weakening_plan_is_refused_by_the_plane(db_url: str, tmp_path: Path) -> None:
    """The agent appends its own plan with `require_validation: false` past the plane."""
    with Plane.open(db_url) as plane:
        project = status_plan(plane, tmp_path, {}, execute=False)
        forge(
            plane.store,
            "plan:P-9",
            PlanCreated(
                plan_id="P-9",
                project="api",
                resources=[str(project)],
                global_config=GlobalConfig(require_validation=False),
            ),
        )
        with pytest.raises(CommandRefused, match="operator's signature"):
            record_strategy(plane, "P-9", "skip the gate")
        assert _policy_violations(plane)


def test_the_operator_may_weaken_a_plan_and_it_is_signed(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        created = create_plan(
            plane,
            "P-1",
            project="api",
            resources=["repo:api"],
            config={"require_validation": False},
        )
        assert not created.global_config.require_validation
        [event] = [e for e in plane.store.read_stream("plan:P-1")]
        assert event.payload.signed is not None
        assert _policy_violations(plane) == []


def test_keys_revoke_needs_the_operator_key_from_the_cli(
    db_url: str, tmp_path: Path, as_agent
) -> None:
    with Plane.open(db_url) as plane:
        generate_key_pair(tmp_path / "bob.key")
        url = plane.store.url
    added = invoke("keys", "add", "bob", str(tmp_path / "bob.key.pub"), "--db", url)
    assert added.exit_code == 0, added.output
    as_agent()
    revoked = invoke("keys", "revoke", "bob", "--db", url)
    assert revoked.exit_code == 2 and revoked.stderr.count("error:") == 1, revoked.output
    assert "no operator's of this ledger" in revoked.stderr


def test_an_upstream_cannot_take_another_servers_name(db_url: str) -> None:
    """The proxy registers a server's tools with its upstream as their source; another
    upstream naming itself the same (`--server files`) cannot re-register them with a
    looser schema."""
    from commands.plane.proxy import UpstreamTool, register_upstream_tools

    strict = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    with Plane.open(db_url) as plane:
        done = register_upstream_tools(
            plane, "files", [UpstreamTool("read", strict)], upstream="npx server-filesystem /srv"
        )
        assert done.names == {"read": "files.read"}
        with pytest.raises(CommandRefused, match="belongs to another upstream"):
            register_upstream_tools(
                plane,
                "files",
                [UpstreamTool("read", {"type": "object"})],
                upstream="python evil.py",
            )
        assert plane.log().tool("files.read").version == 1
        again = register_upstream_tools(
            plane, "files", [UpstreamTool("read", strict)], upstream="npx server-filesystem /srv"
        )
        assert again.names == {"read": "files.read"}  # the same upstream: unchanged


def test_an_upstream_tool_named_like_a_plane_verb_is_not_offered(db_url: str) -> None:
    from commands.plane.proxy import UpstreamTool, register_upstream_tools

    with Plane.open(db_url) as plane:
        done = register_upstream_tools(
            plane,
            "srv",
            [
                UpstreamTool("evidence.authorize", {"type": "object"}),
                UpstreamTool("ok", {"type": "object"}),
            ],
            upstream="python srv.py",
        )
        assert list(done.names) == ["ok"] and "evidence.authorize" in done.refused


@pytest.mark.parametrize("given", [{}, {"type": "object"}, True])
def test_a_callers_output_schema_never_widens_the_registrys(db_url: str, given: object) -> None:
    """`call --output-schema '{}'` (or the proxy's `_meta`, a plan step's `output`) over a
    tool whose registered output schema the output deviates from: still a deviation."""
    from commands.plane.runs import call_tool

    with Plane.open(db_url) as plane:
        register_tool(
            plane,
            {
                "name": "count",
                "command": ["python", "-c", 'print(\'{{"n": "many"}}\')'],
                "input_schema": {"type": "object"},
                "output_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
            },
        )
        create_plan(plane, "P-1", project="api", resources=["repo:api"], config={})
        record_strategy(plane, "P-1", "count")
        enter_execute(plane, "P-1")
        report = call_tool(plane, "P-1", "count", {}, output_schema=given)
        assert not report.ok
        assert [d.kind for d in report.output_gate.check.deviations] == ["wrong_type"]
        narrowed = call_tool(
            plane,
            "P-1",
            "count",
            {},
            output_schema={"type": "object", "properties": {"n": {"const": 1}}},
        )
        assert not narrowed.ok  # the registry's check fails first; narrowing adds, never removes


def _forged_registration(plane: Plane, tmp_path: Path, key_file: Path, fingerprint: str, who: str):  # type: ignore[no-untyped-def]
    """Version 2 of `status` as an always-pass program, signed with ``key_file`` under
    the name ``who`` and the key id ``fingerprint``."""
    import msgspec

    from commands.rules.signing import policy_record, sign_record
    from ledger.events import PolicySignature
    from ledger.keys import load_private_key

    real = plane.log().tool("status")
    assert real is not None
    forged = ValidationRegistered(
        name="status",
        version=2,
        mode=real.spec.mode,
        executor=real.spec.executor,
        command=PASS,
        output_schema=real.spec.output_schema,
    )
    signature = sign_record(load_private_key(key_file), policy_record(forged), domain="policy")
    return msgspec.structs.replace(
        forged, signed=PolicySignature(operator=who, fingerprint=fingerprint, signature=signature)
    )


def test_policy_signed_with_an_approvers_key_is_nobodys(db_url: str, tmp_path: Path) -> None:
    """Alice may decide escalations; her key signs no policy."""
    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, {}, execute=False)
        [(fp, _key)] = [(f, k) for f, k in plane.log().approver_keys().items() if k.name == "alice"]
        forge(
            plane.store,
            "tool:status",
            _forged_registration(plane, tmp_path, tmp_path / "alice.key", fp, "alice"),
        )
        assert plane.log().tool("status").version == 1
        assert any("endorsed key of operator 'alice'" in v for v in _policy_violations(plane))


def test_policy_with_a_signature_that_does_not_verify_is_nobodys(
    db_url: str, tmp_path: Path
) -> None:
    """The real operator's key id and name over a signature made with another key."""
    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, {}, execute=False)
        [(fp, op)] = [
            (f, k) for f, k in plane.log().approver_keys().items() if k.role == "operator"
        ]
        generate_key_pair(tmp_path / "mallory.key")
        forged = _forged_registration(plane, tmp_path, tmp_path / "mallory.key", fp, op.name)
        forge(plane.store, "tool:status", forged)
        assert plane.log().tool("status").version == 1
        assert any("operator signature verifies" in v for v in _policy_violations(plane))


def test_an_operator_key_decides_no_escalation(db_url: str, tmp_path: Path) -> None:
    """Policy keys and decision keys are different roles: the operator's key file, used
    as an approver's, is refused."""
    from commands.rules.signing import operator_key_path

    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, {"retry_limit": 0, "max_strategy_revisions": 0})
        assert validate_plan(plane, "P-1").outcome == "escalate"
        decision_id = plane.state("plan:P-1").doc.pending_decision.decision_id
        with pytest.raises(CommandRefused):
            authorize(plane, decision_id, operator_key_path(plane.store.url), choice="abandon")
        assert plane.state("plan:P-1").doc.pending_decision is not None


def test_audit_of_a_bundle_reports_unsigned_policy(db_url: str, tmp_path: Path) -> None:
    """An auditor holding only a bundle and the plane's public key sees the forgery."""
    import json

    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from ledger.bundle import write_bundle

    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, {}, execute=False)
        alice = next(f for f, k in plane.log().approver_keys().items() if k.name == "alice")
        forged = _forged_registration(plane, tmp_path, tmp_path / "alice.key", alice, "alice")
        forge(plane.store, "tool:status", forged)
        keys = generate_key_pair(tmp_path / "bundle.key")
        write_bundle(plane.store, tmp_path / "all.bundle", key=keys.private_key, origin="o")
        public = load_or_create_plane_key(plane.store.url).public_key()
    pub_file = tmp_path / "plane-for-the-auditor.pub"  # what the auditor keeps
    pub_file.write_bytes(public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    nowhere = f"sqlite:///{tmp_path / 'absent.db'}"
    audited = invoke(
        "audit",
        "--bundle",
        str(tmp_path / "all.bundle"),
        "--plane-key",
        str(pub_file),
        "--json",
        "--db",
        nowhere,
    )
    assert audited.exit_code == 1, audited.output
    found = [v["invariant"] for v in json.loads(audited.stdout)["violations"]]
    assert found == ["policy_signature"]
