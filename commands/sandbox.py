"""A plan's sandbox: the copy of its directory resources that every tool call, fix and
validation of the plan works in, from Execute until Apply (seed 000: "Apply is the
point of no return"; seed 003: a failed output gate commits nothing).

One sandbox per plan, whatever the entry point (``evidence call``, ``validate``,
``fix``, ``run``, the Python API): it lives under the ledger's state directory (or
``--workdir``), named by the SHA-256 of the plan id — a name never becomes a path — and
each resource's copy by the SHA-256 of the resource. It is created when the plan first
enters Execute; nothing in it reaches the real resource before Apply.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ledger.signing import url_identity
from projections.documents import Document

__all__ = ["STATE_DIR_ENV", "PlanSandbox", "sandboxes_dir", "state_dir"]

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
    def of(cls, base: Path, plan: Document) -> PlanSandbox:
        root = base / _digest(plan["plan_id"], 32)
        return cls(root, {r: root / _digest(r, 16) for r in plan.get("resources", [])
                          if os.path.isdir(r)})

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
