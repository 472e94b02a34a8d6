"""Kernel confinement (Landlock) of the programs the plane starts: tools, validations,
compensations, MCP servers and reviewer programs.

A ``Confinement`` says what one run of a program may touch; ``launched`` turns an argv
into the argv that runs it confined — ``python -I -S landlock_exec.py POLICY -- argv``,
the stdlib-only launcher restricting itself before it ``exec``s the program (one
mechanism for every spawn: no ``preexec_fn``, which is unsafe in a threaded process) —
with a private temporary directory of its own (``TMPDIR``, ``TMP``, ``TEMP``), removed
afterwards.

What a confined program may do:

- **read and execute** the allow-list: the system directories that exist (``/usr``,
  ``/bin``, ``/sbin``, ``/lib*``, ``/etc``, ``/opt``, ``/proc``, ``/sys``), this
  interpreter's prefixes, the directories on ``PATH`` and the real directories of
  ``sys.path`` — without any entry that contains (or lies inside) a ``protected`` path:
  the ledger's database file, its state directory (every plan's sandbox), the plane key.
  Such an entry is dropped, a system directory included: keep the ledger and its key
  out of them. The device files ``/dev/null``, ``/dev/zero``, ``/dev/full``,
  ``/dev/random``, ``/dev/urandom`` and ``/dev/tty`` are readable and writable; nothing
  else under ``/dev``.
- **read** its own ``read`` paths and **write** its ``write`` paths (and its temporary
  directory): what each kind of work gets is in ``commands.plane.confinement``. The
  files a registered command names literally by absolute path (``program_files``: the
  program, its script) are readable too. Every ``read`` path is filtered as the
  allow-list is.
- the operator adds paths for every confined program with ``EVIDENCE_CONFINE_READ`` and
  ``EVIDENCE_CONFINE_WRITE`` in the plane's environment (``os.pathsep``-separated;
  filtered as the allow-list is).

What else a confined program gets and does not get:

- **its environment** is an allow-list (``confined_env``): ``PATH``, ``HOME``, the
  locale and a few interpreter settings, and the names the operator lists in
  ``EVIDENCE_CONFINE_ENV``; nothing else of the plane's (no ``EVIDENCE_*``, no
  ``PGPASSWORD``, no cloud keys);
- **nothing it starts outlives it**: the launcher runs it in a new PID namespace (and
  mount namespace, with a ``/proc`` of its own: the plane's processes, their command
  lines and environments, are out of sight), and when the program ends the kernel ends
  every process left in it — a ``setsid`` daemon, a double fork, one ignoring signals.
  Where the kernel grants no namespace (user namespaces disabled), the launcher is the
  subreaper of everything the program starts and kills what is left when it ends; a
  launcher killed outright (``SIGKILL``) then cannot;
- **no abstract unix socket and no signal** outside its Landlock domain (ABI 6);
- **its own OS user**, where the operator names one (``EVIDENCE_CONFINE_USER``,
  ``confine_user``; the plane must be root): no supplementary group, no capability;
  what it works on (``write``, ``lent``) is handed to that user first (``give_tree``);
- **TCP only to the ports its registration declares** (``network``; ``running``):
  connect to ``connect``, bind ``bind``, nothing else (Landlock ABI 4; ports, not
  hosts; before ABI 4 TCP is open).

Not confined: UDP, pathname unix sockets (Landlock does not mediate ``connect`` to
them: keep the database's socket and any other service's out of reach by file mode or
a directory the service's user alone may enter), and reads of the allow-list.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import pwd
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from . import landlock_exec
from .trees import give_tree

__all__ = [
    "ENV_BASE",
    "ENV_PASS",
    "LAUNCHER",
    "READ_ENV",
    "USER_ENV",
    "WRITE_ENV",
    "Confinement",
    "Level",
    "Policy",
    "allow_list",
    "confine_user",
    "confined_env",
    "exec_failure",
    "landlock_abi",
    "launched",
    "launcher_failure",
    "program_files",
    "unconfined",
    "wrap",
]

Level = Literal["landlock", "unconfined"]  # what a run was: recorded on its event
Policy = Literal["landlock", "none"]  # what a plan asks for (global_config.confinement)

READ_ENV = "EVIDENCE_CONFINE_READ"
USER_ENV = "EVIDENCE_CONFINE_USER"  # the OS user confined programs run as
ENV_PASS = "EVIDENCE_CONFINE_ENV"  # variables the operator passes to confined programs
# What every confined program gets of the plane's environment (and nothing else).
ENV_BASE = frozenset(
    (
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM",
        "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING", "PYTHONUNBUFFERED",
        "VIRTUAL_ENV",
    )
)  # fmt: skip
WRITE_ENV = "EVIDENCE_CONFINE_WRITE"
LAUNCHER = Path(landlock_exec.__file__).resolve()
MARKER = landlock_exec.MARKER

_SYSTEM = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/proc",
    "/sys",
)
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")


@functools.cache
def landlock_abi() -> int:
    """The running kernel's Landlock ABI version (0: none; asked once per process)."""
    return landlock_exec.abi_version()


@dataclass(frozen=True)
class Confinement:
    """What one run of a program may touch (see the module's docstring). ``level``
    ``unconfined`` runs it as it is (the plan opted out: ``confinement: none``)."""

    level: Level
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    protected: tuple[str, ...] = ()  # never reachable through the allow-list
    # The TCP ports it may connect to and bind (Landlock ABI 4); nothing else over TCP.
    connect: tuple[int, ...] = ()
    bind: tuple[int, ...] = ()
    # The OS user (uid, gid) it runs as (EVIDENCE_CONFINE_USER); None: the plane's own.
    user: tuple[int, int] | None = None
    # Plane-made trees it reads (a validation's copy): handed to ``user`` with ``write``.
    lent: tuple[str, ...] = ()

    @property
    def confined(self) -> bool:
        return self.level == "landlock"

    def adding(
        self, *, read: Iterable[str] = (), write: Iterable[str] = (), lend: Iterable[str] = ()
    ) -> Confinement:
        """More to read or write; ``lend``: plane-made trees it reads, which become its
        user's (when it runs as one) so that it can read them whatever their modes."""
        lend = tuple(lend)
        return replace(
            self,
            read=(*self.read, *read, *lend),
            write=(*self.write, *write),
            lent=(*self.lent, *lend),
        )

    def running(
        self, template: Iterable[object] | None, network: Mapping[str, object] | None
    ) -> Confinement:
        """This confinement for one registered program: it also reads the files its
        command names (``program_files``) and reaches the TCP ports its registration
        declares (``network``: ``{"connect": [...], "bind": [...]}``), nothing more."""
        ports = {key: _ports((network or {}).get(key)) for key in ("connect", "bind")}
        return replace(
            self.adding(read=program_files(template)),
            connect=(*self.connect, *ports["connect"]),
            bind=(*self.bind, *ports["bind"]),
        )

    @classmethod
    def of(
        cls,
        policy: Policy,
        *,
        read: Iterable[str | os.PathLike[str]] = (),
        write: Iterable[str | os.PathLike[str]] = (),
        lend: Iterable[str | os.PathLike[str]] = (),
        protected: Iterable[str | os.PathLike[str]] = (),
    ) -> Confinement:
        """The confinement a plan's ``policy`` gives: ``none`` runs unconfined. Raises
        ``ConfinementUnavailable`` for ``landlock`` on a kernel without it, or with an
        ``EVIDENCE_CONFINE_USER`` the plane cannot run programs as."""
        if policy == "none":
            return unconfined()
        if landlock_abi() < 1:
            raise ConfinementUnavailable()
        return cls(
            "landlock",
            read=tuple(os.fspath(p) for p in read),
            write=tuple(os.fspath(p) for p in write),
            protected=tuple(os.path.realpath(p) for p in protected),
            user=confine_user(),
        ).adding(lend=(os.fspath(p) for p in lend))


def unconfined() -> Confinement:
    return Confinement("unconfined")


class ConfinementUnavailable(Exception):
    """The kernel has no Landlock, and the plan did not opt out of confinement (or the
    plane cannot run programs as the user the operator named)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(
            message
            or "this kernel has no Landlock (Linux 5.13 or later, enabled at boot), so "
            "the plane cannot confine the programs it runs; a plan created with "
            "global_config `confinement: none` runs them unconfined, and is reported so"
        )


def confine_user() -> tuple[int, int] | None:
    """The user (uid, gid) ``EVIDENCE_CONFINE_USER`` names (a name or a number), the
    user every confined program runs as; None when unset. ``ConfinementUnavailable``
    when it names no user, names root, or the plane is not root (only root can start a
    program as another user and leave it no capability)."""
    named = os.environ.get(USER_ENV, "").strip()
    if not named:
        return None
    try:
        entry = pwd.getpwuid(int(named)) if named.isdigit() else pwd.getpwnam(named)
    except (KeyError, ValueError, OverflowError):
        raise ConfinementUnavailable(f"{USER_ENV}={named!r} names no user of this host") from None
    if entry.pw_uid == 0:
        raise ConfinementUnavailable(f"{USER_ENV}={named!r} is root: name an unprivileged user")
    if os.geteuid() != 0:
        raise ConfinementUnavailable(
            f"{USER_ENV}={named!r} needs the plane to run as root (it starts every program "
            "as that user, with no capability); unset it to run them as the plane's user"
        )
    return entry.pw_uid, entry.pw_gid


def _ports(value: object) -> tuple[int, ...]:
    if not isinstance(value, list | tuple):
        return ()
    return tuple(p for p in value if isinstance(p, int) and not isinstance(p, bool))


# -- the allow-list --------------------------------------------------------------------


def _env_paths(name: str) -> list[str]:
    return [p for p in os.environ.get(name, "").split(os.pathsep) if os.path.isabs(p)]


def _touches(path: str, protected: Sequence[str]) -> bool:
    """``path`` contains a protected path, or lies inside one."""
    for guarded in protected:
        if guarded == path or guarded.startswith(path.rstrip("/") + "/"):
            return True
        if path.startswith(guarded.rstrip("/") + "/"):
            return True
    return False


def _existing(paths: Iterable[str], protected: Sequence[str]) -> list[str]:
    """Each path's real path, if it exists and touches nothing protected; in order, once."""
    kept: dict[str, None] = {}
    for path in paths:
        if not path or not os.path.isabs(path):
            continue  # "" and relative entries mean the working directory: not allowed
        real = os.path.realpath(path)
        if os.path.exists(real) and not _touches(real, protected):
            kept[real] = None
    # An entry inside another adds nothing (a rule covers everything beneath it).
    return [p for p in kept if not any(p.startswith(o.rstrip("/") + "/") for o in kept)]


def allow_list(protected: Sequence[str] = ()) -> list[str]:
    """What every confined program may read and execute (see the module's docstring)."""
    candidates = [
        *_SYSTEM,
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        *os.get_exec_path(),
        *(p for p in sys.path if isinstance(p, str)),
        *_env_paths(READ_ENV),
    ]
    return _existing(candidates, protected)


def program_files(template: Iterable[object] | None) -> list[str]:
    """The files a registered command names literally: each item of its argv template
    with no placeholder that is the absolute path of an existing regular file (the
    program, its script). A confined run of it may read and execute them — what the
    operator registered — but never a directory named so, nor anything a placeholder
    fills in (the agent's values)."""
    return [
        item
        for item in template or ()
        if isinstance(item, str)
        and "{" not in item
        and os.path.isabs(item)
        and os.path.isfile(item)
    ]


# -- launching ---------------------------------------------------------------------------


def wrap(argv: Sequence[str], confinement: Confinement) -> list[str]:
    """The argv that runs ``argv`` under ``confinement`` (``argv`` itself unconfined)."""
    if not confinement.confined:
        return list(argv)
    protected = confinement.protected
    write = [*confinement.write, *_existing(_env_paths(WRITE_ENV), protected)]
    write_real = {os.path.realpath(p) for p in write}
    read = _existing([*allow_list(protected), *confinement.read], protected)
    read = [p for p in read if p not in write_real]
    policy = [
        *(f"r:{p}" for p in read),
        *(f"w:{p}" for p in [*write, *_DEVICES]),
        *(f"tcp-connect:{p}" for p in sorted(set(confinement.connect))),
        *(f"tcp-bind:{p}" for p in sorted(set(confinement.bind))),
        *([f"as:{confinement.user[0]}:{confinement.user[1]}"] if confinement.user else []),
    ]
    return [sys.executable, "-I", "-S", os.fspath(LAUNCHER), *policy, "--", *argv]


@contextlib.contextmanager
def launched(
    argv: Sequence[str], confinement: Confinement | None, env: Mapping[str, str] | None
) -> Iterator[tuple[list[str], dict[str, str] | None]]:
    """The argv and environment that run ``argv`` under ``confinement``, while inside:
    a confined run gets a private temporary directory (``TMPDIR``, ``TMP``, ``TEMP``),
    removed on the way out, and only the allow-listed variables (``confined_env``)."""
    if confinement is None or not confinement.confined:
        yield list(argv), None if env is None else dict(env)
        return
    temp = tempfile.mkdtemp(prefix="evidence-tmp-")
    try:
        child = confined_env(os.environ if env is None else env)
        child.update(TMPDIR=temp, TMP=temp, TEMP=temp)
        confinement = confinement.adding(write=(temp,))
        if confinement.user is not None:
            child.update(_hand_over(confinement))
        yield wrap(argv, confinement), child
    finally:
        _remove(temp)


def _hand_over(confinement: Confinement) -> dict[str, str]:
    """Make the program's user the owner of what it writes and of the plane-made trees
    it reads; its ``HOME``, ``USER`` and ``LOGNAME``."""
    assert confinement.user is not None
    uid, gid = confinement.user
    for tree in (*confinement.write, *confinement.lent):
        give_tree(tree, uid, gid)
    entry = pwd.getpwuid(uid)
    return {"HOME": entry.pw_dir, "USER": entry.pw_name, "LOGNAME": entry.pw_name}


def confined_env(base: Mapping[str, str]) -> dict[str, str]:
    """What a confined program gets of ``base`` (the plane's environment, or what a
    caller built from it): the allow-listed names (``ENV_BASE``, ``LC_*``) and those
    the operator names in ``EVIDENCE_CONFINE_ENV``, never anything else — the plane's
    own secrets (a database password, a cloud key) are not the agent's code's."""
    named = {n for n in os.environ.get(ENV_PASS, "").replace(",", " ").split() if n}
    return {
        k: v
        for k, v in base.items()
        if (k in ENV_BASE or k.startswith("LC_") or k in named) and not k.startswith("EVIDENCE_")
    }


def exec_failure(exit_code: int | None, stderr: bytes) -> tuple[int, str] | None:
    """``(errno, message)`` when a confined run's launcher could not start its program
    (``errno`` 0: the confinement itself could not be set up); None otherwise."""
    if exit_code not in (landlock_exec.EXEC_FAILED, landlock_exec.SETUP_FAILED):
        return None
    return launcher_failure(stderr)


def launcher_failure(stderr: bytes) -> tuple[int, str] | None:
    """``exec_failure`` read from the stderr alone (for a server whose exit status is
    not known): the launcher's one line, if it is the first."""
    line = stderr.split(b"\n", 1)[0].decode("utf-8", "replace")
    if not line.startswith(MARKER):
        return None
    said = line[len(MARKER) :].strip()
    if not said.startswith("exec errno="):
        return 0, said
    code, _, message = said.removeprefix("exec errno=").partition(" ")
    try:
        number = int(code)
    except ValueError:
        return None
    if number == errno.EACCES:
        message += (
            " (a confined program runs only what it may read: add its directory to "
            f"{READ_ENV} in the plane's environment)"
        )
    return number, message


def _remove(root: str) -> None:
    """Delete a temporary tree, even one a program made unwritable."""

    def retry(function: object, path: str, _exc: object) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, 0o700)
            if callable(function):
                function(path)

    shutil.rmtree(root, onerror=retry)
