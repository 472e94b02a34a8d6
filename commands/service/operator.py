"""The routes of the people who govern the plane (docs/service.md, "Operators through the
service"): an operator's ``/v1/operator/prepare`` and ``/v1/operator/commit``, an
approver's ``/v1/approver/pending``, ``prepare`` and ``decide``.

An operator on another machine acts through the service without the service holding
their key: the request is signed by the operator key (``commands.rules.operator_requests``),
the command is decided by the plane and answered unsigned (``commands.plane.signers``:
``prepare``), the operator signs each event for its place where they sit, and the signed
events come back to be appended as signed (``commit``), each signature checked where its
event will stand. The verbs are the CLI's operator commands, run by the same handlers.
An approver's decision is signed the same way: the plane builds the record (the
escalation's leaf hash in it), the approver signs it where they sit, and the plane
verifies it against their key before it records it (``record_decision``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import anyio
import anyio.to_thread
import msgspec
from starlette.requests import Request
from starlette.responses import Response

from commands.errors import CommandRefused
from commands.plane.approvals import set_approval_policy
from commands.plane.attachments import attach, detach
from commands.plane.core import Plane
from commands.plane.credentials import Unauthenticated, issue_credential, revoke_credential
from commands.plane.escalations import pending_evidence
from commands.plane.lifecycle import (
    add_public_key,
    decision_stands,
    decision_to_sign,
    record_decision,
    revoke_approver,
)
from commands.plane.registry import define_skill, register_tool, register_validation
from commands.plane.signers import commit, prepare
from commands.rules.operator_requests import SKEW_S, parse_authorization, request_record
from commands.rules.signing import SigningError, verify_record
from commands.schemas.checker import check
from ledger.events import AnyEvent
from ledger.keys import public_key_from_b64

from .bodies import BadRequest, body_of
from .routes import Endpoint, closed

__all__ = ["VERBS", "committed", "operator_of", "prepared"]

ACTOR = "operator"
STRING = {"type": "string", "minLength": 1, "maxLength": 2000}
OBJECT = {"type": "object"}
# A raw Ed25519 public key in base64: 32 bytes. Only an approver's is added through the
# service: an operator key is the plane key's alone to make (on the service's host).
B64_KEY = "^[A-Za-z0-9+/]{43}=$"


Verb = Callable[[Plane, dict[str, Any]], Any]
# verb -> (its arguments' closed schema, the handler)
VERBS: dict[str, tuple[dict[str, Any], Verb]] = {
    "credential.issue": (
        closed(
            {
                "plan_id": STRING,
                "ttl_s": {"type": "integer", "minimum": 1},
                "credential_id": STRING,
                "secret_sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            },
            ["plan_id", "ttl_s", "credential_id", "secret_sha256"],
        ),
        lambda plane, a: issue_credential(
            plane,
            a["plan_id"],
            ttl=timedelta(seconds=a["ttl_s"]),
            credential_id=a["credential_id"],
            secret_sha256=a["secret_sha256"],
            actor=ACTOR,
        ),
    ),
    "credential.revoke": (
        closed({"credential_id": STRING, "reason": {"type": "string"}}, ["credential_id"]),
        lambda plane, a: revoke_credential(
            plane, a["credential_id"], a.get("reason", ""), actor=ACTOR
        ),
    ),
    "tool.register": (
        closed({"spec": OBJECT}, ["spec"]),
        lambda plane, a: register_tool(plane, a["spec"], actor=ACTOR),
    ),
    "validation.register": (
        closed({"spec": OBJECT}, ["spec"]),
        lambda plane, a: register_validation(plane, a["spec"], actor=ACTOR),
    ),
    "skill.define": (
        closed({"spec": OBJECT}, ["spec"]),
        lambda plane, a: define_skill(plane, a["spec"], actor=ACTOR),
    ),
    "attachment.attach": (
        closed(
            {
                "validation": STRING,
                "resource": STRING,
                "project": STRING,
                "plan": STRING,
                "args": OBJECT,
            },
            ["validation", "resource"],
        ),
        lambda plane, a: attach(
            plane,
            a["validation"],
            resource=a["resource"],
            project=a.get("project"),
            plan=a.get("plan"),
            args=a.get("args"),
            actor=ACTOR,
        ),
    ),
    "approvals.set": (
        closed(
            {
                "min_approvals": {"type": "integer", "minimum": 1, "maximum": 9},
                "separate_duties": {"type": "boolean"},
            },
            ["min_approvals", "separate_duties"],
        ),
        lambda plane, a: set_approval_policy(
            plane,
            min_approvals=a["min_approvals"],
            separate_duties=a["separate_duties"],
            actor=ACTOR,
        ),
    ),
    "keys.add": (
        closed(
            {"name": STRING, "public_key": {"type": "string", "pattern": B64_KEY}},
            ["name", "public_key"],
        ),
        lambda plane, a: add_public_key(
            plane, a["name"], _public(a["public_key"]), role="approver", actor=ACTOR
        ),
    ),
    "keys.revoke": (
        closed({"name": STRING, "reason": {"type": "string"}}, ["name"]),
        lambda plane, a: revoke_approver(plane, a["name"], reason=a.get("reason", ""), actor=ACTOR),
    ),
    "attachment.detach": (
        closed({"attachment_id": STRING, "reason": {"type": "string"}}, ["attachment_id"]),
        lambda plane, a: detach(plane, a["attachment_id"], reason=a.get("reason", ""), actor=ACTOR),
    ),
}


def _public(text: str) -> Any:
    try:
        return public_key_from_b64(text)
    except (SigningError, ValueError) as exc:
        raise BadRequest(422, f"args: /public_key: not an Ed25519 public key ({exc})") from None


def operator_of(
    plane: Plane,
    header: str | None,
    method: str,
    path: str,
    body: bytes,
    role: str = "operator",
) -> str:
    """The name of the person whose key signed this request (``Unauthenticated``
    otherwise): an active key of ``role`` (operator, approver) in the ledger, within
    ``SKEW_S`` of now."""
    try:
        key_print, at, signature = parse_authorization(header)
    except ValueError as exc:
        raise Unauthenticated(str(exc)) from None
    if abs(time.time() - at) > SKEW_S:
        raise Unauthenticated(f"the request's time is more than {SKEW_S} s from the service's")
    key = plane.log().approver_keys().get(key_print)
    if key is None or key.role != role or key.status != "active":
        raise Unauthenticated(f"the request is not signed by an active {role} key of the ledger")
    record = request_record(method, path, at, body)
    try:
        public = public_key_from_b64(key.public_key)
        good = verify_record(public, record, signature, domain="request")
    except (SigningError, ValueError):
        good = False
    if not good:
        raise Unauthenticated("the request's operator signature does not verify")
    return str(key.name)


def prepared(plane: Plane, operator: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """The command decided, unsigned, with each event's place (nothing appended)."""
    schema, verb = VERBS[str(body["verb"])]
    args = dict(body["args"])
    deviations = check(schema, args)
    if deviations:
        first = deviations[0]
        raise BadRequest(
            422, f"args: {first.pointer or '/'}: {first.kind} (expected {first.expected})",
            deviations,
        )  # fmt: skip
    found, _result = prepare(lambda: verb(plane, args))
    stream = found[0].place.stream if found else None
    return {
        "operator": operator,
        "stream": stream,
        "version": found[0].place.version - 1 if found else None,
        "prepared": [p.to_json() for p in found],
        "unchanged": not found,
    }


def committed(plane: Plane, body: Mapping[str, Any]) -> dict[str, Any]:
    """The signed events appended as signed, each checked where it stands."""
    try:
        payloads = [msgspec.convert(p, AnyEvent) for p in body["payloads"]]
    except msgspec.ValidationError as exc:
        raise CommandRefused(f"payloads: not events of the ledger ({exc})") from None
    stream, version = str(body["stream"]), int(body["version"])
    recorded = commit(plane.run, stream, version, payloads, actor=ACTOR)
    return {
        "appended": [
            {
                "position": e.position,
                "stream": e.stream,
                "version": e.stream_version,
                "type": e.type,
            }
            for e in recorded
        ]
    }


def _pending(plane: Plane, _name: str, _body: Mapping[str, Any]) -> dict[str, Any]:
    """What waits for a decision, with what an approver decides on
    (``escalations.pending_evidence``)."""
    return {"decisions": pending_evidence(plane)}


def _to_sign(plane: Plane, _name: str, body: Mapping[str, Any]) -> dict[str, Any]:
    record = decision_to_sign(
        plane,
        str(body["decision_id"]),
        choice=str(body["choice"]),
        guidance=body.get("guidance"),
        reason=body.get("reason"),
    )
    return {"record": record}


def _decided(plane: Plane, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
    record = dict(body["record"])
    decided = record_decision(plane, record, str(body["fingerprint"]), str(body["signature"]))
    stands = decision_stands(plane, decided.plan_id, decided.decision_id)
    return {"decision": msgspec.to_builtins(decided), "stands": stands}


ROUTES: dict[str, Callable[[Plane, str, Mapping[str, Any]], dict[str, Any]]] = {
    "operator_prepare": prepared,
    "operator_commit": lambda plane, _name, body: committed(plane, body),
    "approver_pending": _pending,
    "approver_prepare": _to_sign,
    "approver_decide": _decided,
}


def published(service: Any) -> dict[str, Any]:
    """A checkpoint published now (``public.PublicReads.publish_checkpoint``): the one
    published after it, and whether it was this one (not: the witnesses' quorum did not
    cosign it)."""
    before = service.published
    after = service.publish_checkpoint()
    return {
        "checkpoint": after.note if after is not None else None,
        "size": after.size if after is not None else None,
        "published": after is not None and after is not before,
    }


async def serve(service: Any, endpoint: Endpoint, request: Request) -> Response:
    """An operator route: the request's signature, its body, the command."""
    try:
        data = await service._body_within(request)
        header, path = request.headers.get("authorization"), request.url.path

        def operate(plane: Plane) -> dict[str, Any]:
            role = endpoint.access  # operator or approver
            name = operator_of(plane, header, endpoint.method, path, data, role)  # first
            body = body_of(endpoint, data)
            if endpoint.operation_id == "operator_checkpoint":
                return {}  # the service's to do, off this plane (``published``)
            return ROUTES[endpoint.operation_id](plane, name, body)

        answer = await service.in_thread(operate)
        if endpoint.operation_id == "operator_checkpoint":
            answer = await anyio.to_thread.run_sync(lambda: published(service))
        return service.json(answer)
    except Unauthenticated as exc:
        return service.error(endpoint, 401, str(exc))
    except Exception as exc:
        return service.refusal(endpoint, request, exc)
