"""Checking an offline bundle's records: ``_Reader`` reads each record of the file in
turn (header, checkpoint, leaves, keys, event lines, blobs), holds it to its rules and
keeps what a ``Bundle`` needs; each problem is recorded with the record it is in.

An event is authentic when ``SHA256(0x00 || line) == leaves[position - 1]``: its line is
the very bytes that were hashed, and nothing is re-serialised. The checks of an event
line run in a fixed order, each a method named for what it checks; one that finds a
problem that leaves nothing further to check raises ``_Rejected`` (the problem already
reported) and the next line is read. ``ledger.bundle`` drives a ``_Reader`` over a whole
file, in one pass or in parts.
"""

from __future__ import annotations

from collections.abc import Iterable
from hashlib import sha256
from typing import Any, NoReturn

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .bundle_format import (
    _EMPTY_DELTA,
    _HASH,
    _HEAD_RECORDS,
    _RECORDS,
    BUNDLE_FORMAT,
    _Approver,
    _encode_sorted,
    _json,
    _Leaf,
    _leaf,
    _plan_ref,
)
from .bundle_limits import (
    _BROKEN,
    _HEX64,
    _MAX_DETAIL,
    _PAYLOAD_ERRORS,
    _blob_refs,
    _canonical,
    _is_patch,
    _lines,
    _Malformed,
    _noncanonical,
    _plain,
    _position,
    _show,
    _suspect,
    _unlike_a_store,
    _unsafe_integer,
)
from .canonical import canonical_struct, strict_b64decode
from .checkpoints import CheckpointError, parse_checkpoint, verify_checkpoint_signature
from .events import ApproverKeyAdded, Catalog, RecordedEvent
from .intake import MAX_DEPTH
from .keys import SigningError, public_key_b64, public_key_from_b64
from .merkle import leaf_hash, root_of
from .verify import Problem, Progress

# Event lines one process checks at a time (``verify --bundle --jobs``), and how often
# one pass tells its progress.
_LINES_PER_PART = 1 << 13


class _Rejected(Exception):
    """An event line with a problem (reported) that ends its checks."""


class _Reader:
    """One pass over a bundle's bytes: checks every record, keeps what a ``Bundle``
    needs, and records each problem with the record it is in. ``data`` is read by
    ``ledger.bundle._read``; a reader of a part of the event lines has none."""

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
        self.policy_text: str | None = None  # the policy the bundle says it satisfied
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
        self.progress_every = _LINES_PER_PART  # event lines between progress reports
        # While the event lines are read: the header's plan and tree size, and the
        # position of the last event line that was in order.
        self.plan: str | None = None
        self.size = 0
        self.previous = 0

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

    def _head_records(self, head: list[bytes]) -> list[_Approver] | None:
        """The leaves, keys and checkpoint records, in that order (the checkpoint's
        signature is checked by the key the keys record carries); the approvers the keys
        record lists (None when it is broken)."""
        self._leaves(head[2])
        approvers = self._keys(head[3])
        self._checkpoint(head[1])
        return approvers

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
        self.policy_text = record.policy if isinstance(record.policy, str) else None
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

    # -- event lines -------------------------------------------------------------------

    def _events(self, lines: Iterable[bytes], first_number: int = _HEAD_RECORDS + 1) -> int:
        """Check and keep the event lines; how many lines were read."""
        header = self.header
        assert header is not None
        self.plan, self.size, self.previous = header["plan"], header["size"], 0
        read = 0
        progress, total, every = self.progress, header["events"], self.progress_every
        for number, line in enumerate(lines, start=first_number):
            if self.full:
                break
            read += 1
            if progress is not None and not read % every:
                progress(read, max(read, total))
            try:
                self._event(number, line)
            except _Rejected:
                continue
        return read

    def _reject(self, position: int | None, kind: str, detail: str) -> NoReturn:
        """Report a problem that ends the checks of an event line."""
        self.problem(position, kind, detail)
        raise _Rejected

    def _event(self, number: int, line: bytes) -> None:
        """Check event line ``number`` and keep what it gives; ``_Rejected`` when a
        problem ends its checks."""
        e = self._envelope(number, line)
        position = e.position
        payload, delta = bytes(e.payload), bytes(e.delta)
        self._check_order(number, position)
        digest = self._check_leaf_hash(number, line, position)
        self._check_stream_version(e)
        suspect = _suspect(line)
        if suspect:  # payload and delta node by node (the rare line)
            self._check_payload_within_rules(number, position, payload)
        decoded_delta = (
            [] if delta == _EMPTY_DELTA else self._delta(number, position, delta, suspect)
        )
        self._check_owner(number, position, e.stream, payload)
        decoded = self._payload(number, e, payload)
        self._note_references(position, e.type, decoded, payload)
        self.event_count += 1
        if not self.keep_events:
            return
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

    def _envelope(self, number: int, line: bytes) -> _Leaf:
        """The line decoded as an event's envelope, which must be in canonical form and
        one a ``Store`` appends."""
        try:
            e = _leaf.decode(line)
        except RecursionError:
            self._reject(
                None,
                "event_malformed",
                f"line {number} is not an event: it is nested deeper than {MAX_DEPTH} levels",
            )
        except msgspec.DecodeError as exc:
            self._reject(None, "event_malformed", f"line {number} is not an event: {exc}")
        # The envelope's own members are canonical when msgspec's sorted encoding of
        # it (payload and delta copied as they are) gives the line back: this is
        # ``ledger.envelope.leaf_bytes`` in one C call.
        if _encode_sorted(e) != line:
            self._reject(
                _position(e.position),
                "event_malformed",
                f"line {number} is not the canonical form of an event",
            )
        unlike = _unlike_a_store(e)
        if unlike is not None:
            self._reject(_position(e.position), "event_malformed", f"line {number}: {unlike}")
        return e

    def _check_order(self, number: int, position: int) -> None:
        """The position is after the previous event line's and within the tree."""
        previous, size = self.previous, self.size
        if not previous < position <= size:
            self._reject(
                _position(position),
                "event_order",
                f"line {number}: position {_show(position)} is not after "
                f"{previous} and within the tree's 1..{size}",
            )
        self.previous = position

    def _check_leaf_hash(self, number: int, line: bytes, position: int) -> bytes:
        """The line's leaf hash, which must be the leaves record's at its position (a
        part keeps it for the caller to compare)."""
        digest = leaf_hash(line)
        if self.digests is not None:  # a part: the caller compares them with the leaves
            self.digests.append(digest)
            self.positions.append(position)
        elif self.leaves and digest != self.leaves[position - 1]:
            self.problem(
                position,
                "event_changed",
                f"line {number}: the event at position {position} does not "
                "hash to its leaf (its content changed)",
            )
        return digest

    def _check_stream_version(self, e: _Leaf) -> None:
        """The event's stream version follows the stream's previous one: whole streams
        (a part notes each stream's first version for the caller to check)."""
        versions = self.last_versions
        last = versions.get(e.stream, 0)
        if self.first_seen is not None and e.stream not in versions:
            self.first_seen[e.stream] = (e.position, e.stream_version)  # the caller checks it
        elif e.stream_version != last + 1:
            self.problem(
                e.position,
                "stream_version",
                f"stream {_show(e.stream)} jumps from version {last} to "
                f"{e.stream_version}: the bundle must hold whole streams",
            )
        versions[e.stream] = e.stream_version

    def _check_payload_within_rules(self, number: int, position: int, payload: bytes) -> None:
        try:
            _plain(payload)
        except _Malformed as exc:
            self._reject(position, "event_payload", f"line {number}: its payload {exc}")

    def _delta(self, number: int, position: int, delta: bytes, suspect: bool) -> list[Any]:
        """A delta other than the empty one, decoded: a JSON Patch in canonical form (held
        to the input rules node by node when the line is ``suspect``)."""
        try:
            decoded: list[Any] = _plain(delta) if suspect else _json(delta)
        except _Malformed as exc:
            self._reject(position, "event_malformed", f"line {number}: its delta {exc}")
        except (msgspec.DecodeError, RecursionError) as exc:  # 1e400 is raw JSON
            self._reject(
                position, "event_malformed", f"line {number}: its delta is not JSON: {exc}"
            )
        if not _is_patch(decoded):
            self._reject(
                position,
                "event_malformed",
                f"line {number}: its delta is not a JSON Patch (a list of RFC 6902 operations)",
            )
        if not _canonical(decoded, delta):
            self._reject(
                position, "event_malformed", f"line {number}: its delta is not in canonical form"
            )
        return decoded

    def _check_owner(self, number: int, position: int, stream: str, payload: bytes) -> None:
        """The stream belongs to no plan but the bundle's (by its first event)."""
        owners = self.owners
        if stream not in owners:
            try:
                owners[stream] = _plan_ref.decode(payload).plan_id
            except (msgspec.DecodeError, RecursionError) as exc:
                self._reject(
                    position,
                    "event_payload",
                    f"line {number}: its payload is not an event payload: {exc}",
                )
        owner, plan = owners[stream], self.plan
        if plan is not None and owner is not None and owner != plan:
            self.problem(
                position,
                "plan",
                f"stream {_show(stream)} belongs to plan {_show(owner)}, not "
                f"to the bundle's plan {_show(plan)}",
            )

    def _payload(self, number: int, e: _Leaf, payload: bytes) -> Any:
        """The payload decoded by the catalog (upcast to its type's version), in
        canonical form when stored at that version."""
        position = e.position
        try:
            decoded = self.catalog.decode(e.type, e.schema_version, payload)
        except _PAYLOAD_ERRORS as exc:
            self._reject(position, "event_payload", f"line {number}: {exc}")
        if e.schema_version == type(decoded).SCHEMA_VERSION and not _canonical(
            decoded, payload, canonical_struct
        ):
            self._reject(
                position, "event_malformed", f"line {number}: its payload is not in canonical form"
            )
        return decoded

    def _note_references(self, position: int, type_name: str, decoded: Any, payload: bytes) -> None:
        """The blobs the event references, and the approver key it adds."""
        _blob_refs(payload, self.refs)
        wanted = self.wanted
        for field in decoded.BLOB_FIELDS:  # decoded.blob_refs(), inline: a hot loop
            blob = getattr(decoded, field)
            if blob is not None and blob is not msgspec.UNSET:  # UNSET: absent
                wanted.append((position, type_name, field, blob))
        if isinstance(decoded, ApproverKeyAdded):
            self.approver_keys.append(
                _Approver(
                    fingerprint=decoded.fingerprint,
                    name=decoded.name,
                    position=position,
                    public_key=decoded.public_key,
                )
            )

    # -- blobs and keys ----------------------------------------------------------------

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
