"""docs/service.md's deployment runs as written (issue: "Deployment docs that run").

The page's "Setting it up" and "Running the service" blocks are extracted and run by
bash as root on this machine — real system users (`evidence`, `agent`), the package in
/opt/evidence, the settings in /etc/evidence/env, the socket in /run/evidence — each
command exactly as the page has it, but one: the install names the wheel built from
this checkout instead of the package index's `evidence-ledger` (the same wheel, and
the same install line otherwise). Then the agent's user drives its plan through the
service with `evidence-hook`, and what the page's table says of file modes, and what
the agent cannot read, is checked.

It changes the machine, so it runs only as root and where it is asked to: under
`CI=true` or with `EVIDENCE_TEST_DEPLOY=1`; it refuses to touch a machine where any of
its paths or users already exist without its marker, and removes all of it after.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import IN_CI
from tests.helpers import build_wheel, unix_get

pytestmark = pytest.mark.slow  # a wheel, a virtualenv with the package index, real users

PAGE = Path(__file__).resolve().parent.parent / "docs" / "service.md"
PATHS = ["/opt/evidence", "/var/lib/evidence", "/run/evidence", "/etc/evidence", "/srv/api"]
LINKS = ["/usr/local/bin/evidence", "/usr/local/bin/evidence-hook"]
USERS = ["agent", "evidence"]
MARKER = Path("/etc/evidence-test-deployment")  # this test made what is there
SOCKET = Path("/run/evidence/serve.sock")
INSTALL = "'evidence-ledger[postgres]'"
INIT = "# the ledger, the plane key and the first operator, as the service's user\n"


def block(heading: str, nth: int = 0) -> str:
    """The ``nth`` ```sh block after ``## heading`` in the page, as bash runs it."""
    text = PAGE.read_text(encoding="utf-8")
    after = text[text.index(f"## {heading}\n") :]
    found: list[str] = re.findall(r"```sh\n(.*?)```", after, re.DOTALL)
    return found[nth]


def setup(backend: str, wheel: Path) -> str:
    """The page's setup as it says to run it for ``backend``: PostgreSQL's block goes
    after the settings file, before `evidence init`."""
    script = block("Setting it up").replace(INSTALL, f"'/tmp/{wheel.name}[postgres]'")
    if backend == "postgresql":
        before, marker, rest = script.partition(INIT)
        assert marker, "the setup no longer says where the ledger is made"
        script = before + block("Setting it up", 1) + marker + rest
    return script


def _exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def _clean() -> None:
    subprocess.run(["pkill", "-u", "agent"], check=False)
    subprocess.run(["pkill", "-u", "evidence"], check=False)
    for user in USERS:
        if _exists(user):
            subprocess.run(["userdel", "--remove", user], capture_output=True, check=False)
    for path in PATHS:
        shutil.rmtree(path, ignore_errors=True)
    for link in LINKS:
        Path(link).unlink(missing_ok=True)
    MARKER.unlink(missing_ok=True)
    for drop in (["dropdb", "--if-exists", "evidence"], ["dropuser", "--if-exists", "evidence"]):
        subprocess.run(["sudo", "-u", "postgres", *drop], capture_output=True, check=False)


@pytest.fixture
def machine() -> Iterator[None]:
    if os.geteuid() != 0 or shutil.which("sudo") is None:
        if IN_CI:
            pytest.fail("the deployment docs run as root with sudo (.ci/run installs it)")
        pytest.skip("runs the deployment docs as root, with sudo")
    if not IN_CI and os.environ.get("EVIDENCE_TEST_DEPLOY") != "1":
        pytest.skip("changes this machine (users, /opt, /etc): set EVIDENCE_TEST_DEPLOY=1")
    taken = [p for p in PATHS + LINKS if os.path.lexists(p)] + [u for u in USERS if _exists(u)]
    if taken and not MARKER.exists():
        pytest.skip(f"not this test's to replace: {', '.join(taken)}")
    _clean()
    MARKER.touch()
    try:
        yield
    finally:
        _clean()


def _bash(script: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True, text=True, timeout=900, **kw,  # type: ignore[call-overload]
    )  # fmt: skip


def _as_agent(*argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sudo", "-u", "agent", "env", "EVIDENCE_SERVER=unix:/run/evidence/serve.sock",
         "EVIDENCE_CREDENTIAL_FILE=/home/agent/.config/evidence/credential", *argv],
        input=stdin, capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip


def _hook(tool: str, arguments: object, use_id: str) -> subprocess.CompletedProcess[str]:
    call = {"hook_event_name": "PreToolUse", "tool_name": tool, "tool_input": arguments,
            "tool_use_id": use_id}  # fmt: skip
    return _as_agent("evidence-hook", "pre-tool", stdin=json.dumps(call))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_deployment_docs_run_as_written(machine: None, tmp_path: Path, backend: str) -> None:
    wheel = build_wheel(tmp_path)
    shutil.copy(wheel, "/tmp")  # readable by sudo's pip wherever tmp_path is
    assert block("Setting it up").count(INSTALL) == 1
    done = _bash(setup(backend, wheel), cwd="/")
    assert done.returncode == 0, done.stdout + done.stderr
    settings = Path("/etc/evidence/env").read_text()
    assert ("postgresql+psycopg:///evidence" in settings) == (backend == "postgresql")
    serve = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", block("Running the service")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
        start_new_session=True,
    )  # fmt: skip
    try:
        assert serve.stdout is not None
        assert serve.stdout.readline() == f"listening on unix:{SOCKET}\n"
        for _ in range(600):
            if SOCKET.exists() and unix_get(SOCKET, "/readyz")[0] == 200:
                break
            time.sleep(0.05)
        # the agent's hooks, through the service: a well-formed Read goes on, a
        # malformed one is blocked with its pointer, a tool nobody registered too
        assert _hook("Read", {"file_path": "/srv/api/README"}, "u1").returncode == 0
        bad = _hook("Read", {"file_path": 5}, "u2")
        assert bad.returncode == 2 and "/file_path" in bad.stderr, bad.stderr
        # what the agent's user cannot reach: the keys, the ledger, another plan's word
        for path in ("/var/lib/evidence/keys/plane.key", "/var/lib/evidence/evidence.db"):
            assert _as_agent("cat", path).returncode != 0
        closed = _as_agent("evidence", "plan", "show", "P-17", "--db",
                           "sqlite:////var/lib/evidence/evidence.db")  # fmt: skip
        assert closed.returncode == 2, closed.stderr
        assert "permission denied" in closed.stderr
        assert "/var/lib/evidence/evidence.db" in closed.stderr
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        assert serve.wait(timeout=120) == 0, serve.stderr.read() if serve.stderr else ""
    # the table's modes, and the operator's view of the same plan (one state directory)
    table = {
        "/var/lib/evidence": 0o700, "/var/lib/evidence/keys": 0o700,
        "/var/lib/evidence/keys/plane.key": 0o600, "/var/lib/evidence/state": 0o700,
    }  # fmt: skip
    if backend == "sqlite":
        table["/var/lib/evidence/evidence.db"] = 0o600
    assert {p: os.stat(p).st_mode & 0o777 for p in table} == table
    operator = "sudo -u evidence env $(cat /etc/evidence/env) evidence"
    shown = _bash(f"{operator} plan history P-17 --json", cwd="/")
    assert shown.returncode == 0, shown.stderr
    steps = [e for e in json.loads(shown.stdout)["events"] if e["type"] == "gate.checked"]
    assert len(steps) == 2  # the two hooks' checks, recorded by the service
    assert _bash(f"{operator} verify", cwd="/").returncode == 0
