"""The floor under ``evidence mcp proxy`` for bench/proxy.py: an MCP server on stdio that
forwards ``tools/list`` and ``tools/call`` to an upstream (a command, after the script's
own arguments) with the same SDK and the same forwarding call as the proxy, and does
nothing else — no gate, no ledger. What it adds to a direct call is what any stdio MCP
hop costs; what the proxy adds on top is the plane's work.

    python bench/mcp_passthrough.py UPSTREAM_COMMAND...
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client, stdio_server
from mcp.server.lowlevel import Server


async def main(command: list[str]) -> None:
    params = StdioServerParameters(command=command[0], args=command[1:])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as upstream:
        await upstream.initialize()
        listed = await upstream.list_tools()

        async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            return listed

        async def on_call_tool(
            ctx: Any, params: types.CallToolRequestParams
        ) -> types.CallToolResult:
            request = types.CallToolRequest(
                params=types.CallToolRequestParams(name=params.name, arguments=params.arguments)
            )
            return await upstream.send_request(request, types.CallToolResult)

        server = Server("passthrough", on_list_tools=on_list_tools, on_call_tool=on_call_tool)
        async with stdio_server() as (agent_read, agent_write):
            await server.run(agent_read, agent_write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
