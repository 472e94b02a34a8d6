"""A plane decision against the append it ends in: what deciding from the log costs.

    python bench/decide.py [--history N,N,...] [--calls N] [--repeat K]
                           [--postgres URL] [--skip-postgres] [--stat median|best] [--json]

Every plane command folds the streams it decides on from the events table, inside the
write transaction that appends its events (commands/plane/authority.py). A gate check is the
most frequent decision (one per tool call) and the one whose stream grows: each check is
an event on the plan's stream. Scenarios, on SQLite and PostgreSQL, for a plan whose
stream already holds H events:

  cold    ``gate_input`` through a Plane that has checked nothing yet (a CLI process:
          the plan's whole stream is read, folded and checked)
  warm    ``gate_input`` through a long-lived Plane (an MCP proxy, a Python embedder:
          only the events since its last decision are read)
  floor   ``Store.append`` of the same gate-check event with its delta precomputed: the
          append alone, no decision

The figure is µs per call and the ratio to the floor, median (or best) over the repeats.
Run it from a checkout; ``PYTHONPATH=OTHER_CHECKOUT python bench/decide.py`` measures
another revision with the same script (the A/B in docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from _common import (  # bench/ is sys.path[0]
    GATE_PARAMS as PARAMS,
)
from _common import (
    fresh_target,
    pick,
    plan_in_execute,
    start_run,
    timed,
)
from rich.table import Table

import ledger
from commands.plane import Plane
from commands.plane.gates import gate_input


def measure(url: str, calls: int) -> dict[str, float]:
    """µs per call of each scenario, interleaved so drift hits all three alike."""
    with Plane.open(url) as plane, ledger.open(url) as store:
        # The floor: the very event a gate check appends, delta and all, appended raw.
        [sample] = [e for e in store.read_stream("plan:P") if e.type == "gate.checked"][-1:]
        floor_event = ledger.NewEvent(payload=sample.payload, delta=sample.delta)
        cold: list[float] = []
        warm: list[float] = []
        floor: list[float] = []
        gate_input(plane, "P", "read", PARAMS)  # connections and caches as in steady use
        checked = getattr(plane, "_checked", {})  # a revision before it decided from
        for _ in range(calls):  # the read models has no such cache
            checked.clear()
            cold.append(timed(lambda: gate_input(plane, "P", "read", PARAMS)))
            warm.append(timed(lambda: gate_input(plane, "P", "read", PARAMS)))
            floor.append(timed(lambda: store.append("floor:P", [floor_event])))
    return {
        name: sum(samples) / len(samples) * 1e6
        for name, samples in (("cold", cold), ("warm", warm), ("floor", floor))
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--history",
        default="10,100,1000",
        help="events already on the plan's stream (comma-separated)",
    )
    ap.add_argument("--calls", type=int, default=100, help="calls per scenario per repeat")
    ap.add_argument("--repeat", type=int, default=3)
    run = start_run(ap, argv, None)
    args, out = run.args, run.out
    histories = [int(h) for h in args.history.split(",")]
    rows: list[dict[str, Any]] = []
    for backend in run.backends:
        for history in histories:
            samples: dict[str, list[float]] = {"cold": [], "warm": [], "floor": []}
            for _ in range(args.repeat):
                with fresh_target(backend, run.pg_url or "") as target:
                    plan_in_execute(target.ledger_url, history)
                    for name, value in measure(target.ledger_url, args.calls).items():
                        samples[name].append(value)
            got = {name: pick(values, args.stat) for name, values in samples.items()}
            rows.append(
                {
                    "backend": backend,
                    "history": history,
                    **got,
                    "cold/floor": got["cold"] / got["floor"],
                    "warm/floor": got["warm"] / got["floor"],
                }
            )
    if args.json:
        print(json.dumps({"machine": run.info, "stat": args.stat, "rows": rows}))
        return
    table = Table(
        title=f"a gate-check decision vs its append ({args.stat} of "
        f"{args.repeat}, {args.calls} calls each)"
    )
    for column in (
        "backend",
        "history",
        "cold µs",
        "warm µs",
        "floor µs",
        "cold/floor",
        "warm/floor",
    ):
        table.add_column(column, justify="right" if column != "backend" else "left")
    for r in rows:
        table.add_row(
            r["backend"],
            str(r["history"]),
            f"{r['cold']:.0f}",
            f"{r['warm']:.0f}",
            f"{r['floor']:.0f}",
            f"{r['cold/floor']:.2f}x",
            f"{r['warm/floor']:.2f}x",
        )
    out.print(table)


if __name__ == "__main__":
    main()
