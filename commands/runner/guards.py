"""Guards over trees a run may write but must not keep: a snapshot taken before, put
back afterwards unless what ran passed (a plan's sandbox around a tool call whose output
gate may still fail; a validation's original resource).

Nothing here follows a link. The snapshot is copied by descriptors (``copy_tree``), and
put back by descriptors opened with ``O_NOFOLLOW``: every directory entered, every file
made with ``O_EXCL``. A process racing the restore (a kept MCP server, or the agent's
own processes in a sandbox it may write) can make it fail, never make the plane write
through a link it planted, wherever that link points.

``KeptSnapshots`` keeps one snapshot per sandbox between calls: before each call the
tree is scanned (a file hashed again only when its inode, size, mode or times moved:
``trees.scan``'s ``hashed``) and copied again only when it changed, so a call that
reads costs a scan, not a copy of the sandbox.
"""

from __future__ import annotations

import os
import stat
import tempfile
import threading
from pathlib import Path
from typing import Protocol

from .trees import (
    Entry,
    Hashed,
    changed_paths,
    clear_dir,
    copy_bytes,
    copy_tree,
    remove_tree,
    scan,
)

__all__ = ["Guard", "KeptSnapshots", "TreeGuard", "put_back"]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Guard(Protocol):
    """What a call does with its guard once it is over."""

    def discard(self) -> None:
        """Keep the tree as it is now."""

    def restore_if_changed(self) -> list[str]:
        """The changed paths (empty if none); the tree as it was put back when any."""


class TreeGuard:
    """A snapshot of a tree, kept while something that must not change it runs (the
    original resource during validations; a plan's sandbox during a tool call whose
    output gate may still fail).

    Validations run in copies, but one that writes through an absolute path (or a
    python validation writing to its ``resource`` argument) could reach the original.
    ``restore_if_changed`` compares the tree with the snapshot afterwards and, if
    anything differs, puts the snapshot back byte for byte: no write survives.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._scratch = Path(tempfile.mkdtemp(prefix="evidence-guard-"))
        self._copy = self._scratch / "tree"
        try:
            copy_tree(self.root, self._copy)
            self._before = scan(self.root).entries
        except BaseException:
            remove_tree(self._scratch)
            raise

    @property
    def before(self) -> dict[str, Entry]:
        """The tree's entries when the snapshot was taken."""
        return self._before

    def discard(self) -> None:
        remove_tree(self._scratch)

    def restore_if_changed(self) -> list[str]:
        try:
            changed = changed_paths(self._before, scan(self.root).entries)
            if changed:
                put_back(self._copy, self.root, self._before["."][1])
            return changed
        finally:
            remove_tree(self._scratch)


# Snapshots a process keeps at most: past it, the one used longest ago goes (its next
# call copies its sandbox again). A plan that stops calling without ending holds no copy
# of its sandbox for ever.
MAX_KEPT = 32


class KeptSnapshots:
    """One snapshot per sandbox root, kept across calls (a process's planes share it,
    as they share the warm MCP servers): ``guard(owner, root)`` before a call."""

    def __init__(self, most: int = MAX_KEPT) -> None:
        self._lock = threading.Lock()
        self._kept: dict[str, _Kept] = {}  # in the order of their last use
        self._most = most

    def guard(self, owner: str, root: Path) -> Guard:
        """The guard of one call of ``owner`` (a plan) on ``root``: the kept snapshot
        brought up to date, or a snapshot of its own while another call holds it."""
        key = os.path.abspath(root)
        with self._lock:
            kept = self._kept.pop(key, None)
            if kept is None or kept.owner != owner:
                if kept is not None:
                    kept.retire()
                kept = _Kept(owner, Path(key))
            self._kept[key] = kept  # the last used, last
            while len(self._kept) > self._most:
                self._kept.pop(next(iter(self._kept))).retire()
        if not kept.busy.acquire(blocking=False):
            return TreeGuard(Path(key))
        try:
            kept.refresh()
        except BaseException:
            kept.release()
            raise
        return _KeptGuard(kept)

    def drop(self, owner: str) -> None:
        """Forget ``owner``'s snapshots (its plan ended, or its sandbox is made anew):
        their copies are removed, now or when the call holding one ends."""
        with self._lock:
            gone = [k for k in self._kept.values() if k.owner == owner]
            self._kept = {key: k for key, k in self._kept.items() if k.owner != owner}
        for kept in gone:
            kept.retire()

    def close(self) -> None:
        with self._lock:
            gone, self._kept = list(self._kept.values()), {}
        for kept in gone:
            kept.retire()

    def remove_now(self) -> None:
        """Remove every copy, taking no lock: for a signal handler, which may run while
        this very thread holds one (the process ends right after)."""
        for kept in list(self._kept.values()):
            if kept.scratch is not None:
                remove_tree(kept.scratch)


class _Kept:
    """A sandbox's snapshot between calls: its copy, the entries the copy holds, and the
    digests its files were last hashed to."""

    def __init__(self, owner: str, root: Path) -> None:
        self.owner, self.root = owner, root
        self.busy = threading.Lock()
        self.retired = False
        self.hashed: Hashed = {}
        self.entries: dict[str, Entry] | None = None
        self.scratch: Path | None = None

    def refresh(self) -> None:
        """Bring the copy to the tree as it is now: copied again only if it changed.
        The tree is scanned again after a copy: a write that raced it is copied again
        (three times at most), never trusted to be in the copy."""
        now = scan(self.root, self.hashed).entries
        if self.entries == now and self.scratch is not None:
            return
        for _attempt in range(3):
            self.forget()
            self.scratch = Path(tempfile.mkdtemp(prefix="evidence-guard-"))
            copy_tree(self.root, self.scratch / "tree")
            after = scan(self.root, self.hashed).entries
            if after == now:
                self.entries = now
                return
            now = after
        self.forget()
        raise OSError(f"{self.root} kept changing while it was copied")

    def forget(self) -> None:
        if self.scratch is not None:
            remove_tree(self.scratch)
        self.scratch, self.entries = None, None

    def release(self) -> None:
        if self.retired:
            self.forget()
        self.busy.release()

    def retire(self) -> None:
        """No call will use this snapshot again: its copy goes now if no call holds it,
        else when that call releases it."""
        self.retired = True
        if self.busy.acquire(blocking=False):
            try:
                self.forget()
            finally:
                self.busy.release()


class _KeptGuard:
    def __init__(self, kept: _Kept) -> None:
        self._kept = kept

    def discard(self) -> None:
        self._kept.release()  # the next call scans the tree, and copies it if it changed

    def restore_if_changed(self) -> list[str]:
        kept = self._kept
        try:
            assert kept.entries is not None and kept.scratch is not None  # refreshed
            before = kept.entries
            changed = changed_paths(before, scan(kept.root, kept.hashed).entries)
            if changed:
                put_back(kept.scratch / "tree", kept.root, int(before["."][1]))
            return changed
        finally:
            kept.release()


# -- putting a tree back, following no link ------------------------------------------------


def put_back(copy: Path, root: Path, mode: int) -> None:
    """Make the tree at ``root`` the tree at ``copy`` again (``root`` itself kept, its
    permission bits ``mode``): everything in it removed, the copy's entries made anew,
    all by descriptors that follow no link."""
    target = os.open(root, _DIR)
    try:
        clear_dir(target)
        source = os.open(copy, _DIR)
        try:
            _copy_into(source, target)
        finally:
            os.close(source)
        os.fchmod(target, mode)
    finally:
        os.close(target)


def _copy_into(source: int, target: int) -> None:
    """Copy the entries of the directory ``source`` into the empty directory ``target``
    (a regular file by content, a symlink as its text, a FIFO made anew; modes and
    modification times kept)."""
    for name in os.listdir(source):
        st = os.stat(name, dir_fd=source, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(name, 0o700, dir_fd=target)
            inner, outer = os.open(name, _DIR, dir_fd=source), os.open(name, _DIR, dir_fd=target)
            try:
                _copy_into(inner, outer)
                _keep(outer, st)
            finally:
                os.close(inner)
                os.close(outer)
        elif stat.S_ISREG(st.st_mode):
            inner = os.open(name, _READ, dir_fd=source)
            try:
                outer = os.open(name, _NEW, 0o600, dir_fd=target)
                try:
                    copy_bytes(inner, outer)
                    _keep(outer, st)
                finally:
                    os.close(outer)
            finally:
                os.close(inner)
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(name, dir_fd=source), name, dir_fd=target)
        elif stat.S_ISFIFO(st.st_mode):
            os.mkfifo(name, stat.S_IMODE(st.st_mode), dir_fd=target)


def _keep(fd: int, st: os.stat_result) -> None:
    os.fchmod(fd, stat.S_IMODE(st.st_mode))
    os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
