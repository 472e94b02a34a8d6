"""One registered MCP server through the service (`POST /mcp/{server}`, docs/service.md
"One server's door"), driven by the official SDK's streamable-HTTP client with the
bearer credential, in process (the app under its lifespan through httpx2's ASGI
transport), against the conformance fixture server (tests/conformance/fixture_server.py)
which the plane launches on stdio in the plan's sandbox.

What the door offers is the server's own tools under the server's names, gated and
recorded under their registered names; what the server says during a call (log and
progress messages) reaches the client on the call's SSE stream and is kept with the
call; resources, prompts, completions and the log level are forwarded, and every read
is recorded before the agent gets it. The attacks: an invented name, a read in a plan
whose skills name none of the server's tools, a read before Execute, a name of the
agent's choosing too long to record, a server's name that is none.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

import ledger
from commands.plane import Plane
from commands.plane.credentials import issue_credential
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import define_skill, register_tool
from commands.service import create_app
from ledger.events import Exchange, McpFetched, McpInputGiven, McpInputRequired, ToolCalled
from tests.helpers import TESTS, forge, register_mcp_server, run_cli

FIXTURE = TESTS / "conformance" / "fixture_server.py"
BASE = "http://plane.test"
DOOR = f"{BASE}/mcp/fx"
T = TypeVar("T")


@pytest.fixture
def url(sqlite_url: str) -> str:
    """A ledger with the fixture's tools registered as server `fx`, from its own list
    (the operator's registrations are signed with this test's plane key)."""
    register_mcp_server(sqlite_url, "fx", [sys.executable, str(FIXTURE), "--stdio"])
    return sqlite_url


def _initialize(capabilities: dict[str, Any]) -> dict[str, Any]:
    """A raw ``initialize`` request (2025-11-25) of a client offering ``capabilities``."""
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": capabilities,
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }


def _plan(url: str, plan_id: str = "P-1", *, execute: bool = True, skills: Any = ()) -> str:
    """A plan (in Execute unless not ``execute``) and its agent's credential."""
    with Plane.open(url) as plane:
        create_plan(plane, plan_id, project="door", resources=[f"repo:{plan_id}"], skills=skills)
        record_strategy(plane, plan_id, "use the fixture's tools")
        if execute:
            enter_execute(plane, plan_id)
        return issue_credential(plane, plan_id, ttl=timedelta(hours=1)).token


def _events(url: str, plan_id: str = "P-1") -> list[ledger.RecordedEvent]:
    with ledger.open(url, create=False) as store:
        return list(store.read_stream(f"plan:{plan_id}"))


def _head(url: str) -> int:
    with ledger.open(url, create=False) as store:
        return store.head().size


@contextlib.asynccontextmanager
async def _session(
    http: httpx2.AsyncClient, door: str = DOOR, **callbacks: Any
) -> AsyncIterator[ClientSession]:
    async with (
        streamable_http_client(door, http_client=http) as (read, write),
        ClientSession(read, write, **callbacks) as session,
    ):
        await session.initialize()
        yield session


def _as_agent(url: str, token: str, work: Callable[[httpx2.AsyncClient], Awaitable[T]]) -> T:
    app = create_app(url)

    async def main() -> T:
        async with app.router.lifespan_context(app):
            headers = {"Authorization": f"Bearer {token}"}
            transport = httpx2.ASGITransport(app=app)
            async with httpx2.AsyncClient(
                transport=transport, base_url=BASE, headers=headers, timeout=60
            ) as http:
                with anyio.fail_after(120):
                    return await work(http)

    return anyio.run(main)


def test_the_servers_tools_under_its_names_gated_and_recorded(url: str) -> None:
    token = _plan(url)

    async def work(http: httpx2.AsyncClient) -> tuple[list[types.Tool], Any, Any]:
        async with _session(http) as session:
            tools = (await session.list_tools()).tools
            ok = await session.call_tool("test_simple_text", {})
            invented = await session.call_tool("test_no_such_tool", {})
            return tools, ok, invented

    tools, ok, invented = _as_agent(url, token, work)
    names = {tool.name for tool in tools}
    assert {"test_simple_text", "test_tool_with_logging", "evidence.validate"} <= names
    assert not any(name.startswith("fx.") for name in names)  # the server's names
    assert all(tool.description for tool in tools)
    assert not ok.is_error and ok.content[0].text.startswith("This is a simple text")
    assert invented.is_error and "invented_tool" in invented.content[0].text
    calls = [e.payload for e in _events(url) if isinstance(e.payload, ToolCalled)]
    assert [call.tool for call in calls] == ["fx.test_simple_text"]  # the invented: never run
    gated = [e.payload.tool for e in _events(url) if type(e.payload).__name__ == "GateChecked"]
    assert "mcp__fx__test_no_such_tool" in gated


def test_log_and_progress_reach_the_client_on_the_calls_stream_and_are_kept(url: str) -> None:
    token = _plan(url)
    logs: list[types.LoggingMessageNotificationParams] = []
    progress: list[float] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(done)

    async def work(http: httpx2.AsyncClient) -> None:
        async with _session(http, logging_callback=on_log) as session:
            await session.call_tool("test_tool_with_logging", {})
            await session.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)

    _as_agent(url, token, work)
    assert [entry.data for entry in logs] == [
        "Tool execution started",
        "Tool processing data",
        "Tool execution completed",
    ]
    assert progress == [0, 50, 100]
    calls = {e.payload.tool: e.payload for e in _events(url) if isinstance(e.payload, ToolCalled)}
    logged, progressed = calls["fx.test_tool_with_logging"], calls["fx.test_tool_with_progress"]
    assert logged.exchange is not None and (logged.exchange.log, logged.exchange.progress) == (3, 0)
    assert progressed.exchange is not None and progressed.exchange.progress == 3
    assert not logged.tool_error and not progressed.tool_error


def test_a_client_that_accepts_only_json_gets_the_result_and_the_record_keeps_the_log(
    url: str,
) -> None:
    """No SSE stream to carry them: the answer alone; the record is the same."""
    token = _plan(url)
    init = _initialize({})
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "test_tool_with_logging", "arguments": {}},
    }
    headers = {"Accept": "application/json", "Content-Type": "application/json"}

    async def work(http: httpx2.AsyncClient) -> httpx2.Response:
        await http.post(DOOR, json=init, headers=headers)
        return await http.post(DOOR, json=call, headers=headers)

    answer = _as_agent(url, token, work)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.json()["result"]["content"][0]["text"].startswith("Tool with logging")
    calls = [e.payload for e in _events(url) if isinstance(e.payload, ToolCalled)]
    assert calls[0].exchange is not None and calls[0].exchange.log == 3


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
def test_resources_prompts_completions_and_log_level_are_forwarded_and_reads_recorded(
    url: str,
) -> None:
    token = _plan(url)

    async def work(http: httpx2.AsyncClient) -> tuple[Any, ...]:
        async with _session(http) as session:
            listed = await session.list_resources()
            templates = await session.list_resource_templates()
            text = await session.read_resource("test://static-text")
            prompts = await session.list_prompts()
            prompt = await session.get_prompt("test_simple_prompt")
            await session.set_logging_level("debug")
            completed = await session.complete(
                types.PromptReference(type="ref/prompt", name="test_prompt_with_arguments"),
                {"name": "arg1", "value": "a"},
            )
            return listed, templates, text, prompts, prompt, completed

    listed, templates, text, prompts, prompt, completed = _as_agent(url, token, work)
    assert "test://static-text" in {str(r.uri) for r in listed.resources}
    assert templates.resource_templates
    assert text.contents[0].text == "This is the content of the static text resource."
    assert "test_simple_prompt" in {p.name for p in prompts.prompts}
    assert prompt.messages[0].content.text == "This is a simple prompt for testing."
    assert isinstance(completed.completion.values, list)
    fetched = [e.payload for e in _events(url) if isinstance(e.payload, McpFetched)]
    assert [(f.server, f.what, f.name) for f in fetched] == [
        ("fx", "resource", "test://static-text"),
        ("fx", "prompt", "test_simple_prompt"),
    ]
    with ledger.open(url, create=False) as store:  # the answer the agent read, kept
        kept = store.get_blob(fetched[0].content_sha256)
    assert kept is not None and hashlib.sha256(kept).hexdigest() == fetched[0].content_sha256
    assert json.loads(kept)["contents"][0]["text"] == text.contents[0].text


def _refused(
    work: Callable[[ClientSession], Awaitable[Any]], door: str = DOOR
) -> Callable[[Any], Awaitable[str]]:
    """The message of the MCP error ``work`` gets at ``door``."""

    async def drive(http: httpx2.AsyncClient) -> str:
        async with _session(http, door) as session:
            try:
                await work(session)
            except MCPError as exc:
                return exc.error.message
        raise AssertionError("not refused")

    return drive


def test_a_read_before_execute_is_refused_and_nothing_recorded(url: str) -> None:
    token = _plan(url, execute=False)
    head = _head(url)
    said = _as_agent(url, token, _refused(lambda s: s.read_resource("test://static-text")))
    assert "only in Execute" in said
    assert _head(url) == head


def test_a_plan_whose_skills_name_none_of_the_servers_tools_reads_nothing(url: str) -> None:
    with Plane.open(url) as plane:  # a skill of another tool (a command's)
        register_tool(plane, {"name": "other.echo", "command": ["echo"]})
        define_skill(plane, {"name": "other", "members": ["other.echo"]})
    token = _plan(url, skills=["other"])
    head = _head(url)

    async def work(http: httpx2.AsyncClient) -> tuple[set[str], str]:
        async with _session(http) as session:
            names = {tool.name for tool in (await session.list_tools()).tools}
        return names, await _refused(lambda s: s.read_resource("test://static-text"))(http)

    names, said = _as_agent(url, token, work)
    assert not any(name.startswith("test_") for name in names)
    assert "no tool of MCP server 'fx' is offered to plan P-1" in said
    assert _head(url) == head


@pytest.mark.parametrize(
    "uri", ["test://" + "a" * 4100, "test://static-text\n", "test://\x1b[2Jstatic-text"]
)
def test_a_uri_too_long_or_unprintable_to_record_is_refused_before_the_server_is_asked(
    url: str, uri: str
) -> None:
    token = _plan(url)
    head = _head(url)
    said = _as_agent(url, token, _refused(lambda s: s.read_resource(uri)))
    assert "at most 4096 printable characters" in said
    assert _head(url) == head


def test_a_server_name_that_is_none_is_422_and_an_unknown_one_offers_nothing(url: str) -> None:
    token = _plan(url)
    head = _head(url)

    async def work(http: httpx2.AsyncClient) -> tuple[int, set[str], str]:
        bad = await http.post(
            f"{BASE}/mcp/a%20b",
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            headers={"Accept": "application/json, text/event-stream"},
        )
        async with _session(http, f"{BASE}/mcp/nobody") as session:
            names = {tool.name for tool in (await session.list_tools()).tools}
        said = await _refused(lambda s: s.list_prompts(), f"{BASE}/mcp/nobody")(http)
        return bad.status_code, names, said

    status, names, said = _as_agent(url, token, work)
    assert status == 422
    assert names and all(name.startswith("evidence.") for name in names)
    assert "no tool of MCP server 'nobody'" in said
    assert _head(url) == head


def test_a_refusal_at_the_door_names_its_own_metadata(url: str) -> None:
    async def work(http: httpx2.AsyncClient) -> httpx2.Response:
        return await http.post(
            DOOR,
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            headers={"Accept": "application/json, text/event-stream", "Authorization": ""},
        )

    answer = _as_agent(url, "not-a-credential", work)
    assert answer.status_code == 401
    assert "/.well-known/oauth-protected-resource/mcp/fx" in answer.headers["www-authenticate"]


def test_a_2026_07_28_request_is_answered_and_its_envelope_stays_at_the_door(url: str) -> None:
    """The stateless revision (no initialize: each request carries the protocol's
    envelope in its ``_meta``): the door answers it, and forwards the read to the
    plan's server, whose connection is the plane's own, without that envelope (a
    server on the handshake era refuses a request carrying it)."""
    token = _plan(url)
    envelope = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "stateless", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    own = {"evidence/credential": "for-the-gate-alone"}
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": "2026-07-28",
    }

    async def work(http: httpx2.AsyncClient) -> list[httpx2.Response]:
        answers = []
        for number, (method, params) in enumerate(
            [
                ("server/discover", {}),
                ("resources/read", {"uri": "test://static-text"}),
                ("tools/call", {"name": "test_simple_text", "arguments": {}}),
                ("resources/read", {"uri": "test://received-meta"}),
            ]
        ):
            body = {
                "jsonrpc": "2.0",
                "id": number,
                "method": method,
                "params": {**params, "_meta": {**envelope, **own, "vendor/trace": "t-1"}},
            }
            routing = {"Mcp-Method": method}  # the revision's routing header
            if method == "tools/call":
                routing["Mcp-Name"] = params["name"]
            elif method == "resources/read":
                routing["Mcp-Name"] = params["uri"]
            answers.append(await http.post(DOOR, json=body, headers={**headers, **routing}))
        return answers

    discovered, read, called, probe = (_message(a) for a in _as_agent(url, token, work))
    assert "tools" in discovered["result"]["capabilities"], discovered
    assert read["result"]["contents"][0]["text"].startswith("This is the content"), read
    assert read["result"]["resultType"] == "complete"
    assert called["result"]["content"][0]["text"].startswith("This is a simple text"), called
    assert "result" in probe, probe
    received = json.loads(probe["result"]["contents"][0]["text"])
    # the agent's own _meta keys pass; its envelope and the plane's keys stay here
    assert received["vendor/trace"] == "t-1", received
    assert not [key for key in received if key.startswith("evidence/")], received
    assert "stateless" not in json.dumps(received), received
    fetched = [e.payload for e in _events(url) if isinstance(e.payload, McpFetched)]
    assert [f.name for f in fetched] == ["test://static-text", "test://received-meta"]


def _message(answer: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC answer of a response, as JSON or as the last event of its stream."""
    assert answer.status_code == 200, answer.text
    if answer.headers["content-type"].startswith("application/json"):
        return dict(answer.json())
    events = [line[5:].strip() for line in answer.text.splitlines() if line.startswith("data:")]
    return dict(json.loads([e for e in events if e][-1]))


@contextlib.contextmanager
def _uvicorn(url: str) -> Iterator[str]:
    """The app on a real uvicorn in a thread of this process, on a free loopback port
    (an MCP session's server-to-client request needs a streamed answer, which the ASGI
    test transport, buffering each response whole, cannot give): its base URL."""
    import socket
    import threading

    import uvicorn

    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(create_app(url), log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(500):
            if server.started:
                break
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def test_sampling_and_elicitation_are_asked_of_the_agents_client_and_kept(url: str) -> None:
    """On a session (the client accepts event streams), a server's sampling and
    elicitation requests during a call reach the agent's client, which declared both;
    its answers go back to the server, and request and answer are kept with the call,
    which passes. A client that declared neither is never asked: refused, recorded,
    the call is the tool's failure."""
    token = _plan(url)
    asked: list[str] = []

    async def sampling(context: Any, params: types.CreateMessageRequestParams) -> Any:
        asked.append("sampling")
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text="four"),
            model="agent-model",
        )

    async def elicitation(context: Any, params: Any) -> Any:
        asked.append("elicitation")
        return types.ElicitResult(action="accept", content={"username": "ada", "email": "a@b.c"})

    async def drive(base: str) -> tuple[Any, ...]:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
            async with _session(
                http, f"{base}/mcp/fx", sampling_callback=sampling, elicitation_callback=elicitation
            ) as session:
                sampled = await session.call_tool("test_sampling", {"prompt": "2+2?"})
                elicited = await session.call_tool("test_elicitation", {"message": "who?"})
            async with _session(http, f"{base}/mcp/fx") as plain:
                refused = await plain.call_tool("test_sampling", {"prompt": "2+2?"})
        return sampled, elicited, refused

    with _uvicorn(url) as base:
        sampled, elicited, refused = anyio.run(drive, base)
    assert asked == ["sampling", "elicitation"]
    assert not sampled.is_error and "four" in sampled.content[0].text, sampled
    assert not elicited.is_error and "ada" in json.dumps(elicited.model_dump(mode="json"))
    assert refused.is_error
    calls = [e.payload for e in _events(url) if isinstance(e.payload, ToolCalled)]
    first, second, third = calls
    assert first.exchange is not None and (first.exchange.sampling, first.exchange.refused) == (
        1,
        0,
    )
    assert not first.tool_error
    assert second.exchange is not None and second.exchange.elicitation == 1
    assert third.exchange is not None and third.exchange.refused == 1 and third.tool_error
    with ledger.open(url, create=False) as store:
        kept = json.loads(store.get_blob(first.exchange_sha256) or b"[]")
    assert kept[0]["kind"] == "sampling" and kept[0]["answer"]["content"]["text"] == "four"


def test_a_session_serves_only_the_credential_that_opened_it(url: str) -> None:
    """A session id is no credential: another plan's agent that learns it gets 404 (as
    for a session that does not exist), and nothing is appended."""
    mine, theirs = _plan(url, "P-1"), _plan(url, "P-2")
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    init = _initialize({"sampling": {}})
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}

    async def work(http: httpx2.AsyncClient) -> tuple[int, int, str]:
        opened = await http.post(DOOR, json=init, headers=accept)
        session = opened.headers["mcp-session-id"]
        theirs_headers = {**accept, "Mcp-Session-Id": session, "Authorization": f"Bearer {theirs}"}
        stolen = await http.post(DOOR, json=listing, headers=theirs_headers)
        own = await http.post(DOOR, json=listing, headers={**accept, "Mcp-Session-Id": session})
        return stolen.status_code, own.status_code, own.text

    head = _head(url)
    stolen, own, listed = _as_agent(url, mine, work)
    assert (stolen, own) == (404, 200)
    assert "test_simple_text" in listed
    assert _head(url) == head


def test_a_stateless_request_is_never_asked_and_its_call_cannot_pass(url: str) -> None:
    """A 2025-11-25 request without a session (a client that accepts only JSON) has no
    way back for an answer: the server's request during the call is refused and
    recorded, and the call is the tool's failure, never a normal pass. (A request of the
    2026-07-28 revision is answered in the revision: a server asks it in its results.)"""
    token = _plan(url)
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "test_sampling", "arguments": {"prompt": "2+2?"}},
    }
    headers = {"Accept": "application/json", "MCP-Protocol-Version": "2025-11-25"}

    async def work(http: httpx2.AsyncClient) -> httpx2.Response:
        return await http.post(DOOR, json=body, headers=headers)

    answer = _message(_as_agent(url, token, work))
    assert answer["result"]["isError"] is True, answer
    [call] = [e.payload for e in _events(url) if isinstance(e.payload, ToolCalled)]
    assert call.exchange is not None and (call.exchange.sampling, call.exchange.refused) == (1, 1)
    assert call.tool_error


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
def test_a_sessions_reads_and_calls_share_one_kept_server(url: str) -> None:
    """What the agent's client offers picks the kept server (one that may ask it for
    sampling is another than one that may not): a session's forwarded requests go to
    the server its calls use, so a log level it sets is the one its calls run at."""
    token = _plan(url)
    app = create_app(url)

    async def sampling(context: Any, params: Any) -> Any:
        raise AssertionError("not asked here")

    async def main() -> list[Any]:
        async with app.router.lifespan_context(app):
            headers = {"Authorization": f"Bearer {token}"}
            transport = httpx2.ASGITransport(app=app)
            async with (
                httpx2.AsyncClient(
                    transport=transport, base_url=BASE, headers=headers, timeout=60
                ) as http,
                _session(http, sampling_callback=sampling) as session,
            ):
                await session.call_tool("test_simple_text", {})
                await session.read_resource("test://static-text")
                await session.set_logging_level("debug")
                return app.state.service.warm.running("P-1")

    kept = anyio.run(main)
    assert len(kept) == 1 and kept[0].offers == frozenset({"sampling"}), kept


# -- the stateless revision's rounds of questions (input_required) -------------------------

MODERN = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": "2026-07-28",
}
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "stateless", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
}
ASKS = "test_input_required_result_request_state"  # the fixture's: asks, keeps a state
YES = {"confirm": {"action": "accept", "content": {"ok": True}}}


def _call(arguments: dict[str, Any], **more: Any) -> dict[str, Any]:
    params = {"name": ASKS, "arguments": arguments, "_meta": ENVELOPE, **more}
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}


async def _post(http: httpx2.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """The answer to a 2026-07-28 ``tools/call`` (a refusal's error is a 400's body)."""
    routing = {"Mcp-Method": "tools/call", "Mcp-Name": body["params"]["name"]}
    answer = await http.post(DOOR, json=body, headers={**MODERN, **routing})
    return dict(answer.json()) if answer.status_code == 400 else _message(answer)


def test_a_servers_questions_reach_the_agent_and_its_answers_act_once(url: str) -> None:
    """The server answers a 2026-07-28 call with a question and a state of its own: the
    agent gets the question and a state the door sealed (the server's inside it, and the
    round it answers); its answers, given with it, are recorded before the server has
    them, and the call then passes as any other. The same answers and state sent again
    — a person's "yes" replayed to act twice — are refused before the server is asked:
    a round is answered once."""
    token = _plan(url)

    async def work(http: httpx2.AsyncClient) -> list[dict[str, Any]]:
        asked = await _post(http, _call({}))
        state = asked["result"]["requestState"]
        retry = _call({}, inputResponses=YES, requestState=state)
        return [asked, await _post(http, retry), await _post(http, retry)]

    asked, answered, replayed = _as_agent(url, token, work)
    result = asked["result"]
    assert result["resultType"] == "input_required"
    assert result["inputRequests"]["confirm"]["method"] == "elicitation/create"
    assert result["requestState"].startswith("v1.")  # sealed: neither readable nor forgeable
    assert "round" not in result["requestState"]
    assert "state-ok" in answered["result"]["content"][0]["text"], answered
    assert replayed["result"]["isError"], replayed
    assert "answered already" in replayed["result"]["content"][0]["text"]
    payloads = [e.payload for e in _events(url)]
    calls = (McpInputRequired, McpInputGiven, ToolCalled)
    kinds = [type(p).__name__ for p in payloads if isinstance(p, calls)]
    assert kinds == ["McpInputRequired", "McpInputGiven", "ToolCalled"]  # the replay: nothing
    round_, given = (p for p in payloads if isinstance(p, McpInputRequired | McpInputGiven))
    assert isinstance(round_, McpInputRequired) and isinstance(given, McpInputGiven)
    assert given.round_id == round_.round_id and given.given == ["confirm"]
    assert round_.asked == {"confirm": "elicitation/create"}
    with ledger.open(url, create=False) as store:
        assert json.loads(store.get_blob(given.given_sha256)) == YES  # the person's answer
    audit = _audit(url)
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_the_planes_own_door_asks_the_agent_too(url: str) -> None:
    """``/mcp`` (every tool the plan may call, under its registered name) relays a
    server's questions to an agent of the stateless revision as the server's door does,
    and records the round and the answers the same way."""
    token = _plan(url)
    registered = f"fx.{ASKS}"

    async def post(http: httpx2.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
        body["params"]["name"] = registered
        routing = {"Mcp-Method": "tools/call", "Mcp-Name": registered}
        return _message(await http.post("/mcp", json=body, headers={**MODERN, **routing}))

    async def work(http: httpx2.AsyncClient) -> list[dict[str, Any]]:
        asked = await post(http, _call({}))
        state = asked["result"]["requestState"]
        return [asked, await post(http, _call({}, inputResponses=YES, requestState=state))]

    asked, answered = _as_agent(url, token, work)
    assert asked["result"]["resultType"] == "input_required", asked
    assert "state-ok" in answered["result"]["content"][0]["text"], answered
    kinds = [
        type(e.payload).__name__
        for e in _events(url)
        if isinstance(e.payload, McpInputRequired | McpInputGiven | ToolCalled)
    ]
    assert kinds == ["McpInputRequired", "McpInputGiven", "ToolCalled"]


def test_what_a_server_says_during_a_round_is_recorded_with_it(url: str) -> None:
    """A round has no call record: its progress messages are kept with the round's own
    event, as a call's are with its record."""
    token = _plan(url)

    async def work(http: httpx2.AsyncClient) -> dict[str, Any]:
        body = _call({})
        body["params"]["_meta"] = {**ENVELOPE, "progressToken": "p-1"}
        return await _post(http, body)

    asked = _as_agent(url, token, work)
    assert asked["result"]["resultType"] == "input_required", asked
    [round_] = [e.payload for e in _events(url) if isinstance(e.payload, McpInputRequired)]
    assert isinstance(round_.exchange, Exchange) and round_.exchange.progress == 1, round_
    with ledger.open(url, create=False) as store:
        assert isinstance(round_.exchange_sha256, str)
        said = json.loads(store.get_blob(round_.exchange_sha256))
    assert [m["kind"] for m in said] == ["progress"], said


def test_a_reads_answers_are_recorded_with_what_it_read(url: str) -> None:
    """A prompt whose server asks first (the agent's context): the question reaches the
    agent, and the prompt it finally gets is recorded with the answers it came with, a
    person's input that shaped what the agent reads."""
    token = _plan(url)
    context = {"user_context": {"action": "accept", "content": {"context": "billing"}}}

    def get(**more: Any) -> dict[str, Any]:
        params = {"name": "test_input_required_result_prompt", "_meta": ENVELOPE, **more}
        return {"jsonrpc": "2.0", "id": 1, "method": "prompts/get", "params": params}

    async def post(http: httpx2.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
        routing = {"Mcp-Method": "prompts/get", "Mcp-Name": body["params"]["name"]}
        return _message(await http.post(DOOR, json=body, headers={**MODERN, **routing}))

    async def work(http: httpx2.AsyncClient) -> list[dict[str, Any]]:
        asked = await post(http, get())
        state = asked["result"]["requestState"]
        return [asked, await post(http, get(inputResponses=context, requestState=state))]

    asked, got = _as_agent(url, token, work)
    assert asked["result"]["resultType"] == "input_required", asked
    assert "billing" in got["result"]["messages"][0]["content"]["text"], got
    [fetched] = [e.payload for e in _events(url) if isinstance(e.payload, McpFetched)]
    assert fetched.given == ["user_context"]
    with ledger.open(url, create=False) as store:
        assert isinstance(fetched.given_sha256, str)
        assert json.loads(store.get_blob(fetched.given_sha256)) == context
    audit = _audit(url)
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_a_sealed_state_is_bound_to_its_arguments_and_its_credential(url: str) -> None:
    """The state the door gives is good for the same call by the same credential only:
    with other arguments, from another plan's credential, or as plain JSON the agent
    wrote (naming a round itself), it is refused (-32602) and nothing is recorded."""
    token = _plan(url)
    other = _plan(url, "P-2")
    forged = json.dumps({"round": "01HZZZZZZZZZZZZZZZZZZZZZZZ", "state": "round-1"})

    async def first(http: httpx2.AsyncClient) -> tuple[str, list[dict[str, Any]]]:
        state = (await _post(http, _call({})))["result"]["requestState"]
        tries = [
            _call({"more": 1}, inputResponses=YES, requestState=state),
            _call({}, inputResponses=YES, requestState=forged),
        ]
        return state, [await _post(http, body) for body in tries]

    state, refused = _as_agent(url, token, first)

    async def elsewhere(http: httpx2.AsyncClient) -> dict[str, Any]:
        return await _post(http, _call({}, inputResponses=YES, requestState=state))

    refused.append(_as_agent(url, other, elsewhere))
    assert [answer.get("error", {}).get("code") for answer in refused] == [-32602] * 3, refused
    for plan_id in ("P-1", "P-2"):
        assert not [e for e in _events(url, plan_id) if isinstance(e.payload, McpInputGiven)]


def test_a_forged_second_answer_to_a_round_is_found_by_the_audit(url: str) -> None:
    """An agent holding the database file appends a second answer to a round the plane
    closed (well-formed, its delta right): the plan's rule that a round is answered once
    finds it."""
    token = _plan(url)

    async def work(http: httpx2.AsyncClient) -> None:
        asked = await _post(http, _call({}))
        state = asked["result"]["requestState"]
        await _post(http, _call({}, inputResponses=YES, requestState=state))

    _as_agent(url, token, work)
    given = next(e.payload for e in _events(url) if isinstance(e.payload, McpInputGiven))
    with ledger.open(url, create=False) as store:
        forge(store, "plan:P-1", given)
    audit = _audit(url)
    assert audit.returncode == 1, audit.stdout + audit.stderr
    assert "answered once" in audit.stdout


def _audit(url: str) -> subprocess.CompletedProcess[str]:
    return run_cli("audit", "--db", url)
