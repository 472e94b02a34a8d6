"""Tools, validations and skills (seed 000): registration, versioning, read-only
enforcement, wrapping with JMESPath transforms, structured results, and the CLI."""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import rfc8785

from commands.plane import CommandRefused, Plane
from commands.plane.registry import (
    define_skill,
    get_skill,
    get_tool,
    get_validation,
    list_skills,
    list_tools,
    list_validations,
    register_tool,
    register_validation,
)
from commands.runner.results import (
    RESULT_SCHEMA,
    TransformError,
    apply_transform,
    check_validation_result,
)
from projections.documents import apply_deltas
from projections.states import to_json
from tests.helpers import assert_refused, run_cli

PYTEST_TOOL: dict[str, Any] = {
    "name": "pytest",
    "description": "run the test suite",
    "command": ["pytest", "-q", "{path}"],
    "input_schema": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
    "output_schema": {
        "type": "object",
        "properties": {
            "exit_code": {"type": "integer"},
            "summary": {"type": "string"},
            "failed": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["exit_code"],
    },
    "resource_slots": ["repo"],
    "timeout": 120,
}

TESTS_PASS = "{passed: exit_code == `0`, message: summary}"
NO_FAILURES = "{passed: length(failed) == `0`, data: {failed: failed}}"


def tool(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(PYTEST_TOOL)
    spec.update(changes)
    return spec


def wrapper(name: str = "tests-pass", transform: str = TESTS_PASS, **extra: Any) -> dict[str, Any]:
    return {"name": name, "mode": "required", "wraps": "pytest", "transform": transform, **extra}


def command_validation(name: str = "lint", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "mode": "informational",
        "command": ["ruff", "check", "{path}"],
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
        **extra,
    }


@pytest.fixture
def plane(db_url: str) -> Iterator[Plane]:
    with Plane.open(db_url) as p:
        yield p


def size(plane: Plane) -> int:
    return plane.store.head().size


@pytest.fixture(scope="module")
def _shared_plane(module_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    root = tmp_path_factory.mktemp("shared-plane")
    with pytest.MonkeyPatch.context() as patch:  # the tests' own plane key and state
        patch.setenv("EVIDENCE_PLANE_KEY", str(root / "plane.key"))
        patch.setenv("EVIDENCE_STATE_DIR", str(root))
        with Plane.open(module_db_url) as p:
            yield p


@pytest.fixture
def empty_plane(_shared_plane: Plane) -> Plane:
    """A plane on an empty ledger, shared by the refusal tests below that start from one:
    each is refused and appends nothing (``refused`` checks it), so each finds the
    ledger as empty as a fresh one; checked here too, before every test."""
    assert size(_shared_plane) == 0, "a test appended to the shared empty plane"
    return _shared_plane


def refused(plane: Plane, fn: Any, spec: Any, fragment: str) -> str:
    """Assert ``fn(plane, spec)`` is refused with ``fragment`` and appends nothing."""
    before = size(plane)
    with pytest.raises(CommandRefused) as info:
        fn(plane, spec)
    assert fragment in str(info.value), str(info.value)
    assert size(plane) == before
    return str(info.value)


def payload(plane: Plane, stream: str, version: int = -1) -> dict[str, Any]:
    return plane.store.read_stream(stream)[version].to_json()["payload"]


# -- tools -------------------------------------------------------------------------------


def test_tool_stores_declared_and_normalised_schemas_with_digest(plane: Plane) -> None:
    result = register_tool(plane, PYTEST_TOOL)
    assert (result.kind, result.name, result.version, result.changed) == ("tool", "pytest", 1, True)
    event = payload(plane, "tool:pytest")
    assert event["type"] == "tool.registered" and event["version"] == 1
    for which in ("input", "output"):
        declared = PYTEST_TOOL[f"{which}_schema"]
        normalised = event[f"{which}_schema"]
        assert event[f"declared_{which}_schema"] == declared
        assert normalised == {**declared, "additionalProperties": False}  # closed
        digest = hashlib.sha256(rfc8785.dumps(normalised)).hexdigest()
        assert event[f"{which}_schema_sha256"] == digest
    # A nested object schema is closed too, the declared one is kept as written.
    nested = tool(
        input_schema={
            "type": "object",
            "properties": {"opts": {"type": "object", "properties": {"k": {"type": "integer"}}}},
        }
    )
    register_tool(plane, nested)
    event = payload(plane, "tool:pytest")
    assert event["input_schema"]["properties"]["opts"]["additionalProperties"] is False
    assert "additionalProperties" not in event["declared_input_schema"]["properties"]["opts"]
    # An object that opens itself stays open.
    register_tool(plane, tool(input_schema={"type": "object", "additionalProperties": True}))
    assert payload(plane, "tool:pytest")["input_schema"]["additionalProperties"] is True


def test_tool_fields_are_recorded(plane: Plane) -> None:
    spec = tool(
        source="builtin",
        capability="testing",
        lifecycle={"pre": "echo start"},
        code="print(1)",
        idempotent=True,
        writes=True,
        timeout=1.5,
    )
    register_tool(plane, spec)
    event = payload(plane, "tool:pytest")
    assert event["command"] == ["pytest", "-q", "{path}"]
    assert event["resource_slots"] == ["repo"] and event["timeout_ms"] == 1500
    assert (event["source"], event["capability"], event["code"]) == (
        "builtin",
        "testing",
        "print(1)",
    )
    assert event["lifecycle"] == {"pre": "echo start"}
    assert event["idempotent"] is True and event["writes"] is True  # a tool may write
    mcp = {"name": "search", "mcp_server": "docs", "mcp_tool_name": "search_docs"}
    assert register_tool(plane, mcp).document["spec"]["mcp_tool_name"] == "search_docs"


def test_versioning_change_identical_and_delta(plane: Plane) -> None:
    register_tool(plane, PYTEST_TOOL)
    before = size(plane)
    again = register_tool(plane, copy.deepcopy(PYTEST_TOOL))
    assert (again.changed, again.version) == (False, 1)
    assert size(plane) == before  # identical: nothing appended
    changed = register_tool(plane, tool(description="run the suite, quietly"))
    assert (changed.changed, changed.version) == (True, 2)
    events = plane.store.read_stream("tool:pytest")
    assert [e.stream_version for e in events] == [1, 2]
    ops = {(op["op"], op["path"]) for op in events[-1].delta}
    assert ("replace", "/spec/description") in ops and ("replace", "/version") in ops
    assert not any(op["path"].startswith("/spec/command") for op in events[-1].delta)
    # Every version stays readable; the deltas alone rebuild the document.
    assert get_tool(plane, "pytest", version=1)["spec"]["description"] == "run the test suite"
    assert get_tool(plane, "pytest")["latest_version"] == 2
    doc = plane.projections.document("tools", "pytest")[0]
    assert apply_deltas(e.delta for e in events) == to_json(doc)
    # Key order in a schema is not a change.
    reordered = tool(
        description="run the suite, quietly",
        input_schema=dict(reversed(PYTEST_TOOL["input_schema"].items())),
    )
    assert register_tool(plane, reordered).changed is False


def test_true_and_one_are_different_schemas(plane: Plane) -> None:
    register_tool(plane, tool(input_schema={"const": True}))
    assert register_tool(plane, tool(input_schema={"const": 1})).version == 2


@pytest.mark.parametrize(
    ("schema", "fragment"),
    [
        ({"type": "objekt"}, "input_schema: invalid JSON Schema at /type"),
        ({"type": "object", "properties": {"p": {"minLength": -1}}}, "at /properties/p/minLength"),
        ({"$ref": "https://example.com/schema.json"}, "at /$ref"),
        ({"properties": {"p": {"$ref": "other.json#/x"}}}, "refers outside the document"),
        ("a string", "input_schema: invalid JSON Schema"),
    ],
)
def test_invalid_schemas_are_refused_with_their_pointer(
    empty_plane: Plane, schema: Any, fragment: str
) -> None:
    plane = empty_plane
    refused(plane, register_tool, tool(input_schema=schema), fragment)
    refused(plane, register_validation, command_validation(input_schema=schema), fragment)


def test_output_schema_is_checked_too(empty_plane: Plane) -> None:
    plane = empty_plane
    refused(
        plane,
        register_tool,
        tool(output_schema={"$ref": "#/$defs/missing"}),
        "output_schema: invalid JSON Schema at /$ref",
    )


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        (tool(colour="blue"), "unknown key `colour`"),
        (tool(timeout=True), "key `timeout`"),
        (tool(timeout=0), "key `timeout`"),
        (tool(timeout=-3), "key `timeout`"),
        (tool(timeout=float("inf")), "from 0.001 to 604800"),
        (tool(timeout=1e308), "from 0.001 to 604800"),
        (tool(timeout=0.0001), "at least 0.001"),
        (tool(writes="true"), "key `writes`"),
        (tool(command="pytest -q"), "key `command`"),
        (tool(command=[]), "key `command`"),
        (tool(command=["pytest", "{path"]), "key `command[1]`"),
        (tool(command=["pytest", "{path.x}"]), "plain {name}"),
        (tool(resource_slots=["repo", "repo"]), "listed twice"),
        (tool(resource_slots=["has space"]), "invalid resource slot"),
        (tool(name="bad name"), "invalid tool name"),
        ({"description": "no name"}, "missing required key `name`"),
        (tool(mcp_server="docs"), "go together"),
        (tool(mcp_server="docs", mcp_tool_name="t"), "`command` or `mcp_server`"),
        (["not", "a", "mapping"], "must be a mapping"),
        # YAML and TOML can give values JSON has no type for: refused, never coerced.
        (
            tool(lifecycle={"pre": datetime.date(2024, 1, 1)}),
            "key `lifecycle`: date is not a JSON value",
        ),
        (tool(lifecycle={"pre": float("nan")}), "key `lifecycle`"),
        (tool(lifecycle={"pre": {"n": 2**60}}), "key `lifecycle`"),
        (tool(description=datetime.date(2024, 1, 1)), "key `description`"),
        (tool(input_schema={"default": datetime.date(2024, 1, 1)}), "input_schema"),
    ],
)
def test_bad_tool_files_are_refused(empty_plane: Plane, spec: Any, fragment: str) -> None:
    refused(empty_plane, register_tool, spec, fragment)


# -- validations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"writes": True}, "`writes: true` is not allowed"),
        ({"checkpointable": True}, "`checkpointable: true` is not allowed"),
        ({"read_only": False}, "`read_only: false` is not allowed"),
    ],
)
def test_validation_must_be_read_only(plane: Plane, extra: dict[str, Any], fragment: str) -> None:
    register_tool(plane, PYTEST_TOOL)
    refused(plane, register_validation, command_validation(**extra), fragment)
    refused(plane, register_validation, wrapper(**extra), fragment)


def test_validation_records_read_only_and_mode(plane: Plane) -> None:
    register_validation(
        plane, command_validation(writes=False, read_only=True, checkpointable=False)
    )
    event = payload(plane, "tool:lint")
    assert event["type"] == "validation.registered"
    assert (event["writes"], event["checkpointable"], event["read_only"]) == (False, False, True)
    assert (event["mode"], event["executor"]) == ("informational", "command")
    # The output is always the structured result, closed.
    assert event["declared_output_schema"] == RESULT_SCHEMA
    assert event["output_schema"]["additionalProperties"] is False
    assert event["output_schema"]["properties"]["data"]["additionalProperties"] is True
    assert get_validation(plane, "lint")["spec"]["mode"] == "informational"


def test_python_executor(plane: Plane) -> None:
    spec = {"name": "coverage", "mode": "required", "python": "checks.cov:at_least", "timeout": 10}
    doc = register_validation(plane, spec).document
    assert (doc["spec"]["executor"], doc["spec"]["python"]) == ("python", "checks.cov:at_least")
    assert doc["spec"]["timeout_ms"] == 10_000
    refused(plane, register_validation, {**spec, "python": "no-colon"}, "module:function")


def test_mode_is_required_and_fixed_values(plane: Plane) -> None:
    refused(
        plane,
        register_validation,
        {"name": "v", "command": ["true"]},
        "missing required key `mode`",
    )
    refused(plane, register_validation, command_validation(mode="advisory"), "key `mode`")
    register_validation(plane, command_validation())
    assert register_validation(plane, command_validation(mode="required")).version == 2


def test_wrapper_inherits_input_schema_slots_and_timeout(plane: Plane) -> None:
    register_tool(plane, PYTEST_TOOL)
    result = register_validation(plane, wrapper())
    tool_event = payload(plane, "tool:pytest")
    event = payload(plane, "tool:tests-pass")
    assert event["executor"] == "wrapped" and event["wraps"] == "pytest"
    assert event["wraps_version"] == 1 and event["transform"] == TESTS_PASS
    for field in (
        "declared_input_schema",
        "input_schema",
        "input_schema_sha256",
        "resource_slots",
        "timeout_ms",
    ):
        assert event[field] == tool_event[field], field
    assert result.document["spec"]["timeout_ms"] == 120_000


@pytest.mark.parametrize(
    "extra",
    [
        {"input_schema": {"type": "object"}},
        {"input_schema": None},
        {"resource_slots": []},
        {"resource_slots": ["repo"]},
        {"timeout": 5},
    ],
)
def test_wrapper_may_not_redefine_inherited_fields(plane: Plane, extra: dict[str, Any]) -> None:
    register_tool(plane, PYTEST_TOOL)
    key = next(iter(extra))
    refused(plane, register_validation, wrapper(**extra), f"remove `{key}`")


def test_wrapper_follows_the_tool_when_re_registered(plane: Plane) -> None:
    register_tool(plane, PYTEST_TOOL)
    register_validation(plane, wrapper())
    register_tool(plane, tool(timeout=300, resource_slots=["repo", "cache"]))
    # The validation is not re-registered by itself: it keeps what it recorded.
    assert get_tool(plane, "tests-pass")["spec"]["timeout_ms"] == 120_000
    again = register_validation(plane, wrapper())
    assert (again.changed, again.version) == (True, 2)
    spec = again.document["spec"]
    assert (spec["wraps_version"], spec["timeout_ms"], spec["resource_slots"]) == (
        2,
        300_000,
        ["repo", "cache"],
    )
    assert register_validation(plane, wrapper()).changed is False


def test_several_validations_wrap_one_tool(plane: Plane) -> None:
    register_tool(plane, PYTEST_TOOL)
    register_validation(plane, wrapper("tests-pass", TESTS_PASS))
    register_validation(plane, wrapper("no-failures", NO_FAILURES, mode="informational"))
    views = {v["name"]: v for v in list_validations(plane)}
    assert set(views) == {"tests-pass", "no-failures"}
    assert {v["spec"]["wraps"] for v in views.values()} == {"pytest"}
    output = {"exit_code": 1, "summary": "1 failed", "failed": ["test_a"]}
    results = {name: apply_transform(v["spec"]["transform"], output) for name, v in views.items()}
    assert results == {
        "tests-pass": {"passed": False, "message": "1 failed"},
        "no-failures": {"passed": False, "data": {"failed": ["test_a"]}},
    }


def test_wraps_must_name_an_existing_read_only_tool(plane: Plane) -> None:
    refused(plane, register_validation, wrapper(), "wraps unknown tool 'pytest'")
    register_validation(plane, command_validation("lint"))
    refused(plane, register_validation, {**wrapper(), "wraps": "lint"}, "which is a validation")
    register_tool(plane, {"name": "formatter", "command": ["ruff", "format"], "writes": True})
    refused(plane, register_validation, {**wrapper(), "wraps": "formatter"}, "that tool writes")


@pytest.mark.parametrize(
    ("transform", "fragment"),
    [
        ("{passed: exit_code ==", "not a valid JMESPath expression"),
        ("foo..bar", "column 4"),
        ("a.`x", "not a valid JMESPath expression"),
        ("", "not a valid JMESPath expression"),
        ("{passed: lenght(failed) == `0`}", "unknown JMESPath function lenght()"),
        ("{passed: length(failed, summary) == `0`}", "length() takes 1 argument(s), given 2"),
        ("{passed: merge()}", "merge() takes at least 1 argument(s), given 0"),
    ],
)
def test_bad_transforms_are_refused(plane: Plane, transform: str, fragment: str) -> None:
    register_tool(plane, PYTEST_TOOL)
    message = refused(plane, register_validation, wrapper(transform=transform), fragment)
    assert "\n" not in message


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"name": "v", "mode": "required"}, "exactly one executor"),
        (
            {"name": "v", "mode": "required", "command": ["x"], "python": "m:f"},
            "found `command` and `python`",
        ),
        ({**wrapper(), "command": ["x"]}, "found `command` and `wraps`"),
        ({"name": "v", "mode": "required", "wraps": "pytest"}, "needs a `transform`"),
        (command_validation(transform="@"), "`transform` needs `wraps`"),
        (command_validation(output_schema={"type": "object"}), "`output_schema` cannot be set"),
        (command_validation(mcp_server="s", mcp_tool_name="t"), "found `command` and `mcp_server`"),
        (command_validation(frequency=3), "unknown key `frequency`"),
        (command_validation(mode=True), "key `mode`"),
    ],
)
def test_bad_validation_files_are_refused(
    plane: Plane, spec: dict[str, Any], fragment: str
) -> None:
    register_tool(plane, PYTEST_TOOL)
    refused(plane, register_validation, spec, fragment)


def test_tools_and_validations_share_one_namespace(plane: Plane) -> None:
    register_tool(plane, PYTEST_TOOL)
    register_validation(plane, command_validation("lint"))
    refused(
        plane, register_validation, command_validation("pytest"), "already registered as a tool"
    )
    refused(plane, register_tool, tool(name="lint"), "already registered as a validation")
    assert [v["name"] for v in list_tools(plane)] == ["lint", "pytest"]
    assert [v["name"] for v in list_tools(plane, kind="tool")] == ["pytest"]
    with pytest.raises(CommandRefused, match="is a tool, not a validation"):
        get_validation(plane, "pytest")
    with pytest.raises(CommandRefused, match="has no version 3"):
        get_tool(plane, "pytest", version=3)
    with pytest.raises(CommandRefused, match="unknown tool 'nope'"):
        get_tool(plane, "nope")


# -- transforms and structured results (pure) ---------------------------------------------


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ({"exit_code": 0, "summary": "247 passed"}, {"passed": True, "message": "247 passed"}),
        ({"exit_code": 1, "summary": "1 failed"}, {"passed": False, "message": "1 failed"}),
        ({"exit_code": 0.0, "summary": "ok"}, {"passed": True, "message": "ok"}),
        ({"exit_code": False, "summary": "odd"}, {"passed": False, "message": "odd"}),
    ],
)
def test_transform_interprets_tool_output(output: dict[str, Any], expected: dict[str, Any]) -> None:
    assert apply_transform(TESTS_PASS, output) == expected


def test_transform_with_data_and_coverage() -> None:
    transform = (
        "{passed: coverage >= `90`, message: join(' ', ['coverage', to_string(coverage)]),"
        " data: {coverage: coverage}}"
    )
    assert apply_transform(transform, {"coverage": 94.2}) == {
        "passed": True,
        "message": "coverage 94.2",
        "data": {"coverage": 94.2},
    }
    assert apply_transform(transform, {"coverage": 80})["passed"] is False


def test_absent_message_needs_a_default() -> None:
    # JMESPath gives null for a missing key; null is not a message, so say what to use.
    transform = "{passed: exit_code == `0`, message: summary || ''}"
    assert apply_transform(transform, {"exit_code": 0}) == {"passed": True, "message": ""}


def test_transform_is_pure() -> None:
    output = {"exit_code": 0, "summary": "ok", "nested": {"a": [1]}}
    snapshot = copy.deepcopy(output)
    apply_transform("{passed: `true`, data: nested}", output)
    assert output == snapshot


@pytest.mark.parametrize(
    ("transform", "output", "fragment"),
    [
        (TESTS_PASS, {"exit_code": 0}, "`message` must be a string, got null"),
        ("{passed: summary}", {"summary": "true"}, "`passed` must be a boolean, got a string"),
        ("{ok: `true`}", {}, "unexpected key(s) ok"),
        ("exit_code", {"exit_code": 0}, "a result must be an object, got a number"),
        ("missing", {}, "a result must be an object, got null"),
        ("{passed: length(exit_code) == `0`}", {"exit_code": 3}, "transform failed"),
    ],
)
def test_transform_malformed_results_raise(transform: str, output: Any, fragment: str) -> None:
    with pytest.raises(TransformError) as info:
        apply_transform(transform, output)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ({"passed": True}, True),
        ({"passed": False, "message": "no"}, True),
        ({"passed": True, "message": "", "data": {}}, True),
        ({"passed": True, "data": {"tests_run": 247, "nested": {"x": [1]}}}, True),
        ({}, False),
        ({"message": "forgot passed"}, False),
        ({"passed": "true"}, False),
        ({"passed": 1}, False),
        ({"passed": None}, False),
        ({"passed": True, "extra": 1}, False),
        ({"passed": True, "message": None}, False),
        ({"passed": True, "message": 3}, False),
        ({"passed": True, "data": [1]}, False),
        ({"passed": True, "data": "x"}, False),
        ([{"passed": True}], False),
        ("passed", False),
        (None, False),
    ],
)
def test_check_validation_result(value: Any, ok: bool) -> None:
    result, error = check_validation_result(value)
    assert result is ok
    assert (error is None) is ok


# -- skills ----------------------------------------------------------------------------------


def test_skills_define_version_and_members(plane: Plane) -> None:
    register_tool(plane, PYTEST_TOOL)
    register_validation(plane, wrapper())
    first = define_skill(plane, {"name": "qa", "members": ["pytest", "tests-pass"]})
    assert (first.version, first.changed) == (1, True)
    before = size(plane)
    assert define_skill(plane, {"name": "qa", "members": ["pytest", "tests-pass"]}).changed is False
    assert size(plane) == before
    second = define_skill(plane, {"name": "qa", "description": "checks", "members": ["tests-pass"]})
    assert (second.version, second.changed) == (2, True)
    ops = {op["path"] for op in plane.store.read_stream("skill:qa")[-1].delta}
    assert "/description" in ops and any(p.startswith("/members") for p in ops)
    assert to_json(get_skill(plane, "qa")) == {
        "name": "qa",
        "version": 2,
        "description": "checks",
        "members": ["tests-pass"],
    }
    assert [s.name for s in list_skills(plane)] == ["qa"]


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        (
            {"name": "qa", "members": ["pytest", "ghost", "phantom"]},
            "unknown member(s) ghost, phantom",
        ),
        ({"name": "qa", "members": []}, "at least one member"),
        ({"name": "qa", "members": ["pytest", "pytest"]}, "listed twice"),
        ({"name": "qa"}, "missing required key `members`"),
        ({"name": "qa", "members": "pytest"}, "key `members`"),
        ({"name": "qa", "members": ["pytest"], "gate": True}, "unknown key `gate`"),
    ],
)
def test_bad_skills_are_refused(plane: Plane, spec: dict[str, Any], fragment: str) -> None:
    register_tool(plane, PYTEST_TOOL)
    refused(plane, define_skill, spec, fragment)
    with pytest.raises(CommandRefused, match="unknown skill"):
        get_skill(plane, "qa")


# -- the CLI, as a real subprocess ----------------------------------------------------------

run = run_cli


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def event_count(db_url: str) -> int:
    return len(json.loads(ok(run("events", "--db", db_url, "--json")))["events"])


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "pytest.yaml").write_text(
        "name: pytest\n"
        "command: [pytest, -q, '{path}']\n"
        "input_schema: {type: object, properties: {path: {type: string}}, required: [path]}\n"
        "output_schema: {type: object, properties: {exit_code: {type: integer}}}\n"
        "resource_slots: [repo]\n"
        "timeout: 60\n"
    )
    (tmp_path / "tests-pass.toml").write_text(
        'name = "tests-pass"\nmode = "required"\nwraps = "pytest"\n'
        'transform = "{passed: exit_code == `0`}"\n'
    )
    (tmp_path / "qa.json").write_text(
        json.dumps({"name": "qa", "description": "quality", "members": ["pytest", "tests-pass"]})
    )
    return tmp_path


def test_cli_register_list_show(db_url: str, files: Path) -> None:
    db = ("--db", db_url)
    assert (
        ok(run("tool", "register", str(files / "pytest.yaml"), *db))
        == "registered tool pytest version 1\n"
    )
    assert (
        ok(run("tool", "register", str(files / "pytest.yaml"), *db))
        == "tool pytest unchanged (version 1)\n"
    )
    assert (
        ok(run("--db", db_url, "validation", "register", str(files / "tests-pass.toml")))
        == "registered validation tests-pass version 1\n"
    )
    assert ok(run("skill", "define", str(files / "qa.json"), *db)) == "defined skill qa version 1\n"

    tools = json.loads(ok(run("tool", "list", "--json", *db)))["tools"]
    assert [(t["name"], t["kind"], t["version"]) for t in tools] == [
        ("pytest", "tool", 1),
        ("tests-pass", "validation", 1),
    ]
    shown = json.loads(ok(run("tool", "show", "pytest", "--json", *db)))["tool"]
    assert shown["spec"]["timeout_ms"] == 60_000
    assert shown["spec"]["input_schema"]["additionalProperties"] is False
    validations = json.loads(ok(run("validation", "list", "--json", *db)))["validations"]
    assert [v["spec"]["mode"] for v in validations] == ["required"]
    one = json.loads(ok(run("validation", "show", "tests-pass", "--json", *db)))["validation"]
    assert one["spec"]["resource_slots"] == ["repo"] and one["spec"]["wraps_version"] == 1
    skills = json.loads(ok(run("skill", "list", "--json", *db)))["skills"]
    assert skills == [
        {"name": "qa", "version": 1, "description": "quality", "members": ["pytest", "tests-pass"]}
    ]
    assert json.loads(ok(run("skill", "show", "qa", "--json", *db)))["skill"] == skills[0]

    table = ok(run("validation", "list", *db))
    assert "required" in table and "wraps pytest v1" in table
    assert "command pytest -q {path}" in ok(run("tool", "list", *db))  # no shell quoting
    assert "60s" in ok(run("tool", "show", "pytest", *db))
    assert "tests-pass  validation" in ok(run("skill", "show", "qa", *db))

    (files / "pytest.yaml").write_text((files / "pytest.yaml").read_text() + "description: x\n")
    assert (
        ok(run("tool", "register", str(files / "pytest.yaml"), *db))
        == "registered tool pytest version 2\n"
    )
    old = json.loads(ok(run("tool", "show", "pytest", "--version", "1", "--json", *db)))
    assert old["tool"]["version"] == 1 and old["tool"]["latest_version"] == 2
    registered = json.loads(ok(run("tool", "register", str(files / "pytest.yaml"), "--json", *db)))
    assert registered["changed"] is False and registered["tool"]["version"] == 2


def test_cli_bad_input_is_refused_and_appends_nothing(db_url: str, files: Path) -> None:
    db = ("--db", db_url)
    ok(run("tool", "register", str(files / "pytest.yaml"), *db))
    ok(run("validation", "register", str(files / "tests-pass.toml"), *db))
    ok(run("skill", "define", str(files / "qa.json"), *db))
    before = event_count(db_url)

    def write(name: str, text: str) -> str:
        (files / name).write_text(text)
        return str(files / name)

    cases: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
        (
            ("tool", "register", write("t1.yaml", "name: t\ncolour: blue\n")),
            ("t1.yaml", "unknown key `colour`"),
        ),
        (
            ("tool", "register", write("t2.json", '{"name": "t", "timeout": "10"}')),
            ("t2.json", "key `timeout`"),
        ),
        (
            (
                "tool",
                "register",
                write(
                    "t3.json",
                    json.dumps(
                        {"name": "t", "input_schema": {"properties": {"p": {"type": "strin"}}}}
                    ),
                ),
            ),
            ("t3.json", "invalid JSON Schema at /properties/p/type"),
        ),
        (
            (
                "tool",
                "register",
                write(
                    "t4.json",
                    json.dumps(
                        {"name": "t", "input_schema": {"$ref": "https://evil.example/s.json"}}
                    ),
                ),
            ),
            ("at /$ref", "refers outside the document"),
        ),
        (("tool", "register", write("t5.yaml", "- a list\n")), ("t5.yaml", "one mapping")),
        (("tool", "register", write("t6.json", "{not json")), ("t6.json", "not valid JSON")),
        (("tool", "register", str(files / "missing.json")), ("no such file",)),
        (
            ("tool", "register", write("t7.toml", 'name = "tests-pass"\n')),
            ("already registered as a validation",),
        ),
        (
            (
                "validation",
                "register",
                write("v1.yaml", "name: v\nmode: required\ncommand: [x]\nwrites: true\n"),
            ),
            ("v1.yaml", "`writes: true` is not allowed"),
        ),
        (
            (
                "validation",
                "register",
                write("v2.yaml", "name: v\nmode: required\nwraps: ghost\ntransform: '@'\n"),
            ),
            ("wraps unknown tool 'ghost'",),
        ),
        (
            (
                "validation",
                "register",
                write(
                    "v3.yaml", "name: v\nmode: required\nwraps: pytest\ntransform: '{passed: '\n"
                ),
            ),
            ("not a valid JMESPath expression",),
        ),
        (
            (
                "validation",
                "register",
                write(
                    "v4.yaml",
                    "name: v\nmode: required\nwraps: pytest\ntransform: '@'\ntimeout: 3\n",
                ),
            ),
            ("remove `timeout`",),
        ),
        (
            (
                "validation",
                "register",
                write("v5.yaml", "name: pytest\nmode: required\ncommand: [x]\n"),
            ),
            ("already registered as a tool",),
        ),
        (
            ("skill", "define", write("s1.json", '{"name": "s", "members": ["ghost"]}')),
            ("s1.json", "unknown member(s) ghost"),
        ),
        (
            ("skill", "define", write("s2.json", '{"name": "s", "members": ["pytest"], "x": 1}')),
            ("s2.json", "unknown key `x`"),
        ),
        (("tool", "show", "ghost"), ("unknown tool 'ghost'",)),
        (("tool", "show", "pytest", "--version", "9"), ("has no version 9",)),
        (("tool", "show", "pytest", "--version", "0"), ("--version",)),
        (("tool", "list", "--kind", "gizmo"), ("--kind",)),
        (("validation", "show", "pytest"), ("is a tool, not a validation",)),
        (("validation", "show", "ghost"), ("unknown validation 'ghost'",)),
        (("skill", "show", "ghost"), ("unknown skill 'ghost'",)),
        (("skill", "define"), ("Missing argument",)),
    ]
    for args, fragments in cases:
        assert_refused(run(*args, *db), *fragments)
    assert event_count(db_url) == before


def test_concurrent_registrations_each_get_their_own_version(db_url: str) -> None:
    # Separate planes (connections) racing on one name: the stream version check makes
    # the losers decide again, so each change becomes one version and each caller is told
    # the version it appended.
    def register(description: str) -> int:
        with Plane.open(db_url) as plane:
            return register_tool(plane, tool(description=description)).version

    with Plane.open(db_url):
        pass  # create the ledger once, before the race
    with ThreadPoolExecutor(max_workers=4) as pool:
        versions = list(pool.map(register, [f"variant {i}" for i in range(4)]))
    assert sorted(versions) == [1, 2, 3, 4]
    with Plane.open(db_url) as plane:
        events = plane.store.read_stream("tool:pytest")
        assert [e.payload.version for e in events] == [1, 2, 3, 4]
