"""Append a few evidence events with the Python API, then read and verify them.

    python examples/quickstart.py            # uses $EVIDENCE_DB or ./evidence.db
    evidence events && evidence verify

Until the plan verbs land (`evidence run`, `evidence demo`), this is the smallest
end-to-end use of the log: what a command handler does under the hood.
"""

from __future__ import annotations

import ledger
from ledger.events import Deviation, ExecuteEntered, GateChecked, PlanCreated, StrategyRecorded
from ledger.verify import verify_store


def main() -> None:
    store = ledger.open()  # EVIDENCE_DB, else sqlite:///evidence.db
    plan_id = f"demo-{store.head().size + 1}"
    stream = f"plan:{plan_id}"
    store.append(
        stream,
        [
            ledger.NewEvent(
                payload=PlanCreated(plan_id=plan_id, project="demo", resources=["repo:api"]),
                delta=[{"op": "add", "path": "", "value": {"phase": "strategize"}}],
            ),
            ledger.NewEvent(
                payload=StrategyRecorded(plan_id=plan_id, revision=0, strategy="fix the tests"),
                delta=[{"op": "add", "path": "/strategy", "value": "fix the tests"}],
            ),
            ledger.NewEvent(
                payload=ExecuteEntered(plan_id=plan_id, revision=0),
                delta=[{"op": "replace", "path": "/phase", "value": "execute"}],
            ),
        ],
        expected_version=ledger.NO_STREAM,
    )
    # An agent invented a parameter: the input gate records the deviation as data.
    raw_params = b'{"path": "src", "force": true}'
    digest = store.put_blob(raw_params)
    store.append(
        stream,
        [
            ledger.NewEvent(
                actor="gate",
                payload=GateChecked(
                    plan_id=plan_id,
                    gate="input",
                    tool="pytest",
                    verdict="fail",
                    deviations=[
                        Deviation(
                            pointer="/force",
                            kind="extra_field",
                            expected="no such property",
                            actual_type="boolean",
                        )
                    ],
                    attempt=1,
                    iteration=1,
                    strict_mode=False,
                    checked_sha256=digest,
                ),
                delta=[{"op": "replace", "path": "/iteration", "value": 1}],
            )
        ],
        expected_version=3,
    )
    for event in store.read_stream(stream):
        print(f"{event.position:>4}  {event.type:<24} {event.recorded_at}")
    report = verify_store(store)
    print(f"verify: {'ok' if report.ok else 'FAILED'} - tree head {report.size}:{report.root}")
    print(f"ledger: {store.url}")
    store.close()


if __name__ == "__main__":
    main()
