"""Tool calls, validation runs and the outcome contract (seeds 000 and 001), with real
subprocesses: nothing is fabricated, every halt is classified honestly."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import commands.plane.runs as runs_module
import ledger
from commands.plane import CommandRefused, Plane
from commands.plane.attachments import attach
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan, get_plan
from commands.plane.registry import register_tool, register_validation
from commands.plane.runs import Recorded, call_tool, record_halt
from commands.plane.validation_runs import validate_plan
from ledger.events import ValidationRunCompleted
from projections.outcomes import canonical_halt, classify
from tests.helpers import assert_refused, run_cli

VALIDATOR = """
import json, os, signal, sys, time
mode = sys.argv[1]
if mode == "pass":
    print(json.dumps({"passed": True, "message": "fine"}))
elif mode == "fail":
    print(json.dumps({"passed": False, "message": "2 tests failed", "data": {"failed": 2}}))
elif mode == "hang":
    time.sleep(30)
elif mode == "crash":
    os.kill(os.getpid(), signal.SIGKILL)
elif mode == "string":
    print(json.dumps({"passed": "true"}))
elif mode == "write":
    open("new.txt", "w").write("x")
    print(json.dumps({"passed": True}))
elif mode == "escape":  # writes to the original through its absolute path
    os.remove(os.path.join(sys.argv[2], "src", "app.py"))
    open(os.path.join(sys.argv[2], "planted.txt"), "w").write("x")
    print(json.dumps({"passed": True}))
"""

MODE = {"type": "object", "properties": {"mode": {"type": "string"}}, "required": ["mode"]}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print('hello')\n")
    (tmp_path / "v.py").write_text(VALIDATOR)
    return root


@pytest.fixture
def plane(db_url: str, project: Path):
    script = str(project.parent / "v.py")
    with Plane.open(db_url) as p:
        register_validation(
            p,
            {
                "name": "check",
                "mode": "required",
                "input_schema": MODE,
                "command": [sys.executable, script, "{mode}"],
            },
        )
        register_validation(
            p,
            {
                "name": "advice",
                "mode": "informational",
                "input_schema": MODE,
                "command": [sys.executable, script, "{mode}"],
            },
        )
        register_validation(
            p,
            {
                "name": "hanger",
                "mode": "required",
                "timeout": 0.3,
                "command": [sys.executable, script, "hang"],
            },
        )
        register_validation(
            p, {"name": "absent", "mode": "required", "command": ["definitely-not-installed-xyz"]}
        )
        create_plan(p, "P-1", project="api", resources=[str(project)])
        yield p


def _execute(plane: Plane, plan_id: str = "P-1") -> None:
    record_strategy(plane, plan_id, "make it pass")
    enter_execute(plane, plan_id)


def _attach(plane: Plane, project: Path, *specs: tuple[str, str | None]) -> None:
    """Attach, then enter Execute: the plan's binding set is pinned there."""
    for validation, mode in specs:
        attach(plane, validation, resource=str(project), args={"mode": mode} if mode else {})
    _execute(plane)


def test_all_required_pass_informational_failures_are_surfaced(plane: Plane, project: Path) -> None:
    _attach(plane, project, ("check", "pass"), ("advice", "fail"))
    report = validate_plan(plane, "P-1")
    assert report.outcome == "pass"
    assert report.informational_failures == ["advice"]
    assert [e.type for e in report.events] == [
        "validation.result_recorded",
        "validation.result_recorded",
        "validation.run_completed",
        "plan.token_minted",
    ]
    assert report.token is not None
    doc = get_plan(plane, "P-1")
    assert doc.last_outcome == "pass" and doc.halt is None
    assert doc.informational_failures == ["advice"]


def test_a_failing_required_validation_is_a_blocker(plane: Plane, project: Path) -> None:
    _attach(plane, project, ("check", "pass"), ("check", "fail"))
    report = validate_plan(plane, "P-1")
    assert report.outcome == "blocker"
    types = [e.type for e in report.events]
    assert types[-3:] == ["validation.run_completed", "plan.halted", "plan.attempt_failed"]
    halt = report.events[-2].payload
    assert (halt.halt_type, halt.final_decision, halt.raw_halt_type) == (
        "blocker",
        "blocker",
        "validation_failed",
    )
    failed = next(r for r in report.results if r.verdict is False)
    assert failed.message == "2 tests failed" and failed.data == {"failed": 2}
    assert plane.store.get_blob(failed.raw_output_sha256) is not None  # what it printed
    doc = get_plan(plane, "P-1")
    assert (doc.attempt, doc.retries_used, doc.terminal) == (2, 1, None)


@pytest.mark.parametrize(
    ("validation", "mode", "cause"),
    [
        ("hanger", None, "timeout"),
        ("check", "crash", "crash"),
        ("check", "string", "malformed"),
        ("absent", None, "missing_program"),
    ],
)
def test_no_verdict_from_a_required_validation_is_a_validator_error(
    plane: Plane, project: Path, validation: str, mode: str | None, cause: str
) -> None:
    _attach(plane, project, (validation, mode), ("check", "pass"))
    report = validate_plan(plane, "P-1")
    assert report.outcome == "validator_error"
    broken = [r for r in report.results if r.verdict is None]
    assert [r.cause for r in broken] == [cause]
    halt = report.events[-1].payload
    assert halt.halt_type == "validator_error" and halt.raw_halt_type == cause
    assert "authorize" not in (halt.hint or "")  # nothing to decide: an operator acts


def test_a_blocker_takes_precedence_over_a_validator_error(plane: Plane, project: Path) -> None:
    _attach(plane, project, ("hanger", None), ("check", "fail"))
    assert validate_plan(plane, "P-1").outcome == "blocker"


def _policy_plan(plane: Plane, project: Path, policy: str) -> str:
    """The plan the run is made on: P-1 (confined by the kernel, the default), or a plan
    that opted out (``confinement: none``) so that a write reaches its copy and the
    plane's own detection is what catches it."""
    if policy == "landlock":
        return "P-1"
    create_plan(
        plane, "P-U", project="api", resources=[str(project)], config={"confinement": "none"}
    )
    _execute(plane, "P-U")
    return "P-U"


@pytest.mark.parametrize("policy", ["none", "landlock"])
def test_a_validation_that_writes_is_caught_and_nothing_survives(
    plane: Plane, project: Path, policy: str
) -> None:
    before = {p: p.read_bytes() for p in project.rglob("*") if p.is_file()}
    _attach(plane, project, ("check", "write"))
    report = validate_plan(plane, _policy_plan(plane, project, policy))
    (result,) = report.results
    if policy == "none":  # the write reached its copy: detected, the result void
        assert (result.verdict, result.cause, result.changed_paths) == (
            None,
            "read_only_violation",
            ["new.txt"],
        )
        assert result.confinement == "unconfined"
    else:  # the kernel refused the write: the program failed, nothing changed
        assert (result.verdict, result.cause, result.changed_paths) == (None, "malformed", [])
        assert "PermissionError" in (result.error or "")
        assert result.confinement == "landlock"
    assert report.outcome == "validator_error"
    assert {p: p.read_bytes() for p in project.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("policy", ["none", "landlock"])
def test_a_write_through_an_absolute_path_is_undone(
    plane: Plane, project: Path, policy: str
) -> None:
    before = {p: p.read_bytes() for p in project.rglob("*") if p.is_file()}
    register_validation(
        plane,
        {
            "name": "escaper",
            "mode": "informational",
            "command": [sys.executable, str(project.parent / "v.py"), "escape", str(project)],
        },
    )
    _attach(plane, project, ("escaper", None), ("check", "pass"))
    report = validate_plan(plane, _policy_plan(plane, project, policy))
    causes = {r.validation: (r.verdict, r.cause) for r in report.results}
    changed = next(r.changed_paths for r in report.results if r.validation == "escaper")
    if policy == "none":  # it reached the real resource: restored, its result void
        assert causes["escaper"] == (None, "read_only_violation")
        assert "planted.txt" in changed and "src/app.py" in changed
    else:  # the kernel refused it: nothing to restore
        assert causes["escaper"] == (None, "malformed") and changed == []
    assert {p: p.read_bytes() for p in project.rglob("*") if p.is_file()} == before


def test_validations_run_in_parallel(
    plane: Plane, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both validations of the run are under way at once: each meets the other at a
    barrier before its program runs (run one after the other, the barrier breaks after
    a generous wait, and that validation's result is an internal error). Events, not
    timing."""
    _attach(plane, project, ("check", "pass"), ("advice", "pass"))
    both = threading.Barrier(2, timeout=60)
    run_validation = runs_module.run_validation

    def meeting(*args: Any, **kw: Any) -> Any:
        both.wait()
        return run_validation(*args, **kw)

    monkeypatch.setattr(runs_module, "run_validation", meeting)
    report = validate_plan(plane, "P-1")
    assert [(r.verdict, r.cause) for r in report.results] == [(True, None), (True, None)]
    assert report.outcome == "pass"


def test_the_resolved_set_is_recorded_before_running(plane: Plane, project: Path) -> None:
    _attach(plane, project, ("check", "pass"))
    report = validate_plan(plane, "P-1")
    started = next(
        e for e in plane.store.read_stream("plan:P-1") if e.type == "validation.run_started"
    )
    assert started.position < report.events[0].position
    assert [r.validation for r in started.payload.resolved] == ["check"]
    assert str(project) in started.payload.resource_digests


def test_outcome_classification_is_a_projection(plane: Plane, project: Path) -> None:
    _attach(plane, project, ("check", "fail"))
    validate_plan(plane, "P-1")
    (doc,) = [d for d in plane.projections.documents("outcomes") if d]
    assert (doc.outcome, doc.recorded.outcome, doc.drift) == ("blocker", "blocker", False)
    plane.projections.rebuild(["outcomes"])
    assert plane.projections.documents("outcomes") == [doc]
    # A run recorded under other rules (simulated: its recorded outcome differs from what
    # the current rules derive) shows as drift, with both values.
    state = plane.state("plan:P-1")
    run_id = doc.run_id
    assert state.doc.current_run is None  # the plane itself refuses such an event:
    with pytest.raises(CommandRefused, match="open run"):
        plane.append(
            state,
            [
                ValidationRunCompleted(
                    plan_id="P-1",
                    run_id=run_id,
                    attempt=1,
                    outcome="pass",
                    rules_version=0,
                    results_digest="0" * 64,
                )
            ],
        )
    plane.store.append(
        "plan:P-1",
        [
            ledger.NewEvent(
                payload=ValidationRunCompleted(
                    plan_id="P-1",
                    run_id=run_id,
                    attempt=1,
                    outcome="pass",
                    rules_version=0,
                    results_digest="0" * 64,
                )
            )
        ],
    )
    plane.projections.catch_up()
    (drifted,) = [d for d in plane.projections.documents("outcomes") if d]
    assert drifted.drift is True and drifted.recorded.outcome == "pass"
    assert drifted.outcome == "blocker"


def test_tool_calls(plane: Plane, project: Path, tmp_path: Path) -> None:
    _execute(plane)
    register_tool(
        plane,
        {
            "name": "count",
            "command": [
                sys.executable,
                "-c",
                "import json,os; print(json.dumps({{'files': len(os.listdir('src'))}}))",
            ],
            "output_schema": {"type": "object", "properties": {"files": {"type": "integer"}}},
        },
    )
    report = call_tool(plane, "P-1", "count", b"{}")
    assert report.ok and report.call is not None and report.call.exit_code == 0
    assert json.loads(plane.store.get_blob(report.call.output_sha256)) == {"files": 1}
    # The orchestrator ran it itself: gates still apply, nothing is coerced.
    recorded = call_tool(plane, "P-1", "count", b"{}", recorded_output=b'{"files": "1"}')
    assert recorded.call.executor == "recorded" and not recorded.ok
    assert [d.kind for d in recorded.output_gate.check.deviations] == ["wrong_type"]
    # An invented tool: no call is made.
    invented = call_tool(plane, "P-1", "ghost", b"{}")
    assert invented.call is None and invented.input_gate.check.deviations[0].kind == (
        "invented_tool"
    )


def test_a_missing_program_for_a_tool_is_an_environment_error(plane: Plane) -> None:
    _execute(plane)
    register_tool(plane, {"name": "coder", "command": ["no-such-coder-binary-xyz"]})
    report = call_tool(plane, "P-1", "coder", b"{}")
    assert report.call is None and report.halt is not None
    assert (report.halt.halt_type, report.halt.raw_halt_type) == (
        "environment_error",
        "program_missing",
    )
    assert "install `no-such-coder-binary-xyz`" in report.halt.hint


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("validation_failed", "blocker"),
        ("max_iterations", "blocker"),
        ("coder_missing", "environment_error"),
        ("timeout", "validator_error"),
        ("engine_exception", "internal_error"),
        ("escalated", "escalate"),
        ("execution_error", "internal_error"),  # unknown: a non-verdict, never a blocker
        ("something-new", "internal_error"),
    ],
)
def test_raw_halt_types_map_to_the_canonical_outcome(raw: str, canonical: str) -> None:
    assert canonical_halt(raw) == canonical


def test_classification_rules() -> None:
    def r(mode: str, verdict: bool | None, cause: str | None = None) -> dict:
        return {"validation": f"{mode}-{verdict}", "mode": mode, "verdict": verdict, "cause": cause}

    assert classify([])[0] == "validator_error"  # no required validation: no vacuous pass
    assert classify([], require_validation=False)[0] == "pass"  # only when opted out
    assert classify([r("informational", True)])[1] == "no_required_validation"
    assert classify([r("informational", False), r("required", True)])[0] == "pass"
    assert classify([r("required", None, "internal"), r("required", None, "timeout")])[0] == (
        "internal_error"
    )
    assert classify([r("required", None, "timeout"), r("required", False)])[0] == "blocker"


def test_halts_recorded_by_an_orchestrator(plane: Plane) -> None:
    _execute(plane)
    halt = record_halt(plane, "P-1", "something-new", "the runner gave up")
    assert (halt.halt_type, halt.final_decision) == ("internal_error", "internal_error")
    with pytest.raises(CommandRefused, match="needs"):
        record_halt(plane, "P-1", " ", "x")


def test_validate_refused_outside_execute(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        create_plan(plane, "P-1", project="api", resources=["repo:api"])
        before = plane.store.head().size
        with pytest.raises(CommandRefused, match="only in Execute"):
            validate_plan(plane, "P-1")
        assert plane.store.head().size == before


def test_cli(plane: Plane, project: Path, db_url: str) -> None:
    _attach(plane, project, ("check", "pass"), ("advice", "fail"))
    ok = run_cli("validate", "P-1", "--db", db_url)
    assert ok.returncode == 0, ok.stderr
    assert "outcome: pass" in ok.stdout and "informational failures" in ok.stdout
    create_plan(plane, "P-2", project="api", resources=[str(project)])
    attach(plane, "check", resource=str(project), plan="P-2", args={"mode": "fail"})
    _execute(plane, "P-2")
    failed = run_cli("validate", "P-2", "--json", "--db", db_url)
    assert failed.returncode == 1
    doc = json.loads(failed.stdout)["validation"]
    assert doc["outcome"] == "blocker" and doc["who_acts"] == "agent -> human"
    assert {r["scope"] for r in doc["results"]} == {"direct", "plan"}
    halted = run_cli(
        "halt", "P-1", "--raw-type", "coder_missing", "--reason", "no coder", "--db", db_url
    )
    assert halted.returncode == 1 and "environment_error" in halted.stdout
    with ledger.open(db_url) as store:
        before = store.head().size
    for bad, fragment in [
        (["validate", "P-404"], "unknown plan"),
        (["halt", "P-1", "--raw-type", "x"], "--reason"),
        (["call", "P-1", "--tool", "check", "--params", "@/no/file"], "cannot read"),
    ]:
        assert_refused(run_cli(*bad, "--db", db_url), fragment)
    with ledger.open(db_url) as store:
        assert store.head().size == before


def test_a_validation_called_as_a_tool_may_return_data(plane: Plane, project: Path) -> None:
    """Its structured return passes the output gate with its `data` (any object): what a
    step downstream of it reads."""
    _execute(plane)
    report = call_tool(plane, "P-1", "check", {"mode": "fail"})
    assert report.ok, report.to_json()
    assert json.loads(report.output)["data"] == {"failed": 2}


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_a_tools_own_errors_spend_the_attempt_and_enter_the_failure_loop(
    db: str, request: pytest.FixtureRequest
) -> None:
    """An agent whose MCP server (its own, or a misbehaving upstream) answers every call
    with ``isError`` got endless tries: a tool error passes its gate as the MCP result
    it is, so nothing counted. Every failure counts: each spends an iteration, and the
    last enters the failure loop (here a strategy revision, then an escalation)."""
    url = request.getfixturevalue("sqlite_url" if db == "sqlite" else "pg_url")
    error = {"content": [{"type": "text", "text": "nope"}], "isError": True}
    with Plane.open(url) as plane:
        register_tool(
            plane,
            {
                "name": "srv.fail",
                "mcp_server": "srv",
                "mcp_tool_name": "fail",
                "input_schema": {"type": "object"},
            },
        )
        config = {"max_iterations": 2, "max_strategy_revisions": 1}
        create_plan(plane, "P-1", project="api", resources=["repo:api"], config=config)
        record_strategy(plane, "P-1", "call it")
        enter_execute(plane, "P-1")
        routes = []
        for _ in range(2):
            report = call_tool(
                plane, "P-1", "srv.fail", {},
                recorded=Recorded(json.dumps(error), tool_error=True),
            )  # fmt: skip
            assert report.tool_failed and report.output_gate.passed
            routes.append(report.output_gate.routed)
        assert routes == ["retry", "revised"]
        assert get_plan(plane, "P-1").phase == "strategize"
