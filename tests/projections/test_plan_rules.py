"""Every transition rule of ``projections.plan_rules``, one case each, in one table.

Each case is a history whose last event breaks one rule (every event before it is
legal). The table is read three ways:

1. ``broken_rule`` itself, offline: every event of the history but the last is legal,
   and the last breaks the case's rule (a direct unit test of the rules);
2. the plane, on a real SQLite file and on the real PostgreSQL: the history is appended
   past the plane through the public ``Store`` API (as an agent holding the database
   file can), and the plane refuses the plan with ``TamperedPlan`` naming the rule and
   the position of the forged event (its own check, not another layer's: the events
   before it are well formed, tokens signed with the real plane key, binding sets and
   skills pinned as the registry says, so nothing else gives the forgery away);
3. ``evidence audit`` reports an ``illegal_transition`` at each of those positions.

A rule removed, or a condition of it dropped, fails the case that names it
(``python -m tests.mutation.run`` removes each one in turn: docs/testing.md). A new rule
lands with its case here and its mutant in ``tests/mutation/mutants.toml``.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from commands.auditor.audit import audit
from commands.plane import Plane
from commands.plane.attachments import attach
from commands.plane.authority import TamperedPlan
from commands.plane.registry import define_skill, register_tool, register_validation
from commands.rules.signing import (
    load_or_create_plane_key,
    mint_token,
    token_digest,
    token_signature,
)
from commands.runner.sandbox import encode_trees
from ledger.events import (
    ApproverKeyAdded,
    ApproverKeyRevoked,
    AttachmentCreated,
    AttachmentDetached,
    AttemptFailed,
    ChangesRecorded,
    CompensationCompleted,
    CompensationRequested,
    DecisionRecorded,
    Escalated,
    EscalationExpired,
    EventPayload,
    ExecuteEntered,
    FixRecorded,
    GateChecked,
    GlobalConfig,
    McpInputGiven,
    McpInputRequired,
    PlanApplied,
    PlanCreated,
    PlanHalted,
    ResolvedAttachment,
    SkillDefined,
    SkillPin,
    StrategyRecorded,
    StrategyRevisionRequested,
    TokenConsumed,
    TokenMinted,
    ToolCalled,
    ToolRegistered,
    ValidationResultRecorded,
    ValidationRunCompleted,
    ValidationRunStarted,
)
from projections.documents import fold, new_plan
from projections.outcomes import canonical_halt
from projections.plan_rules import broken_rule, pins_kept
from projections.resolution import pin_binding
from tests.helpers import forge

SNAPSHOT_BLOB = encode_trees({})  # a plan on resources that are not directories
SNAPSHOT = hashlib.sha256(SNAPSHOT_BLOB).hexdigest()
CHANGES_BLOB = b"[]"
DIGEST = "ab" * 32
TOKEN = "01J00000000000000000000TOK"
OTHER_TOKEN = "01J00000000000000000000OTH"
DECISION = "01J00000000000000000000DEC"
OTHER_DECISION = "01J00000000000000000000DEX"
ISSUED, EXPIRES = "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z"
WHEN = "2026-01-01T00:00:00.000000Z"
SKILL = "reader"
BOUND_RESOURCE = "repo:bound"
MEMBER = ResolvedAttachment(
    attachment_id="01J00000000000000000000ATT",
    scope="direct",
    validation="check",
    validation_version=1,
    mode="required",
    resource=BOUND_RESOURCE,
    args_sha256=DIGEST,
)


class World:
    """What a case's events are made with, offline: placeholder signatures, a skill and
    an attachment that no registry holds (``broken_rule`` sees one stream only)."""

    def signature(self, claims: dict[str, Any]) -> tuple[str, str]:
        """The token's (sha256, signature)."""
        return DIGEST, "AA=="

    def skill_pins(self) -> dict[str, SkillPin]:
        return {SKILL: SkillPin(version=1, members=["read"])}

    def binding(self, created: PlanCreated) -> list[ResolvedAttachment]:
        return [MEMBER]


class StoreWorld(World):
    """On a real ledger: tokens signed with the plane key, the skill defined and the
    attachment made through the plane, as the plane's own checks require."""

    def __init__(self, plane: Plane) -> None:
        self.plane = plane
        self.key = load_or_create_plane_key(plane.store.url)
        register_tool(plane, {"name": "read", "command": ["true"]})
        define_skill(plane, {"name": SKILL, "members": ["read"]})
        register_validation(plane, {"name": "check", "mode": "required", "command": ["true"]})
        attach(plane, "check", resource=BOUND_RESOURCE)

    def signature(self, claims: dict[str, Any]) -> tuple[str, str]:
        token = mint_token(self.key, **claims)
        return token_digest(token), token_signature(token)

    def skill_pins(self) -> dict[str, SkillPin]:
        return self.plane.log().skill_pins([SKILL])

    def binding(self, created: PlanCreated) -> list[ResolvedAttachment]:
        return pin_binding([], self.plane.log().applicable(new_plan(created)))


class Plan:
    """The events of one plan, made with a ``World``."""

    def __init__(self, world: World, plan_id: str) -> None:
        self.world, self.id = world, plan_id
        self._created: PlanCreated | None = None
        self._binding: list[ResolvedAttachment] = []  # pinned at the last Execute

    @property
    def stream(self) -> str:
        return f"plan:{self.id}"

    def created(
        self, *, resources: tuple[str, ...] = ("repo:api",), skills: bool = False, **config: Any
    ) -> PlanCreated:
        self._created = PlanCreated(
            plan_id=self.id,
            project="proj",
            resources=list(resources),
            global_config=GlobalConfig(**config),
            skills=[SKILL] if skills else msgspec.UNSET,
        )
        return self._created

    def strategy(self, revision: int = 0) -> StrategyRecorded:
        return StrategyRecorded(plan_id=self.id, revision=revision, strategy=f"strategy {revision}")

    def execute(
        self,
        revision: int = 0,
        *,
        first: bool = True,
        bound: bool = False,
        pins: dict[str, SkillPin] | msgspec.UnsetType | None = None,
    ) -> ExecuteEntered:
        """Execute, pinning what applies (``bound``: the attachment on ``repo:bound``)
        and, for a plan with skills, the registry's pins (``pins`` overrides them)."""
        assert self._created is not None
        if pins is None:
            pins = self.world.skill_pins() if self._created.skills else msgspec.UNSET
        self._binding = self.world.binding(self._created) if bound else []
        return ExecuteEntered(
            plan_id=self.id,
            revision=revision,
            binding=self._binding,
            skills=pins,
            snapshot_sha256=SNAPSHOT if first else None,
        )

    def executing(self, **created: Any) -> list[EventPayload]:
        """Created, its strategy recorded, in Execute."""
        bound = BOUND_RESOURCE in created.get("resources", ())
        return [self.created(**created), self.strategy(), self.execute(bound=bound)]

    def started(
        self, run: str = "R1", attempt: int = 1, resolved: list[ResolvedAttachment] | None = None
    ) -> ValidationRunStarted:
        return ValidationRunStarted(
            plan_id=self.id,
            run_id=run,
            attempt=attempt,
            revision=0,
            resolved=self._binding if resolved is None else resolved,
            trees_sha256=SNAPSHOT,
        )

    def result(
        self, run: str = "R1", *, verdict: bool = True, mode: str = "required"
    ) -> ValidationResultRecorded:
        return ValidationResultRecorded(
            plan_id=self.id,
            run_id=run,
            attachment_id="01J00000000000000000000RES",
            validation="check",
            mode=mode,  # type: ignore[arg-type]
            verdict=verdict,
            started_at=WHEN,
            ended_at=WHEN,
            duration_ms=1,
        )

    def completed(
        self, run: str = "R1", outcome: str = "pass", attempt: int = 1
    ) -> ValidationRunCompleted:
        return ValidationRunCompleted(
            plan_id=self.id,
            run_id=run,
            attempt=attempt,
            outcome=outcome,  # type: ignore[arg-type]
            rules_version=2,
            results_digest=DIGEST,
        )

    def passed(self, run: str = "R1") -> list[EventPayload]:
        return [self.started(run), self.result(run), self.completed(run)]

    def blocked(self, run: str = "R1", attempt: int = 1) -> list[EventPayload]:
        """A run whose required validation failed, and the attempt it failed."""
        return [
            self.started(run, attempt),
            self.result(run, verdict=False),
            self.completed(run, "blocker", attempt),
            AttemptFailed(
                plan_id=self.id,
                attempt=attempt,
                iteration=1,
                failure_class="validation",
                reason="a required validation failed",
            ),
        ]

    def revision(self, revision: int = 1) -> StrategyRevisionRequested:
        return StrategyRevisionRequested(
            plan_id=self.id, revision=revision, reason="retries spent", failed_attempts=1
        )

    def fix(self, attempt: int = 1) -> FixRecorded:
        return FixRecorded(plan_id=self.id, attempt=attempt, note="a fix")

    def token(self, run: str = "R1", attempt: int = 1, token_id: str = TOKEN) -> TokenMinted:
        claims: dict[str, Any] = {
            "token_id": token_id,
            "plan_id": self.id,
            "attempt": attempt,
            "results_digest": DIGEST,
            "issued_at": ISSUED,
            "expires_at": EXPIRES,
            "trees_sha256": SNAPSHOT,
        }
        sha, signature = self.world.signature(claims)
        return TokenMinted(run_id=run, token_sha256=sha, signature=signature, **claims)

    def consumed(self, token_id: str = TOKEN) -> TokenConsumed:
        return TokenConsumed(plan_id=self.id, token_id=token_id)

    def changes(self, token_id: str = TOKEN) -> ChangesRecorded:
        return ChangesRecorded(
            plan_id=self.id,
            token_id=token_id,
            changes_sha256=hashlib.sha256(CHANGES_BLOB).hexdigest(),
            changes=[],
        )

    def applied(self, token_id: str = TOKEN) -> PlanApplied:
        return PlanApplied(plan_id=self.id, token_id=token_id)

    def halted(
        self,
        raw: str = "validation_failed",
        *,
        halt_type: str | None = None,
        final: str | None = None,
        terminal: bool = False,
    ) -> PlanHalted:
        halt_type = halt_type or canonical_halt(raw)
        return PlanHalted(
            plan_id=self.id,
            halt_type=halt_type,  # type: ignore[arg-type]
            final_decision=final or halt_type,  # type: ignore[arg-type]
            raw_halt_type=raw,
            reason="halted",
            phase="execute",
            attempt=1,
            terminal=terminal,
        )

    def escalated(
        self,
        options: tuple[str, ...] = ("revise", "abandon"),
        expires_at: str | None = None,
        approvals: int | None = None,
    ) -> Escalated:
        return Escalated(
            plan_id=self.id,
            decision_id=DECISION,
            options=list(options),
            reason="a human decides",
            revision=0,
            attempt=1,
            expires_at=expires_at if expires_at is not None else msgspec.UNSET,
            approvals_required=approvals if approvals is not None else msgspec.UNSET,
        )

    def expired(
        self, at: str = "2026-12-07T05:00:00.000000Z", decision_id: str = DECISION
    ) -> EscalationExpired:
        return EscalationExpired(
            plan_id=self.id,
            decision_id=decision_id,
            escalation_hash=DIGEST,
            expired_at=at,
            signature="c2lnbmF0dXJl",
        )

    def decision(self, decision_id: str = DECISION, choice: str = "revise") -> DecisionRecorded:
        return DecisionRecorded(
            plan_id=self.id,
            decision_id=decision_id,
            choice=choice,  # type: ignore[arg-type]
            guidance="go on",
            escalation_hash=DIGEST,
            signed_at=ISSUED,
            approver="alice",
            key_fingerprint=DIGEST,
            signature="AA==",
        )

    def gate(self, tool: str, verdict: str = "pass") -> GateChecked:
        return GateChecked(
            plan_id=self.id,
            gate="input",
            tool=tool,
            tool_version=1,
            verdict=verdict,  # type: ignore[arg-type]
            attempt=1,
            iteration=1,
            strict_mode=False,
            checked_sha256=DIGEST,
        )

    def called(
        self,
        tool: str = "read",
        *,
        version: int | None = 1,
        executor: str = "command",
        unregistered: bool | msgspec.UnsetType = msgspec.UNSET,
    ) -> ToolCalled:
        return ToolCalled(
            plan_id=self.id,
            call_id="01J00000000000000000000CAL",
            tool=tool,
            tool_version=version,
            attempt=1,
            executor=executor,  # type: ignore[arg-type]
            params_sha256=DIGEST,
            output_sha256=DIGEST,
            started_at=WHEN,
            ended_at=WHEN,
            duration_ms=1,
            unregistered=unregistered,
        )

    def asked(self, round_id: str = "R1", tool: str = "read") -> McpInputRequired:
        return McpInputRequired(
            plan_id=self.id,
            round_id=round_id,
            tool=tool,
            attempt=1,
            params_sha256=DIGEST,
            asked_sha256=DIGEST,
            asked={"confirm": "elicitation/create"},
            duration_ms=1,
        )

    def given(
        self, round_id: str = "R1", tool: str = "read", params: str = DIGEST
    ) -> McpInputGiven:
        return McpInputGiven(
            plan_id=self.id,
            tool=tool,
            params_sha256=params,
            round_id=round_id,
            given_sha256=DIGEST,
            given=["confirm"],
        )

    def compensation(self) -> CompensationRequested:
        return CompensationRequested(plan_id=self.id, reason="strict mode")

    def compensated(self) -> CompensationCompleted:
        return CompensationCompleted(plan_id=self.id, succeeded=True)


History = Callable[[Plan], list[EventPayload]]


@dataclass(frozen=True)
class Case:
    id: str
    rule: str  # a fragment of the rule the history's last event breaks
    history: History
    # False: a history the plane's other checks refuse too (an unsigned decision)
    on_a_store: bool = True


def _after_failure(p: Plan, *, skills: bool = False, **config: Any) -> list[EventPayload]:
    """In Execute, a required validation failed once (its attempt failed)."""
    created = {"retry_limit": 0, **config}
    return [*p.executing(skills=skills, **created), *p.blocked()]


def _revised(p: Plan, *, skills: bool = False, bound: bool = False) -> list[EventPayload]:
    """Back in Strategize after a failure (a strategy revision), revision 1 recorded."""
    resources = (BOUND_RESOURCE,) if bound else ("repo:api",)
    return [
        *_after_failure(p, skills=skills, resources=resources, max_strategy_revisions=1),
        p.revision(1),
        p.strategy(1),
    ]


def _minted(p: Plan) -> list[EventPayload]:
    """In Execute, a passing run and its token."""
    return [*p.executing(), *p.passed(), p.token()]


PLAN_CASES: list[Case] = [
    # -- the order of a plan's life ----------------------------------------------------------
    Case("first-event", "plan.created is a plan's first event", lambda p: [p.strategy()]),
    Case(
        "created-once",
        "a plan is created once",
        lambda p: [p.created(), p.created()],
    ),
    Case(
        "after-the-end",
        "nothing follows the end of a plan",
        lambda p: [*p.executing(), p.halted(terminal=True), p.fix()],
    ),
    Case(
        "compensation-after-the-end-once",
        "nothing follows the end of a plan",
        lambda p: [
            *p.executing(),
            p.compensation(),
            p.halted(terminal=True),
            p.compensated(),
            p.compensated(),
        ],
    ),
    Case(
        "only-completion-while-applying",
        "Apply began (its change set is recorded): only its completion follows",
        lambda p: [*_minted(p), p.consumed(), p.changes(), p.fix()],
    ),
    Case(
        "a-run-while-applying",
        "Apply began (its change set is recorded): only its completion follows",
        lambda p: [*_minted(p), p.consumed(), p.changes(), p.started("R2")],
    ),
    Case(
        "only-the-decision-while-pending",
        "nothing but the decision moves a plan awaiting a human decision",
        lambda p: [*p.executing(), p.escalated(), p.fix()],
    ),
    Case(
        "an-expiry-of-a-pending-escalation",
        "an escalation expires only while it is pending",
        lambda p: [*p.executing(), p.expired()],
    ),
    Case(
        "an-expiry-of-its-own-escalation",
        "an escalation expires only while it is pending",
        lambda p: [
            *p.executing(),
            p.escalated(expires_at="2026-12-07T04:00:00.000000Z"),
            p.expired(decision_id="01J00000000000000000000OTH"),
        ],
    ),
    Case(
        "an-expiry-after-its-time",
        "an escalation expires at or after its expiry, and only one that has one",
        lambda p: [
            *p.executing(),
            p.escalated(expires_at="2026-12-07T06:00:00.000000Z"),
            p.expired(at="2026-12-07T05:59:59.999999Z"),
        ],
    ),
    Case(
        "an-expiry-of-one-that-expires",
        "an escalation expires at or after its expiry, and only one that has one",
        lambda p: [*p.executing(), p.escalated(), p.expired()],
    ),
    Case(
        "an-approver-signs-once",
        "an approver signs an escalation once",
        lambda p: [*p.executing(), p.escalated(approvals=2), p.decision(), p.decision()],
        on_a_store=False,  # the first decision is not signed
    ),
    Case(
        "one-pending-decision",
        "nothing but the decision moves a plan awaiting a human decision",
        lambda p: [*p.executing(), p.escalated(), p.escalated()],
    ),
    Case(
        "work-in-execute",
        "plan.fix_recorded happens in Execute (the plan is in strategize)",
        lambda p: [p.created(), p.strategy(), p.fix()],
    ),
    Case(
        "a-token-in-execute",
        "plan.token_minted happens in Execute",
        lambda p: [*_revised(p), p.token()],
    ),
    # -- Strategize and Execute --------------------------------------------------------------
    Case(
        "strategy-in-strategize",
        "a strategy is recorded in Strategize",
        lambda p: [*p.executing(), p.strategy()],
    ),
    Case(
        "strategy-of-the-revision",
        "a strategy is for the current revision 0",
        lambda p: [p.created(), p.strategy(1)],
    ),
    Case(
        "execute-with-a-strategy",
        "Execute is entered from Strategize with a recorded strategy",
        lambda p: [p.created(), p.execute()],
    ),
    Case(
        "execute-from-strategize",
        "Execute is entered from Strategize with a recorded strategy",
        lambda p: [*p.executing(), p.execute(first=False)],
    ),
    Case(
        "binding-keeps-its-members",
        "a binding set keeps every member it pinned, unchanged",
        lambda p: [*_revised(p, bound=True), p.execute(1, first=False, bound=False)],
    ),
    Case(
        "snapshot-at-the-first-execute",
        "the first Execute records the resources' snapshot, and only the first",
        lambda p: [p.created(), p.strategy(), p.execute(first=False)],
    ),
    Case(
        "snapshot-only-at-the-first-execute",
        "the first Execute records the resources' snapshot, and only the first",
        lambda p: [*_revised(p), p.execute(1, first=True)],
    ),
    Case(
        "no-skills-no-pins",
        "a plan without skills pins none",
        lambda p: [
            p.created(),
            p.strategy(),
            p.execute(pins={SKILL: SkillPin(version=1, members=[])}),
        ],
    ),
    Case(
        "every-skill-pinned",
        "Execute pins each of the plan's skills",
        lambda p: [p.created(skills=True), p.strategy(), p.execute(pins={})],
    ),
    Case(
        "skills-pinned-once",
        "a plan's skills are pinned once, at its first Execute",
        lambda p: [
            *_revised(p, skills=True),
            p.execute(1, first=False, pins={SKILL: SkillPin(version=2, members=["read", "rm"])}),
        ],
    ),
    # -- gates and calls ---------------------------------------------------------------------
    Case(
        "input-gate-within-skills",
        "an input gate passes only a tool in the plan's skills",
        lambda p: [*p.executing(skills=True), p.gate("rm")],
    ),
    Case(
        "calls-within-skills",
        "a plan with skills calls only their members",
        lambda p: [*p.executing(skills=True), p.called("rm")],
    ),
    Case(
        "unregistered-true-or-absent",
        "`unregistered` is true or absent",
        lambda p: [*p.executing(), p.called(unregistered=False)],
    ),
    Case(
        "a-call-names-its-version",
        "a call names its tool's version, unless it records an unregistered tool",
        lambda p: [*p.executing(), p.called(version=None)],
    ),
    Case(
        "an-unregistered-call-has-no-version",
        "a call names its tool's version, unless it records an unregistered tool",
        lambda p: [*p.executing(), p.called(executor="recorded", unregistered=True)],
    ),
    Case(
        "an-unregistered-call-is-recorded",
        "an unregistered tool's call is recorded, never run by the plane",
        lambda p: [*p.executing(), p.called(version=None, unregistered=True)],
    ),
    # -- a server's rounds of questions ------------------------------------------------------
    Case(
        "asks-within-skills",
        "a plan with skills calls only their members",
        lambda p: [*p.executing(skills=True), p.asked(tool="rm")],
    ),
    Case(
        "a-round-is-asked-once",
        "a round of questions is asked once",
        lambda p: [*p.executing(), p.asked(), p.asked()],
    ),
    Case(
        "a-round-is-answered-once",
        "a round is answered once, by a call of its tool with its arguments",
        lambda p: [*p.executing(), p.asked(), p.given(), p.given()],
    ),
    Case(
        "a-round-answered-by-its-tool",
        "a round is answered once, by a call of its tool with its arguments",
        lambda p: [*p.executing(), p.asked(), p.given(tool="rm")],
    ),
    Case(
        "a-round-answered-with-its-arguments",
        "a round is answered once, by a call of its tool with its arguments",
        lambda p: [*p.executing(), p.asked(), p.given(params=hashlib.sha256(b"x").hexdigest())],
    ),
    Case(
        "a-round-never-asked",
        "a round is answered once, by a call of its tool with its arguments",
        lambda p: [*p.executing(), p.given()],
    ),
    # -- validation runs and the failure loop ------------------------------------------------
    Case(
        "a-fix-before-the-next-run",
        "a fix is recorded between a failed validation and the next",
        lambda p: [*_after_failure(p), p.started("R2", 2)],
    ),
    Case(
        "a-run-runs-the-binding-set",
        "a validation run runs exactly the plan's binding set",
        lambda p: [*p.executing(), p.started(resolved=[MEMBER])],
    ),
    Case(
        "results-in-the-open-run",
        "results belong to the plan's open run",
        lambda p: [*p.executing(), p.started("R1"), p.result("R0")],
    ),
    Case(
        "completion-of-the-open-run",
        "results belong to the plan's open run",
        lambda p: [*p.executing(), p.completed("R1")],
    ),
    Case(
        "a-revision-after-the-retries",
        "a strategy revision follows 2 failed validations or 3 failed iterations "
        "(the plan has 1 and is in iteration 1)",
        lambda p: [*_after_failure(p, retry_limit=1), p.revision(1)],
    ),
    Case(
        "revisions-within-budget",
        "strategy revisions are within max_strategy_revisions",
        lambda p: [*_after_failure(p, max_strategy_revisions=0), p.revision(1)],
    ),
    Case(
        "the-next-revision",
        "the revision requested is 1",
        lambda p: [*_after_failure(p, max_strategy_revisions=5), p.revision(2)],
    ),
    # -- halts and decisions -----------------------------------------------------------------
    Case(
        "halt-type-is-final-decision",
        "a halt's halt_type and final_decision are the canonical value",
        lambda p: [*p.executing(), p.halted(final="validator_error")],
    ),
    Case(
        "halt-type-is-canonical",
        "a halt's halt_type and final_decision are the canonical value",
        lambda p: [*p.executing(), p.halted("timeout", halt_type="blocker")],
    ),
    Case(
        "an-escalate-halt-is-pending",
        "an escalate halt is a pending decision",
        lambda p: [*p.executing(), p.halted("needs_decision")],
    ),
    Case(
        "a-decision-decides-a-pending-escalation",
        "a decision decides the plan's pending escalation",
        lambda p: [*p.executing(), p.decision()],
    ),
    Case(
        "a-decision-decides-its-escalation",
        "a decision decides the plan's pending escalation",
        lambda p: [*p.executing(), p.escalated(), p.decision(OTHER_DECISION)],
    ),
    Case(
        "a-decision-among-the-options",
        "a decision is one of the escalation's options",
        lambda p: [*p.executing(), p.escalated(("revise",)), p.decision(choice="abandon")],
    ),
    # -- tokens and Apply --------------------------------------------------------------------
    Case(
        "a-token-after-a-pass",
        "a token is minted at the end of a passing run",
        lambda p: [*p.executing(), p.token()],
    ),
    Case(
        "no-token-during-a-run",
        "a token is minted at the end of a passing run",
        lambda p: [*p.executing(), *p.passed(), p.started("R2"), p.token()],
    ),
    Case(
        "a-token-of-the-last-run",
        "a token is minted from the plan's last run, for its current attempt",
        lambda p: [*p.executing(), *p.passed(), p.token(run="R0")],
    ),
    Case(
        "a-token-of-the-current-attempt",
        "a token is minted from the plan's last run, for its current attempt",
        lambda p: [*p.executing(), *p.passed(), p.token(attempt=2)],
    ),
    Case(
        "only-the-current-token-consumed",
        "only the plan's current, unused token is consumed",
        lambda p: [*_minted(p), p.consumed(OTHER_TOKEN)],
    ),
    Case(
        "a-token-consumed-once",
        "only the plan's current, unused token is consumed",
        lambda p: [*_minted(p), p.consumed(), p.consumed()],
    ),
    Case(
        "no-token-consumed-unminted",
        "only the plan's current, unused token is consumed",
        lambda p: [*p.executing(), *p.passed(), p.consumed()],
    ),
    Case(
        "a-change-set-after-consumption",
        "Apply's change set follows the consumption of its token",
        lambda p: [*_minted(p), p.changes()],
    ),
    Case(
        "a-change-set-of-the-consumed-token",
        "Apply's change set follows the consumption of its token",
        lambda p: [*_minted(p), p.consumed(), p.changes(OTHER_TOKEN)],
    ),
    Case(
        "applied-after-a-change-set",
        "Apply completes the change set recorded with its consumed token",
        lambda p: [*_minted(p), p.consumed(), p.applied()],
    ),
    Case(
        "applied-with-its-token",
        "Apply completes the change set recorded with its consumed token",
        lambda p: [*_minted(p), p.consumed(), p.changes(), p.applied(OTHER_TOKEN)],
    ),
    Case(
        "compensation-after-a-request",
        "compensation completes after it was requested",
        lambda p: [*p.executing(), p.compensated()],
    ),
]

# Histories every event of which is legal: the exceptions to the rules above.
LEGAL: list[Case] = [
    Case(
        "a-whole-life",
        "",
        lambda p: [
            *_revised(p, skills=True),
            p.execute(1, first=False),
            p.fix(2),
            *p.passed("R2"),
            p.token("R2", attempt=2),
            p.consumed(),
            p.changes(),
            p.applied(),
        ],
    ),
    Case(
        "an-advisory-result-outside-the-run",
        "",
        lambda p: [
            *p.executing(),
            p.result("REVIEW", mode="informational"),
            p.halted(terminal=True),
            p.result("REVIEW", mode="informational"),
        ],
    ),
    Case(
        "compensation-completes-after-the-end",
        "",
        lambda p: [*p.executing(), p.compensation(), p.halted(terminal=True), p.compensated()],
    ),
    Case(
        "a-run-ends-while-a-decision-is-pending",
        "",
        lambda p: [
            *p.executing(),
            p.started(),
            p.escalated(),
            p.result(),
            p.completed(outcome="blocker"),
            p.halted("needs_decision"),
            p.compensation(),
            p.decision(),
        ],
        on_a_store=False,  # the decision is not signed
    ),
    Case(
        "skills-pinned-again-unchanged",
        "",
        lambda p: [*_revised(p, skills=True), p.execute(1, first=False), p.gate("read")],
    ),
]

# The rules of the other stream kinds (the plane's registry and approver reads fold them;
# audit reports them). Each history is made for one name (its streams' own).
OtherHistory = Callable[[str], tuple[str, list[EventPayload]]]


def _attachment(name: str) -> AttachmentCreated:
    return AttachmentCreated(
        attachment_id=name,
        validation="check",
        validation_version=1,
        resource="repo:elsewhere",
        scope="direct",
        args_sha256=DIGEST,
    )


def _key(name: str, approver: str | None = None) -> ApproverKeyAdded:
    return ApproverKeyAdded(
        name=approver or name, public_key="AA==", fingerprint=DIGEST, endorsement="AA=="
    )


def _revoked(name: str) -> ApproverKeyRevoked:
    return ApproverKeyRevoked(name=name, fingerprint=DIGEST)


def _tool(name: str, version: int) -> ToolRegistered:
    return ToolRegistered(name=name, version=version)


def _skill(name: str, version: int) -> SkillDefined:
    return SkillDefined(name=name, version=version, members=["t"])


OTHER_CASES: list[tuple[str, str, OtherHistory]] = [
    (
        "attachment-created-once",
        "an attachment is created once",
        lambda n: (f"attachment:{n}", [_attachment(n), _attachment(n)]),
    ),
    (
        "attachment-detached-after-creation",
        "an attachment is detached after it was created",
        lambda n: (f"attachment:{n}", [AttachmentDetached(attachment_id=n)]),
    ),
    (
        "attachment-detached-once",
        "an attachment is detached once",
        lambda n: (
            f"attachment:{n}",
            [
                _attachment(n),
                AttachmentDetached(attachment_id=n),
                AttachmentDetached(attachment_id=n),
            ],
        ),
    ),
    (
        "one-approver-a-stream",
        "an approver stream holds one approver's keys",
        lambda n: (f"approver:{n}", [_key(n), _key(n, "mallory")]),
    ),
    (
        "revoke-a-key-added",
        "only an active key of the approver is revoked",
        lambda n: (f"approver:{n}", [_revoked(n)]),
    ),
    (
        "revoke-an-active-key",
        "only an active key of the approver is revoked",
        lambda n: (f"approver:{n}", [_key(n), _revoked(n), _revoked(n)]),
    ),
    (
        "tool-versions-from-one",
        "a registration is version 1 of",
        lambda n: (f"tool:{n}", [_tool(n, 2)]),
    ),
    (
        "tool-versions-one-by-one",
        "a registration is version 2 of",
        lambda n: (f"tool:{n}", [_tool(n, 1), _tool(n, 3)]),
    ),
    (
        "skill-versions-one-by-one",
        "a skill's definition is version 2 of",
        lambda n: (f"skill:{n}", [_skill(n, 1), _skill(n, 1)]),
    ),
]


def _walk(stream: str, events: list[EventPayload]) -> tuple[Any, str | None]:
    """Fold ``events`` but the last, each legal; the rule the last one breaks."""
    doc = None
    for i, payload in enumerate(events[:-1]):
        rule = broken_rule(stream, doc, payload)
        assert rule is None, f"event {i} ({payload.type_name()}) of the history: {rule}"
        doc = fold(stream, doc, payload)
    return doc, broken_rule(stream, doc, events[-1])


# -- 1. broken_rule, offline ------------------------------------------------------------------


@pytest.mark.parametrize("case", PLAN_CASES, ids=lambda c: c.id)
def test_each_plan_rule_breaks_on_its_case(case: Case) -> None:
    plan = Plan(World(), "P-1")
    _, rule = _walk(plan.stream, case.history(plan))
    assert rule is not None and case.rule in rule, rule


@pytest.mark.parametrize("case", LEGAL, ids=lambda c: c.id)
def test_the_exceptions_are_legal(case: Case) -> None:
    plan = Plan(World(), "P-1")
    _, rule = _walk(plan.stream, case.history(plan))
    assert rule is None, rule


@pytest.mark.parametrize(("name", "rule", "history"), OTHER_CASES, ids=[c[0] for c in OTHER_CASES])
def test_each_rule_of_the_other_streams(name: str, rule: str, history: OtherHistory) -> None:
    stream, events = history("x1")
    _, broken = _walk(stream, events)
    assert broken is not None and rule in broken, broken


def test_an_empty_document_is_no_document() -> None:
    plan = Plan(World(), "P-1")
    assert broken_rule(plan.stream, {}, plan.created()) is None
    assert broken_rule(plan.stream, {}, plan.strategy()) == "plan.created is a plan's first event"


def test_pins_kept() -> None:
    [member] = World().binding(Plan(World(), "P-1").created())
    changed = msgspec.structs.replace(member, mode="informational")
    assert pins_kept([], [member]) and pins_kept([member], [member])
    assert not pins_kept([member], [])
    assert not pins_kept([member], [changed])


# Rules no history can reach, each with the rule that catches its case first (their
# mutants are listed as equivalent in tests/mutation/mutants.toml).
UNREACHABLE = {
    "one pending decision at a time": "nothing but the decision moves a plan awaiting a human "
    "decision (an escalation is not the decision)",
}


def _texts(node: ast.expr | None) -> list[str]:
    """The rule texts an expression can return (a text with values in it: its longest
    literal part)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        parts = [str(v.value) for v in node.values if isinstance(v, ast.Constant)]
        return [max(parts, key=len)]
    if isinstance(node, ast.IfExp):
        return _texts(node.body) + _texts(node.orelse)
    return []


def test_the_table_names_every_rule() -> None:
    """Every rule text ``plan_rules`` can return is named by a case of this table: a new
    rule lands with its case."""
    import projections.plan_rules as rules

    tree = ast.parse(inspect.getsource(rules))
    texts = [
        t for node in ast.walk(tree) if isinstance(node, ast.Return) for t in _texts(node.value)
    ]
    assert len(texts) >= 40, texts
    named = [c.rule for c in PLAN_CASES] + [rule for _, rule, _ in OTHER_CASES] + list(UNREACHABLE)
    unnamed = [t for t in texts if not any(t.strip(" (") in n or n in t for n in named)]
    assert not unnamed, f"rules no case of tests/projections/test_plan_rules.py names: {unnamed}"


# -- 2. the plane refuses each, 3. audit reports each -----------------------------------------


def test_the_plane_refuses_a_plan_at_each_rule_and_audit_reports_it(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        world = StoreWorld(plane)
        missed: list[str] = []
        forged: dict[int, str] = {}
        for case in PLAN_CASES:
            plan = Plan(world, f"T-{case.id}")
            positions = forge(
                plane.store, plan.stream, *case.history(plan), blobs=(SNAPSHOT_BLOB, CHANGES_BLOB)
            )
            forged[positions[-1]] = case.id
            if not case.on_a_store:  # refused earlier, at its unsigned decision
                continue
            try:
                plane.state(plan.stream)
            except TamperedPlan as refused:
                if refused.position != positions[-1] or case.rule not in refused.rule:
                    missed.append(f"{case.id}: at {refused.position}, {refused.rule}")
            else:
                missed.append(f"{case.id}: the plane acts on the plan")
        for case in LEGAL:
            if not case.on_a_store:
                continue
            plan = Plan(world, f"L-{case.id}")
            forge(plane.store, plan.stream, *case.history(plan), blobs=(SNAPSHOT_BLOB,))
            try:
                plane.state(plan.stream)
            except TamperedPlan as refused:
                missed.append(f"legal {case.id}: refused at {refused.position}, {refused.rule}")
        for name, _rule, history in OTHER_CASES:
            stream, events = history(name)
            positions = forge(plane.store, stream, *events)
            forged[positions[-1]] = name
        assert not missed, "\n".join(missed)
        report = audit(plane.store, plane_public_key=world.key.public_key())
        illegal = {v.position for v in report.violations if v.invariant == "illegal_transition"}
        assert not {p: c for p, c in forged.items() if p not in illegal}, "audit misses these"
        assert not illegal - set(forged), "audit reports a legal event"
