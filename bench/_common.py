"""Shared helpers for the benchmarks: fresh databases, the workload, timing, output.

Nothing here writes into the repository: SQLite files live in a temporary directory and
PostgreSQL data in a throw-away schema that is dropped at the end.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import os
import platform
import pstats
import secrets
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import sqlalchemy as sa
from rich.console import Console
from rich.table import Table
from ulid import ULID

from ledger.canonical import canonical_json
from ledger.events import Deviation, GateChecked, NewEvent

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
PG_ENV_VARS = ("EVIDENCE_BENCH_POSTGRES_URL", "EVIDENCE_TEST_POSTGRES_URL")

# The column list of ledger/tables.py `events`, in the store's insert order.
COLUMNS = (
    "position, event_id, stream, stream_version, type, schema_version, recorded_at, "
    "actor, correlation_id, causation_id, payload, delta, leaf_hash, chain_hash"
)

# The raw baseline table: the same columns, types, keys and indexes as `events`
# (ledger/tables.py as compiled by SQLAlchemy for each dialect), under other names so it
# can share a PostgreSQL schema with the ledger's own tables. No triggers, no head row.
# The "floor" baseline adds what the design itself costs: a one-row head written in the
# same transaction as the insert (DESIGN.md: appends are serialised through it).
RAW_HEAD_DDL = (
    "CREATE TABLE raw_head (id INTEGER PRIMARY KEY, size BIGINT NOT NULL, "
    "chain_hash BLOB NOT NULL, frontier BLOB NOT NULL)"
)
RAW_HEAD_ROW = "INSERT INTO raw_head VALUES (1, 0, '', '')"

RAW_DDL = {
    "sqlite": [
        """CREATE TABLE raw_events (
            position INTEGER NOT NULL,
            event_id VARCHAR(26) NOT NULL,
            stream TEXT NOT NULL,
            stream_version BIGINT NOT NULL,
            type VARCHAR(80) NOT NULL,
            schema_version INTEGER NOT NULL,
            recorded_at VARCHAR(32) NOT NULL,
            actor TEXT NOT NULL,
            correlation_id VARCHAR(26),
            causation_id VARCHAR(26),
            payload BLOB NOT NULL,
            delta BLOB NOT NULL,
            leaf_hash BLOB NOT NULL,
            chain_hash BLOB NOT NULL,
            PRIMARY KEY (position),
            CONSTRAINT uq_raw_events_event_id UNIQUE (event_id),
            CONSTRAINT uq_raw_events_stream_version UNIQUE (stream, stream_version)
        )""",
        "CREATE INDEX ix_raw_events_type ON raw_events (type)",
        RAW_HEAD_DDL,
        RAW_HEAD_ROW,
    ],
    "postgresql": [
        """CREATE TABLE raw_events (
            position BIGINT NOT NULL,
            event_id VARCHAR(26) NOT NULL,
            stream TEXT NOT NULL,
            stream_version BIGINT NOT NULL,
            type VARCHAR(80) NOT NULL,
            schema_version INTEGER NOT NULL,
            recorded_at VARCHAR(32) NOT NULL,
            actor TEXT NOT NULL,
            correlation_id VARCHAR(26),
            causation_id VARCHAR(26),
            payload BYTEA NOT NULL,
            delta BYTEA NOT NULL,
            leaf_hash BYTEA NOT NULL,
            chain_hash BYTEA NOT NULL,
            PRIMARY KEY (position),
            CONSTRAINT uq_raw_events_event_id UNIQUE (event_id),
            CONSTRAINT uq_raw_events_stream_version UNIQUE (stream, stream_version)
        )""",
        "CREATE INDEX ix_raw_events_type ON raw_events (type)",
        RAW_HEAD_DDL.replace("BLOB", "BYTEA"),
        RAW_HEAD_ROW,
    ],
}

REPO = str(Path(__file__).resolve().parent.parent)


def _console(*, stderr: bool = False) -> Console:
    out = Console(stderr=stderr)
    if not out.is_terminal:
        out.width = 150  # piped or captured: do not wrap the tables at 80 columns
    return out


console = _console()
err_console = _console(stderr=True)


# -- PostgreSQL -------------------------------------------------------------------------


def pg_base_url(cli_value: str | None) -> str:
    if cli_value:
        return cli_value
    for name in PG_ENV_VARS:
        if os.environ.get(name):
            return os.environ[name]
    return DEFAULT_PG_URL


def add_common_args(ap: argparse.ArgumentParser, what_profile: str | None) -> None:
    """The options every benchmark takes (see docs/performance.md); ``--profile`` only
    where there is something to profile (``what_profile``)."""
    ap.add_argument("--stat", choices=("median", "best"), default="median")
    ap.add_argument(
        "--postgres",
        metavar="URL",
        default=None,
        help="PostgreSQL server (default: $EVIDENCE_BENCH_POSTGRES_URL, "
        "$EVIDENCE_TEST_POSTGRES_URL or postgresql+psycopg://"
        "postgres@127.0.0.1:5432/test)",
    )
    ap.add_argument("--skip-postgres", action="store_true")
    ap.add_argument("--json", action="store_true", help="print JSON on stdout")
    if what_profile is not None:
        ap.add_argument(
            "--profile",
            action="store_true",
            help=f"also cProfile {what_profile} and print the hot spots",
        )
        ap.add_argument("--profile-top", type=int, default=5)


@dataclass
class Run:
    """A benchmark's parsed options, where it prints, its backends and the machine."""

    args: argparse.Namespace
    out: Console
    backends: list[str]
    pg_url: str | None
    info: dict[str, str]


def start_run(ap: argparse.ArgumentParser, argv: list[str] | None, what_profile: str | None) -> Run:
    """Parse the options (with the common ones), pick the backends and print the
    machine: the start every benchmark's ``main`` shares."""
    add_common_args(ap, what_profile)
    args = ap.parse_args(argv)
    backends, pg_url = select_backends(args)
    info = machine_info(pg_url)
    if not args.json:
        print_machine(info)
    return Run(args, err_console if args.json else console, backends, pg_url, info)


def select_backends(args: argparse.Namespace) -> tuple[list[str], str | None]:
    """SQLite always; PostgreSQL unless skipped or unreachable (then say why)."""
    backends = ["sqlite"]
    pg_url: str | None = None
    if not args.skip_postgres:
        pg_url = pg_base_url(args.postgres)
        why = pg_unreachable(pg_url)
        if why:
            err_console.print(f"[yellow]skipping PostgreSQL: {why}[/]")
            pg_url = None
        else:
            backends.append("postgresql")
    return backends, pg_url


def pg_conninfo(url: str) -> str:
    """The libpq URI psycopg takes, from a SQLAlchemy-style URL."""
    parsed = sa.engine.make_url(url).set(drivername="postgresql", query={})
    return parsed.render_as_string(hide_password=False)


def pg_unreachable(url: str) -> str | None:
    """None if the server answers, else why not (so the caller can skip PostgreSQL)."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install -e '.[postgres]')"
    try:
        with psycopg.connect(pg_conninfo(url), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"cannot reach PostgreSQL at {url}: {exc}".strip()
    return None


def pg_server_version(url: str) -> str:
    import psycopg

    with psycopg.connect(pg_conninfo(url), connect_timeout=3) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"


@dataclass
class Target:
    """One fresh database for one benchmark run: the ledger URL and how to reach it raw."""

    backend: str  # "sqlite" | "postgresql"
    ledger_url: str
    sqlite_path: Path | None = None  # the ledger's file (SQLite)
    raw_sqlite_path: Path | None = None  # the raw table's file (SQLite)
    conninfo: str | None = None  # libpq URI (PostgreSQL)
    schema: str | None = None  # the throw-away schema (PostgreSQL)

    def raw_connect(self) -> Any:
        """A raw driver connection for the baseline, configured like the ledger's."""
        if self.backend == "sqlite":
            assert self.raw_sqlite_path is not None
            return raw_sqlite_connect(self.raw_sqlite_path)
        assert self.conninfo is not None and self.schema is not None
        return raw_pg_connect(self.conninfo, self.schema)

    def ledger_raw_connect(self) -> Any:
        """A raw driver connection onto the ledger's own tables (verify baseline)."""
        if self.backend == "sqlite":
            assert self.sqlite_path is not None
            return raw_sqlite_connect(self.sqlite_path)
        assert self.conninfo is not None and self.schema is not None
        return raw_pg_connect(self.conninfo, self.schema)


@contextmanager
def fresh_sqlite() -> Iterator[Target]:
    """Two new SQLite files (ledger, raw) in a temporary directory outside the repo."""
    with tempfile.TemporaryDirectory(prefix="evb-") as tmp:
        path = Path(tmp) / "ledger.db"
        yield Target(
            "sqlite", f"sqlite:///{path}", sqlite_path=path, raw_sqlite_path=Path(tmp) / "raw.db"
        )


@contextmanager
def fresh_pg_schema(base_url: str) -> Iterator[Target]:
    """A new schema evb_<random>; the ledger reaches it through search_path in the URL."""
    import psycopg

    name = f"evb_{secrets.token_hex(6)}"
    conninfo = pg_conninfo(base_url)
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{name}"')
    url = (
        sa.engine.make_url(base_url)
        .set(drivername="postgresql+psycopg")
        .update_query_dict({"options": f"-csearch_path={name}"})
        .render_as_string(hide_password=False)
    )
    try:
        yield Target("postgresql", url, conninfo=conninfo, schema=name)
    finally:
        with psycopg.connect(conninfo, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{name}" CASCADE')


@contextmanager
def fresh_target(backend: str, pg_url: str) -> Iterator[Target]:
    if backend == "sqlite":
        with fresh_sqlite() as target:
            yield target
    else:
        with fresh_pg_schema(pg_url) as target:
            yield target


def raw_sqlite_connect(path: Path) -> sqlite3.Connection:
    # The store's pragmas (ledger/backends/sqlite.py), and explicit transactions.
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 60000")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def raw_pg_connect(conninfo: str, schema: str) -> Any:
    import psycopg

    # Default server settings; psycopg opens a transaction on the first statement.
    conn = psycopg.connect(conninfo)
    conn.execute(f'SET search_path TO "{schema}"')
    conn.commit()
    return conn


def create_raw_table(target: Target) -> None:
    conn = target.raw_connect()
    try:
        if target.backend == "sqlite":
            conn.execute("BEGIN")
        for ddl in RAW_DDL[target.backend]:
            conn.execute(ddl)
            if "raw_events" in ddl:  # the floor side gets its own copy of the table
                conn.execute(ddl.replace("raw_events", "floor_events"))
        conn.commit() if target.backend == "postgresql" else conn.execute("COMMIT")
    finally:
        conn.close()


# -- workload ---------------------------------------------------------------------------

STREAMS = 64  # plans the events are spread over (each append goes to one plan stream)
ACTOR = "agent:validator"
_TOOLS = ("http.get", "fs.read", "git.diff", "shell.exec", "sql.query")


def gate_checked(i: int, plan: int) -> GateChecked:
    """A realistic gate check (~300 bytes canonical); one in ten fails with a deviation."""
    failed = i % 10 == 9
    return GateChecked(
        plan_id=f"P-{plan:04d}",
        gate="output" if i % 2 else "input",
        tool=_TOOLS[i % len(_TOOLS)],
        tool_version=1 + i % 3,
        step=f"step-{i % 7}",
        verdict="fail" if failed else "pass",
        deviations=[
            Deviation(
                pointer="/items/0/id", kind="wrong_type", expected="string", actual_type="integer"
            )
        ]
        if failed
        else [],
        attempt=1 + i % 3,
        iteration=i % 5,
        strict_mode=True,
        checked_sha256=hashlib.sha256(i.to_bytes(8, "big")).hexdigest(),
    )


@dataclass
class Batch:
    """One transaction's worth of events, in the ledger's form and the raw table's form."""

    stream: str
    events: list[NewEvent]
    raw_rows: list[tuple[Any, ...]] = field(default_factory=list)


@dataclass
class Workload:
    """Builds batches; positions and stream versions continue from batch to batch, so
    the raw rows are exactly what the ledger would store (bar the hashes)."""

    next_event: int = 0
    next_txn: int = 0
    position: int = 0
    versions: dict[str, int] = field(default_factory=dict)
    recorded_at: str = field(
        default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    )

    def batches(self, n_events: int, per_txn: int, *, raw: bool = True) -> list[Batch]:
        out = []
        for start in range(0, n_events, per_txn):
            out.append(self.batch(min(per_txn, n_events - start), raw=raw))
        return out

    def batch(self, size: int, *, raw: bool = True) -> Batch:
        plan = self.next_txn % STREAMS
        self.next_txn += 1
        stream = f"plan:P-{plan:04d}"
        correlation = str(ULID())  # one run id per transaction, as a validator would
        events = []
        raw_rows = []
        for _ in range(size):
            payload = gate_checked(self.next_event, plan)
            self.next_event += 1
            events.append(NewEvent(payload=payload, actor=ACTOR, correlation_id=correlation))
            if raw:
                self.position += 1
                version = self.versions.get(stream, 0) + 1
                self.versions[stream] = version
                raw_rows.append(
                    (
                        self.position,
                        str(ULID()),
                        stream,
                        version,
                        GateChecked.type_name(),
                        GateChecked.SCHEMA_VERSION,
                        self.recorded_at,
                        ACTOR,
                        correlation,
                        None,
                        canonical_json(msgspec.to_builtins(payload)),
                        b"[]",
                        DUMMY_HASH,
                        DUMMY_HASH,
                    )
                )
        return Batch(stream, events, raw_rows)


DUMMY_HASH = bytes(range(32))


def mean_payload_size(batches: Sequence[Batch]) -> float:
    sizes = [len(row[10]) for b in batches for row in b.raw_rows]
    return sum(sizes) / len(sizes) if sizes else 0.0


# -- timing and reporting ---------------------------------------------------------------


def timed(fn: Callable[[], object]) -> float:
    """Wall-clock seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def pick(samples: Sequence[float], stat: str) -> float:
    return min(samples) if stat == "best" else statistics.median(samples)


def profile_top(fn: Callable[[], object], top: int = 5) -> list[dict[str, Any]]:
    """Run ``fn`` under cProfile; the ``top`` functions by own time (tottime)."""
    prof = cProfile.Profile()
    prof.enable()
    try:
        fn()
    finally:
        prof.disable()
    stats = pstats.Stats(prof, stream=io.StringIO())
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    for (filename, line, name), (_cc, ncalls, tottime, cumtime, _callers) in sorted(
        stats.stats.items(),
        key=lambda kv: kv[1][2],
        reverse=True,  # type: ignore[attr-defined]
    )[:top]:
        short = filename
        for marker in ("site-packages/", f"{REPO}/"):
            if marker in filename:
                short = filename.split(marker, 1)[1]
                break
        rows.append(
            {
                "function": f"{name} ({short}:{line})" if line else name,
                "ncalls": ncalls,
                "tottime_s": round(tottime, 4),
                "cumtime_s": round(cumtime, 4),
                "share": round(tottime / total, 3) if total else 0.0,
            }
        )
    return rows


def results_table(title: str, columns: Sequence[str]) -> Table:
    """A bench's table: its first column (what a row is) to the left, the figures right."""
    table = Table(title=title, title_justify="left")
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    return table


def met_cell(met: bool) -> str:
    """A target's cell: met or not, in colour."""
    return "[green]yes[/]" if met else "[red]no[/]"


def print_profile(out: Console, title: str, rows: list[dict[str, Any]]) -> None:
    table = Table(title=title, title_justify="left")
    for col in ("function", "ncalls", "tottime s", "share", "cumtime s"):
        table.add_column(col, justify="left" if col == "function" else "right")
    for r in rows:
        table.add_row(
            r["function"],
            str(r["ncalls"]),
            f"{r['tottime_s']:.3f}",
            f"{r['share']:.0%}",
            f"{r['cumtime_s']:.3f}",
        )
    out.print(table)


def machine_info(pg_url: str | None) -> dict[str, str]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor() or "?"
    info = {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "msgspec": msgspec.__version__,
        "sqlalchemy": sa.__version__,
        "ledger": ledger_revision(),
    }
    try:
        import psycopg

        info["psycopg"] = psycopg.__version__
    except ImportError:
        pass
    if pg_url is not None:
        try:
            info["postgresql"] = pg_server_version(pg_url)
        except Exception:
            info["postgresql"] = "?"
    return info


def ledger_revision() -> str:
    """The commit the measured code is at, and whether ledger/ has uncommitted edits."""
    import ledger

    package = Path(ledger.__file__).resolve().parent
    if package != Path(REPO) / "ledger":  # e.g. PYTHONPATH pointing at another checkout
        return f"imported from {package}"
    try:
        head = subprocess.run(
            ["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", REPO, "status", "--porcelain", "--", "ledger"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return f"{head}{' + uncommitted ledger/ changes' if dirty else ''}"


def print_machine(info: dict[str, str]) -> None:
    console.print(" ".join(f"[bold]{k}[/]={v}" for k, v in info.items()))


# A one-tool plan in Execute: what the decide and startup benches gate against.
GATE_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
GATE_PARAMS = b'{"path": "src/app.py"}'


def plan_in_execute(url: str, history: int, others: int = 0) -> None:
    """Plan ``P`` in Execute with the tool ``read`` registered and ``history`` events on
    its stream (passing input gates after the first four); before it, about ``others``
    events of other plans (100 each: a plan in Execute and its gate checks), appended
    without the read models, which the first command then catches up."""
    from commands.plane import Plane
    from commands.plane.gates import gate_input
    from commands.plane.phases import enter_execute, record_strategy
    from commands.plane.plans import create_plan
    from commands.plane.registry import register_tool

    with Plane.open(url) as plane:
        register_tool(plane, {"name": "read", "command": ["true"], "input_schema": GATE_SCHEMA})
    with Plane.open(url, inline_read_models=False) as plane:
        for n in range(others // 100):
            other = f"O-{n}"
            create_plan(plane, other, project="bench", resources=["repo:bench"])
            record_strategy(plane, other, "read files")
            enter_execute(plane, other)
            for _ in range(96):
                gate_input(plane, other, "read", GATE_PARAMS)
    with Plane.open(url) as plane:
        create_plan(plane, "P", project="bench", resources=["repo:bench"])
        record_strategy(plane, "P", "read files")
        enter_execute(plane, "P")
        for _ in range(max(0, history - 4)):
            gate_input(plane, "P", "read", GATE_PARAMS)
