"""A small MCP server (official SDK) for tests/commands/cli/test_mcp_proxy.py and bench/proxy.py:
``add`` (input and output schemas), ``bad`` (writes a file in its working directory,
then returns off-schema structured output),
``plain`` (no output schema: a text result), ``loose`` (no output schema: a result
with ``structuredContent``, as MCP allows), ``fail`` (an output schema, but answers with
a tool error of its own, as a server does for a bad timezone), ``huge`` (a text result of
``size`` bytes), ``crash`` (the process dies), ``slow`` (never
answers in time), ``grow`` (adds a tool
and says the tool list changed); two tools the proxy must not offer (a name with a
control character, a schema that reaches outside itself).

Every call it receives is appended to the file named by argv[1], with an id of the
server process that answered it (a warm server answers several). On stdio by default;
``--http PORT`` serves streamable HTTP on 127.0.0.1:PORT/mcp instead."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import uuid
from typing import Any

import anyio
import mcp_types as types
from mcp import stdio_server
from mcp.server.lowlevel import Server

COUNT_FILE = sys.argv[1]
SERVER_ID = uuid.uuid4().hex  # the pid may be another namespace's

TOOLS = [
    types.Tool(
        name="add",
        description="Add two integers.",
        input_schema={
            "type": "object",
            "required": ["a", "b"],
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        },
        output_schema={
            "type": "object",
            "required": ["sum"],
            "properties": {"sum": {"type": "integer"}},
        },
    ),
    types.Tool(
        name="bad",
        description="Returns structured output that does not match its schema.",
        input_schema={"type": "object", "properties": {}},
        output_schema={
            "type": "object",
            "required": ["ok"],
            "properties": {"ok": {"type": "boolean"}},
        },
    ),
    types.Tool(
        name="plain",
        description="Answers text (no output schema).",
        input_schema={"type": "object", "properties": {"who": {"type": "string"}}},
    ),
    types.Tool(
        name="loose",
        description="Answers text and structured content (no output schema).",
        input_schema={"type": "object", "properties": {}},
    ),
    types.Tool(
        name="fail",
        description="Declares its output, then answers with a tool error.",
        input_schema={"type": "object", "properties": {"timezone": {"type": "string"}}},
        output_schema={
            "type": "object",
            "required": ["time"],
            "properties": {"time": {"type": "string"}},
        },
    ),
    types.Tool(
        name="huge",
        description="Answers a text of `size` bytes.",
        input_schema={"type": "object", "properties": {"size": {"type": "integer"}}},
    ),
    types.Tool(name="slow", input_schema={"type": "object", "properties": {}}),
    types.Tool(
        name="flood",
        description="Sends `count` log messages of `size` bytes, asks `asks` samplings.",
        input_schema={
            "type": "object",
            "properties": {k: {"type": "integer"} for k in ("count", "size", "asks")},
        },
    ),
    types.Tool(name="grow", input_schema={"type": "object", "properties": {}}),
    types.Tool(name="evil\x1b[2Jname", input_schema={"type": "object", "properties": {}}),
    types.Tool(
        name="remote",
        input_schema={
            "type": "object",
            "properties": {"x": {"$ref": "https://example.com/schema.json"}},
        },
    ),
    types.Tool(
        name="crash",
        description="The server process dies.",
        input_schema={"type": "object", "properties": {}},
        output_schema={"type": "object", "properties": {}},
    ),
]


async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    with open(COUNT_FILE, "a") as f:
        called = {"tool": params.name, "arguments": params.arguments, "server": SERVER_ID}
        f.write(json.dumps(called) + "\n")
    args = params.arguments or {}
    if params.name == "add":
        total = args["a"] + args["b"]
        return types.CallToolResult(
            content=[types.TextContent(text=str(total))], structured_content={"sum": total}
        )
    if params.name == "bad":
        # It writes in its working directory (the plan's sandbox, behind the proxy), then
        # answers off-schema: the write must not survive the failed output gate.
        with open("bad-was-here.txt", "w") as f:
            f.write("written by a call whose output gate fails\n")
        return types.CallToolResult(
            content=[types.TextContent(text="yes")], structured_content={"ok": "yes"}
        )
    if params.name == "plain":
        return types.CallToolResult(content=[types.TextContent(text=f"hello {args.get('who')}")])
    if params.name == "loose":
        return types.CallToolResult(
            content=[types.TextContent(text="both")], structured_content={"any": ["thing"]}
        )
    if params.name == "fail":
        # It writes first: a failed call keeps nothing in the sandbox.
        with open("fail-was-here.txt", "w") as f:
            f.write("written by a call that failed\n")
        return types.CallToolResult(
            content=[types.TextContent(text=f"Invalid timezone: {args.get('timezone')}")],
            is_error=True,
        )
    if params.name == "huge":
        return types.CallToolResult(content=[types.TextContent(text="x" * args["size"])])
    if params.name == "crash":
        os._exit(3)
    if params.name == "flood":  # what an agent could make a server do to a call
        for _ in range(args.get("count", 0)):
            await ctx.session.send_log_message(
                "info", "x" * args.get("size", 0), related_request_id=ctx.request_id
            )
        for _ in range(args.get("asks", 0)):
            with contextlib.suppress(Exception):  # refused: the plane's client offers none
                await ctx.session.create_message(
                    messages=[
                        types.SamplingMessage(role="user", content=types.TextContent(text="hi"))
                    ],
                    max_tokens=1,
                    related_request_id=ctx.request_id,
                )
        return types.CallToolResult(content=[types.TextContent(text="flooded")])
    if params.name == "slow":
        time.sleep(30)
    if params.name == "grow":
        if not any(t.name == "extra" for t in TOOLS):
            TOOLS.append(
                types.Tool(name="extra", input_schema={"type": "object", "properties": {}})
            )
        await ctx.session.send_tool_list_changed()
        return types.CallToolResult(content=[types.TextContent(text="grown")])
    if params.name == "extra":
        return types.CallToolResult(content=[types.TextContent(text="extra")])
    raise ValueError(f"unknown tool {params.name}")


SERVER = Server("test-upstream", on_list_tools=on_list_tools, on_call_tool=on_call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await SERVER.run(read, write, SERVER.create_initialization_options())


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[2] == "--http":
        import uvicorn

        uvicorn.run(
            SERVER.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[3]), log_level="error"
        )
    else:
        anyio.run(main)
