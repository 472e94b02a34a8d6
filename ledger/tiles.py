"""The log as C2SP tlog-tiles (docs/auditing.md, "Tiles"): the Merkle tree the ledger
already keeps, served or written as the static resources any tile client reads —
``checkpoint``, ``tile/<L>/<N>[.p/<W>]`` and ``tile/entries/<N>[.p/<W>]``.

- A tile at level ``L`` holds up to 256 consecutive hashes of the tree's nodes that
  each cover ``256**L`` leaves: level 0 the leaf hashes themselves (the stored
  ``leaf_hash`` column), level ``L + 1`` the Merkle Tree Hash of each *full* tile of
  level ``L``. A tile with fewer than 256 is partial (``.p/<W>``): the tree of size ``s``
  has one of width ``floor(s / 256**L) mod 256`` at each level where that is not 0.
- ``<N>`` is written in zero-padded 3-digit path elements, all but the last starting
  with ``x`` (1234067: ``x001/x234/067``).
- An entry bundle holds the entries of one level-0 tile, each a big-endian uint16
  length and the entry. An entry is the event's leaf bytes (the RFC 8785 envelope the
  leaf hash is over: ``SHA-256(0x00 || entry)`` is its level-0 hash), except for an
  event whose leaf bytes are longer than the 65,535 a length can say: its entry is
  ``LARGE_ENTRY`` followed by the SHA-256 of its leaf bytes and their length (8 bytes,
  big-endian), 71 bytes that commit to the event without holding it. Its level-0 hash
  is still ``SHA-256(0x00 || leaf bytes)``: a client that checks entries against the
  tree reads that event's bytes elsewhere (``evidence event N``, an export) and checks
  both.

Every hash is RFC 6962's (the ledger's RFC 9162 tree): nothing here is new cryptography,
only another encoding of the same tree.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .checkpoints import Checkpoint, CheckpointError, parse_checkpoint, sign_checkpoint
from .envelope import leaf_bytes
from .errors import LedgerError
from .merkle import Frontier, node_hash, root_of
from .store import Store

__all__ = [
    "LARGE_ENTRY",
    "MAX_ENTRY",
    "WIDTH",
    "TilesError",
    "TilesWritten",
    "entries_path",
    "entry_bundle",
    "entry_of",
    "export_tiles",
    "index_path",
    "levels",
    "parse_tile_path",
    "row_entry",
    "subtree_root",
    "tile_path",
    "tiles_of",
]

WIDTH = 256  # hashes in a full tile, entries in a full bundle (a tile is 8 levels high)
MAX_ENTRY = 0xFFFF  # what a bundle's uint16 length can say
LARGE_ENTRY = b"evidence-ledger/large-entry/v1\n"
MAX_LEVEL = 63


def index_path(n: int) -> str:
    """``N`` as path elements: zero-padded groups of three digits, all but the last
    prefixed with ``x``."""
    digits = str(n)
    digits = "0" * (-len(digits) % 3) + digits
    groups = [digits[i : i + 3] for i in range(0, len(digits), 3)]
    return "/".join([*(f"x{g}" for g in groups[:-1]), groups[-1]])


def _suffix(width: int) -> str:
    return "" if width == WIDTH else f".p/{width}"


def tile_path(level: int, n: int, width: int = WIDTH) -> str:
    return f"tile/{level}/{index_path(n)}{_suffix(width)}"


def entries_path(n: int, width: int = WIDTH) -> str:
    return f"tile/entries/{index_path(n)}{_suffix(width)}"


def parse_tile_path(path: str) -> tuple[int | None, int, int]:
    """``(level, n, width)`` of a tile path (``level`` None for an entry bundle);
    ``ValueError`` for anything that is not one, exactly as written by ``tile_path``."""
    parts = path.split("/")
    if len(parts) < 3 or parts[0] != "tile":
        raise ValueError("not a tile path")
    level_part, rest = parts[1], parts[2:]
    width = WIDTH
    if len(rest) >= 2 and rest[-2].endswith(".p"):
        if not rest[-1].isdigit() or str(int(rest[-1])) != rest[-1]:
            raise ValueError("a partial tile's width is a decimal number")
        width = int(rest[-1])
        if not 1 <= width < WIDTH:
            raise ValueError("a partial tile is 1 to 255 wide")
        rest = [*rest[:-2], rest[-2][:-2]]
    n = _index(rest)
    if level_part == "entries":
        return None, n, width
    if not level_part.isdigit() or str(int(level_part)) != level_part:
        raise ValueError("a tile's level is a decimal number")
    level = int(level_part)
    if level > MAX_LEVEL:
        raise ValueError(f"a tile's level is at most {MAX_LEVEL}")
    return level, n, width


def _index(parts: Sequence[str]) -> int:
    if not parts:
        raise ValueError("no index")
    *head, last = parts
    if any(len(p) != 4 or p[0] != "x" or not p[1:].isdigit() for p in head):
        raise ValueError("all but the last index element are x and three digits")
    if len(last) != 3 or not last.isdigit():
        raise ValueError("the last index element is three digits")
    n = int("".join([*(p[1:] for p in head), last]))
    if index_path(n) != "/".join(parts):
        raise ValueError("an index is written without leading zero groups")
    return n


def subtree_root(hashes: Sequence[bytes]) -> bytes:
    """The Merkle Tree Hash over a full tile's 256 hashes (a perfect subtree)."""
    row = list(hashes)
    while len(row) > 1:
        row = [node_hash(row[i], row[i + 1]) for i in range(0, len(row), 2)]
    return row[0]


def levels(leaves: Sequence[bytes]) -> list[list[bytes]]:
    """Every tile level's hashes for a tree of ``len(leaves)`` leaves: level 0 the leaf
    hashes, each next level the root of each full tile of the one below, up to the
    first level with no full tile."""
    found = [list(leaves)]
    while len(found[-1]) >= WIDTH:
        below = found[-1]
        found.append(
            [subtree_root(below[i : i + WIDTH]) for i in range(0, len(below) - WIDTH + 1, WIDTH)]
        )
    return found


def tiles_of(size: int) -> Iterable[tuple[int, int, int]]:
    """Every tile ``(level, n, width)`` a tree of ``size`` leaves has: the full ones and
    the partial one of each level, if any."""
    level = 0
    while size >= WIDTH**level:
        count = size // WIDTH**level
        for n in range(count // WIDTH):
            yield level, n, WIDTH
        if count % WIDTH:
            yield level, count // WIDTH, count % WIDTH
        level += 1


def entry_of(leaf: bytes) -> bytes:
    """The entry of an event whose leaf bytes are ``leaf`` (see the module docstring)."""
    if len(leaf) <= MAX_ENTRY:
        return leaf
    return LARGE_ENTRY + hashlib.sha256(leaf).digest() + len(leaf).to_bytes(8, "big")


def entry_bundle(entries: Iterable[bytes]) -> bytes:
    return b"".join(len(e).to_bytes(2, "big") + e for e in entries)


def row_entry(row: Sequence[Any]) -> bytes:
    """A stored row's entry (its columns in ``StoredRow``'s order, the hashes last)."""
    columns = list(row[:12])
    columns[10], columns[11] = bytes(columns[10]), bytes(columns[11])  # payload, delta
    return entry_of(leaf_bytes(*columns))


@dataclass
class TilesWritten:
    """What an export wrote: the tree size, and how many files of each kind were new."""

    size: int
    tiles: int = 0
    bundles: int = 0

    def to_json(self) -> dict[str, int]:
        return {"size": self.size, "tiles": self.tiles, "bundles": self.bundles}


def write_file(root: Path, relative: str, data: bytes) -> bool:
    """``data`` at ``root/relative``, made atomically; False when a file is there
    already (a tile path names one content for good: it is never written twice)."""
    path = root / relative
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)
    return True


# -- writing them: ``evidence export --tiles DIR`` ---------------------------------------------


class TilesError(LedgerError):
    """The directory holds what these tiles may not be written over (one line: why)."""


def export_tiles(
    store: Store,
    directory: str | os.PathLike[str],
    *,
    key: Ed25519PrivateKey,
    origin: str,
    cosign: Callable[[str, list[bytes]], tuple[str, str]] | None = None,
) -> TilesWritten:
    """Write the log's tiles, entry bundles and a checkpoint signed by ``key`` into
    ``directory``, as of one snapshot: the tiles and bundles it does not hold yet (a
    tile path names one content for good), then the checkpoint, last and atomically, so
    a reader never sees a checkpoint whose tiles are missing. A directory that holds
    another log's checkpoint (another origin, or a tree this log does not extend) is
    refused: its tiles are not this log's. With ``cosign`` (``write_bundle``'s), the
    checkpoint written is the cosigned one; when it raises, the tiles are written and the
    checkpoint is left as it was."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    with store.snapshot() as snap:
        size, _, frontier = snap.head_row()
        leaves = [
            bytes(leaf) for (leaf,) in snap.query("SELECT leaf_hash FROM events ORDER BY position")
        ]
        if len(leaves) != size:
            raise TilesError(f"the log holds {len(leaves)} rows for a head of {size}")
        _check_kept(root / "checkpoint", origin, leaves)
        written = TilesWritten(size)
        found = levels(leaves)
        for level, n, width in tiles_of(size):
            hashes = found[level][n * WIDTH : n * WIDTH + width]
            written.tiles += write_file(root, tile_path(level, n, width), b"".join(hashes))
        missing = [
            (n, width)
            for level, n, width in tiles_of(size)
            if level == 0 and not (root / entries_path(n, width)).exists()
        ]
        if missing:
            first = missing[0][0] * WIDTH + 1
            entries = [row_entry(row) for rows in snap.rows(first=first) for row in rows]
            for n, width in missing:
                start = n * WIDTH + 1 - first
                bundle = entry_bundle(entries[start : start + width])
                written.bundles += write_file(root, entries_path(n, width), bundle)
        store.flush()  # what the signature names is on disk
        note = sign_checkpoint(
            Checkpoint(origin=origin, size=size, root=Frontier.from_bytes(size, frontier).root()),
            key,
        )
    if cosign is not None:
        note = cosign(note, leaves)[0]
    partial = root / ".checkpoint.partial"
    partial.write_text(note)
    os.replace(partial, root / "checkpoint")
    return written


def _check_kept(path: Path, origin: str, leaves: Sequence[bytes]) -> None:
    """The directory's checkpoint, if any, is this log's: its origin, and a tree the
    log extends (its root is the root of the log's first leaves)."""
    if not path.exists():
        return
    try:
        kept, _ = parse_checkpoint(path.read_text(encoding="utf-8"))
    except (CheckpointError, UnicodeDecodeError, OSError) as exc:
        raise TilesError(f"{path} is no checkpoint ({exc})") from None
    if kept.origin != origin:
        raise TilesError(f"{path} is the checkpoint of {kept.origin!r}, not of {origin!r}")
    if kept.size > len(leaves) or root_of(leaves[: kept.size]) != kept.root:
        raise TilesError(
            f"{path} is a tree of size {kept.size} this log does not extend: the tiles there "
            "are another log's"
        )
