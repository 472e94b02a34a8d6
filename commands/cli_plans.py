"""``evidence plan create|list|show``."""

from __future__ import annotations

import click

from .common import db_option, emit_json, json_option, open_plane, print_table
from .inputs import json_or_file
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
@db_option
@json_option
def list_(project: str | None, as_json: bool) -> None:
    """List plans."""
    plans = list_plans(open_plane(), project=project)
    if as_json:
        emit_json({"plans": plans})
        return
    print_table(["plan", "project", "phase", "revision", "resources"],
                [[p["plan_id"], p["project"], p["phase"], str(p["revision"]),
                  " ".join(p["resources"])] for p in plans])


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
    rows = [
        ("plan", doc["plan_id"]),
        ("project", doc["project"]),
        ("resources", " ".join(doc["resources"])),
        ("phase", doc["phase"]),
        ("strategy revision", str(doc["revision"])),
        ("attempt", str(doc["attempt"])),
        ("strategy", doc["strategy"] or "-"),
        ("global_config", " ".join(f"{k}={str(v).lower()}" for k, v in config.items())),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key.ljust(width)}  {value}")
