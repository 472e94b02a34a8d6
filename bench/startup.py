"""Whole-process start-up time of the ``evidence`` command, against a bare interpreter.

    python bench/startup.py [--runs N] [--warmup N] [--history N] [--json]

Each case is a new process, timed from spawn to exit (what a shell or an agent's
orchestrator waits for), with output to /dev/null:

  python -c pass           the interpreter alone: the unit of the ratios
  evidence --version       the group alone: no verb, no database, no schema checker
  evidence --help          every verb listed from the lazy table, none imported
  gate input               ``evidence gate input`` on a prepared SQLite ledger (a plan in
                           Execute with one tool): open the store, decide, append
  plan history             ``evidence plan history`` of that plan (read-only)
  floor: SQLAlchemy        ``python -c "import sqlalchemy, sqlalchemy.dialects.sqlite"``:
                           what opening the store costs before it does anything
  floor: gate imports      ``python -c "import commands.cli.gates"``: every import a gate
                           check makes, and no work

The cases run round-robin (one of each, N times) so drift in machine load hits them all
alike; the figures are the median and the 90th percentile in ms, and each median's
ratio to the median of ``python -c pass`` in the same run. ``evidence`` is the console
script next to this interpreter (``python -m commands.cli`` if there is none). Nothing
is written into the repository: the ledger lives in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (  # bench/ is sys.path[0]
    GATE_PARAMS,
    REPO,
    console,
    err_console,
    machine_info,
    plan_in_execute,
    print_machine,
)
from rich.table import Table

PARAMS = GATE_PARAMS.decode()

# The targets of the issue "A CLI that starts fast": ratio to `python -c pass`, or ms.
TARGET_RATIO = {"evidence --version": 4.0}
TARGET_MS = {"gate input": 300.0}


def evidence_command() -> list[str]:
    """The ``evidence`` console script of this environment, else ``python -m``."""
    script = Path(sys.executable).with_name("evidence")
    if script.exists():
        return [str(script)]
    found = shutil.which("evidence")
    return [found] if found else [sys.executable, "-m", "commands.cli"]


def cases(url: str) -> dict[str, list[str]]:
    py = sys.executable
    evidence = evidence_command()
    return {
        "python -c pass": [py, "-c", "pass"],
        "evidence --version": [*evidence, "--version"],
        "evidence --help": [*evidence, "--help"],
        "gate input": [
            *evidence,
            *("gate", "input", "--plan", "P", "--tool", "read", "--params", PARAMS),
            *("--db", url),
        ],
        "plan history": [*evidence, "plan", "history", "P", "--db", url],
        "floor: SQLAlchemy": [py, "-c", "import sqlalchemy, sqlalchemy.dialects.sqlite"],
        "floor: gate imports": [py, "-c", "import commands.cli.gates"],
    }


def run_once(argv: list[str], cwd: str, env: dict[str, str]) -> float:
    """Seconds from spawn to exit of one process; a failure stops the benchmark."""
    start = time.perf_counter()
    done = subprocess.run(
        argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{argv!r} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return elapsed


def p90(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="timed processes per case")
    ap.add_argument("--warmup", type=int, default=2, help="untimed processes per case first")
    ap.add_argument("--history", type=int, default=10, help="events on the plan's stream")
    ap.add_argument("--json", action="store_true", help="print JSON on stdout")
    args = ap.parse_args(argv)
    out = err_console if args.json else console
    info = machine_info(None)
    info["evidence"] = " ".join(evidence_command())
    if not args.json:
        print_machine(info)

    env = {k: v for k, v in os.environ.items() if k not in ("EVIDENCE_DB", "PYTHONPATH")}
    env["PYTHONPATH"] = REPO  # the checkout this script is in, as the other benches
    with tempfile.TemporaryDirectory(prefix="evb-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'ledger.db'}"
        plan_in_execute(url, args.history)
        commands = cases(url)
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for round_ in range(args.warmup + args.runs):
            for name, command in commands.items():
                elapsed = run_once(command, tmp, env)
                if round_ >= args.warmup:
                    samples[name].append(elapsed * 1000)

    base = statistics.median(samples["python -c pass"])
    rows: list[dict[str, Any]] = []
    for name, values in samples.items():
        median = statistics.median(values)
        row: dict[str, Any] = {
            "case": name,
            "median_ms": round(median, 1),
            "p90_ms": round(p90(values), 1),
            "ratio": round(median / base, 2),
        }
        if name in TARGET_RATIO:
            row["target"] = f"<= {TARGET_RATIO[name]:g}x"
            row["met"] = median / base <= TARGET_RATIO[name]
        elif name in TARGET_MS:
            row["target"] = f"<= {TARGET_MS[name]:g} ms"
            row["met"] = median <= TARGET_MS[name]
        rows.append(row)
    if args.json:
        print(json.dumps({"machine": info, "runs": args.runs, "rows": rows}, indent=2))
        return 0
    table = Table(
        title=f"whole-process time, ms ({args.runs} runs per case, round-robin; "
        f"history {args.history})",
        title_justify="left",
    )
    for column in ("case", "median ms", "p90 ms", "x python -c pass", "target", "met"):
        table.add_column(column, justify="left" if column == "case" else "right")
    for r in rows:
        met = "" if "met" not in r else "[green]yes[/]" if r["met"] else "[red]no[/]"
        table.add_row(
            r["case"],
            f"{r['median_ms']:.1f}",
            f"{r['p90_ms']:.1f}",
            f"{r['ratio']:.2f}x",
            r.get("target", ""),
            met,
        )
    out.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
