"""Small builders shared by the tests."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

import click
from click.testing import CliRunner, Result
from ulid import ULID

from commands.cli import main as cli_main
from commands.plane import Plane
from commands.plane.attachments import attach
from commands.plane.lifecycle import add_approver_key, apply_plan, authorize, record_fix
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_validation
from commands.plane.validation_runs import validate_plan
from ledger import NewEvent, Store, StreamAppend
from ledger import open as open_ledger
from ledger.events import EventPayload, PlanCreated, PlanHalted, StrategyRecorded
from ledger.keys import generate_key_pair
from projections.documents import delta, fold, fold_all

# Where the tests live (their servers, fixtures and vectors), and the checkout they test.
TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def plan_created(plan_id: str = "P-1", **kw: object) -> NewEvent:
    return NewEvent(
        payload=PlanCreated(plan_id=plan_id, project="proj", resources=["repo:api"]), **kw
    )


def strategy(plan_id: str = "P-1", text: str = "fix the tests", revision: int = 0) -> NewEvent:
    return NewEvent(payload=StrategyRecorded(plan_id=plan_id, revision=revision, strategy=text))


def build_wheel(where: Path) -> Path:
    """The project's wheel, built under ``where`` from a copy of the tracked files (a
    build writes build/ and *.egg-info into the tree it builds: the checkout stays as
    it was)."""
    import shutil

    root = REPO
    source, dist = where / "source", where / "dist"
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, tracked):
        target = source / name.decode()
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name.decode(), target)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = dist.glob("evidence_ledger-*.whl")
    return wheel


def unix_get(path: Path, target: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """``GET target`` from an HTTP server on the unix socket ``path``: status and body."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(
            f"GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def wait_ready(path: Path, seconds: float = 30.0) -> None:
    """Until ``evidence serve --uds path`` answers ``/readyz`` with 200."""
    import time

    deadline = time.monotonic() + seconds
    while True:
        try:
            if unix_get(path, "/readyz")[0] == 200:
                return
        except (OSError, IndexError, ValueError):
            pass
        assert time.monotonic() < deadline, f"the service at {path} never became ready"
        time.sleep(0.05)


def run_cli(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    input: str | bytes | None = None,
) -> subprocess.CompletedProcess[str]:
    """``evidence ARGS`` through the real entry point, in this process (about 1 s of
    imports saved per call), shaped like a finished process: its exit status, stdout and
    stderr, an uncaught exception's traceback on stderr with status 1 as Python would
    print it. EVIDENCE_DB is unset unless ``env`` gives it; ``input`` is its stdin.
    Tests where the process boundary is the point (signals, crashes, concurrency) use
    ``run_cli_process``."""
    overrides: dict[str, str | None] = {"EVIDENCE_DB": None, **(env or {})}
    here = os.getcwd()
    with _CWD:
        if cwd is not None:
            os.chdir(cwd)
        try:
            result = CliRunner(env=overrides).invoke(_entry_point, list(args), input=input)
        finally:
            os.chdir(here)
    code, stderr = result.exit_code, result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        code = 1
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["evidence", *args], code, result.stdout, stderr)


_CWD = threading.Lock()  # the working directory is the process's: one call at a time


def run_cli_process(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real ``evidence`` command in a subprocess (EVIDENCE_DB unset unless given)."""
    full_env = {k: v for k, v in os.environ.items() if k != "EVIDENCE_DB"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "commands.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
        timeout=120,
    )


def assert_refused(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Exit 2, exactly one ``error: ...`` line naming the problem, no traceback."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


STATUS_CHECK = """
import json, sys
ok = open("status.txt").read().strip() == "good"
print(json.dumps({"passed": ok, "message": "status is good" if ok else "status is bad"}))
"""


def status_plan(plane: Plane, tmp_path: Path, config: dict, *, execute: bool = True) -> Path:
    """Plan P-1 in Execute on a project whose required validation passes only when
    status.txt says "good" (it says "bad"), with approver alice registered; the key
    pair is alice.key / alice.key.pub in ``tmp_path``. Returns the project directory.
    With ``execute=False`` it stays in Strategize, its strategy recorded."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "status.txt").write_text("bad\n")
    (tmp_path / "check.py").write_text(STATUS_CHECK)
    register_validation(
        plane,
        {
            "name": "status",
            "mode": "required",
            "command": [sys.executable, str(tmp_path / "check.py")],
        },
    )
    create_plan(plane, "P-1", project="api", resources=[str(project)], config=config)
    attach(plane, "status", resource=str(project))
    record_strategy(plane, "P-1", "make the status good")
    if execute:
        enter_execute(plane, "P-1")
    generate_key_pair(tmp_path / "alice.key")
    add_approver_key(plane, "alice", tmp_path / "alice.key.pub")
    return project


def applied_plan(plane: Plane, tmp_path: Path) -> Path:
    """``status_plan`` taken through a failure, an escalation, alice's signed revise
    decision, a fix, a passing run, its token and Apply. Returns the project directory."""
    project = status_plan(plane, tmp_path, {"retry_limit": 0, "max_strategy_revisions": 0})
    report = validate_plan(plane, "P-1")
    escalation = report.to_json()["escalation"]
    assert report.outcome == "escalate" and escalation is not None, report.to_json()
    authorize(
        plane,
        escalation["decision_id"],
        tmp_path / "alice.key",
        choice="revise",
        guidance="write good",
    )
    record_strategy(plane, "P-1", "write good")
    enter_execute(plane, "P-1")
    (work(plane) / "status.txt").write_text("good\n")
    record_fix(plane, "P-1", "status is good now")
    report = validate_plan(plane, "P-1")
    assert report.outcome == "pass" and report.token
    apply_plan(plane, "P-1", report.token)
    return project


def forge(
    store: Store,
    stream: str,
    *payloads: EventPayload,
    blobs: tuple[bytes, ...] = (),
    caused_by_first: bool = False,
    actor: str = "agent",
) -> list[int]:
    """Append around the plane, as an agent holding the database file can through the
    public ``Store`` API: well-formed events with correct deltas (so only the rules, not
    the hashes or deltas, give them away). Returns their positions."""
    doc = fold_all(stream, [e.payload for e in store.read_stream(stream)])
    events: list[NewEvent] = []
    first = None
    for payload in payloads:
        after = fold(stream, doc, payload)
        event_id = str(ULID())
        first = first or event_id
        events.append(
            NewEvent(
                payload=payload,
                actor=actor,
                delta=delta(doc, after),
                event_id=event_id,
                causation_id=first if caused_by_first and event_id != first else None,
            )
        )
        doc = after
    return store.append(stream, events, blobs=blobs)


@click.command(
    context_settings={
        "ignore_unknown_options": True,
        "allow_extra_args": True,
        "help_option_names": [],
    }
)
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def _entry_point(argv: tuple[str, ...]) -> None:
    cli_main(list(argv))


def invoke(*args: str) -> Result:
    """``evidence ARGS`` in-process through the real entry point (its error handling and
    exit codes included), with stdout and stderr captured apart."""
    return CliRunner().invoke(_entry_point, list(args))


def work(plane: Plane, plan_id: str = "P-1") -> Path:
    """Where the agent works on the plan's (first directory) resource until Apply: the
    plan's sandbox copy of it."""
    doc = plane.state(f"plan:{plan_id}").doc
    copies = plane.sandbox(doc).ensure().copies
    return next(copies[r] for r in doc.resources if r in copies)


def register_mcp_server(url: str, server: str, command: list[str]) -> list[str]:
    """As an operator registers an MCP server the plane launches itself: every tool the
    server lists (asked over stdio with the SDK's client), named ``SERVER.TOOL`` as the
    proxy names them, with the schemas the server declares and ``mcp_command``; a tool
    the registry refuses (a control character in its name, a schema reaching outside
    itself) is left out, as the proxy leaves it. Returns the registered names."""
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    from commands.plane.registry import register_tool
    from ledger import LedgerError

    async def listed() -> list[Any]:
        params = StdioServerParameters(command=command[0], args=command[1:])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            return list((await client.list_tools()).tools)

    names = []
    with Plane.open(url) as plane:
        for tool in anyio.run(listed):
            name = f"{server}.{tool.name}"
            try:
                register_tool(
                    plane,
                    {
                        "name": name,
                        "mcp_server": server,
                        "mcp_tool_name": tool.name,
                        "mcp_command": command,
                        **({"description": tool.description} if tool.description else {}),
                        "input_schema": tool.input_schema,
                        # as the server declares it: the plane compares before each call
                        **({"output_schema": tool.output_schema} if tool.output_schema else {}),
                    },
                )
            except LedgerError:
                continue
            names.append(name)
    return names


def forge_credential(store: Store, plan_id: str) -> str:
    """An agent credential's issuance appended past the plane, as an agent holding the
    database file but no operator key can: no operator's signature. Returns the token it
    would make."""
    import hashlib

    from ledger.events import CredentialIssued

    secret = "s" * 43
    forged = CredentialIssued(
        credential_id="01J00000000000000000000000",
        plan_id=plan_id,
        secret_sha256=hashlib.sha256(secret.encode()).hexdigest(),
        expires_at="2099-01-01T00:00:00.000000Z",
    )
    forge(store, f"credential:{forged.credential_id}", forged)
    return f"evd_{forged.credential_id}_{secret}"


def forged_halt(plan_id: str = "P-1") -> PlanHalted:
    """An escalating halt in Execute on a decision nobody asked for: a transition the
    plane never writes (the agent's forgery the plane must refuse and audit report)."""
    return PlanHalted(
        plan_id=plan_id,
        halt_type="escalate",
        final_decision="escalate",
        raw_halt_type="needs_decision",
        reason="no decision made",
        phase="execute",
        attempt=1,
    )


def append_plans(
    where: Store | str,
    first: int,
    count: int,
    *,
    resource: str = "r",
    large_at: int | None = None,
) -> None:
    """``count`` events appended past the plane, a plan's creation each (plans T-first
    onwards, each in its own stream), a thousand to an append: a log of a given size for
    the tree's tests (tiles, witnesses, proofs). The one at ``large_at`` is over a tile
    entry's 65,535 bytes. ``where``: a store, or the URL of one to open."""
    if isinstance(where, str):
        with open_ledger(where) as store:
            append_plans(store, first, count, resource=resource, large_at=large_at)
        return
    for start in range(first, first + count, 1_000):
        appends = []
        for i in range(start, min(start + 1_000, first + count)):
            created = PlanCreated(
                plan_id=f"T-{i}",
                project="p",
                resources=[resource * (70_000 if i == large_at else 1)],
            )
            appends.append(StreamAppend(f"plan:T-{i}", [NewEvent(payload=created)]))
        where.append_batch(appends)
