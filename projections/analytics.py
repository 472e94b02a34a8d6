"""The analytics projection: fact tables over the plan streams, for ``evidence stats``.

An aggregate projection (see ``engine.AggregateProjection``): it spans every plan, so it
keeps rows, not one document per stream. Each table is ``rm_analytics_<part>``:

- ``plans``: one row per plan: ``project`` (from ``plan.created``), the first and last
  position of its events, and its totals: ``attempts`` (highest run attempt),
  ``failed_attempts``, ``strategy_revisions``, ``outcome`` (the plan's canonical outcome,
  as its document has it: the last run's, overridden by a halt's type, cleared by a
  ``revise`` decision; only the six values of seed 001, or null), ``halt_type``
  (canonical) and ``raw_halt_type`` of its last halt, ``unvalidated`` (1 when its last
  completed run had no required validation) and ``applied`` (``validated`` or
  ``unvalidated`` once applied, else null).
- ``plan_facts``: one row per lifecycle event (``run_started``, ``run_completed``,
  ``attempt_failed``, ``strategy_revision``, ``halted``, ``revised``, ``applied``) with
  its position, so totals over any ``--since`` window are one ``GROUP BY``.
- ``runs``: one row per attachment resolved for a validation run: validation, args
  (canonical JSON) and their SHA-256, the input digest (the resource's tree digest
  when the run started). State for ``results``; also a record of what ran.
- ``results``: one row per ``validation.result_recorded``: plan, project, validation,
  mode, verdict (``pass``/``fail``/``no_verdict``), duration, args and input digests.
- ``deviations``: one row per gate deviation: gate, tool, kind, pointer.
- ``informational_failures``: one row per informational failure named by a
  ``validation.run_completed`` (by construction, these never blocked).

Every fact row carries its log ``position`` (and the plan's ``project``), so a window
``position >= since`` and a project filter are plain ``WHERE`` clauses. Only plan-stream
events count. Bump ``VERSION`` when the tables or the step change: the engine then
rebuilds the projection from the log the next time it opens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from ledger import RecordedEvent
from ledger.canonical import canonical_json
from ledger import WriteTx

from .engine import AggregateProjection, Part

VERSION = 2  # 2: outcome as the plan document's (halts, revise), revised facts, applies
# validated or unvalidated

_TEXT = sa.Text()
_INT = sa.BigInteger()
_SHORT = sa.String(32)

PLAN_COLUMNS = ("plan", "project", "first_position", "last_position", "attempts",
                "failed_attempts", "strategy_revisions", "outcome", "halt_type",
                "raw_halt_type", "unvalidated", "applied")

PARTS = (
    Part("plans", (
        ("plan", _TEXT), ("project", _TEXT), ("first_position", _INT),
        ("last_position", _INT), ("attempts", _INT), ("failed_attempts", _INT),
        ("strategy_revisions", _INT), ("outcome", _SHORT), ("halt_type", _SHORT),
        ("raw_halt_type", _TEXT), ("unvalidated", _INT), ("applied", _SHORT),
    ), primary_key=("plan",), indexes=(("project",), ("last_position",))),
    Part("plan_facts", (
        ("position", _INT), ("plan", _TEXT), ("project", _TEXT), ("fact", _SHORT),
        ("attempt", _INT), ("value", _SHORT), ("raw_value", _TEXT),
    ), primary_key=("position",), indexes=(("plan",), ("fact",))),
    Part("runs", (
        ("run_id", _TEXT), ("attachment_id", _TEXT), ("plan", _TEXT),
        ("validation", _TEXT), ("args", _TEXT), ("args_digest", sa.String(64)),
        ("input_digest", _TEXT),
    ), primary_key=("run_id", "attachment_id")),
    Part("results", (
        ("position", _INT), ("plan", _TEXT), ("project", _TEXT), ("run_id", _TEXT),
        ("attachment_id", _TEXT), ("validation", _TEXT), ("mode", _SHORT),
        ("verdict", _SHORT), ("duration_ms", _INT), ("args", _TEXT),
        ("args_digest", sa.String(64)), ("input_digest", _TEXT),
    ), primary_key=("position",), indexes=(("validation",), ("project",))),
    Part("deviations", (
        ("position", _INT), ("seq", _INT), ("plan", _TEXT), ("project", _TEXT),
        ("gate", _SHORT), ("tool", _TEXT), ("kind", _SHORT), ("pointer", _TEXT),
    ), primary_key=("position", "seq"), indexes=(("project",),)),
    Part("informational_failures", (
        ("position", _INT), ("seq", _INT), ("plan", _TEXT), ("project", _TEXT),
        ("run_id", _TEXT), ("validation", _TEXT),
    ), primary_key=("position", "seq")),
)

_FACT_TABLES = ("plan_facts", "results", "deviations", "informational_failures")


def verdict_label(verdict: bool | None) -> str:
    return "no_verdict" if verdict is None else "pass" if verdict else "fail"


def _insert(tx: WriteTx, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]
            ) -> None:
    tx.executemany(f"INSERT INTO {table} ({', '.join(columns)}) "
                   f"VALUES ({', '.join([tx.ph] * len(columns))})", rows)


def _upsert(tx: WriteTx, table: str, columns: Sequence[str], key: Sequence[str],
            rows: list[tuple[Any, ...]]) -> None:
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
    tx.executemany(f"INSERT INTO {table} ({', '.join(columns)}) "
                   f"VALUES ({', '.join([tx.ph] * len(columns))}) "
                   f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}", rows)


def apply(tx: WriteTx, t: Mapping[str, str], events: Sequence[RecordedEvent]) -> None:
    """Add the facts of ``events`` to the tables ``t`` (part -> physical name)."""
    relevant = [e for e in events if e.stream.startswith("plan:")
                and getattr(e.payload, "plan_id", None) is not None]
    if not relevant:
        return  # most appends outside plans cost nothing here
    ph = tx.ph
    plans: dict[str, dict[str, Any]] = {}
    touched = list(dict.fromkeys(e.payload.plan_id for e in relevant))
    for i in range(0, len(touched), 500):  # a few statements per batch, not one per plan
        chunk = touched[i:i + 500]
        for found in tx.query(f"SELECT {', '.join(PLAN_COLUMNS)} FROM {t['plans']} "
                              f"WHERE plan IN ({', '.join([ph] * len(chunk))})", chunk):
            plans[found[0]] = dict(zip(PLAN_COLUMNS, found, strict=True))
    runs: dict[tuple[str, str], tuple[str, str, str]] = {}  # resolved in this batch
    new_runs: list[tuple[Any, ...]] = []
    facts: list[tuple[Any, ...]] = []
    results: list[tuple[Any, ...]] = []
    deviations: list[tuple[Any, ...]] = []
    informational: list[tuple[Any, ...]] = []
    late_projects: list[tuple[str, str]] = []
    for event in relevant:
        p, kind, position = event.payload, event.type, event.position
        plan_id = p.plan_id
        plan = plans.get(plan_id)
        if plan is None:
            plan = plans[plan_id] = dict.fromkeys(PLAN_COLUMNS)
            plan.update(plan=plan_id, first_position=position, attempts=0,
                        failed_attempts=0, strategy_revisions=0, unvalidated=0)
        plan["last_position"] = position
        if kind == "plan.created" and plan["project"] is None:
            plan["project"] = p.project
            if position != plan["first_position"]:
                late_projects.append((p.project, plan_id))  # facts recorded before it
        project = plan["project"]
        if kind == "validation.run_started":
            plan["attempts"] = max(plan["attempts"], p.attempt)
            facts.append((position, plan_id, project, "run_started", p.attempt, None, None))
            for a in p.resolved:
                args = canonical_json(a.args).decode()
                key = (args, hashlib.sha256(args.encode()).hexdigest(),
                       p.resource_digests.get(a.resource, ""))
                runs[(p.run_id, a.attachment_id)] = key
                new_runs.append((p.run_id, a.attachment_id, plan_id, a.validation, *key))
        elif kind == "validation.result_recorded":
            key = runs.get((p.run_id, p.attachment_id))
            if key is None:
                found = tx.query(
                    f"SELECT args, args_digest, input_digest FROM {t['runs']} "
                    f"WHERE run_id = {ph} AND attachment_id = {ph}",
                    (p.run_id, p.attachment_id))
                key = found[0] if found else (None, None, None)
            results.append((position, plan_id, project, p.run_id, p.attachment_id,
                            p.validation, p.mode, verdict_label(p.verdict), p.duration_ms,
                            *key))
        elif kind == "validation.run_completed":
            plan["outcome"], plan["unvalidated"] = p.outcome, int(p.vacuous)
            facts.append((position, plan_id, project, "run_completed", p.attempt, p.outcome,
                          None))
            informational.extend((position, seq, plan_id, project, p.run_id, name)
                                 for seq, name in enumerate(p.informational_failures))
        elif kind == "plan.attempt_failed":
            plan["failed_attempts"] += 1
            facts.append((position, plan_id, project, "attempt_failed", p.attempt, None,
                          None))
        elif kind == "plan.strategy_revision_requested":
            plan["strategy_revisions"] += 1
            facts.append((position, plan_id, project, "strategy_revision", None, None, None))
        elif kind == "plan.halted":
            plan["halt_type"], plan["raw_halt_type"] = p.halt_type, p.raw_halt_type
            plan["outcome"] = p.halt_type  # a halt's type is the plan's canonical outcome
            facts.append((position, plan_id, project, "halted", p.attempt, p.halt_type,
                          p.raw_halt_type))
        elif kind == "plan.decision_recorded" and p.choice == "revise":
            plan["outcome"] = None  # back to Strategize: no outcome until the next run
            facts.append((position, plan_id, project, "revised", None, None, None))
        elif kind == "plan.applied":
            plan["applied"] = "unvalidated" if plan["unvalidated"] else "validated"
            facts.append((position, plan_id, project, "applied", None, plan["applied"],
                          None))
        elif kind == "gate.checked":
            deviations.extend((position, seq, plan_id, project, p.gate, p.tool, d.kind,
                               d.pointer) for seq, d in enumerate(p.deviations))
    _upsert(tx, t["runs"], ("run_id", "attachment_id", "plan", "validation", "args",
                            "args_digest", "input_digest"), ("run_id", "attachment_id"),
            new_runs)
    _insert(tx, t["plan_facts"], ("position", "plan", "project", "fact", "attempt", "value",
                                  "raw_value"), facts)
    _insert(tx, t["results"], ("position", "plan", "project", "run_id", "attachment_id",
                               "validation", "mode", "verdict", "duration_ms", "args",
                               "args_digest", "input_digest"), results)
    _insert(tx, t["deviations"], ("position", "seq", "plan", "project", "gate", "tool",
                                  "kind", "pointer"), deviations)
    _insert(tx, t["informational_failures"], ("position", "seq", "plan", "project",
                                              "run_id", "validation"), informational)
    _upsert(tx, t["plans"], PLAN_COLUMNS, ("plan",),
            [tuple(plan[c] for c in PLAN_COLUMNS) for plan in plans.values()])
    for project, plan_id in late_projects:
        # A plan stream that began without plan.created (only raw appends do that): its
        # earlier facts, in this batch or before, get the project as a rebuild gives it.
        for part in _FACT_TABLES:
            tx.execute(f"UPDATE {t[part]} SET project = {ph} "
                       f"WHERE plan = {ph} AND project IS NULL", (project, plan_id))


ANALYTICS = AggregateProjection(name="analytics", version=VERSION, parts=PARTS, apply=apply)
