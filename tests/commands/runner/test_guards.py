"""Sandbox guards: a snapshot put back when a call does not pass, following no link, and
kept across a plan's calls (copied again only when the tree changed)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from commands.runner import guards, trees
from commands.runner.guards import KeptSnapshots, TreeGuard
from commands.runner.trees import scan


def _tree(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print('v1')\n")
    (root / "README").write_text("read me\n")
    return root


def _contents(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def test_a_write_is_put_back_and_a_passing_one_kept(tmp_path: Path) -> None:
    root = _tree(tmp_path / "sandbox")
    before = _contents(root)
    guard = TreeGuard(root)
    (root / "src" / "app.py").write_text("print('evil')\n")
    (root / "new").write_text("planted\n")
    assert guard.restore_if_changed() == ["new", "src/app.py"]
    assert _contents(root) == before

    guard = TreeGuard(root)
    (root / "README").write_text("kept\n")
    guard.discard()
    assert (root / "README").read_text() == "kept\n"


def test_putting_back_writes_through_no_link_planted_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack: a process that may write the sandbox (a kept MCP server, the agent's
    own) swaps each directory the restore makes for a link to a directory outside. The
    restore fails there; nothing outside is written."""
    root = _tree(tmp_path / "sandbox")
    outside = tmp_path / "outside"
    outside.mkdir()
    guard = TreeGuard(root)
    (root / "src" / "app.py").write_text("changed\n")
    made = os.mkdir

    def racing_mkdir(path: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        made(path, mode, dir_fd=dir_fd)
        inside = dir_fd is not None or os.fspath(path).startswith(os.fspath(root))
        if inside:  # one the restore makes in the sandbox: swapped at once for a link
            os.rmdir(path, dir_fd=dir_fd)
            os.symlink(outside, path, dir_fd=dir_fd)

    monkeypatch.setattr(guards.os, "mkdir", racing_mkdir)
    with pytest.raises(OSError):
        guard.restore_if_changed()
    monkeypatch.undo()
    assert list(outside.iterdir()) == []


def test_removing_a_tree_chmods_nothing_through_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack: a directory is swapped for a link to one outside just after it was
    seen to be a directory. Making it writable to remove it must not chmod that one."""
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    root = tmp_path / "scratch"
    (root / "locked").mkdir(parents=True)
    (root / "locked" / "f").write_text("x")
    os.chmod(root / "locked", 0o500)
    looked: list[str] = []
    lstat, stat_ = os.lstat, os.stat

    def swap_after(found: os.stat_result, name: str) -> os.stat_result:
        if os.path.basename(os.fspath(name)) == "locked" and not looked:
            looked.append(name)
            os.chmod(root / "locked", 0o700)
            (root / "locked" / "f").unlink()
            (root / "locked").rmdir()
            (root / "locked").symlink_to(outside)
        return found

    monkeypatch.setattr(os, "lstat", lambda p, **kw: swap_after(lstat(p, **kw), p))
    monkeypatch.setattr(os, "stat", lambda p, **kw: swap_after(stat_(p, **kw), p))
    trees.remove_tree(root)
    monkeypatch.undo()
    assert looked, "the race was not run"
    assert not root.exists()
    assert outside.is_dir() and (outside.stat().st_mode & 0o777) == 0o755


def test_a_kept_snapshot_is_copied_again_only_when_the_tree_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _tree(tmp_path / "sandbox")
    copies: list[Path] = []
    copy = guards.copy_tree

    def counted(src: Path | str, dst: Path | str) -> object:
        copies.append(Path(src))
        return copy(src, dst)

    monkeypatch.setattr(guards, "copy_tree", counted)
    kept = KeptSnapshots()
    try:
        for _ in range(3):  # calls that read: one copy for all of them
            kept.guard("P-1", root).discard()
        assert len(copies) == 1
        guard = kept.guard("P-1", root)  # a call that writes and passes
        (root / "README").write_text("v2\n")
        guard.discard()
        guard = kept.guard("P-1", root)  # copied again: the tree changed
        assert len(copies) == 2
        (root / "src" / "app.py").write_text("rejected\n")
        assert guard.restore_if_changed() == ["src/app.py"]
        assert _contents(root) == {"README": "v2\n", "src/app.py": "print('v1')\n"}
        kept.guard("P-1", root).discard()  # put back as it was kept: no copy
        assert len(copies) == 2
    finally:
        kept.close()


def test_a_write_that_keeps_size_and_resets_its_time_is_still_seen(tmp_path: Path) -> None:
    """The attack on a digest cache: same size, modification time set back. The change
    time moves with any write and no process can set it, so the file is hashed again."""
    root = _tree(tmp_path / "sandbox")
    target = root / "src" / "app.py"
    time.sleep(trees.RACY_NS / 1e9 + 0.05)  # settled: the next scan keeps its digest
    kept = KeptSnapshots()
    try:
        kept.guard("P-1", root).discard()
        guard = kept.guard("P-1", root)
        st = target.stat()
        target.write_text("print('v2')\n")  # as long as the original
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert guard.restore_if_changed() == ["src/app.py"]
        assert target.read_text() == "print('v1')\n"
    finally:
        kept.close()


def test_a_file_changed_just_before_a_scan_is_hashed_again_next_time(tmp_path: Path) -> None:
    """The kernel stamps times from a coarse clock: a file written in the same tick as a
    scan could be written again without its times moving, so its digest is not kept."""
    root = _tree(tmp_path / "sandbox")
    hashed: trees.Hashed = {}
    scan(root, hashed)
    assert hashed == {}  # every file was written just now
    time.sleep(trees.RACY_NS / 1e9 + 0.05)
    scan(root, hashed)
    assert set(hashed) == {"README", "src/app.py"}


def test_a_snapshot_dropped_while_a_call_holds_it_goes_when_the_call_ends(
    tmp_path: Path,
) -> None:
    """A call whose own record ends its plan drops the plan's snapshots from the thread
    that holds one: the drop never waits for it (it would wait forever)."""
    root = _tree(tmp_path / "sandbox")
    kept = KeptSnapshots()
    guard = kept.guard("P-1", root)
    scratch = [p for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("evidence-guard-*")]
    kept.drop("P-1")
    guard.discard()
    left = [p for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("evidence-guard-*")]
    assert len(left) == len(scratch) - 1
    kept.close()


def test_a_second_call_meanwhile_takes_a_snapshot_of_its_own(tmp_path: Path) -> None:
    root = _tree(tmp_path / "sandbox")
    kept = KeptSnapshots()
    try:
        first = kept.guard("P-1", root)
        second = kept.guard("P-1", root)
        assert isinstance(second, TreeGuard)
        (root / "README").write_text("second's\n")
        assert second.restore_if_changed() == ["README"]
        first.discard()
    finally:
        kept.close()


def test_a_process_keeps_a_bounded_number_of_snapshots(tmp_path: Path) -> None:
    """A plan that stops calling without ending does not hold a copy of its sandbox for
    ever: past the bound, the snapshot used longest ago is removed."""
    roots = [_tree(tmp_path / f"sandbox-{n}") for n in range(3)]
    before = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("evidence-guard-*"))
    kept = KeptSnapshots(most=2)
    try:
        for n, root in enumerate(roots):
            kept.guard(f"P-{n}", root).discard()
        now = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("evidence-guard-*"))
        assert len(now - before) == 2
    finally:
        kept.close()
    assert set(Path(os.environ.get("TMPDIR", "/tmp")).glob("evidence-guard-*")) == before
