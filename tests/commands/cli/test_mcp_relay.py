"""What `evidence mcp proxy` carries besides tool calls (docs/agents.md, "What the proxy
carries"), with the conformance fixture server (tests/conformance/fixture_server.py) on
stdio behind a real proxy process and the official SDK's client as the agent:

- resources, resource templates, prompts, completions and logging are forwarded as the
  upstream declares them; every resource read and prompt fetch is recorded
  (``mcp.fetched``, the answer kept as a blob) before the agent gets it;
- a call's log and progress notifications reach the agent and are kept with the call
  (``tool.called``'s ``exchange``);
- a sampling or elicitation request is relayed to an agent whose client offers it, and
  the request and its answer are kept; one the agent's client does not offer is refused,
  and the call is the tool's failure (``tool_error``), never a normal pass.

And, in-process: what the gate keeps of the agent's ``_meta``, and how an exchange is
counted.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import msgspec
import pytest
from mcp import ClientSession, MCPDeprecationWarning, StdioServerParameters, stdio_client
from mcp.client.session import ClientRequestContext

import ledger
from commands.plane import CommandRefused, Plane
from commands.plane.mcp_answers import forwarded_meta
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.proxy import exchanged, record_fetch
from commands.plane.registry import register_tool
from commands.plane.runs import Recorded, call_tool, record_halt
from commands.runner.mcp_client import mcp_tool_result_schema
from ledger.events import McpFetched, ToolCalled
from tests.commands.cli.test_mcp_proxy import (
    Session,
    _audit_clean,
    _plan_events,
    _proxy,
    _setup,
    _text,
    _with_agent,
)
from tests.helpers import TESTS

FIXTURE = TESTS / "conformance" / "fixture_server.py"


def _upstream() -> list[str]:
    return ["--", sys.executable, str(FIXTURE), "--stdio"]


def _with_client(params: StdioServerParameters, session: Session, **callbacks: Any) -> None:
    """``_with_agent``, with the agent's client offering what ``callbacks`` answer
    (sampling, elicitation, logging: the SDK's client declares them at initialize)."""

    async def drive() -> None:
        async with (
            stdio_client(params) as (read, write),
            ClientSession(read, write, **callbacks) as agent,
        ):
            with anyio.fail_after(60):
                await agent.initialize()
                await session(agent)

    anyio.run(drive)


def _calls(url: str) -> dict[str, ToolCalled]:
    """The plan's calls by the MCP tool name they were registered from (SERVER.TOOL)."""
    return {
        e.payload.tool.split(".", 1)[1]: e.payload
        for e in _plan_events(url)
        if isinstance(e.payload, ToolCalled)
    }


def _blob(url: str, digest: str) -> Any:
    with ledger.open(url, create=False) as store:
        data = store.get_blob(digest)
    assert data is not None and hashlib.sha256(data).hexdigest() == digest
    return json.loads(data)


@pytest.mark.slow
def test_resources_prompts_completions_and_logging_are_forwarded_and_reads_recorded(
    sqlite_url: str, tmp_path: Path
) -> None:
    _setup(sqlite_url)
    seen: dict[str, Any] = {}

    async def session(agent: ClientSession) -> None:
        caps = agent.server_capabilities
        assert caps is not None and caps.resources and caps.prompts and caps.logging
        seen["resources"] = [r.uri for r in (await agent.list_resources()).resources]
        seen["templates"] = [
            t.uri_template for t in (await agent.list_resource_templates()).resource_templates
        ]
        text = await agent.read_resource("test://static-text")
        seen["text"] = text
        seen["template"] = await agent.read_resource("test://template/123/data")
        seen["prompts"] = [p.name for p in (await agent.list_prompts()).prompts]
        seen["prompt"] = await agent.get_prompt(
            "test_prompt_with_arguments", {"arg1": "one", "arg2": "two"}
        )
        with pytest.warns(MCPDeprecationWarning):  # in 2026-07-28, not in 2025-11-25
            await agent.set_logging_level("debug")

    _with_agent(_proxy(sqlite_url, tmp_path, _upstream()), session)
    assert "test://static-text" in seen["resources"]
    assert "test://template/{id}/data" in seen["templates"]
    assert {"test_simple_prompt", "test_prompt_with_arguments"} <= set(seen["prompts"])
    prompt_text = json.dumps(seen["prompt"].model_dump(mode="json"))
    assert "one" in prompt_text and "two" in prompt_text
    fetched = [e.payload for e in _plan_events(sqlite_url) if isinstance(e.payload, McpFetched)]
    assert [(f.what, f.name) for f in fetched] == [
        ("resource", "test://static-text"),
        ("resource", "test://template/123/data"),
        ("prompt", "test_prompt_with_arguments"),
    ]
    # The blob is the answer as the agent got it.
    first = _blob(sqlite_url, fetched[0].content_sha256)
    assert first == seen["text"].model_dump(by_alias=True, mode="json", exclude_none=True)
    assert fetched[0].size == len(msgspec.json.encode(first))
    _audit_clean(sqlite_url)


@pytest.mark.slow
def test_a_calls_log_and_progress_reach_the_agent_and_are_kept(
    sqlite_url: str, tmp_path: Path
) -> None:
    _setup(sqlite_url)
    logs: list[types.LoggingMessageNotificationParams] = []
    progress: list[float] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async def session(agent: ClientSession) -> None:
        logged = await agent.call_tool("test_tool_with_logging", {})
        assert not logged.is_error, _text(logged)
        stepped = await agent.call_tool(
            "test_tool_with_progress", {}, progress_callback=on_progress
        )
        assert not stepped.is_error, _text(stepped)

    _with_client(_proxy(sqlite_url, tmp_path, _upstream()), session, logging_callback=on_log)
    assert len(logs) >= 3 and len(progress) >= 3
    assert progress == sorted(progress)
    calls = _calls(sqlite_url)
    logged, stepped = calls["test_tool_with_logging"], calls["test_tool_with_progress"]
    assert logged.exchange and logged.exchange.log == len(logs) and not logged.exchange.refused
    assert stepped.exchange and stepped.exchange.progress == len(progress)
    kept = _blob(sqlite_url, logged.exchange_sha256)  # type: ignore[arg-type]
    assert [m["params"]["data"] for m in kept] == [entry.data for entry in logs]
    assert logged.tool_error is msgspec.UNSET
    _audit_clean(sqlite_url)


async def _sample(
    context: ClientRequestContext, params: types.CreateMessageRequestParams
) -> types.CreateMessageResult:
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text="sampled by the agent"),
        model="agent-model",
        stop_reason="endTurn",
    )


async def _answer(
    context: ClientRequestContext, params: types.ElicitRequestParams
) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"username": "ada", "email": "a@b.c"})


@pytest.mark.slow
def test_sampling_and_elicitation_are_relayed_and_kept(sqlite_url: str, tmp_path: Path) -> None:
    _setup(sqlite_url)
    answers: dict[str, types.CallToolResult] = {}

    async def session(agent: ClientSession) -> None:
        answers["sampling"] = await agent.call_tool("test_sampling", {"prompt": "say hi"})
        answers["elicitation"] = await agent.call_tool(
            "test_elicitation", {"message": "who are you?"}
        )

    params = _proxy(sqlite_url, tmp_path, _upstream())
    _with_client(params, session, sampling_callback=_sample, elicitation_callback=_answer)
    assert "sampled by the agent" in _text(answers["sampling"])
    assert not answers["elicitation"].is_error, _text(answers["elicitation"])
    calls = _calls(sqlite_url)
    sampled, elicited = calls["test_sampling"], calls["test_elicitation"]
    assert sampled.exchange and sampled.exchange.sampling == 1
    [kept] = _blob(sqlite_url, sampled.exchange_sha256)  # type: ignore[arg-type]
    assert kept["request"]["messages"][0]["content"]["text"] == "say hi"
    assert kept["answer"]["content"]["text"] == "sampled by the agent"
    assert elicited.exchange and elicited.exchange.elicitation == 1
    [person] = _blob(sqlite_url, elicited.exchange_sha256)  # type: ignore[arg-type]
    assert person["answer"] == {
        "action": "accept",
        "content": {"username": "ada", "email": "a@b.c"},
    }
    assert sampled.tool_error is msgspec.UNSET and elicited.tool_error is msgspec.UNSET
    _audit_clean(sqlite_url)


@pytest.mark.slow
def test_a_request_the_agents_client_cannot_answer_fails_the_call(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The attack: a server asks for sampling, the gate cannot relay it, the server
    answers with ordinary text. That answer is the tool's failure, never a pass."""
    _setup(sqlite_url)
    answers: dict[str, types.CallToolResult] = {}

    async def session(agent: ClientSession) -> None:
        answers["sampling"] = await agent.call_tool("test_sampling", {"prompt": "say hi"})

    _with_agent(_proxy(sqlite_url, tmp_path, _upstream()), session)
    assert answers["sampling"].is_error
    sampled = _calls(sqlite_url)["test_sampling"]
    assert sampled.tool_error is True
    assert sampled.exchange and sampled.exchange.refused == 1
    [kept] = _blob(sqlite_url, sampled.exchange_sha256)  # type: ignore[arg-type]
    assert kept["refused"] is True and "does not offer sampling" in kept["error"]["message"]
    _audit_clean(sqlite_url)


@pytest.mark.slow
def test_a_refusal_the_server_answers_with_an_error_fails_the_call_not_the_plan(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The same through the proxy: a server answers a refused elicitation with a JSON-RPC
    error. The agent gets the tool's error; the plan is not halted."""
    _setup(sqlite_url)
    answers: dict[str, types.CallToolResult] = {}

    async def session(agent: ClientSession) -> None:
        answers["elicit"] = await agent.call_tool("test_elicitation", {"message": "who?"})
        answers["after"] = await agent.call_tool("test_simple_text", {})

    _with_agent(_proxy(sqlite_url, tmp_path, _upstream()), session)
    assert answers["elicit"].is_error and not answers["after"].is_error
    elicited = _calls(sqlite_url)["test_elicitation"]
    assert elicited.tool_error is True
    assert elicited.exchange and elicited.exchange.refused == 1
    assert not [e for e in _plan_events(sqlite_url) if e.type == "plan.halted"]
    _audit_clean(sqlite_url)


# -- in-process -------------------------------------------------------------------------


def test_the_gate_keeps_its_own_meta_and_the_progress_token_to_itself() -> None:
    meta = {
        "progress_token": 7, "evidence/step": "s1", "evidence/x": 1, "trace": "t",
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",  # the agent's connection's
    }  # fmt: skip
    assert forwarded_meta(meta) == {"trace": "t"}
    assert forwarded_meta({"evidence/step": "s1"}) is None
    assert forwarded_meta(None) is None


def test_an_exchange_is_counted_by_kind_and_refusal() -> None:
    assert exchanged([]) is None
    messages: list[dict[str, Any]] = [
        {"kind": "log", "params": {"level": "info", "data": "a"}},
        {"kind": "progress", "params": {"progress": 1}},
        {"kind": "sampling", "request": {}, "refused": True, "error": {}},
        {"kind": "elicitation", "request": {}, "answer": {"action": "decline"}},
        {"kind": "log", "params": {"level": "info", "data": "b"}},
    ]
    done = exchanged(messages)
    assert done is not None
    assert msgspec.to_builtins(done.counts) == {
        "log": 2, "progress": 1, "sampling": 1, "elicitation": 1, "refused": 1,
    }  # fmt: skip
    assert json.loads(done.messages) == messages


def test_a_read_in_an_ended_plan_is_refused_and_recorded_nowhere(sqlite_url: str) -> None:
    with Plane.open(sqlite_url) as plane:
        create_plan(plane, "P-1", project="api", resources=["repo:api"])
        record_fetch(plane, "P-1", "srv", "resource", "test://a", {"contents": []})
        record_halt(plane, "P-1", "validation_failed", "stop", terminal=True)
        before = len(_plan_events(sqlite_url))
        with pytest.raises(CommandRefused, match="has ended"):
            record_fetch(plane, "P-1", "srv", "resource", "test://b", {"contents": []})
    assert len(_plan_events(sqlite_url)) == before


def test_an_answer_given_without_what_the_server_asked_for_is_the_tools_failure(
    sqlite_url: str,
) -> None:
    """The rule behind the refusal: a call whose exchange holds a refused request is the
    tool's failure (``tool_error``), whatever its text; the same text without one passes."""
    text = json.dumps({"content": [{"type": "text", "text": "Sampling failed: no"}]})
    refused = exchanged([{"kind": "sampling", "request": {}, "refused": True, "error": {}}])
    logged = exchanged([{"kind": "log", "params": {"level": "info", "data": "x"}}])
    with Plane.open(sqlite_url) as plane:
        register_tool(
            plane,
            {"name": "srv.ask", "mcp_server": "srv", "mcp_tool_name": "ask",
             "input_schema": {"type": "object"}, "output_schema": mcp_tool_result_schema()},
        )  # fmt: skip
        create_plan(plane, "P-1", project="api", resources=["repo:api"])
        record_strategy(plane, "P-1", "ask")
        enter_execute(plane, "P-1")
        failed = call_tool(plane, "P-1", "srv.ask", {}, recorded=Recorded(text, exchange=refused))
        passed = call_tool(plane, "P-1", "srv.ask", {}, recorded=Recorded(text, exchange=logged))
    assert failed.tool_failed and not failed.ok
    assert failed.call is not None and failed.call.exchange == refused.counts  # type: ignore[union-attr]
    assert passed.ok and passed.call is not None and passed.call.tool_error is msgspec.UNSET


# -- the plane's own client (`evidence call`, the service) --------------------------------


def _fixture_tool_plan(
    plane: Plane, name: str, mcp_tool: str, argument: str, plan_id: str = "P-1"
) -> None:
    """Tool ``name``: the conformance fixture's ``mcp_tool`` (one string argument),
    launched by the plane; plan ``plan_id`` in Execute."""
    register_tool(
        plane,
        {"name": name, "mcp_server": "fx", "mcp_tool_name": mcp_tool,
         "mcp_command": [sys.executable, str(FIXTURE), "--stdio"], "source": "mcp:fx",
         "input_schema": {"type": "object", "properties": {argument: {"type": "string"}}}},
    )  # fmt: skip
    create_plan(plane, plan_id, project="api", resources=[f"repo:{plan_id}"])
    record_strategy(plane, plan_id, "call the fixture")
    enter_execute(plane, plan_id)


@pytest.mark.slow
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_request_the_planes_client_never_offered_fails_the_call(
    sqlite_url: str, warm: bool
) -> None:
    """The issue's case: a server asks the plane's client for sampling (which it never
    offered), is refused, and answers "Sampling failed: …" as ordinary text. Recorded as
    a normal pass before; now the refusal is kept and the call is the tool's failure —
    on a server started for the call and on a warm one (the service's)."""
    from commands.runner.mcp_sessions import warm_sessions

    with Plane.open(sqlite_url) as plane, warm_sessions() as sessions:
        if warm:
            plane.mcp_sessions = sessions
        _fixture_tool_plan(plane, "fx.sample", "test_sampling", "prompt")
        report = call_tool(plane, "P-1", "fx.sample", {"prompt": "hi"})
    assert report.tool_failed and not report.ok
    assert report.call is not None and report.call.exchange is not msgspec.UNSET
    assert report.call.exchange.refused == 1 and report.call.exchange.sampling == 1
    [kept] = _blob(sqlite_url, report.call.exchange_sha256)  # type: ignore[arg-type]
    assert kept["request"]["messages"][0]["content"]["text"] == "hi"
    assert "does not offer sampling" in kept["error"]["message"]


def test_a_server_that_fails_the_call_over_a_refusal_fails_the_call_not_the_plan(
    sqlite_url: str,
) -> None:
    """The attack on the agent's own plan: a server asks for an elicitation the plane's
    client cannot relay, and answers the refusal with a JSON-RPC error instead of a
    result. That halted the plan (environment_error) before: an agent could strand its
    plan by calling such a tool. Now the refusal is kept and the call is the tool's own
    failure (an iteration of the attempt), the error's words in its output."""
    with Plane.open(sqlite_url) as plane:
        _fixture_tool_plan(plane, "fx.elicit", "test_elicitation", "message")
        report = call_tool(plane, "P-1", "fx.elicit", {"message": "who?"})
        plan = plane.state("plan:P-1").doc
        # The same error with nothing refused is still the server's failure: a halt.
        _fixture_tool_plan(plane, "fx.gone", "no_such_tool", "x", plan_id="P-2")
        failed = call_tool(plane, "P-2", "fx.gone", {})
    assert report.halt is None and report.tool_failed and not report.ok
    assert report.call is not None and report.call.exchange is not msgspec.UNSET
    assert report.call.exchange.refused == 1 and report.call.exchange.elicitation == 1
    assert b"answered the call" in (report.output or b"")
    assert plan.halt is None and plan.phase == "execute"  # the agent may call again
    assert failed.halt is not None and failed.halt.halt_type == "environment_error"
    assert "answered the call" in failed.halt.reason and failed.call is None


def test_the_planes_client_refuses_and_records_what_it_never_offered() -> None:
    from commands.runner.mcp_client import refuse_unoffered

    class Session:  # what the SDK's client session holds: its request handlers
        _sampling_callback: Any = None
        _elicitation_callback: Any = None

    session, said = Session(), []  # type: ignore[var-annotated]
    refuse_unoffered(session, said.append)
    asked = types.ElicitRequestFormParams(
        message="who?", requested_schema={"type": "object", "properties": {}}
    )
    error = anyio.run(session._elicitation_callback, None, asked)
    assert error.code == types.INVALID_REQUEST
    assert said == [
        {"kind": "elicitation", "refused": True, "request": asked.model_dump(
            by_alias=True, mode="json", exclude_none=True), "error": error.model_dump(
            by_alias=True, mode="json", exclude_none=True)}
    ]  # fmt: skip


def test_a_plan_with_skills_reads_only_from_servers_its_skills_name(sqlite_url: str) -> None:
    """The attack: a plan limited to one server's tools reads another server's
    resources (or gets its prompts) through the proxy. Refused, nothing appended."""
    from commands.plane.registry import define_skill

    schema = {"type": "object"}
    with Plane.open(sqlite_url) as plane:
        for name, server in (("docs.search", "docs"), ("mail.send", "mail")):
            register_tool(
                plane,
                {"name": name, "mcp_server": server, "mcp_tool_name": name.split(".")[1],
                 "input_schema": schema, "output_schema": mcp_tool_result_schema()},
            )  # fmt: skip
        define_skill(plane, {"name": "research", "members": ["docs.search"]})
        create_plan(plane, "P-1", project="api", resources=["repo:api"], skills=["research"])
        record_strategy(plane, "P-1", "read the docs")
        enter_execute(plane, "P-1")
        record_fetch(plane, "P-1", "docs", "resource", "docs://index", {"contents": []})
        before = len(_plan_events(sqlite_url))
        with pytest.raises(CommandRefused, match="skills"):
            record_fetch(plane, "P-1", "mail", "resource", "mail://inbox", {"contents": []})
        with pytest.raises(CommandRefused, match="skills"):
            record_fetch(plane, "P-1", "mail", "prompt", "compose", {"messages": []})
    assert len(_plan_events(sqlite_url)) == before


@pytest.mark.parametrize(
    "name",
    ["test://" + "a" * 5000, "test://a\x1b[2J", "test://a\nb"],
    ids=["huge", "escape", "newline"],
)
def test_a_read_whose_name_is_hostile_is_refused_and_recorded_nowhere(
    sqlite_url: str, name: str
) -> None:
    with Plane.open(sqlite_url) as plane:
        create_plan(plane, "P-1", project="api", resources=["repo:api"])
        before = len(_plan_events(sqlite_url))
        with pytest.raises(CommandRefused, match="printable characters"):
            record_fetch(plane, "P-1", "srv", "resource", name, {"contents": []})
    assert len(_plan_events(sqlite_url)) == before
