"""Escalations that end (commands/plane/expiry.py): a plan created with
``decision_timeout_s`` escalates with an expiry; once it passes undecided, the plane
denies the plan with a plane-signed ``plan.escalation_expired``, and nothing decides it
after. The attacks: an expiry recorded before its time (the plan's rule refuses it), and
one an agent forges around the plane with a key of its own (the plane refuses the plan,
and the audit names it)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from commands.plane import Plane
from commands.plane.authority import TamperedPlan
from commands.plane.core import CommandRefused
from commands.plane.expiry import expire_escalations
from commands.plane.lifecycle import authorize, pending_decisions
from commands.plane.plans import get_plan, plan_brief
from commands.plane.validation_runs import validate_plan
from ledger.events import Escalated, EscalationExpired
from tests.helpers import forge, run_cli, status_plan

CONFIG = {"retry_limit": 0, "max_strategy_revisions": 0, "decision_timeout_s": 60}


def _escalated(plane: Plane, tmp_path: Path) -> Escalated:
    status_plan(plane, tmp_path, CONFIG)
    assert validate_plan(plane, "P-1").outcome == "escalate"
    found = [e.payload for e in plane.store.read_stream("plan:P-1")]
    return next(p for p in found if isinstance(p, Escalated))


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_an_undecided_escalation_denies_the_plan_once_its_time_is_up(
    db_url: str, tmp_path: Path
) -> None:
    with Plane.open(db_url) as plane:
        escalated = _escalated(plane, tmp_path)
        assert isinstance(escalated.expires_at, str)
        due = _at(escalated.expires_at)
        assert timedelta(seconds=55) < due - datetime.now(UTC) <= timedelta(seconds=60)
        [pending] = pending_decisions(plane)
        assert pending.decision_id == escalated.decision_id
        brief = plan_brief(plane, "P-1")  # what the agent's every answer carries
        assert brief["decision_expires_at"] == escalated.expires_at
        assert expire_escalations(plane, now=due - timedelta(seconds=1)) == []
        [expired] = expire_escalations(plane, now=due + timedelta(seconds=1))
        assert expired.decision_id == escalated.decision_id
        plan = get_plan(plane, "P-1")
        assert plan.terminal == "failed" and plan.pending_decision is None
        assert plan.decisions == {escalated.decision_id: "expired"}
        assert expire_escalations(plane, now=due + timedelta(hours=1)) == []  # once
        with pytest.raises(CommandRefused, match="no pending escalation"):
            authorize(plane, escalated.decision_id, tmp_path / "alice.key", choice="abandon")
    audit = run_cli("audit", "--db", db_url)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "expiry_signature 1" in audit.stdout


def test_an_expiry_the_plane_did_not_sign_is_refused_and_audited(
    db_url: str, tmp_path: Path
) -> None:
    """The agent, holding the database file but not the plane key, ends the wait itself
    (its expiry well-formed, after the due time, signed with nothing of the plane's)."""
    with Plane.open(db_url) as plane:
        escalated = _escalated(plane, tmp_path)
        [event] = [
            e for e in plane.store.read_stream("plan:P-1") if isinstance(e.payload, Escalated)
        ]
        assert isinstance(escalated.expires_at, str)
        forged = EscalationExpired(
            plan_id="P-1",
            decision_id=escalated.decision_id,
            escalation_hash=event.leaf_hash.hex(),
            expired_at=escalated.expires_at,
            signature=base64.b64encode(b"\0" * 64).decode(),
        )
        forge(plane.store, "plan:P-1", forged)
        with pytest.raises(TamperedPlan, match="signed by the plane key"):
            plane.state("plan:P-1")
    audit = run_cli("audit", "--db", db_url)
    assert audit.returncode == 1, audit.stdout + audit.stderr
    assert "expiry_signature" in audit.stdout and "signed by the plane key" in audit.stdout


def test_authorize_expire_records_only_what_is_due(db_url: str, tmp_path: Path) -> None:
    """`evidence authorize --expire` on the host: an escalation not yet due stays
    pending (its time is the plane's clock, not the caller's)."""
    with Plane.open(db_url) as plane:
        _escalated(plane, tmp_path)
    done = run_cli("authorize", "--expire", "--json", "--db", db_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout) == {"expired": []}
    refused = run_cli("authorize", "01M8N0Q6Z4", "--expire", "--db", db_url)
    assert refused.returncode == 2 and "--expire takes no DECISION_ID" in refused.stderr
    with Plane.open(db_url) as plane:
        assert get_plan(plane, "P-1").pending_decision is not None
