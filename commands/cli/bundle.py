"""Offline bundles on the command line: ``export --bundle FILE`` writes one; ``verify``,
``audit`` and ``replay`` given ``--bundle FILE`` read it and open no database at all."""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

import ledger  # light: the errors and the version; the store loads on first use
from ledger.intake import read_text

from .common import EXIT_VERDICT, STDOUT, console, emit_json, fail, open_store, read_policy
from .progress import progress_bar
from .terminal import inert

if TYPE_CHECKING:
    from ledger.bundle import Bundle, BundleReport

__all__ = [
    "bundle_option",
    "default_origin",
    "export_bundle_command",
    "load_bundle_or_refuse",
    "open_verified_bundle",
    "print_bundle_report",
    "public_key_option",
    "signing_key",
    "verify_bundle_command",
]

F = TypeVar("F", bound=Callable[..., Any])


def bundle_option(fn: F) -> F:
    return click.option(
        "--bundle",
        "bundle_file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Read this offline bundle (evidence export --bundle) instead of a database.",
    )(fn)


def public_key_option(fn: F) -> F:
    """``--public-key FILE``, which only a ``--bundle`` uses: given alone it is refused
    (silently ignoring a key the user meant to check with would be a false assurance)."""

    @click.option(
        "--public-key",
        "public_key_file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="With --bundle: check its checkpoint with this key (default: the key it carries).",
    )
    @functools.wraps(fn)
    def wrapper(*args: Any, public_key_file: Path | None, **kwargs: Any) -> Any:
        if public_key_file is not None and kwargs.get("bundle_file") is None:
            fail("--public-key checks a --bundle: give the bundle too")
        return fn(*args, public_key_file=public_key_file, **kwargs)

    return wrapper  # type: ignore[return-value]


def signing_key(store: ledger.Store, key_file: Path | None) -> Any:
    """``--key FILE``, else the ledger's plane key (refused if there is none)."""
    from commands.rules.signing import plane_key_path
    from ledger.keys import load_private_key

    if key_file is None:
        key_file = plane_key_path(store.url)
        if not os.path.lexists(key_file):
            fail(f"no plane key at {key_file}: run `evidence init`, or give --key FILE")
    return load_private_key(key_file)


def default_origin(store: ledger.Store) -> str:
    return f"evidence-ledger/{store.meta()['ledger_id']}"


def witness_cosigner(policy_file: Path | None) -> Any:
    """``--witness POLICY``'s cosigner (``witnesses.cosigner``), or None without one."""
    if policy_file is None:
        return None
    from commands.plane.witnesses import cosigner

    return cosigner(*read_policy(policy_file, "--witness"))


def export_bundle_command(
    out: Path,
    plan: str | None,
    key_file: Path | None,
    origin: str | None,
    as_json: bool,
    policy_file: Path | None = None,
) -> None:
    """``export --bundle FILE``; ``-`` writes the bundle to standard output (made in a
    temporary directory first, as a file is: the bundle is assembled at one snapshot
    and written whole) and the summary to standard error. With ``--witness POLICY`` its
    checkpoint carries the quorum's cosignatures and the policy (no quorum: nothing is
    written, exit 1)."""
    from commands.plane.witnesses import NotCosigned
    from ledger.bundle import BundleError, write_bundle

    store = open_store()
    key = signing_key(store, key_file)
    cosign = witness_cosigner(policy_file)
    to_stdout = str(out) == STDOUT
    try:
        origin = default_origin(store) if origin is None else origin
        if to_stdout:
            with tempfile.TemporaryDirectory(prefix="evidence-bundle-") as scratch:
                summary = write_bundle(
                    store, Path(scratch) / "bundle", key=key, origin=origin, plan=plan,
                    cosign=cosign,
                )  # fmt: skip
                with open(summary.out, "rb") as made:
                    shutil.copyfileobj(made, sys.stdout.buffer)
                sys.stdout.buffer.flush()
        else:
            summary = write_bundle(store, out, key=key, origin=origin, plan=plan, cosign=cosign)
    except NotCosigned as exc:
        click.echo(f"not written: {exc}", err=True)
        click.get_current_context().exit(EXIT_VERDICT)
    except BundleError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror}")
    if as_json:
        emit_json(summary)
        return
    scope = f" (plan {inert(plan)} and the streams it uses)" if plan else ""
    where = "standard output" if to_stdout else inert(summary.out)
    click.echo(
        f"{summary.events} event(s){scope} and {summary.blobs} blob(s) to {where}", err=to_stdout
    )
    click.echo(
        f"signed checkpoint {inert(summary.origin)} {summary.size}:{summary.root}", err=to_stdout
    )


def load_bundle_or_refuse(bundle_file: Path, public_key_file: Path | None) -> Bundle:
    """The bundle read and checked (``Bundle.report`` says how it fared); an unreadable
    file or key is a refused command."""
    from ledger.bundle import BundleError, load_bundle
    from ledger.keys import load_public_key

    public_key = load_public_key(public_key_file) if public_key_file is not None else None
    try:
        return load_bundle(bundle_file, public_key=public_key)
    except BundleError as exc:
        fail(str(exc))


def print_bundle_report(report: BundleReport) -> None:
    out = console()
    if report.ok:
        scope = f" (plan {inert(report.plan)})" if report.plan else ""
        out.print(
            f"ok: bundle verified: {report.events} event(s){scope} and {report.blobs} blob(s)",
            markup=False,
        )
        by = (
            "the public key given"
            if report.key_source == "given"
            else "the key the bundle carries (give --public-key, or keep a checkpoint, to tie "
            "it to a key you hold)"
        )
        out.print(
            f"signed checkpoint {inert(report.origin)} {report.size}:{report.root}: "
            "signature "
            f"ok by {by}",
            markup=False,
        )
        if report.kept is not None:
            out.print(
                f"extends the kept checkpoint {report.kept.size}:{report.kept.root}", markup=False
            )
        return
    out.print(f"FAILED: {len(report.problems)} problem(s) in the bundle", markup=False)
    for p in report.problems:
        at = f"position {p.position}" if p.position is not None else "bundle"
        out.print(f"  {at}: {p.kind}: {inert(p.detail)}", markup=False)


def verify_bundle_command(
    bundle_file: Path,
    checkpoint_file: Path | None,
    public_key_file: Path | None,
    as_json: bool,
    jobs: int,
    policy_file: Path | None = None,
) -> None:
    from ledger.bundle import BundleError, verify_bundle
    from ledger.keys import load_public_key

    public_key = load_public_key(public_key_file) if public_key_file is not None else None
    policy = read_policy(policy_file, "--policy")[0] if policy_file is not None else None
    kept = None
    if checkpoint_file is not None:
        kept = read_text(checkpoint_file, "checkpoint", f"--checkpoint {checkpoint_file}")
    with progress_bar("verify") as progress:
        try:
            report = verify_bundle(
                bundle_file,
                public_key=public_key,
                kept_checkpoint=kept,
                jobs=jobs,
                progress=progress,
                policy=policy,
            )
        except BundleError as exc:
            fail(str(exc))
    if as_json:
        emit_json(report)
    else:
        print_bundle_report(report)
    if not report.ok:
        click.get_current_context().exit(EXIT_VERDICT)


def open_verified_bundle(bundle_file: Path, public_key_file: Path | None, as_json: bool) -> Bundle:
    """The bundle, for ``audit``/``replay``; one that does not verify is a verdict
    (exit 1, its problems printed): nothing is derived from bytes that are not
    authentic."""
    bundle = load_bundle_or_refuse(bundle_file, public_key_file)
    if not bundle.report.ok:
        if as_json:
            emit_json({"ok": False, "bundle": bundle.report})
        else:
            print_bundle_report(bundle.report)
        click.get_current_context().exit(EXIT_VERDICT)
    return bundle
