"""What the plane decides from: streams folded from the events table, never a read model.

The ``rm_*`` tables are query caches with no triggers: anyone holding the database file
can edit them, so no decision reads them. Every authority fact — a plan's phase, binding
set, pending decision, retry budget and token; approver keys and revocations; a tool's
registered versions; the attachments in force — is folded here from the events themselves,
inside the deciding transaction (``Plane.run``) or, for reads that need no lock, from a
plain snapshot of the store.

A plan's stream is also *checked* as it is folded, so that no decision rests on events a
writer appended past the plane: every event must be a legal transition
(``projections.plan_rules``), every binding set must be exactly what applied when it was
pinned, and every human decision must carry a valid signature by the approver key in
force at its position over its escalation's leaf hash. A plan whose history fails a
check is refused (``TamperedPlan``); ``evidence audit`` names the same position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from commands.errors import CommandRefused
from commands.rules.approvals import Approvals, duties_problem, escalation_problem
from commands.rules.trust import (
    ApproverKey,
    Identity,
    decision_problem,
    expiry_problem,
    needs_operator,
    token_signed,
)
from commands.runner.sandbox import change_set_problem
from ledger import RecordedEvent, Store
from ledger.events import (
    ApproverKeyAdded,
    ApproverKeyRevoked,
    ChangesRecorded,
    DecisionRecorded,
    Escalated,
    EscalationExpired,
    ExecuteEntered,
    PlanCreated,
    ResolvedAttachment,
    SkillPin,
    TokenMinted,
    ToolRegistered,
    ValidationResultRecorded,
    ValidationRunStarted,
)
from projections.documents import State, fold, fold_plan
from projections.plan_rules import broken_rule
from projections.resolution import pin_binding, resolve_plan
from projections.states import (
    AttachmentState,
    PlanState,
    SkillState,
    ToolSpec,
    ToolState,
)

from .policy import APPROVER_TYPES, REGISTRY_TYPES, PolicyCache

__all__ = [
    "APPROVER_TYPES",
    "REGISTRY_TYPES",
    "Authority",
    "EventSource",
    "Identity",
    "StoreSource",
    "StreamState",
    "TamperedPlan",
]


class TamperedPlan(CommandRefused):
    """The plan's stream holds an event the plane would never have written."""

    def __init__(self, plan_id: str, position: int, rule: str) -> None:
        self.position, self.rule = position, rule
        super().__init__(
            f"plan {plan_id}'s log breaks a rule at position {position} "
            f"({rule}): the plane will not act on it; `evidence audit` "
            "reports it"
        )


class EventSource(Protocol):
    """Reads of the events table: inside a write transaction (``ledger.WriteTx``) or
    from the store."""

    def read_stream(self, stream: str, from_version: int = 1) -> list[RecordedEvent]: ...
    def read_types(self, types: Sequence[str], after: int = 0) -> list[RecordedEvent]: ...
    def read_types_to_head(
        self, types: Sequence[str], after: int = 0
    ) -> tuple[int, list[RecordedEvent]]: ...
    def present_blobs(self, digests: Sequence[str]) -> set[str]: ...

    def get_blob(self, digest: str) -> bytes | None: ...


class StoreSource:
    """An ``EventSource`` over the store, each read its own short transaction."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def read_stream(self, stream: str, from_version: int = 1) -> list[RecordedEvent]:
        return self.store.read_stream(stream, from_version)

    def read_types(self, types: Sequence[str], after: int = 0) -> list[RecordedEvent]:
        return self.store.read_types(types, after)

    def read_types_to_head(
        self, types: Sequence[str], after: int = 0
    ) -> tuple[int, list[RecordedEvent]]:
        return self.store.read_types_to_head(types, after)

    def present_blobs(self, digests: Sequence[str]) -> set[str]:
        return self.store.present_blobs(digests)

    def get_blob(self, digest: str) -> bytes | None:
        return self.store.get_blob(digest)


S = TypeVar("S", bound=State)


class StreamState:
    """A stream's state and version (0 and ``None`` for a new stream), folded from the
    events table, and the ``log`` it was read from (for the other streams a decision
    needs, read in the same transaction). ``doc`` is the state Struct of the stream's
    kind (``projections.states``: ``PlanState`` for ``plan:`` …); read it as that type
    with ``of``."""

    __slots__ = ("doc", "log", "stream", "version")

    def __init__(
        self, stream: str, doc: State | None, version: int, log: Authority | None = None
    ) -> None:
        self.stream, self.doc, self.version, self.log = stream, doc, version, log

    @property
    def exists(self) -> bool:
        return self.version > 0

    def of(self, kind: type[S]) -> S | None:
        """The state as ``kind``, the state Struct of the stream's kind (``None``: no
        document yet)."""
        doc = self.doc
        if doc is None or isinstance(doc, kind):
            return doc
        raise TypeError(f"{self.stream} holds a {type(doc).__name__}, not a {kind.__name__}")

    def existing(self, kind: type[S]) -> S:
        """``of(kind)`` for a stream that has its document (one a command just wrote)."""
        doc = self.of(kind)
        if doc is None:
            raise LookupError(f"{self.stream} has no document")
        return doc


# Checked plan prefixes, shared by every Authority of one Plane: events never change, so a
# prefix checked once stays checked (a long-lived plane reads only what is new).
# version, doc, tokens minted, runs started
Checked = dict[str, tuple[int, PlanState | None, frozenset[str], frozenset[str]]]


PlaneKey = Callable[[], Ed25519PublicKey]


class Authority:
    """Folds and checks streams from one ``EventSource``. ``plane_key`` gives the plane's
    public key (loaded only when a signature must be checked). The trusted policy comes
    from a ``PolicyCache``: the plane's own (``policy``), brought up to date through
    ``source`` once, at the first question that needs it; a private copy of it when the
    source is a write transaction that has appended (its own events are not committed:
    they must not enter a cache that outlives it); a fresh one without."""

    def __init__(
        self,
        source: EventSource,
        checked: Checked | None = None,
        plane_key: PlaneKey | None = None,
        policy: PolicyCache | None = None,
    ) -> None:
        self.source = source
        self._plane_key = plane_key
        self._checked: Checked = {} if checked is None else checked
        self._policy_cache = policy
        self._fresh: PolicyCache | None = None

    def _policy(self) -> PolicyCache:
        """The trusted policy as of this source, refreshed through it once."""
        if self._fresh is None:
            shared = self._policy_cache
            if shared is None:
                cache = PolicyCache(self._plane_key)
            elif getattr(self.source, "appended", False):
                cache = shared.fork()
            else:
                cache = shared
            cache.refresh(self.source, locked=not isinstance(self.source, StoreSource))
            self._fresh = cache
        return self._fresh

    def identity(self) -> Identity | None:
        """The ledger's id as the plane key named it (``ledger.identified``), and where."""
        return self._policy().identity

    # -- streams ----------------------------------------------------------------------

    def state(self, stream: str) -> StreamState:
        """The stream folded from its events; a plan's stream is checked as well."""
        if stream.startswith("plan:"):
            return self._plan(stream)
        doc: State | None = None
        events = self.source.read_stream(stream)
        for event in self._trusted(events):  # unsigned policy is nobody's: skipped
            doc = fold(stream, doc, event.payload)
        return StreamState(stream, doc, events[-1].stream_version if events else 0, self)

    def tool(self, name: str) -> ToolState | None:
        """A tool's (or validation's) state with every registered version."""
        doc = self._policy().doc(f"tool:{name}")
        return doc if isinstance(doc, ToolState) else None

    def policy_doc(self, stream: str) -> State | None:
        """A policy stream's document folded from its trusted events only (a credential,
        an attachment …)."""
        return self._policy().doc(stream)

    def tool_version(self, name: str, version: int | None) -> ToolSpec | None:
        """The spec of one registered version (the current one when ``version`` is None)."""
        doc = self.tool(name)
        if doc is None:
            return None
        if version is None:
            return doc.spec
        return doc.versions.get(str(version))

    def registered_tools(self) -> list[ToolState]:
        """Every tool and validation as the registry holds it (policy an operator
        signed only), by name."""
        events = self._registered_tools()
        found = [d for d in _fold_streams(events, None).values() if isinstance(d, ToolState)]
        return sorted(found, key=lambda doc: doc.name)

    def mcp_tools(self, server: str, tool_name: str) -> list[str]:
        """The registered tools whose current version is ``tool_name`` on MCP server
        ``server`` (``mcp_server`` / ``mcp_tool_name``), by name."""
        events = self._registered_tools()
        return sorted(
            doc.name
            for doc in _fold_streams(events, None).values()
            if isinstance(doc, ToolState)
            and doc.spec.mcp_server == server
            and doc.spec.mcp_tool_name == tool_name
        )

    def server_sources(self, server: str) -> set[str]:
        """Where the registered tools of MCP server ``server`` came from (their
        ``source``): an upstream (``mcp:COMMAND`` or ``mcp:URL``), which the proxy
        registered them from, or anything else (an operator registered them): a server
        name is bound to whoever first registered its tools."""
        events = self._registered_tools()
        return {
            doc.spec.source
            for doc in _fold_streams(events, None).values()
            if isinstance(doc, ToolState) and doc.spec.mcp_server == server
        }

    def _registered_tools(self) -> list[RecordedEvent]:
        """The trusted ``tool.registered`` events (not validations), in log order."""
        name = ToolRegistered.type_name()
        return [e for e in self._policy().registry if e.type == name]

    def present_blobs(self, digests: Sequence[str]) -> set[str]:
        """Which of ``digests`` the blob store holds."""
        return self.source.present_blobs(list(dict.fromkeys(digests))) if digests else set()

    # -- the registry and approvers, folded from their events -------------------------

    def applicable(self, plan: PlanState, *, before: int | None = None) -> list[ResolvedAttachment]:
        """The attachments that apply to ``plan`` (as of just before position ``before``)."""
        attachments, tools = self._fold_registry(before)
        return resolve_plan(attachments.values(), tools, plan)

    def approver_keys(self, *, before: int | None = None) -> dict[str, ApproverKey]:
        """Every trusted key by fingerprint (``KeyRing``), with its status and role, as of
        before ``before``. A key the plane key did not endorse is nobody's."""
        keys: dict[str, ApproverKey] = {}
        for event in self._policy().approvers:
            if before is not None and event.position >= before:
                break
            p = event.payload
            if isinstance(p, ApproverKeyAdded):
                keys[p.fingerprint] = ApproverKey(p.name, p.public_key, "active", p.role)
            elif isinstance(p, ApproverKeyRevoked):
                key = keys.get(p.fingerprint)
                if key is not None and key.name == p.name:
                    key.status = "revoked"
        return keys

    def approvals(self) -> Approvals:
        """The approval policy in force and each plan's operators, by position."""
        return self._policy().approvals

    def policy_ok(self, event: RecordedEvent) -> bool:
        """Whether the plane may decide from this event: not policy, or policy an
        operator signed with a key in force at its position, standing where it was
        signed for."""
        return not needs_operator(event.payload) or self._policy().counts(event)

    def _trusted(self, events: list[RecordedEvent]) -> list[RecordedEvent]:
        return [e for e in events if self.policy_ok(e)]

    def _fold_registry(
        self, before: int | None
    ) -> tuple[dict[str, AttachmentState], dict[str, ToolState]]:
        docs = _fold_streams(self._policy().registry, before)
        attachments = {s: d for s, d in docs.items() if isinstance(d, AttachmentState)}
        tools = {
            d.name: d for d in docs.values() if isinstance(d, ToolState) and d.kind == "validation"
        }
        return attachments, tools

    # -- a plan, checked --------------------------------------------------------------

    def _plan(self, stream: str) -> StreamState:
        plan_id = stream.partition(":")[2]
        version, doc, tokens, started = self._checked.get(
            stream, (0, None, frozenset(), frozenset())
        )
        events = self.source.read_stream(stream, version + 1)
        minted, runs = set(tokens), set(started)
        for event in events:
            p = event.payload
            rule = broken_rule(stream, doc, p) or self._event_problem(
                stream, doc, event, minted, runs
            )
            if rule is not None:
                raise TamperedPlan(plan_id, event.position, rule)
            if isinstance(p, TokenMinted):
                minted.add(p.token_id)
            elif isinstance(p, ValidationRunStarted):
                runs.add(p.run_id)
            doc = fold_plan(doc, p)
            version = event.stream_version
        self._checked[stream] = (version, doc, frozenset(minted), frozenset(runs))
        return StreamState(stream, doc, version, self)

    def _event_problem(
        self,
        stream: str,
        doc: PlanState | None,
        event: RecordedEvent,
        minted: set[str],
        runs: set[str],
    ) -> str | None:
        """What the plane's authority finds wrong with a plan's ``event`` that its
        transition rule allows (None: nothing), given the plan before it and the tokens
        minted and runs started so far."""
        p = event.payload
        if isinstance(p, ExecuteEntered) and doc is not None:
            found = self._binding_problem(doc, p, event.position)
            return found or self._skills_problem(doc, p, event.position)
        if isinstance(p, PlanCreated) and not self.policy_ok(event):
            return self._policy().problems[event.position]
        if isinstance(p, ChangesRecorded) and doc is not None:
            return change_set_problem(doc, list(p.changes), self.source.get_blob)
        if isinstance(p, TokenMinted):
            return self._token_problem(p, minted)
        if isinstance(p, ValidationResultRecorded) and doc is not None:
            return _closed_run_problem(doc, p, runs)
        if isinstance(p, Escalated) and doc is not None:
            return escalation_problem(p, doc.global_config, self.approvals(), event.position)
        if isinstance(p, DecisionRecorded):
            return decision_problem(
                p,
                self._escalation_leaf(stream, p.decision_id),
                self.approver_keys(before=event.position).get(p.key_fingerprint),
            ) or duties_problem(p, self.approvals(), event.position)
        if isinstance(p, EscalationExpired) and self._plane_key is not None:
            leaf = self._escalation_leaf(stream, p.decision_id)
            return expiry_problem(p, leaf, self._plane_key())
        return None

    def _token_problem(self, p: TokenMinted, minted: set[str]) -> str | None:
        """A token is minted once (a replayed mint would revive a superseded token), and
        by the plane key (its signature over the claims)."""
        if p.token_id in minted:
            return f"token {p.token_id} is minted once"
        if self._plane_key is not None and not token_signed(p, self._plane_key()):
            return f"token {p.token_id} is signed by the plane key"
        return None

    def _binding_problem(self, doc: PlanState, p: ExecuteEntered, position: int) -> str | None:
        expected = pin_binding(doc.binding, self.applicable(doc, before=position))
        if list(p.binding) != expected:
            return "the binding set pinned at Execute is every attachment that applied then"
        return None

    def _skills_problem(self, doc: PlanState, p: ExecuteEntered, position: int) -> str | None:
        """The first pins of a plan's skills are the registry's skills then (later ones
        repeat them: a plan rule)."""
        if doc.skill_pins is not msgspec.UNSET or p.skills is msgspec.UNSET:
            return None
        if p.skills != self.skill_pins(list(p.skills), before=position):
            return "a plan's skills are pinned as the registry defined them at its first Execute"
        return None

    def skill_pins(self, names: Sequence[str], *, before: int | None = None) -> dict[str, SkillPin]:
        """Each named skill's version and members as the registry defines them (as of
        before position ``before``); a skill not defined is left out."""
        docs = _fold_streams(self._policy().skills, before)
        found = {name: docs.get(f"skill:{name}") for name in names}
        return {
            name: SkillPin(version=doc.version, members=list(doc.members))
            for name, doc in found.items()
            if isinstance(doc, SkillState)
        }

    def _escalation_leaf(self, stream: str, decision_id: str) -> bytes | None:
        for event in self.source.read_stream(stream):
            if isinstance(event.payload, Escalated) and event.payload.decision_id == decision_id:
                return event.leaf_hash
        return None


def _closed_run_problem(doc: PlanState, p: ValidationResultRecorded, runs: set[str]) -> str | None:
    """A result of a run the plan started belongs inside it, while it is open: an
    informational one outside any run is an advisory review's (``plan_rules``), but
    none is added to a run that has completed."""
    if p.run_id in runs and p.run_id != doc.current_run:
        return f"a result belongs inside its open run (run {p.run_id} has completed)"
    return None


def _fold_streams(events: list[RecordedEvent], before: int | None) -> dict[str, State | None]:
    """Each stream's state, folded from ``events`` (in position order) up to just
    before position ``before``."""
    docs: dict[str, State | None] = {}
    for event in events:
        if before is not None and event.position >= before:
            break
        docs[event.stream] = fold(event.stream, docs.get(event.stream), event.payload)
    return docs
