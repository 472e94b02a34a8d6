"""Confined programs run as an OS user other than the service's (issue 42, item 3):
with ``EVIDENCE_CONFINE_USER`` a root plane starts every tool, validation and MCP
server as that user — no supplementary group, no capability — so what only the
service's user may read (a password file under ``/etc``, the database file, whatever
PostgreSQL's ``peer`` authentication would admit as the service's role) stays out of
reach even inside the allow-list. The plane hands the program what it works on (its
sandbox, a validation's copy, its temporary directory) and nothing else.

The programs here are ``/bin/sh`` scripts: the test interpreter may live where the
other user cannot execute it (a pyenv under ``/root``), as a deployment's must not."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from commands.plane import CommandRefused, Plane
from commands.plane.attachments import attach
from commands.plane.lifecycle import apply_plan
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool, register_validation
from commands.plane.runs import call_tool
from commands.plane.validation_runs import validate_plan
from commands.runner import confine
from commands.runner import landlock_exec as ll
from commands.runner.confine import READ_ENV, USER_ENV, landlock_abi
from commands.runner.trees import give_tree
from tests.helpers import invoke, status_plan, work

pytestmark = [
    pytest.mark.skipif(landlock_abi() < 1, reason="this kernel has no Landlock"),
    pytest.mark.skipif(os.geteuid() != 0, reason="starting a program as another user needs root"),
]

NOBODY = pwd.getpwnam("nobody") if os.geteuid() == 0 else None

# Who it runs as, its groups and capabilities, whether it reads the service's secret
# (a 0600 file of root's, readable through the allow-list), and a write in its sandbox.
# (A command is a template: its literal braces are doubled.)
WHOAMI = r"""
secret=$(cat "$SECRET_FILE" 2>/dev/null >/dev/null && echo read || echo denied)
echo made > made.txt && made=yes || made=no
cap=$(grep CapEff /proc/self/status | cut -f2)
printf '{{"uid": "%s", "groups": "%s", "cap": "%s", "secret": "%s", "made": "%s"}}' \
  "$(id -u)" "$(id -G)" "$cap" "$secret" "$made"
"""

STATUS_IS_GOOD = r"""
if grep -q good status.txt 2>/dev/null; then echo '{{"passed": true}}'
else echo '{{"passed": false, "message": "status.txt unreadable or not good"}}'; fi
"""


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A file only root reads, in a directory every confined program may read (as
    ``/etc`` is): the service's secret."""
    where = Path(tempfile.mkdtemp(prefix="evidence-secret-"))
    where.chmod(0o755)
    found = where / "db-password"
    found.write_text("s3cret\n")
    found.chmod(0o600)
    monkeypatch.setenv(READ_ENV, str(where))
    monkeypatch.setenv("SECRET_FILE", str(found))
    monkeypatch.setenv(confine.ENV_PASS, "SECRET_FILE")
    yield found
    shutil.rmtree(where)


def _called(plane: Plane, name: str, command: list[str], **extra: object) -> dict[str, str]:
    """Register ``command`` as tool ``name`` (its output: an object of strings), call it
    in P-1 and answer what it printed."""
    register_tool(
        plane,
        {
            "name": name,
            "command": command,
            "input_schema": {"type": "object"},
            "output_schema": {"type": "object", "additionalProperties": {"type": "string"}},
            **extra,
        },
    )
    report = call_tool(plane, "P-1", name, {})
    assert report.ok, report
    return json.loads(report.output or b"")


def _whoami(plane: Plane) -> dict[str, str]:
    return _called(plane, "whoami", ["/bin/sh", "-c", WHOAMI], writes=True)


def test_without_the_setting_a_program_runs_as_the_plane_and_reads_its_secret(
    sqlite_url: str, tmp_path: Path, secret: Path
) -> None:
    """The attack: under a root plane (or as the service's own user) a tool reads a
    file only the service may read, when it lies inside the allow-list."""
    with Plane.open(sqlite_url) as plane:
        status_plan(plane, tmp_path, {})
        found = _whoami(plane)
    assert found["uid"] == "0" and found["secret"] == "read"


def test_a_tool_runs_as_the_named_user_with_no_group_or_capability(
    sqlite_url: str, tmp_path: Path, secret: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert NOBODY is not None
    monkeypatch.setenv(USER_ENV, "nobody")
    groups = os.getgroups()
    os.setgroups([0, 4])  # the plane's supplementary groups: none reaches the program
    try:
        with Plane.open(sqlite_url) as plane:
            status_plan(plane, tmp_path, {})
            found = _whoami(plane)
            made = work(plane) / "made.txt"
            assert made.read_text() == "made\n" and made.stat().st_uid == NOBODY.pw_uid
    finally:
        os.setgroups(groups)
    assert found == {
        "uid": str(NOBODY.pw_uid),
        "groups": str(NOBODY.pw_gid),
        "cap": "0000000000000000",
        "secret": "denied",
        "made": "yes",
    }


def test_a_validation_reads_its_copy_whatever_its_modes_and_apply_writes_as_ever(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot's copy keeps the sandbox's modes (a 0600 file of root's): the plane
    lends it to the program's user, who reads it; Apply, the plane's, writes as ever."""
    monkeypatch.setenv(USER_ENV, str(pwd.getpwnam("nobody").pw_uid))
    project = tmp_path / "proj"
    project.mkdir()
    (project / "status.txt").write_text("bad\n")
    with Plane.open(sqlite_url) as plane:
        register_validation(
            plane,
            {"name": "status-sh", "mode": "required", "command": ["/bin/sh", "-c", STATUS_IS_GOOD]},
        )
        create_plan(plane, "P-1", project="api", resources=[str(project)])
        attach(plane, "status-sh", resource=str(project))
        record_strategy(plane, "P-1", "make the status good")
        enter_execute(plane, "P-1")
        status = work(plane) / "status.txt"
        status.write_text("good\n")
        status.chmod(0o600)
        report = validate_plan(plane, "P-1")
        results = {r.validation: r.verdict for r in report.results}
        assert results["status-sh"] is True, report
        assert report.outcome == "pass" and report.token
        apply_plan(plane, "P-1", report.token)
    assert (project / "status.txt").read_text() == "good\n"


@pytest.mark.parametrize(
    ("user", "says"),
    [
        ("no-such-user-here", "names no user of this host"),
        ("root", "is root: name an unprivileged user"),
        ("0", "is root"),
    ],
)
def test_a_user_the_plane_cannot_run_programs_as_is_refused(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user: str, says: str
) -> None:
    with Plane.open(sqlite_url) as plane:
        status_plan(plane, tmp_path, {})
        before = plane.store.head().size
    monkeypatch.setenv(USER_ENV, user)
    result = invoke("validate", "P-1", "--db", sqlite_url)
    assert result.exit_code == 2 and result.stderr.count("error:") == 1, result.output
    assert says in result.stderr
    with Plane.open(sqlite_url) as plane:
        assert plane.store.head().size == before


def test_a_plane_that_is_not_root_refuses_rather_than_run_as_itself(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only root can start a program as another user and leave it no capability: a
    plane that cannot refuses (exit 2), never falls back to its own user."""
    with Plane.open(sqlite_url) as plane:
        status_plan(plane, tmp_path, {})
        monkeypatch.setenv(USER_ENV, "nobody")
        monkeypatch.setattr(confine.os, "geteuid", lambda: 1000)
        with pytest.raises(CommandRefused, match="needs the plane to run as root"):
            validate_plan(plane, "P-1")


def test_handing_a_tree_over_follows_no_link(tmp_path: Path) -> None:
    """A symlink in the sandbox to a file of root's, or to a directory: its own owner
    changes, never its target's."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "shadow").write_text("root's\n")
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f.txt").write_text("x\n")
    os.symlink(outside / "shadow", tree / "file-link")
    os.symlink(outside, tree / "sub" / "dir-link")
    give_tree(tree, 65534, 65534)
    owners = {
        os.path.relpath(os.path.join(top, name), tree): os.lstat(os.path.join(top, name)).st_uid
        for top, dirs, files in os.walk(tree)
        for name in [*dirs, *files]
    }
    assert set(owners.values()) == {65534} and len(owners) == 4
    assert os.lstat(tree).st_uid == 65534
    assert outside.stat().st_uid == 0 and (outside / "shadow").stat().st_uid == 0


@pytest.mark.parametrize("item", ["as:65534", "as:x:1", "as:1:2:3", "as:\uff11:1"])
def test_a_user_item_the_launcher_cannot_read_runs_nothing(item: str) -> None:
    assert ll.main([item, "--", "true"]) == ll.SETUP_FAILED


# Connects to the unix socket named by $SOCKET_PATH (Landlock does not mediate connect on
# a pathname socket: only the file's and its directories' modes do).
CONNECT_UNIX = (
    "import json, os, socket\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "try:\n"
    "    s.connect(os.environ['SOCKET_PATH']); said = 'ok'\n"
    "except OSError as exc:\n"
    "    said = __import__('errno').errorcode[exc.errno]\n"
    "print(json.dumps({{'connect': said}}))\n"
)


@pytest.mark.parametrize(("user", "expected"), [(None, "ok"), ("nobody", "EACCES")])
def test_the_services_own_unix_socket_is_out_of_reach_as_another_user(
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    user: str | None,
    expected: str,
) -> None:
    """A socket only the service's user may reach (as PostgreSQL's, in a directory of
    mode 0700): a program running as that user connects — with `peer` authentication it
    would be logged in as the service's role; as another user it cannot."""
    import socket

    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("needs /usr/bin/python3, an interpreter every user may run")
    private = tmp_path / "run"
    private.mkdir(mode=0o700)
    path = private / ".s.PGSQL.5432"
    monkeypatch.setenv("SOCKET_PATH", str(path))
    monkeypatch.setenv(confine.ENV_PASS, "SOCKET_PATH")
    if user is not None:
        monkeypatch.setenv(USER_ENV, user)
    with socket.socket(socket.AF_UNIX) as server, Plane.open(sqlite_url) as plane:
        server.bind(str(path))
        server.listen(4)
        status_plan(plane, tmp_path, {})
        found = _called(plane, "dial", ["/usr/bin/python3", "-c", CONNECT_UNIX])
    assert found == {"connect": expected}
