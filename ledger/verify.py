"""Verify the log from its stored bytes alone.

Recomputes every leaf from the row's columns (RFC 8785 envelope), the hash chain and the
RFC 9162 root, checks positions are dense from 1 and stream versions dense per stream,
and compares the result with the ledger head. With an earlier tree head (size, root)
that an auditor kept, also checks the current log extends it: the root of the first
``size`` leaves, recomputed from the stored rows, must equal the kept root. That catches
a truncated tail (head rewound) and a suffix rewritten consistently, which no check of
the log against itself can.

With ``check_blobs`` (the default) the blob store is checked too: every stored blob must
hash to its digest, and every blob an event references (its type's ``BLOB_FIELDS``) must
be stored (``blob_missing``, at the event's position: deleting the raw output behind a
passing result leaves the log's hashes intact, so only this check shows it).

Every problem found is reported with its position; ``first_bad_position`` names the
earliest. Checking continues past a bad row (up to ``max_problems``) so one edit does not
hide another: the chain check at row i uses the stored chain hash of row i-1.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from hashlib import sha256
from typing import Any

import msgspec

from .backends import make_engine
from .envelope import GENESIS_CHAIN, LEAF_TEMPLATE, json_string
from .errors import LedgerError
from .events import Catalog
from .merkle import Frontier, merge_up
from .rows import Row
from .store import Store

__all__ = [
    "ROWS_PER_JOB",
    "Problem",
    "TreeHeadRef",
    "VerifyReport",
    "available_cores",
    "parse_tree_head",
    "process_context",
    "verify_store",
]

# A part checked by one process: a power of two, so each part's tree is one perfect
# subtree of the log's (aligned where it starts) and the parts' trees join exactly.
ROWS_PER_JOB = 1 << 15
Progress = Callable[[int, int], None]  # (rows checked, rows in all)


class Problem(msgspec.Struct, frozen=True):
    position: int | None  # None: about the head or a blob, not one row
    kind: str
    detail: str


class TreeHeadRef(msgspec.Struct, frozen=True):
    size: int
    root: str  # hex
    ok: bool | None = None


class VerifyReport(msgspec.Struct, kw_only=True):
    ok: bool
    size: int
    root: str
    chain_hash: str
    checked_events: int
    checked_blobs: int
    first_bad_position: int | None
    against: TreeHeadRef | None
    problems: list[Problem]


def parse_tree_head(text: str) -> TreeHeadRef:
    """Parse ``SIZE:ROOT_HEX`` as printed by ``evidence verify``."""
    size_text, sep, root = text.partition(":")
    if not sep or not size_text.isdigit():
        raise ValueError(f"tree head {text!r} is not SIZE:ROOT_HEX")
    root = root.strip().lower()
    if len(root) != 64 or any(c not in "0123456789abcdef" for c in root):
        raise ValueError(f"tree head root {root!r} is not 64 hex characters")
    return TreeHeadRef(size=int(size_text), root=root)


def verify_store(
    store: Store,
    *,
    against: TreeHeadRef | None = None,
    check_blobs: bool = True,
    max_problems: int = 100,
    jobs: int = 1,
    progress: Progress | None = None,
    rows_per_job: int = ROWS_PER_JOB,
) -> VerifyReport:
    """Check the whole log (see the module's docstring). ``jobs`` > 1 checks parts of
    ``ROWS_PER_JOB`` rows in that many processes and joins their Merkle trees (a log of
    one part is checked here); ``progress`` is told the rows checked so far and the
    total as parts finish (in one process: as batches of rows are)."""
    if against is not None:
        against = parse_tree_head(f"{against.size}:{against.root}")  # validates, lowercases
    problems: list[Problem] = []

    def report(position: int | None, kind: str, detail: str) -> None:
        if len(problems) < max_problems:
            problems.append(Problem(position, kind, detail))

    with store.snapshot() as snap:
        head_size, head_chain, head_frontier = snap.head_row()
        # The blobs first (their digests are what the scan checks references against);
        # their problems are reported after the rows', as they always were.
        checked_blobs, stored, mismatched = _blobs(snap) if check_blobs else (0, None, [])
        against_size = against.size if against is not None else None
        if rows_per_job < 1 or rows_per_job & (rows_per_job - 1):
            raise ValueError(f"rows_per_job {rows_per_job} is not a power of two")
        chunks = snap.chunks(rows_per_job) if jobs > 1 else []
        if len(chunks) > 1:
            frontier, last_chain, at_against = _scan_in_parts(
                store,
                chunks,
                rows_per_job,
                against_size,
                report,
                jobs,
                progress,
                check_references=stored is not None,
                max_problems=max_problems,
            )
        else:
            rows = snap.rows()
            if progress is not None:
                rows = _told(rows, progress, head_size)
            frontier, last_chain, at_against, _ = _scan(
                rows, against_size, report, store.catalog, stored
            )
        for digest in mismatched:
            report(None, "blob_mismatch", f"blob {digest} does not hash to its digest")
    size = frontier.size
    root = frontier.root()
    _check_head(report, (head_size, head_chain, head_frontier), frontier, last_chain)
    against_out = None
    if against is not None:
        against_out = _check_against(report, against, size, at_against)

    positions = [p.position for p in problems if p.position is not None]
    return VerifyReport(
        ok=not problems,
        size=size,
        root=root.hex(),
        chain_hash=last_chain.hex(),
        checked_events=size,
        checked_blobs=checked_blobs,
        first_bad_position=min(positions) if positions else None,
        against=against_out,
        problems=problems,
    )


def _blobs(snap: Any) -> tuple[int, set[str], list[str]]:
    """Every stored blob read and hashed: how many, their digests, and those whose bytes
    do not hash to their digest (or differ from their recorded length)."""
    checked, stored, mismatched = 0, set(), []
    for digest, length, data in snap.blobs():
        checked += 1
        stored.add(digest)
        if sha256(data).hexdigest() != digest or len(data) != length:
            mismatched.append(digest)
    return checked, stored, mismatched


def _check_head(
    report: Callable[[int | None, str, str], None],
    head: tuple[int, bytes, bytes],
    frontier: Frontier,
    last_chain: bytes,
) -> None:
    """The head row (size, chain hash, Merkle frontier) against what the rows give."""
    head_size, head_chain, head_frontier = head
    size = frontier.size
    if head_size != size:
        report(None, "head_size", f"the head records {head_size} events, the log holds {size}")
    if head_chain != last_chain:
        report(None, "head_chain", "the head's chain hash is not the last row's chain hash")
    if head_frontier != frontier.to_bytes():
        report(None, "head_root", "the head's Merkle tree does not match the recomputed one")


def _check_against(
    report: Callable[[int | None, str, str], None],
    against: TreeHeadRef,
    size: int,
    at_against: Frontier | None,
) -> TreeHeadRef:
    """A kept tree head against the log: the log holds at least its events, and its
    first ``against.size`` hash to its root."""
    against_root = at_against.root() if at_against is not None else None
    if against.size > size:
        report(
            None,
            "against_truncated",
            f"the kept tree head has {against.size} events but the log holds only "
            f"{size}: the log was truncated",
        )
        ok_against = False
    else:
        ok_against = against_root is not None and against_root.hex() == against.root
        if not ok_against:
            report(
                None,
                "against_inconsistent",
                f"the first {against.size} events do not hash to the kept root "
                f"{against.root}: the log was rewritten since that tree head",
            )
    return TreeHeadRef(size=against.size, root=against.root, ok=ok_against)


def _scan(
    rows: Iterable[list[Row]],
    against_size: int | None,
    report: Callable[[int | None, str, str], None],
    catalog: Catalog,
    stored: set[str] | None,
    *,
    expected: int = 1,
    previous_chain: bytes = GENESIS_CHAIN,
    first_seen: dict[str, tuple[int, int]] | None = None,
) -> tuple[Frontier, bytes, Frontier | None, dict[str, int]]:
    """Check every row; return the recomputed tree, the last stored chain hash, the tree
    at ``against_size`` leaves (if given and reached) and each stream's last version.

    Kept whole: the loop's body runs once per event of the log, with every check's
    state in locals; ``verify`` is bounded by its hashes (docs/performance.md), and a
    call per check per row would not be.
    With ``stored`` (the digests in the blob store), also check that every blob a row
    references is among them.

    A part of the log checked apart (``verify --jobs``) starts at ``expected``, after the
    row whose chain hash is ``previous_chain``; its tree is over its own rows, and a
    stream's first version in it is recorded in ``first_seen`` for the caller to check
    against the parts before, instead of being checked here.

    This loop is the whole cost of ``verify``, so it is written flat: the JSON forms of
    the few distinct streams, types and actors are cached, and the Merkle frontier is
    updated inline (the same steps as ``Frontier.append``). Payloads are not decoded:
    only a row whose raw ``type`` has ``BLOB_FIELDS`` has just those fields read. A
    payload that cannot be read is left to the leaf check (an edit) and the read path (a
    type or version this catalog does not know): verify itself needs no decoding. Each
    row is unpacked as the plain tuple the driver gives, in ``StoredRow``'s order (the
    snapshot's SELECT is built from it): no ``StoredRow`` is made per row.
    """
    frontier = Frontier()
    hashes = frontier.hashes
    size = 0
    versions: dict[str, int] = {}
    encoded: dict[str | None, bytes] = {None: b"null"}
    at_against = Frontier() if against_size == 0 else None
    # The leaf's 0x00 prefix in the template: the hashed bytes are formatted in one
    # buffer, not formatted and then copied behind the prefix.
    template = b"\x00" + LEAF_TEMPLATE
    # Blobs are checked only with ``stored``: without it there are no readers, so
    # ``present`` is never consulted.
    readers = catalog.blob_readers() if stored is not None else {}
    present: set[str] = stored if stored is not None else set()
    astuple = msgspec.structs.astuple
    # ``expected``: the next position; after a hole, resynchronised to what is stored
    for batch in rows:
        for (
            position,
            event_id,
            stream,
            stream_version,
            type_name,
            sv,
            recorded_at,
            actor,
            corr,
            caus,
            payload,
            delta,
            stored_leaf,
            stored_chain,
        ) in batch:
            if position != expected:
                report(
                    position,
                    "hole",
                    f"position {expected} is missing (next stored position is {position})",
                )
            expected = position + 1
            try:
                stream_json = encoded[stream]
            except KeyError:
                stream_json = encoded[stream] = json_string(stream)
            try:
                type_json = encoded[type_name]
            except KeyError:
                type_json = encoded[type_name] = json_string(type_name)
            try:
                actor_json = encoded[actor]
            except KeyError:
                actor_json = encoded[actor] = json_string(actor)
            leaf = sha256(
                template
                % (
                    actor_json,
                    encoded[caus] if caus is None else json_string(caus),
                    encoded[corr] if corr is None else json_string(corr),
                    delta,
                    json_string(event_id),
                    payload,
                    position,
                    json_string(recorded_at),
                    sv,
                    stream_json,
                    stream_version,
                    type_json,
                )
            ).digest()
            if leaf != stored_leaf:
                report(
                    position,
                    "leaf_mismatch",
                    "the stored row does not hash to its leaf hash (content changed)",
                )
            if sha256(previous_chain + stored_leaf).digest() != stored_chain:
                report(
                    position,
                    "chain_mismatch",
                    "chain hash does not follow from the previous row (a row before it "
                    "was rewritten, removed or reordered)",
                )
            last = versions.get(stream)
            if last is None and first_seen is not None:
                first_seen[stream] = (position, stream_version)  # the caller checks it
            elif stream_version != (last or 0) + 1:
                report(
                    position,
                    "stream_version",
                    f"stream {stream!r} jumps from version {last or 0} to {stream_version}",
                )
            versions[stream] = stream_version
            previous_chain = stored_chain
            reader = readers.get(type_name)
            if reader is not None:
                try:
                    if sv == reader[0]:
                        values = astuple(reader[1].decode(payload))
                    else:  # stored by an older version: upcast first (rare)
                        upcast = catalog.decode(type_name, sv, payload)
                        values = tuple(getattr(upcast, f) for f in reader[2])
                except (LedgerError, msgspec.DecodeError, msgspec.ValidationError):
                    values = ()
                for digest in values:
                    if digest is not None and digest not in present:
                        _missing(report, position, type_name, reader[2], values, present)
                        break
            hashes.append(leaf)  # as Frontier.append
            merge_up(hashes, size)
            size += 1
            if size == against_size:
                at_against = Frontier(size, hashes)
    frontier.size = size
    return frontier, bytes(previous_chain), at_against, versions


def _told(batches: Iterable[list[Row]], progress: Progress, total: int) -> Iterator[list[Row]]:
    """``batches`` as they are, ``progress`` told the rows handed out before each next
    one is read (once a batch: nothing in the loop over rows)."""
    done = 0
    for batch in batches:
        yield batch
        done += len(batch)
        progress(done, max(done, total))


def _missing(
    report: Callable[[int | None, str, str], None],
    position: int,
    type_name: str,
    fields: tuple[str, ...],
    values: tuple[str | None, ...],
    stored: set[str],
) -> None:
    """Report each blob the row at ``position`` references that is not stored."""
    for field, digest in zip(fields, values, strict=True):
        if digest is not None and digest not in stored:
            report(
                position,
                "blob_missing",
                f"{type_name} {field} names blob {digest}, which the blob store does not hold",
            )


# -- verify --jobs ---------------------------------------------------------------------


class _Part(msgspec.Struct, kw_only=True):
    """What one process found in its part of the log."""

    rows: int
    frontier: list[bytes]
    last_chain: bytes
    at_against: list[bytes] | None
    first_seen: dict[str, tuple[int, int]]
    versions: dict[str, int]
    problems: list[Problem]


def _scan_in_parts(
    store: Store,
    chunks: list[tuple[int, int, bytes]],
    rows_per_job: int,
    against_size: int | None,
    report: Callable[[int | None, str, str], None],
    jobs: int,
    progress: Progress | None,
    *,
    check_references: bool,
    max_problems: int,
) -> tuple[Frontier, bytes, Frontier | None]:
    """``_scan`` over ``chunks`` in ``jobs`` processes, found exactly as one scan finds
    it: each part's rows are checked apart (leaves, the chain from the row before it,
    versions within it); here its tree is joined to the parts' before it, each stream's
    first version in a part is checked against the parts before, and the problems are
    reported in the order one scan reports them."""
    url = store.engine.url.render_as_string(hide_password=False)
    ends = [first - 1 for first, _, _ in chunks[1:]] + [None]
    relative = [
        against_size - i * rows_per_job
        if against_size is not None and i * rows_per_job < against_size <= (i + 1) * rows_per_job
        else None
        for i in range(len(chunks))
    ]
    tasks = [
        (
            url,
            first,
            last,
            previous + 1,
            chain or GENESIS_CHAIN,
            rel,
            check_references,
            max_problems,
        )
        for (first, previous, chain), last, rel in zip(chunks, ends, relative, strict=True)
    ]
    frontier, at_against = Frontier(), Frontier() if against_size == 0 else None
    versions: dict[str, int] = {}
    last_chain = GENESIS_CHAIN
    done, total = 0, len(chunks) * rows_per_job
    context = process_context()
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        for part, rel in zip(pool.map(_check_part, tasks), relative, strict=True):
            found = list(part.problems)
            for stream, (position, version) in part.first_seen.items():
                last = versions.get(stream, 0)
                if version != last + 1:
                    detail = f"stream {stream!r} jumps from version {last} to {version}"
                    found.append(Problem(position, "stream_version", detail))
            for problem in sorted(found, key=_scan_order):
                report(problem.position, problem.kind, problem.detail)
            versions.update(part.versions)
            if part.at_against is not None and rel is not None:
                at_against = frontier.copy()
                at_against.extend(Frontier(rel, part.at_against))
            frontier.extend(Frontier(part.rows, part.frontier))
            last_chain = part.last_chain
            done += part.rows
            if progress is not None:
                progress(done, max(done, total))
    return frontier, last_chain, at_against


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system says)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on every system
        return os.cpu_count() or 1


def process_context() -> multiprocessing.context.BaseContext:
    """How the parts' processes start (``verify --jobs``, ``verify --bundle --jobs``).
    A fork is quickest and is safe while this process runs one thread (the CLI): the
    children never touch the parent's connections, they open their own. With other
    threads running (a library caller, a test runner) one may hold a lock a fork would
    copy held: then from a fork server (started clean, this module imported once),
    else spawned."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    if "forkserver" in methods:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])
        return context
    return multiprocessing.get_context("spawn")


# The order in which one scan reports a row's problems.
_KINDS = ("hole", "leaf_mismatch", "chain_mismatch", "stream_version", "blob_missing")


def _scan_order(problem: Problem) -> tuple[int, int]:
    return problem.position or 0, _KINDS.index(problem.kind)


def _check_part(task: tuple[Any, ...]) -> _Part:
    """One process's part: rows ``first`` to ``last`` (None: to the end)."""
    url, first, last, expected, previous_chain, against_rel, check_references, limit = task
    problems: list[Problem] = []

    def report(position: int | None, kind: str, detail: str) -> None:
        if len(problems) < limit:
            problems.append(Problem(position, kind, detail))

    first_seen: dict[str, tuple[int, int]] = {}
    # Only reading, so no preparation: opening normally may upgrade the schema (DDL on
    # ledger_head), which would wait forever on the caller's snapshot that waits on us.
    store = Store(make_engine(url, must_exist=True))
    try:
        with store.snapshot() as snap:
            stored = snap.blob_digests() if check_references else None
            frontier, last_chain, at_against, versions = _scan(
                snap.rows(first=first, last=last),
                against_rel,
                report,
                store.catalog,
                stored,
                expected=expected,
                previous_chain=previous_chain,
                first_seen=first_seen,
            )
    finally:
        store.close()
    return _Part(
        rows=frontier.size,
        frontier=frontier.hashes,
        last_chain=last_chain,
        at_against=at_against.hashes if at_against is not None else None,
        first_seen=first_seen,
        versions=versions,
        problems=problems,
    )
