"""The read models of the plane: one projection per stream kind, and the analytics
aggregate.

Each keeps the current document of every stream of its kind (see ``documents``), with
a few columns extracted for queries (from the stream's state; None before it has one).
Bump a projection's version when its fold or columns change: it is rebuilt from the log
the next time the engine opens.
"""

from __future__ import annotations

import sqlalchemy as sa

from ledger import Store

from .analytics import ANALYTICS
from .engine import Progress, ProjectionEngine
from .outcomes import RULES_VERSION, fold_outcome
from .shapes import Column, Projection, ReadModel
from .states import given

TOOLS = Projection(
    name="tools",
    version=1,
    kind="tool",
    columns=(
        Column("kind", sa.String(16), lambda d: d and d.kind, index=True),
        Column("version", sa.Integer, lambda d: d and d.version),
        Column("mode", sa.String(16), lambda d: d and given(d.spec.mode)),
    ),
)

SKILLS = Projection(
    name="skills",
    version=1,
    kind="skill",
    columns=(Column("version", sa.Integer, lambda d: d and d.version),),
)

ATTACHMENTS = Projection(
    name="attachments",
    version=1,
    kind="attachment",
    columns=(
        Column("validation", sa.Text, lambda d: d and d.validation, index=True),
        Column("resource", sa.Text, lambda d: d and d.resource, index=True),
        Column("scope", sa.String(16), lambda d: d and d.scope),
        Column("project", sa.Text, lambda d: d and d.project),
        Column("plan", sa.Text, lambda d: d and d.plan),
        Column("status", sa.String(16), lambda d: d and d.status),
    ),
)

PLANS = Projection(
    name="plans",
    version=8,  # 2: gates; 3: runs; 4: decisions, tokens; 5: compensation; 6: attempts;
    # 7: binding set, outcome, needs_fix, unvalidated; folds total; 8: applying, applied
    kind="plan",
    columns=(
        Column("project", sa.Text, lambda d: d and d.project, index=True),
        Column("phase", sa.String(16), lambda d: d and d.phase),
    ),
)

OUTCOMES = Projection(
    name="outcomes",
    version=RULES_VERSION,  # new classification rules rebuild it: drift becomes visible
    kind="plan",
    columns=(
        Column("outcome", sa.String(24), lambda d: d and given(d.outcome)),
        Column("drift", sa.Boolean, lambda d: d and given(d.drift)),
    ),
    fold=fold_outcome,
)

APPROVERS = Projection(name="approvers", version=1, kind="approver")

# ANALYTICS is an aggregate over every plan (projections/analytics.py), not per stream.
ALL_PROJECTIONS: tuple[ReadModel, ...] = (
    TOOLS,
    SKILLS,
    ATTACHMENTS,
    PLANS,
    OUTCOMES,
    APPROVERS,
    ANALYTICS,
)


def open_projections(
    store: Store, progress: Progress | None = None, *, catch_up: bool = True
) -> ProjectionEngine:
    """The engine over all read models: created, rebuilt if changed, caught up (unless
    ``catch_up`` is False)."""
    return ProjectionEngine(store, ALL_PROJECTIONS).open(progress, catch_up=catch_up)
