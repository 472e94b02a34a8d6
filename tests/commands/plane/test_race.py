"""A command never reports a refusal for work it did: plane commands racing a plain
``Store.append`` writer answer from the log, not from a read model that lags behind."""

from __future__ import annotations

import threading

import ledger
from commands.plane import Plane
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from tests.helpers import invoke, strategy


def test_plane_commands_racing_a_raw_writer_report_what_they_did(db_url: str) -> None:
    stop = threading.Event()

    def raw_writer() -> None:
        with ledger.open(db_url) as store:
            i = 0
            while not stop.wait(0.002):  # a steady trickle, not a lock hog
                store.append(f"noise:{i}", [strategy(f"N-{i}")])  # not a plan stream
                i += 1

    with Plane.open(db_url) as plane:
        writer = threading.Thread(target=raw_writer)
        writer.start()
        try:
            for n in range(3):
                plan_id = f"cli-{n}"
                created = invoke(
                    "plan",
                    "create",
                    plan_id,
                    "--project",
                    "p",
                    "--resource",
                    "repo:api",
                    "--db",
                    db_url,
                )
                assert created.exit_code == 0, created.output
                doc = create_plan(plane, f"api-{n}", project="p", resources=["repo:api"])
                assert doc.plan_id == f"api-{n}"
                record_strategy(plane, f"api-{n}", "go")
                assert enter_execute(plane, f"api-{n}").phase == "execute"
                strategized = invoke(
                    "plan", "strategize", plan_id, "--strategy", "go", "--db", db_url
                )
                assert strategized.exit_code == 0, strategized.output
        finally:
            stop.set()
            writer.join()
