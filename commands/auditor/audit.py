"""The auditor's handlers: replay a plan, and audit the log's invariants.

Both read the log only (a ``LogReader``: a ``Store``, or an offline bundle; no read
model is trusted): replay folds one plan's stream with ``projections.documents.fold``;
the audit walks the whole log once in position order, keeping the folded documents of
every stream, and checks at each event what must hold there. Every violation names its
position, the invariant and what was expected; nothing here writes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonpatch
import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from commands.errors import CommandRefused
from commands.rules.trust import (
    POLICY_TYPE_NAMES,
    ApproverKey,
    BrokenRule,
    PolicyFold,
    Replayed,
    Unendorsed,
    decision_problem,
    needs_operator,
    review_problem,
    token_signed,
)
from commands.rules.verdicts import results_digest, truncated_deviation
from commands.runner.results import TransformError, apply_transform
from commands.runner.sandbox import change_entry, change_set_problem, decode_trees
from commands.runner.trees import Entry, entries, manifest_of
from commands.schemas.checker import check
from ledger import LogReader, RecordedEvent, Store
from ledger.events import (
    ApproverKeyAdded,
    ChangesRecorded,
    DecisionRecorded,
    Escalated,
    EventPayload,
    ExecuteEntered,
    FileChange,
    FixRecorded,
    GateChecked,
    LedgerIdentified,
    PlanApplied,
    PlanHalted,
    ReviewReportCommitted,
    SkillPin,
    TokenConsumed,
    TokenMinted,
    ToolCalled,
    Truncation,
    ValidationRegistered,
    ValidationResultRecorded,
    ValidationRunCompleted,
    ValidationRunStarted,
)
from ledger.events.validation import ResolvedAttachment
from projections import ALL_PROJECTIONS, ProjectionEngine
from projections.documents import Document, State, fold, fold_plan, to_json
from projections.engine import ReadModelCheck
from projections.outcomes import RULES_VERSION, canonical_halt, classify
from projections.plan_rules import broken_rule
from projections.resolution import pin_binding, resolve_plan
from projections.states import ApproverState, AttachmentState, PlanState, SkillState, ToolState

from .history import summarize

__all__ = [
    "INVARIANTS",
    "AuditReport",
    "ReplayStep",
    "Violation",
    "audit",
    "plan_state",
    "replay_plan",
]

# The invariant names a violation can carry (docs/auditing.md explains each, with the
# seed's ids as aliases: token_from_passing_run is INV1, blocker_not_overridable INV3).
INVARIANTS = (
    "token_from_passing_run",  # INV1: a token only from a complete, passing, current run
    "blocker_not_overridable",  # INV3: decisions only on escalations; no token past a blocker
    "ordering",  # escalate -> decision -> re-validation -> token; Apply; tokens once
    "gate_rederivation",  # gate check re-run on recorded bytes gives the recorded verdict
    "transform_rederivation",  # wrapped transform re-run on the raw output
    "outcome_drift",  # classification with the current rules differs from the recorded
    "delta_fold",  # a stream rebuilt from its deltas differs from its fold
    "read_only",  # a registered validation that is not read-only
    "gate_routing",  # a failed gate check not routed as the plan's strict_mode says
    "read_model",  # a stored read model differs from a fresh fold up to its position
    "illegal_transition",  # an event its stream's state could not take (plan_rules)
    "binding",  # a binding set is not what applied when it was pinned, or a run's set
    "skills",  # skills not pinned as defined, or an input gate that ignored them
    "no_vacuous_pass",  # a pass / token with no required validation run, not opted out
    "decision_signature",  # a decision not signed by its approver's key in force
    "token_signature",  # a token not signed by the plane key
    "approver_endorsement",  # an approver key the plane key did not endorse
    "policy_signature",  # policy not signed by an operator key in force: the plane ignores it
    "replayed_signature",  # a genuine signature standing where it was not made: a copy
    "ledger_identity",  # a ledger.identified the plane key did not sign where it stands
    "review_signature",  # a review report the plane key did not vouch for
    "apply_incomplete",  # a change set recorded, the Apply never completed
    "change_set",  # a change set that is not the validated trees' difference from the snapshot
    "files",  # with --files: a resource directory differs from the applied change set
    "evidence",  # a blob a verdict was derived from is missing
)


# ------------------------------------------------------------------------------ replay


class ReplayStep(msgspec.Struct, kw_only=True):
    """The plan's state right after one of its events."""

    position: int
    stream_version: int
    recorded_at: str
    actor: str
    type: str
    summary: str
    phase: str | None
    revision: int | None
    attempt: int | None
    retries_left: int | None
    outcome: str | None
    token: dict[str, Any] | None
    terminal: str | None
    document: Document  # the whole folded plan document


_COLUMNS = ("phase", "revision", "attempt", "retries_left", "outcome", "token", "terminal")


def plan_state(doc: PlanState | None) -> dict[str, Any]:
    """The replay columns of a folded plan state (all None for a forged stream with no
    ``plan.created`` first: replay shows it, the audit reports it)."""
    if doc is None:
        return dict.fromkeys(_COLUMNS)
    token = doc.token
    return {
        "phase": doc.phase,
        "revision": doc.revision,
        "attempt": doc.attempt,
        "retries_left": retries_left(doc.global_config.retry_limit, doc.retries_used),
        "outcome": doc.last_outcome,
        "token": {"token_id": token.token_id, "status": token.status} if token else None,
        "terminal": doc.terminal,
    }


def retries_left(retry_limit: int, failed: int) -> int:
    """Fix-then-revalidate cycles still allowed in this strategy: ``retry_limit`` of
    them follow its first failed validation."""
    return max(0, retry_limit + 1 - max(failed, 1))


def replay_plan(store: LogReader, plan_id: str, as_of: int | None = None) -> list[ReplayStep]:
    """Fold plan ``plan_id``'s stream event by event (up to position ``as_of``)."""
    if as_of is not None and as_of < 1:
        raise CommandRefused(f"--as-of {as_of}: positions start at 1")
    stream = f"plan:{plan_id}"
    events = store.read_stream(stream, as_of=as_of)
    if not events:
        where = f" as of position {as_of}" if as_of is not None else ""
        raise CommandRefused(f"unknown plan {plan_id!r}{where}")
    doc: PlanState | None = None
    steps = []
    for event in events:
        doc = fold_plan(doc, event.payload)
        steps.append(
            ReplayStep(
                position=event.position,
                stream_version=event.stream_version,
                recorded_at=event.recorded_at,
                actor=event.actor,
                type=event.type,
                summary=summarize(event.payload),
                document=to_json(doc),
                **plan_state(doc),
            )
        )
    return steps


# ------------------------------------------------------------------------------- audit


class Violation(msgspec.Struct, kw_only=True):
    position: int | None
    plan_id: str | None
    invariant: str
    expected: str
    found: str


class AuditReport(msgspec.Struct, kw_only=True):
    ok: bool
    size: int  # the log was audited up to this position
    plans: list[str]
    checked: dict[str, int]  # how many times each check ran
    violations: list[Violation]
    # each read model's check: ok, differs, stale (another version built it: the next
    # open rebuilds it), absent; empty on a bundle, which has none
    read_models: dict[str, str] = {}
    # plans applied after a run in which no required validation ran (they opted out with
    # require_validation: false): not violations, but never to be mistaken for validated
    unvalidated: list[str] = []
    # plans that ran programs unconfined (they opted out with confinement: none): not
    # violations either, but never to be mistaken for confined work
    unconfined: list[str] = []


class _Run:
    __slots__ = (
        "attempt",
        "completed",
        "invalidated_at",
        "position",
        "resolved",
        "results",
        "run_id",
    )

    def __init__(self, payload: ValidationRunStarted, position: int) -> None:
        self.run_id = payload.run_id
        self.attempt = payload.attempt
        self.resolved = list(payload.resolved)
        self.position = position
        self.results: list[ValidationResultRecorded] = []
        self.completed: ValidationRunCompleted | None = None
        self.invalidated_at: int | None = None  # the first event after it that supersedes


class _PlanWalk:
    """What the audit remembers about one plan while walking its events."""

    def __init__(self) -> None:
        self.doc: PlanState | None = None  # None: no document yet
        self.runs: dict[str, _Run] = {}
        self.last_run: _Run | None = None
        self.last_completed: _Run | None = None
        self.escalations: dict[str, int] = {}  # decision_id -> position
        self.escalation_leaf: dict[str, bytes] = {}  # decision_id -> leaf hash
        self.escalation_halt: dict[str, str] = {}  # decision_id -> canonical halt after it
        self.pending_escalation: str | None = None
        self.decided: dict[str, tuple[int, str]] = {}  # decision_id -> (position, choice)
        self.last_escalation: str | None = None
        self.minted: dict[str, int] = {}
        self.consumed: dict[str, int] = {}
        self.apply_at: int | None = None  # Apply began (the token consumed)
        self.changes_at: int | None = None  # where its change set was recorded
        self.forged_changes = False  # its change set is not what passed: never resumed
        # A failed gate check whose routing is being collected: (position, event id,
        # expected event types, the types seen so far caused by it).
        self.routing: tuple[int, str, list[list[str]], list[str]] | None = None
        # (step, output digest) of each tool call whose stdout went over its cap: the
        # output gate on those bytes must judge them truncated (never parse them).
        self.truncated: dict[tuple[str | None, str], Truncation] = {}


def audit(
    store: LogReader,
    *,
    plan: str | None = None,
    max_violations: int = 1000,
    read_models: bool = True,
    plane_public_key: Ed25519PublicKey | None = None,
) -> AuditReport:
    """Check every invariant over the log up to its current head (one plan's events only
    with ``plan``; the attachment, tool and approver streams are always folded, as
    resolution and signatures need them). With ``plane_public_key``, every token's
    signature is checked too. On a database, for the whole log (no ``plan``) and with
    ``read_models``, also compare every read model with a fresh fold of the log up to
    its position."""
    size = store.head().size
    if plan is not None and not store.read_stream(f"plan:{plan}", as_of=size):
        raise CommandRefused(f"unknown plan {plan!r}")
    auditor = _Auditor(store, plan, max_violations, plane_public_key)
    for event in store.read_all(to_position=size):
        auditor.step(event)
    auditor.finish()
    statuses: dict[str, str] = {}
    if read_models and plan is None and isinstance(store, Store):
        for check in check_read_models(store):
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
    return AuditReport(
        ok=not auditor.violations,
        size=size,
        plans=sorted(auditor.plans),
        checked=dict(sorted(auditor.checked.items())),
        violations=auditor.violations,
        read_models=statuses,
        unvalidated=sorted(auditor.unvalidated),
        unconfined=sorted(auditor.unconfined),
    )


def check_read_models(store: Store) -> list[ReadModelCheck]:
    """Every read model as it is stored (the engine is not opened, so nothing is caught
    up or rebuilt first) against a fresh fold of the log."""
    engine = ProjectionEngine(store, ALL_PROJECTIONS)
    return [engine.check(p.name) for p in ALL_PROJECTIONS]


class _Auditor:
    def __init__(
        self,
        store: LogReader,
        plan: str | None,
        max_violations: int,
        plane_public_key: Ed25519PublicKey | None = None,
    ) -> None:
        self.store = store
        self.plane_public_key = plane_public_key
        self.plan = plan
        self.max = max_violations
        self.violations: list[Violation] = []
        self.checked: dict[str, int] = {}
        self.docs: dict[str, State | None] = {}  # stream -> folded state (None: none yet)
        self.rebuilt: dict[str, Any] = {}  # stream -> document rebuilt from deltas
        self.broken: set[str] = set()  # streams whose deltas already diverged
        self.plans: dict[str, _PlanWalk] = {}
        self.unendorsed: set[str] = set()  # approver keys the plane key did not endorse
        # The policy the plane trusts, as of the walk (keys, identity, trusted documents).
        self.policy = PolicyFold(plane_public_key)
        self.review_payloads: dict[str, list[EventPayload]] = {}  # review stream -> so far
        self.unvalidated: set[str] = set()  # plans applied after a vacuous run
        self.unconfined: set[str] = set()  # plans whose programs ran unconfined

    def violation(
        self, position: int | None, plan_id: str | None, invariant: str, expected: str, found: str
    ) -> None:
        if len(self.violations) < self.max:
            self.violations.append(
                Violation(
                    position=position,
                    plan_id=plan_id,
                    invariant=invariant,
                    expected=expected,
                    found=found,
                )
            )

    def count(self, name: str) -> None:
        self.checked[name] = self.checked.get(name, 0) + 1

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
            walk = self.plans.setdefault(key, _PlanWalk())
            self.plan_event(key, walk, event)  # sees the state before the event
        after = fold(stream, before, event.payload)
        self.docs[stream] = after
        if in_scope:
            self.check_delta(event, after)
        if kind == "plan" and in_scope:
            self.plans[key].doc = after if isinstance(after, PlanState) else None

    def finish(self) -> None:
        for plan_id, walk in self.plans.items():
            self.close_routing(plan_id, walk)
            applying = walk.doc.applying if walk.doc is not None else None
            if applying is not None and not walk.forged_changes:
                self.count("apply_incomplete")
                self.violation(
                    walk.changes_at,
                    plan_id,
                    "apply_incomplete",
                    "an Apply whose change set is recorded completes "
                    f"(evidence apply {plan_id} --resume)",
                    f"{len(applying.files)} file(s) recorded, no plan.applied",
                )

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
            rebuilt = jsonpatch.apply_patch(
                self.rebuilt.get(stream, {}), event.delta, in_place=False
            )
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
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
        if rebuilt != to_json(after):
            self.broken.add(stream)
            self.violation(
                event.position,
                _plan_of(stream),
                "delta_fold",
                f"{stream} rebuilt from its deltas equals its fold",
                f"they differ from stream version {event.stream_version} on",
            )

    # -- one plan event -----------------------------------------------------------------

    def plan_event(self, plan_id: str, walk: _PlanWalk, event: RecordedEvent) -> None:
        p = event.payload
        pos = event.position
        if isinstance(p, ToolCalled | ValidationResultRecorded) and p.confinement == "unconfined":
            self.unconfined.add(plan_id)  # reported, not a violation: the plan opted out
        if walk.routing is not None:
            if event.causation_id == walk.routing[1]:
                walk.routing[3].append(event.type)
            else:
                self.close_routing(plan_id, walk)
        validation = (ValidationRunStarted, ValidationResultRecorded, ValidationRunCompleted)
        if isinstance(p, validation) and walk.apply_at is not None:
            self.violation(
                pos,
                plan_id,
                "ordering",
                "no validation event inside Apply",
                f"{event.type} after Apply began at position {walk.apply_at}",
            )
        if isinstance(p, ValidationRunStarted):
            if walk.last_run is not None and walk.last_run.invalidated_at is None:
                walk.last_run.invalidated_at = pos
            started = _Run(p, pos)
            walk.runs[p.run_id] = started
            walk.last_run = started
        elif isinstance(p, ValidationResultRecorded):
            run = walk.runs.get(p.run_id)
            if run is None and p.mode == "informational":
                pass  # an advisory result under its own id (a review's): no run counts it
            elif run is None or run.completed is not None:
                self.violation(
                    pos,
                    plan_id,
                    "ordering",
                    "a validation result inside its started, unfinished run",
                    f"run {p.run_id} is {'unknown' if run is None else 'completed'}",
                )
            else:
                run.results.append(p)
            self.check_transform(plan_id, event, p, run)
        elif isinstance(p, ValidationRunCompleted):
            run = walk.runs.get(p.run_id)
            if run is None:
                self.violation(
                    pos,
                    plan_id,
                    "ordering",
                    "a completed run was started",
                    f"run {p.run_id} never started",
                )
            else:
                run.completed = p
                walk.last_completed = run
                self.check_outcome(plan_id, pos, run, p)
        elif isinstance(p, FixRecorded | ToolCalled):
            if walk.last_run is not None and walk.last_run.invalidated_at is None:
                walk.last_run.invalidated_at = pos
            if (
                isinstance(p, ToolCalled)
                and p.executor in ("command", "mcp", "recorded")
                and p.stdout_truncated is not msgspec.UNSET
            ):
                walk.truncated[(p.step, p.output_sha256)] = p.stdout_truncated
        elif isinstance(p, GateChecked):
            self.check_gate(plan_id, pos, p, walk)
            self.check_skill_gate(plan_id, pos, p, walk)
            self.open_routing(plan_id, walk, event, p)
        elif isinstance(p, ExecuteEntered):
            self.check_binding(plan_id, pos, walk, p)
            self.check_skill_pins(plan_id, pos, walk, p)
        elif isinstance(p, Escalated):
            walk.escalations[p.decision_id] = pos
            walk.escalation_leaf[p.decision_id] = event.leaf_hash
            walk.pending_escalation = p.decision_id
            walk.last_escalation = p.decision_id
        elif isinstance(p, PlanHalted):
            if (
                walk.pending_escalation is not None
                and walk.pending_escalation not in walk.escalation_halt
            ):
                walk.escalation_halt[walk.pending_escalation] = canonical_halt(p.raw_halt_type)
        elif isinstance(p, DecisionRecorded):
            self.check_decision(plan_id, pos, walk, p)
        elif isinstance(p, TokenMinted):
            self.check_token(plan_id, pos, walk, p)
        elif isinstance(p, TokenConsumed):
            self.count("tokens_once")
            if p.token_id not in walk.minted:
                self.violation(
                    pos,
                    plan_id,
                    "ordering",
                    "only a token minted for the plan is consumed",
                    f"token {p.token_id} was never minted",
                )
            elif p.token_id in walk.consumed:
                self.violation(
                    pos,
                    plan_id,
                    "ordering",
                    "a token is consumed once",
                    f"token {p.token_id} was already consumed at position "
                    f"{walk.consumed[p.token_id]}",
                )
            else:
                token = walk.doc.token if walk.doc is not None else None
                if token is None or token.token_id != p.token_id or token.status != "minted":
                    self.violation(
                        pos,
                        plan_id,
                        "token_from_passing_run",
                        "the consumed token is the plan's current, unsuperseded token",
                        f"token {p.token_id} is "
                        f"{token.status if token is not None else 'not current'}",
                    )
            walk.consumed.setdefault(p.token_id, pos)
            walk.apply_at = walk.apply_at or pos
        elif isinstance(p, ChangesRecorded):
            walk.changes_at = pos
            if walk.doc is not None:
                self.count("change_set")
                problem = change_set_problem(walk.doc, list(p.changes), self.store.get_blob)
                if problem is not None:
                    walk.forged_changes = True
                    self.violation(
                        pos, plan_id, "change_set", problem, f"{len(p.changes)} change(s) recorded"
                    )
        elif isinstance(p, PlanApplied):
            if walk.doc is not None and walk.doc.unvalidated:
                self.unvalidated.add(plan_id)
            if p.token_id not in walk.consumed:
                self.violation(
                    pos,
                    plan_id,
                    "ordering",
                    "Apply follows the consumption of its token",
                    f"token {p.token_id} was not consumed",
                )
            walk.apply_at = walk.apply_at or pos

    # -- INV3 and the escalation order ------------------------------------------------

    def check_decision(self, plan_id: str, pos: int, walk: _PlanWalk, p: DecisionRecorded) -> None:
        self.count("blocker_not_overridable")
        if p.decision_id not in walk.escalations:
            self.violation(
                pos,
                plan_id,
                "blocker_not_overridable",
                "a decision follows an escalation",
                f"decision {p.decision_id} has no escalation before it",
            )
        elif p.decision_id in walk.decided:
            self.violation(
                pos,
                plan_id,
                "blocker_not_overridable",
                "one decision per escalation",
                f"decision {p.decision_id} was already recorded at position "
                f"{walk.decided[p.decision_id][0]}",
            )
        else:
            halt = walk.escalation_halt.get(p.decision_id, "escalate")
            if halt != "escalate":
                self.violation(
                    pos,
                    plan_id,
                    "blocker_not_overridable",
                    "no decision concerns a blocker",
                    f"decision {p.decision_id} follows a halt classified {halt}",
                )
        self.count("decision_signature")
        problem = decision_problem(
            p, walk.escalation_leaf.get(p.decision_id), self.approver_key(p.key_fingerprint)
        )
        if problem is not None:
            self.violation(
                pos,
                plan_id,
                "decision_signature",
                problem,
                f"decision {p.decision_id} recorded as {p.approver}'s",
            )
        walk.decided.setdefault(p.decision_id, (pos, p.choice))
        if walk.pending_escalation == p.decision_id:
            walk.pending_escalation = None

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

    # -- the binding set --------------------------------------------------------------

    def check_binding(self, plan_id: str, pos: int, walk: _PlanWalk, p: ExecuteEntered) -> None:
        self.count("binding")
        pinned = list(walk.doc.binding) if walk.doc is not None else []
        expected = pin_binding(pinned, self.resolve_now(walk.doc))
        if list(p.binding) != expected:
            self.violation(
                pos,
                plan_id,
                "binding",
                f"the binding set pinned at Execute: {_members(expected)}",
                _members(p.binding),
            )

    # -- skills -----------------------------------------------------------------------

    def check_skill_pins(self, plan_id: str, pos: int, walk: _PlanWalk, p: ExecuteEntered) -> None:
        """A plan's first Execute pins its skills as the registry defined them then."""
        doc = walk.doc
        if doc is None or doc.skills is msgspec.UNSET or doc.skill_pins is not msgspec.UNSET:
            return  # no skills, or pinned already (later pins repeat them: a plan rule)
        self.count("skills")
        expected = {
            name: SkillPin(version=skill.version, members=list(skill.members))
            for name in doc.skills
            if isinstance(skill := self.policy_docs().get(f"skill:{name}"), SkillState)
        }
        pinned = {} if p.skills is msgspec.UNSET else dict(p.skills)
        if pinned != expected:
            self.violation(
                pos,
                plan_id,
                "skills",
                f"the skills pinned at the first Execute: {_pins(expected)}",
                _pins(pinned),
            )

    def check_skill_gate(self, plan_id: str, pos: int, p: GateChecked, walk: _PlanWalk) -> None:
        """An input gate refuses a registered tool outside the plan's skills (and only
        such a tool) with ``not_in_skill``."""
        if p.gate != "input" or walk.doc is None or walk.doc.skills is msgspec.UNSET:
            return
        self.count("skills")
        outside = isinstance(
            self.policy_docs().get(f"tool:{p.tool}"), ToolState
        ) and not walk.doc.may_call(p.tool)
        refused = any(d.kind == "not_in_skill" for d in p.deviations)
        if outside != refused or (outside and p.verdict != "fail"):
            self.violation(
                pos,
                plan_id,
                "skills",
                f"tool {p.tool!r} is {'outside' if outside else 'in'} the plan's skills: "
                + ("fail, not_in_skill" if outside else "no not_in_skill deviation"),
                f"{p.verdict}, {', '.join(d.kind for d in p.deviations) or 'no deviation'}",
            )

    # -- INV1 -------------------------------------------------------------------------

    def check_token(self, plan_id: str, pos: int, walk: _PlanWalk, p: TokenMinted) -> None:
        self.count("token_from_passing_run")
        if p.token_id in walk.minted:  # a replayed mint would revive a superseded token
            self.violation(
                pos,
                plan_id,
                "ordering",
                f"token {p.token_id} is minted once",
                f"it was minted at position {walk.minted[p.token_id]} already",
            )
        walk.minted.setdefault(p.token_id, pos)
        run = walk.runs.get(p.run_id)
        last = walk.last_completed
        if run is None or run.completed is None:
            self.violation(
                pos,
                plan_id,
                "token_from_passing_run",
                "a token is minted from a completed run",
                f"run {p.run_id} {'never started' if run is None else 'is open'}",
            )
            return
        if run is not last:
            self.violation(
                pos,
                plan_id,
                "token_from_passing_run",
                "a token is minted from the plan's latest run",
                f"run {p.run_id} is not the latest completed run",
            )
        if last is not None and last.completed is not None and last.completed.outcome == "blocker":
            self.violation(
                pos,
                plan_id,
                "blocker_not_overridable",
                "no token after a blocker without a later passing run",
                f"the latest run {last.run_id} is a blocker",
            )
        elif run.completed.outcome != "pass":
            self.violation(
                pos,
                plan_id,
                "token_from_passing_run",
                "a token only from a passing run",
                f"run {p.run_id} completed with outcome {run.completed.outcome}",
            )
        if run.invalidated_at is not None:
            self.violation(
                pos,
                plan_id,
                "token_from_passing_run",
                "nothing invalidates the run before the token",
                f"position {run.invalidated_at} superseded run {p.run_id}",
            )
        doc = walk.doc
        plan_attempt = doc.attempt if doc is not None else None
        if p.attempt != run.attempt or p.attempt != plan_attempt:
            self.violation(
                pos,
                plan_id,
                "token_from_passing_run",
                f"the token's attempt {p.attempt} is the run's and the plan's",
                f"run attempt {run.attempt}, plan attempt {plan_attempt}",
            )
        if p.results_digest != run.completed.results_digest:
            self.violation(
                pos,
                plan_id,
                "token_from_passing_run",
                "the token binds the run's results digest",
                f"{p.results_digest} != {run.completed.results_digest}",
            )
        if results_digest(run.results) != run.completed.results_digest:
            self.violation(
                pos,
                plan_id,
                "token_from_passing_run",
                "the run's results digest is the digest of its recorded results",
                "it is not",
            )
        passing = {r.attachment_id for r in run.results if r.verdict is True and r.cause is None}
        for r in run.resolved:
            if r.mode == "required" and r.attachment_id not in passing:
                self.violation(
                    pos,
                    plan_id,
                    "token_from_passing_run",
                    f"required attachment {r.attachment_id} "
                    f"({r.validation}) has a passing real result in run {p.run_id}",
                    "it has none",
                )
        binding = list(doc.binding) if doc is not None else []
        if run.resolved != binding:
            self.violation(
                pos,
                plan_id,
                "binding",
                f"the token's run ran the plan's whole binding set {_members(binding)}",
                _members(run.resolved),
            )
        self.count("no_vacuous_pass")
        opted_out = doc is not None and not doc.global_config.require_validation
        if not any(r.mode == "required" for r in run.resolved) and not opted_out:
            self.violation(
                pos,
                plan_id,
                "no_vacuous_pass",
                "a token from a run in which a required validation ran (the plan did not opt out)",
                f"run {p.run_id} ran no required validation",
            )
        self.check_token_signature(plan_id, pos, p)
        self.check_evidence(plan_id, pos, run)
        # The escalation order: escalate -> decision -> re-validation -> token.
        esc = walk.last_escalation
        if esc is not None:
            self.count("ordering")
            decided = walk.decided.get(esc)
            if decided is None or decided[1] != "revise":
                self.violation(
                    pos,
                    plan_id,
                    "ordering",
                    f"escalation {esc} is decided (revise) before a token",
                    "no such decision before the token",
                )
            elif run.position < decided[0]:
                self.violation(
                    pos,
                    plan_id,
                    "ordering",
                    f"the token's run started after the decision at position {decided[0]}",
                    f"run {p.run_id} started at position {run.position}",
                )

    def check_token_signature(self, plan_id: str, pos: int, p: TokenMinted) -> None:
        if self.plane_public_key is None:
            return  # not checkable without the plane's public key
        self.count("token_signature")
        if not token_signed(p, self.plane_public_key):
            self.violation(
                pos,
                plan_id,
                "token_signature",
                f"token {p.token_id} signed by the plane key",
                "its signature does not verify",
            )

    def check_evidence(self, plan_id: str, pos: int, run: _Run) -> None:
        """Every raw output the token's results were judged on is still there."""
        for r in run.results:
            if r.raw_output_sha256 is None:
                continue
            self.count("evidence")
            if self.store.get_blob(r.raw_output_sha256) is None:
                self.violation(
                    pos,
                    plan_id,
                    "evidence",
                    f"the raw output of {r.validation} (run {run.run_id}) is in the blob store",
                    f"blob {r.raw_output_sha256} is missing",
                )

    def resolve_now(self, plan_doc: PlanState | None) -> list[ResolvedAttachment]:
        if plan_doc is None:
            return []  # a forged stream with no plan.created: nothing applies to it
        docs = self.policy_docs()
        attachments = [d for d in docs.values() if isinstance(d, AttachmentState)]
        tools = {
            d.name: d for d in docs.values() if isinstance(d, ToolState) and d.kind == "validation"
        }
        return resolve_plan(attachments, tools, plan_doc)

    # -- re-derivation ----------------------------------------------------------------

    def check_outcome(self, plan_id: str, pos: int, run: _Run, p: ValidationRunCompleted) -> None:
        self.count("outcome")
        doc = self.plans[plan_id].doc
        outcome, _raw, _reason = classify(
            (msgspec.to_builtins(r) for r in run.results),
            require_validation=doc.global_config.require_validation if doc is not None else True,
        )
        if outcome != p.outcome:
            self.violation(
                pos,
                plan_id,
                "outcome_drift",
                f"outcome {outcome} (rules v{RULES_VERSION})",
                f"recorded {p.outcome} (rules v{p.rules_version})",
            )
        vacuous = not any(r.mode == "required" for r in run.results)
        if vacuous != p.vacuous:
            self.violation(
                pos,
                plan_id,
                "no_vacuous_pass",
                f"the run is recorded vacuous={vacuous}",
                f"vacuous={p.vacuous}",
            )

    def open_routing(
        self, plan_id: str, walk: _PlanWalk, event: RecordedEvent, p: GateChecked
    ) -> None:
        config = walk.doc.global_config if walk.doc is not None else None
        strict = config.strict_mode if config is not None else None
        if p.strict_mode != strict:
            self.violation(
                event.position,
                plan_id,
                "gate_routing",
                f"the gate check records the plan's strict_mode {strict}",
                f"strict_mode {p.strict_mode}",
            )
        if p.verdict != "fail":
            return
        if p.strict_mode:
            expected = [["plan.compensation_requested", "plan.halted"]]
        elif config is None or p.iteration < config.max_iterations:
            expected = [["plan.attempt_failed"]]
        else:  # the attempt's last iteration: the failure loop's next step
            assert walk.doc is not None
            if walk.doc.revisions_used < config.max_strategy_revisions:
                expected = [["plan.attempt_failed", "plan.strategy_revision_requested"]]
            else:
                expected = [["plan.attempt_failed", "plan.escalated", "plan.halted"]]
            # Ledgers written before the critique loop fed the failure loop halted the
            # plan terminally here: stricter than today (it ends the plan), so accepted.
            expected.append(["plan.attempt_failed", "plan.halted"])
        walk.routing = (event.position, event.event_id, expected, [])

    def close_routing(self, plan_id: str, walk: _PlanWalk) -> None:
        if walk.routing is None:
            return
        position, _event_id, expected, seen = walk.routing
        walk.routing = None
        self.count("gate_routing")
        if seen not in expected:
            self.violation(
                position,
                plan_id,
                "gate_routing",
                f"the failed gate check is followed by {', '.join(expected[0])}",
                ", ".join(seen) or "nothing caused by it",
            )

    def check_gate(self, plan_id: str, pos: int, p: GateChecked, walk: _PlanWalk) -> None:
        if p.schema_sha256 is None:
            return  # no declaration to check against (an invented tool, no output schema)
        self.count("gate_rederivation")
        schema_bytes = self.store.get_blob(p.schema_sha256)
        checked = self.store.get_blob(p.checked_sha256) if p.checked_sha256 else None
        if schema_bytes is None or checked is None:
            missing = "schema" if schema_bytes is None else "checked bytes"
            self.violation(
                pos,
                plan_id,
                "gate_rederivation",
                f"the gate's {missing} are in the blob store",
                f"blob {p.schema_sha256 if schema_bytes is None else p.checked_sha256} is missing",
            )
            return
        # A truncated output is never parsed: recorded so (checked_truncated), or the kept
        # bytes of a call whose stdout went over its cap, checked as its output.
        truncated = (
            p.checked_truncated
            if p.checked_truncated is not msgspec.UNSET
            else walk.truncated.get((p.step, p.checked_sha256))
            if p.gate == "output"
            else None
        )
        if truncated is not None:
            deviations = [truncated_deviation(truncated)]
            if len(checked) != truncated.kept:
                self.violation(
                    pos,
                    plan_id,
                    "gate_rederivation",
                    f"the checked bytes are the {truncated.kept} bytes kept of a truncated output",
                    f"{len(checked)} bytes",
                )
        else:
            schema = msgspec.json.decode(bytes(schema_bytes))
            deviations = check(schema, bytes(checked), schema_sha256=p.schema_sha256)
        verdict = "fail" if deviations else "pass"
        if verdict != p.verdict or list(deviations) != list(p.deviations):
            self.violation(
                pos,
                plan_id,
                "gate_rederivation",
                f"verdict {verdict} with {len(deviations)} deviation(s) {_pointers(deviations)}",
                f"recorded {p.verdict} with {len(p.deviations)} deviation(s) "
                f"{_pointers(p.deviations)}",
            )

    def check_transform(
        self, plan_id: str, event: RecordedEvent, p: ValidationResultRecorded, run: _Run | None
    ) -> None:
        if run is None or p.raw_output_sha256 is None:
            return
        member = next((r for r in run.resolved if r.attachment_id == p.attachment_id), None)
        tool = self.policy_docs().get(f"tool:{p.validation}")
        spec = (
            tool.versions.get(str(member.validation_version))
            if member is not None and isinstance(tool, ToolState)
            else None
        )
        transform = spec.transform if spec is not None and spec.wraps else None
        if not isinstance(transform, str) or not transform:
            return
        if p.verdict is None and p.cause != "malformed":
            return  # it never reached the transform (timeout, crash, missing program)
        self.count("transform_rederivation")
        if p.stdout_truncated is not msgspec.UNSET:  # never transformed: no verdict
            if p.verdict is not None:
                self.violation(
                    event.position,
                    plan_id,
                    "transform_rederivation",
                    "no verdict: the wrapped tool's stdout was truncated at "
                    f"{p.stdout_truncated.kept} bytes (never transformed)",
                    f"passed={p.verdict} message={p.message!r}",
                )
            return
        raw = self.store.get_blob(p.raw_output_sha256)
        if raw is None:  # the input of the re-derivation is gone: a finding, not a skip
            self.violation(
                event.position,
                plan_id,
                "evidence",
                f"the raw output {p.validation}'s transform ran on is in the blob store",
                f"blob {p.raw_output_sha256} is missing",
            )
            return
        recorded = (
            f"passed={p.verdict} message={p.message!r}"
            if p.verdict is not None
            else f"no verdict ({p.cause})"
        )
        try:
            result = apply_transform(transform, msgspec.json.decode(bytes(raw)))
        except (TransformError, msgspec.DecodeError) as exc:
            if p.verdict is not None:
                self.violation(
                    event.position,
                    plan_id,
                    "transform_rederivation",
                    f"the transform fails on the raw output ({exc})",
                    recorded,
                )
            return
        derived = (result["passed"], result.get("message"), result.get("data"))
        if derived != (p.verdict, p.message, p.data):
            self.violation(
                event.position,
                plan_id,
                "transform_rederivation",
                f"passed={derived[0]} message={derived[1]!r}",
                recorded,
            )


def _members(binding: Iterable[ResolvedAttachment]) -> str:
    shown = [
        f"{b.validation} v{b.validation_version} {b.mode} ({b.attachment_id})" for b in binding
    ]
    return "[" + ", ".join(shown) + "]"


def _plan_of(stream: str) -> str | None:
    kind, _, key = stream.partition(":")
    return key if kind == "plan" else None


def _pins(pins: dict[str, SkillPin]) -> str:
    return ", ".join(f"{name} v{pin.version}" for name, pin in sorted(pins.items())) or "none"


def _pointers(deviations: Iterable[Any]) -> str:
    found = [f"{d.kind}@{d.pointer or '/'}" for d in deviations]
    return "[" + ", ".join(found[:5]) + (", …" if len(found) > 5 else "") + "]"


def check_files(store: LogReader, plan_id: str, directory: Path) -> list[Violation]:
    """``audit --plan P --files DIR``: DIR against what it should hold — the resource as
    P's snapshot at Execute saw it, plus every change set applied to that resource since
    (P's own included, even unfinished), in log order — every differing path reported,
    so a write that no Apply made is seen too. DIR is the resource it names (or P's only
    directory or file resource)."""
    events = store.read_stream(f"plan:{plan_id}")
    doc = fold_plan.fold_all(e.payload for e in events)
    if doc is None or doc.snapshot_sha256 is msgspec.UNSET:
        return [
            Violation(
                position=None,
                plan_id=plan_id,
                invariant="files",
                expected=f"plan {plan_id} entered Execute with a snapshot of its resources",
                found="no snapshot: nothing to compare the files with",
            )
        ]
    blob = store.get_blob(doc.snapshot_sha256)
    snapshot = decode_trees(bytes(blob)) if blob is not None else {}
    trees = {r: t for r, t in snapshot.items() if t[0] != "name"}
    chosen = next(
        (r for r in trees if Path(r).resolve() == directory.resolve()),
        next(iter(trees)) if len(trees) == 1 else None,
    )
    if chosen is None:
        return [
            Violation(
                position=None,
                plan_id=plan_id,
                invariant="files",
                expected=f"{directory} is one of plan {plan_id}'s resources",
                found=", ".join(sorted(trees)) or "no directory or file resource",
            )
        ]
    kind, manifest = trees[chosen]
    expected: dict[str, Entry | None] = {
        path: (str(e[0]), int(e[1]), str(e[2])) for path, e in manifest.items()
    }
    started = next(e.position for e in events if isinstance(e.payload, ExecuteEntered))
    for change in _applied_changes(store, plan_id, started):
        if change.resource == chosen:
            expected[change.path] = change_entry(change)
    found_entries = manifest_of(entries(directory), kind, os.path.basename(chosen))
    actual: dict[str, Entry] = {
        path: (str(e[0]), int(e[1]), str(e[2])) for path, e in found_entries.items()
    }
    problems: list[Violation] = []
    for path in sorted(set(expected) | set(actual)):
        want, have = expected.get(path), actual.get(path)
        if want == have:
            continue
        problems.append(
            Violation(
                position=None,
                plan_id=plan_id,
                invariant="files",
                expected=f"{path}: {_entry_text(want)}",
                found=_entry_text(have),
            )
        )
    return problems


def _applied_changes(store: LogReader, plan_id: str, since: int) -> list[FileChange]:
    """The change sets recorded after position ``since`` that count: every plan's that
    completed (``plan.applied``), and ``plan_id``'s own even unfinished; in log order."""
    types = [ChangesRecorded.type_name(), PlanApplied.type_name()]
    recorded: dict[str, tuple[int, list[FileChange]]] = {}
    applied: set[str] = set()
    for event in store.read_all(since, types=types):
        p = event.payload
        if isinstance(p, ChangesRecorded):
            recorded[p.token_id] = (event.position, list(p.changes))
            if p.plan_id == plan_id:
                applied.add(p.token_id)
        elif isinstance(p, PlanApplied):
            applied.add(p.token_id)
    ordered = sorted(recorded[t] for t in applied if t in recorded)
    return [change for _position, changes in ordered for change in changes]


def _entry_text(entry: Entry | None) -> str:
    if entry is None:
        return "absent"
    kind, mode, content = entry
    if kind == "file":
        return f"file {oct(mode)} sha256 {content}"
    if kind == "symlink":
        return f"symlink to {content}"
    return f"{kind} {oct(mode)}"
