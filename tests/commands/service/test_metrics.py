"""The service's metrics as a fleet sees them (``commands.service.metrics``): the counters
of every process of ``serve --workers N`` added up by whichever is scraped, every known
series at 0 from the start, and the published checkpoint's size and age beside the
head's (``commands.service.checkpoints``, served at ``/checkpoint``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from starlette.testclient import TestClient

import ledger
from commands.plane import Plane
from commands.plane.registry import register_tool
from commands.rules.signing import plane_key_path
from commands.service import create_app
from commands.service.checkpoints import latest, origin_of, publish
from commands.service.metrics import Fleet, LedgerReadings, Metrics, Process
from ledger import tables
from ledger.checkpoints import (
    Checkpoint,
    parse_verifier_key,
    sign_checkpoint,
    verifier_key,
    verify_checkpoint_signature,
)
from ledger.keys import load_private_key
from tests.helpers import run_cli

ROUTE = {"route": "/healthz", "method": "GET", "status": "200"}


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    return int(done.stdout)


def test_a_scrape_adds_up_every_process_and_only_the_live_ones_in_flight(tmp_path: Path) -> None:
    own, other, ended = Metrics(), Metrics(), Metrics()
    own.requests.inc(3, **ROUTE)
    other.requests.inc(4, **ROUTE)
    other.latency.observe(0.02, route="/healthz")
    ended.requests.inc(5, **ROUTE)
    ended.validations.inc(outcome="pass")
    Fleet(tmp_path).publish(own.snapshot(Process()))  # replaced by the scrape's own
    for pid, metrics, process in (
        (1, other, Process(in_flight=2, waiting=1, limit=8, commits=(1, 3))),  # pid 1: alive
        (_dead_pid(), ended, Process(in_flight=7, waiting=7, limit=8, commits=(2, 2))),
    ):
        (tmp_path / f"{pid}.json").write_bytes(msgspec.json.encode(metrics.snapshot(process)))
    (tmp_path / "junk.json").write_text("{not json")  # not one of ours: left out
    total, fleet = Fleet(tmp_path).gather(own.snapshot(Process(in_flight=1, limit=8)))
    text = total.render(fleet, LedgerReadings())
    assert 'evidence_http_requests_total{method="GET",route="/healthz",status="200"} 12' in text
    assert 'evidence_validations_total{outcome="pass"} 1' in text
    assert 'evidence_http_request_duration_seconds_count{route="/healthz"} 1' in text
    assert re.search(r"^evidence_in_flight 3$", text, re.M)  # 1 + 2, never the ended 7
    assert re.search(r"^evidence_waiting 1$", text, re.M)
    assert re.search(r"^evidence_in_flight_limit 16$", text, re.M)
    assert re.search(r"^evidence_group_commits_total 3$", text, re.M)  # a counter: all
    assert (tmp_path / f"{os.getpid()}.json").exists()


def test_the_service_publishes_a_checkpoint_and_says_how_old_it_is(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'evidence.db'}"
    assert run_cli("init", "--db", url).returncode == 0
    key = load_private_key(plane_key_path(url)).public_key()
    app = create_app(url)
    with TestClient(app) as client:
        service = app.state.service
        service.publish_checkpoint()
        with Plane.open(url) as plane:
            register_tool(plane, {"name": "probe", "command": ["true"]})
            size = plane.store.head().size
        first = client.get("/checkpoint")
        assert first.status_code == 200 and first.headers["cache-control"] == "no-cache"
        assert service.publish_checkpoint().size == size
        note = client.get("/checkpoint").text
        origin = note.split("\n", 1)[0]
        checkpoint = verify_checkpoint_signature(
            note, parse_verifier_key(verifier_key(origin, key))
        )
        assert checkpoint.size == size and first.text != note
        samples = client.get("/metrics").text
    assert re.search(rf"^evidence_checkpoint_size {size}$", samples, re.M)
    assert re.search(rf"^evidence_ledger_head_size {size}$", samples, re.M)
    age = re.search(r"^evidence_checkpoint_age_seconds (\S+)$", samples, re.M)
    assert age is not None and 0 <= float(age.group(1)) < 60
    # every route's answered series at 0 from the start
    assert 'evidence_http_requests_total{method="POST",route="/v1/validate",status="200"} 0' in (
        samples
    )


def _kept_row(store: ledger.Store, note: str, size: int) -> None:
    """Rows in ledger_meta as another replica, or an agent holding the file, writes them."""
    with store.side_write() as conn:
        conn.execute(
            tables.ledger_meta.insert(),
            [
                {"key": "checkpoint", "value": note},
                {"key": "checkpoint_size", "value": str(size)},
                {"key": "checkpoint_at", "value": "2026-01-01T00:00:00.000000Z"},
            ],
        )


def test_a_checkpoint_never_goes_back(tmp_path: Path) -> None:
    """A replica that read an older head does not replace a larger checkpoint another
    one signed and kept."""
    url = f"sqlite:///{tmp_path / 'evidence.db'}"
    assert run_cli("init", "--db", url).returncode == 0
    key = load_private_key(plane_key_path(url))
    with ledger.open(url, create=False) as store:
        size, origin = store.head().size + 5, origin_of(store)
        later = sign_checkpoint(Checkpoint(origin=origin, size=size, root=bytes(32)), key)
        _kept_row(store, later, size)
        kept = publish(store, key, origin)
        assert (kept.note, kept.size) == (later, size)
        assert latest(store, key.public_key()) == kept


def test_a_checkpoint_the_plane_did_not_sign_is_never_obeyed_nor_served(tmp_path: Path) -> None:
    """The agent writes ledger_meta a "checkpoint" of a huge tree, to stop every later
    publication (a kept one is never replaced by a smaller one): unsigned, it is neither
    served nor kept; the next publication replaces it."""
    url = f"sqlite:///{tmp_path / 'evidence.db'}"
    assert run_cli("init", "--db", url).returncode == 0
    key = load_private_key(plane_key_path(url))
    app = create_app(url)
    with TestClient(app) as client:
        app.state.service.publish_checkpoint()
        with ledger.open(url, create=False) as store:
            with store.side_write() as conn:
                conn.execute(
                    tables.ledger_meta.delete().where(tables.ledger_meta.c.key.like("checkpoint%"))
                )
            _kept_row(store, "evidence-ledger/x\n999999\nAAAA\n\n— x AAAA\n", 999_999)
            assert latest(store, key.public_key()) is None
        assert client.get("/checkpoint").status_code == 404  # never served
        assert "evidence_checkpoint_size 999999" not in client.get("/metrics").text
        published = app.state.service.publish_checkpoint()
        with ledger.open(url, create=False) as store:
            assert published.size == store.head().size
            assert latest(store, key.public_key()) == published


def test_checkpoints_are_a_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EVIDENCE_CHECKPOINT_EVERY=0 publishes none; a value that is no number of seconds
    is a refused start."""
    url = f"sqlite:///{tmp_path / 'evidence.db'}"
    assert run_cli("init", "--db", url).returncode == 0
    monkeypatch.setenv("EVIDENCE_CHECKPOINT_EVERY", "0")
    with TestClient(create_app(url)) as client:
        time.sleep(0.2)
        assert client.get("/checkpoint").status_code == 404
    monkeypatch.setenv("EVIDENCE_CHECKPOINT_EVERY", "often")
    refused = run_cli("serve", "--db", url, "--insecure-single-user")
    assert refused.returncode == 2
    assert "EVIDENCE_CHECKPOINT_EVERY must be a number of seconds from 0 to 3600" in refused.stderr
