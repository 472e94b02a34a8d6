"""The log's C2SP tlog-tiles as ``evidence serve`` answers them (docs/service.md, "Tiles"):
``GET /tile/<L>/<N>[.p/<W>]`` made from the stored leaf hashes on request, with the
published ``/checkpoint`` (``checkpoints``) saying which tree they are of. A tile names
one content for good, so the answers are cached by anyone for a year.

A tile of ``width`` hashes at index ``n`` exists once the level holds ``n * 256 + width``
nodes: the full tiles, the partial tile of today's size, and the partial tiles of every
earlier size (what a client holding an older checkpoint asks for). The nodes above level
0 are subtree roots that never change once their leaves are there: they are kept
(``TileSource._nodes``), so a tile high up costs its leaves' reading once.

Entry bundles hold every event's bytes — the plans, their tools' inputs — so they are
served only when the service is told to (``evidence serve --tile-entries``); the hash
tiles and the checkpoint say nothing but hashes and a size.
"""

from __future__ import annotations

import threading

import sqlalchemy as sa

from ledger import Store, tables
from ledger.tiles import WIDTH, entry_bundle, parse_tile_path, row_entry, subtree_root

__all__ = ["IMMUTABLE", "TileSource"]

IMMUTABLE = "public, max-age=31536000, immutable"


class TileSource:
    """Tiles and entry bundles of one ledger, from its stored rows."""

    def __init__(self, *, entries: bool) -> None:
        self.entries = entries
        self._nodes: dict[tuple[int, int], bytes] = {}  # (level >= 1, index) -> root
        self._lock = threading.Lock()

    def answer(self, store: Store, path: str) -> bytes | None:
        """The bytes at ``tile/...`` ``path``; None when there is no such resource (yet),
        ``ValueError`` when the path is not one a tile has."""
        level, n, width = parse_tile_path(path)
        size = store.head().size
        if level is None:
            if not self.entries or n * WIDTH + width > size:
                return None
            return entry_bundle(_entries(store, n * WIDTH, width))
        if n * WIDTH + width > size // WIDTH**level:
            return None
        first = n * WIDTH
        if level == 0:  # the leaf hashes themselves, in one read
            return b"".join(_leaves(store, first, width))
        return b"".join(self._node(store, level, i) for i in range(first, first + width))

    def _node(self, store: Store, level: int, index: int) -> bytes:
        """The root of the ``index``-th complete subtree of ``WIDTH ** level`` leaves
        (``level`` >= 1)."""
        with self._lock:
            kept = self._nodes.get((level, index))
        if kept is not None:
            return kept
        if level == 1:
            below = _leaves(store, index * WIDTH, WIDTH)
        else:
            below = [self._node(store, level - 1, index * WIDTH + i) for i in range(WIDTH)]
        root = subtree_root(below)
        with self._lock:
            self._nodes[level, index] = root
        return root


def _leaves(store: Store, first: int, count: int) -> list[bytes]:
    """The leaf hashes of positions ``first + 1`` to ``first + count``."""
    ev = tables.events.c
    query = (
        sa.select(ev.leaf_hash)
        .where(ev.position > first, ev.position <= first + count)
        .order_by(ev.position)
    )
    with store.read_transaction() as conn:
        found = [bytes(leaf) for (leaf,) in conn.execute(query)]
    if len(found) != count:
        raise LookupError(f"positions {first + 1}..{first + count} are not all stored")
    return found


def _entries(store: Store, first: int, count: int) -> list[bytes]:
    with store.snapshot() as snap:
        batches = snap.rows(first=first + 1, last=first + count)
        return [row_entry(row) for rows in batches for row in rows]
