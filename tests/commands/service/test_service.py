"""`evidence serve`: the plane as a service (commands/service, docs/service.md).

In-process (Starlette's TestClient, one ledger and one app for the module, a fresh plan
and credential per test): every endpoint; every refusal — 401 without an accepted
credential, 403 for another plan, 409 for a step the plan's state does not allow, 413 /
422 for a body or query the rules refuse, 503 past the in-flight bound — appends
nothing; the hooks answer exactly what `evidence hook` exits with and prints; the
metrics and the OpenAPI document.

With a real uvicorn (`evidence serve` as a subprocess, marked slow): a gated call round
trip, SIGTERM draining a request in flight, SIGKILL mid-request leaving a ledger verify
and audit accept, two services on one PostgreSQL, and the threat model: the service as
root holds the key and the database where only root reads, and an agent running as
`nobody` reaches its plan with its credential and nothing else.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from starlette.testclient import TestClient

import ledger
from commands.plane import Plane
from commands.plane.attachments import attach
from commands.plane.credentials import issue_credential, revoke_credential
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.proxy_verbs import PLANE_TOOLS
from commands.plane.registry import register_tool, register_validation
from commands.service import create_app
from commands.service.app import DEFAULT_MAX_IN_FLIGHT
from commands.service.routes import ENDPOINTS, ERROR
from tests.helpers import REPO, assert_refused, invoke, run_cli

HOUR = timedelta(hours=1)

SEARCH = {
    "name": "search",
    "input_schema": {
        "type": "object",
        "required": ["query"],
        "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
    },
    "output_schema": {
        "type": "object",
        "required": ["hits"],
        "properties": {"hits": {"type": "array", "items": {"type": "string"}}},
    },
}
# A tool the plane runs itself: prints {"echo": TEXT} (no braces: argv placeholders).
ECHO = {
    "name": "echo",
    "command": [
        "python",
        "-c",
        "import json, sys; print(json.dumps(dict(echo=sys.argv[1])))",
        "{text}",
    ],
    "input_schema": {
        "type": "object",
        "required": ["text"],
        "properties": {"text": {"type": "string"}},
    },
    "output_schema": {
        "type": "object",
        "required": ["echo"],
        "properties": {"echo": {"type": "string"}},
    },
}
# A tool that waits in its working directory (the plan's sandbox) for a file named `go`:
# a request held in flight for as long as a test needs, without timing guesses.
WAIT_CODE = (
    "import json, os, time\n"
    "deadline = time.monotonic() + 60\n"
    "while not os.path.exists('go') and time.monotonic() < deadline:\n"
    "    time.sleep(0.01)\n"
    "print(json.dumps(dict(waited=True)))\n"
)
WAIT = {
    "name": "wait",
    "command": ["python", "-c", WAIT_CODE],
    "output_schema": {
        "type": "object",
        "required": ["waited"],
        "properties": {"waited": {"type": "boolean"}},
    },
}
STATUS_CHECK = """
import json
ok = open("status.txt").read().strip() == "good"
print(json.dumps({"passed": ok, "message": "status is good" if ok else "status is bad"}))
"""


@dataclass
class Served:
    url: str
    root: Path
    env: dict[str, str]
    plane: Plane  # the test's own (setup and inspection), beside the app's pool
    client: TestClient

    def head(self) -> int:
        return self.plane.store.head().size


@dataclass
class Agent:
    plan_id: str
    token: str
    credential_id: str
    project: Path

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def _setup_ledger(url: str, root: Path) -> None:
    (root / "check.py").write_text(STATUS_CHECK)
    with Plane.open(url) as plane:
        for spec in (SEARCH, ECHO, WAIT):
            register_tool(plane, spec)
        register_validation(
            plane,
            {"name": "status", "mode": "required", "command": ["python", str(root / "check.py")]},
        )


def _new_plan(plane: Plane, root: Path, plan_id: str, *, execute: bool = True) -> Agent:
    """A plan on its own project (status.txt "bad", the status validation attached), in
    Execute unless told otherwise, and an agent credential for it."""
    project = root / "projects" / plan_id
    project.mkdir(parents=True)
    (project / "status.txt").write_text("bad\n")
    create_plan(plane, plan_id, project=plan_id, resources=[str(project)])
    attach(plane, "status", resource=str(project))
    record_strategy(plane, plan_id, "make the status good")
    if execute:
        enter_execute(plane, plan_id)
    issued = issue_credential(plane, plan_id, ttl=HOUR)
    return Agent(plan_id, issued.token, issued.credential_id, project)


@pytest.fixture(scope="module")
def _served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("service")
    env = {
        "EVIDENCE_PLANE_KEY": str(root / "plane.key"),
        "EVIDENCE_STATE_DIR": str(root / "state"),
        "EVIDENCE_ADMISSION_WAIT": "0.3",  # a request waits that long for a place
    }
    url = f"sqlite:///{root / 'evidence.db'}"
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        _setup_ledger(url, root)
        with (
            Plane.open(url) as plane,
            TestClient(create_app(url, max_in_flight=2)) as client,
        ):
            yield Served(url, root, env, plane, client)


@pytest.fixture
def served(_served: Served, monkeypatch: pytest.MonkeyPatch) -> Served:
    """The module's service, with the module's plane key and state directory in force
    (the suite gives each test its own otherwise)."""
    for name, value in _served.env.items():
        monkeypatch.setenv(name, value)
    return _served


_PLANS = itertools.count(1)


@pytest.fixture
def agent(served: Served) -> Agent:
    return _new_plan(served.plane, served.root, f"S-{next(_PLANS)}")


def _events(served: Served, plan_id: str) -> list[ledger.RecordedEvent]:
    return list(served.plane.store.read_stream(f"plan:{plan_id}"))


def _go(served: Served, agent: Agent) -> Path:
    """Where the plan's tools run: the sandbox copy of its project."""
    doc = served.plane.state(f"plan:{agent.plan_id}").doc
    return served.plane.sandbox(doc).ensure().copies[str(agent.project)]


# (the operator and approver routes take a person's signature, no credential:
# test_operator_routes.py)
AGENT_ROUTES = [e for e in ENDPOINTS if e.access not in ("open", "operator", "approver")]


# -- the open routes and the document -----------------------------------------------------


def test_health_readiness_and_the_openapi_document_need_no_credential(served: Served) -> None:
    client = served.client
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {
        "status": "ready",
        "head_size": served.head(),
    }
    doc = client.get("/openapi.json").json()
    # every route of the table is in the document, and the app serves exactly those
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert documented == {(e.method, e.path) for e in ENDPOINTS}
    for e in AGENT_ROUTES:
        op = doc["paths"][e.path][e.method.lower()]
        # /mcp answers a refused step as an MCP tool error in a 200, never a 409
        refused = {"409"} if e.access != "mcp" else set()
        assert {"200", "401", "403", "422", "503"} | refused <= set(op["responses"])
        if e.body is not None:
            schema = op["requestBody"]["content"]["application/json"]["schema"]
            if "$ref" in schema:  # a shared one (the hooks' input), named once
                schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
            assert schema == e.body
    validator = pytest.importorskip("openapi_spec_validator")
    validator.validate(doc)  # the OpenAPI 3.1 meta-schema (and its dialect), offline


def test_openapi_document_is_checked_against_the_31_meta_schema_with_jsonschema(
    served: Served,
) -> None:
    """The meta-schema file itself, through jsonschema: a document that breaks it fails."""
    validator = pytest.importorskip("openapi_spec_validator")
    meta = json.loads(
        (Path(validator.__file__).parent / "resources/schemas/v3.1/schema.json").read_text()
    )
    doc = served.client.get("/openapi.json").json()
    jsonschema.Draft202012Validator(meta).validate(doc)
    broken = {**doc, "paths": {"/healthz": {"get": {"responses": "none"}}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(meta).validate(broken)


def test_answers_match_the_schemas_the_document_declares(served: Served, agent: Agent) -> None:
    client, h = served.client, agent.auth
    answers = {
        "plan_status": client.get("/v1/plan", headers=h),
        "gate_input": client.post(
            "/v1/gate/input", headers=h, json={"tool": "search", "params": {"query": 1}}
        ),
        "call": client.post(
            "/v1/call", headers=h, json={"tool": "echo", "params": {"text": "hi"}, "step": "e1"}
        ),
        "gate_output": client.post(
            "/v1/gate/output", headers=h, json={"step": "e1", "output": {"echo": "x"}}
        ),
        "hook_pre_tool": client.post(
            "/v1/hooks/pre-tool",
            headers=h,
            json={"tool_name": "search", "tool_input": {"query": "a"}},
        ),
        "validate": client.post("/v1/validate", headers=h),
        "record_fix": client.post("/v1/fix", headers=h, json={"note": "n"}),
        "readyz": client.get("/readyz"),
        "healthz": client.get("/healthz"),
    }
    by_id = {e.operation_id: e for e in ENDPOINTS}
    for name, answer in answers.items():
        assert answer.status_code == 200, (name, answer.text)
        jsonschema.Draft202012Validator(by_id[name].ok).validate(answer.json())
    refused = client.post("/v1/gate/input", headers=h, json={"tool": 1})
    jsonschema.Draft202012Validator(ERROR).validate(refused.json())


def test_shared_schemas_are_named_once_and_answers_match_the_document(
    served: Served, agent: Agent
) -> None:
    """An error, a gate's check, a deviation, a plan's state: each once under
    components/schemas, referred to by $ref (a generator makes one type of each); the
    answers validate against the document itself, every $ref resolved."""
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    doc = served.client.get("/openapi.json").json()
    shared = doc["components"]["schemas"]
    assert {"Error", "Gate", "Deviation", "PlanState", "JsonRpcError"} <= set(shared)
    text = json.dumps(doc["paths"])
    assert '"required": ["error"]' not in text  # the error schema is never written out
    assert text.count('"#/components/schemas/Error"') > 20
    registry = Registry().with_resource(
        "urn:evidence:openapi", Resource.from_contents(doc, default_specification=DRAFT202012)
    )

    def answer_schema(path: str, method: str, status: str) -> Any:
        pointer = path.replace("~", "~0").replace("/", "~1")
        return {
            "$ref": f"urn:evidence:openapi#/paths/{pointer}/{method}/responses/{status}"
            "/content/application~1json/schema"
        }

    h = agent.auth
    client_answers = {
        ("/v1/gate/input", "post", "200"): served.client.post(
            "/v1/gate/input", headers=h, json={"tool": "search", "params": {"query": 1}}
        ),
        ("/v1/gate/input", "post", "422"): served.client.post(
            "/v1/gate/input", headers=h, json={"tool": 1}
        ),
        ("/v1/plan", "get", "401"): served.client.get("/v1/plan"),
    }
    for (path, method, status), answer in client_answers.items():
        assert str(answer.status_code) == status, answer.text
        validator = jsonschema.Draft202012Validator(
            answer_schema(path, method, status), registry=registry
        )
        validator.validate(answer.json())


# -- the agent's verbs --------------------------------------------------------------------


def test_plan_status_is_the_proxy_verbs_answer(served: Served, agent: Agent) -> None:
    answer = served.client.get("/v1/plan", headers=agent.auth)
    assert answer.status_code == 200
    expected = PLANE_TOOLS["evidence.plan_status"].run(served.plane, agent.plan_id, {})
    assert answer.json() == json.loads(json.dumps(expected))
    assert answer.json()["plan"]["plan_id"] == agent.plan_id


def test_gates_record_as_the_cli_does(served: Served, agent: Agent) -> None:
    client, h = served.client, agent.auth
    passed = client.post(
        "/v1/gate/input", headers=h, json={"tool": "search", "params": {"query": "x"}, "step": "s1"}
    ).json()["gate"]
    assert (passed["verdict"], passed["step"], passed["routed"]) == ("pass", "s1", None)
    failed = client.post(
        "/v1/gate/input", headers=h, json={"tool": "search", "params": {"query": 7, "x": 1}}
    ).json()["gate"]
    assert failed["verdict"] == "fail" and failed["routed"] == "retry"
    assert {d["kind"] for d in failed["deviations"]} == {"wrong_type", "extra_field"}
    out = client.post(
        "/v1/gate/output", headers=h, json={"step": "s1", "output": {"hits": ["a"]}}
    ).json()["gate"]
    assert (out["gate"], out["verdict"]) == ("output", "pass")
    events = _events(served, agent.plan_id)
    positions = [*passed["positions"], *failed["positions"], *out["positions"]]
    assert [e.position for e in events[-len(positions) :]] == positions
    checks = [e.payload for e in events if e.type == "gate.checked"]
    # the bytes checked are the parameters' compact JSON, as the hooks keep them
    assert checks[0].checked_sha256 == hashlib.sha256(b'{"query":"x"}').hexdigest()
    assert all(e.actor == "agent" for e in events[-len(positions) :])


def test_a_call_runs_the_tool_on_the_service_side_and_records_it(
    served: Served, agent: Agent
) -> None:
    answer = served.client.post(
        "/v1/call",
        headers=agent.auth,
        json={"tool": "echo", "params": {"text": "hi"}, "step": "c1"},
    )
    assert answer.status_code == 200, answer.text
    report = answer.json()
    assert report["input_gate"]["verdict"] == "pass"
    assert report["output_gate"]["verdict"] == "pass"
    assert (report["call"]["executor"], report["call"]["step"], report["halt"]) == (
        "command",
        "c1",
        None,
    )
    types = [e.type for e in _events(served, agent.plan_id)]
    assert types[-3:] == ["gate.checked", "tool.called", "gate.checked"]


def test_validate_fix_validate_apply_through_the_service(served: Served, agent: Agent) -> None:
    client, h = served.client, agent.auth
    first = client.post("/v1/validate", headers=h, json={})
    assert first.json()["validation"]["outcome"] == "blocker", first.text
    (_go(served, agent) / "status.txt").write_text("good\n")
    fixed = client.post(
        "/v1/fix", headers=h, json={"note": "status is good now", "diff": "-bad\n+good\n"}
    )
    assert fixed.status_code == 200 and fixed.json()["plan"]["plan_id"] == agent.plan_id
    second = client.post("/v1/validate", headers=h).json()["validation"]
    assert second["outcome"] == "pass" and second["token"]
    before = served.head()
    forged = client.post("/v1/apply", headers=h, json={"token": second["token"][:-4] + "AAAA"})
    assert forged.status_code == 409 and forged.json()["error"].startswith("token refused")
    assert served.head() == before
    applied = client.post("/v1/apply", headers=h, json={"token": second["token"]})
    assert applied.status_code == 200, applied.text
    assert (agent.project / "status.txt").read_text() == "good\n"
    assert [f["path"] for f in applied.json()["files"]] == ["status.txt"]
    again = client.post("/v1/apply", headers=h, json={"token": second["token"]})
    assert again.status_code == 409 and served.head() > before


# -- refusals append nothing --------------------------------------------------------------


def _body_of(path: str) -> dict[str, Any]:
    """A well-formed body for each route (so only what a test changes is wrong)."""
    return {
        "/v1/gate/input": {"tool": "search", "params": {"query": "a"}},
        "/v1/gate/output": {"step": "s", "output": {"hits": []}},
        "/v1/call": {"tool": "echo", "params": {"text": "a"}},
        "/v1/strategy": {"strategy": "s"},
        "/v1/execute": {},
        "/v1/validate": {},
        "/v1/fix": {"note": "n"},
        "/v1/apply": {"token": "t"},
        "/v1/hooks/pre-tool": {"tool_name": "search", "tool_input": {"query": "a"}},
        "/v1/hooks/post-tool": {
            "tool_name": "search",
            "tool_input": {"query": "a"},
            "tool_response": {"hits": []},
        },
    }.get(path, {})


def _request(served: Served, e: Any, headers: dict[str, str], **kw: Any) -> Any:
    if e.method == "GET":
        return served.client.get(e.path, headers=headers, **kw)
    kw.setdefault("json", _body_of(e.path))
    return served.client.post(e.path, headers=headers, **kw)


def test_no_accepted_credential_is_401_and_appends_nothing(served: Served, agent: Agent) -> None:
    revoked = issue_credential(served.plane, agent.plan_id, ttl=HOUR)
    revoke_credential(served.plane, revoked.credential_id, "rotated")
    expired = issue_credential(served.plane, agent.plan_id, ttl=timedelta(microseconds=1))
    random_token = "evd_" + "0" * 26 + "_" + "A" * 43
    cases = {
        "none": {},
        "empty": {"Authorization": ""},
        "basic": {"Authorization": "Basic dXNlcjpwYXNz"},
        "bearer without token": {"Authorization": "Bearer "},
        "random": {"Authorization": f"Bearer {random_token}"},
        "not a credential": {"Authorization": "Bearer abc.def"},
        "secret changed": {
            "Authorization": f"Bearer {agent.token[:-1]}{'B' if agent.token[-1] != 'B' else 'C'}"
        },
        "revoked": {"Authorization": f"Bearer {revoked.token}"},
        "expired": {"Authorization": f"Bearer {expired.token}"},
    }
    before = served.head()
    for e in AGENT_ROUTES:
        for name, headers in cases.items():
            answer = _request(served, e, headers)
            assert answer.status_code == 401, (e.path, name, answer.text)
            assert answer.headers["www-authenticate"].startswith('Bearer realm="evidence"')
            assert set(answer.json()) >= {"error"}
            assert "\n" not in answer.json()["error"]
            if e.access == "hook":  # a thin hook client relays it: a block
                assert answer.json()["exit"] == 2
                assert answer.json()["stderr"] == f"error: {answer.json()['error']}\n"
    assert served.head() == before


def test_another_plans_id_is_403_and_appends_nothing(served: Served, agent: Agent) -> None:
    other = _new_plan(served.plane, served.root, f"S-{next(_PLANS)}")
    before = served.head()
    for e in AGENT_ROUTES:
        if e.query:
            answer = _request(served, e, other.auth, params={"plan": agent.plan_id})
            assert answer.status_code == 403, (e.path, answer.text)
            error = answer.json()["error"]  # at /mcp a JSON-RPC error: its message
            assert agent.plan_id in (error["message"] if e.access == "mcp" else error)
        if e.body is not None and e.access == "agent":
            body = {**_body_of(e.path), "plan": agent.plan_id}
            answer = _request(served, e, other.auth, json=body)
            assert answer.status_code == 403, (e.path, answer.text)
    assert served.head() == before
    # naming its own plan is allowed
    own = served.client.get("/v1/plan", headers=other.auth, params={"plan": other.plan_id})
    assert own.status_code == 200


BAD_BODIES = [
    pytest.param("/v1/gate/input", {"tool": "search"}, "missing_required", id="missing"),
    pytest.param("/v1/gate/input", {"tool": 5, "params": {}}, "wrong_type", id="wrong-type"),
    pytest.param(
        "/v1/gate/input", {"tool": "s", "params": {}, "extra": 1}, "extra_field", id="extra"
    ),
    pytest.param(
        "/v1/gate/input", {"tool": "s", "params": {}, "step": "../x"}, "constraint", id="step"
    ),
    pytest.param(
        "/v1/gate/output", {"step": "s", "output": 1, "schema": {}}, "extra_field", id="schema"
    ),
    pytest.param("/v1/fix", {"note": ""}, "constraint", id="empty-note"),
    pytest.param("/v1/apply", {}, "missing_required", id="no-token"),
    pytest.param("/v1/validate", {"dry_run": True}, "extra_field", id="validate-extra"),
]


@pytest.mark.parametrize(("path", "body", "kind"), BAD_BODIES)
def test_a_body_off_its_closed_schema_is_422_with_the_deviations(
    served: Served, agent: Agent, path: str, body: dict, kind: str
) -> None:
    before = served.head()
    answer = served.client.post(path, headers=agent.auth, json=body)
    assert answer.status_code == 422, answer.text
    assert kind in {d["kind"] for d in answer.json()["deviations"]}
    assert served.head() == before


RAW_BODIES = [
    pytest.param(b"not json", "not valid JSON", id="not-json"),
    pytest.param(b'{"tool": "a", "tool": "b"}', "duplicate key", id="duplicate"),
    pytest.param(b'{"tool": "s", "params": NaN}', "NaN", id="nan"),
    pytest.param(b'{"tool": "s", "params": ' + b"[" * 70 + b"]" * 70 + b"}", "deeper", id="deep"),
    pytest.param(b'{"tool": "s\xff", "params": 1}', "UTF-8", id="utf8"),
    pytest.param(b"[1]", "wrong_type", id="not-an-object"),
]


@pytest.mark.parametrize(("data", "fragment"), RAW_BODIES)
def test_bytes_the_input_layer_refuses_are_422(
    served: Served, agent: Agent, data: bytes, fragment: str
) -> None:
    before = served.head()
    answer = served.client.post("/v1/gate/input", headers=agent.auth, content=data)
    assert answer.status_code == 422, answer.text
    assert fragment in answer.text
    assert served.head() == before


def test_query_and_size_refusals(
    served: Served, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, h = served.client, agent.auth
    before = served.head()
    assert client.get("/v1/plan", headers=h, params={"x": "1"}).status_code == 422
    assert client.get("/v1/plan?plan=a&plan=a", headers=h).status_code == 422
    hook = "/v1/hooks/pre-tool"
    body = _body_of(hook)
    assert (
        client.post(hook, headers=h, params={"unknown_tools": "allow"}, json=body).status_code
        == 422
    )
    assert client.request("GET", "/v1/plan", headers=h, content=b"{}").status_code == 422
    monkeypatch.setenv("EVIDENCE_MAX_AGENT_BYTES", "64")
    big = client.post(
        "/v1/gate/input", headers=h, json={"tool": "search", "params": {"query": "x" * 100}}
    )
    assert big.status_code == 413 and "EVIDENCE_MAX_AGENT_BYTES" in big.json()["error"]
    big_hook = client.post(hook, headers=h, json={**body, "tool_input": {"query": "x" * 100}})
    assert big_hook.status_code == 413 and big_hook.json()["exit"] == 2
    # a token nobody issued: 401 before its body is looked at (it holds no place)
    stranger = client.post(
        "/v1/gate/input",
        headers={"Authorization": "Bearer evc_agent.nobody-issued-this"},
        json={"tool": "search", "params": {"query": "x" * 100}},
    )
    assert stranger.status_code == 401, stranger.text
    assert served.head() == before


def test_a_step_the_plans_state_does_not_allow_is_409(served: Served) -> None:
    waiting = _new_plan(served.plane, served.root, f"S-{next(_PLANS)}", execute=False)
    before = served.head()
    for path in ("/v1/gate/input", "/v1/gate/output", "/v1/call", "/v1/validate", "/v1/fix"):
        answer = served.client.post(path, headers=waiting.auth, json=_body_of(path))
        assert answer.status_code == 409, (path, answer.text)
        assert "Strategize" in answer.json()["error"]
    hook = served.client.post(
        "/v1/hooks/pre-tool", headers=waiting.auth, json=_body_of("/v1/hooks/pre-tool")
    )
    assert hook.status_code == 409
    assert hook.json()["exit"] == 2 and hook.json()["stderr"].startswith("error: plan ")
    assert served.head() == before
    # the plan's status is still readable
    assert (
        served.client.get("/v1/plan", headers=waiting.auth).json()["plan"]["phase"] == "strategize"
    )


def test_unknown_routes_and_methods_answer_json(served: Served) -> None:
    assert served.client.get("/v1/nothing").json() == {"error": "Not Found"}
    wrong = served.client.get("/v1/gate/input")
    assert wrong.status_code == 405 and "error" in wrong.json()


# -- the hooks: exactly what `evidence hook` answers ---------------------------------------


def _use(tool: str, params: Any, use_id: str | None, response: Any = None) -> dict[str, Any]:
    found = {"tool_name": tool, "tool_input": params}
    if use_id is not None:
        found["tool_use_id"] = use_id
    if response is not None:
        found["tool_response"] = response
    return found


RECORD = ("--unknown-tools", "record")
HOOK_CASES: list[tuple[str, Any, tuple[str, ...]]] = [
    ("pre-tool", _use("search", {"query": "a"}, "u1"), ()),
    ("post-tool", _use("search", {"query": "a"}, "u1", {"hits": ["x"]}), ()),
    ("pre-tool", _use("Bash", {"command": "ls"}, "u5"), RECORD),
    ("post-tool", _use("Bash", {"command": "ls"}, "u5", "a\nb"), RECORD),
    ("post-tool", _use("search", {"query": "a"}, "u1", {"hits": []}), ()),  # replayed
    ("pre-tool", _use("search", {"query": 1, "z": 2}, "u2"), ()),  # deviations: retry
    ("post-tool", _use("search", {"query": "b"}, "u3", "plain text"), ()),  # retry
    ("pre-tool", _use("Bash", {"command": "ls"}, "u4"), ()),  # invented: a revision
    ("pre-tool", {"hook_event_name": "PostToolUse", "tool_name": "search", "tool_input": {}}, ()),
    ("pre-tool", b'{"tool_name": "se\\u001barch"}', ()),
    ("post-tool", b"not json", ()),
    ("pre-tool", b'{"tool_name": "search", "tool_name": "x", "tool_input": {}}', ()),
    ("pre-tool", _use("search", {"query": "a"}, "u6"), ()),  # the plan is in Strategize
]


def _positionless(text: str) -> str:
    return re.sub(r"\(position \d+\)", "(position N)", text)


def _doorless(text: str) -> str:
    return re.sub(r" \(next: .*\)$", " (next: …)", text, flags=re.MULTILINE)


def test_the_hooks_answer_exactly_what_evidence_hook_exits_with_and_prints(served: Served) -> None:
    """The same hook inputs, one by one, to `evidence hook` on one plan and to the service
    on an identical one: the same exit, the same stderr (the plan's id aside), and the
    same events recorded."""
    cli_plan = _new_plan(served.plane, served.root, f"S-{next(_PLANS)}")
    svc_plan = _new_plan(served.plane, served.root, f"S-{next(_PLANS)}")
    exits = []
    for kind, stdin, options in HOOK_CASES:
        data = stdin if isinstance(stdin, bytes) else json.dumps(stdin).encode()
        cli = run_cli(
            "hook", kind, "--plan", cli_plan.plan_id, "--db", served.url, *options, input=data
        )
        params = {"unknown_tools": options[1]} if options else {}
        answer = served.client.post(
            f"/v1/hooks/{kind}", headers=svc_plan.auth, params=params, content=data
        )
        got = answer.json()
        assert cli.stdout == ""
        assert got["exit"] == cli.returncode, (kind, stdin, cli.stderr, got)
        # the plan's id aside, where in the shared log an event of its landed, and the
        # next step of a refusal, which each door names in its own terms
        expected = _positionless(cli.stderr.replace(cli_plan.plan_id, svc_plan.plan_id))
        assert _doorless(_positionless(got["stderr"])) == _doorless(expected), (kind, stdin)
        if "(next: evidence " in cli.stderr:
            assert "(next: POST /v1/" in got["stderr"], got["stderr"]
        # a verdict is a 200; a refused command carries the CLI's answer in its refusal
        assert answer.status_code == (409 if "error" in got else 200) or (
            answer.status_code == 422 and got["stderr"].startswith("error: stdin")
        )
        exits.append(got["exit"])
    # and on their own: passes go on; deviations, an unknown tool and refusals block
    assert exits == [0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2]
    cli_types = [e.type for e in _events(served, cli_plan.plan_id)]
    svc_types = [e.type for e in _events(served, svc_plan.plan_id)]
    assert cli_types == svc_types
    assert "tool.called" in svc_types and svc_types.count("gate.checked") >= 4


# -- metrics ------------------------------------------------------------------------------

# A label value is quoted and may hold braces (a route's template: /mcp/{server}).
_SAMPLE = re.compile(r'^([a-z_]+)(\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})? (\S+)$')


def _metrics(served: Served) -> dict[str, float]:
    answer = served.client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, float] = {}
    for line in answer.text.splitlines():
        if line.startswith("#"):
            assert re.match(r"# (HELP|TYPE) evidence_[a-z_]+ ", line), line
            continue
        found = _SAMPLE.match(line)
        assert found, line
        samples[found.group(1) + (found.group(2) or "")] = float(found.group(3))
    return samples


def test_counters_export_their_known_series_from_the_start(tmp_path: Path) -> None:
    """A fresh service exports its counters' known series at 0 (a rate over a series
    that does not exist yet is no rate): checks by gate and verdict, validations by
    outcome, hook answers by hook and exit, overload rejections."""
    url = f"sqlite:///{tmp_path / 'evidence.db'}"
    assert run_cli("init", "--db", url).returncode == 0
    with TestClient(create_app(url)) as client:
        samples = client.get("/metrics").text.splitlines()
    for series in (
        'evidence_gate_checks_total{gate="output",verdict="fail"} 0',
        'evidence_validations_total{outcome="validator_error"} 0',
        'evidence_hook_answers_total{exit="2",hook="post"} 0',
        "evidence_overload_rejections_total 0",
    ):
        assert series in samples, series


def test_metrics_count_requests_checks_deviations_validations_and_hooks(
    served: Served, agent: Agent
) -> None:
    client, h = served.client, agent.auth
    before = _metrics(served)
    client.post("/v1/gate/input", headers=h, json={"tool": "search", "params": {"query": "a"}})
    client.post(
        "/v1/gate/input", headers=h, json={"tool": "search", "params": {"query": 1, "x": 1}}
    )
    client.post(
        "/v1/hooks/pre-tool",
        headers=h,
        json={"tool_name": "search", "tool_input": {"query": "a"}, "tool_use_id": "m1"},
    )
    # post-tool reuses the pre-tool's input check: one new check (output), not two
    client.post(
        "/v1/hooks/post-tool",
        headers=h,
        json={
            "tool_name": "search",
            "tool_input": {"query": "a"},
            "tool_use_id": "m1",
            "tool_response": {"hits": []},
        },
    )
    client.post("/v1/validate", headers=h)
    client.get("/v1/plan")
    after = _metrics(served)

    def delta(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    assert delta('evidence_gate_checks_total{gate="input",verdict="pass"}') == 2
    assert delta('evidence_gate_checks_total{gate="input",verdict="fail"}') == 1
    assert delta('evidence_gate_checks_total{gate="output",verdict="pass"}') == 1
    assert delta('evidence_gate_deviations_total{gate="input",kind="wrong_type"}') == 1
    assert delta('evidence_gate_deviations_total{gate="input",kind="extra_field"}') == 1
    assert delta('evidence_validations_total{outcome="blocker"}') == 1
    assert delta('evidence_hook_answers_total{exit="0",hook="pre"}') == 1
    assert delta('evidence_hook_answers_total{exit="0",hook="post"}') == 1
    assert (
        delta('evidence_http_requests_total{method="POST",route="/v1/gate/input",status="200"}')
        == 2
    )
    assert delta('evidence_http_requests_total{method="GET",route="/v1/plan",status="401"}') == 1
    assert delta('evidence_http_request_duration_seconds_count{route="/v1/validate"}') == 1
    assert (
        after['evidence_http_request_duration_seconds_bucket{route="/v1/validate",le="+Inf"}']
        == (after['evidence_http_request_duration_seconds_count{route="/v1/validate"}'])
    )
    assert after["evidence_ledger_head_size"] == served.head()
    assert after["evidence_in_flight"] == 0 and after["evidence_in_flight_limit"] == 2
    # Every append went through the group commit (one request at a time here: one each),
    # the validation's start and finish included.
    commits = delta("evidence_group_commits_total")
    assert commits >= 5 and delta("evidence_group_commit_jobs_total") == commits


# -- overload -----------------------------------------------------------------------------


def test_past_the_in_flight_bound_is_429_or_503_with_retry_after_and_nothing_started(
    served: Served, agent: Agent
) -> None:
    """Two slow calls fill the module app's bound of two: another request of one of the
    two agents is answered 429 at once (its share, half the bound, is taken); a third
    agent's waits its turn, and with no place freed within the wait it is answered 503
    (the service is saturated). Nothing is appended; the two finish."""
    other = _new_plan(served.plane, served.root, f"S-{next(_PLANS)}")
    third = _new_plan(served.plane, served.root, f"S-{next(_PLANS)}")
    results: dict[str, Any] = {}

    def slow(who: Agent, step: str) -> None:
        results[step] = served.client.post(
            "/v1/call", headers=who.auth, json={"tool": "wait", "params": {}, "step": step}
        )

    threads = [
        threading.Thread(target=slow, args=(agent, "w1")),
        threading.Thread(target=slow, args=(other, "w2")),
    ]
    for t in threads:
        t.start()
    try:
        # both in flight: each one's input gate is recorded before its tool starts
        _wait_for(
            lambda: all(
                any(
                    e.type == "gate.checked" and e.payload.step == step
                    for e in _events(served, who.plan_id)
                )
                for who, step in ((agent, "w1"), (other, "w2"))
            )
        )
        before = served.head()
        for e in AGENT_ROUTES:
            answer = _request(served, e, agent.auth)
            assert answer.status_code == 429, (e.path, answer.text)
            assert answer.headers["retry-after"] == "1" and "its share" in answer.text
        started = time.monotonic()
        answer = _request(served, AGENT_ROUTES[0], third.auth)
        assert answer.status_code == 503 and "saturated" in answer.text, answer.text
        assert answer.headers["retry-after"] == "1"
        assert 0.3 <= time.monotonic() - started < 5
        assert served.head() == before
    finally:
        for who in (agent, other):
            (_go(served, who) / "go").write_text("")
        for t in threads:
            t.join(timeout=60)
    assert [results[s].status_code for s in ("w1", "w2")] == [200, 200]
    assert results["w1"].json()["output_gate"]["verdict"] == "pass"
    assert served.client.get("/v1/plan", headers=agent.auth).status_code == 200


def _wait_for(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


# -- `evidence serve`: refused starts -----------------------------------------------------


def test_serve_refuses_what_it_cannot_serve(tmp_path: Path) -> None:
    from commands.rules.signing import load_or_create_plane_key, plane_key_path

    missing = f"sqlite:///{tmp_path / 'none.db'}"
    assert_refused(run_cli("serve", "--db", missing), "no ledger")
    assert not (tmp_path / "none.db").exists()
    bare = f"sqlite:///{tmp_path / 'bare.db'}"
    ledger.open(bare).close()  # a ledger without a plane key or an operator
    assert_refused(run_cli("serve", "--db", bare, "--host", "0.0.0.0"), "no plane key")
    assert not plane_key_path(bare).exists()  # never made by the service
    load_or_create_plane_key(bare)
    for host in ("0.0.0.0", "::", "example.org"):
        assert_refused(
            run_cli("serve", "--db", bare, "--host", host), "not loopback", "no active operator"
        )
    served_url = f"sqlite:///{tmp_path / 'e.db'}"
    assert run_cli("init", "--db", served_url).returncode == 0
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        assert_refused(run_cli("serve", "--db", served_url, "--port", port), "cannot listen")
    assert run_cli("serve", "--db", served_url, "--max-in-flight", "0").returncode == 2
    # A bad deadline or wait: refused before anything listens (no "listening on" line).
    for name in ("EVIDENCE_ADMISSION_WAIT", "EVIDENCE_BODY_TIMEOUT", "EVIDENCE_HEADER_TIMEOUT"):
        bad = run_cli("serve", "--db", served_url, "--port", "0", env={name: "nan"})
        assert_refused(bad, name)
        assert "listening" not in bad.stdout
    # A host name no resolver can encode: one line, no traceback (with an operator, so
    # the name is looked up).
    operated = f"sqlite:///{tmp_path / 'o.db'}"
    assert run_cli("init", "--operator", "ops", "--db", operated).returncode == 0
    assert_refused(run_cli("serve", "--db", operated, "--host", "\u202e"), "not a host name")


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("postgresql+psycopg://plane:s3cret@127.0.0.1:1/evidence", id="user-info"),
        pytest.param("postgresql+psycopg://plane@127.0.0.1:1/evidence?password=s3cret", id="query"),
    ],
)
def test_serve_refuses_a_password_on_its_command_line(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every local user reads a process's command line (/proc/PID/cmdline): the
    service's database password never goes there; in EVIDENCE_DB it may."""
    refused = invoke("serve", "--db", url)
    assert refused.exit_code == 2 and refused.stderr.count("error:") == 1, refused.output
    assert "holds a password" in refused.stderr and "EVIDENCE_DB" in refused.stderr
    assert "s3cret" not in refused.output
    monkeypatch.setenv("EVIDENCE_DB", url)
    from_env = invoke("serve")
    assert from_env.exit_code == 2 and "holds a password" not in from_env.stderr
    assert "s3cret" not in from_env.output


def test_loopback_is_told_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    from commands.cli.serve import is_loopback

    assert all(map(is_loopback, ["127.0.0.1", "127.8.9.1", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.1", "example.org", "localhost.evil"]))


# -- a real uvicorn -------------------------------------------------------------------------


class Server:
    """`evidence serve` in a subprocess on a free port (it prints where it listens); its
    log goes to a file (a pipe nobody reads would fill and stall it)."""

    def __init__(self, url: str, env: dict[str, str] | None = None, *extra: str) -> None:
        full = {k: v for k, v in os.environ.items() if k != "EVIDENCE_DB"}
        full.update(env or {})
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "commands.cli", "serve", "--db", url, "--port", "0", *extra],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=full,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("listening on http://"), (line, self.logged())
        self.base = line.split(" ", 2)[2].strip()
        _wait_for(lambda: self.proc.poll() is not None or _get(self.base + "/readyz")[0] == 200)
        assert self.proc.poll() is None, self.logged()

    def logged(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            assert self.proc.stdout is not None
            self.proc.stdout.close()
            self.log.close()


def _get(url: str, token: str | None = None) -> tuple[int, Any]:
    return _http("GET", url, None, token)


def _http(method: str, url: str, body: Any, token: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")
    except OSError:
        return 0, None


@pytest.fixture
def real(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    url = f"sqlite:///{tmp_path / 'evidence.db'}"
    _setup_ledger(url, tmp_path)
    yield url, tmp_path


def _stalled(base: str, token: str, path: str = "/v1/call") -> socket.socket:
    """A client that sends its headers and the start of a body, then nothing: the slow
    body of a stranger (any token of the right form) or of an agent."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
            'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"tool"'
        ).encode()
    )
    return sock


def _status_of(sock: socket.socket) -> int:
    """The status of the answer on ``sock`` (0: closed without one)."""
    line = sock.makefile("rb").readline()
    return int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else 0


@pytest.mark.slow
def test_strangers_with_slow_bodies_hold_no_place(real: tuple[str, Path]) -> None:
    """Clients with a token nobody issued, sending slow bodies, held every place of the
    in-flight bound while the service waited for their bodies: the agent got 503. Now
    the credential is checked before a byte of the body is read: a stranger is refused
    at once, and the agent is served."""
    url, root = real
    with Plane.open(url) as plane:
        agent = _new_plan(plane, root, "R-1")
    server = Server(url, {"EVIDENCE_BODY_TIMEOUT": "60"}, "--max-in-flight", "2")
    strangers: list[socket.socket] = []
    try:
        strangers = [_stalled(server.base, "evc_agent.not-issued-" + str(i)) for i in range(6)]
        for _ in range(5):
            status, report = _http(
                "POST", server.base + "/v1/call", {"tool": "echo", "params": {"text": "hi"}},
                agent.token,
            )  # fmt: skip
            assert status == 200, (status, report)
        assert [_status_of(s) for s in strangers] == [401] * 6  # without their bodies
    finally:
        for sock in strangers:
            sock.close()
        assert server.stop() == 0, server.logged()


@pytest.mark.slow
def test_a_stalled_body_gives_its_place_up_and_one_agent_has_half_the_bound(
    real: tuple[str, Path],
) -> None:
    """An agent's own slow bodies: each holds a place for at most the body deadline
    (408), and one credential holds at most half the bound (429 past it), so another
    agent is served meanwhile."""
    url, root = real
    with Plane.open(url) as plane:
        greedy = _new_plan(plane, root, "R-1")
        other = _new_plan(plane, root, "R-2")
    server = Server(url, {"EVIDENCE_BODY_TIMEOUT": "2"}, "--max-in-flight", "4")
    held: list[socket.socket] = []
    try:
        held = [_stalled(server.base, greedy.token) for _ in range(2)]
        _wait_for(lambda: _metric(server.base, "evidence_in_flight") == 2)
        status, body = _http(
            "POST", server.base + "/v1/call", {"tool": "echo", "params": {"text": "x"}},
            greedy.token,
        )  # fmt: skip
        assert status == 429 and "its share" in body["error"], (status, body)
        status, report = _http(
            "POST", server.base + "/v1/call", {"tool": "echo", "params": {"text": "hi"}},
            other.token,
        )  # fmt: skip
        assert status == 200, (status, report)
        assert [_status_of(s) for s in held] == [408, 408]  # within the deadline
        _wait_for(lambda: _metric(server.base, "evidence_in_flight") == 0)
    finally:
        for sock in held:
            sock.close()
        assert server.stop() == 0, server.logged()


@pytest.mark.slow
def test_a_dripping_head_is_cut_at_the_header_deadline(real: tuple[str, Path]) -> None:
    """A client sending its request line and headers a byte now and then holds a socket
    before any admission can look at it: the head is due within EVIDENCE_HEADER_TIMEOUT
    (408, closed), on a new connection and after each answer on a kept-alive one; a
    whole head in time is served as ever."""
    url, _root = real
    server = Server(url, {"EVIDENCE_HEADER_TIMEOUT": "1"})
    host, port = server.base.removeprefix("http://").rsplit(":", 1)

    def dripped(sock: socket.socket, head: bytes) -> tuple[float, bytes]:
        start = time.monotonic()
        answer = b""
        for byte in head:
            try:
                sock.sendall(bytes([byte]))
                time.sleep(0.2)
            except OSError:
                break  # closed on us
        sock.settimeout(10)
        while chunk := sock.recv(65536):
            answer += chunk
        return time.monotonic() - start, answer

    head = b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"y" * 40 + b"\r\n\r\n"
    try:
        with socket.create_connection((host, int(port))) as sock:
            took, answer = dripped(sock, head)
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b"EVIDENCE_HEADER_TIMEOUT" in answer and 0.9 < took < 5, took
        with socket.create_connection((host, int(port))) as sock:  # kept alive, then slow
            sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            sock.settimeout(10)
            first = b""
            while b"\r\n\r\n" not in first:  # the whole first answer, head and body,
                first += sock.recv(65536)  # however the segments arrive
            sized = re.search(rb"content-length: (\d+)", first.lower())
            assert sized is not None, first
            length = int(sized.group(1))
            while len(first.partition(b"\r\n\r\n")[2]) < length:
                first += sock.recv(65536)
            assert first.startswith(b"HTTP/1.1 200 "), first
            took, answer = dripped(sock, head)
        assert answer.startswith(b"HTTP/1.1 408 ") and took < 5, answer
        assert _get(server.base + "/readyz")[0] == 200
    finally:
        assert server.stop() == 0, server.logged()


@pytest.mark.slow
def test_two_services_never_answer_an_older_plan_than_either_answered(
    db_url: str, tmp_path: Path
) -> None:
    """Read your writes across processes: a step answered by one service, the plan read
    from the other at once, on one ledger (SQLite and PostgreSQL) — each answer's
    plan_state is what the other service's GET /v1/plan shows next."""
    _setup_ledger(db_url, tmp_path)
    with Plane.open(db_url) as plane:
        project = tmp_path / "projects" / "T-1"
        project.mkdir(parents=True)
        create_plan(
            plane, "T-1", project="T-1", resources=[str(project)],
            config={"max_iterations": 1, "max_strategy_revisions": 3},
        )  # fmt: skip
        record_strategy(plane, "T-1", "s")
        enter_execute(plane, "T-1")
        token = issue_credential(plane, "T-1", ttl=HOUR).token
    env = {"EVIDENCE_PLANE_KEY": os.environ["EVIDENCE_PLANE_KEY"]}
    env["EVIDENCE_STATE_DIR"] = os.environ["EVIDENCE_STATE_DIR"]
    one, two = Server(db_url, env), Server(db_url, env)
    try:

        def read(server: Server) -> dict[str, Any]:
            status, body = _get(server.base + "/v1/plan", token)
            assert status == 200, body
            plan: dict[str, Any] = body["plan"]
            return {k: plan[k] for k in ("phase", "revision", "attempt")}

        for writer, reader in ((one, two), (two, one), (one, two)):
            status, body = _http(
                "POST", writer.base + "/v1/gate/input",
                {"tool": "search", "params": {"query": 1}}, token,
            )  # fmt: skip
            assert status == 200 and body["gate"]["routed"] == "revised", body
            said = {k: body["plan_state"][k] for k in ("phase", "revision", "attempt")}
            assert said["phase"] == "strategize" and read(reader) == said
            for path, payload in (("/v1/strategy", {"strategy": "again"}), ("/v1/execute", {})):
                status, body = _http("POST", writer.base + path, payload, token)
                assert status == 200, body
                assert read(reader) == {k: body["plan"][k] for k in said}
    finally:
        assert one.stop() == 0, one.logged()
        assert two.stop() == 0, two.logged()


@pytest.mark.slow
def test_a_client_that_leaves_mid_body_is_499_not_a_server_error(
    real: tuple[str, Path],
) -> None:
    """A client gone before its body arrived is nobody's fault here: counted as 499
    (nginx's "client closed request"), never as a 500."""
    url, root = real
    with Plane.open(url) as plane:
        agent = _new_plan(plane, root, "R-1")
    server = Server(url)
    try:
        _stalled(server.base, agent.token).close()  # the headers, part of a body, gone
        _wait_for(lambda: (_metric(server.base, _CALLS_499) or 0) == 1, timeout=30)
        assert _metric(server.base, _CALLS_500) is None
    finally:
        assert server.stop() == 0, server.logged()


_CALLS_499 = 'evidence_http_requests_total{method="POST",route="/v1/call",status="499"}'
_CALLS_500 = 'evidence_http_requests_total{method="POST",route="/v1/call",status="500"}'


def _metric(base: str, name: str) -> float | None:
    with urllib.request.urlopen(base + "/metrics", timeout=30) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


# Schemas an agent could send to make the service work for it: huge, wide, deep.
_HOSTILE_SCHEMAS = [
    {"enum": list(range(200_000))},
    {"type": "array", "uniqueItems": True},
    {"anyOf": [{"type": "string", "pattern": f"^(a+)+{i}$"} for i in range(2000)]},
    {"$defs": {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(60)}, "$ref": "#/$defs/d0"},
]


@pytest.mark.slow
def test_a_schema_of_the_agents_is_never_compiled_by_the_service(real: tuple[str, Path]) -> None:
    """The agent's own schemas (`/v1/gate/output`'s `schema`, `/v1/call`'s
    `output_schema`, `_meta` `evidence/output_schema` on `/mcp`) were compiled and
    checked in the one process every agent shares: a sequence of them took the service
    down. The service accepts none (422 at its closed body, nothing appended) and keeps
    answering."""
    url, root = real
    with Plane.open(url) as plane:
        agent = _new_plan(plane, root, "R-1")
        before = plane.store.head().size
    server = Server(url)
    try:
        base, token = server.base, agent.token
        big = list(range(100_000))
        for schema in _HOSTILE_SCHEMAS:
            status, body = _http(
                "POST", base + "/v1/gate/output", {"step": "s", "output": big, "schema": schema},
                token,
            )  # fmt: skip
            assert status == 422 and "schema" in json.dumps(body), (status, body)
            status, body = _http(
                "POST",
                base + "/v1/call",
                {"tool": "echo", "params": {"text": "x"}, "output_schema": schema},
                token,
            )
            assert status == 422 and "output_schema" in json.dumps(body), (status, body)
        status, report = _http(
            "POST", base + "/v1/call", {"tool": "echo", "params": {"text": "hi"}}, token
        )
        assert status == 200 and report["output_gate"]["verdict"] == "pass", report
        assert server.proc.poll() is None
    finally:
        assert server.stop() == 0, server.logged()
    with Plane.open(url) as plane:  # only the last call's three events
        assert plane.store.head().size == before + 3


@pytest.mark.slow
def test_a_gated_call_round_trip_through_a_real_server(real: tuple[str, Path]) -> None:
    url, root = real
    with Plane.open(url) as plane:
        agent = _new_plan(plane, root, "R-1")
    server = Server(url)
    try:
        base = server.base
        status, report = _http(
            "POST", base + "/v1/call", {"tool": "echo", "params": {"text": "hi"}}, agent.token
        )
        assert status == 200 and report["output_gate"]["verdict"] == "pass", report
        status, hook = _http(
            "POST",
            base + "/v1/hooks/pre-tool",
            {"tool_name": "search", "tool_input": {"q": 1}},
            agent.token,
        )
        assert status == 200 and hook["exit"] == 2 and hook["stderr"].startswith("blocked: ")
        assert _get(base + "/v1/plan")[0] == 401
    finally:
        assert server.stop() == 0
    assert run_cli("verify", "--db", url).returncode == 0


def _held_call(server: Server, agent: Agent, results: dict[str, Any]) -> threading.Thread:
    def call() -> None:
        results["answer"] = _http(
            "POST",
            server.base + "/v1/call",
            {"tool": "wait", "params": {}, "step": "held"},
            agent.token,
        )

    thread = threading.Thread(target=call)
    thread.start()
    return thread


def _checked(url: str, plan_id: str, step: str) -> bool:
    with ledger.open(url, create=False) as store:
        return any(
            e.type == "gate.checked" and e.payload.step == step
            for e in store.read_stream(f"plan:{plan_id}")
        )


@pytest.mark.slow
def test_sigterm_drains_a_request_in_flight(real: tuple[str, Path]) -> None:
    url, root = real
    with Plane.open(url) as plane:
        agent = _new_plan(plane, root, "R-1")
        sandbox = plane.sandbox(plane.state("plan:R-1").doc).ensure().copies[str(agent.project)]
    server = Server(url)
    results: dict[str, Any] = {}
    thread = _held_call(server, agent, results)
    try:
        _wait_for(lambda: _checked(url, "R-1", "held"))  # the tool is running now
        server.proc.send_signal(signal.SIGTERM)
        # stopped accepting: a new request gets no answer, the held one goes on
        _wait_for(lambda: _get(server.base + "/healthz")[0] == 0)
        assert server.proc.poll() is None and thread.is_alive()
    finally:
        (sandbox / "go").write_text("")
        thread.join(timeout=60)
    status, report = results["answer"]
    assert status == 200 and report["output_gate"]["verdict"] == "pass", report
    assert server.stop() == 0
    with ledger.open(url, create=False) as store:
        types = [e.type for e in store.read_stream("plan:R-1")]
    assert types[-3:] == ["gate.checked", "tool.called", "gate.checked"]
    assert run_cli("verify", "--db", url).returncode == 0


@pytest.mark.slow
def test_sigkill_mid_request_leaves_a_ledger_verify_and_audit_accept(
    real: tuple[str, Path],
) -> None:
    url, root = real
    with Plane.open(url) as plane:
        agent = _new_plan(plane, root, "R-1")
        sandbox = plane.sandbox(plane.state("plan:R-1").doc).ensure().copies[str(agent.project)]
    server = Server(url)
    results: dict[str, Any] = {}
    thread = _held_call(server, agent, results)
    try:
        _wait_for(lambda: _checked(url, "R-1", "held"))
        assert server.stop(signal.SIGKILL) == -signal.SIGKILL
    finally:
        (sandbox / "go").write_text("")  # the orphaned tool ends too
        thread.join(timeout=60)
    assert results["answer"][0] == 0  # no answer: the connection died
    assert run_cli("verify", "--db", url).returncode == 0
    audited = run_cli("audit", "--db", url)
    assert audited.returncode == 0, audited.stdout + audited.stderr
    # and a new service serves the plan on
    server = Server(url)
    try:
        assert _get(server.base + "/v1/plan", agent.token)[0] == 200
    finally:
        assert server.stop() == 0


@pytest.mark.slow
def test_two_services_on_one_postgresql_serve_their_own_plans(pg_url: str, tmp_path: Path) -> None:
    _setup_ledger(pg_url, tmp_path)
    with Plane.open(pg_url) as plane:
        agents = [_new_plan(plane, tmp_path, f"PG-{i}") for i in (1, 2)]
    servers = [Server(pg_url), Server(pg_url)]
    failures: list[Any] = []

    def work(server: Server, agent: Agent) -> None:
        for i in range(15):
            # one deviation (a retry: the plan stays in Execute), the rest pass
            params = {"query": i} if i == 7 else {"query": "x"}
            status, answer = _http(
                "POST",
                server.base + "/v1/gate/input",
                {"tool": "search", "params": params, "step": f"s{i}"},
                agent.token,
            )
            if status != 200:
                failures.append((status, answer))
        # and the other's plan is refused
        status, _ = _http(
            "GET",
            server.base + "/v1/plan?plan=" + ("PG-2" if agent.plan_id == "PG-1" else "PG-1"),
            None,
            agent.token,
        )
        if status != 403:
            failures.append(("not forbidden", status))

    try:
        threads = [
            threading.Thread(target=work, args=(s, a)) for s, a in zip(servers, agents, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        codes = [s.stop() for s in servers]
    assert failures == [] and codes == [0, 0]
    with ledger.open(pg_url, create=False) as store:
        events = list(store.read_all())
        assert [e.position for e in events] == list(range(1, len(events) + 1))  # dense
        for agent in agents:
            checks = [
                e for e in store.read_stream(f"plan:{agent.plan_id}") if e.type == "gate.checked"
            ]
            assert len(checks) == 15
    assert run_cli("verify", "--db", pg_url).returncode == 0
    audited = run_cli("audit", "--db", pg_url)
    assert audited.returncode == 0, audited.stdout + audited.stderr


def _children(pid: int) -> list[int]:
    return [
        int(c) for t in Path(f"/proc/{pid}/task").glob("*/children") for c in t.read_text().split()
    ]


@pytest.mark.slow
def test_workers_share_the_port_and_stop_together(pg_url: str, tmp_path: Path) -> None:
    """`--workers 2`: two service processes answer on the one port, and a scrape of
    either counts both; SIGTERM to the supervisor drains both (exit 0); one dying on its
    own stops the other too (exit 2)."""
    _setup_ledger(pg_url, tmp_path)
    with Plane.open(pg_url) as plane:
        agents = [_new_plan(plane, tmp_path, f"W-{i}") for i in (1, 2, 3)]
    server = Server(pg_url, None, "--workers", "2")
    try:
        workers = _children(server.proc.pid)
        assert len(workers) == 2
        answers = [
            _http(
                "POST",
                server.base + "/v1/gate/input",
                {"tool": "search", "params": {"query": "x"}, "step": f"s{i}"},
                agent.token,
            )[0]
            for i in range(10)
            for agent in agents
        ]
        assert answers == [200] * 30
        assert all(Path(f"/proc/{w}").exists() for w in workers)
        # One view of the fleet: whichever process a scrape reaches counts all 30.
        checks = 'evidence_http_requests_total{method="POST",route="/v1/gate/input",status="200"}'
        _wait_for(lambda: _metric(server.base, checks) == 30, timeout=30)
        assert [_metric(server.base, checks) for _ in range(8)] == [30] * 8
        assert _metric(server.base, "evidence_in_flight_limit") == 2 * DEFAULT_MAX_IN_FLIGHT
    finally:
        assert server.stop() == 0
    assert not any(Path(f"/proc/{w}").exists() for w in workers)
    with ledger.open(pg_url, create=False) as store:
        for agent in agents:
            checks = [
                e for e in store.read_stream(f"plan:{agent.plan_id}") if e.type == "gate.checked"
            ]
            assert len(checks) == 10
    assert run_cli("verify", "--db", pg_url).returncode == 0
    # A worker killed: the supervisor stops the other and fails, for its supervisor to restart.
    server = Server(pg_url, None, "--workers", "2")
    first, second = _children(server.proc.pid)
    os.kill(first, signal.SIGKILL)
    assert server.proc.wait(timeout=60) == 2
    assert not Path(f"/proc/{second}").exists() or _wait_gone(second)
    assert "a service process ended with exit 1" in server.logged()
    server.stop()


def _wait_gone(pid: int) -> bool:
    _wait_for(lambda: not Path(f"/proc/{pid}").exists())
    return True


# -- the threat model ----------------------------------------------------------------------

AGENT_SIDE = r"""
import json, sys, urllib.request, urllib.error
base, token, other, key, db = sys.argv[1:6]

def call(method, path, token, body=None):
    request = urllib.request.Request(base + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code

def readable(path):
    try:
        open(path, "rb").close()
        return True
    except PermissionError:
        return False

print(json.dumps({
    "status": call("GET", "/v1/plan", token),
    "gate": call("POST", "/v1/gate/input", token, {"tool": "search", "params": {"query": "a"}}),
    "random": call("GET", "/v1/plan", "evd_" + "0" * 26 + "_" + "A" * 43),
    "other_plan": call("GET", "/v1/plan?plan=T-1", other),
    "key": readable(key),
    "db": readable(db),
}))
"""


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the threat model test runs the service as root")
@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="needs a Python nobody can run")
def test_the_agent_as_nobody_reaches_its_plan_but_not_the_key_or_the_database() -> None:
    """The service as root with the plane and operator keys in a directory only root
    reads (0700), the database in another; an agent process running as `nobody` calls
    the API with its credential, and cannot read the key or the database; a random
    token is 401, a credential for another plan naming this one 403."""
    top = Path(tempfile.mkdtemp(prefix="evidence-threat-", dir="/tmp"))
    try:
        top.chmod(0o755)  # anyone may pass through: the 0700 directories are the wall
        keys, data = top / "keys", top / "data"
        for d in (keys, data):
            d.mkdir(mode=0o700)
        env = {
            "EVIDENCE_PLANE_KEY": str(keys / "plane.key"),
            "EVIDENCE_OPERATOR_KEY": str(keys / "operator.key"),
            "EVIDENCE_STATE_DIR": str(data / "state"),
        }
        url = f"sqlite:///{data / 'evidence.db'}"
        with pytest.MonkeyPatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            _setup_ledger(url, data)
            with Plane.open(url) as plane:
                mine = _new_plan(plane, data, "T-1")
                theirs = _new_plan(plane, data, "T-2")
        assert (keys / "plane.key").exists() and (keys / "operator.key").exists()
        server = Server(url, env)
        try:
            agent = subprocess.run(
                [
                    "/usr/bin/python3",
                    "-I",
                    "-c",
                    AGENT_SIDE,
                    server.base,
                    mine.token,
                    theirs.token,
                    str(keys / "plane.key"),
                    str(data / "evidence.db"),
                ],
                user="nobody",
                group="nogroup",
                extra_groups=[],
                env={"PATH": "/usr/bin:/bin"},
                cwd="/",
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert agent.returncode == 0, agent.stderr
            seen = json.loads(agent.stdout)
            assert seen == {
                "status": 200,
                "gate": 200,
                "random": 401,
                "other_plan": 403,
                "key": False,
                "db": False,
            }
        finally:
            assert server.stop() == 0
        with ledger.open(url, create=False) as store:
            checks = [e for e in store.read_stream("plan:T-1") if e.type == "gate.checked"]
        assert len(checks) == 1 and checks[0].actor == "agent"
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_the_service_imports_no_click() -> None:
    """The service sits below the CLI: importing it loads no click (lint-imports keeps
    the layers; this checks the running import graph too)."""
    code = "import sys, commands.service; print('click' in sys.modules)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "False"


def test_serve_is_listed_with_the_agents_door() -> None:
    listed = run_cli("--help").stdout
    door = listed[listed.index("The agent's door:") :].split("\n\n")[0]
    assert re.search(r"^  serve +Serve the plane over HTTP", door, re.M), door


def test_the_dockerfile_builds_the_wheel_from_everything_it_holds() -> None:
    """The top-level Dockerfile (docs/service.md) copies every source the wheel is built
    from — the packages' roots, the data packages, pyproject.toml, README.md — and runs
    `evidence serve` as an unprivileged user."""
    import tomllib

    root = REPO
    text = (root / "Dockerfile").read_text()
    sources: set[str] = set()
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not words[1].startswith("--"):
            sources.update(words[1:-1])
    setup = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    needed = {p.split(".")[0] for p in setup["packages"]}  # ledger, projections, commands
    needed |= set(setup["package-dir"].values()) | {"pyproject.toml", "README.md"}
    assert needed <= sources, needed - sources
    assert "pip wheel" in text and "--no-deps" in text
    assert re.search(r"^USER evidence$", text, re.M)
    assert '"evidence", "serve"' in text


def test_readiness_follows_the_database(pg_url: str, tmp_path: Path) -> None:
    """/readyz is 503 while the ledger cannot be read (its head table gone from under
    the service) and 200 again once it can; /healthz answers throughout."""
    import sqlalchemy as sa

    _setup_ledger(pg_url, tmp_path)
    engine = sa.create_engine(pg_url)
    try:
        with TestClient(create_app(pg_url)) as client:
            assert client.get("/readyz").status_code == 200
            with engine.begin() as conn:
                conn.exec_driver_sql("ALTER TABLE ledger_head RENAME TO ledger_head_away")
            try:
                answer = client.get("/readyz")
                assert answer.status_code == 503, answer.text
                assert answer.json()["error"].startswith("the database does not answer")
                assert client.get("/healthz").status_code == 200
                metrics = client.get("/metrics").text  # the gauge left out, the rest there
                assert not re.search(r"^evidence_ledger_head_size ", metrics, re.M)
                assert re.search(r"^evidence_in_flight 0$", metrics, re.M)
            finally:
                with engine.begin() as conn:
                    conn.exec_driver_sql("ALTER TABLE ledger_head_away RENAME TO ledger_head")
            assert client.get("/readyz").status_code == 200
    finally:
        engine.dispose()
