"""The conventions people expect of a CLI, and saying what the code does:
``evidence completion bash|zsh|fish``; the docs a ``--help`` names reachable from an
installed package (``evidence docs``); ``NO_COLOR`` honoured fully (no bold either);
recorded calls shown without a fake exit code; audit invariants with names a person
reads; the seed's candidate schema id accepted; and docs/cli.md saying what a malformed
validation return is."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from commands.auditor.audit import INVARIANTS
from commands.plane import Plane
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool
from commands.plane.reviews import start_review, submit_candidate
from tests.helpers import REPO, assert_refused, run_cli

ROOT = REPO


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


# -- completion ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shell", "marker"),
    [("bash", "complete -o nosort -F"), ("zsh", "#compdef evidence"), ("fish", "complete")],
)
def test_completion_prints_the_shells_script(shell: str, marker: str) -> None:
    done = run_cli("completion", shell)
    assert done.returncode == 0, done.stderr
    assert marker in done.stdout and "_EVIDENCE_COMPLETE" in done.stdout


def test_the_completion_script_completes(tmp_path: Path) -> None:
    """What the script asks the program (``_EVIDENCE_COMPLETE=bash_complete``) names our
    verbs: the printed script works with the installed command."""
    env = {
        "_EVIDENCE_COMPLETE": "bash_complete",
        "COMP_WORDS": "evidence compl",
        "COMP_CWORD": "1",
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "-m", "commands.cli"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert "plain,completion" in done.stdout.splitlines(), done.stdout + done.stderr


def test_completion_refuses_other_shells() -> None:
    assert_refused(run_cli("completion", "tcsh"), "tcsh")


# -- docs from an installed package --------------------------------------------------------


def test_every_doc_a_help_names_is_an_evidence_docs_page() -> None:
    listed = json.loads(run_cli("docs", "--json").stdout)["docs"]
    names = {d["name"] for d in listed}
    assert {"cli", "concepts", "plan-files", "auditing", "analytics"} <= names
    helps = "\n".join(p.read_text() for p in (ROOT / "commands" / "cli").glob("*.py"))
    for named in set(re.findall(r"docs/([a-z-]+)\.md", helps)):
        assert named in names, named
    page = run_cli("docs", "plan-files")
    assert page.returncode == 0 and page.stdout.startswith("# Plan files")
    assert Path(run_cli("docs", "cli", "--path").stdout.strip()).is_file()
    assert_refused(run_cli("docs", "nope"), "no page 'nope'")
    assert "evidence docs" in run_cli("--help").stdout


def test_the_wheel_ships_the_docs() -> None:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"]["commands.docs"] == "docs"
    assert "*.md" in config["package-data"]["commands.docs"]


# -- NO_COLOR ------------------------------------------------------------------------------


def test_no_color_means_no_bold_header_either(monkeypatch: pytest.MonkeyPatch) -> None:
    from commands.cli.common import print_table

    out = _Tty()
    monkeypatch.setattr(sys, "stdout", out)
    print_table(["a", "b"], [["1", "2"]])
    assert "\x1b[" in out.getvalue()  # a terminal gets a bold header ...
    monkeypatch.setenv("NO_COLOR", "1")
    out = _Tty()
    monkeypatch.setattr(sys, "stdout", out)
    print_table(["a", "b"], [["1", "2"]])
    assert "\x1b" not in out.getvalue()  # ... unless NO_COLOR


def test_no_color_reaches_rich_and_the_run_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.table import Table

    from commands.cli.common import console
    from commands.cli.driver import _say_factory

    monkeypatch.setenv("NO_COLOR", "1")
    out = _Tty()
    monkeypatch.setattr(sys, "stdout", out)
    table = Table("header")
    table.add_row("cell")
    console().print(table)
    _say_factory(False)("validate", "tests [required]: pass")
    assert "header" in out.getvalue() and "validate" in out.getvalue()
    assert "\x1b" not in out.getvalue()


# -- recorded calls ------------------------------------------------------------------------


def test_a_recorded_call_shows_no_exit_code(sqlite_url: str, tmp_path: Path) -> None:
    with Plane.open(sqlite_url) as plane:
        register_tool(
            plane,
            {
                "name": "search",
                "command": ["grep", "x"],
                "output_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
            },
        )
        create_plan(plane, "P-1", project="api", resources=["repo:api"])
        record_strategy(plane, "P-1", "look")
        enter_execute(plane, "P-1")
    called = run_cli(
        "call", "P-1", "--tool", "search", "--params", "{}", "--record-output", '{"n": 1}',
        "--db", sqlite_url,
    )  # fmt: skip
    assert called.returncode == 0, called.stderr
    assert "recorded by the orchestrator" in called.stdout
    assert "exit None" not in called.stdout and " ms" not in called.stdout
    history = run_cli("plan", "history", "P-1", "--db", sqlite_url)
    assert "tool search (recorded by the orchestrator)" in history.stdout
    assert "exit None" not in history.stdout


# -- audit names ---------------------------------------------------------------------------


def test_every_invariant_has_a_name_a_person_reads() -> None:
    assert not [name for name in INVARIANTS if re.fullmatch(r"INV\d+", name)]
    assert {"token_from_passing_run", "blocker_not_overridable"} <= set(INVARIANTS)
    doc = (ROOT / "docs" / "auditing.md").read_text()
    # the design's ids stay, as aliases in the docs
    assert "| `token_from_passing_run` | `INV1` |" in doc
    assert "| `blocker_not_overridable` | `INV3` |" in doc
    for name in INVARIANTS:
        assert f"`{name}`" in doc, name


# -- saying what the code does -------------------------------------------------------------


def test_docs_say_a_malformed_return_is_no_verdict() -> None:
    cli = (ROOT / "docs" / "cli.md").read_text()
    assert "counts as\n  `passed: false`" not in cli and "counts as `passed: false`" not in cli
    assert "recorded with **no verdict**" in cli and "`validator_error`" in cli


def test_the_contracts_candidate_schema_id_is_accepted(sqlite_url: str) -> None:
    request = {
        "objective": "review the retry loop",
        "background": [],
        "changeSummary": "retries now back off",
        "scope": ["src/retry.py"],
        "acceptanceCriteria": ["no infinite loop"],
        "verification": {"status": "not_run", "reason": "no tests yet"},
    }
    report = {"findings": [], "verified": [], "limitations": []}
    with Plane.open(sqlite_url) as plane:
        task = start_review(plane, request)
        for reviewer, version in (
            ("seed", "pi-background-tasks.fusion-validation-candidate.v1"),
            ("ours", "fusion-validation-candidate.v1"),
            ("other", "something-else.v1"),
        ):
            done = submit_candidate(
                plane, task, {"schema_version": version, **report}, reviewer=reviewer
            )
            assert done.valid is (reviewer != "other"), (version, done.errors)
