"""One identity per resource: every spelling of a directory — `repo`, `repo/`, `repo/.`,
`./repo`, a symlink to it — is its canonical absolute path, so an attachment on one
spelling binds a plan created on any other. Names (`repo:api`) are kept as given."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from commands.names import check_resource
from commands.plane import CommandRefused, Plane
from commands.plane.attachments import attach
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_validation


def test_every_spelling_of_a_directory_is_one_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    os.symlink(repo, tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    canonical = str(repo.resolve())
    for spelling in (
        "repo",
        "repo/",
        "repo/.",
        "./repo",
        "link",
        "link/",
        str(repo),
        "../" + tmp_path.name + "/repo",
    ):
        assert check_resource(spelling) == canonical, spelling
    assert check_resource("repo:api") == "repo:api"
    assert check_resource("not-there") == "not-there"  # a name: nothing on disk by it


@pytest.mark.parametrize("spelling", ["repo/.", "repo/", "link"])
def test_a_plan_on_another_spelling_binds_the_operators_attachment(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelling: str
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    os.symlink(repo, tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    with Plane.open(db_url) as plane:
        register_validation(plane, {"name": "gate", "mode": "required", "command": ["true"]})
        attach(plane, "gate", resource="repo")
        doc = create_plan(plane, "P-1", project="api", resources=[spelling], config={})
        assert doc.resources == [str(repo.resolve())]
        record_strategy(plane, "P-1", "work")
        pinned = enter_execute(plane, "P-1").binding
        assert [b.validation for b in pinned] == ["gate"]


def test_two_spellings_of_one_resource_are_one_resource(db_url: str, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    with Plane.open(db_url) as plane, pytest.raises(CommandRefused, match="listed twice"):
        create_plan(plane, "P-1", project="api", resources=[str(repo), f"{repo}/."], config={})
