"""Whole-process start-up time of the ``evidence`` command, against a bare interpreter.

    python bench/startup.py [--runs N] [--warmup N] [--history N] [--others N] [--json]

Each case is a new process, timed from spawn to exit (what a shell or an agent's
orchestrator waits for), with output to /dev/null:

  python -c pass           the interpreter alone: the unit of the ratios
  evidence --version       the group alone: no verb, no database, no schema checker
  evidence --help          every verb listed from the lazy table, none imported
  complete a verb          a TAB after ``evidence pl`` (click's ``bash_complete``
                           protocol, ``_EVIDENCE_COMPLETE``): the verbs from the table
  complete plan's verbs    a TAB after ``evidence plan s``: ``commands.cli.plans`` is
                           imported, the plane and the store are not
  complete gate's verbs    a TAB after ``evidence gate `` (``commands.cli.gates``)
  complete tool's verbs    a TAB after ``evidence tool l`` (``commands.cli.registry``)
  complete review's verbs  a TAB after ``evidence review `` (``commands.cli.reviews``)
  plan list                ``evidence plan list`` on a prepared SQLite ledger (a plan in
                           Execute with one tool): open the store, catch the read models
                           up, read one
  plan show                ``evidence plan show`` of that plan (read-only)
  plan history             ``evidence plan history`` of that plan (read-only)
  gate input               ``evidence gate input`` on that ledger: open the store,
                           check the input against the tool's schema, decide, append
  floor: SQLAlchemy        ``python -c "import sqlalchemy, sqlalchemy.dialects.sqlite"``:
                           what opening the store costs before it does anything
  floor: gate imports      ``python -c "import commands.cli.gates, commands.plane.gates"``:
                           every import a gate check makes, and no work (the CLI module
                           alone no longer imports the plane: it does so as the command
                           runs)

The cases run round-robin (one of each, N times) so drift in machine load hits them all
alike; the figures are the median and the 90th percentile in ms, and each median's
ratio to the median of ``python -c pass`` in the same run. ``evidence`` is the console
script next to this interpreter (``python -m commands.cli`` if there is none). Nothing
is written into the repository: the ledger lives in a temporary directory, and so does
the bytecode (``PYTHONPYCACHEPREFIX``; ``PYTHONDONTWRITEBYTECODE`` is dropped), so every
case runs from compiled bytecode as an installed package does (the warm-up rounds
write it), not compiling the house's modules anew in each process.
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
# Issue 46 ("commands that answer before you notice"): a read command and a TAB, <= 300 ms.
TARGET_RATIO = {"evidence --version": 4.0}
TARGET_MS = {
    name: 300.0
    for name in (
        "complete a verb",
        "complete plan's verbs",
        "complete gate's verbs",
        "complete tool's verbs",
        "complete review's verbs",
        "plan list",
        "plan show",
        "plan history",
        "gate input",
    )
}

# The environment of a completion request: what the bash script click writes sets.
COMPLETE = {"_EVIDENCE_COMPLETE": "bash_complete"}


def evidence_command() -> list[str]:
    """The ``evidence`` console script of this environment, else ``python -m``."""
    script = Path(sys.executable).with_name("evidence")
    if script.exists():
        return [str(script)]
    found = shutil.which("evidence")
    return [found] if found else [sys.executable, "-m", "commands.cli"]


def cases(url: str) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each case's argv and the environment it adds."""
    py = sys.executable
    evidence = evidence_command()
    return {
        "python -c pass": ([py, "-c", "pass"], {}),
        "evidence --version": ([*evidence, "--version"], {}),
        "evidence --help": ([*evidence, "--help"], {}),
        "complete a verb": (evidence, {**COMPLETE, "COMP_WORDS": "evidence pl", "COMP_CWORD": "1"}),
        "complete plan's verbs": (
            evidence,
            {**COMPLETE, "COMP_WORDS": "evidence plan s", "COMP_CWORD": "2"},
        ),
        "complete gate's verbs": (
            evidence,
            {**COMPLETE, "COMP_WORDS": "evidence gate ", "COMP_CWORD": "2"},
        ),
        "complete tool's verbs": (
            evidence,
            {**COMPLETE, "COMP_WORDS": "evidence tool l", "COMP_CWORD": "2"},
        ),
        "complete review's verbs": (
            evidence,
            {**COMPLETE, "COMP_WORDS": "evidence review ", "COMP_CWORD": "2"},
        ),
        "plan list": ([*evidence, "plan", "list", "--db", url], {}),
        "plan show": ([*evidence, "plan", "show", "P", "--db", url], {}),
        "plan history": ([*evidence, "plan", "history", "P", "--db", url], {}),
        "gate input": (
            [
                *evidence,
                *("gate", "input", "--plan", "P", "--tool", "read", "--params", PARAMS),
                *("--db", url),
            ],
            {},
        ),
        "floor: SQLAlchemy": ([py, "-c", "import sqlalchemy, sqlalchemy.dialects.sqlite"], {}),
        "floor: gate imports": (
            [py, "-c", "import commands.cli.gates, commands.plane.gates"],
            {},
        ),
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
    ap.add_argument(
        "--others", type=int, default=0, help="events of other plans in the ledger (100 a plan)"
    )
    ap.add_argument("--json", action="store_true", help="print JSON on stdout")
    args = ap.parse_args(argv)
    out = err_console if args.json else console
    info = machine_info(None)
    info["evidence"] = " ".join(evidence_command())
    if not args.json:
        print_machine(info)

    drop = ("EVIDENCE_DB", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "_EVIDENCE_COMPLETE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = REPO  # the checkout this script is in, as the other benches
    with tempfile.TemporaryDirectory(prefix="evb-") as tmp:
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        url = f"sqlite:///{Path(tmp) / 'ledger.db'}"
        plan_in_execute(url, args.history, args.others)
        commands = cases(url)
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for round_ in range(args.warmup + args.runs):
            for name, (command, extra) in commands.items():
                elapsed = run_once(command, tmp, {**env, **extra})
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
        f"history {args.history}, other plans' events {args.others})",
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
