"""A small MCP server (official SDK, stdio) for tests/test_mcp_proxy.py: ``add`` (input
and output schemas), ``bad`` (returns off-schema structured output), ``crash`` (the
process dies). Every call it receives is appended to the file named by argv[1]."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp import stdio_server
from mcp.server.lowlevel import Server

COUNT_FILE = sys.argv[1]

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
        f.write(json.dumps({"tool": params.name, "arguments": params.arguments}) + "\n")
    args = params.arguments or {}
    if params.name == "add":
        total = args["a"] + args["b"]
        return types.CallToolResult(
            content=[types.TextContent(text=str(total))], structured_content={"sum": total}
        )
    if params.name == "bad":
        return types.CallToolResult(
            content=[types.TextContent(text="yes")], structured_content={"ok": "yes"}
        )
    if params.name == "crash":
        os._exit(3)
    raise ValueError(f"unknown tool {params.name}")


async def main() -> None:
    server = Server("test-upstream", on_list_tools=on_list_tools, on_call_tool=on_call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
