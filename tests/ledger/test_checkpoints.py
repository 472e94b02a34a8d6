"""Signed checkpoints (C2SP tlog-checkpoint / signed-note), inclusion proofs and
``verify_against_checkpoint``: the Go reference note, the RFC 6962 vectors, and an
attacker who rewrites a suffix or forges a checkpoint."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import ledger
from ledger.checkpoints import (
    Checkpoint,
    CheckpointError,
    VerifierKey,
    consistency_with,
    inclusion_from_leaves,
    key_hash,
    open_note,
    parse_checkpoint,
    prove_inclusion,
    sign_checkpoint,
    sign_note,
    stored_leaves,
    verify_against_checkpoint,
    verify_checkpoint_signature,
)
from ledger.keys import generate_key_pair, load_public_key
from ledger.merkle import leaf_hash, verify_inclusion
from ledger.verify import verify_store
from tests.helpers import TESTS, assert_refused, run_cli, strategy

from . import test_tamper as tamper

VECTORS = json.loads((TESTS / "vectors" / "rfc6962.json").read_text())
LEAVES = [leaf_hash(bytes.fromhex(h)) for h in VECTORS["leaves_hex"]]
ROOTS = {int(k): bytes.fromhex(v) for k, v in VECTORS["roots_by_size"].items()}

# golang.org/x/mod/sumdb/note: the package documentation's example note and key.
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
GO_NOTE = (
    GO_TEXT + "\n\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUg"
    "YN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)


def _go_key() -> Ed25519PrivateKey:
    raw = base64.b64decode(GO_SKEY.split("+", 4)[4])
    assert raw[0] == 1  # the Ed25519 algorithm byte
    return Ed25519PrivateKey.from_private_bytes(raw[1:])


def _checkpoint(size: int, key: Ed25519PrivateKey, origin: str = "example.com/log") -> str:
    return sign_checkpoint(Checkpoint(origin=origin, size=size, root=ROOTS[size]), key)


# -- the signed-note format --------------------------------------------------------------


def test_signed_note_matches_the_go_reference_byte_for_byte() -> None:
    key = _go_key()
    assert key_hash("PeterNeumann", key).hex() == "c74f20a3"
    assert sign_note(GO_TEXT, key, "PeterNeumann") == GO_NOTE  # Ed25519 is deterministic
    verifier = VerifierKey.of("PeterNeumann", key)
    assert open_note(GO_NOTE, verifier) == GO_TEXT
    with pytest.raises(CheckpointError, match="does not verify"):
        open_note(GO_NOTE.replace("cryptography", "cryptographY"), verifier)
    with pytest.raises(CheckpointError, match="no signature line"):
        open_note(GO_NOTE, VerifierKey.of("PeterNeumann", Ed25519PrivateKey.generate()))


def test_checkpoint_text_format_and_round_trip() -> None:
    key = Ed25519PrivateKey.generate()
    text = _checkpoint(7, key)
    lines = text.split("\n")
    assert lines[:4] == ["example.com/log", "7", base64.b64encode(ROOTS[7]).decode(), ""]
    assert lines[4].startswith("\u2014 example.com/log ") and lines[5] == ""
    blob = base64.b64decode(lines[4].rsplit(" ", 1)[1])
    assert blob[:4] == key_hash("example.com/log", key) and len(blob) == 68
    checkpoint = verify_checkpoint_signature(text, key.public_key())
    assert (checkpoint.origin, checkpoint.size, checkpoint.root) == ("example.com/log", 7, ROOTS[7])
    # A co-signer's line is ignored; the known key's line still has to verify.
    other = Ed25519PrivateKey.generate()
    cosigned = text + sign_note(text.partition("\n\n")[0] + "\n", other, "witness").split("\n\n")[1]
    assert verify_checkpoint_signature(cosigned, key.public_key()).size == 7
    assert verify_checkpoint_signature(cosigned, VerifierKey.of("witness", other)).size == 7


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t.replace("\n7\n", "\n8\n"),  # a different size, same signature
        lambda t: t.replace("example.com/log\n", "example.com/other\n", 1),
        lambda t: t[:-10] + ("A" if t[-10] != "A" else "B") + t[-9:],  # a changed signature
    ],
)
def test_an_altered_checkpoint_fails_its_signature(mangle) -> None:
    key = Ed25519PrivateKey.generate()
    with pytest.raises(CheckpointError):
        verify_checkpoint_signature(mangle(_checkpoint(7, key)), key.public_key())


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("origin\n7\n" + base64.b64encode(b"x" * 32).decode() + "\n", "blank line"),
        (
            "origin\n07\n" + base64.b64encode(b"x" * 32).decode() + "\n\n\u2014 a AAAAAAA=\n",
            "not a decimal",
        ),
        (
            "origin\n7\n" + base64.b64encode(b"x" * 31).decode() + "\n\n\u2014 a AAAAAAA=\n",
            "32 bytes",
        ),
        (
            "origin\n7\n" + base64.b64encode(b"x" * 32).decode() + "\n\n- a AAAAAAA=\n",
            "malformed signature",
        ),
        ("origin\r\n7\n", "line endings"),
    ],
)
def test_malformed_checkpoints_are_refused(text: str, fragment: str) -> None:
    with pytest.raises(CheckpointError, match=fragment):
        parse_checkpoint(text)


# -- proofs on the RFC 6962 reference vectors ------------------------------------------


@pytest.mark.parametrize("case", VECTORS["inclusion_proofs"], ids=lambda c: str(c))
def test_inclusion_proofs_match_the_vectors(case: dict) -> None:
    index, size = case["leaf_index"], case["tree_size"]
    proof = inclusion_from_leaves(LEAVES[:size], index + 1)
    assert proof.proof == case["proof"] and proof.root == ROOTS[size].hex()
    assert verify_inclusion(
        LEAVES[index], index, size, [bytes.fromhex(p) for p in proof.proof], ROOTS[size]
    )


@pytest.mark.parametrize("case", VECTORS["consistency_proofs"], ids=lambda c: str(c))
def test_a_signed_checkpoint_is_consistent_with_a_larger_tree(case: dict) -> None:
    old, new = case["size1"], case["size2"]
    key = Ed25519PrivateKey.generate()
    checkpoint = verify_checkpoint_signature(_checkpoint(old, key), key.public_key())
    consistent, proof, problem = consistency_with(checkpoint, LEAVES[:new])
    assert consistent is True and problem is None
    assert [p.hex() for p in proof] == case["proof"]
    # Any other leaf in the old range breaks it; so does a smaller tree.
    forged = list(LEAVES[:new])
    forged[old - 1] = leaf_hash(b"forged")
    assert consistency_with(checkpoint, forged)[0] is False
    assert consistency_with(checkpoint, LEAVES[: old - 1])[2].kind == "checkpoint_truncated"


# -- against a real store -----------------------------------------------------------------


@pytest.fixture
def kept(db_url: str) -> Iterator[tuple[ledger.Store, sa.Engine, dict[int, str], Any]]:
    """A 30-event ledger, the plane key's checkpoints kept at every size."""
    key = Ed25519PrivateKey.generate()
    store = ledger.open(db_url)
    notes: dict[int, str] = {}
    for i in range(tamper.EVENTS):
        plan = f"P-{i % tamper.STREAMS}"
        store.append(f"plan:{plan}", [strategy(plan, f"strategy {i + 1}", revision=i)])
        head = store.head()
        notes[head.size] = sign_checkpoint(
            Checkpoint(origin="test/ledger", size=head.size, root=head.root), key
        )
    attacker = sa.create_engine(db_url)
    try:
        yield store, attacker, notes, key
    finally:
        attacker.dispose()
        store.close()


def test_prove_inclusion_from_the_store(kept) -> None:
    store, _attacker, _notes, _key = kept
    leaves = stored_leaves(store)
    for position, size in [(1, 30), (17, 30), (30, 30), (3, 5), (5, 5)]:
        proof = prove_inclusion(store, position, size)
        assert verify_inclusion(
            leaves[position - 1],
            position - 1,
            size,
            [bytes.fromhex(p) for p in proof.proof],
            bytes.fromhex(proof.root),
        )
    assert prove_inclusion(store, 30).root == store.head().root.hex()
    with pytest.raises(CheckpointError, match="not within"):
        prove_inclusion(store, 31)
    with pytest.raises(CheckpointError, match="not within"):
        prove_inclusion(store, 6, 5)


def test_every_kept_checkpoint_verifies_against_the_log(kept) -> None:
    store, _attacker, notes, key = kept
    for size in (1, 7, 16, 30):
        report = verify_against_checkpoint(store, notes[size], key.public_key())
        assert report.ok, (report.problems, report.verify.problems)
        assert report.checkpoint.signature_ok and report.checkpoint.consistent
        assert report.verify.against.ok


def test_a_checkpoint_with_a_bad_signature_fails(kept) -> None:
    store, _attacker, notes, key = kept
    stranger = Ed25519PrivateKey.generate()
    report = verify_against_checkpoint(store, notes[10], stranger.public_key())
    assert not report.ok and [p.kind for p in report.problems] == ["checkpoint_signature"]
    # Signed by the right key name but another key: the key hash does not match either.
    head = store.head()
    forged = sign_checkpoint(
        Checkpoint(origin="test/ledger", size=head.size, root=head.root), stranger
    )
    report = verify_against_checkpoint(store, forged, key.public_key())
    assert not report.ok and report.checkpoint.signature_ok is False
    # A valid signature line pasted under another tree head.
    _body, _, sig = notes[10].partition("\n\n")
    swapped = notes[12].partition("\n\n")[0] + "\n\n" + sig
    report = verify_against_checkpoint(store, swapped, key.public_key())
    assert not report.ok and "checkpoint_signature" in {p.kind for p in report.problems}
    report = verify_against_checkpoint(store, "not a checkpoint", key.public_key())
    assert not report.ok and report.problems[0].kind == "checkpoint_malformed"


def test_a_rewritten_suffix_fails_against_a_kept_checkpoint(kept) -> None:
    store, attacker, notes, key = kept
    backend = store.backend
    with attacker.begin() as conn:
        for name, table in tamper.TRIGGERS[backend]:
            conn.exec_driver_sql(
                f"DROP TRIGGER {name}" + (f" ON {table}" if backend == "postgresql" else "")
            )
        first = tamper.EVENTS - 4
        for row in tamper._rows(conn):
            if row["position"] >= first:
                tamper._update(conn, row["position"], payload=tamper._forged_payload(row))
        tamper._rehash_from(conn, first)
        tamper._rewrite_head(conn)
    assert verify_store(store).ok  # the log checked against itself is fine
    report = verify_against_checkpoint(store, notes[tamper.EVENTS], key.public_key())
    assert not report.ok
    assert report.checkpoint.signature_ok and report.checkpoint.consistent is False
    assert {"checkpoint_inconsistent"} <= {p.kind for p in report.problems}
    # A checkpoint from before the rewritten suffix still holds.
    assert verify_against_checkpoint(store, notes[first - 1], key.public_key()).ok
    assert not verify_against_checkpoint(store, notes[first], key.public_key()).ok


def test_a_truncated_log_fails_against_a_kept_checkpoint(kept) -> None:
    store, attacker, notes, key = kept
    backend = store.backend
    with attacker.begin() as conn:
        for name, table in tamper.TRIGGERS[backend]:
            conn.exec_driver_sql(
                f"DROP TRIGGER {name}" + (f" ON {table}" if backend == "postgresql" else "")
            )
        conn.exec_driver_sql(f"DELETE FROM events WHERE position > {tamper.EVENTS - 3}")
        tamper._rewrite_head(conn)
    report = verify_against_checkpoint(store, notes[tamper.EVENTS], key.public_key())
    assert not report.ok and "checkpoint_truncated" in {p.kind for p in report.problems}


# -- the commands ---------------------------------------------------------------------------


def test_checkpoint_prove_and_verify_cli(sqlite_url: str, tmp_path: Path) -> None:
    assert run_cli("init", "--db", sqlite_url).returncode == 0
    with ledger.open(sqlite_url) as store:
        for i in range(5):
            store.append(f"plan:P-{i}", [strategy(f"P-{i}", f"s {i}")])
    made = run_cli("checkpoint", "--db", sqlite_url)
    assert made.returncode == 0, made.stderr
    text = made.stdout
    checkpoint, _signatures = parse_checkpoint(text)
    assert checkpoint.size == 5 and checkpoint.origin.startswith("evidence-ledger/")
    as_json = json.loads(
        run_cli("checkpoint", "--json", "--origin", "me.example/log", "--db", sqlite_url).stdout
    )
    assert as_json["origin"] == "me.example/log" and as_json["size"] == 5
    public = tmp_path / "plane.pub"
    public.write_text(as_json["public_key"])
    assert verify_checkpoint_signature(text, load_public_key(public)).size == 5
    assert verify_checkpoint_signature(as_json["checkpoint"], load_public_key(public))
    # --key: another key, same format.
    pair = generate_key_pair(tmp_path / "auditor.key")
    other = run_cli("checkpoint", "--key", str(pair.private_path), "--db", sqlite_url)
    assert verify_checkpoint_signature(other.stdout, pair.public_key).size == 5

    proved = run_cli("prove", "3", "--db", sqlite_url)
    assert proved.returncode == 0, proved.stderr
    lines = proved.stdout.splitlines()
    assert lines[:2] == ["leaf_index 2", "tree_size 5"]
    leaf, root = bytes.fromhex(lines[2].split()[1]), bytes.fromhex(lines[3].split()[1])
    assert verify_inclusion(leaf, 2, 5, [bytes.fromhex(h) for h in lines[4:]], root)
    sized = json.loads(run_cli("prove", "3", "--size", "4", "--json", "--db", sqlite_url).stdout)
    assert sized["tree_size"] == 4 and len(sized["proof"]) == 2
    assert_refused(run_cli("prove", "6", "--db", sqlite_url), "position 6")
    assert_refused(run_cli("prove", "1", "--size", "9", "--db", sqlite_url), "tree size 9")

    # verify --checkpoint: by the plane key by default, or the --public-key given.
    kept = tmp_path / "kept.checkpoint"
    kept.write_text(text)
    ok = run_cli("verify", "--checkpoint", str(kept), "--db", sqlite_url)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "signature ok, consistent" in ok.stdout
    with ledger.open(sqlite_url) as store:
        store.append("plan:P-9", [strategy("P-9", "later")])
    ok = run_cli(
        "verify",
        "--checkpoint",
        str(kept),
        "--public-key",
        str(public),
        "--json",
        "--db",
        sqlite_url,
    )
    report = json.loads(ok.stdout)
    assert ok.returncode == 0 and report["ok"] and report["checkpoint"]["consistent"]
    assert report["verify"]["size"] == 6 and len(report["checkpoint"]["consistency_proof"]) > 0
    wrong = run_cli(
        "verify",
        "--checkpoint",
        str(kept),
        "--public-key",
        f"{pair.private_path}.pub",
        "--db",
        sqlite_url,
    )
    assert wrong.returncode == 1 and "checkpoint_signature" in wrong.stdout
    assert_refused(run_cli("checkpoint", "--origin", "has space", "--db", sqlite_url), "origin")
