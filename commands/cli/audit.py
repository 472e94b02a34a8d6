"""The auditor's commands: ``replay``, ``audit``, ``checkpoint`` and ``prove``, and the
``verify --checkpoint FILE`` helper (``verify_checkpoint_command``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from commands.auditor.audit import audit as run_audit
from commands.auditor.audit import check_files, replay_plan
from commands.plane.plans import terminal_label
from commands.plane.signing import plane_key_path
from ledger.bundle import Bundle
from ledger.checkpoints import (
    Checkpoint,
    CheckpointError,
    CheckpointReport,
    prove_inclusion,
    sign_checkpoint,
    verify_against_checkpoint,
)
from ledger.intake import read_text
from ledger.keys import fingerprint, load_private_key, load_public_key, public_key_b64

from .bundle import (
    bundle_option,
    default_origin,
    open_verified_bundle,
    public_key_option,
    signing_key,
)
from .common import (
    EXIT_VERDICT,
    console,
    db_option,
    emit_json,
    fail,
    json_option,
    open_store,
    print_table,
)
from .inputs import whole
from .terminal import inert

__all__ = [
    "audit",
    "checkpoint",
    "prove",
    "replay",
    "verify_against_checkpoint",
    "verify_checkpoint_command",
]


@click.command()
@click.argument("plan_id")
@click.option(
    "--as-of",
    "as_of",
    type=whole(1),
    default=None,
    metavar="POS",
    help="Stop at this log position.",
)
@bundle_option
@public_key_option
@db_option
@json_option
def replay(
    plan_id: str,
    as_of: int | None,
    bundle_file: Path | None,
    public_key_file: Path | None,
    as_json: bool,
) -> None:
    """The plan's state after each of its events, folded from the log."""
    log = (
        open_verified_bundle(bundle_file, public_key_file, as_json) if bundle_file else open_store()
    )
    steps = replay_plan(log, plan_id, as_of)
    if as_json:
        emit_json({"plan_id": plan_id, "as_of": as_of, "steps": steps})
        return
    print_table(
        [
            "pos",
            "event",
            "phase",
            "rev",
            "attempt",
            "retries_left",
            "outcome",
            "token",
            "terminal",
            "summary",
        ],
        [
            [
                str(s.position),
                s.type,
                s.phase or "-",
                _str(s.revision),
                _str(s.attempt),
                _str(s.retries_left),
                s.outcome or "-",
                f"{s.token['token_id'][-6:]} {s.token['status']}" if s.token else "-",
                terminal_label(
                    s.terminal,
                    bool(s.document.get("unvalidated")),
                    bool(s.document.get("compensation")),
                )
                or "-",
                s.summary,
            ]
            for s in steps
        ],
    )


def _str(value: int | None) -> str:
    return "-" if value is None else str(value)


@click.command()
@click.option("--plan", "plan_id", default=None, help="Only this plan's events.")
@bundle_option
@public_key_option
@click.option(
    "--plane-key",
    "plane_key_file",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The plane's public key: every token must be signed by it (default: the "
    "plane key of the database, if it is here; with --bundle, none).",
)
@click.option(
    "--files",
    "files_dir",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="With --plan: compare this resource directory with the change set the plan's Apply wrote.",
)
@db_option
@json_option
def audit(
    plan_id: str | None,
    bundle_file: Path | None,
    public_key_file: Path | None,
    plane_key_file: Path | None,
    files_dir: Path | None,
    as_json: bool,
) -> None:
    """Check the invariants and re-derive every verdict from recorded inputs."""
    if files_dir is not None and plan_id is None:
        fail("--files needs --plan P")
    log = (
        open_verified_bundle(bundle_file, public_key_file, as_json) if bundle_file else open_store()
    )
    report = run_audit(log, plan=plan_id, plane_public_key=_plane_public_key(log, plane_key_file))
    if files_dir is not None and plan_id is not None:
        report.checked["files"] = 1
        report.violations.extend(check_files(log, plan_id, files_dir))
        report.ok = not report.violations
    if as_json:
        emit_json(report)
    else:
        out = console()
        checks = ", ".join(f"{k} {v}" for k, v in report.checked.items())
        if report.unvalidated:
            out.print(
                f"note: applied UNVALIDATED (require_validation: false, no required "
                f"validation ran): {inert(', '.join(report.unvalidated))}",
                markup=False,
            )
        if report.ok:
            out.print(f"ok: {report.size} events audited ({checks})", markup=False)
        else:
            out.print(
                f"FAILED: {len(report.violations)} violation(s) in {report.size} events",
                markup=False,
            )
            for v in report.violations:
                at = f"position {v.position}" if v.position is not None else "log"
                out.print(
                    inert(
                        f"  {at}: {v.invariant}"
                        + (f" (plan {v.plan_id})" if v.plan_id else "")
                        + f": expected {v.expected}; found {v.found}"
                    ),
                    markup=False,
                )
    if not report.ok:
        click.get_current_context().exit(EXIT_VERDICT)


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
@db_option
@json_option
def checkpoint(key_file: Path | None, origin: str | None, as_json: bool) -> None:
    """Print a signed tree head (C2SP tlog-checkpoint) of the current log."""
    store = open_store()
    key = signing_key(store, key_file)
    origin = default_origin(store) if origin is None else origin
    head = store.head()
    try:
        text = sign_checkpoint(Checkpoint(origin=origin, size=head.size, root=head.root), key)
    except CheckpointError as exc:
        fail(f"--origin: {exc}")
    if as_json:
        emit_json(
            {
                "checkpoint": text,
                "origin": origin,
                "size": head.size,
                "root": head.root.hex(),
                "key_name": origin,
                "public_key": public_key_b64(key),
                "fingerprint": fingerprint(key),
            }
        )
    else:
        click.echo(text, nl=False)


@click.command()
@click.argument("position", type=whole(1))
@click.option(
    "--size",
    type=whole(1),
    default=None,
    metavar="N",
    help="In the tree of the first N events (default: the whole log).",
)
@db_option
@json_option
def prove(position: int, size: int | None, as_json: bool) -> None:
    """Print the RFC 9162 inclusion proof of the event at POSITION."""
    try:
        proof = prove_inclusion(open_store(), position, size)
    except CheckpointError as exc:
        fail(str(exc))
    if as_json:
        emit_json(proof)
        return
    click.echo(f"leaf_index {proof.leaf_index}")
    click.echo(f"tree_size {proof.tree_size}")
    click.echo(f"leaf_hash {proof.leaf_hash}")
    click.echo(f"root {proof.root}")
    for node in proof.proof:
        click.echo(node)


def _plane_public_key(log: Any, plane_key_file: Path | None) -> Ed25519PublicKey | None:
    """The key tokens are checked against: the one given, else the plane key of the
    database when it is on this machine. A bundle names no plane key of its own (its
    checkpoint may be signed by any key): None, and token signatures go unchecked."""
    if plane_key_file is not None:
        return load_public_key(plane_key_file)
    if isinstance(log, Bundle):
        return None
    path = plane_key_path(log.url)
    return load_private_key(path).public_key() if os.path.lexists(path) else None


# ------------------------------------------------------- verify --checkpoint FILE (helper)


def verify_checkpoint_command(
    checkpoint_file: Path, public_key_file: Path | None, as_json: bool
) -> CheckpointReport:
    """The body of ``evidence verify --checkpoint FILE [--public-key FILE]``: check the
    note's signature (by the public key given, else the plane key's) and that the log
    extends its tree head; print the report; exit 1 if anything failed."""
    text = read_text(checkpoint_file, "checkpoint", f"--checkpoint {checkpoint_file}")
    store = open_store()
    if public_key_file is not None:
        public_key = load_public_key(public_key_file)
    else:
        plane = plane_key_path(store.url)
        if not os.path.lexists(plane):
            fail("--checkpoint needs --public-key FILE (no plane key here to check it with)")
        public_key = load_private_key(plane).public_key()
    report = verify_against_checkpoint(store, text, public_key)
    if as_json:
        emit_json(report)
    else:
        print_checkpoint_report(report)
    if not report.ok:
        click.get_current_context().exit(EXIT_VERDICT)
    return report


def print_checkpoint_report(report: CheckpointReport) -> None:
    out = console()
    v = report.verify
    cp = report.checkpoint
    if report.ok and cp is not None:
        out.print(f"ok: {v.size} events and {v.checked_blobs} blobs verified", markup=False)
        out.print(
            f"signed checkpoint {inert(cp.origin)} {cp.size}:{cp.root}: signature ok, "
            f"consistent with the current log ({len(cp.consistency_proof)}-hash proof)",
            markup=False,
        )
    else:
        problems = [*report.problems, *v.problems]
        out.print(f"FAILED: {len(problems)} problem(s)", markup=False)
        for p in problems:
            at = f"position {p.position}" if p.position is not None else "head"
            out.print(f"  {at}: {p.kind}: {inert(p.detail)}", markup=False)
    out.print(f"tree head {v.size}:{v.root}", markup=False)
