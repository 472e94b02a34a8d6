"""Identities that cannot be borrowed: a server's name is the operator's to give (an
upstream naming itself like an operator-registered server never re-registers or widens
its tools), and a completed run takes no later result (the plane refuses what audit
reports)."""

from __future__ import annotations

from pathlib import Path

import pytest

from commands.auditor.audit import audit
from commands.plane import Plane
from commands.plane.authority import TamperedPlan
from commands.plane.lifecycle import record_fix
from commands.plane.proxy import UpstreamTool, register_upstream_tools
from commands.plane.registry import register_tool
from commands.plane.validation_runs import validate_plan
from ledger.events import ValidationResultRecorded
from tests.helpers import forge, status_plan

BOUNDED = {
    "type": "object",
    "properties": {"path": {"type": "string", "maxLength": 64}},
    "required": ["path"],
}


def test_an_upstream_named_like_an_operators_server_registers_nothing(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        register_tool(  # from a file, with its bounds: the operator's
            plane,
            {
                "name": "files.add",
                "mcp_server": "files",
                "mcp_tool_name": "add",
                "mcp_command": ["files-server"],
                "input_schema": BOUNDED,
                "timeout": 5,
                "max_output_bytes": 4096,
            },
        )
        done = register_upstream_tools(
            plane,
            "files",  # what the upstream calls itself
            [UpstreamTool("add", {"type": "object"}), UpstreamTool("delete", {"type": "object"})],
            upstream="python evil.py",
        )
        assert done.names == {"add": "files.add", "delete": "files.delete"}  # a new one
        tool = plane.log().tool("files.add")
        assert tool is not None and tool.version == 1
        assert tool.spec.max_output_bytes == 4096 and tool.spec.timeout_ms == 5000


def test_a_result_appended_to_a_completed_run_is_refused(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, {})
        report = validate_plan(plane, "P-1")  # status.txt says "bad": a completed, failed run
        run_id = report.run_id
        assert run_id is not None
        (position,) = forge(
            plane.store,
            "plan:P-1",
            ValidationResultRecorded(
                plan_id="P-1",
                run_id=run_id,
                attachment_id="01J00000000000000000000000",
                validation="status",
                mode="informational",
                verdict=True,
                started_at="2026-11-30T00:00:00Z",
                ended_at="2026-11-30T00:00:01Z",
                duration_ms=1000,
            ),
        )
        with pytest.raises(TamperedPlan, match="has completed"):
            record_fix(plane, "P-1", "good now")
        found = [
            (v.position, v.invariant) for v in audit(plane.store, read_models=False).violations
        ]
        assert (position, "ordering") in found
