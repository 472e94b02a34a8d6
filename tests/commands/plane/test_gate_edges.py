"""The gate's own edges: a boolean schema is honoured as declared (``false``: nothing
passes; ``true``: anything), the digest a check records is the registered schema's, and a
step's output schema only ever narrows the registered one (issue 42, item 5)."""

from __future__ import annotations

from typing import Any

import pytest

from commands.plane import Plane
from commands.plane.gates import gate_input, gate_output
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool

HITS = {
    "type": "object",
    "required": ["hits"],
    "properties": {"hits": {"type": "array", "items": {"type": "string"}}},
}


def _plane_with(url: str, **tools: Any) -> Plane:
    plane = Plane.open(url)
    for name, schema in tools.items():
        register_tool(
            plane,
            {"name": name, "command": ["true"], "input_schema": schema, "output_schema": HITS},
        )
    create_plan(plane, "P-1", project="api", resources=["repo:api"])
    record_strategy(plane, "P-1", "search")
    enter_execute(plane, "P-1")
    return plane


@pytest.mark.parametrize(
    ("schema", "params", "passes"),
    [
        (False, {}, False),
        (False, {"query": "x"}, False),
        (True, {}, True),
        (True, {"anything": [1, "two"]}, True),
        ({}, {"anything": 1}, True),
    ],
    ids=["false-empty", "false-params", "true-empty", "true-params", "empty-schema"],
)
def test_a_boolean_input_schema_is_honoured_as_declared(
    db_url: str, schema: Any, params: Any, passes: bool
) -> None:
    with _plane_with(db_url, tool=schema) as plane:
        registered = plane.log().tool("tool")
        assert registered is not None
        outcome = gate_input(plane, "P-1", "tool", params, step="s1")
        assert outcome.passed is passes
        assert outcome.check.schema_sha256 == registered.spec.input_schema_sha256


@pytest.mark.parametrize("step_schema", [{}, True, {"type": "object"}])
def test_a_steps_output_schema_never_widens_the_registered_one(
    db_url: str, step_schema: Any
) -> None:
    with _plane_with(db_url, search={"type": "object"}) as plane:
        assert gate_input(plane, "P-1", "search", {}, step="s1").passed
        outcome = gate_output(plane, "P-1", "s1", {"hits": "not a list"}, schema=step_schema)
        assert not outcome.passed
        assert outcome.check.schema_sha256 == plane.log().tool("search").spec.output_schema_sha256


def test_a_steps_output_schema_narrows_with_both_checks_recorded(db_url: str) -> None:
    with _plane_with(db_url, search={"type": "object"}) as plane:
        assert gate_input(plane, "P-1", "search", {}, step="s1").passed
        outcome = gate_output(plane, "P-1", "s1", {"hits": ["a"]}, schema={"type": "array"})
        assert not outcome.passed
        checks = [e.payload for e in outcome.events if e.type == "gate.checked"]
        assert [c.verdict for c in checks] == ["pass", "fail"]
        passed = gate_output(plane, "P-1", "s1", {"hits": ["a"]}, schema=HITS)
        assert passed.passed and len(passed.events) == 2


def test_the_service_gates_an_output_by_the_registered_schema_first(
    sqlite_url: str,
) -> None:
    from datetime import timedelta

    from starlette.testclient import TestClient

    from commands.plane.credentials import issue_credential
    from commands.service import create_app

    with _plane_with(sqlite_url, search={"type": "object"}) as plane:
        assert gate_input(plane, "P-1", "search", {}, step="s1").passed
        token = issue_credential(plane, "P-1", ttl=timedelta(hours=1)).token
    auth = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(sqlite_url)) as client:
        # a step's own schema (`{}` would pass anything) is not accepted through the
        # service at all: refused, nothing compiled, nothing recorded
        own = client.post(
            "/v1/gate/output",
            headers=auth,
            json={"step": "s1", "output": {"hits": 3}, "schema": {}},
        )
        assert own.status_code == 422 and "/schema" in own.text, own.text
        answer = client.post(
            "/v1/gate/output", headers=auth, json={"step": "s1", "output": {"hits": 3}}
        )
    gate = answer.json()["gate"]
    assert gate["verdict"] == "fail", gate
