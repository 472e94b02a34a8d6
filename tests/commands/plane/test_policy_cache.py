"""The plane's policy cache (``commands.plane.policy``): a long-lived plane — the
service's — folds the trusted policy once and reads only what is new. The attacks: an
operator's revocation or re-registration made by another process must bind the long-lived
plane at its very next question; what the agent appends without an operator key must stay
ignored; and what a write transaction appended but never committed must never enter the
cache."""

from __future__ import annotations

from datetime import timedelta

import pytest

from commands.plane import Plane
from commands.plane.authority import Authority, StoreSource
from commands.plane.credentials import (
    Unauthenticated,
    authenticate,
    issue_credential,
    revoke_credential,
)
from commands.plane.gates import gate_input
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool
from ledger import NewEvent, StreamAppend
from ledger.events import CredentialIssued, CredentialRevoked
from tests.helpers import forge, forge_credential

HOUR = timedelta(hours=1)
SCHEMA_V1 = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
SCHEMA_V2 = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "rev": {"type": "string"}},
    "required": ["path", "rev"],
}


def _ledger(url: str) -> None:
    with Plane.open(url) as operator:
        register_tool(operator, {"name": "read", "command": ["true"], "input_schema": SCHEMA_V1})
        create_plan(operator, "P-1", project="api", resources=["repo:api"])
        record_strategy(operator, "P-1", "read")
        enter_execute(operator, "P-1")


def test_a_revocation_by_another_process_binds_a_warm_plane_at_once(db_url: str) -> None:
    _ledger(db_url)
    with Plane.open(db_url) as operator, Plane.open(db_url) as service:
        issued = issue_credential(operator, "P-1", ttl=HOUR)
        assert authenticate(service, issued.token).status == "active"  # the cache is warm
        # The agent's forged revocation of someone else's credential revokes nothing …
        forge(
            service.store,
            f"credential:{issued.credential_id}",
            CredentialRevoked(credential_id=issued.credential_id, reason="forged"),
        )
        assert authenticate(service, issued.token).status == "active"
        # … the operator's, from another plane, at the next request.
        revoke_credential(operator, issued.credential_id, "rotated")
        with pytest.raises(Unauthenticated, match="revoked"):
            authenticate(service, issued.token)


def test_an_issuance_the_agent_appends_never_authenticates_a_warm_plane(db_url: str) -> None:
    _ledger(db_url)
    with Plane.open(db_url) as operator, Plane.open(db_url) as service:
        authenticate(service, issue_credential(operator, "P-1", ttl=HOUR).token)
        token = forge_credential(service.store, "P-1")
        with pytest.raises(Unauthenticated, match="none an operator signed"):
            authenticate(service, token)


def test_a_new_registration_reaches_a_warm_plane_at_its_next_check(db_url: str) -> None:
    _ledger(db_url)
    with Plane.open(db_url) as operator, Plane.open(db_url) as service:
        assert gate_input(service, "P-1", "read", b'{"path": "a"}').passed
        register_tool(operator, {"name": "read", "command": ["true"], "input_schema": SCHEMA_V2})
        second = gate_input(service, "P-1", "read", b'{"path": "a"}')
        assert (second.passed, second.check.tool_version) == (False, 2)
        assert [d.kind for d in second.check.deviations] == ["missing_required"]


def test_the_cache_answers_as_the_uncached_authority_does(db_url: str) -> None:
    """After signed and forged policy alike, a warm plane's answers are exactly those of
    an authority folding everything from the log."""
    _ledger(db_url)
    with Plane.open(db_url) as operator, Plane.open(db_url) as service:
        kept = issue_credential(operator, "P-1", ttl=HOUR)
        gone = issue_credential(operator, "P-1", ttl=HOUR)
        service.log().tool("read")  # warm
        revoke_credential(operator, gone.credential_id)
        forge(
            service.store,
            f"credential:{kept.credential_id}",
            CredentialRevoked(credential_id=kept.credential_id, reason="forged"),
        )
        register_tool(operator, {"name": "read", "command": ["true"], "input_schema": SCHEMA_V2})
        cached = service.log()
        uncached = Authority(StoreSource(service.store), plane_key=service.plane_public_key)
        for stream in (f"credential:{kept.credential_id}", f"credential:{gone.credential_id}"):
            assert cached.policy_doc(stream) == uncached.policy_doc(stream)
        assert cached.tool("read") == uncached.tool("read")
        assert cached.approver_keys() == uncached.approver_keys()
        assert cached.registered_tools() == uncached.registered_tools()


def test_what_a_transaction_appended_never_enters_the_cache(db_url: str) -> None:
    """Policy read inside a write transaction after its own append is read around the
    cache: the transaction may still roll back."""
    _ledger(db_url)
    with Plane.open(db_url) as plane:
        plane.log().tool("read")  # warm
        cache = plane._policy
        before = cache.position
        issued = CredentialIssued(
            credential_id="01J00000000000000000000001",
            plan_id="P-1",
            secret_sha256="0" * 64,
            expires_at="2099-01-01T00:00:00.000000Z",
        )
        stream = f"credential:{issued.credential_id}"
        with pytest.raises(RuntimeError, match="roll back"), plane.store.write() as tx:
            tx.append_batch([StreamAppend(stream, [NewEvent(payload=issued)], 0)])
            assert tx.appended
            log = Authority(tx, plane_key=plane.plane_public_key, policy=cache)
            assert log.policy_doc(stream) is None  # unsigned: folded around the cache
            assert cache.position == before  # and the cache did not read it
            raise RuntimeError("roll back")
        assert plane.store.read_stream(stream) == []
        assert cache.position == before


def test_one_look_serves_a_request_and_the_next_request_looks_again(db_url: str) -> None:
    """Inside ``one_look`` (one service request) the policy is read once; a revocation
    committed meanwhile binds the next request, and a write transaction always reads
    what is new under its lock."""
    _ledger(db_url)
    with Plane.open(db_url) as operator, Plane.open(db_url) as service:
        issued = issue_credential(operator, "P-1", ttl=HOUR)
        with service.one_look():
            assert authenticate(service, issued.token).status == "active"
            revoke_credential(operator, issued.credential_id)
            assert authenticate(service, issued.token).status == "active"  # this request
            with service.store.write() as tx:
                locked = Authority(tx, plane_key=service.plane_public_key, policy=service._policy)
                doc = locked.policy_doc(f"credential:{issued.credential_id}")
                assert doc is not None and doc.status == "revoked"
        with pytest.raises(Unauthenticated, match="revoked"):
            authenticate(service, issued.token)


class _Recording:
    """The plane's store as a policy source, noting where each refresh read from."""

    def __init__(self, plane: Plane) -> None:
        self.store, self.asked = plane.store, list[int]()

    def read_types_to_head(self, types, after=0):  # type: ignore[no-untyped-def]
        self.asked.append(after)
        return self.store.read_types_to_head(types, after)


def test_a_refresh_reads_only_what_came_since_the_last(db_url: str) -> None:
    """The next refresh starts at the log's size the last one read, not at the last
    policy event: from there every request would read past every gate check since (a
    cost that grows with the log, measured in docs/performance.md)."""
    _ledger(db_url)
    with Plane.open(db_url) as plane:
        for _ in range(3):
            assert gate_input(plane, "P-1", "read", b'{"path": "a"}').passed
        cache, source = plane._policy, _Recording(plane)
        cache.refresh(source)
        head = plane.store.head().size
        assert cache.position < head == cache.scanned
        cache.refresh(source)
        assert source.asked[-1] == head
