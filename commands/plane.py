"""The plane's Python API: a store, its read models, and how a command handler appends.

Every handler follows one shape: load the state it needs (a stream document from the
read models), decide (refuse with ``CommandRefused`` or produce payloads), then
``Plane.append``: each event gets its structural delta (RFC 6902, from the stream's
document before it to after it), the events are appended with the stream version the
decision was made on, and the read models are updated in that same transaction. If
another writer got there first, the version check fails and ``Plane.run`` decides again
on the fresh state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ulid import ULID

from ledger import (
    ConcurrencyError,
    EventPayload,
    LedgerError,
    NewEvent,
    RecordedEvent,
    Store,
    StreamAppend,
)
from ledger import open as open_store
from projections import ProjectionEngine, delta, fold, open_projections
from projections.documents import Document, stream_kind

__all__ = ["CommandRefused", "Decision", "Plane", "StreamState"]

RETRIES = 5  # decide again this often when another writer moved the stream meanwhile

# Which read model holds the documents of each stream kind.
_PROJECTION_OF_KIND = {"tool": "tools", "skill": "skills", "attachment": "attachments",
                       "plan": "plans", "approver": "approvers"}


class CommandRefused(LedgerError):
    """Bad input, or a step the current state does not allow. Nothing was appended."""


class StreamState:
    """A stream's current document and version (0 and ``{}`` for a new stream)."""

    __slots__ = ("doc", "stream", "version")

    def __init__(self, stream: str, doc: Document, version: int) -> None:
        self.stream, self.doc, self.version = stream, doc, version

    @property
    def exists(self) -> bool:
        return self.version > 0


Decision = Sequence[EventPayload]


class Plane:
    """An open ledger with its read models. ``Plane.open(url)`` or ``Plane(store)``."""

    def __init__(self, store: Store, projections: ProjectionEngine | None = None) -> None:
        self.store = store
        self.projections = projections or open_projections(store)

    @classmethod
    def open(cls, url: str | None = None, *, create: bool = True) -> Plane:
        store = open_store(url, create=create)
        try:
            return cls(store)
        except BaseException:
            store.close()
            raise

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Plane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state ------------------------------------------------------------------------

    def state(self, stream: str) -> StreamState:
        """The stream's document and version, from its read model when it has one."""
        name = _PROJECTION_OF_KIND.get(stream_kind(stream))
        if name is not None:
            found = self.projections.document(name, stream.partition(":")[2])
            if found is None:
                return StreamState(stream, {}, 0)
            return StreamState(stream, found[0], found[1])
        events = self.store.read_stream(stream)
        doc: Document = {}
        for event in events:
            doc = fold(stream, doc, event.payload)
        return StreamState(stream, doc, events[-1].stream_version if events else 0)

    # -- appending --------------------------------------------------------------------

    def run(
        self,
        stream: str,
        decide: Callable[[StreamState], Decision],
        *,
        actor: str = "system",
        blobs: Iterable[bytes] = (),
        correlation_id: str | None = None,
        caused_by_first: bool = False,
    ) -> list[RecordedEvent]:
        """Load the stream, decide, append; decide again if the stream moved meanwhile."""
        blob_list = list(blobs)
        for attempt in range(RETRIES):
            self.projections.catch_up()
            state = self.state(stream)
            payloads = decide(state)
            if not payloads:
                return []
            try:
                return self.append(state, payloads, actor=actor, blobs=blob_list,
                                   correlation_id=correlation_id,
                                   caused_by_first=caused_by_first)
            except ConcurrencyError:
                if attempt == RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def append(
        self,
        state: StreamState,
        payloads: Decision,
        *,
        actor: str = "system",
        blobs: Iterable[bytes] = (),
        correlation_id: str | None = None,
        caused_by_first: bool = False,
    ) -> list[RecordedEvent]:
        """Append ``payloads`` to ``state.stream`` expecting ``state.version``, each with
        its delta, and update the read models in the same transaction. With
        ``caused_by_first`` the later events name the first as their causation (a gate
        check and the failure and halt it routes to)."""
        doc = state.doc
        events = []
        first_id = str(ULID())
        for i, payload in enumerate(payloads):
            after = fold(state.stream, doc, payload)
            events.append(NewEvent(
                payload=payload, actor=actor, delta=delta(doc, after),
                event_id=first_id if i == 0 else None, correlation_id=correlation_id,
                causation_id=first_id if caused_by_first and i > 0 else None,
            ))
            doc = after
        with self.store.write() as tx:
            recorded = tx.append_batch(
                [StreamAppend(state.stream, events, state.version)], blobs=blobs
            )
            self.projections.apply_inline(tx, recorded)
        return recorded
