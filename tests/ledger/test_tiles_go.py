"""Our tiles read by a tile client we did not write (issue 48): Go's own transparency-log
package (``golang.org/x/mod/sumdb/tlog`` and ``.../note``, from Debian's
``golang-golang-x-mod-dev``) opens the checkpoint with the plane key's verifier key,
re-derives the root of a 100,000-event ledger from our tiles (authenticating every tile it
reads), proves and checks inclusions of entries read from our bundles, and consistency
with older trees whose roots our own Merkle code computed — on both backends. The client
is tests/interop/tlog/main.go."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ledger
from ledger.checkpoints import stored_leaves, verifier_key
from ledger.keys import generate_key_pair, load_private_key
from ledger.merkle import root_of
from ledger.tiles import export_tiles
from tests.conftest import IN_CI
from tests.helpers import append_plans

pytestmark = pytest.mark.slow

SOURCE = Path(__file__).resolve().parent.parent / "interop" / "tlog" / "main.go"
GOPATH = Path("/usr/share/gocode")  # Debian's golang-golang-x-mod-dev puts x/mod here
EVENTS = 100_000
ORIGIN = "example.org/evidence"
LARGE = 70_123  # this one's leaf bytes are over a bundle's 65,535


@pytest.fixture(scope="module")
def tlogcheck(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    go = shutil.which("go")
    if go is None or not (GOPATH / "src/golang.org/x/mod/sumdb/tlog").is_dir():
        why = "needs Go and Debian's golang-golang-x-mod-dev (.ci/run installs them)"
        if IN_CI:
            pytest.fail(why)
        pytest.skip(why)
    where = tmp_path_factory.mktemp("tlogcheck")
    env = {
        **os.environ,
        "GO111MODULE": "off",  # Debian's x/mod in GOPATH: no module download, offline
        "GOPATH": str(GOPATH),
        "GOCACHE": str(where / "cache"),
    }
    binary = where / "tlogcheck"
    subprocess.run([go, "build", "-o", str(binary), str(SOURCE)], check=True, env=env, cwd=where)
    yield binary


def _check(tlogcheck: Path, tiles: Path, key: object, indexes: str, trees: str) -> Any:
    return subprocess.run(
        [str(tlogcheck), str(tiles), verifier_key(ORIGIN, key), indexes, trees],  # type: ignore[arg-type]
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_go_tlog_reads_our_tiles_of_a_large_ledger(
    db_url: str, tmp_path: Path, tlogcheck: Path
) -> None:
    generate_key_pair(tmp_path / "plane.key")
    key = load_private_key(tmp_path / "plane.key")
    with ledger.open(db_url) as store:
        append_plans(store, 0, EVENTS, large_at=LARGE)
        export_tiles(store, tmp_path / "tiles", key=key, origin=ORIGIN)
        leaves = stored_leaves(store)
    assert len(leaves) == EVENTS
    indexes = [0, 1, 255, 256, 65_535, 65_536, 70_000, LARGE, EVENTS - 1]
    olds = [1, 2, 255, 256, 257, 65_536, 70_001, EVENTS - 1, EVENTS]
    trees = ",".join(f"{n}:{root_of(leaves[:n]).hex()}" for n in olds)
    checked = _check(tlogcheck, tmp_path / "tiles", key, ",".join(map(str, indexes)), trees)
    assert checked.returncode == 0, checked.stderr
    found = json.loads(checked.stdout)
    assert found["size"] == EVENTS and found["origin"] == ORIGIN
    assert found["records"] == len(indexes) - 1 and found["trees"] == len(olds)
    # The large event: Go proved its level-0 hash, the hash of the event's leaf bytes.
    assert found["large"] == {str(LARGE): leaves[LARGE].hex()}


def test_a_tampered_tile_fails_go_tlog(db_url: str, tmp_path: Path, tlogcheck: Path) -> None:
    """One hash changed in one level-0 tile: the root Go derives no longer matches."""
    generate_key_pair(tmp_path / "plane.key")
    key = load_private_key(tmp_path / "plane.key")
    with ledger.open(db_url) as store:
        append_plans(store, 0, 600)
        export_tiles(store, tmp_path / "tiles", key=key, origin=ORIGIN)
    assert _check(tlogcheck, tmp_path / "tiles", key, "300", "").returncode == 0
    tile = tmp_path / "tiles" / "tile/0/001"
    data = bytearray(tile.read_bytes())
    data[40] ^= 1
    tile.write_bytes(bytes(data))
    checked = _check(tlogcheck, tmp_path / "tiles", key, "300", "")
    assert checked.returncode == 1 and "tlogcheck:" in checked.stderr
