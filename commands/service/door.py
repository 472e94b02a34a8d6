"""What every request passes before anything else: its ``Origin`` and its ``Host``.

A web page the agent's user opens can make the browser send requests to the service —
to ``127.0.0.1`` directly, or through a name the attacker's DNS first points at its own
server and then at ``127.0.0.1`` (DNS rebinding). A browser always says where such a
request comes from (``Origin``) and names the site it meant (``Host``). So:

- a request with an ``Origin`` not on ``EVIDENCE_ALLOWED_ORIGINS`` (comma-separated,
  exact origins such as ``https://console.example.org``; none by default: the service
  has no browser clients) is answered ``403`` before its credential is looked at, as
  the MCP specification requires of ``/mcp``; no ``Origin`` is a client that is no
  browser, and passes; so does the service's own origin (``Origin`` exactly the
  request's scheme and ``Host``, that ``Host`` one of the service's names): only a page
  the service served could send it, and it serves none that runs code. A rebound name
  is never one of its names, so its page, same-origin to the browser, is still
  refused;
- a request whose ``Host`` is not one of the service's names is answered ``421``
  (Misdirected Request): the loopback names (``localhost``, ``127.0.0.1``, ``[::1]``),
  bare or with the service's port, the address it is bound to with its port, and what
  ``EVIDENCE_ALLOWED_HOSTS`` adds
  (``plane.example.org`` behind a TLS proxy that passes the public name on;
  ``NAME:*`` for any port).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

ORIGINS_ENV = "EVIDENCE_ALLOWED_ORIGINS"
HOSTS_ENV = "EVIDENCE_ALLOWED_HOSTS"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def listed(name: str) -> list[str]:
    """The comma-separated entries of the environment variable ``name``."""
    return [part.strip() for part in os.environ.get(name, "").split(",") if part.strip()]


def service_hosts(host: str | None, port: int | None) -> list[str]:
    """The ``Host`` values a service bound to ``host``:``port`` answers to (a unix
    socket: ``host`` and ``port`` None), with ``EVIDENCE_ALLOWED_HOSTS``."""
    names = list(LOOPBACK_NAMES)  # a name no attacker's DNS can point elsewhere
    if port is not None:
        bound = f"[{host}]" if host and ":" in host and not host.startswith("[") else host
        names += [f"{name}:{port}" for name in (*LOOPBACK_NAMES, bound) if name]
        if port in (80, 443) and bound:
            names.append(bound)
    return [*names, *listed(HOSTS_ENV)]


def _allowed_host(host: str, allowed: Iterable[str]) -> bool:
    for entry in allowed:
        if host == entry or (entry.endswith(":*") and host.startswith(entry[:-1])):
            return True
    return False


class DoorChecks:
    """The ASGI app ``app`` behind the Origin and Host checks (``hosts`` None: no Host
    check, as for an app a test drives in process)."""

    def __init__(self, app: ASGIApp, *, hosts: list[str] | None) -> None:
        self.app, self.hosts = app, hosts
        self.origins = set(listed(ORIGINS_ENV))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin: str | None = None
        host = ""
        for name, value in scope["headers"]:  # lower-case names (ASGI); only these two read
            if name == b"origin":
                origin = value.decode("latin-1")
            elif name == b"host":
                host = value.decode("latin-1")
        if origin is not None and origin not in self.origins and not self._own(origin, host, scope):
            await _refuse(
                send,
                403,
                f"Origin {origin[:200]!r} is not allowed: the service serves no web page's "
                f"requests (an operator lists browser origins in {ORIGINS_ENV})",
            )
            return
        if self.hosts is not None and not _allowed_host(host, self.hosts):
            await _refuse(
                send,
                421,
                f"Host {host[:200]!r} is not one of this service's names (an operator adds "
                f"the name a proxy passes on in {HOSTS_ENV})",
            )
            return
        await self.app(scope, receive, send)

    def _own(self, origin: str, host: str, scope: Scope) -> bool:
        """``origin`` is the service's own, as this request names the service (never
        without a Host check: a rebound name is same-origin to its page)."""
        if self.hosts is None or not _allowed_host(host, self.hosts):
            return False
        return origin == f"{scope.get('scheme', 'http')}://{host}"


async def _refuse(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
