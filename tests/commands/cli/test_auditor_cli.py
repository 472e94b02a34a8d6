"""The auditor's conveniences: the newest events first or the last N (`events --last`,
`--reverse`, ``Store.read_backwards``), one event with its hashes and its inclusion proof
(`evidence event`), and a proof checked against a trusted tree head in one step (`prove
--verify`) — including against someone who rewrote the database."""

from __future__ import annotations

import json
import sqlite3
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest

import ledger
from ledger.envelope import leaf_bytes
from ledger.keys import generate_key_pair
from ledger.merkle import verify_consistency, verify_inclusion
from tests.helpers import assert_refused, plan_created, run_cli, strategy


def _seed(url: str) -> None:
    """Ten events on two streams: A at 1, 3, 5, 7, 9 and B at 2, 4, 6, 8, 10 (each stream
    a plan.created, then strategies), and the plane key `init` makes."""
    assert run_cli("init", "--db", url).returncode == 0
    with ledger.open(url) as store:
        for i in range(5):
            store.append("plan:A", [plan_created("A") if i == 0 else strategy("A", f"a{i}")])
            store.append("plan:B", [plan_created("B") if i == 0 else strategy("B", f"b{i}")])


def _positions(url: str, *args: str) -> list[int]:
    result = run_cli("events", *args, "--json", "--db", url)
    assert result.returncode == 0, result.stderr
    return [e["position"] for e in json.loads(result.stdout)["events"]]


def _ok(result: Any) -> Any:
    assert result.returncode == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout) if result.stdout.startswith("{") else result.stdout


# -- events --last N, --reverse --------------------------------------------------------


def test_events_last_and_reverse(db_url: str) -> None:
    _seed(db_url)
    assert _positions(db_url, "--last", "3") == [8, 9, 10]
    assert _positions(db_url, "--reverse") == list(range(10, 0, -1))
    assert _positions(db_url, "--reverse", "--limit", "2") == [10, 9]
    assert _positions(db_url, "--last", "2", "--reverse") == [10, 9]
    assert _positions(db_url, "--stream", "plan:A", "--last", "2") == [7, 9]
    assert _positions(db_url, "--type", "plan.created", "--last", "1") == [2]
    assert _positions(db_url, "--from", "7", "--reverse") == [10, 9, 8, 7]
    assert _positions(db_url, "--last", "50") == list(range(1, 11))
    table = run_cli("events", "--last", "2", "--db", db_url).stdout
    assert table.splitlines()[1].startswith("9 ") and "2 event(s)" in table
    assert_refused(run_cli("events", "--last", "1", "--limit", "1", "--db", db_url), "--last")
    assert_refused(run_cli("events", "--last", "0", "--db", db_url), "--last")


def test_read_backwards_pages_across_batches(db_url: str) -> None:
    _seed(db_url)
    with ledger.open(db_url) as store:
        forward = list(store.read_all())
        for size in (1, 2, 3, 1000):
            back = list(store.read_backwards(batch_size=size))
            assert [e.position for e in back] == [e.position for e in reversed(forward)]
            assert back == list(reversed(forward))
            only_b = [e.position for e in store.read_backwards(stream="plan:B", batch_size=size)]
            assert only_b == [10, 8, 6, 4, 2]
            typed = store.read_backwards(
                types=["plan.strategy_recorded"], from_position=4, batch_size=size
            )
            assert [e.position for e in typed] == [10, 9, 8, 7, 6, 5, 4]
        assert [e.position for e in store.read_backwards(5, from_position=3)] == [5, 4, 3]


# -- evidence event ------------------------------------------------------------------------


def test_event_by_position_and_by_id(db_url: str) -> None:
    _seed(db_url)
    listed = json.loads(run_cli("events", "--json", "--db", db_url).stdout)["events"]
    head = _ok(run_cli("verify", "--json", "--db", db_url))
    by_position = _ok(run_cli("event", "4", "--json", "--db", db_url))
    assert by_position["event"] == listed[3]
    by_id = _ok(run_cli("event", listed[3]["event_id"].lower(), "--json", "--db", db_url))
    assert by_id == by_position
    assert by_position["leaf_ok"] is True and by_position["payload_error"] is None
    assert by_position["recomputed_leaf_hash"] == listed[3]["leaf_hash"]
    proof = by_position["proof"]
    assert (proof["tree_size"], proof["root"], proof["leaf_index"]) == (10, head["root"], 3)
    assert verify_inclusion(
        bytes.fromhex(listed[3]["leaf_hash"]),
        3,
        10,
        [bytes.fromhex(p) for p in proof["proof"]],
        bytes.fromhex(head["root"]),
    )
    text = _ok(run_cli("event", "4", "--db", db_url))
    assert f"leaf_hash       {listed[3]['leaf_hash']} (matches the stored bytes)" in text
    assert '"plan_id": "B"' in text and "inclusion proof in the tree of 10 events" in text


def test_event_refusals(db_url: str) -> None:
    _seed(db_url)
    assert_refused(run_cli("event", "11", "--db", db_url), "no event at position 11", "10")
    assert_refused(run_cli("event", "0", "--db", db_url), "POSITION_OR_ID")
    assert_refused(run_cli("event", "P-1", "--db", db_url), "neither a position")
    assert_refused(
        run_cli("event", "01M8MF3X4R6C1S268ZFR55Z0KN", "--db", db_url), "no event with id"
    )


def _rewrite(path: Path, position: int, payload: bytes, *, leaf_too: bool) -> None:
    """What an agent holding the SQLite file can do: drop the append-only trigger and
    rewrite an event's payload (and, with ``leaf_too``, its leaf hash to match)."""
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER events_no_update")
        db.execute("UPDATE events SET payload = ? WHERE position = ?", (payload, position))
        if leaf_too:
            row = db.execute(
                "SELECT position, event_id, stream, stream_version, type, schema_version, "
                "recorded_at, actor, correlation_id, causation_id, payload, delta "
                "FROM events WHERE position = ?",
                (position,),
            ).fetchone()
            leaf = sha256(b"\x00" + leaf_bytes(*row[:10], bytes(row[10]), bytes(row[11])))
            db.execute(
                "UPDATE events SET leaf_hash = ? WHERE position = ?", (leaf.digest(), position)
            )


def test_event_shows_a_rewritten_row_and_exits_1(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'e.db'}"
    _seed(url)
    _rewrite(tmp_path / "e.db", 3, b'{"type":"plan.created","plan_id":5}', leaf_too=False)
    result = run_cli("event", "3", "--json", "--db", url)
    assert result.returncode == 1
    shown = json.loads(result.stdout)
    assert shown["leaf_ok"] is False
    assert shown["recomputed_leaf_hash"] != shown["event"]["leaf_hash"]
    assert shown["event"]["payload"] == {"type": "plan.created", "plan_id": 5}
    assert "plan.created" in shown["payload_error"]
    text = run_cli("event", "3", "--db", url)
    assert text.returncode == 1 and "MISMATCH: the stored bytes hash to" in text.stdout
    assert "does not decode as plan.strategy_recorded" in text.stdout
    # Reading it decoded is refused in one line that points here (never a traceback).
    for args in (("events",), ("events", "--reverse"), ("tail",)):
        assert_refused(run_cli(*args, "--db", url), "position 3", "evidence event 3")


# -- prove: printed, and checked in one step --------------------------------------------------


def _head(url: str) -> str:
    report = _ok(run_cli("verify", "--json", "--db", url))
    return f"{report['size']}:{report['root']}"


def test_prove_consistency_prints_a_proof_any_verifier_accepts(db_url: str) -> None:
    _seed(db_url)
    kept = _head(db_url)
    with ledger.open(db_url) as store:
        store.append("plan:C", [plan_created("C"), strategy("C")])
    proof = _ok(run_cli("prove", "--consistency", "10", "--json", "--db", db_url))
    assert (proof["old_size"], f"{proof['old_size']}:{proof['old_root']}") == (10, kept)
    assert proof["tree_size"] == 12 and proof["root"] == _head(db_url).split(":")[1]
    assert verify_consistency(
        10,
        12,
        bytes.fromhex(proof["old_root"]),
        bytes.fromhex(proof["root"]),
        [bytes.fromhex(p) for p in proof["proof"]],
    )
    text = _ok(run_cli("prove", "--consistency", "4", "--size", "9", "--db", db_url))
    assert text.splitlines()[0] == "old_size 4" and "tree_size 9" in text


def test_prove_verify_inclusion_against_a_kept_head_and_a_checkpoint(
    db_url: str, tmp_path: Path
) -> None:
    _seed(db_url)
    kept = _head(db_url)
    (tmp_path / "kept.checkpoint").write_text(_ok(run_cli("checkpoint", "--db", db_url)))
    with ledger.open(db_url) as store:  # the log grows after the head was kept
        store.append("plan:C", [plan_created("C")])
    check = _ok(run_cli("prove", "6", "--verify", "--against", kept, "--json", "--db", db_url))
    assert check["ok"] is True and check["kind"] == "inclusion" and check["problems"] == []
    assert (check["tree_size"], check["root"]) == (10, kept.split(":")[1])
    assert check["trusted"]["source"] == "against"
    assert check["leaf_hash"] == check["stored_leaf_hash"]
    signed = _ok(
        run_cli(
            "prove",
            "6",
            "--verify",
            "--checkpoint",
            str(tmp_path / "kept.checkpoint"),
            "--json",
            "--db",
            db_url,
        )
    )
    assert signed["ok"] is True and signed["trusted"]["signature_ok"] is True
    assert signed["proof"] == check["proof"]
    text = _ok(
        run_cli(
            "prove",
            "6",
            "--verify",
            "--checkpoint",
            str(tmp_path / "kept.checkpoint"),
            "--db",
            db_url,
        )
    )
    assert text.startswith("ok: event 6 is in the tree of 10 events")
    assert "signature ok" in text


def test_prove_verify_catches_a_row_rewritten_with_its_leaf(tmp_path: Path) -> None:
    """The agent rewrites event 3 and its stored leaf hash so that the row agrees with its
    leaf (`event` sees nothing wrong); against the tree head kept before, the proof fails."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    _seed(url)
    kept = _head(url)
    (tmp_path / "kept.checkpoint").write_text(_ok(run_cli("checkpoint", "--db", url)))
    forged = b'{"type":"plan.strategy_recorded","plan_id":"A","revision":0,"strategy":"forged"}'
    _rewrite(tmp_path / "e.db", 3, forged, leaf_too=True)
    assert json.loads(run_cli("event", "3", "--json", "--db", url).stdout)["leaf_ok"] is True
    for trusted in (["--against", kept], ["--checkpoint", str(tmp_path / "kept.checkpoint")]):
        result = run_cli("prove", "3", "--verify", *trusted, "--json", "--db", url)
        assert result.returncode == 1, result.stdout
        check = json.loads(result.stdout)
        assert check["ok"] is False
        assert [p["kind"] for p in check["problems"]] == ["not_included"]
    # An untouched event's proof runs through the rewritten leaf's subtree: it fails too.
    result = run_cli("prove", "4", "--verify", "--against", kept, "--db", url)
    assert result.returncode == 1 and "not_included" in result.stdout
    # Rewritten without its leaf: the row does not hash to its leaf, and is not included.
    other = tmp_path / "f.db"
    other_url = f"sqlite:///{other}"
    _seed(other_url)
    kept_other = _head(other_url)
    _rewrite(other, 5, forged, leaf_too=False)
    check = json.loads(
        run_cli(
            "prove", "5", "--verify", "--against", kept_other, "--json", "--db", other_url
        ).stdout
    )
    assert [p["kind"] for p in check["problems"]] == ["leaf_mismatch", "not_included"]


def test_prove_verify_a_checkpoint_by_another_key_or_malformed(db_url: str, tmp_path: Path) -> None:
    _seed(db_url)
    generate_key_pair(tmp_path / "mallory.key")
    note = _ok(run_cli("checkpoint", "--key", str(tmp_path / "mallory.key"), "--db", db_url))
    (tmp_path / "mallory.checkpoint").write_text(note)
    result = run_cli(
        "prove",
        "2",
        "--verify",
        "--checkpoint",
        str(tmp_path / "mallory.checkpoint"),
        "--json",
        "--db",
        db_url,
    )
    assert result.returncode == 1
    check = json.loads(result.stdout)
    assert check["trusted"]["signature_ok"] is False
    assert [p["kind"] for p in check["problems"]] == ["checkpoint_signature"]
    # The same note checked with mallory's own public key: the signature holds.
    fine = run_cli(
        "prove",
        "2",
        "--verify",
        "--checkpoint",
        str(tmp_path / "mallory.checkpoint"),
        "--public-key",
        str(tmp_path / "mallory.key.pub"),
        "--db",
        db_url,
    )
    assert fine.returncode == 0, fine.stdout
    (tmp_path / "bad.checkpoint").write_text("not a checkpoint\n")
    result = run_cli(
        "prove",
        "2",
        "--verify",
        "--checkpoint",
        str(tmp_path / "bad.checkpoint"),
        "--json",
        "--db",
        db_url,
    )
    assert result.returncode == 1
    assert json.loads(result.stdout) == {
        "ok": False,
        "kind": "inclusion",
        "problems": [
            {
                "position": None,
                "kind": "checkpoint_malformed",
                "detail": json.loads(result.stdout)["problems"][0]["detail"],
            }
        ],
    }


def test_prove_verify_consistency(db_url: str, tmp_path: Path) -> None:
    _seed(db_url)
    kept = _head(db_url)
    with ledger.open(db_url) as store:
        store.append("plan:C", [plan_created("C"), strategy("C")])
    check = _ok(run_cli("prove", "--consistency", kept, "--verify", "--json", "--db", db_url))
    assert check["ok"] is True and check["kind"] == "consistency"
    assert (check["old_size"], check["tree_size"], check["trusted"]["source"]) == (10, 12, "log")
    (tmp_path / "new.checkpoint").write_text(_ok(run_cli("checkpoint", "--db", db_url)))
    newer = _ok(
        run_cli(
            "prove",
            "--consistency",
            kept,
            "--verify",
            "--checkpoint",
            str(tmp_path / "new.checkpoint"),
            "--json",
            "--db",
            db_url,
        )
    )
    assert newer["ok"] is True and newer["trusted"]["source"] == "checkpoint"
    wrong = f"10:{'ab' * 32}"
    result = run_cli("prove", "--consistency", wrong, "--verify", "--json", "--db", db_url)
    assert result.returncode == 1
    assert [p["kind"] for p in json.loads(result.stdout)["problems"]] == ["inconsistent"]
    text = run_cli("prove", "--consistency", wrong, "--verify", "--db", db_url)
    assert text.returncode == 1 and text.stdout.startswith("FAILED: 1 problem(s)")
    # A kept head larger than the log: the log was truncated.
    too_big = f"13:{kept.split(':')[1]}"
    result = run_cli("prove", "--consistency", too_big, "--verify", "--json", "--db", db_url)
    assert result.returncode == 1
    assert [p["kind"] for p in json.loads(result.stdout)["problems"]] == ["log_truncated"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((), "one of them"),
        (("3", "--consistency", "2"), "one of them"),
        (("3", "--verify"), "needs a tree head you trust"),
        (("3", "--against", "10:" + "ab" * 32), "add --verify"),
        (("3", "--verify", "--against", "10:" + "ab" * 32, "--size", "4"), "--size"),
        (("3", "--verify", "--against", "10:" + "ab" * 32, "--checkpoint", "x"), "not both"),
        (("3", "--public-key", "k.pub"), "--checkpoint"),
        (("11", "--verify", "--against", "10:" + "ab" * 32), "not in a tree of 10"),
        (("3", "--verify", "--against", "10:xyz"), "--against"),
        (("--consistency", "4", "--verify"), "OLD_SIZE:ROOT_HEX"),
        (("--consistency", "4:" + "ab" * 32), "add it"),
        (("--consistency", "0"), "not a tree size"),
        (("--consistency", "11"), "not within"),
        (("--consistency", "4:" + "ab" * 32, "--verify", "--size", "20"), "not within"),
        (("12",), "not within"),
    ],
)
def test_prove_refusals(db_url: str, args: tuple[str, ...], fragment: str) -> None:
    _seed(db_url)
    assert_refused(run_cli("prove", *args, "--db", db_url), fragment)
