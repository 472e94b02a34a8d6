"""``evidence serve``: the plane as a service (docs/service.md).

Runs the ASGI app of ``commands.service`` under uvicorn in this process. Before it
listens it checks what the service needs, so that a service that cannot work refuses to
start (exit 2, one ``error:`` line) instead of failing its requests: the ledger exists
(it is never created here), the plane key is there, the address can be bound, and a
host other than loopback is served only when the ledger has an active operator key —
without one no credential can be issued or verified, and the service would be open to
whoever reaches the port with nothing to check them by.

The socket is bound here (not by uvicorn) so a busy port is a refused start and
``--port 0`` serves on a free port; the one line ``listening on http://HOST:PORT`` on
stdout says where. Logs (uvicorn's and the service's) go to stderr.

SIGTERM or SIGINT: uvicorn stops accepting, waits for every request in flight (their
plane transactions finish), the pool is closed, and the command exits 0.
"""

from __future__ import annotations

import contextlib
import copy
import ipaddress
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import click

import ledger

from .common import db_option, db_url, fail, workdir_option
from .terminal import inert

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8750


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1). A name other than
    ``localhost`` is not taken on trust: it may resolve anywhere."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _has_operator(url: str, workdir: Path | None) -> bool:
    """The ledger has an active operator key (only asked once the plane key is known to
    be there: reading people's keys loads it, and would make a missing one)."""
    from commands.plane.core import Plane

    with Plane.open(url, create=False, workdir=workdir) as plane:
        return any(
            k.role == "operator" and k.status == "active"
            for k in plane.log().approver_keys().values()
        )


def _bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM
        )[0]
    except socket.gaierror as exc:
        fail(f"--host {inert(host)}: {exc.strerror}")
    except UnicodeError:  # a name IDNA cannot encode: no such host
        fail(f"--host {inert(host)}: not a host name or address")
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    sock.set_inheritable(True)
    return sock


def _log_config() -> dict[str, object]:
    """uvicorn's logging, all of it on stderr (stdout carries the one listening line),
    with the service's own logger beside uvicorn's."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["handlers"]["access"]["stream"] = "ext://sys.stderr"
    config["loggers"]["evidence"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config


@contextlib.contextmanager
def _graceful_signals() -> Iterator[None]:
    """uvicorn handles SIGTERM and SIGINT itself (it drains, then shuts down) and, once
    done, raises the signal again for the handler that was there before it. Here that
    handler does nothing, so a drained stop ends as a normal exit (0), not as death by
    the signal nor as an "aborted" interrupt."""

    def drained(_sig: int, _frame: object) -> None:
        pass

    before = {sig: signal.signal(sig, drained) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


@click.command()
@click.option(
    "--host",
    default=DEFAULT_HOST,
    show_default=True,
    help="The address to listen on. Other than loopback only with an active operator key.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="The TCP port (0: a free one, printed).",
)
@click.option(
    "--max-in-flight",
    type=click.IntRange(1, 1024),
    default=None,
    help="Plane operations at once; beyond it 503 with Retry-After (default 8).",
)
@db_option
@workdir_option
def serve(host: str, port: int, max_in_flight: int | None) -> None:
    """Serve the plane over HTTP to agents holding a credential.

    Holds the plane key and the database; an agent calls its plan's gates, tools,
    validations and hooks with `Authorization: Bearer TOKEN` (docs/service.md).

    \b
    Examples:
      evidence serve --db sqlite:////srv/evidence/evidence.db
      evidence serve --db postgresql+psycopg://plane@db/evidence --host 0.0.0.0
    """
    import uvicorn

    from commands.rules.signing import plane_key_path
    from commands.service import DEFAULT_MAX_IN_FLIGHT, create_app

    url = db_url()
    workdir = click.get_current_context().find_root().meta.get("evidence.workdir")
    ledger.open(url, create=False).close()  # a missing ledger: refused, nothing made
    key = plane_key_path(url)
    if not os.path.lexists(key):
        fail(
            f"no plane key at {key}: run `evidence init` as the service's user, or set "
            "EVIDENCE_PLANE_KEY to the ledger's plane key"
        )
    if not is_loopback(host) and not _has_operator(url, workdir):
        fail(
            f"--host {inert(host)} is not loopback and the ledger has no active operator key: no "
            "credential can be issued or checked (run `evidence init --operator NAME`), "
            "so the service listens on loopback only"
        )
    limit = max_in_flight or DEFAULT_MAX_IN_FLIGHT
    app = create_app(url, max_in_flight=limit, workdir=workdir)
    sock = _bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    click.echo(f"listening on http://{shown}:{bound_port}")
    sys.stdout.flush()
    config = uvicorn.Config(
        app,
        lifespan="on",
        log_config=_log_config(),
        # None: a stop waits for every request in flight, however long its tool runs.
        timeout_graceful_shutdown=None,
        server_header=False,
    )
    server = uvicorn.Server(config)
    try:
        with _graceful_signals():
            server.run(sockets=[sock])
    except SystemExit as exc:  # uvicorn's startup failure (the lifespan refused)
        fail(f"the service did not start (exit {exc.code}); its log above says why")
    finally:
        sock.close()
