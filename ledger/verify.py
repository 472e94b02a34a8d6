"""Verify the log from its stored bytes alone.

Recomputes every leaf from the row's columns (RFC 8785 envelope), the hash chain and the
RFC 9162 root, checks positions are dense from 1 and stream versions dense per stream,
and compares the result with the ledger head. With an earlier tree head (size, root)
that an auditor kept, also checks the current log extends it: the root of the first
``size`` leaves, recomputed from the stored rows, must equal the kept root. That catches
a truncated tail (head rewound) and a suffix rewritten consistently, which no check of
the log against itself can.

With ``check_blobs`` (the default) the blob store is checked too: every stored blob must
hash to its digest, and every blob an event references (its type's ``BLOB_FIELDS``) must
be stored (``blob_missing``, at the event's position: deleting the raw output behind a
passing result leaves the log's hashes intact, so only this check shows it).

Every problem found is reported with its position; ``first_bad_position`` names the
earliest. Checking continues past a bad row (up to ``max_problems``) so one edit does not
hide another: the chain check at row i uses the stored chain hash of row i-1.
"""

from __future__ import annotations

from collections.abc import Callable
from hashlib import sha256

import msgspec

from .envelope import GENESIS_CHAIN, LEAF_TEMPLATE, json_string
from .errors import LedgerError
from .events import Catalog
from .merkle import EMPTY_ROOT, Frontier
from .store import Snapshot, Store

__all__ = ["Problem", "TreeHeadRef", "VerifyReport", "parse_tree_head", "verify_store"]


class Problem(msgspec.Struct, frozen=True):
    position: int | None  # None: about the head or a blob, not one row
    kind: str
    detail: str


class TreeHeadRef(msgspec.Struct, frozen=True):
    size: int
    root: str  # hex
    ok: bool | None = None


class VerifyReport(msgspec.Struct, kw_only=True):
    ok: bool
    size: int
    root: str
    chain_hash: str
    checked_events: int
    checked_blobs: int
    first_bad_position: int | None
    against: TreeHeadRef | None
    problems: list[Problem]


def parse_tree_head(text: str) -> TreeHeadRef:
    """Parse ``SIZE:ROOT_HEX`` as printed by ``evidence verify``."""
    size_text, sep, root = text.partition(":")
    if not sep or not size_text.isdigit():
        raise ValueError(f"tree head {text!r} is not SIZE:ROOT_HEX")
    root = root.strip().lower()
    if len(root) != 64 or any(c not in "0123456789abcdef" for c in root):
        raise ValueError(f"tree head root {root!r} is not 64 hex characters")
    return TreeHeadRef(size=int(size_text), root=root)


def verify_store(
    store: Store,
    *,
    against: TreeHeadRef | None = None,
    check_blobs: bool = True,
    max_problems: int = 100,
) -> VerifyReport:
    if against is not None:
        against = parse_tree_head(f"{against.size}:{against.root}")  # validates, lowercases
    problems: list[Problem] = []

    def report(position: int | None, kind: str, detail: str) -> None:
        if len(problems) < max_problems:
            problems.append(Problem(position, kind, detail))

    with store.snapshot() as snap:
        head_size, head_chain, head_frontier = snap.head_row()
        # The blobs first (their digests are what the scan checks references against);
        # their problems are reported after the rows', as they always were.
        checked_blobs = 0
        stored: set[str] | None = None
        mismatched: list[str] = []
        if check_blobs:
            stored = set()
            for digest, length, data in snap.blobs():
                checked_blobs += 1
                stored.add(digest)
                if sha256(data).hexdigest() != digest or len(data) != length:
                    mismatched.append(digest)
        scan = _scan(
            snap, against.size if against is not None else None, report, store.catalog, stored
        )
        for digest in mismatched:
            report(None, "blob_mismatch", f"blob {digest} does not hash to its digest")

    frontier, last_chain, against_root = scan
    size = frontier.size
    root = frontier.root()
    if head_size != size:
        report(None, "head_size", f"the head records {head_size} events, the log holds {size}")
    if head_chain != last_chain:
        report(None, "head_chain", "the head's chain hash is not the last row's chain hash")
    if head_frontier != frontier.to_bytes():
        report(None, "head_root", "the head's Merkle tree does not match the recomputed one")

    against_out = None
    if against is not None:
        if against.size > size:
            report(
                None,
                "against_truncated",
                f"the kept tree head has {against.size} events but the log holds only "
                f"{size}: the log was truncated",
            )
            ok_against = False
        else:
            ok_against = against_root is not None and against_root.hex() == against.root
            if not ok_against:
                report(
                    None,
                    "against_inconsistent",
                    f"the first {against.size} events do not hash to the kept root "
                    f"{against.root}: the log was rewritten since that tree head",
                )
        against_out = TreeHeadRef(size=against.size, root=against.root, ok=ok_against)

    positions = [p.position for p in problems if p.position is not None]
    return VerifyReport(
        ok=not problems,
        size=size,
        root=root.hex(),
        chain_hash=last_chain.hex(),
        checked_events=size,
        checked_blobs=checked_blobs,
        first_bad_position=min(positions) if positions else None,
        against=against_out,
        problems=problems,
    )


def _scan(
    snap: Snapshot,
    against_size: int | None,
    report: Callable[[int | None, str, str], None],
    catalog: Catalog,
    stored: set[str] | None,
) -> tuple[Frontier, bytes, bytes | None]:
    """Check every row; return the recomputed tree, the last stored chain hash and the
    root at ``against_size`` (if given and reached). With ``stored`` (the digests in the
    blob store), also check that every blob a row references is among them.

    This loop is the whole cost of ``verify``, so it is written flat: the JSON forms of
    the few distinct streams, types and actors are cached, and the Merkle frontier is
    updated inline (the same steps as ``Frontier.append``). Payloads are not decoded:
    only a row whose raw ``type`` has ``BLOB_FIELDS`` has just those fields read. A
    payload that cannot be read is left to the leaf check (an edit) and the read path (a
    type or version this catalog does not know): verify itself needs no decoding.
    """
    frontier = Frontier()
    hashes = frontier.hashes
    size = 0
    previous_chain = GENESIS_CHAIN
    versions: dict[str, int] = {}
    encoded: dict[str | None, bytes] = {None: b"null"}
    against_root = EMPTY_ROOT if against_size == 0 else None
    template = LEAF_TEMPLATE
    # Blobs are checked only with ``stored``: without it there are no readers, so
    # ``present`` is never consulted.
    readers = catalog.blob_readers() if stored is not None else {}
    present: set[str] = stored if stored is not None else set()
    astuple = msgspec.structs.astuple
    expected = 1  # the next position; after a hole, resynchronised to what is stored
    for rows in snap.rows():
        for (
            position,
            event_id,
            stream,
            stream_version,
            type_name,
            sv,
            recorded_at,
            actor,
            corr,
            caus,
            payload,
            delta,
            stored_leaf,
            stored_chain,
        ) in rows:
            if position != expected:
                report(
                    position,
                    "hole",
                    f"position {expected} is missing (next stored position is {position})",
                )
            expected = position + 1
            try:
                stream_json = encoded[stream]
            except KeyError:
                stream_json = encoded[stream] = json_string(stream)
            try:
                type_json = encoded[type_name]
            except KeyError:
                type_json = encoded[type_name] = json_string(type_name)
            try:
                actor_json = encoded[actor]
            except KeyError:
                actor_json = encoded[actor] = json_string(actor)
            leaf = sha256(
                b"\x00"
                + template
                % (
                    actor_json,
                    encoded[caus] if caus is None else json_string(caus),
                    encoded[corr] if corr is None else json_string(corr),
                    delta,
                    json_string(event_id),
                    payload,
                    position,
                    json_string(recorded_at),
                    sv,
                    stream_json,
                    stream_version,
                    type_json,
                )
            ).digest()
            if leaf != stored_leaf:
                report(
                    position,
                    "leaf_mismatch",
                    "the stored row does not hash to its leaf hash (content changed)",
                )
            if sha256(previous_chain + stored_leaf).digest() != stored_chain:
                report(
                    position,
                    "chain_mismatch",
                    "chain hash does not follow from the previous row (a row before it "
                    "was rewritten, removed or reordered)",
                )
            last = versions.get(stream, 0)
            if stream_version != last + 1:
                report(
                    position,
                    "stream_version",
                    f"stream {stream!r} jumps from version {last} to {stream_version}",
                )
            versions[stream] = stream_version
            previous_chain = stored_chain
            reader = readers.get(type_name)
            if reader is not None:
                try:
                    if sv == reader[0]:
                        values = astuple(reader[1].decode(payload))
                    else:  # stored by an older version: upcast first (rare)
                        upcast = catalog.decode(type_name, sv, payload)
                        values = tuple(getattr(upcast, f) for f in reader[2])
                except (LedgerError, msgspec.DecodeError, msgspec.ValidationError):
                    values = ()
                for digest in values:
                    if digest is not None and digest not in present:
                        _missing(report, position, type_name, reader[2], values, present)
                        break
            # Frontier.append, inline: merge one perfect subtree per trailing 1 bit.
            hashes.append(leaf)
            carry = size
            while carry & 1:
                right = hashes.pop()
                hashes[-1] = sha256(b"\x01" + hashes[-1] + right).digest()
                carry >>= 1
            size += 1
            if size == against_size:
                frontier.size = size
                against_root = frontier.root()
    frontier.size = size
    return frontier, bytes(previous_chain), against_root


def _missing(
    report: Callable[[int | None, str, str], None],
    position: int,
    type_name: str,
    fields: tuple[str, ...],
    values: tuple[str | None, ...],
    stored: set[str],
) -> None:
    """Report each blob the row at ``position`` references that is not stored."""
    for field, digest in zip(fields, values, strict=True):
        if digest is not None and digest not in stored:
            report(
                position,
                "blob_missing",
                f"{type_name} {field} names blob {digest}, which the blob store does not hold",
            )
