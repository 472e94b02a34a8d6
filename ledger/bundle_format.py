"""The offline bundle's format: one text file, each line one record, the RFC 8785
canonical JSON of it, in this order::

    1  header      {"blobs":M,"events":K,"format":"evidence-bundle/1","origin":O,
                    "plan":P|null,"root":HEX,"size":N}
    2  checkpoint  {"checkpoint":"<C2SP signed note of (O, N, root)>"}
    3  leaves      {"leaves":"<base64 of the N stored leaf hashes, 32 bytes each>"}
    4  keys        {"keys":{"approvers":[...],"signer":{"name":O,"public_key":B64}}}
    5.. K events   each line exactly an event's leaf bytes (``ledger.envelope``)
    .. M blobs     {"data":"<base64>","digest":"<sha256 hex>"}, sorted by digest: every
                   blob the bundle's events reference (their types' ``BLOB_FIELDS``)

This room holds the records' types and their decoders, which the writer
(``ledger.bundle_write``) and the reader (``ledger.bundle_reader``) share; why the
format has this shape is told in ``ledger.bundle``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .canonical import canonical_json
from .errors import LedgerError

BUNDLE_FORMAT = "evidence-bundle/1"
_HEAD_RECORDS = 4  # header, checkpoint, leaves, keys
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
    # The witness policy (C2SP tlog-policy text) the checkpoint's cosignatures satisfied
    # when the bundle was written: what was claimed, for an auditor to hold to their own.
    policy: str | msgspec.UnsetType = msgspec.UNSET


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
