"""`evidence tool import`: an MCP server's tools registered from its own declaration
(docs/cli.md, "evidence tool import").

Real servers no one here wrote: ``mcp-server-time`` (PyPI) and
``@modelcontextprotocol/server-filesystem`` (npm, tests/interop). After the import a
call through the gate passes — the server's declaration is the registered one, where a
hand-written equivalent copy is refused at the call as ``schema_drift``; a re-run is a
review that appends nothing when nothing changed; and a refused import leaves the
ledger as it was.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

import ledger
from commands.plane import Plane
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool
from commands.plane.runs import call_tool
from tests.commands.cli.test_mcp_proxy import http_upstream  # noqa: F401  (a fixture: a real HTTP server)
from tests.conftest import IN_CI
from tests.helpers import TESTS, assert_refused, run_cli

TIME = [sys.executable, "-m", "mcp_server_time"]
FILESYSTEM = TESTS / "interop/node_modules/@modelcontextprotocol/server-filesystem"


def _imported(url: str, *argv: str) -> dict[str, Any]:
    done = run_cli("tool", "import", *argv, "--json", "--db", url)
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def _plan(url: str, project: Path) -> None:
    with Plane.open(url) as plane:
        create_plan(plane, "P-1", project="p", resources=[str(project)])
        record_strategy(plane, "P-1", "ask the servers")
        enter_execute(plane, "P-1")


def _head(url: str) -> int:
    with ledger.open(url, create=False) as store:
        return store.head().size


def test_the_time_servers_tools_pass_the_gate_as_imported(sqlite_url: str, tmp_path: Path) -> None:
    assert run_cli("init", "--db", sqlite_url).returncode == 0
    found = _imported(sqlite_url, "--mcp", "time", "--", *TIME)
    assert {(t["name"], t["action"], t["version"]) for t in found["tools"]} == {
        ("time.get_current_time", "added", 1),
        ("time.convert_time", "added", 1),
    }
    head = _head(sqlite_url)
    again = _imported(sqlite_url, "--mcp", "time", "--", *TIME)
    assert {t["action"] for t in again["tools"]} == {"unchanged"}
    assert _head(sqlite_url) == head  # a review appends nothing
    project = tmp_path / "project"
    project.mkdir()
    _plan(sqlite_url, project)
    with Plane.open(sqlite_url) as plane:
        report = call_tool(plane, "P-1", "time.get_current_time", {"timezone": "Europe/Paris"})
    answer = report.to_json()
    assert answer["input_gate"]["verdict"] == "pass", answer
    assert answer["halt"] is None and answer["output_gate"]["verdict"] == "pass", answer
    assert answer["call"]["executor"] == "mcp" and not answer["call"].get("tool_error")


def test_a_hand_copied_schema_drifts_and_the_import_mends_it(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The same schema written by hand in another order of keys and without the titles
    is not the server's declaration: the call is refused (schema_drift) before it is
    made. The import replaces it with the declaration, naming what changed."""
    assert run_cli("init", "--db", sqlite_url).returncode == 0
    with Plane.open(sqlite_url) as plane:
        register_tool(
            plane,
            {
                "name": "time.get_current_time",
                "mcp_server": "time",
                "mcp_tool_name": "get_current_time",
                "mcp_command": TIME,
                "input_schema": {
                    "type": "object",
                    "required": ["timezone"],
                    "properties": {"timezone": {"type": "string"}},
                },
            },
        )
    project = tmp_path / "project"
    project.mkdir()
    _plan(sqlite_url, project)
    with Plane.open(sqlite_url) as plane:
        drifted = call_tool(plane, "P-1", "time.get_current_time", {"timezone": "UTC"}).to_json()
    assert drifted["halt"] is not None and "schema" in json.dumps(drifted["halt"]), drifted
    review = _imported(sqlite_url, "--mcp", "time", "--dry-run", "--", *TIME)
    mended = next(t for t in review["tools"] if t["name"] == "time.get_current_time")
    assert mended["action"] == "changed" and "input_schema" in mended["changed"]
    assert "output_schema" in mended["changed"] and mended["version"] is None
    # the review is a diff: RFC 6902 operations from the registered to the declared
    ops = mended["patch"]["input_schema"]
    assert any(op["path"].startswith("/properties/timezone/") for op in ops), ops
    assert mended["patch"]["output_schema"][0]["op"] == "replace"
    text = run_cli("tool", "import", "--mcp", "time", "--dry-run", "--db", sqlite_url, "--", *TIME)
    assert "    input_schema: add /properties/timezone/" in text.stdout, text.stdout


def test_a_tool_the_server_stopped_listing_is_reported_gone(sqlite_url: str) -> None:
    assert run_cli("init", "--db", sqlite_url).returncode == 0
    with Plane.open(sqlite_url) as plane:
        register_tool(
            plane,
            {
                "name": "time.retired",
                "mcp_server": "time",
                "mcp_tool_name": "retired",
                "mcp_command": TIME,
                "input_schema": {"type": "object"},
            },
        )
    found = _imported(sqlite_url, "--mcp", "time", "--", *TIME)
    gone = [t for t in found["tools"] if t["action"] == "gone"]
    assert [t["name"] for t in gone] == ["time.retired"] and "stays" in gone[0]["why"]
    text = run_cli("tool", "import", "--mcp", "time", "--db", sqlite_url, "--", *TIME)
    assert text.returncode == 0 and "gone       time.retired" in text.stdout


def test_refused_imports_leave_the_ledger_as_it_was(sqlite_url: str) -> None:
    assert run_cli("init", "--db", sqlite_url).returncode == 0
    head = _head(sqlite_url)
    db = ("--db", sqlite_url)
    assert_refused(run_cli("tool", "import", "--mcp", "x", *db), "a command after --, or --url")
    assert_refused(
        run_cli("tool", "import", "--mcp", "x", "--url", "ftp://h", *db, "--", "a"), "--url"
    )
    for name in ("a b", "../x", "x\x1b[2J", ""):  # refused before a server is started
        assert_refused(
            run_cli("tool", "import", "--mcp", name, *db, "--", "/nonexistent/server"),
            "letters, digits",
        )
    for timeout in ("nan", "inf", "0", "-1"):
        assert_refused(
            run_cli("tool", "import", "--mcp", "x", "--timeout", timeout, *db, "--", *TIME),
            "--timeout",
        )
    assert_refused(
        run_cli("tool", "import", "--mcp", "x", *db, "--", "/nonexistent/server"),
        "cannot list the tools of /nonexistent/server",
    )
    assert _head(sqlite_url) == head


def test_the_filesystem_servers_tools_pass_the_gate_as_imported(
    sqlite_url: str, tmp_path: Path
) -> None:
    if shutil.which("node") is None or not (FILESYSTEM / "package.json").is_file():
        if IN_CI:
            pytest.fail(
                "node and tests/interop's packages are needed (npm ci --prefix tests/interop)"
            )
        pytest.skip("needs node and `npm ci --prefix tests/interop`")
    assert run_cli("init", "--db", sqlite_url).returncode == 0
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("imported\n")
    server = ["node", str(FILESYSTEM / "dist/index.js"), "."]
    found = _imported(sqlite_url, "--mcp", "fs", "--", *server)
    names = {t["name"] for t in found["tools"] if t["action"] == "added"}
    assert {"fs.read_text_file", "fs.list_directory"} <= names
    _plan(sqlite_url, project)
    with Plane.open(sqlite_url) as plane:
        answer = call_tool(plane, "P-1", "fs.read_text_file", {"path": "notes.txt"}).to_json()
    assert answer["input_gate"]["verdict"] == "pass", answer
    assert answer["halt"] is None and answer["output_gate"]["verdict"] == "pass", answer
    assert answer["call"]["executor"] == "mcp" and not answer["call"].get("tool_error")


def test_a_streamable_http_servers_tools_by_url(
    sqlite_url: str, request: pytest.FixtureRequest
) -> None:
    """--url: the tools of a server the plane reaches over HTTP, with mcp_url."""
    url, _log = request.getfixturevalue("http_upstream")
    assert run_cli("init", "--db", sqlite_url).returncode == 0
    found = _imported(sqlite_url, "--mcp", "web", "--url", url)
    added = {t["name"] for t in found["tools"] if t["action"] == "added"}
    assert "web.add" in added, found
    shown = json.loads(run_cli("tool", "show", "web.add", "--json", "--db", sqlite_url).stdout)
    assert shown["tool"]["spec"]["mcp_url"] == url
    assert "mcp_command" not in shown["tool"]["spec"] or not shown["tool"]["spec"]["mcp_command"]
