"""``evidence plan create|list|show``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
import msgspec

from commands.rules.vocabulary import OUTCOMES, terminal_state  # light: no store

from .common import (
    db_option,
    emit_json,
    emit_listing,
    format_option,
    json_option,
    open_plane,
    print_table,
    workdir_option,
)
from .inputs import json_or_file, text_or_file
from .terminal import inert

if TYPE_CHECKING:
    from ledger.events import ResolvedAttachment
    from projections.states import PlanState

# The plane, the store (SQLAlchemy) and the auditor are imported inside each command, as
# it runs: `evidence plan --help` and completing `evidence plan <TAB>` import none of
# them (tests/commands/cli/test_startup.py).


@click.group()
def plan() -> None:
    """Plans: Strategize -> Execute -> Apply.

    A plan records its strategy in Strategize, works in a sandbox in Execute (its tool
    calls, fixes and validations), and reaches Apply with a passing run's token."""


@plan.command("create")
@click.argument("plan_id")
@click.option("--project", required=True, help="The project the plan works in.")
@click.option(
    "--resource",
    "resources",
    multiple=True,
    required=True,
    help="A resource the plan touches (repeatable): repo:api, ./src ...",
)
@click.option(
    "--config",
    metavar="JSON|@file",
    help="global_config: strict_mode, retry_limit, max_strategy_revisions, max_iterations.",
)
@click.option(
    "--skill",
    "skills",
    multiple=True,
    metavar="NAME",
    help="The plan may call only the tools and validations of its skills (repeatable; "
    "none: any registered one).",
)
@db_option
@json_option
def create(
    plan_id: str,
    project: str,
    resources: tuple[str, ...],
    config: str | None,
    skills: tuple[str, ...],
    as_json: bool,
) -> None:
    """Create PLAN_ID in phase Strategize.

    \b
    Examples:
      evidence plan create P-1 --project api --resource ./src
      evidence plan create P-2 --project api --resource ./src --skill python-dev
    """
    from commands.plane.plans import create_plan
    from projections.documents import to_json

    raw = json_or_file(config, "--config") if config else None
    if raw is not None and not isinstance(raw, dict):
        raise click.UsageError("--config must be a JSON object")
    doc = create_plan(
        open_plane(create=True),
        plan_id,
        project=project,
        resources=list(resources),
        config=raw,
        skills=list(skills),
    )
    if as_json:
        emit_json({"plan": to_json(doc)})
    else:
        click.echo(f"plan {inert(doc.plan_id)} created in phase {doc.phase}")


@plan.command("list")
@click.option("--project", help="Only plans of this project.")
@click.option(
    "--phase",
    type=click.Choice(["strategize", "execute", "apply"]),
    help="Only plans in this phase.",
)
@click.option(
    "--outcome",
    type=click.Choice(OUTCOMES),
    help="Only plans whose canonical outcome is this (escalate: awaiting a human decision).",
)
@db_option
@format_option()
def list_(project: str | None, phase: str | None, outcome: str | None, fmt: str) -> None:
    """List plans.

    \b
    Examples:
      evidence plan list --outcome escalate
      evidence plan list --project api --format csv
    """
    from commands.plane.plans import list_plans
    from projections.documents import to_json

    found = list_plans(open_plane(), project=project)
    plans = [
        (key, doc)
        for key, doc in found.items()
        if (phase is None or (doc is not None and doc.phase == phase))
        and (outcome is None or (doc is not None and doc.outcome == outcome))
    ]
    # A stream with no plan.created is listed as {"plan_id": ID}.
    documents = [to_json(doc) or {"plan_id": key} for key, doc in plans]
    emit_listing(
        fmt,
        {"plans": documents},
        documents,
        lambda: print_table(
            ["plan", "project", "phase", "revision", "outcome", "terminal", "resources"],
            [_list_row(key, doc) for key, doc in plans],
        ),
    )


def _list_row(plan_id: str, doc: PlanState | None) -> list[str]:
    if doc is None:  # a stream with no plan.created
        return [_text(plan_id), "-", "-", "-", "-", "-", "-"]
    return [
        _text(doc.plan_id),
        _text(doc.project),
        _text(doc.phase),
        _text(doc.revision),
        _text(doc.outcome),
        _text(terminal_state(doc)),
        " ".join(doc.resources) or "-",
    ]


@plan.command("show")
@click.argument("plan_id")
@workdir_option
@db_option
@json_option
def show(plan_id: str, as_json: bool) -> None:
    """Show one plan's current state (and where its sandbox is).

    \b
    Examples:
      evidence plan show P-1
      evidence plan show P-1 --json
    """
    from commands.plane.answers import plan_status
    from commands.plane.plans import get_plan
    from commands.rules.plan_runs import failure_lines

    # The read model: a plan whose log breaks a rule is still shown (audit reports it).
    status = plan_status(open_plane(), plan_id, get_plan)
    if as_json:
        emit_json(status.to_json())
        return
    state, sandbox, would, failures = (
        status.plan,
        status.sandbox,
        status.would_bind,
        status.failures,
    )
    for key, value in plan_rows(plan_id, state):
        click.echo(f"{key.ljust(_WIDTH)}  {inert(value)}")
    click.echo(f"{'confinement'.ljust(_WIDTH)}  {status.confinement.text()}")
    for resource, copy in sandbox.items():
        click.echo(f"{'sandbox'.ljust(_WIDTH)}  {inert(resource)} -> {inert(copy)}")
    applying = state.applying if state is not None else None
    changes = (state.applied if state is not None else None) or applying
    written = changes.files if changes is not None else []
    if written:
        click.echo()
        click.echo(
            "files written by Apply"
            + (f" (interrupted: evidence apply {inert(plan_id)} --resume)" if applying else "")
            + ":"
        )
        print_table(
            ["sha256", "resource", "path"],
            [[_text(f.sha256)[:16], _text(f.resource), _text(f.path)] for f in written],
        )
    binding = state.binding if state is not None else []
    if binding:
        click.echo()
        _print_binding(f"binding set ({len(binding)} pinned at Execute):", binding)
    if would is not None:
        click.echo()
        _print_binding(f"validations that would bind it at Execute ({len(would)}):", would)
    if failures:
        click.echo()
        click.echo(f"failed in the last validation run ({failures[0].run_id[-6:]}):")
        for failure in failures:
            for line in failure_lines(failure):
                click.echo(inert("  " + line, multiline=True))


def _print_binding(title: str, rows: list[ResolvedAttachment]) -> None:
    click.echo(title)
    if not rows:
        click.echo("  (none: a validation run would have no required validation)")
        return
    print_table(
        ["validation", "version", "mode", "scope", "resource", "args", "attachment"],
        [
            [
                _text(b.validation),
                _text(b.validation_version),
                _text(b.mode),
                _text(b.scope),
                _text(b.resource),
                msgspec.json.encode(b.args).decode(),
                _text(b.attachment_id),
            ]
            for b in rows
        ],
    )


_WIDTH = len("strategy revisions used")  # the longest field name


def _text(value: object) -> str:
    """A document value as a cell: ``-`` for none."""
    return "-" if value is None or value == "" else str(value)


def _skills(doc: PlanState) -> str:
    """What the plan may call: its skills (pinned at Execute), or anything registered."""
    if doc.skills is msgspec.UNSET:
        return "none: any registered tool or validation may be called"
    if doc.skill_pins is msgspec.UNSET:
        return f"{', '.join(doc.skills)} (their members may be called; pinned at Execute)"
    return "; ".join(
        f"{name} v{pin.version}: {', '.join(pin.members)}" for name, pin in doc.skill_pins.items()
    )


def _of(value: object, limit: object) -> str:
    return "-" if value is None else f"{value} of {_text(limit)}"


def plan_rows(plan_id: str, doc: PlanState | None) -> list[tuple[str, str]]:
    """``plan show``'s field/value lines. A plan stream with no ``plan.created`` folds to
    no state (None), and is still shown."""
    if doc is None:
        return [
            ("plan", plan_id),
            (
                "state",
                "none: the stream has no plan.created (`evidence audit` reports "
                "it; `evidence plan history` shows its events)",
            ),
        ]
    from commands.auditor.replay import retries_left
    from commands.plane.plans import current_halt
    from projections.documents import to_json

    config = doc.global_config
    halt, token = current_halt(doc), doc.token
    last_outcome = _text(doc.last_outcome)
    if doc.unvalidated:
        last_outcome += " (no required validation ran)"
    return [
        ("plan", _text(doc.plan_id)),
        ("project", _text(doc.project)),
        ("resources", " ".join(doc.resources) or "-"),
        ("skills", _skills(doc)),
        ("phase", _text(doc.phase)),
        ("strategy revision", _text(doc.revision)),
        ("attempt", _text(doc.attempt)),
        ("iteration", _of(doc.iteration, config.max_iterations)),
        ("retries left", str(retries_left(config.retry_limit, doc.retries_used))),
        ("strategy revisions used", _of(doc.revisions_used, config.max_strategy_revisions)),
        (
            "pending decision",
            _text(doc.pending_decision.decision_id if doc.pending_decision is not None else None),
        ),
        ("token", f"{token.token_id} ({token.status})" if token is not None else "-"),
        ("strategy", _text(doc.strategy)),
        ("gate checks", f"{doc.gate_checks} ({doc.gate_failures} failed)"),
        ("tool calls", str(doc.tool_calls)),
        ("outcome", _text(doc.outcome)),
        ("last outcome", last_outcome),
        ("informational failures", ", ".join(doc.informational_failures) or "-"),
        (
            "halt",
            f"{halt.halt_type} (raw {halt.raw_halt_type}): {halt.reason}"
            if halt is not None
            else "-",
        ),  # only while it stands: an applied plan's old halts are in `plan history`
        ("compensation", _text(doc.compensation.status if doc.compensation is not None else None)),
        ("terminal", _text(terminal_state(doc))),
        (
            "global_config",
            " ".join(f"{k}={str(v).lower()}" for k, v in to_json(config).items()) or "-",
        ),
    ]


@plan.command("strategize")
@click.argument("plan_id")
@click.option("--strategy", required=True, metavar="TEXT|@file", help="The strategy.")
@db_option
@json_option
def strategize(plan_id: str, strategy: str, as_json: bool) -> None:
    """Record the strategy of the current revision (in Strategize).

    Then prints the validations that would bind the plan at Execute, so the strategy is
    made knowing them.

    \b
    Examples:
      evidence plan strategize P-1 --strategy "fix the failing parser test"
      evidence plan strategize P-1 --strategy @strategy.md
    """
    from commands.plane.answers import strategy_answer
    from commands.plane.phases import record_strategy, would_bind

    plane = open_plane()
    doc = record_strategy(plane, plan_id, text_or_file(strategy, "--strategy"))
    if as_json:
        emit_json(strategy_answer(plane, doc))
    else:
        would = would_bind(plane, plan_id)
        click.echo(f"plan {inert(plan_id)}: strategy recorded (revision {doc.revision})")
        _print_binding(f"validations that would bind it at Execute ({len(would)}):", would)


@plan.command("execute")
@click.argument("plan_id")
@workdir_option
@db_option
@json_option
def execute(plan_id: str, as_json: bool) -> None:
    """Enter Execute (needs a recorded strategy).

    Pins the binding set (the validations the plan's runs will run) and makes the
    plan's sandbox, where its tool calls, fixes and validations work until Apply.

    \b
    Examples:
      evidence plan execute P-1
      evidence plan execute P-1 --workdir /srv/sandboxes --json
    """
    from commands.plane.answers import execute_answer
    from commands.plane.phases import enter_execute
    from commands.plane.plans import sandbox_paths

    plane = open_plane()
    doc = enter_execute(plane, plan_id)
    if as_json:
        emit_json(execute_answer(plane, doc))
    else:
        click.echo(
            f"plan {inert(plan_id)} entered Execute (attempt {doc.attempt}), "
            f"{len(doc.binding)} validation(s) pinned"
        )
        for resource, copy in sandbox_paths(plane, doc).items():
            click.echo(f"sandbox of {inert(resource)}: {inert(copy)}")


@plan.command("history")
@click.argument("plan_id")
@db_option
@format_option()
def history(plan_id: str, fmt: str) -> None:
    """The plan's timeline, one line per event, then where it stands.

    \b
    Examples:
      evidence plan history P-1
      evidence plan history P-1 --format jsonl
    """
    from commands.auditor.history import summaries
    from commands.plane.plans import get_plan, plan_state
    from commands.rules.plan_runs import failure_lines, failure_of, plan_history

    plane = open_plane()
    events = plan_history(plane.store, plan_id)
    lines = summaries(events)
    doc = get_plan(plane, plan_id)
    state = plan_state(doc) if doc is not None else None
    outcome = doc.outcome if doc is not None else None
    failures = {e.position: failure_of(e, plane.store.get_blob) for e in events}
    documents = [
        {
            "position": e.position,
            "recorded_at": e.recorded_at,
            "actor": e.actor,
            "type": e.type,
            "event_id": e.event_id,
            "summary": line,
            # A validation result that is no pass: why (message or error, output tails).
            "failure": failures[e.position],
        }
        for e, line in zip(events, lines, strict=True)
    ]

    def table() -> None:
        print_table(
            ["pos", "recorded_at", "actor", "event", "summary"],
            [
                [str(e.position), e.recorded_at, e.actor, e.type, line]
                for e, line in zip(events, lines, strict=True)
            ],
        )
        why = [f for f in failures.values() if f is not None]
        if why:
            click.echo("why the validations failed:")
            for failure in why:
                for number, line in enumerate(failure_lines(failure)):
                    prefix = f"  {failure.position:>4}  " if number == 0 else "        "
                    click.echo(inert(prefix + line, multiline=True))
        click.echo(f"state: {_text(state)} (outcome {_text(outcome)})")

    emit_listing(
        fmt,
        {"plan_id": plan_id, "state": state, "outcome": outcome, "events": documents},
        documents,
        table,
    )
