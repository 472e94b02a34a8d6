"""``evidence serve``: the plane as a service (docs/service.md).

Runs the ASGI app of ``commands.service`` under uvicorn in this process. Before it
listens it checks what the service needs, so that a service that cannot work refuses to
start (exit 2, one ``error:`` line) instead of failing its requests: the ledger exists
(it is never created here), the plane key is there, the address can be bound, and a
host other than loopback is served only when the ledger has an active operator key —
without one no credential can be issued or verified, and the service would be open to
whoever reaches the port with nothing to check them by.

The socket is bound here (not by uvicorn) so a busy port is a refused start and
``--port 0`` serves on a free port; the one line ``listening on http://HOST:PORT`` (or
``https://…``, or ``unix:PATH`` with ``--uds``) on stdout says where. Logs (uvicorn's
and the service's) go to stderr. A unix socket is placed only where no other user could
have put one (``commands.hook_client.untrusted``: the check its clients make too).

SIGTERM or SIGINT: uvicorn stops accepting, waits for every request in flight (their
plane transactions finish), the pool is closed, and the command exits 0.

``--workers N`` forks N service processes after the checks, one listening socket each
on the one port (``SO_REUSEPORT``: the kernel spreads the connections); this process
supervises them: a stop is passed on, and one ending on its own ends the service.
"""

from __future__ import annotations

import contextlib
import copy
import ipaddress
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

import ledger

from .common import db_option, db_url, fail, read_policy, workdir_option
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


def _bind(host: str, port: int, count: int = 1) -> list[socket.socket]:
    """``count`` listening sockets on one address: with more than one, each has
    ``SO_REUSEPORT`` and the kernel spreads new connections over them (a worker process
    each), where one shared socket would let whichever process accepts first take most
    of them. They listen from here on, so a connection made before a worker is up waits
    in its socket's queue. (The kernel lets only this user's sockets share the port.)"""
    first = _bind_one(host, port, reuse_port=count > 1)
    sockets = [first]
    try:
        for _ in range(count - 1):
            sockets.append(_bind_one(host, first.getsockname()[1], reuse_port=True))
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    for sock in sockets:
        sock.listen(2048)
    return sockets


def _bind_one(host: str, port: int, *, reuse_port: bool) -> socket.socket:
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
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    sock.set_inheritable(True)
    return sock


def _bind_unix(path: str) -> socket.socket:
    """A listening unix socket at ``path``, refused where another user could put a
    socket of their own in its place (the check ``evidence-hook`` makes before it
    sends a credential), and where a service already listens. A socket file left by a
    service that is gone is replaced. Every user may connect (mode 0666): who reaches
    it is the directory's to say, and what they may do is their credential's."""
    from commands.hook_client import resolve, untrusted

    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    try:
        real, directories = resolve(directory)
        if not os.path.isdir(real):
            raise NotADirectoryError(f"{directory} is not a directory")
        why = untrusted([*directories, real], os.geteuid())
    except OSError as exc:
        fail(f"--uds {inert(path)}: {exc.strerror or exc}")
    if why is not None:
        fail(
            f"--uds {inert(path)}: {inert(why)}, so another user could put a socket of their "
            "own there and receive the agents' credentials; use a directory only this user "
            "or root can write (systemd's RuntimeDirectory=evidence makes /run/evidence)"
        )
    path = os.path.join(real, os.path.basename(path))
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            fail(f"--uds {inert(path)}: there is a file there that is not a socket")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # nothing listens: a stopped service's socket
            else:
                fail(f"cannot listen on {inert(path)}: a service is listening there")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o666)
    except OSError as exc:
        sock.close()
        fail(f"cannot listen on {inert(path)}: {exc.strerror or exc}")
    sock.set_inheritable(True)
    sock.listen(2048)
    return sock


def _tls_files(cert: str | None, key: str | None) -> tuple[str, str] | None:
    """The certificate chain and key for https, loaded once here so that a bad pair is a
    refused start, not a failure in uvicorn's start-up."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        fail("--tls-cert and --tls-key go together: the certificate chain and its key")
    import ssl

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        fail(f"cannot load --tls-cert {inert(cert)} with --tls-key {inert(key)}: {exc}")
    return cert, key


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


def _holds_password(url: str | None) -> bool:
    """A database URL given with a password (``user:secret@`` or ``?password=``)."""
    if not url:
        return False
    import sqlalchemy

    try:
        parsed = sqlalchemy.engine.make_url(url)
    except (ValueError, sqlalchemy.exc.ArgumentError):
        return False  # not a URL: opening it says so
    return bool(parsed.password) or "password" in parsed.query


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
    help="Plane operations at once, per worker; beyond it a request waits its turn, "
    "then 503 with Retry-After (default 8).",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Service processes sharing the port (one core of Python each).",
)
@click.option(
    "--uds",
    metavar="PATH",
    default=None,
    help="Listen on a unix socket at PATH instead of TCP; its directory writable by "
    "this user or root only (clients check it before they send a credential).",
)
@click.option(
    "--tls-cert",
    metavar="FILE",
    default=None,
    help="Serve https on TCP with this certificate chain (PEM); with --tls-key.",
)
@click.option("--tls-key", metavar="FILE", default=None, help="The private key of --tls-cert.")
@click.option(
    "--tile-entries",
    is_flag=True,
    help="Serve the log's entry bundles at /tile/entries/ too: every event's bytes, to "
    "anyone who reaches the port (the hash tiles are always served).",
)
@click.option(
    "--witness-policy",
    "policy_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A witness policy (C2SP tlog-policy): publish a checkpoint only once its "
    "witnesses' quorum cosigned it.",
)
@click.option(
    "--insecure-single-user",
    is_flag=True,
    help="Serve the developer's layout (the keys beside the ledger, this user's): an "
    "agent running as this user reads them and signs as the plane and the operator.",
)
@db_option
@workdir_option
def serve(
    host: str,
    port: int,
    max_in_flight: int | None,
    workers: int,
    uds: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tile_entries: bool,
    policy_file: Path | None,
    insecure_single_user: bool,
) -> None:
    """Serve the plane over HTTP to agents holding a credential.

    Holds the plane key and the database; an agent calls its plan's gates, tools,
    validations and hooks with `Authorization: Bearer TOKEN` (docs/service.md). Clients
    send a credential only to a service that shows who it is: on a unix socket (--uds)
    in a directory no one else can write, or over https (--tls-cert, or a TLS proxy).

    \b
    Examples:
      evidence serve --db sqlite:////srv/ev.db --uds /run/evidence/serve.sock
      evidence serve --db postgresql+psycopg://plane@db/evidence --workers 2
    """
    import uvicorn

    from commands.service import DEFAULT_MAX_IN_FLIGHT, create_app
    from commands.service.app import admission_wait, body_timeout
    from commands.service.checkpoints import checkpoint_every
    from commands.service.head_deadline import head_deadline_protocol, header_timeout

    url = db_url()
    root = click.get_current_context().find_root()
    workdir = root.meta.get("evidence.workdir")
    single_user = _servable(url, root.meta.get("evidence.db"), insecure_single_user)
    context = click.get_current_context()
    if uds is not None and any(
        context.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
        for name in ("host", "port", "tls_cert", "tls_key")
    ):
        fail("--uds listens on a unix socket: give it without --host, --port or --tls-*")
    tls = _tls_files(tls_cert, tls_key)
    # A bad setting: a refused start, before anything listens.
    protocol = head_deadline_protocol(header_timeout())
    body_timeout()
    admission_wait()
    checkpoint_every()
    if uds is None and not is_loopback(host) and not _has_operator(url, workdir):
        fail(
            f"--host {inert(host)} is not loopback and the ledger has no active operator key: no "
            "credential can be issued or checked (run `evidence init --operator NAME`), "
            "so the service listens on loopback only"
        )
    limit = max_in_flight or DEFAULT_MAX_IN_FLIGHT
    policy = _witness_policy(policy_file, url) if policy_file is not None else None
    sockets, where, hosts = _listen(host, port, workers, uds, https=tls is not None)
    metrics_dir = _metrics_dir(workers)

    def run(sock: socket.socket) -> None:
        """One service process on its socket, until a stop has drained it."""
        config = uvicorn.Config(
            # A server door's MCP session lives in the process that opened it: with
            # several, a session's next request could reach another (stateless there).
            create_app(
                url,
                max_in_flight=limit,
                workdir=workdir,
                hosts=hosts,
                mcp_sessions=workers == 1,
                metrics_dir=metrics_dir,
                tile_entries=tile_entries,
                witness_policy=policy,
            ),
            lifespan="on",
            log_config=_log_config(),
            # None: a stop waits for every request in flight, however long its tool runs.
            timeout_graceful_shutdown=None,
            server_header=False,
            ssl_certfile=tls[0] if tls else None,
            ssl_keyfile=tls[1] if tls else None,
            http=protocol,
        )
        with _graceful_signals():
            uvicorn.Server(config).run(sockets=[sock])

    click.echo(f"listening on {where}")
    sys.stdout.flush()
    _say_notes(single_user=single_user is not None, workers=workers, plain=uds is None and not tls)
    try:
        if workers == 1:
            run(sockets[0])
        else:
            code = _run_workers(sockets, run)
            if code:
                fail(f"a service process ended with exit {code}; the log above says why")
    except SystemExit as exc:  # uvicorn's startup failure (the lifespan refused)
        fail(f"the service did not start (exit {exc.code}); its log above says why")
    finally:
        _clean_up(sockets, metrics_dir, where if uds is not None else None)


def _witness_policy(path: Path, url: str) -> Any:
    """The witness policy at ``path``, refused unless it lists this ledger's log key (the
    plane key under the checkpoints' origin): its witnesses would cosign nothing."""
    from commands.rules.signing import plane_key_path
    from commands.service.checkpoints import origin_of
    from ledger.checkpoints import VerifierKey
    from ledger.keys import load_private_key

    policy, _ = read_policy(path, "--witness-policy")
    with ledger.open(url, create=False) as store:
        log = VerifierKey.of(origin_of(store), load_private_key(plane_key_path(url)))
    if not any(k.name == log.name and k.key_hash == log.key_hash for k, _ in policy.logs):
        fail(
            f"--witness-policy {inert(str(path))} lists no key of this log: add the line "
            f"`log {log}`"
        )
    return policy


def _metrics_dir(workers: int) -> Path | None:
    """Where several processes publish their metrics, so that a scrape of any is all of
    them (0700, made by mkdtemp: no other user reads or writes it); None for one."""
    return Path(tempfile.mkdtemp(prefix="evidence-metrics-")) if workers > 1 else None


def _clean_up(sockets: list[socket.socket], metrics_dir: Path | None, uds: str | None) -> None:
    """What a stopped service leaves behind: its sockets, the workers' metrics, the
    unix socket's file (``uds``: ``unix:PATH``)."""
    for sock in sockets:
        sock.close()
    if metrics_dir is not None:
        shutil.rmtree(metrics_dir, ignore_errors=True)
    if uds is not None:
        with contextlib.suppress(OSError):
            os.unlink(uds[len("unix:") :])


def _servable(url: str, given: str | None, insecure_single_user: bool) -> Path | None:
    """Refuse a ledger this service cannot serve (exit 2, one line): a password on the
    command line (``given``: the ``--db`` as typed), no ledger (none is made), no plane
    key (none is made), the developer's single-user layout unless told the risk. The
    layout's plane key when it is that layout, else None."""
    from commands.rules.signing import plane_key_path, single_user_layout

    if _holds_password(given):
        fail(
            "the --db URL holds a password, and a service's command line is readable by "
            "every local user (/proc/PID/cmdline): give the URL in EVIDENCE_DB instead, or "
            "the password in PGPASSWORD or ~/.pgpass"
        )
    ledger.open(url, create=False).close()  # a missing ledger: refused, nothing made
    key = plane_key_path(url)
    if not os.path.lexists(key):
        fail(
            f"no plane key at {key}: run `evidence init` as the service's user, or set "
            "EVIDENCE_PLANE_KEY to the ledger's plane key"
        )
    single_user = single_user_layout(url)
    if single_user is not None and not insecure_single_user:
        fail(
            f"the plane key {single_user} is this user's and in its default place beside "
            "the ledger: the developer's single-user layout, where an agent running as this "
            "user reads the keys and signs as the plane and the operator, and nothing "
            "the service checks would stop it; deploy with the keys where EVIDENCE_PLANE_KEY "
            'names (docs/service.md, "Setting it up"), or start with --insecure-single-user '
            "to serve this layout knowingly"
        )
    return single_user


def _say_notes(*, single_user: bool, workers: int, plain: bool) -> None:
    """What the operator should know of how the service runs, on stderr."""
    if single_user:
        click.echo(
            "note: --insecure-single-user: the keys are readable by whatever runs as this "
            "user; credentials keep honest agents apart, not an agent of this user",
            err=True,
        )
    if workers > 1:
        click.echo(
            "note: --workers: the server doors (/mcp/NAME) keep no MCP sessions, so a "
            "tool server's sampling and elicitation requests are refused, not relayed",
            err=True,
        )
    if plain:
        click.echo(
            "note: plain http: evidence-hook sends no credential over it (any local user "
            "who binds the port first would get it); serve agents with --uds or https",
            err=True,
        )


def _listen(
    host: str, port: int, workers: int, uds: str | None, *, https: bool
) -> tuple[list[socket.socket], str, list[str]]:
    """The listening sockets (one per worker), where they listen as the one line says
    it, and the Host names a request may give (``door.service_hosts``)."""
    from commands.service.door import service_hosts

    if uds is not None:
        # one socket all workers accept on (a unix socket has no SO_REUSEPORT spreading)
        sockets = [_bind_unix(uds)] * workers
        return sockets, f"unix:{sockets[0].getsockname()}", service_hosts(None, None)
    sockets = _bind(host, port, workers)
    bound_host, bound_port = sockets[0].getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    where = f"{'https' if https else 'http'}://{shown}:{bound_port}"
    return sockets, where, service_hosts(bound_host, bound_port)


def _run_workers(sockets: list[socket.socket], run: Callable[[socket.socket], None]) -> int:
    """A forked process per socket, each running ``run`` on it (the kernel hands each
    new connection to one of the sockets); this process only supervises.
    SIGTERM or SIGINT here is passed on as SIGTERM (each drains and exits 0; a terminal's
    Ctrl-C reaches them all anyway, and uvicorn takes a second SIGTERM as the first).
    When one ends on its own, the others are stopped: a service with a process missing
    is restarted whole by its supervisor (systemd), never left half there. Answers the
    worst exit status (0: all drained)."""
    children: list[int] = []
    for sock in sockets:
        pid = os.fork()
        if pid == 0:  # the child: no ledger connection or thread was open at the fork
            status = 0
            try:
                for other in sockets:
                    if other is not sock:
                        other.close()
                run(sock)
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # its log has it; the supervisor sees the status
                status = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        children.append(pid)

    def stop(_sig: int, _frame: object) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGTERM)

    before = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    worst = 0
    try:
        running = set(children)
        while running:
            pid, status = os.wait()
            if pid not in running:
                continue
            running.discard(pid)
            code = os.waitstatus_to_exitcode(status)
            worst = max(worst, code if code > 0 else (1 if code < 0 else 0))
            if code != 0:
                stop(signal.SIGTERM, None)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    return worst
