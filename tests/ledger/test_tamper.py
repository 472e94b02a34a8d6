"""An attacker with database access against the append-only log.

First the database's own guard: while the triggers exist, UPDATE and DELETE are refused.
Then the attacker drops the triggers and edits rows with raw SQL (no ledger code on the
write side), and ``verify_store`` must notice each edit, naming the right position.

Two edits are self-consistent (every hash and the head recomputed): a truncated tail and
a rewritten suffix. Nothing inside the database can show those; only a tree head kept
from before the edit can, so those tests check both halves of that statement.

Deleting a blob leaves every hash intact too, but the events still name it: ``verify``
reports each blob an event references that is gone, at that event's position.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import ledger
from commands.cli import cli
from commands.plane import Plane, input_rounds
from commands.plane.driver import run_plan_file
from commands.plane.gates import gate_input
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.proxy import exchanged, record_fetch
from commands.plane.review_host import host_review, run_review
from commands.plane.review_inputs import parse_reviewers
from commands.plane.reviews import account_review, get_review, start_review, submit_candidate
from commands.plane.runs import Recorded, call_tool
from ledger.bundle import verify_bundle, write_bundle
from ledger.canonical import canonical_json
from ledger.envelope import GENESIS_CHAIN, chain_next, leaf_bytes
from ledger.events import ALL_EVENT_TYPES
from ledger.keys import generate_key_pair
from ledger.merkle import EMPTY_ROOT, Frontier, leaf_hash
from ledger.rows import column_list
from ledger.verify import TreeHeadRef, VerifyReport, verify_store
from projections.states import PlanState
from tests.commands.plane.test_review_host import reviewers
from tests.commands.plane.test_reviews import accounting, candidate, finding, request
from tests.helpers import REPO, applied_plan, run_cli, strategy

EVENTS = 30
STREAMS = 3
BLOB = b"raw tool output: 3 passed, 0 failed\n" * 8

# The triggers each backend installs (ledger/tables.py), by table: the append-only
# guards, and on PostgreSQL the NOTIFY that wakes subscribers.
TRIGGERS: dict[str, set[tuple[str, str]]] = {
    "sqlite": {
        ("events_no_update", "events"),
        ("events_no_delete", "events"),
        ("blobs_no_update", "blobs"),
        ("blobs_no_delete", "blobs"),
        ("ledger_head_no_delete", "ledger_head"),
    },
    "postgresql": {
        ("events_append_only", "events"),
        ("blobs_append_only", "blobs"),
        ("events_no_truncate", "events"),
        ("blobs_no_truncate", "blobs"),
        ("ledger_head_no_truncate", "ledger_head"),
        ("ledger_head_no_delete", "ledger_head"),
        ("ledger_head_notify", "ledger_head"),
    },
}
EVENT_COLUMNS = column_list()  # every column of a stored event row (ledger.rows)
EXAMPLES = REPO / "examples"


@dataclass
class Ledger:
    store: ledger.Store
    attacker: sa.Engine  # a plain connection to the same database, no ledger code
    heads: list[TreeHeadRef]  # heads[n]: the tree head an auditor saw at size n
    blob_digest: str

    def verify(self, against: TreeHeadRef | None = None) -> VerifyReport:
        """``verify``, and ``verify --jobs 2`` in parts of 8 rows (a part boundary inside
        every attack): both must find exactly the same."""
        report = verify_store(self.store, against=against)
        in_parts = verify_store(self.store, against=against, jobs=2, rows_per_job=8)
        assert in_parts == report
        return report


@pytest.fixture
def populated(db_url: str) -> Iterator[Ledger]:
    """A ledger of 30 events over 3 streams and one blob, with every tree head kept."""
    store = ledger.open(db_url)
    heads = [_tree_head(store)]
    for i in range(EVENTS):
        plan = f"P-{i % STREAMS}"
        store.append(f"plan:{plan}", [strategy(plan, f"strategy {i + 1}", revision=i)])
        heads.append(_tree_head(store))
    digest = store.put_blob(BLOB)
    attacker = sa.create_engine(db_url)
    try:
        report = verify_store(store)
        assert report.ok, report.problems
        yield Ledger(store, attacker, heads, digest)
    finally:
        attacker.dispose()
        store.close()


@pytest.fixture
def unguarded(populated: Ledger) -> Ledger:
    """The same ledger after the attacker dropped every append-only trigger."""
    backend = populated.store.backend
    with populated.attacker.begin() as conn:
        assert _triggers(conn, backend) == TRIGGERS[backend]
        for name, table in TRIGGERS[backend]:
            on_table = f" ON {table}" if backend == "postgresql" else ""
            conn.exec_driver_sql(f"DROP TRIGGER {name}{on_table}")
        assert _triggers(conn, backend) == set()
    return populated


# -- raw-SQL tools of the attacker ------------------------------------------------------


def _tree_head(store: ledger.Store) -> TreeHeadRef:
    head = store.head()
    return TreeHeadRef(size=head.size, root=head.root.hex())


def _triggers(conn: sa.Connection, backend: str) -> set[tuple[str, str]]:
    if backend == "sqlite":
        sql = "SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger'"
    else:
        sql = (
            "SELECT t.tgname, c.relname FROM pg_trigger t "
            "JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE NOT t.tgisinternal AND n.nspname = current_schema()"
        )
    return {(name, table) for name, table in conn.exec_driver_sql(sql)}


def _rows(conn: sa.Connection) -> list[dict[str, Any]]:
    result = conn.execute(sa.text(f"SELECT {EVENT_COLUMNS} FROM events ORDER BY position"))
    return [
        {k: bytes(v) if isinstance(v, memoryview) else v for k, v in row.items()}
        for row in result.mappings()
    ]


def _row(conn: sa.Connection, position: int) -> dict[str, Any]:
    [row] = [r for r in _rows(conn) if r["position"] == position]
    return row


def _update(conn: sa.Connection, position: int, **columns: Any) -> None:
    assignments = ", ".join(f"{name} = :{name}" for name in columns)
    result = conn.execute(
        sa.text(f"UPDATE events SET {assignments} WHERE position = :where_position"),
        {**columns, "where_position": position},
    )
    assert result.rowcount == 1


def _leaf(row: dict[str, Any]) -> bytes:
    """The row's leaf hash, recomputed the way the store computes it."""
    return leaf_hash(
        leaf_bytes(
            row["position"],
            row["event_id"],
            row["stream"],
            row["stream_version"],
            row["type"],
            row["schema_version"],
            row["recorded_at"],
            row["actor"],
            row["correlation_id"],
            row["causation_id"],
            bytes(row["payload"]),
            bytes(row["delta"]),
        )
    )


def _forged_payload(row: dict[str, Any]) -> bytes:
    """A different but well-formed payload: canonical JSON with the strategy replaced."""
    payload = json.loads(row["payload"])
    payload["strategy"] = f"forged {payload['strategy']}"
    return canonical_json(payload)


def _rehash_from(conn: sa.Connection, position: int) -> None:
    """Recompute leaf and chain hash of every row from ``position`` on, in place."""
    rows = _rows(conn)
    chain = GENESIS_CHAIN
    for row in rows:
        if row["position"] >= position:
            leaf = _leaf(row)
            chain = chain_next(chain, leaf)
            _update(conn, row["position"], leaf_hash=leaf, chain_hash=chain)
        else:
            chain = row["chain_hash"]


def _rewrite_head(conn: sa.Connection) -> None:
    """Make ledger_head describe exactly the rows that are there now."""
    rows = _rows(conn)
    frontier = Frontier()
    for row in rows:
        frontier.append(row["leaf_hash"])
    conn.execute(
        sa.text(
            "UPDATE ledger_head SET size = :size, chain_hash = :chain, "
            "frontier = :frontier WHERE id = 1"
        ),
        {
            "size": frontier.size,
            "chain": rows[-1]["chain_hash"] if rows else GENESIS_CHAIN,
            "frontier": frontier.to_bytes(),
        },
    )


def delete_blob(db_url: str, digest: str) -> None:
    """The attacker's way to a blob row: drop the trigger that refuses DELETE on
    ``blobs``, then delete it with plain SQL."""
    engine = sa.create_engine(db_url)
    try:
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM blobs WHERE digest = :d"), {"d": digest})
        with engine.begin() as conn:
            if engine.dialect.name == "sqlite":
                conn.exec_driver_sql("DROP TRIGGER blobs_no_delete")
            else:
                conn.exec_driver_sql("DROP TRIGGER blobs_append_only ON blobs")
            result = conn.execute(sa.text("DELETE FROM blobs WHERE digest = :d"), {"d": digest})
            assert result.rowcount == 1
    finally:
        engine.dispose()


def passing_result(store: ledger.Store, plan: str = "P-1") -> ledger.RecordedEvent:
    """The one passing validation result of ``applied_plan``; its raw output is stored."""
    [passed] = [
        e
        for e in store.read_stream(f"plan:{plan}")
        if e.type == "validation.result_recorded" and e.payload.verdict is True
    ]
    assert passed.payload.raw_output_sha256 is not None
    assert store.get_blob(passed.payload.raw_output_sha256) is not None
    return passed


def _row_problems(report: VerifyReport) -> dict[int, set[str]]:
    found: dict[int, set[str]] = {}
    for p in report.problems:
        if p.position is not None:
            found.setdefault(p.position, set()).add(p.kind)
    return found


# -- the guard ----------------------------------------------------------------------------


def test_triggers_refuse_update_and_delete(populated: Ledger) -> None:
    refused = [
        "UPDATE events SET payload = payload WHERE position = 1",
        "UPDATE events SET stream_version = stream_version + 100",
        "DELETE FROM events WHERE position = 30",
        "DELETE FROM events",
        "UPDATE blobs SET data = data",
        "DELETE FROM blobs",
        "DELETE FROM ledger_head",
    ]
    if populated.store.backend == "postgresql":
        refused += ["TRUNCATE events", "TRUNCATE blobs", "TRUNCATE ledger_head"]
    for sql in refused:
        with (
            pytest.raises(sa.exc.DBAPIError, match="append-only"),
            populated.attacker.begin() as conn,
        ):
            conn.exec_driver_sql(sql)
    # Nothing changed: same head, still verifies.
    assert _tree_head(populated.store) == populated.heads[EVENTS]
    report = populated.verify()
    assert report.ok, report.problems
    assert populated.store.get_blob(populated.blob_digest) == BLOB


# -- edits that a check of the log against itself catches ------------------------------


def test_flipped_payload_byte_is_found_at_its_row(unguarded: Ledger) -> None:
    target = 15
    with unguarded.attacker.begin() as conn:
        payload = bytearray(_row(conn, target)["payload"])
        at = payload.index(b"strategy 15")
        payload[at] ^= 0x20  # "strategy 15" -> "Strategy 15": one byte, still valid JSON
        _update(conn, target, payload=bytes(payload))

    report = unguarded.verify()
    assert not report.ok
    assert report.first_bad_position == target
    # The chain links stored leaf hashes, so only the edited row itself is flagged.
    assert _row_problems(report) == {target: {"leaf_mismatch"}}


def test_deleted_middle_row_is_reported_as_a_hole(unguarded: Ledger) -> None:
    target = 15
    with unguarded.attacker.begin() as conn:
        conn.execute(sa.text("DELETE FROM events WHERE position = :p"), {"p": target})

    report = unguarded.verify()
    assert not report.ok
    holes = [p for p in report.problems if p.kind == "hole"]
    assert len(holes) == 1
    # Seen where the scan meets the gap: at the missing position or the next stored one.
    assert holes[0].position in (target, target + 1)
    assert report.first_bad_position in (target, target + 1)


@pytest.mark.parametrize(
    ("column", "edit", "kind"),
    [
        ("frontier", "zeroed", "head_root"),
        ("frontier", "one_bit", "head_root"),
        ("frontier", "emptied", "head_root"),
        ("chain_hash", "one_bit", "head_chain"),
    ],
)
def test_an_edited_ledger_head_is_found(
    populated: Ledger, column: str, edit: str, kind: str
) -> None:
    """The head's Merkle frontier is what the next append extends and what a checkpoint
    signs the root of; its chain hash is what the next row chains from. The head is a
    plain row every append updates (no trigger can guard it), so an edit of it needs no
    trigger dropped: verify must recompute both."""
    with populated.attacker.begin() as conn:
        stored = conn.execute(
            sa.text(f"SELECT {column} FROM ledger_head WHERE id = 1")
        ).scalar_one()
        edited = {
            "zeroed": bytes(len(stored)),
            "one_bit": bytes([stored[0] ^ 0x01]) + bytes(stored[1:]),
            "emptied": b"",
        }[edit]
        conn.execute(sa.text(f"UPDATE ledger_head SET {column} = :v WHERE id = 1"), {"v": edited})

    report = populated.verify()
    assert not report.ok
    assert [p.kind for p in report.problems] == [kind]
    assert report.first_bad_position is None  # about the head, not a row


def test_deleted_tail_without_head_rewind_is_found(unguarded: Ledger) -> None:
    # The naive truncation: rows gone, head untouched. The head gives it away.
    with unguarded.attacker.begin() as conn:
        conn.execute(sa.text("DELETE FROM events WHERE position > :p"), {"p": EVENTS - 3})

    report = unguarded.verify()
    assert not report.ok
    assert "head_size" in {p.kind for p in report.problems}


def test_swapped_rows_are_found_at_both_positions(unguarded: Ledger) -> None:
    first, second = 10, 20
    with unguarded.attacker.begin() as conn:
        # Swapping every other column between the two rows is the same as swapping their
        # position values; doing it through a free position dodges the unique constraints
        # (event_id; stream + stream_version) that a column-wise swap would trip midway.
        for old, new in ((first, -1), (second, first), (-1, second)):
            conn.execute(
                sa.text("UPDATE events SET position = :new WHERE position = :old"),
                {"new": new, "old": old},
            )
        assert _row(conn, first)["payload"] != _row(conn, second)["payload"]

    report = unguarded.verify()
    assert not report.ok
    assert report.first_bad_position == first
    # The position is part of the hashed envelope, so both moved rows fail their leaf.
    problems = _row_problems(report)
    assert "leaf_mismatch" in problems[first]
    assert "leaf_mismatch" in problems[second]


def test_rewritten_row_with_its_own_hashes_fixed_breaks_the_next_link(
    unguarded: Ledger,
) -> None:
    target = 15
    with unguarded.attacker.begin() as conn:
        row = _row(conn, target)
        previous_chain = _row(conn, target - 1)["chain_hash"]
        row["payload"] = _forged_payload(row)
        leaf = _leaf(row)
        _update(
            conn,
            target,
            payload=row["payload"],
            leaf_hash=leaf,
            chain_hash=chain_next(previous_chain, leaf),
        )

    report = unguarded.verify()
    assert not report.ok
    # Row 15 is self-consistent now; the stored chain of row 16 still commits to the
    # old row 15, so the break shows at row 15 or right after it.
    assert report.first_bad_position in (target, target + 1)
    assert "chain_mismatch" in _row_problems(report)[target + 1]


def test_flipped_blob_byte_is_found(unguarded: Ledger) -> None:
    tampered = bytearray(BLOB)
    tampered[5] ^= 0x01
    with unguarded.attacker.begin() as conn:
        result = conn.execute(
            sa.text("UPDATE blobs SET data = :data WHERE digest = :digest"),
            {"data": bytes(tampered), "digest": unguarded.blob_digest},
        )
        assert result.rowcount == 1

    report = unguarded.verify()
    assert not report.ok
    assert [p.kind for p in report.problems] == ["blob_mismatch"]
    assert report.first_bad_position is None  # a blob is not a log position
    # The events themselves are untouched.
    assert verify_store(unguarded.store, check_blobs=False).ok


@pytest.fixture
def passed_plan(db_url: str, tmp_path: Path) -> Iterator[Plane]:
    """P-1 taken to Apply by a passing validation result whose raw output is a blob."""
    with Plane.open(db_url) as plane:
        applied_plan(plane, tmp_path)
        report = verify_store(plane.store)
        assert report.ok, report.problems
        yield plane


def test_deleted_raw_output_behind_a_pass_is_missing_at_its_event(
    passed_plan: Plane,
    db_url: str,
) -> None:
    store = passed_plan.store
    passed = passing_result(store)
    digest = passed.payload.raw_output_sha256
    delete_blob(db_url, digest)
    assert store.get_blob(digest) is None

    report = verify_store(store)
    assert not report.ok
    assert [(p.position, p.kind) for p in report.problems] == [(passed.position, "blob_missing")]
    detail = report.problems[0].detail
    assert "validation.result_recorded" in detail and "raw_output_sha256" in detail
    assert digest in detail
    assert report.first_bad_position == passed.position
    # Every hash is intact: only the blob check can see it.
    assert verify_store(store, check_blobs=False).ok


def test_cli_verify_reports_the_missing_blob_and_exits_1(
    passed_plan: Plane,
    db_url: str,
) -> None:
    passed = passing_result(passed_plan.store)
    digest = passed.payload.raw_output_sha256
    runner = CliRunner()
    before = runner.invoke(cli, ["verify", "--db", db_url])
    assert before.exit_code == 0, before.output
    delete_blob(db_url, digest)

    text = runner.invoke(cli, ["verify", "--db", db_url])
    assert text.exit_code == 1, text.output
    assert f"first bad position {passed.position}" in text.output
    [line] = [ln for ln in text.output.splitlines() if "blob_missing" in ln]
    assert line.strip().startswith(f"position {passed.position}: blob_missing: ")
    assert "raw_output_sha256" in line and digest in line

    as_json = runner.invoke(cli, ["verify", "--json", "--db", db_url])
    assert as_json.exit_code == 1, as_json.output
    report = json.loads(as_json.output)
    assert report["ok"] is False and report["first_bad_position"] == passed.position
    assert [(p["position"], p["kind"]) for p in report["problems"]] == [
        (passed.position, "blob_missing")
    ]
    assert digest in report["problems"][0]["detail"]


# -- self-consistent edits: only an earlier tree head can tell -------------------------


def test_consistent_truncation_needs_an_earlier_tree_head(unguarded: Ledger) -> None:
    kept = 5
    with unguarded.attacker.begin() as conn:
        conn.execute(sa.text("DELETE FROM events WHERE position > :p"), {"p": EVENTS - kept})
        _rewrite_head(conn)

    # A self-consistent truncation cannot be seen without an earlier tree head: the rows
    # left are exactly the log as it was at size 25, and the head was rewound to match.
    report = unguarded.verify()
    assert report.ok, report.problems
    assert report.size == EVENTS - kept
    assert verify_store(unguarded.store, against=unguarded.heads[EVENTS - kept]).ok

    # An auditor who kept the head at size 30 sees that the log no longer extends it.
    report = unguarded.verify(against=unguarded.heads[EVENTS])
    assert not report.ok
    assert report.against is not None and report.against.ok is False
    assert "against_truncated" in {p.kind for p in report.problems}


def test_consistent_suffix_rewrite_needs_an_earlier_tree_head(unguarded: Ledger) -> None:
    rewritten = 5
    first = EVENTS - rewritten + 1
    with unguarded.attacker.begin() as conn:
        for row in _rows(conn):
            if row["position"] >= first:
                _update(conn, row["position"], payload=_forged_payload(row))
        _rehash_from(conn, first)
        _rewrite_head(conn)
        assert b"forged" in _row(conn, EVENTS)["payload"]

    # Every leaf, chain hash and the head agree with the forged rows: the log checked
    # against itself is fine.
    report = unguarded.verify()
    assert report.ok, report.problems
    assert report.size == EVENTS
    assert report.root != unguarded.heads[EVENTS].root

    # The head kept at size 30 exposes the rewrite; a head from before the rewritten
    # suffix still holds (the prefix is untouched), one from inside it does not.
    report = unguarded.verify(against=unguarded.heads[EVENTS])
    assert not report.ok
    assert "against_inconsistent" in {p.kind for p in report.problems}
    assert unguarded.verify(against=unguarded.heads[first - 1]).ok
    assert not unguarded.verify(against=unguarded.heads[first]).ok


# -- positive control ----------------------------------------------------------------


def test_untampered_log_verifies_against_current_and_earlier_heads(populated: Ledger) -> None:
    current = _tree_head(populated.store)
    assert current == populated.heads[EVENTS]
    assert populated.verify().ok
    assert populated.verify(against=current).ok
    # An earlier prefix head, taken before more appends, is still extended by the log.
    earlier = populated.heads[10]
    report = populated.verify(against=earlier)
    assert report.ok, report.problems
    assert report.against == TreeHeadRef(size=earlier.size, root=earlier.root, ok=True)
    assert populated.verify(against=TreeHeadRef(size=0, root=EMPTY_ROOT.hex())).ok
    # And the check is real: the right size with another root is refused.
    wrong = TreeHeadRef(size=10, root=populated.heads[11].root)
    assert not populated.verify(against=wrong).ok


def test_every_kind_of_blob_reference_the_plane_writes_verifies(
    db_url: str,
    tmp_path: Path,
) -> None:
    """No false positives: a ledger holding every blob-referencing event the plane writes
    (gates with and without a schema, executed and recorded tool calls, raw outputs of
    command, wrapped and review results, a fix with a diff, compensation output, a review
    report, a hosted review's program outputs, what an MCP server said during a call or a
    round of questions, a resource read and the answers it came with) verifies, in the
    database and as a bundle; and the blobs the events reference are exactly the blobs
    stored."""
    with Plane.open(db_url) as plane:
        for name in ("green-after-fix", "strict-output-deviation"):  # fix diff, compensation
            shutil.copytree(EXAMPLES / name, tmp_path / name)
            run_plan_file(plane, tmp_path / name / "plan.yaml")
        create_plan(plane, "P-R", project="calc", resources=["repo:calc"], config={})
        record_strategy(plane, "P-R", "record a call and ask for a review")
        enter_execute(plane, "P-R")
        assert call_tool(
            plane, "P-R", "inspect-project", {}, recorded_output={"python_files": []}
        ).ok
        said = exchanged([{"kind": "log", "params": {"level": "info", "data": "x"}}])
        recorded = Recorded(b'{"python_files": []}', exchange=said)  # a gate's MCP call
        assert call_tool(plane, "P-R", "inspect-project", {}, recorded=recorded).ok
        answers = {"ok": {"action": "accept"}}  # a read the server's questions shaped
        record_fetch(plane, "P-R", "srv", "resource", "test://r", {"contents": []}, answers)
        # a server's round of questions, and the agent's answers to it
        plan = plane.state("plan:P-R").of(PlanState)
        assert plan is not None
        question = {
            "resultType": "input_required",
            "inputRequests": {"ok": {"method": "roots/list"}},
        }
        assert said is not None  # what the server said during the round, kept with it
        round_ = input_rounds.asked(
            plane, plan, "inspect-project", None, b"{}", question, 1, (said.messages, said.counts)
        )
        input_rounds.given(plane, "P-R", "inspect-project", b"{}", {"ok": {}}, round_.round_id)
        assert not gate_input(plane, "P-R", "ghost", {}).passed  # no schema: no schema blob
        task = start_review(plane, request(), plan_id="P-R")
        submit_candidate(plane, task, candidate(finding("x")), reviewer="amy")
        assert account_review(
            plane, task, accounting(get_review(plane, task), {"G1": ["x"]}, [])
        ).accepted
        reviewed = tmp_path / "reviewed"  # a hosted review: each program's stdout
        reviewed.mkdir()
        (reviewed / "a.py").write_text("x = 1  # TODO\n")
        receipt = run_review(
            plane,
            request(scope=["a.py"]),
            parse_reviewers(reviewers(), "test"),
            repository=reviewed,
            start=False,
        )
        assert host_review(plane, receipt.task_id).status == "completed"

        referenced: Counter[tuple[str, str]] = Counter()
        digests = set()
        for event in plane.store.read_all():
            for field, digest in event.payload.blob_refs():
                referenced[(event.type, field)] += 1
                digests.add(digest)
        declared = {(cls.type_name(), f) for cls in ALL_EVENT_TYPES for f in cls.BLOB_FIELDS}
        assert set(referenced) == declared  # every declared reference occurs, non-null
        with plane.store.snapshot() as snap:
            stored = {digest for digest, _, _ in snap.blobs()}
        assert digests == stored  # ... and they name exactly the blobs the plane stored

        report = verify_store(plane.store)
        assert report.ok, report.problems
        assert report.checked_blobs == len(stored)
        keys = generate_key_pair(tmp_path / "plane.key")
        summary = write_bundle(
            plane.store,
            tmp_path / "all.bundle",
            key=keys.private_key,
            origin="evidence-ledger/test",
        )
        assert summary.blobs == len(stored)
        bundled = verify_bundle(tmp_path / "all.bundle", public_key=keys.public_key)
        assert bundled.ok, bundled.problems


def test_cli_verify_in_parallel_reads_like_one_job(populated: Ledger) -> None:
    """`verify --jobs 2`: the same verdict and tree head as one job (a log this small is
    one part: the parts themselves are compared with one scan in every attack above)."""
    url = populated.store.url
    one = run_cli("verify", "--jobs", "1", "--db", url, "--json")
    two = run_cli("verify", "--jobs", "2", "--db", url, "--json")
    assert one.returncode == two.returncode == 0, one.stderr + two.stderr
    assert json.loads(one.stdout) == json.loads(two.stdout)
    refused = run_cli("verify", "--jobs", "0", "--db", url)
    assert refused.returncode == 2 and "--jobs" in refused.stderr
