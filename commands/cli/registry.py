"""``evidence tool|validation register|list|show`` and ``evidence skill define|list|show``.

Registration files are JSON, YAML (.yaml/.yml) or TOML (.toml), parsed strictly; every
refusal is one ``error: FILE: ...`` line, exit 2, nothing appended.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import click

from commands.plane.core import CommandRefused
from commands.plane.registry import (
    Registered,
    define_skill,
    get_skill,
    get_tool,
    get_validation,
    list_skills,
    list_tools,
    list_validations,
    parse_skill_spec,
    parse_tool_spec,
    parse_validation_spec,
    register_tool,
    register_validation,
)
from ledger import LedgerError
from projections.documents import Document, to_json

from .common import db_option, emit_json, json_option, open_plane, print_table
from .inputs import load_file, whole
from .terminal import inert

VERSION_HELP = "Show this version instead of the latest."


@contextmanager
def _about(path: str) -> Iterator[None]:
    """Name the file in every refusal, so the one error line says where to look."""
    try:
        yield
    except LedgerError as exc:
        raise CommandRefused(f"{path}: {exc}") from exc


def _load(path: str, what: str) -> Mapping[str, Any]:
    """The file's document; ``load_file``'s refusals already name the file."""
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
        return f"command {shlex.join(spec['command'])}"
    if spec.get("mcp_server"):
        how = f"mcp {spec['mcp_server']}/{spec.get('mcp_tool_name')}"
        if spec.get("mcp_command"):
            return f"{how} via {shlex.join(spec['mcp_command'])}"
        return f"{how} at {spec['mcp_url']}" if spec.get("mcp_url") else how
    return "-"


def _compact(value: Any) -> str:
    if value is None or value in ({}, []):
        return "-"
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _seconds(millis: int | None) -> str:
    return "-" if millis is None else f"{millis / 1000:g}s"


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
    """Tools: register, list, show. Validations are tools too (one namespace)."""


@tool.command("register")
@click.argument("file")
@db_option
@json_option
def tool_register(file: str, as_json: bool) -> None:
    """Register the tool in FILE (JSON, YAML or TOML); a change is a new version."""
    raw = _load(file, "tool")
    with _about(file):
        spec = parse_tool_spec(raw)
    plane = open_plane(create=True)
    with _about(file):
        result = register_tool(plane, spec)
    _report(result, as_json)


@tool.command("list")
@click.option(
    "--kind",
    type=click.Choice(["tool", "validation"]),
    help="Only tools or only validations (default: both).",
)
@db_option
@json_option
def tool_list(kind: str | None, as_json: bool) -> None:
    """List every tool and validation, latest versions."""
    views = list_tools(open_plane(), kind=kind)  # type: ignore[arg-type]
    if as_json:
        emit_json({"tools": views})
        return
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
    """Show a tool (or validation): its definition and schema digests."""
    view = get_tool(open_plane(), name, version=version)
    if as_json:
        emit_json({"tool": view})
        return
    print_table(["field", "value"], _show_rows(view))


# -- evidence validation ---------------------------------------------------------------


@click.group()
def validation() -> None:
    """Validations: read-only tools that return {passed, message?, data?}."""


@validation.command("register")
@click.argument("file")
@db_option
@json_option
def validation_register(file: str, as_json: bool) -> None:
    """Register the validation in FILE (JSON, YAML or TOML); a change is a new version."""
    raw = _load(file, "validation")
    with _about(file):
        spec = parse_validation_spec(raw)
    plane = open_plane(create=True)
    with _about(file):
        result = register_validation(plane, spec)
    _report(result, as_json)


@validation.command("list")
@db_option
@json_option
def validation_list(as_json: bool) -> None:
    """List validations with their mode and executor."""
    views = list_validations(open_plane())
    if as_json:
        emit_json({"validations": views})
        return
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
    """Show a validation: mode, executor, transform, inherited fields."""
    view = get_validation(open_plane(), name, version=version)
    if as_json:
        emit_json({"validation": view})
        return
    print_table(["field", "value"], _show_rows(view))


# -- evidence skill --------------------------------------------------------------------


@click.group()
def skill() -> None:
    """Skills: named bundles of tools and validations (membership makes them callable;
    only an attachment makes a validation a gate)."""


@skill.command("define")
@click.argument("file")
@db_option
@json_option
def skill_define(file: str, as_json: bool) -> None:
    """Define the skill in FILE (JSON, YAML or TOML); a change is a new version."""
    raw = _load(file, "skill")
    with _about(file):
        spec = parse_skill_spec(raw)
    plane = open_plane(create=True)
    with _about(file):
        result = define_skill(plane, spec)
    _report(result, as_json)


@skill.command("list")
@db_option
@json_option
def skill_list(as_json: bool) -> None:
    """List skills."""
    skills = list_skills(open_plane())
    if as_json:
        emit_json({"skills": [to_json(s) for s in skills]})
        return
    print_table(
        ["name", "version", "members", "description"],
        [[s.name, str(s.version), " ".join(s.members), s.description or "-"] for s in skills],
    )


@skill.command("show")
@click.argument("name")
@db_option
@json_option
def skill_show(name: str, as_json: bool) -> None:
    """Show a skill and its members (kind, latest version, mode)."""
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
