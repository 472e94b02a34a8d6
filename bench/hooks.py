"""Whole-process cost of one agent hook: the thin client against the in-process hook.

    python bench/hooks.py [--runs N] [--warmup N] [--history N] [--no-service] [--json]

An agent CLI starts one hook process per tool call and hook (PreToolUse, then
PostToolUse), and waits for it. Each case is a new process, timed from spawn to exit
with the hook input on its stdin and its output to /dev/null, round-robin (one of each,
N times) so drift in machine load hits them all alike:

  python -c pass               the interpreter alone: the unit of the ratios
  floor: import urllib.request ``python -c "import json, urllib.request"``: what the
                               client would cost before any work had it used the
                               standard HTTP client (its ``email`` parsing) — it does not
  evidence-hook -> stub        ``evidence-hook pre-tool`` against a local stdlib HTTP
                               server in this process answering ``{"exit": 0, "stderr":
                               ""}`` at once: the client's own cost, the service's none
  evidence hook --server       the same through the click CLI (``evidence hook pre-tool
                               --server URL``): the spelling that pays click's imports
  evidence hook --plan (today) ``evidence hook pre-tool --plan P --db sqlite:///…``: the
                               in-process hook on a real ledger (a plan in Execute, the
                               tool registered, ``--history`` events on its stream): open
                               the store, gate, append
  evidence-hook -> service     the thin client against a real ``evidence serve`` on the
                               same ledger (started here on a free loopback port, with a
                               credential issued for the plan; ``--no-service`` skips
                               it): the client's cost plus the service's gate and append

The figures are the median and the 90th percentile in ms, each median's ratio to the
median of ``python -c pass`` in the same run, and the median CPU time (user + system)
of the hook process itself; the target is the thin hook (against
the stub) at most 3x ``python -c pass``. Nothing is written into the repository: the
ledger lives in a temporary directory.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import socket
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from _common import REPO, console, err_console, machine_info, plan_in_execute, print_machine
from rich.table import Table
from startup import evidence_command, p90  # bench/ is sys.path[0]

TARGET_RATIO = {"evidence-hook -> stub": 3.0}
# The hook input an agent CLI writes for a call of the tool `read` (bench/_common.py).
HOOK_INPUT = json.dumps(
    {
        "session_id": "bench",
        "transcript_path": "/tmp/bench.jsonl",
        "cwd": "/tmp",
        "hook_event_name": "PreToolUse",
        "tool_name": "read",
        "tool_input": {"path": "src/app.py"},
        "tool_use_id": "toolu_bench",
    }
).encode()
ANSWER = b'{"exit": 0, "stderr": ""}'


def hook_command() -> list[str]:
    """The ``evidence-hook`` console script of this environment, else ``python -m``."""
    script = Path(sys.executable).with_name("evidence-hook")
    return [str(script)] if script.exists() else [sys.executable, "-m", "commands.hook_client"]


class _UnixStub(socketserver.UnixStreamServer):
    def get_request(self) -> tuple[Any, Any]:
        conn, _ = self.socket.accept()
        return conn, ("local", 0)  # BaseHTTPRequestHandler wants a (host, port)


class _Stub(BaseHTTPRequestHandler):
    """The contract's answer, at once: the service's cost is none of the client's."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


def cases(url: str, stub: str, service: str | None) -> dict[str, list[str]]:
    py = sys.executable
    hook = hook_command()
    evidence = evidence_command()
    out = {
        "python -c pass": [py, "-c", "pass"],
        "floor: import urllib.request": [py, "-c", "import json, urllib.request"],
        "evidence-hook -> stub": [*hook, "pre-tool", "--server", stub],
        "evidence hook --server": [*evidence, "hook", "pre-tool", "--server", stub],
        "evidence hook --plan (today)": [
            *evidence,
            *("hook", "pre-tool", "--plan", "P", "--db", url),
        ],
    }
    if service is not None:
        out["evidence-hook -> service"] = [*hook, "pre-tool", "--server", service]
    return out


@contextmanager
def service(url: str, cwd: str, env: dict[str, str], path: Path) -> Iterator[str]:
    """``evidence serve`` on the ledger ``url`` at the unix socket ``path`` (the hook
    sends its credential to no plain http port): its URL, once it is ready; stopped
    (SIGTERM, drained) at the end."""
    proc = subprocess.Popen(
        [*evidence_command(), "serve", "--db", url, "--uds", str(path)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("listening on unix:"):
            raise SystemExit(f"evidence serve did not start: {line!r}")
        for _ in range(600):
            try:
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.connect(str(path))
                    probe.sendall(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\n\r\n")
                    if probe.recv(64).startswith(b"HTTP/1.1 200"):
                        break
            except OSError:
                pass
            time.sleep(0.05)
        yield f"unix:{path}"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def issue_credential(url: str, cwd: str, env: dict[str, str]) -> str:
    """A credential for plan P, as an operator issues it (``evidence credential issue``)."""
    done = subprocess.run(
        [*evidence_command(), "credential", "issue", "--plan", "P", "--json", "--db", url],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return str(json.loads(done.stdout)["credential"]["token"])


def run_once(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[float, float]:
    """Seconds from spawn to exit of one hook process, and the CPU seconds it used
    (user + system; a service's are not counted: it is no finished child). Anything but
    a pass (exit 0) stops the benchmark."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        input=HOOK_INPUT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=120,
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{argv!r} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="timed processes per case")
    ap.add_argument("--warmup", type=int, default=2, help="untimed processes per case first")
    ap.add_argument("--history", type=int, default=10, help="events on the plan's stream")
    ap.add_argument(
        "--no-service",
        action="store_true",
        help="do not time evidence-hook against a real `evidence serve`",
    )
    ap.add_argument("--json", action="store_true", help="print JSON on stdout")
    args = ap.parse_args(argv)
    out = err_console if args.json else console
    info = machine_info(None)
    info["evidence-hook"] = " ".join(hook_command())
    if not args.json:
        print_machine(info)

    with_service = not args.no_service and importlib.util.find_spec("commands.service")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("EVIDENCE_DB", "PYTHONPATH", "EVIDENCE_SERVER", "EVIDENCE_CREDENTIAL_FILE")
    }
    env["PYTHONPATH"] = REPO  # the checkout this script is in, as the other benches
    env["EVIDENCE_CREDENTIAL"] = "bench-token"  # the stub takes any
    # the sockets in a directory only this user may write, as evidence-hook demands
    private = tempfile.TemporaryDirectory(prefix="evb-", dir=Path.home())
    stub = _UnixStub(str(Path(private.name) / "stub.sock"), _Stub)
    threading.Thread(target=stub.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        with tempfile.TemporaryDirectory(prefix="evb-") as tmp, ExitStack() as stack:
            url = f"sqlite:///{Path(tmp) / 'ledger.db'}"
            # the key where a deployment names it: the service refuses the developer layout
            env["EVIDENCE_PLANE_KEY"] = os.environ["EVIDENCE_PLANE_KEY"] = f"{tmp}/plane.key"
            plan_in_execute(url, args.history)
            served = None
            if with_service:
                env["EVIDENCE_CREDENTIAL"] = issue_credential(url, tmp, env)
                served = stack.enter_context(
                    service(url, tmp, env, Path(private.name) / "serve.sock")
                )
            commands = cases(url, f"unix:{stub.server_address}", served)
            samples: dict[str, list[float]] = {name: [] for name in commands}
            cpu: dict[str, list[float]] = {name: [] for name in commands}
            for round_ in range(args.warmup + args.runs):
                for name, command in commands.items():
                    elapsed, used = run_once(command, tmp, env)
                    if round_ >= args.warmup:
                        samples[name].append(elapsed * 1000)
                        cpu[name].append(used * 1000)
    finally:
        stub.shutdown()
        stub.server_close()
        private.cleanup()

    base = statistics.median(samples["python -c pass"])
    rows: list[dict[str, Any]] = []
    for name, values in samples.items():
        median = statistics.median(values)
        row: dict[str, Any] = {
            "case": name,
            "median_ms": round(median, 1),
            "p90_ms": round(p90(values), 1),
            "ratio": round(median / base, 2),
            "cpu_ms": round(statistics.median(cpu[name]), 1),
        }
        if name in TARGET_RATIO:
            row["target"] = f"<= {TARGET_RATIO[name]:g}x"
            row["met"] = median / base <= TARGET_RATIO[name]
        rows.append(row)
    if args.json:
        print(json.dumps({"machine": info, "runs": args.runs, "rows": rows}, indent=2))
        return 0
    table = Table(
        title=f"one pre-tool hook, whole process, ms ({args.runs} runs per case, "
        f"round-robin; history {args.history})",
        title_justify="left",
    )
    columns = ("case", "median ms", "p90 ms", "x python -c pass", "cpu ms", "target", "met")
    for column in columns:
        table.add_column(column, justify="left" if column == "case" else "right")
    for r in rows:
        met = "" if "met" not in r else "[green]yes[/]" if r["met"] else "[red]no[/]"
        table.add_row(
            r["case"],
            f"{r['median_ms']:.1f}",
            f"{r['p90_ms']:.1f}",
            f"{r['ratio']:.2f}x",
            f"{r['cpu_ms']:.1f}",
            r.get("target", ""),
            met,
        )
    out.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
