"""Audit throughput: ``evidence audit``'s work against reading the log and verifying it.

    python bench/audit.py [--plans N] [--repeat K] [--postgres URL] [--skip-postgres]
                          [--stat median|best] [--json] [--profile]

Builds, through the plane (so every signature, delta, blob and verdict is the real
one), a ledger of plans that call one registered tool: per plan its creation, strategy
and Execute, then 30 input gate checks, every third of them a recorded call (its input
check, the call and its output check, the output as a blob). Two in three checks carry
parameters of their own; one in three repeats parameters another plan used (an agent
reading the same file again). About 53 events per plan: ``--plans 400`` is about 21,000
events.

Then times, in the same run, each repeat interleaved:

- read: ``sum(1 for _ in store.read_all())`` — every event read and decoded (the floor
  of anything that walks the log);
- verify: ``verify_store(store, jobs=1)`` — every hash, the chain, the tree, the blobs;
- walk: ``audit(store, read_models=False)`` — every invariant, every verdict
  re-derived, every delta applied, every signature checked;
- audit: ``audit(store)`` — the walk, and every read model compared with a fresh fold
  (what ``evidence audit`` does after its start-up).

Reports events/s and the ratios to the read; the target (issue 46, item 5) is the audit
at >= 20,000 events/s on one core. Nothing is written into the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Any

from _common import (
    fresh_target,
    met_cell,
    pick,
    print_profile,
    profile_top,
    results_table,
    start_run,
    timed,
)
from service import keys_env

TARGET_EVENTS_PER_S = 20_000
CALLS_PER_PLAN = 30
INPUT = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "line": {"type": "integer", "minimum": 0}},
    "required": ["path"],
    "additionalProperties": False,
}
OUTPUT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


def build(url: str, plans: int) -> int:
    """The ledger (see the module's docstring); its size."""
    from commands.plane import Plane
    from commands.plane.gates import gate_input
    from commands.plane.phases import enter_execute, record_strategy
    from commands.plane.plans import create_plan
    from commands.plane.registry import register_tool
    from commands.plane.runs import call_tool

    with Plane.open(url) as plane:
        register_tool(
            plane,
            {"name": "read", "command": ["true"], "input_schema": INPUT, "output_schema": OUTPUT},
        )
        for p in range(plans):
            plan_id = f"P-{p}"
            create_plan(plane, plan_id, project="bench", resources=["repo:bench"])
            record_strategy(plane, plan_id, "read the sources")
            enter_execute(plane, plan_id)
            for i in range(CALLS_PER_PLAN):
                owner = p if i % 3 else 0  # one in three: parameters plan P-0 used too
                params = {"path": f"src/{owner}/{i}.py", "line": i}
                if i % 3 == 2:
                    call_tool(plane, plan_id, "read", params, recorded_output={"text": "x" * i})
                else:
                    gate_input(plane, plan_id, "read", params)
        return plane.store.head().size


def run_backend(target: Any, args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    import ledger
    from commands.auditor.audit import audit
    from commands.cli.audit import _plane_public_key
    from ledger.verify import verify_store

    size = build(target.ledger_url, args.plans)
    with ledger.open(target.ledger_url) as store:
        key = _plane_public_key(store, None)

        def walk() -> None:
            assert audit(store, read_models=False, plane_public_key=key).ok

        def full() -> None:
            assert audit(store, plane_public_key=key).ok

        sides = {
            "read": lambda: sum(1 for _ in store.read_all()),
            "verify": lambda: verify_store(store, jobs=1),
            "walk": walk,
            "audit": full,
        }
        samples: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.repeat):
            for name, fn in sides.items():
                samples[name].append(timed(fn))
        top = profile_top(full, 8) if args.profile else None
    row: dict[str, Any] = {"backend": target.backend, "events": size}
    for name in sides:
        seconds = pick(samples[name], args.stat)
        row[f"{name}_s"] = round(seconds, 3)
        row[f"{name}_events_per_s"] = round(size / seconds)
    for name in ("verify", "walk", "audit"):
        row[f"{name}_over_read"] = round(row[f"{name}_s"] / row["read_s"], 2)
    row["met"] = row["audit_events_per_s"] >= TARGET_EVENTS_PER_S
    return row, top


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plans", type=int, default=400, help="plans (about 53 events each)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each side")
    run = start_run(ap, argv, "one audit per backend")
    args, out = run.args, run.out
    rows, profiles = [], {}
    for backend in run.backends:
        with (
            fresh_target(backend, run.pg_url or "") as target,
            tempfile.TemporaryDirectory(prefix="evb-audit-") as tmp,
            keys_env(
                {
                    "EVIDENCE_PLANE_KEY": os.path.join(tmp, "plane.key"),
                    "EVIDENCE_OPERATOR_KEY": os.path.join(tmp, "operator.key"),
                    "EVIDENCE_STATE_DIR": os.path.join(tmp, "state"),
                }
            ),
        ):
            row, top = run_backend(target, args)
        rows.append(row)
        if top is not None:
            profiles[row["backend"]] = top
    if args.json:
        print(json.dumps({"machine": run.info, "rows": rows}, indent=2))
        return 0
    columns = ("backend", "events", "read", "verify", "walk", "audit", "audit / read",
               f"target >= {TARGET_EVENTS_PER_S:,}")  # fmt: skip
    table = results_table(
        f"audit vs read and verify, events/s ({args.stat} of {args.repeat})", columns
    )
    for r in rows:
        table.add_row(
            r["backend"],
            f"{r['events']:,}",
            *(f"{r[f'{k}_events_per_s']:,}" for k in ("read", "verify", "walk", "audit")),
            f"{r['audit_over_read']:.1f}x",
            met_cell(r["met"]),
        )
    out.print(table)
    for backend, top in profiles.items():
        print_profile(out, f"cProfile audit, {backend}", top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
