"""A CLI that starts fast: the verbs load lazily from the table in commands/cli/main.py,
and ``evidence --version``/``--help`` import no database, schema or rendering library
(bench/startup.py measures the times; docs/performance.md records them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import click

from commands.cli.main import COMMANDS, LazyGroup, cli
from tests.helpers import run_cli

# What the lazy table replaced: every verb `main.py` registered by hand.
VERBS = {
    "apply", "approvals", "attach", "audit", "authorize", "call", "checkpoint", "completion",
    "demo", "examples",
    "credential", "detach", "docs", "event", "events", "export", "fix", "gate", "halt",
    "hook", "init",
    "keys", "mcp", "plan", "projections", "prove", "replay", "report", "resolve", "review",
    "run", "serve", "skill", "stats", "tail", "tool", "validate", "validation", "verify",
}  # fmt: skip

HEAVY = (
    "sqlalchemy",
    "jsonschema_rs",
    "pydantic",
    "rich",
    "cryptography",
    "yaml",
    "pyarrow",
    "ledger.store",
    "ledger.events",
    "commands.plane.core",
    "projections",
)


def test_the_table_lists_every_verb() -> None:
    assert set(COMMANDS) == VERBS
    assert set(cli.list_commands(click.Context(cli))) >= VERBS


def test_the_table_points_at_each_command_and_keeps_its_short_help() -> None:
    for name, (target, short_help) in COMMANDS.items():
        module, _, attribute = target.partition(":")
        command = getattr(import_module(module), attribute)
        assert isinstance(command, click.Command) and command.name == name, target
        # What click itself would list (the first sentence of the docstring, unless
        # the command sets short_help), at any width.
        assert short_help == command.get_short_help_str(limit=10**6), name
        for limit in (30, 45, 74):
            stand_in = click.Command(name, help=short_help)
            assert stand_in.get_short_help_str(limit) == command.get_short_help_str(limit)


def test_help_lists_every_verb_as_the_eager_group_did() -> None:
    lazy = run_cli("--help")
    assert lazy.returncode == 0
    for name in VERBS:
        assert f"\n  {name} " in lazy.stdout, name
    # The listing from the table alone (a fresh group: nothing imported) is the text
    # the group writes once every verb is loaded (from the commands' own help), at any
    # width: the same sections, names and descriptions.
    for width in (60, 80, 120):
        fresh = LazyGroup("evidence", lazy_commands=COMMANDS)
        ctx = click.Context(fresh, info_name="evidence", terminal_width=width)
        from_table = ctx.make_formatter()
        fresh.format_commands(ctx, from_table)
        assert fresh.commands == {}  # listing imported nothing
        for name in COMMANDS:
            fresh.get_command(ctx, name)
        assert set(fresh.commands) == set(COMMANDS)
        eager = ctx.make_formatter()
        fresh.format_commands(ctx, eager)
        assert from_table.getvalue() == eager.getvalue()


def test_an_unknown_verb_is_refused() -> None:
    result = run_cli("no-such-verb")
    assert result.returncode == 2 and "no-such-verb" in result.stderr


PROBE = """
import json, sys
from commands.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def _modules_after(*args: str, env: dict[str, str] | None = None) -> set[str]:
    """The modules a real ``evidence ARGS`` process has imported when it ends."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["code"] in (0, None), done.stderr
    return set(report["modules"])


def test_version_and_help_import_no_heavy_module() -> None:
    for args in (("--version",), ("--help",)):
        loaded = _modules_after(*args)
        heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY or m in HEAVY)
        assert heavy == [], (args, heavy)
        verbs = sorted(
            m for m in loaded if m.startswith("commands.cli.") and m != "commands.cli.main"
        )
        assert set(verbs) <= {"commands.cli.common", "commands.cli.terminal"}, (args, verbs)


# What a read command does not need: the schema checker, the auditor, the MCP SDK and
# the service's server, the plan-file driver (YAML, pydantic), rich, the PostgreSQL
# dialect on a SQLite ledger, python-ulid (the store opens with the house's ULIDs).
NOT_FOR_READING = (
    "jsonschema_rs",
    "commands.schemas",
    "commands.auditor.audit",
    "mcp",
    "uvicorn",
    "starlette",
    "pydantic",
    "yaml",
    "rich",
    "pyarrow",
    "ulid",
    "sqlalchemy.dialects.postgresql",
)


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_a_read_command_imports_only_what_it_reads_with(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert run_cli("init", "--db", url).returncode == 0
    assert run_cli("plan", "create", "P", "--project", "p", "--resource", "repo:p",
                   "--db", url).returncode == 0  # fmt: skip
    for args in (("plan", "list"), ("plan", "history", "P"), ("plan", "show", "P")):
        loaded = _modules_after(*args, "--db", url)
        assert "ledger.store" in loaded  # it did open the ledger
        assert _loaded(loaded, NOT_FOR_READING) == [], args


def test_completion_imports_no_plane_nor_store() -> None:
    """A TAB (click's ``_EVIDENCE_COMPLETE=bash_complete`` protocol) lists verbs from
    the table, and a group's subcommands (or a verb's options) from its module, which
    imports the plane, the store and the rest only when a command runs."""
    cases = [("evidence ", "1"), ("evidence pl", "1"), ("evidence plan s", "2")]
    # Every verb (a group's subcommands, a command's arguments), and a group's option.
    cases += [(f"evidence {name} ", "2") for name in sorted(COMMANDS)]
    cases += [("evidence tool list --", "3"), ("evidence export --format ", "3")]
    for words, cword in cases:
        env = {"_EVIDENCE_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": cword}
        loaded = _modules_after(env=env)
        # A verb's options may name the outcomes and the event types (the event catalog
        # and the plan's document type, msgspec): no store, no read model.
        light = ("ledger.events", "projections") if cword != "1" else ()
        too_heavy = (*(h for h in HEAVY if h not in light), *NOT_FOR_READING)
        heavy = _loaded(
            loaded, (*too_heavy, "projections.engine", "commands.plane", "commands.auditor")
        )
        assert heavy == [], (words, heavy)
        verbs = {m for m in loaded if m.startswith("commands.cli.")}
        verb = words.split()[1] if cword != "1" else None
        expected = {"commands.cli.main", "commands.cli.common", "commands.cli.terminal"}
        if verb is not None:
            module = COMMANDS[verb][0].partition(":")[0]
            # Its module and the CLI's helpers (inputs, output, bundles, the verbs whose
            # options it shares); never a transport (the MCP proxy, relay, bridge).
            expected |= {module, *(m for m in verbs if not m.startswith("commands.cli.mcp_"))}
        assert verbs <= expected, (words, sorted(verbs - expected))


def test_export_formats_are_the_auditors() -> None:
    from commands.auditor.analytics import FORMATS
    from commands.cli.analytics import EXPORT_FORMATS

    assert EXPORT_FORMATS == FORMATS
