"""``evidence projections status|rebuild``."""

from __future__ import annotations

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
)
from .progress import progress_bar


@click.group()
def projections() -> None:
    """Read models folded from the log."""


@projections.command("status")
@db_option
@format_option()
def status(fmt: str) -> None:
    """Each projection's version, position, the head and the lag.

    The position is the last event the read model has applied.

    \b
    Examples:
      evidence projections status
      evidence projections status --format json
    """
    rows = open_plane().projections.status()
    documents = [
        {"name": r.name, "version": r.version, "position": r.position, "head": r.head, "lag": r.lag}
        for r in rows
    ]
    emit_listing(
        fmt,
        {"projections": documents},
        documents,
        lambda: print_table(
            ["name", "version", "position", "head", "lag"],
            [[r.name, str(r.version), str(r.position), str(r.head), str(r.lag)] for r in rows],
        ),
    )


@projections.command("rebuild")
@click.argument("name", required=False)
@db_option
@json_option
def rebuild(name: str | None, as_json: bool) -> None:
    """Rebuild NAME (or every projection) and swap it in.

    The whole log is folded into fresh tables, then swapped in atomically.

    \b
    Examples:
      evidence projections rebuild
      evidence projections rebuild plans --json
    """
    plane = open_plane()
    engine = plane.projections
    if name is not None and name not in engine.projections:
        fail(f"unknown projection {name!r} (known: {', '.join(engine.projections)})")
    names = [name] if name else list(engine.projections)
    # One pass over the log for all of them (as the engine rebuilds), with the bar of
    # every long command (done / total, events/s, ETA) on a terminal.
    with progress_bar(f"rebuilding {name or 'every read model'}") as progress:
        engine.rebuild(names, None if as_json else progress)
    rows = [r for r in engine.status() if r.name in names]
    if as_json:
        emit_json(
            {
                "rebuilt": [
                    {"name": r.name, "version": r.version, "position": r.position} for r in rows
                ]
            }
        )
        return
    for r in rows:
        click.echo(f"rebuilt {r.name} (version {r.version}) to position {r.position}")
