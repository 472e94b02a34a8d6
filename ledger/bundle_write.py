"""Writing an offline bundle: the whole log, or one plan's streams, at one snapshot,
signed, into a file that appears atomically.

``--plan P`` keeps every stream that belongs to no other plan: the plan's own stream, the
registry, attachments and approvers, and the reviews of P (a stream belongs to the plan
its first event names in ``plan_id``). Streams are kept whole. Every stored blob the
kept events reference (their types' ``BLOB_FIELDS``) is carried; one the store lacks is
left out, and the bundle's verifier reports it (``blob_missing``).
"""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from typing import IO, Any

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .bundle_format import BUNDLE_FORMAT, BundleError, _json, _line, _plan_ref
from .checkpoints import Checkpoint, CheckpointError, sign_checkpoint
from .envelope import leaf_bytes
from .errors import LedgerError
from .events import Catalog
from .keys import public_key_b64
from .merkle import Frontier
from .rows import Row
from .store import Store


class BundleSummary(msgspec.Struct, kw_only=True):
    out: str
    origin: str
    plan: str | None
    size: int
    root: str  # hex
    events: int
    blobs: int
    checkpoint: str


class _Export:
    """What the rows of one snapshot give a bundle: the leaf hashes of them all, the
    event lines of the kept ones (written to ``spool``), the approvers they add and the
    blob digests they reference."""

    def __init__(self, catalog: Catalog, plan: str | None, spool: IO[bytes]) -> None:
        self.catalog = catalog
        self.readers = catalog.blob_readers()  # the types whose payloads name blobs
        self.plan = plan
        self.spool = spool
        self.leaves = bytearray()
        self.owners: dict[str, str | None] = {}
        self.approvers: list[dict[str, Any]] = []
        self.refs: set[str | None] = set()  # None: a BLOB_FIELDS value that is null
        self.events = 0
        self.plan_seen = plan is None

    def add(self, rows: Iterable[Row], size: int) -> None:
        """One batch of stored rows, in position order, up to position ``size``: each
        unpacked as the plain tuple it is, in ``StoredRow``'s order (a loop over every
        row of the log)."""
        for (
            position,
            event_id,
            stream,
            stream_version,
            type_name,
            schema_version,
            recorded_at,
            actor,
            corr,
            caus,
            payload,
            delta,
            stored_leaf,
            _,
        ) in rows:
            if position > size:
                break
            self.leaves += stored_leaf
            payload = bytes(payload)
            if not self._kept(stream, payload):
                continue
            self._note_blob_refs(type_name, schema_version, payload)
            if type_name == "approver_key.added":
                self._note_approver(position, payload)
            self.spool.write(
                leaf_bytes(
                    position,
                    event_id,
                    stream,
                    stream_version,
                    type_name,
                    schema_version,
                    recorded_at,
                    actor,
                    corr,
                    caus,
                    payload,
                    bytes(delta),
                )
                + b"\n"
            )
            self.events += 1

    def _kept(self, stream: str, payload: bytes) -> bool:
        """Whether the bundle keeps an event of ``stream``: one that belongs to no other
        plan (by its stream's first event)."""
        plan = self.plan
        if plan is None:
            return True
        if stream not in self.owners:
            self.owners[stream] = _plan_ref.decode(payload).plan_id
        owner = self.owners[stream]
        if owner is not None and owner != plan:
            return False
        self.plan_seen = self.plan_seen or owner == plan
        return True

    def _note_blob_refs(self, type_name: str, schema_version: int, payload: bytes) -> None:
        reader = self.readers.get(type_name)
        if reader is None:
            return
        try:
            if schema_version == reader[0]:
                self.refs.update(msgspec.structs.astuple(reader[1].decode(payload)))
            else:  # stored by an older version: upcast first (rare)
                self.refs.update(
                    d for _, d in self.catalog.blob_refs(type_name, schema_version, payload)
                )
        except (LedgerError, msgspec.DecodeError, msgspec.ValidationError):
            pass  # unreadable: the bundle's verifier reports this event

    def _note_approver(self, position: int, payload: bytes) -> None:
        document = _json(payload)
        self.approvers.append(
            {
                "fingerprint": document["fingerprint"],
                "name": document["name"],
                "position": position,
                "public_key": document["public_key"],
            }
        )


def _write_atomically(
    out: str, head: list[Any], spool: IO[bytes], blobs: list[tuple[str, bytes]]
) -> None:
    """The bundle's lines into ``out``: a temp file beside it, renamed over it."""
    directory = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(prefix=".bundle-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            for record in head:
                f.write(_line(record))
            spool.seek(0)
            shutil.copyfileobj(spool, f)
            for digest, data in blobs:
                f.write(_line({"data": base64.b64encode(data).decode("ascii"), "digest": digest}))
        umask = os.umask(0)  # mkstemp made it 0600; a bundle is for handing over
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# (checkpoint note, the log's leaf hashes) -> (the cosigned note, the policy's text)
Cosign = Callable[[str, list[bytes]], tuple[str, str]]


def write_bundle(
    store: Store,
    out: str | os.PathLike[str],
    *,
    key: Ed25519PrivateKey,
    origin: str,
    plan: str | None = None,
    cosign: Cosign | None = None,
) -> BundleSummary:
    """Write the bundle of the whole log (or of ``plan``) at one snapshot, signed by
    ``key`` and, with ``cosign``, cosigned (the checkpoint and the leaf hashes in, the
    cosigned checkpoint and the policy it satisfied out; it raises ``BundleError`` when
    the quorum does not hold); the file appears atomically (a temp file renamed over
    ``out``)."""
    out = os.fspath(out)
    with store.snapshot() as snap, tempfile.TemporaryFile() as spool:
        size, _, frontier = snap.head_row()
        root = Frontier.from_bytes(size, frontier).root()
        store.flush()  # what the signature names is on disk
        try:
            note = sign_checkpoint(Checkpoint(origin=origin, size=size, root=root), key)
        except CheckpointError as exc:
            raise BundleError(f"origin: {exc}") from None
        export = _Export(store.catalog, plan, spool)
        for rows in snap.rows():
            export.add(rows, size)
        if not export.plan_seen:
            raise BundleError(f"unknown plan {plan!r}")
        # Look the stored digests up once rather than each reference. A referenced blob
        # the store lacks is left out: the bundle's verifier reports it (blob_missing).
        # (A null reference, None, is never a stored digest.)
        stored = {digest for (digest,) in snap.query("SELECT digest FROM blobs")}
        blobs = [
            (digest, data)
            for digest in sorted(stored & export.refs)
            if (data := snap.blob(digest)) is not None
        ]
        header = {
            "blobs": len(blobs),
            "events": export.events,
            "format": BUNDLE_FORMAT,
            "origin": origin,
            "plan": plan,
            "root": root.hex(),
            "size": size,
        }
        keys = {
            "approvers": export.approvers,
            "signer": {"name": origin, "public_key": public_key_b64(key)},
        }
        leaves = base64.b64encode(export.leaves).decode("ascii")
        record: dict[str, str] = {"checkpoint": note}
        if cosign is not None:
            hashes = [bytes(export.leaves[i : i + 32]) for i in range(0, len(export.leaves), 32)]
            note, policy = cosign(note, hashes)
            record = {"checkpoint": note, "policy": policy}
        head = [header, record, {"leaves": leaves}, {"keys": keys}]
        _write_atomically(out, head, spool, blobs)
    return BundleSummary(
        out=out,
        origin=origin,
        plan=plan,
        size=size,
        root=root.hex(),
        events=export.events,
        blobs=len(blobs),
        checkpoint=note,
    )
