"""Apply decides from the log, whatever the token says, and an Apply under way is final.

The agent holds the database file and can append past the plane; here it even holds a
token signed with the real plane key (as one leaked from the plane would be). Apply
still re-checks, from the log, in its deciding transaction, the run the token names
(``passing_run_problem``): every required member of the binding set passed, at least
one ran (no vacuous pass unless the plan opted out), and the results hash to the token's
digest. On a real SQLite file and on the real PostgreSQL.

And once Apply's change set is recorded (the point of no return), only Apply's
completion may follow: the plane refuses every other verb on the plan, ``audit`` reports
the unfinished Apply, and ``apply --resume`` finishes it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest
from ulid import ULID

from commands.auditor.audit import audit
from commands.plane import CommandRefused, Plane
from commands.plane.authority import TamperedPlan
from commands.plane.lifecycle import apply_plan, complete_apply, record_fix
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.runs import call_tool, record_halt
from commands.plane.validation_runs import validate_plan
from commands.rules.signing import (
    load_or_create_plane_key,
    mint_token,
    read_token,
    token_digest,
    token_signature,
)
from commands.rules.verdicts import results_digest
from ledger.events import (
    AttemptFailed,
    EventPayload,
    PlanApplied,
    TokenConsumed,
    TokenMinted,
    ValidationResultRecorded,
    ValidationRunCompleted,
    ValidationRunStarted,
)
from ledger.keys import public_key_b64
from ledger.timestamps import rfc3339
from projections.outcomes import RULES_VERSION
from tests.helpers import forge, invoke, status_plan, work


@pytest.fixture
def plane(db_url: str):
    with Plane.open(db_url) as p:
        yield p


def _last_run(plane: Plane, plan_id: str = "P-1") -> tuple[ValidationRunStarted, list]:
    events = [e.payload for e in plane.store.read_stream(f"plan:{plan_id}")]
    started = [p for p in events if isinstance(p, ValidationRunStarted)][-1]
    results = [
        p for p in events if isinstance(p, ValidationResultRecorded) and p.run_id == started.run_id
    ]
    return started, results


def _forge_a_pass(
    plane: Plane,
    judged: ValidationRunStarted,
    results: list[ValidationResultRecorded],
    plan_id: str = "P-1",
    *,
    signed_over: list[ValidationResultRecorded] | None = None,
) -> str:
    """Append past the plane a run over the trees ``judged`` judged, with ``results``,
    recorded as a pass, and a token for it signed with the real plane key (over the
    digest of ``signed_over``, the run's results unless given). Returns the token."""
    doc = plane.state(f"plan:{plan_id}").doc
    run_id = str(ULID())
    started = msgspec.structs.replace(judged, run_id=run_id, attempt=doc.attempt)
    mine = [msgspec.structs.replace(r, run_id=run_id) for r in results]
    claimed = [msgspec.structs.replace(r, run_id=run_id) for r in signed_over or results]
    digest = results_digest(claimed)
    completed = ValidationRunCompleted(
        plan_id=plan_id,
        run_id=run_id,
        attempt=doc.attempt,
        outcome="pass",
        rules_version=RULES_VERSION,
        results_digest=digest,
        vacuous=not any(r.mode == "required" for r in mine),
    )
    now = datetime.now(UTC)
    claims = {
        "token_id": str(ULID()),
        "plan_id": plan_id,
        "attempt": doc.attempt,
        "results_digest": digest,
        "issued_at": rfc3339(now - timedelta(seconds=1)),
        "expires_at": rfc3339(now + timedelta(hours=1)),
        "trees_sha256": judged.trees_sha256,
    }
    token = mint_token(load_or_create_plane_key(plane.store.url), **claims)
    minted = TokenMinted(
        run_id=run_id, token_sha256=token_digest(token), signature=token_signature(token), **claims
    )
    payloads: list[EventPayload] = [started, *mine, completed, minted]
    forge(plane.store, f"plan:{plan_id}", *payloads)
    return token


# -- Apply's own INV1 re-check ---------------------------------------------------------------


def test_a_plane_signed_token_over_a_failed_required_validation_is_refused(
    plane: Plane, tmp_path: Path
) -> None:
    project = status_plan(plane, tmp_path, {})
    (work(plane) / "status.txt").write_text("worse\n")
    assert validate_plan(plane, "P-1").outcome == "blocker"
    record_fix(plane, "P-1", "nothing, really")  # the agent's own verb: legal
    judged, results = _last_run(plane)
    assert [r.verdict for r in results] == [False]
    token = _forge_a_pass(plane, judged, results)
    before = plane.store.head().size
    with pytest.raises(CommandRefused, match=r"required validation\(s\) status have no passing"):
        apply_plan(plane, "P-1", token)
    assert plane.store.head().size == before
    assert (project / "status.txt").read_text() == "bad\n"
    assert plane.state("plan:P-1").doc.terminal is None


def test_a_plane_signed_token_over_a_vacuous_run_is_refused(plane: Plane, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "app.py").write_text("print('old')\n")
    create_plan(plane, "P-1", project="api", resources=[str(project)])  # nothing attached
    record_strategy(plane, "P-1", "nothing to check")
    enter_execute(plane, "P-1")
    (work(plane) / "app.py").write_text("print('unchecked')\n")
    report = validate_plan(plane, "P-1")
    assert (report.outcome, report.raw_halt_type) == ("validator_error", "no_required_validation")
    judged, results = _last_run(plane)
    assert judged.resolved == [] and results == []
    token = _forge_a_pass(plane, judged, results)
    before = plane.store.head().size
    with pytest.raises(CommandRefused, match="no required validation ran"):
        apply_plan(plane, "P-1", token)
    assert plane.store.head().size == before
    assert (project / "app.py").read_text() == "print('old')\n"


def test_a_token_of_an_attempt_a_forged_failure_moved_past_is_refused(
    plane: Plane, tmp_path: Path
) -> None:
    """After a real pass the agent appends a failed attempt of its own (a blocker's
    `plan.attempt_failed`): the plan moves to the next attempt, yet the token stays
    minted, since no run, fix, call, halt or decision came. Apply's own re-check still
    refuses it: a token stands for its run at its attempt only."""
    project = status_plan(plane, tmp_path, {})
    (work(plane) / "status.txt").write_text("good\n")
    report = validate_plan(plane, "P-1")
    assert report.outcome == "pass" and report.token
    doc = plane.state("plan:P-1").doc
    failed = AttemptFailed(
        plan_id="P-1",
        attempt=doc.attempt,
        iteration=doc.iteration,
        failure_class="validation",
        reason="the agent's own",
    )
    forge(plane.store, "plan:P-1", failed)
    moved = plane.state("plan:P-1").doc
    # what makes the re-check reachable: the attempt moved, the token was not superseded
    assert moved.attempt == doc.attempt + 1 and moved.token.status == "minted"
    before = plane.store.head().size
    with pytest.raises(CommandRefused, match="last run at its current attempt"):
        apply_plan(plane, "P-1", report.token)
    assert plane.store.head().size == before
    assert (project / "status.txt").read_text() == "bad\n"
    assert plane.state("plan:P-1").doc.token.status == "minted"


def test_a_plane_signed_token_over_other_results_is_refused(plane: Plane, tmp_path: Path) -> None:
    """The log's run says pass, but the token (plane-signed) binds other results: the
    ones the run really had. Apply applies only results its token binds."""
    project = status_plan(plane, tmp_path, {})
    (work(plane) / "status.txt").write_text("worse\n")
    assert validate_plan(plane, "P-1").outcome == "blocker"
    record_fix(plane, "P-1", "nothing, really")
    judged, results = _last_run(plane)
    passed = [msgspec.structs.replace(r, verdict=True) for r in results]
    token = _forge_a_pass(plane, judged, passed, signed_over=results)
    with pytest.raises(CommandRefused, match="do not hash to the token's results digest"):
        apply_plan(plane, "P-1", token)
    assert (project / "status.txt").read_text() == "bad\n"


def test_the_results_digest_binds_every_verdict_input() -> None:
    """What a token binds (INV1): each field a verdict was made of, in any order."""
    base = ValidationResultRecorded(
        plan_id="P-1",
        run_id="R",
        attachment_id="A1",
        validation="check",
        mode="required",
        verdict=True,
        raw_output_sha256="ab" * 32,
        started_at="2026-01-01T00:00:00Z",
        ended_at="2026-01-01T00:00:00Z",
        duration_ms=1,
    )
    other = msgspec.structs.replace(base, attachment_id="A2", validation="lint")
    digest = results_digest([base, other])
    assert results_digest([other, base]) == digest
    assert len(digest) == 64 and int(digest, 16) >= 0
    for change in (
        {"attachment_id": "A3"},
        {"validation": "other"},
        {"mode": "informational"},
        {"verdict": False},
        {"verdict": None, "cause": "timeout"},
        {"cause": "timeout"},
        {"raw_output_sha256": "cd" * 32},
        {"raw_output_sha256": None},
    ):
        changed = msgspec.structs.replace(base, **change)
        assert results_digest([changed, other]) != digest, change
    # what is not a verdict's input (timing, the run id) is not bound
    moved = msgspec.structs.replace(base, run_id="R2", duration_ms=99)
    assert results_digest([moved, other]) == digest


# -- plan.applied follows a recorded change set ----------------------------------------------


def test_a_forged_apply_without_a_change_set_is_refused_and_audited(
    plane: Plane, tmp_path: Path
) -> None:
    """A real token from a real pass, consumed and "applied" past the plane with no
    change set: nothing was written, and the plan must not read as applied."""
    project = status_plan(plane, tmp_path, {})
    (work(plane) / "status.txt").write_text("good\n")
    report = validate_plan(plane, "P-1")
    assert report.outcome == "pass" and report.token
    token_id = read_token(report.token).token_id
    consumed, applied = forge(
        plane.store,
        "plan:P-1",
        TokenConsumed(plan_id="P-1", token_id=token_id),
        PlanApplied(plan_id="P-1", token_id=token_id, changed_paths=[f"{project}/status.txt"]),
    )
    with pytest.raises(TamperedPlan) as refused:
        plane.state("plan:P-1")
    assert refused.value.position == applied
    assert "Apply completes the change set recorded with its consumed token" in refused.value.rule
    with pytest.raises(TamperedPlan):
        complete_apply(plane, "P-1")
    assert (project / "status.txt").read_text() == "bad\n"
    key_file = tmp_path / "plane.pub"
    key_file.write_text(public_key_b64(load_or_create_plane_key(plane.store.url)))
    shown = invoke("audit", "--plane-key", str(key_file), "--json", "--db", plane.store.url)
    assert shown.exit_code == 1, shown.output
    found = {(v["position"], v["invariant"]) for v in json.loads(shown.stdout)["violations"]}
    assert (applied, "illegal_transition") in found, found
    assert consumed < applied


# -- an Apply under way: only its completion follows -------------------------------------------


class _Interrupted(Exception):
    pass


def _stop_after(step: str):
    def progress(now: str) -> None:
        if now == step:
            raise _Interrupted(step)

    return progress


def test_an_interrupted_apply_admits_only_its_completion(plane: Plane, tmp_path: Path) -> None:
    project = status_plan(plane, tmp_path, {})
    sandbox = work(plane)
    (sandbox / "status.txt").write_text("good\n")
    report = validate_plan(plane, "P-1")
    assert report.outcome == "pass" and report.token
    with pytest.raises(_Interrupted):
        apply_plan(plane, "P-1", report.token, progress=_stop_after("changes_recorded"))
    assert plane.state("plan:P-1").doc.applying is not None
    assert (project / "status.txt").read_text() == "bad\n"

    # The plane itself refuses every other verb, and appends nothing.
    before = plane.store.head().size
    for verb in (
        lambda: record_fix(plane, "P-1", "one more thing"),
        lambda: validate_plan(plane, "P-1"),
        lambda: call_tool(plane, "P-1", "status", b"{}"),
        lambda: record_halt(plane, "P-1", "validation_failed", "changed my mind"),
    ):
        with pytest.raises(CommandRefused, match="Apply began"):
            verb()
    assert plane.store.head().size == before

    # The audit names the unfinished Apply, and only it.
    found = audit(plane.store)
    assert [v.invariant for v in found.violations] == ["apply_incomplete"], found.violations

    doc = complete_apply(plane, "P-1")
    assert doc.terminal == "applied"
    assert (project / "status.txt").read_text() == "good\n"
    assert audit(plane.store).ok
