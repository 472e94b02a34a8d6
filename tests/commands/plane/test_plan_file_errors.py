"""Plan files and resources: a mistake anywhere in a plan file — a registry entry, the
plan's settings, an attachment — is refused naming the file, the key path and (YAML) the
line; and a resource written as a path must exist (a name such as ``repo:api`` is never
looked up)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from commands.names import looks_like_path
from commands.plane import CommandRefused, Plane
from commands.plane.plans import create_plan
from tests.helpers import REPO, assert_refused, run_cli

EXAMPLE = REPO / "examples" / "green-after-fix"


@pytest.fixture
def plan_dir(tmp_path: Path) -> Path:
    target = tmp_path / "example"
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize(
    ("old", "new", "key", "needle", "says"),
    [
        ("timeout: 60", 'timeout: "60"', "tools.0.timeout", 'timeout: "60"', "got `str`"),
        (
            "retry_limit: 3",
            'retry_limit: "3"',
            "plan.global_config.retry_limit",
            "global_config",
            "`int`",
        ),
        ("mode: required", "mode: 3", "validations.0.mode", "mode: 3", "got `int`"),
        (
            "[python, checks/lint.py]",
            '[python, "{x"]',
            "validations.1.command.1",
            '"{x"',
            "bad template",
        ),
        (
            "resources: [project]",
            "resources: [./projectx]",
            "plan.resources.0",
            "resources:",
            "does not exist",
        ),
        (
            "{validation: tests-pass, resource: project}",
            "{validation: tests-pass, resource: src/x}",
            "attachments.0.resource",
            "resource: src/x",
            "does not exist",
        ),
        (
            "{validation: tests-pass, resource: project}",
            "{validation: no-such-validation, resource: project}",
            "attachments.0",
            "no-such-validation",
            "unknown validation",
        ),
    ],
)
def test_a_mistake_names_the_file_the_key_and_the_line(
    plan_dir: Path, sqlite_url: str, old: str, new: str, key: str, needle: str, says: str
) -> None:
    plan = plan_dir / "plan.yaml"
    text = plan.read_text()
    assert old in text
    text = text.replace(old, new, 1)
    plan.write_text(text)
    line = _line_of(text, needle)
    done = run_cli("run", str(plan), "--db", sqlite_url)
    assert_refused(done, f"{plan}: key `{key}` (line {line}): ", says)
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()  # nothing created


def test_a_toml_plan_file_names_the_file_and_the_key(tmp_path: Path, sqlite_url: str) -> None:
    (tmp_path / "project").mkdir()
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[plan]\nid = "t-1"\nproject = "p"\nresources = ["project"]\n\n'
        '[[tools]]\nname = "t"\ncommand = ["true"]\ntimeout = "60"\n\n'
        '[[agent.strategies]]\nstrategy = "s"\n[[agent.strategies.attempts]]\nsteps = []\n'
    )
    done = run_cli("run", str(plan), "--db", sqlite_url)
    assert_refused(done, f"{plan}: key `tools.0.timeout`: ", "got `str`")


# -- a resource written as a path must exist ------------------------------------------------


@pytest.mark.parametrize(
    ("resource", "is_path"),
    [
        ("./src", True),
        ("../src", True),
        ("/srv/app", True),
        ("~/app", True),
        (".", True),
        ("src/api", True),
        ("repo:api", False),
        ("repo:api/sub", False),
        ("https://example.org/x", False),
        ("project", False),
    ],
)
def test_which_resources_are_written_as_paths(resource: str, is_path: bool) -> None:
    assert looks_like_path(resource) is is_path


def test_plan_create_refuses_a_missing_path(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_cli("init", "--db", sqlite_url).returncode == 0
    for resource in ("./src", "src/api", str(tmp_path / "gone")):
        done = run_cli(
            "plan", "create", "P-1", "--project", "a", "--resource", resource, "--db", sqlite_url
        )
        assert_refused(done, repr(resource), "is a path that does not exist")
    # names are names; an existing path is its canonical identity
    (tmp_path / "src").mkdir()
    made = run_cli(
        "plan", "create", "P-1", "--project", "a", "--resource", "./src",
        "--resource", "repo:api", "--resource", "project", "--json", "--db", sqlite_url,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert re.search(r'"resources":\["[^"]*/src","repo:api","project"\]', made.stdout)


def test_the_python_api_refuses_a_missing_path(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        with pytest.raises(CommandRefused, match="does not exist"):
            create_plan(plane, "P-1", project="a", resources=[str(tmp_path / "missing")])
        assert plane.store.head().size == 0
        create_plan(plane, "P-1", project="a", resources=["repo:api"])
