"""What an approver decides on (docs/cli.md, "evidence authorize"): each pending
escalation with its evidence, as every door lists it (the CLI on the database, and
``/v1/approver/pending`` through the service):

- the escalation's reason, when it expires, how many approvers it needs and who signed
  what so far, the plan's strategy;
- the failing results of the plan's last run (their messages, the tails of what their
  programs said);
- the changes that run judged: the difference between the trees it validated (its
  ``trees_sha256``) and the plan's snapshot at Execute, path by path, with a unified
  diff of each changed text file.

The list of changes comes from the log alone (both trees are blobs). The diff's bytes
come from disk (the ledger keeps the hashes of a run's files, not their content), so a
diff is shown only where the sandbox's file still hashes to what the run judged and the
resource's file to what the snapshot recorded; anything else says why it is missing.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

import msgspec

from commands.rules.plan_runs import last_run_failures, plan_runs
from commands.runner.sandbox import Trees, decode_trees
from ledger import RecordedEvent
from ledger.events import ValidationRunStarted
from projections.states import PlanState

from .core import Plane

__all__ = ["MAX_DIFF_BYTES", "MAX_FILE_BYTES", "pending_evidence", "run_changes"]

MAX_FILE_BYTES = 64 * 1024  # a file larger than this on either side gets no diff
MAX_DIFF_BYTES = 256 * 1024  # the diffs of one escalation, together


def pending_evidence(plane: Plane) -> list[dict[str, Any]]:
    """Every pending escalation with its evidence (the module's docstring), from the
    plans' read model caught up now: a listing, which needs no key (each decision is
    checked against the log where it is recorded)."""
    plane.projections.catch_up()
    decisions = []
    for doc in plane.projections.documents("plans"):
        if not isinstance(doc, PlanState) or doc.pending_decision is None:
            continue
        waiting = doc.pending_decision
        events = plan_runs(plane.store, doc.plan_id)
        extra = {
            "plan_id": doc.plan_id,
            "decision_id": waiting.decision_id,
            "options": waiting.options,
            "reason": waiting.reason,
            "expires_at": waiting.expires_at,
            "approvals_required": waiting.approvals_required,
            "approvals": waiting.approvals,
            "strategy": doc.strategy,
            "failures": [
                msgspec.to_builtins(f) for f in last_run_failures(events, plane.store.get_blob)
            ],
            "changes": run_changes(plane, doc),
        }
        decisions.append(
            {k: v for k, v in extra.items() if v is not None and v is not msgspec.UNSET}
        )
    return decisions


def run_changes(plane: Plane, plan: PlanState) -> list[dict[str, Any]]:
    """The changes the plan's last run judged, against its snapshot at Execute (none
    before a run, or where a blob is missing)."""
    started = plane.store.read_stream_types(
        f"plan:{plan.plan_id}", [ValidationRunStarted.type_name()]
    )
    judged = _trees(plane, _last_trees(started))
    snapshot = _trees(plane, plan.snapshot_sha256)
    if judged is None or snapshot is None:
        return []
    copies = plane.sandbox(plan).copies
    changes: list[dict[str, Any]] = []
    budget = [MAX_DIFF_BYTES]
    for resource in sorted(judged):
        kind, after = judged[resource]
        before = snapshot.get(resource, (kind, {}))[1]
        if kind == "name":
            continue
        base = Path(resource) if kind == "dir" else Path(resource).parent
        for path in sorted(set(after) | set(before)):
            old, new = before.get(path), after.get(path)
            if old == new:
                continue
            change = _change(resource, path, old, new)
            inside = not (Path(path).is_absolute() or ".." in Path(path).parts)
            if inside and (_is_file(old) or _is_file(new)):
                sides = (
                    _content(base / path, old),
                    _content(copies[resource] / path, new) if resource in copies else None,
                )
                change.update(_diff(path, sides, budget))
            changes.append(change)
    return changes


def _last_trees(events: list[RecordedEvent]) -> str | None:
    for event in reversed(events):
        p = event.payload
        if isinstance(p, ValidationRunStarted) and p.trees_sha256 is not None:
            return p.trees_sha256
    return None


def _trees(plane: Plane, digest: object) -> Trees | None:
    if not isinstance(digest, str):
        return None
    blob = plane.store.get_blob(digest)
    if blob is None:
        return None
    try:
        return decode_trees(bytes(blob))
    except ValueError:
        return None


def _is_file(entry: list[Any] | None) -> bool:
    return entry is not None and entry[0] == "file"


def _change(resource: str, path: str, old: list[Any] | None, new: list[Any] | None) -> dict:
    """One path's change: added, removed or modified, its kind, and each side's
    content hash (a file's) or target (a symlink's)."""
    change: dict[str, Any] = {
        "resource": resource,
        "path": path,
        "change": "added" if old is None else "removed" if new is None else "modified",
        "kind": str((new or old or ["?"])[0]),
    }
    for side, entry in (("before", old), ("after", new)):
        if entry is not None and entry[0] in ("file", "symlink"):
            change[side] = str(entry[2])
    return change


def _content(path: Path, entry: list[Any] | None) -> bytes | str | None:
    """The bytes of ``path`` when they hash to what ``entry`` recorded (b"" for no file);
    else why not (a string); None when there is nothing to read from."""
    if entry is None:
        return b""
    if entry[0] != "file":
        return f"a {entry[0]}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return "no longer on disk"
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return "no longer a file"
        if st.st_size > MAX_FILE_BYTES:
            return f"over {MAX_FILE_BYTES // 1024} KiB"
        data = f.read(MAX_FILE_BYTES + 1)
    if hashlib.sha256(data).hexdigest() != entry[2]:
        return "changed on disk since it was recorded"
    return data


def _diff(path: str, sides: tuple[bytes | str | None, ...], budget: list[int]) -> dict:
    """A unified diff of the two sides, or why there is none (``diff_note``)."""
    old, new = sides
    for side in (old, new):
        if side is None:
            return {"diff_note": "the plan's sandbox is not on this host"}
        if isinstance(side, str):
            return {"diff_note": f"no diff: {side}"}
    assert isinstance(old, bytes) and isinstance(new, bytes)
    try:
        before, after = old.decode("utf-8"), new.decode("utf-8")
    except UnicodeDecodeError:
        return {"diff_note": "no diff: not UTF-8 text"}
    text = "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
    )
    if len(text.encode()) > budget[0]:
        return {
            "diff_note": f"no diff: the escalation's diffs are over {MAX_DIFF_BYTES // 1024} KiB"
        }
    budget[0] -= len(text.encode())
    return {"diff": text}
