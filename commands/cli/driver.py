"""``evidence run`` and ``evidence demo``."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from .common import db_option, emit_json, fail, json_option, open_plane, workdir_option
from .terminal import inert, no_color

if TYPE_CHECKING:
    from commands.plane.core import Plane
    from commands.plane.driver import RunSummary
    from commands.rules.plan_runs import Failure

CHECKOUT_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def examples_dir() -> Path:
    """The shipped examples: the package data ``commands.examples`` of an installed
    wheel (a directory of data, no ``__init__``: found through its import spec), else
    a source checkout's ``examples/`` (an editable install maps nothing)."""
    spec = importlib.util.find_spec("commands.examples")
    if spec is None or not spec.submodule_search_locations:
        return CHECKOUT_EXAMPLES
    return Path(next(iter(spec.submodule_search_locations)))


def _shipped_example(plan_file: Path) -> Path | None:
    """The shipped example directory PLAN_FILE belongs to, if it is one."""
    shipped = examples_dir().resolve()
    resolved = plan_file.resolve()
    if resolved.parent.parent == shipped and resolved.parent != shipped:
        return resolved.parent
    return None


def _copy_example(example: Path, into: Path) -> Path:
    """A fresh copy of an example directory under ``into`` (no caches, no old runs)."""
    target = into / example.name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(example, target, ignore=shutil.ignore_patterns("__pycache__", ".evidence*"))
    return target


def _say_factory(as_json: bool):
    """Progress: coloured on a terminal, plain lines when piped, silent with --json. The
    message carries the agent's text (strategies, notes, messages): shown ``inert``, and
    never read as markup (``[required]`` is a label)."""
    from rich.console import Console
    from rich.text import Text

    if as_json:
        return lambda _stage, _message: None
    styled = sys.stdout.isatty() and not no_color()
    console = Console(highlight=False, markup=False, emoji=False) if styled else None

    def say(stage: str, message: str) -> None:
        message = inert(message)
        if console is not None:
            console.print(Text.assemble((f"{stage:>10}", "bold cyan"), " ", message))
        else:
            click.echo(f"{stage:>10} {message}")

    return say


def _failures(plane: Plane, summary: RunSummary) -> list[Failure]:
    """Why the plan's last validation run failed, unless the plan was applied."""
    from commands.rules.plan_runs import last_run_failures, plan_history

    if summary.state == "applied":
        return []
    return last_run_failures(plan_history(plane.store, summary.plan_id), plane.store.get_blob)


def _print_summary(summary: RunSummary, failures: Sequence[Failure] = ()) -> None:
    from commands.rules.plan_runs import failure_lines

    click.echo("")
    click.echo(
        f"plan {inert(summary.plan_id)}: {summary.state}"
        + (f" (outcome {summary.outcome})" if summary.outcome else "")
    )
    if summary.token:
        click.echo(f"token {summary.token[:24]}… consumed by Apply")
    if summary.decision_id:
        click.echo(f"escalated: decision {summary.decision_id} awaits a human:")
        click.echo(
            f"  evidence authorize {summary.decision_id} --key KEY_FILE (--revise TEXT | --abandon)"
        )
        click.echo(f"  then: evidence run --resume {inert(summary.plan_id)}")
    elif summary.halt and summary.state != "applied":
        halt = summary.halt
        click.echo(inert(f"halt {halt['halt_type']} ({halt['raw_halt_type']}): {halt['reason']}"))
    if failures:
        click.echo("failed in the last validation run:")
        for failure in failures:
            for line in failure_lines(failure):
                click.echo(inert("  " + line, multiline=True))
    click.echo(
        f"events {summary.positions[0]}..{summary.positions[1]}; verify: "
        f"{'ok' if summary.verify_ok else 'FAILED'} (tree head {summary.tree_head})"
    )
    click.echo(f"ledger {inert(summary.ledger)}")


@click.command("run")
@click.argument("plan_file", required=False, type=click.Path(path_type=Path))
@click.option(
    "--resume", "resume_id", metavar="PLAN_ID", help="Continue a plan after a human decision."
)
@click.option("--plan-id", help="Run the file under another plan id.")
@click.option(
    "--in-place",
    is_flag=True,
    help="Run a shipped example on its own files (default: on a copy).",
)
@workdir_option
@db_option
@json_option
def run(
    plan_file: Path | None,
    resume_id: str | None,
    plan_id: str | None,
    in_place: bool,
    as_json: bool,
) -> None:
    """Drive a whole plan from PLAN_FILE: gates, tools, Apply.

    Registers what the file declares, then runs the plan: gates, real tools in a
    sandbox, validations, the failure loop and Apply (docs/plan-files.md). A shipped
    example (examples/NAME/plan.yaml) runs on a copy of its directory, so its Apply
    never rewrites the example; --in-place runs it on its own files.

    \b
    Examples:
      evidence run examples/green-after-fix/plan.yaml
      evidence run --resume green-after-fix
    """
    from commands.plane.driver import resume, run_plan_file

    if (plan_file is None) == (resume_id is None):
        fail("give PLAN_FILE or --resume PLAN_ID")
    say = _say_factory(as_json)
    plane = open_plane(create=resume_id is None)
    if resume_id is not None:
        summary = resume(plane, resume_id, say=say)
    else:
        assert plan_file is not None  # exactly one of the two was given (checked above)
        example = None if in_place else _shipped_example(plan_file)
        if example is None:
            summary = run_plan_file(plane, plan_file, plan_id=plan_id, say=say)
        else:
            copies = Path(tempfile.mkdtemp(prefix="evidence-example-"))
            start = plane.store.head().size
            try:
                plan_file = _copy_example(example, copies) / plan_file.name
                say("example", f"running a copy of {example.name} in {plan_file.parent}")
                summary = run_plan_file(plane, plan_file, plan_id=plan_id, say=say)
            except BaseException:
                # Refused (or stopped) before the plan was recorded: nothing refers to the
                # copy, so it goes. After that the plan's events name it: it stays.
                if plane.store.head().size == start:
                    shutil.rmtree(copies, ignore_errors=True)
                raise
    failures = _failures(plane, summary)
    if as_json:
        emit_json({"run": {**summary.to_json(), "failures": failures}})
    else:
        _print_summary(summary, failures)
    if summary.state != "applied":
        click.get_current_context().exit(1)


@click.command("demo")
@click.option(
    "--keep",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep the demo's project, sandbox and ledger in DIR.",
)
@click.option(
    "--db",
    "db_option_",
    default=None,
    metavar="URL",
    help="Ledger URL (default: a fresh SQLite file in the demo directory). A ledger "
    "given here keeps the demo's events: a ledger is append-only.",
)
def demo(keep: Path | None, db_option_: str | None) -> None:
    """Run the green-after-fix example on a fresh SQLite ledger.

    Then shows the plan's history and the verify result. Without --keep everything
    lives in a temporary directory, removed at the end. With --keep DIR the demo's
    files stay in DIR; running it again there starts it over. With --db URL the demo's
    events go to that ledger and stay there (under a fresh plan id if the demo ran
    there before); only its files are temporary.

    \b
    Examples:
      evidence demo
      evidence demo --keep ./demo
    """
    from ulid import ULID

    from commands.auditor.history import summarize
    from commands.plane.driver import run_plan_file
    from commands.rules.plan_runs import plan_history

    source = examples_dir() / "green-after-fix"
    if not (source / "plan.yaml").is_file():
        fail(f"the example {source} is missing: this installation is incomplete")
    with tempfile.TemporaryDirectory(prefix="evidence-demo-") as scratch:
        root = keep.resolve() if keep else Path(scratch)
        if keep is not None:
            _reset_kept_demo(root)
        target = _copy_example(source, root)
        url = db_option_ or f"sqlite:///{root / DEMO_DB}"
        meta = click.get_current_context().find_root().meta
        meta["evidence.db"], meta["evidence.workdir"] = url, root / "work"
        plane = open_plane(create=True)
        try:
            plan_id = None
            if db_option_ is not None and plane.store.read_stream(f"plan:{source.name}"):
                plan_id = f"{source.name}-{ULID()}"  # the demo ran in this ledger before
            summary = run_plan_file(
                plane, target / "plan.yaml", plan_id=plan_id, say=_say_factory(False)
            )
            click.echo("\nplan history:")
            for event in plan_history(plane.store, summary.plan_id):
                click.echo(
                    f"  {event.position:>4}  {event.type:<30} {inert(summarize(event.payload))}"
                )
            _print_summary(summary, _failures(plane, summary))
        finally:
            plane.close()
        if keep is not None:
            click.echo(f"demo kept in {inert(root)}: the ledger is {inert(url)}")
        elif db_option_ is not None:
            click.echo(
                "the demo's files were temporary: removed. Its events stay in the ledger "
                f"{inert(url)} (plan {inert(summary.plan_id)}): a ledger is append-only, "
                "nothing is removed from it"
            )
        else:
            click.echo(
                "the demo's files and ledger were temporary: removed (keep them with --keep DIR)"
            )
    if summary.state != "applied":
        click.get_current_context().exit(1)


DEMO_DB = "demo.db"


@click.command("examples")
@click.argument("directory", required=False, default="examples", type=click.Path(path_type=Path))
def examples(directory: Path) -> None:
    """Copy the shipped examples into a directory.

    Into DIRECTORY (./examples by default): the plan files (green-after-fix, escalation,
    strict-output-deviation, actor-graph) and quickstart.py, as a checkout has them,
    so the README's commands run after a
    plain install: `evidence run examples/green-after-fix/plan.yaml`, `python
    examples/quickstart.py`. A DIRECTORY that holds anything is refused (nothing is
    overwritten).

    \b
    Examples:
      evidence examples
      evidence examples ~/evidence-examples
    """
    source = examples_dir()
    shipped = sorted(p for p in source.iterdir() if not p.name.startswith((".", "__")))
    if not shipped:
        fail(f"the examples in {source} are missing: this installation is incomplete")
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        fail(f"{inert(directory)} exists and is not an empty directory: nothing was copied")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for item in shipped:
            if item.is_dir():
                _copy_example(item, directory)
            else:
                shutil.copy2(item, directory / item.name)
    except OSError as exc:
        fail(f"cannot copy the examples into {inert(directory)}: {exc.strerror or exc}")
    names = ", ".join(p.name for p in shipped)
    click.echo(f"copied the examples into {inert(directory)}: {names}")


def _reset_kept_demo(root: Path) -> None:
    """A rerun of ``demo --keep DIR`` starts over: the previous demo's ledger, key, state
    and copy in DIR go (nothing else in DIR is touched)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("green-after-fix", "work", f"{DEMO_DB}.state"):
        if (root / name).is_dir():
            shutil.rmtree(root / name)
    for stale in root.glob(f"{DEMO_DB}*"):
        if stale.is_file():
            stale.unlink()
