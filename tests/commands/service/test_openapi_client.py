"""A client generated from the service's OpenAPI document works (issue 45).

`openapi-python-client` (the generator most Python users reach for) reads
`GET /openapi.json` of a real `evidence serve` and writes a client package, offline
(`--path`, no post hooks); the test imports it and calls the same running service with
it: a refusal parses into the generated `Error`, an agent's answers into their models,
and the schemas several answers share (`Error`, `Gate`, `Deviation`, `Plan`, …) are one
generated type each — a regression to inline schemas would make one near-duplicate model
per route, and fails here.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
import urllib.request
import warnings
from pathlib import Path
from typing import Any

import pytest

from commands.plane import Plane
from tests.commands.service.test_service import Server, _new_plan, _setup_ledger

pytest.importorskip("openapi_python_client")
pytest.importorskip("httpx")  # what the generated client speaks HTTP with

PACKAGE = "evidence_plane_client"
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "generated", "version": "0"},
    },
}
# The most model files the generator may write (80 today: the operator's checkpoint
# route brought its body and answer; 78 before, the three approver routes brought 14;
# 53 before the two operator routes brought their 11, the place shared;
# 48 before the plan's status and strategy
# answers carried would_bind, confinement and failures): inlined shared schemas came to
# 55 at 48, each route with its own Plan, Sandbox, gate deviation, hook input and answer.
MAX_MODELS = 80


def _generate(document: Path, out: Path) -> str:
    """The generator's CLI on ``document`` into ``out`` (a package): what it printed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    config = out.parent / "generator.yaml"
    config.write_text("post_hooks: []\n")  # no formatter run: nothing but the generator
    found = subprocess.run(
        [
            sys.executable, "-m", "openapi_python_client", "generate",
            "--path", str(document), "--output-path", str(out), "--meta", "none",
            "--config", str(config), "--fail-on-warning",
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert found.returncode == 0, found.stdout + found.stderr
    # code Python compiles without a word (a SyntaxWarning is tomorrow's SyntaxError)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for source in out.rglob("*.py"):
            compile(source.read_text(), str(source), "exec")
    return found.stdout + found.stderr


def _import(root: Path) -> Any:
    sys.path.insert(0, str(root))
    try:
        importlib.invalidate_caches()
        return importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(root))


@pytest.mark.slow
def test_a_generated_client_calls_the_real_service(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'evidence.db'}"
    _setup_ledger(url, tmp_path)
    with Plane.open(url) as plane:
        agent = _new_plan(plane, tmp_path, "G-1")
    server = Server(url)
    loaded: list[str] = []
    try:
        with urllib.request.urlopen(server.base + "/openapi.json", timeout=30) as answer:
            document = tmp_path / "openapi.json"
            document.write_bytes(answer.read())
        said = _generate(document, tmp_path / "gen" / PACKAGE)
        assert "warning" not in said.lower(), said

        # one model per schema: the shared ones named once, none copied into a route
        models = sorted(p.stem for p in (tmp_path / "gen" / PACKAGE / "models").glob("*.py"))
        models.remove("__init__")
        assert len(models) <= MAX_MODELS, models
        shared = {"error", "gate", "deviation", "plan", "sandbox", "plan_state"}
        shared |= {"hook_input", "hook_answer", "json_rpc_error", "unknown_tools"}
        assert shared <= set(models), models
        copies = [
            m for m in models
            if any(f"_{s}" in m and not m.startswith(s) for s in ("deviation", "plan", "sandbox"))
            or "hook_pre_tool" in m or "hook_post_tool" in m
        ]  # fmt: skip
        assert copies == [], copies

        client = _import(tmp_path / "gen")
        loaded = [name for name in sys.modules if name.split(".")[0] == PACKAGE]
        plan_status = importlib.import_module(f"{PACKAGE}.api.agent.plan_status")
        gate_input = importlib.import_module(f"{PACKAGE}.api.agent.gate_input")
        mcp = importlib.import_module(f"{PACKAGE}.api.mcp.mcp")
        metadata = importlib.import_module(f"{PACKAGE}.api.operations.mcp_protected_resource")
        m = importlib.import_module(f"{PACKAGE}.models")

        anonymous = client.Client(base_url=server.base, raise_on_unexpected_status=True)
        authed = client.AuthenticatedClient(
            base_url=server.base, token=agent.token, raise_on_unexpected_status=True
        )

        # no credential: 401, parsed into the generated Error, the challenge beside it
        refused = plan_status.sync_detailed(client=anonymous)
        assert refused.status_code == 401
        assert isinstance(refused.parsed, m.Error)
        assert refused.parsed.error.startswith("no credential: send Authorization: Bearer")
        assert "evidence credential issue" in refused.parsed.error
        assert 'resource_metadata="' in refused.headers["www-authenticate"]

        # the agent's plan: its models, the shared Plan and Sandbox among them
        status = plan_status.sync(client=authed)
        assert isinstance(status, m.PlanStatusResponse200), status
        assert isinstance(status.plan, m.Plan) and isinstance(status.sandbox, m.Sandbox)
        assert status.plan["plan_id"] == agent.plan_id

        # a gate's verdict: Gate, its deviations the shared Deviation, the PlanState
        body = m.GateInputBody.from_dict({"tool": "search", "params": {"query": 1}})
        checked = gate_input.sync(client=authed, body=body)
        assert isinstance(checked, m.GateInputResponse200), checked
        assert isinstance(checked.gate, m.Gate)
        assert checked.gate.verdict == m.GateVerdict.FAIL
        assert [type(d) for d in checked.gate.deviations] == [m.Deviation]
        assert checked.gate.deviations[0].kind == "wrong_type"
        assert checked.gate.deviations[0].pointer == "/query"
        assert isinstance(checked.plan_state, m.PlanState)
        assert checked.plan_state.phase == m.PlanStatePhase.EXECUTE

        # a body off its schema: 422, the Error with its deviations
        off = gate_input.sync_detailed(client=authed, body=m.GateInputBody.from_dict({
            "tool": "search", "params": {}, "step": "../x"
        }))  # fmt: skip
        assert off.status_code == 422 and isinstance(off.parsed, m.Error)
        assert off.parsed.deviations and isinstance(off.parsed.deviations[0], m.Deviation)
        assert off.parsed.deviations[0].kind == "constraint"

        # /mcp without a credential: the JSON-RPC error, and the metadata it points at
        mcp_refused = mcp.sync_detailed(client=anonymous, body=m.McpBody.from_dict(INIT))
        assert mcp_refused.status_code == 401
        assert isinstance(mcp_refused.parsed, m.JsonRpcError)
        assert "no credential" in mcp_refused.parsed.error.message
        found = metadata.sync(client=anonymous)
        assert isinstance(found, m.ProtectedResourceMetadata)
        assert found.resource == server.base + "/mcp"
    finally:
        for name in loaded:
            sys.modules.pop(name, None)
        assert server.stop() == 0, server.logged()
    shutil.rmtree(tmp_path / "gen")


def test_the_document_is_generated_without_a_warning(tmp_path: Path) -> None:
    """The generator reads the document the app serves, offline, and warns of nothing
    (no server: the document is the route table's)."""
    from commands.service.openapi import openapi_document
    from commands.service.routes import ENDPOINTS

    document = tmp_path / "openapi.json"
    document.write_text(json.dumps(openapi_document(ENDPOINTS)))
    said = _generate(document, tmp_path / "gen" / PACKAGE)
    assert "warning" not in said.lower(), said
    assert (tmp_path / "gen" / PACKAGE / "models" / "deviation.py").exists()
