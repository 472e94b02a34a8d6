"""Projection rebuild throughput, next to a plain read-all decode of the same log.

    python bench/rebuild.py [--events N] [--repeat K] [--postgres URL] [--skip-postgres]
                            [--stat median|best] [--json] [--profile]

Builds a ledger of N events shaped like a plane's log (per plan: plan.created, then
strategy, execute and gate checks; one in ten plans adds an attachment; a few tool and
validation registrations), then times, in the same run:

- baseline: ``sum(1 for _ in store.read_all())`` — every event read and decoded;
- ours: ``ProjectionEngine.rebuild()`` of every read model — one pass over the log
  folding all projections, fresh tables filled, swapped in atomically.

Reports events/s for both (log size / seconds); the target is >= 150k events/s.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from _common import (  # bench/ is sys.path[0] when run as `python bench/rebuild.py`
    fresh_target,
    pick,
    print_profile,
    profile_top,
    start_run,
    timed,
)
from rich.table import Table

import ledger
from ledger.events import (
    AttachmentCreated,
    EventPayload,
    ExecuteEntered,
    GateChecked,
    PlanCreated,
    StrategyRecorded,
    ToolRegistered,
    ValidationRegistered,
)
from projections import ALL_PROJECTIONS, ProjectionEngine

TARGET_EVENTS_PER_S = 150_000
EVENTS_PER_PLAN = 20


def plan_events(i: int) -> list[tuple[str, EventPayload]]:
    plan_id = f"P-{i}"
    stream = f"plan:{plan_id}"
    events: list[tuple[str, EventPayload]] = [
        (
            stream,
            PlanCreated(plan_id=plan_id, project=f"proj-{i % 7}", resources=[f"repo:{i % 13}"]),
        ),
        (stream, StrategyRecorded(plan_id=plan_id, revision=0, strategy="fix the tests")),
        (stream, ExecuteEntered(plan_id=plan_id, revision=0)),
    ]
    if i % 10 == 0:
        attachment_id = f"01J{i:023d}"
        events.append(
            (
                f"attachment:{attachment_id}",
                AttachmentCreated(
                    attachment_id=attachment_id,
                    validation="tests",
                    validation_version=1,
                    resource=f"repo:{i % 13}",
                    scope="plan",
                    plan=plan_id,
                    args={"path": "src"},
                    args_sha256="0" * 64,
                ),
            )
        )
    while len(events) < EVENTS_PER_PLAN:
        events.append(
            (
                stream,
                GateChecked(
                    plan_id=plan_id,
                    gate="input",
                    tool="pytest",
                    verdict="pass",
                    attempt=1,
                    iteration=1,
                    strict_mode=False,
                    checked_sha256="a" * 64,
                ),
            )
        )
    return events


def build(store: ledger.Store, n_events: int) -> None:
    registrations: list[tuple[str, EventPayload]] = [
        ("tool:pytest", ToolRegistered(name="pytest", version=1, command=["pytest", "-q"])),
        (
            "tool:tests",
            ValidationRegistered(
                name="tests",
                version=1,
                mode="required",
                executor="wrapped",
                wraps="pytest",
                transform="{passed: exit_code == `0`}",
            ),
        ),
    ]
    pending = registrations
    i = 0
    written = 0
    while written < n_events:
        while len(pending) < 1000:
            pending += plan_events(i)
            i += 1
        batch, pending = pending[: min(1000, n_events - written)], pending[1000:]
        by_stream: dict[str, list[ledger.NewEvent]] = {}
        for stream, payload in batch:
            by_stream.setdefault(stream, []).append(ledger.NewEvent(payload=payload))
        store.append_batch([ledger.StreamAppend(s, evs) for s, evs in by_stream.items()])
        written += len(batch)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=100_000, help="ledger size")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per backend")
    run = start_run(ap, argv, "one rebuild per backend")
    args, out, backends, pg_url, info = run.args, run.out, run.backends, run.pg_url, run.info

    rows: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    for backend in backends:
        with fresh_target(backend, pg_url or "") as target:
            store = ledger.open(target.ledger_url)
            try:
                build(store, args.events)
                engine = ProjectionEngine(store, ALL_PROJECTIONS).open()
                n = store.head().size
                read, rebuild = [], []
                for _ in range(args.repeat):
                    read.append(timed(lambda s=store: sum(1 for _ in s.read_all())))
                    rebuild.append(timed(engine.rebuild))
                if args.profile:
                    profiles[backend] = profile_top(engine.rebuild, args.profile_top)
            finally:
                store.close()
        read_rate = n / pick(read, args.stat)
        rebuild_rate = n / pick(rebuild, args.stat)
        rows.append(
            {
                "backend": backend,
                "events": n,
                "read_all_events_per_s": round(read_rate),
                "rebuild_events_per_s": round(rebuild_rate),
                "rebuild_vs_read_all": round(read_rate / rebuild_rate, 2),
                "target_events_per_s": TARGET_EVENTS_PER_S,
                "met": rebuild_rate >= TARGET_EVENTS_PER_S,
                "read_all_samples_s": [round(s, 3) for s in read],
                "rebuild_samples_s": [round(s, 3) for s in rebuild],
            }
        )
        out.print(f"{backend}: done")

    table = Table(
        title=f"projection rebuild vs read-all decode ({args.stat} of {args.repeat})",
        title_justify="left",
    )
    for col in (
        "backend",
        "events",
        "read-all ev/s",
        "rebuild ev/s",
        "rebuild time / read",
        "target",
        "met",
    ):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for r in rows:
        table.add_row(
            r["backend"],
            f"{r['events']:,}",
            f"{r['read_all_events_per_s']:,}",
            f"{r['rebuild_events_per_s']:,}",
            f"{r['rebuild_vs_read_all']:.2f}x",
            f">= {TARGET_EVENTS_PER_S:,}",
            "[green]yes[/]" if r["met"] else "[red]no[/]",
        )
    out.print(table)
    for backend, top in profiles.items():
        print_profile(out, f"cProfile rebuild, {backend}", top)
    if args.json:
        print(json.dumps({"machine": info, "results": rows, "profiles": profiles}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
