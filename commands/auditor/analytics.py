"""Export the log for analytics: a flat, stable column set in JSONL, CSV or Parquet.

Every export covers the positions ``since..until`` (``until`` defaults to the head when
the export starts) and states the tree head covering them: ``tree_size`` (= ``until``)
and the RFC 9162 ``root_hash`` of the first ``tree_size`` leaves, recomputed from the
stored leaf hashes. A consumer compares it with a tree head it trusts (a signed
checkpoint, ``evidence verify``) to prove it holds events of a verified prefix; each row
also carries its ``leaf_hash``. The metadata goes into the Parquet file's key-value
metadata, and into a sidecar ``FILE.meta.json`` for JSONL and CSV.

The export reads in batches of positions and writes each batch before reading the next:
memory stays constant however large the log (only a plan -> project map and a validation
run -> attempt map are kept, one entry per plan and per run).

Columns are typed (``COLUMNS``): integers as integers, and in Parquet ``recorded_at`` as a
UTC timestamp (microseconds); JSONL and CSV, which have no timestamp type, write it as
RFC 3339 UTC text. ``COLUMNS_VERSION`` names the column set (docs/analytics.md).
"""

from __future__ import annotations

import csv
import io
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, BinaryIO, TypeVar

import msgspec
import sqlalchemy as sa

import ledger
from commands.rules.vocabulary import OUTCOMES
from ledger.events import (
    EventPayload,
    PlanCreated,
    PlanHalted,
    ToolRegistered,
    ValidationRegistered,
    ValidationRunStarted,
)
from ledger.merkle import Frontier
from projections.analytics import ANALYTICS
from projections.engine import POSITIONS, ProjectionEngine

FORMATS = ("jsonl", "csv", "parquet")
COLUMNS_VERSION = 2  # 2: recorded_at a timestamp in Parquet; stream_kind .. run_id added

# (name, kind): kind is "int", "str" or "timestamp" (Parquet: timestamp[us, UTC]; JSONL and
# CSV: RFC 3339 text); every column may be null. New columns only ever go at the end.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("position", "int"),
    ("event_id", "str"),
    ("recorded_at", "timestamp"),
    ("stream", "str"),
    ("stream_version", "int"),
    ("type", "str"),
    ("plan", "str"),
    ("project", "str"),
    ("actor", "str"),
    ("tool", "str"),
    ("validation", "str"),
    ("mode", "str"),
    ("verdict", "str"),
    ("outcome", "str"),
    ("halt_type", "str"),
    ("raw_halt_type", "str"),
    ("deviation_count", "int"),
    ("duration_ms", "int"),
    ("leaf_hash", "str"),
    ("payload", "str"),
    # columns version 2
    ("stream_kind", "str"),
    ("gate", "str"),
    ("step", "str"),
    ("attempt", "int"),
    ("iteration", "int"),
    ("run_id", "str"),
)
COLUMN_NAMES = tuple(name for name, _ in COLUMNS)

Progress = Callable[[int, int], None]  # (positions done, positions in range)

_encode = msgspec.json.encode
_LEAF_BATCH = 5_000


class ExportError(ledger.LedgerError):
    """The export cannot be made as asked (bad range, missing extra)."""


@dataclass(frozen=True)
class ExportResult:
    out: str
    format: str
    rows: int
    metadata: dict[str, str]


def _verdict(payload: Any) -> str | None:
    value = getattr(payload, "verdict", ...)
    if value is ...:
        return None
    if value is True:
        return "pass"
    if value is False:
        return "fail"
    if value is None:
        return "no_verdict"
    return str(value)


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def flat_row(
    event: ledger.RecordedEvent,
    projects: dict[str, str],
    attempts: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One event as the documented flat row (payload as its JSON text). ``attempts``
    (validation run id -> attempt) gives a validation result, which does not record its
    attempt, the attempt of its run."""
    p = event.payload
    t = event.type
    plan = getattr(p, "plan_id", None) or getattr(p, "plan", None)
    project = getattr(p, "project", None) or (projects.get(plan) if plan else None)
    validation = getattr(p, "validation", None)
    if validation is None and t == "validation.registered" and isinstance(p, ValidationRegistered):
        validation = p.name
    tool = getattr(p, "tool", None)
    if tool is None and t == "tool.registered" and isinstance(p, ToolRegistered):
        tool = p.name
    outcome = (
        p.final_decision
        if t == "plan.halted" and isinstance(p, PlanHalted)
        else getattr(p, "outcome", None)
    )
    deviations = getattr(p, "deviations", None)
    run_id = _str(getattr(p, "run_id", None))
    attempt = _int(getattr(p, "attempt", None))
    if attempt is None and run_id is not None and attempts:
        attempt = attempts.get(run_id)
    return {
        "position": event.position,
        "event_id": event.event_id,
        "recorded_at": event.recorded_at,
        "stream": event.stream,
        "stream_version": event.stream_version,
        "type": t,
        "plan": plan,
        "project": project,
        "actor": event.actor,
        "tool": tool,
        "validation": validation,
        "mode": getattr(p, "mode", None),
        "verdict": _verdict(p),
        "outcome": outcome,
        "halt_type": getattr(p, "halt_type", None),
        "raw_halt_type": getattr(p, "raw_halt_type", None),
        "deviation_count": len(deviations) if isinstance(deviations, list) else None,
        "duration_ms": getattr(p, "duration_ms", None),
        "leaf_hash": event.leaf_hash.hex(),
        "payload": _encode(p).decode(),
        "stream_kind": event.stream.partition(":")[0],
        "gate": _str(getattr(p, "gate", None)),
        "step": _str(getattr(p, "step", None)),
        "attempt": attempt,
        "iteration": _int(getattr(p, "iteration", None)),
        "run_id": run_id,
    }


def tree_root(store: ledger.Store, size: int) -> bytes:
    """The RFC 9162 root of the first ``size`` leaves, from the stored leaf hashes."""
    frontier = Frontier()
    ph = store.placeholder
    sql = (
        f"SELECT leaf_hash FROM events WHERE position >= {ph} AND position <= {ph} "
        "ORDER BY position"
    )
    position = 1
    while position <= size:
        end = min(size, position + _LEAF_BATCH - 1)
        with store.read_transaction() as conn:
            rows = conn.exec_driver_sql(sql, (position, end)).all()
        if len(rows) != end - position + 1:
            raise ExportError(f"positions {position}..{end} are not all in the log")
        for (leaf,) in rows:
            frontier.append(bytes(leaf))
        position = end + 1
    return frontier.root()


class _Writer:
    def write(self, rows: list[dict[str, Any]]) -> None: ...
    def close(self, metadata: dict[str, str]) -> None: ...


class _JsonlWriter(_Writer):
    def __init__(self, f: BinaryIO) -> None:
        self._f = f

    def write(self, rows: list[dict[str, Any]]) -> None:
        raw = msgspec.Raw
        self._f.write(
            b"".join(_encode({**row, "payload": raw(row["payload"])}) + b"\n" for row in rows)
        )

    def close(self, metadata: dict[str, str]) -> None:
        self._f.flush()


class _CsvWriter(_Writer):
    def __init__(self, f: BinaryIO) -> None:
        self._text = io.TextIOWrapper(f, encoding="utf-8", newline="", write_through=True)
        self._w = csv.writer(self._text)
        self._w.writerow(COLUMN_NAMES)

    def write(self, rows: list[dict[str, Any]]) -> None:
        self._w.writerows([["" if v is None else v for v in row.values()] for row in rows])

    def close(self, metadata: dict[str, str]) -> None:
        self._text.flush()
        self._text.detach()  # the file is the caller's to close


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise ExportError(
            "Parquet export needs pyarrow: pip install 'evidence-ledger[analytics]'"
        ) from None
    return pyarrow


def arrow_schema() -> Any:
    """The Parquet schema of ``COLUMNS`` (documented in docs/analytics.md)."""
    pa = _pyarrow()
    types = {"int": pa.int64(), "str": pa.string(), "timestamp": pa.timestamp("us", tz="UTC")}
    return pa.schema([(name, types[kind]) for name, kind in COLUMNS])


def _timestamp(text: str) -> datetime:
    """An RFC 3339 UTC time as the log writes it, as an aware datetime."""
    return datetime.fromisoformat(text).astimezone(UTC)


class _ParquetWriter(_Writer):
    def __init__(self, f: BinaryIO) -> None:
        pa = _pyarrow()
        self._pa = pa
        self._schema = arrow_schema()
        self._w = pa.parquet.ParquetWriter(f, self._schema, compression="zstd")

    def write(self, rows: list[dict[str, Any]]) -> None:
        typed = [{**row, "recorded_at": _timestamp(row["recorded_at"])} for row in rows]
        self._w.write_batch(self._pa.RecordBatch.from_pylist(typed, schema=self._schema))

    def close(self, metadata: dict[str, str]) -> None:
        self._w.add_key_value_metadata(metadata)
        self._w.close()


_WRITERS: dict[str, Callable[[BinaryIO], _Writer]] = {
    "jsonl": _JsonlWriter,
    "csv": _CsvWriter,
    "parquet": _ParquetWriter,
}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")[:-6] + "Z"


P = TypeVar("P", bound=EventPayload)


def _payloads(store: ledger.Store, until: int, plan: str | None, kind: type[P]) -> list[P]:
    """Every payload of type ``kind`` up to ``until`` (of ``plan``'s stream only, if
    given)."""
    return [
        e.payload
        for e in store.read_all(
            1,
            to_position=until,
            types=[kind.type_name()],
            stream=f"plan:{plan}" if plan is not None else None,
        )
        if isinstance(e.payload, kind)
    ]


def _events(
    store: ledger.Store,
    since: int,
    until: int,
    types: Sequence[str] | None,
    plan: str | None,
    batch_size: int,
) -> Iterator[list[ledger.RecordedEvent]]:
    yield from store.read_batches(
        since,
        to_position=until,
        batch_size=batch_size,
        types=types or None,
        stream=f"plan:{plan}" if plan is not None else None,
    )


def export(
    store: ledger.Store,
    out: str | BinaryIO,
    *,
    format: str,
    since: int = 1,
    until: int | None = None,
    types: Sequence[str] = (),
    plan: str | None = None,
    batch_size: int = 2_000,
    progress: Progress | None = None,
) -> ExportResult:
    """Write the events of ``since..until`` (filtered) to ``out``; see the module doc."""
    until = _export_range(store, format, since, until, types)
    root = tree_root(store, until)
    projects = {p.plan_id: p.project for p in _payloads(store, until, plan, PlanCreated)}
    # each validation run's attempt (its validation.run_started)
    attempts = {p.run_id: p.attempt for p in _payloads(store, until, plan, ValidationRunStarted)}
    metadata = {
        "evidence.columns_version": str(COLUMNS_VERSION),
        "evidence.ledger_id": store.meta().get("ledger_id", ""),
        "evidence.tree_size": str(until),
        "evidence.root_hash": root.hex(),
        "evidence.since": str(since),
        "evidence.until": str(until),
        "evidence.types": _encode(sorted(types)).decode(),
        "evidence.plan": plan or "",
        "evidence.exported_at": _now(),
    }
    target, tmp = _target(out, format)
    rows = 0
    total = max(0, until - since + 1)
    try:
        writer = _WRITERS[format](target)
        try:
            for batch in _events(store, since, until, types, plan, batch_size):
                flat = []
                for event in batch:
                    if isinstance(event.payload, PlanCreated):
                        projects.setdefault(event.payload.plan_id, event.payload.project)
                    flat.append(flat_row(event, projects, attempts))
                writer.write(flat)
                rows += len(flat)
                if progress is not None:
                    progress(batch[-1].position - since + 1, total)
            metadata["evidence.rows"] = str(rows)
        finally:
            writer.close(metadata)
    except BaseException:
        if isinstance(out, str):
            target.close()
            os.unlink(tmp)
        raise
    if not isinstance(out, str):
        if progress is not None:
            progress(total, total)
        return ExportResult("-", format, rows, metadata)
    target.close()
    os.replace(tmp, out)
    if format != "parquet":
        _write_metadata(out, format, metadata)
    if progress is not None:
        progress(total, total)
    return ExportResult(out, format, rows, metadata)


def _export_range(
    store: ledger.Store, format: str, since: int, until: int | None, types: Sequence[str]
) -> int:
    """The last position to export, once the request is one that can be met (the
    format known and installed, the types known, the range within the log)."""
    if format not in FORMATS:
        raise ExportError(f"unknown format {format!r} (one of {', '.join(FORMATS)})")
    unknown = [t for t in types if t not in store.catalog]
    if unknown:
        raise ExportError(f"unknown event type {unknown[0]!r} (see docs/events.md)")
    if format == "parquet":
        _pyarrow()  # refuse before touching the file
    head = store.head().size
    until = head if until is None else until
    if until > head:
        raise ExportError(f"--until {until} is past the head of the log ({head})")
    if since < 1:
        raise ExportError(f"--since must be >= 1, got {since}")
    return until


def _target(out: str | BinaryIO, format: str) -> tuple[BinaryIO, str]:
    """Where the rows go, and the temporary name a file is written under. A file name:
    written to FILE.partial, renamed over FILE once whole, with the metadata beside it.
    An open binary stream (standard output): written as it goes, the metadata only in
    the result (a stream has no "beside")."""
    if not isinstance(out, str):
        if format == "parquet":
            raise ExportError(
                "Parquet is a binary format whose footer is written last: give a file"
            )
        return out, ""
    tmp = f"{out}.partial"
    try:
        return open(tmp, "wb"), tmp  # closed by export
    except OSError as exc:
        raise ExportError(f"cannot write {out}: {exc.strerror or exc}") from None


def _write_metadata(out: str, format: str, metadata: dict[str, str]) -> None:
    """FILE.meta.json beside a JSONL or CSV export (Parquet keeps it in its footer)."""
    document = {"format": format, "file": os.path.basename(out), "columns": COLUMN_NAMES}
    with open(f"{out}.meta.json", "wb") as f:
        f.write(msgspec.json.format(_encode({**document, **metadata})) + b"\n")


# -- stats ----------------------------------------------------------------------------


def _p95(values: list[int]) -> int | None:
    """Nearest-rank 95th percentile."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, -(-95 * len(ordered) // 100) - 1)]


def _counts(conn: Any, sql: str, params: dict[str, Any]) -> dict[str, int]:
    """label -> count from ``SELECT label, count, first position``: by count, then by
    first occurrence (what ``Counter.most_common`` of a pass over the log gives)."""
    rows = conn.execute(sa.text(sql), params).all()
    return {label: int(n) for label, n, _first in sorted(rows, key=lambda r: (-r[1], r[2]))}


def stats(store: ledger.Store, *, project: str | None = None, since: int = 1) -> dict[str, Any]:
    """Aggregates over the plan-stream events from ``since``, answered with SQL over the
    analytics projection (``projections.analytics``), caught up first; with ``project``
    only the plans of that project. See docs/analytics.md.
    """
    if since < 1:
        raise ExportError(f"--since must be >= 1, got {since}")
    ProjectionEngine(store, [ANALYTICS]).open()  # create, rebuild if changed, catch up
    t = ANALYTICS.table_names()
    params: dict[str, Any] = {"since": since, "project": project}
    only = " AND project = :project" if project is not None else ""
    window = f"position >= :since{only}"
    # One snapshot: the projection's position and every table as of the same moment.
    with store.read_transaction(snapshot=True) as conn:
        tree_size = conn.execute(
            sa.text(f"SELECT position FROM {POSITIONS} WHERE name = :name"),
            {"name": ANALYTICS.name},
        ).scalar_one()
        validations = _validation_stats(conn, t, window, params)
        flaky = _flaky(conn, t, window, params)
        plan_rows = _plan_stats(conn, t, params, project)
        halts = _counts(
            conn,
            f"SELECT value, count(*), min(position) FROM {t['plan_facts']} "
            f"WHERE fact = 'halted' AND {window} GROUP BY value",
            params,
        )
        informational = _counts(
            conn,
            f"SELECT validation, count(*), min(position) "
            f"FROM {t['informational_failures']} WHERE {window} GROUP BY validation",
            params,
        )
        by_kind = _counts(
            conn,
            f"SELECT kind, count(*), min(position) FROM "
            f"{t['deviations']} WHERE {window} GROUP BY kind",
            params,
        )
        by_tool = _counts(
            conn,
            f"SELECT tool, count(*), min(position) FROM "
            f"{t['deviations']} WHERE {window} GROUP BY tool",
            params,
        )
    outcomes = Counter(p["outcome"] for p in plan_rows if p["outcome"] is not None)
    applied = Counter(p["applied"] for p in plan_rows if p["applied"] is not None)
    return {
        "tree_size": int(tree_size),
        "since": since,
        "project": project,
        "validations": validations,
        "flaky": [
            {
                "validation": v,
                "args": msgspec.json.decode(a),
                "input_digest": digest,
                "pass": int(passed),
                "fail": int(failed),
            }
            for v, a, digest, passed, failed in sorted(flaky)
        ],
        "plans_by_outcome": dict(sorted(outcomes.items(), key=lambda kv: (-kv[1], kv[0]))),
        "plans_without_outcome": sum(p["outcome"] is None for p in plan_rows),
        "plans_applied": applied.total(),
        "plans_applied_unvalidated": applied["unvalidated"],
        "halts_by_type": halts,
        "plans": plan_rows,
        "informational_failures": informational,
        "deviations_by_kind": by_kind,
        "deviations_by_tool": by_tool,
    }


def _validation_stats(
    conn: Any, t: dict[str, str], window: str, params: dict[str, Any]
) -> list[dict[str, Any]]:
    """Each validation's runs in the window: verdicts, rates, mean and p95 durations."""
    counts: dict[str, dict[str, int]] = {}
    for name, verdict, n in conn.execute(
        sa.text(
            f"SELECT validation, verdict, count(*) FROM {t['results']} WHERE {window} "
            "GROUP BY validation, verdict"
        ),
        params,
    ):
        counts.setdefault(name, {})[verdict] = int(n)
    durations: dict[str, list[int]] = {}
    for name, ms in conn.execute(
        sa.text(
            f"SELECT validation, duration_ms FROM {t['results']} WHERE {window} "
            "ORDER BY validation, duration_ms"
        ),
        params,
    ):
        durations.setdefault(name, []).append(int(ms))
    validations = []
    for name in sorted(counts):
        c, d = counts[name], durations[name]
        n = sum(c.values())
        validations.append(
            {
                "validation": name,
                "runs": n,
                "pass": c.get("pass", 0),
                "fail": c.get("fail", 0),
                "no_verdict": c.get("no_verdict", 0),
                "pass_rate": c.get("pass", 0) / n,
                "no_verdict_rate": c.get("no_verdict", 0) / n,
                "mean_ms": sum(d) / len(d),
                "p95_ms": _p95(d),
            }
        )
    return validations


def _flaky(conn: Any, t: dict[str, str], window: str, params: dict[str, Any]) -> list[Any]:
    """The validations that both passed and failed on the same arguments and input."""
    return conn.execute(
        sa.text(
            "SELECT validation, args, input_digest, "
            "sum(CASE WHEN verdict = 'pass' THEN 1 ELSE 0 END), "
            "sum(CASE WHEN verdict = 'fail' THEN 1 ELSE 0 END) "
            f"FROM {t['results']} WHERE {window} AND args_digest IS NOT NULL "
            "GROUP BY validation, args_digest, args, input_digest "
            "HAVING sum(CASE WHEN verdict = 'pass' THEN 1 ELSE 0 END) > 0 "
            "AND sum(CASE WHEN verdict = 'fail' THEN 1 ELSE 0 END) > 0"
        ),
        params,
    ).all()


def _plan_stats(
    conn: Any, t: dict[str, str], params: dict[str, Any], project: str | None
) -> list[dict[str, Any]]:
    """Each plan with an event in the window: its attempts, failures, revisions, its
    last outcome, whether it was applied, its last halt."""
    # A plan counts if it has an event in the window (its last one is in it); its
    # numbers come from its facts in the window.
    last = (
        "(SELECT f.value FROM {facts} f WHERE f.plan = p.plan AND f.fact IN ({kinds}) "
        "AND f.position >= :since ORDER BY f.position DESC LIMIT 1)"
    )
    plans = conn.execute(
        sa.text(
            "SELECT p.plan, p.project, coalesce(c.attempts, 0), coalesce(c.failed, 0), "
            "coalesce(c.revisions, 0), "
            + last.format(facts=t["plan_facts"], kinds="'run_completed', 'halted', 'revised'")
            + ", "
            + last.format(facts=t["plan_facts"], kinds="'applied'")
            + ", "
            + last.format(facts=t["plan_facts"], kinds="'halted'")
            + f" FROM {t['plans']} p LEFT JOIN ("
            "SELECT plan, max(CASE WHEN fact = 'run_started' THEN attempt END) AS attempts, "
            "sum(CASE WHEN fact = 'attempt_failed' THEN 1 ELSE 0 END) AS failed, "
            "sum(CASE WHEN fact = 'strategy_revision' THEN 1 ELSE 0 END) AS revisions "
            f"FROM {t['plan_facts']} WHERE position >= :since GROUP BY plan) c "
            "ON c.plan = p.plan WHERE p.last_position >= :since"
            + (" AND p.project = :project" if project is not None else "")
        ),
        params,
    ).all()
    return sorted(
        (
            {
                "plan": plan,
                "project": proj,
                "attempts": int(attempts),
                "failed_attempts": int(failed),
                "strategy_revisions": int(revisions),
                "outcome": outcome if outcome in OUTCOMES else None,
                "applied": applied,
                "halt_type": halt_type,
            }
            for plan, proj, attempts, failed, revisions, outcome, applied, halt_type in plans
        ),
        key=lambda p: p["plan"],
    )
