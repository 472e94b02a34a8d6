"""A plan's sandbox: the copy of its directory resources that every tool call, fix and
validation of the plan works in, from Execute until Apply (Apply is the
point of no return; a failed output gate commits nothing).

One sandbox per plan, whatever the entry point (``evidence call``, ``validate``,
``fix``, ``run``, the Python API): it lives under the ledger's state directory (or
``--workdir``), named by the SHA-256 of the plan id — a name never becomes a path — and
each resource's copy by the SHA-256 of the resource. It is created when the plan first
enters Execute; nothing in it reaches the real resource before Apply.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import msgspec

from commands.names import check_relative_path, inside
from ledger.canonical import canonical_json
from ledger.events import FileChange
from ledger.store import url_identity
from projections.states import PlanState

__all__ = [
    "STATE_DIR_ENV",
    "PlanSandbox",
    "change_blob",
    "change_contents",
    "change_set",
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


def sandboxes_dir(db_url: str, workdir: Path | None = None) -> Path:
    """Where the plans of the ledger at ``db_url`` keep their sandboxes: under
    ``workdir`` or the state directory, one folder per ledger (two ledgers sharing a
    work directory never share a plan's sandbox)."""
    base = workdir.resolve() if workdir is not None else state_dir(db_url)
    return base / "sandboxes" / _digest(url_identity(db_url), 16)


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


@dataclass(frozen=True)
class PlanSandbox:
    """The sandbox of one plan: a directory per directory resource."""

    root: Path
    copies: dict[str, Path]  # resource -> its copy

    @classmethod
    def of(cls, base: Path, plan: PlanState) -> PlanSandbox:
        root = base / _digest(plan.plan_id, 32)
        return cls(root, {r: root / _digest(r, 16) for r in plan.resources if os.path.isdir(r)})

    def ensure(self) -> PlanSandbox:
        """Copy each resource that has no copy yet (a strategy revision keeps the work)."""
        for resource, copy in self.copies.items():
            if not copy.exists():
                copy.parent.mkdir(parents=True, exist_ok=True)
                partial = copy.with_name(copy.name + ".partial")
                if partial.exists():
                    shutil.rmtree(partial)
                shutil.copytree(resource, partial, symlinks=True)
                partial.rename(copy)  # a crash mid-copy leaves no half sandbox behind
        return self

    def existing(self) -> dict[str, Path]:
        """The copies that exist (a plan that never entered Execute here has none)."""
        return {r: c for r, c in self.copies.items() if c.is_dir()}


# -- Apply: the change set, and writing it --------------------------------------------------


def change_set(copies: dict[str, Path]) -> tuple[list[FileChange], dict[str, bytes]]:
    """Every regular file of each sandbox copy whose bytes or mode differ from the real
    resource's (sorted), and the contents by SHA-256. Symlinks are not carried over, and
    a file deleted in the sandbox stays in the resource: Apply writes, it never deletes."""
    changes: list[FileChange] = []
    contents: dict[str, bytes] = {}
    for resource, copy in sorted(copies.items()):
        for path in sorted(p for p in copy.rglob("*") if p.is_file() and not p.is_symlink()):
            relative = path.relative_to(copy).as_posix()
            data = path.read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            mode = path.stat().st_mode & 0o7777
            if _matches(Path(resource) / relative, digest, mode):
                continue
            contents[digest] = data
            changes.append(FileChange(resource=resource, path=relative, sha256=digest, mode=mode))
    return changes, contents


def change_blob(changes: list[FileChange], contents: dict[str, bytes]) -> bytes:
    """The change set as one blob (what ``changes_sha256`` names): each file's record with
    its content (base64), canonical JSON — everything Apply needs to finish after a crash,
    in the evidence."""
    return canonical_json(
        [
            {**msgspec.to_builtins(c), "content": base64.b64encode(contents[c.sha256]).decode()}
            for c in changes
        ]
    )


def change_contents(blob: bytes) -> dict[str, bytes]:
    """File contents by SHA-256 from a change-set blob, each checked against its digest."""
    contents: dict[str, bytes] = {}
    for entry in msgspec.json.decode(blob):
        data = base64.b64decode(entry["content"], validate=True)
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ValueError(
                f"the change set's content of {entry['path']} does not hash to its digest"
            )
        contents[entry["sha256"]] = data
    return contents


def write_change(change: FileChange, data: bytes) -> bool:
    """Put one file in place (write to a temp file beside it, then rename: a crash leaves
    the old file or the new one, never half of one). False when it already matched."""
    target = inside(Path(change.resource), check_relative_path(change.path, "change path"))
    if _matches(target, change.sha256, change.mode):
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.evidence-apply")
    with open(temp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.chmod(temp, change.mode)
    os.replace(temp, target)
    return True


def _matches(path: Path, digest: str, mode: int) -> bool:
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_mode & 0o7777 != mode:
            return False
        return hashlib.sha256(path.read_bytes()).hexdigest() == digest
    except OSError:
        return False
