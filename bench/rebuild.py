"""Projection rebuild and catch-up throughput, next to a plain read-all decode of the
same log and the eventsourcing peer replaying it.

    python bench/rebuild.py [--events N] [--repeat K] [--postgres URL] [--skip-postgres]
                            [--stat median|best] [--json] [--profile]

Builds a ledger of N events shaped like a plane's log (per plan: plan.created, then
strategy, execute and gate checks; one in ten plans adds an attachment; a few tool and
validation registrations), then times, in the same run, each repeat interleaved:

- floor: ``sum(1 for _ in store.read_all())`` — every event read and decoded;
- rebuild: ``ProjectionEngine.rebuild()`` of every read model — one pass over the log
  folding all projections, fresh tables filled, swapped in atomically;
- catch-up: ``ProjectionEngine.catch_up()`` of read models N events behind (every read
  model emptied and its position set to 0 before each timed run, untimed): what the first
  open of a ledger whose read models are behind does (read models that hold nothing are
  built as a rebuild builds them);
- in place: the same N events applied by ``apply_in_place``, catch-up's path for read
  models that hold something (each window read, its documents loaded from and upserted
  into the live tables): its cost per event of lag, the worst case (every document new);
- peer: eventsourcing (optional, the ``bench`` extra) replaying the same events from its
  application recorder (see ``replay_peer`` for exactly what is timed).

Reports events/s (log size / seconds) and the ratios to the read-all floor; the targets
are rebuild within 1.3x of the floor and catch-up no slower per event than rebuild.
"""

from __future__ import annotations

import argparse
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import msgspec
from _common import (  # bench/ is sys.path[0] when run as `python bench/rebuild.py`
    fresh_target,
    pick,
    print_profile,
    profile_top,
    start_run,
    timed,
)
from _peer import PEER_MISSING, PEER_VERSION, DomainEvent, Peer, open_peer
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
from projections.engine import POSITIONS

TARGET_RATIO = 1.3  # rebuild time / read-all time
EVENTS_PER_PLAN = 20
PAGE = 5_000  # events per read: the engine's CATCH_UP_BATCH, and the peer's page


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


# -- catch-up ---------------------------------------------------------------------------


def behind_by_everything(store: ledger.Store, engine: ProjectionEngine) -> None:
    """Every read model emptied and at position 0 (untimed): ``catch_up`` then applies
    the whole log, as the first open of a ledger whose read models are behind does."""
    with store.write() as tx:
        for p in engine.projections.values():
            for table in p.table_names().values():
                tx.execute(f"DELETE FROM {table}")
        tx.execute(f"UPDATE {POSITIONS} SET position = 0")


def timed_catch_up(store: ledger.Store, engine: ProjectionEngine) -> float:
    behind_by_everything(store, engine)
    return timed(engine.catch_up)


def timed_in_place(store: ledger.Store, engine: ProjectionEngine) -> float:
    behind_by_everything(store, engine)
    head = store.head().size
    return timed(lambda: engine.apply_in_place(1, head))


# -- the peer: eventsourcing -------------------------------------------------------------

if PEER_MISSING is None:

    class LedgerEventPeer(DomainEvent):
        """One of our events as an eventsourcing domain event: its stream as the
        originator (a UUID), its stream version as the originator version, its type
        and payload fields as attributes."""

        type: str
        data: dict[str, Any]


def fill_peer(recorder: Any, mapper: Any, store: ledger.Store) -> int:
    """Our log, event for event, into the peer's recorder (untimed)."""
    now = datetime.now(UTC)
    n = 0
    for batch in store.read_batches(batch_size=1000):
        stored = []
        for e in batch:
            data = msgspec.to_builtins(e.payload)
            data.pop("type", None)
            stored.append(
                mapper.to_stored_event(
                    LedgerEventPeer(
                        originator_id=uuid.uuid5(uuid.NAMESPACE_URL, e.stream),
                        originator_version=e.stream_version,
                        timestamp=now,
                        type=e.type,
                        data=data,
                    )
                )
            )
        recorder.insert_events(stored)
        n += len(stored)
    return n


def replay_peer(recorder: Any, mapper: Any) -> int:
    """What is timed for the peer: read the whole log through the application
    recorder's ``select_notifications`` in pages of ``PAGE``, decode each notification
    into its domain event with the mapper (JSON transcoder), and fold it into an
    in-memory dict (originator id -> version, count, last type). It writes no read
    model: the peer's read-and-decode floor with the lightest fold, so it flatters the
    peer against our rebuild (which also writes every read model's tables)."""
    state: dict[Any, tuple[int, int, str]] = {}
    start = 1
    n = 0
    while page := recorder.select_notifications(start, PAGE):
        for notification in page:
            event = mapper.to_domain_event(notification)
            previous = state.get(event.originator_id)
            state[event.originator_id] = (
                event.originator_version,
                1 if previous is None else previous[1] + 1,
                event.type,
            )
        n += len(page)
        start = page[-1].id + 1
    return n


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
            peer: Peer | None = None
            try:
                build(store, args.events)
                engine = ProjectionEngine(store, ALL_PROJECTIONS).open()
                n = store.head().size
                if PEER_MISSING is None:
                    peer = open_peer(target)
                    fill_peer(peer.recorder, peer.mapper, store)
                read: list[float] = []
                rebuild: list[float] = []
                catch_up: list[float] = []
                in_place: list[float] = []
                replay: list[float] = []
                for _ in range(args.repeat):  # interleaved: each repeat under one load
                    read.append(timed(lambda s=store: sum(1 for _ in s.read_all())))
                    rebuild.append(timed(engine.rebuild))
                    catch_up.append(timed_catch_up(store, engine))
                    in_place.append(timed_in_place(store, engine))
                    if peer is not None:
                        replay.append(timed(lambda p=peer: replay_peer(p.recorder, p.mapper)))
                if args.profile:
                    profiles[f"rebuild, {backend}"] = profile_top(engine.rebuild, args.profile_top)
                    behind_by_everything(store, engine)
                    profiles[f"catch-up, {backend}"] = profile_top(
                        engine.catch_up, args.profile_top
                    )
            finally:
                if peer is not None:
                    peer.close()
                store.close()
        read_s, rebuild_s, catch_up_s, in_place_s = (
            pick(x, args.stat) for x in (read, rebuild, catch_up, in_place)
        )
        replay_s = pick(replay, args.stat) if replay else None
        rows.append(
            {
                "backend": backend,
                "events": n,
                "read_all_events_per_s": round(n / read_s),
                "rebuild_events_per_s": round(n / rebuild_s),
                "catch_up_events_per_s": round(n / catch_up_s),
                "peer_replay_events_per_s": round(n / replay_s) if replay_s else None,
                "rebuild_vs_read_all": round(rebuild_s / read_s, 2),
                "catch_up_vs_read_all": round(catch_up_s / read_s, 2),
                "catch_up_vs_rebuild": round(catch_up_s / rebuild_s, 2),
                "in_place_events_per_s": round(n / in_place_s),
                "in_place_vs_rebuild": round(in_place_s / rebuild_s, 2),
                "peer_vs_read_all": round(replay_s / read_s, 2) if replay_s else None,
                "target_rebuild_vs_read_all": TARGET_RATIO,
                "met": rebuild_s / read_s <= TARGET_RATIO and catch_up_s <= rebuild_s,
                "read_all_samples_s": [round(x, 3) for x in read],
                "rebuild_samples_s": [round(x, 3) for x in rebuild],
                "catch_up_samples_s": [round(x, 3) for x in catch_up],
                "in_place_samples_s": [round(x, 3) for x in in_place],
                "peer_replay_samples_s": [round(x, 3) for x in replay],
            }
        )
        out.print(f"{backend}: done")

    table = Table(
        title=f"projection rebuild and catch-up vs read-all decode ({args.stat} of "
        f"{args.repeat}, interleaved)",
        title_justify="left",
    )
    for col in (
        "backend",
        "events",
        "read-all ev/s",
        "rebuild ev/s",
        "catch-up ev/s",
        "peer ev/s",
        "rebuild time / read",
        "catch-up time / read",
        "catch-up / rebuild",
        "in place / rebuild",
        "peer time / read",
        "met",
    ):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for r in rows:
        peer_rate = r["peer_replay_events_per_s"]
        table.add_row(
            r["backend"],
            f"{r['events']:,}",
            f"{r['read_all_events_per_s']:,}",
            f"{r['rebuild_events_per_s']:,}",
            f"{r['catch_up_events_per_s']:,}",
            f"{peer_rate:,}" if peer_rate else "not run",
            f"{r['rebuild_vs_read_all']:.2f}x",
            f"{r['catch_up_vs_read_all']:.2f}x",
            f"{r['catch_up_vs_rebuild']:.2f}x",
            f"{r['in_place_vs_rebuild']:.2f}x",
            f"{r['peer_vs_read_all']:.2f}x" if peer_rate else "-",
            "[green]yes[/]" if r["met"] else "[red]no[/]",
        )
    out.print(table)
    out.print(
        f"targets: rebuild time / read <= {TARGET_RATIO}x, catch-up / rebuild <= 1x; peer: "
        f"eventsourcing {PEER_VERSION} replay (bench/rebuild.py replay_peer says what is timed)"
    )
    if PEER_MISSING is not None:
        out.print(f"[yellow]peer not run: {PEER_MISSING}[/]")
    for what, top in profiles.items():
        print_profile(out, f"cProfile {what}", top)
    if args.json:
        info["eventsourcing"] = PEER_VERSION
        print(json.dumps({"machine": info, "results": rows, "profiles": profiles}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
