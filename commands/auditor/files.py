"""``audit --plan P --files DIR``: a resource directory against the snapshot P's first
Execute took plus every change set applied to it since."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from commands.runner.sandbox import Trees, change_entry, decode_trees
from commands.runner.trees import Entry, Manifest, entries, manifest_of
from ledger import LogReader
from ledger.events import ChangesRecorded, ExecuteEntered, FileChange, PlanApplied
from projections.documents import fold_plan

from .findings import Violation

__all__ = ["check_files"]


def check_files(store: LogReader, plan_id: str, directory: Path) -> list[Violation]:
    """``audit --plan P --files DIR``: DIR against what it should hold — the resource as
    P's snapshot at Execute saw it, plus every change set applied to that resource since
    (P's own included, even unfinished), in log order — every differing path reported,
    so a write that no Apply made is seen too. DIR is the resource it names (or P's only
    directory or file resource)."""
    events = store.read_stream(f"plan:{plan_id}")
    doc = fold_plan.fold_all(e.payload for e in events)
    if doc is None or doc.snapshot_sha256 is msgspec.UNSET:
        return [
            _files_violation(
                plan_id,
                f"plan {plan_id} entered Execute with a snapshot of its resources",
                "no snapshot: nothing to compare the files with",
            )
        ]
    blob = store.get_blob(doc.snapshot_sha256)
    snapshot = decode_trees(bytes(blob)) if blob is not None else {}
    trees = {r: t for r, t in snapshot.items() if t[0] != "name"}
    chosen = _chosen(trees, directory)
    if chosen is None:
        return [
            _files_violation(
                plan_id,
                f"{directory} is one of plan {plan_id}'s resources",
                ", ".join(sorted(trees)) or "no directory or file resource",
            )
        ]
    kind, manifest = trees[chosen]
    expected: dict[str, Entry | None] = {**_as_entries(manifest)}
    started = next(e.position for e in events if isinstance(e.payload, ExecuteEntered))
    for change in _applied_changes(store, plan_id, started):
        if change.resource == chosen:
            expected[change.path] = change_entry(change)
    actual = _as_entries(manifest_of(entries(directory), kind, os.path.basename(chosen)))
    return _differences(plan_id, expected, actual)


def _chosen(trees: Trees, directory: Path) -> str | None:
    """The resource ``directory`` names, or the plan's only one."""
    return next(
        (r for r in trees if Path(r).resolve() == directory.resolve()),
        next(iter(trees)) if len(trees) == 1 else None,
    )


def _as_entries(manifest: Manifest) -> dict[str, Entry]:
    return {path: (str(e[0]), int(e[1]), str(e[2])) for path, e in manifest.items()}


def _differences(
    plan_id: str, expected: dict[str, Entry | None], actual: dict[str, Entry]
) -> list[Violation]:
    problems: list[Violation] = []
    for path in sorted(set(expected) | set(actual)):
        want, have = expected.get(path), actual.get(path)
        if want == have:
            continue
        problems.append(
            _files_violation(plan_id, f"{path}: {_entry_text(want)}", _entry_text(have))
        )
    return problems


def _files_violation(plan_id: str, expected: str, found: str) -> Violation:
    return Violation(
        position=None, plan_id=plan_id, invariant="files", expected=expected, found=found
    )


def _applied_changes(store: LogReader, plan_id: str, since: int) -> list[FileChange]:
    """The change sets recorded after position ``since`` that count: every plan's that
    completed (``plan.applied``), and ``plan_id``'s own even unfinished; in log order."""
    types = [ChangesRecorded.type_name(), PlanApplied.type_name()]
    recorded: dict[str, tuple[int, list[FileChange]]] = {}
    applied: set[str] = set()
    for event in store.read_all(since, types=types):
        p = event.payload
        if isinstance(p, ChangesRecorded):
            recorded[p.token_id] = (event.position, list(p.changes))
            if p.plan_id == plan_id:
                applied.add(p.token_id)
        elif isinstance(p, PlanApplied):
            applied.add(p.token_id)
    ordered = sorted(recorded[t] for t in applied if t in recorded)
    return [change for _position, changes in ordered for change in changes]


def _entry_text(entry: Entry | None) -> str:
    if entry is None:
        return "absent"
    kind, mode, content = entry
    if kind == "file":
        return f"file {oct(mode)} sha256 {content}"
    if kind == "symlink":
        return f"symlink to {content}"
    return f"{kind} {oct(mode)}"
