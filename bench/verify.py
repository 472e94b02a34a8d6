"""Full-verify throughput: ``ledger.verify.verify_store`` against a hash-only scan.

    python bench/verify.py [--events N] [--repeat K] [--postgres URL] [--skip-postgres]
                           [--stat median|best] [--json] [--profile]

Builds a ledger of N events (appends of 1000 events, one 4 KiB blob each, which every
event of the append names as its checked bytes) on SQLite (fresh temp file) and
PostgreSQL (fresh schema), then times a full verify: every leaf recomputed from the row,
the hash chain, the Merkle root against the head, stream versions, the blobs, and that
every blob an event references is stored. The target is >= 500k events/s.

The baseline, timed in the same run on the same rows, is the raw driver reading the
same columns in position order (as ``Store.snapshot().rows`` does: same batch size, and a
server-side cursor on PostgreSQL) and doing nothing but one SHA-256 over the
concatenated payloads. It is the floor of any verify written in Python over this
driver: the cost of getting the rows out plus hashing the bulk of the bytes once.

A second floor, "hashes", reads the same rows the same way and computes exactly the
hashes verify must compute to say anything — each leaf over its envelope (the same
template, the same cached JSON forms), the chain, the Merkle tree — and checks nothing:
verify over it is the price of the checks themselves; it over the scan is the price of
hashing three times per event instead of once.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from hashlib import sha256
from typing import Any

import msgspec
from _common import (  # bench/ is sys.path[0] when run as `python bench/verify.py`
    COLUMNS,
    Target,
    Workload,
    fresh_target,
    pick,
    print_profile,
    profile_top,
    start_run,
    timed,
)
from rich.console import Console
from rich.table import Table

import ledger
from ledger.envelope import GENESIS_CHAIN, LEAF_TEMPLATE, json_string
from ledger.verify import available_cores, verify_store

TARGET_EVENTS_PER_S = 500_000
BUILD_BATCH = 1000
SCAN_BATCH = 10_000  # Snapshot.rows' default
BLOB_SIZE = 4096


def build(store: ledger.Store, n_events: int) -> float:
    """Append ``n_events`` in transactions of 1000; returns the seconds spent appending."""
    work = Workload()
    spent = 0.0
    done = 0
    while done < n_events:
        size = min(BUILD_BATCH, n_events - done)
        batch = work.batch(size, raw=False)
        blob = os.urandom(BLOB_SIZE)  # e.g. a raw tool output the batch's events point to
        digest = sha256(blob).hexdigest()
        events = [
            msgspec.structs.replace(
                e, payload=msgspec.structs.replace(e.payload, checked_sha256=digest)
            )
            for e in batch.events
        ]
        spent += timed(lambda s=batch.stream, e=events, blob=blob: store.append(s, e, blobs=[blob]))
        done += size
    return spent


def ours_verify(store: ledger.Store, n_events: int, jobs: int = 1) -> None:
    report = verify_store(store, jobs=jobs)
    if not report.ok or report.checked_events != n_events:
        raise RuntimeError(
            f"verify failed or short: ok={report.ok} "
            f"checked={report.checked_events} problems={report.problems[:3]}"
        )


def _rows(target: Target) -> Iterator[list[tuple[Any, ...]]]:
    """Every row's columns in position order, as ``Store.snapshot().rows`` reads them."""
    conn = target.ledger_raw_connect()
    sql = f"SELECT {COLUMNS} FROM events ORDER BY position"
    try:
        if target.backend == "sqlite":
            conn.execute("BEGIN")  # one read snapshot, as Store.read_transaction takes
            cur = conn.cursor()
        else:
            import psycopg

            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ  # as the store
            cur = conn.cursor(name="evb_scan")  # server-side, as Store.snapshot().rows
            cur.itersize = SCAN_BATCH
        cur.execute(sql)
        while rows := cur.fetchmany(SCAN_BATCH):
            yield rows
        cur.close()
        conn.commit() if target.backend == "postgresql" else conn.execute("COMMIT")
    finally:
        conn.close()


def hashes_floor(target: Target, n_events: int) -> None:
    """Every hash verify computes, nothing compared (see the module docstring)."""
    template = b"\x00" + LEAF_TEMPLATE  # the leaf prefix in the buffer, as verify has it
    encoded: dict[str | None, bytes] = {None: b"null"}
    hashes: list[bytes] = []
    size = 0
    chain = GENESIS_CHAIN
    n = 0
    for rows in _rows(target):
        for position, event_id, stream, sv_, type_name, sv, at, actor, corr, caus, p, d, *_ in rows:
            for value in (stream, type_name, actor):
                if value not in encoded:
                    encoded[value] = json_string(value)
            leaf = sha256(
                template
                % (
                    encoded[actor],
                    encoded[caus] if caus is None else json_string(caus),
                    encoded[corr] if corr is None else json_string(corr),
                    d,
                    json_string(event_id),
                    p,
                    position,
                    json_string(at),
                    sv,
                    encoded[stream],
                    sv_,
                    encoded[type_name],
                )
            ).digest()
            chain = sha256(chain + leaf).digest()
            hashes.append(leaf)  # Frontier.append, inline as verify has it
            carry = size
            while carry & 1:
                right = hashes.pop()
                hashes[-1] = sha256(b"\x01" + hashes[-1] + right).digest()
                carry >>= 1
            size += 1
        n += len(rows)
    if n != n_events:
        raise RuntimeError(f"the hashes floor read {n} rows, expected {n_events}")


def baseline_scan(target: Target, n_events: int) -> None:
    digest = sha256()
    n = 0
    for rows in _rows(target):
        for row in rows:
            digest.update(row[10])
        n += len(rows)
    if n != n_events:
        raise RuntimeError(f"baseline scanned {n} rows, expected {n_events}")


def run_backend(
    target: Target, n: int, args: argparse.Namespace, out: Console
) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """Build the ledger, then time verify and the baseline, interleaved."""
    store = ledger.open(target.ledger_url)
    top = None
    try:
        build_s = build(store, n)
        out.print(
            f"{target.backend}: built {n} events in {build_s:.1f} s "
            f"({n / build_s:,.0f} events/s appending {BUILD_BATCH} per transaction)"
        )
        # Warm-up (discarded): page cache, statement caches, imports.
        ours_verify(store, n)
        baseline_scan(target, n)
        sides = {
            "ours": lambda: ours_verify(store, n),
            "jobs": lambda: ours_verify(store, n, args.jobs),
            "baseline": lambda: baseline_scan(target, n),
            "hashes": lambda: hashes_floor(target, n),
        }
        samples: dict[str, list[float]] = {side: [] for side in sides}
        order = list(sides)
        for rep in range(args.repeat):
            for side in order if rep % 2 == 0 else reversed(order):
                samples[side].append(timed(sides[side]))
        if args.profile:
            top = profile_top(sides["ours"], args.profile_top)
    finally:
        store.close()
    ours_s = pick(samples["ours"], args.stat)
    jobs_s = pick(samples["jobs"], args.stat)
    base_s = pick(samples["baseline"], args.stat)
    hashes_s = pick(samples["hashes"], args.stat)
    row = {
        "backend": target.backend,
        "events": n,
        "build_events_per_s": round(n / build_s),
        "ours_s": round(ours_s, 3),
        "ours_events_per_s": round(n / ours_s),
        "baseline_s": round(base_s, 3),
        "baseline_events_per_s": round(n / base_s),
        "ours_over_baseline": round(ours_s / base_s, 2),
        "hashes_s": round(hashes_s, 3),
        "ours_over_hashes": round(ours_s / hashes_s, 2),
        "hashes_over_baseline": round(hashes_s / base_s, 2),
        "jobs": args.jobs,
        "jobs_s": round(jobs_s, 3),
        "jobs_speedup": round(ours_s / jobs_s, 2),
        "target_events_per_s": TARGET_EVENTS_PER_S,
        "met": n / ours_s >= TARGET_EVENTS_PER_S,
        "ours_samples_s": [round(s, 4) for s in samples["ours"]],
        "baseline_samples_s": [round(s, 4) for s in samples["baseline"]],
    }
    return row, top


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=200_000, help="ledger size")
    ap.add_argument("--repeat", type=int, default=3, help="verifies (and baselines) per backend")
    ap.add_argument(
        "--jobs", type=int, default=available_cores(), help="processes for `verify --jobs`"
    )
    run = start_run(ap, argv, "one verify per backend")
    args, out, backends, pg_url, info = run.args, run.out, run.backends, run.pg_url, run.info
    n = args.events
    rows: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    for backend in backends:
        with fresh_target(backend, pg_url or "") as target:
            row, top = run_backend(target, n, args, out)
        rows.append(row)
        if top is not None:
            profiles[backend] = top

    table = Table(
        title=f"full verify vs hash-only scan ({args.stat} of {args.repeat})", title_justify="left"
    )
    for col in (
        "backend",
        "events",
        "verify s",
        "verify ev/s",
        "baseline s",
        "baseline ev/s",
        "verify/baseline",
        "hashes s",
        "verify/hashes",
        "--jobs s",
        "1 job / --jobs",
        "target",
        "met",
    ):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for r in rows:
        table.add_row(
            r["backend"],
            f"{r['events']:,}",
            f"{r['ours_s']:.2f}",
            f"{r['ours_events_per_s']:,}",
            f"{r['baseline_s']:.2f}",
            f"{r['baseline_events_per_s']:,}",
            f"{r['ours_over_baseline']:.1f}x",
            f"{r['hashes_s']:.2f}",
            f"{r['ours_over_hashes']:.2f}x",
            f"{r['jobs_s']:.2f} ({r['jobs']})",
            f"{r['jobs_speedup']:.2f}x",
            f">= {TARGET_EVENTS_PER_S:,}",
            "[green]yes[/]" if r["met"] else "[red]no[/]",
        )
    out.print(table)
    for backend, top in profiles.items():
        print_profile(out, f"cProfile verify_store, {backend}", top)
    if args.json:
        print(
            json.dumps(
                {
                    "machine": info,
                    "config": {
                        "events": n,
                        "repeat": args.repeat,
                        "stat": args.stat,
                        "build_batch": BUILD_BATCH,
                        "blob_bytes": BLOB_SIZE,
                    },
                    "results": rows,
                    "profiles": profiles,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
