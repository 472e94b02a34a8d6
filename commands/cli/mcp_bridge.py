"""``evidence mcp connect``: the service's MCP gate (``/mcp``) for an MCP client that
speaks stdio — an agent CLI that launches its servers — over the service's unix socket
or https, with the agent's credential added to every request.

An agent CLI's own HTTP transport sends its bearer credential to whatever answers at
the URL it was given; this bridge checks who answers first, as ``evidence-hook`` does
(``commands.hook_client``): a unix socket only where no other user could have put it
and only with a listener of its owner, https only to a trusted (or pinned,
``EVIDENCE_SERVER_CA``) certificate, never plain http. Then it relays each MCP message
as it is, both ways, until either side ends.
"""

from __future__ import annotations

import os
import ssl
from typing import Any

from commands.hook_client import Server, connect_checked

CONNECT_TIMEOUT_S = 30.0


async def relay(server: Server, token: str, door: str = "/mcp") -> None:
    """Relay MCP between this process's stdio and the service's ``door`` (``/mcp`` or
    ``/mcp/SERVER``) at ``server`` (already checked to be who it says), with
    ``Authorization: Bearer token``."""
    import anyio
    import httpx2
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server.stdio import stdio_server

    if server.unix:
        transport = httpx2.AsyncHTTPTransport(uds=server.unix)
        base = "http://localhost"
    else:
        pinned = os.environ.get("EVIDENCE_SERVER_CA") or None
        transport = httpx2.AsyncHTTPTransport(verify=ssl.create_default_context(cafile=pinned))
        base = server.url
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(transport=transport, headers=headers, timeout=None) as http,
        streamable_http_client(f"{base}{door}", http_client=http) as (from_service, to_service),
        stdio_server() as (from_client, to_client),
        anyio.create_task_group() as group,
    ):

        async def pump(source: Any, sink: Any) -> None:
            async with sink:
                async for message in source:
                    await sink.send(message)
            group.cancel_scope.cancel()  # one side ended: so does the bridge

        group.start_soon(pump, from_client, to_service)
        group.start_soon(pump, from_service, to_client)


def check(server: Server) -> None:
    """Who answers at ``server``, checked before a credential goes there (``Blocked``
    otherwise); the connection made for the check is closed again."""
    connect_checked(server, CONNECT_TIMEOUT_S).close()
