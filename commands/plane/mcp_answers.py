"""What an agent's MCP client is answered by the plane's MCP gates — the stdio proxy
(``commands.cli.mcp_proxy``, in front of an upstream server) and the service's
streamable-HTTP endpoint (``commands.plane.mcp_gate`` behind ``commands.service``) —
so that both answer in exactly the same shapes (docs/agents.md, "What the agent's
client sees"):

- a refusal (a deviation at either gate, an invented tool, arguments off a verb's
  schema, a plan state that allows no call) is an MCP tool error: ``isError``, the
  deviations as text, their JSON in the result's ``_meta`` under ``evidence/refusal``,
  never ``structuredContent`` (a client checks that against the tool's output schema
  and would answer the agent with a protocol error instead of the deviations);
- a tool's own error is passed on as the tool said it (its content), marked
  ``{"evidence/refusal": {"upstream_error": true}}``;
- a verb of the plane answers the JSON its CLI verb prints with ``--json``, as text and
  as ``structuredContent``.

It also reads what an agent may put in a call's ``_meta``: the step the call serves
(``evidence/step``) and that step's declared output (``evidence/output_schema``).

Transport-free: the types are the MCP SDK's (``mcp_types``), nothing here speaks a
protocol.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import mcp_types as types
from ulid import ULID

from commands.schemas.prepare import InvalidSchemaError, prepare_schema
from ledger.events import Deviation

from .core import CommandRefused, Plane
from .gates import GateOutcome, routing_line
from .hooks import STEP_ID
from .plans import plan_brief
from .proxy_verbs import PLANE_TOOLS, PlaneTool, check_plane_arguments

__all__ = [
    "OUTPUT_SCHEMA_META",
    "REFUSAL_META",
    "STEP_META",
    "answer",
    "arguments_refused",
    "call_verb",
    "forwarded_meta",
    "gate_failed",
    "plane_tools",
    "refused",
    "step_of",
    "tool_error",
    "upstream_failed",
]

# Where a refusal's machine-readable form goes: the result's ``_meta``, which every client
# keeps and none validates. Never ``structuredContent``: a client (the TypeScript SDK's)
# checks that against the tool's output schema and would answer the agent with a
# protocol error instead of the deviations.
REFUSAL_META = "evidence/refusal"
STEP_META = "evidence/step"
# Where an answer says where the plan stands after the call (commands.plane.plans.plan_brief).
PLAN_STATE_META = "evidence/plan_state"
OUTPUT_SCHEMA_META = "evidence/output_schema"
OWN_META = "evidence/"  # the prefix of the plane's own ``_meta`` keys
RESERVED_META = "io.modelcontextprotocol/"  # MCP's own, per connection


def forwarded_meta(meta: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A request's ``_meta`` as a gate forwards it to the tool's server: without the
    plane's own keys (``evidence/...``, for the gate alone), the progress token (the
    gate asks for progress itself and relays it to the agent under the agent's token),
    nor MCP's reserved keys (``io.modelcontextprotocol/...``: the protocol's envelope of
    the agent's connection, which the gate's own connection to the server sets itself)."""
    kept = {
        key: value
        for key, value in (meta or {}).items()
        if not key.startswith((OWN_META, RESERVED_META)) and key != "progress_token"
    }
    return kept or None


def deviations_json(deviations: Sequence[Deviation]) -> list[dict[str, str]]:
    return [
        {"pointer": d.pointer, "kind": d.kind, "expected": d.expected, "actual_type": d.actual_type}
        for d in deviations
    ]


def deviation_lines(deviations: list[dict[str, str]]) -> list[str]:
    return [
        f"  {d['pointer'] or '/'}: {d['kind']} (expected {d['expected']}; got {d['actual_type']})"
        for d in deviations
    ]


def tool_error(text: str, detail: dict[str, Any]) -> types.CallToolResult:
    """An MCP tool error (``isError``): the text for the agent, the detail in ``_meta``."""
    return types.CallToolResult(
        content=[types.TextContent(text=text)],
        is_error=True,
        _meta={REFUSAL_META: detail},
    )


def gate_failed(gate: GateOutcome, word: str, consequence: str) -> types.CallToolResult:
    """A failed gate check: one line saying which gate failed and what follows, one per
    deviation, and how the failure was routed (with the iterations left)."""
    check = gate.check
    deviations = deviations_json(check.deviations)
    lines = [
        f"{word}: the {check.gate} gate failed for tool {check.tool!r}: "
        f"{len(deviations)} deviation(s); {consequence}",
        *deviation_lines(deviations),
        routing_line(gate),
    ]
    return tool_error(
        "\n".join(lines),
        {
            "gate": check.gate,
            "tool": check.tool,
            "verdict": check.verdict,
            "routed": gate.routed,
            "iterations_left": gate.iterations_left,
            "deviations": deviations,
        },
    )


def arguments_refused(tool: str, deviations: Sequence[Deviation]) -> types.CallToolResult:
    """A verb's arguments off its closed schema: refused, nothing run or recorded."""
    found = deviations_json(deviations)
    lines = [f"refused: the arguments of {tool!r} deviate:", *deviation_lines(found)]
    return tool_error("\n".join(lines), {"tool": tool, "deviations": found})


def with_plan_state(
    result: types.CallToolResult, plane: Plane, plan_id: str
) -> types.CallToolResult:
    """``result`` with where the plan stands now in its ``_meta`` (``evidence/plan_state``,
    ``commands.plane.plans.plan_brief``): an agent never acts on an older state than its
    own last call left. The MCP gate and the stdio proxy answer every call with it."""
    meta = {**(result.meta or {}), PLAN_STATE_META: plan_brief(plane, plan_id)}
    return result.model_copy(update={"meta": meta})


def refused(message: str) -> types.CallToolResult:
    """A refused command (the plan's state allows no call, a forged token …)."""
    return tool_error(f"error: {message}", {"error": message})


def upstream_failed(result: types.CallToolResult, gate: GateOutcome) -> types.CallToolResult:
    """The tool's own error, passed on as it said it (its content), then one line of
    the plane's: how the failed call was routed (it spends an iteration, as a deviation
    does). Its ``structuredContent`` stays behind (a client may check it against the
    tool's output schema)."""
    return types.CallToolResult(
        content=[*result.content, types.TextContent(text=f"evidence: {routing_line(gate)}")],
        is_error=True,
        _meta={
            REFUSAL_META: {
                "upstream_error": True,
                "routed": gate.routed,
                "iterations_left": gate.iterations_left,
            }
        },
    )


def answer(data: dict[str, Any]) -> types.CallToolResult:
    """A verb's answer: its JSON as text and as ``structuredContent``."""
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(data, indent=2))], structured_content=data
    )


def plane_tools() -> list[types.Tool]:
    """The plane's agent-side verbs (``evidence.*``) as MCP tools."""
    return [
        types.Tool(name=t.name, description=t.description, input_schema=t.input_schema)
        for t in PLANE_TOOLS.values()
    ]


def call_verb(plane: Plane, plan_id: str, verb: PlaneTool, arguments: Any) -> types.CallToolResult:
    """One of the plane's verbs: its arguments checked against its closed schema (a
    deviation is refused, nothing runs), then run. A refusal of the verb itself
    (``LedgerError``) is the caller's to answer (``refused``)."""
    deviations = check_plane_arguments(verb, arguments)
    if deviations:
        return arguments_refused(verb.name, deviations)
    return answer(verb.run(plane, plan_id, arguments))


def step_of(meta: Mapping[str, Any] | None) -> tuple[str, Any]:
    """The step the agent names in ``_meta`` (else a fresh ``mcp-ULID``) and its declared
    output; a malformed one is refused (``CommandRefused``) before anything is done."""
    meta = meta or {}
    step = meta.get(STEP_META)
    if step is None:
        step = f"mcp-{ULID()}"
    elif not isinstance(step, str) or not STEP_ID.fullmatch(step):
        raise CommandRefused(
            f"_meta {STEP_META!r} must be letters, digits and . _ : - (starting with a "
            "letter or digit, at most 128 characters)"
        )
    schema = meta.get(OUTPUT_SCHEMA_META)
    if schema is not None:
        try:
            prepare_schema(schema)
        except InvalidSchemaError as exc:
            raise CommandRefused(f"_meta {OUTPUT_SCHEMA_META!r}: {exc}") from None
    return step, schema
