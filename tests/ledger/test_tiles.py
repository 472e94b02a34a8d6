"""The log as C2SP tlog-tiles (``ledger.tiles``): the spec's own examples of paths and of
which tiles a tree has, tiles that hash to the ledger's root, entries that hash to their
leaves (an event too large for a bundle committed to instead), an export that adds only
what is new, and a directory of another log's tiles refused."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import ledger
from ledger.checkpoints import parse_checkpoint, stored_leaves
from ledger.keys import generate_key_pair, load_private_key
from ledger.merkle import leaf_hash, root_of
from ledger.tiles import (
    LARGE_ENTRY,
    WIDTH,
    TilesError,
    entries_path,
    export_tiles,
    index_path,
    levels,
    parse_tile_path,
    subtree_root,
    tile_path,
    tiles_of,
)
from tests.helpers import append_plans


def test_paths_are_written_as_the_spec_writes_them() -> None:
    assert index_path(1234067) == "x001/x234/067"
    assert index_path(0) == "000" and index_path(1000) == "x001/000"
    assert tile_path(0, 1234067, 8) == "tile/0/x001/x234/067.p/8"
    assert tile_path(3, 5) == "tile/3/005"
    assert entries_path(1234067) == "tile/entries/x001/x234/067"
    for path, parsed in (
        ("tile/0/x001/x234/067.p/8", (0, 1234067, 8)),
        ("tile/entries/005", (None, 5, 256)),
        ("tile/12/x001/000", (12, 1000, 256)),
    ):
        assert parse_tile_path(path) == parsed
    for bad in (
        "tile/0/5", "tile/00/005", "tile/0/x000/005", "tile/0/005.p/0", "tile/0/005.p/256",
        "tile/0/005.p/08", "tile/64/005", "tile/0/x01/005", "tile/0", "tiles/0/005",
    ):  # fmt: skip
        with pytest.raises(ValueError):
            parse_tile_path(bad)


def test_a_tree_has_the_tiles_the_spec_lists() -> None:
    """ "A tree of size 70,000 will be represented by 273 full level 0 tiles, one partial
    level 0 tile of width 112, one full level 1 tile, one partial level 1 tile of width
    17, and one partial level 2 tile of width 1"; one of 256 by a full level 0 tile and a
    partial level 1 tile of width 1."""
    tiles = list(tiles_of(70_000))
    assert sum(1 for t in tiles if t[0] == 0 and t[2] == WIDTH) == 273
    assert [t for t in tiles if t[2] != WIDTH] == [(0, 273, 112), (1, 1, 17), (2, 0, 1)]
    assert (1, 0, WIDTH) in tiles and len(tiles) == 273 + 1 + 1 + 1 + 1
    assert list(tiles_of(256)) == [(0, 0, WIDTH), (1, 0, 1)]
    assert list(tiles_of(0)) == []


def test_each_level_is_the_roots_of_the_full_tiles_below() -> None:
    leaves = [leaf_hash(str(i).encode()) for i in range(WIDTH * WIDTH + 300)]
    found = levels(leaves)
    assert [len(level) for level in found] == [len(leaves), WIDTH + 1, 1]
    assert found[1][3] == root_of(leaves[3 * WIDTH : 4 * WIDTH])
    assert found[2][0] == root_of(leaves[: WIDTH * WIDTH]) == subtree_root(found[1][:WIDTH])


@pytest.fixture
def key(tmp_path: Path) -> object:
    generate_key_pair(tmp_path / "log.key")
    return load_private_key(tmp_path / "log.key")


def _entries(bundle: bytes) -> list[bytes]:
    found = []
    while bundle:
        length = int.from_bytes(bundle[:2], "big")
        found.append(bundle[2 : 2 + length])
        bundle = bundle[2 + length :]
    return found


def test_an_export_writes_tiles_that_hash_to_the_log_and_adds_only_what_is_new(
    db_url: str, tmp_path: Path, key: object
) -> None:
    out = tmp_path / "tiles"
    with ledger.open(db_url) as store:
        append_plans(store, 0, 300, large_at=260)
        first = export_tiles(store, out, key=key, origin="example.org/log")  # type: ignore[arg-type]
        assert (first.size, first.tiles, first.bundles) == (300, 3, 2)  # 0/000 0/001.p 1/000.p
        leaves = stored_leaves(store)
        checkpoint, _ = parse_checkpoint((out / "checkpoint").read_text())
        assert (checkpoint.size, checkpoint.root) == (300, root_of(leaves))
        assert (out / "tile/0/000").read_bytes() == b"".join(leaves[:WIDTH])
        assert (out / "tile/1/000.p/1").read_bytes() == root_of(leaves[:WIDTH])
        entries = _entries((out / "tile/entries/000").read_bytes())
        entries += _entries((out / "tile/entries/001.p/44").read_bytes())
        assert [leaf_hash(e) for i, e in enumerate(entries) if i != 260] == [
            h for i, h in enumerate(leaves) if i != 260
        ]
        large = entries[260]  # the event over 65,535 bytes: a commitment to it
        assert len(large) == len(LARGE_ENTRY) + 32 + 8 and large.startswith(LARGE_ENTRY)
        with store.snapshot() as snap:
            [[row]] = list(snap.rows(first=261, last=261))
        from ledger.tiles import row_entry  # the full leaf bytes, as the tree hashes them

        full = _full_leaf(row)
        assert large[len(LARGE_ENTRY) :] == hashlib.sha256(full).digest() + len(full).to_bytes(
            8, "big"
        )
        assert leaf_hash(full) == leaves[260] and row_entry(row) == large
        before = (out / "tile/0/000").stat().st_mtime_ns
        append_plans(store, 300, 300)
        again = export_tiles(store, out, key=key, origin="example.org/log")  # type: ignore[arg-type]
        # new: 0/001 (full now), 0/002.p/88, 1/000.p/2; entries 001, 002.p/88
        assert (again.size, again.tiles, again.bundles) == (600, 3, 2)
        assert (out / "tile/0/000").stat().st_mtime_ns == before  # never written twice
        assert (out / "tile/0/001.p/44").exists()  # the earlier size's partial tile stays
        with pytest.raises(TilesError, match=r"not of 'example\.org/other'"):
            export_tiles(store, out, key=key, origin="example.org/other")  # type: ignore[arg-type]


def _full_leaf(row: tuple) -> bytes:
    from ledger.envelope import leaf_bytes

    columns = list(row[:12])
    columns[10], columns[11] = bytes(columns[10]), bytes(columns[11])
    return leaf_bytes(*columns)


def test_a_directory_of_another_logs_tiles_is_refused(tmp_path: Path, key: object) -> None:
    out = tmp_path / "tiles"
    with ledger.open(f"sqlite:///{tmp_path / 'a.db'}") as a:
        append_plans(a, 0, 10)
        export_tiles(a, out, key=key, origin="example.org/log")  # type: ignore[arg-type]
    with ledger.open(f"sqlite:///{tmp_path / 'b.db'}") as b:
        append_plans(b, 100, 20)  # other events: a tree that does not extend a's
        with pytest.raises(TilesError, match="does not extend"):
            export_tiles(b, out, key=key, origin="example.org/log")  # type: ignore[arg-type]
