"""k of n approvers (a plan's ``approvals_required``): an escalation is decided once k
approvers have each signed the same choice; until then each signature is recorded and
the plan waits. An approver signs an escalation once."""

from __future__ import annotations

from pathlib import Path

import pytest

from commands.plane import Plane
from commands.plane.core import CommandRefused
from commands.plane.lifecycle import add_approver_key, authorize, pending_decisions
from commands.plane.plans import get_plan, plan_brief
from commands.plane.validation_runs import validate_plan
from ledger.keys import generate_key_pair
from tests.helpers import run_cli, status_plan

CONFIG = {"retry_limit": 0, "max_strategy_revisions": 0, "approvals_required": 2}


def test_two_of_three_approvers_decide_and_each_signs_once(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, CONFIG)  # approver alice
        for name in ("bob", "carol"):
            generate_key_pair(tmp_path / f"{name}.key")
            add_approver_key(plane, name, tmp_path / f"{name}.key.pub")
        assert validate_plan(plane, "P-1").outcome == "escalate"
        [pending] = pending_decisions(plane)

        def sign(name: str, choice: str) -> None:
            guidance = "write good" if choice == "revise" else None
            authorize(
                plane, pending.decision_id, tmp_path / f"{name}.key",
                choice=choice, guidance=guidance,
            )  # fmt: skip

        assert plan_brief(plane, "P-1")["approvals_given"] == 0
        sign("alice", "revise")
        waiting = get_plan(plane, "P-1").pending_decision
        assert waiting is not None and waiting.approvals == {"alice": "revise"}
        brief = plan_brief(plane, "P-1")  # what the agent's door says it waits for
        assert (brief["approvals_required"], brief["approvals_given"]) == (2, 1)
        with pytest.raises(CommandRefused, match="signs an escalation once"):
            sign("alice", "abandon")
        sign("bob", "abandon")  # one of each: nothing stands yet
        assert get_plan(plane, "P-1").pending_decision is not None
        sign("carol", "revise")  # two of three on revise
        plan = get_plan(plane, "P-1")
        assert plan.pending_decision is None and plan.phase == "strategize"
        assert plan.decisions == {pending.decision_id: "revise"}
    audit = run_cli("audit", "--db", db_url)
    assert audit.returncode == 0, audit.stdout + audit.stderr
