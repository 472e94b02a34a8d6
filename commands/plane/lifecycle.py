"""Fixes, signed human decisions, tokens and Apply (docs/concepts.md; what a failure
leads to is ``commands.plane.failure_loop``).

State always comes from the plan's stream folded from the log (``commands.plane.authority``),
never from a read model or from memory:

- a ``blocker`` fails the attempt; the agent records a fix (``record_fix``) and
  re-validates. ``retry_limit`` such fix-then-revalidate cycles are allowed after a
  strategy's first failure; the failure past them reverts the plan to Strategize (a
  strategy revision, in the same append) while ``max_strategy_revisions`` allow, and
  otherwise **escalates**: a pending decision with a ULID, its options, and a halt
  ``escalate``;
- ``authorize`` records a human decision signed (Ed25519) with a registered, unrevoked
  approver key the agent process does not hold: ``revise`` sends the plan back to
  Strategize with guidance and fresh budgets, ``abandon`` ends it. Only a pending
  escalation can be decided: there is no decision that passes a blocker (audit's
  ``INV3``: a blocker is never overridable);
- a ``pass`` mints a token signed with the plane's own key (audit's
  ``token_from_passing_run``: a token only from real, passing results), bound to plan,
  attempt and results digest; ``apply`` verifies it and consumes it with the Apply in
  one append at the expected stream version, so two applies cannot both succeed.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from ulid import ULID

from commands.errors import NextStep
from commands.names import check_identifier
from commands.rules.approvals import duties_problem
from commands.rules.signing import (
    SigningError,
    decision_record,
    key_registration,
    load_or_create_operator_key,
    load_or_create_plane_key,
    mint_token,
    operator_key_path,
    operator_name,
    sign_record,
    token_digest,
    token_signature,
    verify_token,
)
from commands.rules.trust import decision_problem
from commands.rules.verdicts import results_digest
from commands.runner.sandbox import (
    ApplyBusy,
    ApplyConflict,
    PlanSandbox,
    Trees,
    change_blob,
    change_contents,
    change_entry,
    decode_trees,
    expected_changes,
    read_changes,
    real_entry,
    write_change,
)
from commands.runner.trees import Entry, ResourceKind, entries, hard_links
from ledger import RecordedEvent
from ledger.events import (
    ApproverKeyAdded,
    ApproverKeyRevoked,
    ChangesRecorded,
    DecisionRecorded,
    Escalated,
    EventPayload,
    FileChange,
    FixRecorded,
    PlanApplied,
    TokenConsumed,
    TokenMinted,
    ValidationResultRecorded,
    ValidationRunStarted,
)
from ledger.keys import fingerprint, load_private_key, load_public_key, public_key_b64
from ledger.timestamps import rfc3339
from projections.states import ApproverState, PlanState

from . import tracing
from .authority import Authority
from .core import CommandRefused, Plane, StreamState
from .failure_loop import DECISION_OPTIONS
from .phases import require_execute, require_no_pending_decision, require_plan

TOKEN_TTL = timedelta(hours=1)


def _now() -> datetime:
    return datetime.now(UTC)


def record_fix(
    plane: Plane, plan_id: str, note: str, *, diff: bytes | None = None, actor: str = "agent"
) -> PlanState:
    """The agent's fix before it re-validates (the diff, if any, goes to the blob store)."""
    if not note.strip():
        raise CommandRefused("the fix's note is empty")

    def decide(state: StreamState) -> list[FixRecorded]:
        doc = require_plan(state, plan_id)
        require_no_pending_decision(doc, plan_id)
        require_execute(doc, plan_id, "fixes are recorded")
        return [
            FixRecorded(
                plan_id=plan_id,
                attempt=doc.attempt,
                note=note,
                diff_sha256=hashlib.sha256(diff).hexdigest() if diff else None,
            )
        ]

    plane.run(f"plan:{plan_id}", decide, actor=actor, blobs=[diff] if diff else [])
    return plane.state(f"plan:{plan_id}").existing(PlanState)


# -- tokens (token_from_passing_run) --------------------------------------------------------


def token_for_pass(
    plane: Plane, plan: PlanState, run_id: str, results_digest: str, trees_sha256: str
) -> tuple[str, TokenMinted]:
    """Mint a token for a passing run: the string for the agent, the event for the log.
    Its claims bind the run's results and the trees it judged."""
    key = load_or_create_plane_key(plane.store.url)
    issued = _now()
    claims: dict[str, Any] = {
        "token_id": str(ULID()),
        "plan_id": plan.plan_id,
        "attempt": plan.attempt,
        "results_digest": results_digest,
        "issued_at": rfc3339(issued),
        "expires_at": rfc3339(issued + TOKEN_TTL),
        "trees_sha256": trees_sha256,
    }
    token = mint_token(key, **claims)
    return token, TokenMinted(
        token_sha256=token_digest(token), run_id=run_id, signature=token_signature(token), **claims
    )


Progress = Callable[[str], None]  # told each step of Apply: "changes_recorded", ...


def _silent(_step: str) -> None:
    pass


def apply_plan(
    plane: Plane, plan_id: str, token: str, *, actor: str = "agent", progress: Progress = _silent
) -> PlanState:
    """Apply with a valid token: its signature, plan, attempt, results and expiry, single
    use, and — from the log, in the deciding transaction — the run it was minted from
    (token_from_passing_run): every required member of the binding set passed, with its
    evidence present.

    Apply writes only what passed: the sandbox must be exactly the trees the token's run
    judged (its manifests' digests), and the change set is exactly those trees'
    difference from the snapshot taken when the plan entered Execute; a real resource
    that changed since at a path Apply writes is refused too.

    Crash-safe: the token's consumption and the change set (each entry's path, digest
    and mode; the contents as blobs) are one append — the point of no return — before
    any file is written; then the files are written (temp file + rename each), then
    ``plan.applied``. Killed at any point, ``complete_apply`` (``evidence apply
    --resume``) finishes it, once. Two Applies of one plan never race: the second is
    refused at once. Traced (``tracing``) as ``apply``."""
    with tracing.operation(
        "apply",
        lambda: {"evidence.operation": "apply", "evidence.plan.id": plan_id},
        records=PlanApplied.type_name(),
    ):
        return _apply_plan(plane, plan_id, token, actor=actor, progress=progress)


def _apply_plan(
    plane: Plane, plan_id: str, token: str, *, actor: str, progress: Progress
) -> PlanState:
    try:
        public = plane.plane_public_key()  # verifying: read, never made
        claims = verify_token(public, token, plan_id=plan_id, now=_now())
    except SigningError as exc:
        raise CommandRefused(f"token refused: {exc}") from None
    plan = plane.state(f"plan:{plan_id}").of(PlanState)
    if plan is None:
        raise CommandRefused(f"unknown plan {plan_id!r}")
    sandbox = plane.sandbox(plan)
    with _apply_lock(sandbox, plan_id):
        if claims.trees_sha256 is msgspec.UNSET:
            raise CommandRefused(
                "token refused: it binds no validated trees (minted before content "
                "binding); re-validate"
            )
        trees_sha256 = claims.trees_sha256
        validated, snapshot = _trees_of(plane, plan, trees_sha256)
        copies = sandbox.existing()
        refuse_hard_links(plan_id, copies)
        current = sandbox.trees({r: k for r, (k, _t) in validated.items()}, _scan_copies(copies))
        drift = _drift(validated, current)
        if drift:
            raise CommandRefused(
                f"the sandbox changed since it was validated ({drift}): Apply writes only "
                "the tree that passed; re-validate"
            )
        try:
            changes = expected_changes(validated, snapshot)
        except ValueError as exc:
            raise CommandRefused(f"cannot apply: {exc}") from None
        _check_resources(changes, snapshot, plan_id)
        try:
            contents = read_changes(changes, copies, _kinds(snapshot))
        except (ApplyConflict, OSError) as exc:
            raise CommandRefused(f"the sandbox changed while Apply read it: {exc}") from None
        diff = change_blob(changes, contents)
        progress("changes_computed")

        def decide(state: StreamState) -> list[EventPayload]:
            doc = require_plan(state, plan_id)
            held = doc.token
            if held is None or held.token_id != claims.token_id:
                raise CommandRefused(
                    "token refused: it is not the token this plan's last passing run minted"
                )
            if held.status == "consumed":
                raise CommandRefused("token refused: it was already used (tokens are single-use)")
            if held.status != "minted":
                raise CommandRefused(
                    "token refused: the plan moved on since it was minted (a "
                    "new run, fix, tool call, halt or decision); re-validate"
                )
            if doc.phase != "execute" or doc.last_outcome != "pass":
                raise CommandRefused(f"plan {plan_id} is not at a passing end of Execute")
            assert state.log is not None
            problem = passing_run_problem(
                state.log, doc, claims.attempt, claims.results_digest, held.run_id
            ) or _trees_problem(state.log, doc, held.run_id, trees_sha256)
            if problem is not None:
                raise CommandRefused(f"token refused: {problem}")
            return [
                TokenConsumed(plan_id=plan_id, token_id=claims.token_id),
                ChangesRecorded(
                    plan_id=plan_id,
                    token_id=claims.token_id,
                    changes_sha256=hashlib.sha256(diff).hexdigest(),
                    changes=changes,
                ),
            ]

        plane.run(f"plan:{plan_id}", decide, actor=actor, caused_by=0, blobs=[diff])
        progress("changes_recorded")
        return _complete(plane, plan_id, actor=actor, progress=progress)


def complete_apply(
    plane: Plane, plan_id: str, *, actor: str = "agent", progress: Progress = _silent
) -> PlanState:
    """Finish an Apply whose change set is recorded: write each entry that does not
    already match (from the blob store), then record ``plan.applied`` — once. A plan
    already applied is returned as it is. The change set must be exactly the difference
    between the trees the plane-signed token bound and the snapshot at Execute (the
    plane refuses a plan whose recorded change set is anything else, before this)."""
    doc = plane.state(f"plan:{plan_id}").of(PlanState)
    if doc is None:
        raise CommandRefused(f"unknown plan {plan_id!r}")
    with (
        tracing.operation(
            "apply",
            lambda: {
                "evidence.operation": "apply_resume",
                "evidence.plan.id": plan_id,
            },
            records=PlanApplied.type_name(),
        ),
        _apply_lock(plane.sandbox(doc), plan_id),
    ):
        return _complete(plane, plan_id, actor=actor, progress=progress)


def _apply_lock(sandbox: PlanSandbox, plan_id: str) -> contextlib.AbstractContextManager[None]:
    @contextlib.contextmanager
    def held() -> Iterator[None]:
        try:
            with sandbox.apply_lock():
                yield
        except ApplyBusy:
            raise CommandRefused(
                f"another Apply of plan {plan_id} is under way; it finishes the plan "
                "(run `evidence plan show` to see it)"
            ) from None

    return held()


def _complete(plane: Plane, plan_id: str, *, actor: str, progress: Progress) -> PlanState:
    stream = f"plan:{plan_id}"
    doc = plane.state(stream).of(PlanState)
    if doc is None:
        raise CommandRefused(f"unknown plan {plan_id!r}")
    if doc.terminal == "applied":
        return doc
    applying = doc.applying
    if applying is None:
        raise CommandRefused(f"plan {plan_id} has no Apply under way", NextStep("apply", plan_id))
    recorded = next(
        e.payload
        for e in reversed(plane.store.read_stream(stream))
        if isinstance(e.payload, ChangesRecorded)
    )
    blob = plane.store.get_blob(recorded.changes_sha256)
    if blob is None:
        raise CommandRefused(
            f"cannot finish Apply: its change set (blob "
            f"{recorded.changes_sha256}) is missing; `evidence verify` "
            "names it"
        )
    try:
        contents = change_contents(bytes(blob))
        files = [
            (change, contents[change.sha256] if change.kind == "file" else b"")
            for change in recorded.changes
        ]
    except (ValueError, KeyError, TypeError, msgspec.DecodeError) as exc:
        raise CommandRefused(f"cannot finish Apply: its change set is damaged ({exc})") from None
    assert doc.snapshot_sha256 is not msgspec.UNSET  # the plan's rules hold it
    _validated, snapshot = _trees_of(plane, doc, None)
    kinds = _kinds(snapshot)
    try:
        for change, _data in files:
            _check_target(change, snapshot, kinds)
        for change, data in files:
            write_change(change, data, kinds[change.resource])
            progress("file_written")
    except (ApplyConflict, OSError) as exc:
        raise CommandRefused(
            f"cannot finish Apply of plan {plan_id}: {exc}; `evidence apply {plan_id} "
            "--resume` retries once it is resolved"
        ) from None
    progress("files_written")

    def decide(state: StreamState) -> list[EventPayload]:
        plan = state.of(PlanState)
        now = plan.applying if plan is not None else None
        if now is None or now.token_id != recorded.token_id:
            return []  # another process finished it first: applied once
        return [
            PlanApplied(
                plan_id=plan_id,
                token_id=recorded.token_id,
                changed_paths=[f"{c.resource}/{c.path}" for c in recorded.changes],
            )
        ]

    plane.run(stream, decide, actor=actor)
    return plane.state(stream).existing(PlanState)


def _trees_of(plane: Plane, plan: PlanState, trees_sha256: str | None) -> tuple[Trees, Trees]:
    """The validated trees (``trees_sha256``; empty when None) and the plan's snapshot."""
    if plan.snapshot_sha256 is msgspec.UNSET:
        raise CommandRefused(
            f"plan {plan.plan_id} has no snapshot of its resources (it entered Execute "
            "before content binding): it cannot be applied"
        )
    found: list[Trees] = []
    for what, digest in (("validated trees", trees_sha256), ("snapshot", plan.snapshot_sha256)):
        if digest is None:
            found.append({})
            continue
        blob = plane.store.get_blob(digest)
        if blob is None:
            raise CommandRefused(f"the {what} of plan {plan.plan_id} (blob {digest}) is missing")
        try:
            found.append(decode_trees(bytes(blob)))
        except ValueError as exc:
            raise CommandRefused(f"the {what} of plan {plan.plan_id} is damaged ({exc})") from None
    return found[0], found[1]


def _kinds(trees: Trees) -> dict[str, ResourceKind]:
    return {r: kind for r, (kind, _tree) in trees.items()}


def refuse_hard_links(plan_id: str, copies: Mapping[str, Path]) -> None:
    """Refused when a regular file in the sandbox has another link: its other name may
    be anywhere (the real resource, a file the agent rewrites at will), and a write or
    read through the sandbox would reach it."""
    for resource, copy in copies.items():
        linked = hard_links(copy)
        if linked:
            raise CommandRefused(
                f"the sandbox of plan {plan_id} holds a hard link at {linked[0]} "
                f"(resource {resource}): a file with another name is never written "
                "through or applied; replace it with a copy"
            )


def _scan_copies(copies: dict[str, Path]) -> dict[str, dict[str, Entry]]:
    return {r: entries(c) for r, c in copies.items()}


def _drift(validated: Trees, current: Trees) -> str:
    """The paths where the sandbox differs from the validated trees ('' when none)."""
    paths: list[str] = []
    for resource, (_kind, tree) in validated.items():
        now = current.get(resource, (_kind, {}))[1]
        paths += [
            f"{resource}/{p}" for p in sorted(set(tree) | set(now)) if tree.get(p) != now.get(p)
        ]
    shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
    return shown


def _check_resources(changes: list[FileChange], snapshot: Trees, plan_id: str) -> None:
    """Before the point of no return: the real resource at every path Apply writes is
    still as the snapshot saw it (or already as the change leaves it)."""
    kinds = _kinds(snapshot)
    try:
        for change in changes:
            _check_target(change, snapshot, kinds)
    except ApplyConflict as exc:
        raise CommandRefused(f"cannot apply plan {plan_id}: {exc}") from None


def _check_target(change: FileChange, snapshot: Trees, kinds: dict[str, ResourceKind]) -> None:
    tree = snapshot[change.resource][1]
    before = tree.get(change.path)
    real = real_entry(change.resource, kinds[change.resource], change.path)
    expected = tuple(before) if before is not None else None
    if real != expected and real != change_entry(change):
        raise ApplyConflict(
            f"{change.resource}/{change.path} changed since the plan entered Execute "
            "(a symlink or hard link where a file is expected is never followed)"
        )


def _trees_problem(log: Authority, plan: PlanState, run_id: str, trees_sha256: str) -> str | None:
    """The token's trees are the ones its run recorded that it judged."""
    started = next(
        (
            e.payload
            for e in log.source.read_stream(f"plan:{plan.plan_id}")
            if isinstance(e.payload, ValidationRunStarted) and e.payload.run_id == run_id
        ),
        None,
    )
    if started is None or started.trees_sha256 != trees_sha256:
        return "the token's trees are not the trees its run judged"
    return None


def passing_run_problem(
    log: Authority, plan: PlanState, attempt: int, digest: str, run_id: str
) -> str | None:
    """Why the run a token names is no ground for Apply (None when it is): it must be the
    plan's last run, at the token's attempt, its results digest the token's, a verdict
    ``passed`` for every required member of the binding set (at least one, unless the
    plan opted out), and every raw output it was judged on still in the blob store."""
    if plan.last_run != run_id or plan.attempt != attempt:
        return "it was not minted from the plan's last run at its current attempt"
    results = [
        e.payload
        for e in log.source.read_stream(f"plan:{plan.plan_id}")
        if isinstance(e.payload, ValidationResultRecorded) and e.payload.run_id == run_id
    ]
    if results_digest(results) != digest:
        return "the run's recorded results do not hash to the token's results digest"
    passed = {r.attachment_id for r in results if r.verdict is True and r.cause is None}
    required = [b for b in plan.binding if b.mode == "required"]
    missing = [b.validation for b in required if b.attachment_id not in passed]
    if missing:
        return f"required validation(s) {', '.join(sorted(missing))} have no passing result"
    if not required and plan.global_config.require_validation:
        return "no required validation ran"
    evidence = [r.raw_output_sha256 for r in results if r.raw_output_sha256]
    absent = sorted(set(evidence) - log.present_blobs(evidence))
    if absent:
        return f"the evidence of the run is missing (blob {absent[0]})"
    return None


# -- approver keys ------------------------------------------------------------------------


def add_approver_key(
    plane: Plane,
    name: str,
    public_key_file: Path,
    *,
    role: Literal["approver", "operator"] = "approver",
    actor: str = "operator",
) -> ApproverState:
    """Register NAME's public key as an approver's (decisions; the registration is policy,
    signed by an operator) or an operator's (policy). Either way the plane key endorses
    it: only whoever holds the plane key makes a key anybody's."""
    try:
        public = load_public_key(public_key_file)
    except SigningError as exc:
        raise CommandRefused(str(exc)) from None
    return add_public_key(plane, name, public, role=role, actor=actor)


def add_public_key(
    plane: Plane,
    name: str,
    public: Ed25519PublicKey,
    *,
    role: Literal["approver", "operator"] = "approver",
    actor: str = "operator",
) -> ApproverState:
    """``add_approver_key`` for a public key already read (an operator's elsewhere sends
    it through the service)."""
    check_identifier(name, "approver name")
    print_ = fingerprint(public)
    load_or_create_plane_key(plane.store.url)  # only whoever holds it adds a key

    def decide(state: StreamState) -> list[ApproverKeyAdded]:
        assert state.log is not None
        known = state.log.approver_keys().get(print_)
        if known is not None:
            raise CommandRefused(f"key {print_[:16]}… is already registered for {known.name!r}")
        # Endorsed by the plane key where it is appended (``Plane._signed``).
        return [key_registration(name, public_key_b64(public), print_, role)]

    plane.run(f"approver:{name}", decide, actor=actor)
    return plane.state(f"approver:{name}").existing(ApproverState)


@dataclass
class OperatorInit:
    name: str
    fingerprint: str
    key_file: Path
    added: bool  # this call made it the ledger's first operator
    registered: bool  # it is an operator key of the ledger (now)


def init_operator(plane: Plane, name: str | None = None, *, register: bool = True) -> OperatorInit:
    """``evidence init``: make (or load) this process's operator key and, on a ledger with
    no operator yet, register it as the first one, endorsed by the plane key. A ledger
    that has operators already takes a new one only through `keys add --role operator`."""
    url = plane.store.url
    try:
        key = load_or_create_operator_key(url)
    except SigningError as exc:
        raise CommandRefused(str(exc)) from None
    assert key is not None
    public, print_ = public_key_b64(key.public_key()), fingerprint(key.public_key())
    who = name or operator_name()
    check_identifier(who, "operator name")

    def decide(state: StreamState) -> list[ApproverKeyAdded]:
        assert state.log is not None
        keys = state.log.approver_keys()
        known = keys.get(print_)
        if known is not None:
            if known.role != "operator" or known.status != "active":
                raise CommandRefused(f"key {print_[:16]}… is not an active operator key")
            return []
        if any(k.role == "operator" for k in keys.values()):
            raise CommandRefused(
                f"this ledger has operators already; one of them registers this key: "
                f"evidence keys add NAME {operator_key_path(url)}.pub --role operator"
            )
        return [key_registration(who, public, print_, "operator")]

    if not register:  # refused now if another operator owns the ledger; else nothing
        known = plane.log().approver_keys().get(print_)
        others = any(k.role == "operator" for k in plane.log().approver_keys().values())
        if known is None and others:
            decide(plane.state(f"approver:{who}"))  # raises: the ledger has operators
        return OperatorInit(
            known.name if known else who, print_, operator_key_path(url), False, known is not None
        )
    added = plane.run(f"approver:{who}", decide, actor="operator")
    known = plane.log().approver_keys().get(print_)
    return OperatorInit(
        known.name if known else who, print_, operator_key_path(url), bool(added), known is not None
    )


def revoke_approver(
    plane: Plane, name: str, *, reason: str = "", actor: str = "operator"
) -> ApproverState:
    def decide(state: StreamState) -> list[ApproverKeyRevoked]:
        doc = state.of(ApproverState)
        active = [
            fp
            for fp, key in (doc.keys if doc is not None else {}).items()
            if key.status == "active"
        ]
        if not active:
            raise CommandRefused(f"approver {name!r} has no active key")
        return [ApproverKeyRevoked(name=name, fingerprint=fp, reason=reason) for fp in active]

    plane.run(f"approver:{name}", decide, actor=actor)
    return plane.state(f"approver:{name}").existing(ApproverState)


# -- human decisions ----------------------------------------------------------------------


@dataclass
class Pending:
    plan_id: str
    decision_id: str
    options: list[str]
    reason: str


def pending_decisions(plane: Plane) -> list[Pending]:
    """Every pending escalation (a query: from the plans read model)."""
    plane.projections.catch_up()
    return [
        Pending(
            d.plan_id,
            d.pending_decision.decision_id,
            d.pending_decision.options,
            d.pending_decision.reason,
        )
        for d in plane.projections.documents("plans")
        if d and d.pending_decision
    ]


def _escalation(plane: Plane, decision_id: str) -> tuple[RecordedEvent, Escalated]:
    """The escalation ``decision_id`` names (its event: the decision signs its leaf
    hash); refused when there is none."""
    for event in plane.store.read_all(types=[Escalated.type_name()]):
        if isinstance(event.payload, Escalated) and event.payload.decision_id == decision_id:
            return event, event.payload
    raise CommandRefused(
        f"no pending escalation {decision_id!r}: only a pending escalation can be "
        "decided (a blocker is never overridable; a decided escalation stays decided)"
    )


def decision_stands(plane: Plane, plan_id: str, decision_id: str) -> bool:
    """Whether escalation ``decision_id`` is decided (with k of n approvers, a signature
    recorded may leave it waiting for more)."""
    doc = plane.state(f"plan:{plan_id}").of(PlanState)
    pending = doc.pending_decision if doc is not None else None
    return pending is None or pending.decision_id != decision_id


def decision_to_sign(
    plane: Plane,
    decision_id: str,
    *,
    choice: str,
    guidance: str | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """The record an approver signs to decide escalation ``decision_id`` (domain
    ``decision``: the decision, its plan, the escalation's leaf hash, the choice, the
    guidance, the reason, the time): built here, signed wherever the approver's key is."""
    if choice not in DECISION_OPTIONS:
        raise CommandRefused(f"a decision is one of {', '.join(DECISION_OPTIONS)}")
    if choice == "revise" and not (guidance or "").strip():
        raise CommandRefused("--revise needs the guidance text")
    escalation_event, escalated = _escalation(plane, decision_id)
    return decision_record(
        decision_id,
        escalated.plan_id,
        choice,
        guidance if choice == "revise" else None,
        escalation_event.leaf_hash.hex(),
        rfc3339(_now()),
        reason,
    )


def authorize(
    plane: Plane,
    decision_id: str,
    key_file: Path,
    *,
    choice: str,
    guidance: str | None = None,
    reason: str | None = None,
    actor: str = "human",
) -> DecisionRecorded:
    """Sign and record a decision on a pending escalation — and on nothing else. The
    signature covers the decision, its plan, the escalation's leaf hash, the choice,
    the guidance and the reason; the plane verifies it against the approver key in
    force before recording it, and again wherever the decision is acted on."""
    record = decision_to_sign(plane, decision_id, choice=choice, guidance=guidance, reason=reason)
    try:
        private = load_private_key(key_file)
    except SigningError as exc:
        raise CommandRefused(str(exc)) from None
    signature = sign_record(private, record, domain="decision")
    return record_decision(plane, record, fingerprint(private.public_key()), signature, actor=actor)


def record_decision(
    plane: Plane,
    record: dict[str, Any],
    print_: str,
    signature: str,
    *,
    actor: str = "human",
) -> DecisionRecorded:
    """Record a decision signed elsewhere (``record`` as ``decision_to_sign`` built it,
    signed by the key of fingerprint ``print_``) on its pending escalation, after the
    plane verified the signature against that approver's key in force."""
    decision_id, plan_id = str(record["decision_id"]), str(record["plan_id"])
    escalation_event, _escalated = _escalation(plane, decision_id)
    if record.get("escalation_hash") != escalation_event.leaf_hash.hex():
        raise CommandRefused(f"the decision is not for escalation {decision_id}'s event")

    def decide(state: StreamState) -> list[DecisionRecorded]:
        plan = state.of(PlanState)
        pending = plan.pending_decision if plan is not None else None
        if pending is None or pending.decision_id != decision_id:
            raise CommandRefused(
                f"no pending escalation {decision_id!r}: only a pending escalation can be "
                "decided (a blocker is never overridable; a decided escalation stays "
                "decided)"
            )
        require_plan(state, plan_id)
        assert state.log is not None
        key = state.log.approver_keys().get(print_)
        if key is None:
            raise CommandRefused(
                "this key belongs to no registered approver (evidence keys add NAME PUBKEY_FILE)"
            )
        if key.status != "active":
            raise CommandRefused(f"the key of approver {key.name!r} was revoked")
        decided = DecisionRecorded(
            plan_id=plan_id,
            decision_id=decision_id,
            choice=record["choice"],
            guidance=record.get("guidance"),
            reason=record.get("reason"),
            escalation_hash=record["escalation_hash"],
            signed_at=record["signed_at"],
            approver=key.name,
            key_fingerprint=print_,
            signature=signature,
        )
        # The plane checks the signature as an auditor would, before it records it.
        problem = decision_problem(decided, escalation_event.leaf_hash, key)
        if problem is not None:
            raise CommandRefused(f"the decision does not verify: {problem}")
        conflict = duties_problem(decided, state.log.approvals())
        if conflict is not None:
            raise CommandRefused(f"refused: {conflict}")
        done["event"] = decided
        return [decided]

    done: dict[str, DecisionRecorded] = {}
    known = plane.log().approver_keys().get(print_)
    with tracing.operation(
        "decision",
        lambda: {
            "evidence.operation": "decision",
            "evidence.plan.id": plan_id,
            "evidence.decision.id": decision_id,
            "evidence.decision.choice": record.get("choice"),
        },
        records=DecisionRecorded.type_name(),
    ):
        plane.run(
            f"plan:{plan_id}", decide, actor=f"{actor}:{known.name if known else print_[:16]}"
        )
    return done["event"]
