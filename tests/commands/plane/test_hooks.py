"""`evidence hook pre-tool|post-tool`: an agent CLI's tool-use hooks (docs/agents.md).
The hook JSON on stdin is hostile input; a deviation blocks with exit 2 and the
deviations on stderr; everything is recorded as `gate input` / `call --record-output`
record it; the audit stays clean."""

from __future__ import annotations

import json
from typing import Any

import pytest

import ledger
from commands.plane import Plane
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool
from tests.helpers import assert_refused, run_cli

SEARCH = {
    "name": "search",
    "input_schema": {
        "type": "object",
        "required": ["query"],
        "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
    },
    "output_schema": {
        "type": "object",
        "required": ["hits"],
        "properties": {"hits": {"type": "array", "items": {"type": "string"}}},
    },
}
ISSUE = {
    "name": "gh-issue",
    "mcp_server": "github",
    "mcp_tool_name": "create_issue",
    "input_schema": {
        "type": "object",
        "required": ["title"],
        "properties": {"title": {"type": "string"}},
    },
    "output_schema": {
        "type": "object",
        "required": ["number"],
        "properties": {"number": {"type": "integer"}},
    },
}
ECHO = {
    "name": "echo",
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
    "output_schema": {"type": "string"},
}


def _setup(url: str, *, strict: bool = False) -> None:
    with Plane.open(url) as plane:
        for spec in (SEARCH, ISSUE, ECHO):
            register_tool(plane, spec)
        create_plan(
            plane, "P-1", project="api", resources=["repo:api"], config={"strict_mode": strict}
        )
        record_strategy(plane, "P-1", "search the code")
        enter_execute(plane, "P-1")


@pytest.fixture
def url(db_url: str) -> str:
    _setup(db_url)
    return db_url


def pre(tool: str, params: Any, use_id: str | None = "toolu_01", **extra: Any) -> dict:
    doc = {
        "session_id": "s-1",
        "transcript_path": "/tmp/t.jsonl",
        "cwd": "/work",
        "hook_event_name": "PreToolUse",
        "tool_name": tool,
        "tool_input": params,
        **extra,
    }
    if use_id is not None:
        doc["tool_use_id"] = use_id
    return doc


def post(tool: str, params: Any, response: Any, use_id: str | None = "toolu_01") -> dict:
    return {
        **pre(tool, params, use_id),
        "hook_event_name": "PostToolUse",
        "tool_response": response,
    }


def hook(url: str, kind: str, stdin: dict | str | bytes, *options: str, env=None):
    data = json.dumps(stdin) if isinstance(stdin, dict) else stdin
    return run_cli("hook", kind, "--plan", "P-1", "--db", url, *options, input=data, env=env)


def events(url: str) -> list[ledger.RecordedEvent]:
    store = ledger.open(url)
    try:
        return list(store.read_stream("plan:P-1"))
    finally:
        store.close()


def types(url: str) -> list[str]:
    return [e.type for e in events(url)]


# -- hostile stdin first: refused, one error line, nothing appended -----------------------

DEEP = b'{"tool_name": "search", "tool_input": ' + b"[" * 100 + b"]" * 100 + b"}"
HOSTILE = [
    pytest.param(b"not json", "not valid JSON", id="not-json"),
    pytest.param(b"", "not valid JSON", id="empty"),
    pytest.param(DEEP, "nested deeper than 64", id="too-deep"),
    pytest.param(b'{"tool_name": "a", "tool_name": "b"}', "duplicate key", id="duplicate-key"),
    pytest.param(b'{"tool_name": "search\xff"}', "not UTF-8", id="not-utf8"),
    pytest.param(b'{"tool_name": "search", "tool_input": NaN}', "NaN", id="nan"),
    pytest.param(b"[1, 2]", "a JSON object is expected", id="not-an-object"),
    pytest.param(b'{"tool_input": {}}', "tool_name must be", id="no-tool-name"),
    pytest.param(b'{"tool_name": 7, "tool_input": {}}', "tool_name must be", id="tool-name-int"),
    pytest.param(
        b'{"tool_name": "se\\u001barch", "tool_input": {}}', "tool_name must be", id="control"
    ),
    pytest.param(b'{"tool_name": "search"}', "tool_input is missing", id="no-tool-input"),
    pytest.param(
        b'{"tool_name": "search", "tool_input": {}, "tool_response": 1, "tool_use_id": "../x"}',
        "tool_use_id must be",
        id="bad-tool-use-id",
    ),
]


@pytest.mark.parametrize("kind", ["pre-tool", "post-tool"])
@pytest.mark.parametrize(("stdin", "fragment"), HOSTILE)
def test_hostile_stdin_is_refused_and_appends_nothing(
    url: str, kind: str, stdin: bytes, fragment: str
) -> None:
    before = events(url)
    result = hook(url, kind, stdin)
    assert_refused(result, "stdin" if fragment != "duplicate key" else "duplicate", fragment)
    assert events(url) == before


def test_huge_stdin_is_refused_at_the_cap(url: str) -> None:
    before = events(url)
    big = json.dumps(pre("search", {"query": "x" * 5000}))
    result = hook(url, "pre-tool", big, env={"EVIDENCE_MAX_AGENT_BYTES": "1024"})
    assert_refused(result, "stdin", "larger than the 1 KiB cap", "EVIDENCE_MAX_AGENT_BYTES")
    assert events(url) == before


def test_a_hook_wired_to_the_wrong_event_is_refused(url: str) -> None:
    before = events(url)
    assert_refused(hook(url, "pre-tool", post("search", {"query": "x"}, {})), "PreToolUse")
    assert_refused(hook(url, "post-tool", pre("search", {"query": "x"})), "PostToolUse")
    no_response = {**pre("search", {"query": "x"}), "hook_event_name": "PostToolUse"}
    assert_refused(hook(url, "post-tool", no_response), "tool_response is missing")
    assert events(url) == before


def test_an_unknown_plan_or_option_is_refused(url: str) -> None:
    before = events(url)
    result = run_cli(
        "hook", "pre-tool", "--plan", "P-9", "--db", url, input=json.dumps(pre("search", {}))
    )
    assert_refused(result, "unknown plan 'P-9'")
    result = hook(url, "pre-tool", pre("search", {}), "--unknown-tools", "allow")
    assert_refused(result, "--unknown-tools")
    assert events(url) == before


# -- pre-tool ------------------------------------------------------------------------------


def test_a_valid_call_passes_silently_and_is_recorded(url: str) -> None:
    result = hook(url, "pre-tool", pre("search", {"query": "x", "limit": 3}, extra_key=1))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    last = events(url)[-1].payload
    assert last.type_name() == "gate.checked"
    assert (last.gate, last.tool, last.verdict, last.step) == (
        "input",
        "search",
        "pass",
        "toolu_01",
    )


def test_a_deviating_call_is_blocked_with_its_deviations_on_stderr(url: str) -> None:
    result = hook(url, "pre-tool", pre("search", {"query": 1, "limit": "3", "x": 0}))
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0].startswith("blocked: the input gate failed for tool 'search' in plan P-1")
    assert "3 deviation(s)" in lines[0]
    assert any(line.strip().startswith("/limit: wrong_type") for line in lines)
    assert any(line.strip().startswith("/x: extra_field") for line in lines)
    assert lines[-1] == "routed: retry in the next iteration (2 iteration(s) left in this attempt)"
    assert "error:" not in result.stderr and "Traceback" not in result.stderr
    # Recorded exactly as `evidence gate input` records it.
    recorded = events(url)
    check = recorded[-2].payload
    assert (check.type_name(), check.verdict, len(check.deviations)) == ("gate.checked", "fail", 3)
    assert recorded[-1].type == "plan.attempt_failed"


def test_the_same_check_as_gate_input(url: str) -> None:
    params = {"query": 1, "limit": "3"}
    hook(url, "pre-tool", pre("search", params, use_id=None))
    via_hook = events(url)[-2].payload
    compact = json.dumps(params, separators=(",", ":"))  # the bytes the hook checks
    run_cli("gate", "input", "--plan", "P-1", "--tool", "search", "--params", compact, "--db", url)
    via_gate = events(url)[-2].payload
    assert via_hook.deviations == via_gate.deviations
    assert via_hook.checked_sha256 == via_gate.checked_sha256
    assert via_hook.schema_sha256 == via_gate.schema_sha256


def test_an_unknown_tool_is_denied_by_default(url: str) -> None:
    result = hook(url, "pre-tool", pre("Bash", {"command": "rm -rf /"}))
    assert result.returncode == 2
    assert result.stderr.startswith("blocked: tool 'Bash' is not registered (--unknown-tools deny)")
    assert "invented_tool" in result.stderr
    check = events(url)[-2].payload
    assert (check.tool, check.verdict, check.deviations[0].kind) == (
        "Bash",
        "fail",
        "invented_tool",
    )


def test_an_unknown_tool_is_let_through_and_recorded_with_record(url: str) -> None:
    before = events(url)
    result = hook(url, "pre-tool", pre("Bash", {"command": "ls"}), "--unknown-tools", "record")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert events(url) == before  # recorded when it returns
    response = {"stdout": "a\nb\n", "stderr": "", "interrupted": False}
    result = hook(
        url, "post-tool", post("Bash", {"command": "ls"}, response), "--unknown-tools", "record"
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    recorded = events(url)
    assert len(recorded) == len(before) + 1
    called = recorded[-1].payload
    assert called.type_name() == "tool.called"
    assert (called.tool, called.tool_version, called.unregistered, called.executor) == (
        "Bash",
        None,
        True,
        "recorded",
    )
    assert called.step == "toolu_01"
    store = ledger.open(url)
    try:
        assert json.loads(bytes(store.get_blob(called.output_sha256))) == response
        assert json.loads(bytes(store.get_blob(called.params_sha256))) == {"command": "ls"}
    finally:
        store.close()


def test_an_mcp_tool_name_maps_to_its_registration(url: str) -> None:
    result = hook(url, "pre-tool", pre("mcp__github__create_issue", {"title": "bug"}))
    assert result.returncode == 0, result.stderr
    check = events(url)[-1].payload
    assert (check.tool, check.verdict) == ("gh-issue", "pass")
    response = {
        "content": [{"type": "text", "text": '{"number": 7}'}],
        "structuredContent": {"number": 7},
    }
    result = hook(url, "post-tool", post("mcp__github__create_issue", {"title": "bug"}, response))
    assert result.returncode == 0, result.stderr
    # An unknown server or tool is an invented tool.
    result = hook(url, "pre-tool", pre("mcp__gitlab__create_issue", {"title": "bug"}, "t2"))
    assert result.returncode == 2 and "not registered" in result.stderr


# -- post-tool -----------------------------------------------------------------------------


def test_post_tool_records_the_call_and_its_output_gate(url: str) -> None:
    params = {"query": "x"}
    assert hook(url, "pre-tool", pre("search", params)).returncode == 0
    before = len(events(url))
    result = hook(url, "post-tool", post("search", params, {"hits": ["a.py"]}))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    new = [e.payload for e in events(url)[before:]]
    # The pre-tool check covered these bytes: not checked twice.
    assert [p.type_name() for p in new] == ["tool.called", "gate.checked"]
    called, check = new
    assert (called.executor, called.tool_version, called.step) == ("recorded", 1, "toolu_01")
    assert (check.gate, check.verdict, check.step) == ("output", "pass", "toolu_01")
    # The same call recorded twice is refused.
    again = hook(url, "post-tool", post("search", params, {"hits": ["a.py"]}))
    assert_refused(again, "already recorded")


def test_post_tool_without_its_pre_tool_check_checks_the_input(url: str) -> None:
    before = len(events(url))
    result = hook(url, "post-tool", post("search", {"query": "x"}, {"hits": []}, use_id=None))
    assert result.returncode == 0, result.stderr
    new = [e.payload for e in events(url)[before:]]
    assert [(p.type_name(), getattr(p, "gate", None)) for p in new] == [
        ("gate.checked", "input"),
        ("tool.called", None),
        ("gate.checked", "output"),
    ]
    # Changed parameters since the pre-tool check: checked again, on what ran.
    hook(url, "pre-tool", pre("search", {"query": "x"}, "t2"))
    before = len(events(url))
    result = hook(url, "post-tool", post("search", {"query": "y"}, {"hits": []}, "t2"))
    assert result.returncode == 0
    assert events(url)[before].type == "gate.checked"


def test_an_off_schema_output_is_rejected(url: str) -> None:
    hook(url, "pre-tool", pre("search", {"query": "x"}))
    result = hook(url, "post-tool", post("search", {"query": "x"}, {"hits": "a.py", "more": 1}))
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0].startswith("rejected: the output gate failed for tool 'search'")
    assert any(line.strip().startswith("/hits: wrong_type") for line in lines)
    assert any(line.strip().startswith("/more: extra_field") for line in lines)
    assert types(url)[-3:] == ["tool.called", "gate.checked", "plan.attempt_failed"]


def test_a_text_response_is_a_json_string(url: str) -> None:
    hook(url, "pre-tool", pre("echo", {"text": "hi"}))
    assert hook(url, "post-tool", post("echo", {"text": "hi"}, "hi\n")).returncode == 0
    # Text that happens to hold JSON is still text: an object schema does not take it.
    hook(url, "pre-tool", pre("search", {"query": "x"}, "t2"))
    result = hook(url, "post-tool", post("search", {"query": "x"}, '{"hits": []}', "t2"))
    assert result.returncode == 2 and "/: wrong_type" in result.stderr


def test_strict_mode_ends_the_plan_and_later_hooks_are_refused(db_url: str) -> None:
    _setup(db_url, strict=True)
    hook(db_url, "pre-tool", pre("search", {"query": "x"}))
    result = hook(db_url, "post-tool", post("search", {"query": "x"}, {"hits": 1}))
    assert result.returncode == 2
    assert "routed: strict_mode; compensation requested" in result.stderr
    assert types(db_url)[-2:] == ["plan.compensation_requested", "plan.halted"]
    before = events(db_url)
    for kind, doc in (
        ("pre-tool", pre("search", {"query": "x"}, "t2")),
        ("post-tool", post("search", {"query": "x"}, {"hits": []}, "t2")),
    ):
        assert_refused(hook(db_url, kind, doc), "P-1 has ended")
    assert events(db_url) == before


def test_audit_is_clean_after_a_hook_session(url: str) -> None:
    hook(url, "pre-tool", pre("search", {"query": "x"}))
    hook(url, "post-tool", post("search", {"query": "x"}, {"hits": ["a"]}))
    hook(url, "pre-tool", pre("search", {"query": 1}, "t2"))
    hook(url, "pre-tool", pre("Bash", {"command": "ls"}, "t3"), "--unknown-tools", "record")
    hook(url, "post-tool", post("Bash", {"command": "ls"}, "ok", "t3"), "--unknown-tools", "record")
    hook(url, "pre-tool", pre("mcp__github__create_issue", {"title": "t"}, "t4"))
    hook(url, "post-tool", post("mcp__github__create_issue", {"title": "t"}, {"number": 1}, "t4"))
    result = run_cli("audit", "--db", url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert run_cli("verify", "--db", url).returncode == 0
    history = run_cli("plan", "history", "P-1", "--db", url)
    assert history.returncode == 0 and "Bash" in history.stdout


@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        ({"unregistered": True, "tool_version": None, "executor": "command"}, "never run"),
        ({"unregistered": True, "tool_version": 1, "executor": "recorded"}, "version"),
        ({"unregistered": False, "tool_version": 1, "executor": "recorded"}, "or absent"),
    ],
)
def test_a_forged_unregistered_call_is_caught(url: str, fields: dict[str, Any], rule: str) -> None:
    """The attack: an agent holding the database file appends, through the public Store
    API, a `tool.called` that claims an unregistered tool the plane ran, or an unregistered
    call with a version. The plane refuses the plan and audit names the position."""
    from ledger.events import ToolCalled
    from tests.helpers import forge

    digest = "0" * 64
    with ledger.open(url, create=False) as store:
        [at] = forge(
            store,
            "plan:P-1",
            ToolCalled(
                plan_id="P-1",
                call_id="forged",
                tool="Bash",
                attempt=1,
                params_sha256=digest,
                output_sha256=digest,
                started_at="2026-12-01T00:00:00.000000Z",
                ended_at="2026-12-01T00:00:00.000000Z",
                duration_ms=0,
                **fields,
            ),
        )
    refused = hook(url, "pre-tool", pre("search", {"query": "x"}))
    assert_refused(refused, f"position {at}")
    audited = run_cli("audit", "--db", url, "--json")
    assert audited.returncode == 1
    found = [v for v in json.loads(audited.stdout)["violations"] if v["position"] == at]
    assert found and any(rule in json.dumps(v) for v in found), audited.stdout
