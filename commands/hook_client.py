"""``evidence-hook``: an agent CLI's tool-use hook as a thin client of the evidence
service (docs/agents.md, "Configuration (Claude Code)").

    evidence-hook pre-tool|post-tool [--server URL] [--unknown-tools deny|record] [--timeout S]

It reads the hook input (Claude Code's PreToolUse / PostToolUse JSON) on stdin, posts
those bytes unchanged to ``SERVER/v1/hooks/KIND?unknown_tools=…`` with the agent's
credential as a bearer token, and relays the answer ``{"exit": 0|2, "stderr": TEXT}``:
the text on stderr, ``exit`` as the exit status (0: the call goes on; 2: it is
blocked). Anything else blocks the call — no server or credential, input over the cap,
any status but 200 (401/403 a refused credential, 409/413/422 a refused hook, 429/503
overloaded, 5xx), a 200 that is not a hook answer, no answer within ``--timeout`` —
with exit 2 and one ``error: …`` line. It never exits with any other status: an agent
CLI lets a call through on every exit but 2, so a missing plane must never look like
one. Stdout stays empty.

The token comes from ``$EVIDENCE_CREDENTIAL`` or the file ``$EVIDENCE_CREDENTIAL_FILE``
names, never from the command line (every user sees argv in ``ps``). Redirects are not
followed (the token goes to the server named and nowhere else), and no proxy is used.

The token goes only to a server that has shown who it is, since any local user may bind
a free port first: to a unix socket (``unix:PATH``) that only its owner or root could
have put there — every directory the path goes through belongs to root or that owner
and no one else may write to it — and whose listening process the kernel says runs as
that owner or root (``SO_PEERCRED``); or over https, to a certificate the system's
authorities or the one ``$EVIDENCE_SERVER_CA`` names vouch for. Plain ``http://`` is
refused before anything is sent.

Start-up is the point of this module: an agent CLI starts one hook process per tool
call and hook, so it imports only the standard library modules a socket needs
(``socket``, ``json``; ``os``, ``sys``, ``time`` and ``urllib.parse`` are loaded by
any interpreter's start; ``ssl`` only for an https server) — neither ``urllib.request``
nor ``http.client``, whose ``email`` parsing alone about doubles a bare interpreter's
start (docs/performance.md, "Thin hooks") — and nothing else of the house: the
``commands`` package's ``__init__`` imports nothing. tests/commands/test_hook_client.py checks
both in a real process.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
import time
from urllib.parse import urlsplit

__all__ = [
    "Blocked",
    "Server",
    "connect_checked",
    "main",
    "main_exit",
    "read_credential",
    "server_of",
]

KINDS = ("pre-tool", "post-tool")
UNKNOWN_TOOLS = ("deny", "record")
DEFAULT_TIMEOUT = 30.0  # below Claude Code's 60 s hook timeout, after which a call goes on
MAX_TIMEOUT = 3600.0
EXIT_BLOCK = 2

_KIB = 1024
_MIB = 1024 * _KIB
SERVER_CA_ENV = "EVIDENCE_SERVER_CA"  # the one authority an https service is checked by
AGENT_CAP_ENV = "EVIDENCE_MAX_AGENT_BYTES"  # the in-process hook's cap on its stdin, too
DEFAULT_AGENT_CAP = 16 * _MIB
MAX_SAFE_INTEGER = 2**53 - 1
MAX_CREDENTIAL = 64 * _KIB
MAX_HEAD_LINE = 64 * _KIB
MAX_HEADERS = 100
MAX_ANSWER = 16 * _MIB + 64 * _KIB  # the deviations of an input at the cap, and headers

USAGE = (
    "usage: evidence-hook pre-tool|post-tool [--server URL] "
    "[--unknown-tools deny|record] [--timeout S]"
)
HELP = f"""{USAGE}

An agent CLI's tool-use hook (PreToolUse: pre-tool, PostToolUse: post-tool) as a client
of the evidence service: the hook input on stdin is posted to the service, which gates
and records the call; exit 0 lets the call go on, exit 2 blocks it (the reasons on
stderr). Any failure to get the service's answer blocks the call too.

options:
  --server URL            the evidence service: unix:PATH or https://… (default:
                          $EVIDENCE_SERVER)
  --unknown-tools MODE    a tool the registry does not know: deny (default) blocks it,
                          record lets it through and records its call
  --timeout S             seconds to wait for the answer (default {DEFAULT_TIMEOUT:g}); keep it
                          below the agent CLI's own hook timeout
  -h, --help              this text

environment:
  EVIDENCE_SERVER           the service: unix:PATH (its socket) or https://HOST…
  EVIDENCE_SERVER_CA        trust only this certificate (PEM) for an https service
  EVIDENCE_CREDENTIAL       the agent credential an operator issued for the plan
  EVIDENCE_CREDENTIAL_FILE  or a file holding it (never on the command line)
  EVIDENCE_MAX_AGENT_BYTES  the cap on the hook input (default 16 MiB)

docs/agents.md, "Configuration (Claude Code)" (`evidence docs agents`).
"""


class Blocked(Exception):
    """The call is blocked: the message is the one ``error:`` line saying why."""


class _Options:
    __slots__ = ("kind", "server", "timeout", "unknown_tools")

    def __init__(self) -> None:
        self.kind: str | None = None
        self.server: str | None = None
        self.unknown_tools = "deny"
        self.timeout = DEFAULT_TIMEOUT


class Server:
    """Where the hook is posted: ``url`` as shown in messages, the socket address (a
    unix socket's path, or host and port), the ``Host`` header and the path prefix the
    hook paths go under."""

    __slots__ = ("host", "netloc", "path", "port", "tls", "unix", "url")

    def __init__(
        self, url: str, tls: bool, host: str, port: int, netloc: str, path: str, unix: str = ""
    ):
        self.url, self.tls, self.host, self.port = url, tls, host, port
        self.netloc, self.path, self.unix = netloc, path, unix


def main(argv: list[str] | None = None) -> int:
    """Run the hook; the exit status (0 or 2, never another)."""
    token = ""
    try:
        options = _options(sys.argv[1:] if argv is None else argv)
        if options is None:
            _write(HELP, err=False)
            return 0
        assert options.kind is not None
        server = server_of(options.server)
        token = read_credential()
        body = _read_input(_agent_cap())
        status, headers, answer = _exchange(server, options, token, body)
        code, text = _verdict(server, status, headers, answer)
    except Blocked as exc:
        _error(str(exc), token)
        return EXIT_BLOCK
    except Exception as exc:  # a bug must block the call as well, and print no traceback
        _error(f"evidence-hook failed ({type(exc).__name__}: {exc})", token)
        return EXIT_BLOCK
    if code == EXIT_BLOCK and not text.strip():
        text = "blocked: the evidence service blocked the call and gave no reason"
    _write(_inert(text, multiline=True))
    return code


def main_exit() -> None:
    """The ``evidence-hook`` console script: the answer's status, and 2 on every other
    way out (a signal, an exception that escaped, a failed flush at exit)."""
    block_on_signals()
    try:
        code = main()
    except BaseException:  # whatever it is, the call must not go on
        _write("error: evidence-hook failed: the call is blocked")
        code = EXIT_BLOCK
    # Not SystemExit: the interpreter's shutdown could still end with another status
    # (120 when flushing a closed stdout fails); _write has flushed what it wrote.
    os._exit(code)


# The signals whose default action ends a process, sent to it from outside: an agent CLI
# lets a call through on every exit status but 2, so each one ends the hook with 2. Not
# SIGKILL or SIGSTOP (nothing can catch them: the agent CLI sees the kill), not SIGPIPE
# (ignored: a write to a closed pipe is an error the hook handles), not the faults
# (SIGSEGV, SIGBUS, SIGFPE, SIGILL: a handler would return to the faulting instruction).
ENDING_SIGNALS = (
    "SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGALRM", "SIGUSR1", "SIGUSR2", "SIGXCPU",
    "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGIO", "SIGPWR", "SIGSYS", "SIGTRAP", "SIGABRT",
    "SIGSTKFLT",
)  # fmt: skip


def block_on_signals() -> None:
    """From now on, each of ``ENDING_SIGNALS`` ends this process with status 2 and one
    ``error:`` line (the C module: ``signal`` would import ``enum`` at every hook)."""
    import _signal  # type: ignore[import-not-found]  # no stub: the C module

    names = {getattr(_signal, name): name for name in ENDING_SIGNALS if hasattr(_signal, name)}

    def ended(number: int, _frame: object) -> None:
        name = names.get(number, str(number))
        _write(f"error: evidence-hook ended by {name} before its answer: the call is blocked")
        os._exit(EXIT_BLOCK)

    for number in names:
        _signal.signal(number, ended)


# -- options, server, credential, input -------------------------------------------------


def _options(argv: list[str]) -> _Options | None:
    """The parsed command line; None for ``--help``."""
    options = _Options()
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg in ("-h", "--help"):
            return None
        if not arg.startswith("-"):
            if options.kind is not None or arg not in KINDS:
                shown = arg if len(arg) <= 40 else arg[:37] + "..."
                raise Blocked(f"unexpected argument {shown!r} ({USAGE})")
            options.kind = arg
            continue
        name, equals, value = arg.partition("=")
        if name not in ("--server", "--unknown-tools", "--timeout"):
            shown = name if len(name) <= 40 else name[:37] + "..."
            raise Blocked(f"no such option {shown!r} ({USAGE})")
        if not equals:
            if i >= len(args):
                raise Blocked(f"option {name} needs a value ({USAGE})")
            value = args[i]
            i += 1
        if name == "--server":
            options.server = value
        elif name == "--unknown-tools":
            if value not in UNKNOWN_TOOLS:
                raise Blocked(f"--unknown-tools is deny or record, not {value[:40]!r}")
            options.unknown_tools = value
        else:
            options.timeout = _seconds(value)
    if options.kind is None:
        raise Blocked(f"which hook: pre-tool or post-tool ({USAGE})")
    return options


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= MAX_TIMEOUT:  # NaN and infinity fail here too
        raise Blocked(
            f"--timeout is a number of seconds above 0 and at most 3600, not {value[:40]!r}"
        )
    return seconds


def server_of(given: str | None) -> Server:
    """The service named by ``given`` (``--server``) or ``$EVIDENCE_SERVER``: a unix
    socket or an https URL; ``Blocked`` for anything else, plain http included."""
    url = given if given is not None else os.environ.get("EVIDENCE_SERVER", "")
    if not url:
        raise Blocked("no evidence service: give --server URL or set EVIDENCE_SERVER")
    where = "--server" if given is not None else "EVIDENCE_SERVER"
    if not url.isascii() or any(c <= " " or c == "\x7f" for c in url):
        raise Blocked(f"{where} {url[:200]!r} is not a URL (spaces, controls or non-ASCII)")
    if url.startswith("unix:"):
        if not url.startswith("unix:/"):
            raise Blocked(
                f"{where} {url[:200]!r}: unix: takes an absolute path "
                "(unix:/run/evidence/serve.sock)"
            )
        return Server(url, False, "localhost", 0, "localhost", "", unix=url[len("unix:") :])
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Blocked(f"{where} {url[:200]!r} is not a URL ({exc})") from None
    if "@" in parts.netloc:  # shown nowhere: it may hold a password
        raise Blocked(
            f"{where} must not hold a user or a password: the credential comes from "
            "EVIDENCE_CREDENTIAL or EVIDENCE_CREDENTIAL_FILE"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Blocked(f"{where} {url[:200]!r} is not a unix:PATH or an https:// URL")
    if parts.scheme == "http":
        raise Blocked(
            f"{where} {url[:200]!r} is plain http://: the credential would go to whatever "
            "listens on that port, another user's program if it bound the port first; use "
            "unix:PATH (evidence serve --uds PATH) or https://"
        )
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise Blocked(f"{where} {url[:200]!r} must not carry a query or a fragment")
    tls = parts.scheme == "https"
    base = f"{parts.scheme}://{parts.netloc}{parts.path}".rstrip("/")
    return Server(
        base,
        tls,
        parts.hostname,
        port if port is not None else 443 if tls else 80,
        parts.netloc,
        parts.path.rstrip("/"),
    )


def read_credential() -> str:
    """The agent's credential from ``$EVIDENCE_CREDENTIAL`` or the file
    ``$EVIDENCE_CREDENTIAL_FILE`` names (never the command line)."""
    value = os.environ.get("EVIDENCE_CREDENTIAL", "")
    path = os.environ.get("EVIDENCE_CREDENTIAL_FILE", "")
    if value and path:
        raise Blocked("both EVIDENCE_CREDENTIAL and EVIDENCE_CREDENTIAL_FILE are set: set one")
    if value:
        source = "EVIDENCE_CREDENTIAL"
        token = value.strip()
    elif path:
        source = f"the credential file {path!r} (EVIDENCE_CREDENTIAL_FILE)"
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_CREDENTIAL + 1)
        except OSError as exc:
            raise Blocked(f"cannot read {source}: {exc.strerror or exc}") from None
        if len(data) > MAX_CREDENTIAL:
            raise Blocked(f"{source} is larger than 64 KiB: not a credential")
        token = data.decode("ascii", "replace").strip()
    else:
        raise Blocked(
            "no credential: set EVIDENCE_CREDENTIAL (or EVIDENCE_CREDENTIAL_FILE) to the "
            "agent credential an operator issued for the plan"
        )
    if not token:
        raise Blocked(f"{source} is empty")
    if any(not "!" <= c <= "~" for c in token):  # it goes into a header line
        raise Blocked(f"{source} is not a bearer credential (printable ASCII without spaces)")
    return token


def _agent_cap() -> int:
    raw = os.environ.get(AGENT_CAP_ENV, "").strip()
    if not raw:
        return DEFAULT_AGENT_CAP
    try:
        cap = int(raw)
    except ValueError:
        raise Blocked(f"{AGENT_CAP_ENV}: {raw[:40]!r} is not a whole number of bytes") from None
    if not 1 <= cap <= MAX_SAFE_INTEGER:
        raise Blocked(f"{AGENT_CAP_ENV}: must be between 1 and 2^53 - 1 bytes")
    return cap


def _read_input(cap: int) -> bytes:
    """The hook input: at most ``cap + 1`` bytes are ever read from stdin, and over the
    cap nothing is sent."""
    if sys.stdin is None:
        raise Blocked("no stdin: the hook input is read from stdin")
    stream = sys.stdin.buffer
    chunks: list[bytes] = []
    left = cap + 1
    try:
        while left > 0:
            chunk = stream.read(min(left, _MIB))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise Blocked(f"cannot read the hook input on stdin ({exc.strerror or exc})") from None
    if left <= 0:
        raise Blocked(
            f"the hook input on stdin is larger than the {_size(cap)} cap on bytes an agent "
            f"produced (read past {cap} bytes; set {AGENT_CAP_ENV} to raise it); "
            "nothing was sent"
        )
    return b"".join(chunks)


def _size(n: int) -> str:
    for unit, size in (("MiB", _MIB), ("KiB", _KIB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


# -- one HTTP/1.1 exchange --------------------------------------------------------------


class _BadAnswer(Exception):
    """What came back is not an HTTP answer this client reads."""


class _Reader:
    """The answer's bytes from the socket, every wait bounded by one deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline
        self.buf = bytearray()
        self.total = 0

    def _fill(self) -> bool:
        self.sock.settimeout(_left(self.deadline))
        chunk = self.sock.recv(256 * _KIB)
        if not chunk:
            return False
        self.total += len(chunk)
        if self.total > MAX_ANSWER:
            raise _BadAnswer(f"an answer larger than {_size(MAX_ANSWER)}")
        self.buf += chunk
        return True

    def line(self) -> bytes:
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                line = bytes(self.buf[: end + 1])
                del self.buf[: end + 1]
                return line
            if len(self.buf) > MAX_HEAD_LINE:
                raise _BadAnswer("a line longer than 64 KiB in its head")
            if not self._fill():
                raise EOFError

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise _BadAnswer("the answer ended before its length")
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def rest(self) -> bytes:
        while self._fill():
            pass
        data = bytes(self.buf)
        self.buf.clear()
        return data


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _exchange(
    server: Server, options: _Options, token: str, body: bytes
) -> tuple[int, dict[str, str], bytes]:
    """POST the hook input; the answer's status, headers (lower-case names) and body."""
    where = f"the evidence service at {server.url}"
    deadline = time.monotonic() + options.timeout
    head = (
        f"POST {server.path}/v1/hooks/{options.kind}?unknown_tools={options.unknown_tools} "
        f"HTTP/1.1\r\nHost: {server.netloc}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Accept: application/json\r\nUser-Agent: evidence-hook\r\nConnection: close\r\n\r\n"
    ).encode("ascii")
    try:
        sock = connect_checked(server, options.timeout)
    except TimeoutError:
        raise Blocked(f"{where} is unreachable (no connection in {options.timeout:g} s)") from None
    except OSError as exc:
        raise Blocked(f"{where} is unreachable ({_why(exc)})") from None
    except UnicodeError:  # the resolver's IDNA codec: an empty or too long label
        raise Blocked(f"{where} is unreachable (not a valid host name)") from None
    try:
        if server.tls:
            sock = _tls(sock, server, deadline)
        unsent: OSError | None = None
        try:
            sock.settimeout(_left(deadline))
            sock.sendall(head + body)
        except TimeoutError:
            raise
        except OSError as exc:  # it may have answered (a refusal) before reading it all
            unsent = exc
        try:
            return _answer(_Reader(sock, deadline))
        except EOFError:
            if unsent is not None:
                raise Blocked(f"{where} broke the connection ({_why(unsent)})") from None
            raise Blocked(f"{where} closed the connection without an answer") from None
        except _BadAnswer as exc:
            raise Blocked(f"{where} answered with something that is not HTTP ({exc})") from None
    except TimeoutError:
        raise Blocked(f"{where} did not answer within {options.timeout:g} s") from None
    except OSError as exc:
        raise Blocked(f"{where} broke the connection ({_why(exc)})") from None
    finally:
        sock.close()


def _tls(sock: socket.socket, server: Server, deadline: float) -> socket.socket:
    import ssl  # only an https server pays for it

    where = f"the evidence service at {server.url}"
    pinned = os.environ.get(SERVER_CA_ENV, "")
    try:  # a pinned authority replaces the system's: the service's certificate, or its CA
        context = ssl.create_default_context(cafile=pinned or None)
    except (OSError, ssl.SSLError) as exc:
        raise Blocked(f"cannot load {SERVER_CA_ENV} {pinned[:200]!r} ({_why(exc)})") from None
    sock.settimeout(_left(deadline))
    try:
        return context.wrap_socket(sock, server_hostname=server.host)
    except ssl.SSLError as exc:
        reason = getattr(exc, "verify_message", None) or exc.reason or str(exc)
        raise Blocked(f"{where}: the TLS handshake failed ({reason})") from None


# -- who answers: a unix socket only its service's user could have put there ------------


def connect_checked(server: Server, timeout: float) -> socket.socket:
    """A connection to the service, over TCP or to its unix socket; the socket only if no
    one but its owner (or root) could have put it where it is, and only if the process
    listening on it runs as that owner (or root). Nothing has been sent yet."""
    if not server.unix:
        return socket.create_connection((server.host, server.port), timeout=timeout)
    where = f"the evidence service at {server.url}"
    try:
        path, directories = resolve(server.unix)
    except FileNotFoundError:
        raise Blocked(f"{where} is unreachable (no socket at {server.unix})") from None
    info = os.lstat(path)
    if not stat.S_ISSOCK(info.st_mode):
        raise Blocked(f"{where} is unreachable ({path} is not a socket)")
    why = untrusted(directories, info.st_uid)
    if why is not None:
        raise Blocked(f"{where} is not trusted: {why}; nothing was sent")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        peer = peer_uid(sock)
        if peer not in (info.st_uid, 0):
            raise Blocked(
                f"{where} is not trusted: the process listening runs as uid {peer}, not as "
                f"the socket's owner (uid {info.st_uid}); nothing was sent"
            )
    except BaseException:
        sock.close()
        raise
    return sock


def resolve(path: str) -> tuple[str, list[str]]:
    """The absolute ``path`` with every symbolic link followed, and each directory the
    lookup read an entry of: whoever may write one of them could have pointed the path
    at a socket of their own. ``OSError`` if a part is missing or the links loop."""
    current, todo, hops = "/", [part for part in path.split("/") if part], 0
    directories = ["/"]
    while todo:
        name = todo.pop(0)
        if name in (".", ".."):
            current = current if name == "." else os.path.dirname(current)
            continue
        if current not in directories:
            directories.append(current)
        candidate = os.path.join(current, name)
        if not stat.S_ISLNK(os.lstat(candidate).st_mode):
            current = candidate
            continue
        hops += 1
        if hops > 40:
            raise OSError(f"too many symbolic links in {path}")
        target = os.readlink(candidate)
        current = "/" if target.startswith("/") else current
        todo[:0] = [part for part in target.split("/") if part]
    return current, directories


def untrusted(directories: list[str], owner: int) -> str | None:
    """Why another user than ``owner`` (and root) could place or replace a socket under
    ``directories``: one of them belongs to someone else, or its group or everyone may
    write to it (a sticky ``/tmp`` too: a name there is whoever's takes it first). None
    when no one else could."""
    for directory in directories:
        info = os.lstat(directory)
        if info.st_uid not in (0, owner):
            return (
                f"{directory} belongs to uid {info.st_uid}, neither root nor the socket's "
                f"owner (uid {owner})"
            )
        if info.st_mode & 0o022:
            who = "everyone" if info.st_mode & 0o002 else "its group"
            return f"{directory} is writable by {who} (mode {info.st_mode & 0o7777:o})"
    return None


def peer_uid(sock: socket.socket) -> int:
    """The user the process at the other end of a unix socket ran as when it listened
    (or connected): the kernel's word, ``SO_PEERCRED``'s pid, uid, gid."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return int.from_bytes(creds[4:8], sys.byteorder)


def _why(exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve its name: {exc.strerror or exc}"
    return exc.strerror or str(exc) or type(exc).__name__


def _answer(reader: _Reader) -> tuple[int, dict[str, str], bytes]:
    while True:  # interim answers (100 Continue, 103 Early Hints) come first
        status_line = reader.line()  # EOFError: no answer at all
        words = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        if (
            len(words) < 2
            or words[0] not in ("HTTP/1.0", "HTTP/1.1")
            or not (len(words[1]) == 3 and words[1].isdigit())
        ):
            raise _BadAnswer(f"status line {status_line[:60]!r}")
        status = int(words[1])
        headers: dict[str, str] = {}
        while True:
            try:
                line = reader.line()
            except EOFError:
                raise _BadAnswer("the answer ended in its headers") from None
            if line in (b"\r\n", b"\n"):
                break
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon or not name.strip() or len(headers) >= MAX_HEADERS:
                raise _BadAnswer(f"header line {line[:60]!r}")
            headers[name.strip().lower()] = value.strip()
        if not 100 <= status < 200:
            break
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _chunked(reader)
    elif "content-length" in headers:
        length = headers["content-length"]
        if not length.isdigit() or int(length) > MAX_ANSWER:
            raise _BadAnswer(f"Content-Length {length[:40]!r}")
        body = reader.exactly(int(length))
    else:
        body = reader.rest()  # to the end of the connection (Connection: close was asked)
    return status, headers, body


def _chunked(reader: _Reader) -> bytes:
    body = bytearray()
    while True:
        try:
            size_line = reader.line().split(b";", 1)[0].strip()
        except EOFError:
            raise _BadAnswer("the answer ended in a chunk") from None
        try:
            size = int(size_line, 16) if size_line.isalnum() else -1
        except ValueError:
            size = -1
        if size < 0:
            raise _BadAnswer(f"chunk size {size_line[:40]!r}")
        if size == 0:
            try:
                while reader.line() not in (b"\r\n", b"\n"):  # trailers, if any
                    pass
            except EOFError:
                pass
            return bytes(body)
        if len(body) + size > MAX_ANSWER:
            raise _BadAnswer(f"an answer larger than {_size(MAX_ANSWER)}")
        body += reader.exactly(size)
        if reader.exactly(2) != b"\r\n":
            raise _BadAnswer("a chunk not ended by CRLF")


# -- the answer -------------------------------------------------------------------------


def _verdict(server: Server, status: int, headers: dict[str, str], body: bytes) -> tuple[int, str]:
    """The service's hook answer (exit, stderr); any other answer blocks."""
    where = f"the evidence service at {server.url}"
    if status == 200:
        try:
            answer = json.loads(body)
        except ValueError:
            raise Blocked(f"{where} answered 200 with a body that is not JSON") from None
        code = answer.get("exit") if isinstance(answer, dict) else None
        text = answer.get("stderr") if isinstance(answer, dict) else None
        if type(code) is not int or code not in (0, EXIT_BLOCK) or not isinstance(text, str):
            raise Blocked(
                f'{where} answered 200 without a hook answer ({{"exit": 0 or 2, '
                '"stderr": TEXT} expected)'
            )
        return code, text
    detail = _detail(body)
    if status in (401, 403):
        raise Blocked(
            f"{where} refused the credential (HTTP {status}{detail}): check "
            "EVIDENCE_CREDENTIAL or EVIDENCE_CREDENTIAL_FILE"
        )
    if status in (429, 503):
        retry = headers.get("retry-after", "")[:40]
        after = f", retry after {retry}{' s' if retry.isdigit() else ''}" if retry else ""
        raise Blocked(f"{where} is overloaded (HTTP {status}{after}{detail})")
    if 400 <= status < 500:
        raise Blocked(f"{where} refused the hook (HTTP {status}{detail})")
    if 500 <= status < 600:
        raise Blocked(f"{where} failed (HTTP {status}{detail})")
    raise Blocked(f"{where} answered HTTP {status}, not a hook answer (redirects are not followed)")


def _detail(body: bytes) -> str:
    """``: WHY`` from a refusal's body (a JSON ``error``/``detail``/``message`` string, or
    its first line of text), at most 200 characters; empty if there is none."""
    text = ""
    try:
        answer = json.loads(body)
    except ValueError:
        try:
            lines = body[:4096].decode("utf-8").strip().splitlines()
        except UnicodeDecodeError:
            lines = []
        text = lines[0] if lines and not lines[0].lstrip().startswith("<") else ""
    else:
        if isinstance(answer, dict):
            for key in ("error", "detail", "message"):
                value = answer.get(key)
                if isinstance(value, dict):
                    value = value.get("message")
                if isinstance(value, str) and value.strip():
                    text = value.strip()
                    break
    if not text:
        return ""
    text = " ".join(text.split())
    return f": {text if len(text) <= 200 else text[:197] + '...'}"


# -- output -----------------------------------------------------------------------------

_JOINERS = ("\u200c", "\u200d")  # format characters that some scripts and emoji need
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _inert(text: str, *, multiline: bool = False) -> str:
    """``text`` safe for a terminal, exactly as ``commands.text.inert`` makes it (the
    same rule, not imported: this module imports nothing of the house): every character
    Python does not call printable written as a visible escape (``\\x1b``,
    ``\\u202e``), a newline kept with ``multiline``.
    tests/commands/cli/test_terminal_text.py compares the two on every code point."""
    lines = text.split("\n") if multiline else [text]
    out = []
    for line in lines:
        if not line.isprintable():
            line = "".join(c if c.isprintable() or c in _JOINERS else _escape(c) for c in line)
        out.append(line)
    return "\n".join(out)


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _error(message: str, token: str) -> None:
    if len(token) >= 8:  # whatever a message quotes, the credential is never shown
        message = message.replace(token, "[credential]")
    _write(f"error: {_inert(message)}")


def _write(text: str, *, err: bool = True) -> None:
    """``text`` and a final newline, as UTF-8 whatever the locale; a closed stream is
    not an error (the exit status still says it all)."""
    if not text:
        return
    if not text.endswith("\n"):
        text += "\n"
    stream = sys.stderr if err else sys.stdout
    try:
        buffer = getattr(stream, "buffer", None)
        if buffer is not None:
            stream.flush()
            buffer.write(text.encode("utf-8", "backslashreplace"))
            buffer.flush()
        else:
            stream.write(text)
            stream.flush()
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    main_exit()
