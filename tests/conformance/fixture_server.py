"""The fixture MCP server the conformance suite's server scenarios are written against.

Written with the official Python SDK's lowlevel ``Server`` from what each scenario of
``@modelcontextprotocol/conformance`` (pinned in tests/interop/package.json) asks of
"the server under test": the tools, resources and prompts it names, with the texts its
descriptions give. Each handler below names the scenario(s) it serves.

    python -m tests.conformance.fixture_server --http PORT   # streamable HTTP at /mcp
    python -m tests.conformance.fixture_server --stdio       # the same server over stdio

Over HTTP it listens on 127.0.0.1; with PORT 0 the kernel picks the port, and the first
line on stdout is always the server's URL (``http://127.0.0.1:PORT/mcp``). The HTTP
transport is the SDK's stateful ``StreamableHTTPSessionManager`` with an in-memory event
store (resumable SSE, for server-sse-polling) and the SDK's DNS-rebinding protection
(Host/Origin must be localhost or 127.0.0.1 with the port, for dns-rebinding-protection).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import re
import socket
import struct
import warnings
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp_types import JSONRPCMessage

try:
    from tests.conformance import input_required
except ImportError:  # run as a script (the plane launches it so): its sibling module
    import input_required  # type: ignore[no-redef,import-not-found]

# Logging, client-to-server progress and the like are deprecated by the SDK for the
# 2026-07-28 protocol; the scenarios test the 2025 protocols, where they are current.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

Ctx = ServerRequestContext[Any, Any]

# A 1x1 red PNG (tools-call-image, tools-call-mixed-content, prompts-get-with-image,
# resources-read-binary).
PNG_B64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAA"
    "AABJRU5ErkJggg=="
)


def _wav_b64() -> str:
    """A tenth of a second of 8 kHz 8-bit mono silence, as a WAV file (tools-call-audio)."""
    frames = b"\x80" * 800
    header = b"RIFF" + struct.pack("<I", 36 + len(frames)) + b"WAVE"
    fmt = b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, 8000, 8000, 1, 8)
    data = b"data" + struct.pack("<I", len(frames)) + frames
    return base64.b64encode(header + fmt + data).decode()


WAV_B64 = _wav_b64()


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def _image() -> types.ImageContent:
    return types.ImageContent(type="image", data=PNG_B64, mime_type="image/png")


def _embedded(uri: str, mime_type: str, text: str) -> types.EmbeddedResource:
    return types.EmbeddedResource(
        type="resource",
        resource=types.TextResourceContents(uri=uri, mime_type=mime_type, text=text),
    )


def _tool(name: str, description: str, **schema: Any) -> types.Tool:
    return types.Tool(name=name, description=description, input_schema={"type": "object", **schema})


# -- tools ---------------------------------------------------------------------------------

STRING = {"type": "string"}

TOOLS = [
    _tool("test_simple_text", "Returns a simple text response", properties={}),
    _tool("test_image_content", "Returns a 1x1 PNG image", properties={}),
    _tool("test_audio_content", "Returns a short WAV clip", properties={}),
    _tool("test_embedded_resource", "Returns an embedded text resource", properties={}),
    _tool("test_multiple_content_types", "Returns text, image and resource", properties={}),
    _tool("test_tool_with_logging", "Logs three messages while it runs", properties={}),
    _tool("test_error_handling", "Always returns a tool error", properties={}),
    _tool("test_tool_with_progress", "Reports progress 0, 50, 100 of 100", properties={}),
    _tool(
        "test_sampling",
        "Asks the client's LLM (sampling/createMessage)",
        properties={"prompt": {**STRING, "description": "The prompt to send to the LLM"}},
        required=["prompt"],
    ),
    _tool(
        "test_elicitation",
        "Asks the user for a username and an email (elicitation/create)",
        properties={"message": {**STRING, "description": "The message to show the user"}},
        required=["message"],
    ),
    _tool("test_elicitation_sep1034_defaults", "Elicits with defaults (SEP-1034)", properties={}),
    _tool("test_elicitation_sep1330_enums", "Elicits with enum forms (SEP-1330)", properties={}),
    _tool("test_reconnection", "Closes its SSE stream mid-call (SEP-1699)", properties={}),
    # json-schema-2020-12: the schema's $schema, $defs and additionalProperties survive.
    types.Tool(
        name="json_schema_2020_12_tool",
        description="Tool with JSON Schema 2020-12 features",
        input_schema={
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {
                "address": {
                    "type": "object",
                    "properties": {"street": STRING, "city": STRING},
                }
            },
            "properties": {"name": STRING, "address": {"$ref": "#/$defs/address"}},
            "additionalProperties": False,
        },
    ),
    *input_required.TOOLS,  # input-required-result-* (2026-07-28)
]

ELICITATION_SCHEMA = {  # tools-call-elicitation
    "type": "object",
    "properties": {
        "username": {"type": "string", "description": "User's response"},
        "email": {"type": "string", "description": "User's email address"},
    },
    "required": ["username", "email"],
}

SEP1034_SCHEMA = {  # elicitation-sep1034-defaults: a default for every primitive type
    "type": "object",
    "properties": {
        "name": {"type": "string", "default": "John Doe"},
        "age": {"type": "integer", "default": 30},
        "score": {"type": "number", "default": 95.5},
        "status": {
            "type": "string",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "default": True},
    },
}


def _choices(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"const": const, "title": title} for const, title in pairs]


SEP1330_SCHEMA = {  # elicitation-sep1330-enums: the five enum forms
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {
            "type": "string",
            "oneOf": _choices(
                ("value1", "First Option"), ("value2", "Second Option"), ("value3", "Third Option")
            ),
        },
        "legacyEnum": {
            "type": "string",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {
            "type": "array",
            "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
        },
        "titledMulti": {
            "type": "array",
            "items": {
                "anyOf": _choices(
                    ("value1", "First Choice"),
                    ("value2", "Second Choice"),
                    ("value3", "Third Choice"),
                )
            },
        },
    },
}


async def list_tools(
    ctx: Ctx, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    # tools-list, json-schema-2020-12
    return types.ListToolsResult(tools=TOOLS)


def _elicited(result: types.ElicitResult) -> str:
    return f"action={result.action}, content={json.dumps(result.content)}"


async def call_tool(
    ctx: Ctx, params: types.CallToolRequestParams
) -> types.CallToolResult | types.InputRequiredResult:
    name, args = params.name, params.arguments or {}
    if name.startswith(input_required.PREFIX) and name in {t.name for t in TOOLS}:
        if (params.meta or {}).get("progress_token") is not None:
            # not the suite's: a round that reports its progress first, when asked to
            await ctx.session.report_progress(0, 1)
        return input_required.call(name, params)
    session, request_id = ctx.session, ctx.request_id
    content: list[Any]
    if name == "test_simple_text":  # tools-call-simple-text
        content = [_text("This is a simple text response for testing.")]
    elif name == "test_image_content":  # tools-call-image
        content = [_image()]
    elif name == "test_audio_content":  # tools-call-audio
        content = [types.AudioContent(type="audio", data=WAV_B64, mime_type="audio/wav")]
    elif name == "test_embedded_resource":  # tools-call-embedded-resource
        content = [
            _embedded(
                "test://embedded-resource", "text/plain", "This is an embedded resource content."
            )
        ]
    elif name == "test_multiple_content_types":  # tools-call-mixed-content
        content = [
            _text("Multiple content types test:"),
            _image(),
            _embedded(
                "test://mixed-content-resource",
                "application/json",
                json.dumps({"test": "data", "value": 123}, separators=(",", ":")),
            ),
        ]
    elif name == "test_tool_with_logging":  # tools-call-with-logging: 3 info logs, ~50 ms apart
        for i, message in enumerate(
            ["Tool execution started", "Tool processing data", "Tool execution completed"]
        ):
            if i:
                await anyio.sleep(0.05)
            await session.send_log_message("info", message, related_request_id=request_id)
        content = [_text("Tool with logging executed successfully")]
    elif name == "test_error_handling":  # tools-call-error: a tool error, not a JSON-RPC one
        return types.CallToolResult(
            content=[_text("This tool intentionally returns an error for testing")], is_error=True
        )
    elif name == "test_tool_with_progress":  # tools-call-with-progress: 0, 50, 100 of 100
        for i, progress in enumerate([0, 50, 100]):
            if i:
                await anyio.sleep(0.05)
            await session.report_progress(progress, 100)
        content = [_text("Tool with progress executed successfully")]
    elif name == "test_sampling":  # tools-call-sampling: a server-to-client request
        try:
            sampled = await session.create_message(
                [types.SamplingMessage(role="user", content=_text(str(args.get("prompt", ""))))],
                max_tokens=100,
                related_request_id=request_id,
            )
        except MCPError as exc:  # as the reference servers do: the refusal becomes text
            return types.CallToolResult(content=[_text(f"Sampling failed: {exc}")])
        reply = sampled.content
        text = reply.text if isinstance(reply, types.TextContent) else str(reply)
        content = [_text(f"LLM response: {text}")]
    elif name == "test_elicitation":  # tools-call-elicitation: a server-to-client request
        result = await session.elicit_form(
            str(args.get("message", "")), ELICITATION_SCHEMA, related_request_id=request_id
        )
        content = [_text(f"User response: {_elicited(result)}")]
    elif name in ("test_elicitation_sep1034_defaults", "test_elicitation_sep1330_enums"):
        # elicitation-sep1034-defaults, elicitation-sep1330-enums
        schema = SEP1034_SCHEMA if name.endswith("defaults") else SEP1330_SCHEMA
        result = await session.elicit_form(
            "Please review and update the form fields", schema, related_request_id=request_id
        )
        content = [_text(f"Elicitation completed: {_elicited(result)}")]
    elif name == "test_reconnection":
        # server-sse-polling: close the POST's SSE stream mid-call; the client reconnects
        # (GET with Last-Event-ID) and gets the result replayed from the event store. The
        # SDK offers the close only to clients of protocol >= 2025-11-25 (the header).
        if ctx.close_sse_stream is not None:
            await anyio.sleep(0.1)
            await ctx.close_sse_stream()
        await anyio.sleep(0.2)
        content = [_text("Reconnection test completed")]
    elif name == "json_schema_2020_12_tool":  # json-schema-2020-12 (listing only)
        content = [_text(f"Received: {json.dumps(args)}")]
    else:
        raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {name}")
    return types.CallToolResult(content=content)


# -- resources -----------------------------------------------------------------------------

STATIC_TEXT = "This is the content of the static text resource."
RECEIVED_META = "test://received-meta"  # unlisted: the read answers the _meta it came with
TEMPLATE = re.compile(r"^test://template/(?P<id>[^/]+)/data$")
SUBSCRIPTIONS: set[str] = set()


async def list_resources(
    ctx: Ctx, params: types.PaginatedRequestParams | None
) -> types.ListResourcesResult:
    # resources-list: direct resources only, each with uri, name and description
    return types.ListResourcesResult(
        resources=[
            types.Resource(
                uri="test://static-text",
                name="static-text",
                description="A static text resource",
                mime_type="text/plain",
            ),
            types.Resource(
                uri="test://static-binary",
                name="static-binary",
                description="A static binary resource (a PNG)",
                mime_type="image/png",
            ),
            types.Resource(
                uri="test://watched-resource",
                name="watched-resource",
                description="A resource to subscribe to",
                mime_type="text/plain",
            ),
        ]
    )


async def list_resource_templates(
    ctx: Ctx, params: types.PaginatedRequestParams | None
) -> types.ListResourceTemplatesResult:
    # resources-templates-read
    return types.ListResourceTemplatesResult(
        resource_templates=[
            types.ResourceTemplate(
                uri_template="test://template/{id}/data",
                name="template-data",
                description="Data for an id",
                mime_type="application/json",
            )
        ]
    )


async def read_resource(
    ctx: Ctx, params: types.ReadResourceRequestParams
) -> types.ReadResourceResult:
    uri = str(params.uri)
    contents: list[types.TextResourceContents | types.BlobResourceContents]
    if uri == "test://static-text":  # resources-read-text
        contents = [types.TextResourceContents(uri=uri, mime_type="text/plain", text=STATIC_TEXT)]
    elif uri == "test://static-binary":  # resources-read-binary
        contents = [types.BlobResourceContents(uri=uri, mime_type="image/png", blob=PNG_B64)]
    elif uri == "test://watched-resource":  # resources-subscribe, resources-unsubscribe
        contents = [
            types.TextResourceContents(uri=uri, mime_type="text/plain", text="Watched resource.")
        ]
    elif uri == RECEIVED_META:  # not the suite's: a test's probe of what a gate forwards
        meta = dict(params.meta or {})
        text = json.dumps(meta, sort_keys=True, default=str)
        contents = [types.TextResourceContents(uri=uri, mime_type="application/json", text=text)]
    elif match := TEMPLATE.match(uri):  # resources-templates-read: {id} substituted
        id_ = match["id"]
        data = {"id": id_, "templateTest": True, "data": f"Data for ID: {id_}"}
        text = json.dumps(data, separators=(",", ":"))
        contents = [types.TextResourceContents(uri=uri, mime_type="application/json", text=text)]
    else:
        raise MCPError(-32002, f"Resource not found: {uri}", {"uri": uri})
    return types.ReadResourceResult(contents=contents)


async def subscribe(ctx: Ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
    # resources-subscribe
    SUBSCRIPTIONS.add(str(params.uri))
    return types.EmptyResult()


async def unsubscribe(ctx: Ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    # resources-unsubscribe
    SUBSCRIPTIONS.discard(str(params.uri))
    return types.EmptyResult()


# -- prompts -------------------------------------------------------------------------------


def _argument(name: str, description: str) -> types.PromptArgument:
    return types.PromptArgument(name=name, description=description, required=True)


PROMPTS = [
    types.Prompt(name="test_simple_prompt", description="A simple prompt without arguments"),
    types.Prompt(
        name="test_prompt_with_arguments",
        description="A prompt with two required arguments",
        arguments=[
            _argument("arg1", "First test argument"),
            _argument("arg2", "Second test argument"),
        ],
    ),
    types.Prompt(
        name="test_prompt_with_embedded_resource",
        description="A prompt that embeds a resource",
        arguments=[_argument("resourceUri", "URI of the resource to embed")],
    ),
    types.Prompt(name="test_prompt_with_image", description="A prompt with an image"),
    *input_required.PROMPTS,
]


async def list_prompts(
    ctx: Ctx, params: types.PaginatedRequestParams | None
) -> types.ListPromptsResult:
    # prompts-list
    return types.ListPromptsResult(prompts=PROMPTS)


def _user(content: Any) -> types.PromptMessage:
    return types.PromptMessage(role="user", content=content)


async def get_prompt(
    ctx: Ctx, params: types.GetPromptRequestParams
) -> types.GetPromptResult | types.InputRequiredResult:
    args = params.arguments or {}
    if params.name == input_required.PROMPT:  # input-required-result-non-tool-request
        return input_required.get_prompt(params)
    if params.name == "test_simple_prompt":  # prompts-get-simple
        messages = [_user(_text("This is a simple prompt for testing."))]
    elif params.name == "test_prompt_with_arguments":  # prompts-get-with-args
        text = f"Prompt with arguments: arg1='{args.get('arg1')}', arg2='{args.get('arg2')}'"
        messages = [_user(_text(text))]
    elif params.name == "test_prompt_with_embedded_resource":  # prompts-get-embedded-resource
        uri = args.get("resourceUri", "test://example-resource")
        messages = [
            _user(_embedded(uri, "text/plain", "Embedded resource content for testing.")),
            _user(_text("Please process the embedded resource above.")),
        ]
    elif params.name == "test_prompt_with_image":  # prompts-get-with-image
        messages = [_user(_image()), _user(_text("Please analyze the image above."))]
    else:
        raise MCPError(types.INVALID_PARAMS, f"Unknown prompt: {params.name}")
    return types.GetPromptResult(messages=messages)


# -- completion, logging -------------------------------------------------------------------

COMPLETIONS = {"arg1": ["paris", "park", "party"], "arg2": ["hello", "help", "world"]}


async def complete(ctx: Ctx, params: types.CompleteRequestParams) -> types.CompleteResult:
    # completion-complete: the argument's values that start with what was typed
    ref, argument = params.ref, params.argument
    candidates: list[str] = []
    if isinstance(ref, types.PromptReference) and ref.name == "test_prompt_with_arguments":
        candidates = COMPLETIONS.get(argument.name, [])
    values = [v for v in candidates if v.startswith(argument.value)]
    return types.CompleteResult(
        completion=types.Completion(values=values, total=len(values), has_more=False)
    )


async def set_logging_level(ctx: Ctx, params: types.SetLevelRequestParams) -> types.EmptyResult:
    # logging-set-level: accepted (the tools log at info, what the scenarios ask for)
    return types.EmptyResult()


def build_server() -> Server[Any]:
    server: Server[Any] = Server(
        "conformance-fixture",
        version="1.0.0",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_resource_templates,
        on_read_resource=read_resource,
        on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
        on_completion=complete,
        on_set_logging_level=set_logging_level,
    )
    # input-required-result-tampered-state: a requestState this process did not seal is
    # refused (-32602) before any handler sees it.
    security = RequestStateSecurity.ephemeral()
    server.middleware.append(RequestStateBoundary(security, default_audience="conformance-fixture"))
    return server


# -- transports ----------------------------------------------------------------------------


class InMemoryEventStore(EventStore):
    """Every SSE event of the process, in order; a reconnecting client (Last-Event-ID) gets
    the rest of its stream replayed (server-sse-polling)."""

    def __init__(self) -> None:
        self._events: list[tuple[EventId, StreamId, JSONRPCMessage | None]] = []
        self._ids = itertools.count(1)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event_id = str(next(self._ids))
        self._events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        index = next((i for i, e in enumerate(self._events) if e[0] == last_event_id), None)
        if index is None:
            return None
        stream_id = self._events[index][1]
        for event_id, stream, message in self._events[index + 1 :]:
            if stream == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id


def serve_http(port: int) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    port = sock.getsockname()[1]
    hosts = [f"127.0.0.1:{port}", f"localhost:{port}"]
    app = build_server().streamable_http_app(
        streamable_http_path="/mcp",
        event_store=InMemoryEventStore(),
        retry_interval=100,  # ms: how soon a client whose stream was closed comes back
        transport_security=TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=hosts,
            allowed_origins=[f"http://{host}" for host in hosts],
        ),
    )
    print(f"http://127.0.0.1:{port}/mcp", flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


async def serve_stdio() -> None:
    from mcp.server.stdio import stdio_server

    server = build_server()
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--http", type=int, metavar="PORT", help="streamable HTTP on 127.0.0.1")
    mode.add_argument("--stdio", action="store_true", help="stdio")
    args = parser.parse_args(argv)
    if args.stdio:
        asyncio.run(serve_stdio())
    else:
        serve_http(args.http)


if __name__ == "__main__":
    main()
