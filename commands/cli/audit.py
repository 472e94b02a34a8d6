"""The auditor's commands: ``replay``, ``audit``, ``checkpoint`` and ``prove``, and the
``verify --checkpoint FILE`` helper (``verify_checkpoint_command``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

import ledger  # light: the errors and the version; the store loads on first use
from commands.rules.vocabulary import terminal_label
from ledger.canonical import MAX_SAFE_INTEGER
from ledger.intake import read_text

from .bundle import (
    bundle_option,
    open_verified_bundle,
    public_key_option,
)
from .common import (
    EXIT_VERDICT,
    console,
    db_option,
    emit_json,
    emit_listing,
    fail,
    format_option,
    json_option,
    open_store,
    print_table,
    read_policy,
)
from .inputs import whole
from .progress import progress_bar
from .terminal import inert

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from ledger.checkpoints import CheckpointReport, InclusionProof, Verifier
    from ledger.proofs import ConsistencyCheck, ConsistencyProof, InclusionCheck, TrustedHead
    from ledger.verify import Problem, TreeHeadRef

__all__ = [
    "audit",
    "prove",
    "replay",
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
@format_option()
def replay(
    plan_id: str,
    as_of: int | None,
    bundle_file: Path | None,
    public_key_file: Path | None,
    fmt: str,
) -> None:
    """Show a plan's state after each of its events.

    Folded from the log alone (or an offline bundle's events): phase, revision,
    attempt, retries left, outcome, token and terminal state after each event.

    \b
    Examples:
      evidence replay P-1
      evidence replay P-1 --as-of 120 --bundle p1.bundle --format csv
    """
    from commands.auditor.audit import replay_plan

    log = (
        open_verified_bundle(bundle_file, public_key_file, fmt in ("json", "jsonl"))
        if bundle_file
        else open_store()
    )
    steps = replay_plan(log, plan_id, as_of)

    def table() -> None:
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

    emit_listing(fmt, {"plan_id": plan_id, "as_of": as_of, "steps": steps}, steps, table)


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
    """Check the invariants; re-derive every verdict from the log.

    Every event a legal transition, the decision, endorsement and token signatures,
    the evidence present, and every gate verdict and outcome re-derived from the
    recorded inputs. Exit 1 on any violation.

    \b
    Examples:
      evidence audit
      evidence audit --plan P-1 --files ./src --json
    """
    from commands.auditor.audit import audit as run_audit
    from commands.auditor.audit import check_files

    if files_dir is not None and plan_id is None:
        fail("--files needs --plan P")
    log = (
        open_verified_bundle(bundle_file, public_key_file, as_json) if bundle_file else open_store()
    )
    with progress_bar("audit") as progress:
        report = run_audit(
            log,
            plan=plan_id,
            plane_public_key=_plane_public_key(log, plane_key_file),
            progress=progress,
        )
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
        if report.unconfined:
            out.print(
                f"note: ran programs UNCONFINED (confinement: none, no kernel sandbox): "
                f"{inert(', '.join(report.unconfined))}",
                markup=False,
            )
        if report.unchecked:
            out.print(
                "note: signatures UNCHECKED (no plane key: give --plane-key FILE, the "
                "plane's public key, to check them; forged tokens, approvers, policy or "
                f"reviews go unfound without it): {', '.join(report.unchecked)}",
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


VERIFIER_KEY_HELP = (
    "The checkpoint's C2SP verifier key NAME+HASH+KEY (or @FILE holding one): only a "
    "signature under that name and key hash counts."
)


def verifier_key_option(fn: Any) -> Any:
    """``--verifier-key NAME+HASH+KEY|@FILE``: the C2SP signed-note verifier key a kept
    checkpoint is checked with (the command receives ``verifier``)."""
    return click.option(
        "--verifier-key", "verifier", metavar="NAME+HASH+KEY|@FILE", help=VERIFIER_KEY_HELP
    )(fn)


@click.command()
@click.argument("position", type=whole(1), required=False)
@click.option(
    "--size",
    type=whole(1),
    default=None,
    metavar="N",
    help="In the tree of the first N events (default: the whole log).",
)
@click.option(
    "--consistency",
    "old_head",
    metavar="OLD_SIZE[:ROOT_HEX]",
    help="Instead of POSITION: the proof that the tree of the first OLD_SIZE events is a "
    "prefix of the larger tree (with --verify, give the ROOT_HEX you kept).",
)
@click.option(
    "--verify",
    "check",
    is_flag=True,
    help="Check the proof in the same step against a tree head you trust; exit 1 if it fails.",
)
@click.option(
    "--against",
    metavar="SIZE:ROOT_HEX",
    help="With --verify: the tree head you trust, as `evidence verify` prints it.",
)
@click.option(
    "--checkpoint",
    "checkpoint_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --verify: a signed checkpoint you kept; its tree head, once its signature "
    "verifies, is the one you trust.",
)
@click.option(
    "--public-key",
    "public_key_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The checkpoint signer's public key (default: the plane key).",
)
@verifier_key_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "tlog-proof"]),
    default="text",
    show_default=True,
    help="tlog-proof: POSITION's offline proof in C2SP tlog-proof form, with the event, "
    "against --checkpoint FILE (a cosigned one) or a checkpoint signed now.",
)
@db_option
@json_option
def prove(
    position: int | None,
    size: int | None,
    old_head: str | None,
    check: bool,
    against: str | None,
    checkpoint_file: Path | None,
    public_key_file: Path | None,
    verifier: str | None,
    fmt: str,
    as_json: bool,
) -> None:
    """Print or check an RFC 9162 inclusion or consistency proof.

    POSITION: the proof that the event is in the tree. --consistency OLD_SIZE: the proof
    that the tree of the first OLD_SIZE events is a prefix of the larger one. Proofs are
    built from the stored leaf hashes. --verify checks one in the same step against a
    tree head you trust: for POSITION, the head --against or --checkpoint gives (the
    event's leaf recomputed from its stored bytes); for --consistency OLD_SIZE:ROOT_HEX,
    from that kept head to the log's current head, or to the head --against or
    --checkpoint gives. Exit 1 when the check fails.

    \b
    Examples:
      evidence prove 42 --verify --checkpoint kept.checkpoint
      evidence prove --consistency "$(cat kept-head.txt)" --verify
    """
    from ledger.checkpoints import CheckpointError
    from ledger.proofs import check_consistency, check_inclusion

    if fmt == "tlog-proof":
        _tlog_proof(position, size, old_head, check, against, as_json, checkpoint_file)
        return
    _check_prove_options(
        position, size, old_head, check, against, checkpoint_file, public_key_file, verifier
    )
    old = _old_head(old_head, check) if old_head is not None else None
    store = open_store()
    if not check:
        _print_proof(store, position, old, size, as_json)
        return
    trusted, problems = _trusted(store, against, checkpoint_file, public_key_file, verifier)
    result: InclusionCheck | ConsistencyCheck | None = None  # None: a checkpoint unread
    try:
        if position is not None and trusted is not None:
            result = check_inclusion(store, position, trusted, problems)
        elif old is not None and (trusted is not None or not problems):
            newer = trusted if trusted is not None else _log_head(store, size)
            if newer.source == "log" and old.size > newer.size:
                problems.append(_log_truncated(old.size, newer.size))
            else:
                result = check_consistency(store, old.size, old.root, newer, problems)
    except CheckpointError as exc:
        fail(str(exc))
    _report_check(result, problems, "inclusion" if position is not None else "consistency", as_json)


def _tlog_proof(
    position: int | None,
    size: int | None,
    old_head: str | None,
    check: bool,
    against: str | None,
    as_json: bool,
    checkpoint_file: Path | None,
) -> None:
    """``prove POSITION --format tlog-proof [--checkpoint FILE]``."""
    from .tlog_proofs import print_tlog_proof

    if position is None or old_head is not None:
        fail("--format tlog-proof proves one event's inclusion: give POSITION")
    if size is not None or check or against is not None or as_json:
        fail("--format tlog-proof takes only POSITION and --checkpoint (its text is the proof)")
    print_tlog_proof(open_store(), position, checkpoint_file)


def _check_prove_options(
    position: int | None,
    size: int | None,
    old_head: str | None,
    check: bool,
    against: str | None,
    checkpoint_file: Path | None,
    public_key_file: Path | None,
    verifier: str | None,
) -> None:
    """Refused (exit 2) unless the options name one proof and, with --verify, one tree
    head to check it against."""
    if (position is None) == (old_head is None):
        fail("give POSITION (an inclusion proof) or --consistency OLD_SIZE, one of them")
    if (against is not None or checkpoint_file is not None) and not check:
        fail("--against and --checkpoint name a tree head to check the proof against: add --verify")
    if against is not None and checkpoint_file is not None:
        fail("give --against or --checkpoint, not both")
    if (public_key_file is not None or verifier is not None) and checkpoint_file is None:
        fail("--public-key and --verifier-key check a --checkpoint: give one")
    given = against is not None or checkpoint_file is not None
    if check and position is not None and not given:
        fail(
            "--verify of an inclusion needs a tree head you trust: --against SIZE:ROOT_HEX "
            "or --checkpoint FILE (the log's own head proves nothing: whoever rewrites the "
            "log rewrites its head too)"
        )
    if given and size is not None:
        fail(
            "--size is the trusted tree head's: with --against or --checkpoint the tree is "
            "the one they name"
        )


def _old_head(text: str, check: bool) -> TreeHeadRef:
    """``--consistency OLD_SIZE[:ROOT_HEX]``: a root only with --verify, and needed then."""
    from ledger.verify import TreeHeadRef, parse_tree_head

    if ":" not in text:
        if check:
            fail("--consistency: give the tree head you kept, OLD_SIZE:ROOT_HEX, to --verify it")
        if not (text.isascii() and text.isdigit()) or not 0 < int(text) <= MAX_SAFE_INTEGER:
            fail(f"--consistency: {text!r} is not a tree size (a whole number from 1)")
        return TreeHeadRef(size=int(text), root="")
    if not check:
        fail("--consistency: a ROOT_HEX is checked with --verify: add it, or give OLD_SIZE alone")
    try:
        head = parse_tree_head(text)
    except ValueError as exc:
        fail(f"--consistency: {exc}")
    if head.size == 0:
        fail("--consistency: the kept tree head's size must be at least 1")
    return head


def _trusted(
    store: ledger.Store,
    against: str | None,
    checkpoint_file: Path | None,
    public_key_file: Path | None,
    verifier: str | None,
) -> tuple[TrustedHead | None, list[Problem]]:
    """The tree head given to check against (with what was wrong with it), or none."""
    from ledger.proofs import TrustedHead, trusted_head
    from ledger.verify import parse_tree_head

    if against is not None:
        try:
            head = parse_tree_head(against)
        except ValueError as exc:
            fail(f"--against: {exc}")
        return TrustedHead(source="against", size=head.size, root=head.root), []
    if checkpoint_file is None:
        return None, []
    text = read_text(checkpoint_file, "checkpoint", f"--checkpoint {checkpoint_file}")
    return trusted_head(text, checkpoint_verifier(store, public_key_file, verifier))


def checkpoint_verifier(
    store: ledger.Store, public_key_file: Path | None, verifier: str | None
) -> Verifier:
    """What a kept checkpoint is checked with: the verifier key given (``--verifier-key``,
    or a ``--public-key`` file holding one), else the public key given or the plane key's,
    standing for the verifier key named after the checkpoint's origin."""
    from commands.rules.signing import plane_key_path
    from ledger.keys import load_private_key

    given = given_verifier(public_key_file, verifier)
    if given is not None:
        return given
    plane = plane_key_path(store.url)
    if not os.path.lexists(plane):
        fail(
            "--checkpoint needs --verifier-key NAME+HASH+KEY or --public-key FILE (no plane "
            "key here to check it with)"
        )
    return load_private_key(plane).public_key()


def given_verifier(public_key_file: Path | None, verifier: str | None) -> Verifier | None:
    """The key ``--verifier-key`` (text or @FILE) or ``--public-key`` gives (None: none)."""
    from ledger.checkpoints import CheckpointError, parse_verifier_key

    if verifier is not None and public_key_file is not None:
        fail("give --verifier-key or --public-key, not both")
    if verifier is not None:
        text = (
            read_text(Path(verifier[1:]), "document", f"--verifier-key {verifier}")
            if verifier.startswith("@")
            else verifier
        )
        try:
            return parse_verifier_key(text)
        except CheckpointError as exc:
            fail(f"--verifier-key: {exc}")
    if public_key_file is not None:
        return load_verifier(public_key_file)
    return None


def load_verifier(path: Path) -> Verifier:
    """A ``--public-key`` file: a PEM or base64 public key, or a C2SP verifier key."""
    from ledger.checkpoints import CheckpointError, parse_verifier_key
    from ledger.keys import SigningError, load_public_key

    try:
        return load_public_key(path)
    except SigningError as exc:
        try:
            text = read_text(path, "document", f"--public-key {path}")
        except ledger.LedgerError:
            raise exc from None
        if text.count("+") < 2:
            raise
        try:
            return parse_verifier_key(text)
        except CheckpointError as vkey_error:
            raise SigningError(f"{path}: {vkey_error}") from None


def _log_head(store: ledger.Store, size: int | None) -> TrustedHead:
    """The log's own tree head (of its first ``size`` events): the newer end of a
    consistency check when no trusted one is given."""
    from ledger.checkpoints import stored_leaves
    from ledger.merkle import root_of
    from ledger.proofs import TrustedHead

    head = store.head()
    if size is None:
        return TrustedHead(source="log", size=head.size, root=head.root.hex())
    if not 0 < size <= head.size:
        fail(f"--size {size} is not within 1..{head.size}")
    return TrustedHead(source="log", size=size, root=root_of(stored_leaves(store, size)).hex())


def _log_truncated(kept: int, held: int) -> Problem:
    from ledger.verify import Problem

    return Problem(
        None,
        "log_truncated",
        f"the kept tree head covers {kept} events but the log holds {held}: the log was truncated",
    )


def _print_proof(
    store: ledger.Store,
    position: int | None,
    old: TreeHeadRef | None,
    size: int | None,
    as_json: bool,
) -> None:
    from ledger.checkpoints import CheckpointError, InclusionProof, prove_inclusion
    from ledger.proofs import prove_consistency

    try:
        proof: InclusionProof | ConsistencyProof = (
            prove_inclusion(store, position, size)
            if position is not None
            else prove_consistency(store, old.size if old is not None else 0, size)
        )
    except CheckpointError as exc:
        fail(str(exc))
    if as_json:
        emit_json(proof)
        return
    if isinstance(proof, InclusionProof):
        click.echo(f"leaf_index {proof.leaf_index}")
        click.echo(f"tree_size {proof.tree_size}")
        click.echo(f"leaf_hash {proof.leaf_hash}")
        click.echo(f"root {proof.root}")
    else:
        click.echo(f"old_size {proof.old_size}")
        click.echo(f"old_root {proof.old_root}")
        click.echo(f"tree_size {proof.tree_size}")
        click.echo(f"root {proof.root}")
    for node in proof.proof:
        click.echo(node)


def _report_check(
    result: InclusionCheck | ConsistencyCheck | None,
    problems: list[Problem],
    kind: str,
    as_json: bool,
) -> None:
    """Print a proof check (or, with no check made, the problems that prevented it);
    exit 1 unless it holds."""
    from ledger.proofs import InclusionCheck

    ok = result.ok if result is not None else False
    if as_json:
        emit_json(
            result if result is not None else {"ok": False, "kind": kind, "problems": problems}
        )
    elif ok and result is not None:
        head = result.trusted
        source = {
            "against": "the tree head given (--against)",
            "checkpoint": f"signed checkpoint {inert(head.origin)}, signature ok",
            "log": "the log's current head",
        }[head.source]
        if isinstance(result, InclusionCheck):
            click.echo(
                f"ok: event {result.position} is in the tree of {result.tree_size} events "
                f"with root {result.root} ({len(result.proof)}-hash proof)"
            )
            click.echo(f"leaf {result.leaf_hash}, recomputed from the event's stored bytes")
        else:
            click.echo(
                f"ok: the tree of {result.tree_size} events with root {result.root} extends "
                f"the kept tree head {result.old_size}:{result.old_root} "
                f"({len(result.proof)}-hash proof)"
            )
        click.echo(f"checked against {source}")
    else:
        found = result.problems if result is not None else problems
        click.echo(f"FAILED: {len(found)} problem(s)")
        for p in found:
            at = f"position {p.position}" if p.position is not None else "head"
            click.echo(inert(f"  {at}: {p.kind}: {p.detail}"))
    if not ok:
        click.get_current_context().exit(EXIT_VERDICT)


def _plane_public_key(log: Any, plane_key_file: Path | None) -> Ed25519PublicKey | None:
    """The key tokens are checked against: the one given, else the plane key of the
    database when it is on this machine. A bundle names no plane key of its own (its
    checkpoint may be signed by any key): None, and token signatures go unchecked."""
    from commands.rules.signing import plane_key_path
    from ledger.bundle import Bundle
    from ledger.keys import load_private_key, load_public_key

    if plane_key_file is not None:
        return load_public_key(plane_key_file)
    if isinstance(log, Bundle):
        return None
    path = plane_key_path(log.url)
    return load_private_key(path).public_key() if os.path.lexists(path) else None


# ------------------------------------------------------- verify --checkpoint FILE (helper)


def verify_checkpoint_command(
    checkpoint_file: Path,
    public_key_file: Path | None,
    as_json: bool,
    verifier: str | None = None,
    policy_file: Path | None = None,
) -> CheckpointReport:
    """The body of ``evidence verify --checkpoint FILE [--verifier-key VKEY | --public-key
    FILE | --policy POLICY]``: check the note's signature (under the verifier key given,
    else the public key given or the plane key's, named after the origin; with a policy,
    one of its logs' keys and its witnesses' quorum) and that the log extends its tree
    head; print the report; exit 1 if anything failed."""
    from ledger.checkpoints import verify_against_checkpoint

    text = read_text(checkpoint_file, "checkpoint", f"--checkpoint {checkpoint_file}")
    store = open_store()
    witnessed: dict[str, Any] | None = None
    if policy_file is not None:
        if verifier is not None or public_key_file is not None:
            fail("--policy names the log's keys: give it without --verifier-key or --public-key")
        key, witnessed = _held_to_policy(text, policy_file, as_json)
    else:
        key = checkpoint_verifier(store, public_key_file, verifier)
    report = verify_against_checkpoint(store, text, key)
    if as_json:
        emit_json(
            report if witnessed is None else {**msgspec_builtins(report), "policy": witnessed}
        )
    else:
        print_checkpoint_report(report)
        if witnessed is not None:
            click.echo(f"cosigned by {', '.join(witnessed['cosigned'])}: the policy's quorum holds")
    if not report.ok:
        click.get_current_context().exit(EXIT_VERDICT)
    return report


def msgspec_builtins(value: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(value)


def _held_to_policy(text: str, policy_file: Path, as_json: bool) -> tuple[Any, dict[str, Any]]:
    """The log key of the policy that signed the checkpoint, and what the policy found;
    a checkpoint no policy log signed, or whose witnesses' quorum does not hold, is a
    verdict (exit 1), said here."""
    from ledger.checkpoints import CheckpointError

    policy, _ = read_policy(policy_file, "--policy")
    try:
        check = policy.check(text)
    except CheckpointError as exc:
        fail(f"--checkpoint: {exc}")
    cosigned = sorted(check.cosigned)
    found = check.to_json()
    if not check.ok:
        why = "signed by none of the policy's logs" if check.log is None else "no quorum"
        if as_json:
            emit_json({"ok": False, "policy": found})
        else:
            click.echo(f"FAILED: the checkpoint does not satisfy the policy: {why}")
            click.echo(inert(f"cosigned by: {', '.join(cosigned) or 'nobody'}"))
        click.get_current_context().exit(EXIT_VERDICT)
    key = next(k for k, _url in policy.logs if k.name == check.log)
    return key, found


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
