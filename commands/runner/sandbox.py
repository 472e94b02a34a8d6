"""A plan's sandbox: the copy of its resources that every tool call, fix and validation
of the plan works in, from Execute until Apply (Apply is the point of no return; a
failed output gate commits nothing).

One sandbox per plan, whatever the entry point (``evidence call``, ``validate``,
``fix``, ``run``, the Python API): it lives under the ledger's state directory (or
``--workdir``), named by the SHA-256 of the plan id — a name never becomes a path — and
each resource's copy by the SHA-256 of the resource. Every resource has one: a
directory is copied (real copies, never hard links), a single file is copied into a
directory of its own, and a named resource (``repo:api``) gets a private empty
directory whose writes never survive. It is made when the plan first enters Execute,
and the manifests of the copies then are the plan's **snapshot**; nothing in it reaches
the real resource before Apply, and Apply writes only the difference between the tree
a token's run validated and that snapshot (``commands.runner.trees``).

A validation run judges a ``RunSnapshot``: the sandbox copied once, for that run, into a
directory beside the copies (no program of the plan may write there); its manifests are
the trees the run records and its token binds, and every validation of the run works in
a copy of it, never in the live sandbox the agent may rewrite at any moment.

Apply follows no link: it walks the resource through directory descriptors opened with
``O_NOFOLLOW``, writes each file to a temporary name made exclusively and
unpredictably beside its target, then renames it into place (a reader sees the old
file or the new one), and refuses a symlink where a directory is expected.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import hashlib
import os
import posixpath
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from commands.errors import CommandRefused
from commands.names import check_relative_path
from ledger.canonical import canonical_json
from ledger.events import FileChange
from ledger.store import url_identity
from projections.states import PlanState

from .trees import (
    Entry,
    Manifest,
    ResourceKind,
    changed_paths,
    copy_entry,
    copy_tree,
    entries,
    manifest_of,
    remove_tree,
    tree_changes,
)

__all__ = [
    "STATE_DIR_ENV",
    "ApplyBusy",
    "ApplyConflict",
    "PlanSandbox",
    "RunSnapshot",
    "Trees",
    "change_blob",
    "change_contents",
    "change_set_problem",
    "decode_trees",
    "encode_trees",
    "expected_changes",
    "read_changes",
    "sandboxes_dir",
    "state_dir",
    "write_change",
]

STATE_DIR_ENV = "EVIDENCE_STATE_DIR"


def state_dir(db_url: str) -> Path:
    """Where the ledger at ``db_url`` keeps its working files (sandboxes):
    ``$EVIDENCE_STATE_DIR``, else ``<db>.state`` next to a SQLite file, else
    ``~/.local/state/evidence-ledger/<sha256(url without password)[:16]>``."""
    override = os.environ.get(STATE_DIR_ENV)
    if override:
        return Path(override).expanduser().resolve()
    driver, _, rest = db_url.partition("://")
    if driver.split("+", 1)[0] == "sqlite":
        path = rest.split("?", 1)[0][1:]
        if path and path != ":memory:":
            return Path(os.path.abspath(path + ".state"))
    digest = hashlib.sha256(url_identity(db_url).encode("utf-8")).hexdigest()[:16]
    return Path.home() / ".local" / "state" / "evidence-ledger" / digest


def private_dirs(path: Path) -> None:
    """``path`` and every missing directory above it, each made 0700: the state
    directory and its sandboxes are the plane's (an agent changes them only through
    calls the plane gates), whatever the umask leaves to others."""
    missing = []
    for found in (path, *path.parents):
        if found.exists():
            break
        missing.append(found)
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            directory.mkdir(0o700)


def sandboxes_dir(db_url: str, workdir: Path | None = None) -> Path:
    """Where the plans of the ledger at ``db_url`` keep their sandboxes: under
    ``workdir`` or the state directory, one folder per ledger (two ledgers sharing a
    work directory never share a plan's sandbox)."""
    base = workdir.resolve() if workdir is not None else state_dir(db_url)
    return base / "sandboxes" / _digest(url_identity(db_url), 16)


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


# -- trees: what a sandbox holds, as a blob --------------------------------------------------

Trees = dict[str, tuple[ResourceKind, Manifest]]  # resource -> (kind, manifest)


class UnrecordableName(CommandRefused):
    """A name in a tree that is not UTF-8: the ledger records names as JSON text, and
    guessing at another encoding would record a different name than the one applied."""


def encode_trees(trees: Trees) -> bytes:
    """The blob of a plan's trees (a snapshot, or what a run judged): canonical JSON
    ``{resource: {"kind": kind, "manifest": manifest}}``. A name that is not UTF-8 is
    refused (``UnrecordableName``, naming it), never recorded otherwise."""
    for resource, (_kind, manifest) in trees.items():
        for name in manifest:
            if not _utf8(name):
                raise UnrecordableName(
                    f"{resource}: the name {os.fsencode(name)!r} is not UTF-8: the ledger "
                    "records UTF-8 names only (rename it)"
                )
    return canonical_json(
        {r: {"kind": kind, "manifest": manifest} for r, (kind, manifest) in trees.items()}
    )


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # os.fsdecode's surrogate escapes of undecodable bytes
        return False
    return True


_KINDS = ("dir", "file", "name")


def decode_trees(blob: bytes) -> Trees:
    """``encode_trees``'s inverse; ``ValueError`` for anything else."""
    try:
        raw = msgspec.json.decode(blob)
        trees: Trees = {}
        for resource, tree in raw.items():
            kind, manifest = tree["kind"], tree["manifest"]
            if kind not in _KINDS or not isinstance(manifest, dict):
                raise ValueError(f"bad tree of {resource!r}")
            for path, entry in manifest.items():
                if not (isinstance(entry, list) and len(entry) == 3):
                    raise ValueError(f"bad entry {path!r} of {resource!r}")
            trees[resource] = (kind, manifest)
        return trees
    except (msgspec.DecodeError, AttributeError, KeyError, TypeError) as exc:
        raise ValueError(f"not a trees blob: {exc}") from None


def expected_changes(validated: Trees, snapshot: Trees) -> list[FileChange]:
    """The one change set Apply may record: for each resource (sorted) that is a
    directory or a file, the validated tree's difference from the snapshot at Execute.
    ``ValueError`` when the two do not name the same resources, or when the difference
    holds what Apply never writes (a FIFO, a kind change of a directory, a symlink whose
    target leaves the resource)."""
    if set(validated) != set(snapshot):
        raise ValueError("the validated trees and the snapshot name different resources")
    changes: list[FileChange] = []
    for resource in sorted(validated):
        (kind, tree), (snap_kind, snap) = validated[resource], snapshot[resource]
        if kind != snap_kind:
            raise ValueError(f"{resource} was a {snap_kind} at Execute, not a {kind}")
        if kind == "name":
            continue
        for change in tree_changes(resource, tree, snap):
            _check_change(change, snap.get(change.path))
            changes.append(change)
    return changes


def change_set_problem(
    plan: PlanState, changes: list[FileChange], get_blob: Callable[[str], bytes | None]
) -> str | None:
    """Why a recorded change set is not the one Apply may write (None when it is): it
    must be exactly the difference between the trees the plan's consumed token bound and
    the plan's snapshot at Execute. ``plan`` is the plan's state before the change set;
    the plane refuses a plan that breaks this, and ``audit`` reports it."""
    token = plan.token
    trees = token.trees_sha256 if token is not None else msgspec.UNSET
    if trees is msgspec.UNSET or plan.snapshot_sha256 is msgspec.UNSET:
        return (
            "Apply's change set follows a token bound to validated trees, on a plan "
            "snapshotted at Execute"
        )
    found: list[Trees] = []
    for digest in (trees, plan.snapshot_sha256):
        blob = get_blob(digest)
        if blob is None:
            return f"the trees blob {digest} Apply's change set is checked against is missing"
        try:
            found.append(decode_trees(bytes(blob)))
        except ValueError as exc:
            return f"the trees blob {digest} is damaged ({exc})"
    try:
        expected = expected_changes(found[0], found[1])
    except ValueError as exc:
        return f"the validated trees cannot be applied ({exc})"
    if list(changes) != expected:
        return (
            "Apply's change set is exactly the validated trees' difference from the "
            "snapshot at Execute"
        )
    return None


def _check_change(change: FileChange, before: list[Any] | None) -> None:
    path = change.path
    if (
        before is not None
        and change.kind != "absent"
        and (before[0] == "dir") != (change.kind == "dir")
    ):
        raise ValueError(f"{path} changes between a directory and a file: Apply refuses that")
    if change.kind == "symlink":
        target = str(change.target)
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            raise ValueError(f"symlink {path} points outside its resource ({target})")


# -- the sandbox -------------------------------------------------------------------------------


def resource_kind(resource: str) -> ResourceKind:
    """A resource that names an existing directory or regular file is one; anything else
    is a name."""
    if os.path.isdir(resource):
        return "dir"
    if os.path.isfile(resource):
        return "file"
    return "name"


@dataclass(frozen=True)
class PlanSandbox:
    """The sandbox of one plan: a directory per resource (see the module's docstring)."""

    root: Path
    copies: dict[str, Path]  # resource -> its copy

    @classmethod
    def of(cls, base: Path, plan: PlanState) -> PlanSandbox:
        root = base / _digest(plan.plan_id, 32)
        return cls(root, {r: root / _digest(r, 16) for r in plan.resources})

    def ensure(self) -> PlanSandbox:
        """Make each copy that does not exist yet (a strategy revision keeps the work)."""
        for resource, copy in self.copies.items():
            if not copy.exists():
                private_dirs(copy.parent)
                partial = copy.with_name(copy.name + ".partial")
                if partial.exists():
                    shutil.rmtree(partial)
                _copy_resource(resource, resource_kind(resource), partial)
                partial.rename(copy)  # a crash mid-copy leaves no half sandbox behind
        return self

    def existing(self) -> dict[str, Path]:
        """The copies that exist (a plan that never entered Execute here has none)."""
        return {r: c for r, c in self.copies.items() if c.is_dir()}

    def trees(
        self, kinds: Mapping[str, ResourceKind], found: Mapping[str, dict[str, Entry]]
    ) -> Trees:
        """Each resource's kind and the manifest of its copy, from entries already read
        (``found``: resource -> ``trees.entries`` of its copy)."""
        return {
            r: (kinds[r], manifest_of(found[r], kinds[r], os.path.basename(r))) for r in self.copies
        }

    def snapshot(self) -> Trees:
        """The trees of the copies as they are now, each resource's kind as it is now."""
        kinds = {r: resource_kind(r) for r in self.copies}
        return self.trees(kinds, {r: entries(c) for r, c in self.copies.items()})

    def clear_names(self, kinds: Mapping[str, ResourceKind]) -> None:
        """Empty the private directory of each named resource: its writes never survive."""
        for resource, copy in self.copies.items():
            if kinds.get(resource) == "name" and copy.is_dir():
                for child in copy.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()

    @property
    def run_snapshots(self) -> Path:
        """Where the plan's validation runs keep their snapshots: beside its copies (the
        only part of the sandbox the plan's programs may write), never in them."""
        return self.root / "run-snapshots"

    @contextlib.contextmanager
    def apply_lock(self) -> Iterator[None]:
        """Held for the whole of an Apply: a second Apply (or resume) of the same plan
        on this machine is refused at once (``ApplyBusy``) instead of racing it."""
        private_dirs(self.root)
        fd = os.open(self.root / "apply.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ApplyBusy("another Apply of this plan is under way") from None
            yield
        finally:
            os.close(fd)


@dataclass(frozen=True)
class RunSnapshot:
    """What one validation run judges: the plan's sandbox copied once
    (``trees.copy_tree``: no link followed, a hard link copied by content) into a
    directory of the run that no program of the plan may write. Its entries are the trees
    the run records and its token binds, and every validation of the run works in a copy
    of it — never in the live sandbox, which the agent may rewrite at any moment."""

    copies: dict[str, Path]  # resource -> its copy in the snapshot
    judged: dict[str, dict[str, Entry]]  # resource -> the entries of its copy
    skipped: dict[str, dict[str, Entry]]  # resource -> what no copy holds (sockets, devices)

    @classmethod
    @contextlib.contextmanager
    def taken(cls, base: Path, run_id: str, sources: Mapping[str, Path]) -> Iterator[RunSnapshot]:
        """The snapshot of ``sources`` (resource -> its sandbox copy) in ``base/run_id``,
        removed when the run ends, whatever happens (one left by a killed run is removed
        by the next run's)."""
        root = base / run_id
        held = _claim(base, root)
        try:
            yield cls._copied(root, sources)
        finally:
            remove_tree(root)
            os.close(held)

    @classmethod
    def _copied(cls, root: Path, sources: Mapping[str, Path]) -> RunSnapshot:
        copies = {r: root / _digest(r, 16) for r in sources}
        skipped: dict[str, dict[str, Entry]] = {}
        for resource, source in sources.items():
            try:
                skipped[resource] = copy_tree(source, copies[resource])
            except OSError as exc:
                raise CommandRefused(
                    f"cannot snapshot the sandbox of {resource} for the run: {exc.strerror} "
                    f"({exc.filename!r}); validate again"
                ) from None
        judged = {r: {**entries(c), **skipped[r]} for r, c in copies.items()}
        return cls(copies, judged, skipped)

    def changed(self) -> dict[str, list[str]]:
        """The paths of each copy that differ from what the run judged (written during the
        run: a validation reading it after the write read what was not judged)."""
        found = {
            r: changed_paths(self.judged[r], {**entries(c), **self.skipped[r]})
            for r, c in self.copies.items()
        }
        return {r: paths for r, paths in found.items() if paths}


def _claim(base: Path, root: Path) -> int:
    """Make ``root`` and lock it for the run (the descriptor is held until the run ends),
    first removing the snapshots no run holds any longer (their run was killed)."""
    private_dirs(base)
    guard = os.open(base / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)  # one claim or sweep at a time
        for found in base.iterdir():
            if not found.name.startswith(".") and _unheld(found):
                remove_tree(found)
        root.mkdir(0o700)
        held = os.open(root, _DIR_FLAGS)
        fcntl.flock(held, fcntl.LOCK_EX)
        return held
    finally:
        os.close(guard)


def _unheld(path: Path) -> bool:
    """A snapshot directory no live run holds."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _copy_resource(resource: str, kind: ResourceKind, copy: Path) -> None:
    if kind == "dir":
        shutil.copytree(resource, copy, symlinks=True, copy_function=copy_entry)
    else:
        copy.mkdir()
        if kind == "file":
            shutil.copy2(resource, copy / os.path.basename(resource))


class ApplyBusy(Exception):
    """Another process holds this plan's Apply."""


class ApplyConflict(Exception):
    """The real resource is not as the snapshot (or the change) says at a path."""


# -- Apply: the change set, and writing it --------------------------------------------------


def read_changes(
    changes: list[FileChange], copies: Mapping[str, Path], kinds: Mapping[str, ResourceKind]
) -> dict[str, bytes]:
    """The content of each file the change set writes, read from the sandbox and checked
    against its digest (the sandbox can change between the check and the read)."""
    contents: dict[str, bytes] = {}
    for change in changes:
        if change.kind != "file":
            continue
        base = copies[change.resource]
        path = base / check_relative_path(change.path, "change path")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            data = handle.read()
        if hashlib.sha256(data).hexdigest() != change.sha256:
            raise ApplyConflict(f"{change.resource}/{change.path} changed in the sandbox")
        contents[change.sha256] = data
    return contents


def change_blob(changes: list[FileChange], contents: dict[str, bytes]) -> bytes:
    """The change set as one blob (what ``changes_sha256`` names): each entry's record,
    with a file's content (base64), canonical JSON — everything Apply needs to finish
    after a crash, in the evidence."""
    return canonical_json(
        [
            {
                **msgspec.to_builtins(c),
                **(
                    {"content": base64.b64encode(contents[c.sha256]).decode()}
                    if c.kind == "file"
                    else {}
                ),
            }
            for c in changes
        ]
    )


def change_contents(blob: bytes) -> dict[str, bytes]:
    """File contents by SHA-256 from a change-set blob, each checked against its digest."""
    contents: dict[str, bytes] = {}
    for entry in msgspec.json.decode(blob):
        if entry.get("kind", "file") != "file":
            continue
        data = base64.b64decode(entry["content"], validate=True)
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ValueError(
                f"the change set's content of {entry['path']} does not hash to its digest"
            )
        contents[entry["sha256"]] = data
    return contents


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _base(resource: str, kind: ResourceKind) -> str:
    """The directory a change's path is relative to: the resource itself, or for a
    single-file resource the directory holding it."""
    return resource if kind == "dir" else os.path.dirname(os.path.abspath(resource))


@contextlib.contextmanager
def _parent_fd(resource: str, kind: ResourceKind, path: str) -> Iterator[tuple[int, str]]:
    """A descriptor of the directory holding ``path`` inside the resource, reached one
    component at a time without following a link, and the last component's name."""
    parts = list(check_relative_path(path, "change path").parts)
    try:
        fd = os.open(_base(resource, kind), _DIR_FLAGS)
    except OSError as exc:
        raise ApplyConflict(f"cannot open {resource}: {exc.strerror}") from None
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                where = "/".join(parts[: i + 1])
                if exc.errno == errno.ENOENT:
                    raise FileNotFoundError(f"{resource}/{where} does not exist") from None
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise ApplyConflict(
                        f"{resource}/{where} is not a directory (a symlink is never followed)"
                    ) from None
                raise ApplyConflict(f"cannot open {resource}/{where}: {exc.strerror}") from None
            os.close(fd)
            fd = child
        yield fd, parts[-1]
    finally:
        os.close(fd)


def real_entry(resource: str, kind: ResourceKind, path: str) -> Entry | None:
    """The real resource's entry at ``path`` (as ``trees.scan`` records it; None when
    absent), read without following a link."""
    try:
        with _parent_fd(resource, kind, path) as (fd, name):
            return _entry_at(fd, name)
    except FileNotFoundError:
        return None
    except ApplyConflict:
        return ("special", 0, "unreachable")


def _entry_at(fd: int, name: str) -> Entry | None:
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISDIR(st.st_mode):
        return ("dir", mode, "")
    if stat.S_ISLNK(st.st_mode):
        return ("symlink", mode, os.readlink(name, dir_fd=fd))
    if stat.S_ISREG(st.st_mode):
        return ("file", mode, _sha256_at(fd, name))
    return ("special", mode, str(stat.S_IFMT(st.st_mode)))


def _sha256_at(dir_fd: int, name: str) -> str:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def change_entry(change: FileChange) -> Entry | None:
    """What the change leaves at its path, as a tree entry (None: nothing)."""
    if change.kind == "absent":
        return None
    if change.kind == "symlink":
        return ("symlink", 0o777, str(change.target))
    if change.kind == "dir":
        return ("dir", change.mode, "")
    return ("file", change.mode, change.sha256)


def _temp_name(name: str) -> str:
    return f".{name[:100]}.{secrets.token_hex(12)}.evidence-apply"


def _clear_leftovers(fd: int, name: str) -> None:
    """Remove what an Apply killed between its temporary file and the rename left beside
    ``name`` (only names of ``_temp_name``'s exact shape: nothing else is touched), so a
    resumed Apply leaves nothing but the intended files."""
    left = re.compile(re.escape(f".{name[:100]}.") + r"[0-9a-f]{24}\.evidence-apply")
    for found in os.listdir(fd):
        if left.fullmatch(found):
            os.unlink(found, dir_fd=fd)


def write_change(change: FileChange, data: bytes, kind: ResourceKind) -> bool:
    """Put one entry in place without following a link; False when it already matched.
    A file goes to an exclusively created, unpredictable temporary name beside its
    target, is synced, given its mode and renamed over the target (a crash leaves the
    old file or the new one, never half of one; a link planted at the target is
    replaced, never written through)."""
    with _parent_fd(change.resource, kind, change.path) as (fd, name):
        _clear_leftovers(fd, name)
        now = _entry_at(fd, name)
        wanted = change_entry(change)
        if now == wanted:
            return False
        if change.kind == "absent":
            if now is not None and now[0] == "dir":
                os.rmdir(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)
            return True
        if change.kind == "dir":
            if now is not None and now[0] != "dir":
                raise ApplyConflict(f"{change.resource}/{change.path} is not a directory")
            if now is None:
                os.mkdir(name, 0o700, dir_fd=fd)
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            try:
                os.fchmod(child, change.mode)
            finally:
                os.close(child)
            return True
        if now is not None and now[0] == "dir":
            raise ApplyConflict(f"{change.resource}/{change.path} is a directory")
        temp = _temp_name(name)
        if change.kind == "symlink":
            os.symlink(str(change.target), temp, dir_fd=fd)
        else:
            out = os.open(
                temp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=fd,
            )
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(out, view) :]
                os.fchmod(out, change.mode)
                os.fsync(out)
            finally:
                os.close(out)
        os.rename(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
        os.fsync(fd)
        return True
