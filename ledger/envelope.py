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


def chain_next(previous: bytes, leaf: bytes) -> bytes:
    return sha256(previous + leaf).digest()
