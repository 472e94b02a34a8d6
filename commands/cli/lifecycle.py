"""``evidence fix``, ``evidence keys``, ``evidence authorize`` and ``evidence apply``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .common import (
    db_option,
    emit_json,
    emit_listing,
    fail,
    format_option,
    json_option,
    open_plane,
    print_table,
    refuse_stdout,
    server_options,
    workdir_option,
)
from .inputs import raw_bytes, text_or_file
from .terminal import inert

if TYPE_CHECKING:
    from projections.states import ApproverState


@click.command()
@click.argument("plan_id")
@click.option("--note", required=True, metavar="TEXT|@file", help="What the fix changed.")
@click.option("--diff", metavar="@file", help="The diff (kept in the blob store).")
@workdir_option
@db_option
@json_option
def fix(plan_id: str, note: str, diff: str | None, as_json: bool) -> None:
    """Record the agent's fix before re-validating.

    After a blocker, `validate` is refused until the fix is recorded.

    \b
    Examples:
      evidence fix P-1 --note "handle empty input in the parser"
      evidence fix P-1 --note @note.txt --diff @fix.diff
    """
    from commands.plane.answers import fix_answer
    from commands.plane.lifecycle import record_fix

    if diff is not None and not diff.startswith("@"):
        fail("--diff takes @file")
    doc = record_fix(
        open_plane(),
        plan_id,
        text_or_file(note, "--note"),
        diff=raw_bytes(diff, "--diff") if diff else None,
    )
    if as_json:
        emit_json(fix_answer(doc))
    else:
        click.echo(f"fix recorded for plan {inert(plan_id)} (attempt {doc.attempt})")


@click.group()
def keys() -> None:
    """People's keys (Ed25519); private keys never enter the ledger.

    An approver signs a decision on an escalated plan, an operator signs policy, each
    with a private key kept outside the ledger; the ledger records the public key,
    endorsed by the plane key."""


@keys.command("generate")
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Private key file (mode 0600); the public key goes to FILE.pub.",
)
@json_option
def generate(out: Path, as_json: bool) -> None:
    """Write a new key pair to local files. Nothing is recorded.

    \b
    Examples:
      evidence keys generate --out alice.key
      evidence keys generate --out ~/.keys/bob.key --json
    """
    from commands.rules.signing import SigningError
    from ledger.keys import fingerprint, generate_key_pair

    refuse_stdout(out, "--out", "a private key goes to a file only its owner can read")
    try:
        pair = generate_key_pair(out)
    except SigningError as exc:
        fail(str(exc))
    print_ = fingerprint(pair.public_key)
    if as_json:
        emit_json({"private_key": str(out), "public_key": f"{out}.pub", "fingerprint": print_})
    else:
        click.echo(
            f"private key {inert(out)} (keep it away from the agent), public key {inert(out)}.pub"
        )
        click.echo(f"fingerprint {print_}")
        click.echo(f"next: evidence keys add NAME {inert(out)}.pub  (register it as an approver)")


@keys.command("add")
@click.argument("name")
@click.argument("pubkey_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--role",
    type=click.Choice(["approver", "operator"]),
    default="approver",
    show_default=True,
    help="approver: decides escalations; operator: signs policy.",
)
@db_option
@server_options
@json_option
def add(
    name: str,
    pubkey_file: Path,
    role: str,
    server: str | None,
    operator_key: str | None,
    as_json: bool,
) -> None:
    """Register NAME's public key as an approver's or an operator's.

    Needs the plane key (it endorses the key); an approver's registration is policy,
    signed with this process's operator key too. With --server, an approver's key
    through the service (its plane key endorses; the operator signs here).

    \b
    Examples:
      evidence keys add alice alice.key.pub
      evidence keys add ops-bob bob.key.pub --role operator --json
    """
    from commands.plane.lifecycle import add_approver_key
    from projections.states import to_json

    if server is not None:
        _add_remotely(server, operator_key, name, pubkey_file, role, as_json)
        return
    doc = add_approver_key(open_plane(create=True), name, pubkey_file, role=role)  # type: ignore[arg-type]
    if as_json:
        emit_json({"approver": to_json(doc), "role": role})
    else:
        click.echo(f"{role} {inert(name)}: {len(doc.keys)} key(s)")


def _add_remotely(
    server: str, operator_key: str | None, name: str, pubkey_file: Path, role: str, as_json: bool
) -> None:
    """An approver's key added through the service: the service's plane key endorses
    it, the operator signs its registration here."""
    from commands.errors import CommandRefused
    from ledger.events import ApproverKeyAdded
    from ledger.keys import SigningError, load_public_key, public_key_b64

    from .operator_remote import act, expecting, remote

    if role != "approver":
        fail(
            "--server adds approvers' keys only: an operator key is the plane key's alone "
            "to make, on the service's host"
        )
    try:
        public = public_key_b64(load_public_key(pubkey_file))
    except SigningError as exc:
        raise CommandRefused(str(exc)) from None
    what = f"the registration of {name}'s key"
    expect = expecting(ApproverKeyAdded, what, name=name, public_key=public, role="approver")
    act(remote(server, operator_key), "keys.add", {"name": name, "public_key": public}, expect)
    if as_json:
        emit_json({"approver": {"name": name}, "role": role})
    else:
        click.echo(f"{role} {inert(name)}: key added")


@keys.command("revoke")
@click.argument("name")
@click.option("--reason", default="")
@db_option
@server_options
@json_option
def revoke(
    name: str, reason: str, server: str | None, operator_key: str | None, as_json: bool
) -> None:
    """Revoke NAME's active keys.

    Decisions signed with them are refused from now on.

    \b
    Examples:
      evidence keys revoke alice --reason "laptop lost"
      evidence keys revoke bob --server unix:/run/evidence/serve.sock
    """
    from commands.plane.lifecycle import revoke_approver
    from projections.states import to_json

    if server is not None:
        from ledger.events import ApproverKeyRevoked

        from .operator_remote import act, expecting, remote

        expect = expecting(ApproverKeyRevoked, f"a revocation of {name}'s keys", name=name)
        act(remote(server, operator_key), "keys.revoke", {"name": name, "reason": reason}, expect)
        if as_json:
            emit_json({"approver": {"name": name}, "revoked": True})
        else:
            click.echo(f"approver {inert(name)}: keys revoked")
        return
    doc = revoke_approver(open_plane(), name, reason=reason)
    if as_json:
        emit_json({"approver": to_json(doc)})
    else:
        click.echo(f"approver {inert(name)}: keys revoked")


@keys.command("list")
@db_option
@format_option()
def list_keys(fmt: str) -> None:
    """Registered approver keys.

    \b
    Examples:
      evidence keys list
      evidence keys list --format jsonl
    """
    from projections.states import to_json

    approvers: list[ApproverState] = [
        d for d in open_plane().projections.documents("approvers") if d is not None
    ]
    documents = [to_json(a) for a in approvers]
    emit_listing(
        fmt,
        {"approvers": documents},
        documents,
        lambda: print_table(
            ["approver", "fingerprint", "status"],
            [[a.name, fp, key.status] for a in approvers for fp, key in a.keys.items()],
        ),
    )


@click.command("authorize")
@click.argument("decision_id", required=False)
@click.option(
    "--key",
    "key_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The approver's private key file.",
)
@click.option("--revise", metavar="TEXT|@file", help="Back to Strategize with this guidance.")
@click.option("--abandon", is_flag=True, help="End the plan (terminal failure).")
@click.option("--reason", help="Why (recorded).")
@click.option(
    "--expire",
    is_flag=True,
    help="Deny every plan whose escalation expired undecided (the plane key signs: run it "
    "where the plane key is; the service does it on its own).",
)
@db_option
@click.option(
    "--server",
    "server",
    metavar="URL",
    default=None,
    help="Through the evidence service at URL (unix:PATH or https://…): the requests "
    "and the decision signed here with --key; no database needed.",
)
@format_option()
def authorize_(
    decision_id: str | None,
    key_file: Path | None,
    revise: str | None,
    abandon: bool,
    reason: str | None,
    expire: bool,
    server: str | None,
    fmt: str,
) -> None:
    """List pending decisions, or sign and record one.

    Without DECISION_ID: the pending decisions (a listing). With it: sign the decision
    with the approver's key and record it; --revise sends the plan back to Strategize,
    --abandon ends it. No decision passes a blocker: only an escalation is decided.

    \b
    Examples:
      evidence authorize
      evidence authorize 01M8N0Q6Z4 --key alice.key --revise "split the change"
    """
    import msgspec

    from commands.plane.lifecycle import authorize, decision_stands

    if decision_id is not None and fmt in ("jsonl", "csv"):
        fail(f"--format {fmt} lists the pending decisions: give no DECISION_ID")
    if expire:
        if decision_id is not None or server is not None or key_file is not None:
            fail("--expire takes no DECISION_ID, --key or --server: the plane key signs")
        _expire(fmt)
        return
    if server is not None:
        _authorize_remotely(server, decision_id, key_file, revise, abandon, reason, fmt)
        return
    plane = open_plane()
    if decision_id is None:
        if key_file is not None or revise is not None or abandon or reason is not None:
            fail(
                "give the DECISION_ID to decide (without it, authorize lists the pending decisions)"
            )
        from commands.plane.escalations import pending_evidence

        _print_pending(pending_evidence(plane), fmt)
        return
    if key_file is None:
        fail("--key FILE is required to decide")
    if (revise is None) == (not abandon):
        fail("give exactly one of --revise TEXT or --abandon")
    decided = authorize(
        plane,
        decision_id,
        key_file,
        choice="revise" if revise is not None else "abandon",
        guidance=text_or_file(revise, "--revise") if revise else None,
        reason=reason,
    )
    stands = decision_stands(plane, decided.plan_id, decided.decision_id)
    _report_decision({**msgspec.to_builtins(decided), "stands": stands}, fmt)


def _expire(fmt: str) -> None:
    import msgspec

    from commands.plane.expiry import expire_escalations

    expired = [msgspec.to_builtins(e) for e in expire_escalations(open_plane())]
    if fmt == "json":
        emit_json({"expired": expired})
        return
    for e in expired:
        click.echo(f"escalation {e['decision_id']} of plan {inert(e['plan_id'])} expired: denied")
    if not expired:
        click.echo("no escalation has expired")


def _report_decision(decided: dict[str, Any], fmt: str) -> None:
    """The decision recorded (``stands``: it decided the escalation; with k of n
    approvers, a signature may leave it waiting for more)."""
    stands = decided.pop("stands", True)
    if fmt == "json":
        emit_json({"decision": decided, "stands": stands})
        return
    who = inert(str(decided["approver"]))
    if not stands:
        click.echo(
            f"decision {decided['decision_id']}: {decided['choice']} signed by {who}; "
            "waiting for more approvers"
        )
        return
    then = (
        "plan back in Strategize: record a strategy, execute, re-validate"
        if decided["choice"] == "revise"
        else "plan ended (terminal failure)"
    )
    click.echo(f"decision {decided['decision_id']}: {decided['choice']} by {who}; {then}")


def _print_pending(pending: list[dict[str, Any]], fmt: str) -> None:
    def table() -> None:
        print_table(
            ["decision", "plan", "options", "reason"],
            [
                [p["decision_id"], p["plan_id"], ",".join(p["options"]), p["reason"]]
                for p in pending
            ],
        )
        for p in pending:
            _print_evidence(p)

    emit_listing(fmt, {"decisions": pending}, pending, table)


_MARKS = {"added": "A", "removed": "D", "modified": "M"}


def _print_evidence(pending: dict[str, Any]) -> None:
    """What an approver decides on, after the table: the last run's failures, and the
    changes it judged with their diffs (the log's text and the plan's files: inert)."""
    import msgspec

    from commands.rules.plan_runs import Failure, failure_lines

    failures, changes = pending.get("failures") or [], pending.get("changes") or []
    if not failures and not changes:
        return
    click.echo(f"\ndecision {pending['decision_id']} (plan {inert(pending['plan_id'])}):")
    for failure in failures:
        lines = failure_lines(msgspec.convert(failure, Failure), "    ")
        click.echo(inert("  " + "\n".join(lines), multiline=True))
    for change in changes:
        where = f"{change['resource']}/{change['path']}"
        click.echo(inert(f"  {_MARKS[change['change']]} {where}"))
        if "diff" in change:
            click.echo(inert(_indented(change["diff"], "    "), multiline=True))
        elif "diff_note" in change:
            click.echo(inert(f"    ({change['diff_note']})"))


def _indented(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.rstrip("\n").split("\n"))


def _authorize_remotely(
    server: str,
    decision_id: str | None,
    key_file: Path | None,
    revise: str | None,
    abandon: bool,
    reason: str | None,
    fmt: str,
) -> None:
    """``authorize --server``: the listing or the decision through the service, every
    request and the decision signed here with the approver's key."""
    from .operator_remote import decide, pending, remote

    if key_file is None:
        fail("--server needs --key FILE: the approver's key signs the requests")
    to = remote(server, str(key_file))
    if decision_id is None:
        _print_pending(pending(to), fmt)
        return
    if (revise is None) == (not abandon):
        fail("give exactly one of --revise TEXT or --abandon")
    asked: dict[str, Any] = {"decision_id": decision_id, "choice": "abandon"}
    if revise is not None:
        asked.update(choice="revise", guidance=text_or_file(revise, "--revise"))
    if reason is not None:
        asked["reason"] = reason
    _report_decision(decide(to, asked), fmt)


@click.command("apply")
@click.argument("plan_id")
@click.option("--token", metavar="TOKEN|@file")
@click.option(
    "--resume",
    is_flag=True,
    help="Finish an Apply that was interrupted after its change set was recorded.",
)
@workdir_option
@db_option
@json_option
def apply_(plan_id: str, token: str | None, resume: bool, as_json: bool) -> None:
    """Apply a plan with the token its passing validation minted.

    The point of no return: the change set is recorded, the sandbox's files are written
    into the resources, then the plan is applied. --resume finishes an Apply a crash
    interrupted.

    \b
    Examples:
      evidence apply P-1 --token @token.txt
      evidence apply P-1 --resume
    """
    from commands.plane.answers import applied_answer
    from commands.plane.lifecycle import apply_plan, complete_apply

    if (token is None) == (not resume):
        fail("give --token TOKEN, or --resume")
    plane = open_plane()
    if resume:
        doc = complete_apply(plane, plan_id)
    else:
        doc = apply_plan(plane, plan_id, text_or_file(token or "", "--token", "token").strip())
    files = doc.applied.files if doc.applied is not None else []
    if as_json:
        emit_json(applied_answer(doc))
    else:
        token = doc.token.token_id if doc.token is not None else None
        click.echo(
            f"plan {inert(plan_id)} applied (token {token} consumed), {len(files)} file(s) written"
        )
        for f in files:
            click.echo(f"  {f.sha256[:16]}  {inert(f.resource)}/{inert(f.path)}")
