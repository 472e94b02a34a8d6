"""The ``evidence`` command through its real entry point (in-process, ``run_cli``), on
both backends."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

import ledger
from ledger.events import Catalog, EventPayload
from tests.helpers import assert_refused, plan_created, run_cli, run_cli_process, strategy

run = run_cli


def _seed(url: str, n: int = 5) -> None:
    with ledger.open(url) as s:
        s.append("plan:P-1", [plan_created()])
        for i in range(n - 1):
            s.append(f"plan:P-{i % 2}", [strategy(f"P-{i % 2}", text=f"s{i}")])


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0 and ledger.__version__ in result.stdout


def test_the_entry_point_runs_as_a_process(tmp_path: Path) -> None:
    # Once as a real process: `python -m commands.cli` itself, its exit codes and stderr.
    assert ledger.__version__ in run_cli_process("--version").stdout
    assert_refused(
        run_cli_process("events", "--db", f"sqlite:///{tmp_path / 'none.db'}"), "evidence init"
    )


def test_init_defaults_to_evidence_db_in_the_working_directory(tmp_path: Path) -> None:
    result = run("init", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["db"] == f"sqlite:///{tmp_path / 'evidence.db'}"
    # The operator key is made; the first policy command registers it (or --operator).
    assert doc["size"] == 0 and doc["schema_version"] == 1 and len(doc["ledger_id"]) == 26
    assert not doc["operator"]["registered"] and doc["operator"]["name"] == "operator"
    assert (tmp_path / "evidence.db").exists()
    again = run("init", "--json", cwd=tmp_path)  # idempotent
    assert json.loads(again.stdout)["ledger_id"] == doc["ledger_id"]
    assert json.loads(again.stdout)["size"] == 0
    named = run("init", "--operator", "ops", "--json", cwd=tmp_path)
    assert json.loads(named.stdout)["operator"] == {
        **json.loads(named.stdout)["operator"],
        "name": "ops",
        "added": True,
        "registered": True,
    }
    assert json.loads(named.stdout)["size"] == 2  # the ledger's identification, the key


def test_evidence_db_environment_variable(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    assert run("init", env={"EVIDENCE_DB": url}, cwd=tmp_path).returncode == 0
    assert (tmp_path / "env.db").exists() and not (tmp_path / "evidence.db").exists()


def test_db_before_and_after_the_command(db_url: str) -> None:
    _seed(db_url)
    before = run("--db", db_url, "events", "--json")
    after = run("events", "--json", "--db", db_url)
    assert before.returncode == after.returncode == 0, before.stderr + after.stderr
    assert json.loads(before.stdout) == json.loads(after.stdout)
    assert [e["position"] for e in json.loads(before.stdout)["events"]] == [1, 2, 3, 4, 5]


def test_events_filters_and_table(db_url: str) -> None:
    _seed(db_url, 8)
    page = json.loads(
        run("events", "--db", db_url, "--from", "3", "--limit", "2", "--json").stdout
    )["events"]
    assert [e["position"] for e in page] == [3, 4]
    one = json.loads(run("events", "--db", db_url, "--stream", "plan:P-1", "--json").stdout)
    assert {e["stream"] for e in one["events"]} == {"plan:P-1"}
    created = json.loads(run("events", "--db", db_url, "--type", "plan.created", "--json").stdout)[
        "events"
    ]
    assert [e["type"] for e in created] == ["plan.created"]
    assert created[0]["payload"]["plan_id"] == "P-1"
    table = run("events", "--db", db_url)
    assert table.returncode == 0 and "plan.created" in table.stdout
    assert "8 event(s)" in table.stdout


def test_verify_ok_and_against(db_url: str) -> None:
    _seed(db_url, 6)
    result = run("verify", "--db", db_url, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["size"] == 6 and report["problems"] == []
    kept = f"{report['size']}:{report['root']}"
    _seed(db_url, 3)  # the log grows: it still extends the kept head
    grown = run("verify", "--db", db_url, "--against", kept)
    assert grown.returncode == 0, grown.stdout
    assert "extends the kept tree head" in grown.stdout
    bogus = f"{report['size']}:{'0' * 64}"
    failed = run("verify", "--db", db_url, "--against", bogus, "--json")
    assert failed.returncode == 1
    doc = json.loads(failed.stdout)
    assert doc["against"]["ok"] is False
    assert doc["problems"][0]["kind"] == "against_inconsistent"
    too_big = run("verify", "--db", db_url, "--against", f"99:{report['root']}")
    assert too_big.returncode == 1 and "truncated" in too_big.stdout


def test_verify_names_the_first_bad_position(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'e.db'}"
    _seed(url, 6)
    raw = sqlite3.connect(tmp_path / "e.db")
    raw.execute("DROP TRIGGER events_no_update")
    raw.execute("UPDATE events SET actor = 'mallory' WHERE position = 4")
    raw.commit()
    raw.close()
    result = run("verify", "--db", url)
    assert result.returncode == 1
    assert "first bad position 4" in result.stdout
    assert "leaf_mismatch" in result.stdout


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("not-a-url", "not a database URL"),
        ("sqlite://x/y:z@", "malformed"),
        ("mysql://root@localhost/db", "unsupported database scheme"),
        ("postgresql+asyncpg://u@h/db", "unsupported PostgreSQL driver"),
    ],
)
def test_bad_urls_are_refused(url: str, fragment: str, tmp_path: Path) -> None:
    for command in ("init", "events", "verify"):
        assert_refused(run("--db", url, command, cwd=tmp_path), fragment)
    assert list(tmp_path.iterdir()) == []


def test_unreadable_files_are_refused(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    assert_refused(run("--db", f"sqlite:///{garbage}", "events"), "file is not a database")
    assert_refused(run("--db", f"sqlite:///{tmp_path}", "init"), "is a directory")
    missing = tmp_path / "missing.db"
    assert_refused(run("--db", f"sqlite:///{missing}", "events"), "run `evidence init`")
    assert_refused(run("--db", f"sqlite:///{missing}", "verify"), "run `evidence init`")
    assert not missing.exists()  # a read never creates a ledger
    assert garbage.read_bytes() == b"this is not a database" * 100


def test_bad_options_are_refused(db_url: str) -> None:
    _seed(db_url, 2)
    assert_refused(run("events", "--db", db_url, "--from", "0"), "--from")
    assert_refused(run("events", "--db", db_url, "--type", "no.such"), "unknown event type")
    assert_refused(run("verify", "--db", db_url, "--against", "12"), "--against")
    assert_refused(run("nonsense"), "No such command")
    with ledger.open(db_url) as s:
        assert s.head().size == 2


def test_unknown_event_type_on_read(db_url: str) -> None:
    class Future(EventPayload, tag="future.thing", kw_only=True):
        note: str

    with ledger.open(db_url, catalog=Catalog([*ledger.DEFAULT_CATALOG, Future])) as s:
        s.append("x", [ledger.NewEvent(payload=Future(note="from a newer release"))])
    assert_refused(run("events", "--db", db_url), "unknown event type 'future.thing'")
    assert run("verify", "--db", db_url).returncode == 0
