"""The interop matrix (issue 32, item 6): MCP servers no one here wrote, behind
`evidence mcp proxy` (a real process, its upstream confined by Landlock in the plan's
sandbox), each driven by three MCP clients no one here wrote either.

Servers: ``mcp-server-time`` and ``mcp-server-git`` (PyPI, the ``test`` extra),
``@modelcontextprotocol/server-everything`` and ``@modelcontextprotocol/server-filesystem``
(npm, pinned in tests/interop/package.json). Clients: the official Python SDK (``mcp``),
fastmcp's client, and the TypeScript SDK's (tests/interop/ts_client.mjs, run by node).

And the TypeScript SDK's streamable-HTTP client against `evidence serve`'s MCP gate (a
real service, an agent's bearer credential, a server the plane launches itself).

For each (server, client) pair, one proxy session (its own ledger and plan) makes a
valid call, an invalid one (a wrong type and an extra member) and, for the time server,
a call the upstream itself answers with an error; every test of the pair then reads
what that session saw and left in the ledger:

- every tool the server declares is offered with its schemas, beside the plane's verbs;
- the valid call passes and is recorded (``tool.called``, passing ``gate.checked``);
- the invalid call is a tool error (``isError``) whose text names every deviation's
  pointer, and is never forwarded;
- ``evidence verify`` and ``evidence audit`` exit 0 afterwards.

And one test per case of the issue's "Why" that is about interop: (a) the draft-07
servers offer every tool; (b) a refusal of a tool with an output schema reaches the
TypeScript client as a tool error, not as the SDK's -32602; (c) the upstream's own error
result reaches the agent as the upstream's text, and is not counted as the agent's
deviation.

The Node packages are installed by ``npm ci --prefix tests/interop`` (.ci/run does it);
without them the pairs that need node skip with the reason, and fail under ``CI=true``,
as the PostgreSQL tests do. Nothing is downloaded at test time (no npx).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

import ledger
from commands.plane import Plane
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from tests.conftest import IN_CI
from tests.helpers import REPO, run_cli

pytestmark = pytest.mark.slow  # real processes: the proxy, its upstream, node

ROOT = REPO
INTEROP = ROOT / "tests" / "interop"
NODE_MODULES = INTEROP / "node_modules"
TS_CLIENT = INTEROP / "ts_client.mjs"
PLAN = "P-1"
VERBS = {
    "evidence.plan_status", "evidence.record_strategy", "evidence.execute",
    "evidence.validate", "evidence.record_fix", "evidence.apply",
}  # fmt: skip
STEP = "evidence/step"  # the request _meta key naming a call's step (docs/agents.md)
LIMIT_S = 90  # one whole session, generous on a loaded two-core machine


# -- the matrix ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    step: str  # named in the request's _meta: the ledger's events for it are found by it
    tool: str
    arguments: dict[str, Any]
    said: str = ""  # a fragment of the result's text (the valid calls: what they answer)
    pointers: tuple[str, ...] = ()  # the invalid calls: the deviations' pointers


@dataclass(frozen=True)
class Server:
    name: str  # also the proxy's --server
    upstream: tuple[str, ...]  # {sandbox} is the proxy's; {node_modules} is ours
    valid: tuple[Call, ...]
    invalid: Call
    others: tuple[Call, ...] = ()
    package: str = ""  # what it needs: a Python module, or (node) an npm package's folder
    node: bool = False


NODE_PACKAGES = "{node_modules}/@modelcontextprotocol"
SERVERS = {
    server.name: server
    for server in (
        Server(
            "time",
            (sys.executable, "-m", "mcp_server_time"),
            valid=(Call("ok", "get_current_time", {"timezone": "Europe/Paris"}, "Europe/Paris"),),
            invalid=Call(
                "bad",
                "get_current_time",
                {"timezone": 5, "extra": 1},
                pointers=("/timezone", "/extra"),
            ),
            # (c): the upstream answers isError itself ("Invalid timezone: ...")
            others=(Call("upstream-error", "get_current_time", {"timezone": "Not/AZone"}),),
            package="mcp_server_time",
        ),
        Server(
            "git",
            (sys.executable, "-m", "mcp_server_git", "--repository", "{sandbox}"),
            # "." is the upstream's working directory: the plan's sandbox copy of the repo
            valid=(Call("ok", "git_status", {"repo_path": "."}, "notes.txt"),),
            invalid=Call(
                "bad", "git_status", {"repo_path": 5, "extra": 1}, pointers=("/repo_path", "/extra")
            ),
            package="mcp_server_git",
        ),
        Server(
            "everything",
            ("node", f"{NODE_PACKAGES}/server-everything/dist/index.js"),
            valid=(Call("ok", "echo", {"message": "hello, proxy"}, "hello, proxy"),),
            invalid=Call(
                "bad", "echo", {"message": 5, "extra": 1}, pointers=("/message", "/extra")
            ),
            package="server-everything",
            node=True,
        ),
        Server(
            "filesystem",
            ("node", f"{NODE_PACKAGES}/server-filesystem/dist/index.js", "{sandbox}"),
            valid=(
                Call("ok", "list_directory", {"path": "."}, "notes.txt"),
                Call("ok-read", "read_text_file", {"path": "notes.txt"}, "hello from the project"),
            ),
            invalid=Call(
                "bad", "list_directory", {"path": 5, "extra": 1}, pointers=("/path", "/extra")
            ),
            package="server-filesystem",
            node=True,
        ),
    )
}
CLIENTS = ("python", "fastmcp", "typescript")
PAIRS = [pytest.param(s, c, id=f"{s}-{c}") for s in SERVERS for c in CLIENTS]


def _calls(server: Server) -> list[Call]:
    return [*server.valid, server.invalid, *server.others]


# -- what the clients need: skipped without them, failed under CI=true ------------------------


def _missing(what: str, install: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true but {what} is missing: the interop matrix cannot skip ({install})")
    pytest.skip(f"the interop matrix needs {what} ({install})")


def _require(server: Server, client: str) -> None:
    """What the pair needs is installed: skip without it, fail under CI=true."""
    modules = [] if server.node else [server.package]
    if client == "fastmcp":
        modules.append("fastmcp")
    for module in modules:
        if importlib.util.find_spec(module) is None:
            _missing(f"the Python package {module!r}", "pip install -e '.[test]'")
    packages = [server.package] if server.node else []
    if client == "typescript":
        packages.append("sdk")
    if packages and shutil.which("node") is None:
        _missing("node", "node 20 or later on PATH")
    for package in packages:
        if not (NODE_MODULES / "@modelcontextprotocol" / package / "package.json").is_file():
            _missing(
                f"the npm package @modelcontextprotocol/{package} in {NODE_MODULES}",
                "npm ci --prefix tests/interop",
            )


# -- one session per pair ----------------------------------------------------------------------


@dataclass
class Session:
    """What one client saw through the proxy, and what the ledger holds afterwards."""

    server: Server
    client: str
    url: str
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> schemas
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # step -> result
    events: list[ledger.RecordedEvent] = field(default_factory=list)
    verify: subprocess.CompletedProcess[str] | None = None
    audit: subprocess.CompletedProcess[str] | None = None
    registered: dict[str, list[str]] = field(default_factory=dict)  # tool -> registry names
    stderr: str = ""  # the proxy's (and the TypeScript client's)

    def step(self, step: str) -> list[ledger.RecordedEvent]:
        """The plan's events for one call: from its step's first event (the input gate's
        check) to the next call's. The calls are made one after the other."""
        found: list[ledger.RecordedEvent] = []
        current: str | None = None
        for event in self.events:
            current = getattr(event.payload, "step", None) or current
            if current == step:
                found.append(event)
        return found

    def why(self) -> str:
        return f"\n--- the proxy's stderr ---\n{self.stderr[-4000:]}"


def _result(*, is_error: bool, content: list[Any], structured: Any) -> dict[str, Any]:
    text = "\n".join(
        str(block.get("text", "")) if isinstance(block, dict) else str(getattr(block, "text", ""))
        for block in content
    )
    return {"is_error": bool(is_error), "text": text, "structured": structured}


def _exception(exc: BaseException) -> dict[str, Any]:
    code = getattr(getattr(exc, "error", None), "code", None) or getattr(exc, "code", None)
    return {"error": {"name": type(exc).__name__, "code": code, "message": str(exc)}}


def _schemas(tool: Any) -> dict[str, Any]:
    return {"input": tool.input_schema, "output": tool.output_schema}


def _proxy_argv(server: Server, url: str, workdir: Path) -> list[str]:
    upstream = [arg.replace("{node_modules}", str(NODE_MODULES)) for arg in server.upstream]
    return [
        sys.executable, "-m", "commands.cli", "mcp", "proxy", "--plan", PLAN, "--db", url,
        "--workdir", str(workdir), "--server", server.name, "--timeout", "30", "--", *upstream,
    ]  # fmt: skip


async def _python_client(argv: list[str], env: dict[str, str], calls: list[Call], log: Path):
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.shared.exceptions import MCPError

    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=ROOT)
    tools: dict[str, dict[str, Any]] = {}
    results: dict[str, dict[str, Any]] = {}
    with log.open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as agent,
        ):
            await agent.initialize()
            tools = {t.name: _schemas(t) for t in (await agent.list_tools()).tools}
            for call in calls:
                try:
                    got = await agent.call_tool(call.tool, call.arguments, meta={STEP: call.step})
                    results[call.step] = _result(
                        is_error=got.is_error,
                        content=got.content,
                        structured=got.structured_content,
                    )
                except MCPError as exc:
                    results[call.step] = _exception(exc)
    return tools, results


async def _fastmcp_client(argv: list[str], env: dict[str, str], calls: list[Call], log: Path):
    from fastmcp import Client
    from fastmcp.client.transports import StdioTransport

    transport = StdioTransport(
        command=argv[0], args=argv[1:], env=env, cwd=str(ROOT), keep_alive=False, log_file=log
    )
    tools: dict[str, dict[str, Any]] = {}
    results: dict[str, dict[str, Any]] = {}
    async with Client(transport) as agent:
        tools = {t.name: _schemas(t) for t in await agent.list_tools()}
        for call in calls:
            try:
                got = await agent.call_tool(
                    call.tool, call.arguments, meta={STEP: call.step}, raise_on_error=False
                )
                results[call.step] = _result(
                    is_error=got.is_error, content=got.content, structured=got.structured_content
                )
            except Exception as exc:  # an exception is what the agent would get instead
                results[call.step] = _exception(exc)
    return tools, results


def _typescript_client(argv: list[str], env: dict[str, str], calls: list[Call]):
    job = {
        "calls": [{"name": c.tool, "arguments": c.arguments, "meta": {STEP: c.step}} for c in calls]
    }
    done = subprocess.run(
        ["node", str(TS_CLIENT), json.dumps(job), "--", *argv],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    try:
        out = json.loads(done.stdout)
    except ValueError:
        out = {"fatal": {"message": f"exit {done.returncode}, stdout {done.stdout[-2000:]!r}"}}
    if "fatal" in out:
        raise AssertionError(f"the TypeScript client failed: {out['fatal']}\n{done.stderr}")
    tools = {
        t["name"]: {"input": t["inputSchema"], "output": t["outputSchema"]} for t in out["tools"]
    }
    results: dict[str, dict[str, Any]] = {}
    for call, answer in zip(calls, out["calls"], strict=True):
        if "error" in answer:
            results[call.step] = {"error": answer["error"]}
        else:
            got = answer["result"]
            results[call.step] = _result(
                is_error=got.get("isError", False),
                content=got.get("content", []),
                structured=got.get("structuredContent"),
            )
    return tools, results, done.stderr


@contextlib.contextmanager
def _environment(base: Path) -> Iterator[dict[str, str]]:
    """This process's ledger key and state directory under ``base`` while a session is
    set up and read, and the proxy's environment.

    The upstream runs confined: it reads the Node packages only if the operator adds
    them (EVIDENCE_CONFINE_READ, as docs/agents.md says for a server's directory outside
    PATH). It gets the proxy's HOME: git reads ``$HOME/.gitconfig``, and under Landlock
    a real home is unreadable, which git takes as fatal ("unknown error occurred while
    reading the configuration files"). So the proxy runs with an empty home of its own
    that the confinement may read."""
    home = base / "home"
    home.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EVIDENCE_PLANE_KEY", str(base / "plane.key"))
        patch.setenv("EVIDENCE_STATE_DIR", str(base / "state"))
        env = {k: v for k, v in os.environ.items() if k != "EVIDENCE_DB"}
        env.update(
            PYTHONPATH=str(ROOT),
            HOME=str(home),
            EVIDENCE_CONFINE_READ=os.pathsep.join([str(NODE_MODULES), str(home)]),
        )
        yield env


def _plan(url: str, base: Path) -> None:
    """Plan P-1 in Execute on a project that is a git repository holding notes.txt: the
    proxy's upstream works in its sandbox copy."""
    project = base / "project"
    project.mkdir()
    (project / "notes.txt").write_text("hello from the project\n")
    subprocess.run(["git", "init", "-q", str(project)], check=True, timeout=60)
    with Plane.open(url) as plane:
        create_plan(
            plane, PLAN, project="interop", resources=[str(project)], config={"max_iterations": 10}
        )
        record_strategy(plane, PLAN, "call the MCP server through the proxy")
        enter_execute(plane, PLAN)


def _run(server: Server, client: str, base: Path) -> Session:
    url = f"sqlite:///{base / 'evidence.db'}"
    session = Session(server, client, url)
    calls = _calls(server)
    log = base / "proxy-stderr.txt"
    with _environment(base) as env:
        _plan(url, base)
        argv = _proxy_argv(server, url, base / "work")
        try:
            if client == "typescript":
                session.tools, session.results, session.stderr = _typescript_client(
                    argv, env, calls
                )
            else:
                drive = _python_client if client == "python" else _fastmcp_client

                async def main() -> None:
                    with anyio.fail_after(LIMIT_S):
                        session.tools, session.results = await drive(argv, env, calls, log)

                anyio.run(main)
        finally:
            if log.exists():
                session.stderr += log.read_text(errors="replace")
        with ledger.open(url, create=False) as store:
            session.events = list(store.read_stream(f"plan:{PLAN}"))
        with Plane.open(url) as plane:
            session.registered = {
                tool: plane.log().mcp_tools(server.name, tool) for tool in session.tools
            }
        session.verify = run_cli("verify", "--db", url)
        session.audit = run_cli("audit", "--db", url)
    return session


_SESSIONS: dict[tuple[str, str], Session | BaseException] = {}


@pytest.fixture
def session(server: str, client: str, tmp_path_factory: pytest.TempPathFactory) -> Session:
    """The pair's one session, run by the first test that needs it; every test of the
    pair reads the same (a failed session fails each of them with its error)."""
    spec = SERVERS[server]
    _require(spec, client)
    key = (server, client)
    if key not in _SESSIONS:
        try:
            _SESSIONS[key] = _run(spec, client, tmp_path_factory.mktemp(f"{server}-{client}"))
        except Exception as exc:
            _SESSIONS[key] = exc
    found = _SESSIONS[key]
    if isinstance(found, BaseException):
        raise AssertionError(f"the {server}-{client} session failed: {found!r}") from found
    return found


# -- what each server declares, asked directly (no proxy, no confinement) ------------------------


_DECLARED: dict[str, dict[str, dict[str, Any]]] = {}


async def _never(*args: Any) -> Any:
    raise AssertionError("listing tools asks the client for nothing")


def _declared(server: Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if server.name not in _DECLARED:
        from mcp import ClientSession, StdioServerParameters, stdio_client

        where = tmp_path_factory.mktemp(f"declared-{server.name}")
        subprocess.run(["git", "init", "-q", str(where)], check=True, timeout=60)
        argv = [
            arg.replace("{node_modules}", str(NODE_MODULES)).replace("{sandbox}", str(where))
            for arg in server.upstream
        ]
        params = StdioServerParameters(command=argv[0], args=argv[1:], cwd=where)

        async def main() -> dict[str, Any]:
            with anyio.fail_after(LIMIT_S), open(os.devnull, "w") as quiet:
                async with (
                    stdio_client(params, errlog=quiet) as (read, write),
                    # Offering sampling and elicitation, as the proxy's own client does (it
                    # relays them to the agent): server-everything lists more tools then.
                    ClientSession(
                        read, write, sampling_callback=_never, elicitation_callback=_never
                    ) as upstream,
                ):
                    await upstream.initialize()
                    listed = (await upstream.list_tools()).tools
                    return {t.name: _schemas(t) for t in listed}

        _DECLARED[server.name] = anyio.run(main)
    return _DECLARED[server.name]


# -- the matrix's assertions ------------------------------------------------------------------


def _types(events: list[ledger.RecordedEvent]) -> list[str]:
    return [e.type for e in events]


def _checks(events: list[ledger.RecordedEvent]) -> list[tuple[str, str]]:
    return [(e.payload.gate, e.payload.verdict) for e in events if e.type == "gate.checked"]


@pytest.mark.parametrize(("server", "client"), PAIRS)
def test_every_upstream_tool_is_offered_with_its_schemas(
    session: Session, tmp_path_factory: pytest.TempPathFactory
) -> None:
    declared = _declared(session.server, tmp_path_factory)
    offered = session.tools
    missing = sorted(set(declared) - set(offered))
    assert not missing, f"not offered: {missing}{session.why()}"
    assert set(offered) == set(declared) | VERBS
    for name, schemas in declared.items():
        assert offered[name] == schemas, name


@pytest.mark.parametrize(("server", "client"), PAIRS)
def test_a_valid_call_passes_and_is_recorded(session: Session) -> None:
    for call in session.server.valid:
        result = session.results[call.step]
        assert "error" not in result, f"{call.tool}: {result}{session.why()}"
        assert not result["is_error"], f"{call.tool}: {result['text']}{session.why()}"
        assert call.said in result["text"], result["text"]
        events = session.step(call.step)
        called = [e.payload for e in events if e.type == "tool.called"]
        assert [(c.tool, c.executor) for c in called] == [
            (f"{session.server.name}.{call.tool}", "recorded")
        ], _types(events)
        assert _checks(events) == [("input", "pass"), ("output", "pass")], _types(events)
        assert "plan.attempt_failed" not in _types(events)


@pytest.mark.parametrize(("server", "client"), PAIRS)
def test_an_invalid_call_is_refused_and_the_client_shows_its_deviations(
    session: Session,
) -> None:
    call = session.server.invalid
    result = session.results[call.step]
    # A tool error the agent reads, never an exception of the client (the TypeScript
    # SDK's -32602 when it checks a refusal against the tool's output schema).
    assert "error" not in result, f"{result['error']}{session.why()}"
    assert result["is_error"], result
    for pointer in call.pointers:
        assert pointer in result["text"], (pointer, result["text"])
    events = session.step(call.step)
    assert "tool.called" not in _types(events)  # never forwarded
    checks = [e.payload for e in events if e.type == "gate.checked"]
    assert [(c.gate, c.verdict) for c in checks] == [("input", "fail")], _types(events)
    assert sorted(d.pointer for d in checks[0].deviations) == sorted(call.pointers)


@pytest.mark.parametrize(("server", "client"), PAIRS)
def test_the_ledger_verifies_and_audits_afterwards(session: Session) -> None:
    assert session.verify is not None and session.audit is not None
    assert session.verify.returncode == 0, session.verify.stdout + session.verify.stderr
    assert session.audit.returncode == 0, session.audit.stdout + session.audit.stderr
    # the session did reach the ledger: every call made an input gate check
    steps = {e.payload.step for e in session.events if e.type == "gate.checked"}
    assert {c.step for c in _calls(session.server)} <= steps, sorted(steps)


# -- the issue's "Why", case by case ------------------------------------------------------------


@pytest.mark.parametrize(("server", "client"), [("everything", "python"), ("filesystem", "python")])
def test_a_draft_07_server_offers_all_its_tools(
    session: Session, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """(a) server-everything and server-filesystem declare their schemas as JSON Schema
    draft-07 (``$schema``): each of their tools is registered (gated) and offered."""
    declared = _declared(session.server, tmp_path_factory)
    drafts = {s["input"].get("$schema") for s in declared.values()}
    assert drafts == {"http://json-schema.org/draft-07/schema#"}  # what the case is about
    unregistered = sorted(name for name in declared if not session.registered.get(name))
    assert not unregistered, f"not registered: {unregistered}{session.why()}"
    assert set(declared) <= set(session.tools), session.why()


@pytest.mark.parametrize(("server", "client"), [("time", "typescript")])
def test_a_refusal_of_a_tool_with_an_output_schema_is_a_tool_error_for_typescript(
    session: Session, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """(b) get_current_time declares an output schema, which the TypeScript SDK checks a
    result's ``structuredContent`` against: a refusal must reach it as a tool error with
    the deviations, not as McpError -32602 (the refusal's report failing that check)."""
    assert _declared(session.server, tmp_path_factory)["get_current_time"]["output"]
    result = session.results["bad"]
    if "error" in result:
        pytest.fail(f"the TypeScript client threw instead: {result['error']}")
    assert result["is_error"]
    assert "/timezone" in result["text"] and "/extra" in result["text"], result["text"]


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("server", ["time"])
def test_the_upstreams_own_error_reaches_the_agent_and_spends_an_iteration(
    session: Session,
) -> None:
    """(c) mcp-server-time answers an unknown timezone with its own tool error
    (``isError``, "Invalid timezone"): the agent reads the upstream's text and how it was
    routed; the ledger counts no deviation for it (every gate check passes) but a failed
    iteration of the attempt (an error is a failure: never an endless try)."""
    result = session.results["upstream-error"]
    assert "error" not in result, f"{result['error']}{session.why()}"
    assert result["is_error"], result
    assert "Invalid timezone" in result["text"] and "Not/AZone" in result["text"], result["text"]
    assert "routed: retry in the next iteration" in result["text"], result["text"]
    events = session.step("upstream-error")
    checks = _checks(events)
    assert checks[:1] == [("input", "pass")], _types(events)  # it was forwarded
    assert all(verdict == "pass" for _, verdict in checks), _types(events)
    failed = [e.payload for e in events if e.type == "plan.attempt_failed"]
    assert len(failed) == 1 and "an error of its own (isError)" in failed[0].reason


# -- the TypeScript SDK through `evidence serve` ------------------------------------------


def test_the_typescript_sdk_through_the_services_mcp_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The TypeScript SDK's own streamable-HTTP client, with an agent's bearer
    credential, against a real `evidence serve`: it is offered the operator's registered
    MCP tools beside the plane's verbs; a valid call returns the tool's structured result
    (which the SDK checks against the declared output schema); a deviating input is a
    tool error carrying the deviations — never an exception of the SDK's own (-32602);
    an off-schema output is a tool error too; and the ledger verifies and audits."""
    if shutil.which("node") is None:
        _missing("node", "node 20 or later on PATH")
    if not (NODE_MODULES / "@modelcontextprotocol" / "sdk" / "package.json").is_file():
        _missing(f"the npm package @modelcontextprotocol/sdk in {NODE_MODULES}", "npm ci")
    from commands.plane.credentials import issue_credential
    from tests.commands.service.test_service import Server
    from tests.helpers import register_mcp_server

    url = f"sqlite:///{tmp_path / 'evidence.db'}"
    (tmp_path / "upstream").mkdir()
    server_log = tmp_path / "upstream" / "calls.jsonl"
    env = {"EVIDENCE_CONFINE_WRITE": str(tmp_path / "upstream")}
    monkeypatch.setenv("EVIDENCE_CONFINE_WRITE", env["EVIDENCE_CONFINE_WRITE"])
    with Plane.open(url) as plane:
        create_plan(plane, "TS-1", project="api", resources=["repo:api"])
        record_strategy(plane, "TS-1", "call through the service")
        enter_execute(plane, "TS-1")
    upstream = [sys.executable, str(ROOT / "tests" / "mcp_server.py"), str(server_log)]
    assert "test-upstream.add" in register_mcp_server(url, "test-upstream", upstream)
    with Plane.open(url) as plane:
        token = issue_credential(plane, "TS-1", ttl=timedelta(hours=1)).token
    service = Server(url, env)
    try:
        job = {
            "calls": [
                {"name": "test-upstream.add", "arguments": {"a": 2, "b": 3}},
                {"name": "test-upstream.add", "arguments": {"a": "two", "b": 3}},
                {"name": "test-upstream.bad", "arguments": {}},
            ]
        }
        done = subprocess.run(
            ["node", str(TS_CLIENT), json.dumps(job), "--url", service.base + "/mcp"],
            env={**os.environ, "EVIDENCE_TOKEN": token},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=LIMIT_S,
        )
    finally:
        assert service.stop() == 0
    out = json.loads(done.stdout)
    assert "fatal" not in out, (out, done.stderr)
    offered = {t["name"] for t in out["tools"]}
    assert {"test-upstream.add", "test-upstream.bad", "evidence.plan_status"} <= offered
    ok, refused, rejected = (c.get("result") or c for c in out["calls"])
    assert ok.get("structuredContent") == {"sum": 5} and not ok.get("isError"), ok
    assert "error" not in refused, refused  # a tool error, not the SDK's exception
    assert refused["isError"] and "structuredContent" not in refused
    assert refused["_meta"]["evidence/refusal"]["deviations"][0]["pointer"] == "/a"
    assert "error" not in rejected and rejected["isError"], rejected
    assert rejected["_meta"]["evidence/refusal"]["gate"] == "output"
    assert len(server_log.read_text().splitlines()) == 2  # the refused input never reached it
    assert run_cli("verify", "--db", url).returncode == 0
    audited = run_cli("audit", "--db", url)
    assert audited.returncode == 0, audited.stdout + audited.stderr
