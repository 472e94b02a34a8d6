"""Schema parts the service's route table is written with (``routes``): ``closed``, and
the bodies and answers of the people's routes — an operator's prepared and signed
commands, an approver's pending escalations and signed decisions (docs/service.md,
"Operators through the service")."""

from __future__ import annotations

from typing import Any

__all__ = [
    "DECISION_ASKED",
    "DECISION_SIGNED",
    "OPERATOR_COMMAND",
    "OPERATOR_COMMITTED",
    "OPERATOR_PREPARED",
    "OPERATOR_SIGNED",
    "OPERATOR_VERBS",
    "PENDING",
    "PLACE",
    "closed",
]

OBJECT = {"type": "object"}


def closed(
    properties: dict[str, Any], required: list[str] | tuple[str, ...] = ()
) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


OPERATOR_VERBS = (
    "credential.issue",
    "credential.revoke",
    "tool.register",
    "validation.register",
    "skill.define",
    "attachment.attach",
    "attachment.detach",
    "approvals.set",
    "keys.add",
    "keys.revoke",
)
OPERATOR_COMMAND = closed(
    {"verb": {"enum": list(OPERATOR_VERBS)}, "args": OBJECT}, ["verb", "args"]
)
PLACE = closed(
    {
        "ledger": {"type": "string"},
        "stream": {"type": "string"},
        "version": {"type": "integer", "minimum": 1},
        "type": {"type": "string"},
    },
    ["ledger", "stream", "version", "type"],
)
OPERATOR_PREPARED = closed(
    {
        "operator": {"type": "string"},
        "stream": {"type": ["string", "null"]},
        "version": {"type": ["integer", "null"]},
        "prepared": {
            "type": "array",
            "items": closed({"place": PLACE, "payload": OBJECT}, ["place", "payload"]),
        },
        "unchanged": {"type": "boolean"},
    },
    ["operator", "stream", "version", "prepared", "unchanged"],
)
OPERATOR_SIGNED = closed(
    {
        "stream": {"type": "string", "minLength": 1, "maxLength": 300},
        "version": {"type": "integer", "minimum": 0},
        "payloads": {"type": "array", "items": OBJECT, "minItems": 1, "maxItems": 16},
    },
    ["stream", "version", "payloads"],
)
OPERATOR_COMMITTED = closed(
    {
        "appended": {
            "type": "array",
            "items": closed(
                {
                    "position": {"type": "integer"},
                    "stream": {"type": "string"},
                    "version": {"type": "integer"},
                    "type": {"type": "string"},
                },
                ["position", "stream", "version", "type"],
            ),
        }
    },
    ["appended"],
)


PENDING = closed(
    {
        "plan_id": {"type": "string"},
        "decision_id": {"type": "string"},
        "options": {"type": "array", "items": {"type": "string"}},
        "reason": {"type": "string"},
        "expires_at": {"type": "string"},
        "approvals_required": {"type": "integer"},
        "approvals": {"type": "object", "additionalProperties": {"type": "string"}},
        "strategy": {"type": "string"},
        "failures": {"type": "array", "items": OBJECT},
    },
    ["plan_id", "decision_id", "options", "reason"],
)
_TEXT = {"type": "string", "maxLength": 20000}
DECISION_ASKED = closed(
    {
        "decision_id": {"type": "string", "minLength": 1, "maxLength": 64},
        "choice": {"enum": ["revise", "abandon"]},
        "guidance": _TEXT,
        "reason": _TEXT,
    },
    ["decision_id", "choice"],
)
DECISION_SIGNED = closed(
    {
        "record": closed(
            {
                "decision_id": {"type": "string"},
                "plan_id": {"type": "string"},
                "choice": {"enum": ["revise", "abandon"]},
                "guidance": {"type": ["string", "null"]},
                "reason": {"type": ["string", "null"]},
                "escalation_hash": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                "signed_at": {"type": "string"},
            },
            ["decision_id", "plan_id", "choice", "escalation_hash", "signed_at"],
        ),
        "fingerprint": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "signature": {"type": "string", "maxLength": 200},
    },
    ["record", "fingerprint", "signature"],
)
