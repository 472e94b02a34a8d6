"""Skills are a plan's allow-list: a plan created with skills may call only their tools
and validations. A call outside them fails the input gate with ``not_in_skill`` through
every entry point (the Python API, `gate`, `call`, `run`, the hooks; the MCP proxy is in
tests/commands/cli/test_mcp_proxy.py); the skills' versions are pinned at the plan's first Execute.
A
plan without skills calls any registered tool, and says so.

The attacks are the agent's (it holds the database file and the Python API): a forged
passing gate check or call of an outside tool, forged wider pins. Each is refused by the
plane and named by `evidence audit`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec
import pytest

from commands.auditor.audit import audit
from commands.plane import CommandRefused, Plane
from commands.plane.attachments import attach
from commands.plane.authority import TamperedPlan
from commands.plane.gates import gate_input
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import define_skill, register_tool, register_validation
from commands.plane.runs import call_tool
from ledger.events import ExecuteEntered, GateChecked, SkillPin, ToolCalled
from tests.helpers import assert_refused, forge, run_cli

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
PARAMS = b'{"path": "a.txt"}'


@pytest.fixture
def plane(db_url: str):
    with Plane.open(db_url) as p:
        yield p


def _registry(plane: Plane) -> None:
    for name in ("read", "write", "shell"):
        register_tool(plane, {"name": name, "command": ["true"], "input_schema": SCHEMA})
    define_skill(plane, {"name": "reader", "members": ["read"]})


def _plan(plane: Plane, plan_id: str = "P-1", skills: tuple[str, ...] = ("reader",)) -> None:
    create_plan(
        plane,
        plan_id,
        project="api",
        resources=["repo:api"],
        config={"max_iterations": 10},
        skills=list(skills),
    )
    record_strategy(plane, plan_id, "read, never write")
    enter_execute(plane, plan_id)


def _kinds(check: GateChecked) -> list[str]:
    return [d.kind for d in check.deviations]


def test_a_tool_outside_the_skills_fails_the_input_gate(plane: Plane) -> None:
    _registry(plane)
    _plan(plane)
    assert gate_input(plane, "P-1", "read", PARAMS).passed
    outside = gate_input(plane, "P-1", "write", PARAMS)
    assert not outside.passed and _kinds(outside.check) == ["not_in_skill"]
    assert outside.routed == "retry"  # routed like any deviation
    assert "reader" in outside.check.deviations[0].expected
    # Its parameters are not what failed it: even a valid call outside is refused.
    bad = gate_input(plane, "P-1", "shell", b'{"path": 1}')
    assert _kinds(bad.check) == ["not_in_skill"]
    # An unknown tool is still an invented tool.
    assert _kinds(gate_input(plane, "P-1", "nope", b"{}").check) == ["invented_tool"]
    report = call_tool(plane, "P-1", "write", PARAMS)
    assert not report.ok and report.call is None  # never run
    assert audit(plane.store).ok


def test_a_plan_without_skills_calls_any_registered_tool(plane: Plane) -> None:
    _registry(plane)
    _plan(plane, skills=())
    assert gate_input(plane, "P-1", "write", PARAMS).passed
    shown = run_cli("plan", "show", "P-1", "--db", plane.store.url)
    assert "none: any registered tool or validation may be called" in shown.stdout


def test_skills_are_pinned_at_the_first_execute(plane: Plane) -> None:
    """Widening a skill after a plan entered Execute binds later plans only; the plan
    keeps its pins when it re-enters Execute."""
    _registry(plane)
    _plan(plane)
    define_skill(plane, {"name": "reader", "members": ["read", "write"]})  # v2
    assert _kinds(gate_input(plane, "P-1", "write", PARAMS).check) == ["not_in_skill"]
    _plan(plane, "P-2")
    assert gate_input(plane, "P-2", "write", PARAMS).passed
    doc = plane.state("plan:P-1").doc
    assert doc.skill_pins == {"reader": SkillPin(version=1, members=["read"])}
    shown = run_cli("plan", "show", "P-1", "--db", plane.store.url, "--json")
    assert json.loads(shown.stdout)["plan"]["skill_pins"] == {
        "reader": {"version": 1, "members": ["read"]}
    }


def test_an_unknown_skill_is_refused_and_nothing_is_appended(plane: Plane) -> None:
    _registry(plane)
    before = plane.store.head().size
    result = run_cli(
        "plan", "create", "P-1", "--project", "api", "--resource", "repo:api",
        "--skill", "reader", "--skill", "nope", "--db", plane.store.url,
    )  # fmt: skip
    assert_refused(result, "unknown skill(s) 'nope'")
    assert plane.store.head().size == before


def test_every_cli_entry_point_refuses_a_call_outside(plane: Plane, tmp_path: Path) -> None:
    _registry(plane)
    url = plane.store.url
    created = run_cli(
        "plan", "create", "P-1", "--project", "api", "--resource", "repo:api",
        "--skill", "reader", "--config", '{"max_iterations": 10}', "--db", url,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    run_cli("plan", "strategize", "P-1", "--strategy", "read", "--db", url)
    run_cli("plan", "execute", "P-1", "--db", url, "--workdir", str(tmp_path))
    gate = run_cli(
        "gate", "input", "--plan", "P-1", "--tool", "write", "--params", PARAMS.decode(),
        "--db", url, "--json",
    )  # fmt: skip
    assert gate.returncode == 1 and "not_in_skill" in gate.stdout
    call = run_cli(
        "call", "P-1", "--tool", "write", "--params", PARAMS.decode(), "--db", url,
        "--workdir", str(tmp_path),
    )  # fmt: skip
    assert call.returncode == 1 and "not_in_skill" in call.stdout + call.stderr
    hook_input = json.dumps({"tool_name": "write", "tool_input": {"path": "a.txt"}})
    pre = run_cli("hook", "pre-tool", "--plan", "P-1", "--db", url, input=hook_input)
    assert pre.returncode == 2 and "not_in_skill" in pre.stderr
    # `--unknown-tools record` lets no unregistered tool into a plan with skills.
    unknown = json.dumps({"tool_name": "Bash", "tool_input": {"command": "ls"}})
    recorded = run_cli(
        "hook", "pre-tool", "--plan", "P-1", "--unknown-tools", "record", "--db", url,
        input=unknown,
    )  # fmt: skip
    assert recorded.returncode == 2 and "invented_tool" in recorded.stderr
    assert audit(plane.store).ok


def test_a_plan_file_names_its_skills(db_url: str, tmp_path: Path) -> None:
    """`evidence run`: a step calling a tool outside `plan.skills` fails its input gate
    and is never run."""
    project = tmp_path / "proj"
    project.mkdir()
    marker = tmp_path / "written"
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(
        json.dumps(
            {
                "plan": {
                    "id": "P-1",
                    "project": "api",
                    "resources": ["proj"],
                    "skills": ["reader"],
                    "global_config": {"strict_mode": True},
                },
                "tools": [
                    {"name": "read", "command": ["true"]},
                    {"name": "write", "command": ["touch", str(marker)]},
                ],
                "skills": [{"name": "reader", "members": ["read"]}],
                "agent": {
                    "strategies": [
                        {
                            "strategy": "write a file",
                            "attempts": [{"steps": [{"step": "w", "tool": "write"}]}],
                        }
                    ]
                },
            }
        )
    )
    result = run_cli("run", str(plan_file), "--db", db_url, "--workdir", str(tmp_path / "w"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert not marker.exists()
    with Plane.open(db_url) as plane:
        checks = [
            e.payload for e in plane.store.read_stream("plan:P-1") if e.type == "gate.checked"
        ]
        assert _kinds(checks[-1]) == ["not_in_skill"]
        assert audit(plane.store).ok


# -- attacks ------------------------------------------------------------------------------


def _outside_pass(tool: str = "write") -> GateChecked:
    return GateChecked(
        plan_id="P-1",
        gate="input",
        verdict="pass",
        tool=tool,
        tool_version=1,
        step="s1",
        attempt=1,
        iteration=1,
        strict_mode=False,
        checked_sha256="0" * 64,
        schema_sha256=None,
        deviations=[],
    )


def _violations(plane: Plane) -> set[str]:
    return {v.invariant for v in audit(plane.store).violations}


def test_a_forged_pass_for_a_tool_outside_is_refused_and_audited(plane: Plane) -> None:
    _registry(plane)
    _plan(plane)
    forge(plane.store, "plan:P-1", _outside_pass())
    with pytest.raises(TamperedPlan, match="skills"):
        gate_input(plane, "P-1", "read", PARAMS)
    assert {"skills", "illegal_transition"} <= _violations(plane)


def test_a_forged_call_of_a_tool_outside_is_refused_and_audited(plane: Plane) -> None:
    _registry(plane)
    _plan(plane)
    forge(
        plane.store,
        "plan:P-1",
        ToolCalled(
            plan_id="P-1",
            call_id="c1",
            tool="write",
            tool_version=1,
            step="s1",
            attempt=1,
            executor="recorded",
            params_sha256="0" * 64,
            output_sha256="0" * 64,
            started_at="2026-12-01T00:00:00Z",
            ended_at="2026-12-01T00:00:00Z",
            duration_ms=0,
        ),
    )
    with pytest.raises(TamperedPlan, match="skills"):
        gate_input(plane, "P-1", "read", PARAMS)
    assert "illegal_transition" in _violations(plane)


# A forged first Execute names a snapshot (the plan rules require one), so that only the
# forged pins give it away.
SNAPSHOT = "0" * 64


def test_forged_wider_pins_are_refused_and_audited(plane: Plane) -> None:
    """The agent enters Execute itself, pinning its skill with a member the registry
    never gave it."""
    _registry(plane)
    create_plan(plane, "P-1", project="api", resources=["repo:api"], skills=["reader"])
    record_strategy(plane, "P-1", "read")
    wide = {"reader": SkillPin(version=1, members=["read", "write"])}
    forge(
        plane.store,
        "plan:P-1",
        ExecuteEntered(plan_id="P-1", revision=0, skills=wide, snapshot_sha256=SNAPSHOT),
    )
    with pytest.raises(TamperedPlan, match="pinned as the registry defined them"):
        gate_input(plane, "P-1", "write", PARAMS)
    assert "skills" in _violations(plane)


def test_a_plan_without_skills_cannot_be_given_pins(plane: Plane) -> None:
    _registry(plane)
    create_plan(plane, "P-1", project="api", resources=["repo:api"])
    record_strategy(plane, "P-1", "read")
    pins = {"reader": SkillPin(version=1, members=["read"])}
    forge(
        plane.store,
        "plan:P-1",
        ExecuteEntered(plan_id="P-1", revision=0, skills=pins, snapshot_sha256=SNAPSHOT),
    )
    with pytest.raises(CommandRefused, match="pins none"):
        gate_input(plane, "P-1", "read", PARAMS)


# -- Strategize sees its validations -------------------------------------------------------


def test_strategize_lists_the_validations_that_would_bind(plane: Plane, tmp_path: Path) -> None:
    register_validation(
        plane,
        {
            "name": "tests",
            "mode": "required",
            "command": [sys.executable, "-c", "1"],
            "input_schema": {"type": "object", "properties": {"k": {"type": "integer"}}},
        },
    )
    create_plan(plane, "P-1", project="api", resources=["repo:api"])
    attach(plane, "tests", resource="repo:api", args={"k": 1})
    url = plane.store.url
    said = run_cli("plan", "strategize", "P-1", "--strategy", "run the tests", "--db", url)
    assert said.returncode == 0, said.stderr
    assert "would bind it at Execute (1)" in said.stdout and "tests" in said.stdout
    shown = json.loads(run_cli("plan", "show", "P-1", "--db", url, "--json").stdout)
    (member,) = shown["would_bind"]
    assert (member["validation"], member["validation_version"], member["mode"]) == (
        "tests",
        1,
        "required",
    )
    assert member["scope"] == "direct" and member["args"] == {"k": 1}
    run_cli("plan", "execute", "P-1", "--db", url, "--workdir", str(tmp_path))
    after = json.loads(run_cli("plan", "show", "P-1", "--db", url, "--json").stdout)
    assert after["would_bind"] is None
    assert [b["validation"] for b in after["plan"]["binding"]] == ["tests"]


def test_the_fold_of_a_plan_without_skills_is_unchanged() -> None:
    """Old ledgers keep verifying: a plan without skills has no skills fields at all."""
    from projections.documents import new_plan, to_json
    from tests.helpers import plan_created

    doc = to_json(new_plan(plan_created().payload))
    assert "skills" not in doc and "skill_pins" not in doc
    assert msgspec.json.decode(msgspec.json.encode(doc)) == doc
