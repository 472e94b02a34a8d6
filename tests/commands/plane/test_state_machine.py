"""No bypass, as a state machine: random interleavings of every plane verb an agent, an
operator and a human can run, and of well-formed appends written around the plane, on a
real SQLite file and on the real PostgreSQL (a fresh database for every run).

After every step:

1. every plan the *plane* applied was applied with a token whose ``plan.token_minted``
   names a run with a real passing result for every required member of the plan's pinned
   binding set (at least one, unless the plan opted out), every raw output of that run
   in the blob store, and — if the plan was ever escalated — a revise decision by a
   registered approver before that run;
2. ``audit`` finds nothing on a plan nobody forged, and finds every forged append that
   breaks a rule at that append's position;
3. no plane call raises anything but ``CommandRefused``, and a refused call appends
   nothing.

The attacker's appends (``tests.helpers.forge``): a decision with a random signature, a
token minted/consumed/applied with a random signature (after a forged passing run, or
naming the plan's last run), Execute entered with an empty binding set, a strategy
revision, an escalate halt with no pending decision, and a replay of the plane's last
passing run with its genuine token signature under a fresh run id.

Bounds: ``MAX_EXAMPLES`` runs per backend of at most ``STEPS`` steps each; under
``CI=true`` the runs are derandomized (the same examples every time) and no example
database is kept; elsewhere each run of the file explores new examples.

The machine found that a token minted before an escalation survived the human's revise
(``test_a_token_minted_before_an_escalation_is_not_applied_after_it`` below keeps it
fixed): every halt, escalation, decision, revision and new Execute now supersedes it.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from ulid import ULID

from commands.auditor.audit import audit
from commands.plane import CommandRefused, Plane
from commands.plane.attachments import attach, detach
from commands.plane.lifecycle import (
    add_approver_key,
    apply_plan,
    authorize,
    record_fix,
    results_digest,
    revoke_approver,
)
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool, register_validation
from commands.plane.runs import call_tool, record_halt
from commands.plane.validation_runs import validate_plan
from commands.rules.signing import load_or_create_plane_key, mint_token
from ledger import RecordedEvent
from ledger.events import (
    ApproverKeyAdded,
    DecisionRecorded,
    Escalated,
    EventPayload,
    ExecuteEntered,
    PlanApplied,
    PlanHalted,
    ResolvedAttachment,
    StrategyRevisionRequested,
    TokenConsumed,
    TokenMinted,
    ValidationResultRecorded,
    ValidationRunCompleted,
    ValidationRunStarted,
)
from ledger.keys import fingerprint, generate_key_pair, load_private_key
from ledger.timestamps import rfc3339
from projections.documents import Document, fold_all
from projections.resolution import pin_binding
from tests.conftest import IN_CI, PG_ENV
from tests.helpers import STATUS_CHECK, forge, status_plan, work

# Runs per backend (an SQLite run takes ~0.3 s, a PostgreSQL run ~1.5 s on 2 cores).
MAX_EXAMPLES = {"sqlite": 80, "postgresql": 30}
STEPS = 20

SETTINGS = settings(
    stateful_step_count=STEPS,
    deadline=None,
    derandomize=IN_CI,
    database=None if IN_CI else settings.default.database,
    suppress_health_check=[HealthCheck.too_slow],
)

VALIDATIONS = ("v0", "v1")
MODES = ("required", "informational")
TOOLS = ("edit", "ghost", "invented")  # a real command, a missing program, never registered
RAW_HALTS = (
    "needs_decision",
    "escalated",
    "timeout",
    "validation_failed",
    "something-unknown",
    "program_missing",
)
OTHER_RESOURCE = "repo:other"  # not a directory: a validation on it sees an empty tree
PLAN_IDS = ("P-0", "P-1", "P-2")
APPROVERS = ("alice", "bob")  # registered; mallory never is
FORGERIES = (
    "decision",
    "apply_chain",
    "empty_binding",
    "revision",
    "escalate_halt",
    "replayed_pass",
)

configs = st.fixed_dictionaries(
    {
        "retry_limit": st.integers(0, 2),
        "max_strategy_revisions": st.integers(0, 1),
    },
    optional={"require_validation": st.booleans()},
)
maybe_configs = st.one_of(st.none(), configs)  # None: the defaults (3 retries, 1 revision)
indices = st.integers(0, 9)  # see NoBypass.plan
signatures = st.binary(min_size=64, max_size=64).map(lambda b: base64.b64encode(b).decode())


def _pg_admin_url() -> str:
    return os.environ[PG_ENV].replace("postgresql://", "postgresql+psycopg://", 1)


@contextlib.contextmanager
def _pg_schema() -> Iterator[str]:
    """A URL whose search_path is a fresh, empty schema (as the ``pg_url`` fixture)."""
    base = _pg_admin_url()
    name = f"evsm_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base)
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
        yield (
            sa.engine.make_url(base)
            .update_query_dict({"options": f"-csearch_path={name}"})
            .render_as_string(hide_password=False)
        )
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        admin.dispose()


def _payloads(events: list[RecordedEvent]) -> list[EventPayload]:
    return [e.payload for e in events]


class _Expected(msgspec.Struct, frozen=True):
    """A forged append that breaks a rule: audit must report it at its position (with
    one of ``invariants`` among the violations there, when that is known)."""

    plan_id: str
    position: int
    invariants: frozenset[str]
    what: str


class NoBypass(RuleBasedStateMachine):
    """One run: a fresh ledger, a project directory whose required validation passes
    only while ``status.txt`` says good, approvers alice and bob, and the attacker."""

    def __init__(self, backend: str) -> None:
        super().__init__()
        self._stack = contextlib.ExitStack()
        try:
            self._open(backend)
        except BaseException:
            self._stack.close()
            raise

    def _open(self, backend: str) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="evidence-sm-"))
        self._stack.callback(shutil.rmtree, self.work, True)
        url = (
            f"sqlite:///{self.work / 'evidence.db'}"
            if backend == "sqlite"
            else self._stack.enter_context(_pg_schema())
        )
        self.plane = self._stack.enter_context(Plane.open(url))
        self.store = self.plane.store
        self.plane_key = load_or_create_plane_key(self.store.url).public_key()
        self.project = self.work / "proj"
        self.project.mkdir()
        (self.project / "status.txt").write_text("bad\n")
        self.check = self.work / "check.py"
        self.check.write_text(STATUS_CHECK)
        self.keys: dict[str, Path] = {}
        self.fingerprints: dict[str, str] = {}
        for name in (*APPROVERS, "mallory"):
            generate_key_pair(self.work / f"{name}.key")
            self.keys[name] = self.work / f"{name}.key"
            self.fingerprints[name] = fingerprint(load_private_key(self.keys[name]))
        for name in APPROVERS:
            add_approver_key(self.plane, name, self.work / f"{name}.key.pub")
        self.revoked_at: dict[str, int] = {}  # approver -> first position it is revoked
        self.other_key = load_private_key(self.keys["mallory"])  # not the plane key
        self.plans: list[str] = []
        self.attachments: list[str] = []
        self.tokens: dict[str, list[str]] = {}  # plan -> every token the plane handed out
        self.forged: set[str] = set()  # plans that received a forged append
        self.forged_positions: set[int] = set()
        self.expected: list[_Expected] = []

    def teardown(self) -> None:
        """The whole audit once more, with every read model against a fresh fold."""
        try:
            self.audit_finds_forgeries_and_only_forgeries(read_models=True)
            for plan_id in self.plans:
                types = [
                    e.type for e in self.events(plan_id) if e.position not in self.forged_positions
                ]
                for t in (
                    "plan.applied",
                    "plan.escalated",
                    "plan.decision_recorded",
                    "plan.strategy_revision_requested",
                    "plan.token_minted",
                ):
                    if t in types:
                        event(f"plan with {t} by the plane")
        finally:
            self._stack.close()

    # -- helpers ----------------------------------------------------------------------

    def call(self, step: Callable[[], Any], *, must_refuse: bool = False, what: str = "") -> Any:
        """A plane call: ``CommandRefused`` is a legitimate answer that appends nothing;
        any other exception fails the run (it propagates)."""
        before = self.store.head().size
        try:
            result = step()
        except CommandRefused as exc:
            assert self.store.head().size == before, "a refused command appended events"
            if what:
                event(f"{what}: refused ({type(exc).__name__})")
            return None
        assert not must_refuse, "the plane accepted what it must refuse"
        if what:
            event(f"{what}: done")
        return result

    def plan(self, pick: int) -> str:
        """Mostly the first plan nobody forged yet (deeper histories), sometimes the last
        one, sometimes any plan, forged or not."""
        live = [p for p in self.plans if p not in self.forged] or self.plans
        if pick < 7:
            return live[0]
        if pick == 7:
            return live[-1]
        return self.plans[pick % len(self.plans)]

    def events(self, plan_id: str) -> list[RecordedEvent]:
        return self.store.read_stream(f"plan:{plan_id}")

    def doc(self, plan_id: str) -> Document:
        """The plan folded from its stream, unchecked (a forged plan too)."""
        return fold_all(f"plan:{plan_id}", _payloads(self.events(plan_id)))

    def past_the_plane(self, plan_id: str, *payloads: EventPayload) -> list[int]:
        positions = forge(self.store, f"plan:{plan_id}", *payloads)
        self.forged.add(plan_id)
        self.forged_positions.update(positions)
        return positions

    def expect(self, plan_id: str, position: int, what: str, *invariants: str) -> None:
        event(f"forged: {what}")
        self.expected.append(_Expected(plan_id, position, frozenset(invariants), what))

    # -- setup --------------------------------------------------------------------------

    @initialize(
        mode=st.sampled_from(["required"] * 4 + ["informational"]),
        config=configs,
        scope=st.sampled_from(["direct"] * 3 + ["plan"] * 2 + ["none"]),
        advance=st.booleans(),
        good=st.integers(0, 2).map(lambda n: n == 0),
    )
    def setup(self, mode: str, config: dict | None, scope: str, advance: bool, good: bool) -> None:
        self.work_on_the_project(good)
        self.register_validation("v0", mode, 5)
        self.register_tool("edit")
        self.create_plan(config, False)
        if scope != "none":
            self.attach("v0", scope, 0, True)
        if advance:
            self.record_strategy(0)
            self.enter_execute(0)

    # -- the operator: registry and attachments -----------------------------------------

    @rule(
        name=st.sampled_from(VALIDATIONS),
        mode=st.sampled_from(MODES),
        timeout=st.sampled_from([5, 10]),
    )
    def register_validation(self, name: str, mode: str, timeout: int) -> None:
        self.call(
            lambda: register_validation(
                self.plane,
                {
                    "name": name,
                    "mode": mode,
                    "timeout": timeout,
                    "command": [sys.executable, str(self.check)],
                },
            )
        )

    @rule(name=st.sampled_from(TOOLS[:2]))
    def register_tool(self, name: str) -> None:
        command = (
            [sys.executable, "-c", "print('{{}}')"]
            if name == "edit"
            else [str(self.work / "no-such-program")]
        )
        self.call(
            lambda: register_tool(
                self.plane,
                {
                    "name": name,
                    "command": command,
                    "timeout": 10,
                    "output_schema": {"type": "object"},
                },
            )
        )

    @rule(
        validation=st.sampled_from(VALIDATIONS),
        scope=st.sampled_from(["direct", "plan"]),
        plan=indices,
        on_project=st.integers(0, 3).map(bool),
    )
    def attach(self, validation: str, scope: str, plan: int, on_project: bool) -> None:
        resource = str(self.project) if on_project else OTHER_RESOURCE
        plan_id = self.plan(plan) if scope == "plan" and self.plans else None
        done = self.call(lambda: attach(self.plane, validation, resource=resource, plan=plan_id))
        if done is not None:
            self.attachments.append(done.attachment_id)

    @precondition(lambda self: self.attachments)
    @rule(which=indices)
    def detach(self, which: int) -> None:
        attachment = self.attachments[which % len(self.attachments)]
        self.call(lambda: detach(self.plane, attachment, reason="in the way"))

    @precondition(lambda self: "bob" not in self.revoked_at)
    @rule()
    def revoke_bob(self) -> None:
        if self.call(lambda: revoke_approver(self.plane, "bob", reason="left")) is not None:
            self.revoked_at["bob"] = next(
                e.position
                for e in self.store.read_stream("approver:bob")
                if e.type != ApproverKeyAdded.type_name()
            )

    # -- the agent: plans, work, validation, Apply ----------------------------------------

    @precondition(lambda self: len(self.plans) < len(PLAN_IDS))
    @rule(config=maybe_configs, two_resources=st.booleans())
    def create_plan(self, config: dict | None, two_resources: bool) -> None:
        plan_id = PLAN_IDS[len(self.plans)]
        resources = [str(self.project), *([OTHER_RESOURCE] if two_resources else [])]
        if (
            self.call(
                lambda: create_plan(
                    self.plane, plan_id, project="api", resources=resources, config=config
                )
            )
            is not None
        ):
            self.plans.append(plan_id)
            self.tokens[plan_id] = []

    @precondition(lambda self: self.plans)
    @rule(plan=indices)
    def record_strategy(self, plan: int) -> None:
        self._strategy(self.plan(plan))

    def _strategy(self, plan_id: str) -> None:
        self.call(
            lambda: record_strategy(self.plane, plan_id, "make the status good"), what="strategy"
        )

    @precondition(lambda self: self.plans)
    @rule(plan=indices)
    def enter_execute(self, plan: int) -> None:
        self._execute(self.plan(plan))

    def _execute(self, plan_id: str) -> None:
        self.call(lambda: enter_execute(self.plane, plan_id), what="execute")

    @precondition(lambda self: self.plans)
    @rule(
        plan=indices,
        upto=st.sampled_from(["execute", "validate", "apply"]),
        human=st.booleans(),
        good=st.integers(0, 2).map(bool),
    )
    def drive(self, plan: int, upto: str, human: bool, good: bool) -> None:
        """The happy path as far as it goes: alice revises a pending escalation (with
        ``human``), then the agent records a strategy, enters Execute, works on the
        project (``good`` or not), records a fix when one is due, validates and applies
        (each step one plane call, refused or not)."""
        plan_id = self.plan(plan)
        pending = self.doc(plan_id).pending_decision
        if human and pending:
            self.call(
                lambda: authorize(
                    self.plane,
                    pending.decision_id,
                    self.keys["alice"],
                    choice="revise",
                    guidance="try another way",
                ),
                what="authorize (alice, driving)",
            )
        if self.doc(plan_id).phase == "strategize":
            self._strategy(plan_id)
            self._execute(plan_id)
        if upto == "execute":
            return
        self.work_on_the_project(good)
        if self.doc(plan_id).needs_fix:
            self._fix(plan_id)
        self._validate(plan_id)
        if upto == "apply":
            self._apply_last(plan_id)

    @rule(good=st.booleans())
    def work_on_the_project(self, good: bool) -> None:
        # The agent works in each plan's sandbox; the project is what later plans copy.
        sandboxes = [
            copy for p in self.plans for copy in self.plane.sandbox(self.doc(p)).existing().values()
        ]
        for folder in [self.project, *sandboxes]:
            (folder / "status.txt").write_text("good\n" if good else "bad\n")

    @precondition(lambda self: self.plans)
    @rule(plan=indices)
    def validate(self, plan: int) -> None:
        self._validate(self.plan(plan))

    def _validate(self, plan_id: str) -> None:
        report = self.call(lambda: validate_plan(self.plane, plan_id), what="validate")
        if report is not None:
            event(f"validate: {report.outcome} ({report.raw_halt_type})")
        if report is not None and report.token:
            self.tokens[plan_id].append(report.token)

    @precondition(lambda self: self.plans)
    @rule(plan=indices)
    def record_fix(self, plan: int) -> None:
        self._fix(self.plan(plan))

    def _fix(self, plan_id: str) -> None:
        self.call(
            lambda: record_fix(self.plane, plan_id, "changed the status", diff=b"-bad\n+good\n")
        )

    @precondition(lambda self: self.plans)
    @rule(plan=indices, raw=st.sampled_from(RAW_HALTS), terminal=st.integers(0, 4))
    def record_halt(self, plan: int, raw: str, terminal: int) -> None:
        plan_id = self.plan(plan)
        self.call(
            lambda: record_halt(
                self.plane, plan_id, raw, "the orchestrator stopped", terminal=terminal == 0
            ),
            what=f"halt {raw}",
        )

    @precondition(lambda self: self.plans)
    @rule(plan=indices, tool=st.sampled_from(TOOLS), good_params=st.integers(0, 3).map(bool))
    def call_tool(self, plan: int, tool: str, good_params: bool) -> None:
        plan_id = self.plan(plan)
        params = b"{}" if good_params else b'{"path": 1}'
        self.call(lambda: call_tool(self.plane, plan_id, tool, params), what="call")

    @precondition(lambda self: any(self.tokens.values()))
    @rule(plan=indices)
    def apply_with_the_last_token(self, plan: int) -> None:
        self._apply_last(self.plan(plan))

    def _apply_last(self, plan_id: str) -> None:
        if not self.tokens[plan_id]:
            return
        self.call(lambda: apply_plan(self.plane, plan_id, self.tokens[plan_id][-1]), what="apply")

    @precondition(lambda self: self.plans)
    @rule(
        plan=indices,
        kind=st.sampled_from(["older", "other_plan", "altered", "wrong_key", "garbage"]),
        which=indices,
    )
    def apply_with_a_stale_or_forged_token(self, plan: int, kind: str, which: int) -> None:
        plan_id = self.plan(plan)
        mine = self.tokens[plan_id]
        others = [t for p, ts in self.tokens.items() if p != plan_id for t in ts]
        token = "evidence-token.garbage.garbage"
        if kind == "older" and len(mine) > 1:
            token = mine[:-1][which % (len(mine) - 1)]
        elif kind == "other_plan" and others:
            token = others[which % len(others)]
        elif kind == "altered" and mine:
            prefix, claims, signature = mine[-1].split(".")
            i = which % len(claims)
            swapped = "A" if claims[i] != "A" else "B"
            token = ".".join([prefix, claims[:i] + swapped + claims[i + 1 :], signature])
        elif kind == "wrong_key":
            token = self._token_signed_by_another_key(plan_id)
        self.call(
            lambda: apply_plan(self.plane, plan_id, token), must_refuse=True, what=f"apply {kind}"
        )

    def _token_signed_by_another_key(self, plan_id: str) -> str:
        """The claims of the plan's current token (or plausible ones), signed by a key
        that is not the plane's."""
        minted = [e.payload for e in self.events(plan_id) if isinstance(e.payload, TokenMinted)]
        now = datetime.now(UTC)
        if minted:
            m = minted[-1]
            claims = {
                "token_id": m.token_id,
                "attempt": m.attempt,
                "results_digest": m.results_digest,
            }
        else:
            claims = {
                "token_id": str(ULID()),
                "attempt": max(self.doc(plan_id).attempt, 1),
                "results_digest": "0" * 64,
            }
        return mint_token(
            self.other_key,
            plan_id=plan_id,
            issued_at=rfc3339(now),
            expires_at=rfc3339(now + timedelta(minutes=30)),
            **claims,
        )

    # -- the human: decisions ---------------------------------------------------------------

    @precondition(lambda self: self.plans)
    @rule(
        plan=indices,
        who=st.sampled_from([*APPROVERS, "mallory"]),
        choice=st.sampled_from(["revise", "abandon"]),
        aim=st.integers(0, 5),
    )
    def authorize(self, plan: int, who: str, choice: str, aim: int) -> None:
        """A decision on the plan's pending escalation (mostly), on an escalation already
        decided, or on one that never was; by alice, bob (maybe revoked) or mallory."""
        docs = {p: self.doc(p) for p in self.plans}
        waiting = [p for p in self.plans if docs[p].pending_decision]
        plan_id = waiting[plan % len(waiting)] if waiting and aim else self.plan(plan)
        pending = docs[plan_id].pending_decision
        decided = [
            e.payload.decision_id
            for e in self.events(plan_id)
            if isinstance(e.payload, DecisionRecorded)
        ]
        if pending is not None and aim > 1:
            decision_id = pending.decision_id
        elif decided and aim % 2:
            decision_id = decided[-1]  # a decided escalation stays decided
        else:
            decision_id = str(ULID())  # never escalated
        refuse = (
            who == "mallory"
            or who in self.revoked_at
            or pending is None
            or decision_id != pending.decision_id
        )
        self.call(
            lambda: authorize(
                self.plane, decision_id, self.keys[who], choice=choice, guidance="try another way"
            ),
            must_refuse=refuse,
            what=f"authorize ({'must refuse' if refuse else 'may pass'})",
        )

    # -- the attacker: appends around the plane -----------------------------------------------

    @precondition(lambda self: self.plans)
    @rule(
        kind=st.sampled_from(FORGERIES),
        plan=indices,
        who=st.sampled_from(APPROVERS),
        choice=st.sampled_from(["revise", "abandon"]),
        with_run=st.booleans(),
        signature=signatures,
    )
    def forge_around_the_plane(
        self, kind: str, plan: int, who: str, choice: str, with_run: bool, signature: str
    ) -> None:
        """The attacker appends well-formed events with correct deltas through the store
        (``tests.helpers.forge``), past the plane."""
        plan_id = self.plan(plan)
        if kind == "decision":
            self._forge_a_decision(plan_id, who, choice, signature)
        elif kind == "apply_chain":
            self._forge_an_apply_chain(plan_id, with_run, signature)
        elif kind == "empty_binding":
            self._forge_an_empty_binding_set(plan_id)
        elif kind == "revision":
            self._forge_a_strategy_revision(plan_id)
        elif kind == "escalate_halt":
            self._forge_an_escalate_halt(plan_id)
        elif self.tokens[plan_id]:
            self._forge_a_replayed_pass(plan_id)
        else:
            self._forge_an_apply_chain(plan_id, with_run, signature)

    def _forge_a_decision(self, plan_id: str, who: str, choice: str, signature: str) -> None:
        events = self.events(plan_id)
        pending = self.doc(plan_id).pending_decision
        decision_id = pending.decision_id if pending else str(ULID())
        leaf = next(
            (
                e.leaf_hash.hex()
                for e in events
                if isinstance(e.payload, Escalated) and e.payload.decision_id == decision_id
            ),
            "0" * 64,
        )
        [at] = self.past_the_plane(
            plan_id,
            DecisionRecorded(
                plan_id=plan_id,
                decision_id=decision_id,
                choice=choice,
                guidance="just go" if choice == "revise" else None,
                escalation_hash=leaf,
                signed_at=rfc3339(datetime.now(UTC)),
                approver=who,
                key_fingerprint=self.fingerprints[who],
                signature=signature,
            ),
        )
        self.expect(
            plan_id,
            at,
            "a decision with a random signature",
            *(["decision_signature"] if pending else []),
        )

    def _forge_an_apply_chain(self, plan_id: str, with_run: bool, signature: str) -> None:
        """A token minted, consumed and applied past the plane (after a forged passing
        run over the plan's binding set, or naming its last run)."""
        doc = self.doc(plan_id)
        attempt = max(doc.attempt, 1)
        chain: list[EventPayload] = []
        if with_run:
            run_id = str(ULID())
            binding = [msgspec.convert(b, ResolvedAttachment) for b in doc.binding]
            now = rfc3339(datetime.now(UTC))
            results = [
                ValidationResultRecorded(
                    plan_id=plan_id,
                    run_id=run_id,
                    attachment_id=b.attachment_id,
                    validation=b.validation,
                    mode=b.mode,
                    verdict=True,
                    started_at=now,
                    ended_at=now,
                    duration_ms=0,
                )
                for b in binding
            ]
            digest = results_digest(results)
            chain += [
                ValidationRunStarted(
                    plan_id=plan_id,
                    run_id=run_id,
                    attempt=attempt,
                    revision=doc.revision,
                    resolved=binding,
                ),
                *results,
                ValidationRunCompleted(
                    plan_id=plan_id,
                    run_id=run_id,
                    attempt=attempt,
                    outcome="pass",
                    rules_version=2,
                    results_digest=digest,
                    vacuous=not any(b.mode == "required" for b in binding),
                ),
            ]
        else:
            run_id = doc.last_run or str(ULID())
            digest = next(
                (
                    e.payload.results_digest
                    for e in self.events(plan_id)
                    if isinstance(e.payload, ValidationRunCompleted) and e.payload.run_id == run_id
                ),
                "0" * 64,
            )
        token_id = str(ULID())
        issued = datetime.now(UTC)
        chain += [
            TokenMinted(
                plan_id=plan_id,
                token_id=token_id,
                token_sha256="0" * 64,
                attempt=attempt,
                run_id=run_id,
                results_digest=digest,
                issued_at=rfc3339(issued),
                expires_at=rfc3339(issued + timedelta(hours=1)),
                signature=signature,
            ),
            TokenConsumed(plan_id=plan_id, token_id=token_id),
            PlanApplied(plan_id=plan_id, token_id=token_id),
        ]
        positions = self.past_the_plane(plan_id, *chain)
        self.expect(plan_id, positions[-3], "a token not signed by the plane key")

    def _forge_an_empty_binding_set(self, plan_id: str) -> None:
        doc = self.doc(plan_id)
        pinned = [msgspec.convert(b, ResolvedAttachment) for b in doc.binding]
        expected = pin_binding(pinned, self.plane.log().applicable(doc))
        legal = (
            doc.phase == "strategize"
            and bool(doc.strategy)
            and doc.terminal is None
            and doc.pending_decision is None
        )
        [at] = self.past_the_plane(plan_id, ExecuteEntered(plan_id=plan_id, revision=doc.revision))
        if not legal:
            self.expect(plan_id, at, "Execute entered where it cannot be", "illegal_transition")
        elif expected:
            self.expect(plan_id, at, "an empty binding set", "binding")

    def _forge_a_strategy_revision(self, plan_id: str) -> None:
        doc = self.doc(plan_id)
        config = doc.global_config
        [at] = self.past_the_plane(
            plan_id,
            StrategyRevisionRequested(
                plan_id=plan_id,
                revision=doc.revision + 1,
                reason="a fresh budget please",
                failed_attempts=doc.retries_used,
            ),
        )
        if (
            doc.retries_used <= config.retry_limit
            or doc.terminal is not None
            or doc.pending_decision is not None
            or doc.revisions_used >= config.max_strategy_revisions
        ):
            self.expect(
                plan_id, at, "a strategy revision before the retry limit", "illegal_transition"
            )

    def _forge_an_escalate_halt(self, plan_id: str) -> None:
        doc = self.doc(plan_id)
        [at] = self.past_the_plane(
            plan_id,
            PlanHalted(
                plan_id=plan_id,
                halt_type="escalate",
                final_decision="escalate",
                raw_halt_type="needs_decision",
                reason="no decision made",
                phase=doc.phase,
                attempt=doc.attempt,
            ),
        )
        if doc.pending_decision is None or doc.terminal is not None:
            self.expect(
                plan_id, at, "an escalate halt without a pending decision", "illegal_transition"
            )

    def _forge_a_replayed_pass(self, plan_id: str) -> None:
        """The plane's last passing run and its mint, copied under a fresh run id (the
        copied token signature is genuine): a superseded token made current again. The
        plane may apply it only over a pass of the plan's whole binding set."""
        events = [e for e in self.events(plan_id) if e.position not in self.forged_positions]
        mint = [e.payload for e in events if isinstance(e.payload, TokenMinted)][-1]
        run_id = str(ULID())
        copied = [
            msgspec.structs.replace(e.payload, run_id=run_id)
            for e in events
            if isinstance(
                e.payload, ValidationRunStarted | ValidationResultRecorded | ValidationRunCompleted
            )
            and e.payload.run_id == mint.run_id
        ]
        self.past_the_plane(plan_id, *copied, msgspec.structs.replace(mint, run_id=run_id))
        event("forged: a replayed pass")

    # -- the invariants ----------------------------------------------------------------------

    @invariant()
    def every_apply_by_the_plane_rests_on_a_complete_pass(self) -> None:
        for plan_id in self.plans:
            events = self.events(plan_id)
            for i, e in enumerate(events):
                if isinstance(e.payload, PlanApplied) and e.position not in self.forged_positions:
                    self._check_apply(plan_id, events[:i], e)

    def _check_apply(
        self, plan_id: str, before: list[RecordedEvent], applied: RecordedEvent
    ) -> None:
        where = f"plan {plan_id} applied at position {applied.position}"
        doc = fold_all(f"plan:{plan_id}", _payloads(before))
        mints = [e.payload for e in before if isinstance(e.payload, TokenMinted)]
        assert mints and mints[-1].token_id == applied.payload.token_id, where
        run_id = mints[-1].run_id
        started = [
            e
            for e in before
            if isinstance(e.payload, ValidationRunStarted) and e.payload.run_id == run_id
        ]
        assert len(started) == 1, f"{where}: run {run_id} started {len(started)} times"
        results = [
            e.payload
            for e in before
            if isinstance(e.payload, ValidationResultRecorded) and e.payload.run_id == run_id
        ]
        passed = {r.attachment_id for r in results if r.verdict is True and r.cause is None}
        required = [b for b in doc.binding if b.mode == "required"]
        # (a) a real pass for every required member of the pinned binding set
        missing = [b.validation for b in required if b.attachment_id not in passed]
        assert not missing, f"{where}: no passing result for {missing} in run {run_id}"
        # (b) at least one required member, unless the plan opted out
        assert required or not doc.global_config.require_validation, (
            f"{where}: run {run_id} ran no required validation"
        )
        # (c) the evidence of every result is in the blob store
        for r in results:
            if r.raw_output_sha256 is not None:
                assert self.store.get_blob(r.raw_output_sha256) is not None, (
                    f"{where}: blob {r.raw_output_sha256} of {r.validation} is missing"
                )
        # (d) after an escalation, a revise by a registered approver precedes the run
        escalations = [e for e in before if isinstance(e.payload, Escalated)]
        if not escalations:
            return
        last = escalations[-1]
        decision = next(
            (
                e
                for e in before
                if isinstance(e.payload, DecisionRecorded)
                and e.payload.decision_id == last.payload.decision_id
            ),
            None,
        )
        assert decision is not None and decision.payload.choice == "revise", (
            f"{where}: escalation {last.payload.decision_id} has no revise decision"
        )
        name, at = decision.payload.approver, decision.position
        assert (
            name in APPROVERS
            and self.fingerprints[name] == decision.payload.key_fingerprint
            and at < self.revoked_at.get(name, at + 1)
        ), f"{where}: the decision at {at} is not by a registered approver's active key"
        assert at < started[0].position, (
            f"{where}: the revise decision at {at} does not precede run {run_id}"
        )

    @invariant()
    def audit_finds_forgeries_and_only_forgeries(self, read_models: bool = False) -> None:
        """(The read models are checked once, at the end of the run: the check folds
        every projection again, which is most of an audit's time.)"""
        report = audit(self.store, plane_public_key=self.plane_key, read_models=read_models)
        for v in report.violations:
            assert v.plan_id is not None, f"audit flags a non-plan stream: {v}"
            assert v.plan_id in self.forged, f"audit flags a plan nobody forged: {v}"
        found: dict[int, set[str]] = {}
        for v in report.violations:
            found.setdefault(v.position, set()).add(v.invariant)
        for e in self.expected:
            at = found.get(e.position)
            assert at, f"audit misses {e.what} forged into {e.plan_id} at {e.position}"
            assert not e.invariants or e.invariants & at, (
                f"audit reports {sorted(at)} for {e.what} at {e.position}, not {e.invariants}"
            )


def _run(backend: str) -> None:
    run_state_machine_as_test(
        lambda: NoBypass(backend), settings=settings(SETTINGS, max_examples=MAX_EXAMPLES[backend])
    )


@pytest.mark.slow
def test_no_bypass_sqlite() -> None:
    _run("sqlite")


@pytest.mark.slow
def test_no_bypass_postgresql(pg_url: str) -> None:
    """``pg_url`` skips (or fails under CI=true) exactly as every PostgreSQL test does;
    each run then gets its own fresh schema."""
    _run("postgresql")


# -- a plane bug the machine found: invariant 1 (d) failed on this history -------------


def test_a_token_minted_before_an_escalation_is_not_applied_after_it(
    db_url: str, tmp_path: Path
) -> None:
    with Plane.open(db_url) as plane:
        status_plan(plane, tmp_path, {})
        (work(plane) / "status.txt").write_text("good\n")
        token = validate_plan(plane, "P-1").token
        assert token
        record_halt(plane, "P-1", "needs_decision", "the orchestrator asks a human")
        decision_id = plane.state("plan:P-1").doc.pending_decision.decision_id
        authorize(
            plane,
            decision_id,
            tmp_path / "alice.key",
            choice="revise",
            guidance="do it another way",
        )
        (work(plane) / "status.txt").write_text("bad\n")
        record_strategy(plane, "P-1", "another way")
        enter_execute(plane, "P-1")
        with pytest.raises(CommandRefused):
            apply_plan(plane, "P-1", token)
