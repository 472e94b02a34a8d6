"""`evidence mcp connect`: the service's MCP gate on stdio for an MCP client that
launches its servers, over the service's unix socket, with the credential added — and
only to a service that showed who it is (docs/service.md, "MCP over HTTP").

Real processes: `evidence serve --uds`, the bridge, and the official SDK's stdio client
driving it; a tool the plane launches (`mcp-server-time`, imported from its own
declaration) called through the gate."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

from commands.plane import Plane
from commands.plane.credentials import issue_credential
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from tests.helpers import run_cli, wait_ready

TIME = [sys.executable, "-m", "mcp_server_time"]


def _bridge(url: str, token: str, *more: str) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVIDENCE_SERVER")}
    env["EVIDENCE_CREDENTIAL"] = token
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "commands.cli", "mcp", "connect", "--server", url, *more],
        env=env,
    )


def test_an_agent_cli_reaches_the_gate_through_the_socket(
    sqlite_url: str, tmp_path: Path, socket_dir: Path
) -> None:
    assert run_cli("init", "--db", sqlite_url).returncode == 0
    assert (
        run_cli("tool", "import", "--mcp", "time", "--db", sqlite_url, "--", *TIME).returncode == 0
    )
    with Plane.open(sqlite_url) as plane:
        create_plan(plane, "P-1", project="p", resources=[str(tmp_path)])
        record_strategy(plane, "P-1", "ask the time")
        enter_execute(plane, "P-1")
        token = issue_credential(plane, "P-1", ttl=timedelta(hours=1)).token
    path = socket_dir / "serve.sock"
    env = {k: v for k, v in os.environ.items() if k != "EVIDENCE_DB"}
    serve = subprocess.Popen(
        [sys.executable, "-m", "commands.cli", "serve", "--db", sqlite_url, "--uds", str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    seen: dict[str, Any] = {}
    try:
        assert serve.stdout is not None and serve.stdout.readline().startswith("listening")
        wait_ready(path)

        async def drive() -> None:
            async with (
                stdio_client(_bridge(f"unix:{path}", token)) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                seen["tools"] = {t.name for t in (await session.list_tools()).tools}
                seen["time"] = await session.call_tool(
                    "time.get_current_time", {"timezone": "Europe/Paris"}
                )
                seen["status"] = await session.call_tool("evidence.plan_status", {})
            # one server's door: its tools under the server's own names
            async with (
                stdio_client(_bridge(f"unix:{path}", token, "--mcp-server", "time")) as (r, w),
                ClientSession(r, w) as session,
            ):
                await session.initialize()
                seen["door"] = {t.name for t in (await session.list_tools()).tools}
                seen["door_time"] = await session.call_tool(
                    "get_current_time", {"timezone": "Europe/Paris"}
                )

        anyio.run(drive)
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0
        assert serve.stdout is not None
        serve.stdout.close()
    assert {"time.get_current_time", "evidence.plan_status"} <= seen["tools"]
    assert not seen["time"].is_error, seen["time"]
    assert "Europe/Paris" in json.dumps(seen["time"].model_dump(mode="json"))
    assert seen["status"].structured_content["plan"]["phase"] == "execute"
    assert {"get_current_time", "evidence.plan_status"} <= seen["door"]
    assert not seen["door_time"].is_error, seen["door_time"]


def test_the_bridge_sends_nothing_to_a_service_it_cannot_trust(socket_dir: Path) -> None:
    """A socket in a directory everyone may write (a squatter's, say), and plain http:
    refused before a byte is sent, in one line, exit 2."""
    import socket

    squatted = Path(tempfile.mkdtemp())  # under /tmp: anyone could have put it there
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(squatted / "serve.sock"))
        listener.listen()
        listener.settimeout(0.5)
        for url, said, *more in (
            (f"unix:{squatted}/serve.sock", "is not trusted"),
            ("http://127.0.0.1:8750", "plain http://"),
            ("http://127.0.0.1:8750", "Invalid value for --mcp-server", "--mcp-server", "a/b"),
        ):
            done = subprocess.run(
                [sys.executable, "-m", "commands.cli", "mcp", "connect", "--server", url, *more],
                env={**os.environ, "EVIDENCE_CREDENTIAL": "evd_x_secret"},
                capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            assert done.returncode == 2, done.stderr
            assert done.stderr.startswith("error: ") and said in done.stderr, done.stderr
            assert "evd_x_secret" not in done.stderr
        try:
            listener.accept()
            raise AssertionError("the bridge connected to the squatter")
        except TimeoutError:
            pass
