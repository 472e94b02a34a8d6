"""One call of a tool on an MCP server, made by the plane itself with the official SDK's
client: launch the server (``mcp_command``, on stdio) or connect to it (``mcp_url``,
streamable HTTP), initialize, ``tools/call``, close. One short-lived client per call,
the whole of it within one timeout.

Pure execution, like ``process``: no database, no events. The result is returned as
the server sent it (``McpCall.result``: the ``CallToolResult`` as JSON); a server that
cannot be launched or reached, dies, breaks the protocol, answers the call with an error
or runs out of time is a ``fault`` with a readable ``error``, never an exception. What a
fault means (a halt for a tool call, a validation without a verdict) is the caller's.

The plane is synchronous: the SDK's async client runs under ``anyio.run`` inside the
call (in a thread of its own when the caller is already inside an event loop, as the
MCP proxy's verbs are). A stdio server runs in ``cwd`` with the plane's environment (as
command tools do; confined by Landlock, with ``confinement``: ``commands.runner.confine``)
and in its own process group, which the SDK kills at the end; its
stderr is captured and quoted in a fault's error, never passed to the user's terminal.
The SDK's own log lines during a call are collected the same way (a traceback it would
log never reaches a user).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import functools
import hashlib
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, Protocol, TypeVar, cast

import msgspec

from ledger.canonical import CanonicalizationError, canonical_json
from ledger.events import Truncation
from ledger.timestamps import utc_now

from .confine import Confinement, launched, launcher_failure
from .said import Said


class Warm(Protocol):
    """Servers kept open across calls (``mcp_sessions.WarmSessions``): ``call`` makes
    ``run`` on the server kept for ``owner`` and this launch, or answers None when it
    cannot be started warm."""

    def call(
        self, run: _Call, owner: str, confinement: Confinement | None, cap: int | None
    ) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class Backchannel:
    """The agent's side of the request a call serves, when a gate's MCP door makes the
    call for an MCP client (``commands.service.mcp``): what of the client's ``_meta``
    goes on to the server (``meta``, without the gate's own keys), whether the client
    asked for progress, and ``send``, which takes the server's log and progress messages
    to the client while the call runs (called from any thread, in order; it never
    blocks).

    Set for the request by the door (``BACKCHANNEL``), read where the call is made: the
    worker thread that makes it runs in a copy of the request's context."""

    meta: dict[str, Any] | None
    progress: bool
    send: Callable[[dict[str, Any]], None]
    # A server's request to the client (``"sampling"``, ``"elicitation"``: those in
    # ``offers``, what the agent's client declared), asked of the agent's client on
    # the request's stream and awaited from any event loop: the answer as JSON, or
    # ``Declined`` with the client's error. None: the door has no way back.
    ask: Ask | None = None
    offers: frozenset[str] = frozenset()
    # The agent's client speaks the stateless revision (2026-07-28): a server's
    # questions come back to it as an ``input_required`` result, never as requests of
    # the server's mid-call; the plane's session to the server speaks it too, declaring
    # what the agent's client declared (``offers``: sampling, elicitation, roots).
    modern: bool = False
    # The agent's answers to a server's questions, with the server's own state echoed
    # (a retry of an ``input_required`` call or read): given to the server as they came.
    resume: Resume | None = None


@dataclass(frozen=True)
class Resume:
    """A retry's ``inputResponses`` (as JSON) and the server's ``requestState``."""

    responses: dict[str, Any] | None
    state: str | None
    # The round of questions they answer (the plane's record: never sent to the server).
    round_id: str | None = None


class Declined(Exception):
    """The agent's client answered a relayed request with an error (``error``: its
    JSON-RPC error object), or, not ``asked``, could not be asked at all (the call is
    then the tool's failure, as for a request the door cannot relay)."""

    def __init__(self, error: dict[str, Any], *, asked: bool = True) -> None:
        super().__init__(str(error.get("message", "")))
        self.error, self.asked = error, asked


# What the plane's client relays to the agent's client, when the door can and the agent
# offered it: an MCP server's requests made during a call.
RELAYED = ("sampling", "elicitation")
# What a server of the stateless revision may ask an agent's client for, in an
# ``input_required`` result (the plane's session declares those the agent declared).
ASKABLE = ("sampling", "elicitation", "roots")
Ask = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


BACKCHANNEL: ContextVar[Backchannel | None] = ContextVar("evidence_backchannel", default=None)
# A request a gate forwards to the server instead of a tool call (``resources/read``,
# ``prompts/get`` …): given the open session, it answers the server's result (a model).
Forward = Callable[[Any], Awaitable[Any]]

__all__ = [
    "BACKCHANNEL",
    "LEGACY_MCP_TOOL_RESULT_SHA256",
    "Backchannel",
    "Declined",
    "Fault",
    "McpCall",
    "Resume",
    "call_mcp_tool",
    "capped",
    "is_tool_error",
    "json_bytes",
    "mcp_tool_result_schema",
    "tool_output",
]


@functools.cache
def mcp_tool_result_schema() -> dict[str, Any]:
    """The output declaration of an MCP tool that declares no output schema of its own:
    an MCP tool result (``content`` blocks, ``structuredContent``, ``isError``,
    ``_meta``), as the official SDK's types define it (their JSON Schema, 2020-12).
    Registration closes it like any schema: a member the SDK does not define is a
    deviation; ``structuredContent`` and ``_meta`` are open objects, as the MCP
    specification has them. (Imported on first use: the SDK is slow to import.)"""
    import mcp_types

    schema = mcp_types.CallToolResult.model_json_schema(by_alias=True, mode="serialization")
    return dict(schema)


# The digest of the hand-written subset that declared an MCP tool result before the
# SDK's types did (content, isError, _meta; blocks open): tools registered with it
# still return the whole result, never its structuredContent.
LEGACY_MCP_TOOL_RESULT_SHA256 = "cea1998791a7c712675425e79cb6d7c5a46e46ac3b70508067933c1fa6c8759a"


def tool_output(result: Mapping[str, Any], structured: bool) -> Any:
    """What the output gate checks of an MCP tool result (and the log keeps as the
    call's output): its ``structuredContent`` when the tool declares an output schema
    (missing: null, which no object schema admits), else the whole result. A result the
    tool marks as an error (``isError``) is always taken whole: it is the tool's
    failure, checked as an MCP tool result, never against the tool's declaration."""
    if structured and not is_tool_error(result):
        return result.get("structuredContent")
    return dict(result)


def is_tool_error(result: Mapping[str, Any]) -> bool:
    """The server answered the call with a tool error (``isError: true``)."""
    return result.get("isError") is True


# missing_program: the stdio server's program cannot be executed. unavailable: the
# server could not be started or reached, or did not complete the initialization.
# crash: the connection ended during the call. error: the server answered the call with
# a JSON-RPC error. protocol: it sent something that is not an MCP message. timeout: no
# result within the timeout.
Fault = Literal[
    "missing_program", "unavailable", "crash", "error", "protocol", "timeout", "schema_drift"
]

# spawn failures that mean "this program cannot be run here", as ``process`` judges a
# command's (kept apart: ``process`` calls this module, never the reverse)
_NOT_RUNNABLE = {
    errno.ENOENT,
    errno.EACCES,
    errno.EPERM,
    errno.ENOEXEC,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.ELOOP,
    errno.ENAMETOOLONG,
}
_STDERR_TAIL = 400  # characters of the server's stderr quoted in an error
_LOG_LINES = 3  # of the SDK's log lines quoted in an error


def answered_error(tool: str, code: int, message: str) -> str:
    """A server's JSON-RPC error answer to a call of ``tool``, in one line."""
    return f"MCP server answered the call of {tool!r} with error {code}: {_one_line(message)}"


def refused_meanwhile(exchange: Sequence[Mapping[str, Any]] | None) -> bool:
    """The plane refused a request the server made of the agent's client during the call
    (a JSON-RPC error the server answered then is the tool's failure: ``refused_error``).
    A ``Said`` counts its refusals past its budget too."""
    if isinstance(exchange, Said):
        return exchange.refused > 0
    return any(message.get("refused") is True for message in exchange or ())


def refused_error(call: McpCall) -> dict[str, Any] | None:
    """A server that answered the call with a JSON-RPC error after the plane refused a
    request it made of the agent's client (sampling, elicitation; in the exchange): the
    tool's own failure, as an MCP tool error result carrying the error, never the
    environment's (no halt: the agent may call again, with a client that offers what
    the server asks). None for any other fault."""
    if call.fault != "error" or not refused_meanwhile(call.exchange):
        return None
    return {"content": [{"type": "text", "text": call.error or "error"}], "isError": True}


class McpCall(msgspec.Struct, kw_only=True):
    """One call: ``result`` when the server answered it, else ``fault`` and ``error``;
    or, for a stdio server whose answer went over ``cap``, ``truncation`` and the
    ``kept`` prefix of the answer as sent (drained, never held whole, never parsed)."""

    result: dict[str, Any] | None = None
    fault: Fault | None = None
    error: str | None = None
    # The JSON-RPC error's code, when the server answered with one (fault ``error``).
    error_code: int | None = None
    truncation: Truncation | None = None
    kept: bytes | None = None
    # What the server said to the client during the call besides its result, in order:
    # its log and progress messages (``{"kind": "log" | "progress", "params"}``) and the
    # requests the plane's client refused (sampling, elicitation: it offers neither),
    # as ``{"kind", "request", "refused", "error"}``: a ``Said``, within its budget.
    exchange: list[dict[str, Any]] | None = None
    # The server answered with questions for the agent's client instead of a result
    # (2026-07-28 ``input_required``: its JSON, the server's ``requestState`` in it).
    input_required: dict[str, Any] | None = None
    started_at: str
    ended_at: str
    duration_ms: int


class ListedTool(msgspec.Struct, frozen=True):
    """A tool as its server declares it (``tools/list``)."""

    name: str
    description: str
    input_schema: Any
    output_schema: Any


def list_mcp_tools(
    *,
    command: Sequence[str] | None = None,
    url: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float,
) -> list[ListedTool]:
    """Every tool the server launched by ``command`` (stdio) or reached at ``url``
    declares, as it declares it, every page of ``tools/list`` read. ``McpListError``
    (one line: what failed, the end of the server's stderr) when it cannot be had."""
    done = call_mcp_tool(
        "", {}, command=command, url=url, env=env, timeout_s=timeout_s, listing=True
    )
    if done.result is None:
        raise McpListError(done.error or "the server listed no tools")
    return [ListedTool(**t) for t in done.result["tools"]]


class McpListError(Exception):
    """A server's tools could not be listed."""


def call_mcp_tool(
    tool: str,
    arguments: Mapping[str, Any],
    *,
    command: Sequence[str] | None = None,
    url: str | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float,
    confinement: Confinement | None = None,
    declared: tuple[Any, Any] | None = None,
    cap: int | None = None,
    listing: bool = False,
    warm: Warm | None = None,
    owner: str = "",
    forward: Forward | None = None,
) -> McpCall:
    """Call ``tool`` with ``arguments`` on the server launched by ``command`` (stdio) or
    reached at ``url`` (streamable HTTP). ``env`` (default: this process's environment)
    is the stdio server's whole environment. A stdio server runs under ``confinement``
    (``commands.runner.confine``) when it confines. With ``declared`` (the input and
    output schemas the tool was registered with), the server's own declaration of the
    tool is read first (``tools/list``) and must be the same, else the call is not made:
    fault ``schema_drift`` — the gate never checks against a stale copy. Never raises for
    the server's sake.

    With ``warm`` (the service's ``mcp_sessions.WarmSessions``), the call is made on the
    server kept open for ``owner`` (a plan) and this very launch, started on first use;
    a server that cannot be started warm is tried as without it, which says why.

    With ``forward``, the server is asked that request instead of a tool call (``tool``
    names its method, for the errors): a gate's resource read or prompt fetch."""
    if (command is None) == (url is None):
        raise ValueError("give exactly one of command and url")
    argv = list(command or [])
    if argv[:1] in (["python"], ["python3"]):
        argv[0] = sys.executable  # as run_command does: the interpreter running the plane
    started, clock = utc_now(), time.monotonic()
    log: list[str] = []

    def finish(**fields: Any) -> McpCall:
        return McpCall(
            started_at=started,
            ended_at=utc_now(),
            duration_ms=max(0, round((time.monotonic() - clock) * 1000)),
            **fields,
        )

    if command is not None and not argv:
        return finish(fault="unavailable", error="empty `mcp_command`: there is no server to run")
    if cwd is not None and not os.path.isdir(cwd):
        return finish(fault="unavailable", error=f"working directory {os.fspath(cwd)!r} is gone")
    if warm is not None and owner and env is None and not listing:
        call = _Call(tool, dict(arguments), argv, url, cwd, None, timeout_s, None)
        call.declared, call.forward = declared, forward
        fields = warm.call(call, owner, confinement if url is None else None, cap)
        if fields is not None:
            return finish(**fields)
    with (
        tempfile.TemporaryFile() as stderr,
        launched(argv, confinement if url is None else None, env) as (launch, child_env),
    ):
        call = _Call(tool, dict(arguments), argv, url, cwd, child_env, timeout_s, stderr)
        call.declared, call.forward = declared, forward
        call.listing = listing
        call.launch = launch
        call.cap = cap
        fields = _run_blocking(call.run, log)
        if fields.get("fault") is not None:
            stderr.seek(0)
            failed = launcher_failure(stderr.read(4096)) if launch != argv else None
            if failed is not None:  # the confined launcher could not execute the server
                number, said = failed
                fields["fault"] = "missing_program" if number in _NOT_RUNNABLE else "unavailable"
                fields["error"] = f"cannot start MCP server {argv[0]!r}: {said}"
            else:
                fields["error"] += _tail(stderr) + _log_text(log)
    return finish(**fields)


def refuse_unoffered(
    session: Any, record: Callable[[dict[str, Any]], None], offered: frozenset[str] = frozenset()
) -> None:
    """Refuse, and ``record``, a sampling or elicitation request the server sends the
    plane's client although the client never offered either (its ``initialize`` declared
    neither). The server may then answer the call with ordinary text made without what
    it asked for; the record makes the call the tool's failure, never a normal pass.

    Set on the open session after ``initialize``: the SDK's client declares a capability
    when it is built with a handler for it, and this one must stay undeclared. What the
    client ``offered`` (it was built with a handler that relays it) is left alone."""

    def refuser(kind: str) -> Callable[..., Awaitable[Any]]:
        async def refuse(context: Any, params: Any) -> Any:
            return _refused(kind, params, "the plane's client does not offer", record)

        return refuse

    if "sampling" not in offered:
        session._sampling_callback = refuser("sampling")
    if "elicitation" not in offered:
        session._elicitation_callback = refuser("elicitation")


def _refused(kind: str, params: Any, why: str, record: Callable[[dict[str, Any]], None]) -> Any:
    """A server's request refused (``why`` the client cannot answer ``kind``), and the
    refusal recorded: the call it came in is then the tool's failure."""
    import mcp_types as types

    error = types.ErrorData(
        code=types.INVALID_REQUEST,
        message=f"{why} {kind}: the call is recorded as the tool's failure",
    )
    record(
        {
            "kind": kind,
            "request": params.model_dump(by_alias=True, mode="json", exclude_none=True),
            "refused": True,
            "error": error.model_dump(by_alias=True, mode="json", exclude_none=True),
        }
    )
    return error


def _canonical_or_none(schema: Any) -> bytes | None:
    if schema is None:
        return None
    try:
        return canonical_json(schema)
    except (CanonicalizationError, TypeError, ValueError):
        return repr(schema).encode()


def json_bytes(value: Any) -> bytes:
    """The bytes the log keeps of a JSON value from a server: RFC 8785 canonical JSON;
    a value with no canonical form (a non-finite number, an integer beyond 2^53 - 1)
    is written as it is, which the gates then judge not JSON rather than coerce."""
    try:
        return canonical_json(value)
    except (CanonicalizationError, TypeError, ValueError):
        return json.dumps(value, sort_keys=True, allow_nan=True, default=repr).encode()


def capped(data: bytes, cap: int) -> tuple[bytes, Truncation | None]:
    """``data`` within ``cap`` bytes: the first ``cap`` bytes and the ``Truncation``
    (full size and SHA-256) when it is longer, else itself and None."""
    if len(data) <= cap:
        return data, None
    return data[:cap], Truncation(kept=cap, size=len(data), sha256=hashlib.sha256(data).hexdigest())


# -- the async call ---------------------------------------------------------------------


class _Call:
    """The call's state: how far it got (``stage``) decides what a failure means."""

    def __init__(
        self,
        tool: str,
        arguments: dict[str, Any],
        argv: list[str],
        url: str | None,
        cwd: Path | None,
        env: Mapping[str, str] | None,
        timeout_s: float,
        stderr: IO[bytes] | None,
    ) -> None:
        self.tool, self.arguments, self.argv, self.url = tool, arguments, argv, url
        self.cwd, self.env, self.timeout_s, self.stderr = cwd, env, timeout_s, stderr
        self.launch = argv  # what is started: argv, or its confined form
        self.stage: Literal["start", "initialize", "call"] = "start"
        self.declared: tuple[Any, Any] | None = None  # (input, output) as registered
        self.listing = False  # list the server's tools instead of calling one
        self.protocol_error: str | None = None
        self.scope: Any = None
        self.cap: int | None = None  # a stdio server's answers beyond it are drained
        self.bounded: Any = None  # the bounded transport's state (``BoundedStdio``)
        # Who hears the server's messages when not this call (a warm server: its calls).
        self.messages: Callable[[Any], Awaitable[None]] | None = None
        # A warm server's tools as it last listed them (emptied when it says they
        # changed): the drift check reads them instead of asking again.
        self.known: dict[str, Any] | None = None
        self.exchange = Said()  # what the server said meanwhile, within its budget
        self.forward: Forward | None = None  # a request to make instead of tools/call
        self.back = BACKCHANNEL.get()  # the agent's client, when a door makes the call
        # What the plane's client offers the server (relays to the agent's client).
        back = self.back
        self.modern = bool(back and back.modern)
        if self.modern:
            assert back is not None
            self.offers = back.offers & set(ASKABLE)
        else:
            self.offers = back.offers & set(RELAYED) if back and back.ask else frozenset()
        # Who answers the server's requests: this call, or a warm server's latest call.
        self.answers: Callable[[str, Any], Awaitable[Any]] | None = None

    async def run(self) -> dict[str, Any]:
        """Start (or reach) the server, initialize, call: the call's fields."""

        async def fresh() -> dict[str, Any]:
            async with self._session() as session:
                return await self._converse(session)

        return await self._guarded(fresh)

    async def run_on(self, session: Any, bounded: Any) -> dict[str, Any]:
        """The call on a session already open and initialized (a warm server's,
        ``mcp_sessions``): the same faults, within the same timeout."""
        self.bounded = bounded
        return await self._guarded(lambda: self._converse(session, initialized=True))

    async def _guarded(self, work: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        import anyio

        found: dict[str, Any] = {}
        try:
            with anyio.fail_after(self.timeout_s):
                found = await work()
        except TimeoutError:
            return {
                "fault": "timeout",
                "error": f"no answer within {self.timeout_s:g} s ({self._doing()})",
            }
        except OSError as exc:
            if self.stage == "start" and self.url is None:
                fault: Fault = "missing_program" if exc.errno in _NOT_RUNNABLE else "unavailable"
                return {
                    "fault": fault,
                    "error": f"cannot start MCP server {self.argv[0]!r}: {exc.strerror or exc}",
                }
            return self._failed(exc)
        except Exception as exc:  # the transport's own failure, in the SDK's task groups
            return self._failed(exc)
        if found.keys() & {"result", "fault", "truncation", "input_required"}:
            return found
        # Cancelled before an answer: only a protocol error cancels the call.
        said = self.protocol_error or f"the call ended without an answer ({self._doing()})"
        return {"fault": "protocol", "error": said}

    async def _converse(self, session: Any, *, initialized: bool = False) -> dict[str, Any]:
        """Initialize (unless ``initialized``), then call; a failure of either is a fault
        (kept out of the SDK's task groups, which would wrap it)."""
        import anyio
        import mcp_types as types
        from mcp.shared.exceptions import MCPError

        with anyio.CancelScope() as self.scope:
            self.stage = "initialize"
            try:
                if not initialized:
                    await open_session(session, self.modern)
                    refuse_unoffered(session, self.exchange.append, self.offers)
                if self.listing:
                    listed = await self._listed(session)
                    return {"result": {"tools": [_declared(t) for t in listed.values()]}}
                if self.declared is not None:
                    drift = await self._drift(session)
                    if drift is not None:
                        return {"fault": "schema_drift", "error": drift}
                self.stage = "call"
                result = await (self.forward(session) if self.forward else self._call(session))
            except MCPError as exc:
                if self.stage == "call" and exc.error.code != types.CONNECTION_CLOSED:
                    return {
                        "fault": "error",
                        "error": answered_error(self.tool, exc.error.code, exc.error.message),
                        "error_code": exc.error.code,
                        # what it asked meanwhile: a refusal there may be the error's cause
                        **({"exchange": self.exchange} if self.exchange else {}),
                    }
                return self._failed(exc)
            except Exception as exc:
                return self._failed(exc)
            oversized = self.bounded.take_truncation(result) if self.bounded else None
            if oversized is not None:
                kept, truncation = oversized
                return {"truncation": truncation, "kept": kept}
            raw = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            if isinstance(result, types.InputRequiredResult):
                asked = {"input_required": raw}
                return {**asked, **({"exchange": self.exchange} if self.exchange else {})}
            raw.pop("resultType", None)
            if getattr(result, "structured_content", None) is not None:  # exactly as sent
                raw["structuredContent"] = result.structured_content
            return {"result": raw, **({"exchange": self.exchange} if self.exchange else {})}
        return {}  # cancelled by a protocol error (see on_message)

    async def _call(self, session: Any) -> Any:
        """``tools/call``, with the agent's ``_meta`` and its progress relayed when a
        door makes the call for a client that asked for progress."""
        import mcp_types as types

        back = self.back
        resume = back.resume if back is not None else None
        params = types.CallToolRequestParams(
            name=self.tool,
            arguments=self.arguments,
            _meta=cast("types.RequestParamsMeta | None", back.meta if back else None),
            input_responses=cast("Any", resume.responses) if resume else None,
            request_state=resume.state if resume else None,
        )
        return await session.send_request(
            types.CallToolRequest(params=params),
            answers_of(types.CallToolResult) if self.modern else types.CallToolResult,
            request_read_timeout_seconds=self.timeout_s,
            progress_callback=self._progress if back is not None and back.progress else None,
        )

    async def _progress(self, progress: float, total: float | None, message: str | None) -> None:
        found = {"progress": progress, "total": total, "message": message}
        self.said({"kind": "progress", "params": {k: v for k, v in found.items() if v is not None}})

    async def answer(self, kind: str, params: Any) -> Any:
        """A request of the server's during the call (``kind``: sampling, elicitation),
        relayed to the agent's client and its answer given back, request and answer
        kept with the call; refused and kept as refused when the door cannot ask."""
        import mcp_types as types

        back = self.back
        if back is None or back.ask is None or kind not in back.offers:
            why = "the agent's client cannot be asked here for"
            return _refused(kind, params, why, self.exchange.append)
        asked = params.model_dump(by_alias=True, mode="json", exclude_none=True)
        try:
            answer = await back.ask(kind, asked)
        except Declined as declined:
            entry = {"kind": kind, "request": asked, "error": declined.error}
            self.exchange.append(entry if declined.asked else {**entry, "refused": True})
            return types.ErrorData.model_validate(declined.error)
        self.exchange.append({"kind": kind, "request": asked, "answer": answer})
        result = types.CreateMessageResult if kind == "sampling" else types.ElicitResult
        return result.model_validate(answer)

    def _answering(self, kind: str) -> Callable[[Any, Any], Awaitable[Any]]:
        async def relay(context: Any, params: Any) -> Any:
            return await (self.answers or self.answer)(kind, params)

        return relay

    def _client_callbacks(self) -> dict[str, Any]:
        """The SDK client's handlers for what it offers (their presence declares them).
        A server of the stateless revision asks in its results instead: the handlers are
        never called, they declare what the agent's client answers."""
        found = {
            f"{kind}_callback": self._answering(kind) for kind in RELAYED if kind in self.offers
        }
        if "roots" in self.offers:
            found["list_roots_callback"] = self._answering("roots")
        return found

    def said(self, entry: dict[str, Any]) -> None:
        """A message of the server's to the client during the call: kept for the call's
        record, and passed on to the agent's client when a door makes the call."""
        if self.exchange.keep(entry) and self.back is not None:
            self.back.send(entry)  # past the budget a message is counted, not relayed

    async def _drift(self, session: Any) -> str | None:
        """How the server's own declaration of the tool differs from the registered one
        (None when it is the same): missing, or another input or output schema."""
        assert self.declared is not None
        found = (await self._listed(session)).get(self.tool)
        if found is None:
            return f"the server no longer lists the tool {self.tool!r}"
        for what, registered, now in (
            ("input", self.declared[0], found.input_schema),
            ("output", self.declared[1], found.output_schema),
        ):
            if _canonical_or_none(registered) != _canonical_or_none(now):
                return (
                    f"the server declares another {what} schema for {self.tool!r} than the "
                    "one it was registered with: re-register the tool (the gate never "
                    "checks against a stale copy)"
                )
        return None

    async def _listed(self, session: Any) -> dict[str, Any]:
        """The server's tools by name, every page of ``tools/list`` read (a warm
        server's listing is read once, and again after it said its tools changed)."""
        if self.known:
            return self.known
        listed: dict[str, Any] = {}
        cursor = None
        for _ in range(1000):  # a server that pages forever is answered, not followed
            page = await session.list_tools(cursor) if cursor else await session.list_tools()
            listed.update({t.name: t for t in page.tools})
            cursor = page.next_cursor
            if not cursor:
                break
        if self.known is not None:
            self.known.update(listed)
        return listed

    async def on_message(self, message: Any) -> None:
        """A log message is the call's (``said``); a transport-level exception (a line
        that is no MCP message) ends the call."""
        import mcp_types as types

        if isinstance(message, types.LoggingMessageNotification):
            params = message.params.model_dump(by_alias=True, mode="json", exclude_none=True)
            self.said({"kind": "log", "params": params})
        if isinstance(message, Exception) and self.protocol_error is None:
            self.protocol_error = (
                f"MCP server broke the protocol ({self._doing()}): "
                f"{type(message).__name__}: {_one_line(str(message))[:300]}"
            )
            if self.scope is not None:
                self.scope.cancel()

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[Any]:
        from mcp import ClientSession, StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client

        if self.url is not None:
            transport: Any = streamable_http_client(self.url)
        elif self.cap is not None:  # its memory bounded: an answer over the cap is drained
            from .bounded_stdio import bounded_stdio_client

            env = dict(os.environ if self.env is None else self.env)
            bounded = bounded_stdio_client(
                self.launch, cap=self.cap, cwd=self.cwd, env=env, errlog=self.stderr
            )
            async with (
                bounded as (read, write, self.bounded),
                ClientSession(
                    read, write, message_handler=self._heard(), **self._client_callbacks()
                ) as session,
            ):
                yield session
            return
        else:
            params = StdioServerParameters(
                command=self.launch[0],
                args=self.launch[1:],
                env=dict(os.environ if self.env is None else self.env),
                cwd=self.cwd,
            )
            transport = stdio_client(params, errlog=self.stderr)  # type: ignore[arg-type]
        async with (
            transport as (read, write),
            ClientSession(
                read, write, message_handler=self._heard(), **self._client_callbacks()
            ) as session,
        ):
            yield session

    def _heard(self) -> Any:  # the SDK's MessageHandlerFnT
        return self.messages or self.on_message

    def _failed(self, exc: BaseException) -> dict[str, Any]:
        leaf = _leaf(exc)
        said = _one_line(str(leaf)) or type(leaf).__name__
        if self.stage == "call":
            what = f"MCP server failed during the call of {self.tool!r}"
            fault: Fault = "crash"
        else:
            where = self.url if self.url is not None else repr(self.argv[0])
            what = f"MCP server {where} could not be {'reached' if self.url else 'started'}"
            fault = "unavailable"
        return {"fault": fault, "error": f"{what}: {type(leaf).__name__}: {said}"}

    def _doing(self) -> str:
        return {
            "start": "starting the server",
            "initialize": "initializing",
            "call": f"calling {self.tool!r}",
        }[self.stage]


@functools.cache
def answers_of(result_type: Any) -> Any:
    """The answers a request of the stateless revision may get: ``result_type``'s, or
    questions for the client (``input_required``)."""
    import mcp_types as types
    from pydantic import TypeAdapter

    return TypeAdapter(result_type | types.InputRequiredResult)


async def open_session(session: Any, modern: bool) -> None:
    """Open the plane's session to a server: ``initialize``, or for an agent of the
    stateless revision ``server/discover`` (a server that does not speak it is
    initialized as before, and its requests mid-call are refused as before)."""
    from mcp.shared.exceptions import MCPError

    if modern:
        with contextlib.suppress(MCPError):
            await session.discover()
            return
    await session.initialize()


def _declared(tool: Any) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description or "",
        "input_schema": tool.input_schema,
        "output_schema": tool.output_schema,
    }


def _leaf(exc: BaseException) -> BaseException:
    """The first exception inside the SDK's (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _tail(stderr: IO[bytes]) -> str:
    stderr.seek(0, os.SEEK_END)
    size = stderr.tell()
    stderr.seek(max(0, size - 4 * _STDERR_TAIL))
    text = _one_line(stderr.read().decode("utf-8", errors="replace"))
    if not text:
        return ""
    if size > 4 * _STDERR_TAIL or len(text) > _STDERR_TAIL:
        text = "..." + text[-_STDERR_TAIL:]
    return f"; stderr: {text}"


# -- running the async client from synchronous code ---------------------------------------

T = TypeVar("T")

# The SDK's log lines of the call running in this context (None: no call).
_SDK_LOG: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "evidence_mcp_log", default=None
)
_INSTALL = threading.Lock()
_installed = False


class _SdkLogHandler(logging.Handler):
    """Keeps the SDK's log lines of a running call (for its error, without tracebacks);
    outside a call it behaves as Python does when logging was never set up."""

    def emit(self, record: logging.LogRecord) -> None:
        found = _SDK_LOG.get()
        if found is not None:
            found.append(_one_line(record.getMessage())[:300])
        elif (
            logging.lastResort is not None
            and not logging.getLogger().handlers
            and record.levelno >= logging.lastResort.level
        ):
            logging.lastResort.handle(record)


def _log_text(log: list[str]) -> str:
    return f"; MCP client: {' | '.join(log[-_LOG_LINES:])}" if log else ""


def _run_blocking(run: Callable[[], Any], log: list[str]) -> Any:
    """``anyio.run(run)``, in a thread of its own when this thread runs an event loop."""
    import anyio

    global _installed
    with _INSTALL:
        if not _installed:
            logging.getLogger("mcp").addHandler(_SdkLogHandler())
            _installed = True

    def blocking() -> Any:
        _SDK_LOG.set(log)
        return anyio.run(run)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return contextvars.copy_context().run(blocking)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mcp-call") as pool:
        return pool.submit(blocking).result()
