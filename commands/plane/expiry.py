"""Escalations that end (docs/concepts.md, "Human decisions"): a plan created with
``decision_timeout_s`` escalates with an ``expires_at``; once it passes with no approver's
decision, the plane denies the plan — a recorded, plane-signed ``plan.escalation_expired``
(it ends, failed), never a silent wait.

Who records it: the service, on a schedule (``commands.service.app``), and
``evidence authorize --expire`` on the host that holds the plane key. Recording twice is
harmless: once decided or expired, an escalation is no longer pending, and the plane's
rule refuses a second expiry.
"""

from __future__ import annotations

from datetime import UTC, datetime

from commands.rules.signing import expiry_record, load_or_create_plane_key, sign_record
from ledger.events import Escalated, EscalationExpired
from ledger.timestamps import rfc3339
from projections.states import PlanState

from .core import CommandRefused, Plane, StreamState

__all__ = ["expire_escalations"]


def expire_escalations(plane: Plane, now: datetime | None = None) -> list[EscalationExpired]:
    """Deny every plan whose pending escalation expired (as of ``now``): the expiries
    recorded, each signed by the plane key."""
    at = rfc3339(now or datetime.now(UTC))
    plane.projections.catch_up()
    due = [
        d.plan_id
        for d in plane.projections.documents("plans")
        if d is not None
        and d.pending_decision is not None
        and isinstance(d.pending_decision.expires_at, str)
        and d.pending_decision.expires_at <= at
    ]
    expired = []
    for plan_id in due:
        try:
            expired.append(_expire(plane, plan_id, at))
        except CommandRefused:
            continue  # decided (or expired) meanwhile: nothing to deny
    return expired


def _expire(plane: Plane, plan_id: str, at: str) -> EscalationExpired:
    escalations = {
        e.payload.decision_id: e
        for e in plane.store.read_stream(f"plan:{plan_id}")
        if isinstance(e.payload, Escalated)
    }
    done: list[EscalationExpired] = []

    def decide(state: StreamState) -> list[EscalationExpired]:
        plan = state.of(PlanState)
        pending = plan.pending_decision if plan is not None else None
        if pending is None or not isinstance(pending.expires_at, str):
            raise CommandRefused(f"plan {plan_id} has no escalation that expires")
        if pending.expires_at > at:
            raise CommandRefused(f"plan {plan_id}'s escalation expires at {pending.expires_at}")
        escalated = escalations.get(pending.decision_id)
        if escalated is None:  # escalated after the read above: the next look expires it
            raise CommandRefused(f"plan {plan_id}'s escalation is newer than this look")
        leaf = escalated.leaf_hash.hex()
        record = expiry_record(pending.decision_id, plan_id, leaf, at)
        key = load_or_create_plane_key(plane.store.url)
        expired = EscalationExpired(
            plan_id=plan_id,
            decision_id=pending.decision_id,
            escalation_hash=leaf,
            expired_at=at,
            signature=sign_record(key, record, domain="expiry"),
        )
        done.append(expired)
        return [expired]

    plane.run(f"plan:{plan_id}", decide, actor="plane")
    return done[-1]
