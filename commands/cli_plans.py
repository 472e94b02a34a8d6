"""``evidence plan create|list|show``."""

from __future__ import annotations

import click

from .audit import retries_left
from .common import db_option, emit_json, json_option, open_plane, print_table
from .history import plan_history, summarize
from .inputs import json_or_file, text_or_file
from .phases import enter_execute, record_strategy
from .plans import create_plan, get_plan, list_plans


@click.group()
def plan() -> None:
    """Plans: Strategize -> Execute -> Apply."""


@plan.command("create")
@click.argument("plan_id")
@click.option("--project", required=True, help="The project the plan works in.")
@click.option("--resource", "resources", multiple=True, required=True,
              help="A resource the plan touches (repeatable): repo:api, ./src ...")
@click.option("--config", metavar="JSON|@file",
              help="global_config: strict_mode, retry_limit, max_strategy_revisions, "
                   "max_iterations.")
@db_option
@json_option
def create(plan_id: str, project: str, resources: tuple[str, ...], config: str | None,
           as_json: bool) -> None:
    """Create PLAN_ID in phase Strategize."""
    raw = json_or_file(config, "--config") if config else None
    if raw is not None and not isinstance(raw, dict):
        raise click.UsageError("--config must be a JSON object")
    doc = create_plan(open_plane(), plan_id, project=project, resources=list(resources),
                      config=raw)
    if as_json:
        emit_json({"plan": doc})
    else:
        click.echo(f"plan {doc['plan_id']} created in phase {doc['phase']}")


@plan.command("list")
@click.option("--project", help="Only plans of this project.")
@click.option("--phase", type=click.Choice(["strategize", "execute", "apply"]),
              help="Only plans in this phase.")
@click.option("--outcome", help="Only plans whose last validation outcome is this.")
@db_option
@json_option
def list_(project: str | None, phase: str | None, outcome: str | None, as_json: bool) -> None:
    """List plans."""
    plans = [p for p in list_plans(open_plane(), project=project)
             if (phase is None or p["phase"] == phase)
             and (outcome is None or p["last_outcome"] == outcome)]
    if as_json:
        emit_json({"plans": plans})
        return
    print_table(["plan", "project", "phase", "revision", "outcome", "terminal", "resources"],
                [[p["plan_id"], p["project"], p["phase"], str(p["revision"]),
                  p["last_outcome"] or "-", p["terminal"] or "-", " ".join(p["resources"])]
                 for p in plans])


@plan.command("show")
@click.argument("plan_id")
@db_option
@json_option
def show(plan_id: str, as_json: bool) -> None:
    """Show one plan's current state."""
    doc = get_plan(open_plane(), plan_id)
    if as_json:
        emit_json({"plan": doc})
        return
    config = doc["global_config"]
    halt = doc["halt"]
    rows = [
        ("plan", doc["plan_id"]),
        ("project", doc["project"]),
        ("resources", " ".join(doc["resources"])),
        ("phase", doc["phase"]),
        ("strategy revision", str(doc["revision"])),
        ("attempt", str(doc["attempt"])),
        ("iteration", f"{doc['iteration']} of {config['max_iterations']}"),
        ("retries left", str(retries_left(config["retry_limit"], doc["retries_used"]))),
        ("strategy revisions used",
         f"{doc['revisions_used']} of {config['max_strategy_revisions']}"),
        ("pending decision", doc["pending_decision"]["decision_id"]
         if doc["pending_decision"] else "-"),
        ("token", f"{doc['token']['token_id']} ({doc['token']['status']})"
         if doc["token"] else "-"),
        ("strategy", doc["strategy"] or "-"),
        ("gate checks", f"{doc['gate_checks']} ({doc['gate_failures']} failed)"),
        ("tool calls", str(doc["tool_calls"])),
        ("last outcome", doc["last_outcome"] or "-"),
        ("informational failures", ", ".join(doc["informational_failures"]) or "-"),
        ("halt", f"{halt['halt_type']} (raw {halt['raw_halt_type']}): {halt['reason']}"
         if halt else "-"),
        ("compensation", doc["compensation"]["status"] if doc["compensation"] else "-"),
        ("terminal", doc["terminal"] or "-"),
        ("global_config", " ".join(f"{k}={str(v).lower()}" for k, v in config.items())),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key.ljust(width)}  {value}")


@plan.command("strategize")
@click.argument("plan_id")
@click.option("--strategy", required=True, metavar="TEXT|@file", help="The strategy.")
@db_option
@json_option
def strategize(plan_id: str, strategy: str, as_json: bool) -> None:
    """Record the strategy of the current revision (phase Strategize)."""
    doc = record_strategy(open_plane(), plan_id, text_or_file(strategy, "--strategy"))
    if as_json:
        emit_json({"plan": doc})
    else:
        click.echo(f"plan {plan_id}: strategy recorded (revision {doc['revision']})")


@plan.command("execute")
@click.argument("plan_id")
@db_option
@json_option
def execute(plan_id: str, as_json: bool) -> None:
    """Enter Execute (needs a recorded strategy)."""
    doc = enter_execute(open_plane(), plan_id)
    if as_json:
        emit_json({"plan": doc})
    else:
        click.echo(f"plan {plan_id} entered Execute (attempt {doc['attempt']})")


@plan.command("history")
@click.argument("plan_id")
@db_option
@json_option
def history(plan_id: str, as_json: bool) -> None:
    """The plan's timeline: every event with a one-line summary."""
    events = plan_history(open_plane(), plan_id)
    if as_json:
        emit_json({"plan_id": plan_id, "events": [
            {"position": e.position, "recorded_at": e.recorded_at, "actor": e.actor,
             "type": e.type, "event_id": e.event_id, "summary": summarize(e.payload)}
            for e in events]})
        return
    print_table(["pos", "recorded_at", "actor", "event", "summary"],
                [[str(e.position), e.recorded_at, e.actor, e.type, summarize(e.payload)]
                 for e in events])
