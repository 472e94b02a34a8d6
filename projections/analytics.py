"""The analytics projection: fact tables over the plan streams, for ``evidence stats``.

An aggregate projection (see ``engine.AggregateProjection``): it spans every plan, so it
keeps rows, not one document per stream. Each table is ``rm_analytics_<part>``:

- ``plans``: one row per plan: ``project`` (from ``plan.created``), the first and last
  position of its events, and its totals: ``attempts`` (highest run attempt),
  ``failed_attempts``, ``strategy_revisions``, ``outcome`` (the plan's canonical outcome,
  as its document has it: the last run's, overridden by a halt's type, cleared by a
  ``revise`` decision; only the six canonical outcomes, or null), ``halt_type``
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from ledger import WriteTx
from ledger.canonical import canonical_json
from ledger.events import (
    AttemptFailed,
    DecisionRecorded,
    GateChecked,
    PlanApplied,
    PlanCreated,
    PlanHalted,
    StrategyRevisionRequested,
    ValidationResultRecorded,
    ValidationRunCompleted,
    ValidationRunStarted,
)

from .folding import Steps
from .shapes import AggregateProjection, Folded, Part, insert_rows

VERSION = 2  # 2: outcome as the plan document's (halts, revise), revised facts, applies
# validated or unvalidated

_TEXT = sa.Text()
_INT = sa.BigInteger()
_SHORT = sa.String(32)

PLAN_COLUMNS = (
    "plan",
    "project",
    "first_position",
    "last_position",
    "attempts",
    "failed_attempts",
    "strategy_revisions",
    "outcome",
    "halt_type",
    "raw_halt_type",
    "unvalidated",
    "applied",
)

PARTS = (
    Part(
        "plans",
        (
            ("plan", _TEXT),
            ("project", _TEXT),
            ("first_position", _INT),
            ("last_position", _INT),
            ("attempts", _INT),
            ("failed_attempts", _INT),
            ("strategy_revisions", _INT),
            ("outcome", _SHORT),
            ("halt_type", _SHORT),
            ("raw_halt_type", _TEXT),
            ("unvalidated", _INT),
            ("applied", _SHORT),
        ),
        primary_key=("plan",),
        indexes=(("project",), ("last_position",)),
    ),
    Part(
        "plan_facts",
        (
            ("position", _INT),
            ("plan", _TEXT),
            ("project", _TEXT),
            ("fact", _SHORT),
            ("attempt", _INT),
            ("value", _SHORT),
            ("raw_value", _TEXT),
        ),
        primary_key=("position",),
        indexes=(("plan",), ("fact",)),
    ),
    Part(
        "runs",
        (
            ("run_id", _TEXT),
            ("attachment_id", _TEXT),
            ("plan", _TEXT),
            ("validation", _TEXT),
            ("args", _TEXT),
            ("args_digest", sa.String(64)),
            ("input_digest", _TEXT),
        ),
        primary_key=("run_id", "attachment_id"),
    ),
    Part(
        "results",
        (
            ("position", _INT),
            ("plan", _TEXT),
            ("project", _TEXT),
            ("run_id", _TEXT),
            ("attachment_id", _TEXT),
            ("validation", _TEXT),
            ("mode", _SHORT),
            ("verdict", _SHORT),
            ("duration_ms", _INT),
            ("args", _TEXT),
            ("args_digest", sa.String(64)),
            ("input_digest", _TEXT),
        ),
        primary_key=("position",),
        indexes=(("validation",), ("project",)),
    ),
    Part(
        "deviations",
        (
            ("position", _INT),
            ("seq", _INT),
            ("plan", _TEXT),
            ("project", _TEXT),
            ("gate", _SHORT),
            ("tool", _TEXT),
            ("kind", _SHORT),
            ("pointer", _TEXT),
        ),
        primary_key=("position", "seq"),
        indexes=(("project",),),
    ),
    Part(
        "informational_failures",
        (
            ("position", _INT),
            ("seq", _INT),
            ("plan", _TEXT),
            ("project", _TEXT),
            ("run_id", _TEXT),
            ("validation", _TEXT),
        ),
        primary_key=("position", "seq"),
    ),
)

_FACT_TABLES = ("plan_facts", "results", "deviations", "informational_failures")


def verdict_label(verdict: bool | None) -> str:
    return "no_verdict" if verdict is None else "pass" if verdict else "fail"


# part -> column -> its type (what ``insert_rows`` sends each column's values as)
_TYPES: dict[str, dict[str, sa.types.TypeEngine[Any]]] = {
    part.name: dict(part.columns) for part in PARTS
}


def _typed(part: str, columns: Sequence[str]) -> list[tuple[str, sa.types.TypeEngine[Any]]]:
    return [(c, _TYPES[part][c]) for c in columns]


def _insert(
    tx: WriteTx,
    t: Mapping[str, str],
    part: str,
    columns: Sequence[str],
    rows: list[tuple[Any, ...]],
) -> None:
    insert_rows(tx, t[part], _typed(part, columns), rows)


def _upsert(
    tx: WriteTx,
    t: Mapping[str, str],
    part: str,
    columns: Sequence[str],
    key: Sequence[str],
    rows: list[tuple[Any, ...]],
) -> None:
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
    at = [columns.index(c) for c in key]
    # The last row of each key, as upserting them one by one would leave it (one
    # multi-row statement may not update a row twice).
    last = {tuple(row[i] for i in at): row for row in rows}
    insert_rows(
        tx,
        t[part],
        _typed(part, columns),
        list(last.values()),
        f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}",
    )


@dataclass
class _Batch:
    """The rows one ``apply`` call adds, gathered by the steps before they are written."""

    tx: WriteTx
    t: Mapping[str, str]
    runs: dict[tuple[str, str], tuple[str, str, str]] = field(default_factory=dict)
    new_runs: list[tuple[Any, ...]] = field(default_factory=list)
    facts: list[tuple[Any, ...]] = field(default_factory=list)
    results: list[tuple[Any, ...]] = field(default_factory=list)
    deviations: list[tuple[Any, ...]] = field(default_factory=list)
    informational: list[tuple[Any, ...]] = field(default_factory=list)


# (the batch, the plan's row, its project, the event's position, the payload)
Step = Callable[[_Batch, dict[str, Any], Any, int, Any], None]
_STEPS: Steps[Step] = Steps()
on = _STEPS.register


@on(ValidationRunStarted)
def _run_started(
    b: _Batch, plan: dict[str, Any], project: Any, position: int, p: ValidationRunStarted
) -> None:
    plan["attempts"] = max(plan["attempts"], p.attempt)
    b.facts.append((position, p.plan_id, project, "run_started", p.attempt, None, None))
    for a in p.resolved:
        args = canonical_json(a.args).decode()
        key = (
            args,
            hashlib.sha256(args.encode()).hexdigest(),
            p.resource_digests.get(a.resource, ""),
        )
        b.runs[(p.run_id, a.attachment_id)] = key
        b.new_runs.append((p.run_id, a.attachment_id, p.plan_id, a.validation, *key))


@on(ValidationResultRecorded)
def _result(
    b: _Batch, plan: dict[str, Any], project: Any, position: int, p: ValidationResultRecorded
) -> None:
    key = b.runs.get((p.run_id, p.attachment_id))
    if key is None:
        ph = b.tx.ph
        found = b.tx.query(
            f"SELECT args, args_digest, input_digest FROM {b.t['runs']} "
            f"WHERE run_id = {ph} AND attachment_id = {ph}",
            (p.run_id, p.attachment_id),
        )
        key = found[0] if found else (None, None, None)
    b.results.append(
        (
            position,
            p.plan_id,
            project,
            p.run_id,
            p.attachment_id,
            p.validation,
            p.mode,
            verdict_label(p.verdict),
            p.duration_ms,
            *key,
        )
    )


@on(ValidationRunCompleted)
def _run_completed(
    b: _Batch, plan: dict[str, Any], project: Any, position: int, p: ValidationRunCompleted
) -> None:
    plan["outcome"], plan["unvalidated"] = p.outcome, int(p.vacuous)
    b.facts.append((position, p.plan_id, project, "run_completed", p.attempt, p.outcome, None))
    b.informational.extend(
        (position, seq, p.plan_id, project, p.run_id, name)
        for seq, name in enumerate(p.informational_failures)
    )


@on(AttemptFailed)
def _attempt_failed(
    b: _Batch, plan: dict[str, Any], project: Any, position: int, p: AttemptFailed
) -> None:
    plan["failed_attempts"] += 1
    b.facts.append((position, p.plan_id, project, "attempt_failed", p.attempt, None, None))


@on(StrategyRevisionRequested)
def _revision(
    b: _Batch, plan: dict[str, Any], project: Any, position: int, p: StrategyRevisionRequested
) -> None:
    plan["strategy_revisions"] += 1
    b.facts.append((position, p.plan_id, project, "strategy_revision", None, None, None))


@on(PlanHalted)
def _halted(b: _Batch, plan: dict[str, Any], project: Any, position: int, p: PlanHalted) -> None:
    plan["halt_type"], plan["raw_halt_type"] = p.halt_type, p.raw_halt_type
    plan["outcome"] = p.halt_type  # a halt's type is the plan's canonical outcome
    b.facts.append(
        (position, p.plan_id, project, "halted", p.attempt, p.halt_type, p.raw_halt_type)
    )


@on(DecisionRecorded)
def _decided(
    b: _Batch, plan: dict[str, Any], project: Any, position: int, p: DecisionRecorded
) -> None:
    if p.choice == "revise":
        plan["outcome"] = None  # back to Strategize: no outcome until the next run
        b.facts.append((position, p.plan_id, project, "revised", None, None, None))


@on(PlanApplied)
def _applied(b: _Batch, plan: dict[str, Any], project: Any, position: int, p: PlanApplied) -> None:
    plan["applied"] = "unvalidated" if plan["unvalidated"] else "validated"
    b.facts.append((position, p.plan_id, project, "applied", None, plan["applied"], None))


@on(GateChecked)
def _gate_checked(
    b: _Batch, plan: dict[str, Any], project: Any, position: int, p: GateChecked
) -> None:
    b.deviations.extend(
        (position, seq, p.plan_id, project, p.gate, p.tool, d.kind, d.pointer)
        for seq, d in enumerate(p.deviations)
    )


def apply(tx: WriteTx, t: Mapping[str, str], events: Sequence[Folded]) -> None:
    """Add the facts of ``events`` to the tables ``t`` (part -> physical name)."""
    relevant = [
        e
        for e in events
        if e.stream.startswith("plan:") and getattr(e.payload, "plan_id", None) is not None
    ]
    if not relevant:
        return  # most appends outside plans cost nothing here
    touched = list(dict.fromkeys(e.payload.plan_id for e in relevant))  # type: ignore[attr-defined]
    plans = _known_plans(tx, t, touched)
    b = _Batch(tx, t)
    late_projects: list[tuple[str, str]] = []
    for event in relevant:
        p, position = event.payload, event.position
        plan_id = p.plan_id  # type: ignore[attr-defined]
        plan = plans.get(plan_id)
        if plan is None:
            plan = plans[plan_id] = dict.fromkeys(PLAN_COLUMNS)
            plan.update(
                plan=plan_id,
                first_position=position,
                attempts=0,
                failed_attempts=0,
                strategy_revisions=0,
                unvalidated=0,
            )
        plan["last_position"] = position
        if isinstance(p, PlanCreated) and plan["project"] is None:
            plan["project"] = p.project
            if position != plan["first_position"]:
                late_projects.append((p.project, plan_id))  # facts recorded before it
        step = _STEPS.lookup(type(p))
        if step is not None:
            step(b, plan, plan["project"], position, p)
    _write_batch(tx, t, b, plans)
    ph = tx.ph
    for project, plan_id in late_projects:
        # A plan stream that began without plan.created (only raw appends do that): its
        # earlier facts, in this batch or before, get the project as a rebuild gives it.
        for part in _FACT_TABLES:
            tx.execute(
                f"UPDATE {t[part]} SET project = {ph} WHERE plan = {ph} AND project IS NULL",
                (project, plan_id),
            )


def _known_plans(
    tx: WriteTx, t: Mapping[str, str], touched: list[str]
) -> dict[str, dict[str, Any]]:
    """The rows of the plans ``touched`` already has, by plan."""
    ph = tx.ph
    plans: dict[str, dict[str, Any]] = {}
    for i in range(0, len(touched), 500):  # a few statements per batch, not one per plan
        chunk = touched[i : i + 500]
        for found in tx.query(
            f"SELECT {', '.join(PLAN_COLUMNS)} FROM {t['plans']} "
            f"WHERE plan IN ({', '.join([ph] * len(chunk))})",
            chunk,
        ):
            plans[found[0]] = dict(zip(PLAN_COLUMNS, found, strict=True))
    return plans


def _write_batch(
    tx: WriteTx, t: Mapping[str, str], b: _Batch, plans: dict[str, dict[str, Any]]
) -> None:
    """The rows a batch gathered, and every plan it touched, written."""
    _upsert(
        tx,
        t,
        "runs",
        ("run_id", "attachment_id", "plan", "validation", "args", "args_digest", "input_digest"),
        ("run_id", "attachment_id"),
        b.new_runs,
    )
    _insert(
        tx,
        t,
        "plan_facts",
        ("position", "plan", "project", "fact", "attempt", "value", "raw_value"),
        b.facts,
    )
    _insert(
        tx,
        t,
        "results",
        (
            "position",
            "plan",
            "project",
            "run_id",
            "attachment_id",
            "validation",
            "mode",
            "verdict",
            "duration_ms",
            "args",
            "args_digest",
            "input_digest",
        ),
        b.results,
    )
    _insert(
        tx,
        t,
        "deviations",
        ("position", "seq", "plan", "project", "gate", "tool", "kind", "pointer"),
        b.deviations,
    )
    _insert(
        tx,
        t,
        "informational_failures",
        ("position", "seq", "plan", "project", "run_id", "validation"),
        b.informational,
    )
    _upsert(
        tx,
        t,
        "plans",
        PLAN_COLUMNS,
        ("plan",),
        [tuple(plan[c] for c in PLAN_COLUMNS) for plan in plans.values()],
    )


ANALYTICS = AggregateProjection(name="analytics", version=VERSION, parts=PARTS, step=apply)
