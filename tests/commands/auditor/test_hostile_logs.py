"""Readers are total: whatever well-formed catalog events an agent holding the database
appends through the public ``Store`` API, in whatever order, every reader shows what it
can and exits 0 (or 1 where its verdict says so) — never a traceback, never exit 2 for a
plan that is in the log. ``evidence audit`` is what reports such logs (its own tests).

The property draws every payload type of the catalog from its msgspec type information
(so a new event type is covered the day it is added), with ids from small pools so the
events refer to each other: a token consumed before it is minted, results of a run never
started, a decision on no escalation, a plan's events with no ``plan.created``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ledger
from commands.plane import Plane
from commands.plane.plans import create_plan
from ledger.events import (
    ALL_EVENT_TYPES,
    DecisionRecorded,
    EventPayload,
    PlanApplied,
    StrategyRecorded,
    TokenConsumed,
    ValidationResultRecorded,
    ValidationRunCompleted,
)
from projections.documents import delta, fold
from tests.conftest import IN_CI
from tests.helpers import invoke

PLAN = "P"
STREAMS = (
    f"plan:{PLAN}",
    "attachment:A1",
    "tool:v1",
    "approver:alice",
    "review:R1",
    "credential:C1",
)
DIGESTS = ("0" * 64, "ab" * 32)

# Ids from small pools, so that events refer to each other some of the time.
POOLS: dict[str, list[Any]] = {
    "plan_id": [PLAN, PLAN, PLAN, "Q"],
    "plan": [None, PLAN],
    "run_id": ["R1", "R2"],
    "token_id": ["T1", "T2"],
    "decision_id": ["D1", "D2"],
    "attachment_id": ["A1", "A2"],
    "task_id": ["R1"],
    "credential_id": ["C1", "C2"],
    "validation": ["v1", "v2"],
    "tool": ["v1", "t1"],
    "wraps": [None, "t1"],
    "approver": ["alice", "bob"],
    "fingerprint": ["F1", "F2"],
    "key_fingerprint": ["F1", "F2"],
    "project": ["proj", "other"],
    "resource": ["repo:a", "repo:b"],
    "step": [None, "s1", "s2"],
    "label": ["A", "B"],
}
# A field whose pool depends on the event type (the stream it names).
TYPE_POOLS: dict[tuple[str, str], list[Any]] = {
    ("approver_key.added", "name"): ["alice"],
    ("approver_key.revoked", "name"): ["alice", "bob"],
    ("tool.registered", "name"): ["v1", "t1"],
    ("validation.registered", "name"): ["v1", "v2"],
    ("skill.defined", "name"): ["s1"],
}

_SMALL_INT = st.integers(-1, 4)
_TEXT = st.text(max_size=8)
_JSON = st.recursive(
    st.none() | st.booleans() | _SMALL_INT | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=6,
)


def _for_type(t: msgspec.inspect.Type, field: str = "") -> st.SearchStrategy[Any]:
    """A strategy of values of msgspec type ``t`` that store and read back."""
    i = msgspec.inspect
    if isinstance(t, i.UnionType):
        return st.one_of(*(_for_type(member, field) for member in t.types))
    if isinstance(t, i.NoneType):
        return st.none()
    if field in POOLS:
        return st.sampled_from([v for v in POOLS[field] if v is not None] or [""])
    if isinstance(t, i.StrType):
        return st.sampled_from(DIGESTS) if field.endswith("sha256") else _TEXT
    if isinstance(t, i.BoolType):
        return st.booleans()
    if isinstance(t, i.IntType):
        low = t.ge if t.ge is not None else -1
        return st.integers(low, t.le if t.le is not None else max(low, 4))
    if isinstance(t, i.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, i.ListType):
        return st.lists(_for_type(t.item_type, field), max_size=2)
    if isinstance(t, i.DictType):
        return st.dictionaries(_TEXT, _for_type(t.value_type), max_size=2)
    if isinstance(t, i.StructType):
        return _struct(t)
    return _JSON  # Any


def _struct(info: msgspec.inspect.StructType, type_name: str = "") -> st.SearchStrategy[Any]:
    fields = {}
    for f in info.fields:
        pool = TYPE_POOLS.get((type_name, f.name))
        fields[f.name] = st.sampled_from(pool) if pool else _for_type(f.type, f.name)
    return st.builds(info.cls, **fields)


PAYLOADS = st.one_of(
    *(_struct(msgspec.inspect.type_info(cls), cls.type_name()) for cls in ALL_EVENT_TYPES)
)
# Mostly the stream the payload names; sometimes one of the others (a misfiled event).
EVENTS = st.tuples(PAYLOADS, st.one_of(st.none(), st.none(), st.sampled_from(STREAMS)))


def append_all(store: ledger.Store, events: list[tuple[EventPayload, str | None]]) -> None:
    """Append one by one, in order, each with the delta its stream's fold gives (as an
    agent forging through the public API would), so only the rules give them away."""
    docs: dict[str, dict[str, Any]] = {}
    for payload, misfiled in events:
        stream = misfiled or payload.default_stream()
        before = docs.get(stream, {})
        after = fold(stream, before, payload)
        store.append(
            stream, [ledger.NewEvent(payload=payload, actor="agent", delta=delta(before, after))]
        )
        docs[stream] = after


def assert_total(result: Result, what: str) -> None:
    """No exception escaped, no traceback, and a verdict's exit status at most."""
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        what,
        result.exception,
        result.output,
    )
    assert "Traceback" not in result.output, (what, result.output)
    assert result.exit_code in (0, 1), (what, result.exit_code, result.output)


def assert_unknown_plan(result: Result, what: str) -> None:
    assert result.exit_code == 2 and "Traceback" not in result.output, (what, result.output)
    assert result.stderr.strip().startswith("error: unknown plan"), (what, result.stderr)


def read_everything(url: str, out: Path) -> None:
    """Every reader, in process through the real entry point."""
    with ledger.open(url) as store:
        planned = bool(store.read_stream(f"plan:{PLAN}"))
    per_plan: list[tuple[str, ...]] = [
        ("replay", PLAN),
        ("plan", "show", PLAN),
        ("plan", "show", PLAN, "--json"),
        ("plan", "history", PLAN),
        ("plan", "history", PLAN, "--json"),
        ("report", PLAN, "--html", str(out / "report.html")),
    ]
    for args in per_plan:
        result = invoke(*args, "--db", url)
        (assert_total if planned else assert_unknown_plan)(result, " ".join(args))
    for args in (
        ("plan", "list"),
        ("plan", "list", "--json"),
        ("stats",),
        ("stats", "--json"),
        ("export", "--format", "jsonl", "--out", str(out / "log.jsonl")),
        ("export", "--format", "csv", "--out", str(out / "log.csv")),
        ("tail", "--from", "1"),
        ("events",),
        ("verify",),
    ):
        assert_total(invoke(*args, "--db", url), " ".join(args))


hostile = settings(
    max_examples=30,
    deadline=None,
    derandomize=IN_CI,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@hostile
@given(st.lists(EVENTS, min_size=1, max_size=12))
def test_every_reader_survives_any_sequence_of_catalog_events(
    events: list[tuple[EventPayload, str | None]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'hostile.db'}"
        with ledger.open(url, create=True) as store:
            append_all(store, events)
        read_everything(url, Path(tmp))


# -- the cases by name, on both backends ----------------------------------------------

NOW = "2026-01-01T00:00:00Z"


def _result(run_id: str = "R9") -> ValidationResultRecorded:
    return ValidationResultRecorded(
        plan_id=PLAN,
        run_id=run_id,
        attachment_id="A1",
        validation="v1",
        mode="required",
        verdict=False,
        message="no run",
        started_at=NOW,
        ended_at=NOW,
        duration_ms=3,
    )


def _decision() -> DecisionRecorded:
    return DecisionRecorded(
        plan_id=PLAN,
        decision_id="D9",
        choice="revise",
        guidance="again",
        escalation_hash="00" * 32,
        signed_at=NOW,
        approver="alice",
        key_fingerprint="F1",
        signature="AAAA",
    )


CASES: dict[str, Callable[[], list[EventPayload]]] = {
    "token consumed as the stream's first event": lambda: [
        TokenConsumed(plan_id=PLAN, token_id="T1")
    ],
    "applied with no token": lambda: [
        PlanApplied(plan_id=PLAN, token_id="T1", changed_paths=["a.py"])
    ],
    "results and completion of a run never started": lambda: [
        _result(),
        ValidationRunCompleted(
            plan_id=PLAN,
            run_id="R9",
            attempt=1,
            outcome="pass",
            rules_version=1,
            results_digest="00" * 32,
            vacuous=True,
        ),
    ],
    "a decision with no escalation": lambda: [_decision()],
    "a plan's events with no plan.created": lambda: [
        StrategyRecorded(plan_id=PLAN, revision=0, strategy="orphan"),
        _result(),
        TokenConsumed(plan_id=PLAN, token_id="T1"),
        _decision(),
        PlanApplied(plan_id=PLAN, token_id="T1"),
    ],
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_log_leaves_every_reader_working(db_url: str, tmp_path: Path, case: str) -> None:
    with ledger.open(db_url, create=True) as store:
        append_all(store, [(payload, None) for payload in CASES[case]()])
    read_everything(db_url, tmp_path)
    # What the log holds is shown: the plan by its id, every event in its history.
    shown = invoke("plan", "show", PLAN, "--db", db_url)
    assert shown.exit_code == 0 and shown.stdout.split()[:2] == ["plan", PLAN], shown.output
    history = invoke("plan", "history", PLAN, "--json", "--db", db_url)
    assert history.exit_code == 0, history.output
    assert [e["type"] for e in msgspec.json.decode(history.stdout)["events"]] == [
        p.type_name() for p in CASES[case]()
    ]
    listed = msgspec.json.decode(invoke("plan", "list", "--json", "--db", db_url).stdout)
    assert [p["plan_id"] for p in listed["plans"]] == [PLAN]


def test_a_hostile_log_and_real_plans_side_by_side(sqlite_url: str, tmp_path: Path) -> None:
    """A forged stream does not hide the plans next to it from list and stats."""
    with Plane.open(sqlite_url) as plane:
        create_plan(plane, "OK-1", project="api", resources=["repo:a"])
        append_all(
            plane.store,
            [(payload, None) for payload in CASES["a plan's events with no plan.created"]()],
        )
    listed = invoke("plan", "list", "--json", "--db", sqlite_url)
    assert listed.exit_code == 0, listed.output
    plans = msgspec.json.decode(listed.stdout)["plans"]
    # The forged stream has no plan document: it is listed by its id alone.
    assert [p["plan_id"] for p in plans] == ["OK-1", PLAN] and plans[1] == {"plan_id": PLAN}
    table = invoke("plan", "list", "--db", sqlite_url)
    assert table.exit_code == 0, table.output
    rows = [line.split() for line in table.stdout.splitlines()[1:]]
    assert rows == [
        ["OK-1", "api", "strategize", "0", "-", "-", "repo:a"],
        [PLAN, "-", "-", "-", "-", "-", "-"],
    ]
    only = msgspec.json.decode(
        invoke("plan", "list", "--project", "api", "--json", "--db", sqlite_url).stdout
    )["plans"]
    assert [p["plan_id"] for p in only] == ["OK-1"]
    stats = msgspec.json.decode(invoke("stats", "--json", "--db", sqlite_url).stdout)
    assert {p["plan"] for p in stats["plans"]} == {"OK-1", PLAN}
    read_everything(sqlite_url, tmp_path)


def test_the_report_names_what_a_forged_decision_breaks(sqlite_url: str, tmp_path: Path) -> None:
    with ledger.open(sqlite_url, create=True) as store:
        append_all(store, [(payload, None) for payload in CASES["a decision with no escalation"]()])
    out = tmp_path / "r.html"
    assert invoke("report", PLAN, "--html", str(out), "--db", sqlite_url).exit_code == 0
    decisions = out.read_text(encoding="utf-8").split('id="decisions"')[1]
    assert (
        '<span class="badge bad">broken: expected decision D9 follows its escalation' in decisions
    )
