"""What an append asks, and its events made rows outside the lock.

``StreamAppend`` is one stream's events and the version it is expected at (``Expect``);
``RowEncoder.prepare`` validates and encodes them before the ledger lock is taken: event
id, payload and delta bytes, and each event's leaf bytes but for its position and stream
version, which only the lock can give (``ledger.write_tx``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

import msgspec

from .canonical import CanonicalizationError, canonical_json, struct_encoder
from .envelope import LEAF_HEAD, json_string, leaf_middle, leaf_tail
from .errors import DuplicateEventError, InvalidEventError
from .events import Catalog, NewEvent
from .ids import is_ulid, new_ulids
from .timestamps import utc_now

__all__ = [
    "ANY",
    "EMPTY_DELTA",
    "NO_STREAM",
    "Expect",
    "ExpectedVersion",
    "Prepared",
    "RowEncoder",
    "StreamAppend",
]

EMPTY_DELTA = b"[]"  # the stored delta of an event that has none
# A payload class's type name, schema version, encoder, checking decoder and leaf tail.
_PayloadType = tuple[str, int, Callable[[Any], bytes], Callable[[bytes], Any], bytes]
# One event prepared: event id, type name, schema version, recorded at, actor,
# correlation and causation ids, payload and delta bytes, and its leaf head, middle and
# tail (``ledger.envelope``): the leaf bytes but for position and stream version.
Prepared = tuple[Any, ...]


class Expect(enum.Enum):
    """Expected-version sentinels. An ``int`` N expects the stream to be at version N."""

    ANY = "any"
    NO_STREAM = "no_stream"


ANY = Expect.ANY
NO_STREAM = Expect.NO_STREAM
ExpectedVersion = Expect | int


class StreamAppend(NamedTuple):
    stream: str
    events: Sequence[NewEvent]
    expected_version: ExpectedVersion = ANY


def _check_ulid(value: str, what: str) -> None:
    if not is_ulid(value):
        raise InvalidEventError(f"{what} {value!r} is not a ULID (26 Crockford base32 chars)")


class RowEncoder:
    """Makes appends' events the rows they are stored as, for one catalog."""

    def __init__(self, catalog: Catalog, decoders: dict[tuple[str, int], Any]) -> None:
        self.catalog = catalog
        self._decoders = decoders  # (type name, schema version) -> the current decoder
        # payload class -> (type name, schema version, checking decode, leaf tail)
        self._payload_types: dict[type, _PayloadType] = {}

    def prepare(self, appends: Sequence[StreamAppend]) -> list[list[Prepared]]:
        """Validate and encode outside the lock: event id, payload and delta bytes, and
        the event's leaf bytes but for position and stream version (``leaf_parts``).

        Kept whole: it runs once per event appended, and its checks are one pass over
        the events with the lookups bound to locals; a helper per check would cost a
        call per event (``bench/append.py`` measures it)."""
        recorded_at = utc_now()
        payload_type = self._payload_types.get
        seen: set[str] = set()
        refs: set[str] = set()  # correlation/causation ids already checked in this call
        # The ids the store makes, all at once (ULIDs by construction: not checked).
        missing = sum(not new.event_id for _s, events, _e in appends for new in events)
        fresh = iter(new_ulids(missing))
        # The JSON forms of the actors and reference ids of this call (the same for most
        # of its events), for the leaf head.
        json_of: dict[str | None, bytes] = {None: b"null"}
        prepared = []
        for stream, events, _expected in appends:
            if not stream or len(stream) > 512 or not stream.isprintable():
                raise InvalidEventError(f"invalid stream name {stream!r}")
            middles: dict[int, bytes] = {}  # schema version -> leaf middle, for this stream
            rows = []
            for new in events:
                payload = new.payload
                known = payload_type(type(payload)) or self._payload_type(type(payload))
                type_name, sv, encode, decode, tail = known
                event_id = new.event_id
                if not event_id:  # None (or empty): the store makes one
                    event_id = next(fresh)
                else:
                    _check_ulid(event_id, "event id")
                if event_id in seen:
                    raise DuplicateEventError([event_id])
                seen.add(event_id)
                corr, caus = new.correlation_id, new.causation_id
                if corr is not None and corr not in refs:
                    _check_ulid(corr, "correlation id")
                    refs.add(corr)
                if caus is not None and caus not in refs:
                    _check_ulid(caus, "causation id")
                    refs.add(caus)
                actor = new.actor
                if not actor:
                    raise InvalidEventError("an event needs an actor")
                try:
                    payload_bytes = encode(payload)  # canonical_struct
                    # What is stored must read back: this also type-checks the payload,
                    # which msgspec does not do when a Struct is constructed.
                    decode(payload_bytes)
                    delta_bytes = (
                        canonical_json(new.delta, safe_numbers=True) if new.delta else EMPTY_DELTA
                    )
                except (CanonicalizationError, msgspec.ValidationError) as exc:
                    raise InvalidEventError(f"{type_name}: {exc}") from None
                middle = middles.get(sv)
                if middle is None:
                    middle = middles[sv] = leaf_middle(recorded_at, sv, stream)
                rows.append(
                    (
                        event_id,
                        type_name,
                        sv,
                        recorded_at,
                        actor,
                        corr,
                        caus,
                        payload_bytes,
                        delta_bytes,
                        LEAF_HEAD  # leaf_head, with the JSON forms at hand
                        % (
                            json_of.get(actor) or json_of.setdefault(actor, json_string(actor)),
                            json_of.get(caus) or json_of.setdefault(caus, json_string(caus)),
                            json_of.get(corr) or json_of.setdefault(corr, json_string(corr)),
                            delta_bytes,
                            json_string(event_id),
                            payload_bytes,
                        ),
                        middle,
                        tail,
                    )
                )
            prepared.append(rows)
        return prepared

    def _payload_type(self, cls: type) -> _PayloadType:
        """What appending a payload of class ``cls`` needs of it: its type name (in the
        catalog, or refused), schema version, its canonical encoder, the decode that
        checks its bytes read back (as ``Catalog.decode`` would), and its leaf tail.
        Cached per class: a type name names one class in a catalog for good
        (``Catalog.add``)."""
        type_name = cls.type_name()  # type: ignore[attr-defined]
        if type_name not in self.catalog:
            raise InvalidEventError(f"event type {type_name!r} is not in the catalog")
        sv = cls.SCHEMA_VERSION  # type: ignore[attr-defined]
        decoder = self._decoders.get((type_name, sv))
        decode: Callable[[bytes], Any] = (
            decoder.decode
            if decoder is not None
            else partial(self.catalog.decode, type_name, sv)  # a type added since, say
        )
        known = (type_name, sv, struct_encoder(cls), decode, leaf_tail(type_name))
        self._payload_types[cls] = known
        return known
