"""A streamable-HTTP front for a stdio MCP server, for the conformance suite (whose
client speaks HTTP only) to reach `evidence mcp proxy` (which speaks stdio to its agent).

``python -m tests.conformance.bridge --port 0 -- COMMAND...``: prints its URL as the first
line of stdout, then serves ``/mcp``. Each MCP session (an ``initialize`` without a
session id) starts its own COMMAND and relays JSON-RPC messages both ways, unchanged,
through the official SDK's server transport (sessions, SSE streams, resumption with
an in-memory event store, the DNS-rebinding check of ``Host`` and ``Origin``). What the
child sends while a request of the client is open (a notification, a request of its
own) rides that request's stream, as a server on HTTP sends it; with several open, the
latest (the proxy itself relates such messages to its latest call).

Test code, not the product's: the door the suite checks here is the SDK's; what the
suite checks through it is the stdio server behind it.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import uuid
from collections.abc import Sequence
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from anyio.abc import TaskStatus
from mcp import StdioServerParameters, stdio_client
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.message import ServerMessageMetadata, SessionMessage
from starlette.types import Receive, Scope, Send

from tests.conformance.fixture_server import InMemoryEventStore


def security(port: int) -> TransportSecuritySettings:
    hosts = [f"127.0.0.1:{port}", f"localhost:{port}"]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{host}" for host in hosts],
    )


async def relay(
    command: Sequence[str], transport: StreamableHTTPServerTransport, *, task_status: TaskStatus
) -> None:
    """One session: the child process and the two pumps between it and the transport."""
    params = StdioServerParameters(command=command[0], args=list(command[1:]), env=dict(os.environ))
    async with (
        transport.connect() as (http_read, http_write),
        stdio_client(params) as (child_read, child_write),
        anyio.create_task_group() as pumps,
    ):
        open_requests: list[types.RequestId] = []
        task_status.started()

        async def to_child() -> None:
            async for message in http_read:
                if isinstance(message, Exception):
                    continue
                root = message.message
                if isinstance(root, types.JSONRPCRequest):
                    open_requests.append(root.id)
                await child_write.send(SessionMessage(root))
            pumps.cancel_scope.cancel()

        async def to_client() -> None:
            async for message in child_read:
                if isinstance(message, Exception):
                    continue
                root = message.message
                if isinstance(root, types.JSONRPCResponse | types.JSONRPCError):
                    if root.id in open_requests:
                        open_requests.remove(root.id)
                    await http_write.send(SessionMessage(root))
                    continue
                related = open_requests[-1] if open_requests else None
                metadata = ServerMessageMetadata(related_request_id=related)
                await http_write.send(SessionMessage(root, metadata=metadata))
            pumps.cancel_scope.cancel()

        pumps.start_soon(to_child)
        pumps.start_soon(to_client)


class Bridge:
    """The ASGI app: ``/mcp``, one transport and one child per session."""

    def __init__(self, command: Sequence[str], port: int) -> None:
        self.command, self.port = list(command), port
        self.sessions: dict[str, StreamableHTTPServerTransport] = {}
        self.tasks: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http" or scope["path"] != "/mcp":
            await _plain(send, 404, b"not found")
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        session = headers.get(MCP_SESSION_ID_HEADER.lower())
        if session is not None:
            transport = self.sessions.get(session)
            if transport is None:
                await _plain(send, 404, b"unknown session")
                return
        elif scope["method"] == "POST":
            transport = await self._new_session()
        else:
            await _plain(send, 400, b"no session")
            return
        await transport.handle_request(scope, receive, send)

    async def _new_session(self) -> StreamableHTTPServerTransport:
        session = uuid.uuid4().hex
        transport = StreamableHTTPServerTransport(
            session, event_store=InMemoryEventStore(), security_settings=security(self.port)
        )
        self.sessions[session] = transport
        await self.tasks.start(_run, self.command, transport)
        return transport

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        message = await receive()
        assert message["type"] == "lifespan.startup"
        async with anyio.create_task_group() as tasks:
            self.tasks = tasks
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
            tasks.cancel_scope.cancel()
        await send({"type": "lifespan.shutdown.complete"})


async def _run(
    command: Sequence[str],
    transport: StreamableHTTPServerTransport,
    *,
    task_status: TaskStatus = anyio.TASK_STATUS_IGNORED,
) -> None:
    await relay(command, transport, task_status=task_status)


async def _plain(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": body})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    sock = socket.socket()
    sock.bind(("127.0.0.1", args.port))
    port = sock.getsockname()[1]
    print(f"http://127.0.0.1:{port}/mcp", flush=True)
    config = uvicorn.Config(Bridge(command, port), log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main(sys.argv[1:])
