"""`tail` (checkpointed, Ctrl-C safe) and `export` (JSONL / CSV / Parquet + DuckDB)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import ledger
from commands.auditor import analytics
from ledger import NewEvent, StreamAppend
from ledger.events import (
    AttemptFailed,
    Deviation,
    GateChecked,
    PlanCreated,
    PlanHalted,
    ResolvedAttachment,
    ValidationResultRecorded,
    ValidationRunCompleted,
    ValidationRunStarted,
)
from ledger.merkle import root_of
from ledger.subscriptions import consumer_position
from tests.helpers import assert_refused, plan_created, run_cli, strategy


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``evidence ARGS`` in-process (``run_cli``)."""
    return run_cli(*args)


@pytest.fixture
def demo(db_url: str) -> str:
    """A ledger holding the green-after-fix demo: validations, gates, a halt, an apply."""
    result = run_cli("demo", "--db", db_url)
    assert result.returncode == 0, result.stderr
    return db_url


@pytest.fixture(scope="module")
def _demo_once(module_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    root = tmp_path_factory.mktemp("demo")
    with pytest.MonkeyPatch.context() as patch:  # its own plane key and state directory
        patch.setenv("EVIDENCE_PLANE_KEY", str(root / "plane.key"))
        patch.setenv("EVIDENCE_STATE_DIR", str(root))
        result = run_cli("demo", "--db", module_db_url)
        assert result.returncode == 0, result.stderr
    return module_db_url, len(_all(module_db_url))


@pytest.fixture
def read_demo(_demo_once: tuple[str, int]) -> str:
    """``demo``'s ledger built once per backend for the tests that only read it (tail
    without a consumer, export): checked unchanged before each."""
    url, size = _demo_once
    assert len(_all(url)) == size, "a test appended to the shared demo ledger"
    return url


def _all(url: str) -> list[ledger.RecordedEvent]:
    with ledger.open(url, create=False) as store:
        return list(store.read_all())


# -- tail ------------------------------------------------------------------------------


def test_tail_prints_json_lines_in_order_and_filters(read_demo: str) -> None:
    demo = read_demo
    events = _all(demo)
    result = cli("tail", "--json", "--db", demo)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines == [json.loads(json.dumps(e.to_json())) for e in events]
    result = cli("tail", "--type", "gate.checked", "--from", "3", "--db", demo)
    positions = [int(line.split()[0]) for line in result.stdout.splitlines()]
    assert positions == [e.position for e in events if e.type == "gate.checked" and e.position >= 3]


def test_tail_refusals(read_demo: str) -> None:
    demo = read_demo
    assert_refused(cli("tail", "--from", "2", "--consumer", "c", "--db", demo), "not both")
    assert_refused(cli("tail", "--type", "no.such", "--db", demo), "unknown event type")


def test_tail_consumer_resumes_after_its_checkpoint(demo: str) -> None:
    size = len(_all(demo))
    first = cli("tail", "--consumer", "ops", "--json", "--db", demo)
    assert len(first.stdout.splitlines()) == size
    with ledger.open(demo, create=False) as store:
        assert consumer_position(store, "ops") == size
        store.append("plan:extra", [plan_created("extra")])
    again = cli("tail", "--consumer", "ops", "--json", "--db", demo)
    assert [json.loads(x)["position"] for x in again.stdout.splitlines()] == [size + 1]


@pytest.mark.slow
def test_tail_follow_sigint_leaves_checkpoint_at_last_printed(db_url: str) -> None:
    store = ledger.open(db_url)
    try:
        store.append("plan:A", [plan_created("A"), strategy("A")])
        env = {k: v for k, v in os.environ.items() if k != "EVIDENCE_DB"}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "commands.cli",
                "tail",
                "--consumer",
                "live",
                "--follow",
                "--json",
                "--interval",
                "0.05",
                "--db",
                db_url,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert proc.stdout is not None
            got = [json.loads(proc.stdout.readline())["position"] for _ in range(2)]
            store.append("plan:A", [strategy("A", "second", revision=1)])
            got.append(json.loads(proc.stdout.readline())["position"])
            assert got == [1, 2, 3]
            # Wait on the condition, not a fixed time (under load a poll can take long):
            # the third line's checkpoint is committed, then it polls on, printing nothing.
            deadline = time.monotonic() + 30
            while consumer_position(store, "live") != 3:
                assert time.monotonic() < deadline, "the tail never checkpointed line 3"
                time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err
        assert out == "" and "Traceback" not in err
        assert consumer_position(store, "live") == 3
        store.append("plan:B", [plan_created("B")])
        rest = cli("tail", "--consumer", "live", "--json", "--db", db_url)
        assert [json.loads(x)["position"] for x in rest.stdout.splitlines()] == [4]
    finally:
        store.close()


# -- export ----------------------------------------------------------------------------


def test_export_jsonl_and_csv_columns_and_sidecar(read_demo: str, tmp_path: Path) -> None:
    demo = read_demo
    events = _all(demo)
    with ledger.open(demo, create=False) as store:
        head = store.head()
    out = tmp_path / "all.jsonl"
    result = cli("export", "--format", "jsonl", "--out", str(out), "--json", "--db", demo)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["rows"] == len(events) and summary["tree_size"] == head.size
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["position"] for r in rows] == [e.position for e in events]
    assert all(tuple(r) == analytics.COLUMN_NAMES for r in rows)
    meta = json.loads(Path(f"{out}.meta.json").read_text())
    assert meta["evidence.tree_size"] == str(head.size)
    assert meta["evidence.root_hash"] == head.root.hex()
    assert meta["columns"] == list(analytics.COLUMN_NAMES)
    assert {r["project"] for r in rows if r["plan"]} == {"demo"} or all(
        r["project"] for r in rows if r["plan"]
    )
    halted = next(r for r in rows if r["type"] == "plan.halted")
    assert halted["halt_type"] and halted["raw_halt_type"] and halted["outcome"]
    gate = next(r for r in rows if r["type"] == "gate.checked")
    assert gate["verdict"] in ("pass", "fail") and isinstance(gate["deviation_count"], int)
    assert rows[0]["payload"]["type"] == events[0].type  # the whole payload, as JSON

    out_csv = tmp_path / "part.csv"
    result = cli(
        "export",
        "--format",
        "csv",
        "--since",
        "3",
        "--until",
        "20",
        "--type",
        "validation.result_recorded",
        "--out",
        str(out_csv),
        "--db",
        demo,
    )
    assert result.returncode == 0, result.stderr
    with out_csv.open(newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == analytics.COLUMN_NAMES
        got = [int(r["position"]) for r in reader]
    assert got == [
        e.position
        for e in events
        if 3 <= e.position <= 20 and e.type == "validation.result_recorded"
    ]
    meta = json.loads(Path(f"{out_csv}.meta.json").read_text())
    assert meta["evidence.tree_size"] == "20"
    assert meta["evidence.root_hash"] == root_of([e.leaf_hash for e in events[:20]]).hex()


def test_export_plan_filter_and_refusals(read_demo: str, tmp_path: Path) -> None:
    demo = read_demo
    events = _all(demo)
    plan = next(e.payload.plan_id for e in events if e.type == "plan.created")
    out = tmp_path / "plan.jsonl"
    assert (
        cli(
            "export", "--format", "jsonl", "--plan", plan, "--out", str(out), "--db", demo
        ).returncode
        == 0
    )
    got = [json.loads(line)["position"] for line in out.read_text().splitlines()]
    assert got == [e.position for e in events if e.stream == f"plan:{plan}"]
    assert_refused(
        cli("export", "--format", "jsonl", "--until", "9999", "--out", str(out), "--db", demo),
        "past the head",
    )
    assert_refused(cli("export", "--format", "xml", "--out", str(out), "--db", demo), "xml")
    assert_refused(
        cli("export", "--format", "csv", "--out", str(tmp_path / "no" / "x.csv"), "--db", demo),
        "cannot write",
    )


def test_parquet_without_pyarrow_names_the_extra(
    read_demo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    demo = read_demo
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    out = tmp_path / "x.parquet"
    with (
        ledger.open(demo, create=False) as store,
        pytest.raises(analytics.ExportError, match=r"evidence-ledger\[analytics\]"),
    ):
        analytics.export(store, str(out), format="parquet")
    assert not out.exists()


def test_parquet_read_by_duckdb_matches_the_ledger(read_demo: str, tmp_path: Path) -> None:
    demo = read_demo
    duckdb = pytest.importorskip("duckdb")
    pytest.importorskip("pyarrow")
    events = _all(demo)
    with ledger.open(demo, create=False) as store:
        head = store.head()
    out = tmp_path / "log.parquet"
    result = cli("export", "--format", "parquet", "--out", str(out), "--db", demo)
    assert result.returncode == 0, result.stderr
    con = duckdb.connect()

    def q(sql: str) -> list[tuple]:
        return con.execute(sql).fetchall()

    path = str(out).replace("'", "''")
    assert q(f"SELECT count(*) FROM '{path}'")[0][0] == len(events)
    by_type = dict(q(f"SELECT type, count(*) FROM '{path}' GROUP BY type"))
    assert by_type == dict(Counter(e.type for e in events))
    results = [e.payload for e in events if e.type == "validation.result_recorded"]
    total, fails = q(
        f"SELECT sum(duration_ms), count(*) FILTER (verdict = 'fail') FROM '{path}' "
        "WHERE type = 'validation.result_recorded'"
    )[0]
    assert total == sum(p.duration_ms for p in results)
    assert fails == sum(1 for p in results if p.verdict is False)
    deviations = q(f"SELECT sum(deviation_count) FROM '{path}'")[0][0]
    assert deviations == sum(len(e.payload.deviations) for e in events if e.type == "gate.checked")
    payload_plan = q(
        f"SELECT DISTINCT json_extract_string(payload, '$.plan_id') FROM '{path}' "
        "WHERE type = 'plan.created'"
    )
    assert payload_plan == [(next(e.payload.plan_id for e in events if e.type == "plan.created"),)]
    meta = dict(q(f"SELECT decode(key), decode(value) FROM parquet_kv_metadata('{path}')"))
    assert meta["evidence.tree_size"] == str(head.size)
    assert meta["evidence.root_hash"] == head.root.hex()


def _export_peak_rss_kib(url: str, out: Path, *extra: str) -> int:
    """Peak RSS (KiB) of a real `evidence export` process: its own rusage, from wait4."""
    env = {k: v for k, v in os.environ.items() if k != "EVIDENCE_DB"}
    with open(f"{out}.stderr", "w+b") as err:  # a file: a full pipe could block the child
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "commands.cli",
                "export",
                "--format",
                "jsonl",
                "--out",
                str(out),
                "--db",
                url,
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
        _pid, status, usage = os.wait4(proc.pid, 0)  # this child's rusage alone
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait
        err.seek(0)
        assert proc.returncode == 0, err.read().decode()
    return usage.ru_maxrss  # KiB on Linux


@pytest.mark.slow
def test_export_of_200k_events_has_bounded_process_rss(sqlite_url: str, tmp_path: Path) -> None:
    """The exporting process's peak RSS does not grow with the log: 200k events cost
    less than 32 MiB more than 20k. A process that held the 200k decoded events would
    need about 650 MB more (the one-batch run below shows the measure sees that).

    SQLite is enough here: what is measured is the export's own batching (windows of
    positions, each written before the next is read), the same code on both backends,
    and a local file fills 200k events in seconds."""
    if not hasattr(os, "wait4"):
        pytest.skip("needs os.wait4 for a child's own rusage")
    bound_kib = 32 * 1024
    store = ledger.open(sqlite_url)
    try:

        def grow(n: int) -> None:  # 5 plan streams x 1,000 events per transaction
            base = store.head().size
            for start in range(base, base + n, 5_000):
                store.append_batch(
                    [
                        ledger.StreamAppend(
                            f"plan:M{start + k}",
                            [
                                strategy(f"M{start + k}", f"step {j}", revision=j)
                                for j in range(1_000)
                            ],
                        )
                        for k in range(0, 5_000, 1_000)
                    ]
                )

        grow(20_000)
        small = _export_peak_rss_kib(sqlite_url, tmp_path / "small.jsonl")
        grow(180_000)
        assert store.head().size == 200_000
        large = _export_peak_rss_kib(sqlite_url, tmp_path / "large.jsonl")
        assert sum(1 for _ in (tmp_path / "large.jsonl").open("rb")) == 200_000
        assert large - small < bound_kib, (small, large)
        # The measurement has teeth: the same export in one batch of 200k events.
        whole = _export_peak_rss_kib(sqlite_url, tmp_path / "whole.jsonl", "--batch-size", "200000")
        assert whole - small > bound_kib, (small, whole)
    finally:
        store.close()


# -- stats -----------------------------------------------------------------------------

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z"


def _run(
    plan: str,
    run: int,
    verdicts: dict[str, bool | None],
    digest: str,
    durations: dict[str, int],
    outcome: str,
) -> list[NewEvent]:
    run_id = f"{plan}-r{run}"
    started = ValidationRunStarted(
        plan_id=plan,
        run_id=run_id,
        attempt=run,
        revision=0,
        resolved=[
            ResolvedAttachment(
                attachment_id=f"A-{v}",
                scope="project",
                validation=v,
                validation_version=1,
                mode="informational" if v == "style" else "required",
                resource="repo:api",
                args={"level": 2},
            )
            for v in verdicts
        ],
        resource_digests={"repo:api": digest},
    )
    results = [
        ValidationResultRecorded(
            plan_id=plan,
            run_id=run_id,
            attachment_id=f"A-{v}",
            validation=v,
            mode="informational" if v == "style" else "required",
            verdict=verdict,
            cause="timeout" if verdict is None else None,
            started_at=T0,
            ended_at=T1,
            duration_ms=durations[v],
        )
        for v, verdict in verdicts.items()
    ]
    done = ValidationRunCompleted(
        plan_id=plan,
        run_id=run_id,
        attempt=run,
        outcome=outcome,
        rules_version=1,
        results_digest="0" * 64,
        informational_failures=[v for v, ok in verdicts.items() if v == "style" and not ok],
    )
    return [NewEvent(payload=p) for p in (started, *results, done)]


def stats_appends() -> list[list[StreamAppend]]:
    """The stats scenario, one list per append (tests replay it inline and lagging)."""

    def one(stream: str, events: list[NewEvent]) -> list[StreamAppend]:
        return [StreamAppend(stream, events)]

    return [
        one(
            "plan:F",
            [NewEvent(payload=PlanCreated(plan_id="F", project="px", resources=["repo:api"]))],
        ),
        one(
            "plan:F",
            _run(
                "F",
                1,
                {"lint": True, "tests": False, "style": False},
                "d1",
                {"lint": 10, "tests": 100, "style": 5},
                "blocker",
            ),
        ),
        one(
            "plan:F",
            [
                NewEvent(
                    payload=AttemptFailed(
                        plan_id="F",
                        attempt=1,
                        iteration=1,
                        failure_class="validation",
                        reason="red",
                    )
                )
            ],
        ),
        one(
            "plan:F",
            _run(
                "F",
                2,
                {"lint": False, "tests": None, "style": True},
                "d1",
                {"lint": 30, "tests": 900, "style": 5},
                "validator_error",
            ),
        ),
        one(
            "plan:F",
            _run(
                "F",
                3,
                {"lint": True, "tests": True, "style": True},
                "d2",
                {"lint": 20, "tests": 200, "style": 5},
                "pass",
            ),
        ),
        one(
            "plan:F",
            [
                NewEvent(
                    payload=PlanHalted(
                        plan_id="F",
                        halt_type="blocker",
                        final_decision="blocker",
                        raw_halt_type="validation_failed",
                        reason="red",
                        phase="execute",
                        attempt=1,
                    )
                )
            ],
        ),
        one(
            "plan:F",
            [
                NewEvent(
                    payload=GateChecked(
                        plan_id="F",
                        gate="input",
                        tool="deploy",
                        verdict="fail",
                        attempt=1,
                        iteration=1,
                        strict_mode=True,
                        checked_sha256="0" * 64,
                        deviations=[
                            Deviation(
                                pointer="/x",
                                kind="extra_field",
                                expected="nothing",
                                actual_type="string",
                            ),
                            Deviation(
                                pointer="/y",
                                kind="wrong_type",
                                expected="integer",
                                actual_type="string",
                            ),
                        ],
                    )
                )
            ],
        ),
        one(
            "plan:G",
            [NewEvent(payload=PlanCreated(plan_id="G", project="other", resources=["repo:api"]))],
        ),
        one("plan:G", _run("G", 1, {"lint": True}, "d9", {"lint": 40}, "pass")),
    ]


def _stats_ledger(url: str) -> None:
    with ledger.open(url) as store:
        for append in stats_appends():
            store.append_batch(append)


def test_stats_aggregates(db_url: str) -> None:
    _stats_ledger(db_url)
    result = cli("stats", "--json", "--db", db_url)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    by_name = {v["validation"]: v for v in report["validations"]}
    assert by_name["lint"]["runs"] == 4 and by_name["lint"]["pass_rate"] == 0.75
    assert by_name["lint"]["mean_ms"] == 25 and by_name["lint"]["p95_ms"] == 40
    assert by_name["tests"]["no_verdict_rate"] == pytest.approx(1 / 3)
    assert by_name["tests"]["p95_ms"] == 900
    # lint and style flip on the same input and args; tests changed its input (d1 -> d2).
    assert report["flaky"] == [
        {"validation": v, "args": {"level": 2}, "input_digest": "d1", "pass": 1, "fail": 1}
        for v in ("lint", "style")
    ]
    # F's last run passed, then it halted on a blocker (a halt's type is the outcome).
    assert report["plans_by_outcome"] == {"blocker": 1, "pass": 1}
    assert (report["plans_applied"], report["plans_without_outcome"]) == (0, 0)
    assert report["halts_by_type"] == {"blocker": 1}
    assert report["informational_failures"] == {"style": 1}
    assert report["deviations_by_kind"] == {"extra_field": 1, "wrong_type": 1}
    assert report["deviations_by_tool"] == {"deploy": 2}
    plan_f = next(p for p in report["plans"] if p["plan"] == "F")
    assert (plan_f["attempts"], plan_f["failed_attempts"], plan_f["project"]) == (3, 1, "px")

    only = json.loads(cli("stats", "--json", "--project", "other", "--db", db_url).stdout)
    assert [p["plan"] for p in only["plans"]] == ["G"] and only["flaky"] == []
    assert [(v["validation"], v["runs"]) for v in only["validations"]] == [("lint", 1)]

    text = cli("stats", "--db", db_url)
    assert text.returncode == 0, text.stderr
    for fragment in ("flaky validation", "gate deviations by kind", "extra_field", "█"):
        assert fragment in text.stdout


def test_stats_since_counts_only_later_events(db_url: str) -> None:
    _stats_ledger(db_url)
    with ledger.open(db_url, create=False) as store:
        gate = next(e.position for e in store.read_all() if e.type == "gate.checked")
    report = json.loads(cli("stats", "--json", "--since", str(gate), "--db", db_url).stdout)
    assert report["deviations_by_kind"] == {"extra_field": 1, "wrong_type": 1}
    assert report["halts_by_type"] == {}
    assert [v["validation"] for v in report["validations"]] == ["lint"]
    assert next(p for p in report["plans"] if p["plan"] == "G")["project"] == "other"
