"""The approval policy (docs/cli.md, "evidence approvals"): how many approvers every
escalation needs at least, and whether an approver may let go on a plan whose operator
they are. Policy an operator signs; the plane applies the policy in force when it
appends an escalation (``core``) and when it records a decision
(``lifecycle.record_decision``), and checks both as it folds a plan (``authority``), as
``evidence audit`` does."""

from __future__ import annotations

from ledger.events import ApprovalPolicySet, EventPayload
from projections.states import ApprovalPolicyState

from .core import Plane, StreamState

__all__ = ["STREAM", "approval_policy", "set_approval_policy"]

STREAM = ApprovalPolicySet.STREAM


def set_approval_policy(
    plane: Plane, *, min_approvals: int, separate_duties: bool, actor: str = "operator"
) -> ApprovalPolicyState:
    """Set the approval policy (signed by this process's operator key, or the operator
    the command runs for); the same policy again appends nothing."""
    wanted = ApprovalPolicySet(min_approvals=min_approvals, separate_duties=separate_duties)

    def decide(state: StreamState) -> list[EventPayload]:
        doc = state.of(ApprovalPolicyState)
        if doc == ApprovalPolicyState(min_approvals=min_approvals, separate_duties=separate_duties):
            return []
        return [wanted]

    plane.run(STREAM, decide, actor=actor)
    found = approval_policy(plane)
    assert found is not None
    return found


def approval_policy(plane: Plane) -> ApprovalPolicyState | None:
    """The approval policy in force: its latest event an operator signed (None: the
    default, one approver and no separation of duties)."""
    doc = plane.log().policy_doc(STREAM)
    return doc if isinstance(doc, ApprovalPolicyState) else None
