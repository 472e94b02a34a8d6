"""Run the official MCP conformance suite's server scenarios against a URL.

The suite is ``@modelcontextprotocol/conformance`` (pinned in tests/interop/package.json,
installed by ``npm ci --prefix tests/interop``), run by node with the Node 20 shim of
tests/interop/node20/ (the suite imports ``fs.globSync``, a Node 22 API). Nothing is
downloaded at test time.

    with fixture_http_server() as url:
        results = run_scenarios(url, workdir=tmp_path)   # scenario -> Result
        assert passing(results) == set(SCENARIOS)

A scenario passes when none of its checks is a ``FAILURE`` (the suite's own verdict:
its summary line and exit status count FAILUREs only). ``WARNING`` checks (SHOULDs) are
kept beside, in ``Result.warnings``: the suite's ``--expected-failures`` baseline mode
would count them too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INTEROP = ROOT / "tests" / "interop"
SUITE = INTEROP / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
NODE20_SHIM = INTEROP / "node20" / "register.mjs"
VERSION = "0.1.16"  # tests/interop/package.json pins exactly this
# The stateless revision's scenarios come with the suite's 0.2.0 alphas, installed beside
# the release under an alias (tests/interop/package.json): `--requirements 2026-07-28`
# runs exactly the scenarios that revision requires (and, unscored, its extensions').
REVISION_2026 = "2026-07-28"
SUITE_2026 = INTEROP / "node_modules" / "conformance-2026-07-28" / "dist" / "index.js"
VERSION_2026 = "0.2.0-alpha.12"

# The server scenarios of 0.1.16, in the suite's order (`... list`; checked by
# tests/commands/service/test_conformance.py). json-schema-2020-12 and server-sse-polling are in its
# "pending" suite, the other 30 in "active"; `--suite all` runs the 32.
SCENARIOS: tuple[str, ...] = (
    "server-initialize",
    "logging-set-level",
    "ping",
    "completion-complete",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-with-logging",
    "tools-call-error",
    "tools-call-with-progress",
    "tools-call-sampling",
    "tools-call-elicitation",
    "json-schema-2020-12",
    "elicitation-sep1034-defaults",
    "server-sse-polling",
    "server-sse-multiple-streams",
    "elicitation-sep1330-enums",
    "resources-list",
    "resources-read-text",
    "resources-read-binary",
    "resources-templates-read",
    "resources-subscribe",
    "resources-unsubscribe",
    "prompts-list",
    "prompts-get-simple",
    "prompts-get-with-args",
    "prompts-get-embedded-resource",
    "prompts-get-with-image",
    "dns-rebinding-protection",
)

SUITE_TIMEOUT_S = 180.0  # one suite process; the 32 take ~3 s against the fixture
START_TIMEOUT_S = 30.0  # the fixture server printing its URL
# A result directory: server-<scenario>-<ISO timestamp with : and . as ->.
_RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$")


@dataclass(frozen=True)
class Result:
    """One scenario's verdict, and the messages of its FAILURE and WARNING checks."""

    passed: bool
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def node_command(suite: Path = SUITE) -> list[str]:
    """The node command line the suite runs with (the CLI's arguments follow)."""
    node = shutil.which("node") or "node"
    return [node, "--import", NODE20_SHIM.as_uri(), str(suite)]


def conformance_available() -> str | None:
    """Why the suite cannot run here, or None when it can."""
    node = shutil.which("node")
    if node is None:
        return "node is not on PATH (the MCP conformance suite runs on node >= 20)"
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30)
    match = re.match(r"v(\d+)\.", version.stdout.strip())
    if match is None or int(match[1]) < 20:
        return f"the MCP conformance suite needs node >= 20, found {version.stdout.strip()!r}"
    for suite in (SUITE, SUITE_2026):
        if not suite.is_file():
            return (
                f"@modelcontextprotocol/conformance is not installed ({suite} is missing): "
                "run `npm ci --prefix tests/interop`"
            )
    if not NODE20_SHIM.is_file():
        return f"the Node 20 shim {NODE20_SHIM} is missing"
    return None


def list_server_scenarios() -> list[str]:
    """The server scenarios the installed suite lists (``conformance list``), in order."""
    out = subprocess.run(
        [*node_command(), "list"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    section = out.split("Server scenarios", 1)[1].split("Client scenarios", 1)[0]
    return re.findall(r"^\s+- (\S+)", section, flags=re.MULTILINE)


@contextlib.contextmanager
def fixture_http_server(*, stderr: Path | None = None) -> Iterator[str]:
    """Start tests/conformance/fixture_server.py over streamable HTTP (a real process, on
    a free port of 127.0.0.1) and yield its URL; the process is killed on exit."""
    argv = [sys.executable, "-m", "tests.conformance.fixture_server", "--http", "0"]
    with serving(argv, stderr=stderr) as url:
        yield url


@contextlib.contextmanager
def serving(
    argv: list[str], *, stderr: Path | None = None, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Start a process that prints its URL in its first line of stdout (the fixture, the
    bridge, `evidence serve`'s ``listening on URL``) and yield that URL; the process is
    stopped on exit."""
    with contextlib.ExitStack() as stack:
        if stderr is not None:
            stderr.parent.mkdir(parents=True, exist_ok=True)
        log = stack.enter_context(open(stderr, "ab")) if stderr is not None else None
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log if log is not None else subprocess.DEVNULL,
            env=env,
        )
        stack.callback(_stop, proc)
        yield _read_url(proc)


@contextlib.contextmanager
def service_door(
    db_url: str, server: str, token: str, *, stderr: Path | None = None
) -> Iterator[str]:
    """`evidence serve` on the ledger at ``db_url`` (a real uvicorn on a free port),
    reached through tests/conformance/bearer.py, which adds ``token`` to every request:
    yields the forwarder's URL of ``/mcp/SERVER``."""
    env = {k: v for k, v in os.environ.items() if k != "EVIDENCE_DB"}
    # The forwarder passes the suite's Host on (its own port): names an operator adds
    # for a proxy in front of the service.
    env["EVIDENCE_ALLOWED_HOSTS"] = "127.0.0.1:*,localhost:*"
    serve = [sys.executable, "-m", "commands.cli", "serve", "--db", db_url, "--port", "0"]
    with serving(serve, stderr=stderr, env=env) as base:
        _wait_ready(base)
        forward = [
            sys.executable, "-m", "tests.conformance.bearer",
            "--to", base.removeprefix("http://"), "--path", f"/mcp/{server}",
        ]  # fmt: skip
        with serving(forward, stderr=stderr, env={**env, "EVIDENCE_BEARER": token}) as url:
            yield url


def _wait_ready(base: str) -> None:
    import urllib.request

    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _read_url(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(START_TIMEOUT_S):
            raise RuntimeError(f"{proc.args!r} printed no URL in {START_TIMEOUT_S} s")
    line = proc.stdout.readline().decode().strip()
    url = line.removeprefix("listening on ")
    if not url.startswith(("http://", "unix:")):
        raise RuntimeError(f"{proc.args!r} did not start (exit {proc.poll()}): {line!r}")
    return url


def run_scenarios(
    url: str,
    scenarios: Iterable[str] | None = None,
    *,
    workdir: Path,
    timeout: float = SUITE_TIMEOUT_S,
) -> dict[str, Result]:
    """Run server scenarios (all 32 when None) against ``url``; scenario -> Result.

    All 32 run in one suite process (``--suite all``); a subset runs one process per
    scenario, concurrently. Each process is bounded by ``timeout`` seconds (the suite
    has no overall timeout of its own: its client's requests time out at 60 s); a
    scenario whose results were not written in time fails with that reason. The
    suite's output and results stay under ``workdir`` (results/…/checks.json, *.log).
    """
    wanted = list(SCENARIOS if scenarios is None else scenarios)
    unknown = sorted(set(wanted) - set(SCENARIOS))
    if unknown:
        raise ValueError(f"not server scenarios of the suite: {unknown}")
    workdir.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="conformance-", dir=workdir))
    results_dir = run_dir / "results"
    if set(wanted) == set(SCENARIOS):
        jobs = {"all": ["--suite", "all"]}
    else:
        jobs = {name: ["--scenario", name] for name in wanted}
    notes = _run_jobs(url, jobs, run_dir, results_dir, timeout, SUITE)
    found = _read_results(results_dir)
    results: dict[str, Result] = {}
    for name in wanted:
        if name in found:
            results[name] = found[name]
        else:
            note = notes.get(name) or notes.get("all") or "the suite wrote no checks.json"
            results[name] = Result(passed=False, failures=[f"no result: {note}"])
    return results


def run_requirements(
    url: str, *, workdir: Path, timeout: float = SUITE_TIMEOUT_S
) -> dict[str, Result]:
    """Every scenario revision 2026-07-28 requires, against ``url`` (the alpha suite's
    ``--requirements``: the list is the suite's); scenario -> Result. A run that wrote
    nothing raises, with the suite's log."""
    workdir.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="conformance-2026-", dir=workdir))
    results_dir = run_dir / "results"
    jobs = {"requirements": ["--requirements", REVISION_2026]}
    notes = _run_jobs(url, jobs, run_dir, results_dir, timeout, SUITE_2026)
    found = _read_results(results_dir)
    if not found:
        raise RuntimeError(notes.get("requirements") or f"no results (see {run_dir})")
    return found


def run_suite(
    url: str,
    scenarios: Iterable[str] | None = None,
    *,
    workdir: Path,
    timeout: float = SUITE_TIMEOUT_S,
) -> dict[str, bool]:
    """``run_scenarios`` reduced to scenario -> passed."""
    results = run_scenarios(url, scenarios, workdir=workdir, timeout=timeout)
    return {name: result.passed for name, result in results.items()}


def passing(results: dict[str, Result]) -> set[str]:
    """The pass set of a run (to compare two runs: the fixture directly, through a gate)."""
    return {name for name, result in results.items() if result.passed}


def _run_jobs(
    url: str,
    jobs: dict[str, list[str]],
    run_dir: Path,
    results_dir: Path,
    timeout: float,
    suite: Path,
) -> dict[str, str]:
    """Start one suite process per job, wait for them all (bounded); job -> what went wrong."""
    env = {**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0"}
    procs = {}
    for job, args in jobs.items():
        log = run_dir / f"{job}.log"
        with open(log, "wb") as out:
            procs[job] = (
                subprocess.Popen(
                    [*node_command(suite), "server", "--url", url, *args, "-o", str(results_dir)],
                    cwd=run_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                ),
                log,
            )
    deadline = time.monotonic() + timeout
    notes = {}
    for job, (proc, log) in procs.items():
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            notes[job] = f"the suite did not finish in {timeout:g} s (see {log})"
        else:
            if proc.returncode not in (0, 1):  # 1: some scenario failed
                notes[job] = f"the suite exited {proc.returncode} (see {log})"
    return notes


def _read_results(results_dir: Path) -> dict[str, Result]:
    results: dict[str, Result] = {}
    if not results_dir.is_dir():
        return results
    for path in sorted(results_dir.glob("server-*/checks.json")):
        match = _RESULT_DIR.match(path.parent.name)
        if match is None:
            continue
        checks = json.loads(path.read_text())
        failures = [_describe(c) for c in checks if c.get("status") == "FAILURE"]
        warnings = [_describe(c) for c in checks if c.get("status") == "WARNING"]
        results[match["scenario"]] = Result(not failures, failures, warnings)
    return results


def _describe(check: dict[str, object]) -> str:
    message = check.get("errorMessage") or check.get("description") or ""
    return f"{check.get('id')}: {message}"
