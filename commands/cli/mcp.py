"""``evidence mcp proxy``: the MCP gate proxy in front of an MCP server (docs/agents.md).
The transport is ``commands.cli.mcp_proxy``; the plane side ``commands.plane.proxy``."""

from __future__ import annotations

from urllib.parse import urlsplit

import click

from ledger.errors import LedgerError

from .common import db_option, open_plane, workdir_option
from .inputs import Seconds


@click.group()
def mcp() -> None:
    """MCP gate proxy: gate and record an agent's MCP tool calls.

    Stands between the agent and an MCP server: every tool call passes the input gate,
    is forwarded, recorded, and its result passes the output gate."""


@mcp.command("proxy", context_settings={"ignore_unknown_options": True})
@click.option("--plan", "plan_id", required=True, help="The plan the agent works on (in Execute).")
@click.option(
    "--url",
    default=None,
    metavar="URL",
    help="The upstream is a streamable-HTTP MCP server at URL (instead of a command).",
)
@click.option(
    "--server",
    default=None,
    help="The MCP server's name in the registry (mcp_server; default: the name the "
    "server reports).",
)
@click.option(
    "--timeout",
    type=Seconds(0.1, 604800),
    default=60.0,
    show_default=True,
    help="Seconds the upstream may take to start or to answer one call.",
)
@click.argument("upstream", nargs=-1, type=click.UNPROCESSED)
@workdir_option
@db_option
def proxy(
    plan_id: str, url: str | None, server: str | None, timeout: float, upstream: tuple[str, ...]
) -> None:
    """Serve MCP to the agent in front of a server, gating every call.

    The proxy speaks MCP on stdio to the agent, in front of the MCP server UPSTREAM (a
    command, after --) or --url URL: every tools/call passes the input gate, is
    forwarded, recorded, and its result passes the output gate.

    \b
    Examples:
      evidence mcp proxy --plan P-1 -- python my_mcp_server.py
      evidence mcp proxy --plan P-1 --url http://127.0.0.1:8000/mcp
    """
    import anyio

    from commands.plane.proxy import server_name

    from .mcp_proxy import serve

    if (url is None) == (not upstream):
        raise click.UsageError("give the upstream MCP server: a command after --, or --url URL")
    if url is not None and (
        urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc
    ):
        raise click.BadParameter(f"{url!r}: an http:// or https:// URL", param_hint="--url")
    if server is not None and server_name(server) != server:
        raise click.BadParameter(
            f"{server!r}: letters, digits, '.', '_' and '-' only, at most 64, not at the "
            "ends (it becomes part of registered tool names)",
            param_hint="--server",
        )
    # The proxy's calls leave the read models to their readers (each listing catches
    # them up first): keeping them current inline cost a gated call 1.5-2.5 ms.
    plane = open_plane(inline_read_models=False)
    program = url or upstream[0]
    try:
        anyio.run(
            lambda: serve(plane, plan_id, upstream, url=url, server=server, timeout_s=timeout)
        )
    except (LedgerError, click.ClickException):
        raise
    except Exception as exc:  # the upstream could not start or answer: one line, exit 2
        raise click.ClickException(_upstream_failure(program, exc, timeout)) from None


def _upstream_failure(program: str, exc: BaseException, timeout: float) -> str:
    """What stopped the proxy, in one line (task groups wrap the cause in a group)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, LedgerError):
        return str(exc)
    if isinstance(exc, TimeoutError):
        why = f"did not answer within {timeout:g} s"
    else:
        why = f"failed: {' '.join(str(exc).split()) or type(exc).__name__}"
    return f"the MCP server {program!r} {why}"


@mcp.command("connect")
@click.option(
    "--server",
    "url",
    default=None,
    metavar="URL",
    help="The service: unix:PATH or https://… (default: $EVIDENCE_SERVER).",
)
@click.option(
    "--mcp-server",
    "mcp_server",
    default=None,
    metavar="NAME",
    help="One registered MCP server's door (/mcp/NAME): its tools under its own names, "
    "its resources and prompts.",
)
def connect(url: str | None, mcp_server: str | None) -> None:
    """The service's MCP gate as a stdio MCP server.

    Relays every MCP message between stdio and the service's /mcp (or /mcp/NAME),
    adding the agent's credential ($EVIDENCE_CREDENTIAL or $EVIDENCE_CREDENTIAL_FILE)
    to each request, after checking who answers: a unix socket only where no other user
    could have put it, https only to a trusted certificate, never plain http
    (docs/service.md).

    \b
    Examples:
      evidence mcp connect --server unix:/run/evidence/serve.sock
      evidence mcp connect --server https://plane.example.org --mcp-server files
    """
    import re

    import anyio

    from commands.hook_client import Blocked, read_credential, server_of

    from .mcp_bridge import check, relay

    if mcp_server is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", mcp_server):
        raise click.BadParameter(
            "letters, digits and . _ - (at most 64): a registered server's name",
            param_hint="--mcp-server",
        )
    door = f"/mcp/{mcp_server}" if mcp_server else "/mcp"
    try:
        server = server_of(url)
        token = read_credential()
        check(server)
    except Blocked as exc:
        raise click.ClickException(str(exc)) from None
    try:
        anyio.run(relay, server, token, door)
    except Exception as exc:  # the service went away or refused: one line, exit 2
        found: BaseException = exc
        while isinstance(found, BaseExceptionGroup) and len(found.exceptions) == 1:
            found = found.exceptions[0]
        said = " ".join(str(found).split()) or type(found).__name__
        raise click.ClickException(f"the evidence service at {server.url}: {said}") from None
