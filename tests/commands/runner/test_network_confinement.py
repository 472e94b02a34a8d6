"""Network reach is a declared capability (issue 42, item 3): a confined program reaches
over TCP only the ports its registration names (``network``: ``connect`` and ``bind``,
Landlock ABI 4), so a tool, a validation or an MCP server that declares none connects
to nothing — not the PostgreSQL ledger on its port, not a service on the host — and
binds nothing (it cannot squat the service's port). The attacks run the real launcher
and real subprocesses, through the Python API and the CLI."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from commands.cli.mcp_proxy import _upstream_confinement
from commands.plane import CommandRefused, Plane
from commands.plane.registry import register_tool, register_validation
from commands.plane.runs import call_tool
from commands.plane.validation_runs import validate_plan
from commands.runner.confine import Confinement, landlock_abi
from tests.commands.runner import test_landlock
from tests.commands.runner.test_landlock import OPS, RESULTS, _probe
from tests.helpers import invoke, status_plan

probe = test_landlock.probe  # the probe script's fixture, shared

needs_tcp_rules = pytest.mark.skipif(
    landlock_abi() < 4, reason="Landlock's TCP rules need ABI 4 (Linux 6.7); this kernel's is older"
)


@pytest.fixture
def listeners() -> Iterator[list[int]]:
    """Two TCP listeners on the loopback (ports the kernel chose)."""
    sockets = []
    for _ in range(2):
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        sockets.append(server)
    yield [s.getsockname()[1] for s in sockets]
    for server in sockets:
        server.close()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the launcher ---------------------------------------------------------------------


@needs_tcp_rules
def test_a_program_that_declares_nothing_reaches_no_tcp_port(
    tmp_path: Path, probe: Path, listeners: list[int]
) -> None:
    confinement = Confinement.of("landlock")
    found = _probe(
        probe,
        confinement,
        tmp_path,
        ["connect-tcp", str(listeners[0])],
        ["connect-tcp", "5432"],  # the PostgreSQL ledger's port
        ["bind-tcp", str(_free_port())],
    )
    assert found == {"0": "EACCES", "1": "EACCES", "2": "EACCES"}


@needs_tcp_rules
def test_a_declared_port_is_reached_and_no_other(
    tmp_path: Path, probe: Path, listeners: list[int]
) -> None:
    free = _free_port()
    declared = Confinement.of("landlock").running(None, {"connect": [listeners[0]], "bind": [free]})
    found = _probe(
        probe,
        declared,
        tmp_path,
        ["connect-tcp", str(listeners[0])],
        ["connect-tcp", str(listeners[1])],
        ["bind-tcp", str(free)],
        ["bind-tcp", str(_free_port())],
        ["bind-tcp", str(listeners[0])],  # reachable is not bindable: EACCES, not EADDRINUSE
    )
    assert found == {"0": "ok", "1": "EACCES", "2": "ok", "3": "EACCES", "4": "EACCES"}


def test_an_unconfined_program_is_not_restricted(
    tmp_path: Path, probe: Path, listeners: list[int]
) -> None:
    from commands.runner.confine import unconfined

    found = _probe(probe, unconfined(), tmp_path, ["connect-tcp", str(listeners[0])])
    assert found == {"0": "ok"}


def test_a_port_outside_tcp_range_is_a_policy_the_launcher_refuses(tmp_path: Path) -> None:
    """The launcher never drops a policy item it cannot read: it refuses to run."""
    from commands.runner import landlock_exec

    assert landlock_exec.main(["tcp-connect:70000", "--", "true"]) == landlock_exec.SETUP_FAILED
    assert landlock_exec.main(["tcp-bind:\uff18\uff10", "--", "true"]) == landlock_exec.SETUP_FAILED


# -- registrations --------------------------------------------------------------------


def _probe_tool(probe: Path, **extra: Any) -> dict[str, Any]:
    return {
        "name": "probe",
        "input_schema": OPS,
        "output_schema": RESULTS,
        "command": [sys.executable, str(probe), "{ops}"],
        **extra,
    }


def _ops(*ops: list[str]) -> dict[str, Any]:
    return {"ops": list(ops)}


@needs_tcp_rules
def test_a_tool_reaches_the_ports_its_registration_declares_only(
    sqlite_url: str, tmp_path: Path, probe: Path, listeners: list[int]
) -> None:
    with Plane.open(sqlite_url) as plane:
        status_plan(plane, tmp_path, {})
        register_tool(plane, _probe_tool(probe))
        attempts = (["connect-tcp", str(listeners[0])], ["connect-tcp", "5432"])
        report = call_tool(plane, "P-1", "probe", _ops(*attempts))
        assert report.ok and json.loads(report.output or b"") == {"0": "EACCES", "1": "EACCES"}
        register_tool(plane, _probe_tool(probe, network={"connect": [listeners[0]]}))
        report = call_tool(plane, "P-1", "probe", _ops(*attempts))
        assert report.ok and json.loads(report.output or b"") == {"0": "ok", "1": "EACCES"}


@needs_tcp_rules
def test_a_validation_reaches_the_ports_it_declares_only(
    sqlite_url: str, tmp_path: Path, probe: Path, listeners: list[int]
) -> None:
    from commands.plane.attachments import attach

    with Plane.open(sqlite_url) as plane:
        project = status_plan(plane, tmp_path, {}, execute=False)
        ops = [["connect-tcp", str(listeners[0])], ["connect-tcp", str(listeners[1])]]
        register_validation(
            plane,
            {
                "name": "reach",
                "mode": "required",
                "command": [sys.executable, str(probe), json.dumps(ops), "--validation"],
                "network": {"connect": [listeners[1]]},
            },
        )
        attach(plane, "reach", resource=str(project))
        from commands.plane.phases import enter_execute

        enter_execute(plane, "P-1")
        report = validate_plan(plane, "P-1")
        reach = next(r for r in report.results if r.validation == "reach")
        assert reach.data == {"0": "EACCES", "1": "ok"}


@pytest.mark.parametrize(
    ("network", "says"),
    [
        ({"connect": [0]}, "`network.connect`: a list of TCP port numbers from 1 to 65535"),
        ({"bind": [65536]}, "`network.bind`: a list of TCP port numbers from 0 to 65535"),
        ({"connect": [True]}, "`network.connect[0]`: expected `int`, got `bool`"),
        ({"connect": ["443"]}, "`network.connect[0]`: expected `int`, got `str`"),
        ({"udp": [53]}, "udp"),
    ],
)
def test_a_network_that_is_not_tcp_ports_is_refused(
    sqlite_url: str, probe: Path, network: dict[str, Any], says: str
) -> None:
    with Plane.open(sqlite_url) as plane:
        before = plane.store.head().size
        with pytest.raises(CommandRefused) as refused:
            register_tool(plane, _probe_tool(probe, network=network))
        assert says in str(refused.value)
        assert plane.store.head().size == before


def test_tool_show_says_what_a_tool_reaches(sqlite_url: str, probe: Path) -> None:
    with Plane.open(sqlite_url) as plane:
        register_tool(plane, _probe_tool(probe, network={"connect": [443, 80, 443], "bind": [0]}))
        register_tool(plane, {**_probe_tool(probe), "name": "quiet"})
    shown = invoke("tool", "show", "probe", "--db", sqlite_url)
    assert shown.exit_code == 0 and "connect 80,443; bind 0" in shown.stdout, shown.output
    quiet = invoke("tool", "show", "quiet", "--db", sqlite_url)
    assert "- (no TCP)" in quiet.stdout


def test_a_wrapper_inherits_the_wrapped_tools_network_and_cannot_widen_it(
    sqlite_url: str, probe: Path
) -> None:
    with Plane.open(sqlite_url) as plane:
        register_tool(plane, _probe_tool(probe, network={"connect": [443]}))
        wrapper = {"name": "wrapped", "mode": "required", "wraps": "probe", "transform": "@"}
        with pytest.raises(CommandRefused, match="timeout and network from it: remove `network`"):
            register_validation(plane, {**wrapper, "network": {"connect": [5432]}})
        register_validation(plane, wrapper)
        spec = plane.log().tool("wrapped")
        assert spec is not None and spec.spec.network.connect == [443]


def test_a_proxy_upstream_reaches_what_the_operator_declared_for_its_command(
    sqlite_url: str,
) -> None:
    """Whoever starts `evidence mcp proxy` names the upstream's command; only an
    operator's registration of that very command grants it reach."""
    server = [sys.executable, "-m", "some_mcp_server"]
    with Plane.open(sqlite_url) as plane:
        for name, source, port in (("fetch", "", 443), ("listed", "mcp:web", 5432)):
            register_tool(
                plane,
                {
                    "name": name,
                    "source": source,  # "mcp:…": listed by the server itself
                    "mcp_server": "web",
                    "mcp_tool_name": name,
                    "mcp_command": server,
                    "input_schema": {"type": "object"},
                    "network": {"connect": [port]},
                },
            )
        declared = _upstream_confinement(plane, None, server)
        other = _upstream_confinement(plane, None, [*server, "--more"])
    assert (declared.connect, declared.bind) == ((443,), ())
    assert (other.connect, other.bind) == ((), ())
