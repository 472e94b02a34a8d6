"""No bypass: every Apply rests on verified evidence, and the plane decides from the log.

Each test is an attack the agent can mount — it holds the database file, calls the
Python API and runs every agent-side verb, but holds no human's private key — run on a
real SQLite file and on the real PostgreSQL. Each ends with the plan unapplied (or the
step refused, nothing appended), and ``evidence audit`` naming what was forged.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import msgspec
import pytest
import sqlalchemy as sa

from commands.auditor.audit import audit
from commands.plane import CommandRefused, Plane
from commands.plane.attachments import attach, detach
from commands.plane.authority import TamperedPlan
from commands.plane.gates import gate_input
from commands.plane.lifecycle import (
    add_approver_key,
    apply_plan,
    authorize,
    pending_decisions,
    record_fix,
)
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_validation
from commands.plane.runs import call_tool, record_halt
from commands.plane.validation_runs import validate_plan
from commands.rules.signing import decision_record, load_or_create_plane_key, sign_record
from commands.runner.sandbox import encode_trees
from ledger.bundle import load_bundle, write_bundle
from ledger.events import (
    DecisionRecorded,
    ExecuteEntered,
    PlanApplied,
    StrategyRevisionRequested,
    TokenConsumed,
    TokenMinted,
    ValidationResultRecorded,
    ValidationRunCompleted,
    ValidationRunStarted,
)
from ledger.keys import generate_key_pair, load_private_key
from projections.states import to_json
from tests.helpers import forge, forged_halt, invoke, status_plan, work

ESCALATE_AT_ONCE = {"retry_limit": 0, "max_strategy_revisions": 0}


@pytest.fixture
def plane(db_url: str):
    with Plane.open(db_url) as p:
        yield p


def _types(plane: Plane, plan_id: str = "P-1") -> list[str]:
    return [e.type for e in plane.store.read_stream(f"plan:{plan_id}")]


def _invariants_at(plane: Plane, position: int) -> set[str]:
    return {v.invariant for v in audit(plane.store).violations if v.position == position}


def _escalated(plane: Plane, tmp_path: Path, plan_id: str = "P-1") -> str:
    report = validate_plan(plane, plan_id)
    assert report.outcome == "escalate", report.to_json()
    return report.to_json()["escalation"]["decision_id"]


# -- 1. the binding set is pinned ---------------------------------------------------------


def test_detaching_the_failing_attachment_does_not_unbind_it(plane: Plane, tmp_path: Path) -> None:
    status_plan(plane, tmp_path, {})
    assert validate_plan(plane, "P-1").outcome == "blocker"
    [attachment] = plane.state("plan:P-1").doc.binding
    detach(plane, attachment.attachment_id, reason="in the way")
    record_fix(plane, "P-1", "nothing really")
    report = validate_plan(plane, "P-1")
    assert report.outcome == "blocker" and report.token is None
    assert [r.validation for r in report.results] == ["status"]
    assert "plan.token_minted" not in _types(plane)
    assert audit(plane.store).ok


def test_reregistering_as_informational_binds_later_plans_only(
    plane: Plane, tmp_path: Path
) -> None:
    status_plan(plane, tmp_path, {})
    register_validation(
        plane,
        {
            "name": "status",
            "mode": "informational",
            "command": [sys.executable, str(tmp_path / "check.py")],
        },
    )
    report = validate_plan(plane, "P-1")
    assert report.outcome == "blocker" and report.token is None
    [result] = report.results
    assert result.mode == "required"
    [member] = report.resolved
    assert (member.validation_version, member.mode) == (1, "required")
    # A plan entering Execute now binds version 2, informational.
    create_plan(plane, "P-2", project="api", resources=[str(tmp_path / "proj")])
    record_strategy(plane, "P-2", "later")
    doc = enter_execute(plane, "P-2")
    assert [(b.validation_version, b.mode) for b in doc.binding] == [(2, "informational")]
    assert audit(plane.store).ok


def test_a_strategy_revision_keeps_every_member_and_adds_new_ones(
    plane: Plane, tmp_path: Path
) -> None:
    project = status_plan(plane, tmp_path, {"retry_limit": 0, "max_strategy_revisions": 1})
    [pinned] = plane.state("plan:P-1").doc.binding
    detach(plane, pinned.attachment_id)
    register_validation(
        plane,
        {
            "name": "other",
            "mode": "required",
            "command": [sys.executable, str(tmp_path / "check.py")],
        },
    )
    attach(plane, "other", resource=str(project))
    assert validate_plan(plane, "P-1").to_json()["strategy_revision"] == 1
    record_strategy(plane, "P-1", "second strategy")
    doc = enter_execute(plane, "P-1")
    assert sorted(b.validation for b in doc.binding) == ["other", "status"]
    assert doc.binding[1] == pinned  # unchanged
    assert audit(plane.store).ok


def test_a_forged_smaller_binding_set_is_refused_and_audited(plane: Plane, tmp_path: Path) -> None:
    """A first Execute well formed in every other way (its snapshot recorded): only the
    plane's own check of the binding set against the registry can refuse it."""
    status_plan(plane, tmp_path, {}, execute=False)
    snapshot = plane.store.put_blob(encode_trees({}))
    [at] = forge(
        plane.store,
        "plan:P-1",
        ExecuteEntered(plan_id="P-1", revision=0, snapshot_sha256=snapshot),
    )
    before = plane.store.head().size
    with pytest.raises(TamperedPlan, match=f"position {at}.*every attachment that applied"):
        validate_plan(plane, "P-1")
    assert plane.store.head().size == before
    assert _invariants_at(plane, at) == {"binding"}


# -- 2. no vacuous pass -------------------------------------------------------------------


def test_a_run_with_no_required_validation_mints_no_token(plane: Plane) -> None:
    create_plan(plane, "P-1", project="api", resources=["repo:api"])
    record_strategy(plane, "P-1", "nothing attached")
    enter_execute(plane, "P-1")
    report = validate_plan(plane, "P-1")
    assert (report.outcome, report.raw_halt_type) == ("validator_error", "no_required_validation")
    assert report.token is None and "attach" in report.reason
    assert "plan.token_minted" not in _types(plane)
    assert audit(plane.store).ok


def test_only_an_explicit_opt_out_passes_an_empty_set_and_it_is_marked(plane: Plane) -> None:
    create_plan(
        plane, "P-1", project="api", resources=["repo:api"], config={"require_validation": False}
    )
    record_strategy(plane, "P-1", "nothing attached, on purpose")
    enter_execute(plane, "P-1")
    report = validate_plan(plane, "P-1")
    assert report.outcome == "pass" and report.token
    doc = apply_plan(plane, "P-1", report.token)
    assert doc.terminal == "applied" and doc.unvalidated is True
    completed = next(
        e.payload
        for e in plane.store.read_stream("plan:P-1")
        if isinstance(e.payload, ValidationRunCompleted)
    )
    assert completed.vacuous is True
    report = audit(plane.store)
    assert report.ok and report.unvalidated == ["P-1"]
    shown = invoke("audit", "--db", plane.store.url)
    assert shown.exit_code == 0 and "applied UNVALIDATED" in shown.stdout


def test_a_forged_vacuous_pass_is_audited(plane: Plane, tmp_path: Path) -> None:
    """A run with no required member and a token, written past the plane."""
    create_plan(plane, "P-1", project="api", resources=["repo:api"])
    record_strategy(plane, "P-1", "s")
    enter_execute(plane, "P-1")
    run_id = "01J0000000000000000000000V"
    positions = forge(
        plane.store,
        "plan:P-1",
        ValidationRunStarted(plan_id="P-1", run_id=run_id, attempt=1, revision=0, resolved=[]),
        ValidationRunCompleted(
            plan_id="P-1",
            run_id=run_id,
            attempt=1,
            outcome="pass",
            rules_version=2,
            results_digest="0" * 64,
            vacuous=True,
        ),
        TokenMinted(
            plan_id="P-1",
            token_id="01J0000000000000000000000T",
            token_sha256="0" * 64,
            attempt=1,
            run_id=run_id,
            results_digest="0" * 64,
            issued_at="2026-01-01T00:00:00Z",
            expires_at="2026-01-01T01:00:00Z",
            signature=base64.b64encode(b"\0" * 64).decode(),
        ),
    )
    load_or_create_plane_key(plane.store.url)
    found = {
        (v.position, v.invariant)
        for v in audit(
            plane.store, plane_public_key=load_or_create_plane_key(plane.store.url).public_key()
        ).violations
    }
    assert (positions[1], "outcome_drift") in found
    assert (positions[2], "no_vacuous_pass") in found
    assert (positions[2], "token_signature") in found


# -- 3. every escalate halt is a pending decision ------------------------------------------


def test_an_escalate_halt_is_a_pending_decision(plane: Plane, tmp_path: Path) -> None:
    status_plan(plane, tmp_path, {})
    halt = record_halt(plane, "P-1", "needs_decision", "the agent asks a human")
    assert halt.halt_type == "escalate" and "evidence authorize" in (halt.hint or "")
    [pending] = pending_decisions(plane)
    assert _types(plane)[-2:] == ["plan.escalated", "plan.halted"]
    (work(plane) / "status.txt").write_text("good\n")
    before = plane.store.head().size
    for step in (
        lambda: validate_plan(plane, "P-1"),
        lambda: record_fix(plane, "P-1", "sneak a fix in"),
        lambda: call_tool(plane, "P-1", "status", b"{}"),
        lambda: gate_input(plane, "P-1", "status", b"{}"),
    ):
        with pytest.raises(CommandRefused, match="human decision"):
            step()
    assert plane.store.head().size == before
    authorize(plane, pending.decision_id, tmp_path / "alice.key", choice="revise", guidance="go on")
    assert plane.state("plan:P-1").doc.phase == "strategize"
    with pytest.raises(CommandRefused, match="cannot be terminal"):
        record_halt(plane, "P-1", "escalated", "x", terminal=True)
    assert audit(plane.store).ok


def test_a_halt_escalating_without_a_decision_is_audited(plane: Plane, tmp_path: Path) -> None:
    status_plan(plane, tmp_path, {})
    [at] = forge(plane.store, "plan:P-1", forged_halt())
    assert "illegal_transition" in _invariants_at(plane, at)
    with pytest.raises(TamperedPlan):
        validate_plan(plane, "P-1")


# -- 5. decisions are verified wherever they are used --------------------------------------


def _forged_decision(plane: Plane, decision_id: str, **changes: object) -> DecisionRecorded:
    escalated = next(e for e in plane.store.read_stream("plan:P-1") if e.type == "plan.escalated")
    decision = DecisionRecorded(
        plan_id="P-1",
        decision_id=decision_id,
        choice="revise",
        guidance="just go",
        escalation_hash=escalated.leaf_hash.hex(),
        signed_at="2026-11-30T00:00:00Z",
        approver="alice",
        key_fingerprint=next(iter(plane.state("approver:alice").doc.keys)),
        signature=base64.b64encode(b"\1" * 64).decode(),
    )
    return msgspec.structs.replace(decision, **changes)


def _signed_by(key_file: Path, decision: DecisionRecorded) -> DecisionRecorded:
    """The decision, signed as ``authorize`` signs it, with the key in ``key_file``."""
    record = decision_record(
        decision.decision_id,
        decision.plan_id,
        decision.choice,
        decision.guidance,
        decision.escalation_hash,
        decision.signed_at,
        decision.reason,
    )
    return msgspec.structs.replace(
        decision, signature=sign_record(load_private_key(key_file), record, domain="decision")
    )


def test_a_decision_with_a_random_signature_is_not_acted_on(plane: Plane, tmp_path: Path) -> None:
    status_plan(plane, tmp_path, ESCALATE_AT_ONCE)
    decision_id = _escalated(plane, tmp_path)
    [at] = forge(plane.store, "plan:P-1", _forged_decision(plane, decision_id))
    before = plane.store.head().size
    with pytest.raises(TamperedPlan, match="signature"):
        record_strategy(plane, "P-1", "carry on as if decided")
    assert plane.store.head().size == before
    assert "decision_signature" in _invariants_at(plane, at)
    refused = invoke("plan", "strategize", "P-1", "--strategy", "x", "--db", plane.store.url)
    assert refused.exit_code == 2 and refused.stderr.count("error:") == 1
    assert "Traceback" not in refused.output and "decision" in refused.stderr
    # The bundle's audit finds it too.
    bundle = tmp_path / "p.bundle"
    write_bundle(
        plane.store,
        bundle,
        key=load_or_create_plane_key(plane.store.url),
        origin="test",
        plan="P-1",
    )
    loaded = load_bundle(bundle)
    assert loaded.report.ok
    assert at in {
        v.position for v in audit(loaded).violations if v.invariant == "decision_signature"
    }


def test_a_signature_copied_from_another_decision_is_not_acted_on(
    plane: Plane, tmp_path: Path
) -> None:
    status_plan(plane, tmp_path, ESCALATE_AT_ONCE)
    # A real decision on another plan, by alice.
    create_plan(
        plane, "P-2", project="api", resources=[str(tmp_path / "proj")], config=ESCALATE_AT_ONCE
    )
    record_strategy(plane, "P-2", "s")
    enter_execute(plane, "P-2")
    other = _escalated(plane, tmp_path, "P-2")
    real = authorize(plane, other, tmp_path / "alice.key", choice="revise", guidance="go")
    decision_id = _escalated(plane, tmp_path)
    transplanted = _forged_decision(
        plane,
        decision_id,
        signature=real.signature,
        signed_at=real.signed_at,
        guidance=real.guidance,
    )
    [at] = forge(plane.store, "plan:P-1", transplanted)
    with pytest.raises(TamperedPlan, match="signature"):
        validate_plan(plane, "P-1")
    assert "decision_signature" in _invariants_at(plane, at)


def test_a_reason_changed_after_signing_breaks_the_signature(plane: Plane, tmp_path: Path) -> None:
    status_plan(plane, tmp_path, ESCALATE_AT_ONCE)
    decision_id = _escalated(plane, tmp_path)
    signed = _signed_by(
        tmp_path / "alice.key", _forged_decision(plane, decision_id, reason="ok for staging only")
    )
    [at] = forge(
        plane.store, "plan:P-1", msgspec.structs.replace(signed, reason="ok for production")
    )
    assert "decision_signature" in _invariants_at(plane, at)
    with pytest.raises(TamperedPlan):
        record_strategy(plane, "P-1", "x")


def test_a_properly_signed_decision_forged_in_is_accepted(plane: Plane, tmp_path: Path) -> None:
    """The control: a decision signed by alice's key, appended by anyone, is alice's."""
    status_plan(plane, tmp_path, ESCALATE_AT_ONCE)
    decision_id = _escalated(plane, tmp_path)
    signed = _signed_by(tmp_path / "alice.key", _forged_decision(plane, decision_id, reason="fine"))
    forge(plane.store, "plan:P-1", signed)
    assert record_strategy(plane, "P-1", "as alice decided").phase == "strategize"
    assert audit(plane.store).ok


def test_a_revoked_key_cannot_decide_later(plane: Plane, tmp_path: Path) -> None:
    from commands.plane.lifecycle import revoke_approver

    status_plan(plane, tmp_path, ESCALATE_AT_ONCE)
    decision_id = _escalated(plane, tmp_path)
    revoke_approver(plane, "alice")
    [at] = forge(
        plane.store,
        "plan:P-1",
        _signed_by(tmp_path / "alice.key", _forged_decision(plane, decision_id)),
    )
    assert "decision_signature" in _invariants_at(plane, at)


# -- 4. the plane decides from the log: read models are caches -----------------------------


def _rm_tables(plane: Plane) -> list[str]:
    return sorted(
        t for t in sa.inspect(plane.store.engine).get_table_names() if t.startswith("rm_")
    )


def _scenario(plane: Plane, work: Path) -> list[str]:
    """The same agent and human steps, whatever the read models say."""
    steps = []

    def attempt(name: str, step) -> None:
        try:
            step()
            steps.append(f"{name}: done")
        except CommandRefused as exc:
            steps.append(f"{name}: refused ({type(exc).__name__})")

    report = validate_plan(plane, "P-1")
    steps.append(report.outcome)
    decision_id = report.to_json()["escalation"]["decision_id"]
    if not (work / "mallory.key").exists():
        generate_key_pair(work / "mallory.key")
    attempt(
        "mallory decides",
        lambda: authorize(plane, decision_id, work / "mallory.key", choice="abandon"),
    )
    attempt("fix while pending", lambda: record_fix(plane, "P-1", "sneak"))
    attempt(
        "alice decides",
        lambda: authorize(
            plane, decision_id, work / "alice.key", choice="revise", guidance="try again"
        ),
    )
    attempt("strategy", lambda: record_strategy(plane, "P-1", "again"))
    attempt("execute", lambda: enter_execute(plane, "P-1"))
    steps.append(validate_plan(plane, "P-1").outcome)
    return steps


def test_no_decision_changes_when_every_read_model_is_edited(db_url: str, tmp_path: Path) -> None:
    clean_dir = tmp_path / "clean"
    clean_dir.mkdir()
    with Plane.open(f"sqlite:///{clean_dir / 'clean.db'}") as clean:
        status_plan(clean, clean_dir, ESCALATE_AT_ONCE)
        expected = _scenario(clean, clean_dir)
        assert expected[:3] == [
            "escalate",
            "mallory decides: refused (CommandRefused)",
            "fix while pending: refused (CommandRefused)",
        ]
        clean_types = _types(clean)
    with Plane.open(db_url) as plane:
        work = tmp_path / "tampered"
        work.mkdir()
        status_plan(plane, work, ESCALATE_AT_ONCE)
        generate_key_pair(work / "mallory.key")
        mallory = load_private_key(work / "mallory.key")
        from ledger.keys import fingerprint, public_key_b64

        tables = _rm_tables(plane)
        assert {"rm_plans", "rm_attachments", "rm_approvers", "rm_tools"} <= set(tables)
        with plane.store.engine.begin() as conn:
            for table in tables:  # delete every row of every read model …
                conn.execute(sa.text(f"DELETE FROM {table}"))
            # … and insert lies: mallory's key as alice's, a plan in Apply.
            doc = {
                "name": "alice",
                "keys": {
                    fingerprint(mallory): {
                        "public_key": public_key_b64(mallory),
                        "status": "active",
                    }
                },
            }
            conn.execute(
                sa.text(
                    "INSERT INTO rm_approvers (key, stream_version, position, "
                    "doc) VALUES ('alice', 1, 1, :d)"
                ),
                {"d": json.dumps(doc).encode()},
            )
        assert _scenario(plane, work) == expected
        assert [t for t in _types(plane)] == clean_types
        report = audit(plane.store)
        assert not report.ok
        assert {v.invariant for v in report.violations} == {"read_model"}


def test_resetting_the_plans_read_model_does_not_allow_a_second_apply(
    plane: Plane, tmp_path: Path
) -> None:
    status_plan(plane, tmp_path, {})
    (work(plane) / "status.txt").write_text("good\n")
    token = validate_plan(plane, "P-1").token
    assert token
    apply_plan(plane, "P-1", token)
    row = plane.projections.document("plans", "P-1")
    assert row is not None
    stored = to_json(row[0])  # the read model's row holds the plain document
    reset = {
        **stored,
        "terminal": None,
        "phase": "execute",
        "token": {**stored["token"], "status": "minted"},
    }
    with plane.store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE rm_plans SET doc = :d WHERE key = 'P-1'"),
            {"d": json.dumps(reset).encode()},
        )
    before = plane.store.head().size
    with pytest.raises(CommandRefused, match="has ended"):
        apply_plan(plane, "P-1", token)
    assert plane.store.head().size == before
    assert {v.invariant for v in audit(plane.store).violations} == {"read_model"}


# -- 6. evidence is complete --------------------------------------------------------------


def _drop_blob_guard(plane: Plane) -> None:
    with plane.store.engine.begin() as conn:
        if plane.store.backend == "sqlite":
            conn.execute(sa.text("DROP TRIGGER blobs_no_delete"))
        else:
            conn.execute(sa.text("DROP TRIGGER blobs_append_only ON blobs"))


def test_apply_refuses_when_the_evidence_of_its_run_is_gone(plane: Plane, tmp_path: Path) -> None:
    status_plan(plane, tmp_path, {})
    (work(plane) / "status.txt").write_text("good\n")
    report = validate_plan(plane, "P-1")
    [result] = report.results
    assert result.raw_output_sha256 and report.token
    _drop_blob_guard(plane)
    with plane.store.engine.begin() as conn:
        conn.execute(
            sa.text("DELETE FROM blobs WHERE digest = :d"), {"d": result.raw_output_sha256}
        )
    with pytest.raises(CommandRefused, match="evidence"):
        apply_plan(plane, "P-1", report.token)
    minted_at = next(
        e.position for e in plane.store.read_stream("plan:P-1") if e.type == "plan.token_minted"
    )
    assert "evidence" in _invariants_at(plane, minted_at)


# -- 7/8. forged transitions ---------------------------------------------------------------


def test_a_forged_strategy_revision_does_not_buy_retries(plane: Plane, tmp_path: Path) -> None:
    status_plan(plane, tmp_path, {"retry_limit": 3, "max_strategy_revisions": 1})
    assert validate_plan(plane, "P-1").outcome == "blocker"
    [at] = forge(
        plane.store,
        "plan:P-1",
        StrategyRevisionRequested(
            plan_id="P-1", revision=1, reason="fresh budget please", failed_attempts=1
        ),
    )
    assert "illegal_transition" in _invariants_at(plane, at)
    with pytest.raises(TamperedPlan, match="strategy revision follows 4 failed"):
        record_strategy(plane, "P-1", "again")


def test_a_forged_apply_chain_without_the_plane_key_is_audited(
    plane: Plane, tmp_path: Path
) -> None:
    """A whole passing run, a token and Apply written past the plane: the transitions are
    legal, but no plane key signed the token."""
    project = status_plan(plane, tmp_path, {})
    doc = plane.state("plan:P-1").doc
    [member] = doc.binding
    run_id = "01J0000000000000000000000F"
    result = ValidationResultRecorded(
        plan_id="P-1",
        run_id=run_id,
        attachment_id=member.attachment_id,
        validation="status",
        mode="required",
        verdict=True,
        started_at="2026-11-30T00:00:00Z",
        ended_at="2026-11-30T00:00:01Z",
        duration_ms=1000,
    )
    from commands.rules.verdicts import results_digest

    digest = results_digest([result])
    token_id = "01J0000000000000000000000K"
    positions = forge(
        plane.store,
        "plan:P-1",
        ValidationRunStarted(
            plan_id="P-1", run_id=run_id, attempt=1, revision=0, resolved=[_resolved(member)]
        ),
        result,
        ValidationRunCompleted(
            plan_id="P-1",
            run_id=run_id,
            attempt=1,
            outcome="pass",
            rules_version=2,
            results_digest=digest,
        ),
        TokenMinted(
            plan_id="P-1",
            token_id=token_id,
            token_sha256="0" * 64,
            attempt=1,
            run_id=run_id,
            results_digest=digest,
            issued_at="2026-11-30T00:00:00Z",
            expires_at="2026-11-30T01:00:00Z",
            signature=base64.b64encode(b"\2" * 64).decode(),
        ),
        TokenConsumed(plan_id="P-1", token_id=token_id),
        PlanApplied(plan_id="P-1", token_id=token_id),
    )
    key = load_or_create_plane_key(plane.store.url).public_key()
    found = {(v.position, v.invariant) for v in audit(plane.store, plane_public_key=key).violations}
    assert (positions[3], "token_signature") in found
    result_cli = invoke("audit", "--db", plane.store.url)
    assert result_cli.exit_code == 1 and "token_signature" in result_cli.output
    assert (project / "status.txt").read_text() == "bad\n"


def _resolved(member: dict):
    from ledger.events import ResolvedAttachment

    return msgspec.convert(member, ResolvedAttachment)


def test_a_token_consumed_as_a_streams_first_event_is_a_finding(plane: Plane) -> None:
    [at] = forge(plane.store, "plan:X", TokenConsumed(plan_id="X", token_id="t"))
    report = audit(plane.store)
    [violation] = [
        v for v in report.violations if v.position == at and v.invariant == "illegal_transition"
    ]
    assert "plan.created is a plan's first event" in violation.expected
    result = invoke("audit", "--db", plane.store.url)
    assert result.exit_code == 1 and "illegal_transition" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


# -- approvers are the operator's: the plane key endorses each one ---------------------------


def test_an_approver_key_registered_past_the_plane_is_nobodys(plane: Plane, tmp_path: Path) -> None:
    """The agent appends its own key as an approver (it has no plane key to endorse it
    with), then signs a decision with it."""
    from ledger.events import ApproverKeyAdded
    from ledger.keys import fingerprint, public_key_b64

    status_plan(plane, tmp_path, ESCALATE_AT_ONCE)
    decision_id = _escalated(plane, tmp_path)
    generate_key_pair(tmp_path / "mallory.key")
    mallory = load_private_key(tmp_path / "mallory.key")
    print_ = fingerprint(mallory)
    [added] = forge(
        plane.store,
        "approver:mallory",
        ApproverKeyAdded(
            name="mallory",
            public_key=public_key_b64(mallory),
            fingerprint=print_,
            endorsement=base64.b64encode(b"\3" * 64).decode(),
        ),
    )
    with pytest.raises(CommandRefused, match="no registered approver"):
        authorize(plane, decision_id, tmp_path / "mallory.key", choice="revise", guidance="mine")
    escalated = next(e for e in plane.store.read_stream("plan:P-1") if e.type == "plan.escalated")
    record = decision_record(
        decision_id, "P-1", "revise", "mine", escalated.leaf_hash.hex(), "2026-11-30T00:00:00Z"
    )
    [at] = forge(
        plane.store,
        "plan:P-1",
        DecisionRecorded(
            plan_id="P-1",
            decision_id=decision_id,
            choice="revise",
            guidance="mine",
            escalation_hash=escalated.leaf_hash.hex(),
            signed_at="2026-11-30T00:00:00Z",
            approver="mallory",
            key_fingerprint=print_,
            signature=sign_record(mallory, record, domain="decision"),
        ),
    )
    with pytest.raises(TamperedPlan, match="registered key"):
        record_strategy(plane, "P-1", "as mallory decided")
    found = {
        (v.position, v.invariant)
        for v in audit(plane.store, plane_public_key=plane.plane_public_key()).violations
    }
    assert {(added, "approver_endorsement"), (at, "decision_signature")} <= found
    # The operator's own registration (it holds the plane key) is endorsed and audits clean.
    generate_key_pair(tmp_path / "bob.key")
    add_approver_key(plane, "bob", tmp_path / "bob.key.pub")
    endorsements = [
        v.position
        for v in audit(plane.store, plane_public_key=plane.plane_public_key()).violations
        if v.invariant == "approver_endorsement"
    ]
    assert endorsements == [added]


def test_resolve_shows_the_pinned_set_next_to_todays_resolution(
    plane: Plane, tmp_path: Path
) -> None:
    project = status_plan(plane, tmp_path, {})
    [pinned] = plane.state("plan:P-1").doc.binding
    detach(plane, pinned.attachment_id)
    result = invoke(
        "resolve", "--resource", str(project), "--plan", "P-1", "--json", "--db", plane.store.url
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["attachments"] == []  # detached: later plans are not bound by it
    assert [p["attachment_id"] for p in shown["pinned"]] == [pinned.attachment_id]
    table = invoke("resolve", "--resource", str(project), "--plan", "P-1", "--db", plane.store.url)
    assert "binding set, pinned at Execute (1)" in table.stdout
    assert pinned.attachment_id in table.stdout


# -- a token does not outlive what it was minted on ------------------------------------------


def test_a_halt_after_a_pass_supersedes_its_token(plane: Plane, tmp_path: Path) -> None:
    status_plan(plane, tmp_path, {})
    (work(plane) / "status.txt").write_text("good\n")
    token = validate_plan(plane, "P-1").token
    assert token
    record_halt(plane, "P-1", "validation_failed", "the orchestrator saw it break")
    with pytest.raises(CommandRefused, match="moved on"):
        apply_plan(plane, "P-1", token)
    assert audit(plane.store).ok


def test_a_token_minted_past_the_plane_is_refused_by_the_plane(
    plane: Plane, tmp_path: Path
) -> None:
    """After the plane's genuine passing run and token, a second token for the same run,
    minted past the plane (legal by the rules: only its signature gives it away). The
    plane refuses the plan at that mint itself, not only audit."""
    status_plan(plane, tmp_path, {})
    (work(plane) / "status.txt").write_text("good\n")
    assert validate_plan(plane, "P-1").token
    minted = next(
        e.payload for e in plane.store.read_stream("plan:P-1") if isinstance(e.payload, TokenMinted)
    )
    forged = msgspec.structs.replace(
        minted,
        token_id="01J0000000000000000000000F",
        signature=base64.b64encode(b"\0" * 64).decode(),
    )
    [at] = forge(plane.store, "plan:P-1", forged)
    with pytest.raises(TamperedPlan, match=f"position {at}.*signed by the plane key"):
        plane.state("plan:P-1")
    public = load_or_create_plane_key(plane.store.url).public_key()
    found = {v.invariant for v in audit(plane.store, plane_public_key=public).violations}
    assert "token_signature" in found


def test_a_replayed_mint_does_not_revive_a_superseded_token(plane: Plane, tmp_path: Path) -> None:
    """The plane's genuine passing run and token, copied after a fix superseded them."""
    status_plan(plane, tmp_path, {})
    (work(plane) / "status.txt").write_text("good\n")
    token = validate_plan(plane, "P-1").token
    assert token
    record_fix(plane, "P-1", "one more change")  # the token is superseded
    stream = plane.store.read_stream("plan:P-1")
    run = [
        e.payload
        for e in stream
        if e.type
        in (
            "validation.run_started",
            "validation.result_recorded",
            "validation.run_completed",
            "plan.token_minted",
        )
    ]
    run_id = "01J0000000000000000000000Z"
    replayed = [msgspec.structs.replace(p, run_id=run_id) for p in run]
    positions = forge(plane.store, "plan:P-1", *replayed)
    with pytest.raises(TamperedPlan, match="minted once"):
        apply_plan(plane, "P-1", token)
    assert "ordering" in _invariants_at(plane, positions[-1])
