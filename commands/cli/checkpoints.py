"""``evidence checkpoint``: a signed tree head of the log, printed; cosigned by a
policy's witnesses (``--witness``); or published by the service now (``--server``)."""

from __future__ import annotations

from pathlib import Path

import click

import ledger

from .bundle import default_origin, signing_key
from .common import (
    EXIT_VERDICT,
    db_option,
    emit_json,
    fail,
    json_option,
    open_store,
    read_policy,
    server_options,
)
from .terminal import inert


@click.command()
@click.option(
    "--key",
    "key_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Sign with this Ed25519 private key (default: the plane key).",
)
@click.option(
    "--origin",
    default=None,
    metavar="NAME",
    help="The checkpoint's origin line (default: evidence-ledger/<ledger id>).",
)
@click.option(
    "--witness",
    "policy_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A witness policy (C2SP tlog-policy): have its witnesses cosign, print the "
    "checkpoint only if its quorum holds.",
)
@db_option
@server_options
@json_option
def checkpoint(
    key_file: Path | None,
    origin: str | None,
    policy_file: Path | None,
    server: str | None,
    operator_key: str | None,
    as_json: bool,
) -> None:
    """Print a signed tree head (a C2SP checkpoint) of the log.

    A C2SP tlog-checkpoint signed note of the current size and root, signed by the plane
    key (or --key): keep it outside the database and check the log against it later.
    With --witness POLICY, the policy's witnesses are asked to cosign it, and it is
    printed only when their quorum holds (exit 1 otherwise, each witness's answer said).

    \b
    Examples:
      evidence checkpoint > kept.checkpoint
      evidence checkpoint --witness witnesses.policy > cosigned.checkpoint
    """
    from ledger.checkpoints import Checkpoint, CheckpointError, sign_checkpoint, verifier_key
    from ledger.keys import fingerprint, public_key_b64

    if server is not None:
        if key_file is not None or origin is not None or policy_file is not None:
            fail("--server asks the service to publish its own: no --key, --origin or --witness")
        _published_remotely(server, operator_key, as_json)
        return

    store = open_store()
    key = signing_key(store, key_file)
    origin = default_origin(store) if origin is None else origin
    head = store.durable_head()
    try:
        text = sign_checkpoint(Checkpoint(origin=origin, size=head.size, root=head.root), key)
    except CheckpointError as exc:
        fail(f"--origin: {exc}")
    if policy_file is not None:
        _witnessed_checkpoint(store, text, policy_file, as_json)
        return
    if as_json:
        emit_json(
            {
                "checkpoint": text,
                "origin": origin,
                "size": head.size,
                "root": head.root.hex(),
                "key_name": origin,
                "verifier_key": verifier_key(origin, key),
                "public_key": public_key_b64(key),
                "fingerprint": fingerprint(key),
            }
        )
    else:
        click.echo(text, nl=False)


def _published_remotely(server: str, operator_key: str | None, as_json: bool) -> None:
    """``checkpoint --server URL``: the service publishes one now (its witnesses' quorum
    too, when it has a policy); printed, or exit 1 when none was published."""
    from .operator_remote import checkpoint_now, remote

    answer = checkpoint_now(remote(server, operator_key))
    if as_json:
        emit_json(answer)
    elif answer["published"]:
        click.echo(answer["checkpoint"], nl=False)
    else:
        click.echo("not published: the service's witnesses did not cosign it", err=True)
    if not answer["published"]:
        click.get_current_context().exit(EXIT_VERDICT)


def _witnessed_checkpoint(store: ledger.Store, note: str, policy_file: Path, as_json: bool) -> None:
    """``checkpoint --witness POLICY``: the checkpoint cosigned by the policy's witnesses,
    printed only when the quorum holds; each witness's refusal said (exit 1 without it)."""
    from commands.plane.witnesses import proofs, witness
    from ledger.checkpoints import parse_checkpoint, stored_leaves

    policy, _ = read_policy(policy_file, "--witness")
    size = parse_checkpoint(note)[0].size
    done = witness(note, policy, proofs(lambda: stored_leaves(store, size)))
    answers = {a.witness: a.why or "cosigned" for a in done.asked}
    if as_json:
        emit_json(
            {
                "checkpoint": done.note if done.check.ok else None,
                "quorum": done.check.quorum,
                "log_signed": done.check.log is not None,
                "cosigned": sorted(done.check.cosigned),
                "witnesses": answers,
            }
        )
    else:
        for name, answer in answers.items():
            click.echo(inert(f"witness {name}: {answer}"), err=True)
        if done.check.ok:
            click.echo(done.note, nl=False)
    if not done.check.ok:
        why = "the policy lists no key of this log" if done.check.log is None else "no quorum"
        if not as_json:
            click.echo(f"not published: {why}", err=True)
        click.get_current_context().exit(EXIT_VERDICT)
