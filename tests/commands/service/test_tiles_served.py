"""`evidence serve`'s tiles (``commands.service.tiles``): the same bytes as `export
--tiles` writes, at the same paths, for every tile of the log and of its earlier sizes;
cached for good; entry bundles only when the service is told to serve them."""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

import ledger
from commands.rules.signing import plane_key_path
from commands.service import create_app
from ledger.keys import load_private_key
from ledger.tiles import export_tiles
from tests.helpers import append_plans, run_cli


def _exported(url: str, out: Path) -> dict[str, bytes]:
    with ledger.open(url, create=False) as store:
        key = load_private_key(plane_key_path(url))
        export_tiles(store, out, key=key, origin="example.org/log")
    return {
        str(path.relative_to(out)): path.read_bytes()
        for path in out.rglob("*")
        if path.is_file() and path.name != "checkpoint"
    }


def test_the_service_serves_the_tiles_export_writes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'evidence.db'}"
    assert run_cli("init", "--db", url).returncode == 0
    append_plans(url, 0, 300)
    earlier = _exported(url, tmp_path / "tiles")
    append_plans(url, 300, 400)
    files = _exported(url, tmp_path / "tiles")  # every size's tiles: the earlier partials too
    assert set(earlier) < set(files)
    with TestClient(create_app(url)) as client:
        for path, data in files.items():
            answer = client.get("/" + path)
            if path.startswith("tile/entries/"):
                assert answer.status_code == 404, path  # not served unless asked
                continue
            assert answer.status_code == 200, path
            assert answer.content == data, path
            assert answer.headers["content-type"] == "application/octet-stream"
            assert answer.headers["cache-control"] == "public, max-age=31536000, immutable"
        assert client.get("/tile/0/002.p/201").status_code == 404  # not in the log yet
        assert client.get("/tile/0/003").status_code == 404
        assert client.get("/tile/0/3").status_code == 404  # not a tile path
        assert client.get("/tile/0/x000/002").status_code == 404
    with TestClient(create_app(url, tile_entries=True)) as client:
        for path, data in files.items():
            if path.startswith("tile/entries/"):
                answer = client.get("/" + path, headers={"Accept-Encoding": "gzip"})
                assert answer.headers["content-encoding"] == "gzip"  # the client unzips it
                assert answer.content == data, path
                plain = client.get("/" + path, headers={"Accept-Encoding": "identity"})
                assert "content-encoding" not in plain.headers and plain.content == data
