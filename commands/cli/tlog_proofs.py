"""``evidence prove POSITION --format tlog-proof`` and ``evidence verify --tlog-proof FILE``:
an event's offline proof in C2SP tlog-proof's form (``ledger.tlog_proof``), made from the
log and checked with nothing but the proof and the keys (docs/auditing.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

import ledger
from ledger.intake import read_text

from .common import EXIT_VERDICT, emit_json, fail, read_policy
from .terminal import inert


def print_tlog_proof(store: ledger.Store, position: int, checkpoint_file: Path | None) -> None:
    """The proof of the event at ``position`` against the checkpoint kept in
    ``checkpoint_file`` (a cosigned one, say: its tree must be this log's), else a
    checkpoint of the log's head signed by the plane key now."""
    from ledger.checkpoints import (
        Checkpoint,
        CheckpointError,
        parse_checkpoint,
        sign_checkpoint,
        stored_leaves,
    )
    from ledger.merkle import inclusion_proof, root_of
    from ledger.tiles import row_entry
    from ledger.tlog_proof import TlogProof, format_proof

    from .bundle import default_origin, signing_key

    if checkpoint_file is not None:
        note = read_text(checkpoint_file, "checkpoint", f"--checkpoint {checkpoint_file}")
        try:
            checkpoint, _ = parse_checkpoint(note)
        except CheckpointError as exc:
            fail(f"--checkpoint {inert(str(checkpoint_file))}: {exc}")
    else:
        head = store.durable_head()
        checkpoint = Checkpoint(origin=default_origin(store), size=head.size, root=head.root)
        note = sign_checkpoint(checkpoint, signing_key(store, None))
    if not 0 < position <= checkpoint.size:
        fail(f"position {position} is not in the checkpoint's tree of {checkpoint.size} events")
    leaves = stored_leaves(store, checkpoint.size)
    if len(leaves) < checkpoint.size or root_of(leaves) != checkpoint.root:
        fail("the checkpoint is not of this log: its root is not the root of the log's events")
    with store.snapshot() as snap:
        [[row]] = list(snap.rows(first=position, last=position))
    proof = TlogProof(
        position - 1, inclusion_proof(leaves, position - 1), note, extra=row_entry(row)
    )
    click.echo(format_proof(proof), nl=False)


def verify_tlog_proof(path: Path, policy_file: Path | None, verifier: Any, as_json: bool) -> None:
    """Check a tlog-proof offline: the entry is included in the checkpoint's tree, and the
    checkpoint is signed (``verifier``: the log's key) or satisfies ``policy_file``. A
    proof that does not hold is a verdict (exit 1)."""
    from ledger.checkpoints import CheckpointError, VerifierKey, open_note, parse_checkpoint
    from ledger.tlog_proof import parse_proof

    try:
        # a proof carries its event: up to a bundle entry's 64 KiB, in base64
        proof = parse_proof(read_text(path, "document", f"--tlog-proof {path}"))
    except CheckpointError as exc:
        fail(f"--tlog-proof {inert(str(path))}: {exc}")
    problems: list[str] = []
    if not proof.includes():
        problems.append("the proof does not take the entry to the checkpoint's root")
    found: dict[str, Any] = {}
    if policy_file is not None:
        check = read_policy(policy_file, "--policy")[0].check(proof.checkpoint)
        found = check.to_json()
        if not check.ok:
            problems.append("the checkpoint does not satisfy the policy")
    else:
        try:
            origin = parse_checkpoint(proof.checkpoint)[0].origin
            key = (
                verifier if isinstance(verifier, VerifierKey) else VerifierKey.of(origin, verifier)
            )
            open_note(proof.checkpoint, key)
        except CheckpointError as exc:
            problems.append(str(exc))
    _report(proof.index, proof.extra, problems, found, as_json)


def _report(
    index: int, entry: bytes | None, problems: list[str], policy: dict[str, Any], as_json: bool
) -> None:
    import msgspec

    event = None
    if entry is not None:
        try:
            event = msgspec.json.decode(entry)
        except msgspec.DecodeError:
            event = None  # a commitment to a large event, not its bytes
    if as_json:
        emit_json(
            {"ok": not problems, "position": index + 1, "event": event, "problems": problems}
            | ({"policy": policy} if policy else {})
        )
    elif problems:
        click.echo("FAILED: " + "; ".join(problems))
    else:
        what = f"event {index + 1}"
        if isinstance(event, dict):
            what += f" ({event.get('type')} in {event.get('stream')})"
        click.echo(inert(f"ok: {what} is in the checkpoint's tree, signed as required"))
    if problems:
        click.get_current_context().exit(EXIT_VERDICT)
