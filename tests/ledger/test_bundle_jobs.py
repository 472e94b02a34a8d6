"""``verify --bundle --jobs N``: the event lines of a bundle checked in parts, in
parallel processes, report exactly what one pass reports — for a good bundle and for
every hostile change, above all the ones only the join of the parts can see (lines
swapped, doubled or dropped across a part's edge, a stream split between parts, an
approver key listed from another part). The parts here are two lines long, so a small
ledger has many of them."""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ledger.bundle
from ledger.bundle import BundleReport, verify_bundle
from tests.helpers import invoke
from tests.ledger.test_bundle_hostile import (
    Source,
    hostile,
    joined,
    lines_of,
    make_source,
    mutations,
    resigned,
)

PART = 2


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    return make_source(tmp_path_factory.mktemp("jobs-source"))


@pytest.fixture(autouse=True)
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger.bundle, "_LINES_PER_PART", PART)


def both(path: Path, **options: object) -> tuple[BundleReport, BundleReport, list[int]]:
    """The report of one pass and of two jobs, and the progress the jobs reported."""
    seen: list[int] = []
    one = verify_bundle(path, **options)  # type: ignore[arg-type]
    parts = verify_bundle(
        path,
        jobs=2,
        progress=lambda done, total: seen.append(done),
        **options,  # type: ignore[arg-type]
    )
    return one, parts, seen


def test_a_good_bundle_is_checked_in_parts(source: Source, tmp_path: Path) -> None:
    for data in (source.data, source.plan_data):
        path = tmp_path / "good.bundle"
        path.write_bytes(data)
        one, parts, seen = both(path, public_key=source.public_key)
        assert one.ok and parts == one, parts.problems
        events = one.events
        assert events > 2 * PART
        # Told as parts finished: each part's lines, up to all of them.
        assert seen == [*range(PART, events, PART), events], seen


def test_one_pass_tells_its_progress_too(source: Source, tmp_path: Path) -> None:
    path = tmp_path / "good.bundle"
    path.write_bytes(source.data)
    seen: list[tuple[int, int]] = []
    report = verify_bundle(path, progress=lambda done, total: seen.append((done, total)))
    events = report.events
    assert report.ok and seen == [(done, events) for done in range(PART, events + 1, PART)]


def across_edges(src: Source) -> Iterator[tuple[str, bytes]]:
    """Changes at a part's edge, each of a kind that only one of the joins sees."""
    lines = lines_of(src.data)
    events = json.loads(lines[0])["events"]
    for edge in range(4 + PART, 4 + events, PART):  # the first line of each part
        swapped = list(lines)
        swapped[edge - 1], swapped[edge] = swapped[edge], swapped[edge - 1]
        yield f"lines {edge} and {edge + 1} swapped", resigned(src, swapped)
        # Each line still hashes to the leaf of its own position: only the order tells.
        yield f"lines {edge} and {edge + 1} swapped, not re-signed", joined(swapped)
        # In order, whole and well formed: only the leaf hash tells.
        changed = list(lines)
        actor = json.loads(lines[edge])["actor"]
        changed[edge] = lines[edge].replace(
            b'"actor":%s,' % json.dumps(actor).encode(), b'"actor":"mallory",', 1
        )
        assert changed[edge] != lines[edge]
        yield f"line {edge + 1} its actor changed", joined(changed)
        doubled = list(lines)
        doubled.insert(edge, doubled[edge - 1])
        yield f"line {edge} doubled", joined(doubled)
        dropped = list(lines)
        del dropped[edge]
        yield f"line {edge + 1} dropped", resigned(src, dropped)
        version = json.loads(lines[edge])["stream_version"]
        bumped = list(lines)
        bumped[edge] = lines[edge].replace(
            b'"stream_version":%d,' % version, b'"stream_version":%d,' % (version + 1)
        )
        yield f"line {edge + 1} a stream version on", resigned(src, bumped)


def test_a_blob_cut_is_missing_at_the_events_naming_it_as_in_one_pass(
    source: Source, tmp_path: Path
) -> None:
    lines = lines_of(source.data)
    header = json.loads(lines[0])
    assert header["blobs"] > 0
    cut = lines[: 4 + header["events"]] + lines[5 + header["events"] :]  # the first blob
    path = tmp_path / "cut.bundle"
    path.write_bytes(joined(cut))
    one, parts, _ = both(path, public_key=source.public_key)
    assert "blob_missing" in {p.kind for p in one.problems}
    assert parts == one


def test_parts_sent_to_processes_that_do_not_fork(
    source: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a fork server (a caller running threads), each part's bytes are sent."""
    context = multiprocessing.get_context("forkserver")
    monkeypatch.setattr(ledger.bundle, "process_context", lambda: context)
    good = tmp_path / "good.bundle"
    good.write_bytes(source.data)
    one, parts, seen = both(good, public_key=source.public_key)
    assert one.ok and parts == one and len(seen) > 1
    name, data = next(across_edges(source))
    broken = tmp_path / "edge.bundle"
    broken.write_bytes(data)
    one, parts, _ = both(broken, public_key=source.public_key)
    assert not one.ok and parts == one, name


def test_changes_at_the_parts_edges_are_reported_as_one_pass_reports(
    source: Source, tmp_path: Path
) -> None:
    cases = list(across_edges(source))
    assert len(cases) > 6
    for name, data in cases:
        path = tmp_path / "edge.bundle"
        path.write_bytes(data)
        one, parts, _ = both(path, public_key=source.public_key)
        assert not one.ok, name
        assert parts == one, (name, parts.problems, one.problems)


@hostile
@given(data=st.data())
def test_any_change_is_reported_in_parts_as_in_one_pass(
    source: Source, tmp_path: Path, data: st.DataObject
) -> None:
    which = data.draw(st.sampled_from(["whole log", "plan P-1"]))
    original = source.data if which == "whole log" else source.plan_data
    changed = data.draw(mutations(original))
    path = tmp_path / "mutated.bundle"
    path.write_bytes(changed)
    with pytest.MonkeyPatch.context() as mp:  # hypothesis reruns outside the fixture
        mp.setattr(ledger.bundle, "_LINES_PER_PART", PART)
        one, parts, _ = both(path, public_key=source.public_key)
    assert parts == one


def test_cli_verify_bundle_jobs(source: Source, tmp_path: Path) -> None:
    path = tmp_path / "all.bundle"
    path.write_bytes(source.data)
    db = f"sqlite:///{tmp_path / 'absent.db'}"
    shown = []
    for jobs in ("1", "2"):
        result = invoke("verify", "--bundle", str(path), "--jobs", jobs, "--json", "--db", db)
        assert result.exit_code == 0, result.stderr
        shown.append(json.loads(result.stdout))
    assert shown[0] == shown[1] and shown[0]["ok"] is True
    broken = tmp_path / "broken.bundle"
    lines = lines_of(source.data)
    lines[4 + PART], lines[5 + PART] = lines[5 + PART], lines[4 + PART]
    broken.write_bytes(resigned(source, lines))
    result = invoke("verify", "--bundle", str(broken), "--jobs", "2", "--json", "--db", db)
    assert result.exit_code == 1, result.stderr
    assert "event_order" in {p["kind"] for p in json.loads(result.stdout)["problems"]}
    assert not (tmp_path / "absent.db").exists()
