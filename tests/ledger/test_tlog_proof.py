"""An event's offline proof in C2SP tlog-proof form (``ledger.tlog_proof``; `evidence prove
N --format tlog-proof`, `evidence verify --tlog-proof`): checked here the way
docs/auditing.md tells an auditor to, step by step with nothing but hashlib and the
plane's public key, and by `verify`; any change to the entry, the index, a proof line or
the checkpoint makes it fail."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ledger.checkpoints import verifier_key
from ledger.keys import load_private_key
from ledger.tlog_proof import parse_proof
from tests.helpers import run_cli


@pytest.fixture
def proved(sqlite_url: str, tmp_path: Path) -> tuple[Path, str]:
    """A ledger of four events (its identification, its operator's key, two tools), the
    proof of the third (the first tool's registration), and the plane's verifier key."""
    assert run_cli("init", "--db", sqlite_url).returncode == 0
    for name in ("calc", "grep"):
        spec = tmp_path / f"{name}.json"
        spec.write_text(json.dumps({"name": name, "command": ["true"]}))
        assert run_cli("tool", "register", str(spec), "--db", sqlite_url).returncode == 0
    made = run_cli("prove", "3", "--format", "tlog-proof", "--db", sqlite_url)
    assert made.returncode == 0, made.stderr
    path = tmp_path / "event.tlog-proof"
    path.write_text(made.stdout)
    vkey = json.loads(run_cli("checkpoint", "--db", sqlite_url, "--json").stdout)["verifier_key"]
    return path, vkey


def _by_hand(text: str, public: Ed25519PublicKey) -> dict:
    """docs/auditing.md's steps, with nothing of this project's code."""
    head, _, note = text.partition("\n\n")
    lines = head.split("\n")
    assert lines[0] == "c2sp.org/tlog-proof@v1"
    entry = base64.b64decode(lines[1].removeprefix("extra "))
    index = int(lines[2].removeprefix("index "))
    proof = [base64.b64decode(line) for line in lines[3:]]
    body, _, signatures = note.rpartition("\n\n")
    origin, size, root = body.split("\n")[:3]
    # the log's signature: Ed25519 over the body, its line named after the origin
    line = next(s for s in signatures.split("\n") if s.startswith(f"\u2014 {origin} "))
    public.verify(base64.b64decode(line.split(" ")[2])[4:], (body + "\n").encode())
    # RFC 9162 2.1.3.2: the entry as a leaf, up the proof to the root
    r = hashlib.sha256(b"\x00" + entry).digest()
    fn, sn = index, int(size) - 1
    for p in proof:
        if fn & 1 or fn == sn:
            r = hashlib.sha256(b"\x01" + p + r).digest()
            while fn and not fn & 1:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = hashlib.sha256(b"\x01" + r + p).digest()
        fn, sn = fn >> 1, sn >> 1
    assert sn == 0 and r == base64.b64decode(root)
    return json.loads(entry)


def test_a_proof_checks_by_hand_and_by_verify(proved: tuple[Path, str], sqlite_url: str) -> None:
    from commands.rules.signing import plane_key_path

    path, vkey = proved
    public = load_private_key(plane_key_path(sqlite_url)).public_key()
    event = _by_hand(path.read_text(), public)
    assert event["position"] == 3 and event["stream"] == "tool:calc"
    checked = run_cli("verify", "--tlog-proof", str(path), "--verifier-key", vkey)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok: event 3 (tool.registered in tool:calc)" in checked.stdout
    assert vkey == verifier_key(vkey.split("+")[0], public)


@pytest.mark.parametrize(
    "change",
    [
        lambda lines: lines.__setitem__(2, "index 1"),  # another position
        lambda lines: lines.__setitem__(1, lines[1][:-8] + "AAAAAAA="),  # the entry changed
        lambda lines: lines.__setitem__(3, base64.b64encode(bytes(32)).decode()),  # a proof line
        lambda lines: lines.__setitem__(lines.index("") + 2, "5"),  # the checkpoint's size
    ],
    ids=["index", "entry", "proof", "checkpoint"],
)
def test_any_change_fails_it(proved: tuple[Path, str], change: object) -> None:
    path, vkey = proved
    lines = path.read_text().split("\n")
    change(lines)  # type: ignore[operator]
    path.write_text("\n".join(lines))
    checked = run_cli("verify", "--tlog-proof", str(path), "--verifier-key", vkey)
    assert checked.returncode in (1, 2), checked.stdout
    assert "FAILED" in checked.stdout or "error:" in checked.stderr


def test_the_format_is_read_strictly() -> None:
    from ledger.checkpoints import CheckpointError

    for text in ("c2sp.org/tlog-proof@v2\nindex 0\n\nx\n", "c2sp.org/tlog-proof@v1\nindex 01\n\n"):
        with pytest.raises(CheckpointError):
            parse_proof(text)
