"""A gated MCP tool call through the service, against the same call on a warm session.

    python bench/mcp_warm.py [--calls N] [--warmup N] [--postgres URL] [--skip-postgres]
                             [--stat median|best] [--json]

Two MCP clients (the official SDK's) call ``add`` of the same small MCP server
(tests/mcp_server.py): one on its own warm stdio session to the server (the floor: what
the call costs when nothing stands between); one through a real ``evidence serve``
(uvicorn, ``POST /mcp`` with a bearer credential), where the server is an operator's
registered MCP tool that the service launches confined in the plan's sandbox and, since
issue 45, keeps open across the plan's calls (``commands.runner.mcp_sessions``). The
calls alternate — direct, gated, direct, ... — so drift in machine load hits both
alike. Each gated call is checked both ways and recorded before it returns (three
events and a blob, committed by the group commit).

Reported per backend: the median (or best) and p99 of each side, in ms, the ratio of
gated to direct for each, against the target (at most 3x, p50 and p99), and the first
gated call (the server started) apart. Beside them, an MCP ``ping`` on each session,
timed in the same alternation: the door's ping is what the HTTP door costs before any
plane work, the floor under which no gated call can go. Nothing is written into the
repository.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx2
from _common import REPO, fresh_target, start_run  # bench/ is sys.path[0]
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from rich.table import Table
from service import Ledger, Service, keys_env

SERVER = Path(REPO) / "tests" / "mcp_server.py"
TARGET_RATIO = 3.0
ADD = {
    "input_schema": {
        "type": "object",
        "required": ["a", "b"],
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    },
    "output_schema": {
        "type": "object",
        "required": ["sum"],
        "properties": {"sum": {"type": "integer"}},
    },
}


def setup(url: str, work: Path) -> str:
    """The tool, a plan in Execute and its credential; the credential's token."""
    from commands.plane import Plane
    from commands.plane.credentials import issue_credential
    from commands.plane.phases import enter_execute, record_strategy
    from commands.plane.plans import create_plan
    from commands.plane.registry import register_tool

    server = [sys.executable, str(SERVER), str(work / "upstream" / "calls.jsonl")]
    with Plane.open(url) as plane:
        register_tool(
            plane,
            {"name": "calc", "mcp_server": "bench", "mcp_tool_name": "add",
             "mcp_command": server, **ADD},
        )  # fmt: skip
        create_plan(plane, "P", project="bench", resources=["repo:bench"])
        record_strategy(plane, "P", "add numbers")
        enter_execute(plane, "P")
        return issue_credential(plane, "P", ttl=timedelta(hours=1)).token


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


async def measure(base: str, token: str, calls: int, warmup: int, work: Path) -> dict[str, Any]:
    server = [str(SERVER), str(work / "upstream" / "direct.jsonl")]
    direct = StdioServerParameters(command=sys.executable, args=server, env=dict(os.environ))
    headers = {"Authorization": f"Bearer {token}"}
    samples: dict[str, list[float]] = {"direct": [], "gated": [], "ping": [], "door_ping": []}
    first = 0.0
    async with (
        stdio_client(direct) as (read, write),
        ClientSession(read, write) as plain,
        httpx2.AsyncClient(headers=headers, timeout=120) as http,
        streamable_http_client(f"{base}/mcp", http_client=http) as (gread, gwrite),
        ClientSession(gread, gwrite) as gated,
    ):
        await plain.initialize()
        await gated.initialize()
        for i in range(warmup + calls):
            for side, session, tool in (("direct", plain, "add"), ("gated", gated, "calc")):
                start = time.perf_counter()
                result = await session.call_tool(tool, {"a": i, "b": 1})
                elapsed = (time.perf_counter() - start) * 1000
                if result.is_error or result.structured_content != {"sum": i + 1}:
                    raise SystemExit(f"{side} call {i} failed: {result}")
                if side == "gated" and i == 0:
                    first = elapsed
                if i >= warmup:
                    samples[side].append(elapsed)
            for side, session in (("ping", plain), ("door_ping", gated)):
                start = time.perf_counter()
                await session.send_ping()
                if i >= warmup:
                    samples[side].append((time.perf_counter() - start) * 1000)
    return {"samples": samples, "first_ms": first}


def run_backend(backend: str, pg_url: str, args: argparse.Namespace) -> dict[str, Any]:
    pick = statistics.median if args.stat == "median" else min
    with (
        fresh_target(backend, pg_url) as target,
        tempfile.TemporaryDirectory(prefix="evb-warm-") as tmp,
    ):
        work = Path(tmp)
        (work / "upstream").mkdir()
        env = {
            "EVIDENCE_PLANE_KEY": f"{tmp}/plane.key",
            "EVIDENCE_OPERATOR_KEY": f"{tmp}/operator.key",
            "EVIDENCE_STATE_DIR": f"{tmp}/state",
            # The server runs confined: it writes its call log only where allowed.
            "EVIDENCE_CONFINE_WRITE": str(work / "upstream"),
        }
        with keys_env(env):
            token = setup(target.ledger_url, work)
            service = Service(Ledger(target, target.ledger_url, env, ["P"], [token]))
            try:
                found = anyio.run(measure, service.base, token, args.calls, args.warmup, work)
            finally:
                service.stop()
    direct, gated = found["samples"]["direct"], found["samples"]["gated"]
    ping, door_ping = found["samples"]["ping"], found["samples"]["door_ping"]
    row: dict[str, Any] = {
        "backend": backend,
        "direct_ms": round(pick(direct), 3),
        "direct_p99_ms": round(p99(direct), 3),
        "gated_ms": round(pick(gated), 3),
        "gated_p99_ms": round(p99(gated), 3),
        "first_gated_ms": round(found["first_ms"], 1),
        "ping_ms": round(pick(ping), 3),
        "door_ping_ms": round(pick(door_ping), 3),
    }
    row["ratio"] = round(row["gated_ms"] / row["direct_ms"], 2)
    row["ratio_p99"] = round(row["gated_p99_ms"] / row["direct_p99_ms"], 2)
    row["met"] = row["ratio"] <= TARGET_RATIO and row["ratio_p99"] <= TARGET_RATIO
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200, help="timed calls per side")
    ap.add_argument("--warmup", type=int, default=20, help="untimed calls per side first")
    run = start_run(ap, argv, None)
    args = run.args
    rows = [run_backend(backend, run.pg_url or "", args) for backend in run.backends]
    if args.json:
        print(json.dumps({"machine": run.info, "calls": args.calls, "rows": rows}, indent=2))
        return 0
    table = Table(
        title=f"one MCP tool call, ms ({args.calls} calls per side, alternating; {args.stat})",
        title_justify="left",
    )
    columns = ("backend", "direct", "direct p99", "gated", "gated p99", "ratio", "ratio p99",
               "first gated", "ping", "door ping", f"target <= {TARGET_RATIO:g}x")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "backend" else "right")
    for r in rows:
        table.add_row(
            r["backend"],
            *(f"{r[k]:.2f}" for k in ("direct_ms", "direct_p99_ms", "gated_ms", "gated_p99_ms")),
            f"{r['ratio']:.2f}x",
            f"{r['ratio_p99']:.2f}x",
            f"{r['first_gated_ms']:.0f}",
            f"{r['ping_ms']:.2f}",
            f"{r['door_ping_ms']:.2f}",
            "[green]yes[/]" if r["met"] else "[red]no[/]",
        )
    run.out.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
