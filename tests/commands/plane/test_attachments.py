"""Attachments and their resolution (seed 000 "Attachment Scoping"), table-driven."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ledger
from commands.plane import CommandRefused, Plane
from commands.plane.attachments import attach, detach, resolve_attachments
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool, register_validation
from tests.helpers import assert_refused, run_cli

LINT = {
    "name": "lint",
    "mode": "informational",
    "command": ["ruff", "check", "{path}"],
    "input_schema": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "strict": {"type": "boolean"}},
    },
}
TESTS = {"name": "tests", "mode": "required", "command": ["pytest", "-q"]}


@pytest.fixture
def plane(db_url: str):
    with Plane.open(db_url) as p:
        register_validation(p, LINT)
        register_validation(p, TESTS)
        register_tool(p, {"name": "formatter", "command": ["black", "."]})
        create_plan(p, "P-1", project="api", resources=["repo:api"])
        create_plan(p, "P-2", project="web", resources=["repo:api"])
        yield p


def _ids(rows) -> list[tuple[str, str, dict]]:
    return [(r.validation, r.scope, r.args) for r in rows]


# (attachments as (validation, scope, scope value, args), query, expected rows)
CASES = [
    pytest.param(
        [("tests", "direct", None, {})],
        {},
        [("tests", "direct", {})],
        id="direct applies everywhere",
    ),
    pytest.param([("tests", "project", "api", {})], {}, [], id="project needs its project"),
    pytest.param(
        [("tests", "project", "api", {})],
        {"project": "api"},
        [("tests", "project", {})],
        id="project matches",
    ),
    pytest.param([("tests", "project", "web", {})], {"project": "api"}, [], id="other project"),
    pytest.param(
        [("tests", "plan", "P-1", {})], {"plan": "P-1"}, [("tests", "plan", {})], id="plan matches"
    ),
    pytest.param([("tests", "plan", "P-1", {})], {"plan": "P-2"}, [], id="other plan"),
    pytest.param(
        [("lint", "direct", None, {"path": "src"}), ("lint", "project", "api", {"path": "src"})],
        {"project": "api"},
        [("lint", "project", {"path": "src"})],
        id="identical args: most specific wins (project over direct)",
    ),
    pytest.param(
        [
            ("lint", "direct", None, {"path": "src"}),
            ("lint", "project", "api", {"path": "src"}),
            ("lint", "plan", "P-1", {"path": "src"}),
        ],
        {"plan": "P-1"},
        [("lint", "plan", {"path": "src"})],
        id="identical args: plan beats project and direct",
    ),
    pytest.param(
        [("lint", "direct", None, {"path": "src"}), ("lint", "direct", None, {"path": "tests"})],
        {},
        [("lint", "direct", {"path": "src"}), ("lint", "direct", {"path": "tests"})],
        id="same validation, different args: both apply",
    ),
    pytest.param(
        [
            ("lint", "direct", None, {"path": "src", "strict": True}),
            ("lint", "plan", "P-1", {"strict": True, "path": "src"}),
        ],
        {"plan": "P-1"},
        [("lint", "plan", {"path": "src", "strict": True})],
        id="args compared canonically (key order is not a difference)",
    ),
    pytest.param(
        [("lint", "direct", None, {}), ("tests", "plan", "P-1", {})],
        {"plan": "P-1"},
        [("lint", "direct", {}), ("tests", "plan", {})],
        id="union across scopes",
    ),
]


@pytest.mark.parametrize(("attachments", "query", "expected"), CASES)
def test_resolution(plane: Plane, attachments: list, query: dict, expected: list) -> None:
    for validation, scope, value, args in attachments:
        attach(
            plane,
            validation,
            resource="repo:api",
            args=args,
            project=value if scope == "project" else None,
            plan=value if scope == "plan" else None,
        )
    attach(plane, "tests", resource="repo:other")  # another resource never applies
    got = resolve_attachments(plane, resource="repo:api", **query)
    assert sorted(_ids(got), key=str) == sorted(expected, key=str)
    assert all(r.mode == {"lint": "informational", "tests": "required"}[r.validation] for r in got)


def test_a_plan_brings_its_project(plane: Plane) -> None:
    attach(plane, "tests", resource="repo:api", project="api")
    assert _ids(resolve_attachments(plane, resource="repo:api", plan="P-1")) == [
        ("tests", "project", {})
    ]
    assert resolve_attachments(plane, resource="repo:api", plan="P-2") == []


def test_detach_and_as_of(plane: Plane) -> None:
    first = attach(plane, "tests", resource="repo:api")
    attached_at = plane.store.head().size
    detach(plane, first.attachment_id, reason="flaky")
    assert resolve_attachments(plane, resource="repo:api") == []
    back = resolve_attachments(plane, resource="repo:api", as_of=attached_at)
    assert [r.attachment_id for r in back] == [first.attachment_id]
    assert resolve_attachments(plane, resource="repo:api", as_of=attached_at - 1) == []
    with pytest.raises(CommandRefused, match="already detached"):
        detach(plane, first.attachment_id)


def test_the_same_validation_attached_twice_gets_two_ulids(plane: Plane) -> None:
    a = attach(plane, "lint", resource="repo:api", args={"path": "src"})
    b = attach(plane, "lint", resource="repo:api", args={"path": "docs"})
    assert a.attachment_id != b.attachment_id and len(a.attachment_id) == 26


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"validation": "ghost"}, "unknown validation 'ghost'"),
        ({"validation": "formatter"}, "is a tool, not a validation"),
        ({"resource": "repo api"}, "invalid resource"),
        ({"plan": "P-404"}, "unknown plan 'P-404'"),
        ({"project": "api", "plan": "P-1"}, "one scope"),
        ({"args": {"path": 5}}, "/path: wrong_type"),
        ({"args": {"path": "src", "extra": 1}}, "/extra: extra_field"),
        ({"validation": "tests", "args": {"x": 1}}, "takes no --args"),
    ],
)
def test_refused_attachments_append_nothing(plane: Plane, kwargs: dict, fragment: str) -> None:
    before = plane.store.head().size
    call = {"validation": "lint", "resource": "repo:api", **kwargs}
    with pytest.raises(CommandRefused, match=fragment.replace("(", r"\(")):
        attach(plane, call.pop("validation"), **call)
    assert plane.store.head().size == before


def test_cli(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as p:
        register_validation(p, LINT)
        create_plan(p, "P-1", project="api", resources=["repo:api"])
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"path": "src"}))
    made = run_cli(
        "attach",
        "lint",
        "--resource",
        "repo:api",
        "--plan",
        "P-1",
        "--args",
        f"@{args}",
        "--db",
        db_url,
    )
    assert made.returncode == 0, made.stderr
    ulid = made.stdout.strip()
    assert len(ulid) == 26
    resolved = run_cli(
        "resolve", "--resource", "repo:api", "--plan", "P-1", "--json", "--db", db_url
    )
    rows = json.loads(resolved.stdout)["attachments"]
    assert [(r["attachment_id"], r["scope"], r["mode"], r["args"]) for r in rows] == [
        (ulid, "plan", "informational", {"path": "src"})
    ]
    table = run_cli("resolve", "--resource", "repo:api", "--plan", "P-1", "--db", db_url)
    assert ulid in table.stdout and "informational" in table.stdout
    with ledger.open(db_url) as store:
        before = store.head().size
    for bad, fragment in [
        (["attach", "ghost", "--resource", "repo:api"], "unknown validation"),
        (["attach", "lint", "--resource", "repo:api", "--args", "{nope"], "not valid JSON"),
        (["attach", "lint", "--resource", "repo:api", "--args", "[1]"], "JSON object"),
        (
            ["attach", "lint", "--resource", "repo:api", "--project", "a", "--plan", "P-1"],
            "not both",
        ),
        (["detach", "01J0000000000000000000000Z"], "unknown attachment"),
        (["resolve", "--resource", "repo:api", "--plan", "nope"], "unknown plan"),
        (["resolve", "--resource", "repo:api", "--as-of", "999"], "outside the log"),
    ]:
        assert_refused(run_cli(*bad, "--db", db_url), fragment)
    assert run_cli("detach", ulid, "--db", db_url).returncode == 0
    with ledger.open(db_url) as store:
        assert store.head().size == before + 1
