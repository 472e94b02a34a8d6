"""An HTTP forwarder that adds the agent's bearer credential to every request, for the
conformance suite (whose client sends no ``Authorization`` header and has no option to)
to reach `evidence serve`'s MCP doors.

``python -m tests.conformance.bearer --port 0 --to HOST:PORT --path /mcp/SERVER``, with
the credential in ``EVIDENCE_BEARER``: prints ``http://127.0.0.1:PORT/mcp/SERVER`` as the
first line of stdout, then forwards every connection to HOST:PORT byte for byte, but for
one header line: each request's ``Authorization`` becomes ``Bearer CREDENTIAL``. The
request's ``Host`` and ``Origin`` pass unchanged, so the service's own door judges them
(dns-rebinding-protection). Answers (JSON, SSE streams) pass as they come.

Test code, not the product's: an MCP client that can send a header sends it itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket

_HEAD_END = b"\r\n\r\n"
_MAX_HEAD = 64 * 1024


async def _request_heads(
    client: asyncio.StreamReader, upstream: asyncio.StreamWriter, bearer: bytes
) -> None:
    """Each request of the connection: its head with the credential, then its body;
    the upstream connection closed once the client's ends."""
    try:
        await _requests(client, upstream, bearer)
    finally:
        upstream.close()


async def _requests(
    client: asyncio.StreamReader, upstream: asyncio.StreamWriter, bearer: bytes
) -> None:
    while True:
        try:
            head = await client.readuntil(_HEAD_END)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            break
        lines = head[: -len(_HEAD_END)].split(b"\r\n")
        kept = [lines[0]] + [
            line for line in lines[1:] if not line.lower().startswith(b"authorization:")
        ]
        kept.append(b"Authorization: Bearer " + bearer)
        upstream.write(b"\r\n".join(kept) + _HEAD_END)
        fields = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(b":") for line in lines[1:])
        }
        if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
            await _chunks(client, upstream)
        else:
            left = int(fields.get(b"content-length", b"0") or 0)
            while left > 0:
                data = await client.read(min(left, 65536))
                if not data:
                    return
                upstream.write(data)
                left -= len(data)
        await upstream.drain()


async def _chunks(client: asyncio.StreamReader, upstream: asyncio.StreamWriter) -> None:
    """A chunked body, passed on as it is (sizes, chunks, the empty last one)."""
    while True:
        size_line = await client.readuntil(b"\r\n")
        upstream.write(size_line)
        size = int(size_line.split(b";")[0].strip(), 16)
        upstream.write(await client.readexactly(size + 2))
        if size == 0:
            return


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()


async def _serve(port: int, to: str, path: str, bearer: bytes) -> None:
    host, _, to_port = to.rpartition(":")

    async def connection(client: asyncio.StreamReader, answer: asyncio.StreamWriter) -> None:
        reader, writer = await asyncio.open_connection(host, int(to_port), limit=_MAX_HEAD)
        try:
            await asyncio.gather(_request_heads(client, writer, bearer), _copy(reader, answer))
        finally:
            for end in (writer, answer):
                end.close()

    sock = socket.create_server(("127.0.0.1", port))
    server = await asyncio.start_server(connection, sock=sock, limit=_MAX_HEAD)
    print(f"http://127.0.0.1:{sock.getsockname()[1]}{path}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--to", required=True, help="HOST:PORT of the service")
    parser.add_argument("--path", default="/mcp")
    args = parser.parse_args(argv)
    bearer = os.environ["EVIDENCE_BEARER"].encode()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.port, args.to, args.path, bearer))


if __name__ == "__main__":
    main()
