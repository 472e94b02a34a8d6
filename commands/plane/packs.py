"""Tool packs: the built-in tools of an agent CLI, registered in one command
(``evidence tool pack NAME``), so that a hook with the matcher ``"*"`` gates them as it
gates any registered tool instead of refusing each as invented.

The agent CLI runs these tools itself: the plane only judges their input (PreToolUse)
and records their calls (PostToolUse), so a pack's tools have no command, no MCP server
and no output schema. Each input schema names the arguments the CLI's tool takes, with
their types and which are required; an argument a later release of the CLI adds is not
checked by the pack (its objects stay open) until the pack's next version lists it —
a stricter schema would make every call of that release a deviation.

A pack is versioned (``PACKS[name]["version"]``); registering a newer version appends
the tools whose schemas changed, as re-registering a tool file does.
"""

from __future__ import annotations

from typing import Any

from .core import CommandRefused, Plane
from .tool_import import Imported, register_reviewed

_STR: dict[str, Any] = {"type": "string"}
_INT: dict[str, Any] = {"type": "integer", "minimum": 0}
_BOOL: dict[str, Any] = {"type": "boolean"}
_PATH: dict[str, Any] = {"type": "string", "minLength": 1}


def _object(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": sorted(required),
    }


_EDIT = _object({"old_string": _STR, "new_string": _STR}, {"replace_all": _BOOL})
_TODO = _object(
    {
        "content": {"type": "string", "minLength": 1},
        "status": {"enum": ["pending", "in_progress", "completed"]},
    },
    {"activeForm": _STR},
)

# Claude Code's built-in tools, by the names its hooks give as ``tool_name``.
CLAUDE_CODE: dict[str, tuple[str, dict[str, Any]]] = {
    "Bash": (
        "Run a shell command (Claude Code's own tool).",
        _object(
            {"command": {"type": "string", "minLength": 1}},
            {
                "description": _STR,
                "timeout": {"type": "number", "minimum": 0, "maximum": 600000},
                "run_in_background": _BOOL,
                "dangerouslyDisableSandbox": _BOOL,
            },
        ),
    ),
    "BashOutput": (
        "Read a background shell's output.",
        _object({"bash_id": _STR}, {"filter": _STR}),
    ),
    "KillShell": ("End a background shell.", _object({"shell_id": _STR})),
    "Glob": ("Find files by pattern.", _object({"pattern": _STR}, {"path": _STR})),
    "Grep": (
        "Search file contents (ripgrep).",
        _object(
            {"pattern": _STR},
            {
                "path": _STR,
                "glob": _STR,
                "type": _STR,
                "output_mode": {"enum": ["content", "files_with_matches", "count"]},
                "-A": _INT,
                "-B": _INT,
                "-C": _INT,
                "-n": _BOOL,
                "-i": _BOOL,
                "head_limit": _INT,
                "offset": _INT,
                "multiline": _BOOL,
            },
        ),
    ),
    "Read": ("Read a file.", _object({"file_path": _PATH}, {"offset": _INT, "limit": _INT})),
    "Write": ("Write a file whole.", _object({"file_path": _PATH, "content": _STR})),
    "Edit": (
        "Replace exact text in a file.",
        _object(
            {"file_path": _PATH, "old_string": _STR, "new_string": _STR}, {"replace_all": _BOOL}
        ),
    ),
    "MultiEdit": (
        "Several exact replacements in one file.",
        _object({"file_path": _PATH, "edits": {"type": "array", "minItems": 1, "items": _EDIT}}),
    ),
    "NotebookEdit": (
        "Edit a Jupyter notebook cell.",
        _object(
            {"notebook_path": _PATH, "new_source": _STR},
            {
                "cell_id": _STR,
                "cell_type": {"enum": ["code", "markdown"]},
                "edit_mode": {"enum": ["replace", "insert", "delete"]},
            },
        ),
    ),
    "WebFetch": (
        "Fetch a URL and read it with a prompt.",
        _object({"url": {"type": "string", "minLength": 1}, "prompt": _STR}),
    ),
    "WebSearch": (
        "Search the web.",
        _object(
            {"query": {"type": "string", "minLength": 2}},
            {
                "allowed_domains": {"type": "array", "items": _STR},
                "blocked_domains": {"type": "array", "items": _STR},
            },
        ),
    ),
    "TodoWrite": (
        "Write the session's task list.",
        _object({"todos": {"type": "array", "items": _TODO}}),
    ),
    "Task": (
        "Start a sub-agent on a task.",
        _object(
            {"description": _STR, "prompt": _STR, "subagent_type": _STR},
            {"model": _STR, "resume": _STR},
        ),
    ),
    "ExitPlanMode": ("Leave plan mode with a plan.", _object({"plan": _STR})),
    "SlashCommand": ("Run a slash command.", _object({"command": _STR})),
    "Skill": ("Use a skill.", _object({"command": _STR})),
}

PACKS: dict[str, dict[str, Any]] = {
    "claude-code": {
        "version": "2",
        "agent": "Claude Code 2.x (its built-in tools, as its hooks name them)",
        "tools": CLAUDE_CODE,
    },
}


def register_pack(plane: Plane, name: str, *, dry_run: bool = False) -> list[Imported]:
    """Register (or review, with ``dry_run``) every tool of the pack ``name``."""
    pack = PACKS.get(name)
    if pack is None:
        raise CommandRefused(f"no tool pack {name!r}: the packs are {', '.join(sorted(PACKS))}")
    done = []
    for tool, (description, schema) in pack["tools"].items():
        spec = {
            "name": tool,
            "description": f"{description} [pack {name} v{pack['version']}]",
            "input_schema": schema,
        }
        done.append(register_reviewed(plane, spec, dry_run))
    return done
