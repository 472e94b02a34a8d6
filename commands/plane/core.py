"""The plane's Python API: a store, its read models, and how a command handler appends.

Every handler follows one shape, ``Plane.run(stream, decide)``: inside one write
transaction holding the ledger lock, the stream is folded **from the events table**
(``commands.plane.authority``: a plan's history is checked as it is folded), ``decide``
refuses with ``CommandRefused`` or returns payloads, each payload is checked against
the stream's transition rules, gets its structural delta (RFC 6902, from the stream's
document before it to after it), and is appended with the read models updated in that
same transaction. Read models are query caches: no decision reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from ulid import ULID

from commands.errors import CommandRefused
from commands.rules.signing import (
    SigningError,
    endorse_key,
    load_or_create_operator_key,
    load_or_create_plane_key,
    operator_key_path,
    operator_name,
    policy_record,
    sign_record,
)
from commands.rules.trust import needs_operator
from commands.runner.sandbox import PlanSandbox, sandboxes_dir
from ledger import (
    ConcurrencyError,
    EventPayload,
    LedgerError,
    NewEvent,
    RecordedEvent,
    Store,
    StreamAppend,
    WriteTx,
)
from ledger import open as open_store
from ledger.events import PolicySignature
from ledger.keys import fingerprint, public_key_b64
from ledger.tails import StreamTails
from projections import ProjectionEngine, delta, fold, open_projections
from projections.engine import Progress
from projections.plan_rules import broken_rule
from projections.states import PlanState

from .authority import Authority, Checked, EventSource, StoreSource, StreamState
from .policy import PolicyCache

__all__ = ["CommandRefused", "Committer", "Decision", "Job", "Plane", "StreamState"]

Decision = Sequence[EventPayload]


@dataclass(frozen=True)
class Job:
    """One ``Plane.run``: a stream, its decision and what the append carries."""

    stream: str
    decide: Callable[[StreamState], Decision]
    actor: str = "system"
    blobs: Iterable[bytes] | Callable[[], Iterable[bytes]] = ()
    correlation_id: str | None = None
    caused_by: int | None = None


class Committer(Protocol):
    """Who appends for a plane that batches (the service's group commit)."""

    def submit(self, job: Job) -> list[RecordedEvent]: ...


RETRIES = 5  # optimistic callers of ``append`` decide again this often on a conflict


class Plane:
    """An open ledger with its read models. ``Plane.open(url)`` or ``Plane(store)``."""

    def __init__(
        self,
        store: Store,
        projections: ProjectionEngine | None = None,
        *,
        workdir: Path | None = None,
        progress: Progress | None = None,
        inline_read_models: bool = True,
    ) -> None:
        """``progress(done, total)`` is told how opening the read models goes (a
        changed one rebuilt, the others caught up): the CLI draws a bar with it.

        ``inline_read_models=False`` leaves the read models to whoever catches them up
        (the service's follower thread): an append then holds the ledger lock for the
        decision and the append only, and a query may see the read models a moment
        behind the log. No decision reads them either way."""
        self.store = store
        self.inline_read_models = inline_read_models
        self.committer: Committer | None = None
        self.sandboxes = sandboxes_dir(store.url, workdir)  # where plans' sandboxes live
        self.projections = projections or open_projections(
            store, progress, catch_up=inline_read_models
        )
        self._checked: Checked = {}  # plan prefixes already checked (events never change)
        # The streams' ends as this plane's transactions left them (``ledger.tails``): a
        # fold under the lock reads what the plane appended last from memory.
        self._tails = StreamTails()
        self._plane_public: Ed25519PublicKey | None = None
        # Trusted policy folded once and read on by position (``commands.plane.policy``).
        self._policy = PolicyCache(self.plane_public_key)

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        create: bool = True,
        workdir: Path | None = None,
        progress: Progress | None = None,
        inline_read_models: bool = True,
    ) -> Plane:
        store = open_store(url, create=create)
        try:
            return cls(
                store, workdir=workdir, progress=progress, inline_read_models=inline_read_models
            )
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

    def plane_public_key(self) -> Ed25519PublicKey:
        """The plane key's public half: it endorses approver keys and signs tokens."""
        if self._plane_public is None:
            self._plane_public = load_or_create_plane_key(self.store.url).public_key()
        return self._plane_public

    def sandbox(self, plan: PlanState) -> PlanSandbox:
        """The plan's sandbox (``ensure()`` it before use: the copies are made lazily)."""
        return PlanSandbox.of(self.sandboxes, plan)

    def one_look(self) -> AbstractContextManager[None]:
        """One operation's look at the policy (``PolicyCache.one_look``): the service
        checks a request's credential and runs it inside one."""
        return self._policy.one_look()

    def log(self) -> Authority:
        """Authority reads outside a write transaction (each its own snapshot)."""
        return self._authority(StoreSource(self.store))

    def _authority(self, source: EventSource) -> Authority:
        return Authority(source, self._checked, self.plane_public_key, self._policy)

    def state(self, stream: str) -> StreamState:
        """The stream's document and version, folded from the events table."""
        return self.log().state(stream)

    # -- appending --------------------------------------------------------------------

    def run(
        self,
        stream: str,
        decide: Callable[[StreamState], Decision],
        *,
        actor: str = "system",
        blobs: Iterable[bytes] | Callable[[], Iterable[bytes]] = (),
        correlation_id: str | None = None,
        caused_by: int | None = None,
    ) -> list[RecordedEvent]:
        """Fold the stream from the log under the ledger lock, decide, append — one
        transaction, so nothing can move the state between the decision and its events.
        ``decide`` must not open transactions of its own: other streams it needs are
        read through ``state.log``, in the same transaction. ``blobs`` may be a function,
        asked after ``decide`` (when what is kept depends on the decision).

        With a ``committer`` (the service's group commit) the job is handed to it: it is
        decided and appended the same way, in a transaction shared with other plans'
        jobs (``run_batch``)."""
        job = Job(stream, decide, actor, blobs, correlation_id, caused_by)
        if self.committer is not None:
            return self.committer.submit(job)
        while True:
            with self.store.write(tails=self._tails) as tx:
                # The read models are kept current in the appending transaction; events
                # another writer appended without them are applied first: here, under
                # the lock, when they are few, else outside it (``catch_up``), then again.
                if not self.inline_read_models or self.projections.catch_up_locked(tx):
                    return self._run_job(tx, job)
            self.projections.catch_up()

    def _run_job(self, tx: WriteTx, job: Job) -> list[RecordedEvent]:
        """Fold the job's stream under ``tx``'s lock, decide, append (``run``'s body)."""
        state = self._authority(tx).state(job.stream)
        payloads = job.decide(state)
        if not payloads:
            return []
        return self._append(
            tx,
            state,
            payloads,
            actor=job.actor,
            blobs=list(job.blobs() if callable(job.blobs) else job.blobs),
            correlation_id=job.correlation_id,
            caused_by=job.caused_by,
        )

    def run_batch(self, jobs: Sequence[Job]) -> list[list[RecordedEvent] | LedgerError]:
        """Group commit: each job decided and appended as ``run`` would, one after the
        other, all in one write transaction (one lock hold, one commit, one fsync for
        all of them). A job its own rules refuse (``CommandRefused``, a stream moved) is
        answered with its refusal before it wrote anything, and the others go on; any
        other error aborts the transaction, and every job with it (nothing appended).
        The read models are not touched: only planes that leave them to a follower
        batch."""
        if self.inline_read_models:
            raise TypeError("run_batch is for planes that leave the read models to a follower")
        answers: list[list[RecordedEvent] | LedgerError] = []
        try:
            self._decide_batch(jobs, answers)
        except BaseException:
            # A later job's fold read an earlier one's events, which the rollback undid:
            # the checked plan prefixes may hold them, so they are read again.
            self._checked.clear()
            raise
        return answers

    def _decide_batch(
        self, jobs: Sequence[Job], answers: list[list[RecordedEvent] | LedgerError]
    ) -> None:
        with self.store.write(tails=self._tails) as tx:
            for job in jobs:
                try:
                    answers.append(self._run_job(tx, job))
                except (CommandRefused, ConcurrencyError) as refused:
                    # Raised before the job sent a write (the rules and the version check
                    # come first): the transaction is as the job found it.
                    answers.append(refused)

    def append(
        self,
        state: StreamState,
        payloads: Decision,
        *,
        actor: str = "system",
        blobs: Iterable[bytes] = (),
        correlation_id: str | None = None,
        caused_by: int | None = None,
    ) -> list[RecordedEvent]:
        """Append ``payloads`` to ``state.stream`` expecting ``state.version`` (a
        ``ConcurrencyError`` if the stream moved), each checked and with its delta."""
        with self.store.write(tails=self._tails) as tx:
            return self._append(
                tx,
                state,
                payloads,
                actor=actor,
                blobs=list(blobs),
                correlation_id=correlation_id,
                caused_by=caused_by,
            )

    def _append(
        self,
        tx: WriteTx,
        state: StreamState,
        payloads: Decision,
        *,
        actor: str,
        blobs: list[bytes],
        correlation_id: str | None,
        caused_by: int | None,
    ) -> list[RecordedEvent]:
        """With ``caused_by`` the events after the one at that index of ``payloads`` name
        it as their causation (a gate check and the failure and halt it routes to)."""
        payloads, bootstrap = self._signed_policy(tx, payloads)
        doc = state.doc
        events = []
        cause_id = str(ULID())
        for i, payload in enumerate(payloads):
            rule = broken_rule(state.stream, doc, payload)
            if rule is not None:  # a handler's own checks come first, with better words
                raise CommandRefused(f"refused: {rule}")
            after = fold(state.stream, doc, payload)
            events.append(
                NewEvent(
                    payload=payload,
                    actor=actor,
                    delta=delta(doc, after),
                    event_id=cause_id if i == caused_by else None,
                    correlation_id=correlation_id,
                    causation_id=cause_id if caused_by is not None and i > caused_by else None,
                )
            )
            doc = after
        appends = [*bootstrap, StreamAppend(state.stream, events, state.version)]
        recorded = tx.append_batch(appends, blobs=blobs)
        if self.inline_read_models:
            self.projections.apply_inline(tx, recorded)
        return recorded[len(recorded) - len(events) :]

    # -- policy: signed by an operator ------------------------------------------------

    def _signed_policy(
        self, tx: WriteTx, payloads: Decision
    ) -> tuple[list[EventPayload], list[StreamAppend]]:
        """Each payload that is policy (``needs_operator``) signed with this process's
        operator key (``EVIDENCE_OPERATOR_KEY``, else the key beside the plane key). A
        fresh ledger with no operator yet is bootstrapped here, in the same append: the
        key is made and endorsed by the plane key as the first operator (the single-user
        mode). A key that is not an active, endorsed operator key refuses the command."""
        if not any(needs_operator(p) for p in payloads):
            return list(payloads), []
        url = self.store.url
        try:
            key = load_or_create_operator_key(url)
        except SigningError as exc:
            raise CommandRefused(f"policy needs an operator key: {exc}") from None
        assert key is not None
        public = public_key_b64(key.public_key())
        print_ = fingerprint(key.public_key())
        log = self._authority(tx)
        keys = log.approver_keys()
        known = keys.get(print_)
        bootstrap: list[StreamAppend] = []
        if known is None:
            if any(k.role == "operator" for k in keys.values()):
                raise CommandRefused(
                    f"this operator key ({print_[:16]}…, {operator_key_path(url)}) is no "
                    "operator's of this ledger: policy (registrations, attachments, "
                    "skills, keys, settings that weaken a gate) is signed by an operator "
                    "(EVIDENCE_OPERATOR_KEY; `evidence keys add NAME PUB --role operator` "
                    "with the plane key makes one)"
                )
            name = operator_name()
            added = endorse_key(load_or_create_plane_key(url), name, public, print_, "operator")
            stream = log.state(f"approver:{name}")
            after = fold(stream.stream, stream.doc, added)
            bootstrap.append(
                StreamAppend(
                    stream.stream,
                    [NewEvent(payload=added, actor="plane", delta=delta(stream.doc, after))],
                    stream.version,
                )
            )
            signer = name
        elif known.role != "operator" or known.status != "active":
            raise CommandRefused(
                f"this key ({print_[:16]}…) is not an active operator key of this ledger"
            )
        else:
            signer = known.name
        return [
            msgspec.structs.replace(
                p,
                signed=PolicySignature(
                    operator=signer,
                    fingerprint=print_,
                    signature=sign_record(key, policy_record(p), domain="policy"),
                ),
            )
            if needs_operator(p)
            else p
            for p in payloads
        ], bootstrap
