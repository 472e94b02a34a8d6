"""Hostile text is inert on a terminal (issue 16, item 3).

The agent the plane governs writes many of the strings the CLI prints: strategies,
reasons, tool descriptions, resources, validation messages. Attacks: an escape sequence
that clears the screen and retitles the window, a bidi override, a carriage return that
overwrites a line, and rich markup (``[/x]`` crashed ``evidence run`` on a terminal;
``[required]`` vanished there). Human output must show them as visible escapes and
literal brackets; ``--json`` carries the exact text.

In process through the real entry point, then a few runs under a real pseudo-terminal.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commands.cli.terminal import inert
from tests.helpers import REPO, invoke

ESC_CLEAR = "\x1b[2J"
ESC_TITLE = "\x1b]0;PWNED\x07"
HOSTILE = f"{ESC_CLEAR}{ESC_TITLE} [/x] [bold]x[/] a\rb \u202eevil"
SHOWN = r"\x1b[2J\x1b]0;PWNED\x07"  # what a reader sees instead
RAW = ("\x1b", "\x07", "\r", "\u202e", "\u2066")
EXAMPLES = REPO / "examples"


def assert_inert(text: str) -> None:
    """No raw ESC, BEL, CR or bidi control; no traceback."""
    for raw in RAW:
        assert raw not in text, (raw, text)
    assert "Traceback" not in text, text


# ------------------------------------------------------------------------- the function


def test_inert_escapes_controls_and_invisible_formatting() -> None:
    assert inert(HOSTILE) == (r"\x1b[2J\x1b]0;PWNED\x07 [/x] [bold]x[/] a\rb \u202eevil")
    for char, shown in [
        ("\x00", r"\x00"),
        ("\t", r"\t"),
        ("\n", r"\n"),
        ("\x7f", r"\x7f"),
        ("\x9b", r"\x9b"),
        ("\u2066", r"\u2066"),
        ("\u2069", r"\u2069"),
        ("\u202a", r"\u202a"),
        ("\u200f", r"\u200f"),
        ("\u2028", r"\u2028"),
        ("\ufeff", r"\ufeff"),
        ("\udcff", r"\udcff"),
        ("\U000e0041", r"\U000e0041"),
    ]:
        assert inert(f"a{char}b") == f"a{shown}b", repr(char)


def test_inert_keeps_printable_text_and_is_idempotent() -> None:
    for text in ["plain [required] text", "café — naïve ✓", "日本語", "👩\u200d💻", r"C:\x1b"]:
        assert inert(text) == text
    once = inert(HOSTILE)
    assert inert(once) == once
    assert inert(None) == "None" and inert(7) == "7"  # as an f-string shows them


def test_inert_multiline_keeps_newlines_only() -> None:
    assert inert("a\nb\r\nc\x1b", multiline=True) == "a\nb\\r\nc\\x1b"


def test_one_rule_every_code_point_as_the_hook_client_escapes_it() -> None:
    """``commands.text.inert`` and ``evidence-hook``'s own copy (which may import nothing
    of the house) escape exactly the same characters the same way: every code point,
    lone surrogates included, single-line and multi-line. And ``json_inert`` escapes
    the same characters, as JSON does."""
    from commands import hook_client
    from commands.text import json_inert

    every = "".join(map(chr, range(0x110000)))
    for multiline in (False, True):
        assert inert(every, multiline=multiline) == hook_client._inert(every, multiline=multiline)
    hidden = [c for c in every if not c.isprintable() and c not in "\u200c\u200d\n"]
    assert {"\u00a0", "\u2028", "\ue000", "\U000e0001", "\ud800"} <= set(hidden)
    shown = json.loads(
        json_inert(
            json.dumps(hidden[:60_000], ensure_ascii=False).encode("utf-8", "surrogatepass")
        ).decode("ascii")
    )  # every one of them escaped: ASCII
    assert shown == hidden[:60_000]


# ------------------------------------------------------------ in process, real entry point


def _plan_file(root: Path, plan_id: str = "hostile") -> Path:
    """A plan whose strategy, tool and validation descriptions and validation message
    are hostile; its one required validation passes, so it is applied."""
    project = root / "project"
    project.mkdir(parents=True)
    (project / "notes.txt").write_text("hello\n")
    check = f"import json; print(json.dumps(dict(passed=True, message={HOSTILE!r})))"
    document = {
        "plan": {"id": plan_id, "project": "calc", "resources": ["project"]},
        "tools": [
            {
                "name": "noop",
                "description": HOSTILE,
                "command": [sys.executable, "-c", "print(dict())"],
                "output_schema": {"type": "object"},
            }
        ],
        "validations": [
            {
                "name": "check",
                "mode": "required",
                "description": HOSTILE,
                "command": [sys.executable, "-c", check],
            }
        ],
        "attachments": [{"validation": "check", "resource": "project"}],
        "agent": {
            "strategies": [
                {"strategy": HOSTILE, "attempts": [{"steps": [{"step": "look", "tool": "noop"}]}]}
            ]
        },
    }
    path = root / "plan.yaml"
    path.write_text(json.dumps(document))  # JSON is YAML; the escapes stay escapes
    return path


@pytest.fixture(scope="module")
def _recorded_once(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, dict[str, str], dict[str, str]]:
    """``recorded``'s ledger, built once for the module (the tests that use it only read
    it), with its own plane key and state directory; returns them too."""
    root = tmp_path_factory.mktemp("recorded")
    env = {
        "EVIDENCE_PLANE_KEY": str(root / "plane-key" / "plane.key"),
        "EVIDENCE_STATE_DIR": str(root / "state"),
    }
    (root / "plane-key").mkdir()
    (root / "state").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        url, printed = _record(f"sqlite:///{root / 'evidence.db'}", root)
    return url, printed, env


@pytest.fixture
def recorded(
    _recorded_once: tuple[str, dict[str, str], dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> tuple[str, dict[str, str]]:
    """Plan `hostile` run and applied from its file; plan P-2 with a hostile resource,
    strategy, proposed tool name, fix note and halt (raw type, reason and hint). Returns
    the ledger URL and what each of those commands printed (stdout and stderr). Built
    once per module; each test reads it with the plane key it was written with."""
    url, printed, env = _recorded_once
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return url, printed


def _record(sqlite_url: str, tmp_path: Path) -> tuple[str, dict[str, str]]:
    printed = {}
    ran = invoke("run", str(_plan_file(tmp_path / "run")), "--db", sqlite_url)
    assert ran.exit_code == 0, (ran.stdout, ran.stderr)  # as for any passing plan
    printed["run"] = ran.stdout + ran.stderr
    for args in (
        ["plan", "create", "P-2", "--project", "calc", "--resource", f"repo:{ESC_TITLE}\u202e"],
        ["plan", "strategize", "P-2", "--strategy", HOSTILE],
        ["plan", "execute", "P-2"],
        ["gate", "input", "--plan", "P-2", "--tool", f"t{ESC_TITLE}", "--params", "{}"],
        ["fix", "P-2", "--note", HOSTILE],
        ["halt", "P-2", "--raw-type", f"odd{ESC_TITLE}", "--reason", HOSTILE, "--hint", HOSTILE],
    ):
        done = invoke(*args, "--db", sqlite_url)
        assert done.exit_code in (0, 1), (args, done.stdout, done.stderr)
        printed[" ".join(args[:2])] = done.stdout + done.stderr
    return sqlite_url, printed


@pytest.fixture
def hostile(recorded: tuple[str, dict[str, str]]) -> str:
    return recorded[0]


def test_the_commands_that_record_it_print_it_inert(recorded: tuple[str, dict[str, str]]) -> None:
    _, printed = recorded
    for out in printed.values():
        assert_inert(out)
    assert "[required]" in printed["run"] and SHOWN in printed["run"]
    assert "[/x] [bold]x[/]" in printed["run"]
    assert r"\x1b]0;PWNED\x07" in printed["halt P-2"]
    assert printed["gate input"].startswith(r"input gate, tool t\x1b]0;PWNED\x07: fail")


@pytest.mark.parametrize(
    "args",
    [
        ["plan", "history", "hostile"],
        ["plan", "history", "P-2"],
        ["plan", "show", "hostile"],
        ["plan", "show", "P-2"],
        ["plan", "list"],
        ["events"],
        ["tool", "list"],
        ["tool", "show", "noop"],
        ["validation", "list"],
        ["replay", "P-2"],
        ["tail"],
        ["stats"],
    ],
    ids=" ".join,
)
def test_human_output_shows_visible_escapes(hostile: str, args: list[str]) -> None:
    result = invoke(*args, "--db", hostile)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert_inert(result.stdout + result.stderr)
    assert r"\x1b]0;PWNED\x07" in result.stdout


@pytest.mark.parametrize(
    "args", [["plan", "history", "hostile"], ["plan", "show", "P-2"], ["events"]], ids=" ".join
)
def test_markup_and_escapes_show_literally(hostile: str, args: list[str]) -> None:
    out = invoke(*args, "--db", hostile).stdout
    assert "[/x] [bold]x[/]" in out and r"\u202eevil" in out
    assert SHOWN in out


def test_json_carries_the_exact_text(hostile: str) -> None:
    result = invoke("plan", "show", "P-2", "--json", "--db", hostile)
    assert json.loads(result.stdout)["plan"]["strategy"] == HOSTILE


def test_the_error_line_is_inert(sqlite_url: str, tmp_path: Path) -> None:
    missing = tmp_path / f"cfg{ESC_TITLE}\u202e.json"
    result = invoke(
        "plan",
        "create",
        "P-9",
        "--project",
        "x",
        "--resource",
        "r",
        "--config",
        f"@{missing}",
        "--db",
        sqlite_url,
    )
    assert result.exit_code == 2
    assert_inert(result.stderr)
    assert result.stderr.startswith("error: ") and r"\x1b]0;PWNED\x07" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# -------------------------------------------------------------- under a pseudo-terminal


def _on_pty(*args: str, cwd: Path, timeout: float = 30.0) -> tuple[int, bytes]:
    """``evidence ARGS`` with stdin, stdout and stderr on a pseudo-terminal (200 columns):
    its exit status and every byte it wrote."""
    import fcntl
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("EVIDENCE_DB", "NO_COLOR", "COLUMNS", "LINES", "TERM")
    }
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen(
        [sys.executable, "-m", "commands.cli", *args],
        cwd=cwd,
        env=env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(
                    f"evidence {' '.join(args)} took over {timeout} s: {b''.join(chunks)!r}"
                )
            ready, _, _ = select.select([master], [], [], left)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the slave
                break
            if not data:
                break
            chunks.append(data)
        return proc.wait(timeout=10), b"".join(chunks)
    finally:
        os.close(master)


def assert_inert_bytes(out: bytes) -> None:
    """None of the hostile sequences from user text (rich's own styling is fine), no
    lone carriage return (the terminal writes CR LF for a newline), no traceback."""
    assert b"\x1b]0;PWNED" not in out, out
    assert ESC_CLEAR.encode() not in out, out
    assert "\u202e".encode() not in out, out
    assert not re.search(rb"\r(?!\n)", out), out
    assert b"Traceback" not in out and b"MarkupError" not in out, out


# A progress line of `run`/`demo`: the stage, in rich's colour on a terminal, then the text.
PROGRESS = rb"validate(?:\x1b\[[0-9;]*m)? "

pty_only = pytest.mark.skipif(
    not hasattr(os, "openpty") or sys.platform == "win32", reason="needs a POSIX pseudo-terminal"
)


@pytest.mark.slow
@pty_only
def test_run_and_history_on_a_terminal(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'evidence.db'}"
    code, out = _on_pty("run", str(_plan_file(tmp_path / "run")), "--db", db, cwd=tmp_path)
    assert code == 0, out
    assert_inert_bytes(out)
    assert re.search(PROGRESS + rb"check \[required\]: pass", out), out
    assert b"[/x] [bold]x[/]" in out and SHOWN.encode() in out
    code, out = _on_pty("plan", "history", "hostile", "--db", db, cwd=tmp_path)
    assert code == 0, out
    assert_inert_bytes(out)
    assert SHOWN.encode() in out and b"[/x] [bold]x[/]" in out


@pytest.mark.slow
@pty_only
def test_demo_labels_show_on_a_terminal(tmp_path: Path) -> None:
    if not (EXAMPLES / "green-after-fix").is_dir():
        pytest.skip("no examples/ in this checkout")
    keep = tmp_path / "demo"
    code, out = _on_pty("demo", "--keep", str(keep), cwd=tmp_path)
    shutil.rmtree(keep, ignore_errors=True)
    assert code == 0, out
    assert_inert_bytes(out)
    # the progress lines, not only the plan history printed after them
    assert re.search(PROGRESS + rb"tests-pass \[required\]: pass", out), out
    assert re.search(PROGRESS + rb"short-lines \[informational\]: FAIL", out), out


def test_review_texts_are_inert(sqlite_url: str) -> None:
    from commands.plane import Plane
    from commands.plane.reviews import account_review, get_review, start_review, submit_candidate
    from tests.commands.plane.test_reviews import accounting, candidate, finding, request

    found = {**finding(HOSTILE), "evidence": f"first line\n{HOSTILE}"}
    with Plane.open(sqlite_url) as plane:
        task = start_review(plane, request(objective=HOSTILE))
        submit_candidate(plane, task, candidate(found, limitations=[HOSTILE]), reviewer="a")
        account_review(plane, task, accounting(get_review(plane, task), {"G1": [HOSTILE]}, []))
    outputs = {}
    for args in (["review", "result", task], ["review", "show", task], ["review", "list"]):
        result = invoke(*args, "--db", sqlite_url)
        assert result.exit_code == 0, (args, result.stdout, result.stderr)
        assert_inert(result.stdout + result.stderr)
        outputs[args[1]] = result.stdout
    out = outputs["result"]  # a report is handed out once
    assert f"objective: {inert(HOSTILE)}\n" in out
    assert f"     evidence: first line\n{inert(HOSTILE)}\n" in out  # its line breaks kept
