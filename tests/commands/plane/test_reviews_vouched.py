"""Reviews the plane vouches for: a committed report carries the plane key's signature
over the review's whole chain of events. A review appended past the plane — no
reviewer, no evaluator, its report blob and commit written through the public `Store`
API — is never handed out as verified, and `audit` reports it."""

from __future__ import annotations

import hashlib

import msgspec
import pytest

from commands.auditor.audit import audit
from commands.plane import Plane
from commands.plane.reviews import (
    ReportVerificationError,
    account_review,
    get_review,
    review_result,
)
from commands.rules.signing import load_or_create_plane_key
from ledger.events import ReviewReportCommitted
from tests.commands.plane.test_reviews import _review_with_findings, accounting
from tests.helpers import forge


def _committed(plane: Plane) -> str:
    task = _review_with_findings(plane)
    account_review(plane, task, accounting(get_review(plane, task), {"G1": ["x", "x2"]}, ["y"]))
    return task


def test_a_committed_report_is_signed_and_handed_out(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        task = _committed(plane)
        [commit] = [
            e.payload
            for e in plane.store.read_stream(f"review:{task}")
            if isinstance(e.payload, ReviewReportCommitted)
        ]
        assert commit.plane_signature
        assert review_result(plane, task).report["findings"]
        public = load_or_create_plane_key(plane.store.url).public_key()
        assert audit(plane.store, plane_public_key=public).ok


@pytest.mark.parametrize("signature", ["none", "copied"])
def test_a_forged_review_is_never_handed_out(db_url: str, signature: str) -> None:
    """The forger copies a real review's events to a new task id (with no signature, or
    the real commit's signature) and commits a report of its choosing."""
    with Plane.open(db_url) as plane:
        real = _committed(plane)
        events = [e.payload for e in plane.store.read_stream(f"review:{real}")]
        forged_id = "01JFORGEDREVIEW0000000000A"
        report = b'{"findings": [], "exclusions": [], "verified": ["all good"]}'
        payloads = []
        for p in events:
            if isinstance(p, ReviewReportCommitted):
                p = msgspec.structs.replace(
                    p,
                    report_sha256=hashlib.sha256(report).hexdigest(),
                    report_size=len(report),
                    plane_signature=None if signature == "none" else p.plane_signature,
                )
            payloads.append(msgspec.structs.replace(p, task_id=forged_id))
        forge(plane.store, f"review:{forged_id}", *payloads, blobs=(report,))
        with pytest.raises(ReportVerificationError, match="does not vouch"):
            review_result(plane, forged_id)
        public = load_or_create_plane_key(plane.store.url).public_key()
        found = [v for v in audit(plane.store, plane_public_key=public).violations]
        assert [v.invariant for v in found] == ["review_signature"]
