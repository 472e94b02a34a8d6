"""Validations: a program's structured verdict on the plan's work, read-only.

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

POSIX only, like ``process``, whose ``run_command`` runs every program here.
"""

from __future__ import annotations

import json
import os
import shutil
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
from ledger.intake import InputError, check_json_value
from ledger.timestamps import utc_now

from .confine import Confinement
from .process import (
    STDERR_TAIL,
    ArgvError,
    RunResult,
    elapsed_ms,
    fill_argv,
    output_cap,
    parse_output_json,
    run_command,
    tool_output,
    truncated_text,
)
from .results import TransformError, apply_transform, check_validation_result
from .trees import changed_paths as _changed
from .trees import copy_entry as _copy_entry
from .trees import entries as _entries
from .trees import remove_tree as _remove_tree

__all__ = ["Cause", "ValidationRun", "run_parallel", "run_validation"]

Cause = Literal[
    "timeout", "crash", "malformed", "missing_program", "read_only_violation", "internal"
]


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
        duration_ms=elapsed_ms(clock),
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
        value = parse_output_json(run.stdout)
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
        reply = parse_output_json(run.stdout)
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
        )[:STDERR_TAIL]
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
    if len(text) > STDERR_TAIL:
        text = "..." + text[-STDERR_TAIL:]
    return f"; stderr: {text}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


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
