"""What an approver decides on (``escalations.pending_evidence``): each pending
escalation with its last run's failures and the changes that run judged against the
plan's snapshot at Execute, a unified diff of each changed text file — and no diff of
bytes that are not the ones the run judged."""

from __future__ import annotations

import hashlib
from pathlib import Path

from commands.plane import Plane
from commands.plane.escalations import pending_evidence
from commands.plane.validation_runs import validate_plan
from tests.helpers import invoke, status_plan, work

CONFIG = {"retry_limit": 0, "max_strategy_revisions": 0}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_an_approver_sees_the_changes_the_failing_run_judged(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        project = status_plan(plane, tmp_path, CONFIG)
        (project / "old.txt").write_text("x\n")  # after Execute's snapshot: never judged
        sandbox = work(plane)
        (sandbox / "status.txt").write_text("still bad\n")
        (sandbox / "notes.md").write_text("why\n")
        (sandbox / "blob.bin").write_bytes(b"\xff\xfe\x00")
        assert validate_plan(plane, "P-1").outcome == "escalate"
        [pending] = pending_evidence(plane)
    resource = str(project)
    assert pending["changes"] == [
        {
            "resource": resource, "path": "blob.bin", "change": "added", "kind": "file",
            "after": _sha(b"\xff\xfe\x00"), "diff_note": "no diff: not UTF-8 text",
        },
        {
            "resource": resource, "path": "notes.md", "change": "added", "kind": "file",
            "after": _sha(b"why\n"),
            "diff": "--- a/notes.md\n+++ b/notes.md\n@@ -0,0 +1 @@\n+why\n",
        },
        {
            "resource": resource, "path": "status.txt", "change": "modified", "kind": "file",
            "before": _sha(b"bad\n"), "after": _sha(b"still bad\n"),
            "diff": "--- a/status.txt\n+++ b/status.txt\n@@ -1 +1 @@\n-bad\n+still bad\n",
        },
    ]  # fmt: skip
    [failure] = pending["failures"]
    assert failure["validation"] == "status"
    listed = invoke("authorize", "--db", db_url)
    assert listed.exit_code == 0, listed.output
    assert f"  M {resource}/status.txt\n    --- a/status.txt\n" in listed.stdout
    assert "    -bad\n    +still bad\n" in listed.stdout
    assert "status [required]: FAIL" in listed.stdout


def test_no_diff_of_bytes_the_run_did_not_judge(db_url: str, tmp_path: Path) -> None:
    """The agent rewrites its sandbox after the failing run, hoping the approver reads
    a friendlier diff: the change is listed as judged, its diff withheld."""
    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, CONFIG)
        sandbox = work(plane)
        (sandbox / "status.txt").write_text("rm -rf /\n")
        assert validate_plan(plane, "P-1").outcome == "escalate"
        (sandbox / "status.txt").write_text("good\n")
        [pending] = pending_evidence(plane)
    [change] = pending["changes"]
    assert change["after"] == _sha(b"rm -rf /\n")
    assert change["diff_note"] == "no diff: changed on disk since it was recorded"
    assert "diff" not in change
