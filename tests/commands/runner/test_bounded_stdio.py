"""The MCP client transport with bounded memory (commands/runner/bounded_stdio.py), with a
real server process that answers over the cap, and what the plane takes of an MCP result
(``tool_output``, ``is_tool_error``)."""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.shared.message import SessionMessage

from commands.runner.bounded_stdio import TRUNCATED_META, BoundedStdio, bounded_stdio_client
from commands.runner.mcp_client import is_tool_error, tool_output
from ledger.events import Truncation

# A server that answers each request line with the line its params name: "small" (a
# result within any cap), "first"/"last" (an oversized result, the id written first as the
# Python SDK writes it, or last as the TypeScript SDK does), "stray" (a message longer
# than any line is held, that answers nothing).
SERVER = r"""
import json, sys
for line in sys.stdin:
    request = json.loads(line)
    rid, kind = request["id"], request["params"]["name"]
    big = {"content": [{"type": "text", "text": "x" * 300000}]}
    if kind == "small":
        out = {"jsonrpc": "2.0", "id": rid, "result": {"content": []}}
    elif kind == "first":
        out = {"jsonrpc": "2.0", "id": rid, "result": big}
    elif kind == "last":
        out = {"result": big, "jsonrpc": "2.0", "id": rid}
    else:
        huge = {"text": "x" * (5 * 1024 * 1024)}
        out = {"jsonrpc": "2.0", "method": "notifications/message", "params": huge}
    sys.stdout.write(json.dumps(out, separators=(",", ":")) + "\n")
    sys.stdout.flush()
"""

CAP = 64 * 1024


def _request(rid: int, name: str, method: str = "tools/call") -> SessionMessage:
    return SessionMessage(
        types.JSONRPCRequest(
            jsonrpc="2.0", id=rid, method=method, params={"name": name, "arguments": {}}
        )
    )


async def _exchange(names: list[str], method: str = "tools/call") -> tuple[list[Any], BoundedStdio]:
    got: list[Any] = []
    async with bounded_stdio_client([sys.executable, "-c", SERVER], cap=CAP) as (
        read,
        write,
        state,
    ):
        for rid, name in enumerate(names, 1):
            await write.send(_request(rid, name, method))
            with anyio.fail_after(20):
                got.append(await read.receive())
    return got, state


def _expected_line(rid: int, first: bool) -> bytes:
    big = {"content": [{"type": "text", "text": "x" * 300000}]}
    out = (
        {"jsonrpc": "2.0", "id": rid, "result": big}
        if first
        else {"result": big, "jsonrpc": "2.0", "id": rid}
    )
    return json.dumps(out, separators=(",", ":")).encode()


def test_an_answer_over_the_cap_is_a_stand_in_whichever_end_holds_its_id() -> None:
    got, state = anyio.run(_exchange, ["small", "first", "last", "small"])
    small, first, last, again = got
    assert small.message.id == 1 and small.message.result == {"content": []}
    assert again.message.id == 4  # the session goes on after a drained answer
    for rid, message, written_first in ((2, first, True), (3, last, False)):
        assert message.message.id == rid
        result = types.CallToolResult.model_validate(message.message.result)
        assert result.is_error
        prefix, truncation = state.take_truncation(result)
        line = _expected_line(rid, written_first)
        assert prefix == line[:CAP]
        assert truncation == Truncation(
            kept=CAP, size=len(line), sha256=hashlib.sha256(line).hexdigest()
        )
        assert state.take_truncation(result) is None  # taken once
    assert not state.pending


def test_the_cap_is_on_tool_answers_only() -> None:
    """The protocol's own answers (a tools/list, an initialize) are not a tool's output:
    over the tool cap but within what a line may hold, they pass whole."""
    (listed,), state = anyio.run(_exchange, ["first"], "tools/list")
    assert isinstance(listed, SessionMessage) and listed.message.id == 1
    assert len(listed.message.result["content"][0]["text"]) == 300000
    assert not state.pending


def test_an_oversized_message_that_answers_nothing_is_a_protocol_error() -> None:
    (stray,), _state = anyio.run(_exchange, ["stray"])
    assert isinstance(stray, ValueError) and "answers no tool call" in str(stray)


def test_a_truncation_the_server_names_itself_is_none() -> None:
    """The stand-in's token is the transport's: a result naming one is the server's own."""
    state = BoundedStdio(CAP)
    made_up = types.CallToolResult(content=[], is_error=True, _meta={TRUNCATED_META: "0" * 32})
    assert state.take_truncation(made_up) is None


@pytest.mark.parametrize(
    ("result", "structured", "output", "error"),
    [
        ({"content": [], "structuredContent": {"a": 1}}, True, {"a": 1}, False),
        ({"content": [], "structuredContent": {"a": 1}}, False, None, False),
        ({"content": [], "isError": True, "structuredContent": {"a": 1}}, True, None, True),
        ({"content": [], "isError": "true"}, True, None, False),  # only the JSON true
    ],
)
def test_what_the_output_gate_takes_of_an_mcp_result(
    result: dict[str, Any], structured: bool, output: Any, error: bool
) -> None:
    assert is_tool_error(result) is error
    expected = output if structured and not error else result
    assert tool_output(result, structured) == expected
