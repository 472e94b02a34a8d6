"""``evidence review run|wait|result|start|submit|account|list|show`` (docs/reviews.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ledger.intake import read_bytes

from .common import (
    EXIT_VERDICT,
    db_option,
    emit_json,
    emit_listing,
    format_option,
    json_option,
    open_plane,
    print_table,
)
from .inputs import Seconds
from .terminal import inert

if TYPE_CHECKING:
    from projections.states import ReviewState


def _read(path: str, what: str) -> bytes:
    """The file's exact bytes (the checks see what was written, duplicates included)."""
    return read_bytes(path, "agent", f"{what} {path}")


@click.group()
def review() -> None:
    """Advisory reviews, recorded and verified; never a gate."""


@review.command("run")
@click.argument("file", metavar="REQUEST_FILE")
@click.option(
    "--reviewers",
    "config",
    required=True,
    metavar="CONFIG",
    help="The reviewer programs: YAML, TOML or JSON (docs/reviews.md).",
)
@click.option(
    "--repo",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="The repository the request's scope is relative to.",
)
@click.option(
    "--plan", "plan_id", help="Record the finished review on this plan (an informational result)."
)
@db_option
@json_option
def run(file: str, config: str, repo: Path, plan_id: str | None, as_json: bool) -> None:
    """Start a review run by reviewer programs in the background.

    Prints its receipt (the task id) once the request and the reviewers are recorded.

    \b
    Examples:
      evidence review run request.json --reviewers reviewers.yaml --repo .
    """
    from commands.plane.review_host import HostNotStarted, run_review
    from commands.plane.review_inputs import load_reviewers
    from commands.plane.reviews import ReviewRequestInvalid

    data = _read(file, "REQUEST_FILE")
    reviewers = load_reviewers(config)
    try:
        receipt = run_review(
            open_plane(create=True), data, reviewers, repository=repo, plan_id=plan_id
        )
    except ReviewRequestInvalid as exc:
        if as_json:  # the violations as data too; the error line still goes to stderr
            emit_json({"violations": [v.to_json() for v in exc.violations]})
        raise
    except HostNotStarted as exc:  # recorded as failed: a verdict, not a refusal
        if as_json:
            emit_json({"task_id": exc.task_id, "log": None})
        click.echo(f"error: {inert(str(exc))}", err=True)
        click.get_current_context().exit(EXIT_VERDICT)
        return
    # Printed only now: the request and the reviewers are committed (durable preflight).
    if as_json:
        emit_json(receipt.to_json())
    else:
        click.echo(receipt.task_id)


@review.command("wait")
@click.argument("task_id", metavar="TASK")
@click.option(
    "--timeout",
    type=Seconds(0, 86_400),
    default=None,
    help="Give up after this many seconds (default: wait for the end).",
)
@db_option
@json_option
def wait(task_id: str, timeout: float | None, as_json: bool) -> None:
    """Block until the review ends. Exit 0 completed, 1 failed (or still running at
    --timeout).

    \b
    Examples:
      evidence review wait 01M8R3RYSDY9ZYQRMAV133SYN9 --timeout 600
    """
    from commands.plane.review_host import wait_review

    outcome = wait_review(open_plane(), task_id, timeout_s=timeout)
    doc = outcome.review
    if as_json:
        emit_json(outcome.to_json())
    elif doc.status == "completed":
        assert doc.report is not None
        click.echo(
            f"review {inert(task_id)}: completed; report sha256 {doc.report.sha256} "
            f"({doc.report.findings} finding(s), {doc.report.exclusions} exclusion(s))"
        )
    elif doc.status == "failed":
        click.echo(f"review {inert(task_id)}: failed: {inert(doc.failure or '')}")
    else:  # the timeout passed first
        click.echo(f"review {inert(task_id)}: still {doc.status} after {timeout or 0:g} s")
    if doc.status != "completed":
        click.get_current_context().exit(EXIT_VERDICT)


@review.command("host", hidden=True)
@click.argument("task_id", metavar="TASK")
@click.option("--lock-fd", type=click.IntRange(0, 1 << 20), default=None)
@click.option("--preflight", default=None, metavar="SHA256")
@db_option
def host(task_id: str, lock_fd: int | None, preflight: str | None) -> None:
    """Run a scheduled review in this process (what review run starts in the background)."""
    from commands.plane.review_host import host_review

    doc = host_review(
        open_plane(), task_id, lock_fd=lock_fd, expect_preflight=preflight, handle_sigterm=True
    )
    click.echo(f"review {inert(task_id)}: {doc.status}")
    if doc.status != "completed":
        click.get_current_context().exit(EXIT_VERDICT)


@review.command("start")
@click.argument("file", metavar="FILE.json")
@click.option(
    "--plan", "plan_id", help="Record the finished review on this plan (an informational result)."
)
@db_option
@json_option
def start(file: str, plan_id: str | None, as_json: bool) -> None:
    """Check and record a review request; print its receipt.

    The receipt is the review's task id.

    \b
    Examples:
      evidence review start request.json --plan P-1
    """
    from commands.plane.reviews import ReviewRequestInvalid, start_review

    data = _read(file, "FILE")
    try:
        task_id = start_review(open_plane(create=True), data, plan_id=plan_id)
    except ReviewRequestInvalid as exc:
        if as_json:  # the violations as data too; the error line still goes to stderr
            emit_json({"violations": [v.to_json() for v in exc.violations]})
        raise
    # Printed only now: the request is committed (durable preflight).
    if as_json:
        emit_json({"task_id": task_id})
    else:
        click.echo(task_id)


@review.command("submit")
@click.argument("task_id", metavar="TASK")
@click.argument("file")
@click.option("--reviewer", required=True, help="Who wrote the report (anonymised as A, B …).")
@db_option
@json_option
def submit(task_id: str, file: str, reviewer: str, as_json: bool) -> None:
    """Record a candidate report. Exit 1 when it failed the schema (kept as a limitation).

    \b
    Examples:
      evidence review submit TASK candidate.json --reviewer alice
    """
    from commands.plane.reviews import submit_candidate

    result = submit_candidate(open_plane(), task_id, _read(file, "FILE"), reviewer=reviewer)
    if as_json:
        emit_json({"submission": result.to_json()})
    elif result.valid:
        ids = ", ".join(result.finding_ids) or "no findings"
        click.echo(f"review {inert(task_id)}: candidate {result.label} recorded ({inert(ids)})")
    else:
        click.echo(
            f"review {inert(task_id)}: candidate {result.label} failed the candidate "
            "schema; "
            "recorded as a limitation:"
        )
        for error in result.errors:
            click.echo(f"  {inert(error)}")
    if not result.valid:
        click.get_current_context().exit(EXIT_VERDICT)


@review.command("account")
@click.argument("task_id", metavar="TASK")
@click.argument("file")
@db_option
@json_option
def account(task_id: str, file: str, as_json: bool) -> None:
    """Check the evaluator's accounting; commit the report.

    A rejected accounting is recorded as a failed attempt (exit 1); one repair is
    allowed, a second failure fails the review.

    \b
    Examples:
      evidence review account TASK accounting.json
    """
    from commands.plane.reviews import account_review

    outcome = account_review(open_plane(), task_id, _read(file, "FILE"))
    if as_json:
        emit_json({"accounting": outcome.to_json()})
    elif outcome.accepted:
        click.echo(
            f"review {inert(task_id)}: accounting accepted (attempt {outcome.attempt}); "
            f"report committed, sha256 {outcome.report_sha256}"
        )
    else:
        then = "one repair attempt is left" if outcome.status == "repair" else "the review failed"
        click.echo(
            f"review {inert(task_id)}: accounting attempt {outcome.attempt} rejected "
            f"({len(outcome.violations)} violation(s)); {then}"
        )
        for violation in outcome.violations:
            click.echo(f"  {inert(violation)}")
    if not outcome.accepted:
        click.get_current_context().exit(EXIT_VERDICT)


@review.command("result")
@click.argument("task_id", metavar="TASK")
@click.option(
    "--as",
    "recipient",
    metavar="NAME",
    help="Who receives the report (default: your login name).",
)
@db_option
@json_option
def result(task_id: str, recipient: str | None, as_json: bool) -> None:
    """The committed report, verified and handed out once.

    Exit 1 if it fails verification; 2 if it was handed out before (when, to whom).

    \b
    Examples:
      evidence review result TASK --as auditor --json
    """
    from commands.plane.reviews import AlreadyHandedOut, ReportVerificationError, review_result

    try:
        found = review_result(open_plane(), task_id, recipient=recipient)
    except AlreadyHandedOut as exc:
        if as_json:
            emit_json({"task_id": task_id, "handed_out": {"at": exc.at, "to": exc.to}})
        raise
    except ReportVerificationError as exc:
        if as_json:
            emit_json(
                {
                    "task_id": task_id,
                    "verified": False,
                    "report_sha256": exc.expected,
                    "actual_sha256": exc.actual,
                }
            )
        click.echo(f"error: {inert(str(exc))}", err=True)
        click.get_current_context().exit(EXIT_VERDICT)
        return
    if as_json:
        emit_json(found.to_json())
        return
    click.echo(
        f"advisory review report (sha256 {found.report_sha256}, verified; handed out "
        f"to {inert(found.recipient)} at {found.handed_out_at})"
    )
    _print_report(found.report)


def _print_report(report: dict[str, Any]) -> None:
    """Every part of the report, whole: never cut to the terminal's width. The reviewers'
    text is shown ``inert``; evidence, impact and rationale keep their line breaks."""
    request = report["request"]
    click.echo(f"objective: {inert(request['objective'])}")
    click.echo(
        f"candidates: {report['candidates']['submitted']} submitted, "
        f"{report['candidates']['valid']} valid"
    )
    if "summary" in report:  # a hosted review with a merger
        summary = report["summary"]
        click.echo(f"summary: {'-' if summary is None else inert(summary, multiline=True)}")
    click.echo(f"\nfindings ({len(report['findings'])}):")
    for n, group in enumerate(report["findings"], start=1):
        merged = f" (merged from {group['reports']} reports)" if group["reports"] > 1 else ""
        click.echo(inert(f"{n}. [{group['severity']}] {group['summary']}{merged}"))
        for finding in group["findings"]:
            click.echo(inert(f"   - [{finding['severity']}] {finding['summary']}"))
            for key in ("location", "evidence", "impact"):
                click.echo(f"     {key}: {inert(finding[key], multiline=key != 'location')}")
        for reason in group["rationale"]:
            click.echo(f"   rationale: {inert(reason, multiline=True)}")
    click.echo(f"\nexclusions ({len(report['exclusions'])}):")
    for excluded in report["exclusions"]:
        finding = excluded["finding"]
        click.echo(inert(f"- [{finding['severity']}] {finding['summary']} ({finding['location']})"))
        click.echo(f"  rationale: {inert(excluded['rationale'], multiline=True)}")
    for title in ("verified", "limitations"):
        click.echo(f"\n{title} ({len(report[title])}):")
        for line in report[title]:
            click.echo(f"- {inert(line)}")


@review.command("list")
@click.option("--plan", "plan_id", help="Only reviews linked to this plan.")
@click.option(
    "--status",
    type=click.Choice(["started", "repair", "accounted", "completed", "failed"]),
    help="Only reviews in this status.",
)
@db_option
@format_option()
def list_(plan_id: str | None, status: str | None, fmt: str) -> None:
    """List reviews, oldest first.

    \b
    Examples:
      evidence review list --status completed
      evidence review list --plan P-1 --format csv
    """
    from commands.plane.reviews import list_reviews

    reviews = [_summary(doc) for doc in list_reviews(open_plane(), plan_id=plan_id, status=status)]
    emit_listing(fmt, {"reviews": reviews}, reviews, lambda: _review_table(reviews))


def _review_table(reviews: list[dict[str, Any]]) -> None:
    print_table(
        ["task", "status", "plan", "candidates", "attempts", "report"],
        [
            [
                r["task_id"],
                r["status"],
                r["plan_id"] or "-",
                str(r["candidates"]),
                str(r["accounting_attempts"]),
                r["report_sha256"] or "-",
            ]
            for r in reviews
        ],
    )


def _summary(doc: ReviewState) -> dict[str, Any]:
    from projections.states import HandOutState, HostState, to_json

    handed = doc.handed_out
    return {
        "task_id": doc.task_id,
        "status": doc.status,
        "plan_id": doc.plan_id,
        "objective": doc.request["objective"],
        "hosted": isinstance(doc.host, HostState),
        "candidates": len(doc.candidates),
        "accounting_attempts": doc.accounting_attempts,
        "report_sha256": doc.report.sha256 if doc.report else None,
        "handed_out": to_json(handed) if isinstance(handed, HandOutState) else None,
    }


def _review_rows(doc: Any) -> list[tuple[str, str]]:
    """A review's fields as ``review show`` lists them, key by key."""
    from projections.states import HandOutState, HostState

    summary = _summary(doc)
    rows = [
        ("task", doc.task_id),
        ("status", doc.status),
        ("plan", doc.plan_id or "-"),
        ("objective", doc.request["objective"]),
        ("request sha256", doc.request_sha256),
        ("accounting attempts", str(doc.accounting_attempts)),
        ("report sha256", summary["report_sha256"] or "-"),
        ("failure", doc.failure or "-"),
    ]
    if isinstance(doc.handed_out, HandOutState):
        rows.append(("handed out", f"at {doc.handed_out.at} to {doc.handed_out.to}"))
    host = doc.host
    if isinstance(host, HostState):
        rows.append(("repository", host.repository))
        rows.append(("reviewers sha256", host.reviewers_sha256))
        taken = f"pid {host.pid} on {host.hostname}" if isinstance(host.pid, int) else "-"
        rows.append(("host", taken))
    return rows


@review.command("show")
@click.argument("task_id", metavar="TASK")
@db_option
@json_option
def show(task_id: str, as_json: bool) -> None:
    """One review: its request, candidates, findings and attempts.

    \b
    Examples:
      evidence review show TASK
    """
    from commands.plane.reviews import get_review, source_findings
    from projections.states import HostState, to_json

    doc = get_review(open_plane(), task_id)
    if as_json:
        emit_json({"review": to_json(doc), "source_findings": source_findings(doc)})
        return
    rows = _review_rows(doc)
    host = doc.host
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key.ljust(width)}  {inert(value)}")
    click.echo("")
    print_table(
        ["label", "reviewer", "valid", "findings", "limitations"],
        [
            [
                label,
                c.reviewer,
                "yes" if c.valid else "no",
                str(len(c.findings)),
                str(len(c.limitations)),
            ]
            for label, c in doc.candidates.items()
        ],
    )
    sources = source_findings(doc)
    if sources:
        click.echo("")
        print_table(
            ["id", "severity", "location", "summary"],
            [[f["id"], f["severity"], f["location"], f["summary"]] for f in sources],
        )
    if isinstance(host, HostState) and host.runs:
        click.echo("")
        print_table(
            ["role", "name", "exit", "ms", "error"],
            [
                [
                    r.role,
                    r.name,
                    "-" if r.exit_code is None else str(r.exit_code),
                    str(r.duration_ms),
                    r.error or "-",
                ]
                for r in host.runs
            ],
        )
    for n, violations in enumerate(doc.rejections, start=1):
        click.echo(f"\nrejected accounting attempt {n}:")
        for violation in violations:
            click.echo(f"  {inert(violation)}")
