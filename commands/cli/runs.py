"""``evidence call``, ``evidence validate`` and ``evidence halt``."""

from __future__ import annotations

from typing import Any

import click

from .common import (
    EXIT_VERDICT,
    db_option,
    emit_json,
    json_option,
    open_plane,
    print_table,
    workdir_option,
)
from .inputs import json_or_file, raw_bytes, text_or_file
from .terminal import inert


@click.command()
@click.argument("plan_id")
@click.option("--tool", required=True, help="The registered tool to call.")
@click.option("--params", required=True, metavar="JSON|@file", help="The call's parameters.")
@click.option("--step", help="The step this call serves.")
@click.option("--output-schema", metavar="JSON|@file", help="The step's output declaration.")
@click.option(
    "--record-output",
    metavar="JSON|@file",
    help="The output of a call the orchestrator made itself (gates still apply).",
)
@workdir_option
@db_option
@json_option
def call(
    plan_id: str,
    tool: str,
    params: str,
    step: str | None,
    output_schema: str | None,
    record_output: str | None,
    as_json: bool,
) -> None:
    """Gate, run and record a tool call. Exit 1 on a deviation or a halt.

    The input gate, the tool run in the plan's sandbox (or, with --record-output, a
    call the orchestrator made itself), then the output gate.

    \b
    Examples:
      evidence call P-1 --tool pytest --params '{"path": "tests"}'
      evidence call P-1 --tool search --params @p.json --record-output @out.json
    """
    from commands.plane.answers import call_answer
    from commands.plane.runs import call_tool

    schema = json_or_file(output_schema, "--output-schema") if output_schema else None
    recorded = raw_bytes(record_output, "--record-output") if record_output is not None else None
    plane = open_plane()
    report = call_tool(
        plane,
        plan_id,
        tool,
        raw_bytes(params, "--params"),
        step=step,
        output_schema=schema,
        recorded_output=recorded,
    )
    if as_json:
        emit_json(call_answer(plane, plan_id, report))
    elif not report.input_gate.passed:
        click.echo(
            f"input gate failed: {len(report.input_gate.check.deviations)} "
            "deviation(s); the call was not made"
        )
    elif report.halt is not None:
        click.echo(
            inert(
                f"halt {report.halt.halt_type} (raw {report.halt.raw_halt_type}): "
                f"{report.halt.reason}"
            )
        )
        click.echo(f"hint: {inert(report.halt.hint)}")
    else:
        assert report.call is not None and report.output_gate is not None
        called = report.call
        if called.executor == "recorded":  # made by the orchestrator: no exit code, no time
            ran = "recorded by the orchestrator"
        elif called.exit_code is None:  # an MCP tool: no exit code
            ran = f"{called.duration_ms} ms"
        else:
            ran = f"exit {called.exit_code}, {called.duration_ms} ms"
        click.echo(
            f"call {report.call.call_id}: {inert(tool)} {ran}, "
            f"output gate {report.output_gate.check.verdict}"
        )
    if not as_json:
        deviations = [
            (g.check.gate, d)
            for g in (report.input_gate, report.output_gate)
            if g is not None
            for d in g.check.deviations
        ]
        if deviations:
            print_table(
                ["gate", "pointer", "kind", "expected", "actual_type"],
                [
                    [gate, d.pointer or "/", d.kind, d.expected, d.actual_type]
                    for gate, d in deviations
                ],
            )
    if not report.ok:
        click.get_current_context().exit(EXIT_VERDICT)


# A result's fields a failure shows (``commands.auditor.history.Failure``).
FAILURE_FIELDS = (
    "validation", "mode", "verdict", "cause", "message", "error", "stdout_tail", "stderr_tail",
)  # fmt: skip


@click.command()
@click.argument("plan_id")
@workdir_option
@db_option
@json_option
def validate(plan_id: str, as_json: bool) -> None:
    """Run the plan's pinned validations; classify the outcome.

    The binding set pinned at Execute runs in parallel, each validation read-only; a
    pass mints the Apply token. A run with no required validation is no pass; after a
    blocker, record a fix first. Exit 1 on any outcome but a pass.

    \b
    Examples:
      evidence validate P-1
      evidence validate P-1 --json
    """
    from commands.plane.answers import validation_answer
    from commands.plane.validation_runs import validate_plan

    plane = open_plane()
    report = validate_plan(plane, plan_id)
    if as_json:
        emit_json(validation_answer(plane, plan_id, report))
    else:
        _say_validation(plan_id, report.to_json())
    if report.outcome != "pass":
        click.get_current_context().exit(EXIT_VERDICT)


def _say_validation(plan_id: str, doc: dict[str, Any]) -> None:
    """A validation run as the terminal shows it: each result, why each one failed,
    the outcome and what comes next."""
    from commands.rules.plan_runs import Failure, failure_lines

    print_table(
        ["validation", "scope", "mode", "result", "ms", "message"],
        [
            [
                r["validation"],
                r["scope"] or "-",
                r["mode"],
                ("pass" if r["verdict"] else "FAIL")
                if r["verdict"] is not None
                else f"no verdict ({r['cause']})",
                str(r["duration_ms"]),
                r["message"] or r["error"] or "",
            ]
            for r in doc["results"]
        ],
    )
    # Why each one failed, as `plan show` says it: its message or error and the
    # tails the report carries (read once, by the run, not again from the blobs).
    shown = [
        Failure(
            position=0,
            run_id=doc["run_id"],
            **{k: r[k] for k in FAILURE_FIELDS},
        )
        for r in doc["results"]
        if r["verdict"] is not True and (r["stdout_tail"] or r["stderr_tail"] or r["error"])
    ]
    if shown:
        click.echo("why:")
        for failure in shown:
            for line in failure_lines(failure):
                click.echo(inert("  " + line, multiline=True))
    if doc["informational_failures"]:
        click.echo(
            "informational failures (never block): "
            + inert(", ".join(doc["informational_failures"]))
        )
    click.echo(f"outcome: {doc['outcome']} — {inert(doc['reason'])}")
    if doc["token"]:
        click.echo(f"token: {doc['token']}")
        click.echo(f"next: evidence apply {inert(plan_id)} --token TOKEN")
    elif doc["escalation"]:
        click.echo(
            f"escalated: decision {doc['escalation']['decision_id']} — "
            f"evidence authorize {doc['escalation']['decision_id']} --key FILE "
            "(--revise TEXT | --abandon)"
        )
    elif doc["strategy_revision"] is not None:
        click.echo(
            f"retry limit reached: plan back in Strategize (revision "
            f"{doc['strategy_revision']}); record a new strategy"
        )
    else:
        click.echo(inert(f"next: {doc['who_acts']}: {doc['next_action']}"))


@click.command()
@click.argument("plan_id")
@click.option("--raw-type", required=True, help="The precise cause (see docs/cli.md).")
@click.option("--reason", required=True, metavar="TEXT|@file", help="Why the plan halts.")
@click.option("--hint", help="What the one who acts should do.")
@click.option("--terminal", is_flag=True, help="The plan ends here.")
@db_option
@json_option
def halt(
    plan_id: str, raw_type: str, reason: str, hint: str | None, terminal: bool, as_json: bool
) -> None:
    """Record an orchestrator's own halt. Exit 1 (a halt is a verdict on the run).

    A raw type that classifies as escalate opens a pending human decision.

    \b
    Examples:
      evidence halt P-1 --raw-type timeout --reason "the build hung"
      evidence halt P-1 --raw-type needs_decision --reason @why.txt
    """
    import msgspec

    from commands.plane.runs import record_halt

    event = record_halt(
        open_plane(),
        plan_id,
        raw_type,
        text_or_file(reason, "--reason"),
        hint=hint,
        terminal=terminal,
    )
    if as_json:
        emit_json({"halt": msgspec.to_builtins(event)})
    else:
        click.echo(inert(f"halt {event.halt_type} (raw {event.raw_halt_type}): {event.reason}"))
        click.echo(f"hint: {inert(event.hint)}")
    click.get_current_context().exit(EXIT_VERDICT)
