"""Checkpoints a C2SP verifier accepts, and only those: ``verify --checkpoint`` with a
verifier key ``<name>+<hash>+<keydata>`` takes a signature line only under exactly that
name and key hash, as Go's ``golang.org/x/mod/sumdb/note`` does.

Where the vectors and rules come from:

- the verifier key, signer key and signed note are the ones in the package
  documentation of ``golang.org/x/mod/sumdb/note`` (``note.go``, "Example"): the
  ``PeterNeumann+c74f20a3+ARpc…`` verifier key opens the note signed
  ``— PeterNeumann x08go/…``; its doubly-signed example adds a line by ``EnochRoot``
  (a key nobody here knows: an unknown signer, ignored);
- the key hash is ``SHA-256(name || 0x0A || 0x01 || public key)[:4]`` (c2sp.org/signed-note,
  Ed25519 signature type 0x01); ``note.NewVerifier`` refuses a key text whose hash is not
  that of its name and key (``invalid verifier hash``), whose hash is not 8 hex digits, whose
  name is empty or holds a space or ``+``, whose type byte is not 1 or whose key is not 32
  bytes;
- ``note.Open`` with a list of verifiers: a line whose (name, hash) no verifier has is an
  unverified signature (ignored); a known line that does not verify fails the note
  (``InvalidSignatureError``); no verified line at all is ``UnverifiedNoteError``; the text
  ends at the *last* blank line; the note has no control character but newline; at most
  100 signature lines.

One deliberate difference: base64 is decoded strictly (the canonical encoding only), where
Go's ``StdEncoding`` would also take non-zero padding bits; no signer writes those.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import ledger
from ledger.checkpoints import (
    Checkpoint,
    CheckpointError,
    VerifierKey,
    open_note,
    parse_verifier_key,
    sign_checkpoint,
    verifier_key,
    verify_checkpoint_signature,
)
from ledger.keys import load_private_key, public_key_b64
from tests.helpers import assert_refused, run_cli, strategy

GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
GO_SIG = (
    "\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqd"
    "ngotpRZb6KE6RyyBwJnAM=\n"
)
ENOCH_SIG = (
    "\u2014 EnochRoot rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTGw"
    "nWLox33WWd1RvMc+QQ=\n"
)
GO_NOTE = GO_TEXT + "\n" + GO_SIG


def _go_private() -> Ed25519PrivateKey:
    raw = base64.b64decode(GO_SKEY.split("+", 4)[4])
    return Ed25519PrivateKey.from_private_bytes(raw[1:])


# -- the verifier key ----------------------------------------------------------------------


def test_the_go_documentation_verifier_key() -> None:
    verifier = parse_verifier_key(GO_VKEY)
    assert verifier.name == "PeterNeumann" and verifier.key_hash.hex() == "c74f20a3"
    assert str(verifier) == GO_VKEY  # the text form round-trips
    assert verifier_key("PeterNeumann", _go_private()) == GO_VKEY  # NewEd25519VerifierKey
    assert public_key_b64(verifier.public_key) == public_key_b64(_go_private())
    assert open_note(GO_NOTE, verifier) == GO_TEXT
    # The doubly-signed example: EnochRoot's line is by a key this reader does not know.
    assert open_note(GO_NOTE + ENOCH_SIG, verifier) == GO_TEXT
    assert open_note(GO_TEXT + "\n" + ENOCH_SIG + GO_SIG, verifier) == GO_TEXT


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (GO_VKEY.replace("c74f20a3", "c74f20a4"), "not the hash of this name and key"),
        (GO_VKEY.replace("PeterNeumann", "PeterNeumanm"), "not the hash of this name and key"),
        (GO_VKEY.replace("c74f20a3", "c74f20a"), "not a verifier key"),
        (GO_VKEY.replace("c74f20a3", "c74f20g3"), "not a verifier key"),
        ("+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW", "not a verifier key"),
        ("Peter Neumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW", "not a verifier"),
        ("PeterNeumann+c74f20a3", "not a verifier key"),
        ("PeterNeumann+c74f20a3+not base64!", "not a verifier key"),
        (
            "PeterNeumann+c74f20a3+" + base64.b64encode(b"\x02" + b"k" * 32).decode(),
            "unknown signature type 0x02",
        ),
        (
            "PeterNeumann+c74f20a3+" + base64.b64encode(b"\x01" + b"k" * 31).decode(),
            "32 bytes, got 31",
        ),
    ],
)
def test_verifier_keys_go_refuses_are_refused(text: str, fragment: str) -> None:
    with pytest.raises(CheckpointError, match=fragment):
        parse_verifier_key(text)


# -- note.Open ---------------------------------------------------------------------------


def test_only_the_verifier_keys_name_and_hash_count() -> None:
    key = _go_private()
    # The same key under another name: another (name, hash), so an unknown signer.
    renamed = GO_TEXT + "\n" + _signature_line(GO_TEXT, key, "SomeoneElse")
    with pytest.raises(CheckpointError, match=r"no signature line .* PeterNeumann\+c74f20a3"):
        open_note(renamed, parse_verifier_key(GO_VKEY))
    assert open_note(renamed, VerifierKey.of("SomeoneElse", key)) == GO_TEXT
    # The verifier's name with another key hash: unknown too.
    other_hash = GO_NOTE.replace("x08go/", "x08gp/")
    with pytest.raises(CheckpointError, match="no signature line"):
        open_note(other_hash, parse_verifier_key(GO_VKEY))
    # The first line under the verifier's name and hash decides: one that does not verify
    # fails the note, even when a later one would (InvalidSignatureError); a repeated
    # line by the same key after a verified one is dropped unread ("Drop repeated
    # signatures by a single verifier").
    with pytest.raises(CheckpointError, match="does not verify"):
        open_note(GO_NOTE.replace("cryptography", "cryptographY"), parse_verifier_key(GO_VKEY))
    forged = GO_SIG[:-6] + ("A" if GO_SIG[-6] != "A" else "B") + GO_SIG[-5:]
    with pytest.raises(CheckpointError, match="does not verify"):
        open_note(GO_TEXT + "\n" + forged + GO_SIG, parse_verifier_key(GO_VKEY))
    assert open_note(GO_NOTE + forged, parse_verifier_key(GO_VKEY)) == GO_TEXT


@pytest.mark.parametrize(
    ("note", "fragment"),
    [
        (GO_TEXT.replace("problem,", "problem,\x07") + "\n" + GO_SIG, "control character 0x07"),
        (GO_TEXT + "\n" + GO_SIG.replace("PeterNeumann", "Peter+Neumann"), "malformed signature"),
        (GO_TEXT + "\n" + GO_SIG.replace("PeterNeumann", "Peter\u00a0Neumann"), "malformed"),
        (GO_TEXT + "\n" + "\u2014 PeterNeumann AAAA\n", "malformed signature"),  # < 5 bytes
        (GO_TEXT + "\n" + GO_SIG * 101, "more than 100 signature lines"),
        (GO_TEXT + GO_SIG, "no blank line"),
    ],
)
def test_notes_go_refuses_as_malformed_are_refused(note: str, fragment: str) -> None:
    with pytest.raises(CheckpointError, match=fragment):
        open_note(note, parse_verifier_key(GO_VKEY))


def test_the_text_ends_at_the_last_blank_line() -> None:
    key = _go_private()
    text = "first paragraph\n\nsecond paragraph\n"
    note = text + "\n" + _signature_line(text, key, "PeterNeumann")
    assert open_note(note, parse_verifier_key(GO_VKEY)) == text
    # 100 lines: the first decides, the repeats by the same key are dropped unread.
    assert open_note(note + GO_SIG * 99, parse_verifier_key(GO_VKEY)) == text


def test_a_bare_public_key_means_the_key_named_after_the_origin() -> None:
    key = Ed25519PrivateKey.generate()
    checkpoint = Checkpoint(origin="example.com/log", size=1, root=b"\x01" * 32)
    ours = sign_checkpoint(checkpoint, key)
    assert verify_checkpoint_signature(ours, key.public_key()).size == 1
    assert verify_checkpoint_signature(
        ours, parse_verifier_key(verifier_key("example.com/log", key))
    )
    other_name = sign_checkpoint(checkpoint, key, name="another-name")
    with pytest.raises(CheckpointError, match=r"example\.com/log"):
        verify_checkpoint_signature(other_name, key.public_key())
    assert verify_checkpoint_signature(other_name, VerifierKey.of("another-name", key)).size == 1


def _signature_line(text: str, key: Ed25519PrivateKey, name: str) -> str:
    from ledger.checkpoints import key_hash

    blob = key_hash(name, key) + key.sign(text.encode("utf-8"))
    return f"\u2014 {name} {base64.b64encode(blob).decode()}\n"


# -- the CLI ------------------------------------------------------------------------------


@pytest.fixture
def ledger_of_three(sqlite_url: str) -> str:
    assert run_cli("init", "--db", sqlite_url).returncode == 0
    with ledger.open(sqlite_url) as store:
        for i in range(3):
            store.append(f"plan:P-{i}", [strategy(f"P-{i}", f"s {i}")])
    return sqlite_url


def test_verify_checkpoint_takes_only_the_plane_keys_origin_name(
    ledger_of_three: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The case of the issue: a note signed by the plane key under a name that is not
    the verifier key's verified under any name; now, as in Go, it does not."""
    import os

    url = ledger_of_three
    made = json.loads(run_cli("checkpoint", "--json", "--db", url).stdout)
    vkey = made["verifier_key"]
    assert parse_verifier_key(vkey).name == made["origin"] == made["key_name"]
    plane = load_private_key(os.environ["EVIDENCE_PLANE_KEY"])
    assert vkey == verifier_key(made["origin"], plane)
    good = tmp_path / "good.checkpoint"
    good.write_text(made["checkpoint"])
    parsed = Checkpoint(origin=made["origin"], size=3, root=bytes.fromhex(made["root"]))
    renamed = tmp_path / "renamed.checkpoint"
    renamed.write_text(sign_checkpoint(parsed, plane, name="not-the-origin"))

    ok = run_cli("verify", "--checkpoint", str(good), "--verifier-key", vkey, "--db", url)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert run_cli("verify", "--checkpoint", str(good), "--db", url).returncode == 0
    for extra in (["--verifier-key", vkey], []):
        bad = run_cli("verify", "--checkpoint", str(renamed), *extra, "--json", "--db", url)
        assert bad.returncode == 1, bad.stdout + bad.stderr
        report = json.loads(bad.stdout)
        assert not report["ok"] and report["checkpoint"]["signature_ok"] is False
        assert [p["kind"] for p in report["problems"]] == ["checkpoint_signature"]
    # The verifier key of that other name opens it; a file holding it works too.
    other = verifier_key("not-the-origin", plane)
    assert (
        run_cli(
            "verify", "--checkpoint", str(renamed), "--verifier-key", other, "--db", url
        ).returncode
        == 0
    )
    vkey_file = tmp_path / "kept.vkey"
    vkey_file.write_text(other + "\n")
    for option in (["--verifier-key", f"@{vkey_file}"], ["--public-key", str(vkey_file)]):
        done = run_cli("verify", "--checkpoint", str(renamed), *option, "--db", url)
        assert done.returncode == 0, done.stdout + done.stderr
    proved = run_cli(
        "prove", "2", "--verify", "--checkpoint", str(renamed), "--verifier-key", other, "--db", url
    )
    assert proved.returncode == 0, proved.stdout + proved.stderr
    wrong = run_cli(
        "prove", "2", "--verify", "--checkpoint", str(renamed), "--verifier-key", vkey, "--db", url
    )
    assert wrong.returncode == 1


def test_verifier_key_mistakes_are_refused(ledger_of_three: str, tmp_path: Path) -> None:
    url = ledger_of_three
    kept = tmp_path / "kept.checkpoint"
    kept.write_text(run_cli("checkpoint", "--db", url).stdout)
    broken = GO_VKEY.replace("c74f20a3", "c74f20a4")
    assert_refused(
        run_cli("verify", "--checkpoint", str(kept), "--verifier-key", broken, "--db", url),
        "--verifier-key",
        "hash",
    )
    assert_refused(run_cli("verify", "--verifier-key", GO_VKEY, "--db", url), "--checkpoint")
    pub = tmp_path / "plane.pub"
    pub.write_text(public_key_b64(Ed25519PrivateKey.generate()))
    assert_refused(
        run_cli(
            "verify", "--checkpoint", str(kept), "--verifier-key", GO_VKEY,
            "--public-key", str(pub), "--db", url,
        ),
        "not both",
    )  # fmt: skip
