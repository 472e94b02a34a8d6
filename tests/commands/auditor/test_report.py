"""``evidence report PLAN --html OUT.html``: one self-contained HTML file an auditor can
look at. The CLI writes it (atomically, exit 0 even when verification failed) or refuses
(exit 2, no file); every value from the log is escaped; nothing is fetched from the
network; and a real headless Chromium renders it with the key sections and a non-blank
screenshot."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
from collections.abc import Collection, Iterator
from html.parser import HTMLParser
from pathlib import Path

import msgspec
import pytest

import ledger
from commands.auditor.audit import Violation, audit
from commands.auditor.report import gather_report
from commands.auditor.report_html import render_html
from commands.plane import CommandRefused, Plane
from commands.plane.gates import gate_input
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool
from commands.plane.runs import record_halt
from ledger import RecordedEvent
from ledger.bundle import load_bundle, write_bundle
from ledger.events import PlanCreated, StrategyRecorded
from ledger.keys import generate_key_pair
from ledger.store import TreeHead
from ledger.verify import verify_store
from tests.helpers import applied_plan, assert_refused, run_cli

IN_CI = os.environ.get("CI", "").lower() == "true"
SECTIONS = [
    "Plan",
    "Timeline",
    "Gate checks",
    "Validation results",
    "Decisions",
    "Token",
    "Outcome classification",
    "Verification",
]
SEARCH = {
    "name": "search",
    "command": ["grep", "-r", "{query}"],
    "input_schema": {
        "type": "object",
        "required": ["query"],
        "properties": {"query": {"type": "string"}},
    },
}


def applied_plan_ids(db_url: str, tmp_path: Path) -> dict[str, str]:
    """``helpers.applied_plan`` (a blocker, an escalation, alice's signed revise decision,
    the fix, a passing run, its token, Apply); returns the decision and token ids."""
    with Plane.open(db_url) as plane:
        applied_plan(plane, tmp_path)
        events = plane.store.read_stream("plan:P-1")
        decided = next(e.payload for e in events if e.type == "plan.decision_recorded")
        minted = next(e.payload for e in events if e.type == "plan.token_minted")
        return {"decision_id": decided.decision_id, "token_id": minted.token_id}


def deviating_plan(db_url: str, params: bytes = b'{"query": "x", "extra": 1}') -> None:
    """Plan G-1 in Execute whose input gate check found an extra field."""
    with Plane.open(db_url) as plane:
        register_tool(plane, SEARCH)
        create_plan(
            plane,
            "G-1",
            project="api",
            resources=["repo:api"],
            config={"strict_mode": False, "max_iterations": 3},
        )
        record_strategy(plane, "G-1", "search the code")
        enter_execute(plane, "G-1")
        outcome = gate_input(plane, "G-1", "search", params)
        assert not outcome.passed


def report_cli(plan: str, out: Path, db_url: str) -> subprocess.CompletedProcess[str]:
    return run_cli("report", plan, "--html", str(out), "--db", db_url)


def sections(page: str) -> list[str]:
    return re.findall(r"<h2>(.*?)</h2>", page)


class Tags(HTMLParser):
    """Every start tag and attribute the browser would see (text is not markup)."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.feed(page)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def assert_self_contained(page: str) -> None:
    """Nothing the browser would fetch: no script at all, no link, image, frame or media
    element, no attribute naming a resource, no url() or @import in the CSS."""
    tags = Tags(page).tags
    names = {tag for tag, _attrs in tags}
    assert not names & {
        "script",
        "link",
        "img",
        "iframe",
        "object",
        "embed",
        "source",
        "audio",
        "video",
        "base",
        "form",
        "svg",
    }, names
    for tag, attrs in tags:
        assert not set(attrs) & {"src", "href", "srcset", "action", "poster", "style"}, tag
        assert not any(a.startswith("on") for a in attrs), tag
    assert "@import" not in page and "url(" not in page
    assert "http://" not in page and "https://" not in page
    assert "default-src 'none'" in page  # and the CSP forbids any fetch anyway


# -- the CLI writes the report --------------------------------------------------------


def test_report_of_an_applied_plan(db_url: str, tmp_path: Path) -> None:
    ids = applied_plan_ids(db_url, tmp_path)
    out = tmp_path / "out" / "report.html"
    out.parent.mkdir()
    result = report_cli("P-1", out, db_url)
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()  # one line naming the file written
    assert line.startswith(f"wrote {out} ") and line.endswith("verified)"), line
    page = out.read_text(encoding="utf-8")
    assert sections(page) == SECTIONS
    assert_self_contained(page)
    assert "<code>P-1</code>" in page and "api" in page
    # The timeline, from the same summaries as `plan history`.
    assert "plan.token_consumed" in page and "plan.applied" in page
    assert "created in Strategize (project api" in page
    # Validation results, the decision with its re-checked signature, the token.
    assert ">status<" in page and "status is good" in page and "status is bad" in page
    assert ids["decision_id"] in page and ">alice<" in page and ">revise<" in page
    decisions = page.split('id="decisions"')[1].split("</section>")[0]
    assert ">verified<" in decisions
    token = page.split('id="token"')[1].split("</section>")[0]
    assert ids["token_id"] in token and ">consumed<" in token
    # Outcome: pass, applied, the earlier blocker and its halt.
    outcome = page.split('id="outcome"')[1].split("</section>")[0]
    assert ">pass<" in outcome and ">applied<" in outcome and ">blocker<" in outcome
    verification = page.split('id="verification"')[1].split("</section>")[0]
    assert ">verified<" in verification and "no violation" in verification
    with ledger.open(db_url) as store:
        assert store.head().root.hex() in verification
    assert not [p for p in out.parent.iterdir() if p != out]  # no temp file left


def test_report_shows_gate_deviations(db_url: str, tmp_path: Path) -> None:
    deviating_plan(db_url)
    out = tmp_path / "gates.html"
    result = report_cli("G-1", out, db_url)
    assert result.returncode == 0, result.stderr
    page = out.read_text(encoding="utf-8")
    gates = page.split('id="gates"')[1].split("</section>")[0]
    assert "tool search v1" in gates and ">fail<" in gates
    assert "<code>/extra</code>" in gates and "<code>extra_field</code>" in gates
    assert "expected " in gates  # the deviation's message
    assert "no deviations" not in gates
    assert "input gate, tool search: fail, 1 deviation(s) (extra_field)" in page  # timeline
    assert "no token minted" in page and "no escalations or decisions" in page


def test_report_replaces_an_existing_file(sqlite_url: str, tmp_path: Path) -> None:
    deviating_plan(sqlite_url)
    out = tmp_path / "gates.html"
    out.write_text("old")
    assert report_cli("G-1", out, sqlite_url).returncode == 0
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert oct(out.stat().st_mode & 0o777) != oct(0o600)  # not left private by mkstemp


# -- escaping ------------------------------------------------------------------------


HOSTILE = '<script>alert("x")</script>'


def test_every_value_is_escaped(sqlite_url: str, tmp_path: Path) -> None:
    # A plan appended around the handlers (which would refuse these names), as a
    # hostile writer could: the report must show it, inert.
    plan_id = "P<script>"
    with Plane.open(sqlite_url) as plane:
        plane.projections.catch_up()
        stream = f"plan:{plan_id}"
        plane.append(
            plane.state(stream),
            [
                PlanCreated(
                    plan_id=plan_id,
                    project=HOSTILE,
                    resources=["repo:<img src=x onerror=alert(1)>"],
                )
            ],
        )
        plane.append(
            plane.state(stream),
            [StrategyRecorded(plan_id=plan_id, revision=0, strategy="</table><h2>Forged</h2>")],
        )
        record_halt(plane, plan_id, "orchestrator_stop", f"reason {HOSTILE} & more")
    out = tmp_path / "hostile.html"
    result = report_cli(plan_id, out, sqlite_url)
    assert result.returncode == 0, result.stderr
    page = out.read_text(encoding="utf-8")
    assert_self_contained(page)
    assert sections(page) == SECTIONS  # the forged heading stayed text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "P&lt;script&gt;" in page and "reason &lt;script&gt;" in page and "&amp; more" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "&lt;/table&gt;&lt;h2&gt;Forged&lt;/h2&gt;" in page


def test_a_plan_stream_without_its_creation_still_gets_a_report(
    sqlite_url: str, tmp_path: Path
) -> None:
    with ledger.open(sqlite_url) as store:  # forged: a strategy with no plan.created
        store.append(
            "plan:P-9",
            [
                ledger.NewEvent(
                    payload=StrategyRecorded(plan_id="P-9", revision=0, strategy="orphan")
                )
            ],
        )
    out = tmp_path / "orphan.html"
    result = report_cli("P-9", out, sqlite_url)
    assert result.returncode == 0, result.stderr
    page = out.read_text(encoding="utf-8")
    assert sections(page) == SECTIONS and "strategy, revision 0: orphan" in page
    # The fold leaves it {} (it cannot take the event); the audit says what is wrong.
    assert "<code>illegal_transition</code>" in page


# -- refusals ------------------------------------------------------------------------


def test_unknown_plan_or_unwritable_path_writes_nothing(sqlite_url: str, tmp_path: Path) -> None:
    deviating_plan(sqlite_url)
    out = tmp_path / "r.html"
    assert_refused(report_cli("nope", out, sqlite_url), "unknown plan 'nope'")
    assert not out.exists()
    missing_dir = tmp_path / "no" / "such" / "r.html"
    assert_refused(report_cli("G-1", missing_dir, sqlite_url), "--html", "does not exist")
    assert not missing_dir.parent.exists()
    assert_refused(report_cli("G-1", tmp_path, sqlite_url), "is a directory")
    assert_refused(run_cli("report", "G-1", "--db", sqlite_url), "--html")
    assert_refused(report_cli("G-1", out, f"sqlite:///{tmp_path / 'absent.db'}"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evidence.db"]


def test_verification_problems_are_shown_and_still_exit_0(sqlite_url: str, tmp_path: Path) -> None:
    deviating_plan(sqlite_url)
    with ledger.open(sqlite_url) as store:
        position = store.read_stream("plan:G-1")[1].position
    db = sqlite3.connect(tmp_path / "evidence.db")
    with db:  # an attacker with the file: drop the guard, edit a row
        db.execute("DROP TRIGGER events_no_update")
        db.execute("UPDATE events SET actor = 'mallory' WHERE position = ?", (position,))
    db.close()
    out = tmp_path / "tampered.html"
    result = report_cli("G-1", out, sqlite_url)
    assert result.returncode == 0, result.stderr
    assert "verification FAILED" in result.stdout
    verification = out.read_text(encoding="utf-8").split('id="verification"')[1]
    assert ">FAILED<" in verification and "<code>leaf_mismatch</code>" in verification
    assert f"<td>{position}</td>" in verification


# -- the interface a bundle implements -------------------------------------------------


class MemorySource:
    """The four reads the report needs, over events and blobs held in memory: what an
    offline bundle provides, with no database behind it."""

    def __init__(
        self, head: TreeHead, events: list[RecordedEvent], blobs: dict[str, bytes]
    ) -> None:
        self._head, self._events, self._blobs = head, events, blobs

    def head(self) -> TreeHead:
        return self._head

    def read_all(
        self, from_position: int = 1, *, to_position: int | None = None
    ) -> Iterator[RecordedEvent]:
        last = to_position or self._head.size
        return (e for e in self._events if from_position <= e.position <= last)

    def read_stream(
        self, stream: str, from_version: int = 1, *, as_of: int | None = None
    ) -> list[RecordedEvent]:
        last = as_of or self._head.size
        return [
            e
            for e in self._events
            if e.stream == stream and e.stream_version >= from_version and e.position <= last
        ]

    def get_blob(self, digest: str) -> bytes | None:
        return self._blobs.get(digest)

    def get_blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        return {d: self._blobs[d] for d in digests if d in self._blobs}


def test_gather_report_reads_only_the_small_interface(sqlite_url: str, tmp_path: Path) -> None:
    ids = applied_plan_ids(sqlite_url, tmp_path)
    with ledger.open(sqlite_url) as store:
        verified = verify_store(store)
        with store.snapshot() as snap:
            blobs = {digest: bytes(data) for digest, _size, data in snap.blobs()}
        memory = MemorySource(store.head(), list(store.read_all()), blobs)
        from_store = gather_report(
            store, "P-1", verification=lambda: verified, source_label="db", generated_at="T"
        )
    from_memory = gather_report(
        memory, "P-1", verification=verified, source_label="db", generated_at="T"
    )
    assert from_memory == from_store
    assert from_memory.audit.ok and from_memory.audit.checked["token_from_passing_run"] == 1
    assert [t.token_id for t in from_memory.tokens] == [ids["token_id"]]
    assert [d.signature for d in from_memory.decisions] == ["verified"]
    assert render_html(from_memory) == render_html(from_store)
    # The audit may be passed in too (a bundle's), and an unknown plan is refused.
    clean = audit(memory, plan="P-1")
    failing = msgspec.structs.replace(
        clean,
        ok=False,
        violations=[
            Violation(
                position=3,
                plan_id="P-1",
                invariant="token_from_passing_run",
                expected="e<1>",
                found="f&2",
            )
        ],
    )
    shown = gather_report(memory, "P-1", verification=verified, audit_report=failing)
    page = render_html(shown)
    assert (
        not shown.audit.ok and ">FAILED<" in page and "<code>token_from_passing_run</code>" in page
    )
    assert "expected e&lt;1&gt;; found f&amp;2" in page
    with pytest.raises(CommandRefused, match="unknown plan 'P-2'"):
        gather_report(memory, "P-2", verification=verified)


def test_a_report_from_an_offline_bundle(sqlite_url: str, tmp_path: Path) -> None:
    ids = applied_plan_ids(sqlite_url, tmp_path)
    keys = generate_key_pair(tmp_path / "plane.key")
    with ledger.open(sqlite_url) as store:
        write_bundle(
            store,
            tmp_path / "p1.bundle",
            key=keys.private_key,
            origin="evidence-ledger/test",
            plan="P-1",
        )
        from_store = gather_report(store, "P-1", verification=verify_store(store))
    bundle = load_bundle(tmp_path / "p1.bundle", public_key=keys.public_key)
    report = gather_report(bundle, "P-1", verification=bundle.report, source_label="p1.bundle")
    assert report.verification.ok and report.verification.checked_events > 0
    assert report.verification.root == from_store.root == report.root
    assert report.audit.ok and report.timeline == from_store.timeline
    assert report.tokens == from_store.tokens and report.runs == from_store.runs
    # A bundle has no chain hashes, but it carries the leaf hash the decision is pinned to.
    assert report.decisions == from_store.decisions
    assert [d.signature for d in report.decisions] == ["verified"]
    page = render_html(report)
    assert ids["token_id"] in page and "p1.bundle" in page and ">verified<" in page


# -- a real browser ------------------------------------------------------------------


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        if IN_CI:
            pytest.fail(
                "CI=true but chromium is not installed: the browser test cannot be "
                "skipped (.ci/run installs it)"
            )
        pytest.skip("the browser test needs Debian's chromium (apt-get install chromium)")
    return found


def browse(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    # A fresh profile and every background fetch off: the page is all that loads.
    return subprocess.run(
        [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )


@pytest.mark.browser
def test_the_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    binary = chromium()
    from PIL import Image

    db_url = f"sqlite:///{tmp_path / 'evidence.db'}"
    applied_plan_ids(db_url, tmp_path)
    out = tmp_path / "report.html"
    assert report_cli("P-1", out, db_url).returncode == 0
    url = out.resolve().as_uri()

    dom = browse(binary, tmp_path / "profile-dom", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr.decode(errors="replace")[-2000:]
    rendered = dom.stdout.decode("utf-8")
    assert sections(rendered) == SECTIONS
    assert "<table>" in rendered and "P-1" in rendered and ">verified<" in rendered

    shot = tmp_path / "shot.png"
    result = browse(
        binary, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1280,2000", url
    )
    assert result.returncode == 0 and shot.exists(), result.stderr.decode(errors="replace")[-2000:]
    with Image.open(shot) as image:
        assert image.size == (1280, 2000)
        pixels = image.convert("RGB")
        colours = pixels.getcolors(maxcolors=1 << 24)
    assert colours is not None and len(colours) > 50  # text, tables, badges: not blank
    background = max(colours)[0]
    drawn = sum(count for count, _colour in colours) - background
    assert drawn / (1280 * 2000) > 0.05, drawn
    # The badges' colours are there: the inline CSS applied (green "ok" on #d5f2dc).
    assert any(
        max(abs(c - w) for c, w in zip(colour, (0xD5, 0xF2, 0xDC), strict=True)) <= 6
        for _count, colour in colours
    )
