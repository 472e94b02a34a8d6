"""Warm MCP servers (docs/service.md, "Warm MCP servers"): the service keeps a plan's MCP
server open across its calls instead of starting it for each call, and never lets one
outlive what it was started for.

Real servers (tests/mcp_server.py, which logs each call with its pid) launched confined
in the plan's sandbox; through the service's `/mcp` (in-process, under its lifespan)
and through the plane with its own ``WarmSessions``:

- every call of a plan on one server is answered by the same process;
- two plans never share a server;
- a call that did not pass restarts the server (its writes put back, its memory gone);
- the plan's end, and a new Execute, stop its servers;
- a server idle for ``EVIDENCE_MCP_IDLE`` seconds is stopped;
- a server that crashed is started again for the next call.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from commands.plane import Plane
from commands.plane.runs import call_tool, record_halt
from commands.runner.mcp_sessions import WarmSessions, warm_sessions
from tests.commands.service.test_service_mcp import (
    _calls,
    _client,
    _plan,
    _register,
    _serve,
    _server_logs,  # noqa: F401  (autouse: where the confined test server may log)
    _session,
)

slow = pytest.mark.slow  # real MCP servers, started and stopped


def _servers(root: Path, tool: str | None = None) -> list[str]:
    """The server (an id each process draws) that answered each call, in order."""
    return [c["server"] for c in _calls(root) if tool is None or c["tool"] == tool]


def _running(root: Path) -> int:
    """Live processes of the test server logging under ``root`` (not yet reaped ones
    included: a zombie is not running)."""
    marker = str(root / "upstream" / "calls.jsonl").encode()
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in argv and b"mcp_server.py" in argv and state != "Z":
            count += 1
    return count


def _none_running(root: Path, within: float = 10) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if _running(root) == 0:
            return True
        time.sleep(0.05)
    return False


@slow
def test_the_service_answers_a_plans_calls_on_one_warm_server(
    sqlite_url: str, tmp_path: Path
) -> None:
    _register(sqlite_url, tmp_path)
    first = _plan(sqlite_url, tmp_path, "P-1")
    second = _plan(sqlite_url, tmp_path, "P-2")

    async def drive(app: Any) -> list[int]:
        for agent in (first, second):
            async with _client(app, agent.token) as http, _session(http) as session:
                await session.initialize()
                for a in range(3):
                    result = await session.call_tool("calc", {"a": a, "b": 1})
                    assert result.structured_content == {"sum": a + 1}
        service = app.state.service
        return [len(service.warm.running("P-1")), len(service.warm.running("P-2"))]

    assert _serve(sqlite_url, drive) == [1, 1]
    servers = _servers(tmp_path, "add")
    assert len(servers) == 6
    assert len(set(servers[:3])) == 1 and len(set(servers[3:])) == 1  # one per plan
    assert servers[0] != servers[3]  # two plans never share one
    assert _none_running(tmp_path)  # the service stopped them as it stopped


def _call(plane: Plane, tool: str, arguments: dict[str, Any]) -> Any:
    return call_tool(plane, "P-1", tool, arguments)


@slow
def test_a_call_that_did_not_pass_restarts_the_server(sqlite_url: str, tmp_path: Path) -> None:
    """`bad` writes in the sandbox, then answers off-schema: its write is put back, and the
    server that made it (which may hold what it wrote) is not asked again."""
    _register(sqlite_url, tmp_path)
    _plan(sqlite_url, tmp_path, "P-1")
    with Plane.open(sqlite_url) as plane, warm_sessions() as warm:
        plane.mcp_sessions = warm
        assert _call(plane, "calc", {"a": 1, "b": 1}).ok
        one = _running(tmp_path)  # the processes of one server (its launcher's too)
        assert one > 0
        assert _call(plane, "calc", {"a": 1, "b": 2}).ok
        assert not _call(plane, "bad-output", {}).ok  # written, then put back
        assert warm.running("P-1") == []
        assert _call(plane, "calc", {"a": 1, "b": 3}).ok
        assert _running(tmp_path) == one  # the one that wrote is gone
    first, again, bad, after = _servers(tmp_path)
    assert first == again == bad and after != bad


@slow
def test_a_rejected_call_that_wrote_nothing_restarts_the_server_too(
    sqlite_url: str, tmp_path: Path
) -> None:
    """`huge` answers past its output cap (the output gate fails it) and writes nothing:
    the server keeps nothing of a rejected call, in memory either."""
    _register(sqlite_url, tmp_path)
    _plan(sqlite_url, tmp_path, "P-1")
    with Plane.open(sqlite_url) as plane, warm_sessions() as warm:
        plane.mcp_sessions = warm
        assert _call(plane, "calc", {"a": 1, "b": 1}).ok
        assert not _call(plane, "huge", {"size": 1000}).ok
        assert warm.running("P-1") == []
        assert _call(plane, "calc", {"a": 1, "b": 2}).ok
    first, rejected, after = _servers(tmp_path)  # `huge` has its own cap: its own server
    assert after not in (first, rejected)  # the plan's servers were all stopped


@slow
def test_the_plans_end_stops_its_servers(sqlite_url: str, tmp_path: Path) -> None:
    _register(sqlite_url, tmp_path)
    _plan(sqlite_url, tmp_path, "P-1")
    with Plane.open(sqlite_url) as plane, warm_sessions() as warm:
        plane.mcp_sessions = warm
        assert _call(plane, "calc", {"a": 1, "b": 1}).ok
        assert len(warm.running("P-1")) == 1
        record_halt(plane, "P-1", "validation_failed", "stop here", terminal=True)
        assert warm.running("P-1") == []
        assert _none_running(tmp_path)


@slow
def test_an_idle_server_is_stopped(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVIDENCE_MCP_IDLE", "0.3")
    _register(sqlite_url, tmp_path)
    _plan(sqlite_url, tmp_path, "P-1")
    with Plane.open(sqlite_url) as plane, warm_sessions() as warm:
        plane.mcp_sessions = warm
        assert warm.idle_s == 0.3
        assert _call(plane, "calc", {"a": 1, "b": 1}).ok
        assert _running(tmp_path) > 0
        assert _none_running(tmp_path, within=5)
        assert warm.running() == []
        assert _call(plane, "calc", {"a": 1, "b": 2}).ok  # and started again when needed
    assert len(set(_servers(tmp_path))) == 2


@slow
def test_a_crashed_server_is_started_again(sqlite_url: str, tmp_path: Path) -> None:
    """A crash halts the plan (environment_error) and the server is not kept; once the
    plan is resumed the next call starts a fresh one."""
    _register(sqlite_url, tmp_path)
    _plan(sqlite_url, tmp_path, "P-1")
    with Plane.open(sqlite_url) as plane, warm_sessions() as warm:
        plane.mcp_sessions = warm
        assert _call(plane, "calc", {"a": 1, "b": 1}).ok
        crashed = _call(plane, "crash", {})
        assert crashed.halt is not None and crashed.halt.halt_type == "environment_error"
        assert warm.running("P-1") == []
        assert _none_running(tmp_path)


def test_a_bad_idle_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger import LedgerError

    monkeypatch.setenv("EVIDENCE_MCP_IDLE", "never")
    with pytest.raises(LedgerError, match="EVIDENCE_MCP_IDLE"):
        WarmSessions()


# -- in-process -------------------------------------------------------------------------


class _Dropped:
    """The plane's view of the warm servers: which plans it told to stop theirs."""

    def __init__(self) -> None:
        self.plans: list[str] = []

    def drop(self, owner: str) -> None:
        self.plans.append(owner)


def test_a_new_execute_and_the_plans_end_stop_its_servers(sqlite_url: str) -> None:
    from commands.plane.phases import enter_execute, record_strategy
    from commands.plane.plans import create_plan

    with Plane.open(sqlite_url) as plane:
        dropped = _Dropped()
        plane.mcp_sessions = dropped  # type: ignore[assignment]
        create_plan(plane, "P-1", project="api", resources=["repo:api"])
        record_strategy(plane, "P-1", "go")
        assert dropped.plans == []
        enter_execute(plane, "P-1")  # its sandbox made anew
        assert dropped.plans == ["P-1"]
        record_halt(plane, "P-1", "needs_decision", "a human decides")  # not an end
        assert dropped.plans == ["P-1"]
        create_plan(plane, "P-2", project="api", resources=["repo:api"])
        record_halt(plane, "P-2", "validation_failed", "stop", terminal=True)
        assert dropped.plans == ["P-1", "P-2"]


def test_a_kept_server_serves_only_calls_that_allow_all_it_may_reach() -> None:
    from commands.runner.confine import Confinement
    from commands.runner.mcp_sessions import _within

    kept = Confinement("landlock", read=("/usr",), write=("/sandbox",), connect=(443,))
    assert _within(kept, kept)
    assert _within(kept, Confinement("landlock", read=("/usr", "/opt"), write=("/sandbox",),
                                     connect=(443,)))  # fmt: skip
    assert not _within(kept, Confinement("landlock", read=("/usr",), write=("/sandbox",)))
    assert not _within(kept, Confinement("landlock", read=(), write=("/sandbox",),
                                         connect=(443,)))  # fmt: skip
    assert not _within(kept, Confinement("unconfined"))
    assert not _within(kept, None) and _within(None, None)
