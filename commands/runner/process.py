"""The execution layer: run programs for real, and report what they did.

Pure execution — no database, no events. ``commands.plane.runs`` records what this returns.

Programs run as real subprocesses, never through a shell: an argv template
(``fill_argv``) keeps every element one argv item whatever the argument values contain.
Each program gets its own process group (``start_new_session``) so a timeout kills the
program *and* anything it spawned; leftovers in the group are also killed after a normal
exit, so nothing a validation started can keep running (or writing) behind our back.

Validations (``run_validation``: a program's structured verdict, read-only in a copy of
its tree) are ``validations``'s: they run their programs through ``run_command``.

Output is bounded (``run_command``): of each of stdout and stderr at most a cap is kept
(``max_output_bytes`` of the tool or validation, default ``LIMITS["output"]`` of
``ledger.intake``); the pipes are pumped with one selector and drained to the end, the
rest counted and hashed but never held, so a program printing 300 MB costs the cap, not
300 MB, and never blocks on a full pipe. A stream that went over its cap is reported as a
``Truncation`` (kept, full size, full SHA-256), and a truncated stdout is never parsed: a
prefix is not the document printed (``tool_output`` gives no value; a validation whose
result it carried has no verdict).

POSIX only (process groups, ``killpg``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import select
import selectors
import signal
import string
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from ledger.canonical import CanonicalizationError, canonical_json
from ledger.events import Truncation
from ledger.intake import LIMITS, InputError, parse_json
from ledger.timestamps import utc_now

from .confine import Confinement, exec_failure, launched
from .trees import tree_digest

__all__ = [
    "STDERR_TAIL",
    "ArgvError",
    "RunResult",
    "elapsed_ms",
    "fill_argv",
    "output_cap",
    "parse_output_json",
    "run_command",
    "tool_output",
    "tree_digest",
]


# After SIGKILL the pipes close within milliseconds; only a process that left the group
# (setsid) and kept them open can hold them longer, and we do not wait for it.
_KILL_GRACE_S = 5.0
STDERR_TAIL = 400  # characters of stderr quoted in an error message
_READ_CHUNK = 64 * 1024  # bytes read from a pipe at a time
# exec failures that mean "this program cannot be run here" (not "it ran and failed")
_NOT_RUNNABLE = {
    errno.ENOENT,
    errno.EACCES,
    errno.EPERM,
    errno.ENOEXEC,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.ELOOP,
    errno.ENAMETOOLONG,
}


# -- argv templates ---------------------------------------------------------------------


class ArgvError(ValueError):
    """An argv template could not be filled: a placeholder without a value, a template
    that is not plain ``{name}`` placeholders, or a value no argv item can hold."""


def fill_argv(template: list[str], values: Mapping[str, Any]) -> list[str]:
    """Replace ``{name}`` by ``values[name]``; ``{{``/``}}`` are literal braces.

    A string is used as is; any other value as its JSON text (RFC 8785 canonical, so an
    object always gives the same bytes; integers exactly). Each template element stays
    exactly one argv item: there is no shell and no splitting.
    """
    if not isinstance(template, list) or not template:
        raise ArgvError("the command template is empty: it needs at least a program")
    argv: list[str] = []
    for index, item in enumerate(template):
        if not isinstance(item, str):
            raise ArgvError(f"command[{index}] is not a string")
        try:
            parts = list(string.Formatter().parse(item))
        except ValueError as exc:
            raise ArgvError(
                f"command[{index}] {item!r}: {exc} (write {{{{ and }}}} for literal braces)"
            ) from None
        pieces: list[str] = []
        for literal, field, spec, conversion in parts:
            pieces.append(literal)
            if field is None:
                continue
            if not field.isidentifier() or spec or conversion:
                raise ArgvError(
                    f"command[{index}] {item!r}: placeholder {{{field}}} is not a plain {{name}}"
                )
            if field not in values:
                raise ArgvError(f"no value for placeholder {{{field}}} in command[{index}]")
            pieces.append(_argv_text(field, values[field]))
        arg = "".join(pieces)
        if "\0" in arg:  # execve cannot pass it; refuse rather than truncate
            raise ArgvError(f"command[{index}] would contain a NUL character")
        argv.append(arg)
    return argv


def _argv_text(name: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # exact, even beyond the range canonical JSON allows
    try:
        return canonical_json(value).decode("utf-8")
    except (CanonicalizationError, TypeError) as exc:
        raise ArgvError(f"the value for {{{name}}} has no JSON text: {exc}") from None


# -- running one program ------------------------------------------------------------------


class RunResult(msgspec.Struct, kw_only=True):
    """One execution of a program."""

    argv: list[str]
    exit_code: int | None  # None if it never ran, timed out or was killed by a signal
    stdout: bytes
    stderr: bytes
    started_at: str  # RFC 3339 UTC with microseconds, "...Z"
    ended_at: str
    duration_ms: int
    timed_out: bool = False
    missing_program: str | None = None  # argv[0] when it cannot be found / executed
    error: str | None = None  # e.g. "killed by signal 9 (SIGKILL)"
    signal: int | None = None  # the signal that ended it (not set on a timeout kill)
    # Set when the stream went over the cap: ``stdout``/``stderr`` hold its first bytes.
    stdout_truncated: Truncation | None = None
    stderr_truncated: Truncation | None = None


def output_cap(
    spec: Mapping[str, Any] | None = None, fallback: Mapping[str, Any] | None = None
) -> int:
    """The cap on each output stream of a program: the spec's ``max_output_bytes``, else
    the fallback spec's (a wrapped tool's), else the plane's default (``LIMITS["output"]``,
    ``EVIDENCE_MAX_OUTPUT_BYTES``: an invalid value raises ``InputError``)."""
    for source in (spec, fallback):
        cap = source.get("max_output_bytes") if source else None
        if isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1:
            return cap
    return LIMITS["output"].cap


def truncated_text(truncation: Truncation) -> str:
    """``truncated at N bytes of M``, for reasons and deviations."""
    return f"truncated at {truncation.kept} bytes of {truncation.size}"


class _Capture:
    """One output stream read through its cap: the first ``cap`` bytes are kept, every
    byte is counted and hashed (the full size and SHA-256 are known), none is held
    beyond the cap."""

    __slots__ = ("cap", "digest", "kept", "size")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = bytearray()
        self.size = 0
        self.digest = hashlib.sha256()

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        self.digest.update(data)
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += data[:room]

    def value(self) -> bytes:
        return bytes(self.kept)

    def truncation(self) -> Truncation | None:
        if self.size <= self.cap:
            return None
        return Truncation(kept=len(self.kept), size=self.size, sha256=self.digest.hexdigest())


class _Pipes:
    """A child's pipes pumped by one selector, as ``communicate`` does, but bounded:
    stdin is fed, stdout and stderr are read in chunks through their caps and drained to
    the end (the child never blocks on a full pipe). ``pump`` can be called again after
    it gave up at a deadline: it carries on where it stopped."""

    def __init__(self, proc: subprocess.Popen[bytes], stdin: bytes | None, cap: int) -> None:
        self.out, self.err = _Capture(cap), _Capture(cap)
        self.selector = selectors.DefaultSelector()
        self.stdin = memoryview(stdin or b"")
        self.offset = 0
        if proc.stdin is not None:
            if self.stdin:
                self.selector.register(proc.stdin, selectors.EVENT_WRITE)
            else:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        for pipe, capture in ((proc.stdout, self.out), (proc.stderr, self.err)):
            if pipe is not None:
                self.selector.register(pipe, selectors.EVENT_READ, capture)

    def pump(self, deadline: float | None) -> bool:
        """Until every pipe is closed (True), or ``deadline`` (monotonic) passed (False)."""
        while self.selector.get_map():
            timeout = None if deadline is None else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                return False
            for key, _events in self.selector.select(timeout):
                if key.data is None:
                    self._write(key)
                else:
                    self._read(key)
        return True

    def _write(self, key: selectors.SelectorKey) -> None:
        # At most PIPE_BUF bytes: a write of that size to a writable pipe never blocks.
        try:
            self.offset += os.write(key.fd, self.stdin[self.offset : self.offset + select.PIPE_BUF])
        except BrokenPipeError:  # it stopped reading its input: what it took, it got
            self.offset = len(self.stdin)
        if self.offset >= len(self.stdin):
            self._close(key.fileobj)

    def _read(self, key: selectors.SelectorKey) -> None:
        data = os.read(key.fd, _READ_CHUNK)
        if data:
            key.data.feed(data)
        else:
            self._close(key.fileobj)

    def _close(self, pipe: Any) -> None:
        self.selector.unregister(pipe)
        with contextlib.suppress(OSError):
            pipe.close()

    def close(self) -> None:
        for key in list(self.selector.get_map().values()):
            self._close(key.fileobj)
        self.selector.close()


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def elapsed_ms(since: float) -> int:
    return max(0, round((time.monotonic() - since) * 1000))


def run_command(
    argv: list[str],
    *,
    cwd: Path | None,
    timeout_s: float | None,
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
    max_output_bytes: int | None = None,
    confinement: Confinement | None = None,
) -> RunResult:
    """Run ``argv`` (no shell) in its own process group; never raises for the program's
    sake. On timeout the whole group is killed and ``timed_out`` is set; a program that
    cannot be found or executed gives ``missing_program=argv[0]``. ``env`` (default: this
    process's environment) replaces the environment. A bare ``python`` or ``python3`` is
    the interpreter running the plane, so plan files work in any virtualenv.

    With a ``confinement`` that confines, the program runs under Landlock through the
    launcher (``commands.runner.confine``), with a private temporary directory; a
    program the launcher cannot execute is a ``missing_program`` exactly as here.

    Output is bounded: at most ``max_output_bytes`` (default ``output_cap()``) of each of
    stdout and stderr is kept; the rest is read to the end (counted and hashed, so the
    program never blocks on a full pipe) and the stream's ``*_truncated`` records the
    full size and SHA-256. Memory stays within the caps plus a constant."""
    argv = list(argv)
    if argv[:1] in (["python"], ["python3"]):
        argv[0] = sys.executable
    cap = output_cap() if max_output_bytes is None else max_output_bytes
    if cap < 1:
        raise ValueError("max_output_bytes must be at least 1")
    if not argv or confinement is None or not confinement.confined:
        return _run_command(argv, argv, cwd=cwd, timeout_s=timeout_s, stdin=stdin, env=env, cap=cap)
    with launched(argv, confinement, env) as (launch, child_env):
        run = _run_command(
            argv, launch, cwd=cwd, timeout_s=timeout_s, stdin=stdin, env=child_env, cap=cap
        )
    failed = exec_failure(run.exit_code, run.stderr)
    if failed is None:
        return run
    number, said = failed
    fields: dict[str, Any] = {"exit_code": None, "stdout": b"", "stderr": b""}
    if number in _NOT_RUNNABLE:
        fields.update(missing_program=argv[0], error=f"cannot execute {argv[0]!r}: {said}")
    else:
        fields.update(error=f"cannot start {argv[0]!r}: {said}")
    return msgspec.structs.replace(run, **fields)


def _run_command(
    argv: list[str],
    launch: list[str],
    *,
    cwd: Path | None,
    timeout_s: float | None,
    stdin: bytes | None,
    env: Mapping[str, str] | None,
    cap: int,
) -> RunResult:
    """``run_command``'s work: runs ``launch`` (``argv`` itself, or its confined form),
    reports as ``argv``."""
    started, clock = utc_now(), time.monotonic()

    def result(**fields: Any) -> RunResult:
        fields.setdefault("exit_code", None)
        fields.setdefault("stdout", b"")
        fields.setdefault("stderr", b"")
        return RunResult(
            argv=argv,
            started_at=started,
            ended_at=utc_now(),
            duration_ms=elapsed_ms(clock),
            **fields,
        )

    if not argv:
        return result(error="empty argv: there is no program to run")
    # Checked here so that a bad cwd is not mistaken for a missing program below.
    if cwd is not None and not os.path.isdir(cwd):
        return result(error=f"working directory {os.fspath(cwd)!r} is not a directory")
    try:
        proc = subprocess.Popen(
            launch,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        if exc.errno in _NOT_RUNNABLE:
            return result(
                missing_program=argv[0], error=f"cannot execute {argv[0]!r}: {exc.strerror or exc}"
            )
        return result(error=f"cannot start {argv[0]!r}: {exc}")
    except ValueError as exc:  # e.g. an embedded NUL byte
        return result(error=f"cannot start {argv[0]!r}: {exc}")

    pipes: _Pipes | None = None
    try:
        pipes = _Pipes(proc, stdin, cap)
        timed_out = _wait_or_kill(proc, pipes, argv, timeout_s)
    except BaseException:  # KeyboardInterrupt and the like: leave nothing running
        _kill_group(proc.pid)
        proc.kill()
        proc.wait()
        raise
    finally:
        if pipes is not None:
            pipes.close()
    # Background children it left in its group die with it. (The group id stays reserved
    # by the kernel while any member lives, so this cannot hit a stranger.)
    _kill_group(proc.pid)

    assert pipes is not None
    out, err = pipes.out.value(), pipes.err.value()
    streams = {
        "stdout_truncated": pipes.out.truncation(),
        "stderr_truncated": pipes.err.truncation(),
    }
    code = proc.returncode
    if timed_out:
        return result(
            stdout=out,
            stderr=err,
            timed_out=True,
            **streams,
            error=f"timed out after {timeout_s:g} s (killed with its process group)",
        )
    if code < 0:
        return result(
            stdout=out,
            stderr=err,
            signal=-code,
            **streams,
            error=f"killed by signal {-code} ({_signal_name(-code)})",
        )
    return result(exit_code=code, stdout=out, stderr=err, **streams)


def _wait_or_kill(
    proc: subprocess.Popen[bytes], pipes: _Pipes, argv: list[str], timeout_s: float | None
) -> bool:
    """Read the program's pipes until it ends, within ``timeout_s``; past it, kill its
    group and read on for a grace period (what it printed before is kept). Whether it
    timed out."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        if not pipes.pump(deadline):
            raise subprocess.TimeoutExpired(argv, timeout_s or 0)
        proc.wait(timeout=_remaining(deadline))
        return False
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        grace = time.monotonic() + _KILL_GRACE_S
        try:  # read on: what it printed before the kill is kept
            if not pipes.pump(grace):
                raise subprocess.TimeoutExpired(argv, _KILL_GRACE_S) from None
            proc.wait(timeout=_remaining(grace))
        except subprocess.TimeoutExpired:
            # Something that left the group holds the pipes open: stop reading.
            proc.kill()
            proc.wait()
        return True


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # nobody left in it
        os.killpg(pgid, signal.SIGKILL)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


# -- strict JSON ------------------------------------------------------------------------


def parse_output_json(data: bytes) -> Any:
    """Exactly one JSON document within the input rules of ``ledger.intake`` (UTF-8, no
    duplicate keys, finite numbers, safe integers, depth; whitespace around it allowed).
    ValueError with a readable reason otherwise."""
    if not data.strip():
        raise ValueError("empty (no JSON document)")
    try:
        return parse_json(data, "output", kind=None)  # bounded by its own output cap
    except InputError as exc:
        where = f" at {exc.pointer}" if exc.pointer else ""
        raise ValueError(f"{exc.detail}{where}") from None


def tool_output(result: RunResult) -> tuple[bytes, Any]:
    """A command tool's output: its stdout and parsed value when stdout is one JSON
    document; otherwise the structure ``{exit_code, stdout, stderr}`` (text decoded as
    UTF-8 with replacement) as canonical JSON bytes, and that dict.

    A stdout truncated at its cap is neither: it is the kept bytes as they are, with
    ``None`` for a value. They are never parsed (a prefix of the output is not the
    document it printed), and never wrapped in the structure (which would be JSON)."""
    if result.stdout_truncated is not None:
        return result.stdout, None
    try:
        return result.stdout, parse_output_json(result.stdout)
    except ValueError:
        pass
    structure = {
        "exit_code": result.exit_code,
        "stdout": result.stdout.decode("utf-8", errors="replace"),
        "stderr": result.stderr.decode("utf-8", errors="replace"),
    }
    return canonical_json(structure), structure
