"""Finding one's way in the CLI: `--help` grouped by what a user is doing, descriptions
that fit at 80 columns, examples ending every command's description (and that they
parse), docs/cli.md naming exactly the commands there are, and shell completion through
the lazy group."""

from __future__ import annotations

import inspect
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from commands.cli import reference
from commands.cli.main import COMMANDS, SECTIONS, LazyGroup, cli
from tests.helpers import REPO, run_cli

DOCS = REPO / "docs" / "cli.md"
REFERENCE = DOCS.with_name("cli-reference.md")

NOT_OURS: tuple[str, ...] = ()  # every command's help is held to the rules


def _walk(
    group: click.Group, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        if command.hidden:  # internal (the review host the CLI starts itself)
            continue
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _walk(command, (*path, name))


def _leaves() -> list[tuple[tuple[str, ...], click.Command]]:
    return [(p, c) for p, c in _walk(cli) if not isinstance(c, click.Group)]


def _groups() -> list[tuple[tuple[str, ...], click.Group]]:
    return [(p, c) for p, c in [((), cli), *_walk(cli)] if isinstance(c, click.Group)]


# -- --help, grouped -------------------------------------------------------------------


def test_every_verb_is_in_exactly_one_section() -> None:
    placed = [name for _, names in SECTIONS for name in names]
    assert sorted(placed) == sorted(COMMANDS)
    assert len(placed) == len(set(placed))


def test_help_lists_the_verbs_under_their_sections_in_order() -> None:
    result = run_cli("--help", env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    text = result.stdout
    titles = [title for title, _ in SECTIONS]
    headings = [line[:-1] for line in text.splitlines() if line in {f"{t}:" for t in titles}]
    assert headings == titles
    # Each section lists its verbs, in its order, and nothing else.
    blocks = re.split(r"\n\n", text.split("\n\n", 3)[-1])
    listed = {}
    for block in blocks:
        lines = block.splitlines()
        if lines and lines[0][:-1] in titles:
            listed[lines[0][:-1]] = [line.split()[0] for line in lines[1:]]
    assert listed == {title: list(names) for title, names in SECTIONS}
    assert "Shell completion" in text and "--help" in text


# click writes help 2 columns narrower than the terminal (78 in an 80-column one; the
# test runner forces 80, so the width is given here).
HELP_WIDTH_AT_80 = 78


def test_no_description_is_cut_at_80_columns() -> None:
    for path, group in _groups():
        if path[:1] and path[0] in NOT_OURS:
            continue
        ctx = click.Context(group, info_name="evidence", terminal_width=HELP_WIDTH_AT_80)
        formatter = ctx.make_formatter()
        group.format_commands(ctx, formatter)
        names = {
            name
            for name in group.list_commands(ctx)
            if name not in NOT_OURS and not (group.get_command(ctx, name) or group).hidden
        }
        listed = [
            line
            for line in formatter.getvalue().splitlines()
            if line.startswith("  ") and line.split()[0] in names
        ]
        assert len(listed) == len(names), (path, formatter.getvalue())
        for line in listed:
            assert not line.rstrip().endswith("..."), (path, line)
            assert len(line) <= 80, (path, line)


def test_short_help_in_the_table_fits_without_importing_a_verb() -> None:
    # The listing comes from the table alone: the same no-cut rule holds before any verb
    # module is imported (what `evidence --help` shows).
    fresh = LazyGroup("evidence", lazy_commands=COMMANDS)
    ctx = click.Context(fresh, info_name="evidence", terminal_width=HELP_WIDTH_AT_80)
    formatter = ctx.make_formatter()
    fresh.format_commands(ctx, formatter)
    assert fresh.commands == {}
    cut = [
        line
        for line in formatter.getvalue().splitlines()
        if line.rstrip().endswith("...") and line.split()[0] not in NOT_OURS
    ]
    assert cut == []


# -- examples --------------------------------------------------------------------------


def _examples(command: click.Command) -> list[str]:
    """The example lines ending the command's help: a ``\\b`` paragraph that starts
    with ``Examples:``."""
    paragraphs = inspect.cleandoc(command.help or "").split("\n\n")
    last = paragraphs[-1].splitlines()
    assert last[:2] == ["\b", "Examples:"], (command.name, paragraphs[-1])
    return [line.strip() for line in last[2:]]


def _parse(path: tuple[str, ...], args: list[str]) -> click.Context:
    """Parse a command's arguments as `evidence PATH ARGS` would, without running it:
    every option and argument must exist and take the value given."""
    ctx = click.Context(cli, info_name="evidence")
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        sub = command.get_command(ctx, name)
        assert sub is not None, path
        ctx, command = click.Context(sub, info_name=name, parent=ctx), sub
    return command.make_context(path[-1], list(args), parent=ctx.parent)


@pytest.mark.parametrize(
    "path",
    [p for p, _ in _leaves() if p[0] not in NOT_OURS],
    ids=" ".join,
)
def test_every_command_help_ends_with_examples_that_parse(path: tuple[str, ...]) -> None:
    command = dict(_leaves())[path]
    examples = _examples(command)
    assert 1 <= len(examples) <= 2, (path, examples)
    for example in examples:
        words = shlex.split(example)
        for redirect in (">", "<"):  # the shell's, not the command's
            words = words[: words.index(redirect)] if redirect in words else words
        assert words[: 1 + len(path)] == ["evidence", *path], example
        assert len(example) <= 76, example  # shown indented and unwrapped: it must fit
        _parse(path, words[1 + len(path) :])
    # `--help` shows them as written, last in the command's description (before the
    # options), under "Examples:".
    shown = run_cli(*path, "--help", env={"COLUMNS": "80"})
    assert shown.returncode == 0, shown.stderr
    description = shown.stdout.split("\nOptions:")[0].rstrip().splitlines()
    assert [line.strip() for line in description[-len(examples) - 1 :]] == [
        "Examples:",
        *examples,
    ]


def test_an_example_with_a_misspelt_option_does_not_parse() -> None:
    with pytest.raises(click.UsageError):
        _parse(("events",), ["--lats", "3"])
    with pytest.raises(click.UsageError):
        _parse(("plan", "create"), ["P-1"])  # --project and --resource are required


# -- docs/cli.md names exactly the commands there are ----------------------------------

_WORD = re.compile(r"[a-z][a-z-]*(\|[a-z][a-z-]*)*")


def documented(text: str) -> set[tuple[str, ...]]:
    """Every command a heading of docs/cli.md names: each backticked `evidence …` span of
    a heading, its leading lowercase words (``a|b`` names both)."""
    found: set[tuple[str, ...]] = set()
    for line in text.splitlines():
        if not line.startswith("#"):
            continue
        for span in re.findall(r"`(evidence [^`]*)`", line):
            words = []
            for word in span.split()[1:]:
                if not _WORD.fullmatch(word):
                    break
                words.append(word.split("|"))
            paths: list[tuple[str, ...]] = [()]
            for alternatives in words:
                paths = [(*p, a) for p in paths for a in alternatives]
            found.update(p for p in paths if p)
    return found


def test_docs_name_every_command_and_subcommand_and_nothing_else() -> None:
    commands = {path for path, _ in _leaves()}
    assert documented(DOCS.read_text()) == commands


def test_the_docs_check_sees_a_heading_go_or_a_stray_one_come() -> None:
    text = DOCS.read_text()
    assert "\n## `evidence event POSITION_OR_ID" in text
    without = text.replace("\n## `evidence event POSITION_OR_ID", "\n## event POSITION_OR_ID")
    assert documented(text) - documented(without) == {("event",)}
    stray = text + "\n### `evidence plan forget PLAN`\n"
    assert documented(stray) - documented(text) == {("plan", "forget")}
    assert {("review", "show"), ("hook", "post-tool"), ("keys", "list")} <= documented(text)


def test_the_cli_reference_is_the_commands_own_help() -> None:
    """docs/cli-reference.md is generated from every command's --help: regenerate it
    with `python -m commands.cli.reference > docs/cli-reference.md`."""
    assert REFERENCE.read_text() == reference.render()


def test_the_reference_check_sees_a_help_change(monkeypatch: pytest.MonkeyPatch) -> None:
    before = reference.render()
    ctx = click.Context(cli)
    verify = cli.get_command(ctx, "verify")
    assert verify is not None and verify.help is not None
    monkeypatch.setattr(verify, "help", verify.help.replace("Merkle", "Merkel"))
    after = reference.render()
    assert after != before and after.replace("Merkel", "Merkle") == before


# -- shell completion --------------------------------------------------------------------


def _complete(words: str, tmp_path: Path) -> list[str]:
    cword = len(words.split()) - (0 if words.endswith(" ") else 1)
    result = run_cli(
        env={
            "_EVIDENCE_COMPLETE": "bash_complete",
            "COMP_WORDS": words,
            "COMP_CWORD": str(cword),
        },
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_completion_through_the_lazy_group(tmp_path: Path) -> None:
    assert _complete("evidence pl", tmp_path) == ["plain,plan"]
    assert set(_complete("evidence ev", tmp_path)) == {"plain,event", "plain,events"}
    assert "plain,history" in _complete("evidence plan h", tmp_path)
    assert {"plain,--last", "plain,--reverse", "plain,--format"} <= set(
        _complete("evidence events --", tmp_path)
    )
    assert _complete("evidence events --format ", tmp_path) == [
        "plain,table",
        "plain,json",
        "plain,jsonl",
        "plain,csv",
    ]
    assert list(tmp_path.iterdir()) == []  # completing opened no ledger


@pytest.mark.parametrize(
    ("shell", "line"),
    [
        ("bash", "complete -o nosort -F _evidence_completion evidence"),
        ("zsh", "compdef _evidence_completion evidence"),
        ("fish", "complete --no-files --command evidence"),
    ],
)
def test_completion_scripts_for_each_shell(shell: str, line: str) -> None:
    result = run_cli(env={"_EVIDENCE_COMPLETE": f"{shell}_source"})
    assert result.returncode == 0, result.stderr
    assert line in result.stdout
    assert f"_EVIDENCE_COMPLETE={shell}_complete" in result.stdout.replace('"', "")
    assert f"_EVIDENCE_COMPLETE={shell}_source evidence" in DOCS.read_text()
