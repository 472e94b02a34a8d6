"""``evidence report PLAN --html OUT.html``: the auditor's one-file HTML report."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

import click

from .bundle import bundle_option, load_bundle_or_refuse, public_key_option
from .common import STDOUT, data_to_stdout, db_option, fail, open_store
from .terminal import inert

__all__ = ["report", "write_atomically"]


@click.command()
@click.argument("plan_id")
@click.option(
    "--html",
    "out",
    required=True,
    metavar="OUT.html",
    type=click.Path(path_type=Path),
    help="Write the self-contained HTML report to this file (- for standard output).",
)
@bundle_option
@public_key_option
@db_option
def report(plan_id: str, out: Path, bundle_file: Path | None, public_key_file: Path | None) -> None:
    """Write a self-contained HTML report of a plan.

    Timeline, gates, validations, decisions, token, outcome and verification, in one
    file with no network access. Exit 0 once written, even when verification found
    problems (the report shows them). With --bundle, from an offline bundle;
    `--html -` writes it to standard output (the summary line goes to standard error).

    \b
    Examples:
      evidence report P-1 --html p1.html
      evidence report P-1 --bundle p1.bundle --html - > p1.html
    """
    from commands.auditor.report import gather_report
    from commands.auditor.report_html import render_html
    from ledger.verify import verify_store

    to_stdout = str(out) == STDOUT
    if to_stdout:
        data_to_stdout("--html")
    else:
        _check_writable(out)  # before the (long) verification: a typo costs nothing
    if bundle_file is not None:
        # A bundle that fails verification still gets its report, marked FAILED, as a
        # tampered database does: the page lists what broke.
        bundle = load_bundle_or_refuse(bundle_file, public_key_file)
        data = gather_report(
            bundle, plan_id, verification=bundle.report, source_label=str(bundle_file)
        )
    else:
        store = open_store()
        data = gather_report(
            store, plan_id, verification=lambda: verify_store(store), source_label=store.url
        )
    html = render_html(data).encode("utf-8")
    if to_stdout:
        sys.stdout.buffer.write(html)
        sys.stdout.buffer.flush()
    else:
        write_atomically(out, html)
    verdict = (
        "verified"
        if data.verification.ok and data.audit.ok
        else ("verification FAILED, see the report")
    )
    # The events read (a bundle holds a plan's, not the whole log) and the log position.
    events = data.verification.checked_events
    where = "the report to standard output" if to_stdout else inert(out)
    click.echo(
        f"wrote {where} (plan {inert(plan_id)}, {events} events as of position "
        f"{data.size}, {verdict})",
        err=to_stdout,
    )


def _check_writable(out: Path) -> None:
    if out.is_dir():
        fail(f"--html: {out} is a directory")
    parent = out.parent
    if not parent.is_dir():
        fail(f"--html: cannot write {out}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        fail(f"--html: cannot write {out}: directory {parent} is not writable")


def write_atomically(out: Path, data: bytes) -> None:
    """Temp file in the same directory, fsync, then rename over ``out``: a reader sees
    the old file or the whole new one, and a failure leaves no partial report."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    except OSError as exc:
        fail(f"--html: cannot write {out}: {exc.strerror or exc}")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp makes the file 0600; a report is for sharing, so honour the umask.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, out)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        fail(f"--html: cannot write {out}: {exc.strerror or exc}")
