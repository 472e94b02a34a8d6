"""Tool and validation output is bounded (issue 16, item 2).

Attack first: a program that prints 50 MB must cost the plane its cap, not 50 MB (and
not a 50 MB blob); what went over the cap is recorded (full size and SHA-256), and a
truncated stdout is never parsed — not by the output gate, not as a validation's verdict
(a prefix can be a valid document that is not the one printed)."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import msgspec
import pytest

from commands.auditor.audit import audit
from commands.plane import CommandRefused, Plane
from commands.plane.attachments import attach
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool, register_validation
from commands.plane.runs import call_tool
from commands.plane.validation_runs import validate_plan
from commands.runner.process import run_command
from commands.runner.validations import run_validation
from ledger.canonical import canonical_struct
from ledger.events import GateChecked, ToolCalled, Truncation, ValidationResultRecorded
from tests.helpers import REPO, forge, invoke

PY = sys.executable
BIG = 50 * 1024 * 1024  # 50 MB of output
CAP = 64 * 1024  # the small cap of these tests
OBJECT = {"type": "object"}


def xs(n: int) -> list[str]:
    """A command printing ``n`` bytes of ``x`` (no shell quoting needed by the plane)."""
    return ["sh", "-c", f"head -c {n} /dev/zero | tr '\\0' x"]


def padded(document: str, n: int) -> list[str]:
    """A command printing ``document`` then ``n`` spaces: still one valid JSON document
    in full, and so is every prefix that holds the document. Braces are doubled: the
    command is an argv template."""
    doc = document.replace("{", "{{").replace("}", "}}")
    return ["sh", "-c", f"printf '%s' '{doc}'; head -c {n} /dev/zero | tr '\\0' ' '"]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "a.txt").write_text("a\n")
    return root


@pytest.fixture
def plane(db_url: str, project: Path):
    with Plane.open(db_url) as p:
        create_plan(p, "P-1", project="api", resources=[str(project)])
        yield p


def _execute(plane: Plane) -> None:
    record_strategy(plane, "P-1", "look")
    enter_execute(plane, "P-1")


# -- tool calls ---------------------------------------------------------------------------


def test_a_tool_printing_50_mb_is_recorded_truncated_at_its_cap(plane: Plane) -> None:
    register_tool(
        plane,
        {"name": "noisy", "command": xs(BIG), "output_schema": OBJECT, "max_output_bytes": CAP},
    )
    _execute(plane)
    report = call_tool(plane, "P-1", "noisy", b"{}")
    call = report.call
    assert call is not None and call.exit_code == 0
    # The blob is the kept bytes (the cap), never the 50 MB.
    blob = plane.store.get_blob(call.output_sha256)
    assert blob == b"x" * CAP
    # The event records the full size and the full output's digest.
    assert call.stdout_truncated == Truncation(kept=CAP, size=BIG, sha256=sha256(b"x" * BIG))
    assert call.stderr_truncated is msgspec.UNSET  # stderr stayed under its cap
    stored = [e.payload for e in plane.store.read_stream("plan:P-1") if e.type == "tool.called"]
    assert stored == [call]
    # The output gate judged it not JSON, and says where it was cut.
    gate = report.output_gate
    assert gate is not None and not gate.passed
    (deviation,) = gate.check.deviations
    assert (deviation.kind, deviation.actual_type) == ("wrong_type", "invalid_json")
    assert f"truncated at {CAP} bytes of {BIG}" in deviation.expected
    assert gate.check.checked_truncated == call.stdout_truncated
    assert gate.check.checked_sha256 == call.output_sha256
    # An auditor re-derives the same verdict from the recorded bytes.
    assert audit(plane.store).ok


def test_a_truncated_stdout_that_is_a_valid_prefix_is_still_not_json(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # '{}' then 1 MiB of spaces: the kept 64 KiB are a valid object, which the schema
    # admits. They are not what the tool printed in full, so they are never parsed.
    monkeypatch.setenv("EVIDENCE_MAX_OUTPUT_BYTES", str(CAP))
    register_tool(
        plane, {"name": "padded", "command": padded("{}", 1 << 20), "output_schema": OBJECT}
    )
    _execute(plane)
    report = call_tool(plane, "P-1", "padded", b"{}")
    assert report.call is not None
    assert report.call.stdout_truncated.size == 2 + (1 << 20)
    kept = plane.store.get_blob(report.call.output_sha256)
    assert kept is not None and len(kept) == CAP and json.loads(kept) == {}
    assert not report.ok
    (deviation,) = report.output_gate.check.deviations
    assert deviation.actual_type == "invalid_json" and "truncated" in deviation.expected
    assert audit(plane.store).ok


def test_a_forged_pass_on_truncated_bytes_is_caught_by_the_audit(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVIDENCE_MAX_OUTPUT_BYTES", str(CAP))
    register_tool(
        plane, {"name": "padded", "command": padded("{}", 1 << 20), "output_schema": OBJECT}
    )
    _execute(plane)
    report = call_tool(plane, "P-1", "padded", b"{}", step="s1")
    check = report.output_gate.check
    doc = plane.state("plan:P-1").doc
    # An agent holding the database appends a passing output gate on the same bytes,
    # without saying they were truncated: a re-check of the bytes alone would pass.
    (position,) = forge(
        plane.store,
        "plan:P-1",
        GateChecked(
            plan_id="P-1",
            gate="output",
            tool="padded",
            tool_version=1,
            step="s1",
            schema_sha256=check.schema_sha256,
            verdict="pass",
            deviations=[],
            attempt=doc.attempt,
            iteration=doc.iteration,
            strict_mode=False,
            checked_sha256=check.checked_sha256,
        ),
    )
    found = audit(plane.store, read_models=False)
    assert [(v.position, v.invariant) for v in found.violations] == [
        (position, "gate_rederivation")
    ]


def test_stderr_is_capped_too_and_the_rest_of_the_output_is_kept(plane: Plane) -> None:
    noisy = ["sh", "-c", f"echo out; head -c {BIG} /dev/zero | tr '\\0' e >&2; exit 3"]
    register_tool(plane, {"name": "loud", "command": noisy, "max_output_bytes": CAP})
    _execute(plane)
    report = call_tool(plane, "P-1", "loud", b"{}")
    call = report.call
    assert call is not None and call.exit_code == 3
    assert call.stdout_truncated is msgspec.UNSET
    assert call.stderr_truncated == Truncation(kept=CAP, size=BIG, sha256=sha256(b"e" * BIG))
    structure = json.loads(plane.store.get_blob(call.output_sha256))
    assert structure == {"exit_code": 3, "stdout": "out\n", "stderr": "e" * CAP}


def test_the_cap_defaults_to_the_environment_and_a_bad_value_is_refused(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_tool(plane, {"name": "noisy", "command": xs(1 << 20)})
    _execute(plane)
    monkeypatch.setenv("EVIDENCE_MAX_OUTPUT_BYTES", "1000")
    call = call_tool(plane, "P-1", "noisy", b"{}").call
    assert call is not None and call.stdout_truncated.kept == 1000
    assert call.stdout_truncated.size == 1 << 20
    size = plane.store.head().size
    monkeypatch.setenv("EVIDENCE_MAX_OUTPUT_BYTES", "lots")
    with pytest.raises(CommandRefused, match="EVIDENCE_MAX_OUTPUT_BYTES"):
        call_tool(plane, "P-1", "noisy", b"{}")
    assert plane.store.head().size == size  # refused before anything was recorded


def test_output_within_the_cap_records_no_truncation_and_keeps_its_bytes(plane: Plane) -> None:
    register_tool(
        plane,
        {
            "name": "small",
            "command": padded('{"n": 1}', 10),
            "output_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
            "max_output_bytes": 18,
        },
    )
    _execute(plane)
    report = call_tool(plane, "P-1", "small", b"{}")
    assert report.ok  # exactly at the cap: nothing was cut
    assert report.call.stdout_truncated is msgspec.UNSET
    assert report.output_gate.check.checked_truncated is msgspec.UNSET
    for event in plane.store.read_stream("plan:P-1"):
        assert b"truncated" not in canonical_struct(event.payload)


# -- validations ----------------------------------------------------------------------------


def _validate(plane: Plane, project: Path, spec: dict) -> ValidationResultRecorded:
    register_validation(plane, {"name": "v", "mode": "required", **spec})
    attach(plane, "v", resource=str(project))
    _execute(plane)
    report = validate_plan(plane, "P-1")
    assert report.outcome == "validator_error", report.to_json()
    (result,) = report.results
    return result


def test_a_command_validation_printing_50_mb_has_no_verdict(plane: Plane, project: Path) -> None:
    result = _validate(plane, project, {"command": xs(BIG), "max_output_bytes": CAP})
    assert result.verdict is None and result.cause == "malformed"
    assert f"truncated at {CAP} bytes of {BIG}" in (result.error or "")
    assert result.stdout_truncated == Truncation(kept=CAP, size=BIG, sha256=sha256(b"x" * BIG))
    assert plane.store.get_blob(result.raw_output_sha256) == b"x" * CAP
    halt = plane.state("plan:P-1").doc.halt
    assert (halt.halt_type, halt.raw_halt_type) == ("validator_error", "malformed")
    assert audit(plane.store).ok


def test_a_truncated_verdict_is_never_a_pass(
    plane: Plane, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In full it is a well-formed passing result (trailing whitespace is allowed), and
    # so is its kept prefix: but the plane did not read all of it, so it has no verdict.
    monkeypatch.setenv("EVIDENCE_MAX_OUTPUT_BYTES", str(CAP))
    result = _validate(plane, project, {"command": padded('{"passed": true}', 1 << 20)})
    assert result.verdict is None and result.cause == "malformed"
    assert f"truncated at {CAP} bytes" in (result.error or "")
    assert result.stdout_truncated.size == len('{"passed": true}') + (1 << 20)


def test_a_wrapped_tool_over_its_cap_is_never_transformed(
    plane: Plane, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The wrapped tool's own cap applies when the wrapper sets none.
    register_tool(
        plane,
        {"name": "lister", "command": padded('{"ok": true}', 1 << 20), "max_output_bytes": CAP},
    )
    result = _validate(plane, project, {"wraps": "lister", "transform": "{passed: ok}"})
    assert result.verdict is None and result.cause == "malformed"
    assert "never parsed or transformed" in (result.error or "")
    assert result.stdout_truncated.kept == CAP
    assert audit(plane.store).ok


def test_a_python_validation_returning_more_than_its_cap_is_malformed(tmp_path: Path) -> None:
    (tmp_path / "checks.py").write_text(
        textwrap.dedent("""\
        def huge(args, resource):
            return {"passed": True, "message": "y" * 1_000_000}
    """)
    )
    spec = {"executor": "python", "python": "checks:huge", "max_output_bytes": CAP}
    run = run_validation(spec, {}, "r", workdir=tmp_path)
    assert run.verdict is None and run.cause == "malformed"
    assert "too large to record" in (run.error or "")
    assert run.stdout_truncated is not None and run.stdout_truncated.kept == CAP


def test_a_validation_called_as_a_tool_records_the_truncation(plane: Plane) -> None:
    register_validation(
        plane, {"name": "v", "mode": "required", "command": xs(1 << 20), "max_output_bytes": CAP}
    )
    _execute(plane)
    report = call_tool(plane, "P-1", "v", b"{}")
    assert report.call is not None and report.call.executor == "validation"
    assert report.call.stdout_truncated.size == 1 << 20
    returned = json.loads(plane.store.get_blob(report.call.output_sha256))
    assert returned["cause"] == "malformed" and "truncated" in returned["error"]
    assert not report.ok


# -- the registry key -----------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 2**53, True, "65536", 1.5, None])
def test_max_output_bytes_must_be_a_positive_safe_integer(db_url: str, value: object) -> None:
    with Plane.open(db_url) as plane:
        spec = {"name": "t", "command": ["true"], "max_output_bytes": value}
        if value is None:  # null is "not set", as for every optional key
            assert "max_output_bytes" not in register_tool(plane, spec).document["spec"]
            return
        with pytest.raises(CommandRefused, match="max_output_bytes"):
            register_tool(plane, spec)
        with pytest.raises(CommandRefused, match="max_output_bytes"):
            register_validation(plane, {**spec, "mode": "required"})
        assert plane.store.head().size == 0


def test_max_output_bytes_is_versioned_shown_and_absent_when_unset(
    db_url: str, tmp_path: Path
) -> None:
    with Plane.open(db_url) as plane:
        first = register_tool(plane, {"name": "t", "command": ["true"]})
        assert "max_output_bytes" not in first.document["spec"]
        (event,) = plane.store.read_stream("tool:t")
        assert b"max_output_bytes" not in canonical_struct(event.payload)
        capped = register_tool(
            plane, {"name": "t", "command": ["true"], "max_output_bytes": 2**53 - 1}
        )
        assert (capped.version, capped.changed) == (2, True)
        assert capped.document["spec"]["max_output_bytes"] == 2**53 - 1
        again = register_tool(
            plane, {"name": "t", "command": ["true"], "max_output_bytes": 2**53 - 1}
        )
        assert again.changed is False
    (tmp_path / "t.json").write_text(
        json.dumps({"name": "t", "command": ["true"], "max_output_bytes": 1024})
    )
    assert invoke("tool", "register", str(tmp_path / "t.json"), "--db", db_url).exit_code == 0
    shown = invoke("tool", "show", "t", "--db", db_url)
    assert shown.exit_code == 0 and "max_output_bytes" in shown.stdout
    assert "1024" in shown.stdout
    as_json = json.loads(invoke("tool", "show", "t", "--json", "--db", db_url).stdout)
    assert as_json["tool"]["spec"]["max_output_bytes"] == 1024
    old = json.loads(invoke("tool", "show", "t", "--version", "1", "--json", "--db", db_url).stdout)
    assert "max_output_bytes" not in old["tool"]["spec"]


def test_events_without_the_new_fields_decode_and_keep_their_bytes() -> None:
    old = (
        b'{"attempt":1,"call_id":"c","duration_ms":1,"ended_at":"e","executor":"command",'
        b'"exit_code":0,"output_sha256":"o","params_sha256":"p","plan_id":"P",'
        b'"started_at":"s","step":null,"tool":"t","tool_version":1,"type":"tool.called"}'
    )
    decoded = msgspec.json.decode(old, type=ToolCalled)
    assert decoded.stdout_truncated is msgspec.UNSET
    assert canonical_struct(decoded) == old
    # Present only when set; never null.
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(old[:-1] + b',"stdout_truncated":null}', type=ToolCalled)


# -- the runner: memory, timeouts, kills ----------------------------------------------------


MEMORY_PROBE = """
import resource, subprocess, sys

def vm_size():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024

from commands.runner.process import run_command

argv = ["sh", "-c", "head -c %(big)d /dev/zero | tr '\\\\0' x"]
limit = vm_size() + %(margin)d  # the interpreter as it is now, plus a margin
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    if sys.argv[1] == "bounded":
        result = run_command(argv, cwd=None, timeout_s=120)  # the cap from the environment
        print(len(result.stdout), result.stdout_truncated.size)
    else:  # what communicate() does: everything in memory
        done = subprocess.run(argv, capture_output=True, timeout=120)
        print(len(done.stdout), len(done.stdout))
except MemoryError:
    print("MemoryError")
"""


def test_memory_stays_within_the_cap_plus_a_constant(tmp_path: Path) -> None:
    # Measured: after the imports the probe's bounded run peaks ~2 MiB above where it
    # started (1 MiB kept + a read chunk); communicate() needs ~2 x 50 MB (chunks, then
    # their join). A 32 MiB margin is ample for the one and far too little for the other.
    margin = 32 << 20
    probe = tmp_path / "probe.py"
    probe.write_text(MEMORY_PROBE % {"big": BIG, "margin": margin})
    env = {
        "EVIDENCE_MAX_OUTPUT_BYTES": str(1 << 20),
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
    }

    def run(mode: str) -> str:
        done = subprocess.run(
            [PY, str(probe), mode], capture_output=True, text=True, env=env, timeout=180
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run("communicate") == "MemoryError"  # the limit is one reading all would blow
    assert run("bounded") == f"{1 << 20} {BIG}"


@pytest.mark.slow
def test_a_timeout_keeps_the_kept_bytes_and_kills_the_group(tmp_path: Path) -> None:
    prog = tmp_path / "p.py"
    prog.write_text(
        textwrap.dedent("""\
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open(sys.argv[1], "w").write(str(child.pid))
        sys.stdout.write("x" * 300_000)
        sys.stdout.flush()
        time.sleep(60)
    """)
    )
    pidfile = tmp_path / "child.pid"
    result = run_command(
        [PY, str(prog), str(pidfile)], cwd=tmp_path, timeout_s=2.0, max_output_bytes=CAP
    )
    assert result.timed_out and result.exit_code is None and result.signal is None
    assert result.stdout == b"x" * CAP
    assert result.stdout_truncated == Truncation(
        kept=CAP, size=300_000, sha256=sha256(b"x" * 300_000)
    )
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the grandchild survived the timeout"


def test_a_killed_program_over_its_cap(tmp_path: Path) -> None:
    code = (
        "import os, signal, sys; sys.stdout.write('x' * 200_000); sys.stdout.flush(); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    result = run_command([PY, "-c", code], cwd=None, timeout_s=30, max_output_bytes=CAP)
    assert result.signal == signal.SIGKILL and result.exit_code is None
    assert result.stdout_truncated is not None and result.stdout_truncated.size == 200_000
    assert len(result.stdout) == CAP


def test_large_stdin_and_large_output_do_not_deadlock(tmp_path: Path) -> None:
    # It reads all of its 4 MiB of input before writing 8 MiB to each stream: neither
    # side may wait on the other's full pipe.
    code = (
        "import sys; data = sys.stdin.buffer.read(); "
        "sys.stderr.buffer.write(b'e' * (2 * len(data))); "
        "sys.stdout.buffer.write(data * 2)"
    )
    data = b"i" * (4 << 20)
    result = run_command([PY, "-c", code], cwd=None, timeout_s=60, stdin=data, max_output_bytes=CAP)
    assert result.exit_code == 0
    assert result.stdout == b"i" * CAP and result.stdout_truncated.size == 8 << 20
    assert result.stdout_truncated.sha256 == sha256(data * 2)
    assert result.stderr_truncated.size == 8 << 20
    # A program that never reads its input does not hang the plane either.
    quiet = run_command(["true"], cwd=None, timeout_s=30, stdin=data)
    assert quiet.exit_code == 0 and quiet.stdout == b""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
