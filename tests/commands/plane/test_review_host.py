"""The review host (``evidence review run|wait|result``): advisory reviews whose reviewers
are programs, run as a background task (seed 002's fusion_validate).

The reviewers are the small deterministic programs in ``tests/reviewers/``, run for
real; the host runs in this process (``host_review``) where the roles are the point, and
as the detached process ``review run`` starts where the background task is."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from commands.auditor.audit import audit
from commands.plane import CommandRefused, Plane
from commands.plane.plans import create_plan
from commands.plane.review_host import (
    host_review,
    lock_path,
    preflight_sha256,
    run_review,
    wait_review,
)
from commands.plane.review_inputs import load_reviewers, parse_reviewers
from commands.plane.reviews import (
    AlreadyHandedOut,
    account_review,
    get_review,
    review_result,
    source_findings,
    start_review,
    submit_candidate,
)
from ledger.events import ReviewHostScheduled, ReviewStarted
from projections.states import to_json
from tests.commands.plane.test_reviews import accounting, candidate, finding
from tests.helpers import TESTS, assert_refused, forge, run_cli

REVIEWERS = TESTS / "reviewers"
NO_USABLE = "a candidate reviewer returned no usable report: "


def program(name: str, *args: str) -> list[str]:
    return ["python", str(REVIEWERS / f"{name}.py"), *args]


def reviewers(
    *candidates: tuple[str, list[str]] | tuple[str, list[str], float],
    evaluator: list[str] | None = None,
    **roles: list[str] | dict[str, Any],
) -> dict[str, Any]:
    """A reviewers configuration: (name, argv[, timeout_s]) candidates, the evaluator
    (default: tests/reviewers/evaluator.py), and repair/merger as argv or a full entry."""
    if not candidates:
        candidates = (("alice", program("candidate")), ("bob", program("candidate")))
    config: dict[str, Any] = {
        "candidates": [
            {"name": c[0], "command": c[1], **({"timeout_s": c[2]} if len(c) > 2 else {})}
            for c in candidates
        ],
        "evaluator": {"command": evaluator or program("evaluator")},
    }
    for role, value in roles.items():
        config[role] = value if isinstance(value, dict) else {"command": value}
    return config


def request(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "objective": "Check the retry fix",
        "background": ["Retries looped forever"],
        "changeSummary": "Bound the retry loop",
        "scope": ["src", "README.md"],
        "acceptanceCriteria": ["At most 3 retries"],
        "verification": {"status": "not_run", "reason": "no tests yet"},
    }
    base.update(changes)
    return base


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository: the scope (src/, README.md) and a file outside it."""
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    (root / "src" / "retry.py").write_text("def retry():\n    while True:\n        pass\n")
    (root / "README.md").write_text("# TODO: write the docs\n")
    (root / "secret.txt").write_text("not in the scope\n")
    return root


@pytest.fixture(autouse=True)
def _records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reviewer programs run confined (seed 002's tool policy, kernel-enforced): the
    files a test reviewer records what it saw in are in a directory the operator lets
    them write (EVIDENCE_CONFINE_WRITE), beside the ledger, never one holding it."""
    (tmp_path / "records").mkdir()
    monkeypatch.setenv("EVIDENCE_CONFINE_WRITE", str(tmp_path / "records"))


def unconfined_plan(plane: Plane, repo: Path) -> str:
    """A plan that opted out of confinement (``confinement: none``): its reviews' programs
    run as they are, and the host's own detection is what catches a write."""
    create_plan(plane, "P-U", project="api", resources=[str(repo)], config={"confinement": "none"})
    return "P-U"


def hosted(
    plane: Plane, repo: Path, config: dict[str, Any], plan_id: str | None = None, **kw: Any
) -> str:
    """Preflight, then the host in this process; returns the task id."""
    receipt = run_review(
        plane,
        request(**kw),
        parse_reviewers(config, "test"),
        repository=repo,
        start=False,
        plan_id=plan_id,
    )
    host_review(plane, receipt.task_id)
    return receipt.task_id


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def types(plane: Plane, task: str) -> list[str]:
    return [e.type for e in plane.store.read_stream(f"review:{task}")]


@pytest.fixture
def plane(sqlite_url: str) -> Iterator[Plane]:
    with Plane.open(sqlite_url) as p:
        yield p


# -- through the CLI, on both backends -----------------------------------------------------


def _write(
    tmp_path: Path, config: dict[str, Any], req: dict[str, Any] | None = None
) -> tuple[str, str]:
    (tmp_path / "request.json").write_text(json.dumps(req or request()))
    plain = json.loads(json.dumps(config))  # no shared nodes: YAML anchors are refused
    (tmp_path / "reviewers.yaml").write_text(yaml.safe_dump(plain))
    return str(tmp_path / "request.json"), str(tmp_path / "reviewers.yaml")


@pytest.mark.slow
def test_run_wait_result_through_the_cli(db_url: str, tmp_path: Path, repo: Path) -> None:
    config = reviewers(
        ("alice", program("candidate")),
        ("bob", program("candidate", "--pattern", "while True", "--severity", "critical")),
        merger=program("merger"),
    )
    req, cfg = _write(tmp_path, config)
    before = files(repo)
    ran = run_cli(
        "review", "run", req, "--reviewers", cfg, "--repo", str(repo), "--db", db_url, "--json"
    )
    assert ran.returncode == 0, ran.stderr
    receipt = json.loads(ran.stdout)
    task = receipt["task_id"]

    waited = run_cli("review", "wait", task, "--timeout", "120", "--db", db_url, "--json")
    assert waited.returncode == 0, (waited.stdout, waited.stderr)
    end = json.loads(waited.stdout)
    assert end["status"] == "completed" and end["timed_out"] is False

    got = run_cli("review", "result", task, "--as", "carol", "--db", db_url, "--json")
    assert got.returncode == 0, got.stderr
    body = json.loads(got.stdout)
    assert body["verified"] is True and body["report_sha256"] == end["report_sha256"]
    assert body["handed_out"]["to"] == "carol"
    report = body["report"]
    assert report["candidates"] == {"submitted": 2, "valid": 2}
    assert [(g["severity"], g["summary"], g["reports"]) for g in report["findings"]] == [
        ("critical", "while True in src/retry.py", 2),
        ("high", "TODO in README.md", 1),
    ]
    assert report["summary"] == "2 finding group(s), 0 exclusion(s); most severe: critical"
    # Handed out once: the second call says when and to whom, and shows no report.
    again = run_cli("review", "result", task, "--db", db_url, "--json")
    assert_refused(again, "already handed out", body["handed_out"]["at"], "to carol")
    assert json.loads(again.stdout) == {"task_id": task, "handed_out": body["handed_out"]}
    assert "while True" not in again.stdout

    assert files(repo) == before  # read-only: the repository is untouched
    with Plane.open(db_url) as plane:
        kinds = types(plane, task)
        assert kinds[:3] == ["review.started", "review.host_scheduled", "review.host_started"]
        assert kinds.count("review.role_ran") == 4  # two candidates, evaluator, merger
        assert kinds[-3:] == ["review.accounted", "review.report_committed", "review.handed_out"]
        doc = get_review(plane, task)
        assert doc.host.reviewers == load_reviewers(cfg).normalised()  # type: ignore[union-attr]
        assert not lock_path(plane, task).exists()  # the host's lock went with it
        assert Path(receipt["log"]) == lock_path(plane, task).with_suffix(".log")
        assert Path(receipt["log"]).read_text().strip() == f"review {task}: completed"
        assert audit(plane.store).ok


@pytest.mark.slow
def test_the_receipt_comes_before_the_reviewers_finish(
    db_url: str, tmp_path: Path, repo: Path
) -> None:
    gate = tmp_path / "go"
    config = reviewers(("alice", program("candidate", "--until", str(gate))))
    req, cfg = _write(tmp_path, config)
    ran = run_cli("review", "run", req, "--reviewers", cfg, "--repo", str(repo), "--db", db_url)
    assert ran.returncode == 0, ran.stderr
    task = ran.stdout.strip()
    with Plane.open(db_url) as plane:
        doc = get_review(plane, task)
        assert doc.status == "started" and doc.host is not msgspec.UNSET  # durable preflight
    early = run_cli("review", "wait", task, "--timeout", "0.3", "--db", db_url, "--json")
    assert early.returncode == 1
    assert json.loads(early.stdout)["timed_out"] is True
    assert json.loads(early.stdout)["status"] == "started"
    assert run_cli("review", "result", task, "--db", db_url).returncode == 2  # no report yet
    gate.touch()
    done = run_cli("review", "wait", task, "--db", db_url)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "completed" in done.stdout


# -- preflight -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        ({"request": {"objective": " "}}, ["invalid review request", "/objective"]),
        ({"config": {"candidates": []}}, ["key `candidates`"]),
        (
            {"config": {"evaluator": {"command": ["x"], "shell": True}}},
            ["evaluator.shell", "unknown"],
        ),
        ({"config": {"evaluator": {"command": ["x"], "timeout_s": "5"}}}, ["evaluator.timeout_s"]),
        ({"request": {"scope": ["src", "missing.py"]}}, ["scope entry 'missing.py'", "names no"]),
        ({"request": {"scope": ["../outside"]}}, ["scope entry '../outside'"]),
        ({"request": {"scope": ["/etc"]}}, ["scope entry '/etc'"]),
        ({"evaluator": ["no-such-program-here"]}, ["evaluator", "not found"]),
        ({"evaluator": ["bin/evaluate"]}, ["relative path"]),
        ({"twice": True}, ["unique", "alice"]),
    ],
)
def test_preflight_refuses_and_records_nothing(
    sqlite_url: str, tmp_path: Path, repo: Path, change: dict[str, Any], fragments: list[str]
) -> None:
    config = reviewers(evaluator=change.get("evaluator"))
    if change.get("twice"):
        config["candidates"].append(dict(config["candidates"][0]))
    config.update(change.get("config", {}))
    req, cfg = _write(tmp_path, config, request(**change.get("request", {})))
    with Plane.open(sqlite_url) as plane:
        before = plane.store.head().size
    ran = run_cli("review", "run", req, "--reviewers", cfg, "--repo", str(repo), "--db", sqlite_url)
    assert_refused(ran, *fragments)
    with Plane.open(sqlite_url) as plane:
        assert plane.store.head().size == before


def test_a_scope_symlink_out_of_the_repository_is_refused(plane: Plane, repo: Path) -> None:
    (repo / "out").symlink_to(repo.parent)
    with pytest.raises(CommandRefused, match="scope entry 'out'"):
        run_review(
            plane,
            request(scope=["out"]),
            parse_reviewers(reviewers(), "t"),
            repository=repo,
            start=False,
        )


# -- candidates: the inspect policy --------------------------------------------------------


def test_candidates_see_a_copy_of_the_scope_and_nothing_else(
    plane: Plane, repo: Path, tmp_path: Path
) -> None:
    seen = tmp_path / "records" / "seen.json"
    task = hosted(plane, repo, reviewers(("alice", program("candidate", "--record", str(seen)))))
    saw = json.loads(seen.read_text())
    assert sorted(saw["files"]) == ["README.md", "src/retry.py"]  # not secret.txt
    assert not Path(saw["cwd"]).is_relative_to(repo)  # a copy, never the repository
    assert not Path(saw["cwd"]).exists()  # and thrown away
    assert saw["input"]["role"] == "candidate"
    assert saw["input"]["request"] == get_review(plane, task).request
    assert saw["input"]["answer_schema"]["properties"]["schema_version"]["const"] == (
        "fusion-validation-candidate.v1"
    )
    assert get_review(plane, task).status == "completed"


@pytest.mark.parametrize("policy", ["none", "landlock"])
def test_a_candidate_that_writes_is_refused_as_a_limitation(
    plane: Plane, repo: Path, policy: str
) -> None:
    before = files(repo)
    config = reviewers(
        ("alice", program("candidate", "--mode", "write")), ("bob", program("candidate"))
    )
    plan_id = unconfined_plan(plane, repo) if policy == "none" else None
    task = hosted(plane, repo, config, plan_id)
    doc = get_review(plane, task)
    by_name = {c.reviewer: c for c in doc.candidates.values()}
    assert not by_name["alice"].valid and by_name["bob"].valid
    assert "scribble.txt" in by_name["alice"].errors[0]
    runs = [
        e.payload for e in plane.store.read_stream(f"review:{task}") if e.type == "review.role_ran"
    ]
    alice = next(r for r in runs if r.name == "alice")
    if policy == "none":  # the write reached its copy: detected, its report void
        why = "it wrote to its read-only view of the repository"
        assert alice.changed_paths == ["scribble.txt"] and alice.exit_code == 0
    else:  # read-only by the kernel: the write failed in the program
        why = "it exited with status 1"
        assert "Permission denied" in by_name["alice"].errors[0]
        assert alice.changed_paths == [] and alice.exit_code == 1
    assert by_name["alice"].limitations == [NO_USABLE + why]
    assert doc.status == "completed" and files(repo) == before
    report = review_result(plane, task).report
    assert report["candidates"] == {"submitted": 2, "valid": 1}
    assert NO_USABLE + why in report["limitations"]


def test_failing_candidates_become_limitations_without_their_words(
    plane: Plane, repo: Path
) -> None:
    config = reviewers(
        ("xq-crash", program("candidate", "--mode", "crash")),
        ("xq-garbage", program("candidate", "--mode", "garbage")),
        ("xq-invalid", program("candidate", "--mode", "invalid")),
        ("xq-hang", program("candidate", "--mode", "hang"), 0.5),
        ("xq-ok", program("candidate")),
    )
    task = hosted(plane, repo, config)
    doc = get_review(plane, task)
    by_name = {c.reviewer: c for c in doc.candidates.values()}
    assert [n for n, c in by_name.items() if c.valid] == ["xq-ok"]
    assert by_name["xq-crash"].limitations == [NO_USABLE + "it exited with status 3"]
    assert "candidate crashed on purpose" in by_name["xq-crash"].errors[0]  # in the log only
    assert by_name["xq-hang"].limitations == [NO_USABLE + "it timed out after 0.5 s"]
    assert by_name["xq-garbage"].errors == ["/: not a JSON document"]
    assert by_name["xq-invalid"].limitations[0].startswith("a candidate report failed the")
    report = review_result(plane, task).report
    text = json.dumps(report)
    for secret in ("crashed on purpose", "xq-", "candidate.py"):
        assert secret not in text, secret
    assert report["candidates"] == {"submitted": 5, "valid": 1}


def test_no_valid_candidate_fails_the_review(plane: Plane, repo: Path) -> None:
    config = reviewers(
        ("a", program("candidate", "--mode", "crash")),
        ("b", program("candidate", "--mode", "garbage")),
    )
    task = hosted(plane, repo, config)
    doc = get_review(plane, task)
    assert doc.status == "failed" and "no candidate reviewer returned a valid report" in (
        doc.failure or ""
    )
    assert "review.role_ran" in types(plane, task) and "review.accounted" not in types(plane, task)


@pytest.mark.parametrize("policy", ["none", "landlock"])
def test_a_write_to_the_repository_itself_fails_the_review(
    plane: Plane, repo: Path, policy: str
) -> None:
    before = files(repo)
    target = repo / "src" / "retry.py"
    config = reviewers(
        ("alice", program("candidate", "--mode", "write-to", "--target", str(target)))
    )
    plan_id = unconfined_plan(plane, repo) if policy == "none" else None
    task = hosted(plane, repo, config, plan_id)
    doc = get_review(plane, task)
    if policy == "none":  # it reached the repository: the host saw the scope move
        assert doc.status == "failed" and "the reviewed scope changed" in (doc.failure or "")
    else:  # the kernel refused the write: the repository is as it was
        assert doc.status == "failed" and "no candidate reviewer returned" in (doc.failure or "")
        assert files(repo) == before
    assert "review.report_committed" not in types(plane, task)


# -- evaluator, repair, merger: no repository -----------------------------------------------


def test_the_evaluator_is_blind_and_has_no_repository(
    plane: Plane, repo: Path, tmp_path: Path
) -> None:
    seen = tmp_path / "records" / "seen.jsonl"
    config = reviewers(
        ("alice", program("candidate")),
        ("bob", program("candidate", "--limitation", "bob could not run the tests")),
        evaluator=program("evaluator", "--record", str(seen)),
    )
    task = hosted(plane, repo, config)
    [line] = seen.read_text().splitlines()
    given = json.loads(line)
    assert given["files"] == []  # an empty directory: no repository
    fields = given["input"]
    assert set(fields) == {"format", "role", "request", "source_findings", "answer_schema"}
    assert fields["source_findings"] == source_findings(get_review(plane, task))
    # No reviewer's name, program or own words beyond the findings reach it.
    for secret in ("alice", "bob", "candidate.py", str(repo)):
        assert secret not in line, secret


def test_a_rejected_accounting_gets_one_repair(plane: Plane, repo: Path, tmp_path: Path) -> None:
    seen = tmp_path / "records" / "seen.jsonl"
    task = hosted(
        plane,
        repo,
        reviewers(evaluator=program("evaluator", "--mode", "broken-once", "--record", str(seen))),
    )
    doc = get_review(plane, task)
    assert doc.status == "completed" and doc.accounting_attempts == 2
    first, repair = (json.loads(line)["input"] for line in seen.read_text().splitlines())
    assert first["role"] == "evaluator" and repair["role"] == "repair"
    assert repair["rejected"]["schema_version"] == "fusion-validation-accounting.v1"
    assert [v["message"] for v in repair["violations"]] == [
        m.split(": ", 1)[1] for m in doc.rejections[0]
    ]
    assert repair["source_findings"] == first["source_findings"]


def test_a_second_rejection_fails_the_review(plane: Plane, repo: Path) -> None:
    task = hosted(plane, repo, reviewers(evaluator=program("evaluator", "--mode", "broken")))
    doc = get_review(plane, task)
    assert doc.status == "failed" and doc.accounting_attempts == 2
    assert "the accounting repair attempt failed too" in (doc.failure or "")
    roles = [
        e.payload.role
        for e in plane.store.read_stream(f"review:{task}")
        if e.type == "review.role_ran"
    ]
    assert roles[-2:] == ["evaluator", "repair"]


def test_an_evaluator_that_crashes_is_a_rejected_attempt_its_repair_can_mend(
    plane: Plane, repo: Path
) -> None:
    config = reviewers(
        evaluator=program("evaluator", "--mode", "crash"), repair=program("evaluator")
    )
    task = hosted(plane, repo, config)
    doc = get_review(plane, task)
    assert doc.status == "completed" and doc.accounting_attempts == 2
    assert "exited with status 3" in doc.rejections[0][0]


def test_the_merger_summarises_and_never_changes_the_findings(plane: Plane, repo: Path) -> None:
    plain = review_result(plane, hosted(plane, repo, reviewers())).report
    merged = review_result(plane, hosted(plane, repo, reviewers(merger=program("merger")))).report
    broken = review_result(
        plane, hosted(plane, repo, reviewers(merger=program("merger", "--mode", "invalid")))
    ).report
    assert "summary" not in plain  # without a merger: the report as a hand-driven review's
    assert merged["summary"] == "2 finding group(s), 0 exclusion(s); most severe: high"
    assert broken["summary"] is None
    assert any(
        x.startswith("the merger gave no summary: its answer failed") for x in broken["limitations"]
    )
    for report in (merged, broken):
        assert report["findings"] == plain["findings"]
        assert report["exclusions"] == plain["exclusions"]


# -- what only the host may do ---------------------------------------------------------------


def test_hand_submissions_to_a_hosted_review_are_refused(plane: Plane, repo: Path) -> None:
    receipt = run_review(
        plane, request(), parse_reviewers(reviewers(), "t"), repository=repo, start=False
    )
    task = receipt.task_id
    before = plane.store.head().size
    with pytest.raises(CommandRefused, match="run by the review host"):
        submit_candidate(plane, task, candidate(finding("x")), reviewer="mallory")
    with pytest.raises(CommandRefused, match="run by the review host"):
        account_review(plane, task, accounting(get_review(plane, task), {}, []))
    assert plane.store.head().size == before
    # And the host takes nothing but a hosted review.
    manual = start_review(plane, request())
    with pytest.raises(CommandRefused, match="not run by the review host"):
        host_review(plane, manual)


def test_a_review_is_hosted_once(plane: Plane, repo: Path) -> None:
    task = hosted(plane, repo, reviewers())
    with pytest.raises(CommandRefused, match="has ended"):
        host_review(plane, task)


def test_the_host_runs_only_the_preflight_it_was_started_for(
    plane: Plane, repo: Path, tmp_path: Path
) -> None:
    """A writer of the database file swaps the programs after the preflight: the host
    started for that preflight runs nothing."""
    receipt = run_review(
        plane, request(), parse_reviewers(reviewers(), "t"), repository=repo, start=False
    )
    task = receipt.task_id
    committed = preflight_sha256(get_review(plane, task))
    marker = tmp_path / "pwned"
    evil = reviewers(("x", ["python", "-c", f"open({str(marker)!r}, 'w')"]))
    doc = get_review(plane, task)
    forge(
        plane.store,
        f"review:{task}",
        ReviewStarted(task_id=task, request=doc.request, request_sha256=doc.request_sha256),
        ReviewHostScheduled(
            task_id=task, reviewers=evil, reviewers_sha256="0" * 64, repository=str(repo)
        ),
    )
    with pytest.raises(CommandRefused, match="differ from the preflight"):
        host_review(plane, task, expect_preflight=committed)
    assert not marker.exists()


# -- waiting, and a host that dies -------------------------------------------------------------


def test_wait_for_an_unknown_review_is_refused(sqlite_url: str) -> None:
    assert run_cli("init", "--db", sqlite_url).returncode == 0
    assert_refused(
        run_cli("review", "wait", "01ARZ3NDEKTSV4RRFFQ69G5FAV", "--db", sqlite_url),
        "unknown review",
    )


def _host_pid(plane: Plane, task: str) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        host = get_review(plane, task).host
        if isinstance(getattr(host, "pid", None), int):
            return host.pid  # type: ignore[union-attr]
        time.sleep(0.05)
    raise AssertionError("the host never started")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_host_that_dies_never_leaves_the_task_hanging(
    db_url: str, tmp_path: Path, repo: Path, signum: int
) -> None:
    gate = tmp_path / "go"
    config = reviewers(("alice", program("candidate", "--until", str(gate))))
    req, cfg = _write(tmp_path, config)
    with Plane.open(db_url) as plane:
        create_plan(plane, "P-1", project="proj", resources=["repo:api"])
    ran = run_cli(
        "review",
        "run",
        req,
        "--reviewers",
        cfg,
        "--repo",
        str(repo),
        "--plan",
        "P-1",
        "--db",
        db_url,
        env={"TMPDIR": str(tmp_path)},  # a killed host leaves its scratch copy behind
    )
    assert ran.returncode == 0, ran.stderr
    task = ran.stdout.strip()
    try:
        with Plane.open(db_url) as plane:
            os.kill(_host_pid(plane, task), signum)
        waited = run_cli("review", "wait", task, "--timeout", "60", "--db", db_url)
        assert waited.returncode == 1, (waited.stdout, waited.stderr)
        with Plane.open(db_url) as plane:
            doc = get_review(plane, task)
            assert doc.status == "failed"
            expected = "stopped by signal" if signum == signal.SIGTERM else "host stopped before"
            assert expected in (doc.failure or "")
            last = plane.store.read_stream("plan:P-1")[-1].payload
            assert last.run_id == task and last.data["status"] == "failed"  # type: ignore[attr-defined]
            assert audit(plane.store).ok
    finally:
        gate.touch()  # the candidate (its own session) ends either way


# -- the hand-out ------------------------------------------------------------------------------


def test_a_report_is_handed_out_once_even_to_concurrent_callers(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        task = start_review(plane, request())
        submit_candidate(plane, task, candidate(finding("x")), reviewer="a")
        account_review(plane, task, accounting(get_review(plane, task), {"G1": ["x"]}, []))
    got: list[str] = []
    refused: list[AlreadyHandedOut] = []
    start = threading.Barrier(2)

    def fetch(who: str) -> None:
        with Plane.open(db_url) as mine:
            start.wait()
            try:
                got.append(review_result(mine, task, recipient=who).recipient)
            except AlreadyHandedOut as exc:
                refused.append(exc)

    threads = [threading.Thread(target=fetch, args=(w,)) for w in ("ann", "ben")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 1 and len(refused) == 1
    assert refused[0].to == got[0]
    with Plane.open(db_url) as plane:
        assert types(plane, task).count("review.handed_out") == 1
        assert to_json(get_review(plane, task))["handed_out"]["to"] == got[0]


def test_a_review_recorded_before_the_host_keeps_its_document_shape(plane: Plane) -> None:
    doc = to_json(get_review(plane, start_review(plane, request())))
    assert "host" not in doc and "handed_out" not in doc


def test_the_hand_out_names_its_recipient(sqlite_url: str) -> None:
    with Plane.open(sqlite_url) as plane:
        task = start_review(plane, request())
        submit_candidate(plane, task, candidate(finding("x")), reviewer="a")
        account_review(plane, task, accounting(get_review(plane, task), {"G1": ["x"]}, []))
    assert_refused(
        run_cli("review", "result", task, "--as", "no body", "--db", sqlite_url),
        "invalid recipient",
    )
    text = run_cli("review", "result", task, "--db", sqlite_url)
    assert text.returncode == 0
    assert "verified; handed out to " in text.stdout.splitlines()[0]
    with Plane.open(sqlite_url) as plane:
        [handed] = [
            e for e in plane.store.read_stream(f"review:{task}") if e.type == "review.handed_out"
        ]
        assert handed.actor == handed.payload.recipient  # type: ignore[attr-defined]


def test_wait_returns_at_once_for_an_ended_review(plane: Plane, repo: Path) -> None:
    task = hosted(plane, repo, reviewers())
    outcome = wait_review(plane, task, timeout_s=0)
    assert outcome.review.status == "completed" and not outcome.timed_out
