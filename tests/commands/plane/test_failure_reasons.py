"""Failure reasons everywhere a person looks: a validation that fails with "pytest exit
code 1" shows *why* — its message, and the bounded, terminal-safe tail of what its
program printed (``No module named pytest`` on stderr) — in ``validate``, ``run``, ``plan
show``, ``plan history`` and the HTML report, and ``--json`` carries them. Before, the
cause was only in the ledger's blobs table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from commands.plane import Plane
from commands.plane.attachments import attach
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool, register_validation
from commands.runner.results import TAIL_CHARS, TAIL_LINES, output_tails
from tests.helpers import REPO, run_cli

# What a missing pytest prints, with a bell and a screen-clearing escape sequence the
# terminal and the page must not act on.
CHILD = (
    "import sys\n"
    "print('collecting ...')\n"
    "sys.stderr.write('Traceback (most recent call last):\\n')\n"
    "sys.stderr.write('ModuleNotFoundError: No module named pytest\\x07\\x1b[2J\\n')\n"
    "sys.exit(1)\n"
)
TRANSFORM = (
    "{passed: exit_code == `0`, message: join(' ', ['pytest exit code', to_string(exit_code)])}"
)


def _failing_plan(db_url: str, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "child.py").write_text(CHILD)
    with Plane.open(db_url) as plane:
        register_tool(
            plane,
            {"name": "pytest", "description": "the tests", "command": ["python", "child.py"]},
        )
        register_validation(
            plane, {"name": "tests", "mode": "required", "wraps": "pytest", "transform": TRANSFORM}
        )
        create_plan(plane, "P-1", project="api", resources=[str(project)])
        attach(plane, "tests", resource=str(project))
        record_strategy(plane, "P-1", "make the tests pass")
        enter_execute(plane, "P-1")


def _assert_inert_reason(text: str) -> None:
    assert "pytest exit code 1" in text
    assert "No module named pytest" in text
    assert "\\x07\\x1b[2J" in text  # shown as escapes ...
    assert "\x07" not in text and "\x1b" not in text  # ... never as the bytes


def test_validate_shows_why(sqlite_url: str, tmp_path: Path) -> None:
    _failing_plan(sqlite_url, tmp_path)
    shown = run_cli("validate", "P-1", "--db", sqlite_url)
    assert shown.returncode == 1, shown.stderr
    _assert_inert_reason(shown.stdout)
    assert "stderr, last 2 line(s):" in shown.stdout and "collecting ..." in shown.stdout


def test_validate_json_carries_the_tails(sqlite_url: str, tmp_path: Path) -> None:
    _failing_plan(sqlite_url, tmp_path)
    done = run_cli("validate", "P-1", "--json", "--db", sqlite_url)
    (result,) = json.loads(done.stdout)["validation"]["results"]
    assert result["message"] == "pytest exit code 1"
    assert result["stderr_tail"] == (
        "Traceback (most recent call last):\nModuleNotFoundError: No module named pytest\x07\x1b[2J"
    )
    assert result["stdout_tail"] == "collecting ..."


def test_plan_show_and_history_show_why(sqlite_url: str, tmp_path: Path) -> None:
    _failing_plan(sqlite_url, tmp_path)
    assert run_cli("validate", "P-1", "--db", sqlite_url).returncode == 1
    show = run_cli("plan", "show", "P-1", "--db", sqlite_url)
    assert show.returncode == 0, show.stderr
    _assert_inert_reason(show.stdout)
    (failure,) = json.loads(run_cli("plan", "show", "P-1", "--json", "--db", sqlite_url).stdout)[
        "failures"
    ]
    assert failure["validation"] == "tests" and failure["verdict"] is False
    assert "No module named pytest" in failure["stderr_tail"]
    history = run_cli("plan", "history", "P-1", "--db", sqlite_url)
    _assert_inert_reason(history.stdout)
    events = json.loads(run_cli("plan", "history", "P-1", "--json", "--db", sqlite_url).stdout)[
        "events"
    ]
    failed = [e for e in events if e["failure"] is not None]
    assert [e["type"] for e in failed] == ["validation.result_recorded"]
    assert "No module named pytest" in failed[0]["failure"]["stderr_tail"]


def test_the_html_report_shows_why(sqlite_url: str, tmp_path: Path) -> None:
    _failing_plan(sqlite_url, tmp_path)
    assert run_cli("validate", "P-1", "--db", sqlite_url).returncode == 1
    out = tmp_path / "report.html"
    made = run_cli("report", "P-1", "--html", str(out), "--db", sqlite_url)
    assert made.returncode == 0, made.stderr
    page = out.read_text(encoding="utf-8")
    _assert_inert_reason(page)
    assert '<pre class="tail" title="stderr">' in page


PLAN_FILE = """\
plan:
  id: missing-pytest
  project: calc
  resources: [project]
  global_config: {retry_limit: 0, max_strategy_revisions: 0}
tools:
  - name: pytest
    description: the tests
    command: [python, child.py]
validations:
  - name: tests
    mode: required
    wraps: pytest
    transform: "TRANSFORM"
attachments:
  - {validation: tests, resource: project}
agent:
  strategies:
    - strategy: try
      attempts:
        - steps: []
""".replace("TRANSFORM", TRANSFORM.replace('"', '\\"'))


def test_run_shows_why(sqlite_url: str, tmp_path: Path) -> None:
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "child.py").write_text(CHILD)
    (tmp_path / "plan.yaml").write_text(PLAN_FILE)
    shown = run_cli("run", str(tmp_path / "plan.yaml"), "--db", sqlite_url)
    assert shown.returncode == 1, shown.stderr
    _assert_inert_reason(shown.stdout)
    # the bare `python` of the plan file is the interpreter running evidence
    assert "failed in the last validation run:" in shown.stdout
    again = run_cli(
        "run", str(tmp_path / "plan.yaml"), "--plan-id", "again", "--json", "--db", sqlite_url
    )
    (failure,) = json.loads(again.stdout)["run"]["failures"]
    assert failure["message"] == "pytest exit code 1"
    assert "No module named pytest" in failure["stderr_tail"]


# -- the tails ----------------------------------------------------------------------------


def test_tails_are_bounded() -> None:
    lines = "\n".join(f"line {i}" for i in range(100))
    blob = json.dumps({"exit_code": 1, "stdout": lines, "stderr": "x" * 10_000}).encode()
    stdout_tail, stderr_tail = output_tails(blob)
    assert stdout_tail is not None and stdout_tail.splitlines() == [
        f"line {i}" for i in range(100 - TAIL_LINES, 100)
    ]
    assert stderr_tail is not None and len(stderr_tail) == TAIL_CHARS
    assert stderr_tail.startswith("…")


@pytest.mark.parametrize(
    ("blob", "expected"),
    [
        (None, (None, None)),
        (b'{"passed": false, "message": "no"}', (None, None)),  # the message says it all
        (b"plain text\n\n", ("plain text", None)),  # a command validation's stdout
        (b"\xff\xfe broken", ("\ufffd\ufffd broken", None)),
    ],
)
def test_tails_of_other_blobs(blob: bytes | None, expected: tuple) -> None:
    assert output_tails(blob) == expected


def test_the_docs_say_which_python_a_plan_file_runs() -> None:
    text = (REPO / "docs" / "plan-files.md").read_text()
    assert "## Which interpreter `python` is" in text and "sys.executable" in text
    assert "[env, python3, -m, pytest]" in text  # how to run the one on PATH instead


def test_a_python_validation_failure_shows_its_stderr_too(sqlite_url: str, tmp_path: Path) -> None:
    """A command validation's recorded output is its stdout; a crash with no return
    carries the stderr tail in its error, which every view shows."""
    project = tmp_path / "proj"
    project.mkdir()
    with Plane.open(sqlite_url) as plane:
        register_validation(
            plane,
            {
                "name": "crashes",
                "mode": "required",
                "command": [sys.executable, "-c", "import sys; sys.exit('boom\\x1b]0;t\\x07')"],
            },
        )
        create_plan(plane, "P-1", project="api", resources=[str(project)])
        attach(plane, "crashes", resource=str(project))
        record_strategy(plane, "P-1", "s")
        enter_execute(plane, "P-1")
    shown = run_cli("validate", "P-1", "--db", sqlite_url)
    assert "no verdict (malformed)" in shown.stdout and "boom" in shown.stdout
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout


# -- a command validation's stderr: kept, and shown by every door ---------------------------

# A command validation returns its verdict on stdout; why it failed is on stderr.
COMMAND_CHILD = (
    "import json, sys\n"
    "sys.stderr.write('Traceback (most recent call last):\\n')\n"
    "sys.stderr.write('ModuleNotFoundError: No module named pytest\\x07\\x1b[2J\\n')\n"
    "print(json.dumps({'passed': False, 'message': 'pytest exit code 1'}))\n"
)
STDERR_TAIL = (
    "Traceback (most recent call last):\nModuleNotFoundError: No module named pytest\x07\x1b[2J"
)


def _failing_command_plan(db_url: str, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "child.py").write_text(COMMAND_CHILD)
    with Plane.open(db_url) as plane:
        register_validation(
            plane, {"name": "tests", "mode": "required", "command": ["python", "child.py"]}
        )
        create_plan(plane, "P-1", project="api", resources=[str(project)])
        attach(plane, "tests", resource=str(project))
        record_strategy(plane, "P-1", "make the tests pass")
        enter_execute(plane, "P-1")


def test_a_command_validations_stderr_is_kept_and_shown(sqlite_url: str, tmp_path: Path) -> None:
    import ledger

    _failing_command_plan(sqlite_url, tmp_path)
    shown = run_cli("validate", "P-1", "--db", sqlite_url)
    assert shown.returncode == 1, shown.stderr
    _assert_inert_reason(shown.stdout)
    assert "stderr, last 2 line(s):" in shown.stdout
    with ledger.open(sqlite_url, create=False) as store:
        (result,) = [
            e.payload
            for e in store.read_stream("plan:P-1")
            if e.type == "validation.result_recorded"
        ]
        assert result.stderr_sha256 and store.get_blob(result.stderr_sha256) is not None
    for argv in (["plan", "show", "P-1"], ["plan", "history", "P-1"]):
        _assert_inert_reason(run_cli(*argv, "--db", sqlite_url).stdout)
    out = tmp_path / "report.html"
    assert run_cli("report", "P-1", "--html", str(out), "--db", sqlite_url).returncode == 0
    _assert_inert_reason(out.read_text(encoding="utf-8"))
    assert run_cli("verify", "--db", sqlite_url).returncode == 0  # the blob is the log's


def test_every_door_answers_a_failures_tails(sqlite_url: str, tmp_path: Path) -> None:
    """The CLI's --json, the MCP gate's evidence.validate and the service's
    POST /v1/validate answer the same results, tails and all."""
    from datetime import timedelta

    from starlette.testclient import TestClient

    from commands.plane.credentials import issue_credential
    from commands.plane.proxy_verbs import PLANE_TOOLS
    from commands.service import create_app

    _failing_command_plan(sqlite_url, tmp_path)
    cli = json.loads(run_cli("validate", "P-1", "--json", "--db", sqlite_url).stdout)
    (result,) = cli["validation"]["results"]
    assert result["stderr_tail"] == STDERR_TAIL and result["stdout_tail"] is None
    with Plane.open(sqlite_url) as plane:
        record_fix_then = PLANE_TOOLS["evidence.record_fix"].run
        record_fix_then(plane, "P-1", {"note": "nothing yet"})
        (mcp,) = PLANE_TOOLS["evidence.validate"].run(plane, "P-1", {})["validation"]["results"]
        record_fix_then(plane, "P-1", {"note": "still nothing"})
        token = issue_credential(plane, "P-1", ttl=timedelta(hours=1)).token
    with TestClient(create_app(sqlite_url)) as client:
        answer = client.post("/v1/validate", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    (api,) = answer.json()["validation"]["results"]
    for door in (mcp, api):
        assert (door["stderr_tail"], door["stdout_tail"]) == (STDERR_TAIL, None), door
