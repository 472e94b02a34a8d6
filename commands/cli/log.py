"""The log itself: ``init``, ``events``, ``event`` and ``verify``."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ledger.canonical import MAX_SAFE_INTEGER

from .audit import verifier_key_option, verify_checkpoint_command
from .bundle import bundle_option, verify_bundle_command
from .common import (
    EXIT_VERDICT,
    console,
    db_option,
    emit_json,
    emit_listing,
    fail,
    format_option,
    json_option,
    note_single_user_layout,
    open_plane,
    open_store,
    print_table,
)
from .inputs import whole
from .progress import progress_bar
from .terminal import inert

if TYPE_CHECKING:
    import msgspec

    from ledger.checkpoints import InclusionProof
    from ledger.proofs import StoredEvent


@click.command()
@click.option(
    "--operator",
    "operator",
    default=None,
    help="The first operator's name (default $EVIDENCE_OPERATOR, else `operator`).",
)
@db_option
@json_option
def init(operator: str | None, as_json: bool) -> None:
    """Create the ledger (if missing) and its first operator.

    Makes the tables, the append-only triggers, the one-row head and the plane key;
    makes (or loads) this process's operator key ($EVIDENCE_OPERATOR_KEY, else beside
    the plane key). Policy — registrations, attachments, skills, keys, settings that
    weaken a gate — is signed with it. On a ledger with no operator yet, --operator NAME
    registers it as the first operator (endorsed by the plane key); without it, the
    first policy command does. On an existing ledger it changes nothing (another
    operator's key is refused: an operator adds yours with `keys add NAME PUB --role
    operator`), except that a ledger an earlier release wrote is identified once
    (`ledger.identified`: its old signatures count where they stand, no copy does).

    \b
    Examples:
      evidence init --operator ops-alice
      evidence init --db postgresql+psycopg://postgres@127.0.0.1/evidence
    """
    from commands.plane.lifecycle import init_operator
    from commands.rules.signing import load_or_create_plane_key, plane_key_path

    plane = open_plane(create=True)
    store = plane.store
    head = store.head()
    meta = store.meta()
    load_or_create_plane_key(store.url)  # mints tokens; kept outside the events table
    # The operator key is made now; it is registered now with --operator, else by the
    # first policy command (the single-user bootstrap), so a fresh ledger stays empty.
    first = init_operator(plane, operator, register=operator is not None)
    plane.identify()  # a ledger the first release wrote: its old signatures stay put
    note_single_user_layout()  # the keys exist now: say what their place does not protect
    if as_json:
        emit_json(
            {
                "db": store.url,
                "ledger_id": meta["ledger_id"],
                "schema_version": int(meta["schema_version"]),
                "created_at": meta["created_at"],
                "size": store.head().size,
                "plane_key": str(plane_key_path(store.url)),
                "operator": {
                    "name": first.name,
                    "fingerprint": first.fingerprint,
                    "key_file": str(first.key_file),
                    "added": first.added,
                    "registered": first.registered,
                },
            }
        )
        return
    click.echo(f"ledger {meta['ledger_id']} at {inert(store.url)}")
    click.echo(f"schema version {meta['schema_version']}, {head.size} events")
    click.echo(
        f"plane key {inert(plane_key_path(store.url))} (mints apply tokens; keep it private)"
    )
    click.echo(
        f"operator {inert(first.name)}: key {inert(first.key_file)} "
        f"({first.fingerprint[:16]}…; signs policy; keep it from the agent)"
        + (
            " — registered as the first operator"
            if first.added
            else ""
            if first.registered
            else " — registered by the first policy command"
        )
    )


def payload_summary(payload: msgspec.Struct) -> str:
    """A one-line view of a payload for a table: ``key=value`` for each field that is set.
    Never cut here: a table cuts its lines to a terminal's width, piped output is whole."""
    import msgspec

    fields = msgspec.structs.asdict(payload)
    parts = []
    for key, value in fields.items():
        if value is msgspec.UNSET or value in (None, "", [], {}):  # UNSET: an absent field
            continue
        text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
        parts.append(f"{key}={text}")
    return " ".join(parts)


@click.command()
@click.option("--stream", help="Only this stream.")
@click.option("--type", "types", multiple=True, help="Only this event type (repeatable).")
@click.option(
    "--from", "from_position", type=whole(1), default=1, show_default=True, help="First position."
)
@click.option(
    "--limit",
    type=whole(1),
    default=None,
    help="At most N events (the first N; newest N with --reverse).",
)
@click.option(
    "--last",
    type=whole(1),
    default=None,
    metavar="N",
    help="The newest N of the events selected, in position order.",
)
@click.option("--reverse", is_flag=True, help="Newest first.")
@db_option
@format_option()
def events(
    stream: str | None,
    types: tuple[str, ...],
    from_position: int,
    limit: int | None,
    last: int | None,
    reverse: bool,
    fmt: str,
) -> None:
    """List events in position order, or newest first.

    --stream, --type and --from select events; --limit keeps the first N of them,
    --last N the newest N; --reverse prints newest first.

    \b
    Examples:
      evidence events --last 20
      evidence events --stream plan:P-1 --reverse --format csv
    """
    if limit is not None and last is not None:
        fail("give --limit or --last, not both")
    store = open_store()
    unknown = [t for t in types if t not in store.catalog]
    if unknown:
        fail(f"unknown event type {unknown[0]!r} (see docs/events.md)")
    count = limit if limit is not None else last
    if reverse or last is not None:
        found = store.read_backwards(
            from_position=from_position, types=types or None, stream=stream
        )
    else:
        found = store.read_all(from_position, types=types or None, stream=stream)
    rows = list(itertools.islice(found, count))
    if last is not None and not reverse:
        rows.reverse()  # the newest N, in position order
    documents = [e.to_json() for e in rows]

    def table() -> None:
        print_table(
            ["pos", "recorded_at", "stream", "ver", "type", "actor", "payload"],
            [
                [
                    str(e.position),
                    e.recorded_at,
                    e.stream,
                    str(e.stream_version),
                    e.type,
                    e.actor,
                    payload_summary(e.payload),
                ]
                for e in rows
            ],
        )
        click.echo(f"{len(rows)} event(s)")

    emit_listing(fmt, {"events": documents}, documents, table)


def _event_key(text: str) -> int | str:
    """A position (a whole number from 1) or an event id (a ULID)."""
    if text.isascii() and text.isdigit():
        position = int(text)
        if not 0 < position <= MAX_SAFE_INTEGER:
            fail(f"POSITION_OR_ID: position {text} is not within 1..2^53 - 1")
        return position
    if len(text) == 26 and set(text.upper()) <= _ULID_CHARS:
        return text.upper()
    fail(
        f"POSITION_OR_ID: {text!r} is neither a position (a whole number from 1) nor an "
        "event id (a ULID, 26 characters)"
    )


_ULID_CHARS = frozenset("0123456789ABCDEFGHJKMNPQRSTVWXYZ")


@click.command()
@click.argument("key", metavar="POSITION_OR_ID")
@db_option
@json_option
def event(key: str, as_json: bool) -> None:
    """Show one event with its hashes and its inclusion proof.

    POSITION_OR_ID is a log position or an event id. The leaf hash is recomputed from
    the event's stored bytes and compared with the stored one (exit 1 if they differ);
    the inclusion proof is in the tree of the whole log (check it against a root you
    trust with `evidence prove POSITION --verify`).

    \b
    Examples:
      evidence event 42
      evidence event 01M8MF3X4R6C1S268ZFR55Z0KN --json
    """
    from ledger.checkpoints import CheckpointError, prove_inclusion
    from ledger.proofs import read_stored_event

    wanted = _event_key(key)
    store = open_store()
    stored = read_stored_event(store, wanted)
    if stored is None:
        where = f"at position {wanted}" if isinstance(wanted, int) else f"with id {wanted}"
        fail(f"no event {where} (the log holds {store.head().size})")
    position = stored.event["position"]
    try:
        proof = prove_inclusion(store, position)
    except CheckpointError as exc:  # a log whose head and rows disagree (verify says why)
        fail(f"no inclusion proof for position {position}: {exc}")
    if as_json:
        emit_json(
            {
                "event": stored.event,
                "payload_error": stored.payload_error,
                "recomputed_leaf_hash": stored.recomputed_leaf_hash,
                "leaf_ok": stored.leaf_ok,
                "proof": proof,
            }
        )
    else:
        _print_event(stored, proof)
    if not stored.leaf_ok:
        click.get_current_context().exit(EXIT_VERDICT)


# The stored columns ``evidence event`` shows after the others, each its own way.
_SHOWN_APART = ("payload", "delta", "leaf_hash", "chain_hash")


def _print_event(stored: StoredEvent, proof: InclusionProof) -> None:
    from ledger.rows import COLUMNS

    e = stored.event
    leaf = (
        "matches the stored bytes"
        if stored.leaf_ok
        else f"MISMATCH: the stored bytes hash to {stored.recomputed_leaf_hash}"
    )
    fields = [
        *(
            (name, "-" if e[name] is None else str(e[name]))
            for name in COLUMNS
            if name not in _SHOWN_APART
        ),
        ("leaf_hash", f"{e['leaf_hash']} ({leaf})"),
        ("chain_hash", e["chain_hash"]),
    ]
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        click.echo(f"{name.ljust(width)}  {inert(value)}")
    if stored.payload_error is not None:
        click.echo(inert(f"payload (does not decode as {e['type']}: {stored.payload_error}):"))
    else:
        click.echo("payload:")
    click.echo(_indented_json(e["payload"]))
    click.echo("delta:")
    click.echo(_indented_json(e["delta"]))
    click.echo(
        f"inclusion proof in the tree of {proof.tree_size} events (root {proof.root}), "
        f"leaf index {proof.leaf_index}:"
    )
    for node in proof.proof:
        click.echo(f"  {node}")
    if not proof.proof:
        click.echo("  (none: the event is the tree's only leaf)")


def _indented_json(value: object) -> str:
    import msgspec

    text = msgspec.json.format(msgspec.json.encode(value), indent=2).decode()
    return inert("\n".join(f"  {line}" for line in text.splitlines()), multiline=True)


@click.command()
@click.option(
    "--against",
    metavar="SIZE:ROOT_HEX",
    help="An earlier tree head you kept: prove the log still extends it.",
)
@click.option(
    "--checkpoint",
    "checkpoint_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A signed checkpoint you kept: check its signature and that the log extends it.",
)
@click.option(
    "--public-key",
    "public_key_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The checkpoint signer's public key (default: the plane key; with "
    "--bundle, the key the bundle carries).",
)
@verifier_key_option
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --checkpoint: a witness policy (C2SP tlog-policy) it must satisfy: signed "
    "by one of its logs, cosigned by its witnesses' quorum.",
)
@click.option(
    "--tlog-proof",
    "tlog_proof_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Check a C2SP tlog-proof offline (no database): with --policy, --verifier-key "
    "or --public-key.",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1, max=64),
    default=None,
    help="Processes checking parts of the log at once (default: the cores available).",
)
@click.option(
    "--trace",
    "trace_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="An OTLP JSON trace of the plane: check each span's receipt against the log.",
)
@bundle_option
@db_option
@json_option
def verify(
    against: str | None,
    checkpoint_file: Path | None,
    public_key_file: Path | None,
    verifier: str | None,
    policy_file: Path | None,
    tlog_proof_file: Path | None,
    jobs: int | None,
    trace_file: Path | None,
    bundle_file: Path | None,
    as_json: bool,
) -> None:
    """Recompute every leaf, the hash chain and the Merkle root.

    From the stored bytes alone; with --against or --checkpoint also that the log
    extends a tree head you kept; with --bundle an offline bundle, with no database.

    \b
    Examples:
      evidence verify
      evidence verify --checkpoint kept.checkpoint --verifier-key @kept.vkey
    """
    from ledger.verify import available_cores, parse_tree_head, verify_store

    if trace_file is not None:
        _verify_trace(trace_file, as_json)
        return
    if tlog_proof_file is not None:
        _verify_tlog_proof(tlog_proof_file, policy_file, verifier, public_key_file, as_json)
        return
    _refuse_mixed(against, checkpoint_file, verifier, bundle_file)
    if bundle_file is not None:
        verify_bundle_command(
            bundle_file, checkpoint_file, public_key_file, as_json, jobs or available_cores(),
            policy_file,
        )  # fmt: skip
        return
    if checkpoint_file is not None:
        if against:
            fail("give --against or --checkpoint, not both")
        verify_checkpoint_command(
            checkpoint_file, public_key_file, as_json, verifier, policy_file=policy_file
        )
        return
    if policy_file is not None:
        fail("--policy checks a --checkpoint: give one")
    if public_key_file is not None:
        fail("--public-key checks a --checkpoint or a --bundle: give one")
    try:
        kept = parse_tree_head(against) if against else None
    except ValueError as exc:
        fail(f"--against: {exc}")
    store = open_store()
    with progress_bar("verify") as progress:
        report = verify_store(
            store, against=kept, jobs=jobs or available_cores(), progress=progress
        )
    if as_json:
        emit_json(report)
    else:
        out = console()
        if report.ok:
            out.print(f"ok: {report.size} events and {report.checked_blobs} blobs verified")
            if report.against is not None:
                out.print(f"extends the kept tree head {report.against.size}:{report.against.root}")
        else:
            where = report.first_bad_position
            out.print(
                f"FAILED: {len(report.problems)} problem(s)"
                + (f", first bad position {where}" if where is not None else "")
            )
            for p in report.problems:
                at = f"position {p.position}" if p.position is not None else "head"
                out.print(f"  {at}: {p.kind}: {inert(p.detail)}", markup=False)
        out.print(f"tree head {report.size}:{report.root}")
    if not report.ok:
        click.get_current_context().exit(EXIT_VERDICT)


def _refuse_mixed(
    against: str | None, checkpoint: Path | None, verifier: str | None, bundle: Path | None
) -> None:
    """The options of ``verify`` that do not go together, refused in one line."""
    if verifier is not None and checkpoint is None:
        fail("--verifier-key checks a --checkpoint: give one")
    if bundle is not None and verifier is not None:
        fail("--verifier-key checks a kept --checkpoint of a database; a bundle takes --public-key")
    if bundle is not None and against:
        fail("--against does not apply to --bundle: give a kept --checkpoint FILE")


def _verify_trace(trace_file: Path, as_json: bool) -> None:
    """``verify --trace``: every span's receipt in the log as named (exit 1 otherwise)."""
    from commands.auditor.traces import check_trace

    try:
        text = trace_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"--trace {inert(str(trace_file))}: {exc}")
    report = check_trace(open_store(), text)
    if as_json:
        emit_json(report.to_json())
    elif report.ok:
        click.echo(
            f"ok: {report.receipted} of {report.spans} spans carry receipts; "
            f"{report.checked} events in the log as named"
        )
    else:
        click.echo(f"FAILED: {len(report.problems)} receipt(s) not in the log as named")
        for problem in report.problems:
            click.echo(f"  {inert(problem)}")
    if not report.ok:
        click.get_current_context().exit(EXIT_VERDICT)


def _verify_tlog_proof(
    path: Path,
    policy_file: Path | None,
    verifier: str | None,
    public_key_file: Path | None,
    as_json: bool,
) -> None:
    """``verify --tlog-proof FILE``: offline, with the keys given (never the database's)."""
    from .audit import given_verifier
    from .tlog_proofs import verify_tlog_proof

    given = [policy_file, verifier, public_key_file]
    if sum(v is not None for v in given) != 1:
        fail("--tlog-proof is checked with one of --policy, --verifier-key or --public-key")
    verify_tlog_proof(path, policy_file, given_verifier(public_key_file, verifier), as_json)
