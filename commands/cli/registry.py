"""``evidence tool|validation register|list|show`` and ``evidence skill define|list|show``.

Registration files are JSON, YAML (.yaml/.yml) or TOML (.toml), parsed strictly; every
refusal is one ``error: FILE: ...`` line, exit 2, nothing appended.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import click

from .common import (
    db_option,
    emit_json,
    emit_listing,
    fail,
    format_option,
    json_option,
    open_plane,
    print_table,
    server_options,
)
from .inputs import Seconds, load_file, whole
from .terminal import inert

if TYPE_CHECKING:  # each module loads only when a verb uses it
    from commands.plane.registry import Registered
    from commands.plane.tool_import import Imported
    from projections.documents import Document

VERSION_HELP = "Show this version instead of the latest."


@contextmanager
def _about(path: str) -> Iterator[None]:
    """Name the file in every refusal, so the one error line says where to look."""
    from commands.plane.core import CommandRefused
    from ledger.errors import LedgerError

    try:
        yield
    except LedgerError as exc:
        raise CommandRefused(f"{path}: {exc}") from exc


def _load(path: str, what: str) -> Mapping[str, Any]:
    """The file's document; ``load_file``'s refusals already name the file."""
    from commands.plane.core import CommandRefused

    raw = load_file(path, f"{what} file")
    if not isinstance(raw, Mapping):
        raise CommandRefused(f"{path}: a {what} file holds one mapping of keys to values")
    return raw


def _report(result: Registered, as_json: bool) -> None:
    if as_json:
        emit_json({result.kind: result.document, "changed": result.changed})
    elif result.changed:
        verb = "defined" if result.kind == "skill" else "registered"
        click.echo(f"{verb} {result.kind} {inert(result.name)} version {result.version}")
    else:
        click.echo(f"{result.kind} {inert(result.name)} unchanged (version {result.version})")


def _executor(spec: Mapping[str, Any]) -> str:
    """One short phrase: how the tool or validation runs."""
    if spec.get("wraps"):
        return f"wraps {spec['wraps']} v{spec.get('wraps_version')}"
    if spec.get("python"):
        return f"python {spec['python']}"
    if spec.get("command"):
        return f"command {argv_text(spec['command'])}"
    if spec.get("mcp_server"):
        how = f"mcp {spec['mcp_server']}/{spec.get('mcp_tool_name')}"
        if spec.get("mcp_command"):
            return f"{how} via {argv_text(spec['mcp_command'])}"
        return f"{how} at {spec['mcp_url']}" if spec.get("mcp_url") else how
    return "-"


def argv_text(argv: Sequence[str]) -> str:
    """An argv list as readable text: the items, space-separated; an item that is empty
    or holds a space, a quote or a backslash in double quotes, written as a JSON string
    (``python -c "print('hi')"``). The plane never runs it through a shell, so no shell's
    quoting is the truth; this form reads the same and is unambiguous."""
    return " ".join(
        item if item and not _NEEDS_QUOTES.search(item) else json.dumps(item, ensure_ascii=False)
        for item in argv
    )


_NEEDS_QUOTES = re.compile(r"[\s\"'\\]")


def _compact(value: Any) -> str:
    if value is None or value in ({}, []):
        return "-"
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _seconds(millis: int | None) -> str:
    return "-" if millis is None else f"{millis / 1000:g}s"


def _network(access: Any) -> str:
    """What its confined program may reach over TCP (nothing unless declared)."""
    parts = [
        f"{key} {','.join(str(p) for p in access.get(key, []))}"
        for key in ("connect", "bind")
        if isinstance(access, dict) and access.get(key)
    ]
    return "; ".join(parts) or "- (no TCP)"


def _show_rows(view: Document) -> list[list[str]]:
    spec = view["spec"]
    version = str(view["version"])
    if view["version"] != view["latest_version"]:
        version += f" (latest {view['latest_version']})"
    rows = [["name", view["name"]], ["kind", view["kind"]], ["version", version]]
    if view["kind"] == "validation":
        rows.append(["mode", spec["mode"]])
    rows += [
        ["description", spec.get("description") or "-"],
        ["executor", _executor(spec)],
    ]
    if spec.get("transform"):
        rows.append(["transform", spec["transform"]])
    rows += [
        ["input_schema", _compact(spec.get("declared_input_schema"))],
        ["input_schema_sha256", spec.get("input_schema_sha256") or "-"],
        ["output_schema", _compact(spec.get("declared_output_schema"))],
        ["output_schema_sha256", spec.get("output_schema_sha256") or "-"],
        ["resource_slots", " ".join(spec.get("resource_slots") or []) or "-"],
        ["timeout", _seconds(spec.get("timeout_ms"))],
        [
            "max_output_bytes",
            str(spec["max_output_bytes"])
            if "max_output_bytes" in spec
            else "- (the plane's default)",
        ],
        ["network", _network(spec.get("network"))],
        ["capability", spec.get("capability") or "-"],
        ["source", spec.get("source") or "-"],
        ["lifecycle", _compact(spec.get("lifecycle"))],
        ["code", spec.get("code") or "-"],
        ["idempotent", str(spec.get("idempotent", False)).lower()],
        ["writes", str(spec.get("writes", False)).lower()],
    ]
    if view["kind"] == "validation":
        rows += [["checkpointable", "false"], ["read_only", "true"]]
    return rows


# -- evidence tool ---------------------------------------------------------------------


@click.group()
def tool() -> None:
    """Tools: register, import, pack, list, show.

    Validations are tools too: one namespace, so a name is a tool or a validation."""


@tool.command("register")
@click.argument("file")
@db_option
@server_options
@json_option
def tool_register(file: str, server: str | None, operator_key: str | None, as_json: bool) -> None:
    """Register the tool in FILE (JSON, YAML or TOML).

    Registering it again with a change appends its next version. With --server, through
    the service, signed here with the operator key.

    \b
    Examples:
      evidence tool register tools/pytest.yaml --json
      evidence tool register calc.json --server unix:/run/evidence/serve.sock
    """
    from commands.plane.registry import parse_tool_spec, register_tool

    raw = _load(file, "tool")
    with _about(file):
        spec = parse_tool_spec(raw)
    if server is not None:
        _register_remotely(server, operator_key, "tool", spec, as_json)
        return
    plane = open_plane(create=True)
    with _about(file):
        result = register_tool(plane, spec)
    _report(result, as_json)


def _register_remotely(
    server: str, operator_key: str | None, kind: str, spec: Any, as_json: bool
) -> None:
    """Register or define ``spec`` (a parsed tool's, validation's or skill's) through the
    service, signed here: only the event that registers this very name is signed."""
    import msgspec

    from ledger.events import SkillDefined, ToolRegistered, ValidationRegistered

    from .operator_remote import act, expecting, remote

    event_type, verb = {
        "tool": (ToolRegistered, "tool.register"),
        "validation": (ValidationRegistered, "validation.register"),
        "skill": (SkillDefined, "skill.define"),
    }[kind]

    expect = expecting(event_type, f"the {kind} {spec.name!r}", name=spec.name)
    args = {"spec": msgspec.to_builtins(spec)}
    answer = act(remote(server, operator_key), verb, args, expect)
    prepared = answer.get("prepared") or []
    version = prepared[0]["payload"].get("version") if prepared else None
    done = "defined" if kind == "skill" else "registered"
    if as_json:
        emit_json({kind: {"name": spec.name, "version": version}, "changed": bool(prepared)})
    elif prepared:
        click.echo(f"{done} {kind} {inert(spec.name)} version {version}")
    else:
        click.echo(f"{kind} {inert(spec.name)} unchanged")


@tool.command("import", context_settings={"ignore_unknown_options": True})
@click.option(
    "--mcp",
    "server",
    required=True,
    metavar="NAME",
    help="The MCP server's name in the registry: its tools become NAME.TOOL.",
)
@click.option(
    "--url",
    default=None,
    metavar="URL",
    help="The server is a streamable-HTTP MCP server at URL (instead of a command after --).",
)
@click.option(
    "--timeout",
    type=Seconds(0.1, 3600),
    default=60.0,
    show_default=True,
    help="Seconds the server may take to start and list its tools.",
)
@click.option("--dry-run", is_flag=True, help="Review what would change; register nothing.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@db_option
@json_option
def tool_import(
    server: str,
    url: str | None,
    timeout: float,
    dry_run: bool,
    command: tuple[str, ...],
    as_json: bool,
) -> None:
    """Register an MCP server's tools from its own declaration.

    Starts the server COMMAND (after --; as this user, like running it by hand) or
    reaches --url, reads every tool it lists, and registers each as NAME.TOOL with its
    schemas exactly as declared and how the plane reaches the server, signed by the
    operator key. Run again, it reviews: added, changed (which fields), unchanged,
    refused, and gone (no longer listed; its registration stays).

    \b
    Examples:
      evidence tool import --mcp time -- python -m mcp_server_time
      evidence tool import --mcp web --url https://mcp.example.org/mcp --dry-run
    """
    from commands.plane.tool_import import check_server, import_tools
    from commands.runner.mcp_client import McpListError, list_mcp_tools

    if (url is None) == (not command):
        raise click.UsageError("give the MCP server: a command after --, or --url URL")
    if url is not None and (
        urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc
    ):
        raise click.BadParameter(f"{url!r}: an http:// or https:// URL", param_hint="--url")
    check_server(server)  # before a server is started for nothing
    plane = open_plane(create=not dry_run)
    try:
        listed = list_mcp_tools(command=list(command) or None, url=url, timeout_s=timeout)
    except McpListError as exc:
        fail(f"cannot list the tools of {inert(url or command[0])}: {inert(str(exc))}")
    done = import_tools(
        plane, server, listed, command=list(command) or None, url=url, dry_run=dry_run
    )
    _print_review({"server": server}, done, dry_run, as_json)


@tool.command("pack")
@click.argument("name")
@click.option("--dry-run", is_flag=True, help="Review what would change; register nothing.")
@db_option
@json_option
def tool_pack(name: str, dry_run: bool, as_json: bool) -> None:
    """Register an agent CLI's built-in tools (NAME: claude-code).

    Each tool under the name the CLI's hooks give it, with the input schema of its
    arguments, signed by the operator key: a hook with the matcher "*" then gates the
    CLI's own tools instead of refusing each as invented. Run again, it reviews.

    \b
    Examples:
      evidence tool pack claude-code
      evidence tool pack claude-code --dry-run --json
    """
    from commands.plane.packs import PACKS, register_pack

    plane = open_plane(create=not dry_run)
    done = register_pack(plane, name, dry_run=dry_run)
    _print_review({"pack": name, "version": PACKS[name]["version"]}, done, dry_run, as_json)


def _print_review(
    head: dict[str, Any], done: Sequence[Imported], dry_run: bool, as_json: bool
) -> None:
    """What an import or a pack did to each tool: a line each, or one JSON document."""
    if as_json:
        emit_json({**head, "dry_run": dry_run, "tools": [d.to_json() for d in done]})
        return
    for d in done:
        detail = f"version {d.version}" if d.version is not None else ""
        if d.changed:
            detail = f"{detail} ({', '.join(d.changed)})".strip()
        if d.why:
            detail = f"{detail}: {d.why}".strip(": ")
        click.echo(f"{d.action:<10} {inert(d.name)}  {inert(detail)}".rstrip())
        for what, ops in d.patch.items():  # the review: what would change
            for op in ops:
                shown = json.dumps(op.get("value"), sort_keys=True) if "value" in op else ""
                if len(shown) > 200:
                    shown = shown[:197] + "..."
                click.echo(inert(f"    {what}: {op['op']} {op['path'] or '/'} {shown}".rstrip()))
    if dry_run:
        click.echo("dry run: nothing registered", err=True)


@tool.command("list")
@click.option(
    "--kind",
    type=click.Choice(["tool", "validation"]),
    help="Only tools or only validations (default: both).",
)
@db_option
@format_option()
def tool_list(kind: str | None, fmt: str) -> None:
    """List every tool and validation, latest versions.

    \b
    Examples:
      evidence tool list
      evidence tool list --kind tool --format csv
    """
    from commands.plane.registry import list_tools

    views = list_tools(open_plane(), kind=kind)  # type: ignore[arg-type]
    emit_listing(fmt, {"tools": views}, views, lambda: _print_tools(views))


def _print_tools(views: list[Document]) -> None:
    print_table(
        ["name", "kind", "version", "executor", "description"],
        [
            [
                v["name"],
                v["kind"],
                str(v["version"]),
                _executor(v["spec"]),
                v["spec"].get("description") or "-",
            ]
            for v in views
        ],
    )


@tool.command("show")
@click.argument("name")
@click.option("--version", type=whole(1), help=VERSION_HELP)
@db_option
@json_option
def tool_show(name: str, version: int | None, as_json: bool) -> None:
    """Show a tool (or validation): its definition and schema digests.

    \b
    Examples:
      evidence tool show pytest
      evidence tool show pytest --version 1 --json
    """
    from commands.plane.registry import get_tool

    view = get_tool(open_plane(), name, version=version)
    if as_json:
        emit_json({"tool": view})
        return
    print_table(["field", "value"], _show_rows(view))


# -- evidence validation ---------------------------------------------------------------


@click.group()
def validation() -> None:
    """Validations: read-only tools that return a verdict.

    Their structured return is exactly {passed, message?, data?}."""


@validation.command("register")
@click.argument("file")
@db_option
@server_options
@json_option
def validation_register(
    file: str, server: str | None, operator_key: str | None, as_json: bool
) -> None:
    """Register the validation in FILE (JSON, YAML or TOML).

    Registering it again with a change appends its next version.

    \b
    Examples:
      evidence validation register validations/tests-pass.toml
      evidence validation register validations/lint.yaml --json
    """
    from commands.plane.registry import parse_validation_spec, register_validation

    raw = _load(file, "validation")
    with _about(file):
        spec = parse_validation_spec(raw)
    if server is not None:
        _register_remotely(server, operator_key, "validation", spec, as_json)
        return
    plane = open_plane(create=True)
    with _about(file):
        result = register_validation(plane, spec)
    _report(result, as_json)


@validation.command("list")
@db_option
@format_option()
def validation_list(fmt: str) -> None:
    """List validations with their mode and executor.

    \b
    Examples:
      evidence validation list
      evidence validation list --format jsonl
    """
    from commands.plane.registry import list_validations

    views = list_validations(open_plane())
    emit_listing(fmt, {"validations": views}, views, lambda: _print_validations(views))


def _print_validations(views: list[Document]) -> None:
    print_table(
        ["name", "version", "mode", "executor", "description"],
        [
            [
                v["name"],
                str(v["version"]),
                v["spec"]["mode"],
                _executor(v["spec"]),
                v["spec"].get("description") or "-",
            ]
            for v in views
        ],
    )


@validation.command("show")
@click.argument("name")
@click.option("--version", type=whole(1), help=VERSION_HELP)
@db_option
@json_option
def validation_show(name: str, version: int | None, as_json: bool) -> None:
    """Show a validation: mode, executor, transform, inherited fields.

    \b
    Examples:
      evidence validation show tests-pass
      evidence validation show tests-pass --version 2 --json
    """
    from commands.plane.registry import get_validation

    view = get_validation(open_plane(), name, version=version)
    if as_json:
        emit_json({"validation": view})
        return
    print_table(["field", "value"], _show_rows(view))


# -- evidence skill --------------------------------------------------------------------


@click.group()
def skill() -> None:
    """Skills: named bundles of tools and validations.

    Membership makes a tool or validation callable in a plan that names the skill; only
    an attachment makes a validation a gate."""


@skill.command("define")
@click.argument("file")
@db_option
@server_options
@json_option
def skill_define(file: str, server: str | None, operator_key: str | None, as_json: bool) -> None:
    """Define the skill in FILE (JSON, YAML or TOML).

    Defining it again with a change appends its next version.

    \b
    Examples:
      evidence skill define skills/qa.json
      evidence skill define skills/python-dev.yaml --json
    """
    from commands.plane.registry import define_skill, parse_skill_spec

    raw = _load(file, "skill")
    with _about(file):
        spec = parse_skill_spec(raw)
    if server is not None:
        _register_remotely(server, operator_key, "skill", spec, as_json)
        return
    plane = open_plane(create=True)
    with _about(file):
        result = define_skill(plane, spec)
    _report(result, as_json)


@skill.command("list")
@db_option
@format_option()
def skill_list(fmt: str) -> None:
    """List skills.

    \b
    Examples:
      evidence skill list
      evidence skill list --format csv
    """
    from commands.plane.registry import list_skills
    from projections.documents import to_json

    skills = list_skills(open_plane())
    documents = [to_json(s) for s in skills]
    emit_listing(
        fmt,
        {"skills": documents},
        documents,
        lambda: print_table(
            ["name", "version", "members", "description"],
            [[s.name, str(s.version), " ".join(s.members), s.description or "-"] for s in skills],
        ),
    )


@skill.command("show")
@click.argument("name")
@db_option
@json_option
def skill_show(name: str, as_json: bool) -> None:
    """Show a skill and its members (kind, latest version, mode).

    \b
    Examples:
      evidence skill show qa
      evidence skill show qa --json
    """
    from commands.plane.registry import get_skill, list_tools
    from projections.documents import to_json

    plane = open_plane()
    doc = get_skill(plane, name)
    if as_json:
        emit_json({"skill": to_json(doc)})
        return
    print_table(
        ["field", "value"],
        [
            ["name", doc.name],
            ["version", str(doc.version)],
            ["description", doc.description or "-"],
        ],
    )
    click.echo()
    members = {v["name"]: v for v in list_tools(plane)}
    rows = []
    for member in doc.members:
        view = members.get(member)
        if view is None:  # members are never unregistered; kept defensive for old logs
            rows.append([member, "-", "-", "-"])
        else:
            rows.append(
                [member, view["kind"], str(view["version"]), view["spec"].get("mode") or "-"]
            )
    print_table(["member", "kind", "version", "mode"], rows)
