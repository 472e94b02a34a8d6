"""What was judged is what is applied (issue 42, "One snapshot"): a validation run copies
the plan's sandbox once into a run-private snapshot the agent cannot write, the digest of
that copy is what the token binds, and every validation of the run reads a copy of it —
never the live sandbox, which the agent may write at any time. On a real SQLite file and
on the real PostgreSQL.

The attack: the agent shows EVIL content while the run's trees are read, GOOD content
while each validation's copy is made, EVIL again after. Judged on GOOD, bound to EVIL,
Apply would write EVIL into the real repository (and `audit` would say ok)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import commands.plane.validation_runs as runs_module
from commands.plane import CommandRefused, Plane
from commands.plane.lifecycle import apply_plan
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.validation_runs import ValidationReport, validate_plan
from commands.runner.trees import scan
from tests.helpers import status_plan, work

GOOD, EVIL = "good\n", "evil\n"

# The plan's validation: passes on "good", and says the digest of what it read.
CHECK = """
import hashlib, json
data = open("status.txt", "rb").read()
print(json.dumps({"passed": data.strip() == b"good",
                  "data": {"read": hashlib.sha256(data).hexdigest()}}))
"""


def _attacked_plan(plane: Plane, tmp_path: Path) -> Path:
    """P-1 in Execute on ``status_plan``'s project (its check also reports what it read)."""
    project = status_plan(plane, tmp_path, {})
    (tmp_path / "check.py").write_text(CHECK)
    return project


def _judged(plane: Plane, report: ValidationReport) -> str:
    """The digest of status.txt in the trees the run recorded it judged."""
    started = next(
        e.payload
        for e in plane.store.read_stream(f"plan:{report.plan_id}")
        if e.type == "validation.run_started" and e.payload.run_id == report.run_id
    )
    trees = json.loads(plane.store.get_blob(started.trees_sha256) or b"")
    (tree,) = trees.values()
    return str(tree["manifest"]["status.txt"][2])


def _apply_if_passed(plane: Plane, report: ValidationReport) -> None:
    if report.token is not None:
        with contextlib.suppress(CommandRefused):
            apply_plan(plane, report.plan_id, report.token)


def test_every_validation_reads_the_content_its_token_binds(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's flips, made exactly around each validation (after the run's trees
    were read): the validation judges what the run bound, so EVIL fails and is never
    applied."""
    with Plane.open(db_url) as plane:
        project = _attacked_plan(plane, tmp_path)
        status = work(plane) / "status.txt"
        status.write_text(EVIL)
        run_validation = runs_module.run_validation

        def agent_flips_around_each_validation(*args: Any, **kw: Any) -> Any:
            status.write_text(GOOD)
            try:
                return run_validation(*args, **kw)
            finally:
                status.write_text(EVIL)

        monkeypatch.setattr(runs_module, "run_validation", agent_flips_around_each_validation)
        report = validate_plan(plane, "P-1")
        _apply_if_passed(plane, report)
        assert (project / "status.txt").read_text() == "bad\n", "EVIL was applied"
        (result,) = report.results
        assert result.data == {"read": _judged(plane, report)}, "judged one thing, bound another"
        assert report.outcome == "blocker" and report.token is None


@pytest.fixture
def plane(db_url: str) -> Iterator[Plane]:
    with Plane.open(db_url) as p:
        yield p


def _snapshots(plane: Plane) -> Path:
    return plane.sandbox(plane.state("plan:P-1").doc).run_snapshots


def _left(plane: Plane) -> list[str]:
    """The snapshots in the plan's directory of them (its lock file aside)."""
    return [p.name for p in _snapshots(plane).iterdir() if p.name != ".lock"]


def test_the_snapshot_is_removed_when_the_run_ends(
    plane: Plane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever happens: a run that passes, one interrupted mid-way, and a snapshot a
    killed run left (swept by the next run, never one a live run holds)."""
    from commands.runner.sandbox import RunSnapshot

    _attacked_plan(plane, tmp_path)
    (work(plane) / "status.txt").write_text(GOOD)
    assert validate_plan(plane, "P-1").outcome == "pass"
    assert _left(plane) == []

    left = _snapshots(plane) / "01KILLEDRUN"  # what a SIGKILLed run leaves
    (left / "copy").mkdir(parents=True)
    (left / "copy" / "status.txt").write_text(GOOD)

    def interrupted(*_args: Any, **_kw: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(runs_module, "run_validation", interrupted)
    with RunSnapshot.taken(_snapshots(plane), "01LIVERUN", {}):  # a run under way
        with pytest.raises(KeyboardInterrupt):
            validate_plan(plane, "P-1")
        assert _left(plane) == ["01LIVERUN"]
    assert _left(plane) == []


def test_a_write_to_the_snapshot_during_the_run_voids_it(
    plane: Plane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A validation that writes the run's snapshot (unconfined, through its path) would
    change what the validations after it read: the run's results on it are void."""
    _attacked_plan(plane, tmp_path)
    (work(plane) / "status.txt").write_text(GOOD)
    run_validation = runs_module.run_validation

    def writes_the_snapshot(*args: Any, **kw: Any) -> Any:
        found = run_validation(*args, **kw)
        (Path(kw["workdir"]) / "status.txt").write_text(EVIL)
        return found

    monkeypatch.setattr(runs_module, "run_validation", writes_the_snapshot)
    report = validate_plan(plane, "P-1")
    (result,) = report.results
    assert (result.verdict, result.cause) == (None, "read_only_violation")
    assert result.changed_paths == ["status.txt"] and report.token is None


def test_the_agents_tools_cannot_write_where_snapshots_are(plane: Plane, tmp_path: Path) -> None:
    """The agent writes its sandbox through its tools: confined, they may write their
    copies only, never the directory beside them where the runs' snapshots are made."""
    from commands.plane.registry import register_tool
    from commands.plane.runs import call_tool

    _attacked_plan(plane, tmp_path)
    assert validate_plan(plane, "P-1").outcome == "blocker"  # made the directory
    target = _snapshots(plane) / "planted"
    write = (
        "import json, sys\n"
        "try:\n    open(sys.argv[1], 'w').write('x'); wrote = True\n"
        "except OSError:\n    wrote = False\n"
        "print(json.dumps(dict(wrote=wrote)))"
    )
    register_tool(
        plane,
        {
            "name": "plant",
            "command": ["python", "-c", write, str(target)],
            "input_schema": {"type": "object"},
            "output_schema": {"type": "object", "properties": {"wrote": {"type": "boolean"}}},
        },
    )
    report = call_tool(plane, "P-1", "plant", {})
    assert report.ok and json.loads(report.output or b"") == {"wrote": False}
    assert not target.exists()


def test_the_snapshot_copies_links_fifos_and_names_as_they_are(tmp_path: Path) -> None:
    """A symlink stays a link (never followed), a hard link to a file outside is copied
    by content (never kept as a link), a FIFO is recreated (never opened), a socket is
    recorded as what it is (never copied), a name that is not UTF-8 is kept as its bytes;
    modes are kept."""
    from commands.runner.sandbox import RunSnapshot

    outside = tmp_path / "outside.txt"
    outside.write_text("secret\n")
    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "f.txt").write_text("x\n")
    (source / "sub" / "f.txt").chmod(0o640)
    os.symlink(outside, source / "link")
    os.symlink(tmp_path, source / "dirlink")
    os.link(outside, source / "hard.txt")
    os.mkfifo(source / "fifo", 0o600)
    bound = socket.socket(socket.AF_UNIX)
    bound.bind(os.fspath(source / "sock"))
    with open(os.path.join(os.fsencode(source), b"caf\xe9.txt"), "wb") as handle:
        handle.write(b"latin-1\n")
    (source / "sub").chmod(0o550)
    try:
        with RunSnapshot.taken(tmp_path / "runs", "R1", {"res": source}) as snap:
            copy = snap.copies["res"]
            assert snap.judged["res"] == scan(source).entries
            assert os.readlink(copy / "link") == str(outside)
            assert os.readlink(copy / "dirlink") == str(tmp_path)
            assert (copy / "hard.txt").read_text() == "secret\n"
            assert os.lstat(copy / "hard.txt").st_nlink == 1
            assert stat.S_ISFIFO(os.lstat(copy / "fifo").st_mode)
            assert not os.path.lexists(copy / "sock")
            assert snap.judged["res"]["sock"][0] == "special"
            assert stat.S_IMODE(os.lstat(copy / "sub").st_mode) == 0o550
            assert (copy / os.fsdecode(b"caf\xe9.txt")).read_bytes() == b"latin-1\n"
            assert not snap.changed()
        assert not (tmp_path / "runs" / "R1").exists()
    finally:
        (source / "sub").chmod(0o750)
        bound.close()


# -- the race, with a real concurrent attacker ---------------------------------------------

# The agent: watches its sandbox with inotify and, counting the reads of status.txt that
# end (IN_CLOSE_NOWRITE), replaces it after a read with what its schedule says (each
# replacement atomic, by rename). Before the fix a run read the sandbox four times: the
# copy the run kept, the scan it judged, the validation's copy, the scan after; after
# it, once (the snapshot's copy).
SCHEDULES = ({2: GOOD, 3: EVIL}, {1: GOOD, 2: EVIL})
ATTACKER = r"""
import ctypes, json, os, struct, sys
IN_CLOSE_NOWRITE, IN_ISDIR = 0x10, 0x40000000
directory, schedule = sys.argv[1], {int(k): v for k, v in json.loads(sys.argv[2]).items()}
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(os.O_CLOEXEC)
if fd < 0 or libc.inotify_add_watch(fd, os.fsencode(directory), IN_CLOSE_NOWRITE) < 0:
    sys.exit(f"inotify: {os.strerror(ctypes.get_errno())}")
print("watching", flush=True)
reads = 0
while schedule:
    buffer, at = os.read(fd, 65536), 0
    while at < len(buffer):
        _wd, mask, _cookie, size = struct.unpack_from("iIII", buffer, at)
        name = buffer[at + 16 : at + 16 + size].rstrip(b"\0")
        at += 16 + size
        if name != b"status.txt" or mask & IN_ISDIR:
            continue
        reads += 1
        if reads in schedule:
            temp = os.path.join(directory, ".flip")
            with open(temp, "w") as handle:
                handle.write(schedule.pop(reads))
            os.replace(temp, os.path.join(directory, "status.txt"))
"""


@contextlib.contextmanager
def _agent_watching(sandbox: Path, schedule: dict[int, str]) -> Iterator[None]:
    agent = subprocess.Popen(
        [sys.executable, "-c", ATTACKER, str(sandbox), json.dumps(schedule)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert agent.stdout is not None and agent.stdout.readline() == "watching\n"
        yield
    finally:
        agent.kill()
        agent.wait()


@pytest.mark.slow
def test_an_agent_racing_the_run_with_inotify_never_gets_evil_applied(
    db_url: str, tmp_path: Path
) -> None:
    """A real agent process, flipping its sandbox on the run's reads (EVIL for the record,
    GOOD for the validation's copy, EVIL after; or GOOD right after the first read), for
    a bounded number of plans: no validation read other than what its run bound, and EVIL
    never reaches the real repository."""
    with Plane.open(db_url) as plane:
        project = _attacked_plan(plane, tmp_path)
        for i in range(1, 9):
            plan_id = f"P-{i}"
            if i > 1:
                create_plan(plane, plan_id, project="api", resources=[str(project)], config={})
                record_strategy(plane, plan_id, "make the status good")
                enter_execute(plane, plan_id)
            sandbox = work(plane, plan_id)
            (sandbox / "status.txt").write_text(EVIL)
            with _agent_watching(sandbox, SCHEDULES[(i - 1) % 2]):
                report = validate_plan(plane, plan_id)
            _apply_if_passed(plane, report)
            assert (project / "status.txt").read_text() == "bad\n", f"EVIL applied by {plan_id}"
            for result in report.results:
                if result.verdict is not None:
                    assert result.data == {"read": _judged(plane, report)}, plan_id


def test_the_judged_digest_is_the_snapshot_copy(plane: Plane, tmp_path: Path) -> None:
    """The digest the token binds is the copy's: status.txt as the validation read it."""
    _attacked_plan(plane, tmp_path)
    (work(plane) / "status.txt").write_text(GOOD)
    report = validate_plan(plane, "P-1")
    assert report.outcome == "pass" and report.token
    (result,) = report.results
    good = hashlib.sha256(GOOD.encode()).hexdigest()
    assert result.data == {"read": good} and _judged(plane, report) == good
