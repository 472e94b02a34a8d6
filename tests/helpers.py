"""Small builders shared by the tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ledger import NewEvent
from ledger.events import PlanCreated, StrategyRecorded


def plan_created(plan_id: str = "P-1", **kw: object) -> NewEvent:
    return NewEvent(
        payload=PlanCreated(plan_id=plan_id, project="proj", resources=["repo:api"]), **kw
    )


def strategy(plan_id: str = "P-1", text: str = "fix the tests", revision: int = 0) -> NewEvent:
    return NewEvent(payload=StrategyRecorded(plan_id=plan_id, revision=revision, strategy=text))


def run_cli(*args: str, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real ``evidence`` command in a subprocess (EVIDENCE_DB unset unless given)."""
    full_env = {k: v for k, v in os.environ.items() if k != "EVIDENCE_DB"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "commands.cli", *args],
        capture_output=True, text=True, cwd=cwd, env=full_env, timeout=120,
    )


def assert_refused(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Exit 2, exactly one ``error: ...`` line naming the problem, no traceback."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
