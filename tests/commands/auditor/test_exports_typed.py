"""Exports an analyst can use: typed timestamps (UTC) and numbers, first-class columns for
plan, stream kind, gate, tool, step, attempt, verdict and outcome, a documented and
versioned Parquet schema, and the DuckDB queries of docs/analytics.md running on a real
export."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

import ledger
from commands.auditor import analytics
from tests.helpers import REPO, run_cli

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
duckdb = pytest.importorskip("duckdb")

DOC = REPO / "docs" / "analytics.md"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    """The demo's ledger (SQLite) exported as Parquet and as JSONL."""
    root = tmp_path_factory.mktemp("typed")
    url = f"sqlite:///{root / 'demo.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EVIDENCE_PLANE_KEY", str(root / "plane.key"))
        patch.setenv("EVIDENCE_STATE_DIR", str(root / "state"))
        assert run_cli("demo", "--db", url).returncode == 0
        parquet, jsonl = root / "log.parquet", root / "log.jsonl"
        for fmt, out in (("parquet", parquet), ("jsonl", jsonl)):
            done = run_cli("export", "--format", fmt, "--out", str(out), "--db", url)
            assert done.returncode == 0, done.stderr
    return url, parquet, jsonl


def test_the_parquet_schema_is_typed_and_versioned(exported: tuple[str, Path, Path]) -> None:
    _url, parquet, _jsonl = exported
    schema = pq.read_schema(parquet)
    assert schema.field("recorded_at").type == pa.timestamp("us", tz="UTC")
    for name in ("position", "stream_version", "deviation_count", "duration_ms", "attempt"):
        assert schema.field(name).type == pa.int64(), name
    assert schema.field("iteration").type == pa.int64()
    for name in ("plan", "stream_kind", "gate", "tool", "step", "verdict", "outcome", "run_id"):
        assert schema.field(name).type == pa.string(), name
    assert schema.names == list(analytics.COLUMN_NAMES)
    file_meta = pq.read_metadata(parquet).metadata or {}
    meta = {k.decode(): v.decode() for k, v in file_meta.items()}
    assert meta["evidence.columns_version"] == "2"
    # docs/analytics.md documents every column, in order
    documented = re.findall(r"^\| `([a-z_]+)` \| (int|str|timestamp) \|", DOC.read_text(), re.M)
    assert documented == [(name, kind) for name, kind in analytics.COLUMNS]


def test_the_columns_carry_the_commonest_answers(exported: tuple[str, Path, Path]) -> None:
    url, parquet, _jsonl = exported
    rows = pq.read_table(parquet).to_pylist()
    with ledger.open(url, create=False) as store:
        events = list(store.read_all())
    assert [r["position"] for r in rows] == [e.position for e in events]
    for row, event in zip(rows, events, strict=True):
        assert row["recorded_at"] == datetime.fromisoformat(event.recorded_at).astimezone(UTC)
        assert row["stream_kind"] == event.stream.partition(":")[0]
    attempts = {
        e.payload.run_id: e.payload.attempt for e in events if e.type == "validation.run_started"
    }
    results = [r for r in rows if r["type"] == "validation.result_recorded"]
    assert results and all(r["attempt"] == attempts[r["run_id"]] for r in results)
    assert {r["attempt"] for r in results} == {1, 2}  # the demo fails once, then passes
    gates = [(r, e) for r, e in zip(rows, events, strict=True) if e.type == "gate.checked"]
    assert gates
    for row, event in gates:
        p = event.payload
        assert (row["gate"], row["step"], row["attempt"], row["iteration"]) == (
            p.gate,
            p.step,
            p.attempt,
            p.iteration,
        )
        assert row["plan"] == p.plan_id and row["tool"] == p.tool
    assert {r["outcome"] for r in rows if r["type"] == "validation.run_completed"} == {
        "blocker",
        "pass",
    }


def test_jsonl_keeps_text_times_and_typed_numbers(exported: tuple[str, Path, Path]) -> None:
    _url, _parquet, jsonl = exported
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert all(list(r) == list(analytics.COLUMN_NAMES) for r in rows)
    result = next(r for r in rows if r["type"] == "validation.result_recorded")
    assert isinstance(result["attempt"], int) and isinstance(result["duration_ms"], int)
    assert result["recorded_at"].endswith("Z")
    meta = json.loads(Path(f"{jsonl}.meta.json").read_text())
    assert meta["evidence.columns_version"] == "2"


def test_the_documented_duckdb_queries_run(exported: tuple[str, Path, Path]) -> None:
    _url, parquet, _jsonl = exported
    section = DOC.read_text().split("### DuckDB over an export", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sql\n(.*?)```", section, re.S)
    assert len(blocks) >= 6
    con = duckdb.connect()
    path = str(parquet).replace("'", "''")
    answers = [
        con.execute(block.replace("'log.parquet'", f"'{path}'")).fetchall() for block in blocks
    ]
    assert all(answers), "every documented query answers something on the demo's log"
    per_day = answers[2]
    assert {outcome for _day, outcome, _n in per_day} == {"blocker", "pass"}
