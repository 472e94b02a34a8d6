"""The event envelope and the base every event payload type derives from.

Payloads are plain msgspec Structs in one tagged union (the tag field is ``type``), so a
payload's stored JSON names its own type and decodes without the envelope. Each type
carries, as class data, its ``SCHEMA_VERSION``, the template of the ``STREAM`` it is
appended to, ``DELTA``: in words, what its structural delta changes in that stream's
state document, and ``BLOB_FIELDS``: the payload fields whose value, when not None, is
the SHA-256 hex digest of a blob the plane stored with the event (docs/events.md is
generated from these). A ``*_sha256`` field not listed there names no blob (a token's,
a request's or arguments' digest, say).
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

__all__ = ["EventPayload", "NewEvent", "RecordedEvent"]

JSON = Any  # any JSON value: dict, list, str, int, float, bool or None


class EventPayload(
    msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, tag_field="type"
):
    """Base of every event payload. Subclasses set ``tag`` to their dotted type name."""

    SCHEMA_VERSION: ClassVar[int] = 1
    STREAM: ClassVar[str] = ""
    DELTA: ClassVar[str] = ""
    # Fields holding the digest of a blob stored with the event (None or absent: no
    # blob). verify
    # reports a referenced blob that is missing; bundles carry exactly these blobs.
    BLOB_FIELDS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def type_name(cls) -> str:
        return cls.__struct_config__.tag  # type: ignore[return-value]

    def blob_refs(self) -> list[tuple[str, str]]:
        """``(field, digest)`` of every blob this event references: its ``BLOB_FIELDS``
        that are not None, in declaration order."""
        return [
            (field, digest)
            for field in self.BLOB_FIELDS
            if (digest := getattr(self, field)) is not None and digest is not msgspec.UNSET
        ]

    def default_stream(self) -> str:
        """The stream this event belongs to, filled from the payload's own fields."""
        return self.STREAM.format(**{f: getattr(self, f) for f in self.__struct_fields__})


class NewEvent(msgspec.Struct, kw_only=True, frozen=True):
    """An event to append. The store assigns position, versions, time and hashes."""

    payload: EventPayload
    actor: str = "system"
    delta: list[JSON] = msgspec.field(default_factory=list)
    event_id: str | None = None  # a ULID; generated when absent
    correlation_id: str | None = None
    causation_id: str | None = None


class RecordedEvent(msgspec.Struct, frozen=True):
    """An event as read back from the log, its payload upcast to the current version.

    Fields are in the order of the ``events`` columns, so the store builds it
    positionally (the read path's hot spot)."""

    position: int
    event_id: str
    stream: str
    stream_version: int
    type: str
    schema_version: int  # the version the stored bytes were written with
    recorded_at: str
    actor: str
    correlation_id: str | None
    causation_id: str | None
    payload: EventPayload
    delta: list[JSON]
    leaf_hash: bytes
    chain_hash: bytes

    def to_json(self) -> dict[str, JSON]:
        """The documented JSON shape (docs/cli.md): hashes in hex, payload as an object."""
        return {
            "position": self.position,
            "event_id": self.event_id,
            "stream": self.stream,
            "stream_version": self.stream_version,
            "type": self.type,
            "schema_version": self.schema_version,
            "recorded_at": self.recorded_at,
            "actor": self.actor,
            "correlation_id": self.correlation_id,
            "causation_id": self.causation_id,
            "payload": msgspec.to_builtins(self.payload),
            "delta": self.delta,
            "leaf_hash": self.leaf_hash.hex(),
            "chain_hash": self.chain_hash.hex(),
        }
