"""The service's one route table: every endpoint with its method, path, access, request
and response schemas and the plane operation it runs. The app (``app.py``) mounts the
routes from it and the OpenAPI document (``openapi.py``) is written from it, so the two
cannot drift; a request body is checked against the very schema the document shows.

The operations call the plane's existing Python API and nothing else: the agent verbs
are the MCP proxy's (``commands.plane.proxy_verbs``: plan status, validate, fix, apply),
the gates and calls are ``gate_input`` / ``gate_output`` / ``call_tool``, the hooks are
``pre_tool`` / ``post_tool`` answered with ``hook_answer`` — exactly what ``evidence
hook`` prints. Each runs for the plan of the request's credential, never one the body
names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from commands.plane.answers import call_answer, gate_answer
from commands.plane.core import Plane
from commands.plane.gates import GateOutcome, gate_input, gate_output
from commands.plane.hooks import (
    MAX_TOOL_NAME,
    STEP_ID,
    HookCall,
    HookKind,
    UnknownTools,
    hook_answer,
    json_bytes,
    post_tool,
    pre_tool,
)
from commands.plane.proxy_verbs import PLANE_TOOLS, PREFIX
from commands.plane.runs import call_tool

from .people_schemas import (
    DECISION_ASKED,
    DECISION_SIGNED,
    OPERATOR_COMMAND,
    OPERATOR_COMMITTED,
    OPERATOR_PREPARED,
    OPERATOR_SIGNED,
    PENDING,
    closed,
)

# open: no credential; agent, hook: the JSON routes of the credential's plan; mcp: the
# plane's MCP gate over streamable HTTP (its messages are MCP's: opaque to this table).
Access = Literal["open", "agent", "hook", "mcp", "operator", "approver"]
# RFC 9728's well-known path: the service's metadata, and (suffixed) that of /mcp
WELL_KNOWN = "/.well-known/oauth-protected-resource"
CREDENTIALS_DOC = "/docs/credentials"


@dataclass(frozen=True)
class Outcome:
    """What an operation answers (``body``, 200) and what the metrics count of it."""

    body: dict[str, Any]
    gates: tuple[GateOutcome | None, ...] = ()
    validation: str | None = None  # the outcome of a validation run
    hook: tuple[HookKind, int] | None = None  # the hook and the exit it answered


# (plane, the credential's plan, the checked body) -> the outcome
Operation = Callable[[Plane, str, dict[str, Any]], Outcome]
# (plane, the credential's plan, the hook input, --unknown-tools) -> the outcome
HookOperation = Callable[[Plane, str, HookCall, UnknownTools], Outcome]


@dataclass(frozen=True)
class Endpoint:
    method: Literal["GET", "POST"]
    path: str
    operation_id: str
    summary: str
    access: Access
    ok: dict[str, Any]  # the schema of a 200 answer (JSON), or of its text
    body: dict[str, Any] | None = None  # the closed schema of a JSON body, checked
    query: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> schema
    path_params: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> schema
    run: Operation | None = None
    hook: HookOperation | None = None
    hook_kind: HookKind | None = None
    media_type: str = "application/json"
    # the route's own path where a parameter spans path segments (Starlette's {name:path})
    route: str | None = None
    # answers other than 200 this endpoint gives beyond those of its access (ERRORS)
    errors: dict[int, str] = field(default_factory=dict)


# -- schemas ----------------------------------------------------------------------------

PLAN = {
    "type": "string",
    "minLength": 1,
    "maxLength": 256,
    "description": "The plan the request is for: must be the credential's (it may be left "
    "out; the credential names the plan).",
}
SERVER = {
    "type": "string",
    "pattern": "^[A-Za-z0-9._-]{1,64}$",
    "description": "A registered MCP server's name (its tools' mcp_server).",
}
STEP = {
    "type": "string",
    "pattern": f"^{STEP_ID.pattern}$",
    "description": "The step the call serves: letters, digits and . _ : - (at most 128).",
}
TOOL = {"type": "string", "minLength": 1, "maxLength": MAX_TOOL_NAME}
ANY = {"description": "Any JSON value: its structure is the gate's to judge."}
UNKNOWN_TOOLS = {
    "enum": ["deny", "record"],
    "description": "A tool the registry does not know: deny (default) blocks it as an "
    "invented tool; record lets it through and records its call (as --unknown-tools).",
}

OBJECT = {"type": "object"}
# The plan as `evidence plan show --json` prints it, and where its sandbox is: named once
# (components/schemas) so that a client generator makes one type of each, not one per route.
PLAN_DOC = {
    "type": "object",
    "description": "The plan's state, folded from its stream (as `evidence plan show --json`).",
}
SANDBOX = {"type": "object", "description": "Where the plan's sandbox is and what it copies."}
WOULD_BIND = {
    "type": "array",
    "items": {"type": "object"},
    "description": "The validations the plan would pin if it entered Execute now.",
}
CONFINEMENT = closed(
    {
        "policy": {"enum": ["landlock", "none"]},
        "landlock": {"type": "integer"},
        "unconfined": {"type": "integer"},
    },
    ["policy", "landlock", "unconfined"],
)
OPTIONAL_TEXT = {"type": ["string", "null"]}
FAILURE = closed(
    {
        "position": {"type": "integer"},
        "run_id": {"type": "string"},
        "validation": {"type": "string"},
        "mode": {"type": "string"},
        "verdict": {"type": ["boolean", "null"]},
        "cause": OPTIONAL_TEXT,
        "message": OPTIONAL_TEXT,
        "error": OPTIONAL_TEXT,
        "stdout_tail": OPTIONAL_TEXT,
        "stderr_tail": OPTIONAL_TEXT,
    },
    ["position", "run_id", "validation", "mode", "verdict", "cause", "message", "error",
     "stdout_tail", "stderr_tail"],
)  # fmt: skip
# Where the plan stands once the answer's step is recorded (commands.plane.plans.plan_brief)
PLAN_STATE = {
    "type": "object",
    "description": "The plan as the step left it: an agent never acts on an older state.",
    "required": ["phase", "revision", "attempt", "needs_fix", "terminal", "pending_decision"],
    "properties": {
        "phase": {"enum": ["strategize", "execute", "apply"]},
        "revision": {"type": "integer"},
        "attempt": {"type": "integer"},
        "needs_fix": {"type": "boolean"},
        "terminal": {"enum": [None, "failed", "applied"]},
        "pending_decision": {"type": ["string", "null"]},
        # when the pending decision's time runs out (a plan with decision_timeout_s)
        "decision_expires_at": {"type": "string"},
        # with k of n approvers: how many must sign one choice, how many have signed
        "approvals_required": {"type": "integer"},
        "approvals_given": {"type": "integer"},
    },
    "additionalProperties": False,
}
DEVIATION = closed(
    {
        "pointer": {"type": "string"},
        "kind": {"type": "string"},
        "expected": {"type": "string"},
        "actual_type": {"type": "string"},
        "schema_pointer": {"type": "string"},
    },
    ["pointer", "kind", "expected", "actual_type"],
)
GATE = {
    "type": "object",
    "required": ["gate", "verdict", "deviations", "routed", "iterations_left", "positions"],
    "properties": {
        "gate": {"enum": ["input", "output"]},
        "verdict": {"enum": ["pass", "fail"]},
        "deviations": {"type": "array", "items": DEVIATION},
        "routed": {"enum": [None, "retry", "revised", "escalated", "compensation"]},
        "iterations_left": {"type": ["integer", "null"]},
        "positions": {"type": "array", "items": {"type": "integer"}},
    },
}
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {"type": "string", "description": "What was refused and why, in one line."},
        "deviations": {"type": "array", "items": DEVIATION},
        # on the hook routes, every answer is one a hook command can exit with
        "exit": {"enum": [2], "description": "The hook command's exit: 2, a block."},
        "stderr": {"type": "string"},
    },
}
HOOK_ANSWER = closed(
    {
        "exit": {"enum": [0, 2], "description": "The hook command's exit status."},
        "stderr": {"type": "string", "description": "What it prints on stderr, exactly."},
    },
    ["exit", "stderr"],
)
HOOK_INPUT = {
    "type": "object",
    "description": "The hook input an agent CLI sends (Claude Code's PreToolUse / "
    "PostToolUse JSON), exactly as `evidence hook` reads it on stdin; keys other than "
    "these are ignored.",
    "required": ["tool_name", "tool_input"],
    "properties": {
        "hook_event_name": {"enum": ["PreToolUse", "PostToolUse"]},
        "tool_name": TOOL,
        "tool_input": ANY,
        "tool_response": ANY,
        "tool_use_id": {"type": "string", "pattern": f"^{STEP_ID.pattern}$"},
    },
}


# /mcp carries MCP's JSON-RPC messages: their schemas are the MCP specification's, not
# this document's (the SDK's transport reads them; the gate checks a call's arguments).
MCP_MESSAGE = {
    "type": "object",
    "description": "One JSON-RPC 2.0 message of the Model Context Protocol (streamable "
    "HTTP transport): initialize, tools/list, tools/call, a notification … Its schema is "
    "MCP's (modelcontextprotocol.io), not this document's.",
}
MCP_ANSWER = {
    "type": "object",
    "description": "The JSON-RPC response (application/json; at /mcp/{server} a tool "
    "call is answered as text/event-stream when the client accepts it): a tool call "
    "refused by a gate is a result with isError and the deviations, never an HTTP error.",
}
JSONRPC_ERROR = {
    "type": "object",
    "required": ["jsonrpc", "error"],
    "properties": {
        "jsonrpc": {"const": "2.0"},
        "id": {"type": ["string", "integer", "null"]},
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "integer"},
                "message": {"type": "string"},
                "data": {"description": "More about the error (the service's: its status)."},
            },
        },
    },
}
# RFC 9728 (OAuth 2.0 Protected Resource Metadata), as the MCP authorization
# specification asks of a server whose 401 names it: the members this service gives. No
# authorization_servers: no OAuth authorization server issues its credentials, an
# operator does (docs/service.md, "MCP over HTTP").
PROTECTED_RESOURCE = {
    "type": "object",
    "description": "OAuth 2.0 Protected Resource Metadata (RFC 9728) of the service.",
    "required": ["resource", "resource_name", "bearer_methods_supported"],
    "properties": {
        "resource": {
            "type": "string",
            "format": "uri",
            "description": "The resource's identifier: the URL the metadata was asked for "
            "with /.well-known/oauth-protected-resource taken out (the service, or its /mcp).",
        },
        "resource_name": {"type": "string"},
        "bearer_methods_supported": {"type": "array", "items": {"enum": ["header"]}},
        "resource_documentation": {
            "type": "string",
            "format": "uri",
            "description": "How a credential is obtained: an operator issues it.",
        },
    },
}
# What the MCP transport (the SDK's) answers itself on /mcp, with a JSON-RPC error body,
# before any message reaches the gate; nothing appended.
MCP_TRANSPORT_ERRORS: dict[int, str] = {
    400: "not a JSON-RPC message of MCP (a parse error, an invalid request); nothing appended",
    406: "the Accept header does not include application/json and text/event-stream",
    415: "the body is not application/json",
}


def with_plan(schema: dict[str, Any]) -> dict[str, Any]:
    """A verb's closed argument schema, which may also name the plan (the credential's)."""
    return {**schema, "properties": {**schema["properties"], "plan": PLAN}}


# -- operations -------------------------------------------------------------------------


def _gate_input(plane: Plane, plan_id: str, body: dict[str, Any]) -> Outcome:
    params = json_bytes(body["params"])  # the bytes checked and kept: compact JSON
    found = gate_input(plane, plan_id, body["tool"], params, step=body.get("step"))
    return Outcome(gate_answer(plane, plan_id, found), gates=(found,))


def _gate_output(plane: Plane, plan_id: str, body: dict[str, Any]) -> Outcome:
    output = json_bytes(body["output"])
    found = gate_output(plane, plan_id, body["step"], output)
    return Outcome(gate_answer(plane, plan_id, found), gates=(found,))


def _call(plane: Plane, plan_id: str, body: dict[str, Any]) -> Outcome:
    report = call_tool(
        plane,
        plan_id,
        body["tool"],
        json_bytes(body["params"]),
        step=body.get("step"),
    )
    answer = call_answer(plane, plan_id, report)
    return Outcome(answer, gates=(report.input_gate, report.output_gate))


def _verb(name: str) -> Operation:
    """The MCP proxy's agent verb ``evidence.NAME``: the same code, the same answer."""
    verb = PLANE_TOOLS[PREFIX + name]

    def run(plane: Plane, plan_id: str, body: dict[str, Any]) -> Outcome:
        answer = verb.run(plane, plan_id, {k: v for k, v in body.items() if k != "plan"})
        found = answer.get("validation")
        return Outcome(answer, validation=found["outcome"] if found is not None else None)

    return run


def _hook(kind: HookKind) -> HookOperation:
    decide = pre_tool if kind == "pre" else post_tool

    def run(plane: Plane, plan_id: str, call: HookCall, unknown: UnknownTools) -> Outcome:
        verdict = decide(plane, plan_id, call, unknown=unknown)
        answer = hook_answer(verdict, plan_id, kind)
        report = verdict.report
        gates = (verdict.gate,) if report is None else (report.input_gate, report.output_gate)
        return Outcome(answer.to_json(), gates=gates, hook=(kind, answer.exit))

    return run


def _verb_schema(name: str) -> dict[str, Any]:
    return with_plan(PLANE_TOOLS[PREFIX + name].input_schema)


# -- the table --------------------------------------------------------------------------

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "GET",
        "/healthz",
        "healthz",
        "The process answers (liveness): no database, no credential.",
        "open",
        ok=closed({"status": {"const": "ok"}}, ["status"]),
    ),
    Endpoint(
        "GET",
        "/readyz",
        "readyz",
        "The database answers (readiness): the ledger's head is read; 503 when it cannot be.",
        "open",
        ok=closed(
            {"status": {"const": "ready"}, "head_size": {"type": "integer", "minimum": 0}},
            ["status", "head_size"],
        ),
        errors={503: "the database does not answer"},
    ),
    Endpoint(
        "GET",
        "/metrics",
        "metrics",
        "Prometheus text exposition: requests, latency, gate checks, deviations, "
        "validation outcomes, hook answers, in-flight operations, the ledger's head size, "
        "the published checkpoint's size and age; with --workers, every process's added up.",
        "open",
        ok={"type": "string"},
        media_type="text/plain; version=0.0.4",
    ),
    Endpoint(
        "GET",
        "/checkpoint",
        "checkpoint",
        "The latest checkpoint the service published: a C2SP signed note of the log's "
        "size and root, signed by the plane key (404 before the first).",
        "open",
        ok={"type": "string"},
        media_type="text/plain; charset=utf-8",
    ),
    Endpoint(
        "GET",
        "/tile/{tile}",
        "tile",
        "The log as C2SP tlog-tiles: tile/<L>/<N>[.p/<W>] (hashes, for any tile client), "
        "and tile/entries/<N>[.p/<W>] (the events' bytes; only with serve --tile-entries). "
        "Each names one content for good: cached for a year.",
        "open",
        ok={"type": "string", "format": "binary"},
        media_type="application/octet-stream",
        path_params={
            "tile": {
                "type": "string",
                "description": "The rest of the path after /tile/, as C2SP tlog-tiles writes it.",
                "pattern": "^(entries|[0-9]{1,2})/(x[0-9]{3}/)*[0-9]{3}(\\.p/[0-9]{1,3})?$",
            }
        },
        route="/tile/{tile:path}",
        errors={404: "no such tile (not a tile path, not in the log yet, or entries not served)"},
    ),
    Endpoint(
        "GET",
        "/openapi.json",
        "openapi",
        "This document: OpenAPI 3.1, written from the service's route table.",
        "open",
        ok=OBJECT,
    ),
    Endpoint(
        "GET",
        WELL_KNOWN,
        "protected_resource",
        "The service's protected-resource metadata (RFC 9728): its bearer credentials and "
        "where to read how one is obtained. No credential needed.",
        "open",
        ok=PROTECTED_RESOURCE,
    ),
    Endpoint(
        "GET",
        WELL_KNOWN + "/mcp",
        "mcp_protected_resource",
        "The protected-resource metadata (RFC 9728) of /mcp, which its 401 names in "
        "WWW-Authenticate (resource_metadata), as the MCP authorization specification asks.",
        "open",
        ok=PROTECTED_RESOURCE,
    ),
    Endpoint(
        "GET",
        WELL_KNOWN + "/mcp/{server}",
        "mcp_server_protected_resource",
        "The protected-resource metadata (RFC 9728) of /mcp/{server}, which its 401 names.",
        "open",
        ok=PROTECTED_RESOURCE,
        path_params={"server": SERVER},
    ),
    Endpoint(
        "GET",
        CREDENTIALS_DOC,
        "credentials_doc",
        "How an agent obtains its credential (an operator issues it): the "
        "resource_documentation of the protected-resource metadata, in plain text.",
        "open",
        ok={"type": "string"},
        media_type="text/plain; charset=utf-8",
    ),
    Endpoint(
        "GET",
        "/v1/plan",
        "plan_status",
        "The credential's plan: its state, where its sandbox is, the validations it would "
        "pin at Execute, how its programs ran and why its last validation run failed (as "
        "the MCP proxy's evidence.plan_status and `evidence plan show --json`).",
        "agent",
        ok=closed(
            {
                "plan": {"anyOf": [PLAN_DOC, {"type": "null"}]},
                "sandbox": SANDBOX,
                "would_bind": {"anyOf": [WOULD_BIND, {"type": "null"}]},
                "confinement": CONFINEMENT,
                "failures": {"type": "array", "items": FAILURE},
            },
            ["plan", "sandbox", "would_bind", "confinement", "failures"],
        ),
        query={"plan": PLAN},
        run=_verb("plan_status"),
    ),
    Endpoint(
        "POST",
        "/v1/gate/input",
        "gate_input",
        "The input gate on a proposed call, recorded (as `evidence gate input --json`): a "
        "deviation is a verdict in the answer, routed by the plan's strict_mode.",
        "agent",
        ok=closed({"gate": GATE, "plan_state": PLAN_STATE}, ["gate", "plan_state"]),
        body=closed({"tool": TOOL, "params": ANY, "step": STEP, "plan": PLAN}, ["tool", "params"]),
        run=_gate_input,
    ),
    Endpoint(
        "POST",
        "/v1/gate/output",
        "gate_output",
        "The output gate on a step's returned structure, recorded (as `evidence gate "
        "output --json`), against the registry's output schema of the step's tool: a "
        "schema of the agent's own is not accepted through the service.",
        "agent",
        ok=closed({"gate": GATE, "plan_state": PLAN_STATE}, ["gate", "plan_state"]),
        body=closed({"step": STEP, "output": ANY, "plan": PLAN}, ["step", "output"]),
        run=_gate_output,
    ),
    Endpoint(
        "POST",
        "/v1/call",
        "call",
        "Gate, run and record a tool call (as `evidence call --json`): the tool's program "
        "or MCP server runs in the plan's sandbox, on the service's side.",
        "agent",
        ok=closed(
            {
                "input_gate": GATE,
                "call": {"type": ["object", "null"]},
                "output_gate": {"anyOf": [GATE, {"type": "null"}]},
                "halt": {"type": ["object", "null"]},
                "plan_state": PLAN_STATE,
            },
            ["input_gate", "call", "output_gate", "halt", "plan_state"],
        ),
        body=closed(
            {
                "tool": TOOL,
                "params": ANY,
                "step": STEP,
                "plan": PLAN,
            },
            ["tool", "params"],
        ),
        run=_call,
    ),
    Endpoint(
        "POST",
        "/v1/strategy",
        "record_strategy",
        "Record the plan's strategy in Strategize, the first or a revised one after the "
        "failure loop sent the plan back (as evidence.record_strategy); then /v1/execute.",
        "agent",
        ok=closed({"plan": PLAN_DOC, "would_bind": WOULD_BIND}, ["plan", "would_bind"]),
        body=_verb_schema("record_strategy"),
        run=_verb("record_strategy"),
    ),
    Endpoint(
        "POST",
        "/v1/execute",
        "execute",
        "Enter Execute with the recorded strategy: a fresh attempt, the validations pinned, "
        "the sandbox ready (as evidence.execute). The body is {} (or empty).",
        "agent",
        ok=closed({"plan": PLAN_DOC, "sandbox": SANDBOX}, ["plan", "sandbox"]),
        body=_verb_schema("execute"),
        run=_verb("execute"),
    ),
    Endpoint(
        "POST",
        "/v1/validate",
        "validate",
        "Run the plan's pinned validations and classify the outcome (as evidence.validate); "
        "a pass carries the token. The body is {} (or empty).",
        "agent",
        ok=closed({"validation": OBJECT, "plan_state": PLAN_STATE}, ["validation", "plan_state"]),
        body=_verb_schema("validate"),
        run=_verb("validate"),
    ),
    Endpoint(
        "POST",
        "/v1/fix",
        "record_fix",
        "Record the fix made after a failing validation (as evidence.record_fix).",
        "agent",
        ok=closed({"plan": PLAN_DOC}, ["plan"]),
        body=_verb_schema("record_fix"),
        run=_verb("record_fix"),
    ),
    Endpoint(
        "POST",
        "/v1/apply",
        "apply",
        "Apply the plan with the token its passing validation minted (as evidence.apply).",
        "agent",
        ok=closed(
            {"plan": PLAN_DOC, "files": {"type": "array", "items": OBJECT}}, ["plan", "files"]
        ),
        body=_verb_schema("apply"),
        run=_verb("apply"),
    ),
    Endpoint(
        "POST",
        "/mcp",
        "mcp",
        "The plane's MCP gate (streamable HTTP, stateless, JSON answers): the plan's MCP "
        "tools the operator registered, by their registered names and schemas, and the "
        "plane's evidence.* verbs; each tools/call gated, called and recorded as "
        "/v1/call does (docs/service.md, MCP over HTTP).",
        "mcp",
        ok=MCP_ANSWER,
        body=MCP_MESSAGE,
        query={"plan": PLAN},
    ),
    Endpoint(
        "POST",
        "/mcp/{server}",
        "mcp_server",
        "One registered MCP server through the plane's MCP gate (streamable HTTP, "
        "stateless): the server's tools the plan may call under the server's own names "
        "and their registered schemas, beside the plane's evidence.* verbs, each "
        "tools/call gated, called and recorded as at /mcp; its resources, prompts, "
        "completions and log level forwarded to the plan's server, every resource read "
        "and prompt fetch recorded. A tool call is answered as an SSE stream (with the "
        "server's log and progress messages) when the client accepts one "
        "(docs/service.md, One server's door).",
        "mcp",
        ok=MCP_ANSWER,
        body=MCP_MESSAGE,
        query={"plan": PLAN},
        path_params={"server": SERVER},
    ),
    Endpoint(
        "POST",
        "/v1/hooks/pre-tool",
        "hook_pre_tool",
        "PreToolUse: the input gate on the agent's proposed call. The answer is the exit "
        "status and stderr `evidence hook pre-tool --plan P` would give.",
        "hook",
        ok=HOOK_ANSWER,
        body=HOOK_INPUT,
        query={"plan": PLAN, "unknown_tools": UNKNOWN_TOOLS},
        hook=_hook("pre"),
        hook_kind="pre",
    ),
    Endpoint(
        "POST",
        "/v1/hooks/post-tool",
        "hook_post_tool",
        "PostToolUse: the call recorded and the output gate on its response. The answer "
        "is the exit status and stderr `evidence hook post-tool --plan P` would give.",
        "hook",
        ok=HOOK_ANSWER,
        body=HOOK_INPUT,
        query={"plan": PLAN, "unknown_tools": UNKNOWN_TOOLS},
        hook=_hook("post"),
        hook_kind="post",
    ),
    Endpoint(
        "POST",
        "/v1/operator/prepare",
        "operator_prepare",
        "An operator's command (register a tool, attach a validation, issue a credential "
        "…) decided by the plane and answered unsigned, with the place each event will "
        "stand at: the operator signs them where they sit. Nothing is appended.",
        "operator",
        ok=OPERATOR_PREPARED,
        body=OPERATOR_COMMAND,
    ),
    Endpoint(
        "POST",
        "/v1/operator/commit",
        "operator_commit",
        "The events of a prepared command, signed by the operator for their places: "
        "appended as signed when each signature verifies under an active operator key "
        "of the ledger where its event will stand (409 when the stream moved: prepare "
        "again).",
        "operator",
        ok=OPERATOR_COMMITTED,
        body=OPERATOR_SIGNED,
    ),
    Endpoint(
        "POST",
        "/v1/operator/checkpoint",
        "operator_checkpoint",
        "Publish a checkpoint now (signed by the plane key; with the service's witness "
        "policy, only once its quorum cosigned it), as the schedule does: the one "
        "published after the request, and whether this request published it.",
        "operator",
        ok=closed(
            {
                "checkpoint": {"type": ["string", "null"]},
                "size": {"type": ["integer", "null"]},
                "published": {"type": "boolean"},
            },
            ["checkpoint", "size", "published"],
        ),
        body=closed({}),
    ),
    Endpoint(
        "POST",
        "/v1/approver/pending",
        "approver_pending",
        "The escalations waiting for a human decision: each plan, its decision id, the "
        "options and the reason it escalated.",
        "approver",
        ok=closed({"decisions": {"type": "array", "items": PENDING}}, ["decisions"]),
        body=closed({}),
    ),
    Endpoint(
        "POST",
        "/v1/approver/prepare",
        "approver_prepare",
        "The record an approver signs to decide a pending escalation (the decision, its "
        "plan, the escalation event's leaf hash, the choice, the guidance, the reason, "
        "the time), built by the plane: the approver signs it where they sit.",
        "approver",
        ok=closed({"record": OBJECT}, ["record"]),
        body=DECISION_ASKED,
    ),
    Endpoint(
        "POST",
        "/v1/approver/decide",
        "approver_decide",
        "A decision signed by the approver's key: recorded when the escalation is still "
        "pending and the signature verifies under an active approver key of the ledger.",
        "approver",
        ok=closed({"decision": OBJECT, "stands": {"type": "boolean"}}, ["decision", "stands"]),
        body=DECISION_SIGNED,
    ),
)

# What every route answers before anything else (commands/service/door.py): a web page's
# request, and one meant for another name.
DOOR_ERRORS = {
    403: "an Origin not on EVIDENCE_ALLOWED_ORIGINS (a web page's request)",
    421: "the Host is none of the service's names (EVIDENCE_ALLOWED_HOSTS adds one)",
}
# The answers other than 200 each kind of route gives, and what each means.
ERRORS: dict[Access, dict[int, str]] = {
    "open": DOOR_ERRORS,
    "agent": {
        **DOOR_ERRORS,
        401: "no credential, or one the plane does not accept (malformed, unknown, revoked, "
        "expired, not signed by an operator); nothing appended",
        403: f"{DOOR_ERRORS[403]}, before the credential is looked at; or the request names "
        "a plan other than the credential's; nothing appended",
        408: "the body did not arrive within EVIDENCE_BODY_TIMEOUT seconds; nothing appended",
        409: "refused: a step the plan's state does not allow (or a forged or spent token); "
        "nothing appended",
        413: "the body is larger than the cap on agent bytes (EVIDENCE_MAX_AGENT_BYTES)",
        422: "the body or the query breaks the input rules or its closed schema (the "
        "deviations listed); nothing appended",
        429: "the credential already holds its share of the in-flight bound (Retry-After); "
        "nothing started",
        500: "a defect of the service (see its log)",
        503: "too many operations in flight or requests waiting for their credential's check "
        "(Retry-After), or the database does not answer; nothing started",
    },
}
ERRORS["mcp"] = {
    status: ERRORS["agent"][status] for status in (401, 403, 408, 413, 421, 422, 429, 500, 503)
} | {
    401: f"{ERRORS['agent'][401]}; WWW-Authenticate names /mcp's protected-resource "
    "metadata (resource_metadata, RFC 9728). At /mcp every refusal of the service is a "
    "JSON-RPC error, its message the reason, its data the HTTP status",
    422: "the query names a parameter other than plan, or the server's name is not one; "
    "nothing appended",
    500: "a defect of the service (see its log); a fault inside a message's handling is a "
    "JSON-RPC error instead",
}
ERRORS["operator"] = {
    **DOOR_ERRORS,
    401: "no operator signature on the request, or one that does not verify under an "
    "active operator key of the ledger, or made more than five minutes from now; "
    "nothing appended",
    408: ERRORS["agent"][408],
    409: "refused: the command's own refusal, a stream that moved since it was prepared, "
    "or an event whose signature does not stand where it would; nothing appended",
    413: ERRORS["agent"][413],
    422: "the body breaks the input rules, its closed schema or its verb's arguments; "
    "nothing appended",
    500: ERRORS["agent"][500],
    503: "the database does not answer; nothing started",
}
ERRORS["approver"] = {
    **ERRORS["operator"],
    401: "no approver signature on the request, or one that does not verify under an "
    "active approver key of the ledger, or made more than five minutes from now; "
    "nothing appended",
    409: "refused: no such pending escalation (decided already, or a blocker), or a "
    "decision whose signature does not verify; nothing appended",
}
ERRORS["hook"] = {
    **ERRORS["agent"],
    409: "a refused command (plan not in Execute, a call already recorded, an ambiguous "
    "MCP tool …): exit 2 with the CLI's one error line; nothing appended",
    422: "the hook input is refused by the input layer or lacks a used field: exit 2 "
    "with the CLI's one error line; nothing appended",
}
