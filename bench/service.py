"""Throughput of the plane as a service: gated checks per second through `evidence serve`,
side by side with the in-process plane and the bare store in the same run.

    python bench/service.py [--seconds N] [--warmup N] [--agents N] [--only KEY,...]
                            [--postgres URL] [--skip-postgres] [--skip-sqlite]
                            [--profile] [--json]

Every scenario runs on a fresh ledger (a SQLite file in a temporary directory, or a
throw-away PostgreSQL schema) holding one registered tool and one plan per agent, in
Execute, each with its own credential. N workers (``--agents``, default 8) then work
flat out for ``--warmup`` seconds (not counted) and ``--seconds`` more (counted): an
operation counts when it starts and ends inside the timed window. Scenarios:

  raw           (PostgreSQL) INSERT of a gate-check row into a plain table, one
                transaction each, N connections: the database's floor, commits free
                to share an fsync (group commit)
  raw+head      (PostgreSQL) the same plus an UPDATE of a one-row head in the same
                transaction: any design that serialises appends through a row lock held
                over a durable commit
  append        ``Store.append`` of a gate-check-sized event (the very event a check
                records, delta and all), N threads, each its own store and stream: the
                floor the ratios are taken to
  append-proc   the same in N processes
  plane-1       ``gate_input`` (a passing check) from one thread, one plan: a single writer
  plane         ``gate_input`` from N threads, each its own ``Plane`` and plan: the
                service's own execution model (one process, worker threads, a plane
                each) without HTTP, so the GIL is shared as in the service
  plane-proc    the same from N processes: what the plane does when the GIL is not shared
  service-1     one ``evidence serve`` (a real uvicorn subprocess, default settings:
                ``--max-in-flight 8``, access log on) and one agent posting
                ``POST /v1/gate/input`` (a passing check) with its credential
  service       the same service and N agents, each its own plan and credential
  service-x2    two ``evidence serve`` processes on the same ledger, N/2 agents each
  service-w2    one ``evidence serve --workers 2`` (two service processes sharing its
                port, the kernel handing each connection to one) and N agents
  service-ckpt  ``service`` with the service publishing a signed checkpoint every 0.5 s
                (``EVIDENCE_CHECKPOINT_EVERY``; by default every 30 s): what continuous
                checkpoints cost the gated checks, against ``service`` in the same run

SQLite runs ``append``, ``plane-1``, ``plane``, ``plane-proc``, ``service-1``,
``service`` and ``service-ckpt`` (one writer at a time by design; ``raw`` and two
services on one database are PostgreSQL questions).

The agents are one asyncio loop in this process with N concurrent connections, each a
minimal HTTP/1.1 keep-alive client on asyncio streams: on a two-core machine every
millisecond of the client's CPU is taken from the service and the database, so the
client is kept to about a tenth of a millisecond per request (the table's "cli" CPU).
A 503 is counted and retried after 10 ms.

After each scenario: ``evidence verify`` on the ledger (exit 0), positions dense (count
= largest = head size), and the events appended after the setup equal the operations
answered (for the gates: every appended event is a ``gate.checked``, one per 200).

The table shows operations per second, latency p50/p99 (ms), the ratio to the
``append`` floor of the same backend, the ratio to the issue's target (500 checks/s,
p99 <= 50 ms, on PostgreSQL through the service), the CPU each operation cost its
executor (plane threads or processes, or the service), PostgreSQL (our backends and its
background processes) and the client, how busy the machine's cores were over the window
and, in cores, how much of that was other work than ours.

``--profile`` adds two passes after the table: a cProfile of every thread of one service
process under the same load, timed by each thread's CPU clock (its own run; the profiles
are kept as .prof files in a temporary directory), and an instrumented in-process run on
PostgreSQL (one writer, then N) that times the ledger lock (waiting for it, holding it,
and what is done while it is held) and counts statements and transactions per check.

Run it from a checkout; ``PYTHONPATH=OTHER_CHECKOUT python bench/service.py`` measures
another revision (the services and ``evidence verify`` run from it too). Nothing is
written into the repository.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import os
import pstats
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import sqlalchemy as sa
from _common import (  # bench/ is sys.path[0]
    DUMMY_HASH,
    GATE_PARAMS,
    GATE_SCHEMA,
    REPO,
    Target,
    create_raw_table,
    fresh_target,
    gate_checked,
    start_run,
)
from rich.table import Table
from ulid import ULID

import commands
import ledger
from ledger.canonical import canonical_json

TARGET_RATE = 500.0  # checks per second, 8 agents, through the service, on PostgreSQL
TARGET_P99_MS = 50.0
TAG = "evb-service"  # application_name of every PostgreSQL connection of a scenario
RETRY_503_S = 0.01
HTTP_BODY = b'{"tool":"read","params":{"path":"src/app.py"}}'
# Where the measured code is: the checkout, or what PYTHONPATH put first (the A/B of
# docs/performance.md); the service and `evidence verify` run from there too.
CODE = str(Path(commands.__file__).resolve().parent.parent)

SCENARIOS: dict[str, str] = {
    "raw": "raw INSERT, commit",
    "raw+head": "raw INSERT + head UPDATE, commit",
    "append": "Store.append",
    "append-proc": "Store.append",
    "plane-1": "plane gate_input",
    "plane": "plane gate_input",
    "plane-proc": "plane gate_input",
    "service-1": "evidence serve x1",
    "service": "evidence serve x1",
    "service-x2": "evidence serve x2",
    "service-w2": "evidence serve --workers 2",
    "service-ckpt": "evidence serve x1, checkpoint every 0.5 s",
}
MODES = {
    "raw": "thread",
    "raw+head": "thread",
    "append": "thread",
    "append-proc": "process",
    "plane-1": "thread",
    "plane": "thread",
    "plane-proc": "process",
    "service-1": "service",
    "service": "service",
    "service-x2": "service",
    "service-w2": "service",
    "service-ckpt": "service",
}
KINDS = {
    "raw": "raw",
    "raw+head": "raw+head",
    "append": "append",
    "append-proc": "append",
    "plane-1": "gate",
    "plane": "gate",
    "plane-proc": "gate",
}
BACKEND_SCENARIOS = {
    "postgresql": list(SCENARIOS),
    "sqlite": ["append", "plane-1", "plane", "plane-proc", "service-1", "service", "service-ckpt"],
}
FLOOR = "append"


# -- the ledger a scenario runs on --------------------------------------------------------


@dataclass
class Ledger:
    """A fresh ledger: its URL, where its keys live, the agents' plans and credentials."""

    target: Target
    url: str
    env: dict[str, str]
    plans: list[str]
    tokens: list[str]
    before: int = 0  # the head's size after the setup

    @property
    def backend(self) -> str:
        return self.target.backend

    def spec(self) -> dict[str, Any]:
        """What a worker process needs to open it (picklable)."""
        return {
            "url": self.url,
            "env": self.env,
            "plans": self.plans,
            "conninfo": self.target.conninfo,
            "schema": self.target.schema,
        }


@contextmanager
def keys_env(env: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def fresh_ledger(
    backend: str, pg_url: str, agents: int, history: int = 0, analyze: bool = True
) -> Iterator[Ledger]:
    """One tool (``read``), one plan per agent in Execute with one passing check on its
    stream, a credential each; keys and sandboxes in a temporary directory. With
    ``history``, that many events of a long-lived log before them (``preload``)."""
    from commands.plane import Plane
    from commands.plane.credentials import issue_credential
    from commands.plane.gates import gate_input
    from commands.plane.phases import enter_execute, record_strategy
    from commands.plane.plans import create_plan
    from commands.plane.registry import register_tool

    with (
        fresh_target(backend, pg_url) as target,
        tempfile.TemporaryDirectory(prefix="evb-keys-") as tmp,
    ):
        url = target.ledger_url
        if backend == "postgresql":  # our connections, told apart in pg_stat_activity
            url = (
                sa.engine.make_url(url)
                .update_query_dict({"application_name": TAG})
                .render_as_string(hide_password=False)
            )
        env = {
            "EVIDENCE_PLANE_KEY": f"{tmp}/plane.key",
            "EVIDENCE_OPERATOR_KEY": f"{tmp}/operator.key",
            "EVIDENCE_STATE_DIR": f"{tmp}/state",
        }
        with keys_env(env):
            plans, tokens = [], []
            with Plane.open(url) as plane:
                register_tool(
                    plane, {"name": "read", "command": ["true"], "input_schema": GATE_SCHEMA}
                )
                for i in range(agents):
                    plan = f"B-{i + 1}"
                    create_plan(plane, plan, project="bench", resources=[f"repo:bench-{i}"])
                    record_strategy(plane, plan, "read files")
                    enter_execute(plane, plan)
                    gate_input(plane, plan, "read", GATE_PARAMS)
                    tokens.append(issue_credential(plane, plan, ttl=timedelta(hours=2)).token)
                    plans.append(plan)
                if history:
                    preload(plane, history, analyze=analyze)
                before = plane.store.head().size
            yield Ledger(target, url, env, plans, tokens, before)


def preload(plane: Any, n: int, *, analyze: bool = True) -> None:
    """``n`` events after the set-up, as a ledger in use for a while holds: passing
    checks on streams of their own, 1,000 per transaction; then the read models caught up
    and (PostgreSQL, ``analyze``) the table's statistics taken, as autovacuum would have
    by then (without: the statistics of a ledger that grew faster than autovacuum ran)."""
    event = sample_event(plane.store)
    for start in range(0, n, 1000):
        count = min(1000, n - start)
        plane.store.append_batch(
            [ledger.StreamAppend(f"history:{start // 1000}", [event] * count, ledger.NO_STREAM)]
        )
    plane.projections.catch_up()
    if analyze and plane.store.backend == "postgresql":
        with plane.store.engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")


def sample_event(store: ledger.Store) -> ledger.NewEvent:
    """The event a passing check appends, delta and all (the floor appends it again)."""
    [found] = [e for e in store.read_stream("plan:B-1") if e.type == "gate.checked"][-1:]
    return ledger.NewEvent(payload=found.payload, delta=found.delta)


def check_log(led: Ledger, answered: int, kind: str) -> dict[str, Any]:
    """After a scenario: verify, density, and appended == answered."""
    out: dict[str, Any] = {}
    with ledger.open(led.url, create=False) as store:
        head = store.head().size
        with store.engine.connect() as conn:
            count, top = conn.execute(
                sa.text("SELECT count(*), coalesce(max(position), 0) FROM events")
            ).one()
            checks = conn.execute(
                sa.text("SELECT count(*) FROM events WHERE position > :b AND type = :t"),
                {"b": led.before, "t": "gate.checked"},
            ).scalar_one()
    appended = head - led.before
    out["dense"] = count == top == head
    out["appended"] = appended
    if kind == "gate":
        out["matches"] = appended == checks == answered
    elif kind == "append":
        out["matches"] = appended == answered
    else:  # raw: nothing goes through the ledger
        out["matches"] = appended == 0
    env = {k: v for k, v in os.environ.items() if k != "EVIDENCE_DB"} | led.env
    verified = subprocess.run(
        [sys.executable, "-m", "commands.cli", "verify", "--db", led.url],
        capture_output=True,
        text=True,
        env=env,
        cwd=CODE,
    )
    out["verify_exit"] = verified.returncode
    if verified.returncode != 0:
        out["verify_output"] = (verified.stdout + verified.stderr)[-2000:]
    out["ok"] = out["dense"] and out["matches"] and verified.returncode == 0
    return out


# -- one worker's operation ----------------------------------------------------------------


def open_op(kind: str, spec: dict[str, Any], index: int) -> tuple[Callable[[], None], Callable]:
    """The operation worker ``index`` repeats, and how to close what it opened."""
    url = spec["url"]
    if kind == "gate":
        from commands.plane import Plane
        from commands.plane.gates import gate_input

        plane = Plane.open(url, create=False)
        plan = spec["plans"][index % len(spec["plans"])]

        def gate() -> None:
            if gate_input(plane, plan, "read", GATE_PARAMS).check.verdict != "pass":
                raise RuntimeError("the check did not pass")

        return gate, plane.close
    if kind == "append":
        store = ledger.open(url, create=False)
        event = sample_event(store)
        stream = f"floor:B-{index + 1}"
        return lambda: store.append(stream, [event]), store.close
    return open_raw(kind, spec, index)


_INSERT = (
    "INSERT INTO {table} (position, event_id, stream, stream_version, type, schema_version, "
    "recorded_at, actor, correlation_id, causation_id, payload, delta, leaf_hash, chain_hash) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_HEAD = "UPDATE raw_head SET size = size + 1, chain_hash = %s, frontier = %s WHERE id = 1"


def open_raw(kind: str, spec: dict[str, Any], index: int) -> tuple[Callable[[], None], Callable]:
    """A gate-check row inserted with psycopg, one transaction each (pipelined: one round
    trip); ``raw+head`` updates the one-row head first, as the store locks it first."""
    import psycopg

    conn = psycopg.connect(spec["conninfo"], application_name=TAG)
    conn.execute(f'SET search_path TO "{spec["schema"]}"')
    conn.commit()
    payload = canonical_json(msgspec.to_builtins(gate_checked(index, index)))
    stream = f"plan:R-{index}"
    versions = itertools.count(1)
    positions = itertools.count(index * 1_000_000_000 + 1)
    head = kind == "raw+head"
    insert = _INSERT.format(table="floor_events" if head else "raw_events")
    recorded_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def append() -> None:
        row = (
            next(positions),
            str(ULID()),
            stream,
            next(versions),
            "gate.checked",
            1,
            recorded_at,
            "agent",
            None,
            None,
            payload,
            b"[]",
            DUMMY_HASH,
            DUMMY_HASH,
        )
        with conn.pipeline(), conn.cursor() as cur:
            if head:
                cur.execute(_HEAD, (DUMMY_HASH, DUMMY_HASH * 8))
            cur.execute(insert, row)
            conn.commit()

    return append, conn.close


# -- driving: a fixed window, every latency in it ----------------------------------------


@dataclass
class Tally:
    done: int = 0  # every operation answered, the warm-up's too
    latencies: list[float] = field(default_factory=list)  # seconds, the timed window's
    errors: int = 0
    first_error: str = ""
    status: dict[int, int] = field(default_factory=dict)  # HTTP only: non-200 answers

    def merge(self, other: Tally) -> None:
        self.done += other.done
        self.latencies.extend(other.latencies)
        self.errors += other.errors
        self.first_error = self.first_error or other.first_error
        for code, n in other.status.items():
            self.status[code] = self.status.get(code, 0) + n


def drive(op: Callable[[], None], warm_until: float, end: float) -> Tally:
    """Repeat ``op`` until ``end``; keep the latency of each one inside the window."""
    tally = Tally()
    clock = time.monotonic
    while (start := clock()) < end:
        try:
            op()
        except Exception as exc:
            tally.errors += 1
            tally.first_error = tally.first_error or f"{type(exc).__name__}: {exc}"[:300]
            time.sleep(0.01)
            continue
        stop = clock()
        tally.done += 1
        if start >= warm_until and stop <= end:
            tally.latencies.append(stop - start)
    return tally


def _process_worker(kind: str, spec: dict[str, Any], index: int, pipe: Any) -> None:
    os.environ.update(spec["env"])
    op, close = open_op(kind, spec, index)
    pipe.send("ready")
    warm_until, end = pipe.recv()
    tally = drive(op, warm_until, end)
    close()
    pipe.send(msgspec.to_builtins(tally))


# -- CPU accounting ------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    total = sum(values[:8])
    return (total - idle) / _TICK, total / _TICK


class CpuMeter:
    """CPU of the executor's processes (or this one's threads), PostgreSQL's processes
    serving us (our backends and its background ones) and the whole machine, over the
    timed window."""

    def __init__(self, led: Ledger, executor_pids: list[int], self_is: str) -> None:
        self.led, self.executor_pids, self.self_is = led, executor_pids, self_is
        self.pg_pids: list[int] = []
        self.connections = 0  # our PostgreSQL connections when the window opened

    def _pg_pids(self) -> list[int]:
        if self.led.backend != "postgresql":
            return []
        import psycopg

        assert self.led.target.conninfo is not None
        with psycopg.connect(self.led.target.conninfo, application_name="evb-monitor") as c:
            rows = c.execute(
                "SELECT pid, application_name = %s FROM pg_stat_activity "
                "WHERE application_name = %s OR backend_type <> 'client backend'",
                (TAG, TAG),
            ).fetchall()
        self.connections = sum(1 for _pid, ours in rows if ours)
        return [r[0] for r in rows]

    def _read(self) -> dict[str, float]:
        me = resource.getrusage(resource.RUSAGE_SELF)
        busy, total = machine_cpu()
        return {
            "self": me.ru_utime + me.ru_stime,
            "executor": sum(proc_cpu(p) for p in self.executor_pids),
            "pg": sum(proc_cpu(p) for p in self.pg_pids),
            "busy": busy,
            "total": total,
        }

    def start(self) -> None:
        self.pg_pids = self._pg_pids()
        self.t0 = self._read()

    def stop(self) -> dict[str, float]:
        t1 = self._read()
        d = {k: t1[k] - self.t0[k] for k in t1}
        executor = d["executor"] + (d["self"] if self.self_is == "executor" else 0.0)
        client = d["self"] if self.self_is == "client" else 0.0
        return {
            "executor_s": executor,
            "pg_s": d["pg"],
            "client_s": client,
            "machine_busy": d["busy"] / d["total"] if d["total"] else 0.0,
            "others_s": max(0.0, d["busy"] - executor - d["pg"] - client),
            "wall_cores": d["total"],  # core-seconds of the window (cores x seconds)
            "pg_connections": self.connections,
        }


# -- in-process scenarios ------------------------------------------------------------------


def run_workers(
    kind: str, mode: str, workers: int, led: Ledger, warmup: float, seconds: float
) -> tuple[Tally, dict[str, float]]:
    spec = led.spec()
    if mode == "thread":
        ops = [open_op(kind, spec, i) for i in range(workers)]
        tallies: list[Tally] = [Tally() for _ in ops]
        window: list[float] = []
        ready = threading.Barrier(workers + 1)

        def work(i: int) -> None:
            ready.wait()
            tallies[i] = drive(ops[i][0], window[0], window[1])

        threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
        for t in threads:
            t.start()
        now = time.monotonic()
        window[:] = [now + warmup, now + warmup + seconds]
        meter = CpuMeter(led, [], "executor")
        ready.wait()
        _sleep_until(window[0])
        meter.start()
        _sleep_until(window[1])
        cpu = meter.stop()
        for t in threads:
            t.join()
        for _op, close in ops:
            close()
    else:
        ctx = multiprocessing.get_context("spawn")
        pipes, procs = [], []
        for i in range(workers):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_process_worker, args=(kind, spec, i, theirs))
            proc.start()
            pipes.append(mine)
            procs.append(proc)
        for pipe in pipes:
            if pipe.recv() != "ready":
                raise RuntimeError("a worker did not start")
        now = time.monotonic()
        window = [now + warmup, now + warmup + seconds]
        for pipe in pipes:
            pipe.send((window[0], window[1]))
        meter = CpuMeter(led, [p.pid for p in procs if p.pid is not None], "none")
        _sleep_until(window[0])
        meter.start()
        _sleep_until(window[1])
        cpu = meter.stop()
        tallies = [Tally(**pipe.recv()) for pipe in pipes]
        for proc in procs:
            proc.join(timeout=60)
    total = Tally()
    for t in tallies:
        total.merge(t)
    return total, cpu


def _sleep_until(moment: float) -> None:
    while (left := moment - time.monotonic()) > 0:
        time.sleep(min(left, 0.5))


# -- the service -----------------------------------------------------------------------------

# `evidence serve` under cProfile, every thread, timed by each thread's CPU clock (so a
# function's time is the CPU it used, not the database, the lock or the GIL it waited
# for): the worker threads (anyio's, where the plane runs) get a profiler each from their
# first call; the main thread (the event loop: uvicorn, its HTTP parser, Starlette) from SIGUSR1 on,
# so start-up is left out. On exit (a SIGTERM drains as usual) the profiles are written
# to ARGV[1].main and ARGV[1].workers.
PROFILED_SERVE = r"""
import cProfile, marshal, pstats, signal, sys, threading, time
out = sys.argv[1]
workers = []
def start(frame, event, arg):
    sys.setprofile(None)
    p = cProfile.Profile(time.thread_time)
    workers.append(p)
    p.enable()
threading.setprofile(start)
main = cProfile.Profile(time.thread_time)
signal.signal(signal.SIGUSR1, lambda *_: main.enable())
sys.argv = ["evidence", *sys.argv[2:]]
from commands.cli.main import main as cli
try:
    cli()
except SystemExit:
    pass
finally:
    main.disable()
    threading.setprofile(None)
    main.dump_stats(out + ".main")
    # The workers' completed calls only: disabling a thread's profiler from this thread
    # would close the call it is blocked in (an idle wait) with this thread's clock.
    parts = []
    for i, p in enumerate(workers):
        p.snapshot_stats()
        with open(f"{out}.w{i}", "wb") as f:
            marshal.dump(p.stats, f)
        parts.append(f"{out}.w{i}")
    if parts:
        pstats.Stats(*parts).dump_stats(out + ".workers")
"""


class Service:
    """`evidence serve --port 0` in a subprocess (optionally under PROFILED_SERVE); its log
    goes to a file (a pipe nobody reads would fill and stall it)."""

    def __init__(
        self,
        led: Ledger,
        profile_to: str | None = None,
        workers: int = 1,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        env = {k: v for k, v in os.environ.items() if k != "EVIDENCE_DB"} | led.env
        env |= extra_env or {}
        args = ["serve", "--db", led.url, "--port", "0", "--workers", str(workers)]
        if profile_to is None:
            cmd = [sys.executable, "-m", "commands.cli", *args]
        else:
            cmd = [sys.executable, "-c", PROFILED_SERVE, profile_to, *args]
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop)
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd=CODE
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("listening on http://"):
            raise RuntimeError(f"evidence serve did not start: {line!r}\n{self.logged()}")
        self.base = line.split(" ", 2)[2].strip()
        host, port = self.base.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)
        deadline = time.monotonic() + 60
        while _get(self.base + "/readyz")[0] != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"evidence serve is not ready:\n{self.logged()}")
            time.sleep(0.05)

    def logged(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def metrics(self) -> dict[str, float]:
        """The gate checks and overload rejections this process counted itself."""
        status, text = _get(self.base + "/metrics")
        found = {"checks": 0.0, "overloaded": 0.0, "commits": 0.0, "committed": 0.0}
        for line in text.splitlines() if status == 200 else []:
            value = line.rsplit(" ", 1)[-1]
            if line.startswith("evidence_gate_checks_total{"):
                found["checks"] += float(value)
            elif line.startswith("evidence_overload_rejections_total"):
                found["overloaded"] += float(value)
            elif line.startswith("evidence_group_commits_total "):
                found["commits"] += float(value)
            elif line.startswith("evidence_group_commit_jobs_total "):
                found["committed"] += float(value)
        return found

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=120)
        finally:
            assert self.proc.stdout is not None
            self.proc.stdout.close()
            self.log.close()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except OSError:
        return 0, ""


def gate_request(host: str, port: int, token: str) -> bytes:
    """An agent's passing input check, as raw HTTP/1.1 on a kept-alive connection."""
    return (
        f"POST /v1/gate/input HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(HTTP_BODY)}\r\n\r\n"
    ).encode() + HTTP_BODY


async def _agent(
    host: str, port: int, token: str, window: list[float], started: asyncio.Event
) -> Tally:
    """One agent: its own keep-alive connection, posting passing input gates."""
    reader, writer = await asyncio.open_connection(host, port)
    request = gate_request(host, port, token)
    tally = Tally()
    await started.wait()
    clock = time.monotonic
    try:
        while (start := clock()) < window[1]:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length)
            stop = clock()
            if status == 200 and b'"verdict":"pass"' in body:
                tally.done += 1
                if start >= window[0] and stop <= window[1]:
                    tally.latencies.append(stop - start)
            else:
                tally.status[status] = tally.status.get(status, 0) + 1
                if status != 503:
                    tally.errors += 1
                    tally.first_error = tally.first_error or body[:300].decode(errors="replace")
                await asyncio.sleep(RETRY_503_S)
    finally:
        writer.close()
    return tally


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a service's worker processes)."""
    found = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in task.read_text().split():
            found.extend(process_tree(int(child)))
    return found


def run_service(
    led: Ledger,
    services: int,
    agents: int,
    warmup: float,
    seconds: float,
    profile_to: str | None = None,
    workers: int = 1,
    extra_env: dict[str, str] | None = None,
) -> tuple[Tally, dict[str, float], dict[str, Any]]:
    servers: list[Service] = []
    try:
        for i in range(services):
            profiled = None if profile_to is None else f"{profile_to}.{i}"
            servers.append(Service(led, profiled, workers, extra_env))
        if profile_to is not None:
            for s in servers:
                s.proc.send_signal(signal.SIGUSR1)  # the main thread's profiler: on
        meter = CpuMeter(led, [p for s in servers for p in process_tree(s.proc.pid)], "client")

        async def load() -> list[Tally]:
            window: list[float] = []
            started = asyncio.Event()
            tasks = [
                asyncio.create_task(
                    _agent(
                        servers[i * services // agents].host,
                        servers[i * services // agents].port,
                        led.tokens[i],
                        window,
                        started,
                    )
                )
                for i in range(agents)
            ]
            await asyncio.sleep(0.2)  # the connections open
            now = time.monotonic()
            window[:] = [now + warmup, now + warmup + seconds]
            started.set()
            await asyncio.sleep(max(0.0, window[0] - time.monotonic()))
            meter.start()
            await asyncio.sleep(max(0.0, window[1] - time.monotonic()))
            cpu.update(meter.stop())
            return await asyncio.gather(*tasks)

        cpu: dict[str, float] = {}
        tallies = asyncio.run(load())
        counted = [s.metrics() for s in servers]
    finally:
        codes = [s.stop() for s in servers]
    total = Tally()
    for t in tallies:
        total.merge(t)
    extra = {
        "service_exit_codes": codes,
        "service_counted_checks": sum(c["checks"] for c in counted),
        "service_counted_overloads": sum(c["overloaded"] for c in counted),
        "per_service_checks": [c["checks"] for c in counted],
        # appends per group commit (one process's: with --workers, the one scraped)
        "jobs_per_commit": round(
            sum(c["committed"] for c in counted) / max(1.0, sum(c["commits"] for c in counted)),
            2,
        ),
    }
    return total, cpu, extra


# -- one scenario ----------------------------------------------------------------------------


SPEED_LOOP = 10_000_000


def python_speed_ms() -> float:
    """CPU milliseconds a fixed pure-Python loop takes: how fast this core is now. A
    virtual machine's cores slow down when its host is busy without the guest seeing it
    as load; this tells two runs apart."""
    started = time.process_time()
    total = 0
    for i in range(SPEED_LOOP):
        total += i
    return (time.process_time() - started) * 1e3


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def run_scenario(key: str, backend: str, pg_url: str, args: argparse.Namespace) -> dict[str, Any]:
    agents = args.agents
    workers = 1 if key in ("plane-1", "service-1") else agents
    with (
        fresh_ledger(backend, pg_url, agents, args.history, not args.stale_stats) as led,
        keys_env(led.env),
    ):
        load_before = os.getloadavg()[0]
        extra: dict[str, Any] = {}
        if MODES[key] == "service":
            services = 2 if key == "service-x2" else 1
            tally, cpu, extra = run_service(
                led,
                services,
                workers,
                args.warmup,
                args.seconds,
                workers=2 if key == "service-w2" else 1,
                extra_env={"EVIDENCE_CHECKPOINT_EVERY": "0.5"} if key == "service-ckpt" else None,
            )
            kind = "gate"
        else:
            kind = KINDS[key]
            if kind.startswith("raw"):
                create_raw_table(led.target)
            tally, cpu = run_workers(kind, MODES[key], workers, led, args.warmup, args.seconds)
        log = check_log(led, tally.done, kind)
    lat = sorted(tally.latencies)
    n = len(lat)
    rate = n / args.seconds
    per_op = 1000.0 / n if n else float("nan")  # ms of CPU per operation, per CPU-second
    return {
        "backend": backend,
        "scenario": key,
        "what": SCENARIOS[key],
        "mode": MODES[key],
        "workers": workers,
        "ops": n,
        "ops_per_s": round(rate, 1),
        "p50_ms": round(percentile(lat, 0.50) * 1e3, 2),
        "p90_ms": round(percentile(lat, 0.90) * 1e3, 2),
        "p99_ms": round(percentile(lat, 0.99) * 1e3, 2),
        "max_ms": round(lat[-1] * 1e3, 2) if lat else None,
        "mean_ms": round(statistics.fmean(lat) * 1e3, 2) if lat else None,
        "answered": tally.done,
        "errors": tally.errors,
        "first_error": tally.first_error,
        "status_503": tally.status.get(503, 0),
        "other_status": {k: v for k, v in tally.status.items() if k != 503},
        "cpu_ms_per_op": {
            "executor": round(cpu["executor_s"] * per_op, 3),
            "postgresql": round(cpu["pg_s"] * per_op, 3),
            "client": round(cpu["client_s"] * per_op, 3),
        },
        "machine_busy": round(cpu["machine_busy"], 3),
        "others_cores": round(cpu["others_s"] / args.seconds, 2),
        "loadavg_before": round(load_before, 2),
        "pg_connections": cpu["pg_connections"],
        "log": log,
        **extra,
    }


# -- --profile: cProfile of one service process, and the lock's anatomy in process ---------

# CPU ms per check, from the profiles: (label, callee, caller or None). A function is
# (file suffix, name); with a caller, only the calls from it count (``Authority.state``
# runs both before the lock, from ``gate_input``, and under it, from ``Plane.run``).
Fn = tuple[str, str]
_RUN: Fn = ("commands/plane/core.py", "run")
_GATE: Fn = ("commands/plane/gates.py", "gate_input")
_STATE: Fn = ("commands/plane/authority.py", "state")
_POLICY = "commands/plane/policy.py"
_ENGINE = "projections/engine.py"
_HTTPTOOLS = "uvicorn/protocols/http/httptools_impl.py"
WORKER_BREAKDOWN: list[tuple[str, Fn, Fn | None]] = [
    ("a request's plane work (worker threads)", ("commands/service/pool.py", "run"), None),
    (
        "  the policy: what is new since the last look",
        ("commands/plane/policy.py", "refresh"),
        None,
    ),
    ("  authenticate the credential", ("commands/service/auth.py", "credential_for"), None),
    ("  gate_input", _GATE, None),
    ("    the tool, before the lock", ("commands/plane/authority.py", "tool"), _GATE),
    ("    the schema check", ("commands/schemas/checker.py", "check"), _GATE),
    ("    Plane.run: the write transaction", _RUN, None),
    ("      lock, fold the plan's new events", _STATE, _RUN),
    ("      rules, delta, append", ("commands/plane/core.py", "_append"), _RUN),
    ("        store: encode, hash, insert", ("ledger/store.py", "append_batch"), None),
    (
        "        read models inline (none: deferred)",
        ("projections/engine.py", "apply_inline"),
        None,
    ),
    ("the read models' follower thread", ("commands/service/follower.py", "_catch_up"), None),
    ("  Ed25519 signature checks (all)", ("~", "<method 'verify' of"), None),
    ("  psycopg: statements (execute)", ("psycopg/cursor.py", "execute"), None),
    ("  psycopg: statements (executemany)", ("psycopg/cursor.py", "executemany"), None),
    ("  psycopg: waits on the server", ("psycopg/connection.py", "wait"), None),
]
MAIN_BREAKDOWN: list[tuple[str, Fn, Fn | None]] = [
    # (uvloop runs the loop in C: then only the loop's Python callbacks are seen)
    ("the event loop (main thread)", ("asyncio/base_events.py", "_run_once"), None),
    ("  uvicorn h11: read requests", ("uvicorn/protocols/http/h11_impl.py", "data_received"), None),
    ("  uvicorn h11: write answers", ("uvicorn/protocols/http/h11_impl.py", "send"), None),
    (
        "  uvicorn httptools: read requests",
        ("uvicorn/protocols/http/httptools_impl.py", "data_received"),
        None,
    ),
    (
        "  uvicorn httptools: write answers",
        ("uvicorn/protocols/http/httptools_impl.py", "send"),
        None,
    ),
    ("    the access log line", ("logging/__init__.py", "_log"), None),
    ("  Starlette and the service's route", ("commands/service/app.py", "answer"), None),
    ("    the body: read, parse, check", ("commands/service/app.py", "_body"), None),
    ("    hand-offs to worker threads", ("anyio/to_thread.py", "run_sync"), None),
]


def _matches(key: tuple[str, int, str], fn: Fn) -> bool:
    filename, _line, name = key
    suffix, wanted = fn
    if wanted.startswith("<"):  # a builtin: its name says whose method it is
        return name.startswith(wanted)
    return name == wanted and filename.endswith(suffix)


def cum_per(stats: pstats.Stats, fn: Fn, caller: Fn | None, n: int) -> tuple[float, float] | None:
    """ms of cumulative time and calls, per check, of ``fn`` (only its calls from
    ``caller``, if given); None when it never ran."""
    total, calls, found = 0.0, 0, False
    for key, (_cc, nc, _tt, ct, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if not _matches(key, fn):
            continue
        if caller is None:
            total, calls, found = total + ct, calls + nc, True
            continue
        for who, (_c, from_nc, _t, from_ct) in callers.items():
            if _matches(who, caller):
                total, calls, found = total + from_ct, calls + from_nc, True
    return (total / n * 1e3, calls / n) if found and n else None


def top_own(stats: pstats.Stats, n_checks: int, top: int) -> list[dict[str, Any]]:
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
    out = []
    for (filename, line, fn), (_cc, nc, tt, ct, _callers) in rows[:top]:
        short = filename
        for marker in ("site-packages/", f"{CODE}/", f"{REPO}/", "lib/python3.11/"):
            if marker in filename:
                short = filename.split(marker, 1)[1]
                break
        out.append(
            {
                "function": f"{fn} ({short}:{line})" if line else fn,
                "calls_per_check": round(nc / n_checks, 2),
                "own_ms_per_check": round(tt / n_checks * 1e3, 3),
                "cum_ms_per_check": round(ct / n_checks * 1e3, 3),
            }
        )
    return out


def profile_service(pg_url: str, args: argparse.Namespace, out_dir: str) -> dict[str, Any]:
    """One service process under the same load, every thread under cProfile."""
    prefix = f"{out_dir}/service"
    with fresh_ledger("postgresql", pg_url, args.agents) as led, keys_env(led.env):
        tally, cpu, _extra = run_service(
            led, 1, args.agents, args.warmup, args.seconds, profile_to=prefix
        )
    served = tally.done  # every check this process answered, warm-up included
    result: dict[str, Any] = {
        "checks_per_s_under_profiler": round(len(tally.latencies) / args.seconds, 1),
        "checks_profiled": served,
        "files": [f"{prefix}.0.main", f"{prefix}.0.workers"],
        "cpu_ms_per_check_service": round(
            cpu["executor_s"] * 1e3 / max(1, len(tally.latencies)), 3
        ),
    }
    for part, table in (("workers", WORKER_BREAKDOWN), ("main", MAIN_BREAKDOWN)):
        path = f"{prefix}.0.{part}"
        if not os.path.exists(path):
            continue
        stats = pstats.Stats(path)
        result[f"{part}_breakdown"] = [
            {
                "what": label,
                "ms_per_check": None if v is None else round(v[0], 3),
                "calls_per_check": None if v is None else round(v[1], 2),
            }
            for label, fn, caller in table
            for v in [cum_per(stats, fn, caller, served)]
        ]
        result[f"{part}_top"] = top_own(stats, served, args.profile_top)
        result[f"{part}_total_own_ms_per_check"] = round(
            stats.total_tt / served * 1e3,  # type: ignore[attr-defined]
            3,
        )
    return result


ANATOMY_FIELDS = (
    "stmts",
    "locked_stmts",
    "write_txs",
    "read_txs",
    "wait",
    "hold",
    "positions",
    "fold",
    "append",
    "store",
    "models",
    "commit",
    "before_lock",
)


def anatomy(pg_url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The in-process plane on PostgreSQL, one writer and N, with the ledger lock timed
    and what happens under it split, and the statements and transactions counted: the
    store's write path, a few plane methods and psycopg's cursor methods are wrapped, in
    this process only, for this pass only."""
    import psycopg

    from commands.plane.authority import Authority
    from commands.plane.core import Plane
    from ledger.backends.postgres import PostgresBackend
    from ledger.store import Store, WriteTx
    from projections.engine import ProjectionEngine

    local = threading.local()
    records: list[dict[str, float]] = []
    patched: list[tuple[type, str, Any]] = []

    def patch(cls: type, name: str, make: Callable[[Any], Any]) -> None:
        original = cls.__dict__[name]
        patched.append((cls, name, original))
        setattr(cls, name, make(original))

    def rec() -> dict[str, float] | None:
        return getattr(local, "rec", None)

    def counting(orig: Any) -> Any:
        def wrapper(self: Any, *a: Any, **k: Any) -> Any:
            if (r := rec()) is not None:
                r["locked_stmts" if getattr(local, "locked_at", None) else "stmts"] += 1
            return orig(self, *a, **k)

        return wrapper

    def locking(orig: Any) -> Any:  # the call that takes the head's row lock
        def wrapper(self: Any, *a: Any, **k: Any) -> Any:
            found = orig(self, *a, **k)
            if getattr(local, "in_tx", False) and local.locked_at is None:
                local.locked_at = time.perf_counter()
            return found

        return wrapper

    def timing(field_: str, *, under_lock: bool) -> Callable[[Any], Any]:
        """Add the call's duration to ``field_`` when it runs under the lock (or, with
        ``under_lock=False``, when it runs outside any write transaction)."""

        def make(orig: Any) -> Any:
            def wrapper(*a: Any, **k: Any) -> Any:
                started = time.perf_counter()
                try:
                    return orig(*a, **k)
                finally:
                    r = rec()
                    inside = getattr(local, "in_tx", False)
                    if r is not None and inside == under_lock:
                        r[field_] += time.perf_counter() - max(
                            started, local.locked_at or started if inside else started
                        )

            return wrapper

        return make

    def write_cursor(orig: Any) -> Any:
        @contextmanager
        def wrapper(self: Any) -> Iterator[Any]:
            started = time.perf_counter()
            local.in_tx, local.locked_at, body_end = True, None, None
            try:
                with orig(self) as cursors:
                    yield cursors
                    body_end = time.perf_counter()
            finally:
                ended = time.perf_counter()
                if (r := rec()) is not None:
                    locked = local.locked_at or ended
                    r["write_txs"] += 1
                    r["wait"] += locked - started
                    r["hold"] += ended - locked
                    r["commit"] += ended - (body_end or ended)
                local.in_tx, local.locked_at = False, None

        return wrapper

    def on_begin(_conn: Any) -> None:
        if (r := rec()) is not None:
            r["read_txs"] += 1

    patch(psycopg.Cursor, "execute", counting)
    patch(psycopg.Cursor, "executemany", counting)
    patch(Store, "_write_cursor", write_cursor)
    patch(WriteTx, "head_size", locking)
    patch(PostgresBackend, "read_head_locked", locking)
    patch(ProjectionEngine, "behind", timing("positions", under_lock=True))
    patch(Authority, "state", timing("fold", under_lock=True))
    patch(Plane, "_append", timing("append", under_lock=True))
    patch(WriteTx, "append_batch", timing("store", under_lock=True))
    patch(ProjectionEngine, "apply_inline", timing("models", under_lock=True))
    patch(Authority, "state", timing("before_lock", under_lock=False))
    sa.event.listen(sa.engine.Engine, "begin", on_begin)
    seconds = min(args.seconds, 5.0)
    try:
        return [
            _anatomy_pass(pg_url, args, writers, seconds, local, records)
            for writers in (1, args.agents)
        ]
    finally:
        for cls, name, original in reversed(patched):
            setattr(cls, name, original)
        sa.event.remove(sa.engine.Engine, "begin", on_begin)


def _anatomy_pass(
    pg_url: str,
    args: argparse.Namespace,
    writers: int,
    seconds: float,
    local: threading.local,
    records: list[dict[str, float]],
) -> dict[str, Any]:
    """``writers`` threads checking through the instrumented plane (see ``anatomy``)."""
    records.clear()
    with fresh_ledger("postgresql", pg_url, args.agents) as led, keys_env(led.env):
        spec = led.spec()
        ops = [open_op("gate", spec, i) for i in range(writers)]
        window: list[float] = []
        ready = threading.Barrier(writers + 1)

        def work(i: int) -> None:
            op = ops[i][0]
            ready.wait()
            clock = time.monotonic
            while (start := clock()) < window[1]:
                local.rec = dict.fromkeys(ANATOMY_FIELDS, 0.0)
                op()
                stop = clock()
                rec, local.rec = local.rec, None
                if start >= window[0] and stop <= window[1]:
                    rec["latency"] = stop - start
                    records.append(rec)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(writers)]
        for t in threads:
            t.start()
        now = time.monotonic()
        window[:] = [now + args.warmup, now + args.warmup + seconds]
        ready.wait()
        for t in threads:
            t.join()
        for _op, close in ops:
            close()
    n = len(records)

    def ms(key: str) -> float:
        return round(sum(r[key] for r in records) / n * 1e3, 3) if n else float("nan")

    hold = ms("hold")
    parts = ("positions", "fold", "append", "commit")
    return {
        "writers": writers,
        "checks_per_s": round(n / seconds, 1),
        "latency_ms": ms("latency"),
        "lock_wait_ms": ms("wait"),
        "lock_hold_ms": hold,
        "outside_lock_ms": round(ms("latency") - ms("wait") - hold, 3),
        "ceiling_per_s": round(1e3 / hold, 1) if hold else None,
        "hold_positions_ms": ms("positions"),
        "hold_fold_ms": ms("fold"),
        "hold_append_ms": ms("append"),
        "hold_append_store_ms": ms("store"),
        "hold_append_models_ms": ms("models"),
        "hold_commit_ms": ms("commit"),
        "hold_other_ms": round(hold - sum(ms(p) for p in parts), 3),
        "reads_before_lock_ms": ms("before_lock"),
        "statements": round(sum(r["stmts"] + r["locked_stmts"] for r in records) / n, 2),
        "statements_under_lock": round(sum(r["locked_stmts"] for r in records) / n, 2),
        "write_txs": round(sum(r["write_txs"] for r in records) / n, 2),
        "read_txs": round(sum(r["read_txs"] for r in records) / n, 2),
    }


# -- output ----------------------------------------------------------------------------------


def print_results(out: Any, rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    table = Table(
        title=f"gated checks through the service, side by side ({args.agents} agents/workers, "
        + (f"{args.history:,} events in the log before each, " if args.history else "")
        + f"{args.seconds:g} s after {args.warmup:g} s warm-up; ms; x floor: ops/s over "
        f"Store.append x{args.agents} threads, same backend; target {TARGET_RATE:.0f}/s, "
        f"p99 <= {TARGET_P99_MS:.0f} ms)",
        title_justify="left",
    )
    for col in (
        "backend",
        "scenario",
        "what",
        "by",
        "ops/s",
        "p50",
        "p99",
        "x floor",
        "x target",
        "met",
        "503",
        "CPU ms/op exec/pg/cli",
        "busy (others)",
        "log",
    ):
        table.add_column(col, justify="left" if col in ("backend", "scenario", "what") else "right")
    floors = {r["backend"]: r["ops_per_s"] for r in rows if r["scenario"] == FLOOR}
    for r in rows:
        floor = floors.get(r["backend"])
        by = {"thread": "threads", "process": "procs", "service": "agents"}[r["mode"]]
        cpu = r["cpu_ms_per_op"]
        is_target = r["mode"] == "service" and r["backend"] == "postgresql"
        met = ("[green]yes[/]" if r["met"] else "[red]no[/]") if is_target and "met" in r else "-"
        log = r["log"]
        table.add_row(
            r["backend"],
            r["scenario"],
            r["what"],
            f"{r['workers']} {by}",
            f"{r['ops_per_s']:.0f}",
            f"{r['p50_ms']:.1f}",
            f"{r['p99_ms']:.1f}",
            f"{r['ops_per_s'] / floor:.2f}x" if floor else "-",
            f"{r['ops_per_s'] / TARGET_RATE:.2f}x",
            met,
            str(r["status_503"]) if r["mode"] == "service" else "-",
            f"{cpu['executor']:.2f}/{cpu['postgresql']:.2f}/{cpu['client']:.2f}",
            f"{r['machine_busy']:.0%} ({r['others_cores']:.1f})",
            "ok" if log["ok"] else "[red]FAILED[/]",
        )
    out.print(table)
    for r in rows:
        if r["errors"] or not r["log"]["ok"] or r["other_status"]:
            out.print(
                f"[red]{r['backend']} {r['scenario']}[/]: errors {r['errors']} "
                f"({r['first_error']}), statuses {r['other_status']}, log {r['log']}"
            )
    one = {r["backend"]: r for r in rows if r["scenario"] == "service"}
    for r in rows:
        if r["scenario"] == "service-x2" and r["backend"] in one:
            base = one[r["backend"]]["ops_per_s"]
            out.print(
                f"{r['backend']}: two services {r['ops_per_s']:.0f}/s against one "
                f"{base:.0f}/s = {r['ops_per_s'] / base:.2f}x (target: not slower, >= 1x); "
                f"checks each counted (its /metrics, warm-up included): "
                f"{[int(c) for c in r['per_service_checks']]}"
            )
        if r["scenario"] == "service-ckpt" and r["backend"] in one:
            base = one[r["backend"]]["ops_per_s"]
            out.print(
                f"{r['backend']}: with a checkpoint every 0.5 s {r['ops_per_s']:.0f}/s against "
                f"{base:.0f}/s = {r['ops_per_s'] / base:.2f}x (target: within 10%, >= 0.90x)"
            )


def print_profile(out: Any, prof: dict[str, Any]) -> None:
    out.print(
        f"\n[bold]cProfile, one service process[/] ({prof['checks_profiled']} checks; "
        f"{prof['checks_per_s_under_profiler']}/s under the profiler; files "
        f"{', '.join(prof['files'])})"
    )
    for part in ("workers", "main"):
        if f"{part}_breakdown" not in prof:
            continue
        total = prof[f"{part}_total_own_ms_per_check"]
        table = Table(
            title=f"{part} thread(s): CPU ms per check under the profiler, cumulative "
            f"(all their functions: {total} ms)",
            title_justify="left",
        )
        table.add_column("what")
        table.add_column("CPU ms/check", justify="right")
        table.add_column("share", justify="right")
        table.add_column("calls/check", justify="right")
        for row in prof[f"{part}_breakdown"]:
            v = row["ms_per_check"]
            table.add_row(
                row["what"],
                "-" if v is None else f"{v:.3f}",
                "-" if v is None or not total else f"{v / total:.0%}",
                "-" if v is None else f"{row['calls_per_check']:.2f}",
            )
        out.print(table)
        top = Table(title=f"{part} thread(s): top functions by own CPU time", title_justify="left")
        for col in ("function", "calls/check", "own ms/check", "cum ms/check"):
            top.add_column(col, justify="left" if col == "function" else "right")
        for row in prof[f"{part}_top"]:
            top.add_row(
                row["function"],
                f"{row['calls_per_check']:.2f}",
                f"{row['own_ms_per_check']:.3f}",
                f"{row['cum_ms_per_check']:.3f}",
            )
        out.print(top)


ANATOMY_ROWS = (
    ("checks per second", "checks_per_s"),
    ("latency, ms", "latency_ms"),
    ("  waiting for the ledger lock", "lock_wait_ms"),
    ("  holding it", "lock_hold_ms"),
    ("    read-model positions (behind)", "hold_positions_ms"),
    ("    fold the plan's new events", "hold_fold_ms"),
    ("    rules, delta, append, read models", "hold_append_ms"),
    ("      the store: encode, hash, queue the insert", "hold_append_store_ms"),
    ("      read models inline", "hold_append_models_ms"),
    ("    commit: the queued writes and the fsync", "hold_commit_ms"),
    ("    the rest", "hold_other_ms"),
    ("  outside the lock", "outside_lock_ms"),
    ("    of which reading the tool and the plan", "reads_before_lock_ms"),
    ("ceiling: 1 / hold, checks per second", "ceiling_per_s"),
    ("statements per check", "statements"),
    ("  of which under the lock", "statements_under_lock"),
    ("write transactions per check", "write_txs"),
    ("read transactions per check", "read_txs"),
)


def print_anatomy(out: Any, rows: list[dict[str, Any]]) -> None:
    table = Table(
        title="the in-process plane (threads, a Plane each) on PostgreSQL, instrumented; per check",
        title_justify="left",
    )
    table.add_column("measure")
    for r in rows:
        table.add_column(f"{r['writers']} writer(s)", justify="right")
    for label, key in ANATOMY_ROWS:
        table.add_row(label, *(str(r[key]) for r in rows))
    out.print(table)


# -- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="timed window per scenario")
    ap.add_argument("--warmup", type=float, default=2.0, help="untimed seconds before it")
    ap.add_argument("--agents", type=int, default=8, help="agents (service), workers (others)")
    ap.add_argument("--only", default="", help="comma-separated scenario keys (default: all)")
    ap.add_argument("--skip-sqlite", action="store_true")
    ap.add_argument(
        "--history",
        type=int,
        default=0,
        help="events already in the log before each scenario (a ledger in use for a while)",
    )
    ap.add_argument(
        "--stale-stats",
        action="store_true",
        help="with --history, no ANALYZE after it (PostgreSQL's statistics of a fresh table)",
    )
    run = start_run(ap, argv, "one service process under load (and time the ledger lock)")
    args, out = run.args, run.out
    only = [k for k in args.only.split(",") if k]
    unknown = set(only) - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown scenario(s) {sorted(unknown)}: choose from {list(SCENARIOS)}")
    backends = [b for b in ("postgresql", "sqlite") if b in run.backends]
    if args.skip_sqlite:
        backends.remove("sqlite")
    run.info["code"] = CODE
    load = os.getloadavg()
    run.info["loadavg"] = " ".join(f"{v:.2f}" for v in load)
    run.info["python_speed_ms"] = f"{python_speed_ms():.0f}"
    if not args.json:
        out.print(f"load average at start: {run.info['loadavg']}")
        out.print(
            f"this core's speed: {run.info['python_speed_ms']} ms of CPU for {SPEED_LOOP:,} "
            "additions in a Python loop (the same host has measured ~550 to ~1000: "
            "compare runs by it)"
        )
    rows: list[dict[str, Any]] = []
    for backend in backends:
        for key in BACKEND_SCENARIOS[backend]:
            if only and key not in only:
                continue
            row = run_scenario(key, backend, run.pg_url or "", args)
            if row["mode"] == "service" and backend == "postgresql":
                row["met"] = row["ops_per_s"] >= TARGET_RATE and row["p99_ms"] <= TARGET_P99_MS
            rows.append(row)
            batch = (
                f", {row['jobs_per_commit']} appends per commit"
                if row.get("jobs_per_commit")
                else ""
            )
            out.print(
                f"{backend} {key}: {row['ops_per_s']:.0f}/s, p50 {row['p50_ms']:.1f} ms, "
                f"p99 {row['p99_ms']:.1f} ms{batch}, log {'ok' if row['log']['ok'] else 'FAILED'}"
            )
    run.info["loadavg_end"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
    run.info["python_speed_ms_end"] = f"{python_speed_ms():.0f}"
    print_results(out, rows, args)
    out.print(f"load average: {run.info['loadavg']} at start, {run.info['loadavg_end']} at end")
    out.print(
        f"this core's speed: {run.info['python_speed_ms']} ms at start, "
        f"{run.info['python_speed_ms_end']} ms at end"
    )
    profile: dict[str, Any] = {}
    if args.profile and run.pg_url is None:
        out.print("[yellow]--profile needs PostgreSQL: skipped[/]")
    if args.profile and run.pg_url is not None:
        out_dir = tempfile.mkdtemp(prefix="evb-service-profile-")
        profile["service"] = profile_service(run.pg_url, args, out_dir)
        print_profile(out, profile["service"])
        profile["anatomy"] = anatomy(run.pg_url, args)
        print_anatomy(out, profile["anatomy"])
    if args.json:
        print(
            json.dumps(
                {
                    "machine": run.info,
                    "config": {
                        "seconds": args.seconds,
                        "warmup": args.warmup,
                        "agents": args.agents,
                        "history": args.history,
                        "stale_stats": args.stale_stats,
                        "target_rate": TARGET_RATE,
                        "target_p99_ms": TARGET_P99_MS,
                    },
                    "results": rows,
                    "profile": profile,
                },
                indent=2,
            )
        )
    failed = [r for r in rows if not r["log"]["ok"] or r["errors"]]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
