"""Every door answers the same: an agent verb's JSON is one shape, built below the CLI
(``commands.plane.answers``), whether the agent asks the CLI (``--json``), the JSON API
(``/v1/*``) or MCP (``/mcp``'s ``evidence.*`` verbs, as ``structuredContent``).

Three plans, alike but for their names, each driven through one door by the same steps
(status, strategy, execute, the gates and a call where the door has them, a failing
validation, a fix, a passing one, apply). Each step's answers are compared after masking
what differs between any two plans by construction (their ids and paths, event ids,
times, log positions, digests of plan-bound bytes, the token): the keys, the types and
every other value must be equal. A door that adds, drops, renames or nests a field fails.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from starlette.testclient import TestClient

from commands.plane import Plane
from commands.plane.attachments import attach
from commands.plane.credentials import issue_credential
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool, register_validation
from commands.service import create_app
from tests.helpers import invoke, work

STATUS_CHECK = """
import json
ok = open("status.txt").read().strip() == "good"
print(json.dumps({"passed": ok, "message": "status is good" if ok else "status is bad"}))
"""
ECHO = {
    "name": "echo",
    "command": [
        "python",
        "-c",
        "import json, sys; print(json.dumps(dict(text=sys.argv[1])))",
        "{text}",
    ],
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
    "output_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
}
PARAMS = {"text": "hi"}
STRATEGY = "make the status good"
NOTE = "the status is good now"
DOORS = ("cli", "http", "mcp")
# Steps only some doors have: MCP gates a tool call as the call itself (the tool's own
# answer), not as a verb with a JSON answer.
NOT_ON = {"gate_input": {"mcp"}, "gate_output": {"mcp"}, "call": {"mcp"}}
HTTP_ONLY = [
    ("/v1/gate/input", {"tool": "echo", "params": PARAMS, "step": "s1"}),
    ("/v1/gate/output", {"step": "s1", "output": PARAMS}),
    ("/v1/call", {"tool": "echo", "params": PARAMS, "step": "s2"}),
]
# Values that differ between two alike plans by construction, masked by key.
VOLATILE_KEYS = {
    "position", "positions", "duration_ms", "started_at", "ended_at", "recorded_at",
    "token", "token_id", "run_id", "at", "expires_at",
}  # fmt: skip
ULID = re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b")
HEX = re.compile(r"\b[0-9a-f]{16,}\b")  # digests, and the sandbox's directories named by them
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?")


@dataclass
class Door:
    name: str
    plan_id: str
    project: Path
    token: str


def _setup(url: str, root: Path) -> dict[str, Door]:
    (root / "check.py").write_text(STATUS_CHECK)
    doors = {}
    with Plane.open(url) as plane:
        register_tool(plane, ECHO)
        register_validation(
            plane,
            {"name": "status", "mode": "required", "command": ["python", str(root / "check.py")]},
        )
        for name in DOORS:
            plan_id = f"P-{name}"
            project = root / "projects" / plan_id
            project.mkdir(parents=True)
            (project / "status.txt").write_text("bad\n")
            create_plan(plane, plan_id, project=plan_id, resources=[str(project)])
            attach(plane, "status", resource=str(project))
            token = issue_credential(plane, plan_id, ttl=timedelta(hours=1)).token
            doors[name] = Door(name, plan_id, project, token)
    return doors


def _make_good(url: str, door: Door) -> None:
    """The agent's fix: the status made good in the plan's sandbox."""
    with Plane.open(url) as plane:
        (work(plane, door.plan_id) / "status.txt").write_text("good\n")


def _cli(url: str, door: Door) -> dict[str, Any]:
    answers: dict[str, Any] = {}
    p = door.plan_id

    def run(step: str, *args: str, exits: int = 0) -> Any:
        done = invoke(*args, "--json", "--db", url)
        assert done.exit_code == exits, (step, done.stdout, done.stderr)
        answers[step] = json.loads(done.stdout)
        return answers[step]

    run("status_new", "plan", "show", p)
    run("strategy", "plan", "strategize", p, "--strategy", STRATEGY)
    run("status_strategized", "plan", "show", p)
    run("execute", "plan", "execute", p)
    gate = ("--plan", p, "--step", "s1")
    run("gate_input", "gate", "input", *gate, "--tool", "echo", "--params", json.dumps(PARAMS))
    run("gate_output", "gate", "output", *gate, "--output", json.dumps(PARAMS))
    run("call", "call", p, "--tool", "echo", "--params", json.dumps(PARAMS), "--step", "s2")
    run("validate_blocker", "validate", p, exits=1)
    run("status_failed", "plan", "show", p)
    _make_good(url, door)
    run("fix", "fix", p, "--note", NOTE)
    token = run("validate_pass", "validate", p)["validation"]["token"]
    run("apply", "apply", p, "--token", token)
    run("status_applied", "plan", "show", p)
    return answers


def _http(url: str, door: Door) -> dict[str, Any]:
    answers: dict[str, Any] = {}
    auth = {"Authorization": f"Bearer {door.token}"}
    with TestClient(create_app(url)) as client:

        def run(step: str, path: str, body: dict[str, Any] | None = None) -> Any:
            got = (
                client.get(path, headers=auth)
                if body is None
                else client.post(path, headers=auth, json=body)
            )
            assert got.status_code == 200, (step, got.text)
            answers[step] = got.json()
            return answers[step]

        run("status_new", "/v1/plan")
        run("strategy", "/v1/strategy", {"strategy": STRATEGY})
        run("status_strategized", "/v1/plan")
        run("execute", "/v1/execute", {})
        for (path, body), step in zip(
            HTTP_ONLY, ("gate_input", "gate_output", "call"), strict=True
        ):
            run(step, path, body)
        run("validate_blocker", "/v1/validate", {})
        run("status_failed", "/v1/plan")
        _make_good(url, door)
        run("fix", "/v1/fix", {"note": NOTE})
        token = run("validate_pass", "/v1/validate", {})["validation"]["token"]
        run("apply", "/v1/apply", {"token": token})
        run("status_applied", "/v1/plan")
    return answers


def _mcp(url: str, door: Door) -> dict[str, Any]:
    answers: dict[str, Any] = {}
    app = create_app(url)

    async def drive() -> None:
        http = httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            base_url="http://plane.test",
            headers={"Authorization": f"Bearer {door.token}"},
            timeout=120,
        )
        async with (
            app.router.lifespan_context(app),
            http,
            streamable_http_client("http://plane.test/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()

            async def run(step: str, verb: str, args: dict[str, Any] | None = None) -> Any:
                got = await session.call_tool(f"evidence.{verb}", args or {})
                assert not got.is_error, (step, got)
                answers[step] = got.structured_content
                return answers[step]

            await run("status_new", "plan_status")
            await run("strategy", "record_strategy", {"strategy": STRATEGY})
            await run("status_strategized", "plan_status")
            await run("execute", "execute")
            # MCP has no gate verbs (a tool call is the call itself): the same steps
            # through the JSON API, so that the plan records what the others do.
            for path, body in HTTP_ONLY:
                assert (await http.post(path, json=body)).status_code == 200
            await run("validate_blocker", "validate")
            await run("status_failed", "plan_status")
            _make_good(url, door)
            await run("fix", "record_fix", {"note": NOTE})
            token = (await run("validate_pass", "validate"))["validation"]["token"]
            await run("apply", "apply", {"token": token})
            await run("status_applied", "plan_status")

    anyio.run(drive)
    return answers


def _masked(value: Any, door: Door, key: str = "") -> Any:
    """``value`` with what differs between alike plans by construction replaced by its
    type's name; everything else kept."""
    if key in VOLATILE_KEYS:
        return type(value).__name__
    if isinstance(value, dict):
        return {_masked(k, door): _masked(v, door, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, door, key) for v in value]
    if isinstance(value, str):
        text = value.replace(door.plan_id, "P")
        for pattern, name in ((ULID, "<ulid>"), (HEX, "<hex>"), (TIME, "<time>")):
            text = pattern.sub(name, text)
        return text
    return value


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("doors")
    url = f"sqlite:///{root / 'evidence.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EVIDENCE_PLANE_KEY", str(root / "plane.key"))
        patch.setenv("EVIDENCE_STATE_DIR", str(root / "state"))
        doors = _setup(url, root)
        drivers: dict[str, Callable[[str, Door], dict[str, Any]]] = {
            "cli": _cli,
            "http": _http,
            "mcp": _mcp,
        }
        return {
            name: {step: _masked(a, doors[name]) for step, a in drive(url, doors[name]).items()}
            for name, drive in drivers.items()
        }


STEPS = [
    "status_new", "strategy", "status_strategized", "execute", "gate_input", "gate_output",
    "call", "validate_blocker", "status_failed", "fix", "validate_pass", "apply",
    "status_applied",
]  # fmt: skip


@pytest.mark.parametrize("step", STEPS)
def test_every_door_answers_the_step_alike(answers: dict[str, dict[str, Any]], step: str) -> None:
    doors = [d for d in DOORS if d not in NOT_ON.get(step, set())]
    first, *others = doors
    for other in others:
        assert answers[other][step] == answers[first][step], (step, first, other)


def test_the_steps_say_what_they_did(answers: dict[str, dict[str, Any]]) -> None:
    """Not vacuously alike: the answers carry what each step did."""
    cli = answers["cli"]
    assert cli["status_new"]["plan"]["phase"] == "strategize"
    assert [m["validation"] for m in cli["status_strategized"]["would_bind"]] == ["status"]
    assert cli["execute"]["sandbox"] and cli["status_failed"]["would_bind"] is None
    assert cli["gate_input"]["gate"]["verdict"] == "pass"
    assert cli["call"]["output_gate"]["verdict"] == "pass"
    assert cli["validate_blocker"]["validation"]["outcome"] == "blocker"
    assert [f["validation"] for f in cli["status_failed"]["failures"]] == ["status"]
    assert cli["status_failed"]["failures"][0]["message"] == "status is bad"
    assert cli["validate_pass"]["plan_state"]["needs_fix"] is False
    assert [f["path"] for f in cli["apply"]["files"]] == ["status.txt"]
    assert cli["status_applied"]["plan"]["terminal"] == "applied"
    assert cli["status_applied"]["confinement"]["landlock"] == 3  # the call, two runs
