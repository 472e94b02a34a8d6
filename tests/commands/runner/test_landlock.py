"""The kernel's sandbox (issue 30, item 2): every program the plane starts runs confined
by Landlock — writes only in its sandbox and a private temporary directory, validations
read-only, no reach into the real resources, other plans' sandboxes, the ledger or the
plane key — and the level is recorded on every run. Where the kernel has no Landlock the
plane refuses confined work unless the plan opted out (``confinement: none``), and that
is recorded and reported as ``unconfined``.

The syscall layer is tested through the launcher itself (``commands/runner/
landlock_exec.py``), the attacks end to end through the Python API and the CLI, on
SQLite (the storage is not the point here), with real subprocesses."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

import commands.plane.confinement as plane_confinement
import ledger
from commands.plane import CommandRefused, Plane
from commands.plane.attachments import attach
from commands.plane.confinement import protected_paths, review_confinement
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool, register_validation
from commands.plane.runs import call_tool
from commands.plane.validation_runs import validate_plan
from commands.runner import landlock_exec as ll
from commands.runner.confine import (
    LAUNCHER,
    READ_ENV,
    Confinement,
    allow_list,
    exec_failure,
    landlock_abi,
    program_files,
    unconfined,
    wrap,
)
from commands.runner.process import run_command
from commands.runner.validations import run_validation
from ledger.events import PlanCreated, ToolCalled, ValidationResultRecorded
from tests.helpers import REPO, TESTS, assert_refused, run_cli, work

needs_landlock = pytest.mark.skipif(landlock_abi() < 1, reason="this kernel has no Landlock")

# A program that tries what it is told and says what happened: one result per
# operation, "ok" or the errno's name. ``--validation`` wraps the results in a passing
# structured return (so a validation's data carries them).
PROBE = r"""
import errno, json, os, sys

def attempt(op, *args):
    if op == "append":
        with open(args[0], "a") as f:
            f.write("pwned\n")
    elif op == "write":
        with open(args[0], "w") as f:
            f.write("x\n")
    elif op == "read":
        with open(args[0], "rb") as f:
            f.read(1)
    elif op == "list":
        os.listdir(args[0])
    elif op == "symlink":
        os.symlink(args[0], args[1])
    elif op == "hardlink":
        os.link(args[0], args[1])
    elif op == "mknod":
        os.mknod(args[0], 0o600 | 0o060000, os.makedev(8, 0))  # a block device
    elif op == "tmp":
        with open(os.path.join(os.environ["TMPDIR"], "t"), "w") as f:
            f.write("x")
        return "ok " + os.environ["TMPDIR"]
    elif op == "signal-parent":
        os.kill(os.getppid(), 0)
    elif op == "env":
        return "absent" if args[0] not in os.environ else "present"
    elif op == "connect-abstract":
        import socket
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect("\0" + args[0])
    elif op == "id":
        with open("/proc/self/status") as status:
            caps = [line.split()[1] for line in status if line.startswith("CapEff")]
        return f"{os.getuid()}:{os.getgid()}:{os.getgroups()}:{caps[0]}"
    elif op == "owner":
        return str(os.lstat(args[0]).st_uid)
    elif op in ("connect-tcp", "bind-tcp"):
        import socket
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            address = ("127.0.0.1", int(args[0]))
            sock.connect(address) if op == "connect-tcp" else sock.bind(address)
    return "ok"

results = {}
for i, (op, *args) in enumerate(json.loads(sys.argv[1])):
    try:
        results[str(i)] = attempt(op, *args)
    except OSError as exc:
        results[str(i)] = errno.errorcode.get(exc.errno, str(exc.errno))
if sys.argv[2:] == ["--validation"]:
    print(json.dumps({"passed": True, "data": results}))
else:
    print(json.dumps(results))
"""

OPS = {"type": "object", "properties": {"ops": {"type": "array"}}, "required": ["ops"]}
RESULTS = {"type": "object", "additionalProperties": {"type": "string"}}


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    """The probe script, in a directory of its own (never one holding the ledger)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "probe.py").write_text(PROBE)
    return tools / "probe.py"


def _probe(probe: Path, confinement: Confinement, cwd: Path, *ops: list[str]) -> dict[str, str]:
    run = run_command(
        [sys.executable, str(probe), json.dumps(list(ops))],
        cwd=cwd,
        timeout_s=60,
        confinement=confinement.adding(read=program_files([sys.executable, str(probe)])),
    )
    assert run.exit_code == 0, run.stderr
    return json.loads(run.stdout)


# -- the syscall layer ------------------------------------------------------------------


def test_each_abi_is_asked_only_for_the_rights_it_knows() -> None:
    base = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
    assert ll.handled_rights(0) == 0
    assert ll.handled_rights(1) == base
    assert ll.handled_rights(2) == base | ll.REFER
    assert ll.handled_rights(3) == ll.handled_rights(4) == base | ll.REFER | ll.TRUNCATE
    every = base | ll.REFER | ll.TRUNCATE | ll.IOCTL_DEV
    assert ll.handled_rights(5) == ll.handled_rights(6) == ll.handled_rights(7) == every
    assert ll.read_rights(7) == ll.EXECUTE | ll.READ_FILE | ll.READ_DIR
    # a writable directory never lets a device node be made in it
    assert ll.write_rights(7) & (ll.MAKE_CHAR | ll.MAKE_BLOCK) == 0
    assert ll.write_rights(1) == base & ~(ll.MAKE_CHAR | ll.MAKE_BLOCK)


@needs_landlock
def test_the_abi_is_detected() -> None:
    assert landlock_abi() == ll.abi_version() >= 1


@needs_landlock
def test_a_confined_program_writes_its_sandbox_and_temp_dir_and_nothing_else(
    tmp_path: Path, probe: Path
) -> None:
    sandbox, other, outside = tmp_path / "sandbox", tmp_path / "other-plan", tmp_path / "out"
    for directory in (sandbox, other, outside):
        directory.mkdir()
    (other / "theirs.txt").write_text("another plan's work\n")
    (outside / "real.txt").write_text("the real resource\n")
    db = tmp_path / "evidence.db"
    db.write_bytes(b"SQLite format 3\x00")
    confinement = Confinement.of("landlock", write=[sandbox], protected=[db])
    found = _probe(
        probe,
        confinement,
        sandbox,
        ["write", str(sandbox / "mine.txt")],
        ["tmp"],
        ["append", str(outside / "real.txt")],
        ["write", str(outside / "new.txt")],
        ["read", str(db)],
        ["read", str(other / "theirs.txt")],
        ["write", str(other / "planted.txt")],
        ["list", str(tmp_path)],
        ["symlink", str(outside / "real.txt"), "link.txt"],
        ["append", "link.txt"],
        ["hardlink", str(outside / "real.txt"), "hard.txt"],
        ["read", str(outside / "real.txt")],
    )
    assert found["0"] == "ok" and (sandbox / "mine.txt").exists()
    assert found["1"].startswith("ok ")
    assert not Path(found["1"][3:]).exists()  # its temporary directory is gone
    # nothing outside: not the real file, not by a symlink made in the sandbox, not a
    # hard link to it; no read of the ledger or of another plan's sandbox
    assert [found[str(i)] for i in (2, 3, 4, 5, 6, 7)] == ["EACCES"] * 6
    assert found["8"] == "ok" and found["9"] == "EACCES"
    assert found["10"] in ("EACCES", "EXDEV")
    assert found["11"] == "EACCES"
    assert (outside / "real.txt").read_text() == "the real resource\n"
    assert sorted(p.name for p in outside.iterdir()) == ["real.txt"]
    assert sorted(p.name for p in other.iterdir()) == ["theirs.txt"]


@needs_landlock
@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_even_root_makes_no_device_node_in_its_sandbox(tmp_path: Path, probe: Path) -> None:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    found = _probe(probe, Confinement.of("landlock", write=[sandbox]), sandbox, ["mknod", "disk"])
    assert found == {"0": "EACCES"} and not (sandbox / "disk").exists()


@needs_landlock
@pytest.mark.skipif(landlock_abi() < 6, reason="signal scoping is Landlock ABI 6")
def test_a_confined_program_cannot_signal_the_plane(tmp_path: Path, probe: Path) -> None:
    found = _probe(probe, Confinement.of("landlock"), tmp_path, ["signal-parent"])
    assert found == {"0": "EPERM"}


@needs_landlock
def test_a_read_only_program_reads_its_copy_and_writes_nothing(tmp_path: Path, probe: Path) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "app.py").write_text("print('hello')\n")
    found = _probe(
        probe,
        Confinement.of("landlock", read=[copy]),
        copy,
        ["read", "app.py"],
        ["write", "new.txt"],
        ["append", "app.py"],
        ["tmp"],
    )
    assert found["0"] == "ok" and found["1"] == found["2"] == "EACCES"
    assert found["3"].startswith("ok ")
    assert sorted(p.name for p in copy.iterdir()) == ["app.py"]


@needs_landlock
def test_a_program_the_launcher_cannot_execute_is_a_missing_program(tmp_path: Path) -> None:
    confined = Confinement.of("landlock")
    run = run_command(
        ["definitely-not-installed-xyz"], cwd=tmp_path, timeout_s=30, confinement=confined
    )
    assert run.missing_program == "definitely-not-installed-xyz" and run.exit_code is None
    assert "No such file" in (run.error or "") and run.stderr == b""
    # a program outside what it may read cannot be executed either: said so, with the fix
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "tool").write_text("#!/bin/sh\necho hi\n")
    (hidden / "tool").chmod(0o755)
    argv = [str(hidden / "tool")]
    run = run_command(argv, cwd=tmp_path, timeout_s=30, confinement=confined)
    assert run.missing_program == argv[0] and READ_ENV in (run.error or "")
    # ... unless it is named in the registered command (its file only, read-only)
    confined = confined.adding(read=program_files(argv))
    run = run_command(argv, cwd=tmp_path, timeout_s=30, confinement=confined)
    assert run.exit_code == 0 and run.stdout == b"hi\n"


# Stacks allow-everything Landlock layers until the kernel refuses one more (E2BIG: the
# most a process may hold), then executes its argv: there, the launcher's own
# landlock_restrict_self fails for real.
EXHAUST_LAYERS = r"""
import errno, importlib.util, os, sys
spec = importlib.util.spec_from_file_location("landlock_exec", sys.argv[1])
ll = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ll)
for _ in range(1000):
    try:
        ll.restrict_self(["/"], ["/"])
    except OSError as exc:
        if exc.errno != errno.E2BIG:
            raise
        break
else:
    sys.exit("no layer limit")
os.execv(sys.argv[2], sys.argv[2:])
"""


@needs_landlock
def test_a_launcher_that_cannot_restrict_itself_runs_nothing(tmp_path: Path) -> None:
    """Fails closed: when the kernel refuses the restriction, the program never runs,
    confined or not, and the failure is the launcher's own (not the program's)."""
    ran = tmp_path / "ran"
    program = [sys.executable, "-c", f"open({str(ran)!r}, 'w').write('unconfined')"]
    argv = wrap(program, Confinement.of("landlock", write=[tmp_path]))
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", EXHAUST_LAYERS, str(LAUNCHER), *argv],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == ll.SETUP_FAILED, done.stderr
    assert not ran.exists()
    failure = exec_failure(done.returncode, done.stderr)
    assert failure is not None and failure[0] == 0  # errno 0: the setup, not the program
    assert failure[1].startswith("setup failed") and os.strerror(errno.E2BIG) in failure[1]


def test_unconfined_runs_as_ever() -> None:
    assert wrap(["true"], unconfined()) == ["true"]
    run = run_command(["definitely-not-installed-xyz"], cwd=None, timeout_s=30)
    assert run.missing_program == "definitely-not-installed-xyz"


def test_the_allow_list_never_holds_the_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "evidence.db"
    db.write_bytes(b"")
    (tmp_path / "tools").mkdir()
    (tmp_path / "evidence.db.state" / "sandboxes").mkdir(parents=True)
    monkeypatch.setenv(
        READ_ENV,
        os.pathsep.join(
            [str(tmp_path), str(tmp_path / "tools"), str(tmp_path / "evidence.db.state/sandboxes")]
        ),
    )
    found = allow_list([str(db), str(tmp_path / "evidence.db.state")])
    # a directory holding the database, or inside the state directory, is dropped
    assert str(tmp_path) not in found and str(tmp_path / "evidence.db.state/sandboxes") not in found
    assert str(tmp_path / "tools") in found
    assert "/usr" in found and not any(p.startswith("/dev") for p in found)
    # a protected system directory is dropped too (keep the ledger out of them)
    assert "/usr" not in allow_list(["/usr/share/evidence/evidence.db"])


def test_program_files_are_the_literal_files_of_a_template(tmp_path: Path, probe: Path) -> None:
    template = [sys.executable, str(probe), "{path}", str(tmp_path), "/nonexistent/x", "rel.py"]
    assert program_files(template) == [sys.executable, str(probe)]


# -- the attacks, end to end ----------------------------------------------------------------


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "app.txt").write_text("original\n")
    return root


@pytest.fixture
def plane(sqlite_url: str, probe: Path) -> Any:
    with Plane.open(sqlite_url) as p:
        register_tool(
            p,
            {
                "name": "probe",
                "input_schema": OPS,
                "output_schema": RESULTS,
                "command": [sys.executable, str(probe), "{ops}"],
            },
        )
        register_validation(
            p,
            {
                "name": "vprobe",
                "mode": "required",
                "input_schema": OPS,
                "command": [sys.executable, str(probe), "{ops}", "--validation"],
            },
        )
        yield p


def _execute(
    plane: Plane, plan_id: str, resource: Path, config: dict[str, Any] | None = None
) -> None:
    create_plan(plane, plan_id, project="api", resources=[str(resource)], config=config)
    record_strategy(plane, plan_id, "probe")
    enter_execute(plane, plan_id)


def _size(plane: Plane) -> int:
    return plane.store.head().size


@needs_landlock
def test_a_tool_writing_the_real_resource_by_absolute_path_gets_a_permission_error(
    plane: Plane, project: Path
) -> None:
    _execute(plane, "P-1", project)
    params = {"ops": [["append", str(project / "app.txt")], ["write", str(project / "new.txt")]]}
    done = run_cli(
        "call",
        "P-1",
        "--tool",
        "probe",
        "--params",
        json.dumps(params),
        "--json",
        "--db",
        plane.store.url,
    )
    assert done.returncode == 0, done.stderr
    call = json.loads(done.stdout)
    assert call["output_gate"]["verdict"] == "pass"
    assert call["call"]["confinement"] == "landlock"
    output = plane.store.get_blob(call["call"]["output_sha256"])
    assert json.loads(bytes(output or b"")) == {"0": "EACCES", "1": "EACCES"}
    assert (project / "app.txt").read_text() == "original\n"
    assert sorted(p.name for p in project.iterdir()) == ["app.txt"]


@needs_landlock
def test_a_tool_writing_through_a_symlink_in_its_sandbox_is_refused(
    plane: Plane, project: Path
) -> None:
    _execute(plane, "P-1", project)
    ops = [["symlink", str(project / "app.txt"), "escape.txt"], ["append", "escape.txt"]]
    report = call_tool(plane, "P-1", "probe", {"ops": ops})
    assert report.ok and json.loads(report.output or b"") == {"0": "ok", "1": "EACCES"}
    assert (work(plane) / "escape.txt").is_symlink()  # made in the sandbox, harmless there
    assert (project / "app.txt").read_text() == "original\n"


@needs_landlock
def test_a_tool_reads_neither_the_ledger_nor_the_key_nor_another_plans_sandbox(
    plane: Plane, project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "theirs.txt").write_text("theirs\n")
    _execute(plane, "P-2", other)
    _execute(plane, "P-1", project)
    db = Path(plane.store.engine.url.database or "")
    key = Path(os.environ["EVIDENCE_PLANE_KEY"])
    assert db.is_file() and key.is_file()
    # The plane's own variables, as a deployment sets them (a URL with its password);
    # the state directory and the key's path come from the autouse fixture; the
    # service's other secrets. A variable the operator passes on (EVIDENCE_CONFINE_ENV)
    # is there, so an "absent" below is the filter's doing.
    monkeypatch.setenv("EVIDENCE_DB", "postgresql+psycopg://evidence:s3cr3t@db.internal/ledger")
    monkeypatch.setenv("PGPASSWORD", "s3cr3t")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI")
    monkeypatch.setenv("PROBE_PASSES", "1")
    monkeypatch.setenv("EVIDENCE_CONFINE_ENV", "PROBE_PASSES")
    assert {"EVIDENCE_PLANE_KEY", "EVIDENCE_STATE_DIR"} <= set(os.environ)
    ops = [
        ["read", str(db)],
        ["read", str(key)],
        ["read", str(work(plane, "P-2") / "theirs.txt")],
        ["write", str(work(plane, "P-2") / "planted.txt")],
        ["list", str(plane.sandboxes)],
        ["env", "EVIDENCE_DB"],
        ["read", str(work(plane, "P-1") / "app.txt")],
        ["env", "EVIDENCE_PLANE_KEY"],
        ["env", "EVIDENCE_STATE_DIR"],
        ["env", "PROBE_PASSES"],
        ["env", "PGPASSWORD"],
        ["env", "AWS_SECRET_ACCESS_KEY"],
        ["env", "EVIDENCE_CONFINE_ENV"],
        ["read", f"/proc/{os.getpid()}/cmdline"],  # the plane's command line
    ]
    report = call_tool(plane, "P-1", "probe", {"ops": ops})
    assert json.loads(report.output or b"") == {
        "0": "EACCES",
        "1": "EACCES",
        "2": "EACCES",
        "3": "EACCES",
        "4": "EACCES",
        "5": "absent",
        "6": "ok",
        "7": "absent",
        "8": "absent",
        "9": "present",
        "10": "absent",
        "11": "absent",
        "12": "absent",
        "13": "ENOENT",  # a /proc of its own PID namespace: the plane is not in it
    }
    assert not (work(plane, "P-2") / "planted.txt").exists()
    assert {str(db), str(key)} <= {str(Path(p)) for p in protected_paths(plane)}


@needs_landlock
def test_a_validation_writes_neither_a_third_directory_nor_another_plans_sandbox(
    plane: Plane, project: Path, tmp_path: Path
) -> None:
    other, third = tmp_path / "other", tmp_path / "third"
    other.mkdir()
    third.mkdir()
    _execute(plane, "P-2", other)
    theirs = work(plane, "P-2")
    before = sorted(p.name for p in theirs.iterdir())
    ops = [
        ["write", str(third / "x.txt")],
        ["write", str(theirs / "x.txt")],
        ["write", "in-its-copy.txt"],
        ["write", str(work(plane, "P-2").parent.parent / "x.txt")],
        ["read", "app.txt"],
    ]
    attach(plane, "vprobe", resource=str(project), args={"ops": ops})
    _execute(plane, "P-1", project)
    report = validate_plan(plane, "P-1")
    (result,) = report.results
    assert (result.verdict, result.cause, result.changed_paths) == (True, None, [])
    assert result.data == {"0": "EACCES", "1": "EACCES", "2": "EACCES", "3": "EACCES", "4": "ok"}
    assert result.confinement == "landlock"
    assert report.outcome == "pass"
    assert list(third.iterdir()) == [] and sorted(p.name for p in theirs.iterdir()) == before


@needs_landlock
def test_a_missing_program_is_still_an_environment_error(plane: Plane, project: Path) -> None:
    register_tool(plane, {"name": "ghost", "command": ["definitely-not-installed-xyz"]})
    register_validation(
        plane, {"name": "absent", "mode": "required", "command": ["definitely-not-installed-xyz"]}
    )
    attach(plane, "absent", resource=str(project))
    _execute(plane, "P-1", project)
    report = call_tool(plane, "P-1", "ghost", {})
    assert report.halt is not None and report.halt.halt_type == "environment_error"
    assert report.halt.raw_halt_type == "program_missing"
    assert "definitely-not-installed-xyz" in (report.halt.hint or "")


@needs_landlock
def test_a_validation_with_a_missing_program_has_no_verdict(plane: Plane, project: Path) -> None:
    register_validation(
        plane, {"name": "absent", "mode": "required", "command": ["definitely-not-installed-xyz"]}
    )
    attach(plane, "absent", resource=str(project))
    _execute(plane, "P-1", project)
    (result,) = validate_plan(plane, "P-1").results
    assert (result.verdict, result.cause, result.confinement) == (
        None,
        "missing_program",
        "landlock",
    )


@needs_landlock
def test_a_reviewer_without_tools_reads_no_repository(
    plane: Plane, project: Path, tmp_path: Path, probe: Path
) -> None:
    """Seed 002: the evaluator, repair and merger run with no tools; a candidate reads its
    copy of the scope only."""
    empty, view = tmp_path / "empty", tmp_path / "view"
    empty.mkdir()
    view.mkdir()
    (view / "scoped.txt").write_text("in scope\n")
    evaluator = review_confinement(plane, None, read=[empty])
    found = _probe(probe, evaluator, empty, ["read", str(project / "app.txt")], ["write", "x"])
    assert found == {"0": "EACCES", "1": "EACCES"}
    candidate = review_confinement(plane, None, read=[view])
    found = _probe(
        probe,
        candidate,
        view,
        ["read", "scoped.txt"],
        ["read", str(project / "app.txt")],
        ["write", "x"],
    )
    assert found == {"0": "ok", "1": "EACCES", "2": "EACCES"}


# -- no Landlock: refused, unless the plan opted out -----------------------------------------


@pytest.fixture
def no_landlock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel without Landlock, as the plane sees it."""
    monkeypatch.setattr(plane_confinement, "landlock_abi", lambda: 0)


def test_without_landlock_confined_work_is_refused_and_nothing_recorded(
    plane: Plane, project: Path, no_landlock: None
) -> None:
    attach(plane, "vprobe", resource=str(project), args={"ops": []})
    _execute(plane, "P-1", project)
    size = _size(plane)
    url = plane.store.url
    refused = run_cli("call", "P-1", "--tool", "probe", "--params", '{"ops": []}', "--db", url)
    assert_refused(refused, "no Landlock", "confinement: none")
    assert_refused(run_cli("validate", "P-1", "--db", url), "no Landlock", "confinement: none")
    assert _size(plane) == size
    # a call whose output the orchestrator recorded runs nothing here: not refused
    recorded = call_tool(plane, "P-1", "probe", {"ops": []}, recorded_output={"0": "ok"})
    assert recorded.ok and recorded.call is not None
    assert recorded.call.confinement is msgspec.UNSET


def test_a_plan_file_run_is_refused_before_the_ledger_sees_it(
    sqlite_url: str, tmp_path: Path, no_landlock: None
) -> None:
    example = REPO / "examples" / "strict-output-deviation"
    shutil.copytree(example, tmp_path / "example")
    done = run_cli("run", str(tmp_path / "example" / "plan.yaml"), "--db", sqlite_url)
    assert_refused(done, "no Landlock", "confinement: none")
    with ledger.open(sqlite_url) as store:
        assert store.head().size == 0


def test_without_landlock_a_review_is_refused_unless_its_plan_opted_out(
    plane: Plane, project: Path, no_landlock: None
) -> None:
    from commands.plane.review_host import run_review
    from commands.plane.review_inputs import parse_reviewers
    from tests.commands.plane.test_review_host import request, reviewers

    config = parse_reviewers(reviewers(), "test")
    (project / "src").mkdir()
    (project / "README.md").write_text("# read me\n")
    size = _size(plane)
    with pytest.raises(CommandRefused, match="no Landlock"):
        run_review(plane, request(), config, repository=project, start=False)
    assert _size(plane) == size
    create_plan(
        plane, "P-U", project="api", resources=[str(project)], config={"confinement": "none"}
    )
    receipt = run_review(plane, request(), config, repository=project, plan_id="P-U", start=False)
    assert receipt.task_id


@needs_landlock
def test_the_opt_out_runs_unconfined_and_says_so_everywhere(
    plane: Plane, project: Path, no_landlock: None, tmp_path: Path
) -> None:
    ops = [["read", "app.txt"]]
    attach(plane, "vprobe", resource=str(project), args={"ops": ops})
    _execute(plane, "P-U", project, {"confinement": "none"})
    url = plane.store.url
    # unconfined, a tool reaches the real resource: what the opt-out gives up
    report = call_tool(plane, "P-U", "probe", {"ops": [["append", str(project / "app.txt")]]})
    assert json.loads(report.output or b"") == {"0": "ok"}
    assert (project / "app.txt").read_text() == "original\npwned\n"
    assert report.call is not None and report.call.confinement == "unconfined"
    (result,) = validate_plan(plane, "P-U").results
    assert result.confinement == "unconfined"
    events = list(plane.store.read_stream("plan:P-U"))
    assert [e.payload.confinement for e in events if isinstance(e.payload, ToolCalled)] == [
        "unconfined"
    ]
    assert [
        e.payload.confinement for e in events if isinstance(e.payload, ValidationResultRecorded)
    ] == ["unconfined"]
    created = events[0].payload
    assert isinstance(created, PlanCreated) and created.global_config.confinement == "none"
    shown = json.loads(run_cli("plan", "show", "P-U", "--json", "--db", url).stdout)
    assert shown["confinement"] == {"policy": "none", "landlock": 0, "unconfined": 2}
    assert shown["plan"]["global_config"]["confinement"] == "none"
    text = run_cli("plan", "show", "P-U", "--db", url).stdout
    assert "UNCONFINED" in text
    history = run_cli("plan", "history", "P-U", "--db", url).stdout
    assert "UNCONFINED" in history
    audited = run_cli("audit", "--json", "--db", url)
    assert audited.returncode == 0 and json.loads(audited.stdout)["unconfined"] == ["P-U"]
    note = run_cli("audit", "--db", url).stdout
    assert "note: ran programs UNCONFINED" in note and "P-U" in note
    page = tmp_path / "report.html"
    assert run_cli("report", "P-U", "--html", str(page), "--db", url).returncode == 0
    assert "unconfined" in page.read_text()


@needs_landlock
def test_a_confined_plan_shows_its_runs_confined(plane: Plane, project: Path) -> None:
    attach(plane, "vprobe", resource=str(project), args={"ops": []})
    _execute(plane, "P-1", project)
    call_tool(plane, "P-1", "probe", {"ops": []})
    validate_plan(plane, "P-1")
    url = plane.store.url
    shown = json.loads(run_cli("plan", "show", "P-1", "--json", "--db", url).stdout)
    assert shown["confinement"] == {"policy": "landlock", "landlock": 2, "unconfined": 0}
    assert "confinement" not in shown["plan"]["global_config"]  # absent: the default
    audited = json.loads(run_cli("audit", "--json", "--db", url).stdout)
    assert audited["unconfined"] == []


def test_an_old_plan_keeps_its_bytes() -> None:
    """A plan created before the option decodes to the default and encodes as it was."""
    from ledger.canonical import canonical_struct
    from ledger.events import GlobalConfig

    created = PlanCreated(plan_id="P", project="p", resources=["r"], global_config=GlobalConfig())
    assert b"confinement" not in canonical_struct(created)
    assert plane_confinement.config_policy(created.global_config) == "landlock"


# -- detection stays, under the opt-out ----------------------------------------------------


@pytest.mark.slow
def test_an_unconfined_mcp_validation_that_writes_is_still_caught(
    plane: Plane, project: Path, no_landlock: None
) -> None:
    server = TESTS / "mcp_validator_server.py"
    register_validation(
        plane,
        {
            "name": "scribbler",
            "mode": "required",
            "mcp_server": "checks",
            "mcp_tool_name": "scribble",
            "mcp_command": [sys.executable, str(server)],
        },
    )
    attach(plane, "scribbler", resource=str(project))
    _execute(plane, "P-U", project, {"confinement": "none"})
    (result,) = validate_plan(plane, "P-U").results
    assert (result.cause, result.changed_paths) == ("read_only_violation", ["scribble.txt"])
    assert result.confinement == "unconfined"
    assert not (project / "scribble.txt").exists()


def test_run_validation_is_read_only_under_confinement(tmp_path: Path, probe: Path) -> None:
    if landlock_abi() < 1:
        pytest.skip("this kernel has no Landlock")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "app.txt").write_text("x\n")
    spec = {
        "executor": "command",
        "command": [sys.executable, str(probe), "{ops}", "--validation"],
    }
    ops = [["write", "new.txt"], ["read", "app.txt"], ["write", str(tree / "app.txt")]]
    run = run_validation(
        spec, {"ops": ops}, str(tree), workdir=tree, confinement=Confinement.of("landlock")
    )
    assert (run.verdict, run.cause, run.changed_paths) == (True, None, [])
    assert run.data == {"0": "EACCES", "1": "ok", "2": "EACCES"}
    assert (tree / "app.txt").read_text() == "x\n"


# -- nothing outlives its call (issue 42) ------------------------------------------------

# Starts a daemon holding ``marker`` in its command line: its own session, a second
# fork, deaf to polite signals (a script's part: it needs os, signal, sys and marker).
START_DAEMON = r"""
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)", marker])
    os._exit(0)
"""
DAEMON = (
    "import os, signal, sys, time\nmarker = sys.argv[1]\n"
    + START_DAEMON
    + 'time.sleep(0.2)\nprint("started")\n'
)


def _with_marker(marker: str) -> list[int]:
    """The processes (anywhere on the machine) whose command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry))
    return found


@contextlib.contextmanager
def _killed_after(marker: str) -> Iterator[None]:
    """Whatever the test finds, no process of ``marker`` is left running after it (on a
    kernel that let one survive, it is not ours to keep)."""
    try:
        yield
    finally:
        for pid in _with_marker(marker):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@needs_landlock
def test_a_daemon_a_tool_starts_ends_with_its_call(tmp_path: Path) -> None:
    marker = f"evidence-survivor-{uuid.uuid4().hex}"
    script = tmp_path / "daemon.py"
    script.write_text(DAEMON)
    confinement = Confinement.of("landlock", read=[str(script)])
    with _killed_after(marker):
        run = run_command(
            [sys.executable, str(script), marker], cwd=tmp_path, timeout_s=20,
            confinement=confinement,
        )  # fmt: skip
        assert run.exit_code == 0 and run.stdout.strip() == b"started", run.stderr
        assert _with_marker(marker) == []


@needs_landlock
def test_without_namespaces_the_launcher_ends_the_daemon_itself(tmp_path: Path) -> None:
    """The fallback where the kernel grants no PID namespace: the launcher is the
    subreaper of what the program starts, and ends what is left when it ends."""
    marker = f"evidence-survivor-{uuid.uuid4().hex}"
    script = tmp_path / "daemon.py"
    script.write_text(DAEMON)
    argv = wrap(
        [sys.executable, str(script), marker], Confinement.of("landlock", read=[str(script)])
    )
    argv.insert(argv.index("--"), "no-namespaces")
    with _killed_after(marker):
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, timeout=20)
        assert done.returncode == 0 and done.stdout.strip() == b"started", done.stderr
        assert _with_marker(marker) == []


@needs_landlock
def test_a_confined_program_reaches_no_abstract_socket_outside(tmp_path: Path, probe: Path) -> None:
    if landlock_abi() < 6:
        pytest.skip("Landlock ABI 6 scopes abstract unix sockets; this kernel has an older ABI")
    name = f"evidence-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind("\0" + name)
        server.listen(1)
        found = _probe(probe, Confinement.of("landlock"), tmp_path, ["connect-abstract", name])
    assert found == {"0": "EPERM"}
