"""Progress of long work: the bar (done / total, events/s, ETA) that verify, catch-up and
rebuild draw on a terminal, and the ``(done, total)`` callbacks the engine and the plane
give it (projections/ and the plane never import the CLI: it passes the callback down)."""

from __future__ import annotations

import io
import sys
import time

import pytest

import commands.auditor.audit as audit_module
import ledger
import projections.engine as engine_module
from commands.cli import progress as progress_module
from commands.plane.core import Plane
from ledger.verify import verify_store
from projections import ALL_PROJECTIONS, ProjectionEngine
from tests.helpers import plan_created, run_cli, strategy


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _lagging_ledger(url: str, plans: int) -> int:
    """A ledger whose read models hold its first event and are behind by the rest
    (returned): events appended past them. (Read models that hold nothing are caught up
    as a rebuild, which reports its own progress.)"""
    with Plane.open(url) as plane:
        plane.store.append("plan:P-first", [plan_created("P-first")])
        plane.projections.catch_up()
    with ledger.open(url) as store:
        for i in range(plans):
            store.append(f"plan:P-{i}", [plan_created(f"P-{i}"), strategy(f"P-{i}")])
        return store.head().size - 1


def test_the_bar_shows_done_of_total_and_events_per_second(monkeypatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(progress_module, "SHOW_AFTER_S", 0.0)
    with progress_module.progress_bar("verify") as progress:
        for done in range(0, 101, 20):
            progress(done, 100)
            time.sleep(0.02)
    shown = terminal.getvalue()
    assert "verify" in shown and "100/100" in shown
    assert "events/s" in shown
    assert "B/s" not in shown  # rich's transfer speed: bytes


def test_no_bar_off_a_terminal_or_before_a_second(monkeypatch) -> None:
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    with progress_module.progress_bar("verify") as progress:
        progress(50, 100)
    assert piped.getvalue() == ""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress_module.progress_bar("verify") as progress:  # quick work: nothing drawn
        progress(50, 100)
    assert terminal.getvalue() == ""


def test_catch_up_reports_each_transaction(sqlite_url: str, monkeypatch) -> None:
    n = _lagging_ledger(sqlite_url, 5)  # 10 events behind
    monkeypatch.setattr(engine_module, "CATCH_UP_BATCH", 4)
    with ledger.open(sqlite_url) as store:
        engine = ProjectionEngine(store, ALL_PROJECTIONS)
        calls: list[tuple[int, int]] = []
        assert engine.catch_up(lambda done, total: calls.append((done, total))) == n
        assert calls == [(4, n), (8, n), (n, n)]
        assert all(engine.check(p.name).status == "ok" for p in ALL_PROJECTIONS)


def test_rebuild_reports_positions(sqlite_url: str) -> None:
    n = _lagging_ledger(sqlite_url, 3)
    with ledger.open(sqlite_url) as store:
        engine = ProjectionEngine(store, ALL_PROJECTIONS)
        calls: list[tuple[int, int]] = []
        engine.rebuild(progress=lambda done, total: calls.append((done, total)))
        assert calls[-1] == (n + 1, n + 1)  # the whole log
        assert all(engine.check(p.name).status == "ok" for p in ALL_PROJECTIONS)


def test_plane_open_passes_progress_to_the_catch_up(sqlite_url: str) -> None:
    n = _lagging_ledger(sqlite_url, 2)
    calls: list[tuple[int, int]] = []
    with Plane.open(sqlite_url, progress=lambda done, total: calls.append((done, total))):
        pass
    assert calls == [(n, n)]


@pytest.mark.parametrize("args", [["projections", "status"], ["projections", "rebuild"]])
def test_the_cli_draws_the_bar_while_opening_or_rebuilding(
    sqlite_url: str, monkeypatch, args: list[str]
) -> None:
    n = _lagging_ledger(sqlite_url, 6)
    monkeypatch.setattr(engine_module, "CATCH_UP_BATCH", 5)
    monkeypatch.setattr(progress_module, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(progress_module, "_on_terminal", lambda: True)
    result = run_cli("--db", sqlite_url, *args)
    assert result.returncode == 0, result.stderr
    label = "read models" if args[1] == "status" else "rebuilding every read model"
    assert label in result.stderr
    assert f"{n}/{n}" in result.stderr


def test_the_cli_draws_the_bar_while_exporting(sqlite_url: str, tmp_path, monkeypatch) -> None:
    _lagging_ledger(sqlite_url, 6)
    monkeypatch.setattr(progress_module, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(progress_module, "_on_terminal", lambda: True)
    out = tmp_path / "events.jsonl"
    result = run_cli("--db", sqlite_url, "export", "--format", "jsonl", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "export" in result.stderr and "13/13" in result.stderr
    assert len(out.read_text().splitlines()) == 13


def test_verify_in_one_process_tells_its_progress(sqlite_url: str) -> None:
    n = _lagging_ledger(sqlite_url, 4) + 1
    with ledger.open(sqlite_url) as store:
        calls: list[tuple[int, int]] = []
        report = verify_store(store, jobs=1, progress=lambda d, t: calls.append((d, t)))
        assert report.ok and calls == [(n, n)]


def test_the_cli_draws_the_bar_while_auditing(sqlite_url: str, monkeypatch) -> None:
    _lagging_ledger(sqlite_url, 6)
    monkeypatch.setattr(progress_module, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(progress_module, "_on_terminal", lambda: True)
    result = run_cli("--db", sqlite_url, "audit")  # a bare log: the verdict is not the point
    assert result.returncode in (0, 1), result.stderr
    assert "audit" in result.stderr and "13/13" in result.stderr


def test_the_audit_tells_its_progress_batch_by_batch(sqlite_url: str, monkeypatch) -> None:
    n = _lagging_ledger(sqlite_url, 6) + 1  # the whole log: the lag and the first event
    monkeypatch.setattr(audit_module, "_BATCH", 5)
    calls: list[tuple[int, int]] = []
    with ledger.open(sqlite_url) as store:
        report = audit_module.audit(store, progress=lambda d, t: calls.append((d, t)))
    assert report.size == n
    assert calls == [(5, n), (10, n), (n, n)]
