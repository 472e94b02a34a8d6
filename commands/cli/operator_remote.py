"""An operator's command through the service, signed where the operator sits
(``--server``; docs/service.md, "Operators through the service").

The operator's key stays on this machine (``--operator-key`` or ``EVIDENCE_OPERATOR_KEY``;
never made here). The command is sent to ``/v1/operator/prepare`` in a request this key
signs; the plane decides it and answers its events unsigned, each with the place it will
stand at. Each event is checked to be the one asked for (``expect``: the same credential,
tool, attachment…), signed here for its place, and sent to ``/v1/operator/commit``,
which appends it as signed. A stream that moved meanwhile is prepared again (at most
``ATTEMPTS`` times).

Who answers is checked before anything is sent, as ``evidence-hook`` checks
(``commands.hook_client``): a unix socket only where no other user could have put it,
https only to a trusted (or ``EVIDENCE_SERVER_CA``-pinned) certificate, never plain http.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from commands.errors import CommandRefused
from commands.hook_client import Blocked, Server, connect_checked, server_of
from commands.rules.operator_requests import authorization
from commands.rules.signing import OPERATOR_KEY_ENV, Place, policy_record, sign_record
from ledger import EventPayload
from ledger.events import AnyEvent, PolicySignature, SignedPlace
from ledger.keys import fingerprint, load_private_key

__all__ = [
    "ATTEMPTS",
    "Remote",
    "act",
    "checkpoint_now",
    "decide",
    "expecting",
    "pending",
    "remote",
]

ATTEMPTS = 3
TIMEOUT_S = 60.0
Expect = Callable[[EventPayload], str | None]  # why the event is not the one asked for


@dataclass(frozen=True)
class Remote:
    """The service (checked), and the operator key that signs here."""

    server: Server
    key: Ed25519PrivateKey


def remote(url: str, key_path: str | None) -> Remote:
    """The service at ``url`` and the operator key at ``key_path`` (else
    ``EVIDENCE_OPERATOR_KEY``), checked before anything is sent."""
    path = key_path or os.environ.get(OPERATOR_KEY_ENV)
    if not path:
        raise CommandRefused(
            f"--server needs the operator key: --operator-key PATH or {OPERATOR_KEY_ENV}"
        )
    try:
        key = load_private_key(Path(path))
        server = server_of(url)
        connect_checked(server, TIMEOUT_S).close()
    except Blocked as exc:
        raise CommandRefused(str(exc)) from None
    except OSError as exc:
        raise CommandRefused(f"the evidence service at {url} is unreachable ({exc})") from None
    return Remote(server, key)


def expecting(event_type: type, what: str, **fields: Any) -> Expect:
    """The check that a prepared event is the one asked for: of exactly ``event_type``,
    with these ``fields``' values (else: "another event than ``what``")."""

    def expect(p: EventPayload) -> str | None:
        ok = type(p) is event_type and all(getattr(p, k, None) == v for k, v in fields.items())
        return None if ok else f"another event than {what}"

    return expect


def act(to: Remote, verb: str, args: dict[str, Any], expect: Expect) -> dict[str, Any]:
    """Prepare ``verb`` with ``args``, check and sign what the plane decided, commit it:
    the service's answer (``appended``), or the prepare's when nothing changed."""
    for _attempt in range(ATTEMPTS):
        prepared = _post(to, "/v1/operator/prepare", {"verb": verb, "args": args})
        if prepared["unchanged"]:
            return prepared
        payloads = [
            _signed(to, prepared["operator"], item, expect) for item in prepared["prepared"]
        ]
        body = {"stream": prepared["stream"], "version": prepared["version"], "payloads": payloads}
        try:
            return {**_post(to, "/v1/operator/commit", body), "prepared": prepared["prepared"]}
        except _Moved:
            continue
    raise CommandRefused(f"the stream kept moving: {ATTEMPTS} attempts, none appended")


def _signed(to: Remote, operator: str, item: dict[str, Any], expect: Expect) -> dict[str, Any]:
    """One prepared event, checked to be the one asked for, signed for its place."""
    try:
        payload = msgspec.convert(item["payload"], AnyEvent)
        place = Place(**item["place"])
    except (msgspec.ValidationError, TypeError) as exc:
        raise CommandRefused(f"the service prepared something that is no event ({exc})") from None
    wrong = expect(payload) if payload.type_name() == place.type else "another type of event"
    if wrong is not None:
        raise CommandRefused(f"the service prepared {wrong}: not signed, nothing appended")
    signature = sign_record(to.key, policy_record(payload), domain="policy", place=place)
    signed = msgspec.structs.replace(
        payload,
        signed=PolicySignature(
            operator=operator,
            fingerprint=fingerprint(to.key.public_key()),
            signature=signature,
            place=SignedPlace(ledger=place.ledger, stream=place.stream, version=place.version),
        ),
    )
    return dict(msgspec.to_builtins(signed))


def checkpoint_now(to: Remote) -> dict[str, Any]:
    """Have the service publish a checkpoint now (an operator's signed request)."""
    return _post(to, "/v1/operator/checkpoint", {})


def pending(to: Remote) -> list[dict[str, Any]]:
    """The escalations waiting for a decision (an approver's signed request)."""
    return list(_post(to, "/v1/approver/pending", {})["decisions"])


def decide(to: Remote, asked: dict[str, Any]) -> dict[str, Any]:
    """Decide an escalation through the service: the plane builds the record, it is
    checked to be the decision asked for, signed here with the approver's key, and
    recorded once the plane verified it. The recorded decision."""
    record = _post(to, "/v1/approver/prepare", asked)["record"]
    for name in ("decision_id", "choice", "guidance", "reason"):
        if record.get(name) != asked.get(name):
            raise CommandRefused(
                f"the service prepared another decision ({name}): not signed, nothing recorded"
            )
    signature = sign_record(to.key, record, domain="decision")
    body = {
        "record": record,
        "fingerprint": fingerprint(to.key.public_key()),
        "signature": signature,
    }
    answer = _post(to, "/v1/approver/decide", body)
    return {**answer["decision"], "stands": bool(answer["stands"])}


class _Moved(Exception):
    """The stream moved between prepare and commit: prepare again."""


def _post(to: Remote, path: str, body: dict[str, Any]) -> dict[str, Any]:
    import httpx2

    data = json.dumps(body, separators=(",", ":")).encode()
    server = to.server
    full = f"{server.path}{path}"
    headers = {
        "Authorization": authorization(to.key, "POST", full, data),
        "Content-Type": "application/json",
    }
    if server.unix:
        transport = httpx2.HTTPTransport(uds=server.unix)
        base = "http://localhost"
    else:
        pinned = os.environ.get("EVIDENCE_SERVER_CA") or None
        transport = httpx2.HTTPTransport(verify=ssl.create_default_context(cafile=pinned))
        base = f"https://{server.netloc}"
    try:
        with httpx2.Client(transport=transport, timeout=TIMEOUT_S) as http:
            answer = http.post(f"{base}{full}", content=data, headers=headers)
    except httpx2.HTTPError as exc:
        raise CommandRefused(f"the evidence service at {server.url}: {exc}") from None
    try:
        found = answer.json()
    except ValueError:
        found = {}
    if answer.status_code == 200 and isinstance(found, dict):
        return found
    said = str(found.get("error", answer.text[:300])) if isinstance(found, dict) else ""
    if answer.status_code == 409 and "prepare it again" in said:
        raise _Moved(said)
    raise CommandRefused(f"the service refused ({answer.status_code}): {said}")
