"""Structural gate checks and tool calls: deviation is failure, and every deviation is
recorded (docs/concepts.md, "Gates")."""

from __future__ import annotations

from typing import Literal

import msgspec

from .base import EventPayload

DeviationKind = Literal[
    "invented_tool",
    "extra_field",
    "missing_required",
    "wrong_type",
    "enum_mismatch",
    "const_mismatch",
    "constraint",
    "no_output_declaration",
    "not_in_skill",
]


class Deviation(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One structural difference between declared and actual. Values are never copied,
    only their JSON type, so secrets in parameters stay out of the log."""

    pointer: str  # RFC 6901, into the instance
    kind: DeviationKind
    expected: str
    actual_type: str
    schema_pointer: str = ""


class Truncation(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A program's output stream was longer than its cap (``max_output_bytes``): only its
    first ``kept`` bytes were kept (and stored); the whole stream was ``size`` bytes with
    SHA-256 ``sha256``. Kept bytes are never parsed: a prefix is not the document."""

    kept: int  # bytes kept: the cap in force
    size: int  # the full size in bytes
    sha256: str  # hex SHA-256 of the full output, every byte of it


class Exchange(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """What a tool's MCP server sent the agent's client during one call besides its
    result, counted by kind: its log and progress messages, its sampling and elicitation
    requests (relayed, with the answers, or refused); the messages themselves, in order,
    are the call's ``exchange_sha256`` blob. ``refused``: the requests the gate could not
    relay (the agent's client does not offer them, or the door has no way to ask it).
    ``dropped``: the messages past the call's budget (1 MiB of them kept), counted above
    but neither kept in the blob nor relayed; absent when none was."""

    log: int
    progress: int
    sampling: int
    elicitation: int
    refused: int
    dropped: int | msgspec.UnsetType = msgspec.UNSET


class GateChecked(EventPayload, tag="gate.checked", kw_only=True, frozen=True):
    """An input or output gate check, pass or fail, with every deviation."""

    STREAM = "plan:{plan_id}"
    DELTA = (
        "increments /gate_checks (and /gate_failures on fail); an input gate pass "
        "with a step records /steps/<step> = {tool, tool_version}"
    )
    BLOB_FIELDS = ("schema_sha256", "checked_sha256")

    plan_id: str
    gate: Literal["input", "output"]
    tool: str
    tool_version: int | None = None
    step: str | None = None
    schema_sha256: str | None = None
    verdict: Literal["pass", "fail"]
    deviations: list[Deviation] = []
    attempt: int
    iteration: int
    strict_mode: bool
    checked_sha256: str  # blob digest of the checked bytes
    # The checked bytes are a truncated tool output: judged not JSON, never parsed.
    # Absent (not null) otherwise, so payloads without it keep their bytes.
    checked_truncated: Truncation | msgspec.UnsetType = msgspec.UNSET


class ToolCalled(EventPayload, tag="tool.called", kw_only=True, frozen=True):
    """A tool call that passed the input gate ran (or was recorded by an orchestrator);
    or, with ``unregistered``, a call of a tool the registry does not know that an agent
    hook let through (``evidence hook post-tool --unknown-tools record``): no gate judged
    it, and it has no tool version."""

    STREAM = "plan:{plan_id}"
    DELTA = "appends the call to /calls"
    BLOB_FIELDS = ("params_sha256", "output_sha256", "exchange_sha256")

    plan_id: str
    call_id: str
    tool: str
    tool_version: int | None = None  # None only for an unregistered tool's call
    step: str | None = None
    attempt: int
    # validation: read-only, in a copy; mcp: the plane called the tool's MCP server
    executor: Literal["command", "recorded", "validation", "mcp"]
    params_sha256: str
    output_sha256: str  # blob digest of the raw output bytes
    exit_code: int | None = None
    started_at: str
    ended_at: str
    duration_ms: int
    # Set only when the program's stdout / stderr went over its cap (for an MCP call:
    # the JSON of its output); absent otherwise.
    stdout_truncated: Truncation | msgspec.UnsetType = msgspec.UNSET
    stderr_truncated: Truncation | msgspec.UnsetType = msgspec.UNSET
    # True: the tool was not registered when its call was recorded (executor
    # ``recorded``, ``tool_version`` null, no gate). Absent otherwise.
    unregistered: bool | msgspec.UnsetType = msgspec.UNSET
    # How the program that made the call ran (a command, a validation, an MCP server the
    # plane launched): ``landlock`` (confined by the kernel) or ``unconfined`` (the plan
    # opted out: ``confinement: none``). Absent on calls the plane did not run and on
    # calls recorded before the field.
    confinement: Literal["landlock", "unconfined"] | msgspec.UnsetType = msgspec.UNSET
    # True: the tool answered with an error of its own (an MCP result with ``isError``).
    # The output is that error, checked as an MCP tool result rather than against the
    # tool's declaration: the tool's failure, not the agent's deviation; the call's
    # result never becomes state. Absent otherwise.
    tool_error: bool | msgspec.UnsetType = msgspec.UNSET
    # An MCP call: what the server said to the client during the call besides its
    # result (through the proxy: log and progress notifications, sampling and
    # elicitation requests with their answers; through the plane's own client, which
    # offers neither: the requests it refused), in order, as one JSON array kept as a
    # blob, and its counts. An elicitation's answer is a person's input that shaped the
    # call. A request that was not relayed makes the call a ``tool_error``: the server
    # answered without what it asked for. Absent when the server said nothing else.
    exchange_sha256: str | msgspec.UnsetType = msgspec.UNSET
    exchange: Exchange | msgspec.UnsetType = msgspec.UNSET


class McpFetched(EventPayload, tag="mcp.fetched", kw_only=True, frozen=True):
    """An agent read a resource or got a prompt of an MCP server through a gate: what it
    was given to read, kept whole, because it may shape what the agent does next; and,
    when the server asked first (the stateless revision's ``input_required``), the
    answers the agent's client gave it, which shaped what it gave."""

    STREAM = "plan:{plan_id}"
    DELTA = "empty: a read changes no plan state"
    BLOB_FIELDS = ("content_sha256", "given_sha256")

    plan_id: str
    fetch_id: str
    server: str  # the MCP server's name, as its tools are registered under
    what: Literal["resource", "prompt"]
    name: str  # the resource's URI or the prompt's name, as the agent asked for it
    size: int  # bytes of the answer's JSON (the blob)
    content_sha256: str  # blob digest of the answer, as the server gave it
    # The answers to the server's questions this read came with (``inputResponses``):
    # blob digest of their JSON, as the agent's client sent them, and their keys.
    given_sha256: str | msgspec.UnsetType = msgspec.UNSET
    given: list[str] | msgspec.UnsetType = msgspec.UNSET


class McpInputRequired(EventPayload, tag="mcp.input_required", kw_only=True, frozen=True):
    """A tool's MCP server answered a call with questions for the agent's client instead
    of its result (the stateless revision's ``input_required``): the call is not over,
    nothing it did is kept, and the agent answers by calling the tool again with the same
    arguments and its answers — once (``mcp.input_given`` closes the round). What the
    server said meanwhile (its log and progress messages) is kept as a call's is
    (``exchange_sha256``, ``exchange``)."""

    STREAM = "plan:{plan_id}"
    DELTA = "adds /rounds/<round_id> = {tool, params_sha256}"
    BLOB_FIELDS = ("params_sha256", "asked_sha256", "exchange_sha256")

    plan_id: str
    round_id: str
    tool: str
    step: str | None = None
    attempt: int
    params_sha256: str  # the call's arguments (its answer must come with the same)
    asked_sha256: str  # blob digest of the server's answer: its questions, as it sent them
    asked: dict[str, str]  # each question's key and its method (elicitation/create …)
    duration_ms: int
    exchange_sha256: str | msgspec.UnsetType = msgspec.UNSET
    exchange: Exchange | msgspec.UnsetType = msgspec.UNSET


class McpInputGiven(EventPayload, tag="mcp.input_given", kw_only=True, frozen=True):
    """The agent's client gave a tool's MCP server its answers (``inputResponses``),
    recorded before the server gets them: an elicitation's answer is a person's input
    that shapes the call. With ``round_id``, they answer that round, which it closes: a
    round is answered once, by a call of its tool with its arguments."""

    STREAM = "plan:{plan_id}"
    DELTA = "removes /rounds/<round_id> (when it answers a round)"
    BLOB_FIELDS = ("params_sha256", "given_sha256")

    plan_id: str
    tool: str
    params_sha256: str
    round_id: str | msgspec.UnsetType = msgspec.UNSET
    given_sha256: str  # blob digest of the answers' JSON, as the agent's client sent them
    given: list[str]  # the answers' keys, sorted
