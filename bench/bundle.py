"""Offline bundles: ``write_bundle`` and ``verify_bundle`` against raw floors.

    python bench/bundle.py [--events N] [--repeat K] [--postgres URL] [--skip-postgres]
                           [--stat median|best] [--json]

Builds a ledger of N events (appends of 1000 events, one 4 KiB blob each, as
bench/verify.py does) on SQLite and PostgreSQL, then times, interleaved with baselines
run in the same process on the same data:

- **export**: ``write_bundle`` of the whole log, against the raw driver reading the same
  columns in position order (one snapshot, as the store does) and writing every row's
  payload and delta bytes to a file: the floor of any export over this driver.
- **verify**: ``verify_bundle`` of that file (every record parsed, every event's leaf
  hash recomputed and decoded, the Merkle root, the signature, the blobs), against
  reading the same file and one SHA-256 per line: the floor of any check that hashes
  every event once; and ``verify_bundle(jobs=N)`` (``--jobs``, default 2: the event
  lines checked in parts in N processes), reported as its speed-up over one job.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from hashlib import sha256
from pathlib import Path
from typing import Any

from _common import (  # bench/ is sys.path[0] when run as `python bench/bundle.py`
    COLUMNS,
    Target,
    fresh_target,
    pick,
    start_run,
    timed,
)
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from rich.table import Table
from verify import build

import ledger
from ledger.bundle import verify_bundle, write_bundle

SCAN_BATCH = 10_000


def ours_export(store: ledger.Store, key: Ed25519PrivateKey, out: Path) -> None:
    write_bundle(store, out, key=key, origin="bench/bundle")


def baseline_export(target: Target, out: Path, n_events: int) -> None:
    conn = target.ledger_raw_connect()
    n = 0
    try:
        if target.backend == "sqlite":
            conn.execute("BEGIN")
            cur = conn.cursor()
        else:
            import psycopg

            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            cur = conn.cursor(name="evb_export")
            cur.itersize = SCAN_BATCH
        cur.execute(f"SELECT {COLUMNS} FROM events ORDER BY position")
        with open(out, "wb") as f:
            while rows := cur.fetchmany(SCAN_BATCH):
                for row in rows:
                    f.write(bytes(row[10]) + bytes(row[11]) + b"\n")
                n += len(rows)
        cur.close()
        conn.commit() if target.backend == "postgresql" else conn.execute("COMMIT")
    finally:
        conn.close()
    if n != n_events:
        raise RuntimeError(f"baseline exported {n} rows, expected {n_events}")


def ours_verify(path: Path, key: Ed25519PrivateKey, n_events: int, jobs: int = 1) -> None:
    report = verify_bundle(path, public_key=key.public_key(), jobs=jobs)
    if not report.ok or report.events != n_events:
        raise RuntimeError(f"bundle verify failed: {report.problems[:3]}")


def baseline_verify(path: Path) -> None:
    with open(path, "rb") as f:
        for line in f:
            sha256(line).digest()


def run_backend(target: Target, n: int, args: argparse.Namespace) -> dict[str, Any]:
    store = ledger.open(target.ledger_url)
    key = Ed25519PrivateKey.generate()
    with tempfile.TemporaryDirectory(prefix="evb-bundle-") as tmp:
        ours_out, raw_out = Path(tmp) / "ours.bundle", Path(tmp) / "raw.out"
        try:
            build(store, n)
            sides = {
                "export": lambda: ours_export(store, key, ours_out),
                "export_baseline": lambda: baseline_export(target, raw_out, n),
                "verify": lambda: ours_verify(ours_out, key, n),
                "verify_baseline": lambda: baseline_verify(ours_out),
                "verify_jobs": lambda: ours_verify(ours_out, key, n, args.jobs),
            }
            for fn in sides.values():  # warm-up, discarded
                fn()
            samples: dict[str, list[float]] = {name: [] for name in sides}
            for rep in range(args.repeat):
                order = list(sides) if rep % 2 == 0 else list(reversed(sides))
                for name in order:
                    samples[name].append(timed(sides[name]))
            size = os.path.getsize(ours_out)
        finally:
            store.close()
    t = {name: pick(s, args.stat) for name, s in samples.items()}
    return {
        "backend": target.backend,
        "events": n,
        "bundle_bytes": size,
        "export_s": round(t["export"], 3),
        "export_baseline_s": round(t["export_baseline"], 3),
        "export_ratio": round(t["export"] / t["export_baseline"], 2),
        "verify_s": round(t["verify"], 3),
        "verify_baseline_s": round(t["verify_baseline"], 3),
        "verify_ratio": round(t["verify"] / t["verify_baseline"], 2),
        "jobs": args.jobs,
        "verify_jobs_s": round(t["verify_jobs"], 3),
        "jobs_speedup": round(t["verify"] / t["verify_jobs"], 2),
        "samples_s": {name: [round(x, 4) for x in s] for name, s in samples.items()},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=100_000, help="ledger size")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each side")
    ap.add_argument("--jobs", type=int, default=2, help="processes for verify --jobs")
    run = start_run(ap, argv, None)
    args, out, backends, pg_url, info = run.args, run.out, run.backends, run.pg_url, run.info
    rows = []
    for backend in backends:
        with fresh_target(backend, pg_url or "") as target:
            rows.append(run_backend(target, args.events, args))
        out.print(f"{backend}: done")
    table = Table(
        title=f"bundle export and verify vs raw floors ({args.stat} of {args.repeat})",
        title_justify="left",
    )
    for col in (
        "backend",
        "events",
        "MB",
        "export s",
        "raw export s",
        "export/raw",
        "verify s",
        "hash-lines s",
        "verify/hash",
        "verify ev/s",
        "jobs",
        "verify --jobs s",
        "one job/jobs",
    ):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for r in rows:
        table.add_row(
            r["backend"],
            f"{r['events']:,}",
            f"{r['bundle_bytes'] / 1e6:.1f}",
            f"{r['export_s']:.2f}",
            f"{r['export_baseline_s']:.2f}",
            f"{r['export_ratio']:.1f}x",
            f"{r['verify_s']:.2f}",
            f"{r['verify_baseline_s']:.2f}",
            f"{r['verify_ratio']:.1f}x",
            f"{r['events'] / r['verify_s']:,.0f}",
            str(r["jobs"]),
            f"{r['verify_jobs_s']:.2f}",
            f"{r['jobs_speedup']:.2f}x",
        )
    out.print(table)
    if args.json:
        print(
            json.dumps(
                {
                    "machine": info,
                    "config": {
                        "events": args.events,
                        "repeat": args.repeat,
                        "stat": args.stat,
                        "jobs": args.jobs,
                    },
                    "results": rows,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
