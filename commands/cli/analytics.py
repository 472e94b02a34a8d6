"""Analytics consumers: ``tail`` (a subscription; a named consumer resumes where it
stopped), ``export`` and ``stats``."""

from __future__ import annotations

import csv
import functools
import io
import os
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ledger.rows import COLUMNS

from .bundle import export_bundle_command
from .common import (
    EXIT_VERDICT,
    STDOUT,
    console,
    csv_cell,
    data_to_stdout,
    db_option,
    emit_json,
    emit_listing,
    fail,
    format_option,
    json_option,
    open_store,
    print_table,
    refuse_stdout,
    terminal_safe_json,
)
from .inputs import Seconds, whole
from .log import payload_summary
from .progress import progress_bar
from .terminal import inert

# `export`'s formats, as commands.auditor.analytics.FORMATS
# (tests/commands/cli/test_startup.py checks they agree): the auditor's module, with the
# store and SQLAlchemy, loads only when a command runs, so completing `evidence export
# <TAB>` imports neither.
EXPORT_FORMATS = ("jsonl", "csv", "parquet")

if TYPE_CHECKING:
    from ledger import RecordedEvent


class _AlignedLines:
    """``tail``'s table: the columns of ``evidence events`` without a header (every line
    is an event), aligned. A stream's widths cannot be known before its end: each column
    is as wide as the widest value printed so far (the type column starts as wide as the
    longest event type), so a longer value widens its column from its batch on. On a
    terminal a line is cut to the screen with an ellipsis; piped output is whole."""

    def __init__(self, type_width: int) -> None:
        self.widths = [0, 0, 0, 0, type_width, 0]  # pos recorded_at stream ver type actor
        self.limit = shutil.get_terminal_size().columns if sys.stdout.isatty() else None

    def render(self, batch: list[RecordedEvent]) -> list[bytes]:
        rows = [
            [
                str(e.position),
                e.recorded_at,
                inert(e.stream),
                str(e.stream_version),
                inert(e.type),
                inert(e.actor),
                inert(payload_summary(e.payload)),
            ]
            for e in batch
        ]
        self.widths = [
            max(width, *(len(row[i]) for row in rows)) for i, width in enumerate(self.widths)
        ]
        lines = []
        for row in rows:
            text = "  ".join(
                [*(cell.ljust(w) for cell, w in zip(row, self.widths, strict=False)), row[-1]]
            ).rstrip()
            if self.limit is not None and len(text) > self.limit:
                text = text[: self.limit - 1] + "…"
            lines.append((text + "\n").encode("utf-8", "surrogateescape"))
        return lines


# The fields of ``events --format csv``: the stored row's columns, in their order.
EVENT_FIELDS = COLUMNS


def _csv_line(cells: Sequence[str]) -> bytes:
    """One CSV record (RFC 4180: quoted where needed, CRLF); on a terminal its cells
    inert, as ``emit_csv`` shows them."""
    tty = sys.stdout.isatty()
    if tty:
        cells = [inert(c) for c in cells]
    text = io.StringIO()
    csv.writer(text, lineterminator="\n" if tty else "\r\n").writerow(cells)
    return text.getvalue().encode("utf-8", "surrogateescape")


def _csv_lines(batch: list[RecordedEvent]) -> list[bytes]:
    """Events as CSV records: the fields of ``events --format csv``."""
    return [
        _csv_line([csv_cell(document[f]) for f in EVENT_FIELDS])
        for document in (e.to_json() for e in batch)
    ]


@click.command()
@click.option(
    "--from", "from_position", type=whole(1), default=None, help="First position (default 1)."
)
@click.option(
    "--consumer",
    metavar="NAME",
    help="Resume after NAME's stored position and advance it as events are printed.",
)
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new events (Ctrl-C ends).")
@click.option("--type", "types", multiple=True, help="Only this event type (repeatable).")
@click.option(
    "--interval",
    type=Seconds(0.01, 3600),
    default=0.2,
    show_default=True,
    help="Seconds between polls of the head while following.",
)
@format_option(("table", "jsonl", "csv"), json_means="jsonl")
@db_option
def tail(
    from_position: int | None,
    consumer: str | None,
    follow: bool,
    types: tuple[str, ...],
    interval: float,
    fmt: str,
) -> None:
    """Print events in position order as they arrive.

    One line an event, in aligned columns (or JSON Lines, or CSV). With --consumer the
    position stored for NAME moves to the last event printed, also when Ctrl-C ends the
    command; the next `tail --consumer NAME` starts after it.

    \b
    Examples:
      evidence tail --follow --type plan.halted
      evidence tail --consumer warehouse --format jsonl
    """
    import msgspec

    from ledger.subscriptions import subscribe

    if from_position is not None and consumer is not None:
        fail("give --from or --consumer, not both")
    store = open_store()
    sub = subscribe(
        store,
        from_position=from_position,
        consumer=consumer,
        types=list(types) or None,
        poll_interval=interval,
    )
    out = sys.stdout.buffer
    encode = msgspec.json.encode
    aligned = _AlignedLines(max(len(t.type_name()) for t in store.catalog))
    printed = sub.acked
    try:
        if fmt == "csv":
            out.write(_csv_line(EVENT_FIELDS))
        for batch in sub.batches(follow=follow):
            if fmt == "jsonl":
                lines = [terminal_safe_json(encode(e.to_json()) + b"\n") for e in batch]
            elif fmt == "csv":
                lines = _csv_lines(batch)
            else:
                lines = aligned.render(batch)
            for event, line in zip(batch, lines, strict=True):
                out.write(line)
                out.flush()  # one line delivered: what a consumer's position may cover
                printed = event.position
            sub.ack(printed)
        sub.ack()  # a filtered read acknowledges the positions it skipped, too
        printed = sub.acked
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a follow ends: acknowledge what was printed, exit 0
    except BrokenPipeError:
        # The reader went away: what it did not take must be delivered again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    finally:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C waits
        try:
            if printed > sub.acked:
                sub.ack(printed)
        finally:
            signal.signal(signal.SIGINT, previous)


@click.command()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(EXPORT_FORMATS),
    default=None,
    help="jsonl, csv, or parquet (needs the analytics extra).",
)
@click.option(
    "--since", type=whole(1), default=1, show_default=True, help="First position exported."
)
@click.option(
    "--until",
    type=whole(0),
    default=None,
    help="Last position exported (default: the head when the export starts).",
)
@click.option("--type", "types", multiple=True, help="Only this event type (repeatable).")
@click.option("--plan", help="Only the events of this plan.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, writable=True),
    help="The file to write (replaced atomically); - for standard output.",
)
@click.option(
    "--bundle",
    "bundle_out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Instead: write an offline bundle for auditors (docs/auditing.md); - for standard output.",
)
@click.option(
    "--tiles",
    "tiles_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Instead: write the log as C2SP tlog-tiles into DIR, adding what is new.",
)
@click.option(
    "--key",
    "key_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --bundle or --tiles: sign the checkpoint with this key (default: the plane key).",
)
@click.option(
    "--witness",
    "policy_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --bundle or --tiles: a witness policy; the checkpoint is cosigned by its "
    "quorum, or not written (exit 1).",
)
@click.option(
    "--origin",
    default=None,
    metavar="NAME",
    help="With --bundle or --tiles: the checkpoint's origin (default: evidence-ledger/<id>).",
)
@click.option("--batch-size", type=whole(1), default=2_000, show_default=True, hidden=True)
@db_option
@json_option
def export(
    fmt: str | None,
    since: int,
    until: int | None,
    types: tuple[str, ...],
    plan: str | None,
    out: str | None,
    bundle_out: Path | None,
    tiles_dir: Path | None,
    key_file: Path | None,
    policy_file: Path | None,
    origin: str | None,
    batch_size: int,
    as_json: bool,
) -> None:
    """Export events (JSONL, CSV, Parquet) or an offline bundle.

    With --format and --out: the events of a range, with the flat analytics columns
    (docs/analytics.md) and the tree head that covers them; `--out -` writes JSONL or
    CSV to standard output (the summary goes to standard error). With --bundle FILE:
    one signed file an auditor checks with no database (`--bundle -`: to standard
    output). With --tiles DIR: the log as C2SP tlog-tiles, for any tile client
    (docs/auditing.md, "Tiles"); run again, it adds only what is new.

    \b
    Examples:
      evidence export --format csv --type gate.checked --out - > gates.csv
      evidence export --bundle p1.bundle --plan P-1
    """
    from commands.auditor import analytics

    to_stdout = STDOUT in (out, str(bundle_out) if bundle_out is not None else None)
    if to_stdout and as_json:
        fail("--json prints a summary on standard output, which `-` fills with the export")
    if to_stdout:
        data_to_stdout("--bundle" if bundle_out is not None else "--out")
    # what selects events: no option of a bundle's or tiles' (they are the log's)
    ranged: dict[str, Any] = {"--format": fmt, "--out": out, "--since": since != 1}
    ranged |= {"--until": until, "--type": types}
    if tiles_dir is not None:
        given = ranged | {"--plan": plan, "--bundle": bundle_out}
        _export_tiles(tiles_dir, given, key_file, origin, as_json, policy_file)
        return
    if bundle_out is not None:
        extra = [name for name, value in ranged.items() if value]
        if extra:
            fail(f"--bundle takes only --plan, --key and --origin, not {', '.join(extra)}")
        export_bundle_command(bundle_out, plan, key_file, origin, as_json, policy_file)
        return
    if fmt is None or out is None:
        fail("export needs --format and --out (or --bundle FILE)")
    if any(v is not None for v in (key_file, origin, policy_file)):
        fail("--key, --origin and --witness apply only to --bundle and --tiles")
    if fmt == "parquet":
        refuse_stdout(out, "--out", "Parquet is binary, with its index written last")
    store = open_store()
    target = sys.stdout.buffer if out == STDOUT else out
    with progress_bar("export") as progress:
        result = analytics.export(
            store,
            target,
            format=fmt,
            since=since,
            until=until,
            types=types,
            plan=plan,
            batch_size=batch_size,
            progress=progress,
        )
    meta = result.metadata
    if as_json:
        emit_json(
            {
                "out": result.out,
                "format": result.format,
                "rows": result.rows,
                "tree_size": int(meta["evidence.tree_size"]),
                "root_hash": meta["evidence.root_hash"],
                "metadata": None if fmt == "parquet" else f"{out}.meta.json",
            }
        )
        return
    where = "standard output" if out == STDOUT else inert(result.out)
    say = functools.partial(click.echo, err=out == STDOUT)  # stdout holds the export
    say(f"{result.rows} event(s) to {where} ({fmt})")
    say(f"covered by tree head {meta['evidence.tree_size']}:{meta['evidence.root_hash']}")


def _bars(title: str, counts: dict[str, int]) -> None:
    """A horizontal bar chart (rich) of a distribution."""
    from rich.bar import Bar
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", show_header=False, box=None)
    top = max(counts.values(), default=0)
    for label, n in counts.items():
        table.add_row(Text(inert(label)), Bar(top, 0, n, width=40), str(n))
    console().print(table)


@click.command()
@click.option("--project", help="Only the plans of this project.")
@click.option(
    "--since", type=whole(1), default=1, show_default=True, help="Only events from this position."
)
@db_option
@format_option()
def stats(project: str | None, since: int, fmt: str) -> None:
    """Validation pass rates, flaky validations, outcomes, halts.

    Per validation runs, pass rate and durations; flaky validations; plans by outcome;
    halts and gate deviations by kind and tool (docs/analytics.md). --format jsonl and
    csv print every row of every table, each naming its table.

    \b
    Examples:
      evidence stats --project api
      evidence stats --format csv > stats.csv
    """
    from commands.auditor import analytics

    store = open_store()
    report = analytics.stats(store, project=project, since=since)
    emit_listing(fmt, report, _stats_rows(report), lambda: _print_stats(report, project))


# The tables of a stats report: lists of rows, and distributions (label -> count).
_STATS_LISTS = ("validations", "flaky", "plans")
_STATS_COUNTS = (
    "plans_by_outcome",
    "halts_by_type",
    "informational_failures",
    "deviations_by_kind",
    "deviations_by_tool",
)


def _stats_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every row of the report's tables, each with the name of its table first; the
    totals are one row of table ``summary``."""
    rows: list[dict[str, Any]] = [
        {
            "table": "summary",
            **{
                key: report[key]
                for key in (
                    "since",
                    "tree_size",
                    "project",
                    "plans_applied",
                    "plans_applied_unvalidated",
                    "plans_without_outcome",
                )
            },
        }
    ]
    for table in _STATS_LISTS:
        rows += [{"table": table, **row} for row in report[table]]
    for table in _STATS_COUNTS:
        rows += [{"table": table, "key": key, "count": n} for key, n in report[table].items()]
    return rows


def _print_stats(report: dict[str, Any], project: str | None) -> None:
    import msgspec

    click.echo(
        f"events {report['since']}..{report['tree_size']}"
        + (f", project {inert(project)}" if project else "")
    )
    if report["validations"]:
        click.echo()
        print_table(
            ["validation", "runs", "pass", "no-verdict", "mean ms", "p95 ms"],
            [
                [
                    v["validation"],
                    str(v["runs"]),
                    f"{v['pass_rate']:.0%}",
                    f"{v['no_verdict_rate']:.0%}",
                    f"{v['mean_ms']:.0f}",
                    str(v["p95_ms"]),
                ]
                for v in report["validations"]
            ],
        )
    if report["flaky"]:
        click.echo()
        print_table(
            ["flaky validation", "pass", "fail", "input digest", "args"],
            [
                [
                    f["validation"],
                    str(f["pass"]),
                    str(f["fail"]),
                    f["input_digest"][:16],
                    msgspec.json.encode(f["args"]).decode(),
                ]
                for f in report["flaky"]
            ],
        )
    if report["plans"]:
        click.echo()
        print_table(
            [
                "plan",
                "project",
                "attempts",
                "failed",
                "revisions",
                "outcome",
                "applied",
                "last halt",
            ],
            [
                [
                    p["plan"],
                    p["project"] or "",
                    str(p["attempts"]),
                    str(p["failed_attempts"]),
                    str(p["strategy_revisions"]),
                    p["outcome"] or "",
                    p["applied"] or "",
                    p["halt_type"] or "",
                ]
                for p in report["plans"]
            ],
        )
        click.echo()
        click.echo(
            f"plans applied: {report['plans_applied']} "
            f"({report['plans_applied_unvalidated']} unvalidated); "
            f"plans with no outcome yet: {report['plans_without_outcome']}"
        )
    for title, key in (
        ("plans by outcome", "plans_by_outcome"),
        ("halts by canonical type", "halts_by_type"),
        ("informational failures (never blocked)", "informational_failures"),
        ("gate deviations by kind", "deviations_by_kind"),
        ("gate deviations by tool", "deviations_by_tool"),
    ):
        if report[key]:
            click.echo()
            _bars(title, report[key])


def _export_tiles(
    tiles_dir: Path,
    given: dict[str, Any],
    key_file: Path | None,
    origin: str | None,
    as_json: bool,
    policy_file: Path | None,
) -> None:
    """``export --tiles DIR``: the whole log (tiles cover every leaf) as C2SP tlog-tiles."""
    from commands.plane.witnesses import NotCosigned
    from ledger.checkpoints import CheckpointError
    from ledger.tiles import TilesError, export_tiles

    from .bundle import default_origin, signing_key, witness_cosigner

    extra = [name for name, value in given.items() if value]
    if extra:
        fail(f"--tiles takes only --key and --origin, not {', '.join(extra)}: tiles are all of it")
    store = open_store()
    key = signing_key(store, key_file)
    try:
        written = export_tiles(
            store,
            tiles_dir,
            key=key,
            origin=default_origin(store) if origin is None else origin,
            cosign=witness_cosigner(policy_file),
        )
    except NotCosigned as exc:
        click.echo(f"checkpoint not written: {exc}", err=True)
        click.get_current_context().exit(EXIT_VERDICT)
    except CheckpointError as exc:
        fail(f"--origin: {exc}")
    except TilesError as exc:
        fail(str(exc))
    if as_json:
        emit_json({"tiles": {"dir": str(tiles_dir), **written.to_json()}})
        return
    click.echo(
        f"tiles of {written.size} event(s) in {inert(str(tiles_dir))}: "
        f"{written.tiles} tile(s) and {written.bundles} entry bundle(s) new, checkpoint signed"
    )
