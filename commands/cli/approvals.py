"""``evidence approvals``: the approval policy every escalation is decided by (operators;
docs/cli.md, "evidence approvals")."""

from __future__ import annotations

from typing import Any

import click

from .common import db_option, emit_json, json_option, open_plane, server_options

DEFAULT: dict[str, Any] = {"min_approvals": 1, "separate_duties": False}


@click.group()
def approvals() -> None:
    """The approval policy: how many approvers, who may decide.

    How many approvers every escalation needs at least, and whether a plan's own
    operator may let it go on. Policy: an operator signs it. A plan may ask for more
    approvers, never fewer.
    """


@approvals.command("set")
@click.option(
    "--min",
    "min_approvals",
    type=click.IntRange(1, 9),
    required=True,
    help="Approvers who must each sign the same choice (1-9).",
)
@click.option(
    "--separate-duties/--no-separate-duties",
    default=False,
    show_default=True,
    help="Refuse a decision that lets a plan go on by the plan's own operator.",
)
@db_option
@server_options
@json_option
def set_(
    min_approvals: int,
    separate_duties: bool,
    server: str | None,
    operator_key: str | None,
    as_json: bool,
) -> None:
    """Set the approval policy, in force from now on.

    An escalation already pending keeps what it asked for.

    \b
    Examples:
      evidence approvals set --min 2 --separate-duties
      evidence approvals set --min 2 --server unix:/run/evidence/serve.sock
    """
    wanted: dict[str, Any] = {"min_approvals": min_approvals, "separate_duties": separate_duties}
    if server is not None:
        from ledger.events import ApprovalPolicySet

        from .operator_remote import act, expecting, remote

        expect = expecting(ApprovalPolicySet, "the approval policy asked for", **wanted)
        act(remote(server, operator_key), "approvals.set", wanted, expect)
    else:
        from commands.plane.approvals import set_approval_policy

        set_approval_policy(open_plane(), **wanted)
    _print(wanted, as_json)


@approvals.command("show")
@db_option
@json_option
def show(as_json: bool) -> None:
    """Print the approval policy in force.

    The default: one approver, duties shared.

    \b
    Examples:
      evidence approvals show --json
    """
    from commands.plane.approvals import approval_policy

    found = approval_policy(open_plane())
    shown: dict[str, Any] = (
        {"min_approvals": found.min_approvals, "separate_duties": found.separate_duties}
        if found is not None
        else DEFAULT
    )
    _print(shown, as_json)


def _print(policy: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json({"approval_policy": policy})
        return
    click.echo(f"min approvals: {policy['min_approvals']}")
    duties = "separate" if policy["separate_duties"] else "shared"
    click.echo(f"duties: {duties}")
