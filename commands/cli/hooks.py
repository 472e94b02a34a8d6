"""``evidence hook pre-tool`` and ``evidence hook post-tool``: an agent CLI's tool-use
hooks (docs/agents.md). They read the hook JSON on stdin, gate and record, and answer
the way those hooks expect: exit 0 lets the call go on (nothing on stdout), exit 2
blocks it with the reasons on stderr — a verdict, printed ``blocked: …`` or
``rejected: …``, never ``error: …``. A refused command (bad stdin, unknown or ended
plan) is the CLI's usual exit 2 with one ``error: …`` line: to the agent CLI a block
as well, and nothing is appended."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from commands.plane.hooks import (
    HookCall,
    HookKind,
    HookVerdict,
    UnknownTools,
    parse_hook_input,
    post_tool,
    pre_tool,
)
from ledger.intake import parse_json, read_stream

from .common import EXIT_REFUSED, db_option, open_plane, workdir_option
from .gates import routing_line
from .terminal import inert

# The hook convention: exit 2 blocks the call (PreToolUse) or shows the reasons to the
# agent (PostToolUse). The same number as a refused command, on purpose: both stop it.
EXIT_BLOCK = EXIT_REFUSED

F = TypeVar("F", bound=Callable[..., Any])


def _hook_options(fn: F) -> F:
    fn = click.option(
        "--unknown-tools",
        type=click.Choice(["record", "deny"]),
        default="deny",
        show_default=True,
        help="A tool the registry does not know: block it as an invented tool (deny), "
        "or let it through and record its call (record).",
    )(fn)
    fn = click.option(
        "--plan", "plan_id", required=True, help="The plan the agent works on (in Execute)."
    )(fn)
    return workdir_option(db_option(fn))


def _read_call(kind: HookKind) -> HookCall:
    """The hook JSON on stdin, through the input layer (the cap on agent bytes, depth,
    numbers, duplicate keys, strict UTF-8); its used fields checked strictly."""
    source = "stdin (the hook input)"
    data = read_stream(sys.stdin.buffer, "agent", source)
    return parse_hook_input(parse_json(data, source, kind=None), kind, source)


@click.group()
def hook() -> None:
    """Agent CLI tool-use hooks: gate and record its tool calls.

    An agent CLI's PreToolUse / PostToolUse hooks (stdin: the hook JSON). Exit 2
    blocks, with the deviations on stderr (docs/agents.md)."""


@hook.command("pre-tool")
@_hook_options
def pre_tool_(plan_id: str, unknown_tools: UnknownTools) -> None:
    """PreToolUse: the input gate. Exit 0 lets the call go on; exit 2 blocks it.

    \b
    Examples:
      evidence hook pre-tool --plan P-1 < hook-input.json
      evidence hook pre-tool --plan P-1 --unknown-tools record
    """
    verdict = pre_tool(open_plane(), plan_id, _read_call("pre"), unknown=unknown_tools)
    if verdict.blocked:
        _block(verdict, plan_id, "blocked", "the call is not made")


@hook.command("post-tool")
@_hook_options
def post_tool_(plan_id: str, unknown_tools: UnknownTools) -> None:
    """PostToolUse: record the call and its output; the output gate.

    Exit 2 on a deviation (the reasons go to the agent).

    \b
    Examples:
      evidence hook post-tool --plan P-1 < hook-input.json
      evidence hook post-tool --plan P-1 --unknown-tools record
    """
    verdict = post_tool(open_plane(), plan_id, _read_call("post"), unknown=unknown_tools)
    if verdict.blocked:
        _block(verdict, plan_id, "rejected", "the output does not become state")


def _block(verdict: HookVerdict, plan_id: str, word: str, consequence: str) -> None:
    gate = verdict.gate
    assert gate is not None  # a hook blocks only on a failed gate check
    check = gate.check
    if verdict.tool is None:
        what = f"tool {check.tool!r} is not registered (--unknown-tools deny)"
    else:
        what = f"the {check.gate} gate failed for tool {check.tool!r}"
    _say(f"{word}: {what} in plan {plan_id}: {len(check.deviations)} deviation(s); {consequence}")
    for d in check.deviations:
        _say(f"  {d.pointer or '/'}: {d.kind} (expected {d.expected}; got {d.actual_type})")
    _say(routing_line(gate))
    click.get_current_context().exit(EXIT_BLOCK)


def _say(line: str) -> None:
    click.echo(inert(line), err=True)
