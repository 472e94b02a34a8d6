"""Offline bundles: a part of the log an auditor verifies, audits and replays with no
database at all. This room is the bundles' front door (every public name is here) and
the reading of a bundle's file: its lines, the header's counts, then the records in
turn, the event lines in one pass or in parts across processes.

A bundle is one text file; each line is one record, the RFC 8785 canonical JSON of it:
a header, a signed checkpoint, the leaf hashes, the keys, K event lines and M blobs
(``ledger.bundle_format`` shows the records). Why this shape:

- An event is carried as its leaf bytes, the very bytes that were hashed: it is authentic
  when ``SHA256(0x00 || line) == leaves[position - 1]``; nothing is re-serialised.
- All N leaf hashes are carried (32 bytes an event) even when only one plan's events
  are. Their RFC 9162 root is what the checkpoint signs; the root of the first m of them
  checks any checkpoint of size m <= N that an auditor kept; and a plan's bundle needs
  no per-event proofs.
- A record a line, so a changed byte is reported at the record it hits.
- The blobs are carried, not just named: a blob an event references that the bundle
  lacks (deleted from the database before the export, or cut from the file) is a
  ``blob_missing`` problem at that event's position.

The rooms:

- ``ledger.bundle_format``: the records' types and decoders, shared by writer and reader.
- ``ledger.bundle_write``: ``write_bundle`` (the whole log, or ``--plan P``'s streams).
- ``ledger.bundle_limits``: the rules hostile bytes are held to, and how they are quoted.
- ``ledger.bundle_reader``: ``_Reader``, the checks of each record and event line.
- ``ledger.bundle_report``: ``BundleReport``, ``KeptCheckpoint`` and ``Bundle``.

A bundle is a file anyone may have written, so it is read defensively. The file is read
through ``ledger.intake`` (at most the bundle cap, ``EVIDENCE_MAX_BUNDLE_BYTES``; an
unreadable or over-cap file is an ``InputError``, a refused command); whatever in it
breaks a rule is a problem named with its line, never an exception. A header that
cannot be read stops the reading (nothing after it can be placed); any other record is
reported and the reading goes on, until ``max_problems`` problems: then it stops, so a
file of a million bad lines costs no more than a hundred.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .bundle_format import _HEAD_RECORDS, BUNDLE_FORMAT, BundleError, _Approver
from .bundle_limits import _line_ends
from .bundle_limits import _lines as _lines
from .bundle_reader import _LINES_PER_PART as _LINES_PER_PART
from .bundle_reader import _Reader
from .bundle_report import Bundle, BundleReport, KeptCheckpoint, _kept, _report
from .bundle_write import BundleSummary, write_bundle
from .events import DEFAULT_CATALOG, Catalog
from .intake import read_bytes
from .tlog_policy import Policy
from .verify import Problem, Progress
from .verify import process_context as process_context

__all__ = [
    "BUNDLE_FORMAT",
    "Bundle",
    "BundleError",
    "BundleReport",
    "BundleSummary",
    "KeptCheckpoint",
    "load_bundle",
    "verify_bundle",
    "write_bundle",
]

# The bundle's bytes, as forked processes checking parts of it inherit them (set only
# while they run).
_INHERITED: bytes | None = None


def _read(reader: _Reader, data: bytes) -> None:
    """Read a bundle's bytes into ``reader``: the file's lines and the header's counts,
    then the records in turn, the event lines in one pass or (``reader.jobs`` > 1, a
    large bundle of the right number of lines) in parts."""
    reader.progress_every = _LINES_PER_PART
    count = _line_count(reader, data)
    if count is None:
        return
    lines = _lines(data)
    head = list(itertools.islice(lines, _HEAD_RECORDS))
    header = _head(reader, head, count)
    if header is None:
        return
    events = header["events"]
    expected = _HEAD_RECORDS + events + header["blobs"]
    parts_apart = reader.jobs > 1 and events > _LINES_PER_PART and count == expected
    if parts_apart and reader.catalog is DEFAULT_CATALOG:
        approvers = _read_in_parts(reader, data, head, events)
        read = events
        lines = _lines(data, reader.event_range[1] + 1)
    else:
        approvers = reader._head_records(head)
        read = reader._events(itertools.islice(lines, events))
    if reader.full:
        return
    reader._blobs(lines, _HEAD_RECORDS + read + 1)
    reader._referenced()
    reader._approvers(approvers)


def _line_count(reader: _Reader, data: bytes) -> int | None:
    """How many lines ``data`` has (the last one even with no newline after it, a
    problem); None when it has no bytes at all (a problem that stops the reading)."""
    if not data:
        reader.problem(None, "header", "the bundle is empty (0 bytes)")
        return None
    complete = data.endswith(b"\n")
    if not complete:
        reader.problem(
            None,
            "truncated",
            "the bundle does not end with a newline: its last record is cut off",
        )
    return data.count(b"\n") + (0 if complete else 1)


def _head(reader: _Reader, head: list[bytes], count: int) -> dict[str, Any] | None:
    """The header, from the first of the bundle's first lines ``head``, its counts
    checked against the ``count`` lines the bundle has; None when there is none to read
    (the reading stops)."""
    if len(head) < _HEAD_RECORDS:
        reader.problem(
            None,
            "header",
            f"a bundle has at least {_HEAD_RECORDS} lines; this one has {len(head)}",
        )
        return None
    header = reader._header(head[0])
    if header is None:
        return None
    reader.header = header
    _check_counts(reader, header, count)
    return header


def _check_counts(reader: _Reader, header: dict[str, Any], count: int) -> None:
    """The header's counts agree with the ``count`` lines and with its tree."""
    events, blobs = header["events"], header["blobs"]
    expected = _HEAD_RECORDS + events + blobs
    if count != expected:
        reader.problem(
            None,
            "record_count",
            f"the header announces {events} events and {blobs} blobs "
            f"({expected} lines); the bundle has {count} lines",
        )
    if events > header["size"]:
        reader.problem(
            None,
            "record_count",
            f"the header announces {events} events in a tree of "
            f"{header['size']}: a bundle holds each event once",
        )
    elif header["plan"] is None and events != header["size"]:
        # The header is not signed: a plan's bundle relabelled as the whole log's
        # would otherwise pass with the other plans' events silently missing.
        reader.problem(
            None,
            "record_count",
            f"the header announces {events} events of a tree of "
            f"{header['size']} and no plan: a bundle of the whole log holds "
            "every event",
        )


# -- the event lines in parts ----------------------------------------------------------


def _read_in_parts(
    reader: _Reader, data: bytes, head: list[bytes], events: int
) -> list[_Approver] | None:
    """Check the ``events`` event lines in parts, in ``reader.jobs`` processes, and the
    head records meanwhile; when the parts do not join cleanly, the lines again in one
    pass. The approvers the keys record lists."""
    global _INHERITED
    header = reader.header
    begin = sum(len(line) + 1 for line in head)  # the first event line's offset
    ends = _line_ends(data, begin, events, _LINES_PER_PART)
    starts = [begin, *(end + 1 for end in ends[:-1])]
    reader.event_range = (begin, ends[-1])
    context = process_context()
    # Forked processes read the bytes they inherit; others are sent their part.
    _INHERITED = data if context.get_start_method() == "fork" else None
    tasks = [
        (header, _HEAD_RECORDS + 1 + i * _LINES_PER_PART, first, last)
        if _INHERITED is not None
        else (header, _HEAD_RECORDS + 1 + i * _LINES_PER_PART, data[first:last], None)
        for i, (first, last) in enumerate(zip(starts, ends, strict=True))
    ]
    try:
        with ProcessPoolExecutor(reader.jobs, mp_context=context) as pool:
            parts = pool.map(_check_event_part, tasks)
            # While the parts run: the leaves, their root, the keys, the signature.
            approvers = reader._head_records(head)
            joined = _join(reader, parts, events)
            if not joined:
                pool.shutdown(wait=False, cancel_futures=True)
    finally:
        _INHERITED = None
    if not joined:
        # Something is wrong somewhere: one pass names every problem exactly.
        reader._events(itertools.islice(_lines(data, begin), events))
    return approvers


class _EventPart(msgspec.Struct, kw_only=True):
    """What one process found in its part of a bundle's event lines (all of it only
    when ``clean``: a part stops at its first problem)."""

    clean: bool
    count: int
    positions: list[int]
    digests: bytes  # the leaf hashes, in line order
    first_seen: dict[str, tuple[int, int]]
    versions: dict[str, int]
    wanted: set[str]  # the digests of the blobs the events reference
    refs: set[str]
    approver_keys: list[_Approver]


def _check_event_part(task: tuple[dict[str, Any], int, Any, int | None]) -> _EventPart:
    """One process's part of the event lines (starting at line ``first_number``): its
    bytes, or (forked) where they are in the bytes it inherited."""
    header, first_number, first, last = task
    data = first if last is None else _INHERITED[first:last]  # type: ignore[index]
    reader = _Reader(None, None, DEFAULT_CATALOG, 1, keep_events=False)
    reader.header, reader.first_seen, reader.digests = header, {}, []
    reader._events(_lines(data), first_number)
    return _EventPart(
        clean=not reader.problems,
        count=reader.event_count,
        positions=reader.positions,
        digests=b"".join(reader.digests),
        first_seen=reader.first_seen,
        versions=reader.last_versions,
        wanted={digest for *_, digest in reader.wanted},
        refs=reader.refs,
        approver_keys=reader.approver_keys,
    )


def _join(reader: _Reader, results: Iterable[_EventPart], lines: int) -> bool:
    """Join the parts of the event lines checked apart (``_check_event_part``), in
    order; True when every part is clean and they join — positions in order, whole
    streams, every leaf hash the leaves record's — and only then are the reader's
    totals set. False as soon as anything is off: the caller reads the lines again
    in one pass, which finds and words the problems exactly as always."""
    parts = _clean_parts(reader, results, lines)
    if parts is None or not _parts_join(reader, parts):
        return False
    reader.wanted_digests = set()
    for part in parts:
        reader.event_count += part.count
        reader.wanted_digests.update(part.wanted)
        reader.refs.update(part.refs)
        reader.approver_keys.extend(part.approver_keys)
    return True


def _clean_parts(
    reader: _Reader, results: Iterable[_EventPart], lines: int
) -> list[_EventPart] | None:
    """The parts as they finish, in order (the progress told of each); None at the first
    one with a problem."""
    parts: list[_EventPart] = []
    for part in results:
        if not part.clean:
            return None
        parts.append(part)
        if reader.progress is not None:
            reader.progress(sum(p.count for p in parts), lines)
    return parts


def _parts_join(reader: _Reader, parts: list[_EventPart]) -> bool:
    """Whether clean parts join: positions in order across them, each stream's versions
    following on from one part to the next, every leaf hash the leaves record's."""
    previous = 0
    versions: dict[str, int] = {}
    # No owner is joined: a part judges a plan's bundle by the owner of its own
    # first event of a stream. Were the stream's first event another plan's, the
    # part holding it reported that; so with every part clean, no event is any
    # other plan's, by either reading.
    for part in parts:
        if part.positions and part.positions[0] <= previous:
            return False
        previous = part.positions[-1] if part.positions else previous
        for stream, (_, version) in part.first_seen.items():
            if version != versions.get(stream, 0) + 1:
                return False
        versions.update(part.versions)
        if reader.leaves and part.digests != b"".join(reader.leaves[p - 1] for p in part.positions):
            return False
    return True


# -- entry points ----------------------------------------------------------------------


def verify_bundle(
    path: str | os.PathLike[str],
    *,
    public_key: Ed25519PublicKey | None = None,
    kept_checkpoint: str | None = None,
    catalog: Catalog = DEFAULT_CATALOG,
    max_problems: int = 100,
    jobs: int = 1,
    progress: Progress | None = None,
    policy: Policy | None = None,
) -> BundleReport:
    """Check a bundle from its bytes alone: every record's form, every event against its
    leaf hash, the leaves against the signed checkpoint (by ``public_key``, else by the
    signer key the bundle carries: ``key_source`` says which), blobs against their
    digests, that every blob an event references is carried, and with
    ``kept_checkpoint`` that the bundle's tree extends it, and with ``policy`` that its
    checkpoint is signed by one of the policy's logs and cosigned by its quorum.

    ``jobs`` > 1 checks the event lines of a large bundle in parts, in that many
    processes (``progress`` is told the lines checked and the total as parts finish);
    a bundle with any problem is read again in one pass, so the report is always the
    one pass's. Unlike ``load_bundle`` it keeps no events."""
    data = read_bytes(path, "bundle", f"bundle {os.fspath(path)}")
    reader = _Reader(
        data,
        public_key,
        catalog,
        max_problems,
        keep_events=False,
        jobs=jobs,
        progress=progress,
    )
    _read(reader, data)
    kept = _kept(reader, kept_checkpoint) if kept_checkpoint is not None else None
    report = _report(reader, kept)
    return report if policy is None else _held_to(report, reader.checkpoint_note, policy)


def _held_to(report: BundleReport, note: str | None, policy: Policy) -> BundleReport:
    """The report with the bundle's checkpoint held to the auditor's witness ``policy``:
    signed by one of its logs and cosigned by its quorum, else a problem."""
    check = policy.check(note) if note is not None else None
    found = check.to_json() if check else {"log": None, "cosigned": [], "quorum": False}
    if check is not None and check.ok:
        return msgspec.structs.replace(report, policy=found)
    problem = Problem(
        None, "witness_policy", "the checkpoint is not signed and cosigned as the policy requires"
    )
    return msgspec.structs.replace(
        report, ok=False, policy=found, problems=[*report.problems, problem]
    )


def load_bundle(
    path: str | os.PathLike[str],
    *,
    public_key: Ed25519PublicKey | None = None,
    kept_checkpoint: str | None = None,
    catalog: Catalog = DEFAULT_CATALOG,
    max_problems: int = 100,
) -> Bundle:
    """Read and verify a bundle; ``Bundle.report`` says whether it can be trusted. The
    file is read through ``ledger.intake`` (the bundle cap): one that cannot be read, or
    is larger than the cap, raises ``InputError``; anything in it is a problem."""
    data = read_bytes(path, "bundle", f"bundle {os.fspath(path)}")
    reader = _Reader(data, public_key, catalog, max_problems)
    _read(reader, data)
    kept = _kept(reader, kept_checkpoint) if kept_checkpoint is not None else None
    return Bundle(reader, _report(reader, kept))
