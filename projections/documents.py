"""Stream documents: the typed state of one stream (``projections.states``), and the
pure fold that advances it by one event.

Every stream kind (``tool:``, ``skill:``, ``attachment:``, ``plan:`` …) has a fold
``(state, payload) -> state`` (a ``folding.StreamFold``: one small step per event type,
beside the others for its stream; ``None`` is "no document yet"). Command handlers use
it to compute each event's structural delta (the RFC 6902 patch from the document
before to the document after), and the read models store the folded documents. Deltas
and rows are computed from a state's JSON form (``to_json``, exactly the plain
document). Applying the deltas alone to ``{}`` therefore rebuilds the same document as
the fold: that is what an auditor checks.

Folds never mutate their input and never read anything but the document and payload.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jsonpatch
import msgspec

from ledger.events import (
    ApprovalPolicySet,
    ApproverKeyAdded,
    ApproverKeyRevoked,
    AttachmentCreated,
    AttachmentDetached,
    AttemptFailed,
    ChangesRecorded,
    CompensationCompleted,
    CompensationRequested,
    CredentialIssued,
    CredentialRevoked,
    DecisionRecorded,
    Escalated,
    EscalationExpired,
    EventPayload,
    ExecuteEntered,
    FixRecorded,
    GateChecked,
    McpInputGiven,
    McpInputRequired,
    PlanApplied,
    PlanCreated,
    PlanHalted,
    SkillDefined,
    StrategyRecorded,
    StrategyRevisionRequested,
    TokenConsumed,
    TokenMinted,
    ToolCalled,
    ToolRegistered,
    ValidationRegistered,
    ValidationRunCompleted,
    ValidationRunStarted,
)

from .folding import StreamFold
from .reviews import fold_review
from .states import (
    ApplyingState,
    ApprovalPolicyState,
    ApproverKeyState,
    ApproverState,
    AttachmentState,
    ChangedFile,
    CompensationState,
    CredentialState,
    HaltState,
    PendingDecision,
    PlanState,
    ReviewState,
    RoundState,
    SkillState,
    StepState,
    TokenState,
    ToolSpec,
    ToolState,
    to_json,
)

Document = dict[str, Any]  # a state's JSON form (``to_json``): deltas, read-model rows
State = (
    ToolState
    | SkillState
    | AttachmentState
    | PlanState
    | ApproverState
    | ReviewState
    | CredentialState
    | ApprovalPolicyState
)
Fold = Callable[[Any, EventPayload], Any]

replace = msgspec.structs.replace

# -- tool: ----------------------------------------------------------------------------

_SPEC_FIELDS = tuple(f for f in ToolSpec.__struct_fields__)


def tool_spec(payload: ToolRegistered) -> ToolSpec:
    """The tool (or validation) definition carried by a registration event."""
    return ToolSpec(**{f: getattr(payload, f) for f in _SPEC_FIELDS if hasattr(payload, f)})


fold_tool: StreamFold[ToolState] = StreamFold("tool", ToolState)


@fold_tool.on_any(ToolRegistered)  # ValidationRegistered is a subclass
def _registered(doc: ToolState | None, p: ToolRegistered) -> ToolState:
    spec = tool_spec(p)
    versions = dict(doc.versions) if doc is not None else {}
    versions[str(p.version)] = spec
    return ToolState(
        name=p.name,
        kind="validation" if isinstance(p, ValidationRegistered) else "tool",
        version=p.version,
        spec=spec,
        versions=versions,
    )


# -- skill: ---------------------------------------------------------------------------

fold_skill: StreamFold[SkillState] = StreamFold("skill", SkillState)


@fold_skill.on_any(SkillDefined)
def _skill_defined(_doc: SkillState | None, p: SkillDefined) -> SkillState:
    return SkillState(
        name=p.name, version=p.version, description=p.description, members=list(p.members)
    )


# -- attachment: ----------------------------------------------------------------------

fold_attachment: StreamFold[AttachmentState] = StreamFold("attachment", AttachmentState)


@fold_attachment.on_any(AttachmentCreated)
def _attached(doc: AttachmentState | None, p: AttachmentCreated) -> AttachmentState:
    if doc is not None:
        return doc  # created twice: audit reports it; the first stands
    return AttachmentState(
        attachment_id=p.attachment_id,
        validation=p.validation,
        validation_version=p.validation_version,
        resource=p.resource,
        scope=p.scope,
        project=p.project,
        plan=p.plan,
        args=p.args,
        args_sha256=p.args_sha256,
        status="attached",
    )


@fold_attachment.on(AttachmentDetached)
def _detached(doc: AttachmentState, p: AttachmentDetached) -> AttachmentState:
    return replace(doc, status="detached", detach_reason=p.reason)


# -- plan: ----------------------------------------------------------------------------
# Total: an event the plan's state cannot take (anything before ``plan.created``, a
# second creation, a consumed token that was never minted) leaves the state as it is;
# ``projections.plan_rules`` names the broken rule, and audit reports it.

fold_plan: StreamFold[PlanState] = StreamFold("plan", PlanState)


def new_plan(payload: PlanCreated) -> PlanState:
    return PlanState(
        plan_id=payload.plan_id,
        project=payload.project,
        resources=list(payload.resources),
        global_config=payload.global_config,
        skills=payload.skills if payload.skills is msgspec.UNSET else list(payload.skills),
    )


@fold_plan.on_any(PlanCreated)
def _created(doc: PlanState | None, p: PlanCreated) -> PlanState:
    return doc if doc is not None else new_plan(p)


@fold_plan.on(StrategyRecorded)
def _strategy(doc: PlanState, p: StrategyRecorded) -> PlanState:
    return replace(doc, strategy=p.strategy, revision=p.revision, guidance=p.guidance)


@fold_plan.on(ExecuteEntered)
def _execute(doc: PlanState, p: ExecuteEntered) -> PlanState:
    # The first Execute starts attempt 1; a failed attempt already moved to the next.
    return replace(
        doc,
        phase="execute",
        attempt=max(doc.attempt, 1),
        iteration=1,
        retries_used=0,
        needs_fix=False,
        token=_superseded(doc.token),
        binding=list(p.binding),
        skill_pins=p.skills if p.skills is msgspec.UNSET else dict(p.skills),
        snapshot_sha256=doc.snapshot_sha256 if p.snapshot_sha256 is None else p.snapshot_sha256,
    )


@fold_plan.on(GateChecked)
def _gate_checked(doc: PlanState, p: GateChecked) -> PlanState:
    steps = doc.steps
    if p.gate == "input" and p.verdict == "pass" and p.step:
        steps = {**steps, p.step: StepState(tool=p.tool, tool_version=p.tool_version)}
    return replace(
        doc,
        gate_checks=doc.gate_checks + 1,
        gate_failures=doc.gate_failures + (p.verdict == "fail"),
        steps=steps,
    )


@fold_plan.on(McpInputRequired)
def _input_required(doc: PlanState, p: McpInputRequired) -> PlanState:
    rounds = doc.rounds if doc.rounds is not msgspec.UNSET else {}
    asked = RoundState(tool=p.tool, params_sha256=p.params_sha256)
    return replace(doc, rounds={**rounds, p.round_id: asked})


@fold_plan.on(McpInputGiven)
def _input_given(doc: PlanState, p: McpInputGiven) -> PlanState:
    if p.round_id is msgspec.UNSET or doc.rounds is msgspec.UNSET:
        return doc
    rounds = {k: v for k, v in doc.rounds.items() if k != p.round_id}
    return replace(doc, rounds=rounds or msgspec.UNSET)


@fold_plan.on(AttemptFailed)
def _attempt_failed(doc: PlanState, p: AttemptFailed) -> PlanState:
    if p.failure_class == "model_behavior":
        return replace(doc, iteration=p.iteration + 1)
    # A failed validation run: the next attempt starts with a fix, then re-validates.
    return replace(
        doc, retries_used=doc.retries_used + 1, attempt=p.attempt + 1, iteration=1, needs_fix=True
    )


@fold_plan.on(ValidationRunStarted)
def _run_started(doc: PlanState, p: ValidationRunStarted) -> PlanState:
    return replace(doc, current_run=p.run_id, token=_superseded(doc.token))


@fold_plan.on(FixRecorded)
def _fixed(doc: PlanState, _p: FixRecorded) -> PlanState:
    return replace(doc, fixes=doc.fixes + 1, needs_fix=False, token=_superseded(doc.token))


@fold_plan.on(StrategyRevisionRequested)
def _revision(doc: PlanState, p: StrategyRevisionRequested) -> PlanState:
    return replace(
        doc,
        phase="strategize",
        revision=p.revision,
        strategy=None,
        revisions_used=doc.revisions_used + 1,
        halt=None,
        token=_superseded(doc.token),
    )


@fold_plan.on(Escalated)
def _escalated(doc: PlanState, p: Escalated) -> PlanState:
    return replace(
        doc,
        pending_decision=PendingDecision(
            decision_id=p.decision_id,
            options=list(p.options),
            reason=p.reason,
            expires_at=p.expires_at,
            approvals_required=p.approvals_required,
        ),
        token=_superseded(doc.token),
    )


@fold_plan.on(EscalationExpired)
def _expired(doc: PlanState, p: EscalationExpired) -> PlanState:
    return replace(
        doc,
        pending_decision=None,
        token=_superseded(doc.token),
        decisions={**doc.decisions, p.decision_id: "expired"},
        terminal="failed",
    )


@fold_plan.on(DecisionRecorded)
def _decided(doc: PlanState, p: DecisionRecorded) -> PlanState:
    pending = doc.pending_decision
    if pending is not None and not pending.stands_with(p.approver, p.choice):
        # k of n: one approver's signature, kept until k signed one choice
        signed = pending.signed_with(p.approver, p.choice)
        return replace(doc, pending_decision=replace(pending, approvals=signed))
    decided = replace(
        doc,
        pending_decision=None,
        token=_superseded(doc.token),
        decisions={**doc.decisions, p.decision_id: p.choice},
    )
    if p.choice == "revise":
        return replace(
            decided,
            phase="strategize",
            revision=doc.revision + 1,
            strategy=None,
            guidance=p.guidance,
            retries_used=0,
            revisions_used=0,
            halt=None,
            needs_fix=False,
            outcome=None,
        )
    return replace(decided, terminal="failed")


@fold_plan.on(TokenMinted)
def _minted(doc: PlanState, p: TokenMinted) -> PlanState:
    return replace(
        doc,
        token=TokenState(
            token_id=p.token_id,
            token_sha256=p.token_sha256,
            attempt=p.attempt,
            run_id=p.run_id,
            expires_at=p.expires_at,
            status="minted",
            trees_sha256=msgspec.UNSET if p.trees_sha256 is None else p.trees_sha256,
        ),
    )


@fold_plan.on(TokenConsumed)
def _consumed(doc: PlanState, p: TokenConsumed) -> PlanState:
    token = doc.token
    if token is None or token.token_id != p.token_id:
        return doc
    return replace(doc, token=replace(token, status="consumed"))


@fold_plan.on(ChangesRecorded)
def _changes(doc: PlanState, p: ChangesRecorded) -> PlanState:
    return replace(
        doc,
        applying=ApplyingState(
            token_id=p.token_id,
            changes_sha256=p.changes_sha256,
            files=[
                ChangedFile(resource=c.resource, path=c.path, sha256=c.sha256) for c in p.changes
            ],
        ),
    )


@fold_plan.on(PlanApplied)
def _applied(doc: PlanState, _p: PlanApplied) -> PlanState:
    return replace(
        doc, phase="apply", terminal="applied", halt=None, applying=None, applied=doc.applying
    )


@fold_plan.on(ValidationRunCompleted)
def _run_completed(doc: PlanState, p: ValidationRunCompleted) -> PlanState:
    return replace(
        doc,
        current_run=None,
        last_run=p.run_id,
        last_outcome=p.outcome,
        outcome=p.outcome,
        unvalidated=p.vacuous,
        informational_failures=list(p.informational_failures),
    )


@fold_plan.on(ToolCalled)
def _tool_called(doc: PlanState, _p: ToolCalled) -> PlanState:
    return replace(doc, tool_calls=doc.tool_calls + 1, token=_superseded(doc.token))


@fold_plan.on(CompensationRequested)
def _compensation_requested(doc: PlanState, p: CompensationRequested) -> PlanState:
    return replace(doc, compensation=CompensationState(status="requested", reason=p.reason))


@fold_plan.on(CompensationCompleted)
def _compensation_completed(doc: PlanState, p: CompensationCompleted) -> PlanState:
    reason = doc.compensation.reason if doc.compensation is not None else None
    return replace(
        doc,
        compensation=CompensationState(
            status="completed" if p.succeeded else "failed", reason=reason
        ),
    )


@fold_plan.on(PlanHalted)
def _halted(doc: PlanState, p: PlanHalted) -> PlanState:
    halt = HaltState(
        halt_type=p.halt_type,
        raw_halt_type=p.raw_halt_type,
        reason=p.reason,
        hint=p.hint,
        terminal=p.terminal,
    )
    return replace(
        doc,
        halt=halt,
        outcome=p.halt_type,
        token=_superseded(doc.token),
        terminal="failed" if p.terminal else doc.terminal,
    )


def _superseded(token: TokenState | None) -> TokenState | None:
    """A minted, unused token stops being valid when the work, its evidence or the plan's
    course moves on: a new run, a fix, a tool call, a halt, an escalation or a decision, a
    strategy revision, a new Execute (a token stands only for the results it was minted
    on, and is never handed on across an escalation)."""
    if token is not None and token.status == "minted":
        return replace(token, status="superseded")
    return token


# -- approver: ------------------------------------------------------------------------

fold_approver: StreamFold[ApproverState] = StreamFold("approver", ApproverState)


@fold_approver.on_any(ApproverKeyAdded)
def _key_added(doc: ApproverState | None, p: ApproverKeyAdded) -> ApproverState:
    keys = {
        **(doc.keys if doc is not None else {}),
        p.fingerprint: ApproverKeyState(
            public_key=p.public_key,
            status="active",
            role="operator" if p.role == "operator" else msgspec.UNSET,
        ),
    }
    return ApproverState(name=p.name, keys=keys)


@fold_approver.on(ApproverKeyRevoked)
def _key_revoked(doc: ApproverState, p: ApproverKeyRevoked) -> ApproverState:
    key = doc.keys.get(p.fingerprint)
    if key is None:
        return doc  # revoking a key never added: audit reports it
    return replace(doc, keys={**doc.keys, p.fingerprint: replace(key, status="revoked")})


# -- credential: ------------------------------------------------------------------------

fold_credential: StreamFold[CredentialState] = StreamFold("credential", CredentialState)


@fold_credential.on_any(CredentialIssued)
def _credential_issued(doc: CredentialState | None, p: CredentialIssued) -> CredentialState:
    if doc is not None:
        return doc  # issued once: a second issuance changes nothing
    return CredentialState(
        credential_id=p.credential_id,
        plan_id=p.plan_id,
        role=p.role,
        secret_sha256=p.secret_sha256,
        expires_at=p.expires_at,
    )


@fold_credential.on(CredentialRevoked)
def _credential_revoked(doc: CredentialState, _p: CredentialRevoked) -> CredentialState:
    return replace(doc, status="revoked")


# -- approval_policy ----------------------------------------------------------------------

fold_approval_policy: StreamFold[ApprovalPolicyState] = StreamFold(
    "approval_policy", ApprovalPolicyState
)


@fold_approval_policy.on_any(ApprovalPolicySet)
def _approval_policy_set(
    _doc: ApprovalPolicyState | None, p: ApprovalPolicySet
) -> ApprovalPolicyState:
    return ApprovalPolicyState(min_approvals=p.min_approvals, separate_duties=p.separate_duties)


FOLDS: dict[str, StreamFold[Any]] = {
    f.kind: f
    for f in (
        fold_approver,
        fold_tool,
        fold_skill,
        fold_attachment,
        fold_plan,
        fold_review,
        fold_credential,
        fold_approval_policy,
    )
}


def stream_kind(stream: str) -> str:
    return stream.partition(":")[0]


def state_type(kind: str) -> type | None:
    """The state Struct of a stream kind (None for a kind without a fold)."""
    found = FOLDS.get(kind)
    return found.state if found is not None else None


def fold(stream: str, doc: Any, payload: EventPayload) -> State | None:
    """Advance ``stream``'s state by one event (``None``: no document yet; a stream kind
    without a fold keeps ``None``)."""
    if doc == {}:
        doc = None  # the plain empty document: no document yet
    step = FOLDS.get(stream_kind(stream))
    return step(doc, payload) if step is not None else doc


def fold_all(stream: str, payloads: Iterable[EventPayload]) -> State | None:
    doc: State | None = None
    for payload in payloads:
        doc = fold(stream, doc, payload)
    return doc


def apply_deltas(deltas: Iterable[list[Any]]) -> Document:
    """Rebuild a stream document (JSON) from its events' deltas alone (the auditor's
    way): equal to ``to_json`` of the fold."""
    doc: Any = {}
    for delta in deltas:
        doc = jsonpatch.apply_patch(doc, delta, in_place=False)
    return doc


def delta(before: Any, after: Any) -> list[Any]:
    """The RFC 6902 patch from state ``before`` to state ``after`` (``None`` is ``{}``):
    ``add``/``remove``/``replace`` operations on what changed in their JSON forms.

    Why not ``jsonpatch.make_patch`` on the two documents: it compares every value of
    both in Python (and serialises each to look for moves), so one event on a plan with
    a long history cost milliseconds. Here the states themselves are walked: a fold
    shares every unchanged part of the state it starts from, so an unchanged member is
    the same object and is skipped at once; what is not shared is compared by its JSON
    encoding (C speed, and exact: ``1``, ``1.0`` and ``true`` differ). Any correct
    patch will do: the auditor applies it and compares the result with the fold."""
    ops: list[Any] = []
    _diff({} if before is None else before, {} if after is None else after, "", ops)
    return ops


_encode = msgspec.json.encode
_plain = msgspec.to_builtins
_MISSING = object()


def _members(value: Any) -> dict[str, Any] | None:
    """A JSON object's members: a dict's items, or a state Struct's fields as
    ``to_builtins`` writes them (an UNSET field is absent). None for anything else."""
    if type(value) is dict:
        return value
    if isinstance(value, msgspec.Struct):
        found = ((f, getattr(value, f)) for f in value.__struct_fields__)
        return {f: v for f, v in found if v is not msgspec.UNSET}
    return None


def _diff(old: Any, new: Any, path: str, ops: list[Any]) -> None:
    if old is new:
        return
    before, after = _members(old), _members(new)
    if before is not None and after is not None:
        for key in before:
            if key not in after:
                ops.append({"op": "remove", "path": f"{path}/{_token(key)}"})
        for key, value in after.items():
            was = before.get(key, _MISSING)
            if was is value:
                continue
            if was is _MISSING:
                ops.append({"op": "add", "path": f"{path}/{_token(key)}", "value": _plain(value)})
            else:
                _diff(was, value, f"{path}/{_token(key)}", ops)
        return
    if _appended(old, new):
        tail = new[len(old) :]
        ops.extend({"op": "add", "path": f"{path}/-", "value": _plain(v)} for v in tail)
        return
    if _encode(old) != _encode(new):
        ops.append({"op": "replace", "path": path, "value": _plain(new)})


def _appended(old: Any, new: Any) -> bool:
    """``new`` is the list ``old`` with items added at its end."""
    if not (isinstance(old, list | tuple) and isinstance(new, list | tuple)):
        return False
    if len(new) <= len(old):
        return False
    kept = new[: len(old)]
    return all(a is b for a, b in zip(old, kept, strict=True)) or _encode(old) == _encode(kept)


def _token(key: str) -> str:
    """A member name as an RFC 6901 reference token."""
    return key.replace("~", "~0").replace("/", "~1")


__all__ = [
    "FOLDS",
    "Document",
    "State",
    "apply_deltas",
    "delta",
    "fold",
    "fold_all",
    "new_plan",
    "state_type",
    "stream_kind",
    "to_json",
    "tool_spec",
]
