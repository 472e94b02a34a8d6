"""Offline proofs that an event is in the log, in C2SP tlog-proof's text form (docs/
auditing.md, "A proof anyone can check"):

    c2sp.org/tlog-proof@v1
    extra <base64 of the event's entry: its leaf bytes>
    index <the event's leaf index: its position - 1>
    <the RFC 6962 inclusion proof, one base64 hash a line, the leaf's sibling first>

    <the checkpoint, verbatim: the log's signature, and its witnesses' cosignatures>

The ``extra`` line carries the event itself (the tile entry: its leaf bytes, or for an
event over 65,535 bytes the commitment ``ledger.tiles`` describes), so the proof is
checked with nothing but it and the keys: hash the entry as a leaf (``SHA-256(0x00 ||
entry)``), walk the proof to a root, compare it with the checkpoint's, and check the
checkpoint's signatures (``verify_proof``).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from .canonical import strict_b64decode
from .checkpoints import CheckpointError, parse_checkpoint
from .merkle import leaf_hash, verify_inclusion

__all__ = ["HEADER", "TlogProof", "format_proof", "parse_proof"]

HEADER = "c2sp.org/tlog-proof@v1"


@dataclass(frozen=True)
class TlogProof:
    index: int
    proof: list[bytes]
    checkpoint: str  # the signed note, verbatim
    extra: bytes | None = None

    def includes(self) -> bool:
        """Whether the proof takes the entry (``extra``) to the checkpoint's root at
        ``index`` (the signatures are the caller's to check)."""
        checkpoint, _ = parse_checkpoint(self.checkpoint)
        if self.extra is None:
            return False
        return verify_inclusion(
            leaf_hash(self.extra), self.index, checkpoint.size, self.proof, checkpoint.root
        )


def format_proof(proof: TlogProof) -> str:
    lines = [HEADER]
    if proof.extra is not None:
        lines.append("extra " + base64.b64encode(proof.extra).decode())
    lines.append(f"index {proof.index}")
    lines += [base64.b64encode(h).decode() for h in proof.proof]
    return "\n".join(lines) + "\n\n" + proof.checkpoint


def parse_proof(text: str) -> TlogProof:
    """A tlog-proof, strictly; ``CheckpointError`` naming what is wrong."""
    head, sep, checkpoint = text.partition("\n\n")
    lines = head.split("\n")
    if not sep or lines[0] != HEADER:
        raise CheckpointError(f"not a tlog-proof: the first line is not {HEADER}")
    rest = lines[1:]
    extra = None
    if rest and rest[0].startswith("extra "):
        extra = strict_b64decode(rest[0][len("extra ") :])
        if extra is None:
            raise CheckpointError("tlog-proof: the extra line is not base64")
        rest = rest[1:]
    if not rest or not rest[0].startswith("index "):
        raise CheckpointError("tlog-proof: no index line")
    number = rest[0][len("index ") :]
    if not number.isdigit() or (number != "0" and number.startswith("0")):
        raise CheckpointError("tlog-proof: the index is a decimal number with no leading zero")
    hashes = [strict_b64decode(line) for line in rest[1:]]
    if any(h is None or len(h) != 32 for h in hashes):
        raise CheckpointError("tlog-proof: a proof line is not base64 of 32 bytes")
    parse_checkpoint(checkpoint)  # the checkpoint itself, strictly
    return TlogProof(int(number), [h for h in hashes if h is not None], checkpoint, extra)
