"""How escalations are decided, as operators set it (docs/cli.md, "evidence approvals"):
the approval policy (``approval_policy.set``) and who each plan's operators are, both as
of a position in the log, and the two rules the plane keeps and ``evidence audit``
checks:

- an escalation asks for the approvals its plan asks for and the policy in force
  requires, whichever is more (``escalation_problem``): an escalation appended with
  fewer would let fewer people decide;
- with ``separate_duties`` in force, no approver lets a plan go on (``revise``) whose
  operator they are (``duties_problem``): the person who gave the agent its credential,
  or signed its weakened configuration, does not also judge its failure. Abandoning a
  plan is never refused: stopping work is nobody's conflict of interest.

A person is a name: an operator key and an approver key registered under one name are
one person's. ``Approvals`` is fed only the policy events that count (``PolicyFold``),
so a copied or unsigned policy event changes nothing here.
"""

from __future__ import annotations

from bisect import bisect_left

import msgspec

from ledger.events import (
    ApprovalPolicySet,
    CredentialIssued,
    DecisionRecorded,
    Escalated,
    GlobalConfig,
    PlanCreated,
    PolicySignature,
    RecordedEvent,
)

__all__ = ["Approvals", "duties_problem", "escalation_problem"]


class Approvals:
    """The approval policies that counted, and each plan's operators, by position."""

    def __init__(self) -> None:
        self.positions: list[int] = []  # of each policy, ascending
        self.policies: list[ApprovalPolicySet] = []
        self.operators: dict[str, list[tuple[int, str]]] = {}  # plan_id -> (position, name)

    def copy(self) -> Approvals:
        twin = Approvals()
        twin.positions, twin.policies = list(self.positions), list(self.policies)
        twin.operators = {plan: list(names) for plan, names in self.operators.items()}
        return twin

    def take(self, event: RecordedEvent) -> None:
        """One policy event that counts (in log order)."""
        p = event.payload
        if isinstance(p, ApprovalPolicySet):
            self.positions.append(event.position)
            self.policies.append(p)
        elif isinstance(p, CredentialIssued | PlanCreated) and isinstance(
            p.signed, PolicySignature
        ):
            self.operators.setdefault(p.plan_id, []).append((event.position, p.signed.operator))

    def policy(self, before: int | None = None) -> ApprovalPolicySet | None:
        """The policy in force just before position ``before`` (None: now)."""
        i = len(self.positions) if before is None else bisect_left(self.positions, before)
        return self.policies[i - 1] if i else None

    def required(self, config: GlobalConfig, before: int | None = None) -> int:
        """How many approvers must sign one choice of an escalation of a plan with
        ``config``: what the plan asks, or the policy's minimum, whichever is more."""
        asked = config.approvals_required
        policy = self.policy(before)
        return max(
            asked if isinstance(asked, int) else 1,
            policy.min_approvals if policy is not None else 1,
        )

    def plan_operators(self, plan_id: str, before: int | None = None) -> set[str]:
        """Who signed the plan's credentials or its weakened configuration, before
        position ``before`` (None: so far)."""
        return {
            name
            for position, name in self.operators.get(plan_id, [])
            if before is None or position < before
        }

    def duties_separate(self, before: int | None = None) -> bool:
        policy = self.policy(before)
        return policy is not None and policy.separate_duties


def escalation_problem(
    p: Escalated, config: GlobalConfig, approvals: Approvals, position: int | None = None
) -> str | None:
    """Why an escalation at ``position`` is not one the plane would append (None: it
    is): it asks for the approvals its plan's ``config`` and the policy then require
    (recorded only when more than one)."""
    required = approvals.required(config, position)
    recorded = p.approvals_required if isinstance(p.approvals_required, int) else 1
    if recorded != required or (required == 1 and p.approvals_required is not msgspec.UNSET):
        return (
            f"escalation {p.decision_id} asks for the {required} approval(s) its plan "
            f"and the approval policy require, not {recorded}"
        )
    return None


def duties_problem(
    p: DecisionRecorded, approvals: Approvals, position: int | None = None
) -> str | None:
    """Why a decision at ``position`` breaks the separation of duties in force then
    (None: it does not): an approver letting go on a plan whose operator they are."""
    if p.choice == "abandon" or not approvals.duties_separate(position):
        return None
    if p.approver in approvals.plan_operators(p.plan_id, position):
        return (
            f"{p.approver} is plan {p.plan_id}'s operator: with duties separate, another "
            "approver decides whether it goes on"
        )
    return None
