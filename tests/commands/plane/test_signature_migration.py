"""A ledger written by the previous release (signatures in the first format: no place)
keeps verifying and auditing clean under this one, and the plane goes on deciding from
its policy; but each of its signed events counts only where it stands: a copy of one,
into the same stream or any other, before or after the ledger's identification, is
ignored and named ``replayed_signature``.

The previous release is the real one: its code is taken from the repository's history
(``git archive``) and run in its own process to write the ledger."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import msgspec
import pytest

from commands.auditor.audit import audit
from commands.plane import Plane
from commands.plane.credentials import Unauthenticated, authenticate
from commands.plane.registry import register_tool
from commands.rules.signing import (
    load_or_create_operator_key,
    load_or_create_plane_key,
    policy_record,
    sign_record,
)
from ledger import RecordedEvent
from ledger.events import EventPayload, PolicySignature, ValidationRegistered
from ledger.verify import verify_store
from tests.helpers import REPO, forge

ROOT = REPO
# Where the repository's history is: this checkout, unless told (the mutation runner's
# copies of the tree have none, and name the checkout they were copied from).
GIT_ROOT = Path(os.environ.get("EVIDENCE_TEST_GIT_ROOT") or ROOT)
# The last commit of the release before signatures were bound to their place.
PREVIOUS_RELEASE = "72c64a344082faf6bff6c575c8e70ba265215ebc"
IN_CI = os.environ.get("CI", "").lower() == "true"

# Run under the previous release: a plan taken through an escalation, a signed
# decision, a passing run, its token and Apply; a credential issued, another revoked.
WRITE_OLD_LEDGER = """
import json, sys
from datetime import timedelta
from pathlib import Path
from commands.plane import Plane
from commands.plane.credentials import issue_credential, revoke_credential
from commands.plane.plans import create_plan
from tests.helpers import applied_plan
url, root = sys.argv[1], Path(sys.argv[2])
with Plane.open(url) as plane:
    applied_plan(plane, root)
    create_plan(plane, "P-2", project="api", resources=["repo:x"])
    kept = issue_credential(plane, "P-2", ttl=timedelta(hours=1))
    gone = issue_credential(plane, "P-2", ttl=timedelta(hours=1))
    revoke_credential(plane, gone.credential_id)
    print(json.dumps({"kept": kept.token, "gone": gone.token, "gone_id": gone.credential_id}))
"""


def _previous_release(into: Path) -> Path:
    try:
        archive = subprocess.run(
            ["git", "archive", PREVIOUS_RELEASE, "ledger", "projections", "commands", "tests"],
            cwd=GIT_ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        if IN_CI:
            pytest.fail(f"the previous release is not in the repository's history: {exc}")
        pytest.skip(f"the previous release is not in the repository's history: {exc}")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


@pytest.fixture
def old_ledger(db_url: str, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A ledger the previous release wrote (its plane key is this test's)."""
    code = _previous_release(tmp_path / "previous")
    work = tmp_path / "old"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run(
        [sys.executable, "-c", WRITE_OLD_LEDGER, db_url, str(work)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return db_url, json.loads(done.stdout.strip().splitlines()[-1])


def _audit(plane: Plane) -> list[tuple[int | None, str]]:
    report = audit(
        plane.store, plane_public_key=load_or_create_plane_key(plane.store.url).public_key()
    )
    return [(v.position, v.invariant) for v in report.violations]


def test_an_old_ledger_verifies_audits_clean_and_is_still_policy(
    old_ledger: tuple[str, dict[str, str]],
) -> None:
    url, tokens = old_ledger
    with Plane.open(url) as plane:
        assert plane.log().identity() is None  # the old release never identified it
        assert verify_store(plane.store).ok
        assert _audit(plane) == []
        # Its policy still counts where it stands: the old credential authenticates, the
        # revoked one does not, its tools and keys are the plane's.
        assert authenticate(plane, tokens["kept"]).plan_id == "P-2"
        with pytest.raises(Unauthenticated, match="revoked"):
            authenticate(plane, tokens["gone"])
        assert plane.log().tool("status") is not None
        # This release's first signature identifies the ledger, and signs in place.
        register_tool(plane, {"name": "new", "command": ["true"]})
        identity = plane.log().identity()
        assert identity is not None
        assert plane.log().tool("new") is not None
        assert authenticate(plane, tokens["kept"]).plan_id == "P-2"
        assert verify_store(plane.store).ok
        assert _audit(plane) == []


def test_old_signed_events_count_only_where_they_stand(
    old_ledger: tuple[str, dict[str, str]],
) -> None:
    url, tokens = old_ledger
    with Plane.open(url) as plane:
        issuance = plane.store.read_stream(f"credential:{tokens['gone_id']}")[0]
        registration = plane.store.read_stream("tool:status")[0]
        # Before the identification: a copy is a second occurrence of its signature.
        revived = "01J00000000000000000000003"
        before = forge(plane.store, f"credential:{revived}", issuance.payload)[0]
        secret = tokens["gone"].rsplit("_", 1)[1]
        with pytest.raises(Unauthenticated):
            authenticate(plane, f"evd_{revived}_{secret}")
        register_tool(plane, {"name": "new", "command": ["true"]})  # identifies the ledger
        # After it: no signature in the old format counts at all, a copy of one that
        # stands before it, or one never seen here (made for another ledger, say).
        after = forge(plane.store, "tool:status", registration.payload)[0]
        elsewhere = forge(plane.store, "tool:status", _first_format_v2(plane, registration))[0]
        tool = plane.log().tool("status")
        assert tool is not None and tool.version == 1
        found = _audit(plane)
        for position in (before, after, elsewhere):
            assert (position, "replayed_signature") in found


def _first_format_v2(plane: Plane, registration: RecordedEvent) -> EventPayload:
    """Version 2 of ``registration``'s validation (always passing), signed by the
    operator's key in the first release's format (no place): a signature this ledger
    has never held."""
    key = load_or_create_operator_key(plane.store.url)
    assert key is not None
    old = registration.payload
    assert isinstance(old, ValidationRegistered) and isinstance(old.signed, PolicySignature)
    v2 = msgspec.structs.replace(old, version=2, command=["true"], signed=msgspec.UNSET)
    signature = sign_record(key, policy_record(v2), domain="policy")
    return msgspec.structs.replace(
        v2, signed=msgspec.structs.replace(old.signed, signature=signature)
    )
