"""Registrations: tools, validations (a validation IS-A tool: one namespace, every tool
field, plus a fixed mode, a structured return and read-only), skills, attachments and
approver keys."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from .base import JSON, EventPayload


class SignedPlace(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Where a signature says its event stands: the ledger (its ``ledger.identified``
    id), the stream and the event's version in it. The signature covers it (with the
    event's type), so a signed event copied anywhere else no longer verifies where it
    stands (docs/events.md "Signed messages")."""

    ledger: str
    stream: str
    version: int


class PolicySignature(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """An operator's Ed25519 signature over a policy event: the event's canonical JSON
    without this field and the place it was signed for (domain ``policy/<type>``), made
    with the operator key whose SHA-256 fingerprint is named. The plane decides only
    from policy whose signature verifies under an operator key the plane key endorsed
    and that was active at the event's position, and that stands where it was signed
    for; ``evidence audit`` reports the rest (``policy_signature``,
    ``replayed_signature``)."""

    operator: str
    fingerprint: str
    signature: str
    # Absent: the first release's format (no place), accepted only where it stands:
    # before the ledger's identification and at its first occurrence.
    place: SignedPlace | msgspec.UnsetType = msgspec.UNSET


class NetworkAccess(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The TCP ports a tool's or validation's confined program may connect to and bind
    (Landlock ABI 4; nothing else over TCP). Absent from a registration: none."""

    connect: list[int] = []
    bind: list[int] = []


class ToolRegistered(EventPayload, tag="tool.registered", kw_only=True, frozen=True):
    """A tool was registered, or re-registered with a change (a new version)."""

    STREAM = "tool:{name}"
    DELTA = (
        "creates the document {name, kind, version, spec, versions} (first version); "
        "then replaces /version, the changed /spec fields and adds /versions/N"
    )

    name: str
    version: int
    description: str = ""
    source: str = ""
    declared_input_schema: JSON = None
    input_schema: JSON = None  # normalised: closed objects
    input_schema_sha256: str | None = None
    declared_output_schema: JSON = None
    output_schema: JSON = None
    output_schema_sha256: str | None = None
    capability: str | None = None
    resource_slots: list[str] = []
    lifecycle: dict[str, JSON] = {}
    code: str | None = None
    command: list[str] | None = None  # argv template of a `command` tool
    mcp_server: str | None = None  # the MCP server's name
    mcp_tool_name: str | None = None
    # How the plane launches the MCP server to call the tool itself: the argv of a stdio
    # server, or the URL of a streamable-HTTP one (at most one). Absent: an MCP tool's
    # calls can only be recorded. Absent (not null) so older payloads keep their bytes.
    mcp_command: list[str] | msgspec.UnsetType = msgspec.UNSET
    mcp_url: str | msgspec.UnsetType = msgspec.UNSET
    timeout_ms: int | None = None
    # A cap on each of stdout and stderr in bytes; absent: the plane's default
    # (EVIDENCE_MAX_OUTPUT_BYTES, 4 MiB). Absent (not null) so older payloads keep their bytes.
    max_output_bytes: int | msgspec.UnsetType = msgspec.UNSET
    # What its confined program may reach over TCP; absent: nothing (and older payloads
    # keep their bytes).
    network: NetworkAccess | msgspec.UnsetType = msgspec.UNSET
    idempotent: bool = False
    writes: bool = False
    # The operator's (see PolicySignature); absent when unsigned, so old bytes stay.
    signed: PolicySignature | msgspec.UnsetType = msgspec.UNSET


class ValidationRegistered(ToolRegistered, tag="validation.registered", kw_only=True, frozen=True):
    """A validation was registered. It shares the tool namespace and stream."""

    STREAM = "tool:{name}"
    DELTA = (
        "as tool.registered (kind validation); the spec adds mode, executor, python, "
        "wraps, wraps_version and transform, and its output schema is always the "
        "structured result {passed, message?, data?}"
    )

    mode: Literal["required", "informational"]
    # mcp: a call of the tool `mcp_tool_name` of the server launched by `mcp_command` or
    # reached at `mcp_url`; its structuredContent is the structured result.
    executor: Literal["command", "python", "wrapped", "mcp"]
    python: str | None = None  # "module:function" for the python executor
    wraps: str | None = None
    wraps_version: int | None = None
    transform: str | None = None  # a JMESPath expression, pure by construction
    checkpointable: bool = False
    read_only: bool = True


class SkillDefined(EventPayload, tag="skill.defined", kw_only=True, frozen=True):
    """A skill (a named bundle of tools and validations) was defined or changed."""

    STREAM = "skill:{name}"
    DELTA = "sets description and members"

    name: str
    version: int
    description: str = ""
    members: list[str]
    signed: PolicySignature | msgspec.UnsetType = msgspec.UNSET


class AttachmentCreated(EventPayload, tag="attachment.created", kw_only=True, frozen=True):
    """A validation was attached to a resource at a scope."""

    STREAM = "attachment:{attachment_id}"
    DELTA = "creates the attachment document (status attached)"

    attachment_id: str
    validation: str
    validation_version: int
    resource: str
    scope: Literal["direct", "project", "plan"]
    project: str | None = None
    plan: str | None = None
    args: dict[str, JSON] = {}
    args_sha256: str
    signed: PolicySignature | msgspec.UnsetType = msgspec.UNSET


class AttachmentDetached(EventPayload, tag="attachment.detached", kw_only=True, frozen=True):
    """An attachment was removed; resolution as of earlier positions still sees it."""

    STREAM = "attachment:{attachment_id}"
    DELTA = "replaces /status with detached"

    attachment_id: str
    reason: str = ""
    signed: PolicySignature | msgspec.UnsetType = msgspec.UNSET


class ApproverKeyAdded(EventPayload, tag="approver_key.added", kw_only=True, frozen=True):
    """A person's Ed25519 public key was registered, endorsed by the plane key (the
    private key is never here): an approver's (decisions; its registration is policy,
    signed by an operator too) or an operator's (policy; the plane key alone makes an
    operator)."""

    STREAM = "approver:{name}"
    DELTA = "adds the key under /keys/<fingerprint> with status active"

    name: str
    public_key: str  # base64 of the raw 32-byte Ed25519 public key
    fingerprint: str  # SHA-256 hex of the raw public key
    # The plane key's signature over {name, public_key, fingerprint} (domain approver;
    # domain operator, with the role, for an operator key): a key nobody holding the
    # plane key registered is nobody's.
    endorsement: str
    # approver: decides escalations; operator: signs policy (registrations, attachments,
    # skills, approver keys, settings that weaken a gate).
    role: Literal["approver", "operator"] = "approver"
    # An operator's, for an approver key (absent for an operator key: the plane key's).
    signed: PolicySignature | msgspec.UnsetType = msgspec.UNSET
    # Where the endorsement was signed for (it covers this place); absent in the first
    # release's format, accepted only where it stands (see PolicySignature.place).
    place: SignedPlace | msgspec.UnsetType = msgspec.UNSET


class ApproverKeyRevoked(EventPayload, tag="approver_key.revoked", kw_only=True, frozen=True):
    """A key was revoked; decisions or policy signed with it are refused from now on. An
    operator signs the revocation (``signed``)."""

    STREAM = "approver:{name}"
    DELTA = "replaces /keys/<fingerprint>/status with revoked"

    name: str
    fingerprint: str
    reason: str = ""
    signed: PolicySignature | msgspec.UnsetType = msgspec.UNSET


class CredentialIssued(EventPayload, tag="credential.issued", kw_only=True, frozen=True):
    """An operator issued an agent credential for one plan: a bearer secret the plane's
    service accepts until ``expires_at`` (RFC 3339) or a revocation. Only the secret's
    SHA-256 is kept (the secret is 256 random bits: no slower hash is needed). Policy:
    an operator signs it (``signed``); an unsigned issuance authenticates nobody."""

    STREAM = "credential:{credential_id}"
    DELTA = "creates the document {credential_id, plan_id, role, secret_sha256, expires_at, status}"

    credential_id: str
    plan_id: str
    role: Literal["agent"] = "agent"
    secret_sha256: str
    expires_at: str
    signed: PolicySignature | msgspec.UnsetType = msgspec.UNSET


class CredentialRevoked(EventPayload, tag="credential.revoked", kw_only=True, frozen=True):
    """A credential was revoked: the service refuses it from now on. An operator signs
    the revocation (``signed``)."""

    STREAM = "credential:{credential_id}"
    DELTA = "replaces /status with revoked"

    credential_id: str
    reason: str = ""
    signed: PolicySignature | msgspec.UnsetType = msgspec.UNSET


class ApprovalPolicySet(EventPayload, tag="approval_policy.set", kw_only=True, frozen=True):
    """An operator set how every escalation of the ledger is decided, from this position
    on: by at least ``min_approvals`` approvers signing one choice (a plan may ask for
    more, never fewer), and, with ``separate_duties``, never by an approver who is the
    plan's operator (whose name signed its credential or its weakened configuration).
    Policy: an operator signs it (``signed``); the latest that counts is in force."""

    STREAM = "approval_policy"
    DELTA = "replaces the document with {min_approvals, separate_duties}"

    min_approvals: Annotated[int, msgspec.Meta(ge=1, le=9)] = 1
    separate_duties: bool = False
    signed: PolicySignature | msgspec.UnsetType = msgspec.UNSET


class LedgerIdentified(EventPayload, tag="ledger.identified", kw_only=True, frozen=True):
    """The plane key named this ledger: every later signature binds ``ledger_id`` (a
    signed event copied from another ledger does not verify here). Signed by the plane
    key (domain ``ledger``, bound to its place) over the id and the event's position.
    The first one that verifies where it stands counts; signatures in the first
    release's format are accepted only before it."""

    STREAM = "ledger"
    DELTA = "empty: the ledger stream keeps no document (the first identification counts)"

    ledger_id: str
    position: int
    signature: str
