"""An MCP client transport on stdio whose memory is bounded: the SDK's own reads each line
of the server's stdout whole, so a server that answers with 64 MiB makes the client hold
64 MiB (and more, decoded). This one reads the server's stdout in chunks and holds at
most the larger of ``cap`` and ``PROTOCOL_CAP`` of any line.

``cap`` is the output cap of a tool's answer: an answer to a ``tools/call`` longer than
it is handed on as a small stand-in result, an MCP tool error, that names a
``Truncation`` the caller collects with ``take_truncation`` (the first ``cap`` bytes, the
size and the SHA-256 of the whole line), so it is recorded as a command's stdout over
its cap is; past what is held, the rest is drained (counted and hashed, never kept).
The protocol's own answers (``initialize``, ``tools/list``) are not output: they may be
as long as ``PROTOCOL_CAP``.

A drained line can be answered this way only when it is a response to a ``tools/call``
awaiting one: its ``id`` is read from the top level at either end of the line (the
Python SDK writes it first, the TypeScript SDK last). Any other line past what is held
is a protocol error, as the SDK reports a line that is not a message.

The server runs in a session of its own (its process group is killed at the end), with
the SDK's default environment plus ``env``; its stderr goes to ``errlog`` (by default,
and when ``errlog`` has no file descriptor, the process's own stderr).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import anyio
import mcp_types as types
from anyio.abc import Process
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

from ledger.events import Truncation

__all__ = ["TRUNCATED_META", "BoundedStdio", "bounded_stdio_client"]

# The stand-in result's ``_meta`` key; its value is the token ``take_truncation`` takes.
TRUNCATED_META = "evidence/truncated"
_CHUNK = 64 * 1024
_EDGE = 256  # bytes kept of a drained line's end, to find a trailing id in
_HEAD_ID = re.compile(
    rb'\A\s*\{\s*"jsonrpc"\s*:\s*"2\.0"\s*,\s*"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,128}")'
)
_TAIL_ID = re.compile(rb',\s*"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,128}")\s*\}\s*\Z')
_GRACE_S = 2.0
# What any line may hold in memory: the cap on a tool's answer applies to answers of
# ``tools/call`` only (``initialize`` or ``tools/list`` are the protocol, not output),
# but no line is held beyond the larger of the two.
PROTOCOL_CAP = 4 * 1024 * 1024
CALL = "tools/call"


class BoundedStdio:
    """The transport's state: requests awaiting an answer, and the truncations made."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.held = max(cap, PROTOCOL_CAP)  # the most of one line ever kept
        self.pending: dict[int | str, str] = {}  # request id -> its method
        self._truncations: dict[str, tuple[bytes, Truncation]] = {}

    def take_truncation(self, result: types.CallToolResult) -> tuple[bytes, Truncation] | None:
        """The kept prefix and ``Truncation`` of a stand-in result (None for a result the
        server sent: a token it made up names nothing)."""
        token = (result.meta or {}).get(TRUNCATED_META)
        if not isinstance(token, str):
            return None
        return self._truncations.pop(token, None)

    def stand_in(
        self, request_id: int | str, prefix: bytes, truncation: Truncation
    ) -> SessionMessage:
        token = secrets.token_hex(16)
        self._truncations[token] = (prefix, truncation)
        result = types.CallToolResult(
            content=[
                types.TextContent(
                    text=f"the server's answer was {truncation.size} bytes, over the "
                    f"output cap of {truncation.kept} bytes: only a prefix was kept"
                )
            ],
            is_error=True,
            _meta={TRUNCATED_META: token},
        )
        return SessionMessage(
            types.JSONRPCResponse(
                jsonrpc="2.0",
                id=request_id,
                result=result.model_dump(by_alias=True, mode="json", exclude_none=True),
            )
        )

    def over_cap(
        self, head: bytes, tail: bytes, truncation: Truncation
    ) -> SessionMessage | Exception:
        """The message a drained line (longer than ``held``) stands for: the stand-in for
        an awaited ``tools/call`` answer, else the protocol error it is."""
        found = _HEAD_ID.match(head) or _TAIL_ID.search(tail)
        request_id = _id_of(found.group(1)) if found else None
        if request_id is None or self.pending.get(request_id) != CALL:
            return ValueError(
                f"a message of {truncation.size} bytes, over the cap of {self.held}, that "
                "answers no tool call awaiting an answer"
            )
        del self.pending[request_id]
        return self.stand_in(request_id, head[: self.cap], truncation)

    def whole(self, line: bytes) -> SessionMessage | Exception:
        """A line held whole: the message it is, or the stand-in for a ``tools/call``
        answer longer than the cap."""
        try:
            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except ValueError as exc:
            return exc
        if not isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            return SessionMessage(message)
        if message.id is None:  # an error about no request in particular
            return SessionMessage(message)
        method = self.pending.pop(message.id, None)
        if method == CALL and len(line) > self.cap:
            digest = hashlib.sha256(line).hexdigest()
            truncation = Truncation(kept=self.cap, size=len(line), sha256=digest)
            return self.stand_in(message.id, line[: self.cap], truncation)
        return SessionMessage(message)


def _id_of(raw: bytes) -> int | str | None:
    text = raw.decode("utf-8", "replace")
    return text[1:-1] if text.startswith('"') else int(text)


@contextlib.asynccontextmanager
async def bounded_stdio_client(
    argv: Sequence[str],
    *,
    cap: int,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    errlog: IO[Any] | None = None,
) -> AsyncIterator[tuple[Any, Any, BoundedStdio]]:
    """Start the server ``argv`` and yield (read stream, write stream, state) as the
    SDK's ``stdio_client`` yields its streams. Raises ``OSError`` when it cannot start."""
    state = BoundedStdio(cap)
    process = await anyio.open_process(
        list(argv),
        env={**get_default_environment(), **(env or {})},
        cwd=cwd,
        # A stream without a descriptor (a test runner's capture): the process's own
        # stderr, where the SDK's transport sends it too.
        stderr=errlog if errlog is not None and _has_fileno(errlog) else None,
        start_new_session=True,
    )
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)

    async def read() -> None:
        assert process.stdout is not None
        held = state.held
        kept = bytearray()  # the current line, while within what is held
        over: Any = None  # the hash of a line beyond that, while it is drained
        size = 0
        tail = b""
        async with to_session:
            with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, OSError):
                while True:
                    chunk = await process.stdout.receive(_CHUNK)
                    while chunk:
                        end = chunk.find(b"\n")
                        piece, chunk = (chunk, b"") if end < 0 else (chunk[:end], chunk[end + 1 :])
                        if over is None and len(kept) + len(piece) > held:
                            over = hashlib.sha256(kept)
                            size = len(kept)
                        if over is None:
                            kept += piece
                        else:
                            over.update(piece)
                            size += len(piece)
                            tail = (tail + piece)[-_EDGE:]
                            if len(kept) < cap:
                                kept += piece[: cap - len(kept)]
                        if end < 0:
                            break
                        if over is None:
                            message = state.whole(bytes(kept)) if kept.strip() else None
                        else:
                            truncation = Truncation(kept=cap, size=size, sha256=over.hexdigest())
                            message = state.over_cap(bytes(kept), tail, truncation)
                        kept, over, size, tail = bytearray(), None, 0, b""
                        if message is not None:
                            await to_session.send(message)

    async def write() -> None:
        assert process.stdin is not None
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async with from_session:
                async for outgoing in from_session:
                    message = outgoing.message
                    if isinstance(message, types.JSONRPCRequest):
                        state.pending[message.id] = message.method
                    data = message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")
        await to_session.aclose()  # the server cannot be written to: the session ends

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read)
        tasks.start_soon(write)
        try:
            yield read_stream, write_stream, state
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
            tasks.cancel_scope.cancel()


def _has_fileno(stream: IO[Any]) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return False
    return True


async def _stop(process: Process) -> None:
    """Close its stdin, give it a moment, then end its whole process group."""
    with contextlib.suppress(Exception):
        if process.stdin is not None:
            await process.stdin.aclose()
    with anyio.move_on_after(_GRACE_S):
        await process.wait()
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        with anyio.move_on_after(_GRACE_S):
            await process.wait()
            return
