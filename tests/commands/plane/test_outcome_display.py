"""How readers show a plan's outcome (the seed 001 vocabulary), its pinned binding set and
an unvalidated Apply: `plan list --outcome`, `plan show`, `plan history`, `report`,
`replay` and `stats`, in process through the real entry point, on both backends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commands.plane import Plane
from commands.plane.attachments import attach
from commands.plane.lifecycle import apply_plan
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.validation_runs import validate_plan
from tests.helpers import invoke, status_plan


@pytest.fixture
def plans(db_url: str, tmp_path: Path) -> dict[str, str]:
    """P-1: escalated, awaiting a human (its required validation failed with no retries
    or revisions left); P-2: a blocker; U-1: opted out of required validation, passed
    with none, applied (unvalidated); N-1: no run yet. Returns the attachment id of the
    status validation, pinned by P-1 and P-2."""
    with Plane.open(db_url) as plane:
        project = status_plan(plane, tmp_path, {"retry_limit": 0, "max_strategy_revisions": 0})
        assert validate_plan(plane, "P-1").outcome == "escalate"
        create_plan(plane, "P-2", project="api", resources=[str(project)])
        record_strategy(plane, "P-2", "try")
        enter_execute(plane, "P-2")
        assert validate_plan(plane, "P-2").outcome == "blocker"
        create_plan(
            plane,
            "U-1",
            project="web",
            resources=["repo:web"],
            config={"require_validation": False},
        )
        record_strategy(plane, "U-1", "nothing to check")
        enter_execute(plane, "U-1")
        report = validate_plan(plane, "U-1")
        assert report.outcome == "pass" and report.token
        apply_plan(plane, "U-1", report.token)
        create_plan(plane, "N-1", project="web", resources=["repo:web"])
        # An attachment made after Execute binds later plans only: P-1 keeps its one.
        attach(plane, "status", resource="repo:web")
        [pinned] = plane.state("plan:P-1").doc.binding
        return {"db": db_url, "attachment_id": pinned.attachment_id, "resource": str(project)}


def cli(plans: dict[str, str], *args: str):
    result = invoke(*args, "--db", plans["db"])
    assert "Traceback" not in result.output, result.output
    return result


def test_plan_list_filters_on_the_canonical_outcome(plans: dict[str, str]) -> None:
    def ids(*args: str) -> list[str]:
        result = cli(plans, "plan", "list", "--json", *args)
        assert result.exit_code == 0, result.output
        return [p["plan_id"] for p in json.loads(result.stdout)["plans"]]

    assert ids() == ["N-1", "P-1", "P-2", "U-1"]
    assert ids("--outcome", "escalate") == ["P-1"]  # awaiting a human decision
    assert ids("--outcome", "blocker") == ["P-2"]
    assert ids("--outcome", "pass") == ["U-1"]
    assert ids("--outcome", "internal_error") == []
    table = cli(plans, "plan", "list")
    assert table.exit_code == 0, table.output
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines()[1:]}
    assert rows["P-1"][4] == "escalate" and rows["P-2"][4] == "blocker"
    assert rows["U-1"][4:7] == ["pass", "applied", "(unvalidated)"]
    assert rows["N-1"][4:6] == ["-", "-"]
    for bad in ("applied", "none", "needs_decision", "PASS"):
        refused = cli(plans, "plan", "list", "--outcome", bad)
        lines = refused.stderr.strip().splitlines()
        assert refused.exit_code == 2 and len(lines) == 1, refused.output
        assert lines[0].startswith("error: ") and "--outcome" in lines[0]


def fields(shown: str) -> dict[str, str]:
    """``plan show``'s ``field  value`` lines (before the binding set)."""
    pairs = [line.split("  ", 1) for line in shown.split("\n\n")[0].splitlines()]
    return {key.strip(): value.strip() for key, value in pairs}


def test_plan_show_outcome_binding_and_unvalidated_apply(plans: dict[str, str]) -> None:
    shown = cli(plans, "plan", "show", "P-1")
    assert shown.exit_code == 0, shown.output
    p1 = fields(shown.stdout)
    assert (p1["outcome"], p1["terminal"]) == ("escalate", "-")
    binding = shown.stdout.split("\n\n")[1].splitlines()
    assert binding[0] == "binding set (1 pinned at Execute):"
    assert binding[1].split() == [
        "validation",
        "version",
        "mode",
        "scope",
        "resource",
        "args",
        "attachment",
    ]
    assert binding[2].split() == [
        "status",
        "1",
        "required",
        "direct",
        plans["resource"],
        "{}",
        plans["attachment_id"],
    ]
    as_json = json.loads(cli(plans, "plan", "show", "P-1", "--json").stdout)["plan"]
    assert as_json["outcome"] == "escalate" and as_json["unvalidated"] is False
    assert [b["attachment_id"] for b in as_json["binding"]] == [plans["attachment_id"]]

    unvalidated = cli(plans, "plan", "show", "U-1")
    assert unvalidated.exit_code == 0, unvalidated.output
    u1 = fields(unvalidated.stdout)
    assert (u1["outcome"], u1["terminal"]) == ("pass", "applied (unvalidated)")
    assert u1["last outcome"] == "pass (no required validation ran)"
    assert "binding set" not in unvalidated.stdout  # nothing pinned
    doc = json.loads(cli(plans, "plan", "show", "U-1", "--json").stdout)["plan"]
    assert (doc["terminal"], doc["unvalidated"], doc["binding"]) == ("applied", True, [])


def test_plan_history_and_replay_name_the_pinned_set_and_the_unvalidated_apply(
    plans: dict[str, str],
) -> None:
    def summaries(plan: str) -> dict[str, str]:
        result = cli(plans, "plan", "history", plan, "--json")
        assert result.exit_code == 0, result.output
        return {e["type"]: e["summary"] for e in json.loads(result.stdout)["events"]}

    p1 = summaries("P-1")
    assert p1["plan.execute_entered"] == "entered Execute (revision 0), 1 validation(s) pinned"
    assert "vacuous" not in p1["validation.run_completed"]
    u1 = summaries("U-1")
    assert u1["plan.execute_entered"] == "entered Execute (revision 0), 0 validation(s) pinned"
    assert u1["validation.run_completed"].endswith(", vacuous: no required validation ran")
    assert u1["plan.applied"] == "applied, unvalidated (0 path(s) changed)"
    table = cli(plans, "plan", "history", "U-1")
    assert "applied, unvalidated (0 path(s) changed)" in table.stdout
    replay = cli(plans, "replay", "U-1")
    assert replay.exit_code == 0, replay.output
    assert "applied (unvalidated)" in replay.stdout.splitlines()[-1]


def test_report_shows_the_binding_set_and_marks_an_unvalidated_apply(
    plans: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "p1.html"
    assert cli(plans, "report", "P-1", "--html", str(out)).exit_code == 0
    page = out.read_text(encoding="utf-8")
    plan = page.split('id="plan"')[1].split("</section>")[0]
    assert "Binding set (pinned at Execute)" in plan
    assert f"<code>{plans['attachment_id']}</code>" in plan and ">status<" in plan
    assert ">required<" in plan and ">direct<" in plan
    assert '<span class="badge warn">escalate</span>' in plan  # the plan's outcome

    out = tmp_path / "u1.html"
    assert cli(plans, "report", "U-1", "--html", str(out)).exit_code == 0
    page = out.read_text(encoding="utf-8")
    plan = page.split('id="plan"')[1].split("</section>")[0]
    assert '<span class="badge warn">applied (unvalidated)</span>' in plan
    assert "no required validation ran" in plan and "no validation pinned" in plan
    outcome = page.split('id="outcome"')[1].split("</section>")[0]
    assert '<span class="badge warn">vacuous</span>' in outcome
    assert '<span class="badge warn">applied (unvalidated)</span>' in outcome
    assert "applied, unvalidated (0 path(s) changed)" in page  # the timeline


def test_stats_count_the_vocabulary_and_applies_apart(plans: dict[str, str]) -> None:
    result = cli(plans, "stats", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["plans_by_outcome"] == {"blocker": 1, "escalate": 1, "pass": 1}
    assert (
        report["plans_applied"],
        report["plans_applied_unvalidated"],
        report["plans_without_outcome"],
    ) == (1, 1, 1)
    by_plan = {p["plan"]: p for p in report["plans"]}
    assert {p: (r["outcome"], r["applied"]) for p, r in by_plan.items()} == {
        "P-1": ("escalate", None),
        "P-2": ("blocker", None),
        "U-1": ("pass", "unvalidated"),
        "N-1": (None, None),
    }
    assert cli(plans, "stats", "--json", "--project", "web").stdout.count('"pass"') >= 1
    text = cli(plans, "stats")
    assert text.exit_code == 0, text.output
    assert "plans applied: 1 (1 unvalidated); plans with no outcome yet: 1" in text.stdout
