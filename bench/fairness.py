"""Fair under overload: many agents through one ``evidence serve``, each one's share.

    python bench/fairness.py [--agents 32,128] [--seconds N] [--max-in-flight N]
                             [--postgres URL] [--skip-postgres] [--json]

Every agent is an HTTP client of its own (one keep-alive connection, its own plan and
credential) that posts passing input gate checks (``POST /v1/gate/input``) as fast as it
is answered; an answer of 429 or 503 is honoured as a well-behaved client does (it waits
``Retry-After``). The service runs with its default bound (8 places in flight), so 32
or 128 agents are far more than it runs at once: what is measured is who gets served.

Reported per backend and number of agents, over the window (``--seconds``, default 60;
a soak is ``--seconds 600``): checks per second, and in the window's first and last
fifth (a minute of ``--seconds 300``: a young ledger must not decay; target within
15%); each agent's completed checks, the
fewest, the median and the most, and the ratios of the extremes to the median (target:
within 2x both ways); the longest and the p99 time a request waited for its answer
(target: under 5 s); the 429 and 503 answers; then the log verified (``evidence
verify``), dense, and every answered pass recorded once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from _common import met_cell, results_table, start_run  # bench/ is sys.path[0]
from service import Service, check_log, fresh_ledger, gate_request

TARGET_SPREAD = 2.0
TARGET_WAIT_S = 5.0


@dataclass
class AgentTally:
    done: int = 0
    finished: list[float] = field(default_factory=list)  # when each pass was answered
    waits: list[float] = field(default_factory=list)  # each answered request, seconds
    status: dict[int, int] = field(default_factory=dict)  # answers other than a pass
    errors: int = 0


async def agent(host: str, port: int, token: str, end: float) -> AgentTally:
    reader, writer = await asyncio.open_connection(host, port)
    request = gate_request(host, port, token)
    tally = AgentTally()
    clock = time.monotonic
    try:
        while (start := clock()) < end:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status, length, retry = int(head[9:12]), 0, 0.0
            for line in head.split(b"\r\n"):
                name = line.split(b":", 1)[0].lower()
                if name == b"content-length":
                    length = int(line.split(b":", 1)[1])
                elif name == b"retry-after":
                    retry = float(line.split(b":", 1)[1])
            body = await reader.readexactly(length)
            now = clock()
            tally.waits.append(now - start)
            if status == 200 and b'"verdict":"pass"' in body:
                tally.done += 1
                tally.finished.append(now)
                continue
            tally.status[status] = tally.status.get(status, 0) + 1
            if status not in (429, 503):
                tally.errors += 1
            await asyncio.sleep(retry or 1.0)
    finally:
        writer.close()
    return tally


def run(backend: str, pg_url: str, agents: int, args: argparse.Namespace) -> dict[str, Any]:
    with fresh_ledger(backend, pg_url, agents) as led:
        service = Service(led, workers=1)
        try:
            begin = time.monotonic()

            async def load() -> list[AgentTally]:
                end = begin + args.seconds
                return await asyncio.gather(
                    *(agent(service.host, service.port, t, end) for t in led.tokens)
                )

            tallies = asyncio.run(load())
        finally:
            exit_code = service.stop()
        done = sorted(t.done for t in tallies)
        answered = sum(done)
        log = check_log(led, answered, "gate")
    waits = sorted(w for t in tallies for w in t.waits)
    median = statistics.median(done)
    status: dict[int, int] = {}
    for t in tallies:
        for code, n in t.status.items():
            status[code] = status.get(code, 0) + n
    # The rate in the run's first and last fifth (a minute of a five-minute run): a
    # young ledger must not decay (issue 46, item 1).
    fifth = args.seconds / 5
    counts = [0] * 5
    for tally in tallies:
        for t in tally.finished:
            counts[min(4, int((t - begin) / fifth))] += 1
    fifths = [round(n / fifth, 1) for n in counts]
    first, last = fifths[0], fifths[-1]
    row = {
        "backend": backend,
        "fifths_per_s": fifths,
        "first_fifth_per_s": round(first, 1),
        "last_fifth_per_s": round(last, 1),
        "change": round(last / first - 1, 3) if first else None,
        "agents": agents,
        "seconds": args.seconds,
        "checks_per_s": round(answered / args.seconds, 1),
        "fewest": done[0],
        "median": median,
        "most": done[-1],
        "most_over_median": round(done[-1] / median, 2) if median else None,
        "median_over_fewest": round(median / done[0], 2) if done[0] else None,
        "longest_wait_s": round(waits[-1], 3) if waits else None,
        "p99_wait_s": round(waits[min(len(waits) - 1, int(0.99 * len(waits)))], 3),
        "status": status,
        "errors": sum(t.errors for t in tallies),
        "service_exit": exit_code,
        "log_ok": log["ok"],
    }
    spread = row["most_over_median"], row["median_over_fewest"]
    row["met"] = (
        None not in spread
        and max(spread) <= TARGET_SPREAD
        and waits[-1] < TARGET_WAIT_S
        and log["ok"]
        and not row["errors"]
    )
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", default="32,128", help="numbers of agents, comma-separated")
    ap.add_argument("--seconds", type=float, default=60.0, help="the window (a soak: 600)")
    started = start_run(ap, argv, None)
    args = started.args
    counts = [int(n) for n in args.agents.split(",")]
    rows = [
        run(backend, started.pg_url or "", n, args) for backend in started.backends for n in counts
    ]
    if args.json:
        print(json.dumps({"machine": started.info, "rows": rows}, indent=2))
        return 0
    columns = ("backend", "agents", "checks/s", "first / last fifth", "fewest / median / most",
               "spread", "longest wait", "p99 wait", "429 / 503", "log", "met")  # fmt: skip
    table = results_table(f"fair under overload ({args.seconds:g} s a run)", columns)
    for r in rows:
        spread = max(r["most_over_median"] or 0, r["median_over_fewest"] or float("inf"))
        table.add_row(
            r["backend"],
            str(r["agents"]),
            f"{r['checks_per_s']:,.0f}",
            f"{r['first_fifth_per_s']:,.0f} / {r['last_fifth_per_s']:,.0f} ({r['change']:+.0%})",
            f"{r['fewest']} / {r['median']:g} / {r['most']}",
            f"{spread:.2f}x",
            f"{r['longest_wait_s']:.2f} s",
            f"{r['p99_wait_s']:.2f} s",
            f"{r['status'].get(429, 0)} / {r['status'].get(503, 0)}",
            "ok" if r["log_ok"] else "[red]BAD[/]",
            met_cell(r["met"]),
        )
    started.out.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
