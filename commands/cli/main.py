"""The ``evidence`` command: a thin click layer over the handlers a Python user can call.

``main`` owns the error convention: an input mistake (click usage error or any
``ledger.LedgerError``) prints one ``error: ...`` line on stderr and exits 2, never a
traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

import ledger

from . import (
    analytics,
    attachments,
    audit,
    driver,
    gates,
    lifecycle,
    log,
    plans,
    projections,
    registry,
    report,
    reviews,
    runs,
)
from .common import DB_HELP, EXIT_REFUSED
from .terminal import inert


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", "db_url", default=None, metavar="URL", help=DB_HELP)
@click.version_option(ledger.__version__, prog_name="evidence")
@click.pass_context
def cli(ctx: click.Context, db_url: str | None) -> None:
    """Evidence Ledger: an append-only, verifiable log of an agent validation plane."""
    if db_url is not None:
        ctx.meta["evidence.db"] = db_url


cli.add_command(log.init)
cli.add_command(log.events)
cli.add_command(log.verify)
cli.add_command(registry.tool)
cli.add_command(registry.validation)
cli.add_command(registry.skill)
cli.add_command(plans.plan)
cli.add_command(projections.projections)
cli.add_command(attachments.attach)
cli.add_command(attachments.detach)
cli.add_command(attachments.resolve)
cli.add_command(gates.gate)
cli.add_command(runs.call)
cli.add_command(runs.validate)
cli.add_command(runs.halt)
cli.add_command(lifecycle.fix)
cli.add_command(lifecycle.keys)
cli.add_command(lifecycle.authorize_)
cli.add_command(lifecycle.apply_)
cli.add_command(driver.run)
cli.add_command(driver.demo)
cli.add_command(reviews.review)
cli.add_command(audit.replay)
cli.add_command(audit.audit)
cli.add_command(audit.checkpoint)
cli.add_command(audit.prove)
cli.add_command(report.report)
cli.add_command(analytics.tail)
cli.add_command(analytics.export)
cli.add_command(analytics.stats)


def _not_utf8(argv: Sequence[str]) -> str | None:
    """The first argument that is not UTF-8 text: Python hands such bytes over as lone
    surrogates (``surrogateescape``), which no later step can store or print."""
    for number, arg in enumerate(argv, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            code = ord(arg[exc.start])
            shown = f" (byte 0x{code - 0xDC00:02x})" if 0xDC80 <= code <= 0xDCFF else ""
            return f"argument {number} is not UTF-8{shown}"
    return None


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if (problem := _not_utf8(args)) is not None:
        click.echo(f"error: {problem}", err=True)
        sys.exit(EXIT_REFUSED)
    try:
        code = cli.main(args=args, prog_name="evidence", standalone_mode=False)
    except click.ClickException as exc:
        click.echo(f"error: {inert(exc.format_message())}", err=True)
        sys.exit(EXIT_REFUSED)
    except ledger.LedgerError as exc:
        click.echo(f"error: {inert(str(exc))}", err=True)
        sys.exit(EXIT_REFUSED)
    except click.Abort:
        click.echo("error: aborted", err=True)
        sys.exit(130)
    except OSError as exc:
        # A path the system cannot use (a name too long, a directory where a file was
        # meant, no permission): the command stops before (or, in a transaction,
        # without) appending anything. Said in one line, like any refusal.
        where = f"{exc.filename}: " if exc.filename else ""
        click.echo(f"error: {inert(where + (exc.strerror or str(exc)))}", err=True)
        sys.exit(EXIT_REFUSED)
    sys.exit(code if isinstance(code, int) else 0)
