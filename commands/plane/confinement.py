"""What the plane's programs may touch: each kind of work's ``Confinement``
(``commands.runner.confine``), from the plan's policy (``global_config.confinement``)
and where this ledger keeps what no program may reach.

- a tool call, a compensation, an MCP server the plane launches for a plan: read and
  write its sandbox (the copies it works in), read the allow-list;
- a validation: read its throwaway copy (``run_validation`` adds it) and the
  allow-list, write nothing but its temporary directory;
- a hosted review's candidate: read its copy of the scope; the evaluator, repair and
  merger: nothing but the allow-list (and their temporary directory).

No program reaches the ledger's database file, its state directory (every plan's
sandbox, the review host's files) or the plane key. When the kernel has no Landlock,
confined work is refused (``CommandRefused``, nothing appended) unless the plan was
created with ``confinement: none``; then it runs unconfined and is recorded so.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

import msgspec

from commands.rules.signing import SigningError, operator_key_path, plane_key_path
from commands.runner.confine import (
    Confinement,
    ConfinementUnavailable,
    Policy,
    landlock_abi,
)
from commands.runner.sandbox import state_dir
from ledger.events import GlobalConfig
from ledger.store import url_identity
from projections.states import PlanState

from .core import CommandRefused, Plane

__all__ = [
    "config_policy",
    "plan_policy",
    "protected_paths",
    "require_confinement",
    "review_confinement",
    "upstream_confinement",
    "validation_confinement",
    "work_confinement",
]


def plan_policy(plan: PlanState | None) -> Policy:
    """The plan's confinement policy (a plan created before the option: ``landlock``)."""
    return "landlock" if plan is None else config_policy(plan.global_config)


def config_policy(config: GlobalConfig) -> Policy:
    """A ``global_config``'s confinement policy (absent: ``landlock``)."""
    found = config.confinement
    return "landlock" if found is msgspec.UNSET else found


def require_confinement(policy: Policy, what: str = "the plan's programs") -> None:
    """Refuse (exit 2, nothing appended) confined work on a kernel without Landlock."""
    if policy == "landlock" and landlock_abi() < 1:
        raise CommandRefused(
            f"cannot run {what} confined: this kernel has no Landlock (Linux 5.13 or "
            "later, enabled at boot); create the plan with global_config "
            "`confinement: none` to run them unconfined (recorded and reported as "
            "unconfined)"
        )


def protected_paths(plane: Plane) -> list[str]:
    """What no program may reach: the database file (SQLite), the state directories
    (``--workdir`` or ``STATE``: every plan's sandbox, the review host's locks), the
    plane key and the operator key."""
    url = plane.store.engine.url
    found: list[Path] = []
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        found.append(Path(os.path.abspath(str(url.database))))
    identity = url_identity(url.render_as_string(hide_password=False))
    found += [plane.sandboxes.parent.parent, state_dir(identity)]
    with contextlib.suppress(SigningError):  # a URL with no place for a key: none to hide
        found += [plane_key_path(identity), operator_key_path(identity)]
    return [os.fspath(p) for p in found]


def _of(
    plane: Plane,
    policy: Policy,
    what: str,
    *,
    write: Iterable[str | os.PathLike[str]] = (),
    lend: Iterable[str | os.PathLike[str]] = (),
) -> Confinement:
    require_confinement(policy, what)
    try:
        return Confinement.of(policy, write=write, lend=lend, protected=protected_paths(plane))
    except ConfinementUnavailable as exc:  # no Landlock was refused above: the user
        raise CommandRefused(str(exc)) from None


def upstream_confinement(plane: Plane) -> Confinement:
    """An MCP server started for a stream that is no plan: confined whenever the kernel
    can (no opt-out), writing nothing but its temporary directory."""
    return _of(plane, plan_policy(None), "the MCP server")


def work_confinement(
    plane: Plane, plan: PlanState, write: Iterable[Path], what: str = "the plan's tools"
) -> Confinement:
    """A tool call, compensation or MCP server of ``plan``: reads and writes ``write``
    (its sandbox's copies), reads the allow-list."""
    return _of(plane, plan_policy(plan), what, write=write)


def validation_confinement(plane: Plane, plan: PlanState) -> Confinement:
    """A validation of ``plan``: writes nothing but its temporary directory (the runner
    adds its throwaway copy, read-only)."""
    return _of(plane, plan_policy(plan), "the plan's validations")


def review_confinement(
    plane: Plane, plan: PlanState | None, read: Iterable[Path] = ()
) -> Confinement:
    """A hosted review's program: reads ``read`` (a candidate's copy of the scope; the
    evaluator, repair and merger get none), writes nothing but its temporary directory.
    A review of no plan is confined whenever the kernel can."""
    return _of(plane, plan_policy(plan), "the reviewer programs", lend=read)
