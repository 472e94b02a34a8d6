"""Apply is crash-safe and idempotent, and the real files are the ones the ledger says.

A real `apply` in a child process is killed with SIGKILL at each point — before the
change set is recorded, after it, in the middle of writing the files, before
``plan.applied`` — on SQLite and PostgreSQL; then ``apply --resume`` (or a new apply,
when nothing was recorded) finishes it: the real files equal the sandbox and the ledger
says applied exactly once.
"""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from commands.auditor.audit import audit
from commands.plane import CommandRefused, Plane
from commands.plane.lifecycle import apply_plan, complete_apply
from commands.plane.validation_runs import validate_plan
from tests._worker_ledger import apply_and_die
from tests.helpers import invoke, status_plan, work


def _passing_with_changes(plane: Plane, tmp_path: Path) -> tuple[Path, str]:
    """P-1 passed, with three files changed or added in its sandbox; the token."""
    project = status_plan(plane, tmp_path, {})
    sandbox = work(plane)
    (sandbox / "status.txt").write_text("good\n")
    (sandbox / "src").mkdir()
    (sandbox / "src" / "new.py").write_text("print('new')\n")
    (sandbox / "notes.md").write_text("# notes\n")
    report = validate_plan(plane, "P-1")
    assert report.outcome == "pass" and report.token
    return project, report.token


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _count(plane: Plane, type_: str) -> int:
    return sum(1 for e in plane.store.read_stream("plan:P-1") if e.type == type_)


def test_apply_writes_the_sandbox_and_records_what_it_wrote(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        project, token = _passing_with_changes(plane, tmp_path)
        assert (project / "status.txt").read_text() == "bad\n"  # nothing before Apply
        doc = apply_plan(plane, "P-1", token)
        assert _files(project) == _files(work(plane))
        assert sorted(f.path for f in doc.applied.files) == [
            "notes.md",
            "src",
            "src/new.py",
            "status.txt",
        ]
        assert audit(plane.store).ok
        shown = invoke("plan", "show", "P-1", "--db", plane.store.url)
        assert "files written by Apply" in shown.stdout and "src/new.py" in shown.stdout
        clean = invoke("audit", "--plan", "P-1", "--files", str(project), "--db", plane.store.url)
        assert clean.exit_code == 0, clean.output
        (project / "src" / "new.py").write_text("print('edited after Apply')\n")
        edited = invoke(
            "audit", "--plan", "P-1", "--files", str(project), "--json", "--db", plane.store.url
        )
        assert edited.exit_code == 1
        [violation] = json.loads(edited.stdout)["violations"]
        assert violation["invariant"] == "files" and "src/new.py" in violation["expected"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "kill_at", ["changes_computed", "changes_recorded", "file_written", "files_written"]
)
def test_apply_killed_at_any_point_is_completed_once(
    db_url: str, tmp_path: Path, kill_at: str
) -> None:
    with Plane.open(db_url) as plane:
        project, token = _passing_with_changes(plane, tmp_path)
        sandbox_files = _files(work(plane))
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=apply_and_die, args=(db_url, "P-1", token, kill_at))
    child.start()
    child.join(120)
    assert child.exitcode == -9, f"the apply was not killed at {kill_at}"
    with Plane.open(db_url) as plane:
        if kill_at == "changes_computed":  # nothing recorded: Apply never began
            assert _count(plane, "plan.changes_recorded") == 0
            with pytest.raises(CommandRefused, match="no Apply under way"):
                complete_apply(plane, "P-1")
            apply_plan(plane, "P-1", token)
        else:
            report = audit(plane.store)
            assert [v.invariant for v in report.violations] == ["apply_incomplete"]
            resumed = invoke("apply", "P-1", "--resume", "--db", plane.store.url)
            assert resumed.exit_code == 0, resumed.output
            complete_apply(plane, "P-1")  # idempotent: a second resume changes nothing
        assert _files(project) == sandbox_files
        assert _count(plane, "plan.changes_recorded") == 1
        assert _count(plane, "plan.applied") == 1
        assert audit(plane.store).ok


def test_a_forged_change_set_cannot_write_outside_the_resource(db_url: str, tmp_path: Path) -> None:
    """The agent holds the token, appends its consumption and a change set of its own
    with a climbing path, then asks the plane to finish the Apply."""
    import base64
    import hashlib

    from commands.rules.signing import read_token
    from ledger.canonical import canonical_json
    from ledger.events import ChangesRecorded, FileChange, TokenConsumed
    from tests.helpers import forge

    with Plane.open(db_url) as plane:
        project, token = _passing_with_changes(plane, tmp_path)
        token_id = read_token(token).token_id
        data = b"pwned"
        change = FileChange(
            resource=str(project),
            path="../../escaped.txt",
            sha256=hashlib.sha256(data).hexdigest(),
            mode=0o644,
        )
        blob = canonical_json(
            [
                {
                    "resource": change.resource,
                    "path": change.path,
                    "sha256": change.sha256,
                    "mode": change.mode,
                    "content": base64.b64encode(data).decode(),
                }
            ]
        )
        forge(
            plane.store,
            "plan:P-1",
            TokenConsumed(plan_id="P-1", token_id=token_id),
            ChangesRecorded(
                plan_id="P-1",
                token_id=token_id,
                changes_sha256=hashlib.sha256(blob).hexdigest(),
                changes=[change],
            ),
            blobs=(blob,),
        )
        with pytest.raises(CommandRefused, match="change set is exactly the validated trees"):
            complete_apply(plane, "P-1")
        assert not (tmp_path.parent / "escaped.txt").exists()
        assert not (tmp_path / "escaped.txt").exists()
        assert _count(plane, "plan.applied") == 0
