"""The legal transitions of each stream: which event a stream's state can take next.

``broken_rule(stream, doc, payload)`` returns the rule an event breaks when appended to
a stream whose folded state is ``doc`` (None when it is legal). Pure and total, like
the folds. Three users, one set of rules:

- the plane checks every event it decides before appending it, so the plane itself can
  never write an illegal history;
- the plane refuses to act on a plan whose stream breaks a rule (a writer of the
  database appended it past the plane): no decision rests on a forged history;
- ``evidence audit`` reports each broken rule as an ``illegal_transition`` with the
  event's position.

What a rule cannot see from one stream's document alone (signatures, the attachments
a binding set must hold) is checked where the other streams are at hand: the plane's
authority reads (``commands``) and the audit walk.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec

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
    McpFetched,
    McpInputGiven,
    McpInputRequired,
    PlanApplied,
    PlanCreated,
    PlanHalted,
    ResolvedAttachment,
    SkillDefined,
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

from .documents import stream_kind
from .folding import Steps
from .outcomes import canonical_halt
from .states import ApproverState, AttachmentState, PlanState, SkillState, ToolState

__all__ = ["broken_rule", "pins_kept"]

# In Execute only, and never while a human decision is pending.
_EXECUTE_WORK = (
    GateChecked,
    ToolCalled,
    McpInputRequired,
    McpInputGiven,
    FixRecorded,
    ValidationRunStarted,
    AttemptFailed,
    CompensationRequested,
    TokenMinted,
    TokenConsumed,
    ChangesRecorded,
    PlanApplied,
)
# What may still be recorded while a decision is pending: the end of a run that was
# already under way, halts, and the decision itself.
_WHILE_PENDING = (
    McpFetched,  # a read changes nothing
    ValidationResultRecorded,
    ValidationRunCompleted,
    PlanHalted,
    DecisionRecorded,
    EscalationExpired,
    CompensationRequested,
)


def broken_rule(stream: str, doc: Any, payload: EventPayload) -> str | None:
    if doc == {}:
        doc = None  # the plain empty document: no document yet
    kind = stream_kind(stream)
    if kind == "plan":
        return _plan_rule(doc, payload)
    if kind == "attachment":
        return _attachment_rule(doc, payload)
    if kind == "approver":
        return _approver_rule(doc, payload)
    if kind == "tool" and isinstance(payload, ToolRegistered):
        expected = _tool_version(doc) + 1
        if payload.version != expected:
            return f"a registration is version {expected} of {payload.name}"
    if kind == "skill" and isinstance(payload, SkillDefined):
        after = doc.version if isinstance(doc, SkillState) else 0
        if payload.version != after + 1:
            return f"a skill's definition is version {after + 1} of {payload.name}"
    return None


def _tool_version(doc: ToolState | None) -> int:
    return doc.version if doc is not None else 0


def pins_kept(before: list[ResolvedAttachment], after: list[ResolvedAttachment]) -> bool:
    """Nothing leaves a binding set, and no member changes (mode, version, arguments)."""
    kept = {b.attachment_id: b for b in after}
    return all(kept.get(b.attachment_id) == b for b in before)


def _plan_rule(doc: PlanState | None, p: EventPayload) -> str | None:
    if doc is None:
        return None if isinstance(p, PlanCreated) else "plan.created is a plan's first event"
    if isinstance(p, PlanCreated):
        return "a plan is created once"
    if isinstance(p, ValidationResultRecorded) and _advisory(doc, p):
        return None
    if doc.terminal is not None:
        if isinstance(p, CompensationCompleted) and _compensation(doc) == "requested":
            return None
        return f"nothing follows the end of a plan ({doc.terminal})"
    if doc.applying is not None and not isinstance(p, PlanApplied):
        return "Apply began (its change set is recorded): only its completion follows"
    if doc.pending_decision is not None and not isinstance(p, _WHILE_PENDING):
        return "nothing but the decision moves a plan awaiting a human decision"
    if isinstance(p, _EXECUTE_WORK) and doc.phase != "execute":
        return f"{p.type_name()} happens in Execute (the plan is in {doc.phase})"
    rule = _PLAN_RULES.lookup(type(p))
    return rule(doc, p) if rule is not None else None


def _advisory(doc: PlanState, p: ValidationResultRecorded) -> bool:
    """An informational result outside the plan's open run (an advisory review's, under
    the review's own task id): it belongs to no run, so no outcome or token counts it,
    and it may be recorded whenever the review ends."""
    return p.mode == "informational" and p.run_id != doc.current_run


PlanRule = Callable[[PlanState, Any], str | None]
_PLAN_RULES: Steps[PlanRule] = Steps()
rule_for = _PLAN_RULES.register


@rule_for(StrategyRecorded)
def _strategy(doc: PlanState, p: StrategyRecorded) -> str | None:
    if doc.phase != "strategize":
        return "a strategy is recorded in Strategize"
    if p.revision != doc.revision:
        return f"a strategy is for the current revision {doc.revision}"
    return None


@rule_for(ExecuteEntered)
def _execute(doc: PlanState, p: ExecuteEntered) -> str | None:
    if doc.phase != "strategize" or not doc.strategy:
        return "Execute is entered from Strategize with a recorded strategy"
    if not pins_kept(doc.binding, list(p.binding)):
        return "a binding set keeps every member it pinned, unchanged"
    if (doc.snapshot_sha256 is msgspec.UNSET) != (p.snapshot_sha256 is not None):
        return "the first Execute records the resources' snapshot, and only the first"
    return _skill_pins(doc, p)


def _skill_pins(doc: PlanState, p: ExecuteEntered) -> str | None:
    """A plan's skills are pinned at its first Execute, each one of them, and carried
    unchanged by every later Execute; a plan without skills pins none. (That the first
    pins are the registry's skills then is the authority's check: it needs the log.)"""
    if doc.skills is msgspec.UNSET:
        return None if p.skills is msgspec.UNSET else "a plan without skills pins none"
    if p.skills is msgspec.UNSET or sorted(p.skills) != sorted(doc.skills):
        return "Execute pins each of the plan's skills"
    if doc.skill_pins is not msgspec.UNSET and p.skills != doc.skill_pins:
        return "a plan's skills are pinned once, at its first Execute"
    return None


@rule_for(GateChecked)
def _gate(doc: PlanState, p: GateChecked) -> str | None:
    if p.gate == "input" and p.verdict == "pass" and not doc.may_call(p.tool):
        return f"an input gate passes only a tool in the plan's skills ({p.tool!r} is in none)"
    return None


@rule_for(ValidationRunStarted)
def _run_started(doc: PlanState, p: ValidationRunStarted) -> str | None:
    if doc.needs_fix:
        return "a fix is recorded between a failed validation and the next"
    if list(p.resolved) != doc.binding:
        return "a validation run runs exactly the plan's binding set"
    return None


@rule_for(ValidationResultRecorded, ValidationRunCompleted)
def _in_run(doc: PlanState, p: ValidationResultRecorded | ValidationRunCompleted) -> str | None:
    if doc.current_run != p.run_id:
        return f"results belong to the plan's open run (open: {doc.current_run})"
    return None


@rule_for(StrategyRevisionRequested)
def _revision(doc: PlanState, p: StrategyRevisionRequested) -> str | None:
    config = doc.global_config
    # After a failed validation the fold counts it (retries_used); after a gate failure
    # in the last iteration it moves past max_iterations.
    iterations_spent = doc.phase == "execute" and doc.iteration > config.max_iterations
    if doc.retries_used <= config.retry_limit and not iterations_spent:
        return (
            f"a strategy revision follows {config.retry_limit + 1} failed validations "
            f"or {config.max_iterations} failed iterations (the plan has "
            f"{doc.retries_used} and is in iteration {doc.iteration})"
        )
    if doc.revisions_used >= config.max_strategy_revisions:
        return "strategy revisions are within max_strategy_revisions"
    if p.revision != doc.revision + 1:
        return f"the revision requested is {doc.revision + 1}"
    return None


def _outside_skills(doc: PlanState, tool: str) -> str | None:
    if not doc.may_call(tool):
        return f"a plan with skills calls only their members ({tool!r} is in none)"
    return None


@rule_for(ToolCalled)
def _tool_called(doc: PlanState, p: ToolCalled) -> str | None:
    if (outside := _outside_skills(doc, p.tool)) is not None:
        return outside
    if p.unregistered is False:
        return "`unregistered` is true or absent"
    if (p.unregistered is True) != (p.tool_version is None):
        return "a call names its tool's version, unless it records an unregistered tool"
    if p.unregistered is True and p.executor != "recorded":
        return "an unregistered tool's call is recorded, never run by the plane"
    return None


@rule_for(McpInputRequired)
def _input_required(doc: PlanState, p: McpInputRequired) -> str | None:
    if (outside := _outside_skills(doc, p.tool)) is not None:
        return outside
    if doc.rounds is not msgspec.UNSET and p.round_id in doc.rounds:
        return "a round of questions is asked once"
    return None


@rule_for(McpInputGiven)
def _input_given(doc: PlanState, p: McpInputGiven) -> str | None:
    if p.round_id is msgspec.UNSET:
        return None
    asked = doc.rounds.get(p.round_id) if doc.rounds is not msgspec.UNSET else None
    if asked is None or (asked.tool, asked.params_sha256) != (p.tool, p.params_sha256):
        return "a round is answered once, by a call of its tool with its arguments"
    return None


@rule_for(EscalationExpired)
def _escalation_expired(doc: PlanState, p: EscalationExpired) -> str | None:
    pending = doc.pending_decision
    if pending is None or pending.decision_id != p.decision_id:
        return "an escalation expires only while it is pending"
    due, at = _moment(pending.expires_at), _moment(p.expired_at)
    if due is None or at is None or at < due:
        return "an escalation expires at or after its expiry, and only one that has one"
    return None


def _moment(text: object) -> datetime | None:
    """An RFC 3339 UTC time as the plane writes it (``...Z``), else None."""
    if not isinstance(text, str) or not text.endswith("Z"):
        return None
    try:
        return datetime.fromisoformat(text[:-1] + "+00:00")
    except ValueError:
        return None


@rule_for(Escalated)
def _escalated(doc: PlanState, _p: Escalated) -> str | None:
    return None if doc.pending_decision is None else "one pending decision at a time"


@rule_for(PlanHalted)
def _halted(doc: PlanState, p: PlanHalted) -> str | None:
    canonical = canonical_halt(p.raw_halt_type)
    if p.halt_type != p.final_decision or p.halt_type != canonical:
        return (
            f"a halt's halt_type and final_decision are the canonical value "
            f"{canonical} of its raw type {p.raw_halt_type!r}"
        )
    if canonical == "escalate" and doc.pending_decision is None:
        return "an escalate halt is a pending decision (plan.escalated before it)"
    return None


@rule_for(DecisionRecorded)
def _decided(doc: PlanState, p: DecisionRecorded) -> str | None:
    pending = doc.pending_decision
    if pending is None or pending.decision_id != p.decision_id:
        return "a decision decides the plan's pending escalation"
    if p.choice not in pending.options:
        return f"a decision is one of the escalation's options {pending.options}"
    if pending.approvals is not msgspec.UNSET and p.approver in pending.approvals:
        return "an approver signs an escalation once"
    return None


@rule_for(TokenMinted)
def _minted(doc: PlanState, p: TokenMinted) -> str | None:
    if doc.current_run is not None or doc.last_outcome != "pass":
        return "a token is minted at the end of a passing run"
    if p.run_id != doc.last_run or p.attempt != doc.attempt:
        return "a token is minted from the plan's last run, for its current attempt"
    return None


@rule_for(TokenConsumed)
def _consumed(doc: PlanState, p: TokenConsumed) -> str | None:
    token = doc.token
    if token is None or token.token_id != p.token_id or token.status != "minted":
        return "only the plan's current, unused token is consumed"
    return None


@rule_for(ChangesRecorded)
def _changes(doc: PlanState, p: ChangesRecorded) -> str | None:
    token = doc.token
    if token is None or token.token_id != p.token_id or token.status != "consumed":
        return "Apply's change set follows the consumption of its token"
    return None


@rule_for(PlanApplied)
def _applied(doc: PlanState, p: PlanApplied) -> str | None:
    applying = doc.applying
    if applying is None or applying.token_id != p.token_id:
        return "Apply completes the change set recorded with its consumed token"
    return None


@rule_for(CompensationCompleted)
def _compensation_done(doc: PlanState, _p: CompensationCompleted) -> str | None:
    if _compensation(doc) != "requested":
        return "compensation completes after it was requested"
    return None


def _compensation(doc: PlanState) -> str | None:
    return doc.compensation.status if doc.compensation is not None else None


def _attachment_rule(doc: AttachmentState | None, p: EventPayload) -> str | None:
    if isinstance(p, AttachmentCreated) and doc is not None:
        return "an attachment is created once"
    if isinstance(p, AttachmentDetached):
        if doc is None:
            return "an attachment is detached after it was created"
        if doc.status == "detached":
            return "an attachment is detached once"
    return None


def _approver_rule(doc: ApproverState | None, p: EventPayload) -> str | None:
    if isinstance(p, ApproverKeyAdded) and doc is not None and doc.name != p.name:
        return "an approver stream holds one approver's keys"
    if isinstance(p, ApproverKeyRevoked):
        key = doc.keys.get(p.fingerprint) if doc is not None else None
        if key is None or key.status != "active":
            return "only an active key of the approver is revoked"
    return None
