"""The execution layer: run tool and validation programs for real, and report what they did.

Pure execution — no database, no events. ``commands.plane.runs`` records what this returns.

Programs run as real subprocesses, never through a shell: an argv template
(``fill_argv``) keeps every element one argv item whatever the argument values contain.
Each program gets its own process group (``start_new_session``) so a timeout kills the
program *and* anything it spawned; leftovers in the group are also killed after a normal
exit, so nothing a validation started can keep running (or writing) behind our back.

Validations run by ``command``, ``python``, ``wrapped`` or ``mcp`` (a tool of
an MCP server, called through ``mcp_client``, its ``structuredContent`` the return) and
come back as a ``ValidationRun``: a verdict (``passed``) only when the program returned
a well-formed structured result ``{passed: bool, message?: str, data?: object}``; a
timeout, a crash, a malformed return or a missing program is a result
with *no verdict* (``verdict=None``) and a ``cause`` — never a fabricated ``false``. The
caller maps causes to outcomes (a non-verdict is never a blocker: docs/concepts.md).

Read-only enforcement at run time — the decision:

- Every validation runs in its OWN throwaway copy of the working tree
  (``shutil.copytree``, symlinks kept as symlinks), never in the original; in a
  validation run the working tree is the run's snapshot of the sandbox
  (``sandbox.RunSnapshot``), never the live sandbox. The copy is
  digested (relative path -> kind, mode, content sha256 / link target) just before the
  program starts and again after it (and its whole process group) is gone; any added,
  removed or modified path makes the run a ``read_only_violation`` with those paths,
  whatever the validation returned. The copy is then deleted, so no write survives.
- Why a copy per validation rather than one shared tree checked before and after:
  validations run in parallel, and with a shared tree a write by one would be
  seen by all of them — a copy each gives exact attribution, and the original cannot be
  changed through the working directory at all, so there is nothing to roll back.
- Confined (``confinement``, ``commands.runner.confine``): the program reads its copy
  and writes nothing but its private temporary directory, so a write fails in the
  program itself; the digest comparison stays as a second line (and is the only one for
  a plan that opted out of confinement).
- Limits (the caller's to close): unconfined, a program that writes through an absolute
  path to the original (e.g. an argument naming the resource's absolute path) bypasses
  the copy; the caller can compare ``tree_digest`` of the resource before and after a
  batch. Sockets
  and device files are not copied (FIFOs are recreated). Writes outside the tree (HOME,
  /tmp) are not watched. Modification times are not part of the digest. An ``mcp``
  validation's stdio server runs in the copy in a process group of its own, which the
  SDK kills only when the server outlives the close of its stdin: a child it left
  running after exiting cleanly is not killed; a server at ``mcp_url`` runs elsewhere,
  unwatched.
- ``PYTHONDONTWRITEBYTECODE=1`` is set for every validation program: a ``__pycache__``
  written by merely importing code would otherwise be reported as a violation.

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
import json
import os
import select
import selectors
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import msgspec

from ledger.canonical import CanonicalizationError, canonical_json
from ledger.events import Truncation
from ledger.intake import LIMITS, InputError, check_json_value, parse_json
from ledger.timestamps import utc_now

from .confine import Confinement, exec_failure, launched
from .results import TransformError, apply_transform, check_validation_result
from .trees import Entry, tree_digest
from .trees import changed_paths as _changed
from .trees import copy_entry as _copy_entry
from .trees import entries as _entries
from .trees import remove_tree as _remove_tree

__all__ = [
    "ArgvError",
    "Cause",
    "RunResult",
    "ValidationRun",
    "fill_argv",
    "output_cap",
    "run_command",
    "run_parallel",
    "run_validation",
    "tool_output",
    "tree_digest",
]

Cause = Literal[
    "timeout", "crash", "malformed", "missing_program", "read_only_violation", "internal"
]

# After SIGKILL the pipes close within milliseconds; only a process that left the group
# (setsid) and kept them open can hold them longer, and we do not wait for it.
_KILL_GRACE_S = 5.0
_STDERR_TAIL = 400  # characters of stderr quoted in an error message
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


def _elapsed_ms(since: float) -> int:
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
            duration_ms=_elapsed_ms(clock),
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

    timed_out = False
    pipes: _Pipes | None = None
    try:
        pipes = _Pipes(proc, stdin, cap)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            if not pipes.pump(deadline):
                raise subprocess.TimeoutExpired(argv, timeout_s or 0)
            proc.wait(timeout=_remaining(deadline))
        except subprocess.TimeoutExpired:
            timed_out = True
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


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # nobody left in it
        os.killpg(pgid, signal.SIGKILL)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


# -- strict JSON ------------------------------------------------------------------------


def _parse_json(data: bytes) -> Any:
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
        return result.stdout, _parse_json(result.stdout)
    except ValueError:
        pass
    structure = {
        "exit_code": result.exit_code,
        "stdout": result.stdout.decode("utf-8", errors="replace"),
        "stderr": result.stderr.decode("utf-8", errors="replace"),
    }
    return canonical_json(structure), structure


# -- validations ------------------------------------------------------------------------


class ValidationRun(msgspec.Struct, kw_only=True):
    """One validation's result. ``verdict`` is None when there is none (see ``cause``)."""

    verdict: bool | None
    message: str | None = None
    data: dict[str, Any] | None = None
    cause: Cause | None = None
    error: str | None = None
    changed_paths: list[str] = []
    raw_output: bytes | None = None  # what the program/tool printed (for the blob store)
    stderr: bytes | None = None  # what the program wrote on stderr (within its cap), if any
    started_at: str
    ended_at: str
    duration_ms: int
    # The program's stdout / stderr went over the cap (see ``RunResult``).
    stdout_truncated: Truncation | None = None
    stderr_truncated: Truncation | None = None


class _Outcome(msgspec.Struct, kw_only=True):
    """What an executor found, before timestamps and the read-only check."""

    verdict: bool | None = None
    message: str | None = None
    data: dict[str, Any] | None = None
    cause: Cause | None = None
    error: str | None = None
    raw_output: bytes | None = None
    stderr: bytes | None = None
    stdout_truncated: Truncation | None = None
    stderr_truncated: Truncation | None = None


def _streams(run: RunResult, outcome: _Outcome) -> _Outcome:
    """The outcome, with the program's stderr (kept: a failure's reason is often there)
    and what the run records of its streams over the cap."""
    return msgspec.structs.replace(
        outcome,
        stderr=run.stderr or None,
        stdout_truncated=run.stdout_truncated,
        stderr_truncated=run.stderr_truncated,
    )


def _no_verdict(cause: Cause, error: str, raw_output: bytes | None = None) -> _Outcome:
    return _Outcome(cause=cause, error=error, raw_output=raw_output)


def _verdict_from(value: Any, raw_output: bytes | None, source: str) -> _Outcome:
    """A verdict only from a well-formed structured return that the ledger can record."""
    ok, problem = check_validation_result(value)
    if not ok:
        return _no_verdict("malformed", f"{source}: {problem}", raw_output)
    try:
        canonical_json(value)  # the caller records message/data in canonical JSON
    except CanonicalizationError as exc:
        return _no_verdict("malformed", f"{source}: cannot be recorded: {exc}", raw_output)
    return _Outcome(
        verdict=value["passed"],
        message=value.get("message"),
        data=value.get("data"),
        raw_output=raw_output,
    )


class _Internal(Exception):
    """A problem of the inputs or the engine, not of the validation program."""


def run_validation(
    spec: Mapping[str, Any],
    args: Mapping[str, Any],
    resource: str,
    *,
    workdir: Path | None,
    wrapped_tool: Mapping[str, Any] | None = None,
    default_timeout_s: float = 300.0,
    confinement: Confinement | None = None,
) -> ValidationRun:
    """Run one validation in its own copy of ``workdir`` (an empty directory if None) and
    return its result. Never raises: an unexpected error is ``cause="internal"``.

    With a ``confinement`` that confines, its program may read its copy (and what the
    confinement allows) and write nothing but its temporary directory: a write to its
    copy fails in the program, and is still detected here if it got through."""
    started, clock = utc_now(), time.monotonic()
    scratch: Path | None = None
    try:
        scratch = Path(tempfile.mkdtemp(prefix="evidence-validation-"))
        copy = scratch / "work"
        if workdir is None:
            copy.mkdir()
        elif not os.path.isdir(workdir):
            raise _Internal(f"working directory {os.fspath(workdir)!r} is not a directory")
        else:
            shutil.copytree(workdir, copy, symlinks=True, copy_function=_copy_entry)
        before = _entries(copy)
        confined = confinement.adding(lend=(str(copy),)) if confinement is not None else None
        outcome = _execute(spec, args, resource, copy, wrapped_tool, default_timeout_s, confined)
        # The program's process group is dead by now (run_command), so this is final.
        changed = _changed(before, _entries(copy))
        if changed:
            shown = ", ".join(changed[:10]) + (" ..." if len(changed) > 10 else "")
            own = (
                f"passed={outcome.verdict}"
                if outcome.cause is None
                else f"{outcome.cause}: {outcome.error}"
            )
            outcome = _Outcome(
                cause="read_only_violation",
                raw_output=outcome.raw_output,
                stderr=outcome.stderr,
                stdout_truncated=outcome.stdout_truncated,
                stderr_truncated=outcome.stderr_truncated,
                error=f"the validation changed {len(changed)} path(s) of its working tree "
                f"({shown}); a validation is read-only, so its own result ({own}) "
                "is void",
            )
            return _finish(outcome, started, clock, changed)
        return _finish(outcome, started, clock, [])
    except _Internal as exc:
        return _finish(_no_verdict("internal", str(exc)), started, clock, [])
    except Exception as exc:  # never raise: the caller records every validation
        error = f"{type(exc).__name__}: {_one_line(str(exc))}"
        return _finish(_no_verdict("internal", error), started, clock, [])
    finally:
        if scratch is not None:
            _remove_tree(scratch)


def _finish(outcome: _Outcome, started: str, clock: float, changed: list[str]) -> ValidationRun:
    return ValidationRun(
        verdict=outcome.verdict,
        message=outcome.message,
        data=outcome.data,
        cause=outcome.cause,
        error=outcome.error,
        changed_paths=changed,
        raw_output=outcome.raw_output,
        stderr=outcome.stderr,
        started_at=started,
        ended_at=utc_now(),
        duration_ms=_elapsed_ms(clock),
        stdout_truncated=outcome.stdout_truncated,
        stderr_truncated=outcome.stderr_truncated,
    )


def _timeout_s(spec: Mapping[str, Any] | None, default: float) -> float:
    millis = spec.get("timeout_ms") if spec else None
    return millis / 1000 if millis else default


def _validation_env() -> dict[str, str]:
    # An import writing __pycache__ would count as a write to the tree.
    return {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}


def _execute(
    spec: Mapping[str, Any],
    args: Mapping[str, Any],
    resource: str,
    cwd: Path,
    wrapped_tool: Mapping[str, Any] | None,
    default_timeout_s: float,
    confinement: Confinement | None = None,
) -> _Outcome:
    executor = spec.get("executor")
    if executor == "command":
        return _run_command_validation(spec, args, cwd, default_timeout_s, confinement)
    if executor == "python":
        return _run_python_validation(spec, args, resource, cwd, default_timeout_s, confinement)
    if executor == "wrapped":
        return _run_wrapped_validation(
            spec, args, cwd, wrapped_tool, default_timeout_s, confinement
        )
    if executor == "mcp":
        return _run_mcp_validation(spec, args, cwd, default_timeout_s, confinement)
    raise _Internal(f"unknown executor {executor!r} (expected command, python, wrapped or mcp)")


def _with_program(
    confinement: Confinement | None, spec: Mapping[str, Any], key: str
) -> Confinement | None:
    """The confinement of ``spec``'s program (its argv template at ``key``): reading what
    the command names literally too, reaching the TCP ports the spec declares."""
    if confinement is None:
        return None
    template = spec.get(key)
    return confinement.running(
        template if isinstance(template, list) else None, spec.get("network")
    )


def _argv(template: Any, args: Mapping[str, Any], what: str) -> list[str]:
    if template is None:
        raise _Internal(f"{what} has no `command` to run")
    try:
        return fill_argv(template, args)
    except ArgvError as exc:
        raise _Internal(f"cannot build the command line of {what}: {exc}") from None


def _not_run(run: RunResult, what: str) -> _Outcome | None:
    """The non-verdicts that do not depend on what the program printed."""
    if run.timed_out:
        return _no_verdict("timeout", f"{what} {run.error}", run.stdout or None)
    if run.missing_program is not None:
        return _no_verdict("missing_program", f"{what} could not be invoked: {run.error}")
    if run.exit_code is None and run.signal is None:
        raise _Internal(f"{what} could not be started: {run.error}")
    return None


def _run_command_validation(
    spec: Mapping[str, Any],
    args: Mapping[str, Any],
    cwd: Path,
    default_timeout_s: float,
    confinement: Confinement | None = None,
) -> _Outcome:
    argv = _argv(spec.get("command"), args, "the validation")
    run = run_command(
        argv,
        cwd=cwd,
        timeout_s=_timeout_s(spec, default_timeout_s),
        env=_validation_env(),
        max_output_bytes=output_cap(spec),
        confinement=_with_program(confinement, spec, "command"),
    )
    return _streams(run, _judge_command_validation(run))


def _judge_command_validation(run: RunResult) -> _Outcome:
    if (stopped := _not_run(run, "the validation")) is not None:
        return stopped
    if run.stdout_truncated is not None:  # a prefix of a verdict is no verdict
        reason = (
            f"stdout was {truncated_text(run.stdout_truncated)}, over the cap "
            "(`max_output_bytes`); a truncated output is never parsed"
        )
        if run.signal is not None:
            return _no_verdict(
                "crash",
                f"{run.error} without a structured return ({reason}){_stderr_tail(run.stderr)}",
                run.stdout,
            )
        return _unparseable(run, reason)
    try:
        value = _parse_json(run.stdout)
    except ValueError as exc:
        return _unparseable(run, f"stdout is {exc}")
    # A well-formed return wins over the exit code (and over a signal after printing it).
    return _verdict_from(value, run.stdout, "malformed structured return")


def _unparseable(run: RunResult, reason: str) -> _Outcome:
    """No parseable return: a crash if a signal ended it, else a malformed return."""
    tail = _stderr_tail(run.stderr)
    if run.signal is not None:
        return _no_verdict(
            "crash", f"{run.error} without a structured return{tail}", run.stdout or None
        )
    status = f"exited with code {run.exit_code}"
    return _no_verdict(
        "malformed", f"no structured return ({reason}; {status}){tail}", run.stdout or None
    )


def _run_wrapped_validation(
    spec: Mapping[str, Any],
    args: Mapping[str, Any],
    cwd: Path,
    tool: Mapping[str, Any] | None,
    default_timeout_s: float,
    confinement: Confinement | None = None,
) -> _Outcome:
    if tool is None:
        raise _Internal(
            f"validation wraps {spec.get('wraps')!r} but the wrapped tool's "
            "definition was not given"
        )
    if not spec.get("transform"):
        raise _Internal("a wrapped validation needs a `transform`")
    what = f"wrapped tool {spec.get('wraps')!r}"
    argv = _argv(tool.get("command"), args, what)
    # The wrapper's timeout_ms is its copy of the tool's (inherited at registration).
    timeout = _timeout_s(spec if spec.get("timeout_ms") else tool, default_timeout_s)
    run = run_command(
        argv,
        cwd=cwd,
        timeout_s=timeout,
        env=_validation_env(),
        max_output_bytes=output_cap(spec, tool),
        confinement=_with_program(confinement, tool, "command"),
    )
    return _streams(run, _judge_wrapped(spec, run, what))


def _judge_wrapped(spec: Mapping[str, Any], run: RunResult, what: str) -> _Outcome:
    if (stopped := _not_run(run, what)) is not None:
        return stopped
    raw, value = tool_output(run)
    if run.signal is not None:
        return _no_verdict("crash", f"{what} {run.error}{_stderr_tail(run.stderr)}", raw)
    if run.stdout_truncated is not None:  # the transform never sees a prefix
        return _no_verdict(
            "malformed",
            f"{what}: stdout was "
            f"{truncated_text(run.stdout_truncated)}, over the "
            "cap (`max_output_bytes`); a truncated output is "
            "never parsed or transformed",
            raw,
        )
    try:
        result = apply_transform(spec["transform"], value)
    except TransformError as exc:
        return _no_verdict("malformed", str(exc), raw)
    return _verdict_from(result, raw, "the transform's result")


# The child of a python validation. It is a -c string, not a module of this package: the
# working copy comes first on sys.path, and a tree with its own `commands` package (this
# repository, say) must not shadow the runner. The result travels on the original stdout;
# the function's own prints (and its children's) are redirected to stderr.
_PYTHON_CHILD = r"""
import importlib, json, math, os, sys

def one_line(exc):
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

def plain(value, where="result"):
    if value is None or isinstance(value, (bool, str, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where} is {value!r}"
    if isinstance(value, list):
        for i, item in enumerate(value):
            if (problem := plain(item, f"{where}[{i}]")):
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where} has a non-string key {key!r}"
            if (problem := plain(item, f"{where}.{key}")):
                return problem
        return None
    return f"{where} is a {type(value).__name__}, not a JSON value"

def main():
    request = json.loads(sys.stdin.buffer.read())
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(**fields):
        channel.write(json.dumps(fields, allow_nan=False))
        channel.flush()

    sys.path.insert(0, os.getcwd())
    target = request["target"]
    module_name, _, function_path = target.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            return reply(status="missing", error=f"module {module_name!r} not found")
        return reply(status="crash", error=f"importing {module_name}: {one_line(exc)}")
    except BaseException as exc:
        return reply(status="crash", error=f"importing {module_name}: {one_line(exc)}")
    for part in function_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            return reply(status="missing", error=f"{target!r} not found (no {part!r})")
        except BaseException as exc:
            return reply(status="crash", error=f"looking up {target}: {one_line(exc)}")
    if not callable(obj):
        return reply(status="missing", error=f"{target!r} is not callable")
    try:
        value = obj(request["args"], request["resource"])
    except BaseException as exc:
        return reply(status="crash", error=one_line(exc))
    problem = plain(value)
    if problem:
        return reply(status="unserializable", error=problem)
    reply(status="returned", value=value)

main()
"""


def _run_python_validation(
    spec: Mapping[str, Any],
    args: Mapping[str, Any],
    resource: str,
    cwd: Path,
    default_timeout_s: float,
    confinement: Confinement | None = None,
) -> _Outcome:
    target = spec.get("python")
    if not isinstance(target, str) or ":" not in target:
        raise _Internal(f'`python` must be "module:function", got {target!r}')
    if not sys.executable:
        raise _Internal("no Python interpreter to run the validation with (sys.executable)")
    request = json.dumps(
        {"target": target, "args": dict(args), "resource": resource}, allow_nan=False
    ).encode("utf-8")
    # A child process, so a timeout or a hard crash (segfault, os._exit) is contained.
    run = run_command(
        [sys.executable, "-B", "-c", _PYTHON_CHILD],
        cwd=cwd,
        timeout_s=_timeout_s(spec, default_timeout_s),
        stdin=request,
        env=_validation_env(),
        max_output_bytes=output_cap(spec),
        confinement=_with_program(confinement, spec, "python"),
    )
    return _streams(run, _judge_python(run, target))


def _judge_python(run: RunResult, target: str) -> _Outcome:
    what = f"python validation {target}"
    if (stopped := _not_run(run, what)) is not None:
        return stopped
    if run.stdout_truncated is not None:  # never parsed
        cut = (
            f"its reply was {truncated_text(run.stdout_truncated)}, over the cap "
            "(`max_output_bytes`)"
        )
        if run.signal is not None:
            return _no_verdict("crash", f"{what} {run.error}; {cut}{_stderr_tail(run.stderr)}")
        # Its stdout carries only the reply (its prints go to stderr): the value it
        # returned is larger than the cap.
        return _no_verdict(
            "malformed", f"the return value of {target} is too large to record: {cut}"
        )
    try:
        reply = _parse_json(run.stdout)
        status = reply["status"]
    except (ValueError, TypeError, KeyError):
        # It died before replying: os._exit, a signal, an interpreter failure.
        how = run.error if run.signal is not None else f"exited with code {run.exit_code}"
        return _no_verdict("crash", f"{what} {how} without returning{_stderr_tail(run.stderr)}")
    if status == "returned":
        value = reply["value"]
        raw = _json_bytes(value)
        return _verdict_from(value, raw, f"malformed return value of {target}")
    if status == "missing":
        return _no_verdict("missing_program", f"{what} could not be invoked: {reply['error']}")
    if status == "unserializable":
        return _no_verdict("malformed", f"return value of {target} is not JSON: {reply['error']}")
    return _no_verdict("crash", f"{what} raised {reply.get('error')}")


# What a fault of an MCP validation's server is: no verdict, with this cause.
_MCP_CAUSES: dict[str, Cause] = {
    "missing_program": "missing_program",
    "timeout": "timeout",
    "protocol": "malformed",
}


def _run_mcp_validation(
    spec: Mapping[str, Any],
    args: Mapping[str, Any],
    cwd: Path,
    default_timeout_s: float,
    confinement: Confinement | None = None,
) -> _Outcome:
    """Call the validation's MCP tool (a stdio server runs in ``cwd``, the throwaway
    copy, so its writes are seen as any validation's). Its structured return is the
    result's ``structuredContent``; anything else is no verdict."""
    from .mcp_client import call_mcp_tool, capped, json_bytes  # the SDK: only when used

    tool = spec.get("mcp_tool_name")
    if not isinstance(tool, str) or not (spec.get("mcp_command") or spec.get("mcp_url")):
        raise _Internal("an MCP validation needs `mcp_tool_name` and `mcp_command` or `mcp_url`")
    what = f"MCP validation {spec.get('mcp_server')}/{tool}"
    call = call_mcp_tool(
        tool,
        args,
        command=spec.get("mcp_command"),
        url=spec.get("mcp_url"),
        cwd=cwd,
        env=_validation_env(),
        timeout_s=_timeout_s(spec, default_timeout_s),
        confinement=_with_program(confinement, spec, "mcp_command"),
        cap=output_cap(spec),
    )
    if call.truncation is not None and call.kept is not None:  # drained: never judged
        return _Outcome(
            cause="malformed",
            error=f"{what}: its result was {truncated_text(call.truncation)}, over the cap "
            "(`max_output_bytes`); a truncated output is never judged",
            raw_output=call.kept,
            stdout_truncated=call.truncation,
        )
    if call.result is None:  # the server could not be started, died, failed or hung
        return _no_verdict(_MCP_CAUSES.get(call.fault or "", "crash"), f"{what}: {call.error}")
    result = call.result
    structured = result.get("structuredContent")
    failed = result.get("isError") is True
    # The evidence kept: the structured return, or the whole result when there is none.
    kept = structured if structured is not None and not failed else result
    raw, truncation = capped(json_bytes(kept), output_cap(spec))
    if truncation is not None:  # never judged
        return _Outcome(
            cause="malformed",
            error=f"{what}: its result was {truncated_text(truncation)}, over the cap "
            "(`max_output_bytes`); a truncated output is never judged",
            raw_output=raw,
            stdout_truncated=truncation,
        )
    if failed:
        said = _one_line(
            " ".join(
                str(block.get("text", ""))
                for block in result.get("content") or []
                if isinstance(block, dict) and block.get("type") == "text"
            )
        )[:_STDERR_TAIL]
        return _no_verdict(
            "malformed", f"{what}: the tool reported an error (isError): {said or '-'}", raw
        )
    if structured is None:
        return _no_verdict(
            "malformed",
            f"{what}: no structured return (the result has no structuredContent; a "
            "validation returns {passed, message?, data?} there)",
            raw,
        )
    try:
        check_json_value(structured, "structuredContent")
    except InputError as exc:
        return _no_verdict("malformed", f"{what}: {exc}", raw)
    return _verdict_from(structured, raw, f"{what}: malformed structured return")


def _json_bytes(value: Any) -> bytes:
    try:
        return canonical_json(value)
    except CanonicalizationError:  # reported as malformed by _verdict_from
        return json.dumps(value, ensure_ascii=False, sort_keys=True).encode("utf-8", "replace")


def _stderr_tail(stderr: bytes) -> str:
    text = _one_line(stderr.decode("utf-8", errors="replace"))
    if not text:
        return ""
    if len(text) > _STDERR_TAIL:
        text = "..." + text[-_STDERR_TAIL:]
    return f"; stderr: {text}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


# -- trees: copy, digest, compare, remove ---------------------------------------------------


class TreeGuard:
    """A snapshot of a tree, kept while something that must not change it runs (the
    original resource during validations; a plan's sandbox during a tool call whose
    output gate may still fail).

    Validations run in copies, but one that writes through an absolute path (or a
    python validation writing to its ``resource`` argument) could reach the original.
    ``restore_if_changed`` compares the original with the snapshot afterwards and, if
    anything differs, puts the snapshot back byte for byte: no write survives.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._scratch = Path(tempfile.mkdtemp(prefix="evidence-guard-"))
        self._copy = self._scratch / "tree"
        shutil.copytree(self.root, self._copy, symlinks=True, copy_function=_copy_entry)
        self._before = _entries(self.root)

    @property
    def before(self) -> dict[str, Entry]:
        """The tree's entries when the snapshot was taken."""
        return self._before

    def discard(self) -> None:
        """Keep the tree as it is now; drop the snapshot."""
        _remove_tree(self._scratch)

    def restore_if_changed(self) -> list[str]:
        """The changed paths (empty if none); the original is restored when there are."""
        try:
            changed = _changed(self._before, _entries(self.root))
            if changed:
                for name in os.listdir(self.root):
                    path = self.root / name
                    if path.is_dir() and not path.is_symlink():
                        _remove_tree(path)
                    else:
                        path.unlink()
                shutil.copytree(
                    self._copy,
                    self.root,
                    symlinks=True,
                    dirs_exist_ok=True,
                    copy_function=_copy_entry,
                )
                os.chmod(self.root, self._before["."][1])
            return changed
        finally:
            _remove_tree(self._scratch)


# -- parallel runs ----------------------------------------------------------------------


def run_parallel(
    jobs: Sequence[Callable[[], ValidationRun]], *, max_workers: int = 4
) -> list[ValidationRun]:
    """Run validation jobs on a thread pool (each job waits on its own subprocess);
    results in input order. A job that raises yields an ``internal`` result instead, so
    there is always one result per job."""
    if max_workers < 1:
        raise ValueError("max_workers must be at least 1")
    if not jobs:
        return []

    def guarded(job: Callable[[], ValidationRun]) -> ValidationRun:
        started, clock = utc_now(), time.monotonic()
        try:
            return job()
        except Exception as exc:
            error = f"{type(exc).__name__}: {_one_line(str(exc))}"
            return _finish(_no_verdict("internal", error), started, clock, [])

    with ThreadPoolExecutor(
        max_workers=min(max_workers, len(jobs)), thread_name_prefix="validation"
    ) as pool:
        return list(pool.map(guarded, jobs))
