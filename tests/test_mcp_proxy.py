"""`evidence mcp proxy`: the MCP gate proxy as a real process in front of a real MCP
server (tests/mcp_server.py), driven by the official SDK's stdio client. A valid call
reaches the server and is recorded; a deviating input or an invented tool never reaches
it; off-schema output fails the output gate; an upstream crash is an MCP error and an
environment_error halt; the audit is clean afterwards."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

import ledger
from commands.plane import Plane
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from tests.helpers import run_cli

SERVER = Path(__file__).with_name("mcp_server.py")
ROOT = Path(__file__).resolve().parent.parent


def _setup(url: str, *, strict: bool = False) -> None:
    with Plane.open(url) as plane:
        create_plan(
            plane,
            "P-1",
            project="api",
            resources=["repo:api"],
            config={"max_iterations": 10, "strict_mode": strict},
        )
        record_strategy(plane, "P-1", "call the MCP server")
        enter_execute(plane, "P-1")


def _calls(count: Path) -> list[dict[str, Any]]:
    if not count.exists():
        return []
    return [json.loads(line) for line in count.read_text().splitlines()]


def _proxy(url: str, count: Path, workdir: Path) -> StdioServerParameters:
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
            "P-1",
            "--db",
            url,
            "--workdir",
            str(workdir),
            "--timeout",
            "20",
            "--",
            sys.executable,
            str(SERVER),
            str(count),
        ],
        env=env,
        cwd=ROOT,
    )


async def _drive(url: str, count: Path, workdir: Path) -> dict[str, Any]:
    params = _proxy(url, count, workdir)
    seen: dict[str, Any] = {}
    async with stdio_client(params) as (read, write), ClientSession(read, write) as agent:
        with anyio.fail_after(60):
            await agent.initialize()
            listed = await agent.list_tools()
            seen["tools"] = {t.name: t for t in listed.tools}
            seen["ok"] = await agent.call_tool("add", {"a": 1, "b": 2})
            seen["calls_after_ok"] = len(_calls(count))
            seen["bad_input"] = await agent.call_tool("add", {"a": "one", "b": 2})
            seen["invented"] = await agent.call_tool("nope", {})
            seen["calls_after_bad_input"] = len(_calls(count))
            seen["bad_output"] = await agent.call_tool("bad", {})
            seen["calls_after_bad_output"] = len(_calls(count))
            try:
                seen["crash_result"] = await agent.call_tool("crash", {})
            except MCPError as exc:
                seen["crash"] = exc
            try:
                seen["after_crash"] = await agent.call_tool("add", {"a": 1, "b": 2})
            except MCPError as exc:
                seen["after_crash"] = exc
    return seen


def _text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


@pytest.mark.slow  # real MCP processes: the proxy and the server
def test_proxy_gates_records_and_audits(db_url: str, tmp_path: Path) -> None:
    _setup(db_url)
    count = tmp_path / "calls.jsonl"
    seen = anyio.run(_drive, db_url, count, tmp_path / "work")

    # The same tools, with the upstream's schemas, registered with mcp_server/mcp_tool_name.
    assert set(seen["tools"]) == {"add", "bad", "crash"}
    assert seen["tools"]["add"].output_schema["required"] == ["sum"]
    with Plane.open(db_url) as plane:
        assert plane.log().mcp_tools("test-upstream", "add") == ["test-upstream.add"]

    ok = seen["ok"]
    assert not ok.is_error and ok.structured_content == {"sum": 3}
    assert seen["calls_after_ok"] == 1

    bad = seen["bad_input"]
    assert bad.is_error
    assert bad.structured_content["gate"] == "input"
    assert bad.structured_content["deviations"][0]["pointer"] == "/a"
    assert "blocked" in _text(bad)
    invented = seen["invented"]
    assert invented.is_error
    assert invented.structured_content["deviations"][0]["kind"] == "invented_tool"
    assert seen["calls_after_bad_input"] == 1  # neither reached the server

    out = seen["bad_output"]
    assert out.is_error and out.structured_content["gate"] == "output"
    assert "rejected" in _text(out)
    assert seen["calls_after_bad_output"] == 2

    assert "crash" in seen, seen.get("crash_result")
    assert "environment_error" in seen["crash"].message
    assert "unavailable" in seen["after_crash"].message  # never forwarded, never a hang
    assert len(_calls(count)) == 3  # the crash call reached the server; nothing after

    store = ledger.open(db_url)
    try:
        plan_events = list(store.read_stream("plan:P-1"))
    finally:
        store.close()
    called = [e.payload for e in plan_events if e.type == "tool.called"]
    assert [c.tool for c in called] == ["test-upstream.add", "test-upstream.bad"]
    assert all(c.executor == "recorded" for c in called)
    halts = [e.payload for e in plan_events if e.type == "plan.halted"]
    assert halts[-1].halt_type == "environment_error"

    audit = run_cli("audit", "--db", db_url)
    assert audit.returncode == 0, audit.stdout + audit.stderr


async def _drive_strict(url: str, count: Path, workdir: Path) -> list[types.CallToolResult]:
    results = []
    async with (
        stdio_client(_proxy(url, count, workdir)) as (read, write),
        ClientSession(read, write) as agent,
    ):
        with anyio.fail_after(60):
            await agent.initialize()
            results.append(await agent.call_tool("add", {"a": 1}))
            results.append(await agent.call_tool("add", {"a": 1, "b": 2}))
    return results


@pytest.mark.slow  # real MCP processes: the proxy and the server
def test_strict_mode_ends_the_plan_and_refuses_later_calls(db_url: str, tmp_path: Path) -> None:
    _setup(db_url, strict=True)
    count = tmp_path / "calls.jsonl"
    deviation, refused = anyio.run(_drive_strict, db_url, count, tmp_path / "work")
    assert deviation.is_error
    assert deviation.structured_content["routed"] == "compensation"
    assert refused.is_error and _text(refused).startswith("error: plan P-1")
    assert _calls(count) == []  # nothing reached the server
    audit = run_cli("audit", "--db", db_url)
    assert audit.returncode == 0, audit.stdout + audit.stderr


@pytest.mark.parametrize(
    ("upstream", "said"),
    [
        (["/nonexistent/mcp-server"], "failed: "),
        ([sys.executable, "-c", "pass"], "failed: "),  # starts, then leaves without a word
        ([sys.executable, "-c", "import time; time.sleep(30)"], "did not answer within 0.5 s"),
    ],
)
def test_an_upstream_that_cannot_serve_is_one_error_line(
    db_url: str, tmp_path: Path, upstream: list[str], said: str
) -> None:
    """No traceback and no hang when the MCP server never starts serving: one `error:`
    line, exit 2, and nothing appended (no tool was registered)."""
    _setup(db_url)
    with ledger.open(db_url, create=False) as store:
        before = store.head().size
    result = run_cli(
        "mcp",
        "proxy",
        "--plan",
        "P-1",
        "--timeout",
        "0.5",
        "--db",
        db_url,
        "--workdir",
        str(tmp_path / "work"),
        "--",
        *upstream,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the MCP server "), result.stderr
    assert said in lines[0] and "Traceback" not in result.stderr
    with ledger.open(db_url, create=False) as store:
        assert store.head().size == before


@pytest.mark.parametrize("server", ["a b", "../x", "x\x1b[31m", "", "-x", "a" * 65])
def test_a_server_name_that_cannot_name_tools_is_refused(
    db_url: str, tmp_path: Path, server: str
) -> None:
    _setup(db_url)
    with ledger.open(db_url, create=False) as store:
        before = store.head().size
    result = run_cli(
        "mcp", "proxy", "--plan", "P-1", "--server", server, "--db", db_url,
        "--workdir", str(tmp_path / "work"), "--", sys.executable, "-c", "pass",
    )  # fmt: skip
    assert result.returncode == 2 and "--server" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    with ledger.open(db_url, create=False) as store:
        assert store.head().size == before
