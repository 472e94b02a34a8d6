"""The service's OpenAPI 3.1 document, written from the route table (``routes.py``).

Every endpoint appears with its method, its query parameters, its request body's schema
(the very schema the body is checked against) and each answer it gives: 200 with its
schema, and the refusals of its kind of route (``routes.ERRORS``). OpenAPI 3.1 schemas
are JSON Schema 2020-12, which is what the checker reads, so the schemas go in as they
are — but for those several answers share (an error, a gate's check, a deviation, a
plan's state, a JSON-RPC error, a plan, a hook's input and answer …): each is named once
under ``components/schemas`` and referred to by ``$ref`` wherever it appears, so that a
client generator (tests/commands/service/test_openapi_client.py: openapi-python-client)
makes one type of each, not one per route.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import ledger

from .people_schemas import PLACE
from .routes import (
    CONFINEMENT,
    DEVIATION,
    DOOR_ERRORS,
    ERROR,
    ERRORS,
    FAILURE,
    GATE,
    HOOK_ANSWER,
    HOOK_INPUT,
    JSONRPC_ERROR,
    MCP_TRANSPORT_ERRORS,
    PLAN_DOC,
    PLAN_STATE,
    PROTECTED_RESOURCE,
    SANDBOX,
    UNKNOWN_TOOLS,
    WOULD_BIND,
    Endpoint,
)

OPENAPI_VERSION = "3.1.0"
SECURITY_SCHEME = "credential"
OPERATOR_SCHEME = "operator_signature"
OPERATOR_AUTH = (
    "`Evidence-Operator key=FINGERPRINT, time=UNIX_SECONDS, signature=BASE64`: the "
    "operator's (on /v1/operator) or approver's (on /v1/approver) key's Ed25519 "
    "signature (domain `request`) over the method, the path, the time and the body's "
    "SHA-256, within five minutes of the service's clock "
    '(docs/service.md, "Operators through the service"). The key never travels.'
)
# The schemas several answers share, named once under components/schemas and referred to
# wherever they appear (a code generator makes one type of each, not one per route).
SHARED: dict[str, dict[str, Any]] = {
    "Error": ERROR,
    "Gate": GATE,
    "Deviation": DEVIATION,
    "PlanState": PLAN_STATE,
    "JsonRpcError": JSONRPC_ERROR,
    "Plan": PLAN_DOC,
    "Sandbox": SANDBOX,
    "WouldBind": WOULD_BIND,
    "Confinement": CONFINEMENT,
    "Failure": FAILURE,
    "HookInput": HOOK_INPUT,
    "HookAnswer": HOOK_ANSWER,
    "UnknownTools": UNKNOWN_TOOLS,
    "ProtectedResourceMetadata": PROTECTED_RESOURCE,
    "Place": PLACE,
}
CHALLENGE = (
    'Bearer (RFC 6750): the realm, error="invalid_token" when a token was given, '
    "error_description (the reason, and how a credential is obtained) and "
    "resource_metadata, the URL of the protected-resource metadata (RFC 9728): "
    "/.well-known/oauth-protected-resource/mcp for /mcp, else "
    "/.well-known/oauth-protected-resource."
)


def _referred(value: Any, names: dict[int, str], top: bool = False) -> Any:
    """``value`` with every shared schema in it (the very object, by identity) replaced by
    a ``$ref`` to its name; ``top``: ``value`` is itself a shared schema, kept whole."""
    if isinstance(value, dict):
        name = None if top else names.get(id(value))
        if name is not None:
            return {"$ref": f"#/components/schemas/{name}"}
        return {k: _referred(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_referred(v, names) for v in value]
    return value


def _responses(endpoint: Endpoint) -> dict[str, Any]:
    ok_content = {endpoint.media_type: {"schema": endpoint.ok}}
    answers: dict[str, Any] = {"200": {"description": "The answer.", "content": ok_content}}
    errors = {**ERRORS[endpoint.access], **endpoint.errors}
    for status, why in sorted(errors.items()):
        answer: dict[str, Any] = {
            "description": why,
            "content": {"application/json": {"schema": _error_schema(endpoint, status)}},
        }
        if status == 401:
            answer["headers"] = {
                "WWW-Authenticate": {"description": CHALLENGE, "schema": {"type": "string"}}
            }
        if status == 503 and endpoint.access != "open":
            answer["headers"] = {
                "Retry-After": {
                    "description": "Seconds to wait when the in-flight bound was reached.",
                    "schema": {"type": "integer"},
                }
            }
        answers[str(status)] = answer
    if endpoint.access == "mcp":
        answers["202"] = {"description": "A notification (or a response) accepted: no body."}
        for status, why in MCP_TRANSPORT_ERRORS.items():
            media, schema = (
                ("text/plain", {"type": "string"})
                if status == 413
                else ("application/json", JSONRPC_ERROR)
            )
            answers[str(status)] = {"description": why, "content": {media: {"schema": schema}}}
        answers = dict(sorted(answers.items()))
    return answers


def _error_schema(endpoint: Endpoint, status: int) -> dict[str, Any]:
    """The body of a refusal: ``Error``; at /mcp a JSON-RPC error (what the SDK's client
    surfaces), but for the door's refusals, made before any route is known (a 403 is
    either)."""
    if endpoint.access != "mcp" or (status in DOOR_ERRORS and status != 403):
        return ERROR
    if status == 403:
        return {"anyOf": [ERROR, JSONRPC_ERROR]}
    return JSONRPC_ERROR


def _operation(endpoint: Endpoint) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": endpoint.operation_id,
        "summary": endpoint.summary,
        "tags": [
            {
                "open": "operations",
                "agent": "agent",
                "hook": "hooks",
                "mcp": "mcp",
                "operator": "operators",
                "approver": "approvers",
            }[endpoint.access]
        ],
        "responses": _responses(endpoint),
    }
    if endpoint.access == "open":
        operation["security"] = []  # no credential needed
    if endpoint.access in ("operator", "approver"):
        operation["security"] = [{OPERATOR_SCHEME: []}]  # a signature, no bearer
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": schema}
        for name, schema in endpoint.path_params.items()
    ] + [
        {"name": name, "in": "query", "required": False, "schema": schema}
        for name, schema in endpoint.query.items()
    ]
    if parameters:
        operation["parameters"] = parameters
    if endpoint.body is not None:
        operation["requestBody"] = {
            "required": endpoint.access in ("hook", "mcp"),
            "content": {"application/json": {"schema": endpoint.body}},
        }
    return operation


def openapi_document(endpoints: Iterable[Endpoint]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(endpoint)
    names = {id(schema): name for name, schema in SHARED.items()}
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "Evidence Ledger plane service",
            "version": ledger.__version__,
            "description": "The evidence plane as a service: an agent gates, records, "
            "validates and applies its plan with a bearer credential an operator issued "
            "for that plan (docs/service.md).",
        },
        "paths": _referred(paths, names),
        "components": {
            "schemas": {
                name: _referred(schema, names, top=True) for name, schema in SHARED.items()
            },
            "securitySchemes": {
                SECURITY_SCHEME: {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An agent credential (`evidence credential issue`).",
                },
                OPERATOR_SCHEME: {
                    "type": "apiKey",
                    "in": "header",
                    "name": "Authorization",
                    "description": OPERATOR_AUTH,
                },
            },
        },
        "security": [{SECURITY_SCHEME: []}],
    }
