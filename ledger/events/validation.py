"""Validation runs at the end of Execute, their results and the run's canonical outcome
(docs/concepts.md, "Outcomes: who acts next")."""

from __future__ import annotations

from typing import Literal

import msgspec

from .base import JSON, EventPayload
from .gates import Truncation

Outcome = Literal[
    "pass", "escalate", "blocker", "validator_error", "internal_error", "environment_error"
]
NoVerdictCause = Literal[
    "timeout", "crash", "malformed", "missing_program", "read_only_violation", "internal"
]


class ResolvedAttachment(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One member of a plan's binding set (pinned at Execute) and of the set a
    validation run was started with: the attachment, the validation version and mode it
    resolved to, its arguments, and for a wrapping validation what it wraps."""

    attachment_id: str
    scope: Literal["direct", "project", "plan"]
    validation: str
    validation_version: int
    mode: Literal["required", "informational"]
    resource: str
    args: dict[str, JSON] = {}
    args_sha256: str | None = None
    wraps: str | None = None
    wraps_version: int | None = None
    transform: str | None = None


class ValidationRunStarted(EventPayload, tag="validation.run_started", kw_only=True, frozen=True):
    """The resolved set of applicable attachments was recorded and the run began."""

    STREAM = "plan:{plan_id}"
    DELTA = "sets /current_run and increments /attempt"
    BLOB_FIELDS = ("trees_sha256",)

    plan_id: str
    run_id: str
    attempt: int
    revision: int
    resolved: list[ResolvedAttachment]
    resource_digests: dict[str, str] = {}  # resource -> tree digest before the run
    # The blob of the trees the run judged: canonical JSON ``{resource: {"kind",
    # "manifest"}}``; each resource's digest above is its manifest's (docs/architecture.md).
    trees_sha256: str | None = None


class ValidationResultRecorded(
    EventPayload, tag="validation.result_recorded", kw_only=True, frozen=True
):
    """One validation's result. ``verdict`` is None when there is none (see ``cause``)."""

    STREAM = "plan:{plan_id}"
    DELTA = "adds the result under /current_run/results/<attachment_id>"
    BLOB_FIELDS = ("raw_output_sha256", "stderr_sha256")

    plan_id: str
    run_id: str
    attachment_id: str
    validation: str
    mode: Literal["required", "informational"]
    verdict: bool | None
    message: str | None = None
    data: dict[str, JSON] | None = None
    cause: NoVerdictCause | None = None
    error: str | None = None
    changed_paths: list[str] = []
    raw_output_sha256: str | None = None
    started_at: str
    ended_at: str
    duration_ms: int
    # Set only when the program's stdout / stderr went over its cap; absent otherwise.
    stdout_truncated: Truncation | msgspec.UnsetType = msgspec.UNSET
    stderr_truncated: Truncation | msgspec.UnsetType = msgspec.UNSET
    # The blob of what the program wrote on stderr (within its cap), when it wrote any:
    # a failure's reason often is there. Absent when empty, and on results recorded
    # before the field.
    stderr_sha256: str | msgspec.UnsetType = msgspec.UNSET
    # How the validation's program ran: ``landlock`` (confined by the kernel, read-only)
    # or ``unconfined`` (the plan opted out: ``confinement: none``). Absent on results
    # recorded before the field.
    confinement: Literal["landlock", "unconfined"] | msgspec.UnsetType = msgspec.UNSET


class ValidationRunCompleted(
    EventPayload, tag="validation.run_completed", kw_only=True, frozen=True
):
    """The run's outcome, classified by the rules of ``rules_version``."""

    STREAM = "plan:{plan_id}"
    DELTA = "sets /last_outcome and clears /current_run"

    plan_id: str
    run_id: str
    attempt: int
    outcome: Outcome
    rules_version: int
    results_digest: str  # SHA-256 of the canonical list of result event ids and verdicts
    informational_failures: list[str] = []
    # no required validation ran: never a pass unless the plan opted out
    # (require_validation false), and then its Apply is marked unvalidated
    vacuous: bool = False
