"""`evidence serve`'s MCP gate over streamable HTTP (`POST /mcp`, docs/service.md "MCP
over HTTP"), driven by the official SDK's own streamable-HTTP client with the bearer
credential on every request.

In-process: the app under its lifespan, reached through httpx2's ASGI transport (the
SDK's HTTP client), with real MCP servers the plane launches in the plan's sandbox
(tests/mcp_server.py, tests/mcp_files_server.py) and a real ledger (SQLite and
PostgreSQL). The plan's MCP tools the operator registered are offered by their
registered names and schemas, beside the plane's verbs; a valid call is gated, called
and recorded; a deviation, an invented tool or a tool the gate does not offer is a tool
error and reaches no server; a missing or refused credential is 401, another plan 403,
nothing appended; validate, fix and apply work through the verbs; `evidence verify` and
`evidence audit` accept the log afterwards.

With a real uvicorn (`evidence serve` as a subprocess, marked slow): the same client
over a real socket.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

import ledger
from commands.plane import Plane
from commands.plane.attachments import attach
from commands.plane.credentials import issue_credential, revoke_credential
from commands.plane.mcp_answers import REFUSAL_META
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.proxy_verbs import INSTRUCTIONS, PLANE_TOOLS
from commands.plane.registry import define_skill, register_tool, register_validation
from commands.service import create_app
from commands.service.app import MCP_REFUSED
from tests.helpers import TESTS, run_cli

HERE = TESTS
UPSTREAM = HERE / "mcp_server.py"
FILES = HERE / "mcp_files_server.py"
BASE = "http://plane.test"
MCP = f"{BASE}/mcp"
HOUR = timedelta(hours=1)
T = TypeVar("T")

ADD_INPUT = {
    "type": "object",
    "required": ["a", "b"],
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
}
SUM = {"type": "object", "required": ["sum"], "properties": {"sum": {"type": "integer"}}}
PATH = {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"}
WRITE_INPUT = {
    "type": "object",
    "required": ["path", "text"],
    "properties": {"path": PATH, "text": {"type": "string"}},
}
WRITTEN = {
    "type": "object",
    "required": ["written", "bytes"],
    "properties": {"written": {"type": "string"}, "bytes": {"type": "integer"}},
}
READ_INPUT = {"type": "object", "required": ["path"], "properties": {"path": PATH}}
STATUS_CHECK = """
import json
ok = open("status.txt").read().strip() == "good"
print(json.dumps({"passed": ok, "message": "status is good" if ok else "status is bad"}))
"""
VERBS = set(PLANE_TOOLS)
# The tools the gate offers a plan without skills: the registered MCP tools whose server
# the plane launches, by their registered names.
OFFERED = {"calc", "bad-output", "crash", "huge", "files.write", "files.read"}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(autouse=True)
def _server_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test servers append each call they get to a log: launched confined by the
    plane, they may write it only where the operator allows (EVIDENCE_CONFINE_WRITE),
    a directory beside the ledger, never one holding it."""
    (tmp_path / "upstream").mkdir()
    monkeypatch.setenv("EVIDENCE_CONFINE_WRITE", str(tmp_path / "upstream"))


@dataclass
class Agent:
    plan_id: str
    token: str
    credential_id: str
    project: Path


def _log(root: Path) -> Path:
    return root / "upstream" / "calls.jsonl"


def _calls(root: Path) -> list[dict[str, Any]]:
    found = _log(root)
    return [json.loads(line) for line in found.read_text().splitlines()] if found.exists() else []


def _register(url: str, root: Path) -> None:
    """The operator's registry: MCP tools whose servers the plane launches (offered),
    and what the gate never offers — a command tool, an MCP tool that can only be
    recorded (no launch key), a validation."""
    (root / "check.py").write_text(STATUS_CHECK)
    upstream = [sys.executable, str(UPSTREAM), str(_log(root))]
    files = [sys.executable, str(FILES), str(_log(root))]

    def mcp(name: str, server: str, tool: str, command: list[str], **schemas: Any) -> None:
        register_tool(
            plane,
            {
                "name": name,
                "description": f"{tool} on {server}",
                "mcp_server": server,
                "mcp_tool_name": tool,
                "mcp_command": command,
                **schemas,
            },
        )

    with Plane.open(url) as plane:
        mcp("calc", "test-upstream", "add", upstream, input_schema=ADD_INPUT, output_schema=SUM)
        mcp(
            "bad-output",
            "test-upstream",
            "bad",
            upstream,
            input_schema={"type": "object", "properties": {}},
            output_schema={
                "type": "object",
                "required": ["ok"],
                "properties": {"ok": {"type": "boolean"}},
            },
        )
        mcp(
            "crash",
            "test-upstream",
            "crash",
            upstream,
            input_schema={"type": "object", "properties": {}},
            output_schema={"type": "object", "properties": {}},
        )
        mcp(
            "huge",
            "test-upstream",
            "huge",
            upstream,
            input_schema={"type": "object", "properties": {"size": {"type": "integer"}}},
            max_output_bytes=200,
        )
        mcp(
            "files.write",
            "test-files",
            "write_file",
            files,
            input_schema=WRITE_INPUT,
            output_schema=WRITTEN,
        )
        mcp("files.read", "test-files", "read_file", files, input_schema=READ_INPUT)
        register_tool(
            plane,
            {
                "name": "echo",
                "command": ["python", "-c", "print('{{}}')"],
                "output_schema": {"type": "object"},
            },
        )
        register_tool(
            plane,
            {
                "name": "remote.search",
                "mcp_server": "remote",
                "mcp_tool_name": "search",
                "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        )
        register_validation(
            plane,
            {"name": "status", "mode": "required", "command": ["python", str(root / "check.py")]},
        )


def _plan(
    url: str, root: Path, plan_id: str, *, execute: bool = True, skills: tuple[str, ...] = ()
) -> Agent:
    """A plan on its own project (status.txt "bad", the status validation attached), in
    Execute unless told otherwise, and an agent credential for it."""
    project = root / "projects" / plan_id
    project.mkdir(parents=True)
    (project / "status.txt").write_text("bad\n")
    with Plane.open(url) as plane:
        create_plan(
            plane,
            plan_id,
            project=plan_id,
            resources=[str(project)],
            config={"max_iterations": 10},
            skills=skills,
        )
        attach(plane, "status", resource=str(project))
        record_strategy(plane, plan_id, "make the status good")
        if execute:
            enter_execute(plane, plan_id)
        issued = issue_credential(plane, plan_id, ttl=HOUR)
    return Agent(plan_id, issued.token, issued.credential_id, project)


def _sandbox(url: str, agent: Agent) -> Path:
    with Plane.open(url) as plane:
        plan = plane.state(f"plan:{agent.plan_id}").doc
        return plane.sandbox(plan).ensure().copies[str(agent.project)]


def _events(url: str, plan_id: str) -> list[ledger.RecordedEvent]:
    with ledger.open(url, create=False) as store:
        return list(store.read_stream(f"plan:{plan_id}"))


def _head(url: str) -> int:
    with ledger.open(url, create=False) as store:
        return store.head().size


def _client(app: Any, token: str | None = None, **headers: str) -> httpx2.AsyncClient:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=app), base_url=BASE, headers=headers, timeout=120
    )


@contextlib.asynccontextmanager
async def _session(http: httpx2.AsyncClient, url: str = MCP) -> AsyncIterator[ClientSession]:
    """The SDK's streamable-HTTP client on ``http`` (which carries the credential)."""
    async with (
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        yield session


Drive = Callable[[Any], Awaitable[T]]


def _serve(url: str, drive: Drive[T], *, max_in_flight: int = 8, limit: float = 120) -> T:
    """``drive(app)`` with the app under its lifespan, in one event loop."""
    app = create_app(url, max_in_flight=max_in_flight)

    async def main() -> T:
        async with app.router.lifespan_context(app):
            with anyio.fail_after(limit):
                return await drive(app)

    return anyio.run(main)


def _as_agent(url: str, token: str, work: Callable[[ClientSession], Awaitable[T]]) -> T:
    """``work(session)`` after ``initialize``, as the agent holding ``token``."""

    async def drive(app: Any) -> T:
        async with _client(app, token) as http, _session(http) as session:
            await session.initialize()
            return await work(session)

    return _serve(url, drive)


def _text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def _refusal(result: types.CallToolResult) -> dict[str, Any]:
    """A refusal's detail: in ``_meta``, never in ``structuredContent``."""
    assert result.is_error and result.structured_content is None, result
    assert result.meta is not None
    detail: dict[str, Any] = result.meta[REFUSAL_META]
    return detail


def _audit_clean(url: str) -> None:
    assert run_cli("verify", "--db", url).returncode == 0
    audit = run_cli("audit", "--db", url)
    assert audit.returncode == 0, audit.stdout + audit.stderr


# -- what is offered ----------------------------------------------------------------------


def test_the_plans_mcp_tools_are_offered_with_their_schemas_beside_the_verbs(
    db_url: str, tmp_path: Path
) -> None:
    _register(db_url, tmp_path)
    agent = _plan(db_url, tmp_path, "P-1")
    seen: dict[str, Any] = {}

    async def drive(app: Any) -> None:
        async with _client(app, agent.token) as http, _session(http) as session:
            seen["init"] = await session.initialize()
            seen["tools"] = {t.name: t for t in (await session.list_tools()).tools}

    _serve(db_url, drive)
    init, tools = seen["init"], seen["tools"]
    # initialize answers the stdio proxy's instructions
    assert init.instructions == INSTRUCTIONS
    assert init.server_info.name == "evidence-plane"
    # by registered name: never the command tool, the recorded-only MCP tool, the
    # validation; never authorize
    assert set(tools) == OFFERED | VERBS
    assert "evidence.authorize" not in tools
    calc = tools["calc"]
    assert (calc.input_schema, calc.output_schema) == (ADD_INPUT, SUM)
    assert calc.description == "add on test-upstream"
    assert (tools["files.write"].input_schema, tools["files.write"].output_schema) == (
        WRITE_INPUT,
        WRITTEN,
    )
    # no output schema declared: none offered (it returns an MCP tool result)
    assert tools["files.read"].output_schema is None
    for name in VERBS:
        assert tools[name].input_schema == PLANE_TOOLS[name].input_schema
    assert _calls(tmp_path) == []  # listing launches no server


def test_a_plans_skills_narrow_what_is_offered(sqlite_url: str, tmp_path: Path) -> None:
    _register(sqlite_url, tmp_path)
    with Plane.open(sqlite_url) as plane:
        define_skill(plane, {"name": "adder", "members": ["calc"]})
    agent = _plan(sqlite_url, tmp_path, "P-1", skills=("adder",))

    async def work(session: ClientSession) -> tuple[set[str], types.CallToolResult]:
        listed = {t.name for t in (await session.list_tools()).tools}
        return listed, await session.call_tool("files.read", {"path": "status.txt"})

    listed, outside = _as_agent(sqlite_url, agent.token, work)
    assert listed == {"calc"} | VERBS
    assert _refusal(outside)["deviations"][0]["kind"] == "not_in_skill"
    assert _calls(tmp_path) == []


# -- calls --------------------------------------------------------------------------------


def test_a_valid_call_is_gated_called_in_the_sandbox_and_recorded(
    db_url: str, tmp_path: Path
) -> None:
    _register(db_url, tmp_path)
    agent = _plan(db_url, tmp_path, "P-1")

    async def work(session: ClientSession) -> list[types.CallToolResult]:
        return [
            await session.call_tool("calc", {"a": 1, "b": 2}, meta={"evidence/step": "add-1"}),
            await session.call_tool("files.write", {"path": "notes.txt", "text": "hello\n"}),
            await session.call_tool("files.read", {"path": "notes.txt"}),
        ]

    added, written, read = _as_agent(db_url, agent.token, work)
    assert not added.is_error and added.structured_content == {"sum": 3}
    assert _text(added) == "3"  # the server's own result, passed on whole
    assert written.structured_content == {"written": "notes.txt", "bytes": 6}
    assert not read.is_error and _text(read) == "hello\n"
    assert [c["tool"] for c in _calls(tmp_path)] == ["add", "write_file", "read_file"]
    # the write happened in the plan's sandbox, not in the real resource
    assert (_sandbox(db_url, agent) / "notes.txt").read_text() == "hello\n"
    assert not (agent.project / "notes.txt").exists()
    events = _events(db_url, agent.plan_id)
    calls = [e.payload for e in events if e.type == "tool.called"]
    assert [(c.tool, c.executor) for c in calls] == [
        ("calc", "mcp"),
        ("files.write", "mcp"),
        ("files.read", "mcp"),
    ]
    assert calls[0].step == "add-1" and all(e.actor == "agent" for e in events[-3:])
    checks = [e.payload for e in events if e.type == "gate.checked"]
    assert [(c.gate, c.verdict) for c in checks] == [("input", "pass"), ("output", "pass")] * 3
    _audit_clean(db_url)


def test_refusals_are_tool_errors_and_reach_no_server(sqlite_url: str, tmp_path: Path) -> None:
    _register(sqlite_url, tmp_path)
    agent = _plan(sqlite_url, tmp_path, "P-1")
    heads: dict[str, int] = {}

    async def work(session: ClientSession) -> dict[str, types.CallToolResult]:
        seen = {
            "bad_input": await session.call_tool("calc", {"a": "one", "b": 2}),
            "extra": await session.call_tool("calc", {"a": 1, "b": 2, "c": 3}),
            "invented": await session.call_tool("nope", {}),
            "authorize": await session.call_tool("evidence.authorize", {}),
        }
        heads["before"] = _head(sqlite_url)
        # not offered here: refused with nothing recorded, never run
        seen["command_tool"] = await session.call_tool("echo", {})
        seen["recorded_only"] = await session.call_tool("remote.search", {"q": "x"})
        seen["validation"] = await session.call_tool("status", {})
        seen["bad_step"] = await session.call_tool(
            "calc", {"a": 1, "b": 2}, meta={"evidence/step": "../x"}
        )
        seen["verb_args"] = await session.call_tool("evidence.record_fix", {"note": ""})
        # a schema of the agent's own: never compiled by the service every agent shares
        seen["own_schema"] = await session.call_tool(
            "calc", {"a": 1, "b": 2}, meta={"evidence/output_schema": {"enum": list(range(10**5))}}
        )
        heads["after"] = _head(sqlite_url)
        return seen

    seen = _as_agent(sqlite_url, agent.token, work)
    bad = _refusal(seen["bad_input"])
    assert (bad["gate"], bad["tool"], bad["deviations"][0]["pointer"]) == ("input", "calc", "/a")
    assert _text(seen["bad_input"]).startswith(
        "blocked: the input gate failed for tool 'calc': 1 deviation(s); the call was not "
        "forwarded\n  /a: wrong_type (expected integer; got string)\n"
    )
    assert "iteration(s) left in this attempt" in _text(seen["bad_input"])
    assert _refusal(seen["extra"])["deviations"][0]["kind"] == "extra_field"
    for invented in ("invented", "authorize"):
        assert _refusal(seen[invented])["deviations"][0]["kind"] == "invented_tool"
    for name in ("command_tool", "recorded_only", "validation", "bad_step", "own_schema"):
        assert _text(seen[name]).startswith("error: "), (name, seen[name])
        assert set(_refusal(seen[name])) == {"error"}
    assert "not offered here" in _text(seen["command_tool"])
    assert "not accepted through the service" in _text(seen["own_schema"])
    assert _refusal(seen["verb_args"])["deviations"][0]["pointer"] == "/note"
    assert heads["after"] == heads["before"]
    assert _calls(tmp_path) == []  # nothing reached a server
    events = _events(sqlite_url, agent.plan_id)
    assert not any(e.type == "tool.called" for e in events)
    failed = [e.payload.tool for e in events if e.type == "gate.checked"]
    assert failed == ["calc", "calc", "nope", "evidence.authorize"]


def test_an_output_deviation_and_a_tools_own_error(sqlite_url: str, tmp_path: Path) -> None:
    _register(sqlite_url, tmp_path)
    agent = _plan(sqlite_url, tmp_path, "P-1")

    async def work(session: ClientSession) -> tuple[types.CallToolResult, ...]:
        return (
            await session.call_tool("bad-output", {}),
            await session.call_tool("files.read", {"path": "missing.txt"}),
            await session.call_tool("huge", {"size": 5000}),
        )

    rejected, failed, huge = _as_agent(sqlite_url, agent.token, work)
    refusal = _refusal(rejected)
    assert (refusal["gate"], refusal["deviations"][0]["pointer"]) == ("output", "/ok")
    assert _text(rejected).startswith("rejected: the output gate failed for tool 'bad-output'")
    # the call wrote in the sandbox, then failed its output gate: nothing kept
    assert not (_sandbox(sqlite_url, agent) / "bad-was-here.txt").exists()
    # the tool's own error is passed on as it said it, marked as the tool's, and spends
    # an iteration (the plane's routing line after it)
    said, routing = [c.text for c in failed.content]
    assert failed.is_error and said == "no such file: missing.txt"
    assert routing.startswith("evidence: routed: retry in the next iteration")
    assert failed.meta[REFUSAL_META]["upstream_error"] is True
    assert failed.meta[REFUSAL_META]["routed"] == "retry"
    # an answer over the tool's output cap: its prefix kept, never parsed, never passed on
    over = _refusal(huge)
    assert (over["gate"], over["deviations"][0]["actual_type"]) == ("output", "invalid_json")
    assert "truncated at 200 bytes" in _text(huge) and "x" * 300 not in _text(huge)
    called = [e.payload for e in _events(sqlite_url, agent.plan_id) if e.type == "tool.called"]
    assert called[1].tool_error is True
    assert called[2].stdout_truncated.kept == 200


def test_a_server_that_cannot_serve_the_call_is_an_mcp_error_and_halts_the_plan(
    sqlite_url: str, tmp_path: Path
) -> None:
    _register(sqlite_url, tmp_path)
    agent = _plan(sqlite_url, tmp_path, "P-1")

    async def work(session: ClientSession) -> tuple[MCPError | types.CallToolResult, ...]:
        try:
            crashed: MCPError | types.CallToolResult = await session.call_tool("crash", {})
        except MCPError as exc:
            crashed = exc
        return crashed, await session.call_tool("calc", {"a": 1, "b": 1})

    crashed, after = _as_agent(sqlite_url, agent.token, work)
    assert isinstance(crashed, MCPError), crashed
    assert "environment_error" in str(crashed) and "'crash'" in str(crashed)
    halts = [e.payload for e in _events(sqlite_url, agent.plan_id) if e.type == "plan.halted"]
    assert [(h.halt_type, h.raw_halt_type) for h in halts] == [
        ("environment_error", "backend_unavailable")
    ]
    # no upstream outlives a call here: the next call starts its server anew
    assert after.structured_content == {"sum": 2}


def test_a_plan_state_that_allows_no_call_is_a_tool_error(sqlite_url: str, tmp_path: Path) -> None:
    _register(sqlite_url, tmp_path)
    agent = _plan(sqlite_url, tmp_path, "P-1", execute=False)
    before = _head(sqlite_url)

    async def work(session: ClientSession) -> tuple[types.CallToolResult, ...]:
        return (
            await session.call_tool("calc", {"a": 1, "b": 2}),
            await session.call_tool("evidence.validate", {}),
            await session.call_tool("evidence.plan_status", {}),
        )

    called, validated, status = _as_agent(sqlite_url, agent.token, work)
    assert _text(called) == (
        "error: plan P-1 is in Strategize: the plane's MCP gate makes tool calls only in "
        "Execute (next: evidence.execute)"  # the door's own verb, never a CLI command
    )
    assert _refusal(validated)["error"].startswith("plan P-1 is in Strategize")
    assert not status.is_error and status.structured_content is not None
    assert status.structured_content["plan"]["phase"] == "strategize"
    assert _head(sqlite_url) == before and _calls(tmp_path) == []


def test_the_agent_enters_execute_and_revises_its_strategy_through_the_gate(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The failure loop's revision is the agent's: evidence.record_strategy and
    evidence.execute, each refused (in the gate's own terms) where the plan's state
    does not allow it."""
    _register(sqlite_url, tmp_path)
    agent = _plan(sqlite_url, tmp_path, "P-1", execute=False)

    async def work(session: ClientSession) -> tuple[types.CallToolResult, ...]:
        return (
            await session.call_tool("evidence.record_strategy", {"strategy": "add, then check"}),
            await session.call_tool("evidence.execute", {}),
            await session.call_tool("evidence.execute", {}),
            await session.call_tool("evidence.record_strategy", {"strategy": "again"}),
            await session.call_tool("calc", {"a": 1, "b": 2}),
        )

    recorded, entered, twice, late, called = _as_agent(sqlite_url, agent.token, work)
    assert not recorded.is_error and recorded.structured_content is not None
    assert recorded.structured_content["plan"]["strategy"] == "add, then check"
    assert not entered.is_error and entered.structured_content is not None
    assert entered.structured_content["plan"]["phase"] == "execute"
    assert entered.structured_content["sandbox"]
    assert _refusal(twice)["error"] == "plan P-1 is in Execute, not Strategize"
    assert _refusal(late)["error"].startswith("plan P-1 is in Execute: a strategy is recorded")
    assert not called.is_error, _text(called)
    # each answer says where the plan stands now
    assert entered.meta is not None and called.meta is not None
    assert entered.meta["evidence/plan_state"]["phase"] == "execute"
    assert called.meta["evidence/plan_state"] == {
        "phase": "execute", "revision": 0, "attempt": 1, "needs_fix": False,
        "terminal": None, "pending_decision": None,
    }  # fmt: skip
    actors = {e.type: e.actor for e in _events(sqlite_url, "P-1")}
    assert actors["plan.execute_entered"] == "agent"


# -- the plane's verbs --------------------------------------------------------------------


def test_validate_fix_validate_apply_through_the_gate(db_url: str, tmp_path: Path) -> None:
    """A plan from a failing validation to Apply with nothing but the gate: the fix made
    by an MCP tool in the sandbox, the verbs for the rest."""
    _register(db_url, tmp_path)
    agent = _plan(db_url, tmp_path, "P-1")
    seen: dict[str, Any] = {}

    async def work(session: ClientSession) -> None:
        first = await session.call_tool("evidence.validate", {})
        seen["first"] = (first.structured_content or {})["validation"]
        await session.call_tool("files.write", {"path": "status.txt", "text": "good\n"})
        seen["early"] = await session.call_tool("evidence.validate", {})
        await session.call_tool("evidence.record_fix", {"note": "status is good now"})
        second = await session.call_tool("evidence.validate", {})
        token = (second.structured_content or {})["validation"]["token"]
        seen["second"] = second.structured_content
        seen["forged"] = await session.call_tool("evidence.apply", {"token": token[:-4] + "AAAA"})
        seen["applied"] = await session.call_tool("evidence.apply", {"token": token})
        seen["again"] = await session.call_tool("evidence.apply", {"token": token})

    _as_agent(db_url, agent.token, work)
    assert seen["first"]["outcome"] == "blocker"
    # a fix must be recorded before validating again: the verb's refusal, a tool error
    assert _text(seen["early"]).startswith("error: plan P-1's last validation failed")
    assert seen["second"]["validation"]["outcome"] == "pass"
    assert _text(seen["forged"]).startswith("error: token refused")
    applied = seen["applied"]
    assert not applied.is_error, applied
    assert [f["path"] for f in applied.structured_content["files"]] == ["status.txt"]
    assert (agent.project / "status.txt").read_text() == "good\n"
    assert _text(seen["again"]).startswith("error: ")
    _audit_clean(db_url)


# -- who may ask ----------------------------------------------------------------------------


def test_no_accepted_credential_is_401_and_appends_nothing(db_url: str, tmp_path: Path) -> None:
    _register(db_url, tmp_path)
    agent = _plan(db_url, tmp_path, "P-1")
    with Plane.open(db_url) as plane:
        revoked = issue_credential(plane, agent.plan_id, ttl=HOUR)
        revoke_credential(plane, revoked.credential_id, "rotated")
        expired = issue_credential(plane, agent.plan_id, ttl=timedelta(microseconds=1))
    cases: dict[str, dict[str, str]] = {
        "none": {},
        "basic": {"Authorization": "Basic dXNlcjpwYXNz"},
        "random": {"Authorization": "Bearer evd_" + "0" * 26 + "_" + "A" * 43},
        "not a credential": {"Authorization": "Bearer abc.def"},
        "revoked": {"Authorization": f"Bearer {revoked.token}"},
        "expired": {"Authorization": f"Bearer {expired.token}"},
    }
    before = _head(db_url)
    answers: dict[str, httpx2.Response] = {}
    refused: dict[str, BaseException] = {}

    async def drive(app: Any) -> None:
        for name, headers in cases.items():
            async with _client(app, **headers) as http:
                answers[name] = await http.post(
                    "/mcp", headers=ACCEPT, content=json.dumps(INIT).encode()
                )
                # the SDK's client gets no session either
                try:
                    async with _session(http) as session:
                        await session.initialize()
                except Exception as exc:
                    refused[name] = exc

    _serve(db_url, drive)
    for name, answer in answers.items():
        assert answer.status_code == 401, (name, answer.text)
        challenge = answer.headers["www-authenticate"]
        assert challenge.startswith('Bearer realm="evidence"'), name
        # a token was given: it is the token that is refused
        assert ('error="invalid_token"' in challenge) == (name not in ("none", "basic")), name
        # where a client learns what it needs (RFC 9728): /mcp's protected-resource metadata
        assert f'resource_metadata="{BASE}/.well-known/oauth-protected-resource/mcp"' in challenge
        assert "evidence credential issue" in challenge, name
        # a JSON-RPC error, one line: the reason and how a credential is obtained
        error = answer.json()
        assert set(error) == {"jsonrpc", "id", "error"} and error["id"] is None, name
        assert error["error"]["code"] == MCP_REFUSED and error["error"]["data"] == {"status": 401}
        message = error["error"]["message"]
        assert "\n" not in message and "evidence credential issue" in message, name
    assert set(refused) == set(cases)
    # the SDK's client surfaces that message (it drops any other body of a non-2xx answer)
    for name, raised in refused.items():
        exc = _leaf(raised)  # inside the SDK's task groups
        assert isinstance(exc, MCPError), (name, raised)
        assert exc.error.code == MCP_REFUSED, name
        assert exc.error.message == answers[name].json()["error"]["message"], name
    assert "revoked" in str(_leaf(refused["revoked"]))
    assert "expired" in str(_leaf(refused["expired"]))
    assert "no credential" in str(_leaf(refused["none"]))
    assert _head(db_url) == before and _calls(tmp_path) == []


def _leaf(exc: BaseException) -> BaseException:
    """The one exception inside the exception groups of the SDK's task groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def test_a_credential_acts_for_its_own_plan_only(sqlite_url: str, tmp_path: Path) -> None:
    """Another plan's credential reaches that plan, never this one: naming this plan is
    403 (nothing appended); its calls are recorded in its own plan."""
    _register(sqlite_url, tmp_path)
    agent = _plan(sqlite_url, tmp_path, "P-1")
    other = _plan(sqlite_url, tmp_path, "Q-1")
    mine_before = _events(sqlite_url, agent.plan_id)
    seen: dict[str, Any] = {}

    async def drive(app: Any) -> None:
        async with _client(app, other.token) as http:
            before = _head(sqlite_url)
            seen["named"] = await http.post(
                "/mcp", params={"plan": agent.plan_id}, headers=ACCEPT, content=json.dumps(INIT)
            )
            seen["unknown_query"] = await http.post(
                "/mcp", params={"debug": "1"}, headers=ACCEPT, content=json.dumps(INIT)
            )
            seen["head_unchanged"] = _head(sqlite_url) == before
            async with _session(http, f"{MCP}?plan={other.plan_id}") as session:
                await session.initialize()
                seen["status"] = await session.call_tool("evidence.plan_status", {})
                seen["call"] = await session.call_tool("calc", {"a": 2, "b": 2})

    _serve(sqlite_url, drive)
    assert seen["named"].status_code == 403
    named = seen["named"].json()  # a JSON-RPC error, as the SDK's transport answers
    assert named["jsonrpc"] == "2.0" and agent.plan_id in named["error"]["message"]
    assert named["error"]["data"] == {"status": 403}
    assert seen["unknown_query"].status_code == 422
    assert seen["head_unchanged"]
    assert seen["status"].structured_content["plan"]["plan_id"] == other.plan_id
    assert seen["call"].structured_content == {"sum": 4}
    assert _events(sqlite_url, agent.plan_id) == mine_before
    assert [e.type for e in _events(sqlite_url, other.plan_id)][-3:] == [
        "gate.checked",
        "tool.called",
        "gate.checked",
    ]


def test_the_transport_refuses_what_is_no_mcp_message(sqlite_url: str, tmp_path: Path) -> None:
    _register(sqlite_url, tmp_path)
    agent = _plan(sqlite_url, tmp_path, "P-1")
    before = _head(sqlite_url)
    seen: dict[str, httpx2.Response] = {}

    async def drive(app: Any) -> None:
        async with _client(app, agent.token) as http:
            seen["get"] = await http.get("/mcp", headers=ACCEPT)
            seen["not_json"] = await http.post("/mcp", headers=ACCEPT, content=b"{nope")
            seen["no_accept"] = await http.post(
                "/mcp",
                headers={"Accept": "text/html", "Content-Type": "application/json"},
                content=json.dumps(INIT),
            )

    _serve(sqlite_url, drive)
    assert seen["get"].status_code == 405  # stateless: no SSE stream to open
    assert seen["not_json"].status_code == 400
    assert seen["not_json"].json()["error"]["code"] == types.PARSE_ERROR
    assert seen["no_accept"].status_code == 406
    assert _head(sqlite_url) == before


# -- metrics and the document ----------------------------------------------------------------


def _samples(text: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def test_metrics_count_mcp_requests_and_gate_checks_and_the_document_shows_mcp(
    sqlite_url: str, tmp_path: Path
) -> None:
    _register(sqlite_url, tmp_path)
    agent = _plan(sqlite_url, tmp_path, "P-1")
    seen: dict[str, Any] = {}

    async def drive(app: Any) -> None:
        async with _client(app, agent.token) as http:
            async with _session(http) as session:
                await session.initialize()
                await session.list_tools()
                await session.call_tool("calc", {"a": 1, "b": 2})
                await session.call_tool("calc", {"a": "x", "b": 2, "z": 0})
                await session.call_tool("evidence.validate", {})
            seen["metrics"] = (await http.get("/metrics")).text
            seen["doc"] = (await http.get("/openapi.json")).json()
        async with _client(app) as anonymous:
            await anonymous.post("/mcp", headers=ACCEPT, content=json.dumps(INIT))
            seen["after"] = (await anonymous.get("/metrics")).text

    _serve(sqlite_url, drive)
    got, after = _samples(seen["metrics"]), _samples(seen["after"])
    posts = 'evidence_http_requests_total{method="POST",route="/mcp",status="200"}'
    # initialize, tools/list, three calls (the initialized notification is a 202)
    assert got[posts] == 5
    assert got['evidence_http_requests_total{method="POST",route="/mcp",status="202"}'] == 1
    assert got['evidence_gate_checks_total{gate="input",verdict="pass"}'] == 1
    assert got['evidence_gate_checks_total{gate="output",verdict="pass"}'] == 1
    assert got['evidence_gate_checks_total{gate="input",verdict="fail"}'] == 1
    assert got['evidence_gate_deviations_total{gate="input",kind="wrong_type"}'] == 1
    assert got['evidence_gate_deviations_total{gate="input",kind="extra_field"}'] == 1
    assert got['evidence_validations_total{outcome="blocker"}'] == 1
    assert got['evidence_http_request_duration_seconds_count{route="/mcp"}'] == 6
    assert after['evidence_http_requests_total{method="POST",route="/mcp",status="401"}'] == 1
    assert got["evidence_in_flight"] == 0

    operation = seen["doc"]["paths"]["/mcp"]["post"]
    assert operation["tags"] == ["mcp"]
    assert {"200", "202", "400", "401", "403", "406", "413", "503"} <= set(operation["responses"])
    assert "409" not in operation["responses"]  # a refused call is a tool error, in a 200
    assert operation["requestBody"]["required"] is True
    validator = pytest.importorskip("openapi_spec_validator")
    validator.validate(seen["doc"])


# -- a real uvicorn ------------------------------------------------------------------------


@pytest.mark.slow
def test_the_gate_through_a_real_service(sqlite_url: str, tmp_path: Path) -> None:
    from tests.commands.service.test_service import Server

    _register(sqlite_url, tmp_path)
    agent = _plan(sqlite_url, tmp_path, "R-1")
    server = Server(sqlite_url)
    seen: dict[str, Any] = {}

    async def main() -> None:
        headers = {"Authorization": f"Bearer {agent.token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=120) as http,
            _session(http, f"{server.base}/mcp") as session,
        ):
            with anyio.fail_after(120):
                seen["init"] = await session.initialize()
                seen["tools"] = {t.name for t in (await session.list_tools()).tools}
                seen["ok"] = await session.call_tool("calc", {"a": 20, "b": 22})
                seen["bad"] = await session.call_tool("calc", {"a": 1})
                seen["validate"] = await session.call_tool("evidence.validate", {})
        async with httpx2.AsyncClient(timeout=60) as anonymous:
            seen["anonymous"] = await anonymous.post(
                f"{server.base}/mcp", headers=ACCEPT, content=json.dumps(INIT)
            )

    try:
        anyio.run(main)
    finally:
        assert server.stop() == 0, server.logged()
    assert seen["init"].instructions == INSTRUCTIONS
    assert seen["tools"] == OFFERED | VERBS
    assert seen["ok"].structured_content == {"sum": 42}
    assert _refusal(seen["bad"])["deviations"][0]["kind"] == "missing_required"
    validation = (seen["validate"].structured_content or {})["validation"]
    assert validation["outcome"] == "blocker"
    assert seen["anonymous"].status_code == 401
    assert [c["arguments"] for c in _calls(tmp_path)] == [{"a": 20, "b": 22}]
    _audit_clean(sqlite_url)
