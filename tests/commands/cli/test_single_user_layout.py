"""The developer's single-user layout says so (docs/service.md, "What the single-user
developer mode does not protect").

The layout: the plane key where ``evidence init`` puts it by default (beside the SQLite
file; ``$EVIDENCE_PLANE_KEY`` unset) and the running user's. Whatever else runs as that
user — the agent a developer starts — reads it and the operator key beside it, makes
itself operator and approver, and ``audit`` cannot tell. Every command says so in one
line on stderr, and ``evidence serve`` refuses the layout unless told
``--insecure-single-user``. (Every other test names its key's place: conftest.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import assert_refused, run_cli

NOTE = "note: single-user layout: the plane key "


@pytest.fixture
def developer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A ledger made by `evidence init` in the default layout: its URL."""
    monkeypatch.delenv("EVIDENCE_PLANE_KEY")
    monkeypatch.delenv("EVIDENCE_OPERATOR_KEY", raising=False)
    url = f"sqlite:///{tmp_path / 'evidence.db'}"
    made = run_cli("init", "--db", url)
    assert made.returncode == 0, made.stderr
    assert made.stderr.count(NOTE) == 1, made.stderr
    assert f"{tmp_path / 'evidence.db.plane-key'}" in made.stderr
    return url


def test_every_command_says_it_once_on_stderr(developer: str) -> None:
    for argv in (["plan", "list"], ["events", "--json"], ["verify"], ["plan", "list", "--json"]):
        done = run_cli(*argv, "--db", developer)
        assert done.returncode == 0, (argv, done.stderr)
        lines = done.stderr.splitlines()
        assert [line for line in lines if line.startswith("note:")] == [
            line for line in lines if NOTE in line
        ]
        assert sum(NOTE in line for line in lines) == 1, (argv, done.stderr)
        assert "an agent too, can sign as the plane and the operator" in done.stderr
        assert NOTE not in done.stdout  # --json stays one document
    json.loads(run_cli("plan", "list", "--json", "--db", developer).stdout)


def test_a_named_key_place_or_another_owner_is_not_the_layout(
    developer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from commands.rules.signing import single_user_layout

    assert single_user_layout(developer) == tmp_path / "evidence.db.plane-key"
    monkeypatch.setenv("EVIDENCE_PLANE_KEY", str(tmp_path / "evidence.db.plane-key"))
    assert single_user_layout(developer) is None
    assert NOTE not in run_cli("plan", "list", "--db", developer).stderr
    monkeypatch.delenv("EVIDENCE_PLANE_KEY")
    if os.geteuid() == 0:
        os.chown(tmp_path / "evidence.db.plane-key", 65534, 65534)
        assert single_user_layout(developer) is None  # the service's user's, not this one's


def test_the_hook_tells_the_agent_nothing_of_it(developer: str) -> None:
    """A hook's stderr is what the agent reads: the note is for people."""
    done = run_cli("hook", "pre-tool", "--plan", "P-1", "--db", developer, input="{}")
    assert done.returncode == 2 and NOTE not in done.stderr


def test_a_real_serve_refuses_the_layout_unless_told_the_risk(developer: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("EVIDENCE_DB", "EVIDENCE_PLANE_KEY")}
    refused = subprocess.run(
        [sys.executable, "-m", "commands.cli", "serve", "--db", developer, "--port", "0"],
        capture_output=True, text=True, env=env, timeout=30,
    )  # fmt: skip
    assert refused.returncode == 2 and refused.stdout == "", refused.stderr
    assert refused.stderr.count("error:") == 1
    assert "developer's single-user layout" in refused.stderr
    assert "--insecure-single-user" in refused.stderr


def test_serve_knowingly_in_the_layout(developer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    served: list[bool] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda *_a, **_k: served.append(True))
    done = run_cli("serve", "--db", developer, "--port", "0", "--insecure-single-user")
    assert done.returncode == 0 and served == [True], done.stderr
    assert "note: --insecure-single-user" in done.stderr
    assert_refused(run_cli("serve", "--db", developer, "--port", "0"), "single-user layout")
