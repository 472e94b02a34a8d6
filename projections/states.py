"""The typed state of each stream kind: one frozen msgspec Struct per stream document.

A stream with no document yet has the state ``None``. The JSON form of a state —
``to_json(state)``, which is ``msgspec.to_builtins`` with ``None`` as ``{}`` — is the
stream document exactly as the log's deltas and the read models have it: every field
below is always present (``None`` included) unless it is typed ``| UnsetType``, which is
absent until it is set. Field order is the document's key order.

States are values: folds build new ones (``msgspec.structs.replace``), never mutate.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from ledger.events import Finding, GlobalConfig, NetworkAccess, ResolvedAttachment, SkillPin

__all__ = [
    "ApplyingState",
    "ApproverKeyState",
    "ApproverState",
    "AttachmentState",
    "CandidateState",
    "ChangedFile",
    "CompensationState",
    "HaltState",
    "HandOutState",
    "HostState",
    "OutcomeHalt",
    "OutcomeResult",
    "OutcomeState",
    "PendingDecision",
    "PlanState",
    "RecordedOutcome",
    "ReportState",
    "ReviewState",
    "RoleRunState",
    "SkillState",
    "StepState",
    "TokenState",
    "ToolSpec",
    "ToolState",
    "given",
    "to_json",
]

JSON = Any


class _Doc(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every state Struct (and of the Structs nested in one). Read fields as
    attributes; ``to_json`` gives the plain document."""


# -- tool: (tools and validations: one namespace) ------------------------------------


class ToolSpec(_Doc, frozen=True, kw_only=True):
    """A tool's (or validation's) definition: its registration without type, name and
    version. The validation fields are absent from a tool's spec."""

    description: str = ""
    source: str = ""
    declared_input_schema: JSON = None
    input_schema: JSON = None
    input_schema_sha256: str | None = None
    declared_output_schema: JSON = None
    output_schema: JSON = None
    output_schema_sha256: str | None = None
    capability: str | None = None
    resource_slots: list[str] = []
    lifecycle: dict[str, JSON] = {}
    code: str | None = None
    command: list[str] | None = None
    mcp_server: str | None = None
    mcp_tool_name: str | None = None
    mcp_command: list[str] | UnsetType = UNSET
    mcp_url: str | UnsetType = UNSET
    timeout_ms: int | None = None
    max_output_bytes: int | UnsetType = UNSET
    network: NetworkAccess | UnsetType = UNSET
    idempotent: bool = False
    writes: bool = False
    # a validation's (absent from a tool's spec)
    mode: Literal["required", "informational"] | UnsetType = UNSET
    executor: Literal["command", "python", "wrapped", "mcp"] | UnsetType = UNSET
    python: str | UnsetType | None = UNSET
    wraps: str | UnsetType | None = UNSET
    wraps_version: int | UnsetType | None = UNSET
    transform: str | UnsetType | None = UNSET
    checkpointable: bool | UnsetType = UNSET
    read_only: bool | UnsetType = UNSET


class ToolState(_Doc, frozen=True, kw_only=True):
    """``tool:{name}``: the current definition, its version, and every version kept."""

    name: str
    kind: Literal["tool", "validation"]
    version: int
    spec: ToolSpec
    versions: dict[str, ToolSpec]


# -- skill: ---------------------------------------------------------------------------


class SkillState(_Doc, frozen=True, kw_only=True):
    name: str
    version: int
    description: str
    members: list[str]


# -- attachment: ----------------------------------------------------------------------


class AttachmentState(_Doc, frozen=True, kw_only=True):
    attachment_id: str
    validation: str
    validation_version: int
    resource: str
    scope: Literal["direct", "project", "plan"]
    project: str | None = None
    plan: str | None = None
    args: dict[str, JSON] = {}
    args_sha256: str
    status: Literal["attached", "detached"] = "attached"
    detach_reason: str | UnsetType = UNSET  # present once detached


# -- approver: ------------------------------------------------------------------------


class ApproverKeyState(_Doc, frozen=True, kw_only=True):
    public_key: str
    status: Literal["active", "revoked"]
    # Absent for an approver's key (so its document is as before); "operator" for an
    # operator's (policy) key.
    role: Literal["operator"] | UnsetType = UNSET


class ApproverState(_Doc, frozen=True, kw_only=True):
    """``approver:{name}``: the approver's public keys by fingerprint."""

    name: str
    keys: dict[str, ApproverKeyState]


# -- approval_policy ----------------------------------------------------------------------


class ApprovalPolicyState(_Doc, frozen=True, kw_only=True):
    """``approval_policy``: how every escalation is decided (the latest policy counts)."""

    min_approvals: int
    separate_duties: bool


# -- credential: ------------------------------------------------------------------------


class CredentialState(_Doc, frozen=True, kw_only=True):
    """``credential:{credential_id}``: an agent credential for one plan (the secret's
    digest only), active until it expires or is revoked."""

    credential_id: str
    plan_id: str
    role: str
    secret_sha256: str
    expires_at: str
    status: Literal["active", "revoked"] = "active"


# -- plan: ----------------------------------------------------------------------------


class StepState(_Doc, frozen=True, kw_only=True):
    """The tool (and its version) a plan step's input gate passed."""

    tool: str
    tool_version: int | None


class RoundState(_Doc, frozen=True, kw_only=True):
    """A call whose MCP server asked the agent's client for input (``mcp.input_required``)
    and whose answer has not been given: the tool, and the arguments it must come with."""

    tool: str
    params_sha256: str


class HaltState(_Doc, frozen=True, kw_only=True):
    halt_type: str
    raw_halt_type: str
    reason: str
    hint: str | None
    terminal: bool


class CompensationState(_Doc, frozen=True, kw_only=True):
    status: Literal["requested", "completed", "failed"]
    reason: str | None


class PendingDecision(_Doc, frozen=True, kw_only=True):
    decision_id: str
    options: list[str]
    reason: str
    # When the plan is denied without a decision (absent: it waits).
    expires_at: str | UnsetType = UNSET
    # k of n: how many approvers must sign one choice, and who signed what so far
    # (absent: one approver decides).
    approvals_required: int | UnsetType = UNSET
    approvals: dict[str, str] | UnsetType = UNSET

    def signed_with(self, approver: str, choice: str) -> dict[str, str]:
        """Who signed what, with ``approver``'s signature of ``choice`` added."""
        before = self.approvals if self.approvals is not UNSET else {}
        return {**before, approver: choice}

    def stands_with(self, approver: str, choice: str) -> bool:
        """Whether ``approver``'s signature of ``choice`` decides the escalation: always
        with one approver; with k of n, once k signed that choice."""
        if not isinstance(self.approvals_required, int):
            return True
        signed = self.signed_with(approver, choice)
        return sum(c == choice for c in signed.values()) >= self.approvals_required


class TokenState(_Doc, frozen=True, kw_only=True):
    token_id: str
    token_sha256: str
    attempt: int
    run_id: str
    expires_at: str
    status: Literal["minted", "consumed", "superseded"]
    # The blob of the trees the run judged (absent on tokens minted before content binding).
    trees_sha256: str | UnsetType = UNSET


class ChangedFile(_Doc, frozen=True, kw_only=True):
    resource: str
    path: str
    sha256: str


class ApplyingState(_Doc, frozen=True, kw_only=True):
    """Apply's recorded change set (``applying`` until it completes, then ``applied``)."""

    token_id: str
    changes_sha256: str
    files: list[ChangedFile]


class PlanState(_Doc, frozen=True, kw_only=True):
    """``plan:{plan_id}``: phase, strategy, binding set, counters, halt, decisions, token."""

    plan_id: str
    project: str
    resources: list[str]
    global_config: GlobalConfig
    # Absent (UNSET) for a plan without skills, so such a plan's document is as before.
    skills: list[str] | UnsetType = UNSET
    skill_pins: dict[str, SkillPin] | UnsetType = UNSET
    phase: Literal["strategize", "execute", "apply"] = "strategize"
    revision: int = 0
    attempt: int = 0
    iteration: int = 0
    retries_used: int = 0
    strategy: str | None = None
    guidance: str | None = None
    binding: list[ResolvedAttachment] = []
    steps: dict[str, StepState] = {}
    gate_checks: int = 0
    gate_failures: int = 0
    halt: HaltState | None = None
    compensation: CompensationState | None = None
    terminal: Literal["failed", "applied"] | None = None
    tool_calls: int = 0
    current_run: str | None = None
    last_run: str | None = None
    last_outcome: str | None = None
    outcome: str | None = None
    unvalidated: bool = False
    needs_fix: bool = False
    informational_failures: list[str] = []
    fixes: int = 0
    revisions_used: int = 0
    pending_decision: PendingDecision | None = None
    decisions: dict[str, str] = {}
    token: TokenState | None = None
    applying: ApplyingState | None = None
    applied: ApplyingState | None = None
    # The blob of the resources as the sandbox copied them at the first Execute (absent
    # before it, and on plans recorded before snapshots).
    snapshot_sha256: str | UnsetType = UNSET
    # The rounds of questions an MCP server asked and nobody answered yet, by round id
    # (absent when there are none, so a plan without any keeps its document).
    rounds: dict[str, RoundState] | UnsetType = UNSET

    def may_call(self, tool: str) -> bool:
        """Whether the plan's skills let it call ``tool``: any tool for a plan without
        skills; else only a member of a skill pinned at Execute (none before)."""
        if self.skills is UNSET:
            return True
        pins = self.skill_pins if self.skill_pins is not UNSET else {}
        return any(tool in pin.members for pin in pins.values())


# -- review: --------------------------------------------------------------------------


class CandidateState(_Doc, frozen=True, kw_only=True):
    reviewer: str
    valid: bool
    findings: list[Finding]
    verified: list[str]
    limitations: list[str]
    errors: list[str]


class ReportState(_Doc, frozen=True, kw_only=True):
    sha256: str
    size: int
    findings: int
    exclusions: int


class RoleRunState(_Doc, frozen=True, kw_only=True):
    """One reviewer program's run, in brief (``review.role_ran`` has it whole)."""

    role: str
    name: str
    exit_code: int | None
    error: str | None
    duration_ms: int
    stdout_sha256: str


class HostState(_Doc, frozen=True, kw_only=True):
    """A hosted review (``evidence review run``): what the host runs, where, and each run.
    ``pid``/``hostname``/``scope_sha256`` are absent until the host process takes it."""

    reviewers: dict[str, JSON]
    reviewers_sha256: str
    repository: str
    pid: int | UnsetType = UNSET
    hostname: str | UnsetType = UNSET
    scope_sha256: str | UnsetType = UNSET
    runs: list[RoleRunState] = []


class HandOutState(_Doc, frozen=True, kw_only=True):
    at: str
    to: str


class ReviewState(_Doc, frozen=True, kw_only=True):
    """``review:{task_id}``: see ``projections.reviews``."""

    task_id: str
    plan_id: str | None
    status: Literal["started", "repair", "accounted", "completed", "failed"]
    request: dict[str, JSON]
    request_sha256: str
    candidates: dict[str, CandidateState] = {}
    accounting_attempts: int = 0
    rejections: list[list[str]] = []
    accounting: dict[str, JSON] | None = None
    report: ReportState | None = None
    failure: str | None = None
    # Absent (not null) until set, so the documents of reviews recorded before these
    # existed keep their exact shape (their deltas still replay to the fold).
    host: HostState | UnsetType = UNSET
    handed_out: HandOutState | UnsetType = UNSET


# -- the outcomes read model (a second view of plan: streams) -------------------------


class OutcomeResult(_Doc, frozen=True, kw_only=True):
    validation: str
    mode: Literal["required", "informational"]
    verdict: bool | None
    cause: str | None


class RecordedOutcome(_Doc, frozen=True, kw_only=True):
    outcome: str
    rules_version: int


class OutcomeHalt(_Doc, frozen=True, kw_only=True):
    halt_type: str
    raw_halt_type: str
    reclassified: str


class OutcomeState(_Doc, frozen=True, kw_only=True):
    """A plan's last run re-classified by the current rules (``outcomes.fold_outcome``).
    Every field is absent until an event sets it."""

    plan_id: str | UnsetType = UNSET
    run_id: str | UnsetType = UNSET
    attempt: int | UnsetType = UNSET
    results: dict[str, OutcomeResult] | UnsetType = UNSET
    recorded: RecordedOutcome | UnsetType | None = UNSET
    halt: OutcomeHalt | UnsetType | None = UNSET
    require_validation: bool | UnsetType = UNSET
    outcome: str | UnsetType = UNSET
    raw_halt_type: str | UnsetType = UNSET
    rules_version: int | UnsetType = UNSET
    drift: bool | UnsetType = UNSET


T = TypeVar("T")
D = TypeVar("D")


def given(value: T | UnsetType, default: D = None) -> T | D:  # type: ignore[assignment]
    """A field's value, or ``default`` when it is absent (UNSET)."""
    return default if isinstance(value, UnsetType) else value


def to_json(state: Any) -> Any:
    """A state's JSON form (the stream document): ``{}`` for no document yet. A plain
    JSON value (an already converted document) is returned as it is."""
    if state is None:
        return {}
    if isinstance(state, msgspec.Struct):
        return msgspec.to_builtins(state)
    return state
