"""The hashed form of an event: the RFC 8785 canonical JSON of its envelope.

A third party recomputes it from a row with nothing but RFC 8785: the object below,
members in canonical order, with ``payload`` and ``delta`` embedded as the JSON values
whose canonical bytes are stored. Then

    leaf_hash[i]  = SHA256(0x00 || leaf_bytes[i])          (RFC 9162 leaf)
    chain_hash[i] = SHA256(chain_hash[i-1] || leaf_hash[i]),  chain_hash[0] = 32 zero bytes

The stored payload and delta are already canonical, so the envelope is assembled by
concatenation rather than re-serialised (tests check it equals a full RFC 8785 encode).
"""

from __future__ import annotations

from hashlib import sha256

import msgspec

GENESIS_CHAIN = bytes(32)

json_string = msgspec.json.encode  # str -> JSON string (RFC 8785 escaping), None -> null

LEAF_TEMPLATE = (
    b'{"actor":%b,"causation_id":%b,"correlation_id":%b,"delta":%b,"event_id":%b,'
    b'"payload":%b,"position":%d,"recorded_at":%b,"schema_version":%d,"stream":%b,'
    b'"stream_version":%d,"type":%b}'
)


def leaf_bytes(
    position: int,
    event_id: str,
    stream: str,
    stream_version: int,
    type_name: str,
    schema_version: int,
    recorded_at: str,
    actor: str,
    correlation_id: str | None,
    causation_id: str | None,
    payload: bytes,
    delta: bytes,
) -> bytes:
    return LEAF_TEMPLATE % (
        json_string(actor),
        json_string(causation_id),
        json_string(correlation_id),
        delta,
        json_string(event_id),
        payload,
        position,
        json_string(recorded_at),
        schema_version,
        json_string(stream),
        stream_version,
        json_string(type_name),
    )


# ``LEAF_TEMPLATE`` cut around the two members only known under the ledger lock,
# ``position`` and ``stream_version``: the rest of an event's leaf bytes is made before
# the lock is taken (``leaf_parts``), and under it three parts and two integers are
# joined (``LEAF_JOIN``). tests/ledger/test_envelope.py checks the join equals ``leaf_bytes``.
_before_position, _, _after_position = LEAF_TEMPLATE.partition(b'"position":%d')
_before_version, _, _LEAF_TAIL = _after_position.partition(b'"stream_version":%d')
LEAF_HEAD = _before_position + b'"position":'
_LEAF_MIDDLE = _before_version + b'"stream_version":'
LEAF_JOIN = b"%b%d%b%d%b"  # head, position, middle, stream_version, tail


def leaf_parts(
    event_id: str,
    stream: str,
    type_name: str,
    schema_version: int,
    recorded_at: str,
    actor: str,
    correlation_id: str | None,
    causation_id: str | None,
    payload: bytes,
    delta: bytes,
) -> tuple[bytes, bytes, bytes]:
    """``leaf_bytes`` but for position and stream version: ``(head, middle, tail)``, so
    that ``LEAF_JOIN % (head, position, middle, stream_version, tail)`` is it."""
    return (
        leaf_head(actor, causation_id, correlation_id, delta, event_id, payload),
        leaf_middle(recorded_at, schema_version, stream),
        leaf_tail(type_name),
    )


def leaf_head(
    actor: str,
    causation_id: str | None,
    correlation_id: str | None,
    delta: bytes,
    event_id: str,
    payload: bytes,
) -> bytes:
    """The part before position (its members in canonical order, as the arguments)."""
    return LEAF_HEAD % (
        json_string(actor),
        json_string(causation_id),
        json_string(correlation_id),
        delta,
        json_string(event_id),
        payload,
    )


def leaf_middle(recorded_at: str, schema_version: int, stream: str) -> bytes:
    """The part between position and stream version (shared by the events of one
    append to one stream with one schema version)."""
    return _LEAF_MIDDLE % (json_string(recorded_at), schema_version, json_string(stream))


def leaf_tail(type_name: str) -> bytes:
    return _LEAF_TAIL % json_string(type_name)


def chain_next(previous: bytes, leaf: bytes) -> bytes:
    return sha256(previous + leaf).digest()
