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
    cli_analytics,
    cli_attachments,
    cli_audit,
    cli_driver,
    cli_gates,
    cli_lifecycle,
    cli_log,
    cli_plans,
    cli_projections,
    cli_registry,
    cli_report,
    cli_reviews,
    cli_runs,
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


cli.add_command(cli_log.init)
cli.add_command(cli_log.events)
cli.add_command(cli_log.verify)
cli.add_command(cli_registry.tool)
cli.add_command(cli_registry.validation)
cli.add_command(cli_registry.skill)
cli.add_command(cli_plans.plan)
cli.add_command(cli_projections.projections)
cli.add_command(cli_attachments.attach)
cli.add_command(cli_attachments.detach)
cli.add_command(cli_attachments.resolve)
cli.add_command(cli_gates.gate)
cli.add_command(cli_runs.call)
cli.add_command(cli_runs.validate)
cli.add_command(cli_runs.halt)
cli.add_command(cli_lifecycle.fix)
cli.add_command(cli_lifecycle.keys)
cli.add_command(cli_lifecycle.authorize_)
cli.add_command(cli_lifecycle.apply_)
cli.add_command(cli_driver.run)
cli.add_command(cli_driver.demo)
cli.add_command(cli_reviews.review)
cli.add_command(cli_audit.replay)
cli.add_command(cli_audit.audit)
cli.add_command(cli_audit.checkpoint)
cli.add_command(cli_audit.prove)
cli.add_command(cli_report.report)
cli.add_command(cli_analytics.tail)
cli.add_command(cli_analytics.export)
cli.add_command(cli_analytics.stats)


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


if __name__ == "__main__":
    main()
