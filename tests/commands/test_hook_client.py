"""``evidence-hook`` (commands/hook_client.py): the agent hooks as thin clients of the
evidence service. What it imports (nothing but the standard library, none of the house:
its start-up is the point), and its side of the HTTP contract against a real HTTP server
started here — a stand-in answering as the contract says, since it is the client that is
tested: its request, the answer relayed, and every failure to get one a block (exit 2
and one ``error:`` line), never a call let through.

Where the process boundary is the point (the exit status, stdin, argv as ``ps`` shows
it) the client runs as a real process; elsewhere in-process through ``main``."""

from __future__ import annotations

import ast
import datetime
import io
import ipaddress
import json
import os
import socketserver
import ssl
import subprocess
import sys
import threading
import tomllib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from commands import hook_client
from tests.helpers import REPO, run_cli, wait_ready

ROOT = REPO
TOKEN = "evc_agent.s3cr3t-Token_value"
HOOK_INPUT = json.dumps(
    {
        "session_id": "s-1",
        "hook_event_name": "PreToolUse",
        "tool_name": "search",
        "tool_input": {"query": "naïve"},
        "tool_use_id": "toolu_01",
    }
).encode()
CLIENT_ENV = ("EVIDENCE_SERVER", "EVIDENCE_CREDENTIAL", "EVIDENCE_CREDENTIAL_FILE")


# -- a real HTTP server in a thread --------------------------------------------------------

Reply = Callable[[BaseHTTPRequestHandler], None]


class Stub:
    """A real HTTP/1.1 server answering with ``reply`` (default: let the call go on): on
    a unix socket in ``directory``, or with ``tls`` on 127.0.0.1 (the two ways a client
    sends a credential). It keeps every request it got, and, while a client's ``pid``
    is known, that process's argv as ``ps`` shows it."""

    def __init__(self, directory: Path | None = None, tls: ssl.SSLContext | None = None):
        self.requests: list[dict[str, Any]] = []
        self.reply: Reply = answer(200, {"exit": 0, "stderr": ""})
        self.release = threading.Event()  # ends every reply that waits
        self.pid: int | None = None
        self.argv_seen: list[bytes] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                stub.requests.append(
                    {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body,
                    }
                )
                if stub.pid is not None:
                    stub.argv_seen.append(Path(f"/proc/{stub.pid}/cmdline").read_bytes())
                self.close_connection = True
                stub.reply(self)

            def log_message(self, *args: object) -> None:
                pass

        class Quiet:
            daemon_threads = True

            def handle_error(self, *args: object) -> None:
                pass  # a client that left, a refused handshake: the test looks at the client

        class Server(Quiet, ThreadingHTTPServer):
            pass

        class UnixServer(Quiet, socketserver.ThreadingUnixStreamServer):
            pass

        self.httpd: socketserver.BaseServer
        if tls is not None:
            self.httpd = Server(("127.0.0.1", 0), Handler)
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        else:
            assert directory is not None
            self.httpd = UnixServer(str(directory / "serve.sock"), Handler)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        address = self.httpd.server_address
        if isinstance(address, str):
            return f"unix:{address}"
        return f"https://127.0.0.1:{address[1]}"

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def answer(status: int, body: Any, headers: dict[str, str] | None = None) -> Reply:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()

    def reply(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    return reply


def raw(data: bytes) -> Reply:
    return lambda handler: handler.wfile.write(data)


@pytest.fixture
def stub(socket_dir: Path) -> Iterator[Stub]:
    server = Stub(socket_dir)
    yield server
    server.close()


@pytest.fixture
def tls_stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stub]:
    """The stub over https with a certificate of its own, the one the client trusts."""
    cert = _self_signed(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, tmp_path / "key.pem")
    monkeypatch.setenv("EVIDENCE_SERVER_CA", str(cert))
    server = Stub(tls=tls)
    yield server
    server.close()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        *CLIENT_ENV,
        "EVIDENCE_MAX_AGENT_BYTES",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "EVIDENCE_SERVER_CA",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EVIDENCE_CREDENTIAL", TOKEN)


def hook(
    monkeypatch: pytest.MonkeyPatch, *argv: str, stdin: bytes = HOOK_INPUT
) -> tuple[int, str, str]:
    """``evidence-hook ARGV`` in this process: its exit status, stdout and stderr."""
    out, err = io.BytesIO(), io.BytesIO()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out, write_through=True))
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(err, write_through=True))
    code = hook_client.main(list(argv))
    return code, out.getvalue().decode(), err.getvalue().decode()


def blocked(result: tuple[int, str, str], *fragments: str) -> str:
    """The one ``error:`` line of a block, holding every fragment; stdout empty."""
    code, out, err = result
    assert (code, out) == (2, ""), result
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert TOKEN not in err
    return lines[0]


def process(
    *argv: str, stdin: bytes = HOOK_INPUT, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``evidence-hook ARGV`` as a real process (``python -m commands.hook_client``)."""
    full = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV}
    full.update({"EVIDENCE_CREDENTIAL": TOKEN, **(env or {})})
    return subprocess.Popen(
        [sys.executable, "-m", "commands.hook_client", *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=full,
    )


def finish(proc: subprocess.Popen[bytes], stdin: bytes = HOOK_INPUT) -> tuple[int, str, str]:
    out, err = proc.communicate(stdin, timeout=30)
    return proc.returncode, out.decode(), err.decode()


# -- what it imports -----------------------------------------------------------------------

PROBE = """
import os, sys
before = set(sys.modules)
from commands import hook_client
code = hook_client.main(["pre-tool", "--server", os.environ["PROBE_SERVER"]])
print(repr((code, sorted(set(sys.modules) - before))))
"""


def test_commands_init_imports_nothing() -> None:
    tree = ast.parse((ROOT / "commands" / "__init__.py").read_text())
    assert all(isinstance(node, ast.Expr) for node in tree.body), "only a docstring"


def test_a_whole_hook_imports_only_the_standard_library(stub: Stub) -> None:
    """A real process imports the client and runs one hook against the server: every
    module it loaded beyond the interpreter's start is the standard library's, or the
    client and its empty package; not ``http.client``/``urllib.request`` (``email``) nor
    ``ssl`` for an http:// server."""
    env = {**os.environ, "PROBE_SERVER": stub.url, "EVIDENCE_CREDENTIAL": TOKEN}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], input=HOOK_INPUT, capture_output=True, env=env, timeout=30
    )
    code, loaded = ast.literal_eval(done.stdout.decode().strip().splitlines()[-1])
    assert code == 0 and len(stub.requests) == 1, done.stderr
    ours = {"commands", "commands.hook_client"}
    foreign = [
        m for m in loaded if m not in ours and m.split(".")[0] not in sys.stdlib_module_names
    ]
    assert foreign == [], foreign
    costly = [m for m in loaded if m.split(".")[0] in ("email", "http", "ssl", "typing")]
    assert costly == [] and "urllib.request" not in loaded, costly


CLI_PROBE = """
import os, sys
from commands.cli import main
try:
    main(["hook", "pre-tool", "--server", os.environ["PROBE_SERVER"]])
except SystemExit as exc:
    code = exc.code
print(repr((code, sorted(sys.modules))))
"""


def test_evidence_hook_server_does_not_import_the_plane(stub: Stub) -> None:
    """The click spelling relays without loading the store, the plane or the gates
    (they cost it ten times the client's start-up: docs/performance.md)."""
    env = {**os.environ, "PROBE_SERVER": stub.url, "EVIDENCE_CREDENTIAL": TOKEN}
    done = subprocess.run(
        [sys.executable, "-c", CLI_PROBE],
        input=HOOK_INPUT,
        capture_output=True,
        env=env,
        timeout=60,
    )
    code, loaded = ast.literal_eval(done.stdout.decode().strip().splitlines()[-1])
    assert code in (0, None) and len(stub.requests) == 1, done.stderr
    heavy = (
        "sqlalchemy",
        "jsonschema_rs",
        "msgspec",
        "commands.plane",
        "ledger.store",
        "projections",
    )
    assert [m for m in loaded if m.startswith(heavy)] == []


def test_the_console_script_is_registered() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["evidence-hook"] == "commands.hook_client:main_exit"


# -- the request ---------------------------------------------------------------------------


def test_the_hook_input_is_posted_unchanged_with_the_bearer_token(
    stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert hook(monkeypatch, "pre-tool", "--server", stub.url) == (0, "", "")
    (request,) = stub.requests
    assert request["path"] == "/v1/hooks/pre-tool?unknown_tools=deny"
    assert request["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert request["headers"]["content-type"] == "application/json"
    assert request["body"] == HOOK_INPUT


def test_the_server_from_the_environment_under_its_path_and_record(
    tls_stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    stub = tls_stub  # a path prefix is a web server's (a TLS proxy's), not a socket's
    monkeypatch.setenv("EVIDENCE_SERVER", stub.url + "/plane/")
    assert hook(monkeypatch, "post-tool", "--unknown-tools", "record")[0] == 0
    assert stub.requests[0]["path"] == "/plane/v1/hooks/post-tool?unknown_tools=record"
    assert hook(monkeypatch, "post-tool", f"--server={stub.url}")[0] == 0  # --server wins
    assert stub.requests[1]["path"] == "/v1/hooks/post-tool?unknown_tools=deny"


def test_the_credential_from_a_file(
    stub: Stub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("EVIDENCE_CREDENTIAL")
    (tmp_path / "cred").write_text(TOKEN + "\n")
    monkeypatch.setenv("EVIDENCE_CREDENTIAL_FILE", str(tmp_path / "cred"))
    assert hook(monkeypatch, "pre-tool", "--server", stub.url)[0] == 0
    assert stub.requests[0]["headers"]["authorization"] == f"Bearer {TOKEN}"


# -- the answer relayed --------------------------------------------------------------------

VERDICT = (
    "blocked: the input gate failed for tool 'search' in plan P-1: 1 deviation(s); "
    "the call is not made\n  /limit: wrong_type (expected integer; got string)\n"
    "routed: retry in the next iteration (2 iteration(s) left in this attempt)\n"
)


@pytest.mark.parametrize(
    ("exit", "text"), [(0, ""), (2, VERDICT), (0, "note: recorded, unregistered\n")]
)
def test_exit_and_stderr_are_relayed(
    stub: Stub, monkeypatch: pytest.MonkeyPatch, exit: int, text: str
) -> None:
    stub.reply = answer(200, {"exit": exit, "stderr": text, "later": "ignored"})
    assert hook(monkeypatch, "pre-tool", "--server", stub.url) == (exit, "", text)


def test_a_relayed_text_is_made_inert_and_a_silent_block_says_so(
    stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    stub.reply = answer(200, {"exit": 2, "stderr": "blocked: \x1b]0;PWNED\x07 \u202e x"})
    code, _, err = hook(monkeypatch, "pre-tool", "--server", stub.url)
    assert (code, err) == (2, "blocked: \\x1b]0;PWNED\\x07 \\u202e x\n")
    stub.reply = answer(200, {"exit": 2, "stderr": ""})
    code, _, err = hook(monkeypatch, "pre-tool", "--server", stub.url)
    assert code == 2 and err.startswith("blocked: ") and "no reason" in err


def test_a_chunked_answer_is_read(stub: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    body = json.dumps({"exit": 2, "stderr": VERDICT}).encode()
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 7]), body[i : i + 7]) for i in range(0, len(body), 7)
    )
    stub.reply = raw(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunks
        + b"0\r\n\r\n"
    )
    assert hook(monkeypatch, "pre-tool", "--server", stub.url) == (2, "", VERDICT)


# -- every other answer, or none, blocks -----------------------------------------------------


REFUSED = "refused the credential"
ANSWERS = [
    (401, {"error": "unknown credential"}, {}, (REFUSED, "HTTP 401: unknown credential")),
    (403, {"detail": "not this plan's"}, {}, (REFUSED, "HTTP 403: not this plan's")),
    (409, {"error": "plan P-1 is not in Execute"}, {}, ("refused the hook (HTTP 409: plan",)),
    (422, {"error": {"message": "not valid JSON"}}, {}, ("hook (HTTP 422: not valid JSON)",)),
    (429, {}, {"Retry-After": "3"}, ("is overloaded", "HTTP 429, retry after 3 s")),
    (503, b"busy\nmore", {"Retry-After": "1"}, ("overloaded (HTTP 503, retry after 1 s: busy)",)),
    (500, b"<html>Internal Server Error</html>", {}, ("failed (HTTP 500)",)),
    (500, {"exit": 0, "stderr": ""}, {}, ("failed (HTTP 500)",)),  # only a 200 is an answer
    (201, {"exit": 0, "stderr": ""}, {}, ("HTTP 201, not a hook answer",)),
    (302, b"", {"Location": "http://elsewhere/"}, ("HTTP 302", "not followed")),
    (200, b"not json", {}, ("answered 200", "not JSON")),
    (200, {"exit": 1, "stderr": ""}, {}, ("without a hook answer",)),
    (200, {"exit": True, "stderr": ""}, {}, ("without a hook answer",)),
    (200, {"exit": 0}, {}, ("without a hook answer",)),
    (200, [0, ""], {}, ("without a hook answer",)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("status", "body", "headers", "fragments"),
    ANSWERS,
    ids=[f"{status}-{i}" for i, (status, *_) in enumerate(ANSWERS)],
)
def test_any_other_answer_blocks(
    stub: Stub,
    monkeypatch: pytest.MonkeyPatch,
    status: int,
    body: Any,
    headers: dict[str, str],
    fragments: tuple[str, ...],
) -> None:
    stub.reply = answer(status, body, headers)
    line = blocked(hook(monkeypatch, "pre-tool", "--server", stub.url), *fragments)
    assert f"the evidence service at {stub.url}" in line


@pytest.mark.parametrize(
    ("reply", "fragment"),
    [
        (raw(b"SSH-2.0-OpenSSH_9.2\r\n\r\n"), "not HTTP"),
        (raw(b""), "closed the connection without an answer"),
        (raw(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{}"), "ended before its length"),
        (raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"), "chunk size"),
    ],
    ids=["not-http", "closed", "short", "bad-chunk"],
)
def test_a_broken_answer_blocks(
    stub: Stub, monkeypatch: pytest.MonkeyPatch, reply: Reply, fragment: str
) -> None:
    stub.reply = reply
    blocked(hook(monkeypatch, "pre-tool", "--server", stub.url), fragment)


def test_a_refusal_never_shows_the_credential(stub: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    stub.reply = answer(401, {"error": f"credential {TOKEN} is revoked"})
    line = blocked(hook(monkeypatch, "pre-tool", "--server", stub.url), "[credential] is revoked")
    assert TOKEN not in line


def test_no_server_listening_blocks(monkeypatch: pytest.MonkeyPatch, socket_dir: Path) -> None:
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        url = f"https://127.0.0.1:{free.getsockname()[1]}"
    blocked(hook(monkeypatch, "pre-tool", "--server", url), f"at {url} is unreachable (")
    line = blocked(hook(monkeypatch, "pre-tool", "--server", "https://a..b"), "not a valid host")
    assert "https://a..b is unreachable" in line
    gone = f"unix:{socket_dir / 'serve.sock'}"
    blocked(hook(monkeypatch, "pre-tool", "--server", gone), f"at {gone} is unreachable (no socket")
    with socket.socket(socket.AF_UNIX) as stale:  # a socket file nothing listens on any more
        stale.bind(str(socket_dir / "serve.sock"))
    blocked(hook(monkeypatch, "pre-tool", "--server", gone), f"at {gone} is unreachable (")


def test_no_answer_within_the_timeout_blocks(stub: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    gave_up = threading.Event()

    def hold(handler: BaseHTTPRequestHandler) -> None:  # the request read, never answered
        if stub.release.wait(60):  # a failure bound: the client must have left long before
            return
        gave_up.set()
        handler.wfile.write(b"HTTP/1.1 500 Too Late\r\nContent-Length: 0\r\n\r\n")

    stub.reply = hold
    blocked(hook(monkeypatch, "pre-tool", "--server", stub.url, "--timeout", "0.3"), "within 0.3 s")
    assert not gave_up.is_set()  # the client's timeout ended it, not the server


def test_an_answer_dripping_forever_is_bounded_by_the_timeout(
    stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every read gets a byte well within the timeout: only a deadline over the whole
    answer ends it. The drip stops after a bound (then the answer ends, and what the
    client says is no timeout) so that a client without that deadline fails, not hangs."""
    drops = 3000  # about a minute of them: a failure bound
    dripped: list[bytes] = []

    def drip(handler: BaseHTTPRequestHandler) -> None:
        handler.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        for _ in range(drops):
            if stub.release.wait(0.02):
                return
            handler.wfile.write(b"a")
            handler.wfile.flush()
            dripped.append(b"a")
        handler.wfile.write(b"\r\n\r\n")

    stub.reply = drip
    blocked(hook(monkeypatch, "pre-tool", "--server", stub.url, "--timeout", "0.3"), "within 0.3 s")
    assert len(dripped) < drops  # the client left while the answer was still dripping


def test_https_with_a_trusted_certificate_and_without(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cert = _self_signed(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, tmp_path / "key.pem")
    server = Stub(tls=tls)
    try:
        blocked(hook(monkeypatch, "pre-tool", "--server", server.url), "TLS handshake failed")
        assert server.requests == []
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        assert hook(monkeypatch, "pre-tool", "--server", server.url) == (0, "", "")
        assert server.requests[0]["headers"]["authorization"] == f"Bearer {TOKEN}"
    finally:
        server.close()


def _self_signed(directory: Path) -> Path:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "evidence test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    (directory / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return directory / "cert.pem"


# -- refused before anything is sent -------------------------------------------------------


def test_over_the_cap_nothing_is_sent(stub: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVIDENCE_MAX_AGENT_BYTES", "100")
    assert hook(monkeypatch, "pre-tool", "--server", stub.url, stdin=b" " * 100)[0] == 0
    line = blocked(
        hook(monkeypatch, "pre-tool", "--server", stub.url, stdin=b" " * 101),
        "larger than the 100 bytes cap",
        "EVIDENCE_MAX_AGENT_BYTES",
        "nothing was sent",
    )
    assert len(stub.requests) == 1, line


@pytest.mark.parametrize(
    ("argv", "env", "fragments"),
    [
        ((), {}, ("pre-tool or post-tool",)),
        (("pre-tool",), {}, ("no evidence service", "EVIDENCE_SERVER")),
        (("pre-tool", "--server", "ftp://h"), {}, ("not a unix:PATH or an https:// URL",)),
        (("pre-tool", "--server", "http://u:pw@h"), {}, ("must not hold a user",)),
        (("pre-tool", "--server", "https://h/?x=1"), {}, ("query",)),
        (("pre-tool", "--server", "https://h:99999"), {}, ("not a URL",)),
        (("pre-tool", "--server", "https://h/\x1b[2J"), {}, ("\\x1b[2J",)),
        (("pre-tool", "--server", "https://h", "--timeout", "nan"), {}, ("--timeout",)),
        (("pre-tool", "--server", "https://h", "--unknown-tools", "all"), {}, ("deny or record",)),
        (("pre-tool", "--server", "http://127.0.0.1:8750"), {}, ("plain http://", "unix:PATH")),
        (("pre-tool", "--server", "unix:serve.sock"), {}, ("absolute path",)),
        (("pre-tool", "--token", "hunter2"), {}, ("no such option '--token'",)),
        (("pre-tool", "--token=hunter2"), {}, ("no such option '--token'",)),
        (("pre-tool", "post-tool"), {}, ("unexpected argument 'post-tool'",)),
        (("pre-tool", "--server"), {}, ("--server needs a value",)),
        (("pre-tool", "--server=https://h"), {"EVIDENCE_CREDENTIAL": ""}, ("no credential",)),
        (("pre-tool", "--server=https://h"), {"EVIDENCE_CREDENTIAL": "a b"}, ("not a bearer",)),
        (("pre-tool", "--server=https://h"), {"EVIDENCE_CREDENTIAL_FILE": "/x"}, ("both",)),
        (("pre-tool", "--server=https://h"), {"EVIDENCE_MAX_AGENT_BYTES": "lots"}, ("whole",)),
    ],
)  # fmt: skip
def test_a_bad_command_line_or_environment_blocks(
    monkeypatch: pytest.MonkeyPatch,
    argv: tuple[str, ...],
    env: dict[str, str],
    fragments: tuple[str, ...],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    line = blocked(hook(monkeypatch, *argv), *fragments)
    assert "hunter2" not in line and "pw" not in line


def test_an_unreadable_credential_file_blocks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("EVIDENCE_CREDENTIAL")
    monkeypatch.setenv("EVIDENCE_CREDENTIAL_FILE", str(tmp_path / "missing"))
    blocked(
        hook(monkeypatch, "pre-tool", "--server", "https://h"), "cannot read the credential file"
    )
    (tmp_path / "empty").write_text("\n")
    monkeypatch.setenv("EVIDENCE_CREDENTIAL_FILE", str(tmp_path / "empty"))
    blocked(hook(monkeypatch, "pre-tool", "--server", "https://h"), "is empty")


def test_a_fault_of_the_client_itself_blocks(stub: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception nothing expected (here: stdin closed under it) is a block with one
    line, never a traceback and exit 1 — which an agent CLI reads as "go on"."""
    out, err = io.BytesIO(), io.BytesIO()
    stdin = io.TextIOWrapper(io.BytesIO(HOOK_INPUT))
    stdin.buffer.close()
    monkeypatch.setattr(sys, "stdin", stdin)
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out, write_through=True))
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(err, write_through=True))
    code = hook_client.main(["pre-tool", "--server", stub.url])
    blocked((code, out.getvalue().decode(), err.getvalue().decode()), "evidence-hook failed")
    assert stub.requests == []


def test_help_goes_to_stdout(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = hook(monkeypatch, "--help")
    assert (code, err) == (0, "") and out.startswith(hook_client.USAGE)


# -- as a real process -----------------------------------------------------------------------


def test_a_real_process_exits_with_the_answer(stub: Stub) -> None:
    assert finish(process("pre-tool", "--server", stub.url)) == (0, "", "")
    stub.reply = answer(200, {"exit": 2, "stderr": VERDICT})
    assert finish(process("post-tool", "--server", stub.url)) == (2, "", VERDICT)
    assert [r["body"] for r in stub.requests] == [HOOK_INPUT, HOOK_INPUT]


def test_a_real_process_blocks_when_nothing_answers() -> None:
    code, out, err = finish(process("pre-tool", "--server", "https://127.0.0.1:9"))
    assert (code, out) == (2, "") and err.startswith("error: ") and err.count("\n") == 1


def test_the_token_is_sent_and_never_in_argv(stub: Stub) -> None:
    """While the server holds the request, the client's command line as every user sees
    it (``/proc/PID/cmdline``, what ``ps`` prints) does not hold the token."""
    proc = process("pre-tool", "--server", stub.url)
    stub.pid = proc.pid
    assert finish(proc)[0] == 0
    (argv,) = stub.argv_seen
    assert b"commands.hook_client" in argv and TOKEN.encode() not in argv
    assert stub.requests[0]["headers"]["authorization"] == f"Bearer {TOKEN}"


def test_stdin_over_the_default_cap_blocks_without_sending(stub: Stub) -> None:
    big = b'{"tool_input": "' + b"x" * (16 * 1024 * 1024) + b'"}'
    code, out, err = finish(process("pre-tool", "--server", stub.url), big)
    assert (code, out) == (2, "") and "larger than the 16 MiB cap" in err
    assert stub.requests == []


# -- the `evidence hook --server` spelling ---------------------------------------------------


def test_evidence_hook_server_relays_through_the_same_client(stub: Stub) -> None:
    env = {"EVIDENCE_CREDENTIAL": TOKEN}
    stub.reply = answer(200, {"exit": 2, "stderr": VERDICT})
    result = run_cli(
        "hook", "pre-tool", "--server", stub.url, "--unknown-tools", "record",
        input=HOOK_INPUT, env=env,
    )  # fmt: skip
    assert (result.returncode, result.stdout, result.stderr) == (2, "", VERDICT)
    assert stub.requests[0]["path"] == "/v1/hooks/pre-tool?unknown_tools=record"
    assert stub.requests[0]["body"] == HOOK_INPUT
    stub.reply = answer(503, {}, {"Retry-After": "2"})
    result = run_cli("hook", "post-tool", "--server", stub.url, input=HOOK_INPUT, env=env)
    assert result.returncode == 2 and result.stderr.startswith("error: ")
    assert "overloaded" in result.stderr and result.stderr.count("\n") == 1


def test_evidence_hook_server_takes_no_plan_and_needs_one_without(stub: Stub) -> None:
    result = run_cli("hook", "pre-tool", "--server", stub.url, "--plan", "P-1", input=HOOK_INPUT)
    assert result.returncode == 2 and "no --plan" in result.stderr
    result = run_cli("hook", "pre-tool", input=HOOK_INPUT)
    assert result.returncode == 2 and "--plan" in result.stderr
    assert stub.requests == []


# -- against the real service ----------------------------------------------------------------

SEARCH = {
    "name": "search",
    "input_schema": {
        "type": "object",
        "required": ["query"],
        "properties": {"query": {"type": "string"}},
    },
    "output_schema": {
        "type": "object",
        "required": ["hits"],
        "properties": {"hits": {"type": "array", "items": {"type": "string"}}},
    },
}


def _call(kind: str, use_id: str, query: Any, response: Any = None) -> bytes:
    doc: dict[str, Any] = {
        "session_id": "s-1",
        "hook_event_name": "PreToolUse" if kind == "pre-tool" else "PostToolUse",
        "tool_name": "search",
        "tool_input": {"query": query},
        "tool_use_id": use_id,
    }
    if kind == "post-tool":
        doc["tool_response"] = response
    return json.dumps(doc).encode()


@pytest.mark.slow  # a real `evidence serve` (uvicorn) in a subprocess
def test_against_a_real_evidence_serve(tmp_path: Path, socket_dir: Path) -> None:
    """The thin hook against ``evidence serve`` on a real ledger: a pass, a deviation
    blocked with the in-process hook's words, a recorded call, a replayed one refused,
    a bad credential refused; and the plan's stream holds what the hooks recorded."""
    import signal

    import ledger
    from commands.plane import Plane
    from commands.plane.phases import enter_execute, record_strategy
    from commands.plane.plans import create_plan
    from commands.plane.registry import register_tool

    url = f"sqlite:///{tmp_path / 'evidence.db'}"
    with Plane.open(url) as plane:
        register_tool(plane, SEARCH)
        create_plan(plane, "P-1", project="api", resources=["repo:api"])
        record_strategy(plane, "P-1", "search the code")
        enter_execute(plane, "P-1")
    issued = run_cli("credential", "issue", "--plan", "P-1", "--json", "--db", url)
    assert issued.returncode == 0, issued.stderr
    token = json.loads(issued.stdout)["credential"]["token"]
    env = {k: v for k, v in os.environ.items() if k not in ("EVIDENCE_DB", *CLIENT_ENV)}
    path = socket_dir / "serve.sock"
    serve = subprocess.Popen(
        [sys.executable, "-m", "commands.cli", "serve", "--db", url, "--uds", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert serve.stdout is not None
        line = serve.stdout.readline()
        assert line == f"listening on unix:{path}\n", line
        wait_ready(path)
        client = {"EVIDENCE_SERVER": f"unix:{path}", "EVIDENCE_CREDENTIAL": token}

        def thin(kind: str, stdin: bytes, **env: str) -> tuple[int, str, str]:
            return finish(process(kind, env={**client, **env}), stdin)

        assert thin("pre-tool", _call("pre-tool", "toolu_01", "x")) == (0, "", "")
        code, out, err = thin("pre-tool", _call("pre-tool", "toolu_02", 1))
        in_process = run_cli(
            "hook", "pre-tool", "--plan", "P-1", "--db", url,
            input=_call("pre-tool", "toolu_03", 1),
        )  # fmt: skip
        assert (code, out) == (2, "") and in_process.returncode == 2
        # the same words through either door (the routing line counts the iterations left)
        assert err.splitlines()[:2] == in_process.stderr.splitlines()[:2]
        assert err.startswith("blocked: the input gate failed for tool 'search' in plan P-1")
        post = _call("post-tool", "toolu_01", "x", {"hits": ["a.py"]})
        assert thin("post-tool", post) == (0, "", "")
        code, _, err = thin("post-tool", post)
        assert code == 2 and err.startswith("error: ") and "HTTP 409" in err
        code, _, err = thin(
            "pre-tool", _call("pre-tool", "toolu_04", "x"), EVIDENCE_CREDENTIAL="evd_x"
        )
        assert code == 2 and "refused the credential (HTTP 401" in err
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0
        if serve.stdout is not None:
            serve.stdout.close()
    store = ledger.open(url)
    try:
        recorded = [
            (e.type, getattr(e.payload, "step", None)) for e in store.read_stream("plan:P-1")
        ]
    finally:
        store.close()
    assert ("tool.called", "toolu_01") in recorded
    assert [s for t, s in recorded if t == "gate.checked"][:3] == [
        "toolu_01",
        "toolu_02",
        "toolu_03",
    ]


# -- every way out blocks ----------------------------------------------------------------

_ENDINGS = ["SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGALRM"]


def _signalled_while_waiting(stub: Stub, argv: list[str], name: str) -> tuple[int, str, str]:
    """``argv`` (a real process) holding its hook request at the stub, sent ``name``."""
    import signal

    arrived = threading.Event()

    def hold(handler: BaseHTTPRequestHandler) -> None:
        arrived.set()
        stub.release.wait(60)

    stub.reply = hold
    full = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV}
    full.update({"EVIDENCE_CREDENTIAL": TOKEN, "PYTHONPATH": str(ROOT)})
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full
    )
    assert proc.stdin is not None
    proc.stdin.write(HOOK_INPUT)
    proc.stdin.close()
    assert arrived.wait(30), "the request never arrived"
    proc.send_signal(getattr(signal, name))
    proc.stdin = None  # written and closed above
    out, err = proc.communicate(timeout=30)
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("name", _ENDINGS)
def test_a_signal_while_waiting_blocks_the_call(stub: Stub, name: str) -> None:
    """An agent CLI lets a call through on every exit but 2: a hook ended by a signal
    (the agent CLI's own SIGINT, a SIGTERM at shutdown, a hangup) blocks with 2."""
    argv = [sys.executable, "-m", "commands.hook_client", "pre-tool", "--server", stub.url]
    line = blocked(_signalled_while_waiting(stub, argv, name), f"ended by {name}")
    assert "the call is blocked" in line


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_evidence_hook_relaying_blocks_on_a_signal_too(stub: Stub, name: str) -> None:
    """`evidence hook --server`, the same client inside the full CLI."""
    argv = [sys.executable, "-m", "commands.cli", "hook", "pre-tool", "--server", stub.url]
    blocked(_signalled_while_waiting(stub, argv, name), f"ended by {name}")
