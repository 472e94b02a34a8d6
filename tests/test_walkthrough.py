"""The auditor's walk-through in docs/auditing.md, run exactly as written there: keep a
checkpoint, let the plane append, export a plan's bundle, then verify, audit, replay and
report offline with no database reachable. The blocks are read from the doc, so the doc
cannot drift from what works."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from commands.plane import Plane
from commands.plane.plans import create_plan
from tests.helpers import applied_plan

DOC = Path(__file__).resolve().parent.parent / "docs" / "auditing.md"


def walkthrough_blocks() -> list[str]:
    section = DOC.read_text(encoding="utf-8").split("## Walk-through", 1)[1]
    section = section.split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)


def run_block(block: str, cwd: Path, db: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("EVIDENCE_DB", "DB")}
    # the `evidence` of this interpreter's environment, as `pip install -e .` made it
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if db is None:
        # offline: any database the commands tried to open would be created here
        env["EVIDENCE_DB"] = f"sqlite:///{cwd / 'must-not-exist.db'}"
    else:
        env["DB"] = db
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_the_documented_walkthrough_runs(db_url: str, tmp_path: Path) -> None:
    keep, plane_side, auditor = walkthrough_blocks()
    assert "evidence checkpoint" in keep and "export --bundle" in plane_side
    for command in ("verify --bundle", "audit --bundle", "replay", "report"):
        assert command in auditor
    work = tmp_path / "work"
    work.mkdir()
    with Plane.open(db_url) as plane:
        applied_plan(plane, tmp_path)
        kept = run_block(keep, work, db_url)
        assert kept.returncode == 0, kept.stderr
        create_plan(plane, "P-2", project="web", resources=[str(tmp_path)], config={})
        exported = run_block(plane_side, work, db_url)
        assert exported.returncode == 0, exported.stderr
        size = plane.store.head().size

    offline = run_block(auditor, work, None)
    assert offline.returncode == 0, offline.stdout + offline.stderr
    assert not (work / "must-not-exist.db").exists()
    assert "extends the kept checkpoint" in offline.stdout
    at_12 = json.loads((work / "p1-at-12.json").read_text())
    assert at_12["as_of"] == 12 and at_12["steps"][-1]["position"] <= 12
    html = (work / "p1.html").read_text()
    assert "P-1" in html and str(size) in html

    # the same walk on a bundle with one byte changed stops at verify, with the verdict
    data = bytearray((work / "p1.bundle").read_bytes())
    data[len(data) * 2 // 3] ^= 0x01
    (work / "p1.bundle").write_bytes(bytes(data))
    broken = run_block(auditor, work, None)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "FAILED" in broken.stdout and "Traceback" not in broken.stderr
