"""The client knows its server before it sends a secret (docs/service.md, "Who answers").

The attack: another local user binds the service's address first — a free TCP port after
a restart, or a socket path in a directory others may write — answers ``{"exit": 0}``
to every hook and keeps the bearer credentials it receives. Here the squatter is a real
process running as ``nobody`` (when the tests run as root; as this user otherwise), and
each case checks both halves: the hook blocks (exit 2, one line) and the squatter got no
byte of a request, so no credential.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.commands.test_hook_client import (
    HOOK_INPUT,
    TOKEN,
    _self_signed,
    blocked,
    clean_env,  # noqa: F401  (autouse: the client's environment)
    hook,
)
from tests.helpers import assert_refused, run_cli

AS_ROOT = os.geteuid() == 0
PYTHON = "/usr/bin/python3" if AS_ROOT else sys.executable  # one every user may run

# A squatter: listens where it is told (a TCP port, a unix socket path, or a socket
# another process bound, passed as a file descriptor), optionally with TLS under a
# certificate of its own, and answers any request with "let the call go on". It reports,
# as one JSON line once its stdin closes, whether anyone connected and every byte it got.
SQUATTER = r"""
import json, os, select, socket, ssl, sys, tempfile
spec = json.loads(sys.stdin.readline())
if spec["at"] == "tcp":
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
elif spec["at"] == "unix":
    path = spec["path"] or os.path.join(tempfile.mkdtemp(), "serve.sock")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    os.chmod(path, 0o666)
else:
    sock = socket.socket(fileno=spec["fd"])
sock.listen(8)
name = sock.getsockname()
print(json.dumps({"port": name[1]} if spec["at"] == "tcp" else {"path": name}), flush=True)
seen = {"connected": False, "received": ""}
ready, _, _ = select.select([sock, sys.stdin], [], [], 60)
if sock in ready:
    conn, _ = sock.accept()
    seen["connected"] = True
    conn.settimeout(5)
    try:
        if spec.get("cert"):
            files = []
            for pem in (spec["cert"], spec["key"]):
                fd, name = tempfile.mkstemp()
                os.write(fd, pem.encode())
                os.close(fd)
                files.append(name)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*files)
            conn = context.wrap_socket(conn, server_side=True)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        seen["received"] = data.decode("latin-1")
        if data:
            body = b'{"exit": 0, "stderr": ""}'
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    except (OSError, ssl.SSLError):
        pass
sys.stdin.read()
print(json.dumps(seen), flush=True)
"""


class Squatter:
    """The squatter process, as ``nobody`` when the tests run as root."""

    def __init__(self, at: str, *, path: str = "", fd: int = -1, tls: Path | None = None):
        spec: dict[str, Any] = {"at": at, "path": path, "fd": fd}
        if tls is not None:
            spec.update(cert=(tls / "cert.pem").read_text(), key=(tls / "key.pem").read_text())
        user = {"user": 65534, "group": 65534, "extra_groups": []} if AS_ROOT else {}
        self.proc = subprocess.Popen(
            [PYTHON, "-c", SQUATTER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            pass_fds=(fd,) if fd >= 0 else (),
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            **user,  # type: ignore[arg-type]
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()
        self.where: dict[str, Any] = json.loads(self.proc.stdout.readline())

    def seen(self) -> dict[str, Any]:
        """What it got: whether anyone connected, and the bytes it read."""
        out, _ = self.proc.communicate(timeout=30)
        return json.loads(out)


def refused_unseen(squatter: Squatter, result: tuple[int, str, str], *fragments: str) -> None:
    """The hook blocked, and the squatter never read a byte of the request."""
    line = blocked(result, *fragments)
    seen = squatter.seen()
    assert seen["received"] == "", (line, seen)
    assert TOKEN not in json.dumps(seen)


@pytest.fixture
def reachable(socket_dir: Path) -> Iterator[Path]:
    """A directory only this user may write, which the squatter may pass through: as
    root one under a root-owned system directory (root's home is closed to others)."""
    if not AS_ROOT:
        socket_dir.chmod(0o711)
        yield socket_dir
        return
    from commands.hook_client import resolve, untrusted

    for base in ("/run", "/srv", "/opt", "/var/lib"):
        real, directories = resolve(base)
        if os.access(real, os.W_OK) and untrusted([*directories, real], 0) is None:
            break
    else:
        pytest.fail("no root-owned directory others may pass through to make one in")
    directory = Path(tempfile.mkdtemp(prefix="evidence-test-", dir=real))
    directory.chmod(0o711)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- TCP: only https, to the certificate the client trusts ----------------------------------


def test_plain_http_sends_nothing_to_whoever_holds_the_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    squatter = Squatter("tcp")
    url = f"http://127.0.0.1:{squatter.where['port']}"
    refused_unseen(squatter, hook(monkeypatch, "pre-tool", "--server", url), "plain http://")


def test_https_to_a_squatters_certificate_sends_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The squatter speaks TLS with a certificate of its own for 127.0.0.1: neither the
    system's authorities nor the pinned one (the real service's) vouch for it."""
    service = tmp_path / "service"
    service.mkdir()
    monkeypatch.setenv("EVIDENCE_SERVER_CA", str(_self_signed(service)))
    own = tmp_path / "squatter"
    own.mkdir()
    _self_signed(own)
    for pinned in (True, False):
        if not pinned:
            monkeypatch.delenv("EVIDENCE_SERVER_CA")
        squatter = Squatter("tcp", tls=own)
        url = f"https://127.0.0.1:{squatter.where['port']}"
        refused_unseen(
            squatter, hook(monkeypatch, "pre-tool", "--server", url), "TLS handshake failed"
        )


def test_a_real_service_over_https_with_its_certificate_pinned(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`evidence serve --tls-cert/--tls-key`, reached by the hook with the certificate
    pinned: the service answers (here: the credential is not one of its own)."""
    url = f"sqlite:///{tmp_path / 'evidence.db'}"
    assert run_cli("init", "--db", url).returncode == 0
    cert = _self_signed(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "EVIDENCE_DB"}
    serve = subprocess.Popen(
        [sys.executable, "-m", "commands.cli", "serve", "--db", url, "--port", "0",
         "--tls-cert", str(cert), "--tls-key", str(tmp_path / "key.pem")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    try:
        assert serve.stdout is not None
        line = serve.stdout.readline()
        assert line.startswith("listening on https://127.0.0.1:"), line
        base = line.split(" ", 2)[2].strip()
        context = ssl.create_default_context(cafile=str(cert))
        for _ in range(600):
            try:
                with urllib.request.urlopen(base + "/readyz", timeout=5, context=context):
                    break
            except OSError:
                import time

                time.sleep(0.05)
        blocked(hook(monkeypatch, "pre-tool", "--server", base), "TLS handshake failed")
        monkeypatch.setenv("EVIDENCE_SERVER_CA", str(cert))
        blocked(
            hook(monkeypatch, "pre-tool", "--server", base),
            f"the evidence service at {base} refused the credential (HTTP 401",
        )
    finally:
        serve.terminate()
        assert serve.wait(timeout=60) == 0
        assert serve.stdout is not None
        serve.stdout.close()


# -- unix sockets: only one its owner could have put there, served by its owner --------------


def test_a_socket_in_a_directory_everyone_may_write_sends_nothing(
    monkeypatch: pytest.MonkeyPatch, reachable: Path
) -> None:
    """A careless operator's directory (mode 0777), and a squatter's own directory made
    in /tmp before the service's: either way another user's socket, refused unread."""
    careless = reachable / "run"
    careless.mkdir()
    careless.chmod(0o777)
    squatter = Squatter("unix", path=str(careless / "serve.sock"))
    refused_unseen(
        squatter,
        hook(monkeypatch, "pre-tool", "--server", f"unix:{careless}/serve.sock"),
        "is not trusted",
        f"{careless} is writable by everyone (mode 777)",
        "nothing was sent",
    )
    squatter = Squatter("unix")  # its own directory under /tmp
    refused_unseen(
        squatter,
        hook(monkeypatch, "pre-tool", "--server", f"unix:{squatter.where['path']}"),
        "/tmp is writable by everyone (mode 1777)",
    )


@pytest.mark.skipif(not AS_ROOT, reason="a listener of another user needs root to start")
def test_a_socket_whose_listener_is_another_user_sends_nothing(
    monkeypatch: pytest.MonkeyPatch, socket_dir: Path
) -> None:
    """The path is root's, in root's directory, but the process that listens on it runs
    as nobody (root bound it, nobody listens): the kernel's word (SO_PEERCRED) names
    the listener, and the client sends nothing to it."""
    bound = socket.socket(socket.AF_UNIX)
    bound.bind(str(socket_dir / "serve.sock"))
    try:
        squatter = Squatter("fd", fd=bound.fileno())
    finally:
        bound.close()
    refused_unseen(
        squatter,
        hook(monkeypatch, "pre-tool", "--server", f"unix:{socket_dir}/serve.sock"),
        "the process listening runs as uid 65534, not as the socket's owner (uid 0)",
    )


def test_a_link_another_user_could_repoint_is_not_followed_on_trust(
    monkeypatch: pytest.MonkeyPatch, reachable: Path
) -> None:
    """The configured path goes through a symbolic link in a directory everyone may
    write: whoever replaces the link chooses the socket, so the path is refused even
    while the link points at a socket of the right owner."""
    careless = reachable / "links"
    careless.mkdir()
    careless.chmod(0o777)
    owner_dir = reachable / "owned"
    owner_dir.mkdir()
    with socket.socket(socket.AF_UNIX) as real:
        real.bind(str(owner_dir / "serve.sock"))
        real.listen()
        (careless / "plane").symlink_to(owner_dir)
        line = blocked(
            hook(
                monkeypatch,
                "pre-tool",
                "--server",
                f"unix:{careless}/plane/serve.sock",
                "--timeout",
                "3",
            ),
            f"{careless} is writable by everyone",
        )
    assert "nothing was sent" in line


def test_resolve_names_each_directory_a_lookup_reads(tmp_path: Path) -> None:
    from commands.hook_client import resolve

    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "s").touch()
    (tmp_path / "l").symlink_to("a/b")
    (tmp_path / "a" / "up").symlink_to("../a")
    real, directories = resolve(f"{tmp_path}/l/../b/./s")
    assert real == f"{tmp_path}/a/b/s"
    assert directories[-3:] == [str(tmp_path), f"{tmp_path}/a", f"{tmp_path}/a/b"]
    real, _ = resolve(f"{tmp_path}/a/up/up/up/b/s")
    assert real == f"{tmp_path}/a/b/s"
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(OSError, match="too many symbolic links"):
        resolve(f"{tmp_path}/loop/x")


# -- the service places its socket only where no one else could ---------------------------


def test_serve_refuses_a_socket_another_user_could_take(
    reachable: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    def started(*_args: object, **_kw: object) -> None:  # a refusal never gets this far
        raise AssertionError("the service started")

    monkeypatch.setattr(uvicorn.Server, "run", started)
    url = f"sqlite:///{tmp_path / 'evidence.db'}"
    assert run_cli("init", "--db", url).returncode == 0
    careless = reachable / "run"
    careless.mkdir()
    careless.chmod(0o777)
    assert_refused(
        run_cli("serve", "--db", url, "--uds", str(careless / "serve.sock")),
        "is writable by everyone", "another user could put a socket of their own there",
    )  # fmt: skip
    assert_refused(
        run_cli("serve", "--db", url, "--uds", "/tmp/evidence-serve.sock"),
        "/tmp is writable by everyone",
    )
    if AS_ROOT:
        theirs = reachable / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
        assert_refused(
            run_cli("serve", "--db", url, "--uds", str(theirs / "serve.sock")),
            f"{theirs} belongs to uid 65534",
        )
    (reachable / "file").touch()
    assert_refused(run_cli("serve", "--db", url, "--uds", str(reachable / "file")), "not a socket")
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(str(reachable / "live.sock"))
        live.listen()
        assert_refused(
            run_cli("serve", "--db", url, "--uds", str(reachable / "live.sock")),
            "a service is listening there",
        )
    assert_refused(
        run_cli("serve", "--db", url, "--uds", str(reachable / "s.sock"), "--port", "9"),
        "without --host, --port or --tls-*",
    )
    assert_refused(run_cli("serve", "--db", url, "--tls-cert", "/nonexistent"), "go together")
    assert_refused(
        run_cli("serve", "--db", url, "--tls-cert", "/nonexistent", "--tls-key", "/nope"),
        "cannot load --tls-cert",
    )


def test_the_squatter_really_is_another_user() -> None:
    """The premise of the cases above, checked: the squatter runs as nobody."""
    if not AS_ROOT:
        pytest.skip("the tests run as this user: the squatter runs as it too")
    probe = subprocess.run(
        [PYTHON, "-c", "import os; print(os.getuid())"],
        user=65534, group=65534, extra_groups=[], capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert probe.stdout.strip() == str(pwd.getpwnam("nobody").pw_uid)
    assert HOOK_INPUT  # the hook input the cases send
