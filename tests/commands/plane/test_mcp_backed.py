"""Tools and validations the plane runs through an MCP server: registered with
``mcp_server`` / ``mcp_tool_name`` and a launch key (``mcp_command``: a stdio server,
``mcp_url``: streamable HTTP), called with the official SDK's client against real MCP
processes (tests/mcp_server.py, tests/mcp_validator_server.py, tests/mcp_raw_server.py),
through the CLI on SQLite and PostgreSQL.

A tool call is gated, called and recorded as any call (executor ``mcp``); a server that
cannot serve it halts the plan with ``environment_error``. A validation's verdict is
the result's ``structuredContent``; anything else is a result with no verdict
(``validator_error``), and a write is a read-only violation."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

import ledger
from commands.plane import Plane
from commands.plane.attachments import attach
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.runner.mcp_client import call_mcp_tool, mcp_tool_result_schema
from commands.runner.said import EXCHANGE_CAP
from commands.schemas.prepare import prepare_schema
from ledger.canonical import canonical_json
from tests.helpers import TESTS, assert_refused, run_cli, run_cli_process, work

HERE = TESTS
SERVER = HERE / "mcp_server.py"
VALIDATOR = HERE / "mcp_validator_server.py"
RAW = HERE / "mcp_raw_server.py"

# Tests marked slow wait out a timeout or a server's shutdown (seconds each).
slow = pytest.mark.slow

ADD_INPUT = {
    "type": "object",
    "required": ["a", "b"],
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
}
SUM = {"type": "object", "required": ["sum"], "properties": {"sum": {"type": "integer"}}}
FLOOD = ("count", "size", "asks")  # tests/mcp_server.py's flood tool


@pytest.fixture(autouse=True)
def _server_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test server appends each call it gets to a log: a confined server may write
    it only where the operator allows (EVIDENCE_CONFINE_WRITE), a directory beside the
    ledger (never one holding it)."""
    (tmp_path / "upstream").mkdir()
    monkeypatch.setenv("EVIDENCE_CONFINE_WRITE", str(tmp_path / "upstream"))


def _logged(log: Path) -> Path:
    """Where the server writes the log named ``log``: in the allowed directory."""
    return log.parent / "upstream" / log.name


def _upstream(log: Path) -> list[str]:
    return [sys.executable, str(SERVER), str(_logged(log))]


def _calls(log: Path) -> list[dict[str, Any]]:
    log = _logged(log)
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _called(log: Path) -> list[dict[str, Any]]:
    """The calls the server got, without the server that answered them."""
    return [{k: v for k, v in call.items() if k != "server"} for call in _calls(log)]


def _register(url: str, tmp_path: Path, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    path = tmp_path / f"{spec['name']}.json"
    path.write_text(json.dumps(spec))
    done = run_cli(kind, "register", str(path), "--json", "--db", url)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _plan(url: str, resource: Path, *validations: tuple[str, dict[str, Any]]) -> None:
    """Plan P-1 on ``resource`` in Execute, the validations attached to it first."""
    with Plane.open(url) as plane:
        create_plan(plane, "P-1", project="api", resources=[str(resource)])
        for name, args in validations:
            attach(plane, name, resource=str(resource), args=args)
        record_strategy(plane, "P-1", "let the MCP server do it")
        enter_execute(plane, "P-1")


def _events(url: str, stream: str = "plan:P-1") -> list[ledger.RecordedEvent]:
    with ledger.open(url, create=False) as store:
        return list(store.read_stream(stream))


def _blob(url: str, digest: str) -> bytes:
    with ledger.open(url, create=False) as store:
        found = store.get_blob(digest)
    assert found is not None
    return bytes(found)


def _call(url: str, tool: str, params: Any) -> tuple[int, dict[str, Any], str]:
    done = run_cli(
        "call", "P-1", "--tool", tool, "--params", json.dumps(params), "--json", "--db", url
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout), done.stderr


def _audit_clean(url: str) -> None:
    audit = run_cli("audit", "--db", url)
    assert audit.returncode == 0, audit.stdout + audit.stderr


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "status.txt").write_text("bad\n")
    return root


# -- registration ------------------------------------------------------------------------


def test_launch_keys_are_part_of_the_spec_and_versioned(db_url: str, tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    spec = {
        "name": "calc",
        "mcp_server": "test-upstream",
        "mcp_tool_name": "add",
        "mcp_command": _upstream(log),
        "input_schema": ADD_INPUT,
        "output_schema": SUM,
    }
    first = _register(db_url, tmp_path, "tool", spec)
    assert first["changed"] and first["tool"]["spec"]["mcp_command"] == _upstream(log)
    assert not _register(db_url, tmp_path, "tool", spec)["changed"]  # identical: nothing
    moved = {**{k: v for k, v in spec.items() if k != "mcp_command"}, "mcp_url": "http://h/mcp"}
    second = _register(db_url, tmp_path, "tool", moved)
    assert second["changed"] and second["tool"]["version"] == 2
    assert "mcp_command" not in second["tool"]["spec"]
    assert second["tool"]["spec"]["mcp_url"] == "http://h/mcp"
    # A tool without a launch key: the keys are absent from its event (old bytes kept).
    plain = {"name": "recorded-only", "mcp_server": "s", "mcp_tool_name": "t"}
    _register(db_url, tmp_path, "tool", plain)
    payload = msgspec.to_builtins(_events(db_url, "tool:recorded-only")[0].payload)
    assert "mcp_command" not in payload and "mcp_url" not in payload
    validation = _register(
        db_url,
        tmp_path,
        "validation",
        {
            "name": "mcp-status",
            "mode": "required",
            "mcp_server": "checks",
            "mcp_tool_name": "status",
            "mcp_command": [sys.executable, str(VALIDATOR)],
        },
    )
    assert validation["validation"]["spec"]["executor"] == "mcp"
    listed = run_cli("tool", "list", "--db", db_url)
    assert "mcp checks/status via" in listed.stdout


MCP = {"mcp_server": "s", "mcp_tool_name": "t"}


@pytest.mark.parametrize(
    ("kind", "spec", "fragment"),
    [
        ("tool", {**MCP, "mcp_command": ["srv"], "mcp_url": "http://h/"}, "give one"),
        ("tool", {"mcp_command": ["srv"]}, "needs `mcp_server` and `mcp_tool_name`"),
        ("tool", {"mcp_url": "http://h/"}, "needs `mcp_server` and `mcp_tool_name`"),
        ("tool", {**MCP, "command": ["x"], "mcp_command": ["srv"]}, "`command` and `mcp_command`"),
        ("tool", {**MCP, "mcp_command": []}, "at least a program name"),
        ("tool", {**MCP, "mcp_command": ["srv", "a\x00b"]}, "NUL"),
        ("tool", {**MCP, "mcp_url": "ftp://h/mcp"}, "http:// or https://"),
        ("tool", {**MCP, "mcp_url": "http:///mcp"}, "with a host"),
        ("tool", {**MCP, "mcp_url": "http://h st/mcp"}, "no spaces"),
        ("tool", {**MCP, "mcp_url": "http://h:99999/mcp"}, "http:// or https://"),
        ("tool", {**MCP, "mcp_tool_name": "two words", "mcp_url": "http://h/"}, "printable"),
        (
            "tool",
            {**MCP, "mcp_url": "http://h/", "input_schema": {"type": "array"}},
            "an object of arguments",
        ),
        ("tool", {**MCP, "mcp_command": "srv --stdio"}, "key `mcp_command`"),
        ("validation", {"mode": "required", **MCP}, "`mcp_command` (a stdio server)"),
        (
            "validation",
            {"mode": "required", **MCP, "command": ["x"], "mcp_command": ["srv"]},
            "found `command` and `mcp_server`",
        ),
        (
            "validation",
            {"mode": "required", **MCP, "python": "m:f", "mcp_url": "http://h/"},
            "found `python` and `mcp_server`",
        ),
        (
            "validation",
            {"mode": "required", "mcp_command": ["srv"], "python": "m:f"},
            "needs `mcp_server`",
        ),
    ],
)
def test_bad_launch_keys_are_refused(
    sqlite_url: str, tmp_path: Path, kind: str, spec: dict[str, Any], fragment: str
) -> None:
    Plane.open(sqlite_url).close()  # an empty ledger
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"name": "x", **spec}))
    assert_refused(run_cli(kind, "register", str(path), "--db", sqlite_url), fragment)
    events = run_cli("events", "--json", "--db", sqlite_url)
    assert json.loads(events.stdout)["events"] == []


def test_an_mcp_tool_without_a_launch_key_can_still_only_be_recorded(
    sqlite_url: str, tmp_path: Path, project: Path
) -> None:
    _register(sqlite_url, tmp_path, "tool", {**MCP, "name": "remote"})
    _plan(sqlite_url, project)
    before = len(_events(sqlite_url))
    refused = run_cli("call", "P-1", "--tool", "remote", "--params", "{}", "--db", sqlite_url)
    assert_refused(refused, "--record-output", "mcp_command")
    assert len(_events(sqlite_url)) == before


# -- tool calls --------------------------------------------------------------------------


def test_the_plane_calls_an_mcp_tool_through_the_gates(
    db_url: str, tmp_path: Path, project: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    server = {"mcp_server": "test-upstream", "mcp_command": _upstream(log)}
    _register(
        db_url,
        tmp_path,
        "tool",
        {
            "name": "calc",
            **server,
            "mcp_tool_name": "add",
            "input_schema": ADD_INPUT,
            "output_schema": SUM,
        },
    )
    _register(
        db_url,
        tmp_path,
        "tool",
        {
            "name": "liar",
            **server,
            "mcp_tool_name": "bad",
            # as the server declares it (the server's own declaration is compared first)
            "input_schema": {"type": "object", "properties": {}},
            "output_schema": {
                "type": "object",
                "required": ["ok"],
                "properties": {"ok": {"type": "boolean"}},
            },
        },
    )
    _register(
        db_url,
        tmp_path,
        "tool",
        {
            "name": "greet",
            **server,
            "mcp_tool_name": "plain",
            "input_schema": {"type": "object", "properties": {"who": {"type": "string"}}},
        },
    )
    _plan(db_url, project)

    code, ok, _ = _call(db_url, "calc", {"a": 2, "b": 3})
    assert code == 0 and ok["output_gate"]["verdict"] == "pass", ok
    assert ok["call"]["executor"] == "mcp" and ok["call"]["exit_code"] is None
    assert _blob(db_url, ok["call"]["output_sha256"]) == b'{"sum":5}'  # structuredContent
    assert _called(log) == [{"tool": "add", "arguments": {"a": 2, "b": 3}}]

    code, blocked, _ = _call(db_url, "calc", {"a": "two", "b": 3})
    assert code == 1 and blocked["call"] is None and blocked["input_gate"]["verdict"] == "fail"
    assert len(_calls(log)) == 1  # the input gate failed: never called

    code, lied, _ = _call(db_url, "liar", {})
    assert code == 1 and lied["call"]["executor"] == "mcp"
    assert [(d["pointer"], d["kind"]) for d in lied["output_gate"]["deviations"]] == [
        ("/ok", "wrong_type")
    ]

    # No output schema of its own: the whole MCP result, checked as one.
    code, greeted, _ = _call(db_url, "greet", {"who": "ada"})
    assert code == 0, greeted
    whole = json.loads(_blob(db_url, greeted["call"]["output_sha256"]))
    assert whole == {"content": [{"type": "text", "text": "hello ada"}], "isError": False}
    assert (
        greeted["output_gate"]["schema_sha256"] == prepare_schema(mcp_tool_result_schema()).sha256
    )
    assert [c["tool"] for c in _calls(log)] == ["add", "bad", "plain"]
    _audit_clean(db_url)


FAULTS = [
    pytest.param(
        {"mcp_command": ["/nonexistent/mcp-server"]},
        "program_missing",
        "install `/nonexistent/mcp-server`",
        id="missing-program",
    ),
    pytest.param(
        {"mcp_command": [sys.executable, "-c", "import sys; sys.exit('no config')"]},
        "backend_unavailable",
        "could not be started",
        id="exits-at-once",
    ),
    pytest.param(
        {"mcp_url": "http://127.0.0.1:9/mcp"},
        "backend_unavailable",
        "could not be reached",
        id="unreachable-url",
    ),
    pytest.param(
        {
            "mcp_tool_name": "crash",
            # registered as the server declares it: its own declaration is compared first
            "input_schema": {"type": "object", "properties": {}},
            "output_schema": {"type": "object", "properties": {}},
        },
        "backend_unavailable",
        "failed during",
        id="crash",
    ),
    # A tool the server does not list: its declaration drifted away (never called).
    pytest.param({"mcp_tool_name": "nope"}, "schema_drift", "no longer lists", id="unknown-tool"),
]


@pytest.mark.parametrize(("launch", "raw", "said"), FAULTS)
def test_a_server_that_cannot_serve_the_call_halts_with_environment_error(
    sqlite_url: str,
    tmp_path: Path,
    project: Path,
    launch: dict[str, Any],
    raw: str,
    said: str,
) -> None:
    spec = {
        "name": "calc",
        "mcp_server": "test-upstream",
        "mcp_tool_name": "add",
        "mcp_command": _upstream(tmp_path / "calls.jsonl"),
        "input_schema": {"type": "object"},
        "output_schema": {"type": "object"},
    }
    if "mcp_url" in launch:
        del spec["mcp_command"]
    _register(sqlite_url, tmp_path, "tool", {**spec, **launch})
    _plan(sqlite_url, project)
    code, report, _ = _call(sqlite_url, "calc", {})
    assert code == 1 and report["call"] is None and report["output_gate"] is None
    halt = report["halt"]
    assert (halt["halt_type"], halt["raw_halt_type"]) == ("environment_error", raw)
    assert said in halt["reason"] + halt["hint"], halt
    assert not [e for e in _events(sqlite_url) if e.type == "tool.called"]
    assert (project / "status.txt").read_text() == "bad\n"
    shown = run_cli("call", "P-1", "--tool", "calc", "--params", "{}", "--db", sqlite_url)
    assert shown.returncode == 1 and "halt environment_error" in shown.stdout
    assert "Traceback" not in shown.stderr and shown.stderr == "", shown.stderr


@slow
@pytest.mark.parametrize(
    ("command", "tool", "said"),
    [
        ([sys.executable, str(SERVER), "{log}"], "slow", "no answer within 3 s (calling"),
        ([sys.executable, str(RAW)], "garble", "broke the protocol"),
    ],
)
def test_a_hung_or_garbling_server_is_an_environment_error_not_a_hang(
    db_url: str, tmp_path: Path, project: Path, command: list[str], tool: str, said: str
) -> None:
    argv = [arg.replace("{log}", str(_logged(tmp_path / "calls.jsonl"))) for arg in command]
    _register(
        db_url,
        tmp_path,
        "tool",
        {
            "name": "t",
            "mcp_server": "up",
            "mcp_tool_name": tool,
            "mcp_command": argv,
            "timeout": 3,
            "input_schema": {"type": "object", "properties": {}},  # as the servers declare
        },
    )
    _plan(db_url, project)
    started = time.monotonic()
    code, report, stderr = _call(db_url, "t", {})
    assert time.monotonic() - started < 15
    assert code == 1 and report["halt"]["halt_type"] == "environment_error", report
    assert said in report["halt"]["reason"]
    assert stderr == ""


@slow
def test_the_sdk_log_never_reaches_the_terminal(
    sqlite_url: str, tmp_path: Path, project: Path
) -> None:
    """The SDK logs a line that is no MCP message with its traceback; in a process with
    no logging set up (the CLI) that would reach the user's terminal."""
    _register(
        sqlite_url,
        tmp_path,
        "tool",
        {
            "name": "t",
            "mcp_server": "raw",
            "mcp_tool_name": "garble",
            "mcp_command": [sys.executable, str(RAW)],
            "timeout": 10,
            "input_schema": {"type": "object", "properties": {}},  # as the server declares
        },
    )
    _plan(sqlite_url, project)
    done = run_cli_process("call", "P-1", "--tool", "t", "--params", "{}", "--db", sqlite_url)
    assert done.returncode == 1 and "broke the protocol" in done.stdout, done.stdout
    assert done.stderr == ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_servers(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """tests/mcp_server.py and tests/mcp_validator_server.py on streamable HTTP: their
    URLs and the first one's call log."""
    log = tmp_path / "http-calls.jsonl"
    ports = [_free_port(), _free_port()]
    servers = [
        subprocess.Popen([sys.executable, str(SERVER), str(_logged(log)), "--http", str(ports[0])]),
        subprocess.Popen([sys.executable, str(VALIDATOR), "--http", str(ports[1])]),
    ]
    try:
        for port, server in zip(ports, servers, strict=True):
            deadline = time.monotonic() + 60  # a generous wait for a server to listen
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline and server.poll() is None, "no server"
                    time.sleep(0.05)
        yield (*(f"http://127.0.0.1:{port}/mcp" for port in ports), log)  # type: ignore[misc]
    finally:
        for server in servers:
            server.kill()
            server.wait()


@slow
def test_streamable_http_servers(
    db_url: str, tmp_path: Path, project: Path, http_servers: tuple[str, str, Path]
) -> None:
    tools_url, checks_url, log = http_servers
    good = tmp_path / "elsewhere.txt"
    good.write_text("good\n")
    _register(
        db_url,
        tmp_path,
        "tool",
        {
            "name": "calc",
            "mcp_server": "web",
            "mcp_tool_name": "add",
            "mcp_url": tools_url,
            "input_schema": ADD_INPUT,
            "output_schema": SUM,
        },
    )
    _register(
        db_url,
        tmp_path,
        "validation",
        {
            "name": "web-status",
            "mode": "required",
            "mcp_server": "checks",
            "mcp_tool_name": "status",
            "mcp_url": checks_url,
            "input_schema": {"type": "object", "properties": {"file": {"type": "string"}}},
        },
    )
    _plan(db_url, project, ("web-status", {"file": str(good)}))
    code, report, _ = _call(db_url, "calc", {"a": 4, "b": 5})
    assert code == 0 and _blob(db_url, report["call"]["output_sha256"]) == b'{"sum":9}'
    assert _called(log) == [{"tool": "add", "arguments": {"a": 4, "b": 5}}]
    done = run_cli("validate", "P-1", "--json", "--db", db_url)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)["validation"]
    assert doc["outcome"] == "pass" and doc["token"]
    _audit_clean(db_url)


# -- validations -------------------------------------------------------------------------


def test_an_mcp_validation_gates_apply(db_url: str, tmp_path: Path, project: Path) -> None:
    _register(
        db_url,
        tmp_path,
        "validation",
        {
            "name": "mcp-status",
            "mode": "required",
            "mcp_server": "checks",
            "mcp_tool_name": "status",
            "mcp_command": [sys.executable, str(VALIDATOR)],
        },
    )
    for argv in (
        ["plan", "create", "P-1", "--project", "api", "--resource", str(project)],
        ["attach", "mcp-status", "--resource", str(project)],
        ["plan", "strategize", "P-1", "--strategy", "make the status good"],
        ["plan", "execute", "P-1"],
    ):
        done = run_cli(*argv, "--db", db_url)
        assert done.returncode == 0, (argv, done.stderr)

    # Called as a tool: read-only, its structured return checked as the output.
    code, called, _ = _call(db_url, "mcp-status", {})
    assert code == 0 and called["call"]["executor"] == "validation"
    assert json.loads(_blob(db_url, called["call"]["output_sha256"]))["passed"] is False

    failed = run_cli("validate", "P-1", "--json", "--db", db_url)
    assert failed.returncode == 1, failed.stderr
    doc = json.loads(failed.stdout)["validation"]
    assert doc["outcome"] == "blocker"
    (result,) = doc["results"]
    assert (result["verdict"], result["message"]) == (False, "status is bad")
    assert result["data"] == {"file": "status.txt"}
    assert _blob(db_url, result["raw_output_sha256"]) == canonical_json(
        {"passed": False, "message": "status is bad", "data": {"file": "status.txt"}}
    )

    with Plane.open(db_url) as plane:  # the agent's work, in the plan's sandbox
        (work(plane) / "status.txt").write_text("good\n")
    assert run_cli("fix", "P-1", "--note", "status is good", "--db", db_url).returncode == 0
    passed = run_cli("validate", "P-1", "--json", "--db", db_url)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    token = json.loads(passed.stdout)["validation"]["token"]
    applied = run_cli("apply", "P-1", "--token", token, "--db", db_url)
    assert applied.returncode == 0, applied.stderr
    assert (project / "status.txt").read_text() == "good\n"
    _audit_clean(db_url)


NO_VERDICT = [
    # name, server, MCP tool, args, cause, what the error says
    ("sum-only", "upstream", "add", {"a": 1, "b": 2}, "malformed", "unexpected key(s) sum"),
    ("text-only", "upstream", "plain", {}, "malformed", "no structuredContent"),
    ("dies", "upstream", "crash", {}, "crash", "failed during the call"),
    ("refuses", "checks", "refuse", {}, "malformed", "isError): cannot check today"),
    ("loose", "checks", "loose", {}, "malformed", "`passed` must be a boolean"),
    # confined read-only by the kernel: the write fails in the server (its detection,
    # as a read_only_violation, is tested unconfined in tests/commands/runner/test_landlock.py)
    ("writes", "checks", "scribble", {}, "crash", "Permission denied: 'scribble.txt'"),
    ("absent", "missing", "status", {}, "missing_program", "No such file"),
    ("broken", "broken", "status", {}, "crash", "could not be started"),
    ("hangs", "upstream", "slow", {}, "timeout", "no answer within 3 s"),
]


@slow
def test_an_mcp_validation_without_a_verdict_is_a_validator_error(
    db_url: str, tmp_path: Path, project: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    launch = {
        "upstream": _upstream(log),
        "checks": [sys.executable, str(VALIDATOR)],
        "missing": ["/nonexistent/mcp-checks"],
        "broken": [sys.executable, "-c", "raise SystemExit('no config')"],
    }
    for name, server, tool, args, _cause, _said in NO_VERDICT:
        schema = ADD_INPUT if args else None
        _register(
            db_url,
            tmp_path,
            "validation",
            {
                "name": name,
                "mode": "required",
                "mcp_server": server,
                "mcp_tool_name": tool,
                "mcp_command": launch[server],
                "timeout": 3 if tool == "slow" else 60,
                **({"input_schema": schema} if schema else {}),
            },
        )
    _plan(db_url, project, *((name, args) for name, _s, _t, args, _c, _w in NO_VERDICT))
    done = run_cli("validate", "P-1", "--json", "--db", db_url)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    doc = json.loads(done.stdout)["validation"]
    assert doc["outcome"] == "validator_error" and doc["token"] is None
    found = {r["validation"]: r for r in doc["results"]}
    for name, _server, _tool, _args, cause, said in NO_VERDICT:
        result = found[name]
        assert (result["verdict"], result["cause"]) == (None, cause), result
        assert said in result["error"], result
    assert found["writes"]["changed_paths"] == []
    assert found["writes"]["confinement"] == "landlock"
    with Plane.open(db_url) as plane:
        assert not (work(plane) / "scribble.txt").exists()
    assert not (project / "scribble.txt").exists()
    # The evidence of a return that was no verdict: the whole result, kept.
    kept = json.loads(_blob(db_url, found["refuses"]["raw_output_sha256"]))
    assert kept["isError"] is True and kept["structuredContent"]["passed"] is True
    _audit_clean(db_url)


# -- the client ----------------------------------------------------------------------------


def test_a_call_made_inside_a_running_event_loop(tmp_path: Path) -> None:
    """A synchronous caller inside an event loop (the MCP proxy's own verbs) still gets
    its call: the client runs in a thread of its own then."""
    log = tmp_path / "calls.jsonl"

    async def inside() -> Any:
        return call_mcp_tool("add", {"a": 1, "b": 1}, command=_upstream(log), timeout_s=30)

    call = anyio.run(inside)
    assert call.fault is None and call.result is not None, call.error
    assert call.result["structuredContent"] == {"sum": 2}


def test_output_over_the_cap_is_kept_truncated_and_never_passes(
    sqlite_url: str, tmp_path: Path, project: Path
) -> None:
    _register(
        sqlite_url,
        tmp_path,
        "tool",
        {
            "name": "greet",
            "mcp_server": "up",
            "mcp_tool_name": "plain",
            "mcp_command": _upstream(tmp_path / "calls.jsonl"),
            "max_output_bytes": 20,
            "input_schema": {"type": "object", "properties": {"who": {"type": "string"}}},
        },
    )
    _plan(sqlite_url, project)
    code, report, _ = _call(sqlite_url, "greet", {"who": "ada"})
    assert code == 1
    truncated = report["call"]["stdout_truncated"]
    assert truncated["kept"] == 20 and truncated["size"] > 20
    assert len(_blob(sqlite_url, report["call"]["output_sha256"])) == 20
    assert report["output_gate"]["checked_truncated"] == truncated
    _audit_clean(sqlite_url)


def test_a_file_registered_schema_that_drifted_from_the_server_is_never_called(
    sqlite_url: str, tmp_path: Path, project: Path
) -> None:
    """The registration file's copy of `add`'s input schema is looser than the server's
    own (no `required`): parameters valid for the file but not for the server would pass
    the gate and reach it. The plane reads the server's declaration first: drift halts
    the plan with environment_error (raw schema_drift) and the server is never called."""
    log = tmp_path / "calls.jsonl"
    loose = {**ADD_INPUT, "required": []}
    _register(
        sqlite_url,
        tmp_path,
        "tool",
        {
            "name": "calc",
            "mcp_server": "test-upstream",
            "mcp_tool_name": "add",
            "mcp_command": _upstream(log),
            "input_schema": loose,
            "output_schema": SUM,
        },
    )
    _plan(sqlite_url, project)
    code, report, _ = _call(sqlite_url, "calc", {"a": 1})
    halt = report["halt"]
    assert code == 1 and (halt["halt_type"], halt["raw_halt_type"]) == (
        "environment_error",
        "schema_drift",
    ), report
    assert "another input schema" in halt["reason"]
    assert _calls(log) == []  # never called


# -- a flooding server -------------------------------------------------------------------


def test_a_server_that_floods_a_call_is_kept_within_the_budget_and_counted(
    sqlite_url: str, tmp_path: Path, project: Path
) -> None:
    """An agent steers a server's tool with its arguments: one call that sends 3 MB of
    log messages, then asks for a sampling the plane's client refuses. The call keeps
    1 MiB of what the server said (the rest counted as dropped, not held), counts every
    message, and the refusal still makes the call the tool's failure (one past the
    budget too: tests/commands/runner/test_said.py)."""
    server = {"mcp_server": "test-upstream", "mcp_command": _upstream(tmp_path / "calls.jsonl")}
    flood = {"type": "object", "properties": {k: {"type": "integer"} for k in FLOOD}}
    spec = {"name": "flood", **server, "mcp_tool_name": "flood", "input_schema": flood}
    _register(sqlite_url, tmp_path, "tool", spec)
    _plan(sqlite_url, project)

    code, quiet, _ = _call(sqlite_url, "flood", {"count": 3000, "size": 1000, "asks": 0})
    assert code == 0 and quiet["output_gate"]["verdict"] == "pass", quiet
    code, asked, _ = _call(sqlite_url, "flood", {"count": 3000, "size": 1000, "asks": 1})
    assert code == 1 and asked["halt"] is None, asked
    assert asked["call"]["tool_error"] is True  # the tool's failure, not a pass

    calls = [e.payload for e in _events(sqlite_url) if e.type == "tool.called"]
    for called, refused in zip(calls, (0, 1), strict=True):
        assert called.exchange.log == 3000 and called.exchange.refused == refused
        assert called.exchange.sampling == refused
        kept = json.loads(_blob(sqlite_url, called.exchange_sha256))
        assert len(kept) + called.exchange.dropped == 3000 + refused
        assert 900 < len(kept) < 1100  # about 1 MiB of the 3 MB
        assert len(_blob(sqlite_url, called.exchange_sha256)) <= EXCHANGE_CAP
    _audit_clean(sqlite_url)
