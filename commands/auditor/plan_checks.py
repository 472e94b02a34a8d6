"""The checks of one plan's stream, event by event, in log order: each plan event's
kind has its own step in a dispatch table (``projections.folding.Steps``, as the folds
and the plan rules dispatch), which sees the plan's walk before the event is folded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from commands.rules.approvals import duties_problem, escalation_problem
from commands.rules.trust import decision_problem, expiry_problem
from commands.runner.sandbox import change_set_problem
from ledger import LogReader, RecordedEvent
from ledger.events import (
    ChangesRecorded,
    DecisionRecorded,
    Escalated,
    EscalationExpired,
    ExecuteEntered,
    FixRecorded,
    GateChecked,
    PlanApplied,
    PlanHalted,
    SkillPin,
    TokenConsumed,
    TokenMinted,
    ToolCalled,
    ValidationResultRecorded,
    ValidationRunCompleted,
    ValidationRunStarted,
)
from ledger.events.validation import ResolvedAttachment
from projections.documents import State
from projections.folding import Steps
from projections.outcomes import canonical_halt
from projections.resolution import pin_binding, resolve_plan
from projections.states import AttachmentState, PlanState, SkillState, ToolState

from .findings import Findings, Reporting
from .rederive import Rederivation
from .tokens import TokenChecks, members
from .walk import LogView, PlanWalk, Run

__all__ = ["PlanChecks"]

# (the checks, the plan's id, its walk, the event, its payload)
PlanStep = Callable[["PlanChecks", str, PlanWalk, RecordedEvent, Any], None]
_PLAN_STEPS: Steps[PlanStep] = Steps()
on = _PLAN_STEPS.register

_VALIDATION = (ValidationRunStarted, ValidationResultRecorded, ValidationRunCompleted)


class PlanChecks(Reporting):
    """Every plan's walk, and the checks of its events."""

    def __init__(
        self,
        findings: Findings,
        store: LogReader,
        log: LogView,
        plane_public_key: Ed25519PublicKey | None,
    ) -> None:
        super().__init__(findings)
        self.store = store
        self.log = log
        self.plans: dict[str, PlanWalk] = {}
        self.unvalidated: set[str] = set()  # plans applied after a vacuous run
        self.unconfined: set[str] = set()  # plans whose programs ran unconfined
        self.tokens = TokenChecks(findings, store, plane_public_key)
        self.rederivation = Rederivation(findings, store, log)
        self.plane_public_key = plane_public_key

    def policy_docs(self) -> dict[str, State | None]:
        return self.log.policy_docs()

    # -- the walk ---------------------------------------------------------------------

    def take(self, plan_id: str, event: RecordedEvent) -> None:
        """Check plan ``plan_id``'s ``event`` against its state before the event."""
        walk = self.plans.setdefault(plan_id, PlanWalk())
        self.plan_event(plan_id, walk, event)

    def folded(self, plan_id: str, after: State | None) -> None:
        """The plan's state after its event."""
        self.plans[plan_id].doc = after if isinstance(after, PlanState) else None

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

    def plan_event(self, plan_id: str, walk: PlanWalk, event: RecordedEvent) -> None:
        p = event.payload
        pos = event.position
        if isinstance(p, ToolCalled | ValidationResultRecorded) and p.confinement == "unconfined":
            self.unconfined.add(plan_id)  # reported, not a violation: the plan opted out
        if walk.routing is not None:
            if event.causation_id == walk.routing[1]:
                walk.routing[3].append(event.type)
            else:
                self.close_routing(plan_id, walk)
        if isinstance(p, _VALIDATION) and walk.apply_at is not None:
            self.violation(
                pos,
                plan_id,
                "ordering",
                "no validation event inside Apply",
                f"{event.type} after Apply began at position {walk.apply_at}",
            )
        step = _PLAN_STEPS.lookup(type(p))
        if step is not None:
            step(self, plan_id, walk, event, p)

    # -- one step per plan event kind ---------------------------------------------------

    @on(ValidationRunStarted)
    def run_started(
        self, plan_id: str, walk: PlanWalk, event: RecordedEvent, p: ValidationRunStarted
    ) -> None:
        walk.supersede_last_run(event.position)
        started = Run(p, event.position)
        walk.runs[p.run_id] = started
        walk.last_run = started

    @on(ValidationResultRecorded)
    def result_recorded(
        self, plan_id: str, walk: PlanWalk, event: RecordedEvent, p: ValidationResultRecorded
    ) -> None:
        run = walk.runs.get(p.run_id)
        if run is None and p.mode == "informational":
            pass  # an advisory result under its own id (a review's): no run counts it
        elif run is None or run.completed is not None:
            self.violation(
                event.position,
                plan_id,
                "ordering",
                "a validation result inside its started, unfinished run",
                f"run {p.run_id} is {'unknown' if run is None else 'completed'}",
            )
        else:
            run.results.append(p)
        self.rederivation.check_transform(plan_id, event, p, run)

    @on(ValidationRunCompleted)
    def run_completed(
        self, plan_id: str, walk: PlanWalk, event: RecordedEvent, p: ValidationRunCompleted
    ) -> None:
        run = walk.runs.get(p.run_id)
        if run is None:
            self.violation(
                event.position,
                plan_id,
                "ordering",
                "a completed run was started",
                f"run {p.run_id} never started",
            )
            return
        run.completed = p
        walk.last_completed = run
        self.rederivation.check_outcome(plan_id, event.position, run, p, walk.doc)

    @on(FixRecorded)
    def fix_recorded(
        self, plan_id: str, walk: PlanWalk, event: RecordedEvent, p: FixRecorded
    ) -> None:
        walk.supersede_last_run(event.position)

    @on(ToolCalled)
    def tool_called(
        self, plan_id: str, walk: PlanWalk, event: RecordedEvent, p: ToolCalled
    ) -> None:
        walk.supersede_last_run(event.position)
        if p.executor in ("command", "mcp", "recorded") and p.stdout_truncated is not msgspec.UNSET:
            walk.truncated[(p.step, p.output_sha256)] = p.stdout_truncated

    @on(GateChecked)
    def gate_checked(
        self, plan_id: str, walk: PlanWalk, event: RecordedEvent, p: GateChecked
    ) -> None:
        self.rederivation.check_gate(plan_id, event.position, p, walk)
        self.check_skill_gate(plan_id, event.position, p, walk)
        self.open_routing(plan_id, walk, event, p)

    @on(ExecuteEntered)
    def execute_entered(
        self, plan_id: str, walk: PlanWalk, event: RecordedEvent, p: ExecuteEntered
    ) -> None:
        self.check_binding(plan_id, event.position, walk, p)
        self.check_skill_pins(plan_id, event.position, walk, p)

    @on(Escalated)
    def escalated(self, plan_id: str, walk: PlanWalk, event: RecordedEvent, p: Escalated) -> None:
        approvals = self.log.approvals()
        if approvals is not None and walk.doc is not None:
            self.count("approvals")
            problem = escalation_problem(p, walk.doc.global_config, approvals, event.position)
            if problem is not None:
                self.violation(
                    event.position, plan_id, "approvals", problem,
                    f"escalation {p.decision_id} asks for {p.approvals_required or 1}",
                )  # fmt: skip
        walk.escalations[p.decision_id] = event.position
        walk.escalation_leaf[p.decision_id] = event.leaf_hash
        walk.pending_escalation = p.decision_id
        walk.last_escalation = p.decision_id

    @on(PlanHalted)
    def halted(self, plan_id: str, walk: PlanWalk, event: RecordedEvent, p: PlanHalted) -> None:
        pending = walk.pending_escalation
        if pending is not None and pending not in walk.escalation_halt:
            walk.escalation_halt[pending] = canonical_halt(p.raw_halt_type)

    @on(DecisionRecorded)
    def decision_recorded(
        self, plan_id: str, walk: PlanWalk, event: RecordedEvent, p: DecisionRecorded
    ) -> None:
        self.check_decision(plan_id, event.position, walk, p)

    @on(EscalationExpired)
    def escalation_expired(
        self, plan_id: str, walk: PlanWalk, event: RecordedEvent, p: EscalationExpired
    ) -> None:
        """The plane's denial of an escalation nobody decided in time: signed by the
        plane key over that escalation (checked with the key), and it ends the wait."""
        if self.plane_public_key is not None:
            self.count("expiry_signature")
            leaf = walk.escalation_leaf.get(p.decision_id)
            problem = expiry_problem(p, leaf, self.plane_public_key)
            if problem is not None:
                self.violation(
                    event.position, plan_id, "expiry_signature", problem,
                    f"escalation {p.decision_id} denied as the plane's",
                )  # fmt: skip
        walk.decided.setdefault(p.decision_id, (event.position, "expired"))
        if walk.pending_escalation == p.decision_id:
            walk.pending_escalation = None

    @on(TokenMinted)
    def token_minted(
        self, plan_id: str, walk: PlanWalk, event: RecordedEvent, p: TokenMinted
    ) -> None:
        self.tokens.check_token(plan_id, event.position, walk, p)

    @on(TokenConsumed)
    def token_consumed(
        self, plan_id: str, walk: PlanWalk, event: RecordedEvent, p: TokenConsumed
    ) -> None:
        pos = event.position
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
                f"token {p.token_id} was already consumed at position {walk.consumed[p.token_id]}",
            )
        else:
            self.check_current_token(plan_id, pos, walk, p)
        walk.consumed.setdefault(p.token_id, pos)
        walk.apply_at = walk.apply_at or pos

    def check_current_token(self, plan_id: str, pos: int, walk: PlanWalk, p: TokenConsumed) -> None:
        token = walk.doc.token if walk.doc is not None else None
        if token is None or token.token_id != p.token_id or token.status != "minted":
            self.violation(
                pos,
                plan_id,
                "token_from_passing_run",
                "the consumed token is the plan's current, unsuperseded token",
                f"token {p.token_id} is {token.status if token is not None else 'not current'}",
            )

    @on(ChangesRecorded)
    def changes_recorded(
        self, plan_id: str, walk: PlanWalk, event: RecordedEvent, p: ChangesRecorded
    ) -> None:
        walk.changes_at = event.position
        if walk.doc is None:
            return
        self.count("change_set")
        problem = change_set_problem(walk.doc, list(p.changes), self.store.get_blob)
        if problem is not None:
            walk.forged_changes = True
            self.violation(
                event.position,
                plan_id,
                "change_set",
                problem,
                f"{len(p.changes)} change(s) recorded",
            )

    @on(PlanApplied)
    def applied(self, plan_id: str, walk: PlanWalk, event: RecordedEvent, p: PlanApplied) -> None:
        if walk.doc is not None and walk.doc.unvalidated:
            self.unvalidated.add(plan_id)
        if p.token_id not in walk.consumed:
            self.violation(
                event.position,
                plan_id,
                "ordering",
                "Apply follows the consumption of its token",
                f"token {p.token_id} was not consumed",
            )
        walk.apply_at = walk.apply_at or event.position

    # -- INV3 and the escalation order ------------------------------------------------

    def check_decision(self, plan_id: str, pos: int, walk: PlanWalk, p: DecisionRecorded) -> None:
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
            p, walk.escalation_leaf.get(p.decision_id), self.log.approver_key(p.key_fingerprint)
        )
        if problem is not None:
            self.violation(
                pos,
                plan_id,
                "decision_signature",
                problem,
                f"decision {p.decision_id} recorded as {p.approver}'s",
            )
        approvals = self.log.approvals()
        if approvals is not None:
            self.count("approvals")
            conflict = duties_problem(p, approvals, pos)
            if conflict is not None:
                self.violation(
                    pos, plan_id, "approvals", conflict,
                    f"decision {p.decision_id} ({p.choice}) recorded as {p.approver}'s",
                )  # fmt: skip
        if _partial(walk, p):  # k of n: one approver's signature of several
            return
        walk.decided.setdefault(p.decision_id, (pos, p.choice))
        if walk.pending_escalation == p.decision_id:
            walk.pending_escalation = None

    # -- the binding set --------------------------------------------------------------

    def check_binding(self, plan_id: str, pos: int, walk: PlanWalk, p: ExecuteEntered) -> None:
        self.count("binding")
        pinned = list(walk.doc.binding) if walk.doc is not None else []
        expected = pin_binding(pinned, self.resolve_now(walk.doc))
        if list(p.binding) != expected:
            self.violation(
                pos,
                plan_id,
                "binding",
                f"the binding set pinned at Execute: {members(expected)}",
                members(p.binding),
            )

    # -- skills -----------------------------------------------------------------------

    def check_skill_pins(self, plan_id: str, pos: int, walk: PlanWalk, p: ExecuteEntered) -> None:
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

    def check_skill_gate(self, plan_id: str, pos: int, p: GateChecked, walk: PlanWalk) -> None:
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

    def resolve_now(self, plan_doc: PlanState | None) -> list[ResolvedAttachment]:
        if plan_doc is None:
            return []  # a forged stream with no plan.created: nothing applies to it
        docs = self.policy_docs()
        attachments = [d for d in docs.values() if isinstance(d, AttachmentState)]
        tools = {
            d.name: d for d in docs.values() if isinstance(d, ToolState) and d.kind == "validation"
        }
        return resolve_plan(attachments, tools, plan_doc)

    def open_routing(
        self, plan_id: str, walk: PlanWalk, event: RecordedEvent, p: GateChecked
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

    def close_routing(self, plan_id: str, walk: PlanWalk) -> None:
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


def _pins(pins: dict[str, SkillPin]) -> str:
    return ", ".join(f"{name} v{pin.version}" for name, pin in sorted(pins.items())) or "none"


def _partial(walk: PlanWalk, p: DecisionRecorded) -> bool:
    """The decision is one approver's of an escalation that needs more to stand."""
    pending = walk.doc.pending_decision if walk.doc is not None else None
    return pending is not None and not pending.stands_with(p.approver, p.choice)
