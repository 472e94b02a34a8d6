"""Names never become paths: plan ids, fix paths and symlinks are confined, and a name
that would leave the work directory or a resource is refused before anything is
appended (exit 2, one error line)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import ledger
from commands.names import check_identifier, check_relative_path
from commands.plane import CommandRefused
from tests.helpers import REPO, invoke

EXAMPLES = REPO / "examples"


@pytest.mark.parametrize(
    "name", ["x/./../../victim", "a/../b", "a//b", "a/.", "a/..", "a\x00b", "a\nb", "../x", "/abs"]
)
def test_identifiers_that_read_like_climbing_paths_are_refused(name: str) -> None:
    with pytest.raises(CommandRefused, match="invalid plan id"):
        check_identifier(name, "plan id")


@pytest.mark.parametrize(
    "path", ["../../../pwned.txt", "/etc/passwd", "a/../../b", "a\x00b", "a\x1b[2J", "", "a\\..\\b"]
)
def test_fix_paths_are_relative_and_stay_inside(path: str) -> None:
    with pytest.raises(CommandRefused, match="fix path"):
        check_relative_path(path, "fix path")


def _copy_example(tmp_path: Path) -> Path:
    root = tmp_path / "green"
    shutil.copytree(
        EXAMPLES / "green-after-fix",
        root,
        ignore=shutil.ignore_patterns("__pycache__", ".evidence*"),
    )
    return root


def _size(url: str) -> int:
    with ledger.open(url, create=True) as store:
        return store.head().size


def test_a_climbing_plan_id_is_refused_before_anything_is_appended(tmp_path: Path) -> None:
    root = _copy_example(tmp_path)
    url = f"sqlite:///{tmp_path / 'e.db'}"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    before = _size(url)
    result = invoke(
        "run",
        str(root / "plan.yaml"),
        "--plan-id",
        "x/./../../victim",
        "--workdir",
        str(tmp_path / "runs"),
        "--db",
        url,
    )
    assert result.exit_code == 2 and result.stderr.count("error:") == 1, result.output
    assert "invalid plan id" in result.stderr and "Traceback" not in result.output
    assert _size(url) == before
    assert (victim / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("bad", ["../../../pwned.txt", "/tmp/pwned.txt", "link/pwned.txt"])
def test_a_fix_path_leaving_the_resource_is_refused_before_anything_is_appended(
    tmp_path: Path, bad: str
) -> None:
    root = _copy_example(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, root / "project" / "link")  # a symlink inside that points out
    text = (root / "plan.yaml").read_text().replace("calc.py: |", f"{bad}: |", 1)
    (root / "plan.yaml").write_text(text)
    url = f"sqlite:///{tmp_path / 'e.db'}"
    before = _size(url)
    result = invoke(
        "run", str(root / "plan.yaml"), "--workdir", str(tmp_path / "runs"), "--db", url
    )
    assert result.exit_code == 2 and result.stderr.count("error:") == 1, result.output
    assert "Traceback" not in result.output
    assert _size(url) == before
    assert not list(outside.iterdir()) and not (tmp_path / "pwned.txt").exists()


def test_run_directories_are_named_by_digest(tmp_path: Path) -> None:
    root = _copy_example(tmp_path)
    url = f"sqlite:///{tmp_path / 'e.db'}"
    result = invoke(
        "run",
        str(root / "plan.yaml"),
        "--plan-id",
        "team/green",
        "--workdir",
        str(tmp_path / "runs"),
        "--db",
        url,
    )
    assert result.exit_code == 0, result.output
    made = [
        p.relative_to(tmp_path / "runs")
        for p in (tmp_path / "runs").rglob("*")
        if p.is_dir() and "green" not in p.parts[-1]
    ]
    assert made and not [p for p in made if "team" in str(p)]
    [ledger_dir] = (tmp_path / "runs" / "sandboxes").iterdir()
    names = {p.name for p in ledger_dir.iterdir()} | {
        p.name for p in (ledger_dir / "runs").iterdir()
    }
    assert all(len(n) == 32 for n in names - {"runs"}), names
