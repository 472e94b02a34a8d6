"""Property: for random valid command sequences, the incremental read models equal a
full rebuild, equal the pure fold as of every position; and every stream rebuilt from
its deltas alone equals its fold."""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ledger
from commands.plane import Plane
from commands.plane.attachments import attach, detach
from commands.plane.core import StreamState
from commands.plane.plans import create_plan
from ledger.events import StrategyRecorded, ValidationRegistered
from projections.documents import apply_deltas, delta, fold, fold_all, to_json
from tests.conftest import _pg_base_url

LEVEL_SCHEMA = {
    "type": "object",
    "properties": {"level": {"type": "integer"}},
    "additionalProperties": False,
}

command = st.one_of(
    st.tuples(st.just("plan"), st.integers(0, 3), st.sampled_from(["api", "web"])),
    st.tuples(
        st.just("validation"), st.integers(0, 2), st.sampled_from(["required", "informational"])
    ),
    st.tuples(
        st.just("attach"),
        st.integers(0, 2),
        st.sampled_from(["repo:a", "repo:b"]),
        st.sampled_from(["direct", "project", "plan"]),
        st.sampled_from([{}, {"level": 1}]),
        st.integers(0, 3),
    ),
    st.tuples(st.just("detach"), st.integers(0, 30)),
    st.tuples(st.just("behind"), st.integers(0, 3)),  # appended without inline update
)


@contextlib.contextmanager
def fresh_url(backend: str) -> Iterator[str]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{Path(tmp) / 'p.db'}"
        return
    base = _pg_base_url()
    name = f"evp_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base)
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
    try:
        yield (
            sa.engine.make_url(base)
            .update_query_dict({"options": f"-csearch_path={name}"})
            .render_as_string(hide_password=False)
        )
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{name}" CASCADE')
        admin.dispose()


def _run(plane: Plane, step: tuple, attachments: list[str], plans: list[str]) -> None:
    kind = step[0]
    if kind == "plan":
        plan_id = f"P-{step[1]}"
        if plan_id not in plans:
            create_plan(plane, plan_id, project=step[2], resources=["repo:a", "repo:b"])
            plans.append(plan_id)
    elif kind == "validation":
        name, mode = f"v{step[1]}", step[2]
        state = plane.state(f"tool:{name}")
        if (state.doc.spec.mode if state.doc is not None else None) != mode:
            plane.append(
                state,
                [
                    ValidationRegistered(
                        name=name,
                        version=state.version + 1,
                        mode=mode,
                        executor="command",
                        command=["true"],
                        input_schema=LEVEL_SCHEMA,
                    )
                ],
            )
    elif kind == "attach":
        _, v, resource, scope, args, which = step
        if plane.state(f"tool:v{v}").exists:
            project = "api" if which % 2 else "web"
            plan = plans[which % len(plans)] if plans else None
            if scope == "plan" and plan is None:
                return
            doc = attach(
                plane,
                f"v{v}",
                resource=resource,
                args=args,
                project=project if scope == "project" else None,
                plan=plan if scope == "plan" else None,
            )
            attachments.append(doc.attachment_id)
    elif kind == "detach":
        if attachments:
            target = attachments[step[1] % len(attachments)]
            if plane.state(f"attachment:{target}").doc.status == "attached":
                detach(plane, target)
    elif kind == "behind" and plans:
        plan_id = plans[step[1] % len(plans)]
        state = plane.state(f"plan:{plan_id}")
        payload = StrategyRecorded(plan_id=plan_id, revision=0, strategy=f"s{state.version}")
        # A writer that does not update the read models: they lag until caught up.
        plane.store.append(
            state.stream,
            [
                ledger.NewEvent(
                    payload=payload, delta=delta(state.doc, fold(state.stream, state.doc, payload))
                )
            ],
            state.version,
        )


def _documents(plane: Plane) -> dict[str, dict[str, dict]]:
    engine = plane.projections
    return {name: engine.keyed_documents(name) for name in engine.projections}


def _check(backend: str, steps: list[tuple]) -> None:
    with fresh_url(backend) as url, Plane.open(url) as plane:
        attachments: list[str] = []
        plans: list[str] = []
        seen: list[tuple[int, dict]] = []
        for step in steps:
            _run(plane, step, attachments, plans)
            plane.projections.catch_up()
            seen.append((plane.store.head().size, _documents(plane)))
        incremental = _documents(plane)
        plane.projections.rebuild()
        assert _documents(plane) == incremental  # incremental == full rebuild
        for position, documents in seen:  # == the pure fold as of every position
            for name, docs in documents.items():
                assert plane.projections.fold_as_of(name, position) == docs, (name, position)
        streams: dict[str, list[ledger.RecordedEvent]] = {}
        for event in plane.store.read_all():
            streams.setdefault(event.stream, []).append(event)
        for stream, events in streams.items():  # deltas alone == the fold
            assert apply_deltas(e.delta for e in events) == to_json(
                fold_all(stream, [e.payload for e in events])
            ), stream


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(command, min_size=1, max_size=20))
def test_sqlite(steps: list[tuple]) -> None:
    _check("sqlite", steps)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(command, min_size=1, max_size=15))
def test_postgresql(steps: list[tuple]) -> None:
    _check("postgresql", steps)


def test_state_of_an_unknown_stream_is_empty(sqlite_url: str) -> None:
    with Plane.open(sqlite_url) as plane:
        state = plane.state("plan:nobody")
        assert isinstance(state, StreamState) and not state.exists and state.doc is None
