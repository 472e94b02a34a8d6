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
from typing import TYPE_CHECKING, Any, TypeVar

import click

from .common import db_option, open_plane, workdir_option

# The plane is imported where a hook decides in this process, not at import: with
# `--server` the command only relays (commands.hook_client) and pays click's start-up,
# not the plane's (docs/performance.md, "Thin hooks").
if TYPE_CHECKING:
    from commands.plane.hooks import HookCall, HookKind, HookVerdict, UnknownTools

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
        "--server",
        metavar="URL",
        default=None,
        help="Relay the hook to the evidence service at URL (credential: "
        "$EVIDENCE_CREDENTIAL or $EVIDENCE_CREDENTIAL_FILE; no --plan, --db, --workdir). "
        "`evidence-hook` does the same and starts faster.",
    )(fn)
    fn = click.option(
        "--plan",
        "plan_id",
        default=None,
        help="The plan the agent works on (in Execute). Required unless --server.",
    )(fn)
    return workdir_option(db_option(fn))


def _read_call(kind: HookKind) -> HookCall:
    """The hook JSON on stdin, through the input layer (the cap on agent bytes, depth,
    numbers, duplicate keys, strict UTF-8); its used fields checked strictly."""
    from commands.plane.hooks import HOOK_SOURCE, read_hook_input
    from ledger.intake import read_stream

    return read_hook_input(read_stream(sys.stdin.buffer, "agent", HOOK_SOURCE), kind)


@click.group()
def hook() -> None:
    """Agent CLI tool-use hooks: gate and record its tool calls.

    An agent CLI's PreToolUse / PostToolUse hooks (stdin: the hook JSON). Exit 2
    blocks, with the deviations on stderr (docs/agents.md)."""


@hook.command("pre-tool")
@_hook_options
def pre_tool_(plan_id: str | None, unknown_tools: UnknownTools, server: str | None) -> None:
    """PreToolUse: the input gate. Exit 0 lets the call go on; exit 2 blocks it.

    \b
    Examples:
      evidence hook pre-tool --plan P-1 < hook-input.json
      evidence hook pre-tool --plan P-1 --unknown-tools record
    """
    plan_id = _plan_here("pre-tool", plan_id, server, unknown_tools)
    from commands.plane.hooks import pre_tool

    verdict = pre_tool(
        open_plane(layout_note=False), plan_id, _read_call("pre"), unknown=unknown_tools
    )
    _answer(verdict, plan_id, "pre")


@hook.command("post-tool")
@_hook_options
def post_tool_(plan_id: str | None, unknown_tools: UnknownTools, server: str | None) -> None:
    """PostToolUse: record the call and its output; the output gate.

    Exit 2 on a deviation (the reasons go to the agent).

    \b
    Examples:
      evidence hook post-tool --plan P-1 < hook-input.json
      evidence hook post-tool --plan P-1 --unknown-tools record
    """
    plan_id = _plan_here("post-tool", plan_id, server, unknown_tools)
    from commands.plane.hooks import post_tool

    verdict = post_tool(
        open_plane(layout_note=False), plan_id, _read_call("post"), unknown=unknown_tools
    )
    _answer(verdict, plan_id, "post")


def _plan_here(kind: str, plan_id: str | None, server: str | None, unknown: str) -> str:
    """The plan to decide on in this process. With ``--server`` the hook is relayed to
    the service by the thin client (``commands.hook_client``, the ``evidence-hook``
    script: the same request, the same answer, every failure a block) and the command
    ends with its exit status."""
    if server is None:
        if plan_id is None:
            raise click.UsageError("Missing option '--plan' (or --server URL).")
        return plan_id
    meta = click.get_current_context().find_root().meta
    if plan_id is not None or "evidence.db" in meta or "evidence.workdir" in meta:
        raise click.UsageError(
            "--server relays the hook to the service, which knows the plan from the "
            "credential: give no --plan, --db or --workdir with it"
        )
    from commands.hook_client import main as relay

    click.get_current_context().exit(
        relay([kind, f"--server={server}", f"--unknown-tools={unknown}"])
    )


def _answer(verdict: HookVerdict, plan_id: str, kind: HookKind) -> None:
    """Say what the plane decided as the hook convention wants it (the text is made by
    ``hook_answer``, which the service sends too: one wording for both doors)."""
    from commands.plane.hooks import hook_answer

    answer = hook_answer(verdict, plan_id, kind)
    if answer.stderr:
        click.echo(answer.stderr, err=True, nl=False)
    if answer.exit:
        click.get_current_context().exit(answer.exit)
