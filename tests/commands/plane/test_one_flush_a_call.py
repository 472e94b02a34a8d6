"""One flush a call: a passing input check whose call follows is committed without a
flush of its own and reaches the disk with the call's record; every other commit is
flushed before it returns, and a signed tree head covers only what is on disk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import ledger
from commands.plane import Plane
from commands.plane.gates import gate_input
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool
from commands.plane.runs import call_tool
from ledger.backends.base import driver_connection
from tests.helpers import REPO, invoke

CALC = {
    "name": "calc",
    "command": ["true"],
    "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
    "output_schema": {"type": "object", "properties": {"sum": {"type": "integer"}}},
}


def _plan(url: str) -> None:
    with Plane.open(url) as plane:
        register_tool(plane, CALC)
        create_plan(plane, "P-1", project="p", resources=["repo:p"])
        record_strategy(plane, "P-1", "add")
        enter_execute(plane, "P-1")


@contextmanager
def _flushes(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """What the SQLite writer did about flushing, in order: ``lowered`` for a commit
    begun at NORMAL (not synced at its commit), ``synced`` for a sync of the WAL after
    one. A commit at FULL (synced by SQLite itself) shows neither."""
    seen: list[str] = []
    driver = driver_connection(plane.store._writer())
    fsync = os.fsync

    def traced(statement: str) -> None:
        if statement == "PRAGMA synchronous = NORMAL":
            seen.append("lowered")

    def synced(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("-wal"):
            seen.append("synced")
        fsync(fd)

    driver.set_trace_callback(traced)
    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", synced)
        try:
            yield seen
        finally:
            driver.set_trace_callback(None)


def test_a_passing_input_check_leaves_its_flush_to_the_calls_record(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _plan(sqlite_url)
    with Plane.open(sqlite_url) as plane:
        with _flushes(plane, monkeypatch) as seen:
            report = call_tool(plane, "P-1", "calc", b'{"a": 1}', recorded_output=b'{"sum": 2}')
        assert report.ok
        # the input check's commit is not synced; the call and its verdict's is, by SQLite
        assert seen == ["lowered"]
        with _flushes(plane, monkeypatch) as seen:
            gate_input(plane, "P-1", "calc", b'{"a": 2}', step="s-hook")  # no call follows
        assert seen == []
        with _flushes(plane, monkeypatch) as seen:  # a failed check: on disk before it returns
            gate_input(plane, "P-1", "calc", b'{"a": "x"}', step="s-bad", call_follows=True)
        assert seen == ["lowered", "synced"]


def test_a_check_left_unflushed_survives_its_process_killed(db_url: str, tmp_path: Path) -> None:
    """Committed before the call is made: the kill of the process that made it (before
    any record follows) takes nothing back."""
    _plan(db_url)
    script = (
        "import os, signal\n"
        "from commands.plane import Plane\n"
        "from commands.plane.gates import gate_input\n"
        f"plane = Plane.open({db_url!r}, create=False)\n"
        "gate_input(plane, 'P-1', 'calc', b'{\"a\": 7}', step='s-7', call_follows=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == -signal.SIGKILL
    with ledger.open(db_url, create=False) as store:
        checks = [e.payload for e in store.read_stream("plan:P-1") if e.type == "gate.checked"]
    assert [(c.step, c.verdict) for c in checks] == [("s-7", "pass")]


def test_a_signed_head_is_on_disk_first(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`evidence checkpoint` signs only after the WAL is synced: a check whose flush was
    left to a call's record never stands under a signature a power cut could undo."""
    _plan(sqlite_url)
    with Plane.open(sqlite_url) as plane:
        gate_input(plane, "P-1", "calc", b'{"a": 1}', step="s-1", call_follows=True)
    synced: list[str] = []
    fsync = os.fsync

    def recorded(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recorded)
    result = invoke("checkpoint", "--db", sqlite_url)
    assert result.exit_code == 0, result.output
    assert synced == [sqlite_url.removeprefix("sqlite:///") + "-wal"]
