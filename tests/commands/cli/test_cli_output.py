"""What the CLI prints: `--format table|json|jsonl|csv` on every listing command, `-` as
standard output wherever a file is written (and refused where a file is required),
`tail` aligned and never cut when piped, `tool list` without shell quoting."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ledger
from commands.cli.terminal import json_inert
from commands.plane import Plane
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import define_skill
from commands.plane.runs import record_halt
from tests.commands.cli.test_terminal_text import HOSTILE, _on_pty, assert_inert_bytes, pty_only
from tests.helpers import (
    applied_plan,
    assert_refused,
    invoke,
    plan_created,
    run_cli,
    strategy,
)


def _size(url: str) -> int:
    with ledger.open(url, create=False) as store:
        return store.head().size


@pytest.fixture(scope="module")
def _listed_once(
    module_db_url: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, int]:
    """A ledger with something in every listing: a plan applied after an escalation and
    a signed decision (P-1: tools, validations, an attachment, an approver key), a skill,
    and a plan awaiting a human decision (P-2)."""
    root = tmp_path_factory.mktemp("listed")
    with pytest.MonkeyPatch.context() as patch:  # its own plane key and state directory
        patch.setenv("EVIDENCE_PLANE_KEY", str(root / "plane.key"))
        patch.setenv("EVIDENCE_STATE_DIR", str(root / "state"))
        with Plane.open(module_db_url) as plane:
            project = applied_plan(plane, root)
            define_skill(plane, {"name": "qa", "description": "checks", "members": ["status"]})
            create_plan(plane, "P-2", project="api", resources=["repo:web"])
            record_strategy(plane, "P-2", "ask first")
            enter_execute(plane, "P-2")
            record_halt(plane, "P-2", "needs_decision", "a human decides")
    return module_db_url, project, _size(module_db_url)


@pytest.fixture
def listed(_listed_once: tuple[str, Path, int]) -> tuple[str, Path]:
    """The shared ledger, checked unchanged before each test (they only read it)."""
    url, project, size = _listed_once
    assert _size(url) == size, "a test appended to the shared ledger"
    return url, project


def _ok(result: Any) -> str:
    assert result.returncode == 0, (result.stdout, result.stderr)
    return str(result.stdout)


def _cell(value: Any) -> str:
    """A CSV cell as docs/cli.md specifies it (written apart from the code under test)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _resolve_rows(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"set": "resolved", **a} for a in document["attachments"]] + [
        {"set": "pinned", **a} for a in document["pinned"] or []
    ]


def _stats_rows(document: dict[str, Any]) -> list[dict[str, Any]]:
    summary = [
        "since",
        "tree_size",
        "project",
        "plans_applied",
        "plans_applied_unvalidated",
        "plans_without_outcome",
    ]
    rows = [{"table": "summary", **{k: document[k] for k in summary}}]
    for table in ("validations", "flaky", "plans"):
        rows += [{"table": table, **row} for row in document[table]]
    for table in (
        "plans_by_outcome",
        "halts_by_type",
        "informational_failures",
        "deviations_by_kind",
        "deviations_by_tool",
    ):
        rows += [{"table": table, "key": k, "count": n} for k, n in document[table].items()]
    return rows


def _key(name: str) -> Callable[[dict[str, Any]], list[dict[str, Any]]]:
    return lambda document: document[name]


# (arguments, the rows of its --json document that jsonl and csv print)
LISTINGS: list[tuple[tuple[str, ...], Callable[[dict[str, Any]], list[dict[str, Any]]]]] = [
    (("events",), _key("events")),
    (("tool", "list"), _key("tools")),
    (("validation", "list"), _key("validations")),
    (("skill", "list"), _key("skills")),
    (("plan", "list"), _key("plans")),
    (("plan", "history", "P-1"), _key("events")),
    (("keys", "list"), _key("approvers")),
    (("authorize",), _key("decisions")),
    (("projections", "status"), _key("projections")),
    (("replay", "P-1"), _key("steps")),
    (("resolve", "--resource", "PROJECT", "--plan", "P-1"), _resolve_rows),
    (("stats",), _stats_rows),
]


@pytest.mark.parametrize(
    ("args", "rows_of"), LISTINGS, ids=lambda a: " ".join(a) if isinstance(a, tuple) else ""
)
def test_every_listing_prints_each_format(
    listed: tuple[str, Path],
    args: tuple[str, ...],
    rows_of: Callable[[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    url, project = listed
    args = tuple(str(project) if a == "PROJECT" else a for a in args)
    as_json = _ok(run_cli(*args, "--json", "--db", url))
    assert _ok(run_cli(*args, "--format", "json", "--db", url)) == as_json
    rows = rows_of(json.loads(as_json))
    assert rows, "the listing should not be empty: the test would prove nothing"

    jsonl = _ok(run_cli(*args, "--format", "jsonl", "--db", url))
    assert [json.loads(line) for line in jsonl.splitlines()] == rows

    text = _ok(run_cli(*args, "--format", "csv", "--db", url))
    columns = list(dict.fromkeys(key for row in rows for key in row))
    parsed = list(csv.reader(io.StringIO(text)))
    assert parsed[0] == columns
    assert parsed[1:] == [[_cell(row.get(c)) for c in columns] for row in rows]

    table = _ok(run_cli(*args, "--db", url))
    assert _ok(run_cli(*args, "--format", "table", "--db", url)) == table
    assert table != as_json and not table.lstrip().startswith("{")


def test_csv_lines_end_in_crlf(listed: tuple[str, Path]) -> None:
    url, _ = listed
    raw = invoke("tool", "list", "--format", "csv", "--db", url).stdout_bytes
    assert raw.count(b"\r\n") == raw.count(b"\n") == 2  # the header, the one tool (RFC 4180)


def test_json_and_another_format_are_refused(listed: tuple[str, Path]) -> None:
    url, _ = listed
    assert_refused(run_cli("events", "--json", "--format", "csv", "--db", url), "--json")
    assert_refused(run_cli("plan", "list", "--format", "xml", "--db", url), "xml")
    assert_refused(
        run_cli("authorize", "01M8N0Q6Z4RVC5J9W3X2B7TQ1D", "--format", "csv", "--db", url),
        "pending decisions",
    )


# -- tail and events: aligned, and never cut when piped -------------------------------

LONG = "a strategy that goes on " * 20  # 480 characters: longer than any old cut


def _columns_ledger(url: str) -> None:
    with ledger.open(url) as store:
        store.append("plan:A", [plan_created("A"), strategy("A", text="short")])
        store.append(
            "plan:a-plan-with-a-much-longer-name",
            [
                plan_created("a-plan-with-a-much-longer-name", actor="orchestrator-7"),
                strategy("a-plan-with-a-much-longer-name", text=LONG),
            ],
        )
        store.append("plan:A", [strategy("A", text="again", revision=0)])


def test_tail_columns_are_aligned_and_whole_when_piped(db_url: str) -> None:
    _columns_ledger(db_url)
    lines = _ok(run_cli("tail", "--db", db_url)).splitlines()
    assert len(lines) == 5
    for column in ("plan.", "plan_id="):
        starts = {line.index(column) for line in lines if column in line}
        assert len(starts) == 1, (column, lines)
    starts = {line.index("plan:") for line in lines}
    assert len(starts) == 1
    assert any(LONG.strip() in line for line in lines) and "…" not in "".join(lines)


def test_events_table_is_whole_when_piped(db_url: str) -> None:
    _columns_ledger(db_url)
    table = _ok(run_cli("events", "--db", db_url))
    assert LONG.strip() in table and "…" not in table


def test_tail_formats(db_url: str) -> None:
    _columns_ledger(db_url)
    events = json.loads(_ok(run_cli("events", "--json", "--db", db_url)))["events"]
    jsonl = _ok(run_cli("tail", "--format", "jsonl", "--db", db_url))
    assert _ok(run_cli("tail", "--json", "--db", db_url)) == jsonl
    assert [json.loads(line) for line in jsonl.splitlines()] == events
    rows = list(
        csv.DictReader(io.StringIO(_ok(run_cli("tail", "--format", "csv", "--db", db_url))))
    )
    assert rows == [{k: _cell(v) for k, v in e.items()} for e in events]
    assert_refused(run_cli("tail", "--json", "--format", "csv", "--db", db_url), "--json")
    assert_refused(run_cli("tail", "--format", "json", "--db", db_url), "json")


# -- tool list: the command as readable text ---------------------------------------------


def test_tool_list_shows_the_command_without_shell_quoting(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'e.db'}"
    spec = {"name": "hi", "command": ["python", "-c", "print('hi')", "a b", ""]}
    (tmp_path / "hi.json").write_text(json.dumps(spec))
    _ok(run_cli("tool", "register", str(tmp_path / "hi.json"), "--db", url))
    table = _ok(run_cli("tool", "list", "--db", url))
    assert """command python -c "print('hi')" "a b" \"\"""" in table
    assert "'\"'\"'" not in table
    shown = _ok(run_cli("tool", "show", "hi", "--db", url))
    assert """python -c "print('hi')" "a b" \"\"""" in shown
    doc = json.loads(_ok(run_cli("tool", "list", "--json", "--db", url)))
    assert doc["tools"][0]["spec"]["command"] == spec["command"]  # the exact list


# -- `-` is standard output ----------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_export_to_standard_output(listed: tuple[str, Path], tmp_path: Path, fmt: str) -> None:
    url, _ = listed
    piped = run_cli("export", "--format", fmt, "--out", "-", "--db", url, cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    assert list(tmp_path.iterdir()) == []  # no file named "-", no sidecar
    _ok(run_cli("export", "--format", fmt, "--out", str(tmp_path / f"e.{fmt}"), "--db", url))
    assert piped.stdout == (tmp_path / f"e.{fmt}").read_text(encoding="utf-8")
    meta = json.loads((tmp_path / f"e.{fmt}.meta.json").read_text())
    assert "to standard output" in piped.stderr
    assert f"{meta['evidence.tree_size']}:{meta['evidence.root_hash']}" in piped.stderr


def test_export_refuses_standard_output_where_it_cannot(
    listed: tuple[str, Path], tmp_path: Path
) -> None:
    url, _ = listed
    assert_refused(
        run_cli("export", "--format", "parquet", "--out", "-", "--db", url, cwd=tmp_path),
        "Parquet",
    )
    assert_refused(
        run_cli("export", "--format", "jsonl", "--out", "-", "--json", "--db", url, cwd=tmp_path),
        "--json",
    )
    assert list(tmp_path.iterdir()) == []


def test_bundle_to_standard_output_verifies(listed: tuple[str, Path], tmp_path: Path) -> None:
    url, project = listed
    key = str(project.parent / "plane.key")  # the shared ledger's plane key
    piped = run_cli(
        "export", "--bundle", "-", "--plan", "P-1", "--key", key, "--db", url, cwd=tmp_path
    )
    assert piped.returncode == 0, piped.stderr
    assert list(tmp_path.iterdir()) == []
    assert "to standard output" in piped.stderr and "signed checkpoint" in piped.stderr
    (tmp_path / "p1.bundle").write_text(piped.stdout, encoding="utf-8")
    verified = json.loads(_ok(run_cli("verify", "--bundle", str(tmp_path / "p1.bundle"), "--json")))
    assert verified["ok"] is True and verified["plan"] == "P-1"


def test_report_to_standard_output(listed: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = listed
    piped = run_cli("report", "P-1", "--html", "-", "--db", url, cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.startswith("<!DOCTYPE html>") and "P-1" in piped.stdout
    assert piped.stderr.startswith("wrote the report to standard output (plan P-1")
    assert list(tmp_path.iterdir()) == []


def test_a_private_key_never_goes_to_standard_output(tmp_path: Path) -> None:
    result = run_cli("keys", "generate", "--out", "-", cwd=tmp_path)
    assert_refused(result, "--out -", "private key")
    assert result.stdout == "" and list(tmp_path.iterdir()) == []


def test_a_file_named_dash_is_still_reachable(listed: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = listed
    _ok(run_cli("export", "--format", "jsonl", "--out", "./-", "--db", url, cwd=tmp_path))
    assert (tmp_path / "-").is_file() and (tmp_path / "-.meta.json").is_file()


# -- on a terminal: machine formats keep their meaning and act on nothing ------------------


def _hostile_ledger(path: Path) -> str:
    url = f"sqlite:///{path}"
    with ledger.open(url) as store:
        store.append("plan:A", [plan_created("A"), strategy("A", text=HOSTILE)])
    return url


def test_json_inert_keeps_every_value() -> None:
    value = {"s": HOSTILE + "\x7f\x9b\U000e0001\u200d\u00e9\u2028", "n": [1, None, True]}
    raw = json.dumps(value, ensure_ascii=False).encode() + b"\n"
    shown = json_inert(raw)
    assert json.loads(shown) == value and shown.isascii() is False  # é and ZWJ stay
    for char in ("\x7f", "\x9b", "\u202e", "\u2028", "\U000e0001"):
        assert char.encode() not in shown
    assert json_inert(b'{"a":"plain"}\n') == b'{"a":"plain"}\n'


@pytest.mark.slow
@pty_only
def test_machine_formats_on_a_terminal(tmp_path: Path) -> None:
    url = _hostile_ledger(tmp_path / "e.db")
    for args in (
        ("events", "--format", "csv"),
        ("events", "--format", "jsonl"),
        ("events", "--json"),
        ("tail", "--format", "csv"),
        ("tail", "--json"),
    ):
        code, out = _on_pty(*args, "--db", url, cwd=tmp_path)
        assert code == 0, (args, out)
        assert_inert_bytes(out)
        assert b"\\u202e" in out, (args, out)  # shown, as JSON escapes it or as inert does
    code, out = _on_pty("events", "--format", "jsonl", "--db", url, cwd=tmp_path)
    strategy_line = next(line for line in out.splitlines() if b"strategy_recorded" in line)
    assert json.loads(strategy_line)["payload"]["strategy"] == HOSTILE  # the same value


@pytest.mark.slow
@pty_only
def test_dash_refuses_a_terminal(tmp_path: Path) -> None:
    url = _hostile_ledger(tmp_path / "e.db")
    for args in (
        ("export", "--format", "jsonl", "--out", "-"),
        ("export", "--bundle", "-", "--key", str(tmp_path / "k")),
        ("report", "A", "--html", "-"),
    ):
        code, out = _on_pty(*args, "--db", url, cwd=tmp_path)
        assert code == 2, (args, out)
        assert b"standard output is a terminal" in out and b"Traceback" not in out
        assert_inert_bytes(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.db"]
