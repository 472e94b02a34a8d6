"""The ``evidence`` command: a thin click layer over the handlers a Python user can call.

``main`` owns the error convention: an input mistake (click usage error or any
``ledger.LedgerError``) prints one ``error: ...`` line on stderr and exits 2, never a
traceback.

The verbs load lazily: ``COMMANDS`` names each one's module and attribute and keeps its
short help, so ``evidence --help`` lists every verb and ``evidence --version`` answers
without importing any verb's module (nor the database, the schema checker, rich ...);
``evidence gate input`` imports ``commands.cli.gates`` and what it needs, nothing else.
tests/commands/cli/test_startup.py keeps the short help here equal to each command's own.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from importlib import import_module
from typing import TYPE_CHECKING, Any, NoReturn

import click

import ledger  # light: the errors and the version; the store loads on first use

from .common import (  # light: no store, no rich until used
    DB_HELP,
    EXIT_REFUSED,
    discard_fresh_ledgers,
    reset_fresh_ledgers,
)
from .terminal import inert

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

# Every verb: name -> ("module:attribute", short help). The short help is what
# `evidence --help` shows without importing the module: the first sentence of the
# command's docstring (tests/commands/cli/test_startup.py checks that they agree), short enough to
# fit on one line at 80 columns (tests/commands/cli/test_cli_surface.py).
# A new verb: add its line here, to a section of SECTIONS, and to docs/cli.md.
COMMANDS: dict[str, tuple[str, str]] = {
    "apply": (
        "commands.cli.lifecycle:apply_",
        "Apply a plan with the token its passing validation minted.",
    ),
    "attach": (
        "commands.cli.attachments:attach",
        "Attach VALIDATION to a resource; print the attachment's ULID.",
    ),
    "audit": (
        "commands.cli.audit:audit",
        "Check the invariants; re-derive every verdict from the log.",
    ),
    "approvals": (
        "commands.cli.approvals:approvals",
        "The approval policy: how many approvers, who may decide.",
    ),
    "authorize": (
        "commands.cli.lifecycle:authorize_",
        "List pending decisions, or sign and record one.",
    ),
    "call": ("commands.cli.runs:call", "Gate, run and record a tool call."),
    "completion": (
        "commands.cli.help:completion",
        "Print the shell completion script for bash, zsh or fish.",
    ),
    "checkpoint": (
        "commands.cli.checkpoints:checkpoint",
        "Print a signed tree head (a C2SP checkpoint) of the log.",
    ),
    "credential": (
        "commands.cli.credentials:credential",
        "Agent credentials: what an agent shows the plane's service.",
    ),
    "demo": (
        "commands.cli.driver:demo",
        "Run the green-after-fix example on a fresh SQLite ledger.",
    ),
    "detach": ("commands.cli.attachments:detach", "Detach an attachment."),
    "examples": (
        "commands.cli.driver:examples",
        "Copy the shipped examples into a directory.",
    ),
    "docs": (
        "commands.cli.help:docs",
        "Show the documentation that ships with evidence-ledger.",
    ),
    "event": (
        "commands.cli.log:event",
        "Show one event with its hashes and its inclusion proof.",
    ),
    "events": ("commands.cli.log:events", "List events in position order, or newest first."),
    "export": (
        "commands.cli.analytics:export",
        "Export events (JSONL, CSV, Parquet) or an offline bundle.",
    ),
    "fix": ("commands.cli.lifecycle:fix", "Record the agent's fix before re-validating."),
    "gate": (
        "commands.cli.gates:gate",
        "Structural gates: any deviation fails, and is recorded.",
    ),
    "halt": ("commands.cli.runs:halt", "Record an orchestrator's own halt."),
    "hook": (
        "commands.cli.hooks:hook",
        "Agent CLI tool-use hooks: gate and record its tool calls.",
    ),
    "init": ("commands.cli.log:init", "Create the ledger (if missing) and its first operator."),
    "keys": (
        "commands.cli.lifecycle:keys",
        "People's keys (Ed25519); private keys never enter the ledger.",
    ),
    "mcp": (
        "commands.cli.mcp:mcp",
        "MCP gate proxy: gate and record an agent's MCP tool calls.",
    ),
    "plan": ("commands.cli.plans:plan", "Plans: Strategize -> Execute -> Apply."),
    "projections": ("commands.cli.projections:projections", "Read models folded from the log."),
    "prove": (
        "commands.cli.audit:prove",
        "Print or check an RFC 9162 inclusion or consistency proof.",
    ),
    "replay": (
        "commands.cli.audit:replay",
        "Show a plan's state after each of its events.",
    ),
    "report": (
        "commands.cli.report:report",
        "Write a self-contained HTML report of a plan.",
    ),
    "resolve": (
        "commands.cli.attachments:resolve",
        "Which validations apply to work on a resource.",
    ),
    "review": (
        "commands.cli.reviews:review",
        "Advisory reviews, recorded and verified; never a gate.",
    ),
    "run": (
        "commands.cli.driver:run",
        "Drive a whole plan from PLAN_FILE: gates, tools, Apply.",
    ),
    "serve": (
        "commands.cli.serve:serve",
        "Serve the plane over HTTP to agents holding a credential.",
    ),
    "skill": (
        "commands.cli.registry:skill",
        "Skills: named bundles of tools and validations.",
    ),
    "stats": (
        "commands.cli.analytics:stats",
        "Validation pass rates, flaky validations, outcomes, halts.",
    ),
    "tail": ("commands.cli.analytics:tail", "Print events in position order as they arrive."),
    "tool": ("commands.cli.registry:tool", "Tools: register, import, pack, list, show."),
    "validate": (
        "commands.cli.runs:validate",
        "Run the plan's pinned validations; classify the outcome.",
    ),
    "validation": (
        "commands.cli.registry:validation",
        "Validations: read-only tools that return a verdict.",
    ),
    "verify": (
        "commands.cli.log:verify",
        "Recompute every leaf, the hash chain and the Merkle root.",
    ),
}

# `evidence --help` lists the verbs by what a user is doing, in this order (and within a
# section in the order of the work). Every verb of COMMANDS is in exactly one section.
SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("The log", ("init", "events", "event", "verify", "projections")),
    ("Registry", ("tool", "validation", "skill", "attach", "detach", "resolve")),
    ("Plans and runs", ("plan", "call", "validate", "fix", "halt", "run", "demo", "examples")),
    ("Gates", ("gate",)),
    ("Decisions and Apply", ("authorize", "approvals", "keys", "credential", "apply")),
    ("Auditing", ("audit", "replay", "checkpoint", "prove", "report")),
    ("Analytics", ("tail", "export", "stats")),
    ("Reviews", ("review",)),
    ("The agent's door", ("hook", "mcp", "serve")),
    ("Help", ("docs", "completion")),
)


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use (click's lazy group
    pattern). Listing them (``--help``) needs only the table."""

    def __init__(
        self, *args: Any, lazy_commands: Mapping[str, tuple[str, str]], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy_commands:
            self.add_command(self.load(cmd_name), cmd_name)
        return super().get_command(ctx, cmd_name)

    def load(self, cmd_name: str) -> click.Command:
        """Import the command ``cmd_name`` from the module the table names."""
        target = self.lazy_commands[cmd_name][0]
        module, _, attribute = target.partition(":")
        command = getattr(import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command

    def listed(self, cmd_name: str) -> click.Command:
        """The command as a listing shows it: itself once imported, else a stand-in that
        carries the table's short help (imports nothing)."""
        command = self.commands.get(cmd_name)
        if command is None:
            command = click.Command(cmd_name, help=self.lazy_commands[cmd_name][1])
        return command

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        """The verbs that start with ``incomplete`` (then what click adds: the options),
        as click's group completes them but from the table: completing a verb (``evidence
        pl<TAB>``) imports none of them."""
        from click.shell_completion import CompletionItem

        results = [
            CompletionItem(name, help=command.get_short_help_str())
            for name in self.list_commands(ctx)
            if name.startswith(incomplete) and not (command := self.listed(name)).hidden
        ]
        results.extend(click.Command.shell_complete(self, ctx, incomplete))
        return results

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The verbs in the sections of ``SECTIONS`` (any other under "Other"), as click
        lists commands (same columns, same shortening), one name column for all; the
        short help from the table for those not imported yet."""
        commands = {name: self.listed(name) for name in self.list_commands(ctx)}
        shown = {name: c for name, c in commands.items() if not c.hidden}
        if not shown:
            return
        width = max(len(name) for name in shown)
        limit = formatter.width - 6 - width
        placed = {name for _, names in SECTIONS for name in names}
        sections = [
            *SECTIONS,
            ("Other", tuple(name for name in shown if name not in placed)),
        ]
        for title, names in sections:
            rows = [
                (name.ljust(width), shown[name].get_short_help_str(limit))
                for name in names
                if name in shown
            ]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


@click.group(
    cls=LazyGroup,
    lazy_commands=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option("--db", "db_url", default=None, metavar="URL", help=DB_HELP)
@click.version_option(ledger.__version__, prog_name="evidence")
@click.pass_context
def cli(ctx: click.Context, db_url: str | None) -> None:
    """Evidence Ledger: an append-only, verifiable log of an agent validation plane.

    `evidence COMMAND --help` shows a command's options and examples; docs/cli.md
    documents every command, its output formats and exit codes. The docs ship with the
    package: `evidence docs cli` prints docs/cli.md (any docs/NAME.md a help names is
    `evidence docs NAME`). Tab completion: `evidence completion bash|zsh|fish`
    (docs/cli.md, "Shell completion").

    \b
    Examples:
      evidence demo
      evidence events --last 20
    """
    if db_url is not None:
        ctx.meta["evidence.db"] = db_url


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
    if argv is None and args[:1] == ["hook"]:
        _hook_main(args)
    if (problem := _not_utf8(args)) is not None:
        click.echo(f"error: {problem}", err=True)
        sys.exit(EXIT_REFUSED)
    reset_fresh_ledgers()
    try:
        code = cli.main(args=args, prog_name="evidence", standalone_mode=False)
    except click.ClickException as exc:
        discard_fresh_ledgers()  # a refused command leaves no ledger it created
        click.echo(f"error: {inert(exc.format_message())}", err=True)
        sys.exit(EXIT_REFUSED)
    except ledger.LedgerError as exc:
        discard_fresh_ledgers()
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
        discard_fresh_ledgers()
        click.echo(f"error: {inert(where + (exc.strerror or str(exc)))}", err=True)
        sys.exit(EXIT_REFUSED)
    sys.exit(code if isinstance(code, int) else 0)


def _hook_main(args: list[str]) -> NoReturn:
    """``evidence hook`` as an agent CLI runs it: an agent CLI lets the call through on
    every exit status but 2, so every way out but the answer's 0 — a signal, a refusal,
    an exception that escaped — is 2 (``commands.hook_client`` does the same)."""
    from commands.hook_client import block_on_signals

    block_on_signals()
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = 0 if exc.code in (0, None) else 2
    except BaseException as exc:  # a bug must block the call too, and show no traceback
        click.echo(
            f"error: evidence hook failed ({type(exc).__name__}): the call is blocked", err=True
        )
        code = 2
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
