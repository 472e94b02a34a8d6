"""The plane as a service: an ASGI app (Starlette) in front of the plane's Python API.

The service's process holds the plane key and the database credentials; an agent holds
neither and reaches its plan over HTTP with a bearer credential an operator issued for
that plan (docs/service.md). Nothing the plane decides changes: each route calls the
existing handlers (``routes.py``), in a worker thread, with a ``Plane`` from a small pool
(``pool.py``).

A request to an agent route goes through, in order, and stops at the first refusal:

1. the bearer token's presence and form (401, no database touched; every 401 names
   the service's protected-resource metadata, RFC 9728, and says how a credential is
   obtained: ``auth.challenge``);
2. the credential, checked by the plane (401; reads only) before a byte of the body is
   read — ``AUTH_POOL`` such checks at once, the others waiting their turn (at most
   ``AUTH_QUEUE`` in all: 503 beyond), so requests nobody vouches for hold nothing else;
3. a place in flight (``admission.py``): given out in turn among the credentials
   waiting, each holding at most its share, half the bound (429 with ``Retry-After``
   past it); a request waits at most ``EVIDENCE_ADMISSION_WAIT`` seconds for one (503
   with ``Retry-After`` after it: the service is saturated);
4. the query, checked against the route's closed set (422);
5. the body, read through the cap on agent bytes (413: never more than the cap is read,
   whoever sends it) within the body deadline (408: a stalled body gives its place up);
6. in one worker thread, with one look at the policy: the credential again (a
   revocation binds at once), the plan the query names (403); the body through the
   input layer, checked against the route's closed schema with the project's checker,
   no coercion (422), and the plan it names (403); then the plane operation: a
   ``CommandRefused`` is 409, and what it recorded is the answer.

``POST /mcp`` (the plane's MCP gate, ``mcp.py``) goes through steps 1-5 (its message
read within the deadline, then handed to the SDK's transport; each of those refusals
a JSON-RPC error, ``MCP_REFUSED``, which an MCP client shows); a refusal inside it (a
gate's deviation, a plan state that allows no call) is an MCP tool error in a 200, as
the stdio proxy answers it.

Every refusal appends nothing (the plane's handlers refuse before their one
transaction). The service's planes leave the read models to a follower thread
(``follower.py``): an answer is durable in the log when it is sent, and the read models
(``evidence status`` and the other queries) show it a moment later. A plane operation is
never abandoned half-way: a worker thread runs to its end even when the client goes
away or the server is told to stop, and uvicorn's graceful shutdown (SIGTERM) waits for
every request in flight before the pool is closed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import msgspec
import sqlalchemy.exc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from commands.errors import CommandRefused, said_by
from commands.plane import tracing
from commands.plane.core import Plane
from commands.plane.credentials import CredentialState
from commands.plane.expiry import expire_escalations
from commands.plane.hooks import HookCall, UnknownTools, read_hook_input, refused_answer
from commands.rules.signing import plane_key_path
from commands.runner.guards import KeptSnapshots
from commands.runner.mcp_sessions import WarmSessions
from commands.schemas.checker import check
from commands.text import inert
from ledger import LedgerError
from ledger.errors import LedgerOpenError, LedgerUnavailable
from ledger.events import Deviation
from ledger.intake import LIMITS, InputError, env_seconds, limit_bytes
from ledger.keys import fingerprint, load_private_key
from ledger.store import url_identity
from ledger.tlog_policy import Policy

from . import operator
from .admission import QUEUE, WAIT_S, Admission, Overloaded
from .auth import (
    OBTAIN,
    Forbidden,
    Unauthenticated,
    bearer_token,
    challenge,
    check_plan,
    credential_for,
)
from .bodies import BODY_SOURCE, BadRequest
from .bodies import body_of as _body
from .bodies import deviations_line as _deviations_line
from .checkpoints import Published
from .committer import GroupCommitter
from .door import DoorChecks
from .follower import ReadModelFollower
from .mcp import SCOPE_PLAN, SCOPE_SERVER, SCOPE_SLOT, McpGate, Slot, session_owner
from .metrics import Fleet, Metrics
from .openapi import openapi_document
from .pool import PlanePool
from .public import PublicReads
from .routes import CREDENTIALS_DOC, ENDPOINTS, SERVER, WELL_KNOWN, Endpoint, Outcome, closed
from .tiles import TileSource

__all__ = ["DEFAULT_MAX_IN_FLIGHT", "RETRY_AFTER_S", "Service", "create_app"]

DEFAULT_MAX_IN_FLIGHT = 8
RETRY_AFTER_S = 1
AUTH_POOL = 4  # credential checks at once for requests not yet authenticated
# Requests waiting for (or in) a credential check; 503 beyond. As many as may wait for a
# place: 128 agents asking at once are not a flood.
AUTH_QUEUE = QUEUE
CLIENT_CLOSED = 499  # the client went away before its request was whole
BODY_TIMEOUT_ENV = "EVIDENCE_BODY_TIMEOUT"  # seconds a request body may take to arrive
ADMISSION_WAIT_ENV = "EVIDENCE_ADMISSION_WAIT"  # seconds a request may wait for a place
DEFAULT_BODY_TIMEOUT_S = 10.0
# The JSON-RPC error code of a request the service refused before MCP read it (401, 403,
# 408, 413, 422, 429, 503 at /mcp): in the implementation-defined band, -32000..-32019,
# clear of the SDK's own -32000 and -32001. Its ``data`` holds the HTTP status.
MCP_REFUSED = -32010
RESOURCE_NAME = "Evidence Ledger plane service"
log = logging.getLogger("evidence.service")
T = TypeVar("T")
ROUND_SECRET = b"evidence/mcp-request-state/v1\0"  # the derivation's label
EXPIRE_EVERY_S = 15.0  # how often the service denies escalations whose time ran out


class Service(PublicReads):
    """One app's state: the plane pool, the in-flight bound and the metrics."""

    def __init__(
        self,
        db_url: str,
        *,
        max_in_flight: int,
        workdir: Path | None,
        mcp_sessions: bool = True,
        metrics_dir: Path | None = None,
        tile_entries: bool = False,
        witness_policy: Policy | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.db_url = db_url
        self.max_in_flight = max_in_flight
        # Changed on the event loop's thread only: the places in flight and who waits
        # for one (each credential at most its share), and credential checks under way.
        self.admission = Admission(max_in_flight, wait_s=admission_wait())
        self.authenticating = 0
        self._checks = anyio.Semaphore(AUTH_POOL)
        self.body_timeout_s = body_timeout()
        self.committer = GroupCommitter(
            lambda: Plane.open(db_url, create=False, workdir=workdir, inline_read_models=False)
        )
        # MCP servers kept open across a plan's calls (started on its first call).
        self.warm = WarmSessions()
        # Plans' sandbox snapshots kept across their calls (copied again only on change).
        self.snapshots = KeptSnapshots()
        self.pool = PlanePool(
            db_url, workdir=workdir, committer=self.committer, mcp_sessions=self.warm,
            snapshots=self.snapshots,
        )  # fmt: skip
        self.follower = ReadModelFollower(db_url)
        self.metrics = Metrics(routes=[(e.path, e.method) for e in ENDPOINTS])
        # One view of the metrics across `serve --workers N`'s processes.
        self.fleet = Fleet(metrics_dir) if metrics_dir is not None else None
        self.tiles = TileSource(entries=tile_entries)
        self.published: Published | None = None  # the checkpoint last kept, as this process saw it
        self.witness_policy = witness_policy  # cosigners a checkpoint needs to be published
        self.plane_key_fingerprint: str | None = None
        self.openapi = msgspec.json.encode(openapi_document(ENDPOINTS))
        # Worker threads for plane work: one per operation in flight, and room for the
        # readiness and metrics reads beside them.
        self._limiter: anyio.CapacityLimiter | None = None
        self.mcp = McpGate(self, sessions=mcp_sessions)
        self._stopping = threading.Event()
        self._expiring = threading.Thread(
            target=self._expire_due, name="escalation-expiry", daemon=True
        )
        self._checkpointing = threading.Thread(
            target=self._checkpoint_due, name="checkpoints", daemon=True
        )
        self._plane_key: Ed25519PrivateKey | None = None

    # -- life -------------------------------------------------------------------------

    def start(self) -> None:
        """Load the plane key once and open the ledger once, so that a service that
        cannot do its work refuses to start rather than failing its first request. The
        key is never made here: a missing one means the service runs as the wrong user
        or with the wrong EVIDENCE_PLANE_KEY, and a new key would vouch for nothing the
        ledger holds."""
        path = plane_key_path(self.db_url)
        if not os.path.lexists(path):
            raise LedgerOpenError(
                f"no plane key at {path}: run `evidence init` as the service's user, or "
                "set EVIDENCE_PLANE_KEY to the ledger's plane key"
            )
        key = load_private_key(path)
        self._plane_key = key
        self.plane_key_fingerprint = fingerprint(key.public_key())
        # The door's requestState is sealed under a secret every service of this ledger
        # derives alike, and no agent can: it holds no plane key.
        self.mcp.seal_rounds(hashlib.sha256(ROUND_SECRET + key.private_bytes_raw()).digest())
        # A ledger the first release wrote is identified before any request is served.
        self.pool.run(lambda plane: plane.identify())
        self._limiter = anyio.CapacityLimiter(self.max_in_flight + AUTH_POOL + 2)
        self.committer.start()
        self.follower.start()
        self._expiring.start()
        self._checkpointing.start()

    def _expire_due(self) -> None:
        """Every ``EXPIRE_EVERY_S``: deny the plans whose escalation expired undecided
        (``commands.plane.expiry``: a plane-signed ``plan.escalation_expired`` each)."""
        while not self._stopping.wait(EXPIRE_EVERY_S):
            try:
                self.pool.run(expire_escalations)
            except Exception as exc:  # the database is away: the next round tries again
                log.warning("escalation expiry: %s", exc)

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """The app's lifespan: started, its background work running, stopped."""
        # OTLP export when the `otel` extra is installed and an endpoint is configured
        # (docs/service.md, "Traces"); else nothing of OpenTelemetry is loaded here.
        tracing.configure_from_environment()
        self.start()
        log.info(
            "serving %s (plane key %s…), at most %d operations in flight",
            url_identity(self.db_url),  # never the password
            (self.plane_key_fingerprint or "")[:16],
            self.max_in_flight,
        )
        try:
            async with self.mcp.running(), anyio.create_task_group() as tasks:
                if self.fleet is not None:
                    tasks.start_soon(self.publish_metrics)
                yield
                tasks.cancel_scope.cancel()
        finally:
            self.stop()

    def stop(self) -> None:
        self._stopping.set()
        self.pool.close()
        self.warm.close()
        self.snapshots.close()
        self.committer.stop()
        self.follower.stop()

    async def in_thread(self, fn: Callable[[Plane], T]) -> T:
        """``fn(plane)`` in a worker thread with a pooled plane. Not abandoned when the
        request is cancelled: the thread's transaction always finishes."""
        assert self._limiter is not None, "the service has not started"
        try:
            return await anyio.to_thread.run_sync(self.pool.run, fn, limiter=self._limiter)
        finally:
            self.follower.poke()  # it may have appended: the read models follow

    # -- answers ----------------------------------------------------------------------

    def json(self, body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
        return Response(msgspec.json.encode(body), status, headers, media_type="application/json")

    def error(
        self,
        endpoint: Endpoint | None,
        status: int,
        message: str,
        *,
        deviations: list[Deviation] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        """``{"error": one line}`` (with the deviations of a 422). On a hook route also
        the hook answer the CLI would give for a refused command (exit 2, its ``error:``
        line), so a thin hook client only relays it."""
        line = inert(message)  # one line: a newline or a control character is escaped
        body: dict[str, Any] = {"error": line}
        if deviations:
            body["deviations"] = [msgspec.to_builtins(d) for d in deviations]
        if endpoint is not None and endpoint.access == "mcp":
            # A JSON-RPC error, as the SDK's transport answers what it refuses: an MCP
            # client (the official SDK's) then surfaces the reason, which it drops from
            # any other body of a non-2xx answer.
            data: dict[str, Any] = {"status": status, **body}
            del data["error"]
            body = {
                "jsonrpc": "2.0",
                "id": None,
                "error": {"code": MCP_REFUSED, "message": line, "data": data},
            }
        if endpoint is not None and endpoint.hook_kind is not None:
            answer = refused_answer(message)
            body.update(answer.to_json())
            self.metrics.hook_answers.inc(hook=endpoint.hook_kind, exit=str(answer.exit))
        return self.json(body, status, headers)

    def unauthenticated(
        self, endpoint: Endpoint, request: Request, reason: str, *, token_given: bool
    ) -> Response:
        """A 401: the reason, how a credential is obtained, and where the service's
        protected-resource metadata is (that of /mcp for /mcp), in ``WWW-Authenticate``
        and in the body."""
        suffix = _mcp_path(request) if endpoint.access == "mcp" else ""
        metadata = f"{origin(request)}{WELL_KNOWN}{suffix}"
        header = challenge(reason, token_given=token_given, resource_metadata=metadata)
        return self.error(
            endpoint,
            401,
            f"{reason} ({OBTAIN}; see {origin(request)}{CREDENTIALS_DOC})",
            headers={"WWW-Authenticate": header},
        )

    def refusal(self, endpoint: Endpoint, request: Request, exc: BaseException) -> Response:
        """The answer to what stopped a request (see the module's steps)."""
        if isinstance(exc, ClientDisconnect):  # nothing to answer, and no fault of ours:
            # counted as 499, "client closed request" (nginx's), never a server error
            return Response(status_code=CLIENT_CLOSED)
        if isinstance(exc, Unauthenticated):
            return self.unauthenticated(endpoint, request, str(exc), token_given=True)
        if isinstance(exc, Forbidden):
            return self.error(endpoint, 403, str(exc))
        if isinstance(exc, BadRequest):
            return self.error(endpoint, exc.status, str(exc), deviations=exc.deviations)
        if isinstance(exc, InputError):
            return self.error(endpoint, 413 if exc.rule == "size" else 422, str(exc))
        if isinstance(exc, LedgerOpenError):
            return self.error(endpoint, 503, str(exc))
        if isinstance(exc, LedgerUnavailable):  # transient: the same request may pass later
            return self.error(
                endpoint, 503, str(exc), headers={"Retry-After": str(exc.retry_after_s)}
            )
        if isinstance(exc, LedgerError):  # CommandRefused and the store's refusals
            return self.error(endpoint, 409, said_by(exc, "api"))
        if isinstance(exc, sqlalchemy.exc.DBAPIError):
            log.warning("database error on %s: %s", endpoint.path, exc)
            return self.error(endpoint, 503, "the database does not answer; retry later")
        log.error("internal error on %s", endpoint.path, exc_info=exc)
        return self.error(endpoint, 500, f"internal error ({type(exc).__name__}); see the log")

    def count(self, outcome: Outcome) -> None:
        """Count what the operation recorded: only checks it appended (a post-tool hook
        reuses the pre-tool's check, which was counted then)."""
        for gate in outcome.gates:
            if gate is None or not gate.recorded:
                continue
            found = gate.check
            self.metrics.gate_checks.inc(gate=found.gate, verdict=found.verdict)
            for d in found.deviations:
                self.metrics.deviations.inc(gate=found.gate, kind=d.kind)
        if outcome.validation is not None:
            self.metrics.validations.inc(outcome=outcome.validation)
        if outcome.hook is not None:
            kind, exit_ = outcome.hook
            self.metrics.hook_answers.inc(hook=kind, exit=str(exit_))

    # -- the agent routes -------------------------------------------------------------

    async def _admitted(
        self, endpoint: Endpoint, request: Request
    ) -> tuple[str, CredentialState] | Response:
        """Steps 1-3: the token and its credential, or the refusal (401; 503 when too
        many checks or operations are under way; 429 past the credential's share).
        Admitted, the request holds a place in both bounds: ``_leave`` gives it back."""
        try:
            token = bearer_token(request.headers.get("authorization"))
        except Unauthenticated as exc:
            return self.unauthenticated(endpoint, request, str(exc), token_given=False)
        if self.authenticating >= AUTH_QUEUE:
            return self._overloaded(
                endpoint, 503, f"{self.authenticating} credentials waiting to be checked"
            )
        self.authenticating += 1
        try:
            async with self._checks:
                credential = await self.in_thread(lambda plane: credential_for(plane, token))
        except Exception as exc:
            return self.refusal(endpoint, request, exc)
        finally:
            self.authenticating -= 1
        try:
            await self.admission.enter(credential.credential_id)
        except Overloaded as exc:
            return self._overloaded(endpoint, exc.status, str(exc))
        return token, credential

    def _overloaded(self, endpoint: Endpoint, status: int, what: str) -> Response:
        self.metrics.overloaded.inc()
        return self.error(
            endpoint,
            status,
            f"{what}: retry after {RETRY_AFTER_S} s",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    def _leave(self, credential_id: str) -> None:
        self.admission.leave(credential_id)

    async def _body_within(self, request: Request) -> bytes:
        """Step 5: the body within the deadline (408 when it stalls)."""
        try:
            with anyio.fail_after(self.body_timeout_s):
                return await _read_body(request)
        except TimeoutError:
            raise BadRequest(
                408, f"the request body did not arrive within {self.body_timeout_s:g} s"
            ) from None

    async def agent(self, endpoint: Endpoint, request: Request) -> Response:
        admitted = await self._admitted(endpoint, request)
        if isinstance(admitted, Response):
            return admitted
        token, credential = admitted
        try:
            return await self._serve(endpoint, request, token)
        except Exception as exc:
            return self.refusal(endpoint, request, exc)
        finally:
            self._leave(credential.credential_id)

    async def mcp_request(
        self, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send
    ) -> int:
        """``POST /mcp``: checked as an agent route (token, credential, bounds, the plan
        a query names, the message read within the deadline), then served by the MCP
        gate for the credential's plan. Answers the HTTP status sent (0: none, the client
        went away first)."""
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        request = Request(scope, receive)
        admitted = await self._admitted(endpoint, request)
        if isinstance(admitted, Response):
            await admitted(scope, receive, sending)
            return status
        _token, credential = admitted
        slot = Slot(lambda: self._leave(credential.credential_id))
        try:
            try:
                check_plan(credential, _query(endpoint, request).get("plan"))
                server = _path(endpoint, request).get("server")
                message = await self._body_within(request)
            except Exception as exc:
                await self.refusal(endpoint, request, exc)(scope, receive, sending)
                return status
            checked = {
                **scope,
                SCOPE_PLAN: credential.plan_id,
                SCOPE_SLOT: slot,
                SCOPE_SERVER: server,
                # who the request is, for the server door's sessions: a session is
                # served only to the credential that opened it
                "user": session_owner(credential.credential_id),
            }
            await self.mcp.handle(checked, _replayed(message, receive), sending)
            return status
        finally:
            slot.release()

    async def _serve(self, endpoint: Endpoint, request: Request, token: str) -> Response:
        query = _query(endpoint, request)
        data = await self._body_within(request)
        hook, unknown = endpoint.hook, _unknown_tools(query)
        run = endpoint.run

        def operate(plane: Plane) -> Outcome:
            # The credential first, then the body: one hand-off to a worker thread and
            # one look at the policy for the whole request.
            with plane.one_look():
                return checked(plane)

        def checked(plane: Plane) -> Outcome:
            credential = credential_for(plane, token)
            check_plan(credential, query.get("plan"))
            plan_id = credential.plan_id
            if hook is not None:
                return hook(plane, plan_id, _hook_call(endpoint, data), unknown)
            assert run is not None
            body = _body(endpoint, data)
            check_plan(credential, body.get("plan"))
            return run(plane, plan_id, body)

        outcome = await self.in_thread(operate)
        self.count(outcome)
        return self.json(outcome.body)

    # -- the open routes --------------------------------------------------------------

    async def healthz(self, _request: Request) -> Response:
        return self.json({"status": "ok"})

    async def readyz(self, _request: Request) -> Response:
        try:
            size = await self.in_thread(lambda plane: plane.store.head().size)
        except Exception as exc:
            log.warning("not ready: %s", exc)
            return self.json({"error": inert(f"the database does not answer: {exc}")}, 503)
        return self.json({"status": "ready", "head_size": size})

    def open_routes(self) -> dict[str, Callable[[Request], Any]]:
        """The routes open to anyone, by operation id."""
        return {
            "healthz": self.healthz,
            "readyz": self.readyz,
            "metrics": self.metrics_text,
            "checkpoint": self.checkpoint_text,
            "tile": self.tile,
            "openapi": self.openapi_json,
            "protected_resource": self.protected_resource,
            "mcp_protected_resource": self.mcp_protected_resource,
            "mcp_server_protected_resource": self.mcp_protected_resource,
            "credentials_doc": self.credentials_doc,
        }

    async def openapi_json(self, _request: Request) -> Response:
        return Response(self.openapi, media_type="application/json")

    def _protected_resource(self, request: Request, resource: str) -> Response:
        """RFC 9728's metadata of ``resource``: its bearer credentials go in the header,
        and an operator issues them (no authorization server: none is named)."""
        return self.json(
            {
                "resource": resource,
                "resource_name": RESOURCE_NAME,
                "bearer_methods_supported": ["header"],
                "resource_documentation": origin(request) + CREDENTIALS_DOC,
            }
        )

    async def protected_resource(self, request: Request) -> Response:
        # The metadata at the root describes the service (RFC 9728 section 3.3: the
        # resource is the URL with the well-known part taken out): /v1/* and /mcp alike.
        return self._protected_resource(request, origin(request))

    async def mcp_protected_resource(self, request: Request) -> Response:
        # /mcp's, and /mcp/{server}'s (the resource: the path after the well-known part)
        return self._protected_resource(request, origin(request) + _mcp_path(request))

    async def credentials_doc(self, request: Request) -> Response:
        return Response(credentials_text(origin(request)), media_type="text/plain")


def _mcp_path(request: Request) -> str:
    """``/mcp``, or ``/mcp/SERVER`` for a request naming a server by a valid name (the
    name goes into a header: nothing else of the path does)."""
    server = request.path_params.get("server")
    if isinstance(server, str) and re.fullmatch(SERVER["pattern"], server):
        return f"/mcp/{server}"
    return "/mcp"


def origin(request: Request) -> str:
    """The service's origin as the request names it (``https://`` behind a TLS proxy
    that says so in X-Forwarded-Proto, uvicorn's default for a proxy on loopback): its
    ``Host`` passed the door's check (``door.py``) when the service has a list."""
    return f"{request.url.scheme}://{request.url.netloc}"


def credentials_text(base: str) -> str:
    """``GET /docs/credentials``: how an agent comes by its credential."""
    return (
        "Evidence Ledger plane service: credentials\n\n"
        "Every /v1/ route and /mcp need Authorization: Bearer TOKEN, an agent credential\n"
        "for one plan. No OAuth authorization server issues them: an operator does, on\n"
        "the service's host, with the operator key:\n\n"
        "    evidence credential issue --plan PLAN --ttl 8h --json\n\n"
        "The token (evd_...) is printed once; give it to the agent's user only (a file\n"
        "only that user reads). `evidence credential revoke ID` ends it at once.\n"
        "An MCP client sends it on every request to /mcp, as a header its configuration\n"
        'holds (Claude Code: "headers": {"Authorization": "Bearer ..."}).\n\n'
        f"Metadata (RFC 9728): {base}{WELL_KNOWN} and {base}{WELL_KNOWN}/mcp\n"
        f"The API: {base}/openapi.json\n"
        'More: `evidence docs service` (the sections "Setting it up" and "MCP over HTTP").\n'
    )


def body_timeout() -> float:
    """``EVIDENCE_BODY_TIMEOUT`` (seconds, > 0), else ``DEFAULT_BODY_TIMEOUT_S``."""
    return env_seconds(BODY_TIMEOUT_ENV, DEFAULT_BODY_TIMEOUT_S)


def admission_wait() -> float:
    """``EVIDENCE_ADMISSION_WAIT`` (seconds, > 0), else ``admission.WAIT_S``."""
    return env_seconds(ADMISSION_WAIT_ENV, WAIT_S)


def _replayed(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` (read already) as the request's one message,
    then whatever the connection says next (its disconnect)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _unknown_tools(query: dict[str, str]) -> UnknownTools:
    return "record" if query.get("unknown_tools") == "record" else "deny"


def _hook_call(endpoint: Endpoint, data: bytes) -> HookCall:
    """The hook input of a hook route's body (413 / 422 as the CLI's refusals)."""
    assert endpoint.hook_kind is not None
    try:
        return read_hook_input(data, endpoint.hook_kind)
    except InputError as exc:
        raise BadRequest(413 if exc.rule == "size" else 422, str(exc)) from None
    except CommandRefused as exc:  # a used field missing or malformed
        raise BadRequest(422, str(exc)) from None


def _query(endpoint: Endpoint, request: Request) -> dict[str, str]:
    """The query parameters, each at most once, checked against the route's closed set."""
    found: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name in found:
            raise BadRequest(422, f"the query: {name!r} is given more than once")
        found[name] = value
    deviations = check(closed(endpoint.query), found)
    if deviations:
        raise BadRequest(422, _deviations_line("the query", deviations), deviations)
    return found


def _path(endpoint: Endpoint, request: Request) -> dict[str, str]:
    """The path's parameters, checked against the route's schemas."""
    found = {name: str(value) for name, value in request.path_params.items()}
    deviations = check(closed(endpoint.path_params, list(endpoint.path_params)), found)
    if deviations:
        raise BadRequest(422, _deviations_line("the path", deviations), deviations)
    return found


async def _read_body(request: Request) -> bytes:
    """The body, never more than the cap on agent bytes (plus one chunk) read."""
    cap = LIMITS["agent"].cap
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > cap:
            break
    return limit_bytes(b"".join(chunks), "agent", BODY_SOURCE)


class TraceContext:
    """The caller's W3C trace context (the ``traceparent`` and ``tracestate`` headers)
    made current for its request when tracing is on (``commands.plane.tracing``): the
    spans of the operations it starts are children of the caller's span. (An MCP
    request's own ``params._meta.traceparent`` is the SDK's server span's parent, and so
    theirs: it comes first.)"""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not tracing.active():
            await self.app(scope, receive, send)
            return
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in (b"traceparent", b"tracestate")
        }
        token = tracing.continued(carrier)
        try:
            await self.app(scope, receive, send)
        finally:
            tracing.detach(token)


def create_app(
    db_url: str,
    *,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    workdir: Path | None = None,
    hosts: list[str] | None = None,
    mcp_sessions: bool = True,
    metrics_dir: Path | None = None,
    tile_entries: bool = False,
    witness_policy: Policy | None = None,
) -> Starlette:
    """The service for the ledger at ``db_url``: at most ``max_in_flight`` plane
    operations at once (503 beyond); ``workdir`` as ``--workdir`` (plans' sandboxes);
    a request with a foreign ``Origin`` refused before anything else, and one whose
    ``Host`` is none of ``hosts`` (None: any) too (``door.DoorChecks``); MCP sessions
    at the server doors unless not ``mcp_sessions`` (one process of several: a session
    lives in the process that opened it); ``metrics_dir``: where ``--workers``' processes
    publish their metrics; ``tile_entries``: serve the log's entry bundles too;
    ``witness_policy``: publish a checkpoint only once its witnesses' quorum cosigned it."""
    service = Service(
        db_url,
        max_in_flight=max_in_flight,
        workdir=workdir,
        mcp_sessions=mcp_sessions,
        metrics_dir=metrics_dir,
        tile_entries=tile_entries,
        witness_policy=witness_policy,
    )
    open_routes = service.open_routes()

    def observe(endpoint: Endpoint, started: float, status: int) -> None:
        service.metrics.requests.inc(
            route=endpoint.path, method=endpoint.method, status=str(status)
        )
        service.metrics.latency.observe(time.perf_counter() - started, route=endpoint.path)

    class McpEndpoint:
        """``/mcp`` as an ASGI app (the SDK's transport writes its own answers)."""

        def __init__(self, endpoint: Endpoint) -> None:
            self.endpoint = endpoint

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            started = time.perf_counter()
            status = await service.mcp_request(self.endpoint, scope, receive, send)
            observe(self.endpoint, started, status)

    def mount(endpoint: Endpoint) -> Route:
        if endpoint.access == "mcp":
            return Route(
                endpoint.path,
                McpEndpoint(endpoint),
                methods=[endpoint.method],
                name=endpoint.operation_id,
            )

        async def answer(request: Request) -> Response:
            started = time.perf_counter()
            if endpoint.access == "open":
                response: Response = await open_routes[endpoint.operation_id](request)
            elif endpoint.access in ("operator", "approver"):
                response = await operator.serve(service, endpoint, request)
            else:
                response = await service.agent(endpoint, request)
            observe(endpoint, started, response.status_code)
            return response

        path = endpoint.route or endpoint.path
        return Route(path, answer, methods=[endpoint.method], name=endpoint.operation_id)

    async def not_routed(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        service.metrics.requests.inc(
            route="(none)", method=request.method, status=str(exc.status_code)
        )
        return service.json({"error": exc.detail}, exc.status_code, dict(exc.headers or {}))

    app = Starlette(
        routes=[mount(e) for e in ENDPOINTS],
        exception_handlers={HTTPException: not_routed},
        lifespan=lambda _app: service.serving(),
        middleware=[Middleware(DoorChecks, hosts=hosts), Middleware(TraceContext)],
    )
    app.state.service = service
    return app
