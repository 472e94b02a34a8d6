"""People on other machines, as the kernel sees them (issue 47's "Done when"): the
service runs as root with its database and keys in directories only root reads; an
operator and three approvers run the real `evidence` CLI as `nobody`, each with a key
only they hold, and reach the ledger through the service's unix socket only.

The operator registers a tool, attaches a validation and issues the agent's credential;
the agent validates with that credential and its plan escalates, needing two of the
three approvers; two of them decide it. Then, as root: the events are signed by the
people who sent them, no private key of theirs is anywhere in the database, and the
audit (with the plane key) is clean.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

import ledger
from commands.plane import Plane
from commands.plane.lifecycle import add_approver_key
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from ledger.keys import generate_key_pair, load_private_key
from tests.conformance import harness
from tests.helpers import STATUS_CHECK, run_cli

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the service runs as root, the people as nobody"),
]

PYTHON = "/usr/bin/python3"  # nobody cannot run an interpreter under /root (pyenv's)
NOBODY = {"user": "nobody", "group": "nogroup", "extra_groups": []}
# The CLI from this checkout's environment, on an interpreter nobody can run (the same
# minor version: the compiled wheels load).
ENTRY = (
    "import site, sys; site.addsitedir(sys.argv.pop(1)); "
    "from commands.cli.main import main; sys.argv[0] = 'evidence'; main()"
)
SITE = sysconfig.get_paths()["purelib"]


def _as_nobody(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-I", "-c", ENTRY, SITE, *args],
        **NOBODY,  # type: ignore[arg-type]
        env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
        cwd=home,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _nobody_can_run_the_cli(home: Path) -> str | None:
    """Why `nobody` cannot run this checkout's CLI here (None: it can)."""
    if not Path(PYTHON).exists():
        return f"no {PYTHON}"
    probe = _as_nobody(home, "--version")
    if probe.returncode != 0:
        return f"nobody cannot import this checkout ({probe.stderr.strip()[-200:]})"
    return None


@pytest.fixture
def places() -> Iterator[dict[str, Path]]:
    """The service's directories (root's, 0700), the socket's (root's, 0755, under
    /run: no one else could put a socket there), and each person's home (nobody's)."""
    top = Path(tempfile.mkdtemp(prefix="evidence-people-", dir="/tmp"))
    run = Path(tempfile.mkdtemp(prefix="evidence-people-", dir="/run"))
    try:
        top.chmod(0o755)
        run.chmod(0o755)
        found = {"run": run}
        for name, mode in (("keys", 0o700), ("data", 0o700), ("people", 0o755)):
            found[name] = top / name
            found[name].mkdir(mode=mode)
        yield found
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(run, ignore_errors=True)


def _home(places: dict[str, Path], name: str) -> Path:
    """A person's home with their key pair, theirs alone (0700, owned by nobody)."""
    home = places["people"] / name
    home.mkdir(mode=0o700)
    generate_key_pair(home / f"{name}.key")
    for path in (home, home / f"{name}.key", home / f"{name}.key.pub"):
        shutil.chown(path, "nobody", "nogroup")
    return home


def test_an_operator_and_approvers_as_another_user_act_through_the_service(
    places: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    keys, data = places["keys"], places["data"]
    env = {
        "EVIDENCE_PLANE_KEY": str(keys / "plane.key"),
        "EVIDENCE_OPERATOR_KEY": str(keys / "operator.key"),
        "EVIDENCE_STATE_DIR": str(data / "state"),
    }
    url = f"sqlite:///{data / 'evidence.db'}"
    people = {name: _home(places, name) for name in ("alice", "bob", "carol", "dave")}
    why = _nobody_can_run_the_cli(people["alice"])
    if why is not None:
        pytest.skip(why)
    project = data / "proj"
    project.mkdir()
    (project / "status.txt").write_text("bad\n")
    (data / "check.py").write_text(STATUS_CHECK)
    check = {
        "name": "status",
        "mode": "required",
        "command": [sys.executable, str(data / "check.py")],
    }
    (people["alice"] / "status.json").write_text(json.dumps(check))
    (people["alice"] / "calc.json").write_text(json.dumps({"name": "calc", "command": ["true"]}))
    for name, value in env.items():  # the service's host
        monkeypatch.setenv(name, value)
    with Plane.open(url) as plane:  # the host's operator (the first) adds the people
        for name in ("bob", "carol", "dave"):
            add_approver_key(plane, name, people[name] / f"{name}.key.pub")
        add_approver_key(plane, "alice", people["alice"] / "alice.key.pub", role="operator")
        config = {"retry_limit": 0, "max_strategy_revisions": 0, "approvals_required": 2}
        create_plan(plane, "P-1", project="api", resources=[str(project)], config=config)
    sock = places["run"] / "serve.sock"
    serve = [sys.executable, "-m", "commands.cli", "serve", "--db", url, "--uds", str(sock)]
    full = {k: v for k, v in os.environ.items() if k != "EVIDENCE_DB"} | env
    with harness.serving(serve, stderr=data / "serve.log", env=full) as server:
        alice = people["alice"]
        remote = ("--server", server, "--operator-key", str(alice / "alice.key"))
        for args in (
            ("validation", "register", "status.json"),
            ("tool", "register", "calc.json"),
            ("attach", "status", "--resource", str(project)),
        ):
            done = _as_nobody(alice, *args, *remote)
            assert done.returncode == 0, (args, done.stderr)
        issued = _as_nobody(alice, "credential", "issue", "--plan", "P-1", "--json", *remote)
        assert issued.returncode == 0, issued.stderr
        token = json.loads(issued.stdout)["credential"]["token"]
        # The operator's machine holds no ledger and no plane key, and cannot read them.
        denied = _as_nobody(alice, "events", "--db", url)
        assert denied.returncode == 2 and "ermission denied" in denied.stderr, denied.stderr
        with Plane.open(url) as plane:  # the plan goes on as the agent's would
            record_strategy(plane, "P-1", "make the status good")
            enter_execute(plane, "P-1")
        agent = httpx2.Client(
            transport=httpx2.HTTPTransport(uds=server.removeprefix("unix:")),
            base_url="http://localhost",
            timeout=60,
        )
        escalated = agent.post("/v1/validate", headers={"Authorization": f"Bearer {token}"})
        assert escalated.json()["validation"]["outcome"] == "escalate", escalated.text
        listed = _as_nobody(people["bob"], "authorize", "--server", server, "--key", "bob.key",
                            "--json")  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        [pending] = json.loads(listed.stdout)["decisions"]
        assert pending["approvals_required"] == 2
        for name in ("bob", "carol"):
            decided = _as_nobody(
                people[name], "authorize", pending["decision_id"], "--server", server,
                "--key", f"{name}.key", "--revise", "write good", "--json",
            )  # fmt: skip
            assert decided.returncode == 0, decided.stderr
        assert json.loads(decided.stdout)["stands"] is True
    with ledger.open(url, create=False) as store:
        events = list(store.read_all())
    signers = {
        e.stream: e.payload.signed.operator
        for e in events
        if e.stream in ("tool:calc", "tool:status")
        or e.stream.startswith(("attachment:", "credential:"))
    }
    assert set(signers.values()) == {"alice"} and len(signers) == 4
    decisions = [e.payload.approver for e in events if e.type == "plan.decision_recorded"]
    assert decisions == ["bob", "carol"]
    # Every byte the database holds (its file and its write-ahead log): no private key.
    everything = b"".join(p.read_bytes() for p in data.glob("evidence.db*"))
    for name, home in people.items():
        secret = load_private_key(home / f"{name}.key").private_bytes_raw()
        for form in (secret, secret.hex().encode(), base64.b64encode(secret)):
            assert form not in everything, name
    audit = run_cli("audit", "--db", url)
    assert audit.returncode == 0, audit.stdout + audit.stderr
