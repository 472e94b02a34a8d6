"""The structural gates (seed 003): deviation is failure, recorded with every deviation,
routed by strict_mode; nothing coerced, dropped or filled."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

import ledger
from commands.plane import CommandRefused, Plane
from commands.plane.gates import gate_input, gate_output
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan, get_plan
from commands.plane.registry import register_tool
from projections.states import to_json
from tests.helpers import assert_refused, run_cli

SEARCH = {
    "name": "search",
    "command": ["grep", "-r", "{query}"],
    "input_schema": {
        "type": "object",
        "required": ["query"],
        "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer"},
            "options": {"type": "object", "properties": {"case": {"type": "boolean"}}},
        },
    },
    "output_schema": {
        "type": "object",
        "required": ["hits"],
        "properties": {"hits": {"type": "array", "items": {"type": "string"}}},
    },
}


def _plane(url: str, *, strict: bool = False, max_iterations: int = 3) -> Plane:
    plane = Plane.open(url)
    register_tool(plane, SEARCH)
    create_plan(
        plane,
        "P-1",
        project="api",
        resources=["repo:api"],
        config={"strict_mode": strict, "max_iterations": max_iterations},
    )
    record_strategy(plane, "P-1", "search the code")
    enter_execute(plane, "P-1")
    return plane


@pytest.fixture
def plane(db_url: str):
    p = _plane(db_url)
    yield p
    p.close()


# Seed 003's table: each behaviour is a failure, recorded; the right-hand column
# (drop, null-fill, coerce, call anyway) never happens.
SEED_003 = [
    pytest.param({"query": "x", "extra": 1}, [("/extra", "extra_field")], id="extra field"),
    pytest.param({"limit": 5}, [("/query", "missing_required")], id="missing required"),
    pytest.param({"query": "x", "limit": "5"}, [("/limit", "wrong_type")], id="wrong scalar type"),
    pytest.param({"query": None}, [("/query", "wrong_type")], id="null is not a value"),
    pytest.param(
        {"query": "x", "limit": 5.0}, [("/limit", "wrong_type")], id="1.0 is not an integer"
    ),
    pytest.param(
        {"query": "x", "limit": True}, [("/limit", "wrong_type")], id="true is not an integer"
    ),
    pytest.param(
        {"query": "x", "options": {"case": True, "x": 1, "y": 2}},
        [("/options/x", "extra_field"), ("/options/y", "extra_field")],
        id="every deviation, one per field",
    ),
]


@pytest.mark.parametrize(("params", "expected"), SEED_003)
def test_input_gate_deviations(plane: Plane, params: dict, expected: list) -> None:
    raw = json.dumps(params).encode()
    outcome = gate_input(plane, "P-1", "search", raw)
    assert not outcome.passed
    assert sorted((d.pointer, d.kind) for d in outcome.check.deviations) == sorted(expected)
    gate_event = outcome.events[0]
    assert gate_event.type == "gate.checked"
    assert gate_event.payload == outcome.check
    # The exact bytes checked are kept (nothing dropped or coerced) and named by digest.
    assert plane.store.get_blob(outcome.check.checked_sha256) == raw
    assert (
        outcome.check.schema_sha256
        == plane.projections.document("tools", "search")[0].spec.input_schema_sha256
    )


def test_invented_tool_fails_at_the_input_gate(plane: Plane) -> None:
    outcome = gate_input(plane, "P-1", "rm-rf", b'{"path": "/"}')
    assert [(d.kind, d.pointer) for d in outcome.check.deviations] == [("invented_tool", "")]
    assert outcome.check.tool_version is None and outcome.routed == "retry"


def test_passing_checks_are_recorded_too(plane: Plane) -> None:
    outcome = gate_input(plane, "P-1", "search", b'{"query": "x", "limit": 3}', step="s1")
    assert outcome.passed and outcome.routed is None and len(outcome.events) == 1
    assert to_json(get_plan(plane, "P-1"))["steps"] == {"s1": {"tool": "search", "tool_version": 1}}


def test_output_gate_declarations(plane: Plane) -> None:
    gate_input(plane, "P-1", "search", b'{"query": "x"}', step="s1")
    # The step's tool declares the output: extra fields are failures, not dropped.
    assert gate_output(plane, "P-1", "s1", b'{"hits": ["a.py"]}').passed
    bad = gate_output(plane, "P-1", "s1", b'{"hits": ["a.py"], "score": 0.9}')
    assert [(d.pointer, d.kind) for d in bad.check.deviations] == [("/score", "extra_field")]
    # A declaration given with the step wins, and is normalised closed.
    declared = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert gate_output(plane, "P-1", "s2", b'{"n": 1}', schema=declared).passed
    # Neither: nothing unchecked ever becomes state.
    none = gate_output(plane, "P-1", "s3", b'{"n": 1}')
    assert [d.kind for d in none.check.deviations] == ["no_output_declaration"]


def test_without_strict_mode_a_deviation_retries_until_max_iterations(db_url: str) -> None:
    with _plane(db_url, max_iterations=2) as plane:
        first = gate_input(plane, "P-1", "search", b'{"q": 1}')
        assert (first.routed, first.iterations_left) == ("retry", 1)
        assert [e.type for e in first.events] == ["gate.checked", "plan.attempt_failed"]
        assert first.events[1].causation_id == first.events[0].event_id
        assert get_plan(plane, "P-1").iteration == 2
        # The last iteration fails: the attempt has failed, and the failure loop takes
        # it (seed 003: only strict_mode is terminal): a strategy revision first.
        second = gate_input(plane, "P-1", "search", b'{"q": 1}')
        assert (second.routed, second.iterations_left) == ("revised", 0)
        assert [e.type for e in second.events] == [
            "gate.checked",
            "plan.attempt_failed",
            "plan.strategy_revision_requested",
        ]
        doc = get_plan(plane, "P-1")
        assert (doc.phase, doc.terminal, doc.revisions_used) == ("strategize", None, 1)
        with pytest.raises(CommandRefused, match="only in Execute"):
            gate_input(plane, "P-1", "search", b'{"query": "x"}')
        # A new strategy gets fresh iterations; spent again with no revision left, a
        # human decides: an escalation, never a terminal halt.
        record_strategy(plane, "P-1", "search differently")
        enter_execute(plane, "P-1")
        assert gate_input(plane, "P-1", "search", b'{"q": 1}').routed == "retry"
        third = gate_input(plane, "P-1", "search", b'{"q": 1}')
        assert third.routed == "escalated"
        assert [e.type for e in third.events] == [
            "gate.checked",
            "plan.attempt_failed",
            "plan.escalated",
            "plan.halted",
        ]
        halt = third.events[-1].payload
        assert (halt.halt_type, halt.raw_halt_type, halt.terminal) == (
            "escalate",
            "escalated",
            False,
        )
        assert "max_iterations" in halt.reason
        doc = get_plan(plane, "P-1")
        assert doc.terminal is None and doc.pending_decision is not None
        # While a human decides, no gate check is recorded.
        before = plane.store.head().size
        with pytest.raises(CommandRefused, match="awaits a human decision"):
            gate_input(plane, "P-1", "search", b'{"query": "x"}')
        assert plane.store.head().size == before
    audited = run_cli("audit", "--db", db_url, "--json")
    assert audited.returncode == 0, audited.stdout
    checks = json.loads(audited.stdout)
    assert checks["ok"] is True


def test_with_strict_mode_the_first_deviation_is_terminal(db_url: str) -> None:
    with _plane(db_url, strict=True) as plane:
        outcome = gate_output(
            plane, "P-1", "s1", b'{"hits": []}', schema={"type": "object", "properties": {}}
        )
        assert outcome.routed == "compensation"
        assert [e.type for e in outcome.events] == [
            "gate.checked",
            "plan.compensation_requested",
            "plan.halted",
        ]
        assert len({e.position for e in outcome.events}) == 3  # one append, one transaction
        doc = get_plan(plane, "P-1")
        assert doc.terminal == "failed" and doc.compensation.status == "requested"
        assert doc.halt.raw_halt_type == "structural_deviation"


def test_gates_only_in_execute(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        register_tool(plane, SEARCH)
        create_plan(plane, "P-1", project="api", resources=["repo:api"])
        before = plane.store.head().size
        with pytest.raises(CommandRefused, match="only in Execute"):
            gate_input(plane, "P-1", "search", b'{"query": "x"}')
        with pytest.raises(CommandRefused, match="unknown plan"):
            gate_input(plane, "P-9", "search", b'{"query": "x"}')
        with pytest.raises(CommandRefused, match="no strategy"):
            enter_execute(plane, "P-1")
        assert plane.store.head().size == before


def test_parameter_values_never_reach_the_log(plane: Plane) -> None:
    secret = "sk-live-4f9a8c7e2b"
    outcome = gate_input(
        plane, "P-1", "search", json.dumps({"query": secret, "token": secret}).encode()
    )
    assert not outcome.passed
    for event in plane.store.read_all():
        assert secret not in msgspec.json.encode(event.to_json()).decode()


def test_cli(db_url: str, tmp_path: Path) -> None:
    _plane(db_url).close()
    ok = run_cli(
        "gate",
        "input",
        "--plan",
        "P-1",
        "--tool",
        "search",
        "--params",
        '{"query": "x"}',
        "--step",
        "s1",
        "--db",
        db_url,
    )
    assert ok.returncode == 0, ok.stderr
    output = tmp_path / "out.json"
    output.write_text('{"hits": ["a"], "extra": true}')
    failed = run_cli(
        "gate",
        "output",
        "--plan",
        "P-1",
        "--step",
        "s1",
        "--output",
        f"@{output}",
        "--json",
        "--db",
        db_url,
    )
    assert failed.returncode == 1
    gate = json.loads(failed.stdout)["gate"]
    assert gate["verdict"] == "fail" and gate["routed"] == "retry"
    assert gate["deviations"] == [
        {
            "pointer": "/extra",
            "kind": "extra_field",
            "expected": "no such property",
            "actual_type": "boolean",
            "schema_pointer": "/additionalProperties",
        }
    ]
    table = run_cli(
        "gate", "input", "--plan", "P-1", "--tool", "ghost", "--params", "{}", "--db", db_url
    )
    assert table.returncode == 1 and "invented_tool" in table.stdout
    history = json.loads(run_cli("plan", "history", "P-1", "--json", "--db", db_url).stdout)
    summaries = [e["summary"] for e in history["events"] if e["type"] == "gate.checked"]
    assert summaries == [
        "input gate, tool search: pass",
        "output gate, step s1: fail, 1 deviation(s) (extra_field)",
        "input gate, tool ghost: fail, 1 deviation(s) (invented_tool)",
    ]
    with ledger.open(db_url) as store:
        before = store.head().size
    for bad, fragment in [
        (
            ["gate", "input", "--plan", "P-1", "--tool", "search", "--params", "@/nope"],
            "cannot read",
        ),
        (
            [
                "gate",
                "output",
                "--plan",
                "P-1",
                "--step",
                "s",
                "--output",
                "{}",
                "--schema",
                '{"type": "strng"}',
            ],
            "invalid JSON Schema",
        ),
        (
            ["gate", "input", "--plan", "P-404", "--tool", "search", "--params", "{}"],
            "unknown plan",
        ),
        (["gate", "input", "--plan", "P-1", "--tool", "search"], "--params"),
        (["plan", "history", "P-404"], "unknown plan"),
    ]:
        assert_refused(run_cli(*bad, "--db", db_url), fragment)
    with ledger.open(db_url) as store:
        assert store.head().size == before
