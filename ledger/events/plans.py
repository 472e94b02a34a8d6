"""The plan lifecycle: Strategize -> Execute -> Apply, the failure loop, signed human
decisions, tokens, halts with their canonical outcome, and compensation after a
strict-mode deviation (docs/concepts.md)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from .base import EventPayload
from .registry import PolicySignature
from .validation import Outcome, ResolvedAttachment

Phase = Literal["strategize", "execute", "apply"]


class GlobalConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A plan's validation posture, fixed at creation for the whole plan: ``strict_mode``
    (a gate deviation ends the plan), the failure loop's budgets, and whether a run with
    no required validation may pass."""

    strict_mode: bool = False
    # fix-then-revalidate cycles after a strategy's first failed validation: the default
    # 3 allows four failed validations before the strategy revision
    retry_limit: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 3
    max_strategy_revisions: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 1
    max_iterations: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 3
    # False only by an explicit opt-out: a run in which no required validation ran is
    # then a pass, and the Apply it leads to is marked unvalidated everywhere
    require_validation: bool = True
    # How the plane's programs for the plan run: confined by the kernel (Landlock; the
    # plane refuses to run them where the kernel has none), or ``none``, the explicit
    # opt-out (each run recorded ``unconfined``). Absent means ``landlock``: absent, not
    # defaulted, so plans created before the option keep their bytes.
    confinement: Literal["landlock", "none"] | msgspec.UnsetType = msgspec.UNSET
    # Seconds an escalation waits for a human decision; then the plan is denied (it ends,
    # failed) on the plane's signature. Absent: an escalation waits until it is decided.
    decision_timeout_s: Annotated[int, msgspec.Meta(ge=60, le=30 * 86400)] | msgspec.UnsetType = (
        msgspec.UNSET
    )
    # How many approvers must each sign the same choice before an escalation is
    # decided (k of the n registered). Absent: one.
    approvals_required: Annotated[int, msgspec.Meta(ge=1, le=9)] | msgspec.UnsetType = msgspec.UNSET


class PlanCreated(EventPayload, tag="plan.created", kw_only=True, frozen=True):
    """A plan was created in phase Strategize."""

    STREAM = "plan:{plan_id}"
    DELTA = (
        "creates the plan document: phase strategize, revision 0, attempt 0 (and /skills "
        "when the plan has skills)"
    )

    plan_id: str
    project: str
    resources: list[str]
    global_config: GlobalConfig = GlobalConfig()
    # The skills whose tools and validations are all the plan may call (absent: any
    # registered tool or validation, as before skills decided anything).
    skills: list[str] | msgspec.UnsetType = msgspec.UNSET
    # An operator's signature, required when the config weakens a gate
    # (``require_validation: false``, ``confinement: none``): that is policy, not the
    # agent's to choose.
    signed: PolicySignature | msgspec.UnsetType = msgspec.UNSET


class StrategyRecorded(EventPayload, tag="plan.strategy_recorded", kw_only=True, frozen=True):
    """The strategy for the current revision (with a decision's guidance, if any)."""

    STREAM = "plan:{plan_id}"
    DELTA = "replaces /strategy, /revision and /guidance"

    plan_id: str
    revision: int
    strategy: str
    guidance: str | None = None


class SkillPin(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One of a plan's skills as it was pinned: its version and its members then."""

    version: int
    members: list[str]


class ExecuteEntered(EventPayload, tag="plan.execute_entered", kw_only=True, frozen=True):
    """The plan moved from Strategize to Execute: a new attempt, iteration 1, a fresh
    retry budget, and its **binding set** pinned: every attachment that applied when it
    first entered Execute (with the validation version, mode, arguments and, for a
    wrapping validation, the wrapped tool's version and transform), plus those that
    apply now. Detach and re-registration bind later plans only; nothing leaves a set."""

    STREAM = "plan:{plan_id}"
    DELTA = (
        "replaces /phase with execute, /binding with the pinned set, sets /attempt to "
        "at least 1, /iteration to 1, /retries_used to 0 (and /skill_pins when the plan "
        "has skills; /snapshot_sha256 at the first Execute)"
    )
    BLOB_FIELDS = ("snapshot_sha256",)

    plan_id: str
    revision: int
    binding: list[ResolvedAttachment] = []
    # A plan with skills: each skill's version and members, pinned at the first Execute
    # and carried unchanged by every later one (absent for a plan without skills).
    skills: dict[str, SkillPin] | msgspec.UnsetType = msgspec.UNSET
    # The first Execute only: the blob of the plan's resources as its sandbox copied them
    # then (canonical JSON ``{resource: {"kind", "manifest"}}``, see docs/architecture.md
    # "The sandbox"): what Apply's change set is the difference from.
    snapshot_sha256: str | None = None


class AttemptFailed(EventPayload, tag="plan.attempt_failed", kw_only=True, frozen=True):
    """An attempt failed: a gate deviation (model_behavior) or a blocker (validation).
    The envelope's causation_id names the event that failed it."""

    STREAM = "plan:{plan_id}"
    DELTA = (
        "model_behavior: replaces /iteration with iteration + 1 (the critique loop's "
        "next iteration); validation: increments /retries_used"
    )

    plan_id: str
    attempt: int
    iteration: int
    failure_class: Literal["model_behavior", "validation"]
    reason: str


class FixRecorded(EventPayload, tag="plan.fix_recorded", kw_only=True, frozen=True):
    """The agent recorded a fix before re-validating."""

    STREAM = "plan:{plan_id}"
    DELTA = "appends to /fixes"
    BLOB_FIELDS = ("diff_sha256",)

    plan_id: str
    attempt: int
    note: str
    diff_sha256: str | None = None


class StrategyRevisionRequested(
    EventPayload, tag="plan.strategy_revision_requested", kw_only=True, frozen=True
):
    """The retry limit was reached: the plan reverts to Strategize."""

    STREAM = "plan:{plan_id}"
    DELTA = (
        "replaces /phase with strategize, /revision with the new one, clears /strategy, "
        "increments /revisions_used"
    )

    plan_id: str
    revision: int  # the new revision number
    reason: str
    failed_attempts: int


class Escalated(EventPayload, tag="plan.escalated", kw_only=True, frozen=True):
    """Strategy revisions are exhausted: a human must decide."""

    STREAM = "plan:{plan_id}"
    DELTA = "sets /pending_decision to {decision_id, options, reason}"

    plan_id: str
    decision_id: str
    options: list[str]
    reason: str
    revision: int
    attempt: int
    # When the plan is denied if no approver decided (the plan's decision_timeout_s
    # after the escalation; absent: it waits). RFC 3339, UTC.
    expires_at: str | msgspec.UnsetType = msgspec.UNSET
    # Approvers who must each sign the same choice (the plan's approvals_required, when
    # more than one); absent: one decides.
    approvals_required: int | msgspec.UnsetType = msgspec.UNSET


class EscalationExpired(EventPayload, tag="plan.escalation_expired", kw_only=True, frozen=True):
    """No approver decided a pending escalation before it expired: the plan is denied
    (it ends, failed). A timeout, not a silence: the plane key signs the escalation's
    leaf hash and the time, and only after the escalation's ``expires_at``."""

    STREAM = "plan:{plan_id}"
    DELTA = "clears /pending_decision, records /decisions/<decision_id> = expired, /terminal failed"

    plan_id: str
    decision_id: str
    escalation_hash: str  # leaf hash of the escalation event, hex
    expired_at: str  # RFC 3339, UTC: at or after the escalation's expires_at
    signature: str  # base64 Ed25519 by the plane key over the expiry record


class DecisionRecorded(EventPayload, tag="plan.decision_recorded", kw_only=True, frozen=True):
    """A human decision, Ed25519-signed with a registered approver key."""

    STREAM = "plan:{plan_id}"
    DELTA = (
        "clears /pending_decision, records /decisions/<decision_id>; revise: back to "
        "strategize with /guidance and fresh budgets; abandon: /terminal failed"
    )

    plan_id: str
    decision_id: str
    choice: Literal["revise", "abandon"]
    guidance: str | None = None
    reason: str | None = None
    escalation_hash: str  # leaf hash of the escalation event, hex
    signed_at: str
    approver: str
    key_fingerprint: str
    signature: str  # base64 Ed25519 signature over the canonical decision record


class TokenMinted(EventPayload, tag="plan.token_minted", kw_only=True, frozen=True):
    """A pass over real results minted an apply token (audit's ``token_from_passing_run``:
    a token only from real, passing results). The token string itself is not here, only
    its SHA-256."""

    STREAM = "plan:{plan_id}"
    DELTA = "sets /token to {token_id, token_sha256, attempt, run_id, expires_at, status minted}"
    BLOB_FIELDS = ("trees_sha256",)

    plan_id: str
    token_id: str
    token_sha256: str  # SHA-256 of the token string handed out; the token itself is not here
    attempt: int
    run_id: str
    results_digest: str
    issued_at: str
    expires_at: str
    # The plane key's signature over the claims (the token's own signature): an auditor
    # holding the plane's public key checks that the plane, not a writer of the
    # database, minted it. The token string is claims + this signature.
    signature: str
    # The blob of the trees the run judged (its ``validation.run_started``'s
    # ``trees_sha256``), one of the signed claims: the token binds content, not only a
    # plan. Absent only on tokens minted before content binding (Apply refuses them).
    trees_sha256: str | None = None


class TokenConsumed(EventPayload, tag="plan.token_consumed", kw_only=True, frozen=True):
    """The token was verified and used; it can never be used again."""

    STREAM = "plan:{plan_id}"
    DELTA = "replaces /token/status with consumed"

    plan_id: str
    token_id: str


class FileChange(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One entry Apply puts in place: a resource, a path inside it, and what the path
    becomes — a ``file`` (the content's SHA-256 and its permission bits), a ``symlink``
    (its target, never followed), a ``dir`` (its permission bits), or ``absent`` (the
    path is removed). Together, a change set is exactly the difference between the tree
    the token's run validated and the resource as it was when the plan entered Execute."""

    resource: str
    path: str
    sha256: str = ""
    mode: Annotated[int, msgspec.Meta(ge=0, le=0o7777)] = 0
    kind: Literal["file", "symlink", "dir", "absent"] = "file"
    target: str | msgspec.UnsetType = msgspec.UNSET


class ChangesRecorded(EventPayload, tag="plan.changes_recorded", kw_only=True, frozen=True):
    """Apply began (appended with the token's consumption): the change set from the plan's
    sandbox to its resources, recorded before any file is written, so a crash at any
    point leaves what ``apply --resume`` needs to finish. The change list (canonical
    JSON) and every file's content are blobs."""

    STREAM = "plan:{plan_id}"
    DELTA = "sets /applying to {token_id, changes_sha256, changes}"
    BLOB_FIELDS = ("changes_sha256",)

    plan_id: str
    token_id: str
    changes_sha256: str  # the blob of the canonical JSON of ``changes``
    changes: list[FileChange] = []


class PlanApplied(EventPayload, tag="plan.applied", kw_only=True, frozen=True):
    """Apply, the point of no return, completed: every file of the recorded change set
    is in place."""

    STREAM = "plan:{plan_id}"
    DELTA = "replaces /phase with apply, sets /terminal to applied, moves /applying to /applied"

    plan_id: str
    token_id: str
    changed_paths: list[str] = []


class PlanHalted(EventPayload, tag="plan.halted", kw_only=True, frozen=True):
    """A halt. ``halt_type`` == ``final_decision`` is the canonical outcome (one of the six:
    who acts next); the precise cause is ``raw_halt_type``. A raw type the plane does not
    know is classified ``internal_error`` (no verdict), never ``blocker``."""

    STREAM = "plan:{plan_id}"
    DELTA = (
        "sets /halt to {halt_type, raw_halt_type, reason, hint, terminal}; when "
        "terminal, sets /terminal to failed"
    )

    plan_id: str
    halt_type: Outcome
    final_decision: Outcome
    raw_halt_type: str
    reason: str
    hint: str | None = None
    phase: Phase
    attempt: int
    terminal: bool = False
    result_refs: list[str] = []


class CompensationRequested(
    EventPayload, tag="plan.compensation_requested", kw_only=True, frozen=True
):
    """A strict-mode deviation (or an orchestrator) routed the plan to compensation.
    The envelope's causation_id names the event that caused it."""

    STREAM = "plan:{plan_id}"
    DELTA = "sets /compensation to {status: requested, reason}"

    plan_id: str
    reason: str


class CompensationCompleted(
    EventPayload, tag="plan.compensation_completed", kw_only=True, frozen=True
):
    """Compensation commands ran; each command's exit code is kept."""

    STREAM = "plan:{plan_id}"
    DELTA = "replaces /compensation/status with completed or failed"
    BLOB_FIELDS = ("output_sha256",)

    plan_id: str
    succeeded: bool
    exit_codes: list[int] = []
    output_sha256: str | None = None
