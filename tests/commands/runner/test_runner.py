"""The execution layer (commands.runner.process): real subprocesses, structured returns, timeouts,
crashes, missing programs, wrapped tools, read-only enforcement and parallel runs.

Validator programs are tiny Python scripts written into ``tmp_path`` and run with
``sys.executable``; no database is involved.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import sys
import textwrap
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from commands.runner.process import (
    ArgvError,
    RunResult,
    fill_argv,
    run_command,
    tool_output,
    tree_digest,
)
from commands.runner.validations import ValidationRun, run_parallel, run_validation

PY = sys.executable
MISSING = "definitely-not-a-program-xyz"


# -- helpers ----------------------------------------------------------------------------


def script(tmp_path: Path, name: str, body: str) -> str:
    """Write a Python script outside any working tree; return its absolute path."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def command_spec(argv: list[str], **extra: Any) -> dict[str, Any]:
    return {"executor": "command", "command": argv, **extra}


def emit_spec(tmp_path: Path, stdout: bytes, *, exit_code: int = 0) -> dict[str, Any]:
    """A validation that prints exactly ``stdout`` and exits with ``exit_code``."""
    out = tmp_path / f"out-{hashlib.sha256(stdout).hexdigest()[:12]}-{exit_code}"
    out.write_bytes(stdout)
    emit = script(
        tmp_path,
        "emit.py",
        """\
        import sys
        sys.stdout.buffer.write(open(sys.argv[1], "rb").read())
        sys.exit(int(sys.argv[2]))
    """,
    )
    return command_spec([PY, emit, str(out), str(exit_code)])


def make_tree(root: Path) -> Path:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.txt").write_text("alpha\n")
    (root / "sub" / "b.txt").write_text("beta\n")
    (root / "sub" / "deeper" / "c.bin").write_bytes(bytes(range(256)))
    (root / "empty").mkdir()
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    os.symlink("a.txt", root / "link")
    return root


def snapshot(root: Path) -> dict[str, tuple[int, bytes | str | None]]:
    """Every path with its mode and content (file bytes / link target), for byte-for-byte
    comparisons independent of the runner's own digest."""
    found: dict[str, tuple[int, bytes | str | None]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                found[rel] = (st.st_mode, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = (st.st_mode, None)
            else:
                found[rel] = (st.st_mode, path.read_bytes())
    return found


def parse_ts(text: str) -> datetime:
    assert text.endswith("Z")
    return datetime.fromisoformat(text[:-1] + "+00:00")


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie nobody reaped yet counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def no_verdict(run: ValidationRun, cause: str) -> None:
    assert run.verdict is None, run
    assert run.cause == cause, run
    assert run.error


# -- fill_argv --------------------------------------------------------------------------


def test_fill_argv_strings_and_json_text() -> None:
    template = [
        "prog",
        "{path}",
        "--n={n}",
        "{flag}",
        "{ratio}",
        "{nothing}",
        "{obj}",
        "{items}",
        "{big}",
    ]
    values = {
        "path": "a b; rm -rf /",
        "n": 3,
        "flag": True,
        "ratio": 0.5,
        "nothing": None,
        "obj": {"b": 1, "a": [1, "x"]},
        "items": [],
        "big": 2**60,
    }
    assert fill_argv(template, values) == [
        "prog",
        "a b; rm -rf /",
        "--n=3",
        "true",
        "0.5",
        "null",
        '{"a":[1,"x"],"b":1}',
        "[]",
        str(2**60),
    ]


def test_fill_argv_escapes_and_repeats() -> None:
    assert fill_argv(["echo", "{{x}}", "{{{x}}}", "}}{x}{{", "{x}{x}"], {"x": "v"}) == [
        "echo",
        "{x}",
        "{v}",
        "}v{",
        "vv",
    ]
    assert fill_argv(["plain"], {}) == ["plain"]


def test_fill_argv_missing_placeholder_is_named() -> None:
    with pytest.raises(ArgvError, match=r"\{target\}"):
        fill_argv(["prog", "{present}", "--t={target}"], {"present": 1})
    assert issubclass(ArgvError, ValueError)


@pytest.mark.parametrize(
    "template",
    [
        ["prog", "{"],
        ["prog", "}"],
        ["prog", "{0}"],
        ["prog", "{}"],
        ["prog", "{x!r}"],
        ["prog", "{x:>4}"],
        ["prog", "{x.y}"],
        [],
        ["prog", 3],
    ],
)
def test_fill_argv_refuses_bad_templates(template: list[Any]) -> None:
    with pytest.raises(ArgvError):
        fill_argv(template, {"x": "v"})


def test_fill_argv_refuses_values_no_argv_can_hold() -> None:
    with pytest.raises(ArgvError, match="NUL"):
        fill_argv(["prog", "{x}"], {"x": "a\0b"})
    with pytest.raises(ArgvError, match=r"\{x\}"):
        fill_argv(["prog", "{x}"], {"x": float("nan")})


# -- run_command and tool_output -------------------------------------------------------


def test_run_command_captures_output_and_exit_code(tmp_path: Path) -> None:
    prog = script(
        tmp_path,
        "p.py",
        """\
        import os, sys
        data = sys.stdin.buffer.read()
        sys.stdout.write(os.getcwd() + "|" + data.decode() + "|" + sys.argv[1])
        sys.stderr.write("warn")
        sys.exit(3)
    """,
    )
    result = run_command([PY, prog, "x y"], cwd=tmp_path, timeout_s=30, stdin=b"in")
    assert result.exit_code == 3
    assert result.stdout == f"{tmp_path}|in|x y".encode()
    assert result.stderr == b"warn"
    assert not result.timed_out and result.missing_program is None and result.error is None
    assert parse_ts(result.started_at) <= parse_ts(result.ended_at)


def test_run_command_measures_the_run_it_made(tmp_path: Path) -> None:
    """``duration_ms`` spans the program's own run and lies within the caller's: both
    read the same system-wide monotonic clock, so neither bound depends on load."""
    prog = script(
        tmp_path,
        "p.py",
        """\
        import time
        began = time.monotonic()
        time.sleep(0.05)
        print(repr(time.monotonic() - began))
    """,
    )
    before = time.monotonic()
    result = run_command([PY, prog], cwd=tmp_path, timeout_s=60)
    outside_ms = round((time.monotonic() - before) * 1000)
    inside_ms = round(float(result.stdout) * 1000)
    assert result.exit_code == 0 and inside_ms >= 50
    assert inside_ms <= result.duration_ms <= outside_ms


def test_run_command_missing_program(tmp_path: Path) -> None:
    result = run_command([MISSING, "--help"], cwd=tmp_path, timeout_s=5)
    assert result.missing_program == MISSING
    assert result.exit_code is None and MISSING in (result.error or "")
    not_executable = tmp_path / "plain.txt"
    not_executable.write_text("hello")
    result = run_command([str(not_executable)], cwd=None, timeout_s=5)
    assert result.missing_program == str(not_executable)


def test_run_command_bad_cwd_is_not_a_missing_program(tmp_path: Path) -> None:
    result = run_command([PY, "-c", "pass"], cwd=tmp_path / "nope", timeout_s=5)
    assert result.missing_program is None and result.exit_code is None
    assert "not a directory" in (result.error or "")


@pytest.mark.slow
def test_run_command_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    prog = script(
        tmp_path,
        "spawn.py",
        """\
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open(sys.argv[1], "w").write(str(child.pid))
        print("partial", flush=True)
        time.sleep(60)
    """,
    )
    result = run_command([PY, prog, str(pidfile)], cwd=tmp_path, timeout_s=2.0)
    assert result.timed_out and result.exit_code is None
    assert result.stdout == b"partial\n"  # what it printed before the kill is kept
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child), "the grandchild survived the timeout"


def test_run_command_killed_by_signal(tmp_path: Path) -> None:
    result = run_command(
        [PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
        cwd=None,
        timeout_s=30,
    )
    assert result.exit_code is None and result.signal == signal.SIGKILL
    assert "signal 9" in (result.error or "")


def _result(stdout: bytes, stderr: bytes = b"", exit_code: int | None = 0) -> RunResult:
    return RunResult(
        argv=["x"],
        exit_code=exit_code,
        stdout=stdout,
        stderr=stderr,
        started_at="2026-01-01T00:00:00.000000Z",
        ended_at="2026-01-01T00:00:00.000000Z",
        duration_ms=0,
    )


def test_tool_output_json_document_or_structure() -> None:
    raw = b'{"ok": true, "n": [1, 2]}\n'
    assert tool_output(_result(raw)) == (raw, {"ok": True, "n": [1, 2]})
    data, value = tool_output(_result(b"3 passed\xff", b"err", exit_code=1))
    assert value == {"exit_code": 1, "stdout": "3 passed\ufffd", "stderr": "err"}
    assert json.loads(data) == value
    for not_one_document in (b"", b"{} {}", b"NaN", b'{"a": 1, "a": 2}'):
        assert tool_output(_result(not_one_document))[1]["exit_code"] == 0


# -- structured returns (command executor) ----------------------------------------------


def test_well_formed_return_gives_the_verdict(tmp_path: Path) -> None:
    raw = b'{"passed": true, "message": "247 tests", "data": {"coverage": 94.2}}\n'
    run = run_validation(emit_spec(tmp_path, raw), {}, "repo:x", workdir=None)
    assert run.verdict is True and run.cause is None and run.error is None
    assert run.message == "247 tests" and run.data == {"coverage": 94.2}
    assert run.raw_output == raw and run.changed_paths == []
    failed = run_validation(emit_spec(tmp_path, b'{"passed": false}'), {}, "r", workdir=None)
    assert failed.verdict is False and failed.cause is None and failed.message is None


def test_well_formed_return_wins_over_the_exit_code(tmp_path: Path) -> None:
    spec = emit_spec(tmp_path, b'{"passed": false, "message": "2 failed"}', exit_code=1)
    run = run_validation(spec, {}, "r", workdir=None)
    assert run.verdict is False and run.cause is None and run.message == "2 failed"


@pytest.mark.parametrize(
    ("stdout", "why"),
    [
        (b'{"message": "no verdict"}', "missing `passed`"),
        (b'{"passed": "true"}', "must be a boolean"),
        (b'{"passed": 1}', "must be a boolean"),
        (b'{"passed": true, "score": 3}', "unexpected key"),
        (b'{"passed": true, "message": null}', "`message` must be a string"),
        (b'{"passed": true, "data": [1]}', "`data` must be an object"),
        (b"All tests passed", "not valid JSON"),
        (b'{"passed": true}\n{"passed": true}\n', "more than one JSON document"),
        (b'{"passed": true} trailing', "more than one JSON document"),
        (b'[{"passed": true}]', "must be an object"),
        (b'{"passed": true, "passed": false}', "duplicate key"),
        (b'{"passed": true, "data": {"x": NaN}}', "NaN"),
        (b'{"passed": true, "data": {"x": 1e999}}', "out of range"),
        (b'{"passed": true, "data": {"x": 9007199254740993}}', "2^53"),
        (b'{"passed": true, "message": "\xff"}', "not UTF-8"),
        (b"", "empty"),
        (b"  \n", "empty"),
    ],
)
def test_malformed_or_missing_return_has_no_verdict(
    tmp_path: Path, stdout: bytes, why: str
) -> None:
    run = run_validation(emit_spec(tmp_path, stdout), {}, "r", workdir=None)
    no_verdict(run, "malformed")
    assert why in (run.error or ""), run.error
    assert run.message is None and run.data is None
    assert run.raw_output == (stdout or None)


def test_nonzero_exit_without_return_is_malformed_and_quotes_stderr(tmp_path: Path) -> None:
    prog = script(
        tmp_path,
        "fail.py",
        """\
        import sys
        sys.stderr.write("Traceback: something broke\\n")
        sys.exit(2)
    """,
    )
    run = run_validation(command_spec([PY, prog]), {}, "r", workdir=None)
    no_verdict(run, "malformed")
    assert "exited with code 2" in (run.error or "")
    assert "something broke" in (run.error or "")


def test_arguments_are_filled_into_the_command(tmp_path: Path) -> None:
    prog = script(
        tmp_path,
        "args.py",
        """\
        import json, sys
        print(json.dumps({"passed": sys.argv[1] == "x y" and sys.argv[2] == "7",
                          "data": {"argv": sys.argv[1:]}}))
    """,
    )
    run = run_validation(
        command_spec([PY, prog, "{name}", "{count}"]),
        {"name": "x y", "count": 7},
        "r",
        workdir=None,
    )
    assert run.verdict is True and run.data == {"argv": ["x y", "7"]}


# -- timeouts, crashes, missing programs --------------------------------------------------


def test_timeout_has_no_verdict(tmp_path: Path) -> None:
    prog = script(
        tmp_path,
        "sleep.py",
        """\
        import time
        time.sleep(60)
        print('{"passed": true}')
    """,
    )
    run = run_validation(command_spec([PY, prog], timeout_ms=300), {}, "r", workdir=None)
    no_verdict(run, "timeout")
    assert "timed out" in (run.error or "")


def test_default_timeout_applies_without_timeout_ms(tmp_path: Path) -> None:
    prog = script(tmp_path, "sleep.py", "import time\ntime.sleep(60)\n")
    run = run_validation(command_spec([PY, prog]), {}, "r", workdir=None, default_timeout_s=0.3)
    no_verdict(run, "timeout")


def test_killed_by_signal_is_a_crash(tmp_path: Path) -> None:
    prog = script(
        tmp_path,
        "die.py",
        """\
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)
    """,
    )
    run = run_validation(command_spec([PY, prog]), {}, "r", workdir=None)
    no_verdict(run, "crash")
    assert "signal 9" in (run.error or "")


def test_missing_program_names_it(tmp_path: Path) -> None:
    run = run_validation(command_spec([MISSING, "{x}"]), {"x": 1}, "r", workdir=None)
    no_verdict(run, "missing_program")
    assert MISSING in (run.error or "")


# -- python executor ----------------------------------------------------------------------


CHECKS = """\
import json, os, sys, time

def ok(args, resource):
    print("noise on stdout must not corrupt the result")
    return {"passed": True, "message": resource,
            "data": {"args": args, "files": sorted(os.listdir("."))}}

def failing(args, resource):
    return {"passed": False, "message": "threshold not met"}

def malformed(args, resource):
    return {"passed": "yes"}

def not_json(args, resource):
    return {"passed": True, "data": {"values": (1, 2)}}

def nothing(args, resource):
    return None

def boom(args, resource):
    raise ValueError("boom: the check itself failed")

def hard_exit(args, resource):
    os._exit(7)

def sleepy(args, resource):
    time.sleep(60)

class Group:
    @staticmethod
    def nested(args, resource):
        return {"passed": args["n"] > 1}

not_callable = 3
"""


@pytest.fixture
def checks_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "checks.py").write_text(CHECKS)
    (tree / "data.txt").write_text("x")
    return tree


def python_spec(target: str, **extra: Any) -> dict[str, Any]:
    return {"executor": "python", "python": target, **extra}


def test_python_function_returns_a_verdict(checks_tree: Path) -> None:
    before = snapshot(checks_tree)
    run = run_validation(python_spec("checks:ok"), {"n": 2}, "repo:api", workdir=checks_tree)
    assert run.verdict is True and run.cause is None, run
    assert run.message == "repo:api"
    assert run.data == {"args": {"n": 2}, "files": ["checks.py", "data.txt"]}
    assert json.loads(run.raw_output or b"") == {
        "passed": True,
        "message": "repo:api",
        "data": run.data,
    }
    assert run.changed_paths == []  # importing wrote no __pycache__
    assert snapshot(checks_tree) == before
    nested = run_validation(python_spec("checks:Group.nested"), {"n": 2}, "r", workdir=checks_tree)
    assert nested.verdict is True
    failed = run_validation(python_spec("checks:failing"), {}, "r", workdir=checks_tree)
    assert failed.verdict is False and failed.message == "threshold not met"


@pytest.mark.parametrize(
    ("target", "cause", "why"),
    [
        ("checks:malformed", "malformed", "must be a boolean"),
        ("checks:nothing", "malformed", "must be an object"),
        ("checks:not_json", "malformed", "tuple"),
        ("checks:boom", "crash", "ValueError: boom: the check itself failed"),
        ("checks:hard_exit", "crash", "exited with code 7"),
        ("checks:absent", "missing_program", "checks:absent"),
        ("checks:not_callable", "missing_program", "not callable"),
        ("no_such_module_xyz:check", "missing_program", "no_such_module_xyz"),
    ],
)
def test_python_function_without_verdict(
    checks_tree: Path, target: str, cause: str, why: str
) -> None:
    run = run_validation(python_spec(target), {}, "r", workdir=checks_tree)
    no_verdict(run, cause)
    assert why in (run.error or ""), run.error


def test_python_function_timeout(checks_tree: Path) -> None:
    run = run_validation(python_spec("checks:sleepy", timeout_ms=300), {}, "r", workdir=checks_tree)
    no_verdict(run, "timeout")


# -- wrapped tools ------------------------------------------------------------------------


EXIT_CODE_TRANSFORM = "{passed: exit_code == `0`, message: stdout}"


@pytest.fixture
def exit_tool(tmp_path: Path) -> dict[str, Any]:
    prog = script(
        tmp_path,
        "tool.py",
        """\
        import sys
        print(f"tool says {sys.argv[1]}", end="")
        sys.exit(int(sys.argv[1]))
    """,
    )
    return {"command": [PY, prog, "{code}"], "timeout_ms": None}


def wrapped_spec(transform: str = EXIT_CODE_TRANSFORM, **extra: Any) -> dict[str, Any]:
    return {"executor": "wrapped", "wraps": "tool", "transform": transform, **extra}


def test_wrapped_tool_with_exit_code_transform(exit_tool: dict[str, Any]) -> None:
    passed = run_validation(wrapped_spec(), {"code": 0}, "r", workdir=None, wrapped_tool=exit_tool)
    assert passed.verdict is True and passed.message == "tool says 0" and passed.cause is None
    assert json.loads(passed.raw_output or b"") == {
        "exit_code": 0,
        "stdout": "tool says 0",
        "stderr": "",
    }
    failed = run_validation(wrapped_spec(), {"code": 1}, "r", workdir=None, wrapped_tool=exit_tool)
    assert failed.verdict is False and failed.message == "tool says 1" and failed.cause is None


def test_wrapped_tool_json_output(tmp_path: Path) -> None:
    prog = script(tmp_path, "json_tool.py", 'print(\'{"errors": 0, "files": 12}\')\n')
    tool = {"command": [PY, prog]}
    run = run_validation(
        wrapped_spec("{passed: errors == `0`, data: @}"), {}, "r", workdir=None, wrapped_tool=tool
    )
    assert run.verdict is True and run.data == {"errors": 0, "files": 12}
    assert run.raw_output == b'{"errors": 0, "files": 12}\n'


def test_wrapped_transform_that_yields_no_result_is_malformed(exit_tool: dict[str, Any]) -> None:
    for transform in ("{passed: stdout}", "{ok: `true`}", "exit_code"):
        run = run_validation(
            wrapped_spec(transform), {"code": 0}, "r", workdir=None, wrapped_tool=exit_tool
        )
        no_verdict(run, "malformed")
        assert run.raw_output is not None


def test_wrapped_tool_missing_program_and_timeout(tmp_path: Path) -> None:
    run = run_validation(wrapped_spec(), {}, "r", workdir=None, wrapped_tool={"command": [MISSING]})
    no_verdict(run, "missing_program")
    assert MISSING in (run.error or "")
    prog = script(tmp_path, "slow_tool.py", "import time\ntime.sleep(60)\n")
    # The wrapper inherits timeout_ms from the tool; either one bounds the run.
    run = run_validation(
        wrapped_spec(),
        {},
        "r",
        workdir=None,
        wrapped_tool={"command": [PY, prog], "timeout_ms": 300},
    )
    no_verdict(run, "timeout")
    run = run_validation(
        wrapped_spec(timeout_ms=300),
        {},
        "r",
        workdir=None,
        wrapped_tool={"command": [PY, prog], "timeout_ms": None},
    )
    no_verdict(run, "timeout")


# -- read-only enforcement ----------------------------------------------------------------


WRITERS = {
    "adds": (
        "open('new.txt', 'w').write('x'); import os; os.mkdir('newdir')",
        ["new.txt", "newdir"],
    ),
    "modifies": ("open('a.txt', 'a').write('more')", ["a.txt"]),
    "deletes": ("import os; os.remove('sub/b.txt')", ["sub/b.txt"]),
    "chmods": ("import os; os.chmod('sub/b.txt', 0o600)", ["sub/b.txt"]),
    "relinks": ("import os; os.remove('link'); os.symlink('sub/b.txt', 'link')", ["link"]),
    "removes_dir": (
        "import shutil; shutil.rmtree('sub/deeper')",
        ["sub/deeper", "sub/deeper/c.bin"],
    ),
    # Unlistable for a normal user (its entries vanish from the digest); root still lists it.
    "locks_dir": (
        "import os; os.chmod('sub', 0)",
        ["sub"] if os.geteuid() == 0 else ["sub", "sub/b.txt", "sub/deeper", "sub/deeper/c.bin"],
    ),
}


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_writes_are_violations_and_never_reach_the_original(tmp_path: Path, kind: str) -> None:
    tree = make_tree(tmp_path / "tree")
    (tree / "sub" / "b.txt").chmod(0o644)
    before_digest, before = tree_digest(tree), snapshot(tree)
    code, expected = WRITERS[kind]
    # It reports a pass: the write voids it all the same.
    prog = script(tmp_path, "writer.py", f"{code}\nprint('{{\"passed\": true}}')\n")
    run = run_validation(command_spec([PY, prog]), {}, str(tree), workdir=tree)
    no_verdict(run, "read_only_violation")
    assert run.changed_paths == expected
    assert "passed=True" in (run.error or "")
    assert tree_digest(tree) == before_digest
    assert snapshot(tree) == before


def test_clean_validation_passes_and_tree_stays_identical(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    before_digest, before = tree_digest(tree), snapshot(tree)
    prog = script(
        tmp_path,
        "reader.py",
        """\
        import json, os
        content = open("sub/deeper/c.bin", "rb").read()
        ok = (open("a.txt").read() == "alpha\\n" and len(content) == 256
              and os.readlink("link") == "a.txt" and os.access("run.sh", os.X_OK))
        print(json.dumps({"passed": ok, "data": {"cwd_is_copy": os.getcwd()}}))
    """,
    )
    run = run_validation(command_spec([PY, prog]), {}, str(tree), workdir=tree)
    assert run.verdict is True and run.cause is None and run.changed_paths == []
    assert run.data is not None and Path(run.data["cwd_is_copy"]) != tree
    assert not Path(run.data["cwd_is_copy"]).exists(), "the copy was not deleted"
    assert tree_digest(tree) == before_digest
    assert snapshot(tree) == before


def test_without_workdir_runs_in_an_empty_directory(tmp_path: Path) -> None:
    prog = script(
        tmp_path,
        "empty.py",
        """\
        import json, os
        print(json.dumps({"passed": os.listdir(".") == []}))
    """,
    )
    assert run_validation(command_spec([PY, prog]), {}, "r", workdir=None).verdict is True
    writer = script(tmp_path, "w.py", "open('x', 'w').close()\nprint('{\"passed\": true}')\n")
    run = run_validation(command_spec([PY, writer]), {}, "r", workdir=None)
    no_verdict(run, "read_only_violation")
    assert run.changed_paths == ["x"]


def test_workdir_that_is_not_a_directory_is_internal(tmp_path: Path) -> None:
    run = run_validation(
        emit_spec(tmp_path, b'{"passed": true}'), {}, "r", workdir=tmp_path / "gone"
    )
    no_verdict(run, "internal")


def test_tree_digest_sees_content_mode_and_structure(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    digest = tree_digest(tree)
    assert len(digest) == 64 and digest == tree_digest(tree)
    assert tree_digest(make_tree(tmp_path / "twin")) == digest  # only content counts
    changes = [
        lambda: (tree / "a.txt").write_text("ALPHA\n"),
        lambda: (tree / "run.sh").chmod(0o644),
        lambda: (tree / "empty" / "d").mkdir(),
        lambda: (tree / "link").unlink() or os.symlink("run.sh", tree / "link"),
    ]
    seen = {digest}
    for change in changes:
        change()
        seen.add(tree_digest(tree))
    assert len(seen) == len(changes) + 1
    with pytest.raises(NotADirectoryError):
        tree_digest(tree / "a.txt")


# -- never raises -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        {"executor": "mcp"},
        {"executor": "command", "command": ["prog", "{absent}"]},
        {"executor": "command"},
        {"executor": "wrapped", "wraps": "t", "transform": "@"},  # no wrapped tool given
        {"executor": "python", "python": "no-colon"},
    ],
)
def test_unexpected_problems_are_internal_results(spec: dict[str, Any]) -> None:
    run = run_validation(spec, {}, "r", workdir=None)
    no_verdict(run, "internal")


# -- parallel runs ----------------------------------------------------------------------


def test_run_parallel_keeps_order_and_overlaps(tmp_path: Path) -> None:
    """The three jobs run at once (each meets the others at a barrier before it runs its
    program: run one at a time, the barrier breaks after a generous wait and the results
    say so), and the results come back in input order although the first job finishes
    last (it waits for the other two to have finished). Events, not timing."""
    prog = script(
        tmp_path,
        "say.py",
        """\
        import json, sys
        print(json.dumps({"passed": True, "message": sys.argv[1]}))
    """,
    )
    running = threading.Barrier(3, timeout=60)
    finished = [threading.Event() for _ in range(3)]

    def job(index: int) -> Any:
        def run() -> ValidationRun:
            running.wait()
            if index == 0:
                assert finished[1].wait(60) and finished[2].wait(60)
            result = run_validation(command_spec([PY, prog, str(index)]), {}, "r", workdir=None)
            finished[index].set()
            return result

        return run

    runs = run_parallel([job(0), job(1), job(2)], max_workers=3)
    assert [(r.verdict, r.message) for r in runs] == [(True, "0"), (True, "1"), (True, "2")], runs
    assert all(e.is_set() for e in finished)


def test_run_parallel_turns_a_raising_job_into_an_internal_result() -> None:
    def broken() -> ValidationRun:
        raise RuntimeError("bug in the job")

    runs = run_parallel([broken], max_workers=2)
    no_verdict(runs[0], "internal")
    assert "bug in the job" in (runs[0].error or "")
    assert run_parallel([]) == []
    with pytest.raises(ValueError):
        run_parallel([broken], max_workers=0)
