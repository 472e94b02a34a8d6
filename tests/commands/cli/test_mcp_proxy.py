"""`evidence mcp proxy`: the MCP gate proxy as a real process in front of a real MCP
server (tests/mcp_server.py, on stdio or streamable HTTP), driven by the official SDK's
client. A valid call reaches the server and is recorded; a deviating input or an
invented tool never reaches it; off-schema output fails the output gate (these sessions
also run through `evidence serve`'s MCP gate, the same but for the tool names); an upstream
crash, timeout or protocol error is an MCP error and an environment_error halt; the
plane's own verbs take a plan from a failing validation to Apply; four proxies on one
PostgreSQL ledger at once leave it verifiable; the audit is clean afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import msgspec
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

import ledger
from commands.plane import Plane
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import define_skill, register_tool
from tests.helpers import REPO, TESTS, assert_refused, run_cli, status_plan

SERVER = TESTS / "mcp_server.py"
ROOT = REPO

# Tests marked slow start real MCP processes: the proxy and the server.
slow = pytest.mark.slow


def _setup(
    url: str, plan_id: str = "P-1", *, strict: bool = False, skills: tuple[str, ...] = ()
) -> None:
    with Plane.open(url) as plane:
        create_plan(
            plane,
            plan_id,
            project="api",
            resources=["repo:api"],
            config={"max_iterations": 10, "strict_mode": strict},
            skills=list(skills),
        )
        record_strategy(plane, plan_id, "call the MCP server")
        enter_execute(plane, plan_id)


@pytest.fixture(autouse=True)
def _server_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test server appends each call it gets to a log: the upstream runs confined, so
    it may write that log only where the operator allows (EVIDENCE_CONFINE_WRITE, which
    the proxy process inherits), a directory beside the ledger, never one holding it."""
    (tmp_path / "upstream").mkdir()
    monkeypatch.setenv("EVIDENCE_CONFINE_WRITE", str(tmp_path / "upstream"))


def _logged(count: Path) -> Path:
    """Where the server writes the log named ``count``: in the allowed directory."""
    return count.parent / "upstream" / count.name


def _calls(count: Path) -> list[dict[str, Any]]:
    count = _logged(count)
    if not count.exists():
        return []
    return [json.loads(line) for line in count.read_text().splitlines()]


def _proxy(
    url: str,
    workdir: Path,
    upstream: list[str],
    *,
    plan_id: str = "P-1",
    timeout: float = 20,
) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if k != "EVIDENCE_DB"}
    env["PYTHONPATH"] = str(ROOT)
    return StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "commands.cli",
            "mcp",
            "proxy",
            "--plan",
            plan_id,
            "--db",
            url,
            "--workdir",
            str(workdir),
            "--timeout",
            str(timeout),
            *upstream,
        ],
        env=env,
        cwd=ROOT,
    )


def _stdio(count: Path) -> list[str]:
    return ["--", sys.executable, str(SERVER), str(_logged(count))]


Session = Callable[[ClientSession], Awaitable[None]]


def _with_agent(params: StdioServerParameters, session: Session, *, limit: float = 60) -> None:
    async def drive() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as agent:
            with anyio.fail_after(limit):
                await agent.initialize()
                await session(agent)

    anyio.run(drive)


async def _error(call: Awaitable[types.CallToolResult]) -> MCPError | types.CallToolResult:
    try:
        return await call
    except MCPError as exc:
        return exc


def _refusal(result: types.CallToolResult) -> dict[str, Any]:
    """A refusal's detail: in ``_meta``, never in ``structuredContent`` (a client checks
    that against the tool's output schema and would fail the call)."""
    assert result.is_error and result.structured_content is None
    return result.meta["evidence/refusal"]


def _text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def _plan_events(url: str, plan_id: str = "P-1") -> list[ledger.RecordedEvent]:
    with ledger.open(url, create=False) as store:
        return list(store.read_stream(f"plan:{plan_id}"))


def _audit_clean(url: str) -> None:
    audit = run_cli("audit", "--db", url)
    assert audit.returncode == 0, audit.stdout + audit.stderr


@slow
def test_proxy_offers_the_upstreams_tools_and_a_crash_is_an_error(
    db_url: str, tmp_path: Path
) -> None:
    """The proxy offers the upstream's tools under their own names with their schemas
    (registered as ``SERVER.TOOL``) beside the plane's verbs, and nothing the plane
    cannot gate; an upstream that dies is an MCP error and an environment_error halt,
    and a later call an error too, never a hang. (Gating itself, through the proxy and
    the service alike: ``test_the_gate_session_through_the_proxy_and_the_service``.)"""
    _setup(db_url)
    count = tmp_path / "calls.jsonl"
    seen: dict[str, Any] = {}

    async def session(agent: ClientSession) -> None:
        seen["tools"] = {t.name: t for t in (await agent.list_tools()).tools}
        seen["ok"] = await agent.call_tool("add", {"a": 1, "b": 2})
        seen["crash"] = await _error(agent.call_tool("crash", {}))
        seen["after_crash"] = await _error(agent.call_tool("add", {"a": 1, "b": 2}))

    _with_agent(_proxy(db_url, tmp_path / "work", _stdio(count)), session)

    upstream = {"add", "bad", "plain", "loose", "fail", "huge", "crash", "slow", "flood", "grow"}
    verbs = {
        "evidence.plan_status", "evidence.record_strategy", "evidence.execute",
        "evidence.validate", "evidence.record_fix", "evidence.apply",
    }  # fmt: skip
    assert set(seen["tools"]) == upstream | verbs
    assert seen["tools"]["add"].output_schema["required"] == ["sum"]
    with Plane.open(db_url) as plane:
        assert plane.log().mcp_tools("test-upstream", "add") == ["test-upstream.add"]
        assert plane.log().mcp_tools("test-upstream", "remote") == []
    assert not seen["ok"].is_error
    assert seen["ok"].meta["evidence/plan_state"]["phase"] == "execute"  # where it stands
    crash = seen["crash"]
    assert isinstance(crash, MCPError), crash
    assert "environment_error" in crash.message
    after = seen["after_crash"]
    assert isinstance(after, MCPError) and "unavailable" in after.message  # never a hang
    assert len(_calls(count)) == 2  # the crash call reached the server; nothing after
    events = _plan_events(db_url)
    assert [e.payload.tool for e in events if e.type == "tool.called"] == ["test-upstream.add"]
    halts = [e.payload for e in events if e.type == "plan.halted"]
    assert halts[-1].halt_type == "environment_error"
    _audit_clean(db_url)


# -- the same sessions through `evidence serve`'s MCP gate ---------------------------------
#
# The agent's side of these tests runs through both doors: the stdio proxy, and the
# service. For the service the operator registers the upstream's tools as the proxy does
# (each `SERVER.TOOL`, with the schemas the upstream declares) plus how to launch it
# (`mcp_command`), and the agent reaches them over streamable HTTP with its credential.
# The service offers them by their registered names, where the proxy offers the
# upstream's own: `Names` maps one to the other, and the recorded calls say how each was
# made (`recorded` through the proxy, `mcp` when the plane launched the server).

Names = Callable[[str], str]
Transport = Callable[[str, Path, Path, Session], None]  # (url, tmp_path, count, session)


def _through_proxy(url: str, tmp_path: Path, count: Path, session: Session) -> None:
    _with_agent(_proxy(url, tmp_path / "work", _stdio(count)), session)


def _through_service(url: str, tmp_path: Path, count: Path, session: Session) -> None:
    """The upstream's tools registered by the operator with how to launch them, a
    credential for P-1, and the agent's session over HTTP against the in-process app."""
    from commands.plane.credentials import issue_credential
    from tests.commands.service.test_service_mcp import _as_agent
    from tests.helpers import register_mcp_server

    register_mcp_server(url, "test-upstream", [sys.executable, str(SERVER), str(_logged(count))])
    with Plane.open(url) as plane:
        token = issue_credential(plane, "P-1", ttl=timedelta(hours=1)).token
    _as_agent(url, token, session)


TRANSPORTS = [
    pytest.param(_through_proxy, lambda t: t, "recorded", id="proxy"),
    pytest.param(_through_service, lambda t: f"test-upstream.{t}", "mcp", id="service"),
]


@slow
@pytest.mark.parametrize(("through", "name", "executor"), TRANSPORTS)
def test_the_gate_session_through_the_proxy_and_the_service(
    db_url: str, tmp_path: Path, through: Transport, name: Names, executor: str
) -> None:
    """A valid call reaches the server and is recorded; a deviating input, an invented
    tool and a decision verb never reach it; off-schema output fails the output gate; a
    tool without an output schema answers an MCP tool result — through either door."""
    _setup(db_url)
    count = tmp_path / "calls.jsonl"
    seen: dict[str, Any] = {}

    async def session(agent: ClientSession) -> None:
        seen["tools"] = {t.name for t in (await agent.list_tools()).tools}
        seen["ok"] = await agent.call_tool(name("add"), {"a": 1, "b": 2})
        seen["calls_after_ok"] = len(_calls(count))
        seen["bad_input"] = await agent.call_tool(name("add"), {"a": "one", "b": 2})
        seen["invented"] = await agent.call_tool("nope", {})
        seen["authorize"] = await agent.call_tool("evidence.authorize", {})
        seen["calls_after_bad_input"] = len(_calls(count))
        seen["bad_output"] = await agent.call_tool(name("bad"), {})
        seen["calls_after_bad_output"] = len(_calls(count))
        seen["plain"] = await agent.call_tool(name("plain"), {"who": "you"})

    through(db_url, tmp_path, count, session)

    verbs = {
        "evidence.plan_status", "evidence.record_strategy", "evidence.execute",
        "evidence.validate", "evidence.record_fix", "evidence.apply",
    }  # fmt: skip
    assert {name("add"), name("bad"), name("plain")} | verbs <= seen["tools"]
    assert not {"nope", "evidence.authorize"} & seen["tools"]
    ok = seen["ok"]
    assert not ok.is_error and ok.structured_content == {"sum": 3}
    assert seen["calls_after_ok"] == 1
    bad = seen["bad_input"]
    assert _refusal(bad)["gate"] == "input" and _refusal(bad)["deviations"][0]["pointer"] == "/a"
    assert "blocked" in _text(bad)
    # The agent is told what is left of the critique loop (max_iterations 10).
    assert "(9 iteration(s) left in this attempt)" in _text(bad)
    for invented in (seen["invented"], seen["authorize"]):  # no door to a decision
        assert _refusal(invented)["deviations"][0]["kind"] == "invented_tool"
    assert seen["calls_after_bad_input"] == 1  # none of them reached the server
    out = seen["bad_output"]
    assert _refusal(out)["gate"] == "output" and "rejected" in _text(out)
    assert seen["calls_after_bad_output"] == 2
    # No output schema: the output gate checks it is an MCP tool result.
    assert not seen["plain"].is_error and _text(seen["plain"]) == "hello you"

    called = [e.payload for e in _plan_events(db_url) if e.type == "tool.called"]
    assert [c.tool for c in called] == [
        "test-upstream.add",
        "test-upstream.bad",
        "test-upstream.plain",
    ]
    assert {c.executor for c in called} == {executor}
    _audit_clean(db_url)


@slow
@pytest.mark.parametrize(("through", "name", "executor"), TRANSPORTS)
def test_an_upstream_tool_error_through_the_proxy_and_the_service(
    sqlite_url: str, tmp_path: Path, through: Transport, name: Names, executor: str
) -> None:
    """An upstream's own tool error (``isError``: "Invalid timezone") reaches the agent
    as the upstream said it, then the plane's routing line, and is recorded as the
    upstream's failure: checked as an MCP tool result (no deviation), a failed iteration
    of the attempt (every failure counts), nothing kept in the sandbox. A tool without an
    output schema may answer ``structuredContent``: the MCP tool result's shape comes
    from the SDK's types."""
    _setup(sqlite_url)
    count = tmp_path / "calls.jsonl"
    seen: dict[str, Any] = {}

    async def session(agent: ClientSession) -> None:
        seen["fail"] = await agent.call_tool(name("fail"), {"timezone": "Not/AZone"})
        seen["loose"] = await agent.call_tool(name("loose"), {})
        seen["status"] = await agent.call_tool("evidence.plan_status", {})

    through(sqlite_url, tmp_path, count, session)

    fail = seen["fail"]
    assert fail.is_error and fail.structured_content is None
    said, routing = [c.text for c in fail.content]
    assert said == "Invalid timezone: Not/AZone"
    assert (
        routing
        == "evidence: routed: retry in the next iteration (9 iteration(s) left in this attempt)"
    )
    assert fail.meta["evidence/refusal"] == {
        "upstream_error": True, "routed": "retry", "iterations_left": 9,
    }  # fmt: skip
    loose = seen["loose"]
    assert not loose.is_error and loose.structured_content == {"any": ["thing"]}
    events = _plan_events(sqlite_url)
    failed = [e.payload for e in events if e.type == "plan.attempt_failed"]
    assert [f.reason for f in failed] == [
        "the tool answered an error of its own (isError) at the output gate (test-upstream.fail)"
    ]
    checks = [e.payload for e in events if e.type == "gate.checked"]
    assert [(c.gate, c.verdict) for c in checks] == [("input", "pass"), ("output", "pass")] * 2
    called = {e.payload.tool: e.payload for e in events if e.type == "tool.called"}
    assert called["test-upstream.fail"].tool_error is True
    assert called["test-upstream.loose"].tool_error is msgspec.UNSET
    assert {c.executor for c in called.values()} == {executor}
    plan = _refusal_free_plan(seen["status"])
    assert plan["gate_failures"] == 0 and plan["iteration"] == 2
    (sandbox,) = seen["status"].structured_content["sandbox"].values()
    assert not (Path(sandbox) / "fail-was-here.txt").exists()  # a failed call keeps nothing
    _audit_clean(sqlite_url)


def _refusal_free_plan(status: types.CallToolResult) -> dict[str, Any]:
    assert not status.is_error, _text(status)
    return status.structured_content["plan"]


@slow
def test_an_upstream_answer_over_the_cap_is_drained_not_held(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 64 MiB answer: the proxy keeps the cap's prefix, records the size and digest of
    the whole, drains the rest, and its memory does not grow with the answer. The
    output gate fails it as a command's stdout over its cap fails."""
    cap = 1 << 20
    size = 64 << 20
    monkeypatch.setenv("EVIDENCE_MAX_OUTPUT_BYTES", str(cap))
    _setup(sqlite_url)
    count = tmp_path / "calls.jsonl"
    seen: dict[str, Any] = {}

    async def session(agent: ClientSession) -> None:
        await agent.list_tools()
        proxy = _proxy_pid(sqlite_url)
        seen["before"] = _rss_kib(proxy, "VmRSS")
        seen["huge"] = await agent.call_tool("huge", {"size": size})
        seen["peak"] = _rss_kib(proxy, "VmHWM")
        seen["after"] = await agent.call_tool("add", {"a": 1, "b": 2})

    _with_agent(_proxy(sqlite_url, tmp_path / "work", _stdio(count)), session, limit=120)

    huge = seen["huge"]
    assert huge.is_error and "rejected" in _text(huge), _text(huge)
    assert seen["after"].structured_content == {"sum": 3}  # the session goes on
    # The answer alone is 64 MiB; the proxy's peak stays within a few caps of its size
    # before the call (the SDK's own transport held the whole line, decoded twice).
    assert seen["peak"] - seen["before"] < 24 * 1024, (seen["before"], seen["peak"])
    events = _plan_events(sqlite_url)
    (called,) = [e.payload for e in events if e.type == "tool.called" and "huge" in e.payload.tool]
    truncation = called.stdout_truncated
    assert truncation.kept == cap and truncation.size > size
    (check,) = [
        e.payload
        for e in events
        if e.type == "gate.checked" and e.payload.gate == "output" and e.payload.step == called.step
    ]
    assert check.verdict == "fail" and check.checked_truncated == truncation
    _audit_clean(sqlite_url)


def _proxy_pid(url: str) -> int:
    """The proxy process serving the ledger at ``url`` (its command line names it)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"proxy" in argv and url.encode() in argv:
            return int(entry.name)
    raise AssertionError("no proxy process found")


def _rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


@slow
def test_a_named_step_declares_its_output(sqlite_url: str, tmp_path: Path) -> None:
    """``_meta`` names the step and narrows its output: the output gate checks the
    registered schema, then that declaration; a malformed declaration is refused before
    the call is forwarded."""
    _setup(sqlite_url)
    count = tmp_path / "calls.jsonl"
    seen: dict[str, Any] = {}
    text_sum = {"type": "object", "properties": {"sum": {"type": "string"}}}

    async def session(agent: ClientSession) -> None:
        seen["declared"] = await agent.call_tool(
            "add",
            {"a": 1, "b": 2},
            meta={"evidence/step": "sum-it", "evidence/output_schema": text_sum},
        )
        seen["bad_step"] = await agent.call_tool("add", {"a": 1, "b": 2}, meta={"evidence/step": 7})
        seen["bad_schema"] = await agent.call_tool(
            "add", {"a": 1, "b": 2}, meta={"evidence/output_schema": {"type": "nope"}}
        )

    _with_agent(_proxy(sqlite_url, tmp_path / "work", _stdio(count)), session)
    declared = seen["declared"]
    assert declared.is_error and _refusal(declared)["gate"] == "output"
    assert _refusal(declared)["deviations"][0]["pointer"] == "/sum"
    for refused in (seen["bad_step"], seen["bad_schema"]):
        assert refused.is_error and _text(refused).startswith("error: _meta"), _text(refused)
    assert len(_calls(count)) == 1  # the refused ones were never forwarded
    checks = [e.payload for e in _plan_events(sqlite_url) if e.type == "gate.checked"]
    # The registry's output check first (it passes: {"sum": 3}), then the declaration
    # in _meta, which only narrows: it fails at /sum.
    assert [(c.gate, c.step, c.verdict) for c in checks] == [
        ("input", "sum-it", "pass"),
        ("output", "sum-it", "pass"),
        ("output", "sum-it", "fail"),
    ]


@slow
def test_the_plane_verbs_take_a_plan_from_failure_to_apply(sqlite_url: str, tmp_path: Path) -> None:
    with Plane.open(sqlite_url) as plane:
        project = status_plan(plane, tmp_path, {})
    count = tmp_path / "calls.jsonl"
    seen: dict[str, Any] = {}

    async def session(agent: ClientSession) -> None:
        seen["first"] = await agent.call_tool("evidence.validate", {})
        status = await agent.call_tool("evidence.plan_status", {})
        (sandbox,) = status.structured_content["sandbox"].values()
        (Path(sandbox) / "status.txt").write_text("good\n")
        seen["no_note"] = await agent.call_tool("evidence.record_fix", {"note": 3})
        await agent.call_tool("evidence.record_fix", {"note": "status is good now"})
        seen["second"] = await agent.call_tool("evidence.validate", {})
        token = seen["second"].structured_content["validation"]["token"]
        seen["forged"] = await agent.call_tool("evidence.apply", {"token": token[:-4] + "AAAA"})
        seen["applied"] = await agent.call_tool("evidence.apply", {"token": token})

    _with_agent(_proxy(sqlite_url, tmp_path / "work", _stdio(count)), session)
    first = seen["first"].structured_content["validation"]
    assert first["outcome"] == "blocker" and first["token"] is None
    no_note = seen["no_note"]
    assert no_note.is_error and _refusal(no_note)["deviations"][0]["pointer"] == "/note"
    assert seen["second"].structured_content["validation"]["outcome"] == "pass"
    assert seen["forged"].is_error and "token refused" in _text(seen["forged"])
    applied = seen["applied"]
    assert not applied.is_error, _text(applied)
    assert applied.structured_content["plan"]["phase"] == "apply"
    assert applied.structured_content["files"][0]["path"] == "status.txt"
    assert (project / "status.txt").read_text() == "good\n"
    _audit_clean(sqlite_url)


@slow
def test_a_changed_tool_list_is_registered_again(sqlite_url: str, tmp_path: Path) -> None:
    """The upstream says its tools changed: the proxy lists and registers them again
    before the next call, so the new tool is gated, offered and recorded."""
    _setup(sqlite_url)
    count = tmp_path / "calls.jsonl"
    seen: dict[str, Any] = {}

    async def session(agent: ClientSession) -> None:
        await agent.call_tool("grow", {})
        with anyio.fail_after(10):
            while True:  # the notification travels on its own; the next call sees it
                extra = await agent.call_tool("extra", {})
                if not extra.is_error:
                    break
                await anyio.sleep(0.1)
        seen["extra"] = extra
        seen["tools"] = {t.name for t in (await agent.list_tools()).tools}

    _with_agent(_proxy(sqlite_url, tmp_path / "work", _stdio(count)), session)
    assert _text(seen["extra"]) == "extra" and "extra" in seen["tools"]
    with Plane.open(sqlite_url) as plane:
        assert plane.log().mcp_tools("test-upstream", "extra") == ["test-upstream.extra"]


@slow
@pytest.mark.parametrize(
    ("server", "tool", "fault"),
    [
        ("mcp_server.py", "slow", "no answer within 2 s"),
        ("mcp_raw_server.py", "garble", "protocol"),
    ],
)
def test_a_timeout_or_protocol_error_is_an_error_not_a_hang(
    sqlite_url: str, tmp_path: Path, server: str, tool: str, fault: str
) -> None:
    _setup(sqlite_url)
    count = tmp_path / "calls.jsonl"
    seen: dict[str, Any] = {}

    async def session(agent: ClientSession) -> None:
        started = time.monotonic()
        seen["error"] = await _error(agent.call_tool(tool, {}))
        seen["seconds"] = time.monotonic() - started
        seen["after"] = await _error(agent.call_tool("add", {"a": 1, "b": 2}))

    upstream = ["--", sys.executable, str(SERVER.with_name(server)), str(_logged(count))]
    _with_agent(_proxy(sqlite_url, tmp_path / "work", upstream, timeout=2), session)
    error = seen["error"]
    assert isinstance(error, MCPError), error
    assert "environment_error" in error.message and fault in error.message
    assert seen["seconds"] < 10, error.message
    assert isinstance(seen["after"], MCPError) and "unavailable" in seen["after"].message
    halts = [e.payload for e in _plan_events(sqlite_url) if e.type == "plan.halted"]
    assert [h.halt_type for h in halts] == ["environment_error"]
    assert halts[0].raw_halt_type == "backend_unavailable"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_upstream(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """tests/mcp_server.py serving streamable HTTP; its URL and call log."""
    count, port = tmp_path / "http-calls.jsonl", _free_port()
    server = subprocess.Popen(
        [sys.executable, str(SERVER), str(_logged(count)), "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60  # a generous wait for a server to listen
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "no HTTP server"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", count
    finally:
        server.kill()
        server.wait()


@slow
def test_a_streamable_http_upstream(
    sqlite_url: str,
    tmp_path: Path,
    http_upstream: tuple[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, count = http_upstream
    _setup(sqlite_url)
    monkeypatch.setenv("EVIDENCE_MAX_OUTPUT_BYTES", "4096")
    seen: dict[str, Any] = {}

    async def session(agent: ClientSession) -> None:
        seen["ok"] = await agent.call_tool("add", {"a": 2, "b": 3})
        seen["bad"] = await agent.call_tool("add", {"a": 2})
        seen["huge"] = await agent.call_tool("huge", {"size": 100_000})

    params = _proxy(sqlite_url, tmp_path / "work", ["--url", url, "--server", "web"])
    _with_agent(params, session)
    assert seen["ok"].structured_content == {"sum": 5}
    assert seen["bad"].is_error and _refusal(seen["bad"])["gate"] == "input"
    assert len(_calls(count)) == 2
    called = [e.payload for e in _plan_events(sqlite_url) if e.type == "tool.called"]
    assert [c.tool for c in called] == ["web.add", "web.huge"]
    # Over the cap, as a command's stdout: the prefix kept, the whole's size recorded.
    assert seen["huge"].is_error and "rejected" in _text(seen["huge"])
    truncation = called[1].stdout_truncated
    assert truncation.kept == 4096 and truncation.size > 100_000


@slow
def test_four_proxies_on_one_postgresql_ledger(pg_url: str, tmp_path: Path) -> None:
    """Four agents, four plans, four proxies and servers writing one PostgreSQL ledger
    at once: every call recorded in its own plan, and the ledger verifies and audits."""
    plans = [f"P-{i}" for i in range(4)]
    for plan_id in plans:
        _setup(pg_url, plan_id)
    calls = 6

    async def agent_for(plan_id: str) -> None:
        # One upstream command line for every plan: a server name is bound to its upstream
        # (another command line is another server, which needs a name of its own).
        count = tmp_path / "calls.jsonl"
        params = _proxy(pg_url, tmp_path / "work", _stdio(count), plan_id=plan_id)
        async with stdio_client(params) as (read, write), ClientSession(read, write) as agent:
            await agent.initialize()
            for i in range(calls):
                result = await agent.call_tool("add", {"a": i, "b": 1})
                assert result.structured_content == {"sum": i + 1}, _text(result)
            bad = await agent.call_tool("add", {"a": "x", "b": 1})
            assert bad.is_error

    async def all_agents() -> None:
        with anyio.fail_after(120):
            async with anyio.create_task_group() as group:
                for plan_id in plans:
                    group.start_soon(agent_for, plan_id)

    anyio.run(all_agents)
    for plan_id in plans:
        events = _plan_events(pg_url, plan_id)
        assert sum(e.type == "tool.called" for e in events) == calls
        checks = [e.payload for e in events if e.type == "gate.checked"]
        assert [c.verdict for c in checks].count("fail") == 1
    verify = run_cli("verify", "--db", pg_url)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    _audit_clean(pg_url)


@slow
def test_a_tool_outside_the_plans_skills_is_never_forwarded(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The plan's skills hold the server's `add` only: `plain` fails the input gate with
    not_in_skill and never reaches the server."""
    with Plane.open(sqlite_url) as plane:
        register_tool(
            plane,
            {
                "name": "test-upstream.add",
                "mcp_server": "test-upstream",
                "mcp_tool_name": "add",
                # the operator's registration gates the upstream's tool as it stands
                "input_schema": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                },
                "output_schema": {"type": "object", "properties": {"sum": {"type": "integer"}}},
            },
        )
        define_skill(plane, {"name": "adder", "members": ["test-upstream.add"]})
    _setup(sqlite_url, skills=("adder",))
    count = tmp_path / "calls.jsonl"
    seen: dict[str, Any] = {}

    async def session(agent: ClientSession) -> None:
        seen["add"] = await agent.call_tool("add", {"a": 1, "b": 2})
        seen["plain"] = await agent.call_tool("plain", {"who": "you"})

    _with_agent(_proxy(sqlite_url, tmp_path / "work", _stdio(count)), session)
    assert seen["add"].structured_content == {"sum": 3}
    plain = seen["plain"]
    assert plain.is_error and _refusal(plain)["deviations"][0]["kind"] == "not_in_skill"
    assert [c["tool"] for c in _calls(count)] == ["add"]
    _audit_clean(sqlite_url)


@slow
def test_strict_mode_ends_the_plan_and_refuses_later_calls(db_url: str, tmp_path: Path) -> None:
    _setup(db_url, strict=True)
    count = tmp_path / "calls.jsonl"
    results: list[types.CallToolResult] = []

    async def session(agent: ClientSession) -> None:
        results.append(await agent.call_tool("add", {"a": 1}))
        results.append(await agent.call_tool("add", {"a": 1, "b": 2}))

    _with_agent(_proxy(db_url, tmp_path / "work", _stdio(count)), session)
    deviation, refused = results
    assert deviation.is_error
    assert _refusal(deviation)["routed"] == "compensation"
    assert refused.is_error and _text(refused).startswith("error: plan P-1")
    assert _calls(count) == []  # nothing reached the server
    _audit_clean(db_url)


@pytest.mark.parametrize(
    ("upstream", "said"),
    [
        (["/nonexistent/mcp-server"], "failed: "),
        ([sys.executable, "-c", "pass"], "failed: "),  # starts, then leaves without a word
        ([sys.executable, "-c", "import time; time.sleep(30)"], "did not answer within 0.5 s"),
    ],
)
def test_an_upstream_that_cannot_serve_is_one_error_line(
    sqlite_url: str, tmp_path: Path, upstream: list[str], said: str
) -> None:
    """No traceback and no hang when the MCP server never starts serving: one `error:`
    line, exit 2, and nothing appended (no tool was registered)."""
    _setup(sqlite_url)
    before = len(_plan_events(sqlite_url))
    result = run_cli(
        "mcp", "proxy", "--plan", "P-1", "--timeout", "0.5", "--db", sqlite_url,
        "--workdir", str(tmp_path / "work"), "--", *upstream,
    )  # fmt: skip
    assert_refused(result, "error: the MCP server ", said)
    assert len(_plan_events(sqlite_url)) == before


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--server", "a b"], "--server"),
        (["--server", "../x"], "--server"),
        (["--server", "x\x1b[31m"], "--server"),
        (["--server", ""], "--server"),
        (["--server", "-x"], "--server"),
        (["--server", "a" * 65], "--server"),
        (["--url", "file:///etc/passwd"], "--url"),
        (["--url", "http://127.0.0.1:9/mcp", "--", "echo"], "a command after --, or --url"),
        ([], "a command after --, or --url"),
    ],
)
def test_a_bad_upstream_option_is_refused(
    sqlite_url: str, tmp_path: Path, args: list[str], said: str
) -> None:
    _setup(sqlite_url)
    before = len(_plan_events(sqlite_url))
    if "--url" not in args and "--" not in args and args:
        args = [*args, "--", sys.executable, "-c", "pass"]
    result = run_cli(
        "mcp", "proxy", "--plan", "P-1", "--db", sqlite_url,
        "--workdir", str(tmp_path / "work"), *args,
    )  # fmt: skip
    assert_refused(result, said)
    assert len(_plan_events(sqlite_url)) == before


def test_an_unknown_or_ended_plan_is_refused_before_the_upstream_starts(
    sqlite_url: str, tmp_path: Path
) -> None:
    _setup(sqlite_url)
    count = tmp_path / "calls.jsonl"
    result = run_cli(
        "mcp", "proxy", "--plan", "P-9", "--db", sqlite_url,
        "--workdir", str(tmp_path / "work"), *_stdio(count),
    )  # fmt: skip
    assert_refused(result, "unknown plan 'P-9'")


def test_a_stdio_upstream_works_in_the_plans_sandbox(sqlite_url: str, tmp_path: Path) -> None:
    """The docs' filesystem example names `{sandbox}`: the upstream is pointed at the
    plan's sandbox copy (and runs there), never at the real resource."""
    from commands.cli.mcp_proxy import _in_sandbox, _upstream_workdir
    from commands.plane import CommandRefused
    from tests.helpers import work

    with Plane.open(sqlite_url) as plane:
        project = status_plan(plane, tmp_path, {}, execute=False)
        assert _upstream_workdir(plane, "P-1") is None
        with pytest.raises(CommandRefused, match="not entered Execute"):
            _in_sandbox(["server", "{sandbox}"], None)
        enter_execute(plane, "P-1")
        workdir = _upstream_workdir(plane, "P-1")
        assert workdir == work(plane) and workdir != project
        assert _in_sandbox(["npx", "server-filesystem", "{sandbox}"], workdir) == [
            "npx",
            "server-filesystem",
            str(workdir),
        ]


@slow
def test_a_forwarded_write_whose_output_gate_fails_is_not_kept(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The upstream works in the plan's sandbox (never the real directory); a call that
    writes there and then fails its output gate leaves the sandbox as it was."""
    from tests.helpers import work

    with Plane.open(sqlite_url) as plane:
        project = status_plan(plane, tmp_path, {})
        sandbox = work(plane)
    count = tmp_path / "calls.jsonl"
    seen: dict[str, Any] = {}

    async def session(agent: ClientSession) -> None:
        seen["bad"] = await agent.call_tool("bad", {})

    _with_agent(_proxy(sqlite_url, tmp_path / "work", _stdio(count)), session)
    assert seen["bad"].is_error and len(_calls(count)) == 1  # forwarded, then rejected
    assert not list(tmp_path.rglob("bad-was-here.txt"))  # no sandbox, no real directory
    assert sorted(p.name for p in project.iterdir()) == ["status.txt"]
    assert sandbox.is_dir()


@slow
def test_the_plane_explains_itself_at_initialize(sqlite_url: str, tmp_path: Path) -> None:
    """`initialize` returns instructions describing the lifecycle and every outcome,
    environment_error by name; `evidence.validate` names the outcomes too."""
    from commands.rules.vocabulary import OUTCOMES

    _setup(sqlite_url)
    params = _proxy(sqlite_url, tmp_path / "work", _stdio(tmp_path / "calls.jsonl"))
    seen: dict[str, Any] = {}

    async def drive() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as agent:
            with anyio.fail_after(60):
                seen["init"] = await agent.initialize()
                seen["tools"] = (await agent.list_tools()).tools

    anyio.run(drive)
    instructions = seen["init"].instructions or ""
    validate = next(t for t in seen["tools"] if t.name == "evidence.validate")
    for outcome in OUTCOMES:
        assert outcome in instructions, outcome
        assert outcome in (validate.description or ""), outcome
    assert "Strategize -> Execute -> Apply" in instructions


# A stdio upstream that starts a daemon (its own session, a double fork, deaf to polite
# signals) and then becomes the test server: the agent's session with the proxy is
# the upstream's session, and nothing of it may outlive that session.
def _spawn_then_serve() -> str:
    from tests.commands.runner.test_landlock import START_DAEMON

    return (
        "import os, signal, sys\nmarker, server, log = sys.argv[1:4]\n"
        + START_DAEMON
        + "os.execv(sys.executable, [sys.executable, server, log])\n"
    )


@slow
def test_what_an_upstream_starts_ends_with_the_agents_session(
    sqlite_url: str, tmp_path: Path
) -> None:
    import uuid

    from tests.commands.runner.test_landlock import _killed_after, _with_marker

    _setup(sqlite_url)
    marker = f"evidence-session-{uuid.uuid4().hex}"
    spawner = tmp_path / "spawner.py"
    spawner.write_text(_spawn_then_serve())
    upstream = ["--", sys.executable, str(spawner), marker, str(SERVER)]
    upstream.append(str(_logged(tmp_path / "calls.jsonl")))
    seen: dict[str, Any] = {}

    async def session(agent: ClientSession) -> None:
        result = await agent.call_tool("add", {"a": 2, "b": 3})
        seen["sum"] = result.structured_content
        seen["during"] = _with_marker(marker)

    with _killed_after(marker):
        _with_agent(_proxy(sqlite_url, tmp_path / "work", upstream), session)
        assert seen["sum"] == {"sum": 5} and seen["during"], seen  # it ran meanwhile
        deadline = time.monotonic() + 10
        while _with_marker(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _with_marker(marker) == []


@pytest.mark.slow
def test_a_flooding_upstream_reaches_the_agent_and_the_record_within_the_budget(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A call whose upstream sends 3 MB of log messages: the agent's client gets what the
    call keeps (about 1 MiB of them), the record counts every one and how many it
    dropped, and the call passes (nothing was refused)."""
    from commands.runner.said import EXCHANGE_CAP

    _setup(sqlite_url)
    logs: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    async def session(agent: ClientSession) -> None:
        done = await agent.call_tool("flood", {"count": 3000, "size": 1000, "asks": 0})
        assert not done.is_error, done

    async def drive() -> None:
        params = _proxy(sqlite_url, tmp_path / "work", _stdio(tmp_path / "calls.jsonl"))
        async with (
            stdio_client(params) as (read, write),
            ClientSession(read, write, logging_callback=on_log) as agent,
        ):
            with anyio.fail_after(60):
                await agent.initialize()
                await session(agent)

    anyio.run(drive)
    (called,) = [e.payload for e in _plan_events(sqlite_url) if e.type == "tool.called"]
    assert called.exchange.log == 3000 and called.exchange.dropped == 3000 - len(logs)
    assert 900 < len(logs) < 1100  # what was kept is what was relayed
    with ledger.open(sqlite_url, create=False) as store:
        kept = store.get_blob(called.exchange_sha256)
    assert kept is not None and len(kept) <= EXCHANGE_CAP
    assert len(json.loads(kept)) == len(logs)


def test_the_proxy_leaves_the_read_models_to_their_readers(sqlite_url: str, tmp_path: Path) -> None:
    """A gated call through the proxy keeps its read models out of the call (they are
    its readers' to catch up, as the service's are): after the calls the plan's read
    model is behind the log, and a listing catches it up and shows them."""
    _setup(sqlite_url)
    count = tmp_path / "calls.jsonl"

    async def session(agent: ClientSession) -> None:
        for i in range(3):
            result = await agent.call_tool("add", {"a": i, "b": 1})
            assert not result.is_error, result

    _with_agent(_proxy(sqlite_url, tmp_path / "work", _stdio(count)), session)
    with ledger.open(sqlite_url, create=False) as store:
        head = store.head().size
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as db:
        [(position,)] = db.execute(
            "SELECT position FROM projection_checkpoints WHERE name = 'plans'"
        ).fetchall()
    assert position < head, "the proxy kept the plans' read model inline"
    shown = run_cli("plan", "list", "--json", "--db", sqlite_url)
    assert shown.returncode == 0, shown.stderr
    [plan] = [p for p in json.loads(shown.stdout)["plans"] if p["plan_id"] == "P-1"]
    assert plan["tool_calls"] == 3, plan


def test_a_registration_made_between_calls_binds_the_next(sqlite_url: str, tmp_path: Path) -> None:
    """The proxy takes one look at the policy a call (as the service takes one a
    request): what an operator registers while the proxy runs judges the next call."""
    _setup(sqlite_url)
    count = tmp_path / "calls.jsonl"
    seen: list[types.CallToolResult] = []
    narrower = {
        "name": "test-upstream.add",
        "mcp_server": "test-upstream",
        "mcp_tool_name": "add",
        "input_schema": {
            "type": "object",
            "properties": {"a": {"type": "integer", "maximum": 9}, "b": {"type": "integer"}},
        },
        "output_schema": {"type": "object", "properties": {"sum": {"type": "integer"}}},
    }

    async def session(agent: ClientSession) -> None:
        seen.append(await agent.call_tool("add", {"a": 10, "b": 2}))
        with Plane.open(sqlite_url) as plane:  # the operator, meanwhile
            register_tool(plane, narrower)
        seen.append(await agent.call_tool("add", {"a": 10, "b": 2}))

    _with_agent(_proxy(sqlite_url, tmp_path / "work", _stdio(count)), session)
    assert seen[0].structured_content == {"sum": 12}
    assert seen[1].is_error and _refusal(seen[1])["deviations"][0]["pointer"] == "/a"
    assert len(_calls(count)) == 1


def test_a_proxy_ended_by_sigterm_leaves_no_copy_of_the_sandbox(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy keeps the sandbox's snapshot across calls; a client that ends it with
    SIGTERM (as MCP clients do after closing its input) ends it at once, as before, and
    no copy of the sandbox is left behind."""
    _setup(sqlite_url)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    count = tmp_path / "calls.jsonl"
    seen: dict[str, Any] = {}

    async def session(agent: ClientSession) -> None:
        assert not (await agent.call_tool("add", {"a": 1, "b": 2})).is_error
        seen["kept"] = sorted(p.name for p in scratch.glob("evidence-guard-*"))
        proxy = _proxy_pid(sqlite_url)
        os.kill(proxy, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while Path(f"/proc/{proxy}").exists() and time.monotonic() < deadline:
            await anyio.sleep(0.05)
        seen["alive"] = Path(f"/proc/{proxy}").exists()

    with contextlib.suppress(Exception):  # the session ends with its server
        _with_agent(_proxy(sqlite_url, tmp_path / "work", _stdio(count)), session)
    assert len(seen["kept"]) == 1, seen  # kept while the proxy ran
    assert seen["alive"] is False
    assert list(scratch.glob("evidence-guard-*")) == []
