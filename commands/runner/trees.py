"""Trees as the plane judges them: every entry of a directory read without following a
link, one canonical manifest, one digest, and the difference between two manifests.

A **manifest** is a JSON object mapping each path under the tree's root (relative,
``/``-separated; the root itself is not an entry) to ``[kind, mode, content]``:

- ``["dir", mode, ""]``, ``["file", mode, sha256 of the bytes]``,
  ``["symlink", mode, target]`` (the link's own text, never followed),
- ``["special", mode, file type]`` for a FIFO, socket or device (never opened), and
  ``["unreadable", 0, errno name]`` for an entry that could not be read.

``mode`` is the permission bits (``st_mode & 0o7777``). A tree's **digest** is the
SHA-256 of the manifest's RFC 8785 canonical JSON, so anyone holding the manifest (it is
stored as a blob) can recompute it; a validation run records the digest of the tree it
judged, a token carries it, and Apply writes only that tree.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ledger.canonical import canonical_json
from ledger.events import FileChange

__all__ = [
    "Entry",
    "Hashed",
    "Manifest",
    "ResourceKind",
    "Scan",
    "changed_paths",
    "clear_dir",
    "copy_bytes",
    "copy_entry",
    "copy_tree",
    "entries",
    "file_sha256",
    "give_tree",
    "hard_links",
    "manifest_bytes",
    "manifest_digest",
    "manifest_of",
    "remove_tree",
    "scan",
    "tree_changes",
    "tree_digest",
]

Entry = tuple[str, int, str]  # (kind, permission bits, content sha256 / link target / "")
Manifest = dict[str, list[str | int]]  # path -> [kind, mode, content]
# What a plan's resource is, as its sandbox holds it: a directory (a copy of it), a single
# file (a directory holding a copy of it under its own name), or a name such as
# ``repo:api`` (a private empty directory whose writes never survive).
ResourceKind = Literal["dir", "file", "name"]


@dataclass(frozen=True)
class Scan:
    """A tree read once: every entry, and the regular files with more than one link
    (a hard link's other name may be anywhere: writing through it would write there)."""

    entries: dict[str, Entry]
    hard_links: list[str]


# A regular file's identity as ``lstat`` sees it: device, inode, size, mode, and the
# modification and change times. No user process can set a change time (the kernel
# sets it to now on every write, chmod, rename or utime), so bytes that moved move it.
StatKey = tuple[int, int, int, int, int, int]
# Path -> (its StatKey when last hashed, its Entry then): what ``scan`` may reuse.
Hashed = dict[str, tuple[StatKey, Entry]]
# A file changed within this long of a scan is hashed again next time whatever its
# times say: the kernel stamps times from a coarse clock, so a second write in the same
# tick as the scan can leave them equal (git's "racily clean" entries).
RACY_NS = 1_000_000_000


def scan(root: Path | str, hashed: Hashed | None = None) -> Scan:
    """Every path under ``root`` (``.`` for root itself), never following symlinks. An
    entry that cannot be read is recorded as such rather than raising, so a program that
    chmods something unreadable shows up as a change.

    ``hashed`` (kept by the caller between scans of the same tree): a regular file whose
    ``StatKey`` is the one it had when last hashed, and whose change time is older than
    ``RACY_NS`` before that scan, keeps its digest without being read; the map is
    brought up to date with this scan's files."""
    started = time.time_ns()
    seen: Hashed = {}
    found: dict[str, Entry] = {}
    linked: list[str] = []
    pending = [""]
    while pending:
        rel = pending.pop()
        path = os.path.join(root, rel) if rel else os.fspath(root)
        key = rel or "."
        try:
            st = os.lstat(path)
        except OSError as exc:
            found[key] = ("unreadable", 0, _errno_name(exc))
            continue
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            try:
                names = os.listdir(path)
            except OSError as exc:
                found[key] = ("dir", mode, "unlistable:" + _errno_name(exc))
                continue
            found[key] = ("dir", mode, "")
            pending.extend(os.path.join(rel, name) if rel else name for name in names)
        elif stat.S_ISREG(st.st_mode):
            found[key] = _file_entry(path, key, st, mode, hashed, seen, started)
            if st.st_nlink > 1:
                linked.append(key)
        elif stat.S_ISLNK(st.st_mode):
            found[key] = ("symlink", mode, os.readlink(path))
        else:  # FIFO, socket, device: never opened (a FIFO would block)
            found[key] = ("special", mode, str(stat.S_IFMT(st.st_mode)))
    if hashed is not None:
        hashed.clear()
        hashed.update(seen)
    return Scan(found, sorted(linked))


def _file_entry(
    path: str, key: str, st: os.stat_result, mode: int,
    hashed: Hashed | None, seen: Hashed, started: int,
) -> Entry:  # fmt: skip
    """A regular file's entry: its digest as last hashed when nothing moved since (and
    that hash was not racy), else read now (and kept for the next scan when settled)."""
    if hashed is None:
        return ("file", mode, file_sha256(path))
    now = (st.st_dev, st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns)
    known = hashed.get(key)
    fresh = known is None or known[0] != now
    entry = ("file", mode, file_sha256(path)) if fresh or known is None else known[1]
    if st.st_ctime_ns < started - RACY_NS and not entry[2].startswith("unreadable:"):
        seen[key] = (now, entry)
    return entry


def entries(root: Path | str) -> dict[str, Entry]:
    return scan(root).entries


def hard_links(root: Path | str) -> list[str]:
    """The regular files under ``root`` with more than one link (no content is read)."""
    found: list[str] = []
    for top, dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(top, name)
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                    found.append(os.path.relpath(path, root))
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]
    return sorted(found)


def copy_entry(src: str, dst: str) -> None:
    """copytree's copy function: a regular file's bytes and metadata (a real copy, never a
    link to the original); a FIFO is recreated (opening it to copy would block);
    sockets and devices are not copied."""
    st = os.lstat(src)
    if stat.S_ISREG(st.st_mode):
        shutil.copy2(src, dst)
    elif stat.S_ISFIFO(st.st_mode):
        os.mkfifo(dst, stat.S_IMODE(st.st_mode))


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in after the lstat is opened without waiting for a writer.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_Frame = tuple[int, str, str, list[str], os.stat_result]  # dir fd, copy, rel path, names, stat


def give_tree(root: Path | str, uid: int, gid: int) -> None:
    """Make ``uid``:``gid`` the owner of the tree at ``root`` and of everything in it,
    following no link at any depth (directories opened with ``O_NOFOLLOW`` and walked
    by descriptor; a symlink's own owner changes, never its target's), so an entry
    swapped for a link meanwhile hands nothing outside the tree to the user."""
    stack = [os.open(root, _DIR_FLAGS)]
    try:
        os.fchown(stack[0], uid, gid)
        while stack:
            fd = stack.pop()
            try:
                for name in os.listdir(fd):
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                        stack.append(child)
                        os.fchown(child, uid, gid)
                    else:
                        os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
            finally:
                os.close(fd)
    finally:
        for fd in stack:
            os.close(fd)


def copy_tree(src: Path | str, dst: Path | str) -> dict[str, Entry]:
    """Copy the tree at ``src`` to ``dst`` (made here), following no link at any depth
    (directories are walked by descriptors opened with ``O_NOFOLLOW``, so an entry
    swapped for a link meanwhile is refused, never followed): a regular file by content
    (a hard link becomes a file of its own), a symlink as its own text, a FIFO
    recreated (never opened); modes and modification times kept. Sockets and devices
    are not copied: they are returned as ``scan`` records them. ``OSError`` when an
    entry cannot be read, or changed kind while it was copied."""
    skipped: dict[str, Entry] = {}
    stack = [_opened(os.open(src, _DIR_FLAGS), os.fspath(dst), "", None)]
    try:
        while stack:
            fd, out, rel, names, st = stack[-1]
            if not names:
                stack.pop()
                os.close(fd)
                _keep_metadata(out, st)  # after its entries: a read-only directory too
                continue
            name = names.pop()
            child = _copy_at(fd, name, os.path.join(out, name), os.path.join(rel, name), skipped)
            if child is not None:
                stack.append(child)
    finally:
        for frame in stack:
            os.close(frame[0])
    return skipped


def _copy_at(fd: int, name: str, out: str, rel: str, skipped: dict[str, Entry]) -> _Frame | None:
    """Copy the entry ``name`` of the directory ``fd`` to ``out``; a directory's frame."""
    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        return _opened(os.open(name, _DIR_FLAGS, dir_fd=fd), out, rel, st)
    if stat.S_ISREG(st.st_mode):
        _copy_file(fd, name, out, st, rel)
    elif stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=fd), out)
        return None
    elif stat.S_ISFIFO(st.st_mode):
        os.mkfifo(out, 0o600)
    else:
        skipped[rel] = ("special", stat.S_IMODE(st.st_mode), str(stat.S_IFMT(st.st_mode)))
        return None
    _keep_metadata(out, st)
    return None


def _opened(fd: int, out: str, rel: str, st: os.stat_result | None) -> _Frame:
    """The frame of the directory ``fd`` (``st`` as examined before it was opened),
    its copy ``out`` made; ``fd`` is closed when that fails."""
    try:
        if st is not None:
            _same_entry(fd, st, rel)
        os.mkdir(out, 0o700)
        return fd, out, rel, sorted(os.listdir(fd)), st or os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


def _copy_file(fd: int, name: str, out: str, st: os.stat_result, rel: str) -> None:
    source = os.open(name, _READ_FLAGS, dir_fd=fd)
    try:
        _same_entry(source, st, rel)
        target = os.open(out, _NEW_FLAGS, 0o600)
        try:
            copy_bytes(source, target)
        finally:
            os.close(target)
    finally:
        os.close(source)


def copy_bytes(source: int, target: int) -> None:
    """In the kernel (``sendfile``) where it can; else read and write, in chunks small
    enough not to allocate a fresh mapping per read."""
    try:
        while os.sendfile(target, source, None, 1 << 30):
            pass
        return
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS) or os.lseek(source, 0, os.SEEK_CUR):
            raise
    while chunk := os.read(source, 1 << 16):
        view = memoryview(chunk)
        while view:
            view = view[os.write(target, view) :]


def _same_entry(fd: int, st: os.stat_result, rel: str) -> None:
    """The entry opened is the one examined (not swapped between the two)."""
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino, stat.S_IFMT(now.st_mode)) != (
        st.st_dev,
        st.st_ino,
        stat.S_IFMT(st.st_mode),
    ):
        raise OSError(errno.EAGAIN, "it changed while it was copied", rel)


def _keep_metadata(path: str, st: os.stat_result) -> None:
    os.chmod(path, stat.S_IMODE(st.st_mode))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def remove_tree(root: Path | str) -> None:
    """Delete a tree even if something in it made directories unwritable, following no
    link: each directory is made writable through a descriptor opened with
    ``O_NOFOLLOW`` (a path swapped for a link meanwhile is not entered, never chmodded
    through), and ``shutil.rmtree`` removes by descriptors too."""
    with contextlib.suppress(OSError):
        fd = os.open(root, _DIR_FLAGS)
        try:
            os.fchmod(fd, 0o700)
            clear_dir(fd, best_effort=True)
        finally:
            os.close(fd)
    shutil.rmtree(root, ignore_errors=True)  # what is left: the root itself, or a file


def clear_dir(fd: int, *, best_effort: bool = False) -> None:
    """Remove every entry of the directory ``fd``, following no link: directories are
    entered by descriptors opened with ``O_NOFOLLOW`` and made writable first.
    ``best_effort``: an entry that cannot be removed is left, the others go on."""
    for name in os.listdir(fd):
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                try:
                    os.fchmod(child, 0o700)
                    clear_dir(child, best_effort=best_effort)
                finally:
                    os.close(child)
                os.rmdir(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)
        except OSError:
            if not best_effort:
                raise


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    except OSError as exc:
        return "unreadable:" + _errno_name(exc)
    return digest.hexdigest()


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, "?")


def changed_paths(before: Mapping[str, Entry], after: Mapping[str, Entry]) -> list[str]:
    paths = set(before) ^ set(after)
    paths.update(path for path in set(before) & set(after) if before[path] != after[path])
    return sorted(paths)


# -- manifests ------------------------------------------------------------------------------


def manifest_of(found: Mapping[str, Entry], kind: ResourceKind = "dir", name: str = "") -> Manifest:
    """The manifest of a scanned sandbox copy: every entry but the root for a directory;
    only the file itself (``name``) for a single-file resource; nothing for a name."""
    if kind == "name":
        return {}
    if kind == "file":
        return {name: list(found[name])} if name in found else {}
    return {path: list(entry) for path, entry in found.items() if path != "."}


def manifest_bytes(manifest: Manifest) -> bytes:
    """The canonical bytes of a manifest (RFC 8785): what its digest is the SHA-256 of."""
    return canonical_json(manifest)


def manifest_digest(manifest: Manifest) -> str:
    return hashlib.sha256(manifest_bytes(manifest)).hexdigest()


def tree_digest(root: Path | str) -> str:
    """The digest of the directory tree at ``root`` (see the module's docstring)."""
    if not os.path.isdir(root):
        raise NotADirectoryError(f"{os.fspath(root)!r} is not a directory")
    return manifest_digest(manifest_of(entries(root)))


# -- the difference Apply writes --------------------------------------------------------------


def tree_changes(resource: str, validated: Manifest, snapshot: Manifest) -> list[FileChange]:
    """What takes the resource from ``snapshot`` (as it was when the plan entered
    Execute) to ``validated`` (the tree the token's run judged), sorted: directories to
    make, files and symlinks to write, and paths to remove (``absent``, deepest first,
    after the writes). Raises ``ValueError`` for an entry Apply never writes (a FIFO,
    socket, device or unreadable entry that differs)."""
    writes: list[FileChange] = []
    for path in sorted(validated):
        entry = validated[path]
        if snapshot.get(path) == entry:
            continue
        kind, mode, content = str(entry[0]), int(entry[1]), str(entry[2])
        if kind == "dir":
            writes.append(FileChange(resource=resource, path=path, kind="dir", mode=mode))
        elif kind == "file":
            writes.append(FileChange(resource=resource, path=path, sha256=content, mode=mode))
        elif kind == "symlink":
            writes.append(FileChange(resource=resource, path=path, kind="symlink", target=content))
        else:
            raise ValueError(f"{path} is a {kind} entry: Apply writes files, symlinks, directories")
    gone = [
        FileChange(resource=resource, path=path, kind="absent")
        for path in sorted(set(snapshot) - set(validated), reverse=True)
    ]
    return writes + gone
