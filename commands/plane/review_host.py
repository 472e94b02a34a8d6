"""The review host: advisory reviews (docs/reviews.md) that run themselves.

``evidence review start|submit|account`` record the steps of a review a person drives by
hand. ``run_review`` hands the same steps to reviewer programs, named in a strict
reviewers configuration (``load_reviewers``), and runs them as a background task:

1. **Preflight** (``run_review``): the request is normalised and checked, the reviewers
   configuration too, every scope entry must name a file or directory inside the
   repository, and every program must be runnable. Only then are ``review.started`` and
   ``review.host_scheduled`` (the configuration exactly as it will run, its SHA-256 and
   the repository) committed together; the task id is the receipt, returned after the
   commit, and a detached host process (``evidence review host TASK``) is started.
2. **The host** (``host_review``) copies the scope once, then runs every candidate in
   parallel, each in its own throwaway copy of that scope (the inspect policy: it reads
   the repository as it was when the host took it; a write to its copy voids its report,
   as a validation's write voids its result). The evaluator, the repair and the merger
   run in an empty directory: they get no repository, only what their input gives them.
   Each run is recorded (``review.role_ran``, stdout kept as a blob) and its answer goes
   through the steps a hand-driven review takes (``reviews.record_candidate`` /
   ``record_accounting``): the same closed schemas, labels, accounting rules and single
   repair, and the same deterministic report, committed with its SHA-256.
3. **The end** is a terminal event (``review.report_committed`` or ``review.failed``);
   on PostgreSQL its commit NOTIFYs every listener. ``wait_review`` blocks until it
   (LISTEN/NOTIFY, or polling on SQLite), and ``reviews.review_result`` verifies the
   report and hands it out once.

A task never hangs for ever: the host records ``review.failed`` for anything it cannot
finish (a crash of its own included), and while it runs it holds an exclusive lock on a
file in the ledger's state directory (taken by ``run_review`` before the preflight and
passed on to the host process). A waiter that finds the lock released and no terminal
event knows the host died (killed, the machine rebooted) and records the failure.

What each role receives on stdin and must print on stdout is in docs/reviews.md ("The
reviewer programs").
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec
from ulid import ULID

from commands.names import check_relative_path
from commands.runner.confine import Confinement, program_files
from commands.runner.guards import TreeGuard
from commands.runner.process import RunResult, run_command
from ledger import EventPayload
from ledger.canonical import canonical_json
from ledger.events import ReviewHostScheduled, ReviewHostStarted, ReviewRoleRan, ReviewStarted
from ledger.subscriptions import subscribe
from projections.states import HostState, PlanState, ReviewState, to_json

from .confinement import plan_policy, require_confinement, review_confinement
from .core import CommandRefused, Plane, StreamState
from .review_inputs import (
    CandidateCommand,
    ReviewersConfig,
    RoleCommand,
    check_programs,
    check_scope,
    copy_scope,
    load_reviewers,
    parse_reviewers,
    remove_copy,
    scope_digest,
    scope_paths,
)
from .reviews import (
    ACCOUNTING_SCHEMA,
    CANDIDATE_SCHEMA,
    MERGER_SCHEMA,
    MERGER_VERSION,
    TERMINAL_STATUSES,
    MergerAnswer,
    RoleFailure,
    Violation,
    accounting_answer,
    fail_review,
    get_review,
    normalize_request,
    parse_answer,
    record_accounting,
    record_candidate,
    render_report,
    source_findings,
)

__all__ = [
    "HOST_ACTOR",
    "ROLE_INPUT_FORMAT",
    "HostNotStarted",
    "HostStopped",
    "Receipt",
    "ReviewersConfig",
    "WaitOutcome",
    "host_alive",
    "host_review",
    "load_reviewers",
    "lock_path",
    "parse_reviewers",
    "preflight_sha256",
    "run_review",
    "wait_review",
]

ROLE_INPUT_FORMAT = "fusion-validation-role-input.v1"
HOST_ACTOR = "review-host"  # the actor of every event the host records
Role = Literal["candidate", "evaluator", "repair", "merger"]
_STDERR_TAIL = 400  # characters of a program's stderr quoted in its run's error


# -- the host's lock: how a waiter knows the host is alive -------------------------------


def _state_base(plane: Plane) -> Path:
    """The ledger's state directory (``--workdir``, ``$EVIDENCE_STATE_DIR`` or
    ``<db>.state``): ``plane.sandboxes`` is ``<base>/sandboxes/<ledger digest>``."""
    return plane.sandboxes.parent.parent


def _reviews_dir(plane: Plane) -> Path:
    return _state_base(plane) / "reviews" / plane.sandboxes.name


def lock_path(plane: Plane, task_id: str) -> Path:
    """The file the review's host holds locked while it runs."""
    return _reviews_dir(plane) / f"{_safe_task(task_id)}.lock"


def log_path(plane: Plane, task_id: str) -> Path:
    """Where a background host writes what it prints (its crash, if it crashes)."""
    return _reviews_dir(plane) / f"{_safe_task(task_id)}.log"


def _safe_task(task_id: str) -> str:
    # A task id is a ULID; anything else names no file (a name never becomes a path).
    if not (len(task_id) == 26 and task_id.isalnum() and task_id.isascii()):
        raise CommandRefused(f"unknown review {task_id!r}")
    return task_id


def _take_lock(path: Path) -> int:
    """An exclusive lock on ``path`` (created), or a refusal when a host holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise CommandRefused(f"a review host already runs this review (it holds {path})") from None
    return fd


def _adopt_lock(fd: int, path: Path) -> int:
    """The lock ``run_review`` took and passed on as descriptor ``fd``: it must be that
    file, and (flock is per open file) already ours."""
    try:
        held, named = os.fstat(fd), os.stat(path)
        if (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
            raise OSError("another file")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise CommandRefused(f"--lock-fd {fd} is not this review's lock ({path})") from None
    return fd


def host_alive(path: Path) -> bool | None:
    """True while a host holds the lock at ``path``, False when nobody does (the host
    ended or died: the kernel releases a dead process's lock), None when there is no
    lock file here to tell (a review driven by hand, or a host on another machine)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False
    finally:
        os.close(fd)  # releases the shared lock too


# -- preflight and the background task ---------------------------------------------------


@dataclass
class Receipt:
    """What ``run_review`` returns once the preflight is committed."""

    task_id: str
    log: Path | None  # the background host's output (None: not started here)

    def to_json(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "log": None if self.log is None else str(self.log)}


class HostNotStarted(CommandRefused):
    """The preflight was committed but the host process could not be started: the
    review is recorded as failed (``task_id``)."""

    def __init__(self, task_id: str, reason: str) -> None:
        self.task_id = task_id
        super().__init__(f"review {task_id}: {reason}; the review is recorded as failed")


def run_review(
    plane: Plane,
    request: bytes | str | Mapping[str, Any],
    reviewers: ReviewersConfig,
    *,
    repository: Path,
    plan_id: str | None = None,
    actor: str = "system",
    start: bool = True,
) -> Receipt:
    """Check everything, commit the preflight, start the host; return the receipt.

    Refused (``CommandRefused``, nothing appended) on an invalid request, a scope entry
    that names nothing in ``repository``, a program that cannot be found, an unknown
    plan. With ``start=False`` no process is started: call ``host_review`` yourself."""
    normalised = normalize_request(request)
    repository = repository.resolve()
    check_scope(repository, normalised["scope"])
    check_programs(reviewers)
    if plan_id is not None:
        plane.projections.catch_up()
        if plane.projections.document("plans", plan_id) is None:
            raise CommandRefused(f"unknown plan {plan_id!r}")
    require_confinement(plan_policy(_plan_of(plane, plan_id)), "the reviewer programs")
    config = reviewers.normalised()
    task_id = str(ULID())
    events: list[EventPayload] = [
        ReviewStarted(
            task_id=task_id,
            plan_id=plan_id,
            request=normalised,
            request_sha256=hashlib.sha256(canonical_json(normalised)).hexdigest(),
        ),
        ReviewHostScheduled(
            task_id=task_id,
            reviewers=config,
            reviewers_sha256=hashlib.sha256(canonical_json(config)).hexdigest(),
            repository=str(repository),
        ),
    ]

    def decide(state: StreamState) -> list[EventPayload]:
        if state.exists:  # a fresh ULID: cannot happen, but never overwrite a review
            raise CommandRefused(f"review {task_id} already exists")
        return events

    if not start:
        plane.run(f"review:{task_id}", decide, actor=actor)
        return Receipt(task_id, None)
    # The lock is held from before the preflight is visible until the host ends (the
    # host inherits it): a waiter never sees this review without a live holder.
    lock = lock_path(plane, task_id)
    fd = _take_lock(lock)
    try:
        try:
            plane.run(f"review:{task_id}", decide, actor=actor)
        except BaseException:
            lock.unlink(missing_ok=True)
            raise
        log = log_path(plane, task_id)
        preflight = _preflight_sha256(normalised, config, str(repository))
        try:
            _spawn_host(plane, task_id, fd, log, preflight)
        except OSError as exc:
            reason = f"the review host could not be started: {exc}"
            fail_review(plane, task_id, reason, actor=HOST_ACTOR)
            lock.unlink(missing_ok=True)
            raise HostNotStarted(task_id, reason) from None
    finally:
        os.close(fd)  # the host keeps its own copy of the locked descriptor
    return Receipt(task_id, log)


def _spawn_host(plane: Plane, task_id: str, fd: int, log: Path, preflight: str) -> None:
    """``evidence review host TASK`` as a detached process: its own session (it outlives
    the caller and a Ctrl-C at the caller's terminal), stdin from /dev/null, output to
    ``log``. The database URL goes by environment (not visible in ``ps``), and the state
    directory too, so the host finds this review's lock where it was taken."""
    env = {
        **os.environ,
        "EVIDENCE_DB": plane.store.engine.url.render_as_string(hide_password=False),
        "EVIDENCE_STATE_DIR": str(_state_base(plane)),
    }
    argv = [sys.executable, "-m", "commands.cli", "review", "host", task_id]
    argv += ["--lock-fd", str(fd), "--preflight", preflight]
    with open(log, "ab") as output:
        subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            env=env,
            pass_fds=(fd,),
            start_new_session=True,
        )


# -- the host ------------------------------------------------------------------------------


class HostStopped(BaseException):
    """The host process was asked to stop (SIGTERM): the review is recorded as failed.
    A ``BaseException``, as ``KeyboardInterrupt`` is: it may arrive inside any code the
    host runs, and a handler there that takes every ``Exception`` (a program's run that
    never raises, the store's driver-error mapping) must not swallow it and go on."""


@contextlib.contextmanager
def _stopped_by_sigterm(enabled: bool) -> Iterator[None]:
    """While the host runs (in the main thread of its own process): SIGTERM raises
    ``HostStopped``, so the failure is recorded rather than the process just vanishing
    (the programs still running end at their own timeouts)."""
    if not enabled:
        yield
        return

    def stop(signum: int, _frame: Any) -> None:
        raise HostStopped(f"the review host was stopped by signal {signum} (SIGTERM)")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def preflight_sha256(doc: ReviewState) -> str:
    """The digest of what a hosted review's preflight fixed: the request, the reviewer
    programs and the repository. ``run_review`` hands it to the host process, which runs
    nothing unless the review it reads still has it (an event appended to the stream by
    a writer of the database file cannot swap the programs the host runs)."""
    host = doc.host
    if not isinstance(host, HostState):
        return _preflight_sha256(doc.request, None, None)
    return _preflight_sha256(doc.request, host.reviewers, host.repository)


def _preflight_sha256(
    request: Mapping[str, Any], reviewers: Mapping[str, Any] | None, repository: str | None
) -> str:
    fixed = {"request": request, "reviewers": reviewers, "repository": repository}
    return hashlib.sha256(canonical_json(fixed)).hexdigest()


def host_review(
    plane: Plane,
    task_id: str,
    *,
    lock_fd: int | None = None,
    expect_preflight: str | None = None,
    handle_sigterm: bool = False,
) -> ReviewState:
    """Run a scheduled review to its end (in this process) and return it ended.

    Refused when the review is not hosted, a host already took it, or (with
    ``expect_preflight``, as the background host is always started) its preflight is not
    the one committed. Every other failure ends the review as ``failed`` with the
    reason. ``handle_sigterm`` (the host process; main thread only): SIGTERM ends the
    review as failed too."""
    doc = get_review(plane, task_id)
    host = doc.host
    if not isinstance(host, HostState):
        raise CommandRefused(f"review {task_id} is not run by the review host (review run)")
    if expect_preflight is not None and preflight_sha256(doc) != expect_preflight:
        raise CommandRefused(
            f"review {task_id}: the recorded request, reviewers or repository differ from "
            "the preflight this host was started for; nothing is run"
        )
    if doc.status in TERMINAL_STATUSES:
        raise CommandRefused(f"review {task_id} has ended ({doc.status})")
    if not isinstance(host.pid, msgspec.UnsetType):
        raise CommandRefused(
            f"review {task_id} was taken by the review host pid {host.pid} on {host.hostname}"
        )
    lock = lock_path(plane, task_id)
    fd = _adopt_lock(lock_fd, lock) if lock_fd is not None else _take_lock(lock)
    try:
        try:
            with _stopped_by_sigterm(handle_sigterm):
                _Host(plane, doc, host).run()
        except _Ended:
            pass  # the review ended meanwhile (a waiter found it lost): nothing to add
        except HostStopped as exc:
            fail_review(plane, task_id, str(exc), actor=HOST_ACTOR)
        except Exception as exc:
            if get_review(plane, task_id).status not in TERMINAL_STATUSES:
                reason = f"the review host failed: {type(exc).__name__}: {exc}"
                fail_review(plane, task_id, reason, actor=HOST_ACTOR)
                traceback.print_exc()  # into the host's log: an engine defect to look at
        except BaseException:  # KeyboardInterrupt and the like: recorded, then on its way
            fail_review(plane, task_id, "the review host was interrupted", actor=HOST_ACTOR)
            raise
        lock.unlink(missing_ok=True)  # after the terminal event: a waiter reads it first
    finally:
        os.close(fd)
    return get_review(plane, task_id)


class _Ended(Exception):
    """The review ended while the host worked on it."""


@dataclass
class _Ran:
    role: Role
    name: str
    run: RunResult
    failure: RoleFailure | None
    changed: list[str]


class _Host:
    """One review's run: the scope copied, the roles run, each step recorded."""

    def __init__(self, plane: Plane, doc: ReviewState, host: HostState) -> None:
        self.plane, self.doc, self.task_id = plane, doc, doc.task_id
        self.config = ReviewersConfig.model_validate(host.reviewers)
        self.repository = Path(host.repository)
        self.paths = scope_paths(
            [str(check_relative_path(p, "scope entry")) for p in doc.request["scope"]]
        )
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("EVIDENCE_")}
        self.env["PYTHONDONTWRITEBYTECODE"] = "1"  # importing must not write __pycache__
        # Seed 002's tool policy, enforced by the kernel: a candidate reads its copy of
        # the scope (inspect), the evaluator, repair and merger nothing (no tools).
        self.plan = _plan_of(plane, doc.plan_id)

    def run(self) -> None:
        scratch = Path(tempfile.mkdtemp(prefix="evidence-review-"))
        try:
            before = scope_digest(self.repository, self.paths)
            started = ReviewHostStarted(
                task_id=self.task_id,
                pid=os.getpid(),
                hostname=socket.gethostname(),
                scope_sha256=before,
            )
            self._append([started])
            copy_scope(self.repository, self.paths, scratch / "scope")
            self._candidates(scratch)
            after = scope_digest(self.repository, self.paths)
            if after != before:
                self._fail(
                    "the reviewed scope changed in the repository while the candidates read "
                    "it (a reviewer may have written to it through an absolute path, or "
                    "someone edited it): no report is rendered from reads of a moving scope"
                )
                return
            self._accounting()
        finally:
            remove_copy(scratch)

    # -- candidates, in parallel, each in its own copy -----------------------------

    def _candidates(self, scratch: Path) -> None:
        request = {"role": "candidate", "answer_schema": CANDIDATE_SCHEMA}
        stdin = self._input(request)
        guards: dict[str, TreeGuard] = {}
        jobs: dict[Future[RunResult], CandidateCommand] = {}
        pool = ThreadPoolExecutor(max_workers=len(self.config.candidates))
        try:
            for i, candidate in enumerate(self.config.candidates):
                view = scratch / f"candidate-{i}"
                shutil.copytree(scratch / "scope", view, symlinks=True)
                guards[candidate.name] = TreeGuard(view)
                confined = review_confinement(self.plane, self.plan, read=[view])
                job = pool.submit(self._execute, candidate, view, stdin, confined)
                jobs[job] = candidate
            # Recorded as they finish: the labels A, B … follow completion, not the
            # order of the configuration (which would tell the evaluator who is who).
            for job in as_completed(jobs):
                candidate = jobs[job]
                name, run = candidate.name, job.result()
                changed = guards.pop(name).restore_if_changed()
                failure = _failure(run, candidate.timeout_s)
                if failure is None and changed:
                    shown = ", ".join(changed[:10]) + (" …" if len(changed) > 10 else "")
                    failure = RoleFailure(
                        "it wrote to its read-only view of the repository",
                        f"wrote to its read-only view of the repository ({len(changed)} "
                        f"path(s): {shown}); a reviewer is read-only, so its report is void",
                    )
                self._record(_Ran("candidate", name, run, failure, changed))
                record_candidate(
                    self.plane,
                    self.task_id,
                    None if failure else run.stdout,
                    reviewer=name,
                    actor=HOST_ACTOR,
                    hosted=True,
                    failure=failure,
                )
        finally:
            # Stopped early (SIGTERM, an error): not waited for here, so the failure is
            # recorded now; the programs still running end at their timeouts.
            pool.shutdown(wait=False, cancel_futures=True)
            for guard in guards.values():
                guard.discard()

    # -- evaluator, repair, merger: no repository ----------------------------------

    def _accounting(self) -> None:
        doc = get_review(self.plane, self.task_id)
        if not any(c.valid for c in doc.candidates.values()):
            self._fail(
                f"no candidate reviewer returned a valid report ({len(doc.candidates)} ran; "
                "see review show)"
            )
            return
        sources = source_findings(doc)
        evaluator = self.config.evaluator
        fields = {"role": "evaluator", "source_findings": sources}
        ran, value, violations = self._evaluate("evaluator", evaluator, fields, doc)
        if violations:
            self._account(ran)  # attempt 1 rejected: one repair follows
            fields = {
                "role": "repair",
                "source_findings": sources,
                "rejected": value,  # null when the evaluator gave no JSON document
                "violations": [v.to_json() for v in violations],
            }
            ran, value, violations = self._evaluate(
                "repair", self.config.repair or evaluator, fields, doc
            )
            if violations:
                self._account(ran)  # the second rejection ends the review as failed
                return
        self._account(ran, self._merge(doc, value))

    def _evaluate(
        self, role: Role, command: RoleCommand, fields: dict[str, Any], doc: ReviewState
    ) -> tuple[_Ran, Any, list[Violation]]:
        """Run the evaluator (or repair) and check its accounting as ``account_review``
        will: the run, the decoded answer and every rule it breaks."""
        ran = self._run_bare(role, role, command, {**fields, "answer_schema": ACCOUNTING_SCHEMA})
        if ran.failure is not None:
            return ran, None, [Violation("", ran.failure.detail)]
        value, violations = accounting_answer(ran.run.stdout, doc)
        return ran, value, violations

    def _account(self, ran: _Ran, merger: MergerAnswer | None = None) -> None:
        record_accounting(
            self.plane,
            self.task_id,
            None if ran.failure else ran.run.stdout,
            actor=HOST_ACTOR,
            hosted=True,
            failure=ran.failure,
            merger=merger,
        )

    def _merge(self, doc: ReviewState, accounting: Any) -> MergerAnswer | None:
        """The merger's summary of the report the host will commit (rendered here from
        the accepted accounting, exactly as it will be but for the summary)."""
        if self.config.merger is None:
            return None
        draft = render_report(doc.request, to_json(doc)["candidates"], accounting)
        fields = {
            "role": "merger",
            "report": msgspec.json.decode(draft),
            "answer_schema": MERGER_SCHEMA,
        }
        ran = self._run_bare("merger", "merger", self.config.merger, fields)
        if ran.failure is not None:
            return MergerAnswer(None, ran.failure.summary)
        answer, violations = parse_answer(ran.run.stdout, MERGER_SCHEMA)
        if violations:
            return MergerAnswer(
                None,
                f"its answer failed the {MERGER_VERSION} schema ({len(violations)} violation(s))",
            )
        return MergerAnswer(answer["summary"])

    def _run_bare(
        self, role: Role, name: str, command: RoleCommand, fields: dict[str, Any]
    ) -> _Ran:
        """A program with no repository: in an empty directory of its own."""
        stdin = self._input(fields)
        with tempfile.TemporaryDirectory(prefix=f"evidence-review-{role}-") as empty:
            # No tools: nothing readable but its empty working directory (and the
            # allow-list, so that its interpreter runs).
            confined = review_confinement(self.plane, self.plan, read=[Path(empty)])
            run = self._execute(command, Path(empty), stdin, confined)
        ran = _Ran(role, name, run, _failure(run, command.timeout_s), [])
        self._record(ran)
        return ran

    # -- running and recording -----------------------------------------------------

    def _input(self, fields: dict[str, Any]) -> bytes:
        """A role's stdin: the request and the role's own fields, as one JSON document.
        No reviewer name, label or program is in it."""
        document = {"format": ROLE_INPUT_FORMAT, "request": self.doc.request, **fields}
        return msgspec.json.encode(document)

    def _execute(
        self, command: RoleCommand, cwd: Path, stdin: bytes, confinement: Confinement
    ) -> RunResult:
        return run_command(
            command.command,
            cwd=cwd,
            timeout_s=command.timeout_s,
            stdin=stdin,
            env=self.env,
            confinement=confinement.adding(read=program_files(command.command)),
        )

    def _record(self, ran: _Ran) -> None:
        run = ran.run
        payload = ReviewRoleRan(
            task_id=self.task_id,
            role=ran.role,
            name=ran.name,
            argv=run.argv,
            exit_code=run.exit_code,
            error=None if ran.failure is None else ran.failure.detail,
            changed_paths=ran.changed,
            stdout_sha256=hashlib.sha256(run.stdout).hexdigest(),
            stdout_truncated=run.stdout_truncated,
            started_at=run.started_at,
            ended_at=run.ended_at,
            duration_ms=run.duration_ms,
        )
        self._append([payload], blobs=[run.stdout])

    def _append(self, payloads: list[EventPayload], blobs: list[bytes] | None = None) -> None:
        def decide(state: StreamState) -> list[EventPayload]:
            doc = state.of(ReviewState)
            if doc is None or doc.status in TERMINAL_STATUSES:
                raise _Ended()
            return payloads

        self.plane.run(f"review:{self.task_id}", decide, actor=HOST_ACTOR, blobs=blobs or [])

    def _fail(self, reason: str) -> None:
        fail_review(self.plane, self.task_id, reason, actor=HOST_ACTOR)


def _plan_of(plane: Plane, plan_id: str | None) -> PlanState | None:
    """The review's plan, whose ``confinement`` policy its programs follow (None: a
    review of no plan, confined whenever the kernel can)."""
    if plan_id is None:
        return None
    return plane.state(f"plan:{plan_id}").of(PlanState)


def _failure(run: RunResult, timeout_s: float) -> RoleFailure | None:
    """Why a program's answer cannot be used (None: it exited 0 with all its output).
    The summary names no program and quotes nothing it printed; the detail does."""
    tail = run.stderr.decode("utf-8", "replace").strip()[-_STDERR_TAIL:]
    said = f"; stderr: {tail}" if tail else ""
    if run.missing_program is not None:
        return RoleFailure("its program could not be run", f"{run.error}")
    if run.timed_out:
        return RoleFailure(f"it timed out after {timeout_s:g} s", f"{run.error}{said}")
    if run.exit_code is None:
        return RoleFailure("it was stopped before it answered", f"{run.error}{said}")
    if run.exit_code != 0:
        return RoleFailure(
            f"it exited with status {run.exit_code}", f"exited with status {run.exit_code}{said}"
        )
    if run.stdout_truncated is not None:
        cut = run.stdout_truncated
        return RoleFailure(
            "its answer was longer than the output cap",
            f"its answer was {cut.size} bytes, over the cap of {cut.kept} "
            "(EVIDENCE_MAX_OUTPUT_BYTES): a prefix is not a document",
        )
    return None


# -- waiting ---------------------------------------------------------------------------------

_TERMINAL_TYPES = ("review.report_committed", "review.failed")


@dataclass
class WaitOutcome:
    review: ReviewState
    timed_out: bool = False  # the timeout passed first: the review is still running
    host_lost: bool = False  # the host died; this waiter recorded the failure

    def to_json(self) -> dict[str, Any]:
        doc = self.review
        return {
            "task_id": doc.task_id,
            "status": doc.status,
            "timed_out": self.timed_out,
            "failure": doc.failure,
            "report_sha256": doc.report.sha256 if doc.report else None,
        }


def wait_review(
    plane: Plane,
    task_id: str,
    *,
    timeout_s: float | None = None,
    poll_interval_s: float = 0.2,
    liveness_interval_s: float = 0.5,
) -> WaitOutcome:
    """Block until the review's terminal event, ``timeout_s`` (None: no limit) or the
    death of its host (then the failure is recorded here). Woken by the terminal event's
    NOTIFY on PostgreSQL; SQLite is polled every ``poll_interval_s``."""
    stream = f"review:{task_id}"
    head = plane.store.head().size  # before the state: nothing after it can be missed
    doc = get_review(plane, task_id)
    if doc.status in TERMINAL_STATUSES:
        return WaitOutcome(doc)
    lock = lock_path(plane, task_id)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    subscription = subscribe(
        plane.store, from_position=head + 1, types=_TERMINAL_TYPES, poll_interval=poll_interval_s
    )
    done, timed_out, lost = threading.Event(), threading.Event(), threading.Event()

    def watch() -> None:
        # Beside the subscription: the deadline, and whether the host still lives.
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                timed_out.set()
                break
            if host_alive(lock) is False:
                lost.set()
                break
            if done.wait(liveness_interval_s if left is None else min(left, liveness_interval_s)):
                return
        subscription.stop()

    watcher = threading.Thread(target=watch, name=f"wait-{task_id}", daemon=True)
    watcher.start()
    try:
        for event in subscription.events(follow=True):
            if event.stream == stream:
                break
    finally:
        done.set()
        subscription.stop()
        watcher.join()
    doc = get_review(plane, task_id)
    if doc.status in TERMINAL_STATUSES:
        return WaitOutcome(doc)
    if lost.is_set():
        reason = (
            "the review host stopped before the review ended (its lock was released "
            "with no terminal event: killed, or its machine restarted)"
        )
        doc = fail_review(plane, task_id, reason, actor="review-wait")
        return WaitOutcome(doc, host_lost=doc.failure == reason)
    return WaitOutcome(doc, timed_out=timed_out.is_set())
