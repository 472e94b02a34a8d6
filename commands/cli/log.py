"""The log itself: ``init``, ``events`` and ``verify``."""

from __future__ import annotations

from pathlib import Path

import click
import msgspec

from commands.plane.signing import load_or_create_plane_key, plane_key_path
from ledger.verify import available_cores, parse_tree_head, verify_store

from .audit import verify_checkpoint_command
from .bundle import bundle_option, verify_bundle_command
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
from .progress import progress_bar
from .terminal import inert


@click.command()
@db_option
@json_option
def init(as_json: bool) -> None:
    """Create the ledger (tables, append-only triggers, head) if it does not exist."""
    store = open_store(create=True)
    head = store.head()
    meta = store.meta()
    load_or_create_plane_key(store.url)  # mints tokens; kept outside the events table
    if as_json:
        emit_json(
            {
                "db": store.url,
                "ledger_id": meta["ledger_id"],
                "schema_version": int(meta["schema_version"]),
                "created_at": meta["created_at"],
                "size": head.size,
                "plane_key": str(plane_key_path(store.url)),
            }
        )
        return
    click.echo(f"ledger {meta['ledger_id']} at {inert(store.url)}")
    click.echo(f"schema version {meta['schema_version']}, {head.size} events")
    click.echo(
        f"plane key {inert(plane_key_path(store.url))} (mints apply tokens; keep it private)"
    )


def payload_summary(payload: msgspec.Struct) -> str:
    """A short one-line view of a payload for the table."""
    fields = msgspec.structs.asdict(payload)
    parts = []
    for key, value in fields.items():
        if value is msgspec.UNSET or value in (None, "", [], {}):  # UNSET: an absent field
            continue
        text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
        parts.append(f"{key}={text}")
    line = " ".join(parts)
    return line if len(line) <= 100 else line[:99] + "…"


@click.command()
@click.option("--stream", help="Only this stream.")
@click.option("--type", "types", multiple=True, help="Only this event type (repeatable).")
@click.option(
    "--from", "from_position", type=whole(1), default=1, show_default=True, help="First position."
)
@click.option("--limit", type=whole(1), default=None, help="At most N events.")
@db_option
@json_option
def events(
    stream: str | None,
    types: tuple[str, ...],
    from_position: int,
    limit: int | None,
    as_json: bool,
) -> None:
    """List events in position order."""
    store = open_store()
    unknown = [t for t in types if t not in store.catalog]
    if unknown:
        fail(f"unknown event type {unknown[0]!r} (see docs/events.md)")
    rows = []
    for event in store.read_all(from_position, types=types or None, stream=stream):
        rows.append(event)
        if limit is not None and len(rows) >= limit:
            break
    if as_json:
        emit_json({"events": [e.to_json() for e in rows]})
        return
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
@click.option(
    "--jobs",
    type=click.IntRange(min=1, max=64),
    default=None,
    help="Processes checking parts of the log at once (default: the cores available).",
)
@bundle_option
@db_option
@json_option
def verify(
    against: str | None,
    checkpoint_file: Path | None,
    public_key_file: Path | None,
    jobs: int | None,
    bundle_file: Path | None,
    as_json: bool,
) -> None:
    """Recompute every leaf, the hash chain and the Merkle root from the stored bytes
    (with --bundle: check an offline bundle, with no database)."""
    if bundle_file is not None:
        if against:
            fail("--against does not apply to --bundle: give a kept --checkpoint FILE")
        verify_bundle_command(bundle_file, checkpoint_file, public_key_file, as_json)
        return
    if checkpoint_file is not None:
        if against:
            fail("give --against or --checkpoint, not both")
        verify_checkpoint_command(checkpoint_file, public_key_file, as_json)
        return
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
