"""Export the log for analytics: a flat, stable column set in JSONL, CSV or Parquet.

Every export covers the positions ``since..until`` (``until`` defaults to the head when
the export starts) and states the tree head covering them: ``tree_size`` (= ``until``)
and the RFC 9162 ``root_hash`` of the first ``tree_size`` leaves, recomputed from the
stored leaf hashes. A consumer compares it with a tree head it trusts (a signed
checkpoint, ``evidence verify``) to prove it holds events of a verified prefix; each row
also carries its ``leaf_hash``. The metadata goes into the Parquet file's key-value
metadata, and into a sidecar ``FILE.meta.json`` for JSONL and CSV.

The export reads in batches of positions and writes each batch before reading the next:
memory stays constant however large the log (only a plan -> project map is kept, one
entry per plan).
"""

from __future__ import annotations

import csv
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec

import ledger
from ledger.merkle import Frontier

FORMATS = ("jsonl", "csv", "parquet")
COLUMNS_VERSION = 1

# (name, kind): kind is "int" or "str"; every column may be null.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("position", "int"),
    ("event_id", "str"),
    ("recorded_at", "str"),
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


def flat_row(event: ledger.RecordedEvent, projects: dict[str, str]) -> dict[str, Any]:
    """One event as the documented flat row (payload as its JSON text)."""
    p = event.payload
    t = event.type
    plan = getattr(p, "plan_id", None) or getattr(p, "plan", None)
    project = getattr(p, "project", None) or (projects.get(plan) if plan else None)
    validation = getattr(p, "validation", None)
    if validation is None and t == "validation.registered":
        validation = p.name
    tool = getattr(p, "tool", None)
    if tool is None and t == "tool.registered":
        tool = p.name
    outcome = p.final_decision if t == "plan.halted" else getattr(p, "outcome", None)
    deviations = getattr(p, "deviations", None)
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
    }


def tree_root(store: ledger.Store, size: int) -> bytes:
    """The RFC 9162 root of the first ``size`` leaves, from the stored leaf hashes."""
    frontier = Frontier()
    ph = store._ph
    sql = f"SELECT leaf_hash FROM events WHERE position >= {ph} AND position <= {ph} " \
          "ORDER BY position"
    position = 1
    while position <= size:
        end = min(size, position + _LEAF_BATCH - 1)
        with store._transaction() as conn:
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
    def __init__(self, path: str) -> None:
        self._f = open(path, "wb")  # noqa: SIM115 - closed in close()

    def write(self, rows: list[dict[str, Any]]) -> None:
        raw = msgspec.Raw
        self._f.write(b"".join(
            _encode({**row, "payload": raw(row["payload"])}) + b"\n" for row in rows
        ))

    def close(self, metadata: dict[str, str]) -> None:
        self._f.close()


class _CsvWriter(_Writer):
    def __init__(self, path: str) -> None:
        self._f = open(path, "w", newline="", encoding="utf-8")  # noqa: SIM115
        self._w = csv.writer(self._f)
        self._w.writerow(COLUMN_NAMES)

    def write(self, rows: list[dict[str, Any]]) -> None:
        self._w.writerows([["" if v is None else v for v in row.values()] for row in rows])

    def close(self, metadata: dict[str, str]) -> None:
        self._f.close()


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
    pa = _pyarrow()
    return pa.schema([(name, pa.int64() if kind == "int" else pa.string())
                      for name, kind in COLUMNS])


class _ParquetWriter(_Writer):
    def __init__(self, path: str) -> None:
        pa = _pyarrow()
        self._pa = pa
        self._schema = arrow_schema()
        self._w = pa.parquet.ParquetWriter(path, self._schema, compression="zstd")

    def write(self, rows: list[dict[str, Any]]) -> None:
        self._w.write_batch(self._pa.RecordBatch.from_pylist(rows, schema=self._schema))

    def close(self, metadata: dict[str, str]) -> None:
        self._w.add_key_value_metadata(metadata)
        self._w.close()


_WRITERS: dict[str, Callable[[str], _Writer]] = {
    "jsonl": _JsonlWriter, "csv": _CsvWriter, "parquet": _ParquetWriter,
}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")[:-6] + "Z"


def _plan_projects(store: ledger.Store, until: int, plan: str | None) -> dict[str, str]:
    return {
        e.payload.plan_id: e.payload.project
        for e in store.read_all(
            1, to_position=until, types=["plan.created"],
            stream=f"plan:{plan}" if plan is not None else None,
        )
    }


def _events(store: ledger.Store, since: int, until: int, types: Sequence[str] | None,
            plan: str | None, batch_size: int) -> Iterator[list[ledger.RecordedEvent]]:
    yield from store.read_batches(
        since, to_position=until, batch_size=batch_size, types=types or None,
        stream=f"plan:{plan}" if plan is not None else None,
    )


def export(
    store: ledger.Store,
    out: str,
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
    root = tree_root(store, until)
    projects = _plan_projects(store, until, plan)
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
    tmp = f"{out}.partial"
    try:
        writer = _WRITERS[format](tmp)
    except OSError as exc:
        raise ExportError(f"cannot write {out}: {exc.strerror or exc}") from None
    rows = 0
    total = max(0, until - since + 1)
    try:
        for batch in _events(store, since, until, types, plan, batch_size):
            flat = []
            for event in batch:
                if event.type == "plan.created":
                    projects.setdefault(event.payload.plan_id, event.payload.project)
                flat.append(flat_row(event, projects))
            writer.write(flat)
            rows += len(flat)
            if progress is not None:
                progress(batch[-1].position - since + 1, total)
        metadata["evidence.rows"] = str(rows)
        writer.close(metadata)
    except BaseException:
        try:
            writer.close(metadata)
        finally:
            os.unlink(tmp)
        raise
    os.replace(tmp, out)
    if format != "parquet":
        with open(f"{out}.meta.json", "wb") as f:
            f.write(msgspec.json.format(_encode({
                "format": format, "file": os.path.basename(out),
                "columns": COLUMN_NAMES, **metadata,
            })) + b"\n")
    if progress is not None:
        progress(total, total)
    return ExportResult(out, format, rows, metadata)


# -- stats ----------------------------------------------------------------------------


def _p95(values: list[int]) -> int | None:
    """Nearest-rank 95th percentile."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, -(-95 * len(ordered) // 100) - 1)]


def stats(store: ledger.Store, *, project: str | None = None, since: int = 1) -> dict[str, Any]:
    """Aggregates over the events from ``since`` (one streaming pass; see docs/analytics.md).

    Only plan-stream events count; with ``project`` only the plans of that project.
    """
    if since < 1:
        raise ExportError(f"--since must be >= 1, got {since}")
    head = store.head().size
    projects = _plan_projects(store, head, None)
    runs: dict[str, dict[str, tuple[str, bytes, str]]] = {}  # run -> attachment -> key
    durations: dict[str, list[int]] = {}
    counts: dict[str, Counter[str]] = {}
    flaky: dict[tuple[str, bytes, str], Counter[str]] = {}
    plans: dict[str, dict[str, Any]] = {}
    halts: Counter[str] = Counter()
    informational: Counter[str] = Counter()
    by_kind: Counter[str] = Counter()
    by_tool: Counter[str] = Counter()
    for batch in store.read_batches(since, to_position=head, batch_size=2_000):
        for event in batch:
            p = event.payload
            plan_id = getattr(p, "plan_id", None)
            if plan_id is None or not event.stream.startswith("plan:"):
                continue
            if event.type == "plan.created":
                projects.setdefault(plan_id, p.project)
            if project is not None and projects.get(plan_id) != project:
                continue
            plan = plans.setdefault(plan_id, {
                "plan": plan_id, "project": projects.get(plan_id), "attempts": 0,
                "failed_attempts": 0, "strategy_revisions": 0, "outcome": None,
                "halt_type": None,
            })
            t = event.type
            if t == "validation.run_started":
                plan["attempts"] = max(plan["attempts"], p.attempt)
                runs[p.run_id] = {
                    a.attachment_id: (a.validation, _encode(a.args),
                                      p.resource_digests.get(a.resource, ""))
                    for a in p.resolved
                }
            elif t == "validation.result_recorded":
                verdict = _verdict(p) or "no_verdict"
                counts.setdefault(p.validation, Counter())[verdict] += 1
                durations.setdefault(p.validation, []).append(p.duration_ms)
                key = runs.get(p.run_id, {}).get(p.attachment_id)
                if key is not None and verdict != "no_verdict":
                    flaky.setdefault(key, Counter())[verdict] += 1
            elif t == "validation.run_completed":
                runs.pop(p.run_id, None)
                plan["outcome"] = p.outcome
                informational.update(p.informational_failures)
            elif t == "plan.attempt_failed":
                plan["failed_attempts"] += 1
            elif t == "plan.strategy_revision_requested":
                plan["strategy_revisions"] += 1
            elif t == "plan.halted":
                halts[p.halt_type] += 1
                plan["halt_type"] = p.halt_type
            elif t == "plan.applied":
                plan["outcome"] = "applied"
            elif t == "gate.checked":
                for d in p.deviations:
                    by_kind[d.kind] += 1
                    by_tool[p.tool] += 1
    validations = []
    for name in sorted(counts):
        c, d = counts[name], durations[name]
        n = sum(c.values())
        validations.append({
            "validation": name, "runs": n, "pass": c["pass"], "fail": c["fail"],
            "no_verdict": c["no_verdict"], "pass_rate": c["pass"] / n,
            "no_verdict_rate": c["no_verdict"] / n, "mean_ms": sum(d) / len(d),
            "p95_ms": _p95(d),
        })
    return {
        "tree_size": head,
        "since": since,
        "project": project,
        "validations": validations,
        "flaky": [
            {"validation": v, "args": msgspec.json.decode(a), "input_digest": digest,
             "pass": c["pass"], "fail": c["fail"]}
            for (v, a, digest), c in sorted(flaky.items()) if c["pass"] and c["fail"]
        ],
        "plans_by_outcome": dict(Counter(
            p["outcome"] or "none" for p in plans.values()).most_common()),
        "halts_by_type": dict(halts.most_common()),
        "plans": sorted(plans.values(), key=lambda p: p["plan"]),
        "informational_failures": dict(informational.most_common()),
        "deviations_by_kind": dict(by_kind.most_common()),
        "deviations_by_tool": dict(by_tool.most_common()),
    }
