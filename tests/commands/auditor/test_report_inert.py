"""The HTML report is inert: a control character, a bell, an escape sequence or a bidi
override the agent wrote into the log appears in the page as the visible escape the
terminal shows, never as the character (before, the page carried them raw)."""

from __future__ import annotations

from pathlib import Path

from commands.plane import Plane
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.runs import record_halt
from tests.helpers import run_cli

HOSTILE = "ring\x07 clear\x1b[2J del\x7f c1\x85 rtl\u202eevil\u2066 tab\there"


def test_control_characters_from_the_log_are_escaped_in_the_page(
    sqlite_url: str, tmp_path: Path
) -> None:
    with Plane.open(sqlite_url) as plane:
        create_plan(plane, "P-1", project="api", resources=["repo:api"])
        record_strategy(plane, "P-1", "strategy " + HOSTILE)
        enter_execute(plane, "P-1")
        record_halt(plane, "P-1", "timeout", "reason " + HOSTILE, hint="hint " + HOSTILE)
    out = tmp_path / "report.html"
    done = run_cli("report", "P-1", "--html", str(out), "--db", sqlite_url)
    assert done.returncode == 0, done.stderr
    page = out.read_text(encoding="utf-8")
    raw = [c for c in page if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F]
    assert raw == []
    assert "\u202e" not in page and "\u2066" not in page
    assert "ring\\x07 clear\\x1b[2J del\\x7f c1\\x85 rtl\\u202eevil\\u2066 tab\\there" in page
