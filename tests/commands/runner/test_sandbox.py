"""Nothing commits before Apply: every entry point works in the plan's sandbox, a call
that fails a gate or halts leaves it as it was, and a validation called as a tool is
read-only (seed 000: Apply is the point of no return; seed 003: nothing commits)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from commands.plane import Plane
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool, register_validation
from commands.plane.runs import call_tool
from tests.helpers import invoke, work

TOUCH = """import json, pathlib
pathlib.Path("touched.txt").write_text("x")
print(json.dumps({"ok": OK}))
"""
WRITER = """import json, pathlib
pathlib.Path("written.txt").write_text("x")
print(json.dumps({"passed": True}))
"""
OK_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def _script(tmp_path: Path, name: str, text: str) -> list[str]:
    (tmp_path / name).write_text(text)
    return [sys.executable, str(tmp_path / name)]


@pytest.fixture
def plane(db_url: str, tmp_path: Path):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "app.py").write_text("print('hello')\n")
    with Plane.open(db_url) as p:
        register_tool(
            p,
            {
                "name": "touch-it",
                "output_schema": OK_SCHEMA,
                "command": _script(tmp_path, "bad.py", TOUCH.replace("OK", '"yes"')),
            },
        )
        register_tool(
            p,
            {
                "name": "touch-ok",
                "output_schema": OK_SCHEMA,
                "command": _script(tmp_path, "good.py", TOUCH.replace("OK", "True")),
            },
        )
        register_validation(
            p,
            {
                "name": "some-validation",
                "mode": "informational",
                "command": _script(tmp_path, "writer.py", WRITER),
            },
        )
        create_plan(p, "P-1", project="api", resources=[str(project)])
        record_strategy(p, "P-1", "touch things")
        enter_execute(p, "P-1")
        yield p


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_the_sandbox_is_made_at_execute_and_named_by_digest(plane: Plane, tmp_path: Path) -> None:
    sandbox = work(plane)
    assert _files(sandbox) == _files(tmp_path / "proj")
    assert "P-1" not in str(sandbox) and "proj" not in sandbox.name


def test_a_call_whose_output_gate_fails_leaves_everything_as_it_was(
    plane: Plane, tmp_path: Path
) -> None:
    real, sandbox = tmp_path / "proj", work(plane)
    before_real, before_sandbox = _files(real), _files(sandbox)
    report = call_tool(plane, "P-1", "touch-it", {})
    assert report.call is not None and not report.output_gate.passed  # "yes" is no bool
    assert _files(real) == before_real and _files(sandbox) == before_sandbox


def test_a_passing_call_changes_the_sandbox_only(plane: Plane, tmp_path: Path) -> None:
    real = tmp_path / "proj"
    before_real = _files(real)
    assert call_tool(plane, "P-1", "touch-ok", {}).ok
    assert (work(plane) / "touched.txt").read_text() == "x"
    assert _files(real) == before_real  # nothing reaches the real files before Apply


@pytest.mark.parametrize("policy", ["none", "landlock"])
def test_a_validation_called_as_a_tool_is_read_only(
    plane: Plane, tmp_path: Path, policy: str
) -> None:
    plan_id = "P-1"
    if policy == "none":  # opted out of the kernel's confinement: the plane detects it
        plan_id = "P-U"
        config = {"confinement": "none"}
        create_plan(
            plane, plan_id, project="api", resources=[str(tmp_path / "proj")], config=config
        )
        record_strategy(plane, plan_id, "touch things")
        enter_execute(plane, plan_id)
    real, sandbox = tmp_path / "proj", work(plane, plan_id)
    before_real, before_sandbox = _files(real), _files(sandbox)
    report = call_tool(plane, plan_id, "some-validation", {})
    assert report.call is not None and report.call.executor == "validation"
    assert not report.output_gate.passed  # a read-only violation is no structured return
    if policy == "none":
        assert json.loads(report.output)["cause"] == "read_only_violation"
        assert report.call.confinement == "unconfined"
    else:  # the kernel refused the write: the program failed before it returned
        found = json.loads(report.output)
        assert found["cause"] == "malformed" and "PermissionError" in found["error"]
        assert report.call.confinement == "landlock"
    assert _files(real) == before_real and _files(sandbox) == before_sandbox


def test_the_cli_call_works_in_the_sandbox_too(plane: Plane, tmp_path: Path) -> None:
    result = invoke("call", "P-1", "--tool", "touch-it", "--params", "{}", "--db", plane.store.url)
    assert result.exit_code == 1, result.output  # the output gate's verdict
    assert not (tmp_path / "proj" / "touched.txt").exists()
    assert not (work(plane) / "touched.txt").exists()
    shown = invoke("plan", "show", "P-1", "--json", "--db", plane.store.url)
    assert json.loads(shown.stdout)["sandbox"] == {str(tmp_path / "proj"): str(work(plane))}
