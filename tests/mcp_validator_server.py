"""A small MCP server (official SDK) whose tools are validations, for
tests/commands/plane/test_mcp_backed.py: each returns the structured return ``{passed, message?,
data?}`` in ``structuredContent``, reading the directory it was started in (the plane
starts it in the validation's throwaway copy of the sandbox).

- ``status``: passes when ``status.txt`` (or the file the ``file`` argument names)
  says ``good``;
- ``scribble``: writes ``scribble.txt`` where it runs, then passes (a read-only
  violation);
- ``refuse``: a tool error (``isError``) that still carries a passing return;
- ``loose``: ``passed`` is the string ``"yes"`` (malformed).

On stdio by default; ``--http PORT`` serves streamable HTTP on 127.0.0.1:PORT/mcp (its
working directory is then wherever it was started)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import stdio_server
from mcp.server.lowlevel import Server

RESULT = {
    "type": "object",
    "required": ["passed"],
    "properties": {
        "passed": {"type": "boolean"},
        "message": {"type": "string"},
        "data": {"type": "object"},
    },
}
TOOLS = [
    types.Tool(
        name="status",
        description="Passes when the status file says good.",
        input_schema={"type": "object", "properties": {"file": {"type": "string"}}},
        output_schema=RESULT,
    ),
    types.Tool(name="scribble", input_schema={"type": "object", "properties": {}}),
    types.Tool(name="refuse", input_schema={"type": "object", "properties": {}}),
    types.Tool(name="loose", input_schema={"type": "object", "properties": {}}),
]


async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


def _result(value: dict[str, Any], *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=str(value.get("message", "")))],
        structured_content=value,
        is_error=error,
    )


async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    if params.name == "status":
        name = str(args.get("file", "status.txt"))
        said = Path(name).read_text().strip() if Path(name).exists() else "missing"
        return _result(
            {"passed": said == "good", "message": f"status is {said}", "data": {"file": name}}
        )
    if params.name == "scribble":
        Path("scribble.txt").write_text("was here\n")
        return _result({"passed": True, "message": "all fine"})
    if params.name == "refuse":
        return _result({"passed": True, "message": "cannot check today"}, error=True)
    if params.name == "loose":
        return _result({"passed": "yes"})
    raise ValueError(f"unknown tool {params.name}")


SERVER = Server("checks", on_list_tools=on_list_tools, on_call_tool=on_call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await SERVER.run(read, write, SERVER.create_initialization_options())


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        import uvicorn

        uvicorn.run(
            SERVER.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="error"
        )
    else:
        anyio.run(main)
