"""Rounds of questions (docs/agents.md, "The stateless revision"): a tool's MCP server of
the stateless MCP revision (2026-07-28) answers a call with questions for the agent's
client (``input_required``: an elicitation, a sampling, the client's roots) instead of
its result, and the agent calls again with the same arguments and its answers.

Both halves are recorded in the plan's stream:

- ``asked`` (``mcp.input_required``), after the server's answer: the round's id, the
  tool and its arguments' digest, the questions kept as a blob. Nothing of the call is
  kept (the sandbox is put back, as for any call that did not pass); the round stays
  open in the plan's document (``/rounds``).
- ``given`` (``mcp.input_given``), before the server gets the answers: the answers kept
  as a blob, and the round they answer, which it closes. A round is answered once, by a
  call of its tool with its arguments: a second answer, or one to another tool or with
  other arguments, is refused before the server is called (the plan's rule, which the
  audit checks again), so a person's answer cannot be replayed to act twice.

Which round a retry answers is the door's to say (the service seals it in the
``requestState`` it gives the agent: ``commands.service.mcp``); this module trusts it
only as far as the plan's document agrees.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from ulid import ULID

from commands.runner.mcp_client import json_bytes
from ledger.events import Exchange, McpInputGiven, McpInputRequired
from projections.states import PlanState

from .core import CommandRefused, Plane, StreamState
from .gates import sha256_hex
from .phases import require_plan

__all__ = ["MAX_ANSWERS", "asked", "given"]

MAX_ANSWERS = 64  # answers in one retry (a server asks a few questions a round)


def asked(
    plane: Plane,
    plan: PlanState,
    tool: str,
    step: str | None,
    raw_params: bytes,
    result: Mapping[str, Any],
    duration_ms: int,
    said: tuple[bytes, Exchange] | None = None,
) -> McpInputRequired:
    """Record the server's questions (``result``: its ``input_required`` answer as JSON),
    and what it said meanwhile (``said``: the messages' JSON, kept as a blob, and their
    counts), as a call records it."""
    questions = result.get("inputRequests") or {}
    methods = {
        str(key): str(q.get("method", "")) if isinstance(q, Mapping) else ""
        for key, q in questions.items()
    }
    kept = json_bytes(dict(result))
    event = McpInputRequired(
        plan_id=plan.plan_id,
        round_id=str(ULID()),
        tool=tool,
        step=step,
        attempt=plan.attempt,
        params_sha256=sha256_hex(raw_params),
        asked_sha256=sha256_hex(kept),
        asked=methods,
        duration_ms=duration_ms,
        exchange_sha256=sha256_hex(said[0]) if said else msgspec.UNSET,
        exchange=said[1] if said else msgspec.UNSET,
    )
    blobs = [raw_params, kept, *([said[0]] if said else [])]
    plane.run(f"plan:{plan.plan_id}", lambda _state: [event], actor="agent", blobs=blobs)
    return event


def given(
    plane: Plane,
    plan_id: str,
    tool: str,
    raw_params: bytes,
    answers: Mapping[str, Any],
    round_id: str | None,
) -> McpInputGiven:
    """Record the agent's answers before the server gets them; with ``round_id``, close
    that round (refused when it is not open for this tool and these arguments)."""
    if len(answers) > MAX_ANSWERS:
        raise CommandRefused(f"at most {MAX_ANSWERS} answers in one call")
    kept = json_bytes(dict(answers))
    event = McpInputGiven(
        plan_id=plan_id,
        tool=tool,
        params_sha256=sha256_hex(raw_params),
        round_id=round_id if round_id is not None else msgspec.UNSET,
        given_sha256=sha256_hex(kept),
        given=sorted(str(key) for key in answers),
    )

    def decide(state: StreamState) -> list[McpInputGiven]:
        plan = require_plan(state, plan_id)
        if round_id is None:
            return [event]
        rounds = plan.rounds if plan.rounds is not msgspec.UNSET else {}
        open_round = rounds.get(round_id)
        if open_round is None:
            raise CommandRefused(
                "these answers are for a round of questions that was answered already "
                "(or never asked in this plan): call the tool again without them"
            )
        if (open_round.tool, open_round.params_sha256) != (tool, event.params_sha256):
            raise CommandRefused(
                "these answers are for a call of another tool or with other arguments"
            )
        return [event]

    plane.run(f"plan:{plan_id}", decide, actor="agent", blobs=[raw_params, kept])
    return event
