"""The hashed bytes are the RFC 8785 form of the envelope: a third party with the RFC
and the stored row recomputes them exactly."""

from __future__ import annotations

import hashlib
import json

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.canonical import canonical_json
from ledger.envelope import GENESIS_CHAIN, LEAF_JOIN, chain_next, leaf_bytes, leaf_parts

texts = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)
ulids = st.text("0123456789ABCDEFGHJKMNPQRSTVWXYZ", min_size=25, max_size=25).map(lambda s: "0" + s)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53 - 1), 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(texts, c, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    position=st.integers(1, 2**40),
    event_id=ulids,
    stream=texts,
    stream_version=st.integers(1, 2**40),
    type_name=texts,
    schema_version=st.integers(1, 50),
    actor=texts,
    correlation_id=st.none() | ulids,
    causation_id=st.none() | ulids,
    payload=st.dictionaries(texts, json_values, max_size=5),
    delta=st.lists(json_values, max_size=3),
)
def test_leaf_bytes_are_the_rfc8785_envelope(
    position,
    event_id,
    stream,
    stream_version,
    type_name,
    schema_version,
    actor,
    correlation_id,
    causation_id,
    payload,
    delta,
) -> None:
    recorded_at = "2026-11-29T20:07:13.123456Z"
    built = leaf_bytes(
        position,
        event_id,
        stream,
        stream_version,
        type_name,
        schema_version,
        recorded_at,
        actor,
        correlation_id,
        causation_id,
        canonical_json(payload),
        canonical_json(delta),
    )
    envelope = {
        "position": position,
        "event_id": event_id,
        "stream": stream,
        "stream_version": stream_version,
        "type": type_name,
        "schema_version": schema_version,
        "recorded_at": recorded_at,
        "actor": actor,
        "correlation_id": correlation_id,
        "causation_id": causation_id,
        "payload": payload,
        "delta": delta,
    }
    assert built == rfc8785.dumps(envelope)
    assert json.loads(built) == json.loads(rfc8785.dumps(envelope))
    # The store makes the same bytes from parts made before the lock (see leaf_parts).
    head, middle, tail = leaf_parts(
        event_id,
        stream,
        type_name,
        schema_version,
        recorded_at,
        actor,
        correlation_id,
        causation_id,
        canonical_json(payload),
        canonical_json(delta),
    )
    assert LEAF_JOIN % (head, position, middle, stream_version, tail) == built


def test_chain_is_sha256_of_previous_and_leaf() -> None:
    leaf = hashlib.sha256(b"\x00" + b"{}").digest()
    assert chain_next(GENESIS_CHAIN, leaf) == hashlib.sha256(bytes(32) + leaf).digest()
