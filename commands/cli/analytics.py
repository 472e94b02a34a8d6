"""Analytics consumers: ``tail`` (a subscription; a named consumer resumes where it
stopped), ``export`` and ``stats``."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import click
import msgspec

from commands.auditor import analytics
from ledger import RecordedEvent
from ledger.subscriptions import subscribe

from .bundle import export_bundle_command
from .common import (
    console,
    db_option,
    emit_json,
    fail,
    json_option,
    open_store,
    print_table,
)
from .inputs import Seconds, whole
from .log import payload_summary
from .terminal import inert


def _text_line(e: RecordedEvent) -> bytes:
    return (
        inert(
            f"{e.position}  {e.recorded_at}  {e.stream}  {e.type}  {e.actor}  "
            f"{payload_summary(e.payload)}"
        )
        + "\n"
    ).encode()


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
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line (JSON Lines).")
@db_option
def tail(
    from_position: int | None,
    consumer: str | None,
    follow: bool,
    types: tuple[str, ...],
    interval: float,
    as_json: bool,
) -> None:
    """Print events in position order as they arrive.

    With --consumer the position stored for NAME moves to the last event printed, also
    when Ctrl-C ends the command; the next `tail --consumer NAME` starts after it.
    """
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
    printed = sub.acked
    try:
        for batch in sub.batches(follow=follow):
            for event in batch:
                out.write(encode(event.to_json()) + b"\n" if as_json else _text_line(event))
                out.flush()
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
    type=click.Choice(analytics.FORMATS),
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
    help="The file to write (replaced atomically).",
)
@click.option(
    "--bundle",
    "bundle_out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Instead: write an offline bundle for auditors (docs/auditing.md).",
)
@click.option(
    "--key",
    "key_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --bundle: sign its checkpoint with this key (default: the plane key).",
)
@click.option(
    "--origin",
    default=None,
    metavar="NAME",
    help="With --bundle: the checkpoint's origin (default: evidence-ledger/<id>).",
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
    key_file: Path | None,
    origin: str | None,
    batch_size: int,
    as_json: bool,
) -> None:
    """Write events to a file with the flat analytics columns (docs/analytics.md), or an
    offline bundle (--bundle FILE [--plan P])."""
    if bundle_out is not None:
        extra = [
            name
            for name, given in (
                ("--format", fmt),
                ("--out", out),
                ("--since", since != 1),
                ("--until", until),
                ("--type", types),
            )
            if given
        ]
        if extra:
            fail(f"--bundle takes only --plan, --key and --origin, not {', '.join(extra)}")
        export_bundle_command(bundle_out, plan, key_file, origin, as_json)
        return
    if fmt is None or out is None:
        fail("export needs --format and --out (or --bundle FILE)")
    if key_file is not None or origin is not None:
        fail("--key and --origin apply only to --bundle")
    store = open_store()
    if sys.stderr.isatty() and not as_json:
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task("export", total=None)
            result = analytics.export(
                store,
                out,
                format=fmt,
                since=since,
                until=until,
                types=types,
                plan=plan,
                batch_size=batch_size,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
            )
    else:
        result = analytics.export(
            store,
            out,
            format=fmt,
            since=since,
            until=until,
            types=types,
            plan=plan,
            batch_size=batch_size,
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
    click.echo(f"{result.rows} event(s) to {inert(result.out)} ({fmt})")
    click.echo(f"covered by tree head {meta['evidence.tree_size']}:{meta['evidence.root_hash']}")


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
@json_option
def stats(project: str | None, since: int, as_json: bool) -> None:
    """Validation pass rates and durations, flaky validations, plan outcomes, halts and
    gate deviations (docs/analytics.md)."""
    store = open_store()
    report = analytics.stats(store, project=project, since=since)
    if as_json:
        emit_json(report)
        return
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
