"""The plane's agent-side verbs the MCP gate proxy offers beside the upstream's tools:
the plan's status, record a (revised) strategy, enter Execute, validate, record a fix,
apply with a token.

These are the verbs an agent may run from the CLI too (``plan show``, ``plan
strategize``, ``plan execute``, ``validate``, ``fix``, ``apply``); each answers the JSON
its CLI verb prints with ``--json`` (both built by ``commands.plane.answers``). The
strategy is the agent's to revise when the failure loop sends its plan back to
Strategize (within ``max_strategy_revisions``); an escalation stays a human's (no verb
here records a decision).
``authorize`` is never offered, nor any verb that records a decision, registers or
attaches: what decides stays with a human's key and the operator.

Their arguments are checked against closed schemas before anything runs, the same
way the gates check a tool's (no coercion); a deviation is answered, never recorded:
these calls are not tool calls of the plan, and the verbs record what they do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from commands.schemas.checker import check
from ledger.events import Deviation

from .answers import (
    applied_answer,
    execute_answer,
    fix_answer,
    plan_status,
    strategy_answer,
    validation_answer,
)
from .core import Plane
from .lifecycle import apply_plan, record_fix
from .phases import enter_execute, record_strategy
from .validation_runs import validate_plan

PREFIX = "evidence."

Verb = Callable[[Plane, str, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class PlaneTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    run: Verb


def _closed(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _status(plane: Plane, plan_id: str, _args: dict[str, Any]) -> dict[str, Any]:
    return plan_status(plane, plan_id).to_json()


# What the proxy tells an agent at `initialize` (MCP `instructions`).
INSTRUCTIONS = (
    "Every tool call goes through the evidence plane's gates: the input is checked against "
    "the tool's registered schema before the call is forwarded, the output after it; a "
    "deviation is an error naming every difference (no coercion), and the call counts as "
    "a failed iteration. The plan moves Strategize -> Execute -> Apply: work happens in "
    "the plan's sandbox during Execute; evidence.validate runs the plan's validations and "
    "classifies the outcome: pass (a token for evidence.apply), blocker (fix, record it "
    "with evidence.record_fix, validate again), escalate (a human decides), "
    "validator_error (a validation gave no verdict), environment_error (a program could "
    "not be invoked: install what the hint names, then retry unchanged) or internal_error. "
    "Only Apply, with a token from a pass, changes the real files, and only to the "
    "content that passed. When an attempt's iterations or retries are spent the plan goes "
    "back to Strategize: record a revised strategy with evidence.record_strategy, then "
    "evidence.execute starts a fresh attempt (evidence.plan_status shows where it is)."
)


def _strategy(plane: Plane, plan_id: str, args: dict[str, Any]) -> dict[str, Any]:
    return strategy_answer(plane, record_strategy(plane, plan_id, args["strategy"], actor="agent"))


def _execute(plane: Plane, plan_id: str, _args: dict[str, Any]) -> dict[str, Any]:
    return execute_answer(plane, enter_execute(plane, plan_id, actor="agent"))


def _validate(plane: Plane, plan_id: str, _args: dict[str, Any]) -> dict[str, Any]:
    return validation_answer(plane, plan_id, validate_plan(plane, plan_id))


def _fix(plane: Plane, plan_id: str, args: dict[str, Any]) -> dict[str, Any]:
    diff = args.get("diff")
    doc = record_fix(plane, plan_id, args["note"], diff=diff.encode() if diff else None)
    return fix_answer(doc)


def _apply(plane: Plane, plan_id: str, args: dict[str, Any]) -> dict[str, Any]:
    return applied_answer(apply_plan(plane, plan_id, args["token"].strip()))


_TEXT = {"type": "string", "minLength": 1, "maxLength": 1_000_000}

PLANE_TOOLS: dict[str, PlaneTool] = {
    t.name: t
    for t in (
        PlaneTool(
            f"{PREFIX}plan_status",
            "The plan's state: its phase, attempt, last outcome, halt, token, and where "
            "its sandbox is (the copies to work in until Apply).",
            _closed({}, []),
            _status,
        ),
        PlaneTool(
            f"{PREFIX}record_strategy",
            "Record the plan's strategy in Strategize: the first one, or a revised one "
            "after the failure loop sent the plan back (its attempt's iterations or "
            "retries spent). Then evidence.execute.",
            _closed(
                {"strategy": {**_TEXT, "description": "How the plan will be done."}}, ["strategy"]
            ),
            _strategy,
        ),
        PlaneTool(
            f"{PREFIX}execute",
            "Enter Execute with the recorded strategy: a fresh attempt, the plan's "
            "validations pinned, its sandbox ready. Answers the plan and its sandbox.",
            _closed({}, []),
            _execute,
        ),
        PlaneTool(
            f"{PREFIX}validate",
            "Run the plan's validations (the set pinned when it entered Execute) on its "
            "sandbox and classify the outcome, one of: pass (a token is minted: apply "
            "takes it), blocker (a required validation failed: fix, then validate again), "
            "escalate (a human decides; never with a token), validator_error (a "
            "validation gave no verdict: the operator looks), environment_error (a "
            "program could not be invoked: the hint names what to install), "
            "internal_error (a defect of the plane).",
            _closed({}, []),
            _validate,
        ),
        PlaneTool(
            f"{PREFIX}record_fix",
            "Record the fix made after a failing validation, before validating again.",
            _closed(
                {"note": {**_TEXT, "description": "What the fix changed."}, "diff": _TEXT},
                ["note"],
            ),
            _fix,
        ),
        PlaneTool(
            f"{PREFIX}apply",
            "Apply the plan with the token its last passing validation minted: the "
            "sandbox's changes are written into the resources (single use).",
            _closed({"token": _TEXT}, ["token"]),
            _apply,
        ),
    )
}


def check_plane_arguments(tool: PlaneTool, arguments: Any) -> list[Deviation]:
    """Every deviation of ``arguments`` from the verb's closed schema."""
    return check(tool.input_schema, arguments)
