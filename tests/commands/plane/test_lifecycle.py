"""Failure handling, signed human decisions, tokens and Apply (seeds 000 and 001):
fix -> revalidate -> retry limit -> strategy revision -> escalation -> decision."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from commands.plane import CommandRefused, Plane
from commands.plane.lifecycle import (
    add_approver_key,
    apply_plan,
    authorize,
    pending_decisions,
    record_fix,
    revoke_approver,
)
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan, get_plan
from commands.plane.validation_runs import validate_plan
from commands.rules.signing import load_or_create_plane_key, mint_token, plane_key_path
from ledger.keys import generate_key_pair
from tests.helpers import assert_refused, run_cli, status_plan, work


@pytest.fixture
def setup(db_url: str, tmp_path: Path):
    with Plane.open(db_url) as plane:
        project = status_plan(plane, tmp_path, {"retry_limit": 1, "max_strategy_revisions": 1})
        yield plane, project, tmp_path


def _types(plane: Plane, after: int) -> list[str]:
    return [e.type for e in plane.store.read_stream("plan:P-1") if e.position > after]


def _escalate(plane: Plane) -> str:
    """Fail, fix, fail (retry_limit 1: one fix-then-revalidate cycle), revise; fail, fix,
    fail again: the plane escalates, and that run's outcome is escalate."""
    assert validate_plan(plane, "P-1").outcome == "blocker"
    record_fix(plane, "P-1", "tried something")
    report = validate_plan(plane, "P-1")
    assert report.outcome == "blocker" and report.to_json()["strategy_revision"] == 1
    assert get_plan(plane, "P-1").phase == "strategize"
    with pytest.raises(CommandRefused, match="only in Execute"):
        validate_plan(plane, "P-1")  # past the retry limit: refused until a revision
    record_strategy(plane, "P-1", "a second strategy")
    enter_execute(plane, "P-1")
    assert get_plan(plane, "P-1").retries_used == 0  # a fresh budget
    assert validate_plan(plane, "P-1").outcome == "blocker"
    with pytest.raises(CommandRefused, match="record the fix"):
        validate_plan(plane, "P-1")  # steps 2-3: a fix between two validations
    record_fix(plane, "P-1", "tried something else")
    report = validate_plan(plane, "P-1")
    assert report.outcome == "escalate"
    escalation = report.to_json()["escalation"]
    assert escalation is not None and escalation["options"] == ["revise", "abandon"]
    return escalation["decision_id"]


def test_the_full_failure_sequence_ends_in_terminal_failure(setup) -> None:
    plane, _project, tmp = setup
    start = plane.store.head().size
    decision_id = _escalate(plane)
    types = _types(plane, start)
    assert types.count("plan.attempt_failed") == 4
    assert types.count("plan.strategy_revision_requested") == 1
    assert types[-2:] == ["plan.escalated", "plan.halted"]
    halt = plane.store.read_stream("plan:P-1")[-1].payload
    assert (halt.halt_type, halt.raw_halt_type) == ("escalate", "escalated")
    assert [p.decision_id for p in pending_decisions(plane)] == [decision_id]
    with pytest.raises(CommandRefused, match="awaits a human decision"):
        validate_plan(plane, "P-1")
    authorize(plane, decision_id, tmp / "alice.key", choice="abandon", reason="not worth it")
    assert get_plan(plane, "P-1").terminal == "failed"
    with pytest.raises(CommandRefused, match="has ended"):
        validate_plan(plane, "P-1")


def test_escalate_revise_pass_token_apply(setup) -> None:
    plane, _project, tmp = setup
    decision_id = _escalate(plane)
    decided = authorize(
        plane, decision_id, tmp / "alice.key", choice="revise", guidance="check status.txt"
    )
    assert decided.approver == "alice" and len(decided.signature) > 40
    doc = get_plan(plane, "P-1")
    assert (doc.phase, doc.guidance, doc.retries_used) == ("strategize", "check status.txt", 0)
    record_strategy(plane, "P-1", "write good")
    enter_execute(plane, "P-1")
    (work(plane) / "status.txt").write_text("good\n")
    record_fix(plane, "P-1", "status is good now")
    report = validate_plan(plane, "P-1")
    assert report.outcome == "pass" and report.token
    stream = plane.store.read_stream("plan:P-1")
    decision_at = next(e.position for e in stream if e.type == "plan.decision_recorded")
    minted_at = [e.position for e in stream if e.type == "plan.token_minted"]
    assert minted_at and all(p > decision_at for p in minted_at)  # never with the escalation
    applied = apply_plan(plane, "P-1", report.token)
    assert applied.terminal == "applied" and applied.token.status == "consumed"
    with pytest.raises(CommandRefused, match="has ended"):
        apply_plan(plane, "P-1", report.token)


def _passing(setup) -> tuple[Plane, str]:
    plane, _project, _tmp = setup
    (work(plane) / "status.txt").write_text("good\n")
    report = validate_plan(plane, "P-1")
    assert report.outcome == "pass"
    return plane, report.token


def test_tokens_are_single_use_and_only_one_concurrent_apply_wins(setup) -> None:
    plane, token = _passing(setup)
    results: list[str] = []

    def go() -> None:
        try:
            apply_plan(plane, "P-1", token)
            results.append("applied")
        except CommandRefused as exc:
            results.append(str(exc))

    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("applied") == 1
    assert (
        sum(1 for e in plane.store.read_stream("plan:P-1") if e.type == "plan.token_consumed") == 1
    )


@pytest.mark.parametrize("case", ["other_plan", "expired", "forged", "superseded", "garbage"])
def test_bad_tokens_are_refused(setup, case: str) -> None:
    plane, token = _passing(setup)
    key = load_or_create_plane_key(plane.store.url)
    now = datetime.now(UTC)
    claims = {
        "token_id": "01J0000000000000000000000T",
        "plan_id": "P-1",
        "attempt": 1,
        "results_digest": "0" * 64,
        "issued_at": (now - timedelta(hours=2)).isoformat().replace("+00:00", "Z"),
        "expires_at": (now - timedelta(hours=1)).isoformat().replace("+00:00", "Z"),
    }
    if case == "other_plan":
        create_plan(plane, "P-2", project="api", resources=["repo:x"])
        bad, target, fragment = token, "P-2", "plan"
    elif case == "expired":
        bad, target, fragment = mint_token(key, **claims), "P-1", "expired"
    elif case == "forged":
        head, body, sig = token.split(".")
        flipped = sig[:-2] + ("A" if sig[-2] != "A" else "B") + sig[-1]
        bad, target, fragment = f"{head}.{body}.{flipped}", "P-1", "signature"
    elif case == "superseded":
        record_fix(plane, "P-1", "one more change")  # the evidence moved on
        bad, target, fragment = token, "P-1", "moved on"
    else:
        bad, target, fragment = "not-a-token", "P-1", "token refused"
    before = plane.store.head().size
    with pytest.raises(CommandRefused, match=fragment):
        apply_plan(plane, target, bad)
    assert plane.store.head().size == before


def test_decisions_need_a_registered_unrevoked_key_and_a_pending_escalation(setup) -> None:
    plane, _project, tmp = setup
    with pytest.raises(CommandRefused, match="no pending escalation"):
        authorize(plane, "01J00000000000000000000000", tmp / "alice.key", choice="abandon")
    decision_id = _escalate(plane)
    generate_key_pair(tmp / "mallory.key")
    with pytest.raises(CommandRefused, match="no registered approver"):
        authorize(plane, decision_id, tmp / "mallory.key", choice="abandon")
    # The plane's own key (the agent side can reach it) cannot decide either.
    load_or_create_plane_key(plane.store.url)
    plane_key = plane_key_path(plane.store.url)
    with pytest.raises(CommandRefused, match="no registered approver"):
        authorize(plane, decision_id, plane_key, choice="abandon")
    revoke_approver(plane, "alice", reason="left")
    with pytest.raises(CommandRefused, match="revoked"):
        authorize(plane, decision_id, tmp / "alice.key", choice="abandon")
    generate_key_pair(tmp / "bob.key")
    add_approver_key(plane, "bob", tmp / "bob.key.pub")
    authorize(plane, decision_id, tmp / "bob.key", choice="abandon")
    with pytest.raises(CommandRefused, match="no pending escalation"):
        authorize(plane, decision_id, tmp / "bob.key", choice="abandon")  # already decided


def test_cli(setup, db_url: str) -> None:
    plane, _project, tmp = setup
    (work(plane) / "status.txt").write_text("good\n")
    out = run_cli("validate", "P-1", "--db", db_url)
    assert out.returncode == 0, out.stderr
    token = next(
        line.split(" ", 1)[1] for line in out.stdout.splitlines() if line.startswith("token: ")
    )
    assert_refused(run_cli("apply", "P-1", "--token", "nope", "--db", db_url), "token refused")
    applied = run_cli("apply", "P-1", "--token", token, "--db", db_url)
    assert applied.returncode == 0 and "applied" in applied.stdout
    assert_refused(run_cli("apply", "P-1", "--token", token, "--db", db_url), "has ended")
    listed = run_cli("authorize", "--db", db_url, "--json")
    assert listed.returncode == 0 and '"decisions":[]' in listed.stdout
    gen = run_cli("keys", "generate", "--out", str(tmp / "carol.key"))
    assert gen.returncode == 0 and (tmp / "carol.key.pub").exists()
    assert (tmp / "carol.key").stat().st_mode & 0o777 == 0o600
    assert (
        run_cli("keys", "add", "carol", str(tmp / "carol.key.pub"), "--db", db_url).returncode == 0
    )
    assert_refused(
        run_cli(
            "authorize",
            "01J00000000000000000000000",
            "--key",
            str(tmp / "carol.key"),
            "--abandon",
            "--db",
            db_url,
        ),
        "no pending escalation",
    )
    assert_refused(
        run_cli(
            "authorize",
            "01J00000000000000000000000",
            "--key",
            str(tmp / "carol.key"),
            "--db",
            db_url,
        ),
        "exactly one",
    )
