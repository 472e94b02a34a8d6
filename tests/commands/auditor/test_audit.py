"""``evidence replay`` and ``evidence audit``: the replayed state equals the plans read
model as of every position; a log written by the plane audits clean; each invariant,
broken by events an attacker (or a bug) appended around the command handlers, is
reported with its position."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import msgspec
import pytest

import ledger
from commands.auditor.audit import audit, replay_plan
from commands.plane import CommandRefused, Plane
from commands.schemas.checker import check
from ledger import NewEvent
from ledger.canonical import canonical_json
from ledger.events import (
    AttemptFailed,
    CompensationRequested,
    DecisionRecorded,
    FixRecorded,
    GateChecked,
    PlanCreated,
    PlanHalted,
    TokenConsumed,
    TokenMinted,
    ValidationResultRecorded,
    ValidationRunCompleted,
    ValidationRunStarted,
)
from ledger.events.gates import Deviation
from projections import ALL_PROJECTIONS, delta, fold
from projections.states import to_json
from tests.helpers import REPO, applied_plan, assert_refused, forge, run_cli, strategy

EXAMPLES = REPO / "examples"


@pytest.fixture
def setup(db_url: str, tmp_path: Path):
    """Plan P-1 through a failure, an escalation, a signed revise decision, a passing run,
    its token and Apply (the lifecycle tests' scenario)."""
    with Plane.open(db_url) as plane:
        project = applied_plan(plane, tmp_path)
        yield plane, project, tmp_path


def _types(report) -> set[str]:
    return {v.invariant for v in report.violations}


# -- replay ---------------------------------------------------------------------------------


def test_replay_equals_the_plans_read_model_at_every_position(setup) -> None:
    plane, _project, _tmp = setup
    head = plane.store.head().size
    steps = replay_plan(plane.store, "P-1")
    assert [s.type for s in steps][-4:] == [
        "plan.token_minted",
        "plan.token_consumed",
        "plan.changes_recorded",
        "plan.applied",
    ]
    by_position = {s.position: s for s in steps}
    expected = None
    for position in range(1, head + 1):
        found = plane.projections.fold_as_of("plans", position).get("P-1")
        folded = to_json(found) if found is not None else None  # replay shows the document
        if position in by_position:
            expected = by_position[position].document
            as_of = replay_plan(plane.store, "P-1", as_of=position)
            assert as_of[-1].document == folded and as_of[-1].position == position
        assert expected == folded, position  # between plan events the state stands still
    assert steps[-1].document == to_json(plane.projections.document("plans", "P-1")[0])
    last = steps[-1]
    assert (last.phase, last.revision, last.outcome, last.terminal) == (
        "apply",
        1,
        "pass",
        "applied",
    )
    assert last.token["status"] == "consumed"
    decided = next(s for s in steps if s.type == "plan.decision_recorded")
    assert (decided.phase, decided.revision, decided.retries_left) == ("strategize", 1, 0)
    failed = next(s for s in steps if s.type == "plan.attempt_failed")
    assert failed.retries_left == 0 and failed.outcome == "blocker"
    minted = next(s for s in steps if s.type == "plan.token_minted")
    assert minted.token["status"] == "minted"


def test_replay_refuses_an_unknown_plan_or_position(setup) -> None:
    plane, _project, _tmp = setup
    with pytest.raises(CommandRefused, match="unknown plan 'P-2'"):
        replay_plan(plane.store, "P-2")
    created = plane.store.read_stream("plan:P-1")[0].position
    with pytest.raises(CommandRefused, match="as of position"):
        replay_plan(plane.store, "P-1", as_of=created - 1)


def test_replay_cli(setup, db_url: str) -> None:
    plane, _project, _tmp = setup
    stream = plane.store.read_stream("plan:P-1")
    middle = stream[len(stream) // 2].position
    result = run_cli("replay", "P-1", "--as-of", str(middle), "--json", "--db", db_url)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["as_of"] == middle and doc["steps"][-1]["position"] == middle
    assert doc["steps"][-1]["document"] == to_json(
        plane.projections.fold_as_of("plans", middle)["P-1"]
    )
    assert {"phase", "revision", "attempt", "retries_left", "outcome", "token"} <= set(
        doc["steps"][0]
    )
    table = run_cli("replay", "P-1", "--db", db_url)
    assert table.returncode == 0 and "plan.applied" in table.stdout
    assert table.stdout.splitlines()[0].split()[:4] == ["pos", "event", "phase", "rev"]
    assert_refused(run_cli("replay", "nope", "--db", db_url), "unknown plan 'nope'")
    assert_refused(run_cli("replay", "P-1", "--as-of", "0", "--db", db_url), "--as-of")


# -- audit: a clean log -------------------------------------------------------------------


def test_a_log_written_by_the_plane_audits_clean(setup, db_url: str) -> None:
    plane, _project, _tmp = setup
    report = audit(plane.store)
    assert report.ok, report.violations
    assert report.plans == ["P-1"] and report.size == plane.store.head().size
    assert report.checked["token_from_passing_run"] == 1  # INV1
    assert report.checked["blocker_not_overridable"] == 1  # INV3
    assert report.checked["outcome"] == 2 and report.checked["tokens_once"] == 1
    assert report.checked["delta_fold"] == report.size
    assert audit(plane.store, plan="P-1").ok
    with pytest.raises(CommandRefused, match="unknown plan"):
        audit(plane.store, plan="P-9")
    result = run_cli("audit", "--json", "--db", db_url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["ok"] is True
    assert run_cli("audit", "--plan", "P-1", "--db", db_url).stdout.startswith("ok: ")


# -- audit: each invariant broken -----------------------------------------------------------


def _forge(
    plane: Plane, *payloads, blobs=(), stream: str = "plan:P-1", caused_by_first: bool = False
) -> list[int]:
    """Append around the handlers (with correct deltas), as a buggy writer could."""
    return forge(
        plane.store, stream, *payloads, blobs=tuple(blobs), caused_by_first=caused_by_first
    )


def _events(plane: Plane, type_: type):
    return [e for e in plane.store.read_stream("plan:P-1") if isinstance(e.payload, type_)]


def test_validation_inside_apply_and_a_token_consumed_twice(setup) -> None:
    plane, _project, _tmp = setup
    started = _events(plane, ValidationRunStarted)[-1].payload
    minted = _events(plane, TokenMinted)[-1].payload
    run = msgspec.structs.replace(started, run_id="01J00000000000000000000000")
    again, inside = _forge(plane, TokenConsumed(plan_id="P-1", token_id=minted.token_id), run)
    report = audit(plane.store)
    found = {(v.position, v.invariant) for v in report.violations}
    assert (again, "ordering") in found and (inside, "ordering") in found
    twice = next(v for v in report.violations if v.position == again and v.invariant == "ordering")
    assert "consumed once" in twice.expected
    assert (again, "illegal_transition") in found  # nothing follows Apply
    result = run_cli("audit", "--db", plane.store.url)
    assert result.returncode == 1 and f"position {inside}: ordering" in result.stdout


def test_a_token_after_an_invalidating_fix_breaks_inv1(setup) -> None:
    plane, _project, _tmp = setup
    minted = _events(plane, TokenMinted)[-1]
    # A second token for the same run, minted after a fix superseded the run.
    fix_at, token_at = _forge(
        plane,
        FixRecorded(plan_id="P-1", attempt=minted.payload.attempt, note="later edit"),
        msgspec.structs.replace(minted.payload, token_id="01J00000000000000000000001"),
    )
    report = audit(plane.store, plan="P-1")
    inv1 = [
        v
        for v in report.violations
        if v.invariant == "token_from_passing_run" and v.position == token_at
    ]
    assert inv1 and any(f"position {fix_at}" in v.found for v in inv1)


def test_decision_without_escalation_breaks_inv3(setup) -> None:
    plane, _project, _tmp = setup
    real = _events(plane, DecisionRecorded)[0].payload
    [at] = _forge(plane, msgspec.structs.replace(real, decision_id="01J0000000000000000000000D"))
    found = {v.invariant: v for v in audit(plane.store).violations if v.position == at}
    assert "follows an escalation" in found["blocker_not_overridable"].expected
    assert set(found) == {"blocker_not_overridable", "illegal_transition", "decision_signature"}


def test_a_token_from_a_failed_run_and_outcome_drift(setup) -> None:
    plane, _project, _tmp = setup
    started = _events(plane, ValidationRunStarted)[-1].payload
    result = _events(plane, ValidationResultRecorded)[-1].payload
    minted = _events(plane, TokenMinted)[-1].payload
    run_id = "01J0000000000000000000000R"
    failed = msgspec.structs.replace(result, run_id=run_id, verdict=False, message="bad")
    positions = _forge(
        plane,
        msgspec.structs.replace(started, run_id=run_id),
        failed,
        ValidationRunCompleted(
            plan_id="P-1",
            run_id=run_id,
            attempt=started.attempt,
            outcome="pass",
            rules_version=1,
            results_digest="0" * 64,
        ),
        msgspec.structs.replace(
            minted, run_id=run_id, token_id="01J0000000000000000000000T", results_digest="0" * 64
        ),
    )
    report = audit(plane.store)
    by_position = {}
    for v in report.violations:
        by_position.setdefault(v.position, []).append(v)
    [drift] = [v for v in by_position[positions[2]] if v.invariant == "outcome_drift"]
    assert "blocker" in drift.expected and "recorded pass" in drift.found  # both values
    token = by_position[positions[3]]
    assert any(
        "passing real result" in v.expected
        for v in token
        if v.invariant == "token_from_passing_run"
    )
    assert any("results digest" in v.expected for v in token)


def _output_check(  # type: ignore[no-untyped-def]
    doc,
    schema_sha256: str | None,
    raw: bytes,
    verdict: str,
    deviations: list[Deviation] | None = None,
    *,
    iteration: int | None = None,
    strict: bool = True,
) -> GateChecked:
    """An output check of plan P-1 as recorded: its schema's digest, its bytes' digest,
    the verdict and deviations it claims (at the plan's iteration unless given)."""
    return GateChecked(
        plan_id="P-1",
        gate="output",
        tool="t",
        tool_version=1,
        step="s",
        schema_sha256=schema_sha256,
        verdict=verdict,
        deviations=deviations or [],
        attempt=doc.attempt,
        iteration=doc.iteration if iteration is None else iteration,
        strict_mode=strict,
        checked_sha256=hashlib.sha256(raw).hexdigest(),
    )


def test_a_gate_verdict_that_does_not_follow_from_its_bytes(setup) -> None:
    plane, _project, _tmp = setup
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    schema_bytes, checked = canonical_json(schema), b'{"n": "seven"}'
    doc = plane.state("plan:P-1").doc

    def gate(raw: bytes, verdict: str, digest: str | None = None) -> GateChecked:
        return _output_check(doc, digest or hashlib.sha256(schema_bytes).hexdigest(), raw, verdict)

    lied, honest, missing = _forge(
        plane,
        gate(checked, "pass"),
        gate(b'{"n": 7}', "pass"),
        gate(checked, "pass", "ab" * 32),
        blobs=[schema_bytes, checked, b'{"n": 7}'],
    )
    report = audit(plane.store)
    gates = {v.position: v for v in report.violations if v.invariant == "gate_rederivation"}
    assert set(gates) == {lied, missing} and honest not in gates
    assert "fail" in gates[lied].expected and "recorded pass" in gates[lied].found
    assert "missing" in gates[missing].found


def test_bytes_judged_once_are_judged_against_each_schema_and_each_record(setup) -> None:
    """The audit judges the same bytes against the same schema once (a cache keyed by
    both digests): a later record of them is still compared with that judgement, and the
    same bytes under another schema are judged anew."""
    plane, _project, _tmp = setup
    loose_schema = {"type": "object"}
    strict_schema = {"type": "object", "required": ["m"]}
    loose, strict = canonical_json(loose_schema), canonical_json(strict_schema)
    raw = b'{"n": 7}'
    doc = plane.state("plan:P-1").doc

    def gate(schema: bytes, verdict: str, deviations: list[Deviation]) -> GateChecked:
        return _output_check(doc, hashlib.sha256(schema).hexdigest(), raw, verdict, deviations)

    found = check(strict_schema, raw)
    assert found  # the bytes fail the strict schema, pass the loose one
    honest, lied_again, other_schema = _forge(
        plane,
        gate(strict, "fail", found),
        gate(strict, "pass", []),
        gate(loose, "fail", found),
        blobs=[loose, strict, raw],
    )
    report = audit(plane.store)
    gates = {v.position for v in report.violations if v.invariant == "gate_rederivation"}
    assert gates == {lied_again, other_schema} and honest not in gates


def test_a_schema_that_does_not_compile_is_a_violation_not_a_blind_audit(setup) -> None:
    """The attack on the auditor: a forged check whose schema blob (stored under its own,
    honest digest: verify finds nothing wrong with the blob) is no JSON Schema the
    checker compiles. The audit reports it, at its position, and goes on; it never stops
    with an error that hides the rest of the log."""
    plane, _project, _tmp = setup
    broken = b'{"type": 12}'
    doc = plane.state("plan:P-1").doc
    raw = b'{"n": 7}'
    [forged] = _forge(
        plane,
        _output_check(doc, hashlib.sha256(broken).hexdigest(), raw, "pass"),
        blobs=[broken, raw],
    )
    report = audit(plane.store)
    [violation] = [v for v in report.violations if v.invariant == "gate_rederivation"]
    assert violation.position == forged and "compile" in violation.expected
    result = run_cli("audit", "--db", plane.store.url)
    assert result.returncode == 1 and "gate_rederivation" in result.stdout, result.stderr


def _failed_check(doc, raw: bytes, *, iteration: int, strict: bool) -> GateChecked:  # type: ignore[no-untyped-def]
    """A failed output check of plan P-1 (no output declaration) at ``iteration``."""
    found = Deviation(pointer="", kind="no_output_declaration", expected="x", actual_type="object")
    return _output_check(doc, None, raw, "fail", [found], iteration=iteration, strict=strict)


def test_gate_failures_routed_against_strict_mode(setup) -> None:
    plane, _project, _tmp = setup
    doc = plane.state("plan:P-1").doc
    strict = doc.global_config.strict_mode
    raw = b'{"n": 7}'
    failed = _failed_check(doc, raw, iteration=1, strict=strict)
    routed = (
        [
            CompensationRequested(plan_id="P-1", reason="r"),
            PlanHalted(
                plan_id="P-1",
                halt_type="blocker",
                final_decision="blocker",
                raw_halt_type="structural_deviation",
                reason="r",
                phase="execute",
                attempt=doc.attempt,
                terminal=True,
            ),
        ]
        if strict
        else [
            AttemptFailed(
                plan_id="P-1",
                attempt=doc.attempt,
                iteration=1,
                failure_class="model_behavior",
                reason="r",
            )
        ]
    )
    _forge(plane, failed, *routed, blobs=[raw], caused_by_first=True)
    report = audit(plane.store)
    assert not [v for v in report.violations if v.invariant == "gate_routing"]
    assert report.checked["gate_routing"] == 1
    (unrouted,) = _forge(plane, failed, blobs=[raw])  # nothing follows it
    (wrong_mode,) = _forge(
        plane,
        msgspec.structs.replace(failed, verdict="pass", deviations=[], strict_mode=not strict),
    )
    routing = {
        v.position: v for v in audit(plane.store).violations if v.invariant == "gate_routing"
    }
    assert set(routing) == {unrouted, wrong_mode}
    assert routing[unrouted].found == "nothing caused by it"
    assert "strict_mode" in routing[wrong_mode].expected


def test_a_gate_failure_in_the_last_iteration_must_enter_the_failure_loop(setup) -> None:
    """Without strict_mode the last iteration's failure fails the attempt and leads to a
    strategy revision (or an escalation): a log where it only fails the iteration, as if
    the critique loop could go on, is reported."""
    plane, _project, _tmp = setup
    doc = plane.state("plan:P-1").doc
    if doc.global_config.strict_mode:
        pytest.skip("the plan of this setup is strict")
    raw = b'{"n": 7}'
    last = doc.global_config.max_iterations
    failed = _failed_check(doc, raw, iteration=last, strict=False)
    only_the_iteration = AttemptFailed(
        plan_id="P-1",
        attempt=doc.attempt,
        iteration=last,
        failure_class="model_behavior",
        reason="r",
    )
    (at, _failed) = _forge(plane, failed, only_the_iteration, blobs=[raw], caused_by_first=True)
    [routing] = [v for v in audit(plane.store).violations if v.invariant == "gate_routing"]
    assert routing.position == at
    revision_left = doc.revisions_used < doc.global_config.max_strategy_revisions
    step = "plan.strategy_revision_requested" if revision_left else "plan.escalated, plan.halted"
    assert routing.expected.endswith(f"plan.attempt_failed, {step}")


def test_a_validation_registered_writable(setup) -> None:
    plane, _project, _tmp = setup
    real = plane.store.read_stream("tool:status")[0].payload
    (at,) = _forge(
        plane, msgspec.structs.replace(real, name="writer", writes=True), stream="tool:writer"
    )
    [violation] = audit(plane.store).violations
    assert (violation.position, violation.invariant) == (at, "read_only")
    assert "writes True" in violation.found


def test_a_delta_that_does_not_rebuild_the_fold(setup) -> None:
    plane, _project, _tmp = setup
    [position] = plane.store.append(
        "plan:P-9",
        [
            NewEvent(
                payload=strategy("P-9").payload, delta=[{"op": "add", "path": "/x", "value": 1}]
            )
        ],
    )
    violations = audit(plane.store).violations
    assert {(v.position, v.invariant) for v in violations} == {
        (position, "delta_fold"),
        (position, "illegal_transition"),
    }  # no plan.created
    assert audit(plane.store, plan="P-1").ok  # another plan's problem


def _true_as_one(value):
    """``value`` with every ``true`` written ``1``: equal to it in Python, not in JSON."""
    if value is True:
        return 1
    if isinstance(value, dict):
        return {k: _true_as_one(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_true_as_one(v) for v in value]
    return value


def test_a_delta_that_rebuilds_the_fold_only_in_python_equality(setup) -> None:
    """A forged delta writing ``1`` where the fold has ``true`` (Python says 1 == True):
    a consumer of the deltas would read another document than the log's."""
    plane, _project, _tmp = setup
    real = plane.store.read_stream("tool:status")[0].payload
    forged = msgspec.structs.replace(real, name="twin")
    stream = "tool:twin"
    honest = delta({}, fold(stream, None, forged))
    assert "true" in json.dumps(honest)  # read_only: a boolean the forgery rewrites
    [position] = plane.store.append(stream, [NewEvent(payload=forged, delta=_true_as_one(honest))])
    [violation] = audit(plane.store).violations
    assert (violation.position, violation.invariant) == (position, "delta_fold")


def test_without_the_plane_key_the_audit_says_which_signatures_went_unchecked(
    setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An auditor on another machine, with no plane key: the checks only that key can
    make are not made, and the audit says so (never a clean report that reads as if
    tokens, approvers, policy and reviews were checked)."""
    from commands.auditor.findings import NEEDS_PLANE_KEY
    from ledger.keys import public_key_b64

    plane, _project, tmp = setup
    keyless = audit(plane.store)
    assert keyless.ok and keyless.unchecked == list(NEEDS_PLANE_KEY)
    assert not set(NEEDS_PLANE_KEY) & set(keyless.checked)
    keyed = audit(plane.store, plane_public_key=plane.plane_public_key())
    assert keyed.ok and keyed.unchecked == [] and keyed.checked["token_signature"] >= 1
    url = plane.store.url
    monkeypatch.setenv("EVIDENCE_PLANE_KEY", str(tmp / "not-here.key"))
    text = run_cli("audit", "--db", url)
    assert text.returncode == 0 and "note: signatures UNCHECKED" in text.stdout, text.stdout
    shown = json.loads(run_cli("audit", "--json", "--db", url).stdout)
    assert shown["unchecked"] == list(NEEDS_PLANE_KEY)
    public = tmp / "plane.pub"
    public.write_text(public_key_b64(plane.plane_public_key()) + "\n")  # raw base64
    given = run_cli("audit", "--plane-key", str(public), "--db", url)
    assert given.returncode == 0 and "UNCHECKED" not in given.stdout, given.stdout


# -- the examples: gate checks and wrapped transforms re-derived ---------------------------


def test_escalation_example_rederives_gates_and_transforms(sqlite_url: str, tmp_path: Path) -> None:
    root = tmp_path / "escalation"
    shutil.copytree(EXAMPLES / "escalation", root)

    def run(*args: str) -> dict:
        result = run_cli(
            "run",
            *args,
            "--json",
            "--db",
            sqlite_url,
            "--workdir",
            str(tmp_path / "runs"),
            cwd=root,
        )
        assert result.returncode in (0, 1), result.stderr
        return json.loads(result.stdout)["run"]

    decision = run(str(root / "plan.yaml"))["decision_id"]
    key = tmp_path / "alice.key"
    assert run_cli("keys", "generate", "--out", str(key)).returncode == 0
    assert run_cli("keys", "add", "alice", f"{key}.pub", "--db", sqlite_url).returncode == 0
    assert (
        run_cli(
            "authorize", decision, "--key", str(key), "--revise", "fix calc.add", "--db", sqlite_url
        ).returncode
        == 0
    )
    assert run("--resume", "escalation")["state"] == "applied"
    with ledger.open(sqlite_url) as store:
        report = audit(store)
        assert report.ok, report.violations
        assert report.checked["gate_rederivation"] == 2
        assert report.checked["transform_rederivation"] == 3
        # A result whose recorded verdict the transform does not give on its raw output.
        stream = store.read_stream("plan:escalation")
        failing = next(
            e.payload
            for e in stream
            if isinstance(e.payload, ValidationResultRecorded) and e.payload.verdict is False
        )
        started = next(
            e.payload
            for e in stream
            if isinstance(e.payload, ValidationRunStarted) and e.payload.run_id == failing.run_id
        )
        run_id = "01J0000000000000000000000W"
        lied = forge(
            store,
            "plan:escalation",
            msgspec.structs.replace(started, run_id=run_id),
            msgspec.structs.replace(failing, run_id=run_id, verdict=True),
        )[1]
        report = audit(store, plan="escalation")
        [transform] = [v for v in report.violations if v.invariant == "transform_rederivation"]
        assert transform.position == lied
        assert "passed=False" in transform.expected and "passed=True" in transform.found


def test_a_transforms_data_rederived_as_json_not_as_python_equals(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A wrapped validation's transform gives ``data: {"flag": 1}``; a forged result
    recording ``{"flag": true}`` (Python says equal) is another result than the
    transform's, and the audit says so."""
    from commands.plane.attachments import attach
    from commands.plane.phases import enter_execute, record_strategy
    from commands.plane.plans import create_plan
    from commands.plane.registry import register_tool, register_validation
    from commands.plane.validation_runs import validate_plan

    project = tmp_path / "proj"
    project.mkdir()
    (project / "flag.py").write_text("print('{\"flag\": 1}')\n")
    with Plane.open(sqlite_url) as plane:
        register_tool(plane, {"name": "flagger", "command": ["python", "flag.py"]})
        register_validation(
            plane,
            {"name": "flag", "mode": "required", "wraps": "flagger",
             "transform": "{passed: `true`, data: {flag: flag}}"},
        )  # fmt: skip
        create_plan(plane, "P-1", project="api", resources=[str(project)])
        attach(plane, "flag", resource=str(project))
        record_strategy(plane, "P-1", "flag it")
        enter_execute(plane, "P-1")
        (result,) = validate_plan(plane, "P-1").results
        assert result.verdict is True and result.data == {"flag": 1}
        assert audit(plane.store).ok
        started = _events(plane, ValidationRunStarted)[-1].payload
        recorded = _events(plane, ValidationResultRecorded)[-1].payload
        run_id = "01J0000000000000000000000W"
        lied = forge(
            plane.store,
            "plan:P-1",
            msgspec.structs.replace(started, run_id=run_id),
            msgspec.structs.replace(recorded, run_id=run_id, data={"flag": True}),
        )[1]
        report = audit(plane.store)
        [transform] = [v for v in report.violations if v.invariant == "transform_rederivation"]
        assert transform.position == lied


def test_strict_output_deviation_example_audits_clean(sqlite_url: str, tmp_path: Path) -> None:
    root = tmp_path / "strict-output-deviation"
    shutil.copytree(EXAMPLES / "strict-output-deviation", root)
    result = run_cli(
        "run",
        str(root / "plan.yaml"),
        "--json",
        "--db",
        sqlite_url,
        "--workdir",
        str(tmp_path / "runs"),
        cwd=root,
    )
    assert result.returncode == 1, result.stderr  # halted by the strict output gate
    with ledger.open(sqlite_url) as store:
        report = audit(store)
    assert report.ok, report.violations
    assert report.checked["gate_routing"] >= 1 and report.checked["gate_rederivation"] >= 1
    assert report.checked["read_only"] >= 1


def test_replay_of_a_forged_plan_stream_shows_what_it_can(sqlite_url) -> None:
    with ledger.open(sqlite_url) as store:  # no plan.created: appended around the handlers
        store.append("plan:F-1", [strategy("F-1", "forged")])
        steps = replay_plan(store, "F-1")
    assert [(s.type, s.phase, s.retries_left) for s in steps] == [
        ("plan.strategy_recorded", None, None)
    ]
    result = run_cli("replay", "F-1", "--db", sqlite_url)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr


# -- read models against a fresh fold -----------------------------------------------------


def _write_sql(plane: Plane, sql: str) -> None:
    with plane.store.write() as tx:  # a read model is a plain table: an operator can edit it
        tx.execute(sql)


def test_every_read_model_equals_a_fresh_fold(setup) -> None:
    plane, _project, _tmp = setup
    report = audit(plane.store)
    assert report.ok, report.violations
    assert set(report.read_models) == {p.name for p in ALL_PROJECTIONS}
    assert set(report.read_models.values()) == {"ok"}
    assert report.checked["read_model"] == len(ALL_PROJECTIONS)
    # appended around the plane (its delta made here), the read models lag: each is
    # checked at its own checkpoint, so they are still sound
    created = PlanCreated(plan_id="P-9", project="web", resources=["repo:web"])
    after = fold("plan:P-9", {}, created)
    plane.store.append("plan:P-9", [NewEvent(payload=created, delta=delta({}, after))])
    report = audit(plane.store)
    assert report.ok, report.violations
    statuses = {s.name: s for s in plane.projections.status()}
    assert statuses["plans"].lag == 1


@pytest.mark.parametrize(
    "sql, name, key",
    [
        ("UPDATE rm_plans SET phase = 'strategize' WHERE key = 'P-1'", "plans", "P-1"),
        ("DELETE FROM rm_tools", "tools", "status"),
        ("DELETE FROM rm_outcomes", "outcomes", "P-1"),
        ("UPDATE rm_analytics_plans SET attempts = attempts + 1", "analytics", "plans/P-1"),
        (
            "DELETE FROM rm_analytics_results WHERE position = (SELECT MIN(position) FROM "
            "rm_analytics_results)",
            "analytics",
            "results/",
        ),
    ],
)
def test_an_edited_read_model_is_a_violation(setup, sql: str, name: str, key: str) -> None:
    plane, _project, _tmp = setup
    _write_sql(plane, sql)
    report = audit(plane.store)
    assert not report.ok and report.read_models[name] == "differs"
    (violation,) = report.violations
    assert violation.invariant == "read_model" and name in violation.expected
    assert key in violation.found
    assert audit(plane.store, plan="P-1").ok  # a plan's audit leaves read models alone


def test_a_read_model_built_by_another_version_is_stale_not_wrong(setup, db_url) -> None:
    plane, _project, _tmp = setup
    _write_sql(plane, "UPDATE rm_plans SET phase = 'strategize'")
    _write_sql(
        plane, "UPDATE projection_checkpoints SET version = version + 100 WHERE name = 'plans'"
    )
    report = audit(plane.store)
    assert report.ok and report.read_models["plans"] == "stale"
    assert report.checked["read_model"] == len(ALL_PROJECTIONS) - 1
    result = run_cli("audit", "--json", "--db", db_url)
    assert result.returncode == 0 and json.loads(result.stdout)["read_models"]["plans"] == ("stale")
    _write_sql(plane, "DELETE FROM rm_outcomes")
    result = run_cli("audit", "--db", db_url)
    assert result.returncode == 1 and "read_model" in result.stdout, result.stdout
