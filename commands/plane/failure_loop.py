"""The failure loop (docs/concepts.md): what a failed attempt leads to.

An attempt fails in one of two ways, and both end the same way once their own bound is
spent: a required validation fails (the agent fixes and re-validates, ``retry_limit``
times after a strategy's first failure), or the gates find deviations in
``max_iterations`` iterations of the critique loop. Then a strategy revision (back to
Strategize) while ``max_strategy_revisions`` allow, then an escalation to a human: a
pending decision and a non-terminal ``escalate`` halt. Nothing here is terminal; only
``strict_mode`` (the gates) and a human's ``abandon`` end a plan that failed.

Pure: each function returns the events to append with the failure itself, from the plan
as folded before it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
from msgspec import UNSET
from ulid import ULID

from ledger.events import Escalated, EventPayload, PlanHalted, StrategyRevisionRequested
from ledger.timestamps import rfc3339
from projections.states import PlanState

DECISION_OPTIONS = ["revise", "abandon"]


def after_blocker(plan: PlanState, reason: str, run_id: str | None = None) -> list[EventPayload]:
    """What a failed validation leads to, once it is counted: within ``retry_limit``
    fix-then-revalidate cycles after a strategy's first failure, nothing more (the agent
    fixes, then re-validates); past them, the next step of the loop."""
    config = plan.global_config
    failed = plan.retries_used + 1  # this failure included
    if failed <= config.retry_limit:
        return []
    why = f"{failed} failed validations (retry limit {config.retry_limit})"
    return _next_step(plan, why, reason, failed, [run_id] if run_id else [])


def after_iterations(plan: PlanState, reason: str) -> list[EventPayload]:
    """What an attempt whose ``max_iterations`` iterations all failed at a gate leads
    to: the next step of the loop (never a terminal halt)."""
    why = f"{plan.global_config.max_iterations} iterations failed at the gates (max_iterations)"
    return _next_step(plan, why, reason, plan.retries_used + 1, [])


def _next_step(
    plan: PlanState, why: str, reason: str, failed: int, result_refs: list[str]
) -> list[EventPayload]:
    """A strategy revision while ``max_strategy_revisions`` allow, else an escalation."""
    config = plan.global_config
    if plan.revisions_used < config.max_strategy_revisions:
        return [
            StrategyRevisionRequested(
                plan_id=plan.plan_id,
                revision=plan.revision + 1,
                failed_attempts=failed,
                reason=f"{why}: {reason}",
            )
        ]
    why = f"{why} and strategy revisions ({config.max_strategy_revisions}) exhausted: {reason}"
    escalated = escalation(plan, why)
    return [
        escalated,
        PlanHalted(
            plan_id=plan.plan_id,
            halt_type="escalate",
            final_decision="escalate",
            raw_halt_type="escalated",
            reason=why,
            hint=authorize_hint(escalated.decision_id),
            phase="execute",
            attempt=plan.attempt,
            result_refs=result_refs,
        ),
    ]


def escalation(plan: PlanState, reason: str) -> Escalated:
    """A pending decision for a human (a fresh decision id, the options), expiring after
    the plan's ``decision_timeout_s`` when it has one, needing ``approvals_required``
    approvers' signatures on one choice when more than one."""
    timeout = plan.global_config.decision_timeout_s
    required = plan.global_config.approvals_required
    expires = (
        rfc3339(datetime.now(UTC) + timedelta(seconds=timeout))
        if isinstance(timeout, int)
        else msgspec.UNSET
    )
    return Escalated(
        plan_id=plan.plan_id,
        decision_id=str(ULID()),
        options=DECISION_OPTIONS,
        reason=reason,
        revision=plan.revision,
        attempt=plan.attempt,
        expires_at=expires,
        approvals_required=required if isinstance(required, int) and required > 1 else UNSET,
    )


def authorize_hint(decision_id: str) -> str:
    return f"human: evidence authorize {decision_id} --key FILE (--revise TEXT | --abandon)"
