"""The agent's whole loop through the service alone (docs/service.md, "The API").

The failure loop sends a plan back to Strategize when an attempt's iterations are spent;
the revision is the agent's to record (``POST /v1/strategy``, then ``POST
/v1/execute``), an escalation a human's (a signed decision, here through the Python API
with the approver's key, which the agent never holds). A state machine drives plans
through deviations, revisions, escalations, decisions, validations and fixes in every
order the doors allow, and checks after each answer that a refusal names the next step
as a route of the API (never a CLI command the agent lacks), and at the end that the
plan is never stranded: from wherever it got to, Apply is reached through the service
(and the human's decision where one is pending).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, rule
from starlette.testclient import TestClient

from commands.plane import Plane
from commands.plane.attachments import attach
from commands.plane.credentials import issue_credential
from commands.plane.lifecycle import add_approver_key, authorize
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool, register_validation
from commands.service import create_app
from ledger.keys import generate_key_pair
from tests.commands.test_hook_client import SEARCH as HOOK_SEARCH
from tests.helpers import STATUS_CHECK

SEARCH = {"name": "search", "input_schema": HOOK_SEARCH["input_schema"]}
CHECK = STATUS_CHECK
# One deviation spends an attempt; one revision, then an escalation.
CONFIG = {"max_iterations": 1, "max_strategy_revisions": 1, "retry_limit": 0}
CLI_COMMAND = re.compile(r"\bevidence (plan|fix|apply|authorize|validate|call|gate)\b|--[a-z]")


@dataclass
class World:
    root: Path
    env: dict[str, str]
    plane: Plane
    client: TestClient
    plans: Iterator[int]


@pytest.fixture
def world(_world: World, monkeypatch: pytest.MonkeyPatch) -> World:
    """The module's service, its plane key and state directory in force (the suite
    gives each test its own otherwise)."""
    for name, value in _world.env.items():
        monkeypatch.setenv(name, value)
    return _world


@pytest.fixture(scope="module")
def _world(module_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One service per backend for the module's plans (each test makes its own)."""
    root = tmp_path_factory.mktemp("loop")
    url = module_db_url
    env = {"EVIDENCE_PLANE_KEY": str(root / "plane.key"), "EVIDENCE_STATE_DIR": str(root / "s")}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        (root / "check.py").write_text(CHECK)
        with Plane.open(url) as plane:
            register_tool(plane, SEARCH)
            register_validation(
                plane, {"name": "status", "mode": "required", "command": ["python", "check.py"]}
            )
            generate_key_pair(root / "alice.key")
            add_approver_key(plane, "alice", root / "alice.key.pub")
            with TestClient(create_app(url, max_in_flight=2)) as client:
                yield World(root, env, plane, client, itertools.count(1))


def _brief(plan: dict[str, Any]) -> dict[str, Any]:
    """What a plan's answer and a plan's read must agree on."""
    pending = plan.get("pending_decision")
    if isinstance(pending, dict):
        pending = pending["decision_id"]
    return {
        "phase": plan["phase"],
        "revision": plan["revision"],
        "attempt": plan["attempt"],
        "terminal": plan["terminal"],
        "pending_decision": pending,
    }


class Loop:
    """One plan, driven by its agent through the service (and by alice, the approver)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.plan_id = f"L-{next(world.plans)}"
        self.project = world.root / "projects" / self.plan_id
        self.project.mkdir(parents=True)
        (self.project / "status.txt").write_text("bad\n")
        (self.project / "check.py").write_text(CHECK)
        plane = world.plane
        create_plan(
            plane, self.plan_id, project=self.plan_id, resources=[str(self.project)], config=CONFIG
        )
        attach(plane, "status", resource=str(self.project))
        record_strategy(plane, self.plan_id, "make the status good")
        enter_execute(plane, self.plan_id)
        token = issue_credential(plane, self.plan_id, ttl=timedelta(hours=1)).token
        self.auth = {"Authorization": f"Bearer {token}"}
        self.token: str | None = None
        self.refusals: list[str] = []

    def post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The answer's body on 200; None on 409, whose message is checked: the next
        step in the API's terms, never a CLI command."""
        answer = self.world.client.post(path, headers=self.auth, json=body or {})
        if answer.status_code == 409:
            message = answer.json()["error"]
            assert not CLI_COMMAND.search(message), message
            self.refusals.append(message)
            return None
        assert answer.status_code == 200, (path, answer.status_code, answer.text)
        found: dict[str, Any] = answer.json()
        # Read your writes: the state an answer carries is the one a read shows next.
        said = found.get("plan_state") or (found.get("plan") and _brief(found["plan"]))
        if said:
            assert _brief(self.plan()) == _brief(said), (path, said)
        return found

    def plan(self) -> dict[str, Any]:
        answer = self.world.client.get("/v1/plan", headers=self.auth)
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()["plan"]
        return found

    def deviate(self) -> None:
        self.post("/v1/gate/input", {"tool": "search", "params": {"query": 1}})

    def revise(self) -> None:
        self.post("/v1/strategy", {"strategy": "check the status file first"})
        self.post("/v1/execute")

    def decide(self) -> bool:
        """alice's signed revise decision on the pending escalation, if there is one."""
        pending = self.plan().get("pending_decision")
        if not pending:
            return False
        authorize(
            self.world.plane,
            pending["decision_id"],
            self.world.root / "alice.key",
            choice="revise",
            guidance="read the status file before writing it",
        )
        return True

    def fix_and_validate(self) -> None:
        sandbox = self.sandbox()
        if sandbox is not None:
            (sandbox / "status.txt").write_text("good\n")
        self.post("/v1/fix", {"note": "the status is good now"})
        answer = self.post("/v1/validate")
        if answer is not None and answer["validation"]["outcome"] == "pass":
            self.token = answer["validation"]["token"]

    def sandbox(self) -> Path | None:
        answer = self.world.client.get("/v1/plan", headers=self.auth).json()
        found = answer["sandbox"].get(str(self.project))
        return Path(found) if found else None

    def apply(self) -> bool:
        if self.token is None:
            return False
        return self.post("/v1/apply", {"token": self.token}) is not None

    def finish(self) -> None:
        """Apply, from wherever the plan got to: through the service, and the human's
        decision where the loop escalated."""
        for _ in range(12):
            plan = self.plan()
            if plan.get("terminal") == "applied":
                return
            if self.decide():
                continue
            if plan["phase"] == "strategize":
                self.revise()
            elif not self.apply():
                self.fix_and_validate()
        raise AssertionError(f"plan {self.plan_id} stranded: {self.plan()} {self.refusals}")


def test_from_the_first_deviation_to_apply_through_the_service_alone(world: World) -> None:
    loop = Loop(world)
    loop.deviate()  # the attempt's one iteration spent: back to Strategize
    assert loop.plan()["phase"] == "strategize"
    assert loop.post("/v1/gate/input", {"tool": "search", "params": {"query": "x"}}) is None
    assert "(next: POST /v1/" in loop.refusals[-1]
    assert loop.post("/v1/strategy", {"strategy": " \n "}) is None  # no CLI words in it
    assert loop.refusals[-1] == "the strategy is empty"
    loop.revise()
    assert loop.plan()["phase"] == "execute"
    loop.deviate()  # revisions spent too: escalated, a human decides
    assert loop.plan()["pending_decision"]
    assert loop.post("/v1/strategy", {"strategy": "mine"}) is None
    decision = loop.plan()["pending_decision"]["decision_id"]
    assert loop.refusals[-1].endswith(
        f"(next: a human approver decides ({decision}); until then the plan waits)"
    )
    assert loop.post("/v1/execute") is None
    assert loop.decide()
    loop.revise()
    assert loop.plan()["phase"] == "execute"
    loop.fix_and_validate()
    assert loop.token is not None and loop.apply()
    assert (loop.project / "status.txt").read_text() == "good\n"


class AgentLoop(RuleBasedStateMachine):
    """Any order of the doors' steps; the plan ends applied whatever the order was."""

    world: World

    def __init__(self) -> None:
        super().__init__()
        self.loop = Loop(self.world)

    @rule()
    def deviate(self) -> None:
        self.loop.deviate()

    @rule()
    def revise(self) -> None:
        self.loop.revise()

    @rule()
    def record_strategy_alone(self) -> None:
        self.loop.post("/v1/strategy", {"strategy": "a strategy"})

    @rule()
    def execute_alone(self) -> None:
        self.loop.post("/v1/execute")

    @rule()
    def human_decides(self) -> None:
        self.loop.decide()

    @rule()
    def fix_and_validate(self) -> None:
        self.loop.fix_and_validate()

    @rule()
    def validate(self) -> None:
        self.loop.post("/v1/validate")

    @rule()
    def apply(self) -> None:
        self.loop.apply()

    def teardown(self) -> None:
        if self.loop.plan().get("terminal") is None:
            self.loop.finish()


def test_every_order_of_steps_ends_in_apply(world: World) -> None:
    AgentLoop.world = world
    run = AgentLoop.TestCase
    run.settings = settings(
        max_examples=6,
        stateful_step_count=10,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    run().runTest()
