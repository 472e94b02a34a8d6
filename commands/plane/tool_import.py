"""``evidence tool import``: an MCP server's tools registered from its own declaration.

The server is asked (``tools/list``) and each tool it declares is registered as the
operator registers a tool file — signed by the operator's key — named ``SERVER.TOOL``,
with ``mcp_server``, ``mcp_tool_name``, how the plane reaches the server (``mcp_command``
or ``mcp_url``) and the schemas exactly as declared: the gate's check before each call
(the server's declaration must be the registered one, else ``schema_drift``) then
passes, where a hand-made copy with another spelling fails it.

Run again, it is a review: each tool is ``added``, ``changed`` (naming the fields that
differ), ``unchanged`` or ``refused`` (the registry's reason), and a tool registered
for the server that it no longer lists is ``gone`` — its registration stays, nothing in
the registry is deleted. ``dry_run`` says all of it and registers nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ledger import LedgerError
from projections.documents import delta

from .core import CommandRefused, Plane
from .proxy import server_name
from .registry import get_tool, list_tools, register_tool

Action = Literal["added", "changed", "unchanged", "refused", "gone"]
_COMPARED = ("description", "input_schema", "output_schema", "mcp_command", "mcp_url")


@dataclass
class Imported:
    """One tool of the review: what importing did (or would do) with it."""

    name: str
    mcp_tool_name: str
    action: Action
    changed: list[str] = field(default_factory=list)
    version: int | None = None
    why: str = ""
    # the review: an RFC 6902 patch from the registered to the declared, per field changed
    patch: dict[str, list[Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "mcp_tool_name": self.mcp_tool_name,
            "action": self.action,
            "changed": self.changed,
            "version": self.version,
            "why": self.why,
            "patch": self.patch,
        }


def check_server(server: str) -> None:
    """Refused unless ``server`` can be part of the registered names (asked before a
    server is started to list its tools)."""
    if server_name(server) != server:
        raise CommandRefused(
            f"--mcp {server!r}: letters, digits, '.', '_' and '-' only, at most 64, not at "
            "the ends (it becomes part of the registered names)"
        )


def import_tools(
    plane: Plane,
    server: str,
    tools: Sequence[Any],
    *,
    command: Sequence[str] | None = None,
    url: str | None = None,
    dry_run: bool = False,
) -> list[Imported]:
    """Register (or, with ``dry_run``, review) every tool of ``tools`` (``ListedTool``:
    what the server declared) as a tool of the MCP server ``server``, reached by
    ``command`` or at ``url``."""
    check_server(server)
    how: dict[str, Any] = {"mcp_command": list(command)} if command else {"mcp_url": url}
    done: list[Imported] = []
    for tool in tools:
        name = f"{server}.{server_name(tool.name)}"[:128]
        spec = {
            "name": name,
            "description": tool.description,
            "mcp_server": server,
            "mcp_tool_name": tool.name,
            **how,
            "input_schema": tool.input_schema,
            **({"output_schema": tool.output_schema} if tool.output_schema is not None else {}),
        }
        done.append(register_reviewed(plane, spec, dry_run))
    listed = {t.name for t in tools}
    for view in list_tools(plane, kind="tool"):
        found = view["spec"]
        if found.get("mcp_server") == server and found.get("mcp_tool_name") not in listed:
            done.append(
                Imported(view["name"], found.get("mcp_tool_name") or "", "gone",
                         version=view["version"],
                         why="the server no longer lists it; its registration stays")
            )  # fmt: skip
    return done


def register_reviewed(plane: Plane, spec: dict[str, Any], dry_run: bool) -> Imported:
    """Register the tool ``spec`` unless the registry holds it already, saying which
    (``added``, ``changed`` and how, ``unchanged``, ``refused``); ``dry_run`` registers
    nothing."""
    name, tool_name = spec["name"], spec.get("mcp_tool_name", "")
    try:
        before = get_tool(plane, name)
    except CommandRefused:
        before = None
    old = before["spec"] if before is not None else None
    if old is not None and _other_tool(old, spec):
        how = _executor_of(old)
        why = f"{name} is registered already as another tool ({how}); it is left as it is"
        return Imported(name, tool_name, "refused", why=why)
    changed = [f for f in _COMPARED if old is not None and _differ(_stored(old, f), spec.get(f))]
    if old is not None and not changed:
        return Imported(name, tool_name, "unchanged", version=before["version"] if before else None)
    patch = {f: _patch(_stored(old, f), spec.get(f)) for f in changed} if old else {}
    if dry_run:
        return Imported(name, tool_name, "changed" if old else "added", changed, patch=patch)
    try:
        result = register_tool(plane, spec)
    except LedgerError as exc:
        return Imported(name, tool_name, "refused", why=str(exc))
    action: Action = "changed" if old is not None else "added"
    return Imported(name, tool_name, action if result.changed else "unchanged", changed,
                    version=result.version, patch=patch)  # fmt: skip


def _differ(old: Any, new: Any) -> bool:
    return (old or None) != (new or None)  # an empty description is none


def _stored(spec: dict[str, Any], name: str) -> Any:
    """A field of a registered tool's view as it was given (a schema as declared)."""
    declared = spec.get(f"declared_{name}")
    return declared if declared is not None else spec.get(name)


def _executor_of(spec: dict[str, Any]) -> str:
    if spec.get("mcp_server"):
        return f"MCP server {spec['mcp_server']}'s {spec.get('mcp_tool_name')!r}"
    for key in ("command", "python", "wraps"):
        if spec.get(key):
            return f"with a {key}"
    return "recorded only"


def _other_tool(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """The registered tool is another than the one to register: another server's or
    tool's, or one the plane runs itself where the new one is only gated."""
    return _executor_of(old) != _executor_of(new)


def _patch(old: Any, new: Any) -> list[Any]:
    """The RFC 6902 operations that make the registered value the declared one (a whole
    value replaced where either is not an object)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return delta(old, new)
    return [{"op": "replace", "path": "", "value": new}]
