"""``evidence completion`` and ``evidence docs``: finding your way from an installed
package alone.

The documentation ships inside the package (``docs/`` is the package data
``commands.docs``, as ``examples/`` is ``commands.examples``): every ``docs/NAME.md`` a
command's help names is ``evidence docs NAME`` wherever evidence-ledger is installed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import click

from .common import emit_json, fail, json_option
from .terminal import inert

SHELLS = ("bash", "zsh", "fish")
CHECKOUT_DOCS = Path(__file__).resolve().parents[2] / "docs"


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the shell completion script for bash, zsh or fish.

    The same script as `_EVIDENCE_COMPLETE=SHELL_source evidence`: source it from the
    shell's start-up file (docs/cli.md, "Shell completion").

    \b
    Examples:
      evidence completion bash > ~/.evidence-complete.bash
      evidence completion fish > ~/.config/fish/completions/evidence.fish
    """
    from click.shell_completion import get_completion_class

    from .main import cli

    found = get_completion_class(shell)
    if found is None:  # click knows the three; a newer click could drop one
        fail(f"no completion for {shell}")
    script = found(cli, {}, "evidence", "_EVIDENCE_COMPLETE").source()
    click.echo(script.rstrip("\n"))


def docs_dir() -> Path:
    """The shipped documentation: the package data ``commands.docs`` of an installed
    wheel (found through its import spec), else a source checkout's ``docs/``."""
    spec = importlib.util.find_spec("commands.docs")
    if spec is None or not spec.submodule_search_locations:
        return CHECKOUT_DOCS
    return Path(next(iter(spec.submodule_search_locations)))


def _title(path: Path) -> str:
    with path.open(encoding="utf-8") as f:
        first = f.readline().strip()
    return first.lstrip("#").strip()


@click.command("docs")
@click.argument("name", required=False)
@click.option("--path", "show_path", is_flag=True, help="Print the file's path, not its text.")
@json_option
def docs(name: str | None, show_path: bool, as_json: bool) -> None:
    """Show the documentation that ships with evidence-ledger.

    Without NAME: every page, its title and where it is installed. With NAME (cli,
    concepts, plan-files ...; as in docs/NAME.md): the page's Markdown.

    \b
    Examples:
      evidence docs
      evidence docs plan-files --path
    """
    root = docs_dir()
    pages = sorted(root.glob("*.md"))
    if not pages:
        fail(f"no documentation in {root}: this installation is incomplete")
    if name is None:
        if as_json:
            emit_json(
                {"docs": [{"name": p.stem, "title": _title(p), "path": str(p)} for p in pages]}
            )
            return
        width = max(len(p.stem) for p in pages)
        for page in pages:
            click.echo(f"{page.stem.ljust(width)}  {inert(_title(page))}")
        click.echo(f"(in {inert(root)}; `evidence docs NAME` prints one)")
        return
    chosen = root / f"{name.removeprefix('docs/').removesuffix('.md')}.md"
    if chosen not in pages:
        fail(f"no page {name!r}: one of {', '.join(p.stem for p in pages)}")
    if as_json:
        emit_json(
            {
                "name": chosen.stem,
                "title": _title(chosen),
                "path": str(chosen),
                "text": chosen.read_text(encoding="utf-8"),
            }
        )
    elif show_path:
        click.echo(str(chosen))
    else:
        click.echo(inert(chosen.read_text(encoding="utf-8"), multiline=True), nl=False)
