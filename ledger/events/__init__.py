"""The event catalog: every event type the plane records, and how stored payloads of
older schema versions are upcast on read.

A ``Catalog`` maps a type name to its Struct and current schema version and holds the
upcasters. The store writes payloads with the version of the catalog it was opened with
and, on read, upcasts older payloads step by step (v1 -> v2 -> ...) before decoding.
Stored bytes never change; only what is read is upgraded.

It also answers which blobs a stored payload references (each type's ``BLOB_FIELDS``)
without decoding the whole payload: ``blob_refs`` and, for raw scans, ``blob_readers``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Union, cast

import msgspec

from ledger.errors import UnknownEventTypeError

from .base import JSON, EventPayload, NewEvent, RecordedEvent
from .gates import (
    Deviation,
    Exchange,
    GateChecked,
    McpFetched,
    McpInputGiven,
    McpInputRequired,
    ToolCalled,
    Truncation,
)
from .plans import (
    AttemptFailed,
    ChangesRecorded,
    CompensationCompleted,
    CompensationRequested,
    DecisionRecorded,
    Escalated,
    EscalationExpired,
    ExecuteEntered,
    FileChange,
    FixRecorded,
    GlobalConfig,
    PlanApplied,
    PlanCreated,
    PlanHalted,
    SkillPin,
    StrategyRecorded,
    StrategyRevisionRequested,
    TokenConsumed,
    TokenMinted,
)
from .registry import (
    ApprovalPolicySet,
    ApproverKeyAdded,
    ApproverKeyRevoked,
    AttachmentCreated,
    AttachmentDetached,
    CredentialIssued,
    CredentialRevoked,
    LedgerIdentified,
    NetworkAccess,
    PolicySignature,
    SignedPlace,
    SkillDefined,
    ToolRegistered,
    ValidationRegistered,
)
from .reviews import (
    Finding,
    ReviewAccounted,
    ReviewAccountingRejected,
    ReviewCandidateSubmitted,
    ReviewFailed,
    ReviewHandedOut,
    ReviewHostScheduled,
    ReviewHostStarted,
    ReviewReportCommitted,
    ReviewRoleRan,
    ReviewStarted,
)
from .validation import (
    ResolvedAttachment,
    ValidationResultRecorded,
    ValidationRunCompleted,
    ValidationRunStarted,
)

ALL_EVENT_TYPES: tuple[type[EventPayload], ...] = (
    ToolRegistered,
    ValidationRegistered,
    SkillDefined,
    AttachmentCreated,
    AttachmentDetached,
    ApproverKeyAdded,
    ApproverKeyRevoked,
    CredentialIssued,
    CredentialRevoked,
    ApprovalPolicySet,
    LedgerIdentified,
    PlanCreated,
    StrategyRecorded,
    ExecuteEntered,
    GateChecked,
    ToolCalled,
    McpFetched,
    McpInputRequired,
    McpInputGiven,
    AttemptFailed,
    ValidationRunStarted,
    ValidationResultRecorded,
    ValidationRunCompleted,
    FixRecorded,
    StrategyRevisionRequested,
    Escalated,
    DecisionRecorded,
    EscalationExpired,
    TokenMinted,
    TokenConsumed,
    ChangesRecorded,
    PlanApplied,
    PlanHalted,
    CompensationRequested,
    CompensationCompleted,
    ReviewStarted,
    ReviewCandidateSubmitted,
    ReviewAccountingRejected,
    ReviewAccounted,
    ReviewReportCommitted,
    ReviewFailed,
    ReviewHostScheduled,
    ReviewHostStarted,
    ReviewRoleRan,
    ReviewHandedOut,
)

# The tagged union: ``msgspec.json.decode(payload_bytes, type=AnyEvent)`` picks the Struct
# from the payload's own "type" field.
AnyEvent = Union[ALL_EVENT_TYPES]  # type: ignore[valid-type]  # noqa: UP007

Upcaster = Callable[[dict[str, JSON]], dict[str, JSON]]
# (current schema version, decoder of just the BLOB_FIELDS, BLOB_FIELDS): a plain tuple,
# indexed in the hot loops of verify and export.
BlobReader = tuple[int, "msgspec.json.Decoder[Any]", tuple[str, ...]]


class BlobRefs(msgspec.Struct, kw_only=True, gc=False):
    """Only the ``BLOB_FIELDS`` of a payload (one subclass a type, made by the catalog):
    decoding a stored payload into it skips every other member, so a scan of raw rows
    reads the references for a fraction of a full decode."""

    BLOB_FIELDS: ClassVar[tuple[str, ...]] = ()

    blob_refs = EventPayload.blob_refs


def _blob_refs_struct(cls: type[EventPayload]) -> type[BlobRefs]:
    # defstruct is typed as returning a Struct class; with bases=(BlobRefs,) it makes a
    # BlobRefs subclass, which the stub cannot express.
    return cast(
        "type[BlobRefs]",
        msgspec.defstruct(
            f"{cls.__name__}BlobRefs",
            [(field, Union[str, None], None) for field in cls.BLOB_FIELDS],  # noqa: UP007
            bases=(BlobRefs,),
            namespace={"BLOB_FIELDS": cls.BLOB_FIELDS},
            kw_only=True,
        ),
    )


class Catalog:
    """Event types by name, their current schema versions, and the upcasters between."""

    def __init__(self, types: Iterable[type[EventPayload]] = ALL_EVENT_TYPES) -> None:
        self._types: dict[str, type[EventPayload]] = {}
        self._decoders: dict[str, msgspec.json.Decoder[Any]] = {}
        self._blob_decoders: dict[str, msgspec.json.Decoder[Any]] = {}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        for cls in types:
            self.add(cls)

    def add(self, cls: type[EventPayload]) -> None:
        name = cls.type_name()
        if name in self._types and self._types[name] is not cls:
            raise ValueError(f"event type {name!r} is defined twice")
        unknown = [f for f in cls.BLOB_FIELDS if f not in cls.__struct_fields__]
        if unknown:
            raise ValueError(f"{name}: BLOB_FIELDS names no field {unknown}")
        self._types[name] = cls
        self._decoders[name] = msgspec.json.Decoder(cls)
        if cls.BLOB_FIELDS:
            self._blob_decoders[name] = msgspec.json.Decoder(_blob_refs_struct(cls))
        else:
            self._blob_decoders.pop(name, None)

    def upcaster(self, type_name: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
        """Register ``fn(payload_dict) -> payload_dict`` taking ``from_version`` to +1."""

        def register(fn: Upcaster) -> Upcaster:
            self._upcasters[(type_name, from_version)] = fn
            return fn

        return register

    def __contains__(self, type_name: str) -> bool:
        return type_name in self._types

    def __iter__(self):
        return iter(self._types.values())

    def type_for(self, type_name: str) -> type[EventPayload]:
        try:
            return self._types[type_name]
        except KeyError:
            raise UnknownEventTypeError(
                f"unknown event type {type_name!r}: the log was written by a newer or "
                "different evidence-ledger"
            ) from None

    def version_of(self, type_name: str) -> int:
        return self.type_for(type_name).SCHEMA_VERSION

    def current_decoders(self) -> dict[tuple[str, int], msgspec.json.Decoder[Any]]:
        """(type, current schema version) -> decoder: the read path's fast lookup."""
        return {
            (name, cls.SCHEMA_VERSION): self._decoders[name] for name, cls in self._types.items()
        }

    def blob_readers(self) -> dict[str, BlobReader]:
        """type name -> ``(current schema version, decoder, BLOB_FIELDS)`` for each type
        whose payloads reference blobs. The decoder reads just those fields of a payload
        of the current version into a ``BlobRefs`` (``msgspec.structs.astuple`` gives
        their values in ``BLOB_FIELDS`` order, None for no reference). A raw scan looks
        each row's ``type`` up here and skips every other row; a payload of an older
        version goes through ``blob_refs`` (it may need upcasting)."""
        return {
            name: (self._types[name].SCHEMA_VERSION, decoder, self._types[name].BLOB_FIELDS)
            for name, decoder in self._blob_decoders.items()
        }

    def blob_refs(
        self, type_name: str, schema_version: int, payload: bytes
    ) -> list[tuple[str, str]]:
        """``(field, digest)`` of every blob a stored payload references (``[]`` for a
        type with no ``BLOB_FIELDS``, or one this catalog does not know). Raises as
        ``decode`` does when the payload cannot be read."""
        decoder = self._blob_decoders.get(type_name)
        if decoder is None:
            return []
        if schema_version == self._types[type_name].SCHEMA_VERSION:
            return decoder.decode(payload).blob_refs()
        return self.decode(type_name, schema_version, payload).blob_refs()

    def decode(self, type_name: str, schema_version: int, payload: bytes) -> EventPayload:
        """Decode stored payload bytes, upcasting them first if they are older."""
        cls = self.type_for(type_name)
        if schema_version == cls.SCHEMA_VERSION:
            return self._decoders[type_name].decode(payload)
        if schema_version > cls.SCHEMA_VERSION:
            raise UnknownEventTypeError(
                f"event type {type_name!r} version {schema_version} is newer than this "
                f"evidence-ledger knows ({cls.SCHEMA_VERSION})"
            )
        document = msgspec.json.decode(payload)
        for version in range(schema_version, cls.SCHEMA_VERSION):
            step = self._upcasters.get((type_name, version))
            if step is None:
                raise UnknownEventTypeError(
                    f"no upcaster for {type_name!r} from version {version} to {version + 1}"
                )
            document = step(document)
        document["type"] = type_name
        return msgspec.convert(document, cls)


DEFAULT_CATALOG = Catalog()

__all__ = [
    "ALL_EVENT_TYPES",
    "DEFAULT_CATALOG",
    "AnyEvent",
    "ApprovalPolicySet",
    "ApproverKeyAdded",
    "ApproverKeyRevoked",
    "AttachmentCreated",
    "AttachmentDetached",
    "AttemptFailed",
    "BlobReader",
    "BlobRefs",
    "Catalog",
    "ChangesRecorded",
    "CompensationCompleted",
    "CompensationRequested",
    "CredentialIssued",
    "CredentialRevoked",
    "DecisionRecorded",
    "Deviation",
    "Escalated",
    "EscalationExpired",
    "EventPayload",
    "Exchange",
    "ExecuteEntered",
    "FileChange",
    "Finding",
    "FixRecorded",
    "GateChecked",
    "GlobalConfig",
    "LedgerIdentified",
    "McpFetched",
    "McpInputGiven",
    "McpInputRequired",
    "NetworkAccess",
    "NewEvent",
    "PlanApplied",
    "PlanCreated",
    "PlanHalted",
    "PolicySignature",
    "RecordedEvent",
    "ResolvedAttachment",
    "ReviewAccounted",
    "ReviewAccountingRejected",
    "ReviewCandidateSubmitted",
    "ReviewFailed",
    "ReviewHandedOut",
    "ReviewHostScheduled",
    "ReviewHostStarted",
    "ReviewReportCommitted",
    "ReviewRoleRan",
    "ReviewStarted",
    "SignedPlace",
    "SkillDefined",
    "SkillPin",
    "StrategyRecorded",
    "StrategyRevisionRequested",
    "TokenConsumed",
    "TokenMinted",
    "ToolCalled",
    "ToolRegistered",
    "Truncation",
    "UnknownEventTypeError",
    "ValidationRegistered",
    "ValidationResultRecorded",
    "ValidationRunCompleted",
    "ValidationRunStarted",
]
