"""The approval policy (``approval_policy.set``, docs/cli.md "evidence approvals"): an
operator's minimum number of approvers for every escalation, and the separation of
duties (a plan's own operator never lets it go on). Each rule with its attack: an
escalation appended past the plane asking for fewer approvers, a self-approval appended
past the plane's refusal, a policy the agent wrote itself, an operator's older policy
copied back in. The plane ignores each (or refuses the plan), and ``evidence audit``
reports it."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import msgspec
import pytest

import ledger
from commands.plane import Plane
from commands.plane.approvals import approval_policy, set_approval_policy
from commands.plane.authority import TamperedPlan
from commands.plane.core import CommandRefused
from commands.plane.credentials import issue_credential
from commands.plane.lifecycle import (
    add_approver_key,
    authorize,
    decision_to_sign,
    pending_decisions,
)
from commands.plane.plans import get_plan
from commands.plane.validation_runs import validate_plan
from commands.rules.signing import sign_record
from ledger.events import DecisionRecorded, Escalated, PlanHalted
from ledger.keys import fingerprint, generate_key_pair, load_private_key
from tests.helpers import forge, run_cli, status_plan

CONFIG = {"retry_limit": 0, "max_strategy_revisions": 0}
HOURS = {"ttl": timedelta(hours=1)}


def _approvers(plane: Plane, tmp_path: Path, *names: str) -> None:
    for name in names:
        generate_key_pair(tmp_path / f"{name}.key")
        add_approver_key(plane, name, tmp_path / f"{name}.key.pub")


def _sign(plane: Plane, tmp_path: Path, name: str, choice: str) -> None:
    [pending] = pending_decisions(plane)
    guidance = "write good" if choice == "revise" else None
    authorize(
        plane, pending.decision_id, tmp_path / f"{name}.key", choice=choice, guidance=guidance
    )


def _audit(db_url: str) -> dict:
    found = run_cli("audit", "--db", db_url, "--json")
    return json.loads(found.stdout) | {"exit": found.returncode}


def test_the_policy_minimum_raises_every_plans_escalation(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, CONFIG)  # asks for one approver; alice registered
        _approvers(plane, tmp_path, "bob")
        assert set_approval_policy(plane, min_approvals=2, separate_duties=False).min_approvals == 2
        assert validate_plan(plane, "P-1").outcome == "escalate"
        [pending] = pending_decisions(plane)
        _sign(plane, tmp_path, "alice", "revise")
        waiting = get_plan(plane, "P-1").pending_decision
        assert waiting is not None and waiting.approvals_required == 2
        _sign(plane, tmp_path, "bob", "revise")
        assert get_plan(plane, "P-1").decisions == {pending.decision_id: "revise"}
    assert _audit(db_url)["exit"] == 0


def test_a_plan_may_ask_for_more_approvers_never_fewer(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, {**CONFIG, "approvals_required": 3})
        set_approval_policy(plane, min_approvals=2, separate_duties=False)
        assert validate_plan(plane, "P-1").outcome == "escalate"
        assert get_plan(plane, "P-1").pending_decision.approvals_required == 3


def test_an_escalation_appended_past_the_plane_with_fewer_approvers_is_refused_and_reported(
    db_url: str, tmp_path: Path
) -> None:
    """The agent, holding the database file, escalates its own plan asking for one
    approver where the policy requires two: the plane refuses the plan, audit names it."""
    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, CONFIG)
        set_approval_policy(plane, min_approvals=2, separate_duties=False)
        escalated = Escalated(
            plan_id="P-1", decision_id="01J00000000000000000000001", options=["revise", "abandon"],
            reason="forged", revision=0, attempt=1,
        )  # fmt: skip
        halted = PlanHalted(
            plan_id="P-1", halt_type="escalate", final_decision="escalate",
            raw_halt_type="escalated", reason="forged", hint="", phase="execute", attempt=1,
        )  # fmt: skip
        [at, _] = forge(plane.store, "plan:P-1", escalated, halted)
        with pytest.raises(TamperedPlan, match="asks for the 2 approval"):
            plane.state("plan:P-1")
    found = _audit(db_url)
    assert found["exit"] == 1
    assert [(v["invariant"], v["position"]) for v in found["violations"]] == [("approvals", at)]


def _self_approving(plane: Plane, tmp_path: Path) -> None:
    """P-1 escalated, its credential issued by the host's operator ("operator"), who
    also holds an approver key under that name; alice approves too; duties separate."""
    status_plan(plane, tmp_path, CONFIG)
    _approvers(plane, tmp_path, "operator")  # the operator's own approver key
    issue_credential(plane, "P-1", **HOURS)
    set_approval_policy(plane, min_approvals=1, separate_duties=True)
    assert validate_plan(plane, "P-1").outcome == "escalate"


def test_a_plans_operator_cannot_let_it_go_on_but_may_stop_it(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        _self_approving(plane, tmp_path)
        with pytest.raises(CommandRefused, match="operator is plan P-1's operator"):
            _sign(plane, tmp_path, "operator", "revise")
        _sign(plane, tmp_path, "alice", "revise")  # another approver decides
        assert get_plan(plane, "P-1").pending_decision is None
    assert _audit(db_url)["exit"] == 0


def test_abandoning_ones_own_plan_is_no_conflict(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        _self_approving(plane, tmp_path)
        _sign(plane, tmp_path, "operator", "abandon")
        assert get_plan(plane, "P-1").terminal == "failed"
    assert _audit(db_url)["exit"] == 0


def test_a_self_approval_appended_past_the_plane_is_refused_and_reported(
    db_url: str, tmp_path: Path
) -> None:
    """The operator holds a genuine approver key and signs a genuine decision; the
    plane refused to record it, so it is appended to the database directly. Its
    signature verifies; the separation of duties does not hold."""
    with Plane.open(db_url) as plane:
        _self_approving(plane, tmp_path)
        [pending] = pending_decisions(plane)
        record = decision_to_sign(plane, pending.decision_id, choice="revise", guidance="go")
        key = load_private_key(tmp_path / "operator.key")
        decided = DecisionRecorded(
            **{k: record[k] for k in ("plan_id", "decision_id", "choice", "guidance")},
            reason=record.get("reason"), escalation_hash=record["escalation_hash"],
            signed_at=record["signed_at"], approver="operator",
            key_fingerprint=fingerprint(key.public_key()),
            signature=sign_record(key, record, domain="decision"),
        )  # fmt: skip
        [at] = forge(plane.store, "plan:P-1", decided)
        with pytest.raises(TamperedPlan, match="another approver decides"):
            plane.state("plan:P-1")
    found = _audit(db_url)
    assert [(v["invariant"], v["position"]) for v in found["violations"]] == [("approvals", at)]


def test_a_policy_holds_from_where_it_was_set_never_before(db_url: str, tmp_path: Path) -> None:
    """A decision taken before the separation of duties (or before the credential that
    made its approver the plan's operator) stays good: policy never reaches back."""
    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, CONFIG)
        _approvers(plane, tmp_path, "operator")
        set_approval_policy(plane, min_approvals=1, separate_duties=True)
        assert validate_plan(plane, "P-1").outcome == "escalate"
        _sign(plane, tmp_path, "operator", "revise")  # not yet the plan's operator
        issue_credential(plane, "P-1", **HOURS)  # now they are
        set_approval_policy(plane, min_approvals=3, separate_duties=True)
        assert get_plan(plane, "P-1").phase == "strategize"
    with Plane.open(db_url) as fresh:  # the plan folded and checked anew: no TamperedPlan
        assert fresh.state("plan:P-1").doc.decisions
    assert _audit(db_url)["exit"] == 0


def test_a_policy_the_agent_wrote_or_copied_back_changes_nothing(
    db_url: str, tmp_path: Path
) -> None:
    """The agent lowers the minimum with an unsigned policy of its own, then with a
    copy of the operator's own earlier, genuine one: both are ignored (the escalation
    still needs two), and audit reports each."""
    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, CONFIG)
        _approvers(plane, tmp_path, "bob")
        set_approval_policy(plane, min_approvals=1, separate_duties=False)
        set_approval_policy(plane, min_approvals=2, separate_duties=False)
        [first, _] = plane.store.read_stream("approval_policy")
        unsigned = msgspec.structs.replace(first.payload, signed=msgspec.UNSET)
        [own] = forge(plane.store, "approval_policy", unsigned)
        [copied] = forge(plane.store, "approval_policy", first.payload)
        assert approval_policy(plane).min_approvals == 2
        assert validate_plan(plane, "P-1").outcome == "escalate"
        assert get_plan(plane, "P-1").pending_decision.approvals_required == 2
    found = _audit(db_url)
    assert {(v["invariant"], v["position"]) for v in found["violations"]} == {
        ("policy_signature", own),
        ("replayed_signature", copied),
    }


def test_the_cli_sets_and_shows_the_policy(db_url: str) -> None:
    assert run_cli("init", "--db", db_url).returncode == 0
    shown = run_cli("approvals", "show", "--db", db_url)
    assert shown.stdout == "min approvals: 1\nduties: shared\n"
    refused = run_cli("approvals", "set", "--min", "10", "--db", db_url)
    assert refused.returncode == 2 and "10 is not in the range 1<=x<=9" in refused.stderr
    set_ = run_cli("approvals", "set", "--min", "2", "--separate-duties", "--json", "--db", db_url)
    assert set_.returncode == 0, set_.stderr
    assert json.loads(set_.stdout) == {
        "approval_policy": {"min_approvals": 2, "separate_duties": True}
    }
    with ledger.open(db_url, create=False) as store:
        size = store.head().size
    run_cli("approvals", "set", "--min", "2", "--separate-duties", "--db", db_url)
    with ledger.open(db_url, create=False) as store:
        assert store.head().size == size  # the same policy again appends nothing
