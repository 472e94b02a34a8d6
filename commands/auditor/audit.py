"""The auditor's handlers: replay a plan, and audit the log's invariants.

Both read the log only (a ``LogReader``: a ``Store``, or an offline bundle; no read
model is trusted): replay folds one plan's stream with ``projections.documents.fold``
(``replay``); the audit walks the whole log once in position order, keeping the folded
documents of every stream, and checks at each event what must hold there. Every
violation names its position, the invariant and what was expected; nothing here writes.

This module holds the walk and its log-wide checks (transitions, deltas, policy and
review signatures, read models); a plan's own events are checked by ``plan_checks``
(INV1 in ``tokens``, re-derived verdicts in ``rederive``), ``audit --files`` by
``files``; the finding types are in ``findings``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from commands.errors import CommandRefused
from commands.rules.approvals import Approvals
from commands.rules.trust import (
    POLICY_TYPE_NAMES,
    ApproverKey,
    BrokenRule,
    PolicyFold,
    Replayed,
    Unendorsed,
    needs_operator,
    review_problem,
)
from ledger import LogReader, RecordedEvent, Store
from ledger.events import (
    ApproverKeyAdded,
    EventPayload,
    GateChecked,
    LedgerIdentified,
    ReviewReportCommitted,
    ValidationRegistered,
)
from projections import ALL_PROJECTIONS, ProjectionEngine
from projections.documents import State, fold, to_json
from projections.engine import LogFolds, ReadModelCheck, no_gc
from projections.plan_rules import broken_rule
from projections.states import ApproverState

from .deltas import DeltaError, apply_delta, misplaced
from .files import check_files
from .findings import INVARIANTS, NEEDS_PLANE_KEY, AuditReport, Findings, Reporting, Violation
from .plan_checks import PlanChecks
from .replay import ReplayStep, plan_state, replay_plan, retries_left

__all__ = [
    "INVARIANTS",
    "AuditReport",
    "ReplayStep",
    "Violation",
    "audit",
    "check_files",
    "check_read_models",
    "plan_state",
    "replay_plan",
    "retries_left",
]


def audit(
    store: LogReader,
    *,
    plan: str | None = None,
    max_violations: int = 1000,
    read_models: bool = True,
    plane_public_key: Ed25519PublicKey | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> AuditReport:
    """Check every invariant over the log up to its current head (one plan's events only
    with ``plan``; the attachment, tool and approver streams are always folded, as
    resolution and signatures need them). With ``plane_public_key``, every token's
    signature is checked too. On a database, for the whole log (no ``plan``) and with
    ``read_models``, also compare every read model with a fresh fold of the log up to
    its position. ``progress(done, total)`` is told the walk's position after each
    batch of events."""
    size = store.head().size
    if plan is not None and not store.read_stream(f"plan:{plan}", as_of=size):
        raise CommandRefused(f"unknown plan {plan!r}")
    ahead = _BlobsAhead(store)
    check_models = read_models and plan is None and isinstance(store, Store)
    auditor = _Auditor(ahead, plan, max_violations, plane_public_key)
    auditor.folds = LogFolds(ALL_PROJECTIONS if check_models else ())
    judged = auditor.plan_checks.rederivation.judged
    batch: list[RecordedEvent] = []
    with no_gc():
        for event in store.read_all(to_position=size):
            batch.append(event)
            if len(batch) == _BATCH:
                ahead.walk(batch, auditor.step, judged)
                if progress is not None:
                    progress(event.position, size)
        ahead.walk(batch, auditor.step, judged)
        if progress is not None:
            progress(size, size)
        auditor.finish()
    statuses: dict[str, str] = {}
    if check_models and isinstance(store, Store):
        for check in check_read_models(store, auditor.folds):
            statuses[check.name] = check.status
            if check.status in ("ok", "differs"):
                auditor.count("read_model")
            if not check.ok:
                auditor.violation(
                    check.position,
                    None,
                    "read_model",
                    f"read model {check.name!r} equal to a fresh fold of the log up to its "
                    f"position {check.position}",
                    "; ".join(check.differences),
                )
    found = auditor.findings
    plans = auditor.plan_checks
    return AuditReport(
        ok=not found.violations,
        size=size,
        plans=sorted(plans.plans),
        checked=dict(sorted(found.checked.items())),
        violations=found.violations,
        read_models=statuses,
        unvalidated=sorted(plans.unvalidated),
        unconfined=sorted(plans.unconfined),
        unchecked=list(NEEDS_PLANE_KEY) if plane_public_key is None else [],
    )


_BATCH = 500  # events walked per statement of blobs fetched ahead


class _BlobsAhead:
    """The log as the walk reads it, with the checked bytes of a batch's gate checks
    fetched in one statement before the batch is walked (re-deriving a check reads
    them; one statement each was a third of the audit's time)."""

    def __init__(self, store: LogReader) -> None:
        self.store = store
        self.ahead: dict[str, bytes] = {}
        self.head, self.read_all, self.read_stream = store.head, store.read_all, store.read_stream
        self.get_blobs = store.get_blobs

    def walk(
        self,
        batch: list[RecordedEvent],
        step: Callable[[RecordedEvent], None],
        judged: Callable[[str, str], bool],
    ) -> None:
        """``step`` each event of ``batch`` (emptied), the blobs it will read fetched
        first: the bytes of its gate checks not ``judged`` already."""
        wanted = [
            p.checked_sha256
            for e in batch
            if isinstance(p := e.payload, GateChecked)
            and p.checked_sha256
            and p.schema_sha256
            and not judged(p.schema_sha256, p.checked_sha256)
        ]
        self.ahead = self.store.get_blobs(wanted) if wanted else {}
        for event in batch:
            step(event)
        batch.clear()
        self.ahead = {}

    def get_blob(self, digest: str) -> bytes | None:
        found = self.ahead.get(digest)
        return found if found is not None else self.store.get_blob(digest)


def check_read_models(store: Store, walked: LogFolds | None = None) -> list[ReadModelCheck]:
    """Every read model as it is stored (the engine is not opened, so nothing is caught
    up or rebuilt first) against a fresh fold of the log (the audit's own, ``walked``,
    where the read model is at the position the walk reached)."""
    engine = ProjectionEngine(store, ALL_PROJECTIONS)
    return [engine.check(p.name, walked=walked) for p in ALL_PROJECTIONS]


class _Auditor(Reporting):
    def __init__(
        self,
        store: LogReader,
        plan: str | None,
        max_violations: int,
        plane_public_key: Ed25519PublicKey | None = None,
    ) -> None:
        super().__init__(Findings(max_violations))
        self.store = store
        self.plane_public_key = plane_public_key
        self.plan = plan
        self.docs: dict[str, State | None] = {}  # stream -> folded state (None: none yet)
        self.folds = LogFolds(())  # what a read model's fresh fold would hold
        self.rebuilt: dict[str, Any] = {}  # stream -> document rebuilt from deltas
        self.broken: set[str] = set()  # streams whose deltas already diverged
        self.unendorsed: set[str] = set()  # approver keys the plane key did not endorse
        # The policy the plane trusts, as of the walk (keys, identity, trusted documents).
        self.policy = PolicyFold(plane_public_key)
        self.review_payloads: dict[str, list[EventPayload]] = {}  # review stream -> so far
        self.plan_checks = PlanChecks(self.findings, store, self, plane_public_key)

    # -- the walk ---------------------------------------------------------------------

    def step(self, event: RecordedEvent) -> None:
        stream = event.stream
        kind, _, key = stream.partition(":")
        in_scope = kind != "plan" or self.plan is None or key == self.plan
        before = self.docs.get(stream)
        if isinstance(event.payload, ValidationRegistered) and in_scope:
            self.check_read_only(event, event.payload)
        if self.plane_public_key is not None:
            self.check_policy(event)
            if kind == "review":
                self.check_review(event)
        if in_scope:
            self.count("illegal_transition")
            rule = broken_rule(stream, before, event.payload)
            if rule is not None:
                self.violation(
                    event.position,
                    _plan_of(stream),
                    "illegal_transition",
                    rule,
                    f"{event.type} at {stream} v{event.stream_version}",
                )
        if kind == "plan" and in_scope:
            self.plan_checks.take(key, event)  # sees the state before the event
        after = fold(stream, before, event.payload)
        self.docs[stream] = after
        self.folds.take(event, after)
        if in_scope:
            self.check_delta(event, after)
        if kind == "plan" and in_scope:
            self.plan_checks.folded(key, after)

    def finish(self) -> None:
        self.plan_checks.finish()

    def check_read_only(self, event: RecordedEvent, p: ValidationRegistered) -> None:
        self.count("read_only")
        if p.writes or p.checkpointable or not p.read_only:
            self.violation(
                event.position,
                None,
                "read_only",
                f"validation {p.name} v{p.version} is read-only (writes false, "
                "checkpointable false, read_only true)",
                f"writes {p.writes}, checkpointable {p.checkpointable}, read_only {p.read_only}",
            )

    def check_delta(self, event: RecordedEvent, after: State | None) -> None:
        stream = event.stream
        if stream in self.broken:
            return
        self.count("delta_fold")
        try:
            # In place: the rebuilt document is the walk's own, and a patch that does not
            # apply marks its stream broken (no copy of a long plan's document per event).
            rebuilt = apply_delta(self.rebuilt.get(stream, {}), event.delta)
        except DeltaError as exc:
            self.broken.add(stream)
            self.violation(
                event.position,
                _plan_of(stream),
                "delta_fold",
                f"the delta of {stream} v{event.stream_version} applies to the "
                "document rebuilt so far",
                f"it does not: {exc}",
            )
            return
        self.rebuilt[stream] = rebuilt
        folded = to_json(after)
        if rebuilt != folded:
            found = f"they differ from stream version {event.stream_version} on"
        elif (path := misplaced(event.delta, folded)) is not None:
            found = f"at {path!r} the delta writes another JSON value (true is no 1)"
        else:
            return
        self.broken.add(stream)
        self.violation(
            event.position,
            _plan_of(stream),
            "delta_fold",
            f"{stream} rebuilt from its deltas equals its fold",
            found,
        )

    def check_review(self, event: RecordedEvent) -> None:
        """A review's report is one the plane ran: its commit carries the plane key's
        signature over the chain of the review's earlier events (``review_problem``)."""
        earlier = self.review_payloads.setdefault(event.stream, [])
        assert self.plane_public_key is not None  # checked only with the plane key
        if isinstance(event.payload, ReviewReportCommitted):
            self.count("review_signature")
            problem = review_problem([*earlier, event.payload], self.plane_public_key)
            if problem is not None:
                self.violation(
                    event.position,
                    None,
                    "review_signature",
                    f"review {event.payload.task_id}'s report is vouched for by the plane",
                    problem,
                )
        earlier.append(event.payload)

    def check_policy(self, event: RecordedEvent) -> None:
        """Policy only from an operator, standing where it was signed: every
        registration, attachment, skill, key change, credential and gate-weakening plan
        setting carries a signature that verifies under an operator key the plane key
        endorsed, active at its position, made for this ledger, stream and version
        (``PolicyFold``, the plane's own rule); keys are endorsed by the plane key; the
        ledger's identification is the plane key's."""
        if event.type not in POLICY_TYPE_NAMES:
            return
        p = event.payload
        if isinstance(p, ApproverKeyAdded):
            self.count("approver_endorsement")
        if needs_operator(p):
            self.count("policy_signature")
        problem = self.policy.take(event)
        if problem is None or isinstance(problem, BrokenRule):
            return  # a broken rule is illegal_transition's finding
        where = f"{event.type} at {event.stream} v{event.stream_version}: the plane ignores it"
        if isinstance(problem, Replayed):
            self.count("replayed_signature")
            invariant = "replayed_signature"
        elif isinstance(p, LedgerIdentified):
            self.count("ledger_identity")
            invariant = "ledger_identity"
        elif isinstance(problem, Unendorsed):
            assert isinstance(p, ApproverKeyAdded)
            self.unendorsed.add(p.fingerprint)
            invariant = "approver_endorsement"
        else:
            invariant = "policy_signature"
        self.violation(event.position, _plan_of(event.stream), invariant, str(problem), where)

    def policy_docs(self) -> dict[str, State | None]:
        """The policy streams' documents resolution reads: as the plane trusts them
        when the plane key is known (what it ignores changes nothing), else as folded."""
        return self.policy.docs if self.plane_public_key is not None else self.docs

    def approvals(self) -> Approvals | None:
        """The approval policy and plans' operators as of the event being audited."""
        return self.policy.approvals if self.plane_public_key is not None else None

    def approver_key(self, fingerprint: str) -> ApproverKey | None:
        """The approver key as of the event being audited (the walk is in order)."""
        if self.plane_public_key is not None:
            return self.policy.ring.keys.get(fingerprint)
        if fingerprint in self.unendorsed:
            return None
        for doc in self.docs.values():
            key = doc.keys.get(fingerprint) if isinstance(doc, ApproverState) else None
            if isinstance(doc, ApproverState) and key is not None:
                return ApproverKey(doc.name, key.public_key, key.status)
        return None


def _plan_of(stream: str) -> str | None:
    kind, _, key = stream.partition(":")
    return key if kind == "plan" else None
