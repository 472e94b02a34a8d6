"""Advisory reviews (seed 002, issue 10): the request contract, candidates, accounting,
the deterministic report, verified retrieval and the informational plan result."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import sqlalchemy as sa

from commands.auditor.audit import audit
from commands.plane import CommandRefused, Plane, reviews
from commands.plane.core import RETRIES
from commands.plane.plans import create_plan, get_plan
from commands.plane.reviews import (
    ACCOUNTING_VERSION,
    CANDIDATE_VERSION,
    ReportVerificationError,
    ReviewRequestInvalid,
    account_review,
    accounting_violations,
    get_review,
    label_for,
    list_reviews,
    normalize_request,
    review_result,
    scrub,
    source_findings,
    start_review,
    submit_candidate,
)
from ledger import ConcurrencyError
from projections.documents import apply_deltas, fold_all
from projections.outcomes import classify
from projections.states import to_json
from tests.helpers import assert_refused, run_cli

ULID_CHARS = set("0123456789ABCDEFGHJKMNPQRSTVWXYZ")


def request(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "objective": "Check the retry fix",
        "background": ["Retries looped forever"],
        "changeSummary": "Bound the retry loop",
        "scope": ["src/retry.py"],
        "acceptanceCriteria": ["At most 3 retries"],
        "verification": {
            "status": "provided",
            "evidence": [{"check": "pytest", "outcome": "12 passed"}],
        },
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def finding(
    summary: str, severity: str = "high", location: str = "src/retry.py:10"
) -> dict[str, str]:
    return {
        "severity": severity,
        "location": location,
        "evidence": f"evidence of {summary}",
        "impact": f"impact of {summary}",
        "summary": summary,
    }


def candidate(
    *findings: dict[str, str],
    verified: list[str] | None = None,
    limitations: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "schema_version": CANDIDATE_VERSION,
        "findings": list(findings),
        "verified": verified or [],
        "limitations": limitations or [],
    }


def accounting(
    doc: dict[str, Any], groups: dict[str, list[str]], excluded: list[str]
) -> dict[str, Any]:
    """A valid accounting, written the way an evaluator would: by finding content
    (summaries), naming labels and ids in its rationale text."""
    sources = source_findings(doc)
    ids = {s["summary"]: s["id"] for s in sources}
    decisions = []
    for group, summaries in groups.items():
        decisions += [
            {
                "finding": ids[s],
                "decision": "include",
                "group": group,
                "rationale": f"reviewer {ids[s][0]} found {ids[s]}",
            }
            for s in summaries
        ]
    decisions += [
        {
            "finding": ids[s],
            "decision": "exclude",
            "rationale": f"out of scope ({ids[s]}, candidate {ids[s][0]})",
        }
        for s in excluded
    ]
    return {
        "schema_version": ACCOUNTING_VERSION,
        "validation_accounting": {
            "source_findings": sources,
            "decisions": decisions,
            "groups": [
                {
                    "id": g,
                    "members": [ids[s] for s in summaries],
                    "rationale": "reviewers "
                    + " and ".join(ids[s][0] for s in summaries)
                    + " report the same defect",
                }
                for g, summaries in groups.items()
            ],
        },
    }


@pytest.fixture
def plane(db_url: str) -> Iterator[Plane]:
    with Plane.open(db_url) as p:
        yield p


def review_events(plane: Plane) -> list[str]:
    return [e.type for e in plane.store.read_all() if e.stream.startswith("review:")]


# -- the request: normalisation ------------------------------------------------------------


def test_valid_request_is_normalised_recorded_and_receipted(plane: Plane) -> None:
    raw = request(
        objective="  Check the retry fix \n",
        background=["  a ", "b\t"],
        verification={
            "status": " provided ",
            "evidence": [{"check": " pytest ", "outcome": " 12 passed "}],
        },
    )
    task_id = start_review(plane, json.dumps(raw))
    assert len(task_id) == 26 and set(task_id) <= ULID_CHARS
    # Durable preflight: the event is in the log when the receipt is returned.
    [started] = plane.store.read_stream(f"review:{task_id}")
    assert started.type == "review.started"
    assert started.payload.request == {
        "objective": "Check the retry fix",
        "background": ["a", "b"],
        "changeSummary": "Bound the retry loop",
        "scope": ["src/retry.py"],
        "acceptanceCriteria": ["At most 3 retries"],
        "verification": {
            "status": "provided",
            "evidence": [{"check": "pytest", "outcome": "12 passed"}],
        },
        "knownLimitations": [],
        "exclusions": [],
    }
    assert get_review(plane, task_id).status == "started"


@pytest.mark.parametrize("field", ["knownLimitations", "exclusions"])
def test_optional_lists_default_to_empty_and_are_trimmed(field: str) -> None:
    assert normalize_request(request())[field] == []
    assert normalize_request(request(**{field: ["  x  "]}))[field] == ["x"]


@pytest.mark.parametrize(
    "pointer, raw",
    [
        ("/objective", request(objective=" \t ")),
        ("/changeSummary", request(changeSummary="\n")),
        ("/background/1", request(background=["ok", "   "])),
        ("/scope/0", request(scope=["  "])),
        ("/acceptanceCriteria/0", request(acceptanceCriteria=[""])),
        ("/knownLimitations/0", request(knownLimitations=[" "])),
        ("/exclusions/0", request(exclusions=["\t"])),
        (
            "/verification/evidence/0/check",
            request(
                verification={"status": "provided", "evidence": [{"check": " ", "outcome": "ok"}]}
            ),
        ),
        (
            "/verification/evidence/0/outcome",
            request(
                verification={"status": "provided", "evidence": [{"check": "t", "outcome": " "}]}
            ),
        ),
        ("/verification/reason", request(verification={"status": "not_run", "reason": "  "})),
    ],
)
def test_whitespace_only_text_is_rejected_at_its_pointer(pointer: str, raw: dict) -> None:
    with pytest.raises(ReviewRequestInvalid) as refused:
        normalize_request(raw)
    assert [(v.pointer, v.message) for v in refused.value.violations] == [
        (pointer, "must not be empty or whitespace-only")
    ]


@pytest.mark.parametrize(
    "pointer, raw",
    [
        ("/extra", {**request(), "extra": 1}),
        (
            "/verification/extra",
            request(verification={"status": "not_run", "reason": "r", "extra": True}),
        ),
        (
            "/verification/evidence/0/extra",
            request(
                verification={
                    "status": "provided",
                    "evidence": [{"check": "c", "outcome": "o", "extra": "x"}],
                }
            ),
        ),
    ],
)
def test_the_schema_is_closed_at_every_level(pointer: str, raw: dict) -> None:
    with pytest.raises(ReviewRequestInvalid) as refused:
        normalize_request(raw)
    assert [v.pointer for v in refused.value.violations] == [pointer]
    assert "closed" in refused.value.violations[0].message


@pytest.mark.parametrize(
    "field",
    ["objective", "background", "changeSummary", "scope", "acceptanceCriteria", "verification"],
)
def test_every_required_field_is_required(field: str) -> None:
    with pytest.raises(ReviewRequestInvalid) as refused:
        normalize_request(request(**{field: None}))
    assert [v.pointer for v in refused.value.violations] == [f"/{field}"]


@pytest.mark.parametrize("field", ["scope", "acceptanceCriteria"])
def test_scope_and_acceptance_criteria_need_an_item(field: str) -> None:
    with pytest.raises(ReviewRequestInvalid) as refused:
        normalize_request(request(**{field: []}))
    assert [(v.pointer, v.message) for v in refused.value.violations] == [
        (f"/{field}", "expected at least 1 items")
    ]


# -- the request: the verification cross-field rule --------------------------------------

EVIDENCE = [{"check": "pytest", "outcome": "12 passed"}]


@pytest.mark.parametrize(
    "verification, expected",
    [
        (
            {"status": "provided"},
            [("/verification/evidence", "status provided needs non-empty evidence")],
        ),
        (
            {"status": "provided", "evidence": []},
            [("/verification/evidence", "status provided needs non-empty evidence")],
        ),
        (
            {"status": "provided", "evidence": EVIDENCE, "reason": "also this"},
            [("/verification/reason", "status provided forbids reason")],
        ),
        ({"status": "not_run"}, [("/verification/reason", "status not_run needs a reason")]),
        (
            {"status": "not_run", "reason": "no CI", "evidence": EVIDENCE},
            [("/verification/evidence", "status not_run forbids non-empty evidence")],
        ),
        (
            {"status": "skipped", "reason": "r"},
            [
                (
                    "/verification/status",
                    'enum_mismatch: expected one of ["provided","not_run"], got string',
                )
            ],
        ),
    ],
)
def test_verification_cross_field_rule(verification: dict, expected: list) -> None:
    with pytest.raises(ReviewRequestInvalid) as refused:
        normalize_request(request(verification=verification))
    assert [(v.pointer, v.message) for v in refused.value.violations] == expected


@pytest.mark.parametrize(
    "verification, normalised",
    [
        (
            {"status": "provided", "evidence": EVIDENCE},
            {"status": "provided", "evidence": EVIDENCE},
        ),
        (
            {"status": "not_run", "reason": " no CI runner "},
            {"status": "not_run", "evidence": [], "reason": "no CI runner"},
        ),
        (
            {"status": "not_run", "reason": "no CI runner", "evidence": []},
            {"status": "not_run", "evidence": [], "reason": "no CI runner"},
        ),
    ],
)
def test_verification_valid_cases(verification: dict, normalised: dict) -> None:
    assert normalize_request(request(verification=verification))["verification"] == normalised


def test_legacy_prompt_request_gets_a_migration_error_showing_the_new_shape() -> None:
    with pytest.raises(ReviewRequestInvalid) as refused:
        normalize_request({"prompt": "please review my retry change"})
    message = str(refused.value)
    assert "/prompt" in message and "legacy {prompt}" in message
    for field in (
        "objective",
        "background",
        "changeSummary",
        "scope",
        "acceptanceCriteria",
        '"status": "provided"',
        '"status": "not_run"',
        "knownLimitations",
    ):
        assert field in message


def test_invalid_request_lists_every_violation_exits_2_and_appends_nothing(
    db_url: str, tmp_path: Path
) -> None:
    bad = request(
        objective=" ", scope=[], extra=1, verification={"status": "provided", "reason": "r"}
    )
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    result = run_cli("review", "start", str(path), "--db", db_url, "--json")
    assert_refused(
        result,
        "5 violation(s)",
        "/objective",
        "/scope",
        "/extra",
        "/verification/evidence",
        "/verification/reason",
    )
    assert [v["pointer"] for v in json.loads(result.stdout)["violations"]] == [
        "/extra",
        "/objective",
        "/scope",
        "/verification/evidence",
        "/verification/reason",
    ]
    with Plane.open(db_url) as plane:
        assert plane.store.head().size == 0


def test_legacy_prompt_via_cli_is_refused(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "legacy.json"
    path.write_text('{"prompt": "review this"}')
    assert_refused(
        run_cli("review", "start", str(path), "--db", db_url), "legacy {prompt}", '"objective"'
    )


def test_start_prints_the_receipt_after_commit(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "req.json"
    path.write_text(json.dumps(request()))
    result = run_cli("review", "start", str(path), "--db", db_url, "--json")
    assert result.returncode == 0, result.stderr
    receipt = json.loads(result.stdout)
    assert list(receipt) == ["task_id"]
    with Plane.open(db_url) as plane:
        assert get_review(plane, receipt["task_id"]).status == "started"
    plain = run_cli("review", "start", str(path), "--db", db_url)
    assert plain.returncode == 0 and len(plain.stdout.strip()) == 26


def test_start_with_an_unknown_plan_is_refused(plane: Plane) -> None:
    with pytest.raises(CommandRefused, match="unknown plan"):
        start_review(plane, request(), plan_id="P-404")
    assert plane.store.head().size == 0


# -- candidates ----------------------------------------------------------------------------


def test_labels_follow_submission_order_and_ids_are_host_assigned(plane: Plane) -> None:
    task = start_review(plane, request())
    first = submit_candidate(plane, task, candidate(finding("x"), finding("y")), reviewer="zed")
    second = submit_candidate(plane, task, candidate(finding("z")), reviewer="amy")
    assert (first.label, first.finding_ids) == ("A", ["A-F001", "A-F002"])
    assert (second.label, second.finding_ids) == ("B", ["B-F001"])
    doc = get_review(plane, task)
    assert [s["id"] for s in source_findings(doc)] == ["A-F001", "A-F002", "B-F001"]
    assert doc.candidates["A"].reviewer == "zed"
    assert [label_for(i) for i in (0, 2, 25, 26, 27)] == ["A", "C", "Z", "AA", "AB"]


def test_invalid_candidate_is_recorded_as_that_reviewers_limitation(plane: Plane) -> None:
    task = start_review(plane, request())
    bad = {
        "schema_version": CANDIDATE_VERSION,
        "findings": [{**finding("x"), "severity": "blocker", "extra": 1}],
        "verified": [],
    }
    result = submit_candidate(plane, task, bad, reviewer="rev")
    assert not result.valid and result.label == "A"
    assert result.errors == [
        "/findings/0/extra: not allowed: the schema is closed",
        '/findings/0/severity: enum_mismatch: expected one of ["critical","high","minor"], '
        "got string",
        "/limitations: missing (required array)",
    ]
    recorded = get_review(plane, task).candidates["A"]
    assert recorded.valid is False and recorded.findings == []
    assert len(recorded.limitations) == 1 and "/findings/0/extra" in recorded.limitations[0]
    # Not JSON at all is recorded too.
    assert not submit_candidate(plane, task, b"{not json", reviewer="other").valid


def test_invalid_candidate_via_cli_exits_1_and_is_recorded(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        task = start_review(plane, request())
    path = tmp_path / "c.json"
    path.write_text('{"schema_version": "v0"}')
    result = run_cli(
        "review", "submit", task, str(path), "--reviewer", "r", "--db", db_url, "--json"
    )
    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout)["submission"]["valid"] is False
    with Plane.open(db_url) as plane:
        assert get_review(plane, task).candidates["A"].valid is False


def test_a_reviewer_submits_once(plane: Plane) -> None:
    task = start_review(plane, request())
    submit_candidate(plane, task, candidate(), reviewer="rev")
    with pytest.raises(CommandRefused, match="already submitted"):
        submit_candidate(plane, task, candidate(), reviewer="rev")


def test_submissions_after_accounting_are_refused(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        task = start_review(plane, request())
        submit_candidate(plane, task, candidate(finding("x")), reviewer="a")
        account_review(plane, task, accounting(get_review(plane, task), {"G1": ["x"]}, []))
        size = plane.store.head().size
    path = tmp_path / "c.json"
    path.write_text(json.dumps(candidate(finding("late"))))
    assert_refused(
        run_cli("review", "submit", task, str(path), "--reviewer", "b", "--db", db_url),
        "completed",
        "before accounting",
    )
    with Plane.open(db_url) as plane:
        assert plane.store.head().size == size


def test_submissions_after_a_rejected_accounting_are_refused(plane: Plane) -> None:
    task = start_review(plane, request())
    submit_candidate(plane, task, candidate(finding("x")), reviewer="a")
    account_review(plane, task, {"schema_version": ACCOUNTING_VERSION})
    with pytest.raises(CommandRefused, match="repair"):
        submit_candidate(plane, task, candidate(), reviewer="b")


# -- accounting rules ----------------------------------------------------------------------

SOURCES = [
    {"id": "A-F001", **finding("x")},
    {"id": "A-F002", **finding("y", "minor")},
    {"id": "B-F001", **finding("x2")},
]


def good_accounting() -> dict[str, Any]:
    return {
        "schema_version": ACCOUNTING_VERSION,
        "validation_accounting": {
            "source_findings": copy.deepcopy(SOURCES),
            "decisions": [
                {"finding": "A-F001", "decision": "include", "group": "G1", "rationale": "real"},
                {"finding": "B-F001", "decision": "include", "group": "G1", "rationale": "dup"},
                {"finding": "A-F002", "decision": "exclude", "rationale": "cosmetic"},
            ],
            "groups": [{"id": "G1", "members": ["A-F001", "B-F001"]}],
        },
    }


def _body(a: dict[str, Any]) -> dict[str, Any]:
    return a["validation_accounting"]


Mutation = Callable[[dict[str, Any]], None]

ACCOUNTING_CASES: list[tuple[str, Mutation, list[tuple[str, str]]]] = [
    (
        "missing decision",
        lambda a: _body(a)["decisions"].pop(2),
        [("/validation_accounting/decisions", "no decision for source finding A-F002")],
    ),
    (
        "duplicate decision",
        lambda a: _body(a)["decisions"].append(
            {"finding": "A-F002", "decision": "exclude", "rationale": "again"}
        ),
        [
            (
                "/validation_accounting/decisions/3/finding",
                "A-F002 is decided twice (also at /validation_accounting/decisions/2)",
            )
        ],
    ),
    (
        "include without group",
        lambda a: _body(a)["decisions"][0].pop("group"),
        [
            ("/validation_accounting/decisions/0", "include of A-F001 needs a group"),
            (
                "/validation_accounting/groups/0/members/0",
                "A-F001 is not included into group 'G1' by a decision",
            ),
        ],
    ),
    (
        "exclude with group",
        lambda a: _body(a)["decisions"][2].update(group="G1"),
        [("/validation_accounting/decisions/2/group", "exclude of A-F002 forbids a group")],
    ),
    (
        "group member not included",
        lambda a: _body(a)["groups"][0]["members"].append("A-F002"),
        [
            (
                "/validation_accounting/groups/0/members/2",
                "A-F002 is not included into group 'G1' by a decision",
            )
        ],
    ),
    (
        "included finding not a member",
        lambda a: _body(a)["groups"][0]["members"].pop(),
        [
            (
                "/validation_accounting/groups/0/members",
                "B-F001 is included into group 'G1' but is not a member",
            )
        ],
    ),
    (
        "include into an unknown group",
        lambda a: _body(a)["decisions"][1].update(group="G9"),
        [
            ("/validation_accounting/decisions/1/group", "no group 'G9'"),
            (
                "/validation_accounting/groups/0/members/1",
                "B-F001 is not included into group 'G1' by a decision",
            ),
        ],
    ),
    (
        "altered source finding",
        lambda a: _body(a)["source_findings"][1].update(impact="worse than said"),
        [("/validation_accounting/source_findings/1/impact", "differs from source finding A-F002")],
    ),
    (
        "missing source finding",
        lambda a: _body(a)["source_findings"].pop(0),
        [("/validation_accounting/source_findings", "source finding A-F001 is missing")],
    ),
    (
        "duplicate source finding",
        lambda a: _body(a)["source_findings"].append(copy.deepcopy(SOURCES[0])),
        [
            (
                "/validation_accounting/source_findings/3/id",
                "A-F001 is copied twice (also at /validation_accounting/source_findings/0)",
            )
        ],
    ),
    (
        "invented source finding",
        lambda a: _body(a)["source_findings"].append({"id": "C-F001", **finding("new")}),
        [("/validation_accounting/source_findings/3/id", "C-F001 is not a source finding")],
    ),
    (
        "decision on an unknown finding",
        lambda a: _body(a)["decisions"].append(
            {"finding": "Z-F001", "decision": "exclude", "rationale": "?"}
        ),
        [("/validation_accounting/decisions/3/finding", "Z-F001 is not a source finding")],
    ),
    (
        "closed schema",
        lambda a: _body(a)["groups"][0].update(title="extra"),
        [("/validation_accounting/groups/0/title", "not allowed: the schema is closed")],
    ),
]


@pytest.mark.parametrize(
    "mutate, expected", [c[1:] for c in ACCOUNTING_CASES], ids=[c[0] for c in ACCOUNTING_CASES]
)
def test_accounting_rule(mutate: Mutation, expected: list[tuple[str, str]]) -> None:
    assert accounting_violations(good_accounting(), SOURCES) == []
    bad = good_accounting()
    mutate(bad)
    assert [(v.pointer, v.message) for v in accounting_violations(bad, SOURCES)] == expected


def test_every_violation_is_listed_at_once() -> None:
    bad = good_accounting()
    _body(bad)["decisions"].pop(2)
    _body(bad)["decisions"][0].pop("group")
    _body(bad)["source_findings"][1]["summary"] = "changed"
    assert len(accounting_violations(bad, SOURCES)) == 4


def _review_with_findings(plane: Plane, **kw: Any) -> str:
    task = start_review(plane, request(), **kw)
    submit_candidate(plane, task, candidate(finding("x"), finding("y", "minor")), reviewer="alice")
    submit_candidate(plane, task, candidate(finding("x2")), reviewer="bob")
    return task


def test_a_rejected_accounting_is_recorded_and_one_repair_is_allowed(plane: Plane) -> None:
    task = _review_with_findings(plane)
    good = accounting(get_review(plane, task), {"G1": ["x", "x2"]}, ["y"])
    bad = copy.deepcopy(good)
    _body(bad)["decisions"].pop()
    first = account_review(plane, task, bad)
    assert (first.accepted, first.attempt, first.status) == (False, 1, "repair")
    doc = get_review(plane, task)
    assert doc.rejections == [
        ["/validation_accounting/decisions: no decision for source finding A-F002"]
    ]
    repaired = account_review(plane, task, good)
    assert (repaired.accepted, repaired.attempt, repaired.status) == (True, 2, "completed")
    assert review_events(plane)[-3:] == [
        "review.accounting_rejected",
        "review.accounted",
        "review.report_committed",
    ]


def test_a_second_failure_fails_the_review(db_url: str, tmp_path: Path) -> None:
    with Plane.open(db_url) as plane:
        task = _review_with_findings(plane)
        good = accounting(get_review(plane, task), {"G1": ["x", "x2"]}, ["y"])
    bad = copy.deepcopy(good)
    _body(bad)["decisions"][2]["group"] = "G1"
    path, good_path = tmp_path / "bad.json", tmp_path / "good.json"
    path.write_text(json.dumps(bad))
    good_path.write_text(json.dumps(good))
    first = run_cli("review", "account", task, str(path), "--db", db_url, "--json")
    assert first.returncode == 1
    assert json.loads(first.stdout)["accounting"]["status"] == "repair"
    second = run_cli("review", "account", task, str(path), "--db", db_url)
    assert second.returncode == 1 and "the review failed" in second.stdout
    assert "exclude of A-F002 forbids a group" in second.stdout
    with Plane.open(db_url) as plane:
        doc = get_review(plane, task)
        assert doc.status == "failed" and doc.accounting_attempts == 2
        assert review_events(plane)[-2:] == ["review.accounting_rejected", "review.failed"]
        size = plane.store.head().size
    assert_refused(run_cli("review", "account", task, str(good_path), "--db", db_url), "failed")
    assert_refused(run_cli("review", "result", task, "--db", db_url), "no report")
    with Plane.open(db_url) as plane:
        assert plane.store.head().size == size


def test_a_stream_that_keeps_moving_ends_in_a_concurrency_error(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When every retry meets a conflict the caller gets the ConcurrencyError (one
    ``error:`` line in the CLI), not a TypeError from building one wrongly."""
    task = _review_with_findings(plane)
    good = accounting(get_review(plane, task), {"G1": ["x", "x2"]}, ["y"])
    calls = []

    def conflicting_commit(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        raise ConcurrencyError(f"review:{task}", 3, 4)

    monkeypatch.setattr(reviews, "_commit", conflicting_commit)
    with pytest.raises(ConcurrencyError, match=f"review:{task}"):
        account_review(plane, task, good)
    assert len(calls) == RETRIES


def test_accounting_without_candidates_is_refused(plane: Plane) -> None:
    task = start_review(plane, request())
    with pytest.raises(CommandRefused, match="no candidate"):
        account_review(plane, task, {})


# -- the report ---------------------------------------------------------------------------


def test_report_content(plane: Plane) -> None:
    task = start_review(plane, request())
    submit_candidate(
        plane,
        task,
        candidate(finding("x"), finding("y", "minor"), verified=["tests pass"]),
        reviewer="alice",
    )
    submit_candidate(
        plane,
        task,
        candidate(
            finding("x2", "critical"),
            verified=["tests pass", "lint clean"],
            limitations=["no network"],
        ),
        reviewer="bob",
    )
    submit_candidate(plane, task, {"schema_version": "v0"}, reviewer="carol")
    account_review(plane, task, accounting(get_review(plane, task), {"G1": ["x", "x2"]}, ["y"]))
    report = review_result(plane, task).report
    [group] = report["findings"]
    # Included findings preserved whole, merged into one entry, most severe first.
    assert group["severity"] == "critical" and group["reports"] == 2
    assert group["findings"] == [finding("x2", "critical"), finding("x")]
    # Excluded findings only as exclusions.
    assert [e["finding"] for e in report["exclusions"]] == [finding("y", "minor")]
    assert report["verified"] == ["lint clean", "tests pass"]
    assert report["limitations"][1] == "no network"
    assert report["limitations"][0].startswith(
        f"a candidate report failed the {CANDIDATE_VERSION} schema"
    )
    assert report["candidates"] == {"submitted": 3, "valid": 2}
    # No labels, no source ids anywhere in the rationale texts.
    assert group["rationale"] == ["a reviewer found [finding]", "reviewers report the same defect"]
    assert report["exclusions"][0]["rationale"] == "out of scope ([finding], a reviewer)"


def test_scrub_removes_labels_and_source_ids() -> None:
    labels = ["A", "B", "C"]
    assert scrub("A-F001 and B-F012 match", labels) == "[finding] and [finding] match"
    assert scrub("Reviewer A agrees with candidates B and C", labels) == (
        "a reviewer agrees with reviewers"
    )
    assert scrub("reviewers A, B & C", labels) == "reviewers"
    assert scrub("A real issue (report C)", labels) == "A real issue (a reviewer)"
    assert scrub("reviewer D", labels) == "reviewer D"  # not a label of this review


def _run_review(plane: Plane, order: list[tuple[str, dict[str, Any]]]) -> bytes:
    task = start_review(plane, request(knownLimitations=["read live"]))
    for reviewer, report in order:
        submit_candidate(plane, task, report, reviewer=reviewer)
    doc = get_review(plane, task)
    account_review(plane, task, accounting(doc, {"G1": ["x", "x2"], "G2": ["z"]}, ["y", "w"]))
    return review_result(plane, task).report_bytes


def test_report_is_deterministic_in_any_submission_order(plane: Plane) -> None:
    reports = {
        "alice": candidate(
            finding("x"), finding("y", "minor"), verified=["v1"], limitations=["l1"]
        ),
        "bob": candidate(finding("z", "critical"), finding("x2"), verified=["v2", "v1"]),
        "carol": candidate(finding("w", "minor"), limitations=["l0"]),
    }
    orders = [["alice", "bob", "carol"], ["carol", "bob", "alice"], ["bob", "alice", "carol"]]
    rendered = {_run_review(plane, [(r, reports[r]) for r in order]) for order in orders}
    assert len(rendered) == 1
    # Equal content under other reviewer names renders the same bytes too.
    renamed = [(f"x-{r}", reports[r]) for r in ["bob", "carol", "alice"]]
    assert _run_review(plane, renamed) in rendered
    report = msgspec.json.decode(rendered.pop())
    assert [g["severity"] for g in report["findings"]] == ["critical", "high"]


def test_result_verifies_and_returns_the_whole_report(db_url: str) -> None:
    long_evidence = "line of evidence " * 2000
    tasks = []
    with Plane.open(db_url) as plane:
        for _ in range(2):  # a report is handed out once: one for each form
            task = start_review(plane, request())
            submit_candidate(
                plane, task, candidate({**finding("x"), "evidence": long_evidence}), reviewer="a"
            )
            outcome = account_review(
                plane, task, accounting(get_review(plane, task), {"G1": ["x"]}, [])
            )
            assert plane.store.get_blob(outcome.report_sha256) is not None
            tasks.append(task)
    as_json = run_cli("review", "result", tasks[0], "--db", db_url, "--json")
    assert as_json.returncode == 0, as_json.stderr
    body = json.loads(as_json.stdout)
    assert body["verified"] is True and body["report_sha256"] == outcome.report_sha256
    assert body["report"]["findings"][0]["findings"][0]["evidence"] == long_evidence.strip()
    text = run_cli("review", "result", tasks[1], "--db", db_url)
    assert text.returncode == 0 and long_evidence.strip() in text.stdout
    # Handed out once: a second call refuses, saying when and to whom, and shows nothing.
    again = run_cli("review", "result", tasks[0], "--db", db_url)
    assert_refused(again, "already handed out", body["handed_out"]["at"], body["handed_out"]["to"])
    assert long_evidence.strip() not in again.stdout


def test_tampered_report_fails_retrieval(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        task = start_review(plane, request())
        submit_candidate(plane, task, candidate(finding("x")), reviewer="a")
        digest = account_review(
            plane, task, accounting(get_review(plane, task), {"G1": ["x"]}, [])
        ).report_sha256
        backend = plane.store.backend
    attacker = sa.create_engine(db_url)
    try:
        with attacker.begin() as conn:
            if backend == "sqlite":
                conn.exec_driver_sql("DROP TRIGGER blobs_no_update")
            else:
                conn.exec_driver_sql("DROP TRIGGER blobs_append_only ON blobs")
            forged = conn.execute(
                sa.text("SELECT data FROM blobs WHERE digest = :d"), {"d": digest}
            ).scalar_one()
            forged = bytes(forged).replace(b"evidence of x", b"evidence of y")
            updated = conn.execute(
                sa.text("UPDATE blobs SET data = :data WHERE digest = :d"),
                {"data": forged, "d": digest},
            )
            assert updated.rowcount == 1
    finally:
        attacker.dispose()
    with Plane.open(db_url) as plane, pytest.raises(ReportVerificationError):
        review_result(plane, task)
    result = run_cli("review", "result", task, "--db", db_url, "--json")
    assert result.returncode == 1
    assert json.loads(result.stdout)["verified"] is False
    assert "fails verification" in result.stderr and "Traceback" not in result.stderr
    assert "evidence of y" not in result.stdout


# -- the plan link ---------------------------------------------------------------------------


def test_linked_plan_gets_an_informational_result_that_never_gates(plane: Plane) -> None:
    create_plan(plane, "P-1", project="proj", resources=["repo:api"])
    before = get_plan(plane, "P-1")
    task = _review_with_findings(plane, plan_id="P-1")
    outcome = account_review(
        plane, task, accounting(get_review(plane, task), {"G1": ["x", "x2"]}, ["y"])
    )
    events = plane.store.read_stream("plan:P-1")
    result = events[-1]
    assert result.type == "validation.result_recorded"
    payload = msgspec.to_builtins(result.payload)
    assert payload["mode"] == "informational" and payload["verdict"] is None
    assert payload["validation"] == "fusion_validate" and payload["run_id"] == task
    assert payload["raw_output_sha256"] == outcome.report_sha256
    assert payload["data"] == {
        "review_task_id": task,
        "advisory": True,
        "status": "completed",
        "report_sha256": outcome.report_sha256,
        "findings": 1,
        "exclusions": 1,
    }
    # Committed in the same transaction as the report.
    review_end = plane.store.read_stream(f"review:{task}")[-1]
    assert review_end.position == result.position - 1
    # It never gates: the plan document and its outcome are untouched.
    assert get_plan(plane, "P-1") == before
    # Not a required validation: alone it is no pass, and it never turns a pass into
    # anything else.
    assert classify([payload])[1] == "no_required_validation"
    required = {"validation": "t", "mode": "required", "verdict": True, "cause": None}
    assert classify([payload, required]) == classify([required])
    assert audit(plane.store).ok
    outcomes = plane.projections.document("outcomes", "P-1")
    assert outcomes is None or not outcomes[0].results


def test_a_failed_linked_review_is_recorded_on_the_plan(plane: Plane) -> None:
    create_plan(plane, "P-2", project="proj", resources=["repo:api"])
    task = _review_with_findings(plane, plan_id="P-2")
    for _ in range(2):
        account_review(plane, task, {"schema_version": ACCOUNTING_VERSION})
    payload = plane.store.read_stream("plan:P-2")[-1].payload
    assert payload.type_name() == "validation.result_recorded"
    assert payload.mode == "informational" and payload.data["status"] == "failed"
    assert payload.error is not None


# -- reading, and the stream document ------------------------------------------------------


def test_list_and_show(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        create_plan(plane, "P-1", project="proj", resources=["repo:api"])
        linked = _review_with_findings(plane, plan_id="P-1")
        other = start_review(plane, request())
        assert [d.task_id for d in list_reviews(plane)] == [linked, other]
    listed = run_cli("review", "list", "--plan", "P-1", "--db", db_url, "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)["reviews"]
    assert row == {
        "task_id": linked,
        "status": "started",
        "plan_id": "P-1",
        "objective": "Check the retry fix",
        "hosted": False,
        "candidates": 2,
        "accounting_attempts": 0,
        "report_sha256": None,
        "handed_out": None,
    }
    table = run_cli("review", "list", "--db", db_url)
    assert linked in table.stdout and other in table.stdout
    shown = run_cli("review", "show", linked, "--db", db_url, "--json")
    body = json.loads(shown.stdout)
    assert [s["id"] for s in body["source_findings"]] == ["A-F001", "A-F002", "B-F001"]
    assert body["review"]["candidates"]["B"]["reviewer"] == "bob"
    text = run_cli("review", "show", linked, "--db", db_url)
    assert "A-F002" in text.stdout and "alice" in text.stdout
    assert_refused(
        run_cli("review", "show", "01ARZ3NDEKTSV4RRFFQ69G5FAV", "--db", db_url), "unknown review"
    )


def test_deltas_rebuild_the_review_document(plane: Plane) -> None:
    task = _review_with_findings(plane)
    account_review(plane, task, {"schema_version": ACCOUNTING_VERSION})
    account_review(plane, task, accounting(get_review(plane, task), {"G1": ["x", "x2"]}, ["y"]))
    events = plane.store.read_stream(f"review:{task}")
    stream = f"review:{task}"
    assert (
        apply_deltas(e.delta for e in events)
        == to_json(fold_all(stream, [e.payload for e in events]))
        == to_json(get_review(plane, task))
    )
