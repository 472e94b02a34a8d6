"""Witness cosignatures of a checkpoint (C2SP tlog-cosignature, the Ed25519
``cosignature/v1`` type): a witness's statement that, at its timestamp, the checkpoint is
the largest tree of the log it has seen consistent. A cosignature is a signed-note
signature line under the witness's name, whose bytes are the key id (4), the timestamp
(8, big-endian seconds) and the Ed25519 signature (64) over

    cosignature/v1
    time <timestamp>
    <the checkpoint's body, its final newline included>

A witness key's id is ``SHA-256(name || "\\n" || 0x04 || public key)[:4]`` and its
verifier key ``name+<id hex>+base64(0x04 || public key)``. ML-DSA-44 cosignatures
(type 0x06) are not accepted: the key is refused where it is named (a policy), and their
lines are ignored as any unknown key's.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .canonical import strict_b64decode
from .checkpoints import SIGNATURE_PREFIX, CheckpointError, parse_note
from .keys import raw_public_key

__all__ = [
    "COSIGNATURE_TYPE",
    "CosignerKey",
    "cosign",
    "cosignature_message",
    "cosigned_by",
    "parse_cosigner_key",
]

COSIGNATURE_TYPE = b"\x04"
_ML_DSA_44 = 0x06
_MAX_TIMESTAMP = 2**63 - 1


def _key_id(name: str, encoded: bytes) -> bytes:
    return hashlib.sha256(name.encode("utf-8") + b"\n" + encoded).digest()[:4]


@dataclass(frozen=True)
class CosignerKey:
    """A witness's name and Ed25519 key, as a cosignature verifier knows them."""

    name: str
    key_id: bytes
    public_key: Ed25519PublicKey = field(compare=False)  # (name, id) name it: hashable

    @classmethod
    def of(cls, name: str, key: Ed25519PublicKey | Ed25519PrivateKey) -> CosignerKey:
        public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
        if not name or "+" in name or any(c.isspace() for c in name):
            raise CheckpointError(f"cosigner name {name!r} must be non-empty, no spaces or '+'")
        return cls(name, _key_id(name, COSIGNATURE_TYPE + raw_public_key(public)), public)

    def __str__(self) -> str:
        encoded = base64.b64encode(COSIGNATURE_TYPE + raw_public_key(self.public_key)).decode()
        return f"{self.name}+{self.key_id.hex()}+{encoded}"


def parse_cosigner_key(text: str) -> CosignerKey:
    """A witness's verifier key ``name+<8 hex>+base64(0x04 || key)``; ``CheckpointError``
    for anything else (an ML-DSA-44 key, type 0x06, with the reason)."""
    name, _, rest = text.strip().partition("+")
    hex_id, _, encoded = rest.partition("+")
    data = strict_b64decode(encoded) if encoded else None
    if not name or len(hex_id) != 8 or not data:
        raise CheckpointError(f"{text[:80]!r} is not a cosigner key <name>+<8 hex>+<base64>")
    if data[0] == _ML_DSA_44:
        raise CheckpointError(
            f"cosigner key {name}: ML-DSA-44 cosignatures (type 0x06) are not accepted here; "
            "give the witness's Ed25519 cosignature/v1 key (type 0x04)"
        )
    if data[:1] != COSIGNATURE_TYPE or len(data) != 33:
        raise CheckpointError(
            f"cosigner key {name}: not an Ed25519 cosignature/v1 key (type 0x04, 32 bytes)"
        )
    key = CosignerKey.of(name, Ed25519PublicKey.from_public_bytes(data[1:]))
    if key.key_id.hex() != hex_id.lower():
        raise CheckpointError(f"cosigner key {name}+{hex_id}: the id is not this name's and key's")
    return key


def cosignature_message(body: str, timestamp: int) -> bytes:
    """What a ``cosignature/v1`` signs: the header, the time, the checkpoint's body."""
    return f"cosignature/v1\ntime {timestamp}\n{body}".encode()


def cosign(key: Ed25519PrivateKey, name: str, body: str, timestamp: int) -> str:
    """A cosignature line by ``name`` over the checkpoint ``body`` at ``timestamp``."""
    signer = CosignerKey.of(name, key)
    signature = key.sign(cosignature_message(body, timestamp))
    blob = signer.key_id + timestamp.to_bytes(8, "big") + signature
    return f"{SIGNATURE_PREFIX}{name} {base64.b64encode(blob).decode()}\n"


def cosigned_by(note: str, cosigners: Iterable[CosignerKey]) -> dict[CosignerKey, int]:
    """The cosigners whose cosignature on the checkpoint ``note`` verifies, with its
    timestamp; lines of other names or key ids, or that do not verify, count for
    nobody."""
    body, signatures = parse_note(note)
    known = {(c.name, c.key_id): c for c in cosigners}
    found: dict[CosignerKey, int] = {}
    for sig in signatures:
        cosigner = known.get((sig.name, sig.key_hash))
        if cosigner is None or len(sig.signature) != 8 + 64 or cosigner in found:
            continue
        timestamp = int.from_bytes(sig.signature[:8], "big")
        if timestamp > _MAX_TIMESTAMP:
            continue
        try:
            cosigner.public_key.verify(sig.signature[8:], cosignature_message(body, timestamp))
        except InvalidSignature:
            continue
        found[cosigner] = timestamp
    return found
