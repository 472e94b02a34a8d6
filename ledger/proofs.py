"""What an auditor asks of one event or of one tree head, answered in one step.

- ``read_stored_event``: one event, by position or event id, exactly as stored: its
  columns, its payload (decoded when this catalog can read it, else the stored JSON and
  why it does not decode), its stored leaf and chain hashes, and the leaf hash
  recomputed from its stored bytes.
- ``check_inclusion``: the event's leaf, recomputed from its stored bytes, is in the tree
  of a head the auditor trusts: the RFC 9162 inclusion proof built from the stored
  leaves is checked against the trusted root (section 2.1.3.2).
- ``prove_consistency`` / ``check_consistency``: the RFC 9162 consistency proof from the
  tree of the first ``old_size`` events to a larger one, built from the stored leaves;
  the check holds it against a kept root and the newer root (section 2.1.4.2).
- ``trusted_head``: the tree head of a signed checkpoint, if its signature verifies.

The proofs are built from the stored leaf hashes, which anyone who can write the
database can change: a proof shows something only because it is checked against a root
obtained elsewhere (a signed checkpoint, a tree head kept outside the database).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from .checkpoints import (
    CheckpointError,
    Verifier,
    inclusion_from_leaves,
    parse_checkpoint,
    stored_leaves,
    verify_checkpoint_signature,
)
from .envelope import leaf_bytes
from .errors import LedgerError
from .merkle import consistency_proof, leaf_hash, root_of, verify_consistency, verify_inclusion
from .rows import StoredRow, column_list
from .store import Store
from .verify import Problem

__all__ = [
    "ConsistencyCheck",
    "ConsistencyProof",
    "InclusionCheck",
    "StoredEvent",
    "TrustedHead",
    "check_consistency",
    "check_inclusion",
    "prove_consistency",
    "read_stored_event",
    "trusted_head",
]


class StoredEvent(msgspec.Struct, kw_only=True):
    """One event as stored. ``event`` has the shape of ``evidence events --json``."""

    event: dict[str, Any]
    payload_error: str | None  # why the payload does not decode as its type (None: it does)
    recomputed_leaf_hash: str  # SHA-256(0x00 || the envelope of the stored columns)
    leaf_ok: bool  # the stored row hashes to its stored leaf hash


def read_stored_event(store: Store, key: int | str) -> StoredEvent | None:
    """The event at position ``key`` (an int) or with event id ``key`` (a str), or None.

    Read from the raw row, so an event whose payload no longer decodes (an edit of the
    database) is shown too, with the stored JSON and the reason."""
    where = "position" if isinstance(key, int) else "event_id"
    with store.snapshot() as snap:
        rows = snap.query(
            f"SELECT {column_list()} FROM events WHERE {where} = {store.placeholder}", (key,)
        )
    if not rows:
        return None
    row = StoredRow._make(rows[0])
    row = row._replace(payload=bytes(row.payload), delta=bytes(row.delta))
    # The leaf is over every column but the two hashes (the last two), in the row's order.
    recomputed = leaf_hash(leaf_bytes(*row[:-2]))
    payload_error = None
    try:
        document: Any = msgspec.to_builtins(
            store.catalog.decode(row.type, row.schema_version, row.payload)
        )
    except (LedgerError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        payload_error = str(exc)
        document = _raw_json(row.payload)
    event = {
        **row._asdict(),
        "payload": document,
        "delta": _raw_json(row.delta),
        "leaf_hash": bytes(row.leaf_hash).hex(),
        "chain_hash": bytes(row.chain_hash).hex(),
    }
    return StoredEvent(
        event=event,
        payload_error=payload_error,
        recomputed_leaf_hash=recomputed.hex(),
        leaf_ok=recomputed == bytes(row.leaf_hash),
    )


def _raw_json(data: bytes) -> Any:
    """Stored JSON bytes as a value; bytes that are not JSON as their text (replaced)."""
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return data.decode("utf-8", "replace")


# ------------------------------------------------------------------------ trusted heads


class TrustedHead(msgspec.Struct, kw_only=True):
    """The tree head a proof is checked against, and where it came from."""

    source: str  # "against" (SIZE:ROOT given), "checkpoint" (a signed note), "log"
    size: int
    root: str  # hex
    origin: str | None = None  # a checkpoint's origin line
    signature_ok: bool | None = None  # a checkpoint's signature, by the key given


def trusted_head(
    checkpoint_text: str, public_key: Verifier
) -> tuple[TrustedHead | None, list[Problem]]:
    """The tree head a signed checkpoint names, if the note parses and a signature on it
    is by ``public_key``; otherwise no head and the problem (``checkpoint_malformed``,
    ``checkpoint_signature``), as ``verify --checkpoint`` reports them."""
    try:
        checkpoint, _ = parse_checkpoint(checkpoint_text)
    except CheckpointError as exc:
        return None, [Problem(None, "checkpoint_malformed", str(exc))]
    head = TrustedHead(
        source="checkpoint",
        size=checkpoint.size,
        root=checkpoint.root.hex(),
        origin=checkpoint.origin,
        signature_ok=True,
    )
    try:
        verify_checkpoint_signature(checkpoint_text, public_key)
    except CheckpointError as exc:
        head.signature_ok = False
        return head, [Problem(None, "checkpoint_signature", str(exc))]
    return head, []


# ----------------------------------------------------------------------------- inclusion


class InclusionCheck(msgspec.Struct, kw_only=True):
    ok: bool
    kind: str  # "inclusion"
    position: int
    leaf_index: int
    tree_size: int
    root: str  # the trusted root the proof was checked against
    leaf_hash: str | None  # recomputed from the event's stored bytes (None: not stored)
    stored_leaf_hash: str | None
    proof: list[str]
    trusted: TrustedHead
    problems: list[Problem]


def check_inclusion(
    store: Store, position: int, trusted: TrustedHead, problems: Sequence[Problem] = ()
) -> InclusionCheck:
    """Is the event at ``position``, as stored now, in the tree ``trusted`` names?

    The leaf is recomputed from the event's stored bytes (not read from its leaf
    column), the inclusion proof is built from the first ``trusted.size`` stored leaves,
    and the proof must lead from that leaf to ``trusted.root``. ``problems`` are those
    already found with the trusted head (its signature); they fail the check too."""
    if not 0 < position <= trusted.size:
        raise CheckpointError(
            f"position {position} is not in a tree of {trusted.size} events: it can only "
            "be proven in a later tree head"
        )
    found = list(problems)
    stored = read_stored_event(store, position)
    leaves = stored_leaves(store, trusted.size)
    proof: list[str] = []
    if stored is not None and not stored.leaf_ok:
        found.append(
            Problem(
                position,
                "leaf_mismatch",
                "the stored row does not hash to its leaf hash (content changed)",
            )
        )
    if stored is None or len(leaves) < trusted.size:
        found.append(_truncated(trusted, len(leaves)))
    else:
        proof = inclusion_from_leaves(leaves, position).proof
        included = verify_inclusion(
            bytes.fromhex(stored.recomputed_leaf_hash),
            position - 1,
            trusted.size,
            [bytes.fromhex(p) for p in proof],
            bytes.fromhex(trusted.root),
        )
        if not included:
            found.append(
                Problem(
                    position,
                    "not_included",
                    f"the event as stored is not in the tree of {trusted.size} events with "
                    f"root {trusted.root}: it, or another of the first {trusted.size} "
                    "events, was changed since that tree head",
                )
            )
    return InclusionCheck(
        ok=not found,
        kind="inclusion",
        position=position,
        leaf_index=position - 1,
        tree_size=trusted.size,
        root=trusted.root,
        leaf_hash=stored.recomputed_leaf_hash if stored is not None else None,
        stored_leaf_hash=stored.event["leaf_hash"] if stored is not None else None,
        proof=proof,
        trusted=trusted,
        problems=found,
    )


def _truncated(head: TrustedHead, held: int) -> Problem:
    return Problem(
        None,
        "log_truncated",
        f"the tree head covers {head.size} events but the log holds {held}: the log was truncated",
    )


# --------------------------------------------------------------------------- consistency


class ConsistencyProof(msgspec.Struct, kw_only=True):
    old_size: int
    old_root: str
    tree_size: int
    root: str
    proof: list[str]


def prove_consistency(store: Store, old_size: int, size: int | None = None) -> ConsistencyProof:
    """The RFC 9162 consistency proof from the tree of the first ``old_size`` events to
    the tree of the first ``size`` (default: the whole log), from the stored leaves."""
    head = store.head().size
    size = head if size is None else size
    if not 0 < size <= head:
        raise CheckpointError(f"tree size {size} is not within 1..{head}")
    if not 0 < old_size <= size:
        raise CheckpointError(f"old tree size {old_size} is not within 1..{size}")
    leaves = stored_leaves(store, size)
    return ConsistencyProof(
        old_size=old_size,
        old_root=root_of(leaves[:old_size]).hex(),
        tree_size=size,
        root=root_of(leaves).hex(),
        proof=[p.hex() for p in consistency_proof(leaves, old_size)],
    )


class ConsistencyCheck(msgspec.Struct, kw_only=True):
    ok: bool
    kind: str  # "consistency"
    old_size: int
    old_root: str  # the kept root
    tree_size: int
    root: str  # the newer root the proof was checked against
    proof: list[str]
    trusted: TrustedHead
    problems: list[Problem]


def check_consistency(
    store: Store,
    old_size: int,
    old_root: str,
    newer: TrustedHead,
    problems: Sequence[Problem] = (),
) -> ConsistencyCheck:
    """Does the tree ``newer`` names extend the kept head ``old_size:old_root``?

    The consistency proof is built from the first ``newer.size`` stored leaves and must
    connect ``old_root`` to ``newer.root``. With ``newer.source == "log"`` the newer root
    is the stored leaves' own: the check then shows that the log, as stored now, extends
    the kept head (its leaf hashes; ``evidence verify`` checks each row hashes to its
    leaf). ``problems``: those already found with the newer head (its signature)."""
    if not 0 < old_size <= newer.size:
        raise CheckpointError(
            f"the kept tree head's size {old_size} is not within 1..{newer.size} (the "
            "newer tree head's)"
        )
    found = list(problems)
    leaves = stored_leaves(store, newer.size)
    proof: list[bytes] = []
    if len(leaves) < newer.size:
        found.append(_truncated(newer, len(leaves)))
    else:
        proof = consistency_proof(leaves, old_size)
        consistent = verify_consistency(
            old_size,
            newer.size,
            bytes.fromhex(old_root),
            bytes.fromhex(newer.root),
            proof,
        )
        if not consistent:
            found.append(
                Problem(
                    None,
                    "inconsistent",
                    f"no consistency proof from the tree head {old_size}:{old_root} to "
                    f"{newer.size}:{newer.root} in the stored leaves: events at or before "
                    f"position {old_size} were rewritten since the kept head, or the log "
                    "does not lead to the newer one",
                )
            )
    return ConsistencyCheck(
        ok=not found,
        kind="consistency",
        old_size=old_size,
        old_root=old_root,
        tree_size=newer.size,
        root=newer.root,
        proof=[p.hex() for p in proof],
        trusted=newer,
        problems=found,
    )
