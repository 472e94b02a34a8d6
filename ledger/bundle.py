"""Offline bundles: a part of the log an auditor verifies, audits and replays with no
database at all.

A bundle is one text file; each line is one record, the RFC 8785 canonical JSON of it,
in this order::

    1  header      {"blobs":M,"events":K,"format":"evidence-bundle/1","origin":O,
                    "plan":P|null,"root":HEX,"size":N}
    2  checkpoint  {"checkpoint":"<C2SP signed note of (O, N, root)>"}
    3  leaves      {"leaves":"<base64 of the N stored leaf hashes, 32 bytes each>"}
    4  keys        {"keys":{"approvers":[...],"signer":{"name":O,"public_key":B64}}}
    5.. K events   each line exactly an event's leaf bytes (``ledger.envelope``)
    .. M blobs     {"data":"<base64>","digest":"<sha256 hex>"}, sorted by digest: every
                   blob the bundle's events reference (their types' ``BLOB_FIELDS``)

Why this shape:

- An event is carried as its leaf bytes, the very bytes that were hashed: it is authentic
  when ``SHA256(0x00 || line) == leaves[position - 1]``; nothing is re-serialised.
- All N leaf hashes are carried (32 bytes an event) even when only one plan's events
  are. Their RFC 9162 root is what the checkpoint signs; the root of the first m of them
  checks any checkpoint of size m <= N that an auditor kept; and a plan's bundle needs
  no per-event proofs.
- A record a line, so a changed byte is reported at the record it hits.
- The blobs are carried, not just named: a blob an event references that the bundle
  lacks (deleted from the database before the export, or cut from the file) is a
  ``blob_missing`` problem at that event's position.

``--plan P`` keeps every stream that belongs to no other plan: the plan's own stream, the
registry, attachments and approvers, and the reviews of P (a stream belongs to the plan
its first event names in ``plan_id``). Streams are kept whole.

Bundles authenticate through the Merkle tree, not the hash chain: a bundle event's
``chain_hash`` is empty. ``Bundle`` reads like a ``Store`` (``LogReader``), so the audit
and replay run on it unchanged; it holds the bundle in memory.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from hashlib import sha256
from typing import Any

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from .canonical import canonical_json, strict_b64decode
from .checkpoints import (
    Checkpoint,
    CheckpointError,
    parse_checkpoint,
    sign_checkpoint,
    verify_checkpoint_signature,
)
from .envelope import leaf_bytes
from .errors import LedgerError
from .events import DEFAULT_CATALOG, Catalog, RecordedEvent
from .merkle import Frontier, leaf_hash, root_of
from .signing import SigningError, public_key_b64, public_key_from_b64
from .store import Store, TreeHead
from .verify import Problem

__all__ = [
    "BUNDLE_FORMAT",
    "Bundle",
    "BundleError",
    "BundleReport",
    "BundleSummary",
    "KeptCheckpoint",
    "load_bundle",
    "verify_bundle",
    "write_bundle",
]

BUNDLE_FORMAT = "evidence-bundle/1"
_HEAD_RECORDS = 4  # header, checkpoint, leaves, keys
_HASH = 32
_HEADER_KEYS = frozenset({"blobs", "events", "format", "origin", "plan", "root", "size"})
_EMPTY_DELTA = b"[]"


class BundleError(LedgerError):
    """A bundle cannot be written or read at all (an unreadable file, an unknown plan)."""


class _PlanRef(msgspec.Struct):
    plan_id: str | None = None


class _Leaf(msgspec.Struct, forbid_unknown_fields=True):
    """An event line: the envelope of ``ledger.envelope``, payload and delta kept raw."""

    actor: str
    causation_id: str | None
    correlation_id: str | None
    delta: msgspec.Raw
    event_id: str
    payload: msgspec.Raw
    position: int
    recorded_at: str
    schema_version: int
    stream: str
    stream_version: int
    type: str


_plan_ref = msgspec.json.Decoder(_PlanRef)
_leaf = msgspec.json.Decoder(_Leaf)
_json = msgspec.json.decode


def _line(record: Any) -> bytes:
    return canonical_json(record) + b"\n"


# A member ``"<name>_sha256": "<64 hex>"`` of a canonical payload: a digest that may name
# a blob. In RFC 8785 bytes a quote inside a string is escaped, so ``_sha256":"`` only
# occurs where a member name ends and its string value begins. Which blobs an event
# references is its type's ``BLOB_FIELDS`` (what export carries and verify requires);
# this looser match only decides whether a carried blob is one no event names, so a
# bundle from an exporter that carried every stored blob any ``*_sha256`` named still
# verifies.
_BLOB_REF = re.compile(rb'_sha256":"([0-9a-f]{64})"')


def _blob_refs(payload: bytes, found: set[str]) -> None:
    found.update(m.decode("ascii") for m in _BLOB_REF.findall(payload))


# ------------------------------------------------------------------------------ write


class BundleSummary(msgspec.Struct, kw_only=True):
    out: str
    origin: str
    plan: str | None
    size: int
    root: str  # hex
    events: int
    blobs: int
    checkpoint: str


def write_bundle(
    store: Store,
    out: str | os.PathLike[str],
    *,
    key: Ed25519PrivateKey,
    origin: str,
    plan: str | None = None,
) -> BundleSummary:
    """Write the bundle of the whole log (or of ``plan``) at one snapshot, signed by
    ``key``; the file appears atomically (a temp file renamed over ``out``)."""
    out = os.fspath(out)
    with store.snapshot() as snap, tempfile.TemporaryFile() as spool:
        size, _, frontier = snap.head_row()
        root = Frontier.from_bytes(size, frontier).root()
        try:
            note = sign_checkpoint(Checkpoint(origin=origin, size=size, root=root), key)
        except CheckpointError as exc:
            raise BundleError(f"origin: {exc}") from None
        leaves = bytearray()
        owners: dict[str, str | None] = {}
        approvers: list[dict[str, Any]] = []
        refs: set[str] = set()
        catalog = store.catalog
        readers = catalog.blob_readers()  # the types whose payloads name blobs
        astuple = msgspec.structs.astuple
        events = 0
        plan_seen = plan is None
        for rows in snap.rows():
            for (position, event_id, stream, stream_version, type_name, schema_version,
                 recorded_at, actor, corr, caus, payload, delta, stored_leaf, _) in rows:
                if position > size:
                    break
                leaves += stored_leaf
                payload = bytes(payload)
                if plan is not None:
                    if stream not in owners:
                        owners[stream] = _plan_ref.decode(payload).plan_id
                    owner = owners[stream]
                    if owner is not None and owner != plan:
                        continue
                    plan_seen = plan_seen or owner == plan
                reader = readers.get(type_name)
                if reader is not None:
                    try:
                        if schema_version == reader[0]:
                            refs.update(astuple(reader[1].decode(payload)))
                        else:  # stored by an older version: upcast first (rare)
                            refs.update(d for _, d in catalog.blob_refs(
                                type_name, schema_version, payload))
                    except (LedgerError, msgspec.DecodeError, msgspec.ValidationError):
                        pass  # unreadable: the bundle's verifier reports this event
                if type_name == "approver_key.added":
                    document = _json(payload)
                    approvers.append({"fingerprint": document["fingerprint"],
                                      "name": document["name"], "position": position,
                                      "public_key": document["public_key"]})
                spool.write(leaf_bytes(position, event_id, stream, stream_version, type_name,
                                       schema_version, recorded_at, actor, corr, caus,
                                       payload, bytes(delta)) + b"\n")
                events += 1
        if not plan_seen:
            raise BundleError(f"unknown plan {plan!r}")
        # Look the stored digests up once rather than each reference. A referenced blob
        # the store lacks is left out: the bundle's verifier reports it (blob_missing).
        stored = {digest for (digest,) in snap.query("SELECT digest FROM blobs")}
        refs.discard(None)  # type: ignore[arg-type]  # a BLOB_FIELDS value may be null
        blobs = [(digest, data) for digest in sorted(refs & stored)
                 if (data := snap.blob(digest)) is not None]
        header = {"blobs": len(blobs), "events": events, "format": BUNDLE_FORMAT,
                  "origin": origin, "plan": plan, "root": root.hex(), "size": size}
        keys = {"approvers": approvers,
                "signer": {"name": origin, "public_key": public_key_b64(key)}}
        directory = os.path.dirname(os.path.abspath(out))
        fd, tmp = tempfile.mkstemp(prefix=".bundle-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_line(header))
                f.write(_line({"checkpoint": note}))
                f.write(_line({"leaves": base64.b64encode(leaves).decode("ascii")}))
                f.write(_line({"keys": keys}))
                spool.seek(0)
                shutil.copyfileobj(spool, f)
                for digest, data in blobs:
                    f.write(_line({"data": base64.b64encode(data).decode("ascii"),
                                   "digest": digest}))
            umask = os.umask(0)  # mkstemp made it 0600; a bundle is for handing over
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, out)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    return BundleSummary(out=out, origin=origin, plan=plan, size=size, root=root.hex(),
                         events=events, blobs=len(blobs), checkpoint=note)


# ----------------------------------------------------------------------------- verify


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


class _Reader:
    """One pass over a bundle's bytes: checks every record, keeps what a ``Bundle``
    needs, and records each problem with the record it is in."""

    def __init__(self, data: bytes, public_key: Ed25519PublicKey | None,
                 catalog: Catalog, max_problems: int) -> None:
        self.problems: list[Problem] = []
        self.max_problems = max_problems
        self.catalog = catalog
        self.given_key = public_key
        self.header: dict[str, Any] | None = None
        self.checkpoint_note: str | None = None
        self.signer: Ed25519PublicKey | None = None
        self.signature_ok = False
        self.leaves: list[bytes] = []
        self.events: list[RecordedEvent] = []
        self.blobs: dict[str, bytes] = {}
        self.wanted: list[tuple[int, str, str, str]] = []  # position, type, field, digest
        self._read(data)

    def problem(self, position: int | None, kind: str, detail: str) -> None:
        if len(self.problems) < self.max_problems:
            self.problems.append(Problem(position, kind, detail))

    # -- records -----------------------------------------------------------------------

    def _record(self, line: bytes, number: int, key: str) -> Any:
        """The value of a one-member record ``{key: value}`` in canonical form."""
        try:
            record = _json(line)
        except msgspec.DecodeError as exc:
            self.problem(None, key, f"line {number} ({key}) is not JSON: {exc}")
            return None
        if not isinstance(record, dict) or set(record) != {key}:
            self.problem(None, key, f"line {number} is not the {key} record")
            return None
        if _line(record)[:-1] != line:
            self.problem(None, key, f"line {number} ({key}) is not in canonical form")
            return None
        return record[key]

    def _read(self, data: bytes) -> None:
        if not data.endswith(b"\n"):
            self.problem(None, "truncated", "the bundle does not end with a newline: "
                         "its last record is cut off")
            data += b"\n"
        lines = data[:-1].split(b"\n")
        if len(lines) < _HEAD_RECORDS:
            self.problem(None, "header", f"a bundle has at least {_HEAD_RECORDS} lines; "
                         f"this one has {len(lines)}")
            return
        header = self._header(lines[0])
        if header is None:
            return
        self.header = header
        expected = _HEAD_RECORDS + header["events"] + header["blobs"]
        if len(lines) != expected:
            self.problem(None, "record_count",
                         f"the header announces {header['events']} events and "
                         f"{header['blobs']} blobs ({expected} lines); the bundle has "
                         f"{len(lines)} lines")
        self._leaves(lines[2])
        approvers = self._keys(lines[3])
        self._checkpoint(lines[1])
        event_lines = lines[_HEAD_RECORDS:_HEAD_RECORDS + header["events"]]
        blob_lines = lines[_HEAD_RECORDS + header["events"]:]
        refs = self._events(event_lines)
        self._blobs(blob_lines, _HEAD_RECORDS + len(event_lines) + 1, refs)
        self._referenced()
        self._approvers(approvers)

    def _header(self, line: bytes) -> dict[str, Any] | None:
        try:
            header = _json(line)
        except msgspec.DecodeError as exc:
            self.problem(None, "header", f"line 1 (header) is not JSON: {exc}")
            return None
        if not isinstance(header, dict) or set(header) != _HEADER_KEYS:
            self.problem(None, "header", "line 1 is not a bundle header (its members are "
                         f"{sorted(header) if isinstance(header, dict) else type(header)})")
            return None
        if header["format"] != BUNDLE_FORMAT:
            self.problem(None, "header", f"unknown bundle format {header['format']!r} "
                         f"(this evidence reads {BUNDLE_FORMAT})")
            return None
        types_ok = (
            all(isinstance(header[k], int) and not isinstance(header[k], bool)
                and header[k] >= 0 for k in ("blobs", "events", "size"))
            and isinstance(header["origin"], str) and isinstance(header["root"], str)
            and (header["plan"] is None or isinstance(header["plan"], str))
        )
        if not types_ok:
            self.problem(None, "header", "a header member has the wrong type")
            return None
        if _line(header)[:-1] != line:
            self.problem(None, "header", "line 1 (header) is not in canonical form")
            return None
        return header

    def _checkpoint(self, line: bytes) -> None:
        note = self._record(line, 2, "checkpoint")
        if not isinstance(note, str):
            if note is not None:
                self.problem(None, "checkpoint", "the checkpoint record is not a string")
            return
        self.checkpoint_note = note
        header = self.header
        assert header is not None
        try:
            checkpoint, _ = parse_checkpoint(note)
        except CheckpointError as exc:
            self.problem(None, "checkpoint", f"malformed checkpoint: {exc}")
            return
        named = (checkpoint.origin, checkpoint.size, checkpoint.root.hex())
        if named != (header["origin"], header["size"], header["root"]):
            self.problem(None, "checkpoint",
                         f"the checkpoint names {checkpoint.origin} {checkpoint.size}:"
                         f"{checkpoint.root.hex()}; the header names {header['origin']} "
                         f"{header['size']}:{header['root']}")
        key = self.given_key or self.signer
        if key is None:
            self.problem(None, "checkpoint_signature",
                         "no public key to check the checkpoint's signature with")
            return
        try:
            verify_checkpoint_signature(note, key)
        except CheckpointError as exc:
            self.problem(None, "checkpoint_signature", str(exc))
            return
        self.signature_ok = True

    def _leaves(self, line: bytes) -> None:
        text = self._record(line, 3, "leaves")
        if text is None:
            return
        header = self.header
        assert header is not None
        raw = strict_b64decode(text) if isinstance(text, str) else None
        if raw is None:
            self.problem(None, "leaves", "the leaves record is not strict base64")
            return
        if len(raw) != _HASH * header["size"]:
            self.problem(None, "leaves", f"the leaves record holds {len(raw)} bytes; a tree "
                         f"of {header['size']} events has {_HASH * header['size']}")
            return
        self.leaves = [raw[i:i + _HASH] for i in range(0, len(raw), _HASH)]
        if root_of(self.leaves).hex() != header["root"]:
            self.problem(None, "leaves", "the leaf hashes do not hash to the root the "
                         "header and checkpoint name: a leaf hash was changed")

    def _keys(self, line: bytes) -> list[Any] | None:
        keys = self._record(line, 4, "keys")
        if keys is None:
            return None
        try:
            approvers = keys["approvers"]
            signer = keys["signer"]
            if not isinstance(approvers, list) or set(keys) != {"approvers", "signer"} \
                    or set(signer) != {"name", "public_key"}:
                raise TypeError
            self.signer = public_key_from_b64(signer["public_key"])
            if signer["name"] != self.header["origin"]:  # type: ignore[index]
                raise TypeError("the signer is not named as the log's origin")
        except (TypeError, KeyError, SigningError) as exc:
            self.problem(None, "keys", f"the keys record is malformed: {exc or 'bad shape'}")
            return None
        if self.given_key is not None and public_key_b64(self.given_key) != \
                signer["public_key"]:
            self.problem(None, "keys", "the bundle's signer key is not the public key given")
        return approvers

    def _events(self, lines: Sequence[bytes]) -> set[str]:
        header = self.header
        assert header is not None
        plan = header["plan"]
        size = header["size"]
        versions: dict[str, int] = {}
        owners: dict[str, str | None] = {}
        refs: set[str] = set()
        wanted = self.wanted
        previous = 0
        decoders = self.catalog
        for number, line in enumerate(lines, start=_HEAD_RECORDS + 1):
            try:
                e = _leaf.decode(line)
            except msgspec.DecodeError as exc:
                self.problem(None, "event_malformed", f"line {number} is not an event: {exc}")
                continue
            position = e.position
            payload, delta = bytes(e.payload), bytes(e.delta)
            if not previous < position <= size:
                self.problem(position, "event_order",
                             f"line {number}: position {position} is not after {previous} "
                             f"and within the tree's 1..{size}")
                continue
            previous = position
            digest = leaf_hash(line)
            # A line that hashes to its signed leaf is the very bytes that were hashed, so
            # canonical; only a line that does not is re-encoded, to say which way it is bad.
            if not self.leaves or digest != self.leaves[position - 1]:
                canonical = leaf_bytes(position, e.event_id, e.stream, e.stream_version,
                                       e.type, e.schema_version, e.recorded_at, e.actor,
                                       e.correlation_id, e.causation_id, payload, delta)
                if canonical != line:
                    self.problem(position, "event_malformed",
                                 f"line {number} is not the canonical form of an event")
                    continue
                if self.leaves:
                    self.problem(position, "event_changed",
                                 f"line {number}: the event at position {position} does not "
                                 "hash to its leaf (its content changed)")
            last = versions.get(e.stream, 0)
            if e.stream_version != last + 1:
                self.problem(position, "stream_version",
                             f"stream {e.stream!r} jumps from version {last} to "
                             f"{e.stream_version}: the bundle must hold whole streams")
            versions[e.stream] = e.stream_version
            if e.stream not in owners:
                owners[e.stream] = _plan_ref.decode(payload).plan_id
            owner = owners[e.stream]
            if plan is not None and owner is not None and owner != plan:
                self.problem(position, "plan",
                             f"stream {e.stream!r} belongs to plan {owner!r}, not to the "
                             f"bundle's plan {plan!r}")
            try:
                decoded = decoders.decode(e.type, e.schema_version, payload)
            except (LedgerError, msgspec.ValidationError, msgspec.DecodeError) as exc:
                self.problem(position, "event_payload", f"line {number}: {exc}")
                continue
            _blob_refs(payload, refs)
            for field in decoded.BLOB_FIELDS:  # decoded.blob_refs(), inline: a hot loop
                blob = getattr(decoded, field)
                if blob is not None:
                    wanted.append((position, e.type, field, blob))
            self.events.append(RecordedEvent(
                position, e.event_id, e.stream, e.stream_version, e.type, e.schema_version,
                e.recorded_at, e.actor, e.correlation_id, e.causation_id, decoded,
                [] if delta == _EMPTY_DELTA else _json(delta), digest, b"",
            ))
        return refs

    def _blobs(self, lines: Sequence[bytes], first_line: int, refs: set[str]) -> None:
        previous = ""
        for number, line in enumerate(lines, start=first_line):
            try:
                record = _json(line)
            except msgspec.DecodeError as exc:
                self.problem(None, "blob", f"line {number} (blob) is not JSON: {exc}")
                continue
            if not isinstance(record, dict) or set(record) != {"data", "digest"} \
                    or not isinstance(record["digest"], str) \
                    or not isinstance(record["data"], str) or _line(record)[:-1] != line:
                self.problem(None, "blob", f"line {number} is not a canonical blob record")
                continue
            digest = record["digest"]
            data = strict_b64decode(record["data"])
            if data is None:
                self.problem(None, "blob", f"line {number}: blob {digest} is not strict base64")
                continue
            if sha256(data).hexdigest() != digest:
                self.problem(None, "blob_changed",
                             f"line {number}: blob {digest} does not hash to its digest")
                continue
            if digest <= previous:
                self.problem(None, "blob", f"line {number}: blob {digest} is out of order")
            previous = digest
            if digest not in refs:
                self.problem(None, "blob", f"line {number}: no event references blob {digest}")
            self.blobs[digest] = data

    def _referenced(self) -> None:
        """Every blob an event references is carried (intact: a changed blob record was
        not kept)."""
        for position, type_name, field, digest in self.wanted:
            if digest not in self.blobs:
                self.problem(position, "blob_missing",
                             f"{type_name} {field} names blob {digest}, which the bundle "
                             "does not carry")

    def _approvers(self, listed: list[Any] | None) -> None:
        if listed is None:
            return
        from_events = [
            {"fingerprint": e.payload.fingerprint, "name": e.payload.name,
             "position": e.position, "public_key": e.payload.public_key}
            for e in self.events if e.type == "approver_key.added"
        ]
        if listed != from_events:
            self.problem(None, "keys", "the approver keys listed differ from the "
                         "approver_key.added events the bundle holds")


def _kept(reader: _Reader, note: str) -> KeptCheckpoint:
    """Check a checkpoint the auditor kept: signed by the same key, and its tree is a
    prefix of the bundle's (the root of the first m leaves is the kept root)."""
    try:
        checkpoint, _ = parse_checkpoint(note)
    except CheckpointError as exc:
        reader.problem(None, "kept_checkpoint", f"malformed kept checkpoint: {exc}")
        return KeptCheckpoint(origin=None, size=None, root=None, signature_ok=False,
                              consistent=None)
    signature_ok = False
    key = reader.given_key or reader.signer
    if key is None:
        reader.problem(None, "kept_checkpoint",
                       "no public key to check the kept checkpoint's signature with")
    else:
        try:
            verify_checkpoint_signature(note, key)
            signature_ok = True
        except CheckpointError as exc:
            reader.problem(None, "kept_checkpoint", f"kept checkpoint: {exc}")
    header = reader.header
    consistent: bool | None = None
    if header is not None and checkpoint.origin != header["origin"]:
        reader.problem(None, "kept_checkpoint", f"the kept checkpoint is of log "
                       f"{checkpoint.origin!r}; the bundle is of {header['origin']!r}")
    elif header is not None and checkpoint.size > header["size"]:
        reader.problem(None, "kept_truncated",
                       f"the kept checkpoint covers {checkpoint.size} events; the bundle's "
                       f"tree has only {header['size']}: the log was truncated")
    elif header is not None and len(reader.leaves) == header["size"]:
        consistent = root_of(reader.leaves[:checkpoint.size]) == checkpoint.root
        if not consistent:
            reader.problem(None, "kept_inconsistent",
                           f"the first {checkpoint.size} leaves do not hash to the kept root "
                           f"{checkpoint.root.hex()}: events at or before position "
                           f"{checkpoint.size} were rewritten since it was signed")
    return KeptCheckpoint(origin=checkpoint.origin, size=checkpoint.size,
                          root=checkpoint.root.hex(), signature_ok=signature_ok,
                          consistent=consistent)


def _report(reader: _Reader, kept: KeptCheckpoint | None) -> BundleReport:
    header = reader.header or {}
    return BundleReport(
        ok=not reader.problems, format=header.get("format"), origin=header.get("origin"),
        plan=header.get("plan"), size=header.get("size"), root=header.get("root"),
        events=len(reader.events), blobs=len(reader.blobs),
        signature_ok=reader.signature_ok,
        key_source="given" if reader.given_key is not None else "bundle",
        kept=kept, problems=reader.problems,
    )


def _read_file(path: str | os.PathLike[str]) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise BundleError(f"cannot read bundle {os.fspath(path)}: {exc.strerror}") from None


def verify_bundle(
    path: str | os.PathLike[str],
    *,
    public_key: Ed25519PublicKey | None = None,
    kept_checkpoint: str | None = None,
    catalog: Catalog = DEFAULT_CATALOG,
    max_problems: int = 100,
) -> BundleReport:
    """Check a bundle from its bytes alone: every record's form, every event against its
    leaf hash, the leaves against the signed checkpoint (by ``public_key``, else by the
    signer key the bundle carries: ``key_source`` says which), blobs against their
    digests, that every blob an event references is carried, and with
    ``kept_checkpoint`` that the bundle's tree extends it."""
    return load_bundle(path, public_key=public_key, kept_checkpoint=kept_checkpoint,
                       catalog=catalog, max_problems=max_problems).report


def load_bundle(
    path: str | os.PathLike[str],
    *,
    public_key: Ed25519PublicKey | None = None,
    kept_checkpoint: str | None = None,
    catalog: Catalog = DEFAULT_CATALOG,
    max_problems: int = 100,
) -> Bundle:
    """Read and verify a bundle; ``Bundle.report`` says whether it can be trusted."""
    reader = _Reader(_read_file(path), public_key, catalog, max_problems)
    kept = _kept(reader, kept_checkpoint) if kept_checkpoint is not None else None
    return Bundle(reader, _report(reader, kept))


# ------------------------------------------------------------------------------- read


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
        return [e for e in self._streams.get(stream, ())
                if e.stream_version >= from_version and (as_of is None or e.position <= as_of)]

    def get_blob(self, digest: str) -> bytes | None:
        return self._blobs.get(digest)
