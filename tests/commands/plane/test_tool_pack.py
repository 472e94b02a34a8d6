"""`evidence tool pack claude-code`: an agent CLI's built-in tools registered in one
command (docs/agents.md, "Configuration (Claude Code)"), so that hooks with the matcher
"*" gate Read, Edit, Bash … as registered tools: a well-formed call goes on, a
malformed one is a deviation naming its pointer, and only a tool nobody registered is
invented."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ledger
from commands.plane import Plane
from commands.plane.packs import CLAUDE_CODE, PACKS
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool
from tests.helpers import assert_refused, run_cli


def _pre(tool: str, arguments: Any, use_id: str) -> str:
    return json.dumps(
        {
            "hook_event_name": "PreToolUse",
            "tool_name": tool,
            "tool_input": arguments,
            "tool_use_id": use_id,
        }
    )


def _head(url: str) -> int:
    with ledger.open(url, create=False) as store:
        return store.head().size


def test_the_pack_is_registered_reviewed_and_gates_the_clis_own_tools(
    sqlite_url: str, tmp_path: Path
) -> None:
    assert run_cli("init", "--db", sqlite_url).returncode == 0
    first = run_cli("tool", "pack", "claude-code", "--json", "--db", sqlite_url)
    assert first.returncode == 0, first.stderr
    found = json.loads(first.stdout)
    assert found["version"] == PACKS["claude-code"]["version"]
    assert {t["name"] for t in found["tools"] if t["action"] == "added"} == set(CLAUDE_CODE)
    head = _head(sqlite_url)
    again = run_cli("tool", "pack", "claude-code", "--db", sqlite_url)
    assert again.returncode == 0
    assert {line.split()[0] for line in again.stdout.splitlines()} == {"unchanged"}
    assert _head(sqlite_url) == head
    with Plane.open(sqlite_url) as plane:
        create_plan(plane, "P-1", project="p", resources=[str(tmp_path)])
        record_strategy(plane, "P-1", "read, then edit")
        enter_execute(plane, "P-1")

    def hook(tool: str, arguments: Any, use_id: str) -> tuple[int, str]:
        done = run_cli(
            "hook", "pre-tool", "--plan", "P-1", "--db", sqlite_url,
            input=_pre(tool, arguments, use_id),
        )  # fmt: skip
        return done.returncode, done.stderr

    assert hook("Read", {"file_path": "/w/a.py", "limit": 20}, "u1") == (0, "")
    assert hook("Bash", {"command": "pytest -q", "timeout": 60000}, "u2") == (0, "")
    assert hook("Edit", {"file_path": "a", "old_string": "x", "new_string": "y"}, "u3")[0] == 0
    code, said = hook("Read", {"file_path": 5}, "u4")
    assert code == 2 and "/file_path" in said, said
    code, said = hook("Frobnicate", {}, "u5")  # nobody registered it: invented
    assert code == 2 and "Frobnicate" in said, said


def test_a_tool_of_the_operators_own_under_the_name_is_left_as_it_is(sqlite_url: str) -> None:
    assert run_cli("init", "--db", sqlite_url).returncode == 0
    with Plane.open(sqlite_url) as plane:
        register_tool(plane, {"name": "Bash", "command": ["bash", "-c", "{command}"]})
    done = run_cli("tool", "pack", "claude-code", "--json", "--db", sqlite_url)
    bash = next(t for t in json.loads(done.stdout)["tools"] if t["name"] == "Bash")
    assert bash["action"] == "refused" and "with a command" in bash["why"]


def test_a_dry_run_or_an_unknown_pack_registers_nothing(sqlite_url: str) -> None:
    assert run_cli("init", "--db", sqlite_url).returncode == 0
    head = _head(sqlite_url)
    review = run_cli("tool", "pack", "claude-code", "--dry-run", "--db", sqlite_url)
    assert review.returncode == 0 and review.stdout.startswith("added      Bash")
    assert_refused(run_cli("tool", "pack", "cursor", "--db", sqlite_url), "no tool pack 'cursor'")
    assert _head(sqlite_url) == head
