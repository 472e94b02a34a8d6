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

A bundle is a file anyone may have written, so it is read defensively. The file is read
through ``ledger.intake`` (at most the bundle cap, ``EVIDENCE_MAX_BUNDLE_BYTES``; an
unreadable or over-cap file is an ``InputError``, a refused command). Every record is
then held to the intake rules (nested at most ``MAX_DEPTH`` deep, finite numbers,
integers within +-(2^53 - 1)) and to its canonical form, every count and position to its
type and range, every event's delta to the shape of a JSON Patch; whatever breaks a rule
is a problem named with its line, never an exception. A header that cannot be read
stops the reading (nothing after it can be placed); any other record is reported and
the reading goes on, until ``max_problems`` problems: then it stops, so a file of a
million bad lines costs no more than a hundred.
"""

from __future__ import annotations

import base64
import itertools
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from hashlib import sha256
from typing import Any

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from .canonical import (
    CanonicalizationError,
    canonical_json,
    canonical_struct,
    strict_b64decode,
)
from .checkpoints import (
    Checkpoint,
    CheckpointError,
    parse_checkpoint,
    sign_checkpoint,
    verify_checkpoint_signature,
)
from .envelope import leaf_bytes
from .errors import LedgerError
from .events import DEFAULT_CATALOG, ApproverKeyAdded, Catalog, RecordedEvent
from .intake import MAX_DEPTH, MAX_SAFE_INTEGER, InputError, check_json_value, read_bytes
from .keys import SigningError, public_key_b64, public_key_from_b64
from .merkle import Frontier, leaf_hash, root_of
from .store import Store, TreeHead
from .verify import Problem, Progress, process_context

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
# Event lines one process checks at a time (``verify --bundle --jobs``).
_LINES_PER_PART = 1 << 13
_HASH = 32
_EMPTY_DELTA = b"[]"


class BundleError(LedgerError):
    """A bundle cannot be written (an unknown plan, an origin that cannot sign). A file
    that cannot be read at all is an ``ledger.intake.InputError``."""


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


# The other records, typed: decoding one stops at the first member of the wrong type, so
# a hostile record is never built into a large or deep Python value first.


class _Header(msgspec.Struct, forbid_unknown_fields=True):
    blobs: int
    events: int
    format: str
    origin: str
    plan: str | None
    root: str
    size: int


class _CheckpointRecord(msgspec.Struct, forbid_unknown_fields=True):
    checkpoint: str


class _LeavesRecord(msgspec.Struct, forbid_unknown_fields=True):
    leaves: str


class _Approver(msgspec.Struct, forbid_unknown_fields=True):
    fingerprint: str
    name: str
    position: int
    public_key: str


class _Signer(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    public_key: str


class _Keys(msgspec.Struct, forbid_unknown_fields=True):
    approvers: list[_Approver]
    signer: _Signer


class _KeysRecord(msgspec.Struct, forbid_unknown_fields=True):
    keys: _Keys


class _BlobRecord(msgspec.Struct, forbid_unknown_fields=True):
    data: str
    digest: str


_plan_ref = msgspec.json.Decoder(_PlanRef)
_leaf = msgspec.json.Decoder(_Leaf)
_RECORDS: dict[str, msgspec.json.Decoder[Any]] = {
    "header": msgspec.json.Decoder(_Header),
    "checkpoint": msgspec.json.Decoder(_CheckpointRecord),
    "leaves": msgspec.json.Decoder(_LeavesRecord),
    "keys": msgspec.json.Decoder(_KeysRecord),
    "blob": msgspec.json.Decoder(_BlobRecord),
}
_json = msgspec.json.decode
# msgspec's sorted encoding: the RFC 8785 bytes of a value with no floats (see
# ``ledger.canonical``); a cheap first check that a decoded record is in canonical form.
_encode_sorted = msgspec.json.Encoder(order="sorted").encode


def _line(record: Any) -> bytes:
    return canonical_json(record) + b"\n"


# -- reading hostile bytes ---------------------------------------------------------------

_SHOWN = 80  # the longest value from a bundle quoted in a problem
_MAX_DETAIL = 400  # the longest problem detail
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ULID = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")  # as ledger.store checks ids
_MAX_STREAM = 512
# An event line with at most MAX_DEPTH brackets cannot nest deeper, and one with no run
# of 16 digits holds no integer beyond 10^15 < 2^53: the usual line is cleared by two
# scans in C; only the rest has its payload and delta checked node by node.
_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 16
# RFC 6902: what each operation needs besides "op" and "path".
_PATCH_OPS: dict[str, str | None] = {
    "add": "value",
    "remove": None,
    "replace": "value",
    "move": "from",
    "copy": "from",
    "test": "value",
}
# What decoding an event's payload with the catalog may raise on hostile bytes: msgspec's
# errors, and what an upcaster meets in a document of the wrong shape.
_PAYLOAD_ERRORS = (
    LedgerError,
    msgspec.MsgspecError,
    RecursionError,
    TypeError,
    ValueError,
    KeyError,
    IndexError,
    AttributeError,
)


def _show(value: Any) -> str:
    """``repr`` of a value read from a bundle, clipped: a problem never quotes a
    megabyte."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


_BROKEN: Any = object()  # a record that could not be read (its problem reported)


class _Malformed(Exception):
    """A record that breaks the input rules; its message completes "line N (record) ..."."""


def _plain(data: bytes) -> Any:
    """``data`` as a plain JSON value within the rules of ``ledger.intake``: no exception
    but ``_Malformed`` escapes, however deep, long or odd the bytes are."""
    if not data.strip():
        raise _Malformed("is empty")
    try:
        value = _json(data)
    except RecursionError:  # msgspec gave up near the interpreter's recursion limit
        raise _Malformed(f"is nested deeper than {MAX_DEPTH} levels") from None
    except msgspec.DecodeError as exc:  # ValidationError too: a number out of range
        raise _Malformed(f"is not JSON: {exc}") from None
    try:
        check_json_value(value, "")
    except InputError as exc:
        pointer = exc.pointer if len(exc.pointer) <= 60 else exc.pointer[:57] + "..."
        where = f" at {pointer}" if pointer else ""
        raise _Malformed(f"breaks the input rules{where}: {exc.detail}") from None
    return value


def _position(position: int) -> int | None:
    """A position as a problem names it: none for one no log has (0, negative, beyond
    2^53 - 1, where a JSON reader would round it); the detail still shows it."""
    return position if 0 < position <= MAX_SAFE_INTEGER else None


def _unlike_a_store(e: _Leaf) -> str | None:
    """What in an event's envelope no ``Store`` appends (``Store._prepare_rows``): a
    stream name that is empty, longer than 512 or not printable, an id that is not a
    ULID, an empty actor."""
    stream = e.stream
    if not stream or len(stream) > _MAX_STREAM or not stream.isprintable():
        return (
            f"stream {_show(stream)} is not a stream name (1 to {_MAX_STREAM} printable characters)"
        )
    for value, what in (
        (e.event_id, "event id"),
        (e.correlation_id, "correlation id"),
        (e.causation_id, "causation id"),
    ):
        if value is not None and _ULID.fullmatch(value) is None:
            return f"{what} {_show(value)} is not a ULID"
    if not e.actor:
        return "its actor is empty"
    return None


def _suspect(line: bytes) -> bool:
    """Whether an event line might nest deeper than the rules allow, or hold an integer
    beyond them (see ``_DIGITS``)."""
    return line.count(b"[") + line.count(b"{") > MAX_DEPTH or _LONG_NUMBER in line.translate(
        _DIGITS
    )


def _is_patch(delta: Any) -> bool:
    """Whether ``delta`` has the shape of an RFC 6902 JSON Patch."""
    if type(delta) is not list:
        return False
    for op in delta:
        if type(op) is not dict or type(op.get("path")) is not str:
            return False
        name = op.get("op")
        if type(name) is not str or name not in _PATCH_OPS:
            return False
        needs = _PATCH_OPS[name]
        if needs == "from" and type(op.get("from")) is not str:
            return False
        if needs == "value" and "value" not in op:
            return False
    return True


def _canonical(value: Any, data: bytes, encode: Any = canonical_json) -> bool:
    """Whether ``data`` is the RFC 8785 form of ``value`` (read from it)."""
    if _encode_sorted(value) == data:  # no floats: the one C call is the answer
        return True
    try:
        return encode(value) == data
    except (CanonicalizationError, RecursionError):
        return False


def _noncanonical(line: bytes) -> str:
    cr = (
        " (it ends in a carriage return: a bundle's lines end in \\n alone)"
        if line.endswith(b"\r")
        else ""
    )
    return f"is not in canonical form{cr}"


def _unsafe_integer(record: msgspec.Struct) -> str | None:
    """The first integer member of a typed record beyond +-(2^53 - 1) (msgspec reads
    any size into an ``int``), described; None when there is none."""
    for name in record.__struct_fields__:
        value = getattr(record, name)
        if type(value) is int and not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return f"breaks the input rules at /{name}: integer outside ±(2^53 - 1)"
        if isinstance(value, msgspec.Struct):
            inner = _unsafe_integer(value)
            if inner is not None:
                return inner.replace(" at /", f" at /{name}/", 1)
        if type(value) is list:
            for i, item in enumerate(value):
                inner = _unsafe_integer(item) if isinstance(item, msgspec.Struct) else None
                if inner is not None:
                    return inner.replace(" at /", f" at /{name}/{i}/", 1)
    return None


def _lines(data: bytes, start: int = 0) -> Iterator[bytes]:
    """The lines of ``data`` from offset ``start``, one at a time (the last one even with
    no newline after it): a file of a billion newlines is not a list of a billion
    lines."""
    end = len(data)
    find = data.find
    while start < end:
        stop = find(b"\n", start)
        if stop < 0:
            yield data[start:]
            return
        yield data[start:stop]
        start = stop + 1


def _line_ends(data: bytes, start: int, count: int, step: int) -> list[int]:
    """Where (at its newline) every ``step``-th of ``count`` lines from ``start`` ends,
    and the last one: the parts ``verify --bundle --jobs`` checks apart. ``data`` has
    at least ``count`` lines from ``start``."""
    ends = []
    find = data.find
    at = start - 1
    for i in range(1, count + 1):
        at = find(b"\n", at + 1)
        if at < 0:  # the last line, with no newline after it
            at = len(data)
        if i % step == 0 or i == count:
            ends.append(at)
    return ends


# The bundle's bytes, as forked processes checking parts of it inherit them (set only
# while they run).
_INHERITED: bytes | None = None


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
        refs: set[str | None] = set()  # None: a BLOB_FIELDS value that is null
        catalog = store.catalog
        readers = catalog.blob_readers()  # the types whose payloads name blobs
        astuple = msgspec.structs.astuple
        events = 0
        plan_seen = plan is None
        for rows in snap.rows():
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
                            refs.update(
                                d for _, d in catalog.blob_refs(type_name, schema_version, payload)
                            )
                    except (LedgerError, msgspec.DecodeError, msgspec.ValidationError):
                        pass  # unreadable: the bundle's verifier reports this event
                if type_name == "approver_key.added":
                    document = _json(payload)
                    approvers.append(
                        {
                            "fingerprint": document["fingerprint"],
                            "name": document["name"],
                            "position": position,
                            "public_key": document["public_key"],
                        }
                    )
                spool.write(
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
                events += 1
        if not plan_seen:
            raise BundleError(f"unknown plan {plan!r}")
        # Look the stored digests up once rather than each reference. A referenced blob
        # the store lacks is left out: the bundle's verifier reports it (blob_missing).
        # (A null reference, None, is never a stored digest.)
        stored = {digest for (digest,) in snap.query("SELECT digest FROM blobs")}
        blobs = [
            (digest, data)
            for digest in sorted(stored & refs)
            if (data := snap.blob(digest)) is not None
        ]
        header = {
            "blobs": len(blobs),
            "events": events,
            "format": BUNDLE_FORMAT,
            "origin": origin,
            "plan": plan,
            "root": root.hex(),
            "size": size,
        }
        keys = {
            "approvers": approvers,
            "signer": {"name": origin, "public_key": public_key_b64(key)},
        }
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
                    f.write(
                        _line({"data": base64.b64encode(data).decode("ascii"), "digest": digest})
                    )
            umask = os.umask(0)  # mkstemp made it 0600; a bundle is for handing over
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, out)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    return BundleSummary(
        out=out,
        origin=origin,
        plan=plan,
        size=size,
        root=root.hex(),
        events=events,
        blobs=len(blobs),
        checkpoint=note,
    )


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

    def __init__(
        self,
        data: bytes | None,
        public_key: Ed25519PublicKey | None,
        catalog: Catalog,
        max_problems: int,
        *,
        keep_events: bool = True,
        jobs: int = 1,
        progress: Progress | None = None,
    ) -> None:
        self.problems: list[Problem] = []
        self.max_problems = max(1, max_problems)
        self.catalog = catalog
        self.given_key = public_key
        self.header: dict[str, Any] | None = None
        self.checkpoint_note: str | None = None
        self.signer: Ed25519PublicKey | None = None
        self.signature_ok = False
        self.leaves: list[bytes] = []
        self.events: list[RecordedEvent] = []  # only with keep_events
        self.event_count = 0  # event lines that passed every check
        self.approver_keys: list[_Approver] = []  # from the approver_key.added events
        self.blobs: dict[str, bytes] = {}
        self.wanted: list[tuple[int, str, str, str]] = []  # position, type, field, digest
        self.refs: set[str] = set()  # every digest a payload names (see _BLOB_REF)
        self.keep_events, self.jobs, self.progress = keep_events, jobs, progress
        self.data = data
        self.event_range = (0, 0)  # the event lines' bytes (when checked in parts)
        self.wanted_digests: set[str] | None = None  # ``wanted``'s digests (in parts)
        # A part of the event lines checked in its own process (``_check_event_part``):
        # each stream's first event there (position, version), and the leaf hashes in
        # line order, which the caller checks against the leaves record.
        self.first_seen: dict[str, tuple[int, int]] | None = None
        self.digests: list[bytes] | None = None
        self.positions: list[int] = []
        self.owners: dict[str, str | None] = {}
        self.last_versions: dict[str, int] = {}
        if data is not None:
            self._read(data)

    def problem(self, position: int | None, kind: str, detail: str) -> None:
        if len(self.problems) < self.max_problems:
            if len(detail) > _MAX_DETAIL:
                detail = detail[: _MAX_DETAIL - 3] + "..."
            self.problems.append(Problem(position, kind, detail))

    @property
    def full(self) -> bool:
        """As many problems as are reported: reading on would only spend time."""
        return len(self.problems) >= self.max_problems

    # -- records -----------------------------------------------------------------------

    def _record(self, line: bytes, number: int, key: str) -> Any:
        """Line ``number``, the record ``key``, decoded into its type and in canonical
        form; else ``_BROKEN``, its problem reported (of kind ``key``)."""
        try:
            if not line.strip():
                raise _Malformed("is empty")
            try:
                record = _RECORDS[key].decode(line)
            except RecursionError:  # not reached by a record of these types; kept safe
                raise _Malformed(f"is nested deeper than {MAX_DEPTH} levels") from None
            except msgspec.ValidationError as exc:
                raise _Malformed(f"is not the {key} record: {exc}") from None
            except msgspec.DecodeError as exc:
                raise _Malformed(f"is not JSON: {exc}") from None
            unsafe = _unsafe_integer(record)
            if unsafe is not None:
                raise _Malformed(unsafe)
            if _encode_sorted(record) != line:
                raise _Malformed(_noncanonical(line))
        except _Malformed as exc:
            self.problem(None, key, f"line {number} ({key}) {exc}")
            return _BROKEN
        return record

    def _read(self, data: bytes) -> None:
        if not data:
            self.problem(None, "header", "the bundle is empty (0 bytes)")
            return
        complete = data.endswith(b"\n")
        if not complete:
            self.problem(
                None,
                "truncated",
                "the bundle does not end with a newline: its last record is cut off",
            )
        count = data.count(b"\n") + (0 if complete else 1)
        lines = _lines(data)
        head = list(itertools.islice(lines, _HEAD_RECORDS))
        if len(head) < _HEAD_RECORDS:
            self.problem(
                None,
                "header",
                f"a bundle has at least {_HEAD_RECORDS} lines; this one has {len(head)}",
            )
            return
        header = self._header(head[0])
        if header is None:
            return
        self.header = header
        events, blobs = header["events"], header["blobs"]
        expected = _HEAD_RECORDS + events + blobs
        if count != expected:
            self.problem(
                None,
                "record_count",
                f"the header announces {events} events and {blobs} blobs "
                f"({expected} lines); the bundle has {count} lines",
            )
        if events > header["size"]:
            self.problem(
                None,
                "record_count",
                f"the header announces {events} events in a tree of "
                f"{header['size']}: a bundle holds each event once",
            )
        elif header["plan"] is None and events != header["size"]:
            # The header is not signed: a plan's bundle relabelled as the whole log's
            # would otherwise pass with the other plans' events silently missing.
            self.problem(
                None,
                "record_count",
                f"the header announces {events} events of a tree of "
                f"{header['size']} and no plan: a bundle of the whole log holds "
                "every event",
            )
        parts_apart = self.jobs > 1 and events > _LINES_PER_PART and count == expected
        if parts_apart and self.catalog is DEFAULT_CATALOG:
            begin = sum(len(line) + 1 for line in head)  # the first event line's offset
            ends = _line_ends(data, begin, events, _LINES_PER_PART)
            starts = [begin, *(end + 1 for end in ends[:-1])]
            read = events
            self.event_range = (begin, ends[-1])
            context = process_context()
            global _INHERITED
            # Forked processes read the bytes they inherit; others are sent their part.
            _INHERITED = data if context.get_start_method() == "fork" else None
            tasks = [
                (header, _HEAD_RECORDS + 1 + i * _LINES_PER_PART, first, last)
                if _INHERITED is not None
                else (header, _HEAD_RECORDS + 1 + i * _LINES_PER_PART, data[first:last], None)
                for i, (first, last) in enumerate(zip(starts, ends, strict=True))
            ]
            try:
                with ProcessPoolExecutor(self.jobs, mp_context=context) as pool:
                    parts = pool.map(_check_event_part, tasks)
                    # While the parts run: the leaves, their root, the keys, the signature.
                    self._leaves(head[2])
                    approvers = self._keys(head[3])
                    self._checkpoint(head[1])
                    joined = self._join(parts, read)
                    if not joined:
                        pool.shutdown(wait=False, cancel_futures=True)
            finally:
                _INHERITED = None
            if not joined:
                # Something is wrong somewhere: one pass names every problem exactly.
                self._events(itertools.islice(_lines(data, begin), events))
            lines = _lines(data, self.event_range[1] + 1)
        else:
            self._leaves(head[2])
            approvers = self._keys(head[3])
            self._checkpoint(head[1])
            read = self._events(itertools.islice(lines, events))
        if self.full:
            return
        self._blobs(lines, _HEAD_RECORDS + read + 1)
        self._referenced()
        self._approvers(approvers)

    def _header(self, line: bytes) -> dict[str, Any] | None:
        record = self._record(line, 1, "header")
        if record is _BROKEN:
            return None
        header = msgspec.structs.asdict(record)
        if header["format"] != BUNDLE_FORMAT:
            self.problem(
                None,
                "header",
                "line 1 (header): unknown bundle format "
                f"{_show(header['format'])} (this evidence reads {BUNDLE_FORMAT})",
            )
            return None
        wrong = [k for k in ("blobs", "events", "size") if header[k] < 0]
        if wrong:
            self.problem(
                None,
                "header",
                f"line 1 (header): {wrong[0]} {header[wrong[0]]} "
                "is not a count (a whole number from 0 to 2^53 - 1)",
            )
            return None
        if _HEX64.fullmatch(header["root"]) is None:
            self.problem(
                None,
                "header",
                f"line 1 (header): root {_show(header['root'])} is not 64 lowercase hex digits",
            )
            return None
        return header

    def _checkpoint(self, line: bytes) -> None:
        record = self._record(line, 2, "checkpoint")
        if record is _BROKEN:
            return
        note = record.checkpoint
        self.checkpoint_note = note
        header = self.header
        assert header is not None
        try:
            checkpoint, _ = parse_checkpoint(note)
        except CheckpointError as exc:
            self.problem(None, "checkpoint", f"line 2 (checkpoint) is malformed: {exc}")
            return
        named = (checkpoint.origin, checkpoint.size, checkpoint.root.hex())
        if named != (header["origin"], header["size"], header["root"]):
            self.problem(
                None,
                "checkpoint",
                f"line 2: the checkpoint names {_show(checkpoint.origin)} "
                f"{checkpoint.size}:{checkpoint.root.hex()}; the header names "
                f"{_show(header['origin'])} {header['size']}:{header['root']}",
            )
        key = self.given_key or self.signer
        if key is None:
            self.problem(
                None,
                "checkpoint_signature",
                "no public key to check the checkpoint's signature with",
            )
            return
        try:
            verify_checkpoint_signature(note, key)
        except CheckpointError as exc:
            self.problem(None, "checkpoint_signature", str(exc))
            return
        self.signature_ok = True

    def _leaves(self, line: bytes) -> None:
        record = self._record(line, 3, "leaves")
        if record is _BROKEN:
            return
        header = self.header
        assert header is not None
        raw = strict_b64decode(record.leaves)
        if raw is None:
            self.problem(None, "leaves", "line 3 (leaves) is not strict base64")
            return
        if len(raw) != _HASH * header["size"]:
            shape = "" if len(raw) % _HASH == 0 else f" (not a whole number of {_HASH}-byte hashes)"
            self.problem(
                None,
                "leaves",
                f"line 3 (leaves) holds {len(raw)} bytes{shape}; "
                f"a tree of {header['size']} events has {_HASH * header['size']}",
            )
            return
        self.leaves = [raw[i : i + _HASH] for i in range(0, len(raw), _HASH)]
        if root_of(self.leaves).hex() != header["root"]:
            self.problem(
                None,
                "leaves",
                "line 3 (leaves): the leaf hashes do not hash to "
                "the root the header and checkpoint name: a leaf hash was changed",
            )

    def _keys(self, line: bytes) -> list[_Approver] | None:
        record = self._record(line, 4, "keys")
        if record is _BROKEN:
            return None
        header = self.header
        assert header is not None
        signer = record.keys.signer
        try:
            self.signer = public_key_from_b64(signer.public_key)
        except SigningError as exc:
            self.problem(None, "keys", f"line 4 (keys) is malformed: {exc}")
            return None
        if signer.name != header["origin"]:
            self.problem(
                None,
                "keys",
                "line 4 (keys) is malformed: the signer is not named as the log's origin",
            )
            return None
        if self.given_key is not None and public_key_b64(self.given_key) != signer.public_key:
            self.problem(
                None, "keys", "line 4 (keys): the bundle's signer key is not the public key given"
            )
        return record.keys.approvers

    def _events(self, lines: Iterable[bytes], first_number: int = _HEAD_RECORDS + 1) -> int:
        """Check and keep the event lines; how many lines were read."""
        header = self.header
        assert header is not None
        plan = header["plan"]
        size = header["size"]
        versions = self.last_versions
        owners = self.owners
        first_seen, digests, positions = self.first_seen, self.digests, self.positions
        refs = self.refs
        wanted = self.wanted
        previous = 0
        decoders = self.catalog
        read = 0
        progress, total = self.progress, header["events"]
        for number, line in enumerate(lines, start=first_number):
            if self.full:
                break
            read += 1
            if progress is not None and not read % _LINES_PER_PART:
                progress(read, max(read, total))
            try:
                e = _leaf.decode(line)
            except RecursionError:
                self.problem(
                    None,
                    "event_malformed",
                    f"line {number} is not an event: it is nested deeper than {MAX_DEPTH} levels",
                )
                continue
            except msgspec.DecodeError as exc:
                self.problem(None, "event_malformed", f"line {number} is not an event: {exc}")
                continue
            # The envelope's own members are canonical when msgspec's sorted encoding of
            # it (payload and delta copied as they are) gives the line back: this is
            # ``ledger.envelope.leaf_bytes`` in one C call.
            if _encode_sorted(e) != line:
                self.problem(
                    _position(e.position),
                    "event_malformed",
                    f"line {number} is not the canonical form of an event",
                )
                continue
            position = e.position
            payload, delta = bytes(e.payload), bytes(e.delta)
            unlike = _unlike_a_store(e)
            if unlike is not None:
                self.problem(_position(position), "event_malformed", f"line {number}: {unlike}")
                continue
            if not previous < position <= size:
                self.problem(
                    _position(position),
                    "event_order",
                    f"line {number}: position {_show(position)} is not after "
                    f"{previous} and within the tree's 1..{size}",
                )
                continue
            previous = position
            digest = leaf_hash(line)
            if digests is not None:  # a part: the caller compares them with the leaves
                digests.append(digest)
                positions.append(position)
            elif self.leaves and digest != self.leaves[position - 1]:
                self.problem(
                    position,
                    "event_changed",
                    f"line {number}: the event at position {position} does not "
                    "hash to its leaf (its content changed)",
                )
            last = versions.get(e.stream, 0)
            if first_seen is not None and e.stream not in versions:
                first_seen[e.stream] = (position, e.stream_version)  # the caller checks it
            elif e.stream_version != last + 1:
                self.problem(
                    position,
                    "stream_version",
                    f"stream {_show(e.stream)} jumps from version {last} to "
                    f"{e.stream_version}: the bundle must hold whole streams",
                )
            versions[e.stream] = e.stream_version
            suspect = _suspect(line)
            if suspect:  # payload and delta node by node (the rare line)
                try:
                    _plain(payload)
                except _Malformed as exc:
                    self.problem(position, "event_payload", f"line {number}: its payload {exc}")
                    continue
            if delta == _EMPTY_DELTA:
                decoded_delta: list[Any] = []
            else:
                try:
                    decoded_delta = _plain(delta) if suspect else _json(delta)
                except _Malformed as exc:
                    self.problem(position, "event_malformed", f"line {number}: its delta {exc}")
                    continue
                except (msgspec.DecodeError, RecursionError) as exc:  # 1e400 is raw JSON
                    self.problem(
                        position, "event_malformed", f"line {number}: its delta is not JSON: {exc}"
                    )
                    continue
                if not _is_patch(decoded_delta):
                    self.problem(
                        position,
                        "event_malformed",
                        f"line {number}: its delta is "
                        "not a JSON Patch (a list of RFC 6902 operations)",
                    )
                    continue
                if not _canonical(decoded_delta, delta):
                    self.problem(
                        position,
                        "event_malformed",
                        f"line {number}: its delta is not in canonical form",
                    )
                    continue
            if e.stream not in owners:
                try:
                    owners[e.stream] = _plan_ref.decode(payload).plan_id
                except (msgspec.DecodeError, RecursionError) as exc:
                    self.problem(
                        position,
                        "event_payload",
                        f"line {number}: its payload is not an event payload: {exc}",
                    )
                    continue
            owner = owners[e.stream]
            if plan is not None and owner is not None and owner != plan:
                self.problem(
                    position,
                    "plan",
                    f"stream {_show(e.stream)} belongs to plan {_show(owner)}, not "
                    f"to the bundle's plan {_show(plan)}",
                )
            try:
                decoded = decoders.decode(e.type, e.schema_version, payload)
            except _PAYLOAD_ERRORS as exc:
                self.problem(position, "event_payload", f"line {number}: {exc}")
                continue
            if e.schema_version == type(decoded).SCHEMA_VERSION and not _canonical(
                decoded, payload, canonical_struct
            ):
                self.problem(
                    position,
                    "event_malformed",
                    f"line {number}: its payload is not in canonical form",
                )
                continue
            _blob_refs(payload, refs)
            for field in decoded.BLOB_FIELDS:  # decoded.blob_refs(), inline: a hot loop
                blob = getattr(decoded, field)
                if blob is not None and blob is not msgspec.UNSET:  # UNSET: absent
                    wanted.append((position, e.type, field, blob))
            if isinstance(decoded, ApproverKeyAdded):
                self.approver_keys.append(
                    _Approver(
                        fingerprint=decoded.fingerprint,
                        name=decoded.name,
                        position=position,
                        public_key=decoded.public_key,
                    )
                )
            self.event_count += 1
            if not self.keep_events:
                continue
            self.events.append(
                RecordedEvent(
                    position,
                    e.event_id,
                    e.stream,
                    e.stream_version,
                    e.type,
                    e.schema_version,
                    e.recorded_at,
                    e.actor,
                    e.correlation_id,
                    e.causation_id,
                    decoded,
                    decoded_delta,
                    digest,
                    b"",
                )
            )
        return read

    def _join(self, results: Iterable[_EventPart], lines: int) -> bool:
        """Join the parts of the event lines checked apart (``_check_event_part``), in
        order; True when every part is clean and they join — positions in order, whole
        streams, every leaf hash the leaves record's — and only then are this reader's
        totals set. False as soon as anything is off: the caller reads the lines again
        in one pass, which finds and words the problems exactly as always."""
        parts: list[_EventPart] = []
        for part in results:
            if not part.clean:
                return False
            parts.append(part)
            if self.progress is not None:
                self.progress(sum(p.count for p in parts), lines)
        previous = 0
        versions: dict[str, int] = {}
        # No owner is joined: a part judges a plan's bundle by the owner of its own
        # first event of a stream. Were the stream's first event another plan's, the
        # part holding it reported that; so with every part clean, no event is any
        # other plan's, by either reading.
        for part in parts:
            if part.positions and part.positions[0] <= previous:
                return False
            previous = part.positions[-1] if part.positions else previous
            for stream, (_, version) in part.first_seen.items():
                if version != versions.get(stream, 0) + 1:
                    return False
            versions.update(part.versions)
            if self.leaves and part.digests != b"".join(self.leaves[p - 1] for p in part.positions):
                return False
        self.wanted_digests = set()
        for part in parts:
            self.event_count += part.count
            self.wanted_digests.update(part.wanted)
            self.refs.update(part.refs)
            self.approver_keys.extend(part.approver_keys)
        return True

    def _blobs(self, lines: Iterable[bytes], first_line: int) -> None:
        previous = ""
        refs = self.refs
        for number, line in enumerate(lines, start=first_line):
            if self.full:
                break
            record = self._record(line, number, "blob")
            if record is _BROKEN:
                continue
            digest = record.digest
            data = strict_b64decode(record.data)
            if data is None:
                self.problem(
                    None, "blob", f"line {number}: blob {_show(digest)} is not strict base64"
                )
                continue
            if sha256(data).hexdigest() != digest:
                self.problem(
                    None,
                    "blob_changed",
                    f"line {number}: blob {_show(digest)} does not hash to its digest",
                )
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
        if self.wanted_digests is not None:  # the events were checked in parts
            if self.wanted_digests <= self.blobs.keys():
                return
            # A blob missing: every reference again, with the event that makes it.
            assert self.header is not None and self.data is not None
            again = _Reader(None, None, self.catalog, self.max_problems, keep_events=False)
            again.header = self.header
            begin, end = self.event_range
            again._events(_lines(self.data[begin:end]))
            self.wanted = again.wanted
        for position, type_name, field, digest in self.wanted:
            if digest not in self.blobs:
                self.problem(
                    position,
                    "blob_missing",
                    f"{type_name} {field} names blob {digest}, which the bundle does not carry",
                )

    def _approvers(self, listed: list[_Approver] | None) -> None:
        if listed is None:
            return
        if listed != self.approver_keys:
            self.problem(
                None,
                "keys",
                "the approver keys listed differ from the "
                "approver_key.added events the bundle holds",
            )


class _EventPart(msgspec.Struct, kw_only=True):
    """What one process found in its part of a bundle's event lines (all of it only
    when ``clean``: a part stops at its first problem)."""

    clean: bool
    count: int
    positions: list[int]
    digests: bytes  # the leaf hashes, in line order
    first_seen: dict[str, tuple[int, int]]
    versions: dict[str, int]
    wanted: set[str]  # the digests of the blobs the events reference
    refs: set[str]
    approver_keys: list[_Approver]


def _check_event_part(task: tuple[dict[str, Any], int, Any, int | None]) -> _EventPart:
    """One process's part of the event lines (starting at line ``first_number``): its
    bytes, or (forked) where they are in the bytes it inherited."""
    header, first_number, first, last = task
    data = first if last is None else _INHERITED[first:last]  # type: ignore[index]
    reader = _Reader(None, None, DEFAULT_CATALOG, 1, keep_events=False)
    reader.header, reader.first_seen, reader.digests = header, {}, []
    reader._events(_lines(data), first_number)
    return _EventPart(
        clean=not reader.problems,
        count=reader.event_count,
        positions=reader.positions,
        digests=b"".join(reader.digests),
        first_seen=reader.first_seen,
        versions=reader.last_versions,
        wanted={digest for *_, digest in reader.wanted},
        refs=reader.refs,
        approver_keys=reader.approver_keys,
    )


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
    )


def verify_bundle(
    path: str | os.PathLike[str],
    *,
    public_key: Ed25519PublicKey | None = None,
    kept_checkpoint: str | None = None,
    catalog: Catalog = DEFAULT_CATALOG,
    max_problems: int = 100,
    jobs: int = 1,
    progress: Progress | None = None,
) -> BundleReport:
    """Check a bundle from its bytes alone: every record's form, every event against its
    leaf hash, the leaves against the signed checkpoint (by ``public_key``, else by the
    signer key the bundle carries: ``key_source`` says which), blobs against their
    digests, that every blob an event references is carried, and with
    ``kept_checkpoint`` that the bundle's tree extends it.

    ``jobs`` > 1 checks the event lines of a large bundle in parts, in that many
    processes (``progress`` is told the lines checked and the total as parts finish);
    a bundle with any problem is read again in one pass, so the report is always the
    one pass's. Unlike ``load_bundle`` it keeps no events."""
    data = read_bytes(path, "bundle", f"bundle {os.fspath(path)}")
    reader = _Reader(
        data,
        public_key,
        catalog,
        max_problems,
        keep_events=False,
        jobs=jobs,
        progress=progress,
    )
    kept = _kept(reader, kept_checkpoint) if kept_checkpoint is not None else None
    return _report(reader, kept)


def load_bundle(
    path: str | os.PathLike[str],
    *,
    public_key: Ed25519PublicKey | None = None,
    kept_checkpoint: str | None = None,
    catalog: Catalog = DEFAULT_CATALOG,
    max_problems: int = 100,
) -> Bundle:
    """Read and verify a bundle; ``Bundle.report`` says whether it can be trusted. The
    file is read through ``ledger.intake`` (the bundle cap): one that cannot be read, or
    is larger than the cap, raises ``InputError``; anything in it is a problem."""
    data = read_bytes(path, "bundle", f"bundle {os.fspath(path)}")
    reader = _Reader(data, public_key, catalog, max_problems)
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
        return [
            e
            for e in self._streams.get(stream, ())
            if e.stream_version >= from_version and (as_of is None or e.position <= as_of)
        ]

    def get_blob(self, digest: str) -> bytes | None:
        return self._blobs.get(digest)
