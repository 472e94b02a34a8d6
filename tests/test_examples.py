"""The examples, end to end with real subprocesses: outcome, event sequence, files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import ledger
from tests.helpers import assert_refused, run_cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture
def copy(tmp_path: Path):
    def make(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(EXAMPLES / name, target)
        return target

    return make


def _types(db_url: str, plan: str) -> list[str]:
    with ledger.open(db_url) as store:
        return [e.type for e in store.read_stream(f"plan:{plan}")]


def _run(db_url: str, *args: str, cwd: Path) -> dict:
    result = run_cli(
        "run", *args, "--json", "--db", db_url, "--workdir", str(cwd / "runs"), cwd=cwd
    )
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)["run"]


def test_green_after_fix(db_url: str, copy) -> None:
    root = copy("green-after-fix")
    run = _run(db_url, str(root / "plan.yaml"), cwd=root)
    assert (run["state"], run["outcome"], run["verify_ok"]) == ("applied", "pass", True)
    assert run["changed_paths"] == ["project/calc.py"]
    assert "return a + b" in (root / "project" / "calc.py").read_text()  # Apply landed it
    types = _types(db_url, "green-after-fix")
    assert types[:3] == ["plan.created", "plan.strategy_recorded", "plan.execute_entered"]
    assert types.count("validation.run_completed") == 2
    assert "plan.fix_recorded" in types
    assert types[-4:] == [
        "plan.token_minted",
        "plan.token_consumed",
        "plan.changes_recorded",
        "plan.applied",
    ]
    with ledger.open(db_url) as store:
        results = [
            e.payload
            for e in store.read_stream("plan:green-after-fix")
            if e.type == "validation.result_recorded"
        ]
    lint = [r for r in results if r.validation == "short-lines"]
    assert lint and all(r.mode == "informational" and r.verdict is False for r in lint)


def test_strict_output_deviation(db_url: str, copy) -> None:
    root = copy("strict-output-deviation")
    before = (root / "project" / "notes.md").read_text()
    run = _run(db_url, str(root / "plan.yaml"), cwd=root)
    assert run["state"] == "compensated"
    assert run["halt"]["raw_halt_type"] == "structural_deviation"
    types = _types(db_url, "strict-output-deviation")
    assert types[-5:] == [
        "tool.called",
        "gate.checked",
        "plan.compensation_requested",
        "plan.halted",
        "plan.compensation_completed",
    ]
    assert "plan.applied" not in types and "validation.run_started" not in types
    assert (root / "project" / "notes.md").read_text() == before


def test_escalation_then_resume(db_url: str, copy) -> None:
    root = copy("escalation")
    run = _run(db_url, str(root / "plan.yaml"), cwd=root)
    assert run["state"] == "escalated" and run["decision_id"]
    assert "return a - b" in (root / "project" / "calc.py").read_text()
    key = root / "alice.key"
    assert run_cli("keys", "generate", "--out", str(key)).returncode == 0
    assert run_cli("keys", "add", "alice", f"{key}.pub", "--db", db_url).returncode == 0
    decided = run_cli(
        "authorize",
        run["decision_id"],
        "--key",
        str(key),
        "--revise",
        "fix calc.add",
        "--db",
        db_url,
    )
    assert decided.returncode == 0, decided.stderr
    resumed = _run(db_url, "--resume", "escalation", cwd=root)
    assert (resumed["state"], resumed["outcome"]) == ("applied", "pass")
    assert "return a + b" in (root / "project" / "calc.py").read_text()
    types = _types(db_url, "escalation")
    assert types.count("plan.strategy_revision_requested") == 1
    escalated, decision, minted = (
        types.index("plan.escalated"),
        types.index("plan.decision_recorded"),
        types.index("plan.token_minted"),
    )
    assert escalated < decision < minted  # a token only after the human decided


def test_actor_graph(db_url: str, copy) -> None:
    """The graph example: outputs flow downstream, validations are nodes (one attached,
    one not), the writer's REPORT.md and the fix reach the project through Apply."""
    root = copy("actor-graph")
    run = _run(db_url, str(root / "plan.yaml"), cwd=root)
    assert (run["state"], run["outcome"], run["verify_ok"]) == ("applied", "pass", True)
    assert run["changed_paths"] == ["project/REPORT.md", "project/calc.py"]
    report = (root / "project" / "REPORT.md").read_text()
    assert "- Python files: 3 (20 lines)" in report
    assert "- lines over 60 characters: 1" in report
    assert "- tests passed: true (unittest exit code 0)" in report
    with ledger.open(db_url) as store:
        stream = list(store.read_stream("plan:actor-graph"))
        called = [e.payload for e in stream if e.type == "tool.called"]
        look = next(c for c in called if c.step == "look")
        measure = next(c for c in called if c.step == "measure")
        files = json.loads(store.get_blob(look.output_sha256) or b"")["python_files"]
        assert json.loads(store.get_blob(measure.params_sha256) or b"") == {"files": files}
    # Each attempt ran every node once, step id = the node's name.
    assert sorted(c.step for c in called) == sorted(
        ["look", "lint", "tests", "measure", "report"] * 2
    )
    assert {c.executor for c in called if c.step in ("lint", "tests")} == {"validation"}
    # Only the attached validation gates the plan; the other is data for `report`.
    results = {e.payload.validation for e in stream if e.type == "validation.result_recorded"}
    assert results == {"tests-pass"}
    assert run_cli("audit", "--db", db_url).returncode == 0


def test_registrations_are_idempotent(sqlite_url: str, copy) -> None:
    root = copy("green-after-fix")
    _run(sqlite_url, str(root / "plan.yaml"), cwd=root)
    with ledger.open(sqlite_url) as store:
        registered = [e for e in store.read_all() if e.stream.startswith(("tool:", "attach"))]
    again = _run(sqlite_url, str(root / "plan.yaml"), "--plan-id", "second", cwd=root)
    assert again["state"] == "applied"  # nothing left to fix: passes at once
    with ledger.open(sqlite_url) as store:
        assert [e for e in store.read_all() if e.stream.startswith(("tool:", "attach"))] == (
            registered
        )
    assert_refused(
        run_cli("run", str(root / "plan.yaml"), "--db", sqlite_url, cwd=root), "already exists"
    )


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (
            lambda t: t.replace("  project: calc\n", "  project: calc\n  colour: red\n"),
            "key `plan.colour` (line 7): unknown key",
        ),
        (lambda t: t.replace("retry_limit: 3", "retry_limit: '3'"), "retry_limit"),
        (lambda t: t.replace("agent:", "agnt:"), "key `agnt`"),
        (
            lambda t: t.replace("    mode: required", "    mode: required\n    writes: true"),
            "writes",
        ),
        (lambda t: t + "\n  - : [", "not valid YAML"),
    ],
)
def test_plan_file_mistakes_append_nothing(sqlite_url: str, copy, edit, fragment: str) -> None:
    root = copy("green-after-fix")
    plan = root / "plan.yaml"
    plan.write_text(edit(plan.read_text()))
    result = run_cli("run", str(plan), "--db", sqlite_url, cwd=root)
    assert_refused(result, fragment)
    with ledger.open(sqlite_url) as store:
        assert [
            e.type for e in store.read_all() if not e.stream.startswith(("tool:", "attachment:"))
        ] == []
        if "writes" not in fragment:
            assert store.head().size == 0


def test_demo(tmp_path: Path) -> None:
    """The README's first command: the demo reaches a verified pass on SQLite; kept, it
    says where its ledger is, and a rerun in the same directory starts it over."""
    for _ in range(2):
        result = run_cli("demo", "--keep", str(tmp_path / "demo"), cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "plan green-after-fix: applied (outcome pass)" in result.stdout
        assert "verify: ok" in result.stdout and "plan history:" in result.stdout
        assert f"the ledger is sqlite:///{tmp_path / 'demo' / 'demo.db'}" in result.stdout
        assert (tmp_path / "demo" / "demo.db").exists()


def test_a_temporary_demo_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    (tmp_path / "cwd").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    result = run_cli("demo", cwd=tmp_path / "cwd")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "were temporary: removed" in result.stdout
    assert list((tmp_path / "tmp").iterdir()) == []
    assert list((tmp_path / "cwd").iterdir()) == []


def test_running_a_shipped_example_never_touches_it(tmp_path: Path) -> None:
    """`evidence run examples/green-after-fix/plan.yaml` from a checkout works on a copy:
    the example's files are unchanged after its Apply."""
    example = EXAMPLES / "green-after-fix"
    before = {p: p.read_bytes() for p in sorted(example.rglob("*")) if p.is_file()}
    url = f"sqlite:///{tmp_path / 'evidence.db'}"
    result = run_cli("run", str(example / "plan.yaml"), "--db", url, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "running a copy of green-after-fix in " in result.stdout
    after = {p: p.read_bytes() for p in sorted(example.rglob("*")) if p.is_file()}
    assert after == before
