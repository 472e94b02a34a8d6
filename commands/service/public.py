"""What the service publishes to anyone who reaches it, beside the agents' and the
people's routes: its metrics (one view across ``--workers``), the log's checkpoint,
signed by the plane key every ``CHECKPOINT_EVERY_S`` and kept in the database, and the
log's tiles (docs/service.md, "Metrics", "Checkpoints", "Tiles"). A mixin of ``Service``
(``app``): these read what the service holds and answer in its shapes."""

from __future__ import annotations

import gzip
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from starlette.requests import Request
from starlette.responses import Response

from commands.plane import Plane
from commands.plane.witnesses import proofs, witness
from ledger.checkpoints import stored_leaves
from ledger.tlog_policy import Policy

from .admission import Admission
from .checkpoints import Published, checkpoint_every, keep, latest, origin_of, sign_head
from .committer import GroupCommitter
from .metrics import CONTENT_TYPE, PUBLISH_EVERY_S, Fleet, LedgerReadings, Metrics, Process
from .pool import PlanePool
from .tiles import IMMUTABLE, TileSource

__all__ = ["PublicReads"]

log = logging.getLogger("evidence.service")
T = TypeVar("T")


class PublicReads:
    """Metrics, checkpoints and tiles, for ``Service``."""

    metrics: Metrics
    fleet: Fleet | None
    tiles: TileSource
    published: Published | None
    witness_policy: Policy | None
    admission: Admission
    committer: GroupCommitter
    pool: PlanePool
    max_in_flight: int
    _plane_key: Ed25519PrivateKey | None
    _stopping: threading.Event

    async def in_thread(self, fn: Callable[[Plane], T]) -> T:
        raise NotImplementedError  # Service's

    def json(self, body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
        raise NotImplementedError  # Service's

    def publish_checkpoint(self) -> Published | None:
        """Sign the log's head with the plane key and keep it (``checkpoints``); with a
        witness policy, only once its witnesses' quorum cosigned it (else the one kept
        stays, and the log says why)."""
        assert self._plane_key is not None, "the service has not started"
        key = self._plane_key
        note, size = self.pool.run(
            lambda plane: sign_head(plane.store, key, origin_of(plane.store))
        )
        if self.witness_policy is not None:  # the witnesses are asked off the pool
            read = proofs(lambda: self.pool.run(lambda plane: stored_leaves(plane.store, size)))
            done = witness(note, self.witness_policy, read)
            if not done.check.ok:
                refusals = "; ".join(f"{a.witness}: {a.why}" for a in done.asked if a.why)
                log.warning("checkpoint of %d not published: no quorum (%s)", size, refusals)
                return self.published
            note = done.note
        public = key.public_key()
        self.published = self.pool.run(lambda plane: keep(plane.store, note, size, public))
        return self.published

    def _checkpoint_due(self) -> None:
        """A checkpoint now, then every ``checkpoint_every()`` seconds (never with 0)."""
        every = checkpoint_every()
        while every:
            try:
                self.publish_checkpoint()
            except Exception as exc:  # the database is away: the next round tries again
                log.warning("checkpoint: %s", exc)
            if self._stopping.wait(every):
                return

    async def metrics_text(self, _request: Request) -> Response:
        def read(plane: Plane) -> LedgerReadings:
            kept = latest(plane.store, self._public_key())
            return LedgerReadings(
                head_size=plane.store.head().size,
                checkpoint_size=kept.size if kept is not None else None,
                checkpoint_age_s=kept.age_s() if kept is not None else None,
            )

        try:
            ledger_readings = await self.in_thread(read)
        except Exception:  # the metrics still answer; the ledger's gauges are left out
            ledger_readings = LedgerReadings()
        own = self._process()
        if self.fleet is None:
            return Response(self.metrics.render(own, ledger_readings), media_type=CONTENT_TYPE)
        total, fleet = await anyio.to_thread.run_sync(self.fleet.gather, self.metrics.snapshot(own))
        return Response(total.render(fleet, ledger_readings), media_type=CONTENT_TYPE)

    def _process(self) -> Process:
        return Process(
            in_flight=self.admission.active,
            waiting=self.admission.queued,
            limit=self.max_in_flight,
            commits=(self.committer.batches, self.committer.jobs),
        )

    async def publish_metrics(self) -> None:
        """This process's snapshot in the fleet's directory, every ``PUBLISH_EVERY_S``."""
        assert self.fleet is not None
        while True:
            await anyio.sleep(PUBLISH_EVERY_S)
            snapshot = self.metrics.snapshot(self._process())
            try:
                await anyio.to_thread.run_sync(self.fleet.publish, snapshot)
            except OSError as exc:
                log.warning("metrics: %s", exc)

    async def tile(self, request: Request) -> Response:
        """A tile or an entry bundle of the log (``tiles``), immutable once it exists."""
        path = "tile/" + str(request.path_params["tile"])
        try:
            data = await self.in_thread(lambda plane: self.tiles.answer(plane.store, path))
        except ValueError as exc:
            return self.json({"error": f"not a tile path: {exc}"}, 404)
        if data is None:
            return self.json({"error": "no such tile: not in the log yet, or not served"}, 404)
        headers = {"Cache-Control": IMMUTABLE}
        if path.startswith("tile/entries/"):  # JSON text: compressed when the client takes gzip
            headers["Vary"] = "Accept-Encoding"
            if "gzip" in request.headers.get("accept-encoding", ""):
                data = await anyio.to_thread.run_sync(gzip.compress, data)
                headers["Content-Encoding"] = "gzip"
        return Response(data, media_type="application/octet-stream", headers=headers)

    def _public_key(self) -> Ed25519PublicKey:
        assert self._plane_key is not None, "the service has not started"
        return self._plane_key.public_key()

    async def checkpoint_text(self, _request: Request) -> Response:
        """The latest checkpoint kept (``checkpoints``), as C2SP tlog-tiles serves it."""
        kept = await self.in_thread(lambda plane: latest(plane.store, self._public_key()))
        if kept is None:
            return self.json({"error": "no checkpoint published yet"}, 404)
        return Response(
            kept.note,
            media_type="text/plain; charset=utf-8",
            headers={"Cache-Control": "no-cache"},
        )
