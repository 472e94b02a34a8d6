"""The fixture's multi-round-trip tools and prompt (MCP 2026-07-28, SEP-2322): instead of
asking the client mid-call, the server answers ``input_required`` with the questions
(``inputRequests``) and, where it needs to remember something, a ``requestState``; the
client retries the same request with its ``inputResponses`` and the state echoed.

Written from the ``input-required-result-*`` scenarios of the conformance suite's 0.2.0
alpha (their descriptions give the tools, keys and texts). The state is sealed by the
SDK's ``RequestStateBoundary`` (``fixture_server.build_server`` installs it, under a key
of this process): a tampered one is refused with -32602 before a handler runs. Each
handler names the scenario(s) it serves.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types

PREFIX = "test_input_required_result_"
PROMPT = "test_input_required_result_prompt"
CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"


def _elicit(message: str, field: str, kind: str = "string") -> dict[str, Any]:
    schema = {"type": "object", "properties": {field: {"type": kind}}, "required": [field]}
    return {
        "method": "elicitation/create",
        "params": {"message": message, "requestedSchema": schema},
    }


def _sample(text: str, max_tokens: int) -> dict[str, Any]:
    message = {"role": "user", "content": {"type": "text", "text": text}}
    return {
        "method": "sampling/createMessage",
        "params": {"messages": [message], "maxTokens": max_tokens},
    }


ROOTS = {"method": "roots/list", "params": {}}

# tool (after the prefix) -> the questions of its first round
FIRST_ROUND: dict[str, dict[str, dict[str, Any]]] = {
    "elicitation": {"user_name": _elicit("What is your name?", "name")},  # basic-elicitation …
    "sampling": {"capital_question": _sample("What is the capital of France?", 100)},
    "list_roots": {"client_roots": ROOTS},  # basic-list-roots
    "request_state": {"confirm": _elicit("Please confirm", "ok", "boolean")},
    "tampered_state": {"confirm": _elicit("Please confirm", "ok", "boolean")},
    "multiple_inputs": {
        "user_name": _elicit("What is your name?", "name"),
        "greeting": _sample("Generate a greeting", 50),
        "client_roots": ROOTS,
    },
    "multi_round": {"step1": _elicit("Step 1: What is your name?", "name")},
    "capabilities": {
        "user_name": _elicit("What is your name?", "name"),
        "capital_question": _sample("What is the capital of France?", 100),
    },
}
# tools that keep a requestState between rounds (the others need none)
STATEFUL = {"request_state", "tampered_state", "multiple_inputs", "multi_round"}

TOOLS = [
    types.Tool(
        name=PREFIX + name,
        description=f"Asks the client for input first (SEP-2322: {name.replace('_', ' ')})",
        input_schema={"type": "object", "properties": {}},
    )
    for name in FIRST_ROUND
]


def _asked(questions: dict[str, dict[str, Any]], state: str | None) -> types.InputRequiredResult:
    return types.InputRequiredResult.model_validate(
        {"inputRequests": questions, **({"requestState": state} if state else {})}
    )


def _declared(meta: Any) -> set[str]:
    """What the client declared it can answer, from its request's envelope (2026-07-28)."""
    found = (meta or {}).get(CLIENT_CAPABILITIES) if isinstance(meta, dict) else None
    if found is None and meta is not None:
        found = getattr(meta, "model_extra", {}).get(CLIENT_CAPABILITIES)
    return set(found) if isinstance(found, dict) else set()


def _answers(params: Any) -> dict[str, Any]:
    given = params.input_responses or {}
    return {
        key: value.model_dump(by_alias=True, mode="json", exclude_none=True)
        if hasattr(value, "model_dump")
        else value
        for key, value in given.items()
    }


def call(
    name: str, params: types.CallToolRequestParams
) -> types.CallToolResult | types.InputRequiredResult:
    """One round of the tool ``PREFIX + name``."""
    tool = name.removeprefix(PREFIX)
    questions, answers = FIRST_ROUND[tool], _answers(params)
    state = params.request_state
    if tool == "capabilities":  # capability-check: only what the client declared
        declared = _declared(params.meta)
        kinds = {"elicitation/create": "elicitation", "sampling/createMessage": "sampling"}
        questions = {k: q for k, q in questions.items() if kinds[q["method"]] in declared}
        return _asked(questions, None) if questions else _done("Nothing to ask this client.")
    if tool == "multi_round" and state == "round-2":  # multi-round, third call
        if "step2" in answers:
            return _done(f"Completed both steps: {json.dumps(answers['step2'])}")
        return _asked(
            {"step2": _elicit("Step 2: What is your favorite color?", "color")}, "round-2"
        )
    missing = [key for key in questions if key not in answers]
    if missing or (tool in STATEFUL and state is None):
        # first round, or missing-input-response: ask (again) for what is missing
        return _asked(
            {k: questions[k] for k in (missing or questions)},
            "round-1" if tool in STATEFUL else None,
        )
    if tool == "multi_round":  # step 1 answered: the second round
        return _asked(
            {"step2": _elicit("Step 2: What is your favorite color?", "color")}, "round-2"
        )
    if tool == "elicitation":
        content = answers["user_name"].get("content") or {}
        return _done(f"Hello, {content.get('name')}!")
    if tool in ("request_state", "tampered_state"):
        return _done(f"state-ok: confirmed {json.dumps(answers['confirm'])}")
    return _done(f"Received: {json.dumps(answers, sort_keys=True)}")


def _done(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


PROMPTS = [
    types.Prompt(name=PROMPT, description="A prompt that asks the user for its context first")
]


def get_prompt(
    params: types.GetPromptRequestParams,
) -> types.GetPromptResult | types.InputRequiredResult:
    """non-tool-request: ``prompts/get`` asks too."""
    context = (_answers(params).get("user_context") or {}).get("content") or {}
    if "context" not in context:
        question = _elicit("What context should the prompt use?", "context")
        return _asked({"user_context": question}, None)
    text = f"Prompt with context: {context['context']}"
    message = types.PromptMessage(role="user", content=types.TextContent(type="text", text=text))
    return types.GetPromptResult(messages=[message])
