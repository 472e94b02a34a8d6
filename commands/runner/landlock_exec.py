"""Run a program confined by Landlock: the launcher every confined process of the plane
starts through (``commands.runner.confine.wrap``).

    python -I -S landlock_exec.py [r:PATH | w:PATH | tcp-connect:PORT | tcp-bind:PORT]...
        [as:UID:GID] [no-namespaces] -- PROGRAM ARG...

Each ``r:PATH`` allows reading (and executing) beneath PATH, each ``w:PATH`` writing
too (one argument a path: any byte but NUL, no quoting; the policy is not JSON because
importing ``json`` would double the launcher's start-up time). It builds a Landlock
ruleset that handles every file-system right the running kernel's ABI knows
(ABI 1 the base set; 2 ``REFER``; 3 ``TRUNCATE``; 5 ``IOCTL_DEV``), allows read and
execute beneath each ``r:`` path and every right but making device nodes beneath each
``w:`` path (a path that does not exist is skipped; a file gets the file rights of
its list), handles TCP (ABI 4: the program connects to the ``tcp-connect:`` ports and
binds the ``tcp-bind:`` ports, no others), scopes abstract unix sockets and signals to
the domain (ABI 6: the program cannot signal the plane), becomes the ``as:`` user (no
supplementary group, no capability left; the launcher must be root), sets
``PR_SET_NO_NEW_PRIVS``, restricts itself, then ``execvp``s the program. Everything
the program starts inherits the confinement; it can only be narrowed further.

It imports the standard library only and runs with ``-I -S`` (no site, no user or
working-directory path), so nothing of the tree it confines can stand in for it. A
program that cannot be executed (not found, not executable, outside what the policy
lets it read) is one line on stderr starting with ``MARKER`` and the exit status
``EXEC_FAILED``; a confinement that cannot be set up is one line with ``MARKER`` and
``SETUP_FAILED`` — the program never runs unconfined.

The syscalls are called directly (``ctypes``): no Python binding of Landlock is a
stable release yet. Their numbers are the generic ones (444-446), the same on x86_64,
aarch64 and the other architectures Linux runs this on.
"""

# The C module itself: ``signal`` would import ``enum`` at every start of the launcher.
import _signal as signal  # type: ignore[import-not-found]  # no stub: the C module
import ctypes
import errno
import os
import stat
import sys

MARKER = "evidence-confine:"
EXEC_FAILED = 127  # with MARKER on stderr: the program could not be executed
SETUP_FAILED = 126  # with MARKER on stderr: the confinement could not be set up

_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2  # ABI 4
BIND_TCP = 1 << 0  # ABI 4 (handled_access_net)
CONNECT_TCP = 1 << 1  # ABI 4
_PR_SET_NO_NEW_PRIVS = 38

# Access rights (include/uapi/linux/landlock.h)
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6 (scoped)
SCOPE_SIGNAL = 1 << 1  # ABI 6 (scoped)

# The rights that apply to a file (not a directory) in a rule.
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV


def handled_rights(abi: int) -> int:
    """Every file-system right ABI ``abi`` knows (0 for none)."""
    if abi < 1:
        return 0
    rights = (1 << 13) - 1  # ABI 1: EXECUTE .. MAKE_SYM
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def read_rights(abi: int) -> int:
    return (EXECUTE | READ_FILE | READ_DIR) & handled_rights(abi)


def write_rights(abi: int) -> int:
    """Everything but making device nodes (a device node in a writable directory would
    open whatever device it names)."""
    return handled_rights(abi) & ~(MAKE_CHAR | MAKE_BLOCK)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in the kernel's header
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


_LIBC: list[ctypes.CDLL] = []  # loaded on first use


def _libc() -> ctypes.CDLL:
    if not _LIBC:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        _LIBC.append(libc)
    return _LIBC[0]


def _syscall(*args: int) -> int:
    ctypes.set_errno(0)
    result = _libc().syscall(*(ctypes.c_long(a) for a in args))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return int(result)


def abi_version() -> int:
    """The Landlock ABI version of the running kernel; 0 when it has none (not Linux,
    built without it, or disabled at boot)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        return _syscall(_SYS_CREATE_RULESET, 0, 0, _CREATE_RULESET_VERSION)
    except (OSError, AttributeError):
        return 0


def restrict_self(
    read: list[str], write: list[str], connect: tuple[int, ...] = (), bind: tuple[int, ...] = ()
) -> None:
    """Confine this process (and everything it starts) to ``read`` and ``write``, and
    over TCP to ``connect`` and ``bind`` (ABI 4); ``OSError`` when the kernel refuses.
    Single-threaded callers only: the restriction applies to the calling thread."""
    enforce(ruleset(read, write, connect, bind))


def ruleset(
    read: list[str], write: list[str], connect: tuple[int, ...] = (), bind: tuple[int, ...] = ()
) -> int:
    """A ruleset (its descriptor) allowing ``read``, ``write``, ``connect`` and ``bind``:
    each path opened now, by whoever this process is (root, before it becomes the
    program's user, reaches paths that user could not name)."""
    abi = abi_version()
    if abi < 1:
        raise OSError(errno.EOPNOTSUPP, "Landlock is not available in this kernel")
    scoped = SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET if abi >= 6 else 0
    net = BIND_TCP | CONNECT_TCP if abi >= 4 else 0
    attr = _RulesetAttr(handled_rights(abi), net, scoped)
    # The struct grew with the ABI: pass only the part this kernel knows.
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    found = _syscall(_SYS_CREATE_RULESET, ctypes.addressof(attr), size, 0)
    try:
        for paths, rights in ((read, read_rights(abi)), (write, write_rights(abi))):
            for path in paths:
                _add_rule(found, path, rights)
        if net:
            for ports, right in ((connect, CONNECT_TCP), (bind, BIND_TCP)):
                for port in ports:
                    port_attr = _NetPortAttr(right, port)
                    _syscall(_SYS_ADD_RULE, found, _RULE_NET_PORT, ctypes.addressof(port_attr), 0)
    except BaseException:
        os.close(found)
        raise
    return found


def enforce(ruleset_fd: int) -> None:
    """Set ``PR_SET_NO_NEW_PRIVS`` and restrict this process to the ruleset (closed)."""
    try:
        if _libc().prctl(*(ctypes.c_long(a) for a in (_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"PR_SET_NO_NEW_PRIVS: {os.strerror(code)}")
        _syscall(_SYS_RESTRICT_SELF, ruleset_fd, 0)
    finally:
        os.close(ruleset_fd)


def _add_rule(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # absent (or unreachable): nothing to allow there
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_RIGHTS
        attr = _PathBeneathAttr(rights, fd)
        _syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.addressof(attr), 0)
    finally:
        os.close(fd)


def _say(text: str) -> None:
    try:  # noqa: SIM105 (contextlib would be one more import at every start)
        os.write(2, f"{MARKER} {text}\n".encode("utf-8", "replace"))
    except OSError:
        pass


def main(argv: list[str]) -> int:
    try:
        end = argv.index("--")
    except ValueError:
        end = -1
    if end < 0 or end == len(argv) - 1:
        _say("usage: landlock_exec.py [r:PATH | w:PATH | tcp-connect:PORT]... -- PROGRAM ARG...")
        return SETUP_FAILED
    policy = argv[:end]
    read = [item[2:] for item in policy if item.startswith("r:")]
    write = [item[2:] for item in policy if item.startswith("w:")]
    connect, bind = _ports(policy, "tcp-connect:"), _ports(policy, "tcp-bind:")
    user = _user(policy)
    # "no-namespaces": the fallback a kernel without them gets (tests ask for it).
    namespaces = "no-namespaces" not in policy
    counted = len(read) + len(write) + len(connect) + len(bind) + len(user) // 2
    if counted + (not namespaces) != end:
        _say("setup failed: a policy item is not r:PATH, w:PATH, tcp-*:PORT or as:UID:GID")
        return SETUP_FAILED
    os.get_exec_path()  # imports what execvp needs while the library is still readable
    program = argv[end + 1 :]
    isolated = namespaces and _unshare()
    if not isolated:
        # No PID namespace: what the program leaves behind is re-parented to this
        # process, which ends it when the program has ended.
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    report_r, report_w = os.pipe()
    first = os.fork()
    if first == 0:
        os.close(report_r)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # this supervisor gone: so is the run
        if isolated:
            _own_proc()
        os._exit(_init(program, user, (read, write, connect, bind), report_w))
    os.close(report_w)
    _forward_signals(first)
    os.waitpid(first, 0)
    if not isolated:
        _end_descendants()
    report = os.read(report_r, 32)
    status = int(report) if report.strip().isdigit() else signal.SIGKILL
    return _mirror(status)


# -- supervision: nothing the program starts outlives it ---------------------------------
# The program runs as a grandchild of this launcher: its parent (pid 1 of a new PID
# namespace when the kernel grants one) reaps everything and reports the program's wait
# status; when it exits, the kernel ends every process left in the namespace (daemons,
# double forks, signal-ignorers alike). Without a namespace this process is the
# subreaper of the program's descendants and kills those left when the program ends.

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _prctl(option: int, value: int) -> int:
    return int(_libc().prctl(*(ctypes.c_long(a) for a in (option, value, 0, 0, 0))))


def _unshare() -> bool:
    """Enter new PID and mount namespaces (inside a new user namespace unless root,
    with this process's own uid and gid mapped); False where the kernel refuses."""
    libc = _libc()
    root = os.geteuid() == 0
    flags = _CLONE_NEWPID | _CLONE_NEWNS | (0 if root else _CLONE_NEWUSER)
    if libc.unshare(ctypes.c_int(flags)) != 0:
        return False
    if not root:
        uid, gid = os.getuid(), os.getgid()
        try:
            for name, text in (
                ("setgroups", "deny"),
                ("uid_map", f"{uid} {uid} 1"),
                ("gid_map", f"{gid} {gid} 1"),
            ):
                with open(f"/proc/self/{name}", "w") as handle:
                    handle.write(text)
        except OSError:
            return True  # unmapped ids: the namespaces still hold
    return True


def _own_proc() -> None:
    """Mount a /proc of the new PID namespace over the old one, in a private mount
    namespace: the program sees its own processes only, never the plane's command
    line or environment. Best effort (a kernel or container may refuse the mount)."""
    libc = _libc()
    if libc.mount(b"none", b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None) != 0:
        return
    libc.mount(
        b"proc", b"/proc", b"proc", ctypes.c_ulong(_MS_NOSUID | _MS_NODEV | _MS_NOEXEC), None
    )


def _ports(policy: list[str], prefix: str) -> tuple[int, ...]:
    """The ports of the ``prefix`` items (one that is not a port 0-65535 is left out,
    so the count check refuses the policy)."""
    found = [item[len(prefix) :] for item in policy if item.startswith(prefix)]
    return tuple(int(p) for p in found if p.isascii() and p.isdigit() and int(p) <= 65535)


_Rules = tuple[list[str], list[str], tuple[int, ...], tuple[int, ...]]


def _user(policy: list[str]) -> tuple[int, ...]:
    """The ``as:UID:GID`` item's ids (empty: none, or one that is not two numbers, so
    the count check refuses the policy)."""
    found = [item[3:].split(":") for item in policy if item.startswith("as:")]
    if len(found) != 1 or len(found[0]) != 2:
        return ()
    if not all(part.isascii() and part.isdigit() for part in found[0]):
        return ()
    return int(found[0][0]), int(found[0][1])


def _become(user: tuple[int, ...]) -> None:
    """Run as ``user`` (uid, gid): no supplementary group, no ambient capability (an
    exec then leaves a process of another uid none at all); ``OSError`` when this
    process may not."""
    uid, gid = user
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL) != 0 or os.getuid() != uid:
        raise OSError(errno.EPERM, "the user did not change")


def _init(program: list[str], user: tuple[int, ...], rules: _Rules, report: int) -> int:
    """The program's parent: confine and start it, reap every process re-parented
    here, and report the program's wait status on ``report`` when it has ended."""
    child = os.fork()
    if child == 0:
        os.close(report)
        for sig in _FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        stage = "confine the program with Landlock"
        try:
            rules_fd = ruleset(*rules)  # before the user changes: the paths are opened now
            if user:
                stage = f"run the program as uid {user[0]}"
                _become(user)
                stage = "confine the program with Landlock"
            enforce(rules_fd)
        except OSError as exc:
            _say(f"setup failed: cannot {stage}: {exc}")
            os._exit(SETUP_FAILED)
        try:
            os.execvp(program[0], program)
        except OSError as exc:
            code = exc.errno or 0
            _say(f"exec errno={code} cannot execute {program[0]!r}: {exc.strerror or exc}")
        os._exit(EXEC_FAILED)
    _forward_signals(child)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        if pid == child:
            os.write(report, str(status).encode())
            return 0


def _forward_signals(to: int) -> None:
    def forward(sig: int, _frame: object) -> None:
        try:  # noqa: SIM105 (contextlib would be one more import at every start)
            os.kill(to, sig)
        except OSError:
            pass

    for sig in _FORWARDED:
        signal.signal(sig, forward)


def _end_descendants() -> None:
    """Kill and reap every process re-parented to this subreaper (the program's
    leftovers), until none is left."""
    for _round in range(1000):
        children = _children()
        if not children:
            return
        for pid in children:
            try:  # noqa: SIM105
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in children:
            try:  # noqa: SIM105
                os.waitpid(pid, 0)
            except OSError:
                pass


def _children() -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as handle:
                found += [int(pid) for pid in handle.read().split()]
    except OSError:
        return found
    return found


def _mirror(status: int) -> int:
    """Exit as the program did: with its code, or killed by its signal (no core dump
    of this launcher)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        _prctl(_PR_SET_DUMPABLE, 0)
        try:  # noqa: SIM105
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL, SIGSTOP: no handler to reset
        os.kill(os.getpid(), sig)
        return 128 + sig
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else SETUP_FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
