"""Verify the log from its stored bytes alone.

Recomputes every leaf from the row's columns (RFC 8785 envelope), the hash chain and the
RFC 9162 root, checks positions are dense from 1 and stream versions dense per stream,
and compares the result with the ledger head. With an earlier tree head (size, root)
that an auditor kept, also checks the current log extends it: the root of the first
``size`` leaves, recomputed from the stored rows, must equal the kept root. That catches
a truncated tail (head rewound) and a suffix rewritten consistently, which no check of
the log against itself can.

Every problem found is reported with its position; ``first_bad_position`` names the
earliest. Checking continues past a bad row (up to ``max_problems``) so one edit does not
hide another: the chain check at row i uses the stored chain hash of row i-1.
"""

from __future__ import annotations

from hashlib import sha256

import msgspec

from .envelope import GENESIS_CHAIN, leaf_bytes
from .merkle import Frontier
from .store import Store

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
    problems: list[Problem] = []

    def report(position: int | None, kind: str, detail: str) -> None:
        if len(problems) < max_problems:
            problems.append(Problem(position, kind, detail))

    frontier = Frontier()
    previous_chain = GENESIS_CHAIN
    expected = 1
    versions: dict[str, int] = {}
    against_root: bytes | None = None
    if against is not None and against.size == 0:
        against_root = frontier.root()
    for rows in store.scan_rows():
        for row in rows:
            (position, event_id, stream, stream_version, type_name, sv, recorded_at, actor,
             corr, caus, payload, delta, stored_leaf, stored_chain) = row
            if position != expected:
                report(position, "hole",
                       f"position {expected} is missing (next stored position is {position})")
                expected = position
            leaf = sha256(
                b"\x00" + leaf_bytes(position, event_id, stream, stream_version, type_name, sv,
                                     recorded_at, actor, corr, caus, bytes(payload), bytes(delta))
            ).digest()
            stored_leaf = bytes(stored_leaf)
            stored_chain = bytes(stored_chain)
            if leaf != stored_leaf:
                report(position, "leaf_mismatch",
                       "the stored row does not hash to its leaf hash (content changed)")
            if sha256(previous_chain + stored_leaf).digest() != stored_chain:
                report(position, "chain_mismatch",
                       "chain hash does not follow from the previous row (a row before it "
                       "was rewritten, removed or reordered)")
            last = versions.get(stream, 0)
            if stream_version != last + 1:
                report(position, "stream_version",
                       f"stream {stream!r} jumps from version {last} to {stream_version}")
            versions[stream] = stream_version
            frontier.append(leaf)
            previous_chain = stored_chain
            expected += 1
            if against is not None and frontier.size == against.size:
                against_root = frontier.root()

    size = frontier.size
    root = frontier.root()
    head_size, head_chain, head_frontier, head_root = store.head_row()
    if head_size != size:
        report(None, "head_size", f"the head records {head_size} events, the log holds {size}")
    if head_chain != previous_chain:
        report(None, "head_chain", "the head's chain hash is not the last row's chain hash")
    if head_root != root or head_frontier != frontier.to_bytes():
        report(None, "head_root", "the head's Merkle root does not match the recomputed tree")

    checked_blobs = 0
    if check_blobs:
        for digest, length, data in store.scan_blobs():
            checked_blobs += 1
            if sha256(data).hexdigest() != digest or len(data) != length:
                report(None, "blob_mismatch", f"blob {digest} does not hash to its digest")

    against_out = None
    if against is not None:
        if against.size > size:
            report(None, "against_truncated",
                   f"the kept tree head has {against.size} events but the log holds only "
                   f"{size}: the log was truncated")
            ok_against = False
        else:
            ok_against = against_root is not None and against_root.hex() == against.root
            if not ok_against:
                report(None, "against_inconsistent",
                       f"the first {against.size} events do not hash to the kept root "
                       f"{against.root}: the log was rewritten since that tree head")
        against_out = TreeHeadRef(size=against.size, root=against.root, ok=ok_against)

    positions = [p.position for p in problems if p.position is not None]
    return VerifyReport(
        ok=not problems,
        size=size,
        root=root.hex(),
        chain_hash=previous_chain.hex(),
        checked_events=size,
        checked_blobs=checked_blobs,
        first_bad_position=min(positions) if positions else None,
        against=against_out,
        problems=problems,
    )
