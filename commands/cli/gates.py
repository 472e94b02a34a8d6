"""``evidence gate input`` and ``evidence gate output``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from .common import EXIT_VERDICT, db_option, emit_json, json_option, open_plane, print_table
from .inputs import json_or_file, raw_bytes
from .terminal import inert

# The plane and the store load inside each command, as it runs: completing `evidence gate
# <TAB>` or `gate --help` imports neither (tests/commands/cli/test_startup.py).
if TYPE_CHECKING:
    from commands.plane.core import Plane
    from commands.plane.gates import GateOutcome


def _report(plane: Plane, plan_id: str, outcome: GateOutcome, as_json: bool) -> None:
    # routing_line lives with the gates (the hooks' answers, here and in the service, use it).
    from commands.plane.answers import gate_answer
    from commands.plane.gates import routing_line

    check = outcome.check
    if as_json:
        emit_json(gate_answer(plane, plan_id, outcome))
    else:
        subject = f"tool {check.tool}" if check.gate == "input" else f"step {check.step}"
        click.echo(
            f"{check.gate} gate, {inert(subject)}: {check.verdict}"
            f" (attempt {check.attempt}, iteration {check.iteration})"
        )
        if check.deviations:
            print_table(
                ["pointer", "kind", "expected", "actual_type"],
                [[d.pointer or "/", d.kind, d.expected, d.actual_type] for d in check.deviations],
            )
            click.echo(routing_line(outcome))
    if not outcome.passed:
        click.get_current_context().exit(EXIT_VERDICT)


@click.group()
def gate() -> None:
    """Structural gates: any deviation fails, and is recorded.

    A gate never coerces, drops or fills in a value: every deviation from the declared
    schema is recorded with the check and routed by the plan's strict_mode."""


@gate.command("input")
@click.option("--plan", "plan_id", required=True, help="The plan (in Execute).")
@click.option("--tool", required=True, help="The tool the agent proposes to call.")
@click.option("--params", required=True, metavar="JSON|@file", help="The proposed parameters.")
@click.option("--step", help="The step this call serves (its output gate finds the tool).")
@db_option
@json_option
def input_(plan_id: str, tool: str, params: str, step: str | None, as_json: bool) -> None:
    """Check a proposed call: tool identity and parameters. Exit 1 on any deviation.

    \b
    Examples:
      evidence gate input --plan P-1 --tool search --params '{"q": "x"}'
      evidence gate input --plan P-1 --tool search --params @params.json --step s1
    """
    from commands.plane.gates import gate_input

    checked = raw_bytes(params, "--params")
    plane = open_plane()
    _report(plane, plan_id, gate_input(plane, plan_id, tool, checked, step=step), as_json)


@gate.command("output")
@click.option("--plan", "plan_id", required=True, help="The plan (in Execute).")
@click.option("--step", required=True, help="The step whose output this is.")
@click.option("--output", required=True, metavar="JSON|@file", help="The returned structure.")
@click.option("--schema", metavar="JSON|@file", help="The step's output declaration.")
@db_option
@json_option
def output(plan_id: str, step: str, output: str, schema: str | None, as_json: bool) -> None:
    """Check a returned structure against the step's declaration. Exit 1 on any deviation.

    \b
    Examples:
      evidence gate output --plan P-1 --step s1 --output @result.json
      evidence gate output --plan P-1 --step s2 --output @r.json --schema @s.json
    """
    from commands.plane.gates import gate_output

    declared = json_or_file(schema, "--schema") if schema is not None else None
    returned = raw_bytes(output, "--output")
    plane = open_plane()
    _report(plane, plan_id, gate_output(plane, plan_id, step, returned, schema=declared), as_json)
