"""The analytics projection behind `evidence stats`: kept by the projection engine
(inline, catch-up, rebuild, version bump), equal to a one-pass fold of the log, and the
only thing `stats` reads."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

import msgspec
import sqlalchemy as sa

import ledger
from commands.auditor import analytics
from ledger import NewEvent, StreamAppend
from ledger.events import (
    Deviation,
    GateChecked,
    PlanApplied,
    PlanCreated,
    StrategyRevisionRequested,
)
from projections import ALL_PROJECTIONS, ProjectionEngine
from projections.analytics import ANALYTICS
from tests.commands.auditor.test_analytics import _run, _stats_ledger, stats_appends
from tests.helpers import run_cli


def one_pass_stats(
    store: ledger.Store, *, project: str | None = None, since: int = 1
) -> dict[str, Any]:
    """The test oracle: `stats` as it was before the projection, one streaming pass over
    the log (kept verbatim but for names, and the outcome vocabulary of seed 001: a
    plan's outcome is its last run's, overridden by a halt's type and cleared by a revise
    decision; an Apply is counted apart, unvalidated after a vacuous run). Its one
    documented difference: a flaky key needs the run to have started at or after
    ``since``."""
    head = store.head().size
    projects = {
        e.payload.plan_id: e.payload.project
        for e in store.read_all(1, to_position=head, types=["plan.created"])
    }
    runs: dict[str, dict[str, tuple[str, bytes, str]]] = {}
    durations: dict[str, list[int]] = {}
    counts: dict[str, Counter[str]] = {}
    flaky: dict[tuple[str, bytes, str], Counter[str]] = {}
    plans: dict[str, dict[str, Any]] = {}
    halts: Counter[str] = Counter()
    informational: Counter[str] = Counter()
    by_kind: Counter[str] = Counter()
    by_tool: Counter[str] = Counter()
    vacuous: dict[str, bool] = {}  # plan -> its last completed run had no required one
    for event in store.read_all(1, to_position=head):
        p = event.payload
        plan_id = getattr(p, "plan_id", None)
        if plan_id is None or not event.stream.startswith("plan:"):
            continue
        was_vacuous = vacuous.get(plan_id, False)
        if event.type == "validation.run_completed":
            vacuous[plan_id] = p.vacuous
        if event.position < since:
            continue
        if project is not None and projects.get(plan_id) != project:
            continue
        plan = plans.setdefault(
            plan_id,
            {
                "plan": plan_id,
                "project": projects.get(plan_id),
                "attempts": 0,
                "failed_attempts": 0,
                "strategy_revisions": 0,
                "outcome": None,
                "applied": None,
                "halt_type": None,
            },
        )
        t = event.type
        if t == "validation.run_started":
            plan["attempts"] = max(plan["attempts"], p.attempt)
            runs[p.run_id] = {
                a.attachment_id: (
                    a.validation,
                    msgspec.json.encode(a.args),
                    p.resource_digests.get(a.resource, ""),
                )
                for a in p.resolved
            }
        elif t == "validation.result_recorded":
            verdict = "no_verdict" if p.verdict is None else "pass" if p.verdict else "fail"
            counts.setdefault(p.validation, Counter())[verdict] += 1
            durations.setdefault(p.validation, []).append(p.duration_ms)
            key = runs.get(p.run_id, {}).get(p.attachment_id)
            if key is not None and verdict != "no_verdict":
                flaky.setdefault(key, Counter())[verdict] += 1
        elif t == "validation.run_completed":
            plan["outcome"] = p.outcome
            informational.update(p.informational_failures)
        elif t == "plan.attempt_failed":
            plan["failed_attempts"] += 1
        elif t == "plan.strategy_revision_requested":
            plan["strategy_revisions"] += 1
        elif t == "plan.halted":
            halts[p.halt_type] += 1
            plan["halt_type"] = plan["outcome"] = p.halt_type
        elif t == "plan.decision_recorded" and p.choice == "revise":
            plan["outcome"] = None
        elif t == "plan.applied":
            plan["applied"] = "unvalidated" if was_vacuous else "validated"
        elif t == "gate.checked":
            for d in p.deviations:
                by_kind[d.kind] += 1
                by_tool[p.tool] += 1
    validations = []
    for name in sorted(counts):
        c, d = counts[name], sorted(durations[name])
        n = sum(c.values())
        validations.append(
            {
                "validation": name,
                "runs": n,
                "pass": c["pass"],
                "fail": c["fail"],
                "no_verdict": c["no_verdict"],
                "pass_rate": c["pass"] / n,
                "no_verdict_rate": c["no_verdict"] / n,
                "mean_ms": sum(d) / len(d),
                "p95_ms": d[max(0, -(-95 * len(d) // 100) - 1)],
            }
        )
    return {
        "tree_size": head,
        "since": since,
        "project": project,
        "validations": validations,
        "flaky": [
            {
                "validation": v,
                "args": msgspec.json.decode(a),
                "input_digest": digest,
                "pass": c["pass"],
                "fail": c["fail"],
            }
            for (v, a, digest), c in sorted(flaky.items())
            if c["pass"] and c["fail"]
        ],
        "plans_by_outcome": dict(
            Counter(p["outcome"] for p in plans.values() if p["outcome"] is not None)
        ),
        "plans_without_outcome": sum(p["outcome"] is None for p in plans.values()),
        "plans_applied": sum(p["applied"] is not None for p in plans.values()),
        "plans_applied_unvalidated": sum(p["applied"] == "unvalidated" for p in plans.values()),
        "halts_by_type": dict(halts),
        "plans": sorted(plans.values(), key=lambda p: p["plan"]),
        "informational_failures": dict(informational),
        "deviations_by_kind": dict(by_kind),
        "deviations_by_tool": dict(by_tool),
    }


def _gate(plan: str, tool: str, *kinds: str) -> NewEvent:
    return NewEvent(
        payload=GateChecked(
            plan_id=plan,
            gate="output",
            tool=tool,
            verdict="fail" if kinds else "pass",
            attempt=1,
            iteration=1,
            strict_mode=False,
            checked_sha256="0" * 64,
            deviations=[
                Deviation(pointer=f"/{i}", kind=k, expected="x", actual_type="string")
                for i, k in enumerate(kinds)
            ],
        )
    )


def more_appends() -> list[list[StreamAppend]]:
    """Beyond the stats scenario: several plans in one append, a plan stream that began
    before its plan.created (a raw append can do that), a revision and an apply."""
    return [
        [
            StreamAppend("plan:H", [_gate("H", "fmt", "enum_mismatch")]),
            StreamAppend(
                "plan:G",
                [
                    NewEvent(
                        payload=StrategyRevisionRequested(
                            plan_id="G", revision=1, reason="again", failed_attempts=1
                        )
                    )
                ],
            ),
        ],
        [
            StreamAppend(
                "plan:H",
                [NewEvent(payload=PlanCreated(plan_id="H", project="px", resources=["repo:api"]))],
            )
        ],
        [
            StreamAppend(
                "plan:H",
                _run(
                    "H",
                    1,
                    {"lint": False, "style": False},
                    "d1",
                    {"lint": 70, "style": 1},
                    "blocker",
                ),
            )
        ],
        [StreamAppend("plan:G", [NewEvent(payload=PlanApplied(plan_id="G", token_id="T" * 26))])],
    ]


def scenario() -> list[list[StreamAppend]]:
    return stats_appends() + more_appends()


def _scenario(url: str) -> None:
    with ledger.open(url) as store:
        for append in scenario():
            store.append_batch(append)


def _rows(store: ledger.Store) -> dict[str, dict[str, Any]]:
    return ProjectionEngine(store, [ANALYTICS]).keyed_documents("analytics")


def test_stats_equal_the_one_pass_fold(db_url: str) -> None:
    _scenario(db_url)
    with ledger.open(db_url, create=False) as store:
        head = store.head().size
        for project in (None, "px", "other", "nobody"):
            assert analytics.stats(store, project=project) == one_pass_stats(
                store, project=project
            ), project
        report = analytics.stats(store)
        # Hand-checked, against a mistake both computations would share.
        assert report["tree_size"] == head
        # F: a pass, then a blocker halt; G: a pass, then Apply; H: a blocker.
        assert report["plans_by_outcome"] == {"blocker": 2, "pass": 1}
        assert (
            report["plans_applied"],
            report["plans_applied_unvalidated"],
            report["plans_without_outcome"],
        ) == (1, 0, 0)
        assert report["deviations_by_kind"] == {
            "extra_field": 1,
            "wrong_type": 1,
            "enum_mismatch": 1,
        }
        assert report["deviations_by_tool"] == {"deploy": 2, "fmt": 1}
        assert report["informational_failures"] == {"style": 2}
        h = next(p for p in report["plans"] if p["plan"] == "H")
        assert (h["project"], h["attempts"], h["outcome"]) == ("px", 1, "blocker")
        g = next(p for p in report["plans"] if p["plan"] == "G")
        assert (g["strategy_revisions"], g["outcome"], g["applied"]) == (1, "pass", "validated")
        # Every window: the same numbers as the one pass (flaky aside: see the oracle).
        for since in range(1, head + 2):
            got, want = analytics.stats(store, since=since), one_pass_stats(store, since=since)
            got.pop("flaky"), want.pop("flaky")
            assert got == want, since


def test_since_keeps_the_inputs_of_runs_started_before_it(db_url: str) -> None:
    _scenario(db_url)
    with ledger.open(db_url, create=False) as store:
        since = next(
            e.position
            for e in store.read_all()
            if e.type == "validation.result_recorded" and e.payload.run_id == "F-r2"
        )
        report = analytics.stats(store, since=since, project="px")
        # style passes in F-r2 (started before --since) and fails in H-r1, on the same
        # input d1 and args: flaky. The one pass did not know F-r2's input any more.
        assert report["flaky"] == [
            {
                "validation": "style",
                "args": {"level": 2},
                "input_digest": "d1",
                "pass": 1,
                "fail": 1,
            }
        ]
        assert one_pass_stats(store, since=since, project="px")["flaky"] == []
        assert [p["plan"] for p in report["plans"]] == ["F", "H"]
        assert report["halts_by_type"] == {"blocker": 1}


def test_incremental_equals_rebuild_equals_fold(db_url: str) -> None:
    """Appends applied inline, some behind the projection's back (caught up later),
    equal a rebuild from the log and the fold as of every position."""
    appends = scenario()
    with ledger.open(db_url) as store:
        engine = ProjectionEngine(store, [ANALYTICS]).open()
        seen: list[tuple[int, dict[str, Any]]] = []
        for i, append in enumerate(appends):
            if i % 3 == 2:
                store.append_batch(append)  # lags until the next catch-up
            else:
                engine.catch_up()
                with store.write() as tx:
                    engine.apply_inline(tx, tx.append_batch(append))
            seen.append((store.head().size, engine.keyed_documents("analytics")))
        engine.catch_up()
        incremental = engine.keyed_documents("analytics")
        assert {k.split("/")[0] for k in incremental} == {
            "plans",
            "plan_facts",
            "runs",
            "results",
            "deviations",
            "informational_failures",
        }
        assert incremental["plans/H"]["project"] == "px"
        # H's gate deviation came before plan.created: it got the project then.
        assert [
            r["project"]
            for k, r in incremental.items()
            if k.startswith("deviations/") and r["tool"] == "fmt"
        ] == ["px"]
        engine.rebuild(["analytics"])
        assert engine.keyed_documents("analytics") == incremental
        status = {s.name: s for s in engine.status()}
        assert status["analytics"].position == store.head().size
        assert engine.fold_as_of("analytics", store.head().size) == incremental
        for i, (position, rows) in enumerate(seen):
            if i % 3 != 2:  # current after each inline append (a lagging one is not)
                assert engine.fold_as_of("analytics", position) == rows, position
        names = set(sa.inspect(store.engine).get_table_names())
        assert not [n for n in names if "__rb_" in n or "__asof_" in n]


def test_stats_reads_the_projection_not_the_log(db_url: str) -> None:
    _scenario(db_url)
    with ledger.open(db_url, create=False) as store:
        assert analytics.stats(store)["validations"]
        with store.engine.begin() as conn:  # vandalise the facts: the log is untouched
            conn.execute(sa.text("DELETE FROM rm_analytics_results"))
        assert analytics.stats(store)["validations"] == []
        ProjectionEngine(store, [ANALYTICS]).rebuild(["analytics"])
        assert analytics.stats(store) == one_pass_stats(store)


def test_a_version_bump_rebuilds(db_url: str) -> None:
    _scenario(db_url)
    assert ANALYTICS in ALL_PROJECTIONS  # so every plane keeps it, like the others
    with ledger.open(db_url, create=False) as store:
        ProjectionEngine(store, [ANALYTICS]).open()
        before = _rows(store)
        with store.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM rm_analytics_plans"))
        bumped = dataclasses.replace(ANALYTICS, version=ANALYTICS.version + 1)
        engine = ProjectionEngine(store, [bumped]).open()
        (status,) = engine.status()
        assert (status.stored_version, status.lag) == (ANALYTICS.version + 1, 0)
        assert engine.keyed_documents("analytics") == before


def test_projections_status_and_rebuild_include_analytics(db_url: str) -> None:
    # Plans made as the handlers make them (the other read models fold these).
    _stats_ledger(db_url)
    status = run_cli("projections", "status", "--json", "--db", db_url)
    assert status.returncode == 0, status.stderr
    rows = {p["name"]: p for p in json.loads(status.stdout)["projections"]}
    with ledger.open(db_url, create=False) as store:
        head = store.head().size
    assert rows["analytics"]["version"] == ANALYTICS.version
    assert (rows["analytics"]["position"], rows["analytics"]["lag"]) == (head, 0)
    rebuilt = run_cli("projections", "rebuild", "analytics", "--json", "--db", db_url)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert json.loads(rebuilt.stdout)["rebuilt"] == [
        {"name": "analytics", "version": ANALYTICS.version, "position": head}
    ]
    stats = run_cli("stats", "--json", "--db", db_url)
    assert stats.returncode == 0, stats.stderr
    with ledger.open(db_url, create=False) as store:
        assert json.loads(stats.stdout) == json.loads(json.dumps(one_pass_stats(store)))


def test_demo_stats_match_the_one_pass(db_url: str) -> None:
    """The real plane (inline application through Plane.append) on the demo."""
    result = run_cli("demo", "--db", db_url)
    assert result.returncode == 0, result.stderr
    with ledger.open(db_url, create=False) as store:
        inline = _rows(store)
        assert any(k.startswith("results/") for k in inline)
        assert analytics.stats(store) == one_pass_stats(store)
        ProjectionEngine(store, [ANALYTICS]).rebuild()
        assert _rows(store) == inline
