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
from typing import TYPE_CHECKING, Protocol

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from commands.errors import CommandRefused
from commands.rules.signing import (
    Place,
    SigningError,
    endorse_key,
    identity_record,
    key_registration,
    load_or_create_operator_key,
    load_or_create_plane_key,
    load_plane_public_key,
    operator_key_path,
    operator_name,
    policy_record,
    sign_record,
)
from commands.rules.trust import needs_operator
from commands.runner.guards import Guard, KeptSnapshots, TreeGuard
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
from ledger.events import (
    ApproverKeyAdded,
    Escalated,
    ExecuteEntered,
    LedgerIdentified,
    PlanApplied,
    PlanHalted,
    PolicySignature,
)
from ledger.ids import new_ulid
from ledger.keys import fingerprint, public_key_b64
from ledger.tails import StreamTails
from projections import ProjectionEngine, delta, fold, open_projections
from projections.engine import Progress
from projections.plan_rules import broken_rule
from projections.states import PlanState

from . import tracing
from .authority import Authority, Checked, EventSource, Identity, StoreSource, StreamState
from .policy import PolicyCache
from .signers import SIGNER, Signer

if TYPE_CHECKING:  # the service's; the plane never starts them itself
    from commands.runner.mcp_sessions import WarmSessions

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
    # Who signs its policy (``signers``): None, this process's operator key.
    signer: Signer | None = None
    # Whether its events may wait for the next durable commit to reach the disk (asked
    # of what it decided): a passing input check whose call's record follows.
    deferrable: Callable[[Decision], bool] | None = None


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
        # The service's warm MCP servers (None: every MCP call starts its server).
        self.mcp_sessions: WarmSessions | None = None
        # Sandbox snapshots kept across a plan's calls (None: each call copies its own).
        self.snapshots: KeptSnapshots | None = None
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
        """The plane key's public half: it endorses approver keys and signs tokens.
        Read, never made (``load_plane_public_key``): only what signs as the plane makes
        the plane key."""
        if self._plane_public is None:
            self._plane_public = load_plane_public_key(self.store.url)
        return self._plane_public

    def sandbox(self, plan: PlanState) -> PlanSandbox:
        """The plan's sandbox (``ensure()`` it before use: the copies are made lazily)."""
        return PlanSandbox.of(self.sandboxes, plan)

    def guard_sandbox(self, plan_id: str, root: Path) -> Guard:
        """A guard over one of the plan's sandbox copies while a call runs in it: the
        snapshot kept across the plan's calls (``snapshots``), else one of its own."""
        if self.snapshots is None:
            return TreeGuard(root)
        return self.snapshots.guard(plan_id, root)

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
        deferrable: Callable[[Decision], bool] | None = None,
    ) -> list[RecordedEvent]:
        """Fold the stream from the log under the ledger lock, decide, append — one
        transaction, so nothing can move the state between the decision and its events.
        ``decide`` must not open transactions of its own: other streams it needs are
        read through ``state.log``, in the same transaction. ``blobs`` may be a function,
        asked after ``decide`` (when what is kept depends on the decision).

        ``deferrable(decided)`` true: the commit may leave its flush to disk to the next
        durable one (``WriteTx.defer_flush``): committed and safe from any process's
        end when this returns, durable with the record that follows it.

        With a ``committer`` (the service's group commit) the job is handed to it: it is
        decided and appended the same way, in a transaction shared with other plans'
        jobs (``run_batch``)."""
        job = Job(stream, decide, actor, blobs, correlation_id, caused_by, SIGNER.get(), deferrable)
        if self.committer is not None:
            return self._after(self.committer.submit(job))
        while True:
            with self.store.write(tails=self._tails, may_defer=deferrable is not None) as tx:
                # The read models are kept current in the appending transaction; events
                # another writer appended without them are applied first: here, under
                # the lock, when they are few, else outside it (``catch_up``), then again.
                if not self.inline_read_models or self.projections.catch_up_locked(tx):
                    events = self._run_job(tx, job)
                    break
            self.projections.catch_up()
        return self._after(events)

    def _after(self, events: list[RecordedEvent]) -> list[RecordedEvent]:
        """What follows an append outside the log: a plan whose sandbox is made anew (a
        new Execute) or which ended keeps no warm MCP server (``mcp_sessions``) and no
        sandbox snapshot (``snapshots``); an open
        span of the plane (``tracing``) keeps them for its receipt."""
        tracing.recorded(events)
        for event in events:
            p = event.payload
            if isinstance(p, ExecuteEntered | PlanApplied) or (
                isinstance(p, PlanHalted) and p.terminal
            ):
                if self.mcp_sessions is not None:
                    self.mcp_sessions.drop(p.plan_id)
                if self.snapshots is not None:
                    self.snapshots.drop(p.plan_id)
        return events

    def _run_job(self, tx: WriteTx, job: Job) -> list[RecordedEvent]:
        """Fold the job's stream under ``tx``'s lock, decide, append (``run``'s body)."""
        state = self._authority(tx).state(job.stream)
        payloads = job.decide(state)
        if not payloads:
            return []
        tx.defer_flush(job.deferrable is not None and job.deferrable(payloads))
        return self._append(
            tx,
            state,
            payloads,
            actor=job.actor,
            blobs=list(job.blobs() if callable(job.blobs) else job.blobs),
            correlation_id=job.correlation_id,
            caused_by=job.caused_by,
            signer=job.signer,
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
        may_defer = any(job.deferrable is not None for job in jobs)
        with self.store.write(tails=self._tails, may_defer=may_defer) as tx:
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
        signer: Signer | None = None,
    ) -> list[RecordedEvent]:
        """With ``caused_by`` the events after the one at that index of ``payloads`` name
        it as their causation (a gate check and the failure and halt it routes to)."""
        payloads, bootstrap = self._signed(tx, state, _in_force(state, payloads), signer)
        doc = state.doc
        events = []
        cause_id = new_ulid()
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

    # -- signatures: bound to where each event will stand ------------------------------

    def identify(self) -> Identity | None:
        """Identify a ledger that holds events but no identification yet (one the first
        release wrote): from then on, no signature in the first release's format counts
        (``evidence init`` and ``evidence serve`` call it). A fresh ledger stays empty:
        its first signature identifies it. Needs the plane key."""
        if self.log().identity() is not None or self.store.head().size == 0:
            return self.log().identity()
        while True:
            with self.store.write(tails=self._tails) as tx:
                if not self.inline_read_models or self.projections.catch_up_locked(tx):
                    log = self._authority(tx)
                    if log.identity() is None:
                        recorded = tx.append_batch(self._identified(tx, log)[1])
                        if self.inline_read_models:
                            self.projections.apply_inline(tx, recorded)
                    break
            self.projections.catch_up()
        return self.log().identity()

    def _signed(
        self, tx: WriteTx, state: StreamState, payloads: Decision, signer: Signer | None = None
    ) -> tuple[list[EventPayload], list[StreamAppend]]:
        """Each payload signed where it will stand (``Place``: this ledger, the stream,
        its version there, its type): a key registration endorsed by the plane key,
        policy (``needs_operator``) by this process's operator key
        (``EVIDENCE_OPERATOR_KEY``, else the key beside the plane key). What the
        signatures need is appended first, in the same append: the ledger's
        identification when it has none, and, on a fresh ledger with no operator yet,
        this key endorsed as the first operator (the single-user mode). A key that is
        not an active, endorsed operator key refuses the command. With ``signer`` (an
        operator elsewhere: ``signers``) the policy is its to sign, or to have signed."""
        endorse = [isinstance(p, ApproverKeyAdded) and not p.endorsement for p in payloads]
        policy = [needs_operator(p) for p in payloads]
        if not any(endorse) and not any(policy):
            return list(payloads), []
        log = self._authority(tx)
        ledger_id, bootstrap = self._identified(tx, log)
        operator: Signer | None = signer
        if operator is None and any(policy):
            operator = self._operator(tx, log, ledger_id, bootstrap)
        signed: list[EventPayload] = []
        asked: list[tuple[EventPayload, Place]] = []
        for i, p in enumerate(payloads):
            place = Place(ledger_id, state.stream, state.version + i + 1, p.type_name())
            if endorse[i]:
                assert isinstance(p, ApproverKeyAdded)
                p = endorse_key(load_or_create_plane_key(self.store.url), p, place)
            if policy[i]:
                assert operator is not None
                p = operator.sign(p, place, log)
                asked.append((p, place))
            signed.append(p)
        if operator is not None:
            operator.done(asked)
        return signed, bootstrap

    def _identified(self, tx: WriteTx, log: Authority) -> tuple[str, list[StreamAppend]]:
        """The ledger's id as the plane key named it, and the ``ledger.identified`` to
        append first when it has none yet (signed over its place and its position)."""
        identity = log.identity()
        if identity is not None:
            return identity.ledger_id, []
        rows = tx.query(f"SELECT value FROM ledger_meta WHERE key = {tx.ph}", ("ledger_id",))
        ledger_id = str(rows[0][0]) if rows else new_ulid()
        size = tx.head_size()
        stream = log.state(LedgerIdentified.STREAM)
        place = Place(ledger_id, stream.stream, stream.version + 1, LedgerIdentified.type_name())
        identified = LedgerIdentified(
            ledger_id=ledger_id,
            position=size + 1,
            signature=sign_record(
                load_or_create_plane_key(self.store.url),
                identity_record(ledger_id, size + 1),
                domain="ledger",
                place=place,
            ),
        )
        event = NewEvent(payload=identified, actor="plane")
        return ledger_id, [StreamAppend(stream.stream, [event], stream.version)]

    def _operator(
        self, tx: WriteTx, log: Authority, ledger_id: str, bootstrap: list[StreamAppend]
    ) -> _Operator:
        """This process's operator key, checked against the ledger's keys; on a ledger
        with no operator yet, endorsed as its first (appended to ``bootstrap``)."""
        url = self.store.url
        try:
            key = load_or_create_operator_key(url)
        except SigningError as exc:
            raise CommandRefused(f"policy needs an operator key: {exc}") from None
        assert key is not None
        public = public_key_b64(key.public_key())
        print_ = fingerprint(key.public_key())
        keys = log.approver_keys()
        known = keys.get(print_)
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
            stream = log.state(f"approver:{name}")
            place = Place(ledger_id, stream.stream, stream.version + 1, "approver_key.added")
            added = endorse_key(
                load_or_create_plane_key(url),
                key_registration(name, public, print_, "operator"),
                place,
            )
            after = fold(stream.stream, stream.doc, added)
            bootstrap.append(
                StreamAppend(
                    stream.stream,
                    [NewEvent(payload=added, actor="plane", delta=delta(stream.doc, after))],
                    stream.version,
                )
            )
            return _Operator(key, name, print_)
        if known.role != "operator" or known.status != "active":
            raise CommandRefused(
                f"this key ({print_[:16]}…) is not an active operator key of this ledger"
            )
        return _Operator(key, known.name, print_)


@dataclass(frozen=True)
class _Operator:
    """An operator key that may sign policy here, and the name it signs as."""

    key: Ed25519PrivateKey
    name: str
    fingerprint: str

    def sign(self, p: EventPayload, place: Place, log: object = None) -> EventPayload:
        return msgspec.structs.replace(
            p,
            signed=PolicySignature(
                operator=self.name,
                fingerprint=self.fingerprint,
                signature=sign_record(self.key, policy_record(p), domain="policy", place=place),
                place=place.stated(),
            ),
        )

    def done(self, signed: Sequence[tuple[EventPayload, Place]]) -> None:
        return None


def _in_force(state: StreamState, payloads: Decision) -> Decision:
    """``payloads`` with the approval policy in force applied, under the ledger lock (no
    policy change races it): an escalation asks for the approvals its plan and the
    policy require, whichever is more (``commands.rules.approvals``)."""
    if state.log is None or not any(isinstance(p, Escalated) for p in payloads):
        return payloads
    plan = state.doc if isinstance(state.doc, PlanState) else None
    if plan is None:
        return payloads
    required = state.log.approvals().required(plan.global_config)
    return [
        msgspec.structs.replace(p, approvals_required=required if required > 1 else msgspec.UNSET)
        if isinstance(p, Escalated)
        else p
        for p in payloads
    ]
