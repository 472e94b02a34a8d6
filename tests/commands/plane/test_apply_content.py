"""Apply writes only what passed: a token binds the trees its run judged, Apply refuses a
sandbox that changed since, a change set is exactly the validated trees' difference from
the snapshot at Execute (the plane refuses any other, `audit` reports it and never
advises resuming it), and Apply follows no link. Each test is an attack the agent being
gated can make with the CLI, the Python API or the database file."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from commands.auditor.audit import audit
from commands.plane import CommandRefused, Plane
from commands.plane.lifecycle import apply_plan, complete_apply
from commands.plane.validation_runs import validate_plan
from commands.rules.signing import read_token
from ledger.canonical import canonical_json
from ledger.events import ChangesRecorded, FileChange, TokenConsumed
from tests.helpers import forge, invoke, status_plan, work


def _passed(plane: Plane, tmp_path: Path) -> tuple[Path, str]:
    """P-1 passed with status.txt made good in its sandbox; the project and the token."""
    project = status_plan(plane, tmp_path, {})
    (work(plane) / "status.txt").write_text("good\n")
    report = validate_plan(plane, "P-1")
    assert report.outcome == "pass" and report.token
    return project, report.token


def _size(plane: Plane) -> int:
    return plane.store.head().size


def _types(plane: Plane) -> list[str]:
    return [e.type for e in plane.store.read_stream("plan:P-1")]


def test_the_token_carries_the_trees_its_run_judged(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        project, token = _passed(plane, tmp_path)
        started = next(
            e.payload
            for e in plane.store.read_stream("plan:P-1")
            if e.type == "validation.run_started"
        )
        assert read_token(token).trees_sha256 == started.trees_sha256
        trees = json.loads(plane.store.get_blob(started.trees_sha256))
        manifest = trees[str(project)]["manifest"]
        good = hashlib.sha256(b"good\n").hexdigest()
        assert manifest["status.txt"] == ["file", 0o644, good]
        digest = hashlib.sha256(canonical_json(manifest)).hexdigest()
        assert started.resource_digests == {str(project): digest}


def test_a_sandbox_edited_after_the_pass_is_not_applied(db_url: str, tmp_path: Path) -> None:
    """The agent edits the sandbox (the path `plan show` prints) after its token."""
    with Plane.open(db_url) as plane:
        project, token = _passed(plane, tmp_path)
        (work(plane) / "status.txt").write_text("good\nrm -rf /\n")
        (work(plane) / "extra.sh").write_text("never validated\n")
        before = _size(plane)
        result = invoke("apply", "P-1", "--token", token, "--db", plane.store.url)
        assert result.exit_code == 2 and result.stderr.count("error:") == 1, result.output
        assert "changed since it was validated" in result.stderr
        assert "status.txt" in result.stderr and "extra.sh" in result.stderr
        assert _size(plane) == before
        assert (project / "status.txt").read_text() == "bad\n"
        assert not (project / "extra.sh").exists()


def test_a_sandbox_put_back_as_validated_applies(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        project, token = _passed(plane, tmp_path)
        (work(plane) / "status.txt").write_text("evil\n")
        with pytest.raises(CommandRefused, match="changed since it was validated"):
            apply_plan(plane, "P-1", token)
        (work(plane) / "status.txt").write_text("good\n")
        apply_plan(plane, "P-1", token)
        assert (project / "status.txt").read_text() == "good\n"
        assert audit(plane.store).ok


def _forge_changes(plane: Plane, token: str, change: FileChange, data: bytes) -> None:
    token_id = read_token(token).token_id
    blob = canonical_json(
        [
            {
                **json.loads(canonical_json(change_dict(change))),
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


def change_dict(change: FileChange) -> dict[str, object]:
    return {
        "resource": change.resource,
        "path": change.path,
        "sha256": change.sha256,
        "mode": change.mode,
    }


@pytest.mark.parametrize("where", ["resource", "elsewhere"])
def test_a_forged_change_set_after_a_real_pass_is_never_resumed(
    db_url: str, tmp_path: Path, where: str
) -> None:
    """After a real pass the agent appends the token's consumption and a change set of
    its own (content that never passed; into the resource, or any directory)."""
    with Plane.open(db_url) as plane:
        project, token = _passed(plane, tmp_path)
        target = project if where == "resource" else tmp_path / "elsewhere"
        target.mkdir(exist_ok=True)
        data = b"never validated\n"
        change = FileChange(
            resource=str(target),
            path="status.txt",
            sha256=hashlib.sha256(data).hexdigest(),
            mode=0o644,
        )
        _forge_changes(plane, token, change, data)
        resumed = invoke("apply", "P-1", "--resume", "--db", plane.store.url)
        assert resumed.exit_code == 2 and resumed.stderr.count("error:") == 1, resumed.output
        assert "change set is exactly the validated trees" in resumed.stderr
        with pytest.raises(CommandRefused, match="breaks a rule"):
            complete_apply(plane, "P-1")
        assert (project / "status.txt").read_text() == "bad\n"
        assert not (target / "status.txt").exists() or target == project
        report = audit(plane.store)
        found = {v.invariant for v in report.violations}
        assert "change_set" in found and "apply_incomplete" not in found
        assert not any("--resume" in v.expected for v in report.violations)


def test_a_symlink_at_any_temp_name_is_never_written_through(db_url: str, tmp_path: Path) -> None:
    """The old temp file name was predictable (`.status.txt.evidence-apply`): a link
    planted there sent the write outside the resource."""
    with Plane.open(db_url) as plane:
        project, token = _passed(plane, tmp_path)
        victim = tmp_path / "victim.txt"
        victim.write_text("mine\n")
        victim.chmod(0o600)
        os.symlink(victim, project / ".status.txt.evidence-apply")
        apply_plan(plane, "P-1", token)
        assert victim.read_text() == "mine\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600
        assert (project / "status.txt").read_text() == "good\n"
        assert not (project / "status.txt").is_symlink()
        leftovers = [p.name for p in project.iterdir() if p.name.endswith(".evidence-apply")]
        assert leftovers == [".status.txt.evidence-apply"]  # the planted link, untouched


def test_a_symlink_planted_at_the_target_is_refused_not_followed(
    db_url: str, tmp_path: Path
) -> None:
    with Plane.open(db_url) as plane:
        project, token = _passed(plane, tmp_path)
        victim = tmp_path / "victim.txt"
        victim.write_text("mine\n")
        (project / "status.txt").unlink()
        os.symlink(victim, project / "status.txt")
        before = _size(plane)
        result = invoke("apply", "P-1", "--token", token, "--db", plane.store.url)
        assert result.exit_code == 2 and "changed since the plan entered Execute" in result.stderr
        assert _size(plane) == before and victim.read_text() == "mine\n"


def test_a_symlinked_directory_on_the_way_is_refused(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        project = status_plan(plane, tmp_path, {})
        (work(plane) / "src").mkdir()
        (work(plane) / "src" / "new.py").write_text("x = 1\n")
        (work(plane) / "status.txt").write_text("good\n")
        token = validate_plan(plane, "P-1").token
        assert token
        outside = tmp_path / "outside"
        outside.mkdir()
        os.symlink(outside, project / "src")  # planted after Execute, where Apply makes src/
        before = _size(plane)
        with pytest.raises(CommandRefused, match="src"):
            apply_plan(plane, "P-1", token)
        assert not list(outside.iterdir())
        # refused before the point of no return: nothing appended, the token still usable
        assert _size(plane) == before
        assert plane.state("plan:P-1").doc.token.status == "minted"


def test_a_hard_link_in_the_sandbox_is_refused_before_a_call(db_url: str, tmp_path: Path) -> None:
    """A hard link from the sandbox to the real file: a tool writing its sandbox would
    write the real file, even when its output gate then fails."""
    from commands.plane.registry import register_tool

    with Plane.open(db_url) as plane:
        project = status_plan(plane, tmp_path, {})
        register_tool(
            plane,
            {
                "name": "scribble",
                "command": ["python", "-c", "open('status.txt','w').write('owned')"],
                "input_schema": {"type": "object"},
                "output_schema": {"type": "object"},
            },
        )
        sandboxed = work(plane) / "status.txt"
        sandboxed.unlink()
        os.link(project / "status.txt", sandboxed)
        before = _size(plane)
        result = invoke(
            "call", "P-1", "--tool", "scribble", "--params", "{}", "--db", plane.store.url
        )
        assert result.exit_code == 2 and "hard link" in result.stderr, result.output
        assert _size(plane) == before
        assert (project / "status.txt").read_text() == "bad\n"


def test_a_hard_link_put_in_after_the_pass_is_refused_at_apply(db_url: str, tmp_path: Path) -> None:
    """The validated file replaced by a hard link to a file outside with the same bytes:
    the trees still match, but the file's other name is the agent's to rewrite while
    Apply reads; Apply refuses the sandbox as calls and runs do."""
    with Plane.open(db_url) as plane:
        project, token = _passed(plane, tmp_path)
        outside = tmp_path / "outside.txt"
        outside.write_text("good\n")
        sandboxed = work(plane) / "status.txt"
        sandboxed.unlink()
        os.link(outside, sandboxed)
        before = _size(plane)
        result = invoke("apply", "P-1", "--token", token, "--db", plane.store.url)
        assert result.exit_code == 2 and result.stderr.count("error:") == 1, result.output
        assert "hard link at status.txt" in result.stderr
        assert _size(plane) == before
        assert (project / "status.txt").read_text() == "bad\n"
        assert plane.state("plan:P-1").doc.token.status == "minted"


def test_symlinks_and_deletions_are_part_of_the_applied_tree(db_url: str, tmp_path: Path) -> None:
    """The applied tree is the validated tree: a symlink made in the sandbox is applied
    as a link, a file removed there is removed, and what the snapshot never held (a file
    added to the real resource after Execute) is not Apply's to touch."""
    from commands.plane.phases import enter_execute

    with Plane.open(db_url) as plane:
        project = status_plan(plane, tmp_path, {}, execute=False)
        (project / "stale.txt").write_text("old\n")
        enter_execute(plane, "P-1")
        (project / "later.txt").write_text("added after Execute\n")
        sandbox = work(plane)
        (sandbox / "status.txt").write_text("good\n")
        (sandbox / "stale.txt").unlink()
        os.symlink("status.txt", sandbox / "current")
        token = validate_plan(plane, "P-1").token
        assert token
        doc = apply_plan(plane, "P-1", token)
        assert os.readlink(project / "current") == "status.txt"
        assert not (project / "stale.txt").exists()
        assert (project / "later.txt").exists()
        assert {"current", "stale.txt", "status.txt"} == {f.path for f in doc.applied.files}
        assert audit(plane.store).ok


def test_a_symlink_leaving_the_resource_is_refused_at_apply(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        project = status_plan(plane, tmp_path, {})
        (work(plane) / "status.txt").write_text("good\n")
        os.symlink("/etc/passwd", work(plane) / "passwd")
        token = validate_plan(plane, "P-1").token
        assert token
        with pytest.raises(CommandRefused, match="points outside its resource"):
            apply_plan(plane, "P-1", token)
        assert not (project / "passwd").exists()


@pytest.mark.parametrize("target", ["../../../../etc/shadow", "sub/../.."])
def test_a_relative_symlink_leaving_the_resource_is_refused_at_apply(
    db_url: str, tmp_path: Path, target: str
) -> None:
    """A relative target that climbs out (or normalises to `..`) leaves the resource as
    surely as an absolute one: applied, it would point the real tree outside itself."""
    with Plane.open(db_url) as plane:
        project = status_plan(plane, tmp_path, {})
        (work(plane) / "status.txt").write_text("good\n")
        os.symlink(target, work(plane) / "escape")
        token = validate_plan(plane, "P-1").token
        assert token
        before = _size(plane)
        with pytest.raises(CommandRefused, match="points outside its resource"):
            apply_plan(plane, "P-1", token)
        assert _size(plane) == before
        assert not os.path.lexists(project / "escape")
        assert (project / "status.txt").read_text() == "bad\n"


class _Crash(Exception):
    pass


def _interrupted_apply(plane: Plane, token: str) -> None:
    """Apply stopped right after its change set was recorded (the point of no return),
    before any file was written."""

    def crash(step: str) -> None:
        if step == "changes_recorded":
            raise _Crash

    with pytest.raises(_Crash):
        apply_plan(plane, "P-1", token, progress=crash)
    assert plane.state("plan:P-1").doc.applying is not None


def test_a_change_set_blob_rewritten_before_the_resume_is_not_written(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The attacker rewrites, with raw SQL on the SQLite file, a file's content inside the
    recorded change-set blob (its digest in the blob and in the event left as they were):
    the resume checks each content against its digest and writes nothing."""
    import sqlite3

    with Plane.open(sqlite_url) as plane:
        project, token = _passed(plane, tmp_path)
        _interrupted_apply(plane, token)
        recorded = next(
            e.payload
            for e in plane.store.read_stream("plan:P-1")
            if isinstance(e.payload, ChangesRecorded)
        )
        entries = json.loads(plane.store.get_blob(recorded.changes_sha256) or b"")
        (entry,) = [e for e in entries if e["path"] == "status.txt"]
        entry["content"] = base64.b64encode(b"never validated\n").decode()
        db = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
        try:
            with db:
                db.execute("DROP TRIGGER blobs_no_update")
                done = db.execute(
                    "UPDATE blobs SET data = ? WHERE digest = ?",
                    (canonical_json(entries), recorded.changes_sha256),
                )
                assert done.rowcount == 1
        finally:
            db.close()
        before = _size(plane)
        resumed = invoke("apply", "P-1", "--resume", "--db", sqlite_url)
        assert resumed.exit_code == 2 and resumed.stderr.count("error:") == 1, resumed.output
        assert "status.txt does not hash to its digest" in resumed.stderr
        assert (project / "status.txt").read_text() == "bad\n"
        assert _size(plane) == before and plane.state("plan:P-1").doc.terminal is None


def test_a_real_file_edited_before_the_resume_is_refused_not_overwritten(
    db_url: str, tmp_path: Path
) -> None:
    """Between an interrupted Apply and its resume someone edits the real file: the
    resume re-checks every target against the snapshot and refuses, rather than
    overwrite the edit; put back, the resume finishes."""
    with Plane.open(db_url) as plane:
        project, token = _passed(plane, tmp_path)
        _interrupted_apply(plane, token)
        (project / "status.txt").write_text("edited by a human meanwhile\n")
        before = _size(plane)
        with pytest.raises(CommandRefused, match=r"status\.txt changed since the plan entered"):
            complete_apply(plane, "P-1")
        assert (project / "status.txt").read_text() == "edited by a human meanwhile\n"
        assert _size(plane) == before and plane.state("plan:P-1").doc.terminal is None
        (project / "status.txt").write_text("bad\n")
        assert complete_apply(plane, "P-1").terminal == "applied"
        assert (project / "status.txt").read_text() == "good\n"


def test_a_second_apply_while_one_holds_the_plan_is_refused(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        project, token = _passed(plane, tmp_path)
        doc = plane.state("plan:P-1").doc
        with plane.sandbox(doc).apply_lock():
            result = invoke("apply", "P-1", "--token", token, "--db", plane.store.url)
            assert result.exit_code == 2 and result.stderr.count("error:") == 1, result.output
            assert "another Apply of plan P-1 is under way" in result.stderr
            resumed = invoke("apply", "P-1", "--resume", "--db", plane.store.url)
            assert resumed.exit_code == 2 and "under way" in resumed.stderr
        assert (project / "status.txt").read_text() == "bad\n"
        apply_plan(plane, "P-1", token)
        assert (project / "status.txt").read_text() == "good\n"


def test_audit_files_reports_a_write_no_apply_made(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        project, token = _passed(plane, tmp_path)
        apply_plan(plane, "P-1", token)
        clean = invoke("audit", "--plan", "P-1", "--files", str(project), "--db", plane.store.url)
        assert clean.exit_code == 0, clean.output
        (project / "sneaked.txt").write_text("written by a tool during Execute\n")
        found = invoke(
            "audit", "--plan", "P-1", "--files", str(project), "--json", "--db", plane.store.url
        )
        assert found.exit_code == 1
        [violation] = json.loads(found.stdout)["violations"]
        assert violation["invariant"] == "files" and violation["expected"].startswith("sneaked.txt")


def test_a_named_resource_works_in_a_private_directory(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`repo:api` is no directory: its tool calls run in a private empty directory,
    never the caller's, and nothing they write survives."""
    from commands.plane.phases import enter_execute, record_strategy
    from commands.plane.plans import create_plan
    from commands.plane.registry import register_tool
    from commands.plane.runs import call_tool

    caller = tmp_path / "caller"
    caller.mkdir()
    monkeypatch.chdir(caller)
    with Plane.open(db_url) as plane:
        register_tool(
            plane,
            {
                "name": "where",
                "command": [
                    "python",
                    "-c",
                    "import os, json; seen = sorted(os.listdir('.'));"
                    " open('left.txt', 'w').write('x');"
                    " print(json.dumps(dict(cwd=os.getcwd(), seen=seen)))",
                ],
                "input_schema": {"type": "object"},
                "output_schema": {
                    "type": "object",
                    "properties": {"cwd": {"type": "string"}, "seen": {"type": "array"}},
                },
            },
        )
        create_plan(plane, "P-1", project="api", resources=["repo:api"], config={})
        record_strategy(plane, "P-1", "look around")
        enter_execute(plane, "P-1")
        first = call_tool(plane, "P-1", "where", {})
        assert first.ok, first
        second = call_tool(plane, "P-1", "where", {})
        out = json.loads(second.output)
        assert Path(out["cwd"]) != caller and out["seen"] == []  # the first call's file is gone
        assert not (caller / "left.txt").exists()


def test_a_single_file_resource_is_worked_on_in_its_own_sandbox(
    db_url: str, tmp_path: Path
) -> None:
    """A plan on one file: its tools run in a directory holding a copy of it (never the
    caller's directory), a call whose output gate fails keeps nothing, and Apply writes
    the validated file back in place — and nothing else beside it."""
    import sys

    from commands.plane.attachments import attach
    from commands.plane.phases import enter_execute, record_strategy
    from commands.plane.plans import create_plan
    from commands.plane.registry import register_tool, register_validation
    from commands.plane.runs import call_tool
    from tests.helpers import STATUS_CHECK

    project = tmp_path / "proj"
    project.mkdir()
    target = project / "status.txt"
    target.write_text("bad\n")
    (project / "neighbour.txt").write_text("untouched\n")
    (tmp_path / "check.py").write_text(STATUS_CHECK)
    write = "import sys; open('status.txt', 'w').write(sys.argv[1] + chr(10)); print('{{}}')"
    with Plane.open(db_url) as plane:
        register_validation(
            plane,
            {
                "name": "status",
                "mode": "required",
                "command": [sys.executable, str(tmp_path / "check.py")],
            },
        )
        for name, output in (("make_good", {"type": "object"}), ("make_evil", {"type": "string"})):
            register_tool(
                plane,
                {
                    "name": name,
                    "command": ["python", "-c", write, "good" if name == "make_good" else "evil"],
                    "input_schema": {"type": "object"},
                    "output_schema": output,
                },
            )
        create_plan(plane, "P-1", project="api", resources=[str(target)], config={})
        attach(plane, "status", resource=str(target))
        record_strategy(plane, "P-1", "make it good")
        enter_execute(plane, "P-1")
        assert call_tool(plane, "P-1", "make_good", {}).ok
        assert not call_tool(plane, "P-1", "make_evil", {}).ok  # output gate: kept nothing
        assert target.read_text() == "bad\n"
        report = validate_plan(plane, "P-1")
        assert report.outcome == "pass" and report.token
        doc = apply_plan(plane, "P-1", report.token)
        assert target.read_text() == "good\n"
        assert [f.path for f in doc.applied.files] == ["status.txt"]
        assert (project / "neighbour.txt").read_text() == "untouched\n"
        assert sorted(p.name for p in project.iterdir()) == ["neighbour.txt", "status.txt"]
        assert audit(plane.store).ok


@pytest.mark.slow
def test_two_concurrent_resumes_write_once_and_no_reader_sees_half_a_file(
    db_url: str, tmp_path: Path
) -> None:
    """An Apply crashed after its change set was recorded; two `apply --resume` race.
    At most one writes (the other, if it overlaps, is refused with one `error:` line);
    a reader polling the target meanwhile sees the old bytes or the new, never a part."""
    import subprocess
    import sys
    import threading

    old, new = b"bad\n", b"good\n" + b"x" * (8 << 20)
    with Plane.open(db_url) as plane:
        project = status_plan(plane, tmp_path, {})
        (work(plane) / "status.txt").write_bytes(new)
        (tmp_path / "check.py").write_text(
            "import json; ok = open('status.txt').read().startswith('good')\n"
            "print(json.dumps({'passed': ok}))\n"
        )
        token = validate_plan(plane, "P-1").token
        assert token

        def crash(step: str) -> None:
            if step == "changes_recorded":
                raise _Crash

        with pytest.raises(_Crash):
            apply_plan(plane, "P-1", token, progress=crash)
        assert (project / "status.txt").read_bytes() == old

    seen: set[bytes] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                seen.add(hashlib.sha256((project / "status.txt").read_bytes()).digest())
            except FileNotFoundError:
                seen.add(b"missing")

    watcher = threading.Thread(target=watch)
    watcher.start()
    env = {k: v for k, v in os.environ.items() if k != "EVIDENCE_DB"}
    argv = [sys.executable, "-m", "commands.cli", "apply", "P-1", "--resume", "--db", db_url]
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(p.wait(120), *p.communicate()) for p in procs]
    stop.set()
    watcher.join()
    assert seen <= {hashlib.sha256(old).digest(), hashlib.sha256(new).digest()}, "a part seen"
    assert 0 in [code for code, _out, _err in results], results
    for code, _out, err in results:
        assert "Traceback" not in err
        if code != 0:
            assert code == 2 and err.count("error:") == 1 and "under way" in err, err
    assert (project / "status.txt").read_bytes() == new
    with Plane.open(db_url) as plane:
        assert _types(plane).count("plan.applied") == 1
        assert audit(plane.store).ok


def test_a_directory_swapped_for_a_symlink_after_execute_is_not_followed(
    db_url: str, tmp_path: Path
) -> None:
    """`src/` was a real directory when the plan entered Execute; the agent replaces it
    with a symlink to a directory outside before Apply writes `src/new.py`."""
    from commands.plane.phases import enter_execute

    with Plane.open(db_url) as plane:
        project = status_plan(plane, tmp_path, {}, execute=False)
        (project / "src").mkdir()
        enter_execute(plane, "P-1")
        (work(plane) / "src" / "new.py").write_text("x = 1\n")
        (work(plane) / "status.txt").write_text("good\n")
        token = validate_plan(plane, "P-1").token
        assert token
        outside = tmp_path / "outside"
        outside.mkdir()
        (project / "src").rmdir()
        os.symlink(outside, project / "src")
        before = _size(plane)
        with pytest.raises(CommandRefused, match="src"):
            apply_plan(plane, "P-1", token)
        assert not list(outside.iterdir())
        assert _size(plane) == before
        assert plane.state("plan:P-1").doc.token.status == "minted"


def test_a_resumed_apply_leaves_nothing_but_the_intended_files(db_url: str, tmp_path: Path) -> None:
    """Apply killed between a file's temporary copy and its rename leaves the copy in the
    real resource; the resume removes it (issue 42: `audit --files` reported it)."""
    with Plane.open(db_url) as plane:
        project, token = _passed(plane, tmp_path)
        _interrupted_apply(plane, token)
        leftover = project / ".status.txt.0123456789abcdef01234567.evidence-apply"
        leftover.write_text("good\n")  # what the killed write left
        unrelated = project / ".status.txt.keep.evidence-apply"  # not of the shape: kept
        unrelated.write_text("mine\n")
        complete_apply(plane, "P-1")
        assert not leftover.exists() and unrelated.exists()
        assert (project / "status.txt").read_text() == "good\n"


def test_a_name_that_is_not_utf8_is_refused_in_one_line(db_url: str, tmp_path: Path) -> None:
    """The ledger records names as JSON text: one that is not UTF-8 is refused, naming
    it, before anything is appended (issue 42: it ended `validate` with a traceback)."""
    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, {})
        bad = os.path.join(os.fsencode(work(plane)), b"caf\xe9.txt")
        with open(bad, "wb") as handle:
            handle.write(b"x")
        before = _size(plane)
        with pytest.raises(CommandRefused, match=r"b'caf\\xe9.txt' is not UTF-8"):
            validate_plan(plane, "P-1")
        assert _size(plane) == before
        url = plane.store.url
    refused = invoke("validate", "P-1", "--db", url)
    assert refused.exit_code == 2, refused.output
    assert refused.stderr.count("\n") == 1 and "is not UTF-8" in refused.stderr
