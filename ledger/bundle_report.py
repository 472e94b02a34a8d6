"""What reading an offline bundle gives: the report (``BundleReport``, with the check of
a checkpoint the auditor kept, ``KeptCheckpoint``) and the verified ``Bundle``, read
like a ``Store``.

Bundles authenticate through the Merkle tree, not the hash chain: a bundle event's
``chain_hash`` is empty. ``Bundle`` reads like a ``Store`` (``LogReader``), so the audit
and replay run on it unchanged; it holds the bundle in memory.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from typing import Any

import msgspec

from .bundle_limits import _show
from .bundle_reader import _Reader
from .checkpoints import CheckpointError, parse_checkpoint, verify_checkpoint_signature
from .events import RecordedEvent
from .merkle import root_of
from .store import TreeHead
from .verify import Problem


class KeptCheckpoint(msgspec.Struct, kw_only=True):
    """A checkpoint the auditor kept, checked against the bundle's leaves."""

    origin: str | None
    size: int | None
    root: str | None  # hex
    signature_ok: bool
    consistent: bool | None  # None: not checkable (malformed, or larger than the bundle)


class BundleReport(msgspec.Struct, kw_only=True):
    ok: bool
    format: str | None
    origin: str | None
    plan: str | None
    size: int | None
    root: str | None  # hex
    events: int
    blobs: int
    signature_ok: bool
    key_source: str  # "given": the auditor's key; "bundle": the key the bundle carries
    kept: KeptCheckpoint | None
    problems: list[Problem]
    # Held to a witness policy (``verify --bundle --policy``): {log, cosigned, quorum}.
    policy: dict[str, Any] | None = None
    # The policy text the bundle says its checkpoint satisfied (its writer's claim).
    carried_policy: str | None = None


def _kept(reader: _Reader, note: str) -> KeptCheckpoint:
    """Check a checkpoint the auditor kept: signed by the same key, and its tree is a
    prefix of the bundle's (the root of the first m leaves is the kept root)."""
    try:
        checkpoint, _ = parse_checkpoint(note)
    except CheckpointError as exc:
        reader.problem(None, "kept_checkpoint", f"malformed kept checkpoint: {exc}")
        return KeptCheckpoint(
            origin=None, size=None, root=None, signature_ok=False, consistent=None
        )
    signature_ok = False
    key = reader.given_key or reader.signer
    if key is None:
        reader.problem(
            None, "kept_checkpoint", "no public key to check the kept checkpoint's signature with"
        )
    else:
        try:
            verify_checkpoint_signature(note, key)
            signature_ok = True
        except CheckpointError as exc:
            reader.problem(None, "kept_checkpoint", f"kept checkpoint: {exc}")
    header = reader.header
    consistent: bool | None = None
    if header is not None and checkpoint.origin != header["origin"]:
        reader.problem(
            None,
            "kept_checkpoint",
            f"the kept checkpoint is of log "
            f"{_show(checkpoint.origin)}; the bundle is of "
            f"{_show(header['origin'])}",
        )
    elif header is not None and checkpoint.size > header["size"]:
        reader.problem(
            None,
            "kept_truncated",
            f"the kept checkpoint covers {checkpoint.size} events; the bundle's "
            f"tree has only {header['size']}: the log was truncated",
        )
    elif header is not None and len(reader.leaves) == header["size"]:
        consistent = root_of(reader.leaves[: checkpoint.size]) == checkpoint.root
        if not consistent:
            reader.problem(
                None,
                "kept_inconsistent",
                f"the first {checkpoint.size} leaves do not hash to the kept root "
                f"{checkpoint.root.hex()}: events at or before position "
                f"{checkpoint.size} were rewritten since it was signed",
            )
    return KeptCheckpoint(
        origin=checkpoint.origin,
        size=checkpoint.size,
        root=checkpoint.root.hex(),
        signature_ok=signature_ok,
        consistent=consistent,
    )


def _report(reader: _Reader, kept: KeptCheckpoint | None) -> BundleReport:
    header = reader.header or {}
    return BundleReport(
        ok=not reader.problems,
        format=header.get("format"),
        origin=header.get("origin"),
        plan=header.get("plan"),
        size=header.get("size"),
        root=header.get("root"),
        events=reader.event_count,
        blobs=len(reader.blobs),
        signature_ok=reader.signature_ok,
        key_source="given" if reader.given_key is not None else "bundle",
        kept=kept,
        problems=reader.problems,
        carried_policy=reader.policy_text,
    )


class Bundle:
    """A verified bundle read like a ``Store`` (the ``LogReader`` reads of the audit,
    replay and report). Only the bundle's events are there: positions have gaps in a
    plan's bundle."""

    def __init__(self, reader: _Reader, report: BundleReport) -> None:
        self.report = report
        self.plan: str | None = report.plan
        self._events = reader.events
        self._blobs = reader.blobs
        self._root = bytes.fromhex(report.root) if report.root and report.ok else b""
        self._streams: dict[str, list[RecordedEvent]] = {}
        for event in self._events:
            self._streams.setdefault(event.stream, []).append(event)

    def head(self) -> TreeHead:
        """The tree head of the log the bundle was cut from (its size counts events
        that a plan's bundle leaves out)."""
        return TreeHead(self.report.size or 0, self._root, b"")

    def read_all(
        self,
        from_position: int = 1,
        *,
        to_position: int | None = None,
        batch_size: int = 1000,
        types: Sequence[str] | None = None,
        stream: str | None = None,
        stream_prefix: str | None = None,
    ) -> Iterator[RecordedEvent]:
        for event in self._events:
            if event.position < from_position:
                continue
            if to_position is not None and event.position > to_position:
                return
            if types and event.type not in types:
                continue
            if stream is not None and event.stream != stream:
                continue
            if stream_prefix is not None and not event.stream.startswith(stream_prefix):
                continue
            yield event

    def read_stream(
        self, stream: str, from_version: int = 1, *, as_of: int | None = None
    ) -> list[RecordedEvent]:
        return [
            e
            for e in self._streams.get(stream, ())
            if e.stream_version >= from_version and (as_of is None or e.position <= as_of)
        ]

    def get_blob(self, digest: str) -> bytes | None:
        return self._blobs.get(digest)

    def get_blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        return {d: self._blobs[d] for d in digests if d in self._blobs}
