"""The plane's agent-side verbs the MCP gate proxy offers beside the upstream's tools:
the plan's status, validate, record a fix, apply with a token.

These are the verbs an agent may run from the CLI too (``plan show``, ``validate``,
``fix``, ``apply``); each answers the JSON its CLI verb prints with ``--json``.
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
from projections.documents import to_json

from .core import Plane
from .lifecycle import apply_plan, record_fix
from .plans import get_plan, sandbox_paths
from .runs import validate_plan

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
    doc = get_plan(plane, plan_id)
    return {"plan": to_json(doc), "sandbox": sandbox_paths(plane, doc)}


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
    "content that passed."
)


def _validate(plane: Plane, plan_id: str, _args: dict[str, Any]) -> dict[str, Any]:
    return {"validation": validate_plan(plane, plan_id).to_json()}


def _fix(plane: Plane, plan_id: str, args: dict[str, Any]) -> dict[str, Any]:
    diff = args.get("diff")
    doc = record_fix(plane, plan_id, args["note"], diff=diff.encode() if diff else None)
    return {"plan": to_json(doc)}


def _apply(plane: Plane, plan_id: str, args: dict[str, Any]) -> dict[str, Any]:
    doc = apply_plan(plane, plan_id, args["token"].strip())
    files = doc.applied.files if doc.applied is not None else []
    return {"plan": to_json(doc), "files": [to_json(f) for f in files]}


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
