"""A small MCP server (official SDK) working on the files of the directory it was started
in, for tests/commands/service/test_service_mcp.py: the plane starts it in the plan's sandbox, so
what it
writes is the plan's work until Apply.

- ``write_file``: writes ``text`` to the relative ``path`` (declares its output:
  ``{"written": path, "bytes": n}``);
- ``read_file``: answers the file's text (no output schema: an MCP tool result).

Every call it receives is appended to the file named by argv[1]."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import stdio_server
from mcp.server.lowlevel import Server

LOG = sys.argv[1]
PATH = {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"}

TOOLS = [
    types.Tool(
        name="write_file",
        description="Write a text file in the working directory.",
        input_schema={
            "type": "object",
            "required": ["path", "text"],
            "properties": {"path": PATH, "text": {"type": "string"}},
        },
        output_schema={
            "type": "object",
            "required": ["written", "bytes"],
            "properties": {"written": {"type": "string"}, "bytes": {"type": "integer"}},
        },
    ),
    types.Tool(
        name="read_file",
        description="Read a text file of the working directory.",
        input_schema={"type": "object", "required": ["path"], "properties": {"path": PATH}},
    ),
]


async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    with open(LOG, "a") as f:
        f.write(json.dumps({"tool": params.name, "arguments": params.arguments}) + "\n")
    args = params.arguments or {}
    path = Path(args["path"])
    if params.name == "write_file":
        path.write_text(args["text"])
        written = {"written": str(path), "bytes": len(args["text"].encode())}
        return types.CallToolResult(
            content=[types.TextContent(text=json.dumps(written))], structured_content=written
        )
    if not path.exists():
        return types.CallToolResult(
            content=[types.TextContent(text=f"no such file: {path}")], is_error=True
        )
    return types.CallToolResult(content=[types.TextContent(text=path.read_text())])


SERVER = Server("test-files", on_list_tools=on_list_tools, on_call_tool=on_call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await SERVER.run(read, write, SERVER.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
