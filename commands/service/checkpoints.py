"""The service's published checkpoint (docs/service.md, "Checkpoints"): a C2SP signed
note of the log's size and root, signed by the plane key, made again every
``CHECKPOINT_EVERY_S`` by a thread of its own — after the append path, never in it: it
reads the head as any reader does and takes no ledger lock, so no gated check waits for
it. It is kept in the ledger's ``ledger_meta`` table, so every process and replica of
the service answers the same one at ``GET /checkpoint`` (the path C2SP tlog-tiles
gives it), and ``/metrics`` tells how old it is and what size it covers.

The table is writable by whoever can write the database, as is everything in it: a
checkpoint is worth its signature, which a client checks with the plane's public key
(``evidence verify --checkpoint``). What the agent writes there verifies under no key it
holds. A checkpoint never goes back: one of a smaller size than the one kept is not
stored (two replicas racing keep the larger).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ledger import Store, tables
from ledger.checkpoints import (
    Checkpoint,
    CheckpointError,
    sign_checkpoint,
    verify_checkpoint_signature,
)
from ledger.intake import env_seconds
from ledger.timestamps import rfc3339

__all__ = [
    "CHECKPOINT_EVERY_S",
    "Published",
    "checkpoint_every",
    "keep",
    "latest",
    "origin_of",
    "publish",
    "sign_head",
]

CHECKPOINT_EVERY_S = 30.0
CHECKPOINT_EVERY_ENV = "EVIDENCE_CHECKPOINT_EVERY"  # seconds; 0: publish none


def checkpoint_every() -> float:
    """``EVIDENCE_CHECKPOINT_EVERY`` (seconds, 0 to 3600; 0: no checkpoint is published),
    else ``CHECKPOINT_EVERY_S``."""
    return env_seconds(CHECKPOINT_EVERY_ENV, CHECKPOINT_EVERY_S, zero=True)


_NOTE, _SIZE, _AT = "checkpoint", "checkpoint_size", "checkpoint_at"


@dataclass(frozen=True)
class Published:
    """The checkpoint kept: its note, the size it covers, when it was signed (UTC)."""

    note: str
    size: int
    at: datetime

    def age_s(self, now: datetime | None = None) -> float:
        return max(0.0, ((now or datetime.now(UTC)) - self.at).total_seconds())


def origin_of(store: Store) -> str:
    """The checkpoint's origin line, as ``evidence checkpoint`` names it by default."""
    return f"evidence-ledger/{store.meta()['ledger_id']}"


def latest(store: Store, key: Ed25519PublicKey) -> Published | None:
    """The checkpoint kept, when it is one ``key`` signed (None: none yet, or rows the
    plane did not write: anyone who can write the database can write them)."""
    return _parsed(store.meta(), key)


def _parsed(meta: dict[str, str], key: Ed25519PublicKey) -> Published | None:
    try:
        at = datetime.fromisoformat(meta[_AT].replace("Z", "+00:00"))
        kept = Published(meta[_NOTE], int(meta[_SIZE]), at.astimezone(UTC))
        if verify_checkpoint_signature(kept.note, key).size != kept.size:
            return None
    except (KeyError, ValueError, CheckpointError):
        return None
    return kept


def sign_head(store: Store, key: Ed25519PrivateKey, origin: str) -> tuple[str, int]:
    """A checkpoint of the log's current head, signed by ``key``, and its size."""
    head = store.durable_head()
    return sign_checkpoint(
        Checkpoint(origin=origin, size=head.size, root=head.root), key
    ), head.size


def keep(store: Store, note: str, size: int, key: Ed25519PublicKey) -> Published:
    """Keep ``note`` (of a tree of ``size``) as the published checkpoint, the signing time
    renewed when the size did not change (its age says the publisher is alive); the kept
    one when it is larger and ``key`` signed it (another replica read a later head; a
    larger one nobody signed is replaced, never obeyed)."""
    now = datetime.now(UTC)
    meta = tables.ledger_meta
    keys = (_NOTE, _SIZE, _AT)
    with store.side_write() as conn:
        rows = conn.execute(sa.select(meta.c.key, meta.c.value).where(meta.c.key.in_(keys)))
        kept = _parsed({str(k): str(v) for k, v in rows.all()}, key)
        if kept is not None and kept.size > size:
            return kept
        conn.execute(meta.delete().where(meta.c.key.in_(keys)))
        conn.execute(
            meta.insert(),
            [
                {"key": _NOTE, "value": note},
                {"key": _SIZE, "value": str(size)},
                {"key": _AT, "value": rfc3339(now)},
            ],
        )
    return Published(note, size, now)


def publish(store: Store, key: Ed25519PrivateKey, origin: str) -> Published:
    """Sign the log's current head and keep it (``sign_head``, ``keep``)."""
    return keep(store, *sign_head(store, key, origin), key.public_key())
