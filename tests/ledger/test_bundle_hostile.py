"""Hostile bundles (issue 16, item 5): an offline bundle is a file an adversary may have
written, so every malformed record in it is a listed problem — exit 1 from ``verify``,
``audit`` and ``replay --bundle``, the record named by its line — never a traceback and
never unbounded time or memory; a file that cannot be read, or is larger than the
bundle cap, is a refused command (exit 2, one ``error:`` line). Nothing is appended to
any ledger.

The bundles are cut from a real SQLite ledger (a plan taken to Apply through an
escalation, and a second plan), then changed record by record. Where a change would only
be caught by a leaf hash, the bundle is also *re-signed*: its leaves, root and checkpoint
recomputed and signed with the plane's own key, so that the hashes and the signature all
hold and only the defensive parsing stands between the bytes and the audit.
"""

from __future__ import annotations

import base64
import json
import os
import random
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ledger
import ledger.bundle as bundle_module
from commands.plane import Plane
from commands.plane.plans import create_plan
from ledger.bundle import BundleError, load_bundle, verify_bundle, write_bundle
from ledger.canonical import canonical_json
from ledger.checkpoints import (
    Checkpoint,
    CheckpointError,
    parse_checkpoint,
    sign_checkpoint,
)
from ledger.intake import InputError
from ledger.keys import generate_key_pair
from ledger.merkle import leaf_hash, root_of
from tests.conftest import IN_CI
from tests.helpers import applied_plan, invoke

ORIGIN = "evidence-ledger/hostile"


class Source:
    """The ledger the bundles are cut from, and what a test needs of it."""

    def __init__(
        self,
        url: str,
        data: bytes,
        plan_data: bytes,
        key: Any,
        public_key: Any,
        pub_file: Path,
        head: Any,
    ) -> None:
        self.url = url
        self.data = data  # the whole-log bundle
        self.plan_data = plan_data  # the bundle of P-1
        self.key = key  # the plane's signing key
        self.public_key = public_key
        self.pub_file = pub_file
        self.head = head  # the ledger's tree head once the bundles were cut

    def __repr__(self) -> str:  # hypothesis prints it with a failing example
        return f"Source({self.url})"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    return make_source(tmp_path_factory.mktemp("hostile-source"))


def make_source(tmp: Path) -> Source:
    """A ledger with a plan taken to Apply and a second plan, and its bundles."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EVIDENCE_PLANE_KEY", str(tmp / "plane-state.key"))
        mp.setenv("EVIDENCE_STATE_DIR", str(tmp / "state"))
        url = f"sqlite:///{tmp / 'evidence.db'}"
        with Plane.open(url) as plane:
            applied_plan(plane, tmp)
            create_plan(plane, "P-2", project="web", resources=[str(tmp)], config={})
            keys = generate_key_pair(tmp / "plane.key")
            write_bundle(plane.store, tmp / "all.bundle", key=keys.private_key, origin=ORIGIN)
            write_bundle(
                plane.store, tmp / "p1.bundle", key=keys.private_key, origin=ORIGIN, plan="P-1"
            )
            head = plane.store.head()
    return Source(
        url,
        (tmp / "all.bundle").read_bytes(),
        (tmp / "p1.bundle").read_bytes(),
        keys.private_key,
        keys.public_key,
        tmp / "plane.key.pub",
        head,
    )


@pytest.fixture(autouse=True)
def _nothing_appended(request: pytest.FixtureRequest) -> Any:
    """After every test the source ledger is as it was: no bundle command appends."""
    yield
    if "source" in request.fixturenames:
        src: Source = request.getfixturevalue("source")
        with ledger.open(src.url) as store:
            assert store.head() == src.head


# -- building hostile bundles --------------------------------------------------------------


def lines_of(data: bytes) -> list[bytes]:
    assert data.endswith(b"\n")
    return data[:-1].split(b"\n")


def joined(lines: list[bytes]) -> bytes:
    return b"\n".join(lines) + b"\n"


def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


def members(raw: dict[str, bytes]) -> bytes:
    """A JSON object of raw member values, in canonical member order."""
    return (
        b"{" + b",".join(json.dumps(k).encode() + b":" + v for k, v in sorted(raw.items())) + b"}"
    )


def raw_members(line: bytes) -> dict[str, bytes]:
    return {k: canonical_json(v) for k, v in json.loads(line).items()}


def replace(line: bytes, **values: bytes) -> bytes:
    """``line`` (a JSON object) with some members' raw values replaced."""
    return members({**raw_members(line), **values})


def header_of(data: bytes) -> dict[str, Any]:
    return json.loads(lines_of(data)[0])


def n_events(data: bytes) -> int:
    return header_of(data)["events"]


def resigned(src: Source, lines: list[bytes]) -> bytes:
    """A whole-log bundle made consistent again around changed event lines: the leaves
    are the event lines' hashes, the header names their root, and the checkpoint over it
    is signed with the plane's own key. Only the parsing can tell what is wrong."""
    header = json.loads(lines[0])
    events = lines[4 : 4 + header["events"]]
    leaves = [leaf_hash(line) for line in events]
    root = root_of(leaves)
    header.update(size=len(leaves), root=root.hex())
    note = sign_checkpoint(Checkpoint(origin=ORIGIN, size=len(leaves), root=root), src.key)
    return joined(
        [
            canonical_json(header),
            canonical_json({"checkpoint": note}),
            canonical_json({"leaves": base64.b64encode(b"".join(leaves)).decode()}),
            *lines[3:],
        ]
    )


def with_event(src: Source, index: int, line: bytes, *, resign: bool = True) -> bytes:
    """The whole-log bundle with its ``index``-th event line (0-based) replaced."""
    lines = lines_of(src.data)
    lines[4 + index] = line
    return resigned(src, lines) if resign else joined(lines)


def event_line(src: Source, index: int) -> bytes:
    return lines_of(src.data)[4 + index]


def in_payload(line: bytes, old: bytes, new: bytes) -> bytes:
    """``line`` with the first ``old`` in its payload (not in its delta) replaced."""
    envelope, mark, rest = line.partition(b'"payload":')
    assert mark and old in rest
    return envelope + mark + rest.replace(old, new, 1)


def event_index(src: Source, type_name: str) -> int:
    return next(
        i for i in range(n_events(src.data)) if json.loads(event_line(src, i))["type"] == type_name
    )


# -- the verdict ----------------------------------------------------------------------------


def problems_of(report: Any) -> list[tuple[int | None, str, str]]:
    return [(p.position, p.kind, p.detail) for p in report.problems]


def assert_reported(
    tmp: Path, data: bytes, kind: str, fragment: str = "", *, kept: Path | None = None
) -> None:
    """``data`` as a bundle file is a verdict, never a traceback: ``verify_bundle`` lists
    a problem of ``kind`` whose detail holds ``fragment``, and ``verify``, ``audit`` and
    ``replay --bundle`` exit 1 with that problem (as JSON, and ``verify`` as text too),
    opening and creating no database. With ``kept``, ``verify --checkpoint KEPT`` only
    (the problem is in the kept checkpoint, not in the bundle)."""
    path = tmp / "hostile.bundle"
    path.write_bytes(data)
    nowhere = tmp / "absent.db"
    note = kept.read_text() if kept is not None else None
    report = verify_bundle(path, kept_checkpoint=note)
    assert not report.ok
    found = problems_of(report)
    assert any(k == kind and fragment in d for _, k, d in found), (kind, fragment, found)
    extra = ["--checkpoint", str(kept)] if kept is not None else []
    commands = (
        [["verify", *extra]] if kept is not None else [["verify"], ["audit"], ["replay", "P-1"]]
    )
    for args in commands:
        result = invoke(*args, "--bundle", str(path), "--json", "--db", f"sqlite:///{nowhere}")
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            args,
            repr(result.exception),
        )
        assert result.exit_code == 1, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        shown = json.loads(result.stdout)
        bundle = shown if args[0] == "verify" else shown["bundle"]
        assert shown["ok"] is False and any(
            p["kind"] == kind and fragment in p["detail"] for p in bundle["problems"]
        ), (args, bundle["problems"])
    text = invoke("verify", "--bundle", str(path), *extra, "--db", f"sqlite:///{nowhere}")
    assert text.exit_code == 1 and text.stdout.startswith("FAILED"), text.stdout
    assert "Traceback" not in text.stderr and not isinstance(
        text.exception, (ValueError, RecursionError, TypeError, KeyError)
    )
    assert not nowhere.exists()


def check_all(
    subtests: pytest.Subtests, tmp: Path, cases: list[tuple[str, bytes, str, str]]
) -> None:
    """Every case as its own subtest (named in a failure, the rest still run): the cases
    are built from the module's bundle (a fixture), so they are subtests, not parameters."""
    for name, data, kind, fragment in cases:
        with subtests.test(case=name):
            assert_reported(tmp, data, kind, fragment)


def test_the_unchanged_and_the_resigned_bundles_verify(source: Source, tmp_path: Path) -> None:
    """The controls: what the cases below change is the only thing wrong with them."""
    for data in (source.data, source.plan_data, resigned(source, lines_of(source.data))):
        path = tmp_path / "good.bundle"
        path.write_bytes(data)
        report = verify_bundle(path, public_key=source.public_key)
        assert report.ok, report.problems
        for args in (["verify"], ["audit"], ["replay", "P-1"]):
            result = invoke(
                *args, "--bundle", str(path), "--db", f"sqlite:///{tmp_path / 'absent.db'}"
            )
            assert result.exit_code == 0, (args, result.stdout, result.stderr)
    assert resigned(source, lines_of(source.data)) == source.data


# -- the file as a whole --------------------------------------------------------------------


def test_empty_blank_crlf_truncated_and_stray_bytes(
    source: Source, tmp_path: Path, subtests: pytest.Subtests
) -> None:
    data = source.data
    lines = lines_of(data)
    check_all(
        subtests,
        tmp_path,
        [
            ("empty file", b"", "header", "empty"),
            ("only newlines", b"\n" * 10, "header", "line 1 (header) is empty"),
            ("one newline", b"\n", "header", "at least 4 lines"),
            ("CRLF line ends", data.replace(b"\n", b"\r\n"), "header", "carriage return"),
            ("truncated last line", data[:-40], "truncated", "cut off"),
            ("truncated mid-file", data[: len(data) // 2], "truncated", "cut off"),
            (
                "NUL in the header",
                data.replace(ORIGIN.encode(), b"evidence\x00", 1),
                "header",
                "line 1 (header) is not JSON",
            ),
            (
                "not UTF-8 in the header",
                data.replace(ORIGIN.encode(), b"\xff\xfe", 1),
                "header",
                "line 1 (header) is not JSON",
            ),
            (
                "not UTF-8 in an event",
                with_event(
                    source,
                    0,
                    event_line(source, 0).replace(b'"actor":"', b'"actor":"sys\xc3\x28', 1),
                    resign=False,
                ),
                "event_malformed",
                "line 5 is not an event",
            ),
            (
                "NUL in an event",
                with_event(
                    source,
                    1,
                    event_line(source, 1).replace(b'"actor":"', b'"actor":"\x00', 1),
                    resign=False,
                ),
                "event_malformed",
                "line 6 is not an event",
            ),
            ("a line more", data + lines[-1] + b"\n", "record_count", "the bundle has"),
            ("a line less", joined(lines[:-1]), "record_count", "the bundle has"),
            ("a blank line inside", joined([*lines[:6], b"", *lines[6:]]), "record_count", ""),
            (
                "binary garbage",
                joined([random.Random(n).randbytes(999).replace(b"\n", b"") for n in range(6)]),
                "header",
                "line 1 (header)",
            ),
        ],
    )


def test_a_million_bad_lines_cost_a_hundred_problems(
    source: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading stops once ``max_problems`` are listed: a bounded number of lines is read
    (counted, not timed), and the lines are never all held at once."""
    head = lines_of(source.data)[:4]
    header = json.loads(head[0])
    header.update(events=2**53 - 1)  # a count the lines never reach
    read: list[int] = []
    lines = bundle_module._lines

    def counted(data: bytes, start: int = 0) -> Iterator[bytes]:
        for line in lines(data, start):
            read.append(len(line))
            yield line

    monkeypatch.setattr(bundle_module, "_lines", counted)
    for body in (b"\n" * 1_000_000, b"x\n" * 1_000_000, b"[" * 1_000_000 + b"\n"):
        path = tmp_path / "many.bundle"
        path.write_bytes(joined([canonical_json(header), *head[1:]]) + body)
        read.clear()
        tracemalloc.start()
        try:
            report = verify_bundle(path)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert 0 < len(read) < 1_000, len(read)  # of a million and four
        # the file once, and not a list of its million lines
        assert peak < 2 * len(body) + 2**20, peak
        assert not report.ok and 0 < len(report.problems) <= 100
        kinds = {k for _, k, _ in problems_of(report)}
        assert {"record_count", "event_malformed"} <= kinds, kinds
        assert all(len(d) <= 400 for _, _, d in problems_of(report))


def test_unreadable_and_over_cap_files_are_refused(
    source: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "b.bundle"
    path.write_bytes(source.data)
    nowhere = f"sqlite:///{tmp_path / 'absent.db'}"

    def refused(target: Path, *fragments: str) -> None:
        for args in (["verify"], ["audit"], ["replay", "P-1"]):
            result = invoke(*args, "--bundle", str(target), "--db", nowhere)
            assert result.exit_code == 2, (args, result.stdout, result.stderr)
            errors = result.stderr.strip().splitlines()
            assert len(errors) == 1 and errors[0].startswith("error: "), result.stderr
            assert all(f in errors[0] for f in fragments), errors[0]
            assert "Traceback" not in result.stderr
        assert not (tmp_path / "absent.db").exists()

    refused(tmp_path / "missing.bundle", "missing.bundle", "cannot read")
    refused(tmp_path, "is a directory")
    with pytest.raises(InputError, match="is a directory"):
        load_bundle(tmp_path)
    with pytest.raises(InputError, match="cannot read"):
        load_bundle(tmp_path / "missing.bundle")
    monkeypatch.setenv("EVIDENCE_MAX_BUNDLE_BYTES", str(len(source.data) - 1))
    refused(path, "EVIDENCE_MAX_BUNDLE_BYTES", "b.bundle")
    with pytest.raises(InputError, match="cap on an offline bundle"):
        verify_bundle(path)
    if os.path.exists("/dev/zero"):  # never read whole: refused at the cap
        refused(Path("/dev/zero"), "EVIDENCE_MAX_BUNDLE_BYTES")
    monkeypatch.setenv("EVIDENCE_MAX_BUNDLE_BYTES", str(len(source.data)))
    assert verify_bundle(path).ok  # exactly the cap is within it
    # both refusals are LedgerErrors: what the command line maps to exit 2
    assert issubclass(InputError, ledger.LedgerError)
    assert issubclass(BundleError, ledger.LedgerError)


# -- record by record -----------------------------------------------------------------------


def test_the_header_line(source: Source, tmp_path: Path, subtests: pytest.Subtests) -> None:
    lines = lines_of(source.data)
    header = raw_members(lines[0])

    def with_header(**values: bytes) -> bytes:
        return joined([members({**header, **values}), *lines[1:]])

    counts = [
        (f"{member} {value.decode()}", with_header(**{member: value}), "header", "line 1")
        for member in ("events", "blobs", "size")
        for value in (
            b"1e20",
            b"100000000000000000000",
            b"18446744073709551616",
            b"9007199254740992",
            b"-1",
            b"true",
            b"1.5",
            b"27.0",
            b'"3"',
            b"null",
            b"[]",
            b"{}",
            b"1e400",
            deep(65),
            deep(100_000),
        )
    ]
    check_all(
        subtests,
        tmp_path,
        [
            *counts,
            (
                "nested 100k deep",
                joined([deep(100_000), *lines[1:]]),
                "header",
                "line 1 (header) is not the header record",
            ),
            ("nested 65 deep in a member", with_header(plan=deep(65)), "header", "$.plan"),
            (
                "a member nested 65 deep",
                joined([lines[0][:-1] + b',"x":' + deep(65) + b"}", *lines[1:]]),
                "header",
                "unknown field `x`",
            ),
            (
                "a member nested 100k deep",
                with_header(origin=b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
                "header",
                "$.origin",
            ),
            ("an array", joined([b"[]", *lines[1:]]), "header", "not the header record"),
            ("a string", joined([b'"header"', *lines[1:]]), "header", "not the header record"),
            ("null", joined([b"null", *lines[1:]]), "header", "not the header record"),
            ("a number", joined([b"1", *lines[1:]]), "header", "not the header record"),
            (
                "a member missing",
                joined([members({k: v for k, v in header.items() if k != "plan"}), *lines[1:]]),
                "header",
                "missing required field `plan`",
            ),
            (
                "a duplicate key",
                joined([lines[0][:-1] + b',"size":' + header["size"] + b"}", *lines[1:]]),
                "header",
                "canonical",
            ),
            (
                "whitespace",
                joined([lines[0].replace(b",", b", "), *lines[1:]]),
                "header",
                "canonical",
            ),
            (
                "another format",
                with_header(format=b'"evidence-bundle/2"'),
                "header",
                "unknown bundle format",
            ),
            (
                "a root not hex",
                with_header(root=b'"' + b"Z" * 64 + b'"'),
                "header",
                "not 64 lowercase hex digits",
            ),
            (
                "a short root",
                with_header(root=b'"' + b"a" * 63 + b'"'),
                "header",
                "not 64 lowercase hex digits",
            ),
            ("an origin that is a number", with_header(origin=b"12"), "header", "$.origin"),
            ("a plan that is an object", with_header(plan=b"{}"), "header", "$.plan"),
            (
                "a huge origin",
                with_header(origin=b'"' + b"o" * 2_000_000 + b'"'),
                "checkpoint",
                "line 2",
            ),
            (
                "events beyond the tree",
                with_header(events=str(source.head.size + 1).encode()),
                "record_count",
                f"in a tree of {source.head.size}",
            ),
            (
                "events short of the lines",
                with_header(events=b"20"),
                "record_count",
                "the bundle has",
            ),
            (
                "a unicode escape",
                joined([lines[0].replace(b'"format"', b'"\\u0066ormat"'), *lines[1:]]),
                "header",
                "canonical",
            ),
        ],
    )


def test_the_checkpoint_line(source: Source, tmp_path: Path, subtests: pytest.Subtests) -> None:
    lines = lines_of(source.data)
    note = json.loads(lines[1])["checkpoint"]
    size, root = header_of(source.data)["size"], header_of(source.data)["root"]
    root64 = base64.b64encode(bytes.fromhex(root)).decode()

    def with_checkpoint(raw: bytes) -> bytes:
        return joined([lines[0], b'{"checkpoint":' + raw + b"}", *lines[2:]])

    def with_note(text: str) -> bytes:
        return with_checkpoint(canonical_json(text))

    check_all(
        subtests,
        tmp_path,
        [
            ("null", with_checkpoint(b"null"), "checkpoint", "line 2 (checkpoint)"),
            ("a number", with_checkpoint(b"5"), "checkpoint", "Expected `str`"),
            (
                "a huge integer",
                with_checkpoint(b"1152921504606846976"),
                "checkpoint",
                "Expected `str`",
            ),
            (
                "an overflowing number",
                with_checkpoint(b"1e400"),
                "checkpoint",
                "line 2 (checkpoint)",
            ),
            ("an array", with_checkpoint(b"[]"), "checkpoint", "Expected `str`"),
            ("nested 500 deep", with_checkpoint(deep(500)), "checkpoint", "Expected `str`"),
            ("nested 100k deep", with_checkpoint(deep(100_000)), "checkpoint", "Expected `str`"),
            (
                "another record",
                joined([lines[0], b'{"note":"x"}', *lines[2:]]),
                "checkpoint",
                "unknown field `note`",
            ),
            (
                "a duplicate key",
                joined([lines[0], lines[1][:-1] + b',"checkpoint":"x"}', *lines[2:]]),
                "checkpoint",
                "canonical",
            ),
            ("a lone surrogate", with_checkpoint(b'"\\ud800"'), "checkpoint", "not JSON"),
            (
                "CRLF inside the note",
                with_note(note.replace("\n", "\r\n")),
                "checkpoint",
                "malformed",
            ),
            ("too large", with_note(note + "x" * 70_000), "checkpoint", "too large"),
            (
                "many lines",
                with_note("".join(f"{ORIGIN}\n" for _ in range(5000)) + "\n" + note),
                "checkpoint",
                "line 2",
            ),
            (
                "no signature",
                with_note(f"{ORIGIN}\n{size}\n{root64}\n"),
                "checkpoint",
                "no blank line",
            ),
            (
                "a signature that is not base64",
                with_note(note.rsplit(" ", 1)[0] + " !!!not-base64!!!\n"),
                "checkpoint",
                "malformed signature",
            ),
            (
                "a root that is not base64",
                with_note(note.replace(root64, "####")),
                "checkpoint",
                "root hash",
            ),
            (
                "an absurd size",
                with_note(note.replace(f"\n{size}\n", "\n99999999999999999999\n")),
                "checkpoint",
                "beyond 2^53",
            ),
            (
                "a size of 2^53",
                with_note(note.replace(f"\n{size}\n", f"\n{2**53}\n")),
                "checkpoint",
                "beyond 2^53",
            ),
            (
                "a negative size",
                with_note(note.replace(f"\n{size}\n", "\n-1\n")),
                "checkpoint",
                "not a decimal",
            ),
            (
                "a size re-signed",
                with_note(
                    sign_checkpoint(
                        Checkpoint(origin=ORIGIN, size=size - 1, root=bytes.fromhex(root)),
                        source.key,
                    )
                ),
                "checkpoint",
                "the checkpoint names",
            ),
        ],
    )


def test_the_leaves_line(source: Source, tmp_path: Path, subtests: pytest.Subtests) -> None:
    lines = lines_of(source.data)
    leaves = base64.b64decode(json.loads(lines[2])["leaves"])

    def with_leaves(raw: bytes) -> bytes:
        return joined([*lines[:2], b'{"leaves":' + raw + b"}", *lines[3:]])

    def b64(data: bytes) -> bytes:
        return b'"' + base64.b64encode(data) + b'"'

    padded = next(n for n in range(len(leaves) - 1, 0, -1) if n % 3)  # its base64 has "="
    check_all(
        subtests,
        tmp_path,
        [
            ("null", with_leaves(b"null"), "leaves", "not the leaves record"),
            ("a number", with_leaves(b"5"), "leaves", "not the leaves record"),
            (
                "a huge integer",
                with_leaves(b"18446744073709551616"),
                "leaves",
                "not the leaves record",
            ),
            ("an object", with_leaves(b'{"a":1}'), "leaves", "not the leaves record"),
            ("nested 100k deep", with_leaves(deep(100_000)), "leaves", "not the leaves record"),
            (
                "a million empty arrays",
                with_leaves(b"[" + b"[]," * 1_000_000 + b"[]]"),
                "leaves",
                "not the leaves record",
            ),
            ("not base64", with_leaves(b'"!!!!"'), "leaves", "not strict base64"),
            (
                "base64 with a space",
                with_leaves(b64(leaves).replace(b"A", b" A", 1)),
                "leaves",
                "not strict base64",
            ),
            (
                "base64 re-padded",
                # cut to a length whose base64 is padded, then the padding dropped
                with_leaves(b'"' + base64.b64encode(leaves[:padded]).rstrip(b"=") + b'"'),
                "leaves",
                "not strict base64",
            ),
            (
                "not a multiple of 32 bytes",
                with_leaves(b64(leaves + b"\x00")),
                "leaves",
                "not a whole number of 32-byte hashes",
            ),
            (
                "one hash short",
                with_leaves(b64(leaves[:-32])),
                "leaves",
                f"a tree of {source.head.size}",
            ),
            (
                "a changed hash",
                with_leaves(b64(bytes(32) + leaves[32:])),
                "leaves",
                "do not hash to the root",
            ),
            ("empty", with_leaves(b'""'), "leaves", "holds 0 bytes"),
        ],
    )


def test_the_keys_line(source: Source, tmp_path: Path, subtests: pytest.Subtests) -> None:
    lines = lines_of(source.data)
    keys = json.loads(lines[3])["keys"]
    signer = keys["signer"]

    def with_keys(raw: bytes) -> bytes:
        return joined([*lines[:3], b'{"keys":' + raw + b"}", *lines[4:]])

    def changed(**values: Any) -> bytes:
        return with_keys(canonical_json({**keys, **values}))

    check_all(
        subtests,
        tmp_path,
        [
            ("null", with_keys(b"null"), "keys", "line 4 (keys) is not the keys record"),
            ("an array", with_keys(b"[]"), "keys", "line 4 (keys) is not the keys record"),
            ("a string", with_keys(b'"keys"'), "keys", "line 4 (keys) is not the keys record"),
            ("a number", with_keys(b"5"), "keys", "line 4 (keys) is not the keys record"),
            ("nested 100k deep", with_keys(deep(100_000)), "keys", "not the keys record"),
            (
                "an approver nested 900 deep",
                with_keys(
                    b'{"approvers":' + deep(900) + b',"signer":' + canonical_json(signer) + b"}"
                ),
                "keys",
                "$.keys.approvers",
            ),
            (
                "a huge integer",
                with_keys(
                    b'{"approvers":[1152921504606846976],"signer":' + canonical_json(signer) + b"}"
                ),
                "keys",
                "$.keys.approvers",
            ),
            (
                "an approver at position 2^60",
                changed(approvers=[{**keys["approvers"][0], "position": 0}]).replace(
                    b'"position":0', b'"position":1152921504606846976'
                ),
                "keys",
                "/keys/approvers/0/position: integer outside",
            ),
            ("approvers not a list", changed(approvers={}), "keys", "$.keys.approvers"),
            (
                "approvers that are not the events",
                changed(approvers=[]),
                "keys",
                "approver keys listed differ",
            ),
            ("a signer that is a string", changed(signer="name"), "keys", "$.keys.signer"),
            (
                "a signer with no key",
                changed(signer={"name": ORIGIN}),
                "keys",
                "missing required field `public_key`",
            ),
            (
                "a key not base64",
                changed(signer={**signer, "public_key": "!!"}),
                "keys",
                "not valid base64",
            ),
            (
                "a key of 31 bytes",
                changed(signer={**signer, "public_key": base64.b64encode(bytes(31)).decode()}),
                "keys",
                "31 bytes",
            ),
            (
                "a key that is a number",
                changed(signer={**signer, "public_key": 5}),
                "keys",
                "$.keys.signer.public_key",
            ),
            (
                "a signer of another name",
                changed(signer={**signer, "name": "someone"}),
                "keys",
                "not named as the log's origin",
            ),
            ("an extra member", changed(extra=1), "keys", "unknown field `extra`"),
        ],
    )


def test_the_event_lines(source: Source, tmp_path: Path, subtests: pytest.Subtests) -> None:
    # validation.registered: its schemas are any JSON
    first_index = event_index(source, "validation.registered")
    first = event_line(source, first_index)
    strategy = event_index(source, "plan.strategy_recorded")
    strategy_line = event_line(source, strategy)
    number = 5 + strategy  # its line in the file
    payload = json.loads(strategy_line)["payload"]

    def event(index: int, line: bytes, *, resign: bool = True) -> bytes:
        return with_event(source, index, line, resign=resign)

    def at(**values: bytes) -> bytes:
        return event(strategy, replace(strategy_line, **values))

    def swapped() -> bytes:
        lines = lines_of(source.data)
        lines[5], lines[6] = lines[6], lines[5]
        return resigned(source, lines)

    def doubled() -> bytes:
        lines = lines_of(source.data)
        lines[6] = lines[5]
        return resigned(source, lines)

    patch_op = b'{"op":"add","path":"/x","value":'
    check_all(
        subtests,
        tmp_path,
        [
            # the payload: wrong JSON types, and a payload that is not its type's
            *[
                (
                    f"a payload that is {raw.decode()[:10]}",
                    at(payload=raw),
                    "event_payload",
                    f"line {number}",
                )
                for raw in (b"[1,2]", b"[]", b'"payload"', b"null", b"5", b"true")
            ],
            (
                "a payload of an unknown type",
                at(payload=canonical_json({**payload, "type": "x.y"}), type=b'"x.y"'),
                "event_payload",
                "unknown event",
            ),
            (
                "a payload of another type",
                at(type=b'"plan.created"'),
                "event_payload",
                f"line {number}",
            ),
            (
                "a payload with a member missing",
                at(payload=canonical_json({k: v for k, v in payload.items() if k != "strategy"})),
                "event_payload",
                "strategy",
            ),
            (
                "a payload with a member too many",
                at(payload=canonical_json({**payload, "extra": 1})),
                "event_payload",
                "extra",
            ),
            (
                "a payload member of the wrong type",
                at(payload=canonical_json({**payload, "revision": "0"})),
                "event_payload",
                "revision",
            ),
            (
                "a huge integer in the payload",
                at(
                    payload=canonical_json({**payload, "revision": 0}).replace(
                        b'"revision":0', b'"revision":2305843009213693952'
                    )
                ),
                "event_payload",
                "integer outside",
            ),
            (
                "an overflowing number in the payload",
                at(
                    payload=canonical_json({**payload, "revision": 0}).replace(
                        b'"revision":0', b'"revision":1e400'
                    )
                ),
                "event_payload",
                f"line {number}",
            ),
            (
                "a payload nested 65 deep",
                event(
                    first_index,
                    in_payload(
                        first,
                        b'"declared_input_schema":null',
                        b'"declared_input_schema":' + deep(65),
                    ),
                ),
                "event_payload",
                "deeper than 64",
            ),
            (
                "a payload nested 500 deep",
                event(
                    first_index,
                    in_payload(
                        first,
                        b'"declared_input_schema":null',
                        b'"declared_input_schema":' + deep(500),
                    ),
                ),
                "event_payload",
                "deeper than 64",
            ),
            (
                "a payload nested 100k deep",
                event(
                    first_index,
                    in_payload(
                        first,
                        b'"declared_input_schema":null',
                        b'"declared_input_schema":' + deep(100_000),
                    ),
                ),
                "event_malformed",
                "deeper than 64",
            ),
            (
                "a huge integer deep in a payload",
                event(
                    first_index,
                    in_payload(
                        first,
                        b'"declared_input_schema":null',
                        b'"declared_input_schema":{"maximum":9007199254740993}',
                    ),
                ),
                "event_payload",
                "integer outside",
            ),
            (
                "a duplicate key in the payload",
                at(payload=canonical_json(payload)[:-1] + b',"strategy":"x"}'),
                "event_malformed",
                "payload is not in canonical form",
            ),
            (
                "whitespace in the payload",
                at(payload=canonical_json(payload).replace(b'","', b'", "')),
                "event_malformed",
                "payload is not in canonical form",
            ),
            # the delta
            *[
                (
                    f"a delta that is {raw.decode()[:12]}",
                    at(delta=raw),
                    "event_malformed",
                    "JSON Patch",
                )
                for raw in (
                    b"5",
                    b"null",
                    b'"x"',
                    b"{}",
                    b"[1]",
                    b'[{"op":"add"}]',
                    b'[{"op":"copy","path":"/a","from":5}]',
                    b'[{"op":"jump","path":""}]',
                    b'[{"op":"add","path":"/a"}]',
                    b'[{"op":"remove","path":7}]',
                )
            ],
            (
                "a delta nested 65 deep",
                at(delta=b"[" + patch_op + deep(65) + b"}]"),
                "event_malformed",
                "deeper than 64",
            ),
            (
                "a delta nested 100k deep",
                at(delta=b"[" + patch_op + deep(100_000) + b"}]"),
                "event_malformed",
                "deeper than 64",
            ),
            (
                "a huge integer in the delta",
                at(delta=b"[" + patch_op + b"2305843009213693952}]"),
                "event_malformed",
                "integer outside",
            ),
            (
                "a duplicate key in the delta",
                at(delta=b"[" + patch_op + b'1,"value":2}]'),
                "event_malformed",
                "delta is not in canonical form",
            ),
            # the envelope
            (
                "a duplicate key in the envelope",
                event(strategy, strategy_line[:-1] + b',"actor":"intruder"}'),
                "event_malformed",
                "canonical form of an event",
            ),
            (
                "an unknown member",
                event(strategy, strategy_line[:-1] + b',"zzz":1}'),
                "event_malformed",
                "unknown field",
            ),
            (
                "a member missing",
                event(
                    strategy,
                    members({k: v for k, v in raw_members(strategy_line).items() if k != "actor"}),
                ),
                "event_malformed",
                "actor",
            ),
            ("an actor that is a number", at(actor=b"5"), "event_malformed", "actor"),
            ("an empty actor", at(actor=b'""'), "event_malformed", "actor is empty"),
            ("an empty stream", at(stream=b'""'), "event_malformed", "not a stream name"),
            (
                "a stream with an escape",
                at(stream=b'"plan:P-1\\u001b[2J"'),
                "event_malformed",
                "not a stream name",
            ),
            (
                "a stream of 100k characters",
                at(stream=b'"' + b"s" * 100_000 + b'"'),
                "event_malformed",
                "not a stream name",
            ),
            (
                "an event id that is not a ULID",
                at(event_id=b'"not-a-ulid"'),
                "event_malformed",
                "not a ULID",
            ),
            (
                "a causation id that is not a ULID",
                at(causation_id=b'"x"'),
                "event_malformed",
                "causation id",
            ),
            ("a position of 0", at(position=b"0"), "event_order", "position 0"),
            ("a negative position", at(position=b"-1"), "event_order", "position -1"),
            (
                "a position beyond the tree",
                at(position=str(source.head.size + 1).encode()),
                "event_order",
                f"1..{source.head.size}",
            ),
            (
                "a position of 2^64",
                at(position=b"18446744073709551616"),
                "event_order",
                "within the tree",
            ),
            (
                "a position of 10^30",
                at(position=b"1" + b"0" * 30),
                "event_order",
                "within the tree",
            ),
            (
                "a position of 10^400",
                at(position=b"1" + b"0" * 400),
                "event_order",
                "within the tree",
            ),
            (
                "a position of 10^5000",
                at(position=b"1" + b"0" * 5000),
                "event_malformed",
                f"line {number} is not an event",
            ),
            ("a fractional position", at(position=b"1.5"), "event_malformed", "position"),
            ("a position that is a string", at(position=b'"4"'), "event_malformed", "position"),
            ("two events swapped", swapped(), "event_order", "line 7"),
            ("an event twice", doubled(), "event_order", "line 7"),
            ("a schema version of 0", at(schema_version=b"0"), "event_payload", "upcaster"),
            (
                "a schema version from the future",
                at(schema_version=b"9007199254740991"),
                "event_payload",
                "newer than",
            ),
            ("a stream version of 0", at(stream_version=b"0"), "stream_version", "jumps"),
            ("a stream version of -5", at(stream_version=b"-5"), "stream_version", "jumps"),
            (
                "not JSON",
                event(strategy, b"{not json", resign=False),
                "event_malformed",
                f"line {number} is not an event",
            ),
            (
                "an empty line",
                event(strategy, b"", resign=False),
                "event_malformed",
                f"line {number} is not an event",
            ),
            ("an array", event(strategy, b"[]"), "event_malformed", "not an event"),
            (
                "an array nested 100k deep",
                event(strategy, deep(100_000), resign=False),
                "event_malformed",
                f"line {number} is not an event",
            ),
            (
                "a delta member nested 100k deep",
                event(
                    strategy,
                    strategy_line.replace(b'"delta":[', b'"delta":[' + deep(100_000) + b",", 1),
                    resign=False,
                ),
                "event_malformed",
                "deeper than 64",
            ),
            (
                "a changed event",
                event(
                    strategy,
                    strategy_line.replace(b"make the status good", b"make the status bad"),
                    resign=False,
                ),
                "event_changed",
                "does not hash",
            ),
        ],
    )


def test_the_blob_lines(source: Source, tmp_path: Path, subtests: pytest.Subtests) -> None:
    lines = lines_of(source.data)
    blob = len(lines) - 1  # the last line: a blob record
    record = json.loads(lines[blob])

    def with_blob(raw: bytes, *, newline: bool = True) -> bytes:
        data = joined([*lines[:blob], raw])
        return data if newline else data[:-1]

    check_all(
        subtests,
        tmp_path,
        [
            ("nested 100k deep", with_blob(deep(100_000)), "blob", "not the blob record"),
            (
                "nested 65 deep",
                with_blob(members({"data": deep(65), "digest": b'"0"'})),
                "blob",
                "$.data",
            ),
            ("null", with_blob(b"null"), "blob", "not the blob record"),
            ("an array", with_blob(b"[]"), "blob", "not the blob record"),
            ("an empty line", with_blob(b""), "blob", "is empty"),
            (
                "data not base64",
                with_blob(canonical_json({**record, "data": "!!!"})),
                "blob",
                "not strict base64",
            ),
            (
                "data changed",
                with_blob(
                    canonical_json({**record, "data": base64.b64encode(b"changed").decode()})
                ),
                "blob_changed",
                "does not hash",
            ),
            (
                "a digest that is a number",
                with_blob(members({"data": b'"AA=="', "digest": b"18446744073709551616"})),
                "blob",
                "$.digest",
            ),
            (
                "data that is a number",
                with_blob(members({"data": b"1e400", "digest": b'"0"'})),
                "blob",
                f"line {blob + 1} (blob)",
            ),
            (
                "a duplicate key",
                with_blob(lines[blob][:-1] + b',"data":"AA=="}'),
                "blob",
                "canonical form",
            ),
            ("cut off", with_blob(lines[blob][:30], newline=False), "truncated", "cut off"),
            ("a blob twice", joined([*lines, lines[blob]]), "blob", "out of order"),
        ],
    )


def test_a_plan_bundle_changed_in_its_header_or_events(
    source: Source, tmp_path: Path, subtests: pytest.Subtests
) -> None:
    """The plan's bundle: events not a prefix of the tree, so positions have gaps."""
    lines = lines_of(source.plan_data)
    header = raw_members(lines[0])
    events = n_events(source.plan_data)
    check_all(
        subtests,
        tmp_path,
        [
            (
                "another plan named",
                joined([members({**header, "plan": b'"P-2"'}), *lines[1:]]),
                "plan",
                "not to the bundle's plan",
            ),
            (
                "relabelled as the whole log's",
                joined([members({**header, "plan": b"null"}), *lines[1:]]),
                "record_count",
                "a bundle of the whole log holds every event",
            ),
            (
                "a plan that is a list",
                joined([members({**header, "plan": b'["P-1"]'}), *lines[1:]]),
                "header",
                "$.plan",
            ),
            (
                "a payload that is an array",
                joined([*lines[:4], replace(lines[4], payload=b"[]"), *lines[5:]]),
                "event_payload",
                "line 5",
            ),
            (
                "a delta that is not a patch",
                joined(
                    [
                        *lines[: 4 + events - 1],
                        replace(lines[4 + events - 1], delta=b"[1]"),
                        *lines[4 + events :],
                    ]
                ),
                "event_malformed",
                "JSON Patch",
            ),
        ],
    )


def test_a_hostile_kept_checkpoint(
    source: Source, tmp_path: Path, subtests: pytest.Subtests
) -> None:
    """``--checkpoint FILE``: read as text within the checkpoint cap (else refused,
    exit 2), then parsed strictly (else a problem, exit 1)."""
    size, root = header_of(source.data)["size"], header_of(source.data)["root"]
    root64 = base64.b64encode(bytes.fromhex(root)).decode()
    good = sign_checkpoint(
        Checkpoint(origin=ORIGIN, size=size, root=bytes.fromhex(root)), source.key
    )
    hostile = {
        "empty": "",
        "only newlines": "\n" * 50,
        "CRLF": good.replace("\n", "\r\n"),
        "no signature": f"{ORIGIN}\n{size}\n{root64}\n",
        "a size of 2^53": good.replace(f"\n{size}\n", f"\n{2**53}\n"),
        "a size of 2^64": good.replace(f"\n{size}\n", f"\n{2**64}\n"),
        "a size of 20 nines": good.replace(f"\n{size}\n", "\n" + "9" * 20 + "\n"),
        "a size of 400 digits": good.replace(f"\n{size}\n", "\n" + "9" * 400 + "\n"),
        "a size in hex": good.replace(f"\n{size}\n", "\n0x18\n"),
        "a size with a sign": good.replace(f"\n{size}\n", f"\n+{size}\n"),
        "a root not base64": good.replace(root64, "%%%%"),
        "a root of 31 bytes": good.replace(root64, base64.b64encode(bytes(31)).decode()),
        "a signature not base64": good.rsplit(" ", 1)[0] + " ***\n",
        "a short signature": good.rsplit(" ", 1)[0] + " AAAA\n",
        "a lone surrogate": good.replace(ORIGIN, ORIGIN + "\ud800"),
        "too large": good + "x" * 70_000,
        "a thousand signature lines": good + "".join(f"\u2014 w{i} !\n" for i in range(1000)),
        "an empty body line": good.replace(f"{root64}\n", f"{root64}\n\n\n", 1),
    }
    for name, note in hostile.items():
        with subtests.test(case=name):
            with pytest.raises(CheckpointError):
                parse_checkpoint(note)
            bundle = _write(tmp_path / "b.bundle", source.data)
            report = verify_bundle(bundle, kept_checkpoint=note)
            assert not report.ok and any(p.kind == "kept_checkpoint" for p in report.problems)

    kept = tmp_path / "kept.checkpoint"
    for name in (
        "a size of 2^64",
        "a root not base64",
        "a thousand signature lines",
        "no signature",
    ):
        kept.write_text(hostile[name])
        assert_reported(tmp_path, source.data, "kept_checkpoint", "kept checkpoint", kept=kept)
    # not text, or beyond the checkpoint cap: refused before any parsing
    nowhere = f"sqlite:///{tmp_path / 'absent.db'}"
    bundle = _write(tmp_path / "b.bundle", source.data)
    for content in (good.encode() + b"\xff\xfe\n", (good + "x" * 70_000).encode()):
        kept.write_bytes(content)
        result = invoke(
            "verify", "--bundle", str(bundle), "--checkpoint", str(kept), "--db", nowhere
        )
        assert result.exit_code == 2, (result.stdout, result.stderr)
        errors = result.stderr.strip().splitlines()
        assert len(errors) == 1 and errors[0].startswith("error: --checkpoint"), errors
    # and the good one still checks
    kept.write_text(good)
    assert verify_bundle(bundle, kept_checkpoint=good).ok


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_a_database_checkpoint_of_absurd_size_is_malformed(source: Source, tmp_path: Path) -> None:
    """``evidence verify --checkpoint`` on the database parses the note the same way: a
    tree size no log reaches is a malformed checkpoint, not a query that overflows."""
    header = header_of(source.data)
    note = sign_checkpoint(
        Checkpoint(origin=ORIGIN, size=header["size"], root=bytes.fromhex(header["root"])),
        source.key,
    )
    kept = tmp_path / "kept.checkpoint"
    kept.write_text(note.replace(f"\n{header['size']}\n", f"\n{2**63}\n"))
    result = invoke(
        "verify",
        "--checkpoint",
        str(kept),
        "--public-key",
        str(source.pub_file),
        "--json",
        "--db",
        source.url,
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.exit_code == 1, (result.stdout, result.stderr)
    shown = json.loads(result.stdout)
    assert [p["kind"] for p in shown["problems"]] == ["checkpoint_malformed"]
    assert "beyond 2^53" in shown["problems"][0]["detail"]


# -- any change at all --------------------------------------------------------------------

hostile = settings(
    max_examples=50,
    deadline=None,
    derandomize=IN_CI,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

NASTY = [
    b"",
    b"\r",
    b"\x00",
    b"\xff",
    b"\xc3\x28",
    b"\n",
    b"\n\n",
    b"null",
    b"[]",
    b"{}",
    b'"',
    b"\\",
    b"1e400",
    b"-0",
    b"18446744073709551616",
    b"9007199254740992",
    deep(65),
    deep(2000),
    b'{"a":1,"a":2}',
    b"\\ud800",
    b"\xe2\x80\x94 ",
    b"==",
    b'[{"op":"add"}]',
]


# JSON values of every type and of hostile size and depth.
VALUES = [
    b"null",
    b"true",
    b"0",
    b"-1",
    b"1.5",
    b"1e20",
    b"1e400",
    b"100000000000000000000",
    b"18446744073709551616",
    b"9007199254740992",
    b'""',
    b'"x"',
    b"[]",
    b"{}",
    b"[1,2]",
    b'{"a":1}',
    deep(65),
    deep(2000),
    b'"\\u0000"',
    b'"' + b"A" * 5000 + b'"',
]


class Mutated(bytes):
    """A changed bundle that says how it was changed: hypothesis prints that, not the
    25 kB."""

    how = ""

    def __repr__(self) -> str:
        return f"<bundle with {self.how}: {len(self)} bytes>"


def _mutated(data: bytes, how: str) -> Mutated:
    changed = Mutated(data)
    changed.how = how
    return changed


@st.composite
def mutations(draw: st.DrawFn, data: bytes) -> Mutated:
    """``data`` changed somewhere: bytes flipped, set, cut or inserted; lines dropped,
    doubled, swapped or replaced; one member of a record (or of an event's payload)
    given a value of another type, size or depth."""
    lines = lines_of(data)
    kind = draw(
        st.sampled_from(
            [
                "flip",
                "set",
                "cut",
                "insert",
                "drop",
                "double",
                "swap",
                "replace",
                "truncate",
                *["member"] * 9,
            ]
        )
    )
    if kind == "member":  # one member of one record given a hostile value
        i = draw(st.integers(0, 3) | st.integers(0, len(lines) - 1))
        record = raw_members(lines[i])
        name = draw(st.sampled_from(sorted(record)))
        value = draw(st.sampled_from(VALUES))
        how = f"line {i + 1} member {name} = {value[:40]!r}"
        if name == "payload" and draw(st.booleans()):  # or one member of the payload
            payload = raw_members(record["payload"])
            inner = draw(st.sampled_from(sorted(payload)))
            payload[inner] = value
            value = members(payload)
            how = f"line {i + 1} payload member {inner} = {value[:40]!r}"
        lines[i] = members({**record, name: value})
        return _mutated(joined(lines), how)
    offset = draw(st.integers(0, len(data) - 1))
    if kind == "flip":
        changed = bytearray(data)
        bit = draw(st.sampled_from([0x01, 0x02, 0x20, 0x40, 0x80]))
        changed[offset] ^= bit
        return _mutated(bytes(changed), f"byte {offset} ^ {bit:#x}")
    if kind == "set":
        value = draw(st.integers(0, 255))
        return _mutated(
            data[:offset] + bytes([value]) + data[offset + 1 :], f"byte {offset} = {value:#x}"
        )
    if kind == "cut":
        n = draw(st.integers(1, 64))
        return _mutated(data[:offset] + data[offset + n :], f"{n} bytes cut at {offset}")
    if kind == "insert":
        fragment = draw(st.sampled_from(NASTY) | st.binary(min_size=1, max_size=8))
        return _mutated(
            data[:offset] + fragment + data[offset:], f"{fragment[:40]!r} inserted at {offset}"
        )
    if kind == "truncate":
        return _mutated(data[:offset], f"cut off after {offset} bytes")
    i = draw(st.integers(0, len(lines) - 1))
    j = draw(st.integers(0, len(lines) - 1))
    if kind == "drop":
        del lines[i]
        how = f"line {i + 1} dropped"
    elif kind == "double":
        lines.insert(i, lines[i])
        how = f"line {i + 1} doubled"
    elif kind == "swap":
        lines[i], lines[j] = lines[j], lines[i]
        how = f"lines {i + 1} and {j + 1} swapped"
    else:
        lines[i] = draw(
            st.sampled_from(NASTY) | st.binary(max_size=32).filter(lambda b: b"\n" not in b)
        )
        how = f"line {i + 1} = {lines[i][:40]!r}"
    return _mutated(joined(lines), how)


@hostile
@given(data=st.data())
def test_any_change_to_a_bundle_is_reported_never_raised(
    source: Source, tmp_path: Path, data: st.DataObject
) -> None:
    """No exception but a refusal to read the file escapes ``load_bundle`` or
    ``verify_bundle``, and a bundle changed in any way is not reported ok."""
    which = data.draw(st.sampled_from(["whole log", "plan P-1"]))
    original = source.data if which == "whole log" else source.plan_data
    changed = data.draw(mutations(original))
    public_key = data.draw(st.sampled_from([None, source.public_key]))
    path = tmp_path / "mutated.bundle"
    path.write_bytes(changed)
    try:
        bundle = load_bundle(path, public_key=public_key)
        report = verify_bundle(path, public_key=public_key)
    except (BundleError, InputError) as exc:  # the only refusals: reading the file
        pytest.fail(f"a readable file was refused: {exc}")
    assert report == bundle.report
    if changed == original:
        assert report.ok, report.problems
        return
    assert not report.ok, "a changed bundle verified"
    assert 0 < len(report.problems) <= 100
