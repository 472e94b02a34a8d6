"""The policy the plane trusts, folded once per ``Plane`` and kept up to date by position.

Policy — approver and operator keys, the registry (tools, validations, attachments),
skills, agent credentials — is what every decision is checked against, so without a
cache every gate check and every service request would read each of those streams and
verify each of their signatures again: the credential, the tool's registration and the
approver keys were half of the service's CPU per request (docs/performance.md).

``PolicyCache`` reads only what is new: each ``refresh`` asks for the policy events after
the log's size it last read to (one indexed query over the events since, that usually
returns no row), and judges each new one exactly as ``Authority`` judges it — in log
order, against the keys in force just before its position (``KeyRing``). A revocation
is therefore seen by the very next refresh: every ``Authority`` refreshes once, before
its first policy answer, through its own source (inside a write transaction, under the
ledger lock).

Why folding by position is sound: positions are given under the ledger lock and
committed in that order with the head that counts them, so a read that saw the log at
size S saw every event at or below S, and none can appear there later; and an event,
once read, is judged once (events never change; a database whose rows were edited in
place is ``evidence verify``'s to report, as for the checked plan prefixes the plane
already keeps). A write transaction that has
appended is never read into the cache: what it wrote is not yet committed and may never
be (``Authority`` then reads without the cache).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from commands.rules.approvals import Approvals
from commands.rules.trust import POLICY_TYPE_NAMES, Identity, PolicyFold
from ledger import RecordedEvent
from ledger.events import (
    ApproverKeyAdded,
    ApproverKeyRevoked,
    AttachmentCreated,
    AttachmentDetached,
    SkillDefined,
    ToolRegistered,
    ValidationRegistered,
)
from projections.documents import State

__all__ = ["POLICY_SCAN_TYPES", "PolicyCache", "PolicySource"]

APPROVER_TYPES = (ApproverKeyAdded.type_name(), ApproverKeyRevoked.type_name())
REGISTRY_TYPES = (
    AttachmentCreated.type_name(),
    AttachmentDetached.type_name(),
    ToolRegistered.type_name(),
    ValidationRegistered.type_name(),
)
SKILL_TYPES = (SkillDefined.type_name(),)
POLICY_SCAN_TYPES = POLICY_TYPE_NAMES  # every type the cache judges (``PolicyFold``)


class PolicySource(Protocol):
    """The one read a refresh needs: events of ``types`` after position ``after``, in
    position order, and the log's size that read saw."""

    def read_types_to_head(
        self, types: Sequence[str], after: int = 0
    ) -> tuple[int, list[RecordedEvent]]: ...


class PolicyCache:
    """Trusted policy as of ``position``: the approver-stream events that count, the
    trusted registry and skill events (for folds as of a position), each trusted policy
    stream's document (tools, attachments, skills, credentials, approvers), the
    ledger's identity, and why each scanned event that does not count does not
    (``problems``, by position)."""

    def __init__(self, plane_key: Callable[[], Ed25519PublicKey] | None) -> None:
        self.position = 0  # of the last policy event folded
        # The log's size as the last refresh read it: the next reads what came since
        # (from ``position`` it would scan every event after the last policy event).
        self.scanned = 0
        self._fold = PolicyFold(plane_key)  # the plane key is loaded once a signature needs it
        self.approvers: list[RecordedEvent] = []
        self.registry: list[RecordedEvent] = []
        self.skills: list[RecordedEvent] = []
        self.problems: dict[int, str] = {}
        self._looks = 0  # ``one_look`` scopes open
        self._looked = False  # refreshed inside the open scope

    def fork(self) -> PolicyCache:
        """A private copy to read a write transaction's own, uncommitted events into
        (they must never enter the shared cache: they may never be committed)."""
        twin = copy.copy(self)
        twin._fold = self._fold.copy()
        twin.approvers, twin.registry, twin.skills = (
            list(self.approvers),
            list(self.registry),
            list(self.skills),
        )
        twin.problems = dict(self.problems)
        twin._looks, twin._looked = 0, False
        return twin

    @property
    def identity(self) -> Identity | None:
        """The ledger's id as the plane key named it (None: not identified yet)."""
        return self._fold.ring.identity

    @contextmanager
    def one_look(self) -> Iterator[None]:
        """One request's look at the policy: inside, the first refresh outside a write
        transaction serves every later one outside a write transaction too (a request
        checked against the policy as it stood when it began finishes against it; a
        revocation binds the next request). A write transaction still reads what is new
        under its lock."""
        self._looks += 1
        try:
            yield
        finally:
            self._looks -= 1
            if not self._looks:
                self._looked = False

    def refresh(self, source: PolicySource, *, locked: bool = False) -> None:
        """Fold the policy events ``source`` holds after ``position`` (``locked``: the
        source is a write transaction, read under the ledger lock)."""
        if self._looked and not locked:
            return
        size, events = source.read_types_to_head(POLICY_SCAN_TYPES, self.scanned)
        for event in events:
            self._take(event)
        self.scanned = max(self.scanned, size)
        if self._looks and not locked:
            self._looked = True

    def _take(self, event: RecordedEvent) -> None:
        if event.position <= self.position:  # read twice (a racing page): judged once
            return
        problem = self._fold.take(event)
        if problem is None:
            kind = event.type
            if kind in APPROVER_TYPES:
                self.approvers.append(event)
            elif kind in REGISTRY_TYPES:
                self.registry.append(event)
            elif kind in SKILL_TYPES:
                self.skills.append(event)
        else:
            self.problems[event.position] = problem
        self.position = event.position

    def counts(self, event: RecordedEvent) -> bool:
        """Whether a scanned event counts (any other event is not policy)."""
        return event.position not in self.problems

    @property
    def approvals(self) -> Approvals:
        """The approval policy and each plan's operators, by position."""
        return self._fold.approvals

    def doc(self, stream: str) -> State | None:
        """A policy stream's document, folded from its trusted events only."""
        return self._fold.docs.get(stream)
