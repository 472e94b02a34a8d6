"""Reading structured input given on the command line: ``JSON``, ``@file`` or a file path
(JSON, YAML or TOML by extension). Every mistake is a one-line ``CommandRefused``."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from .plane import CommandRefused


def json_or_file(value: str, what: str) -> Any:
    """``'{"a": 1}'`` or ``@path/to/file.json``."""
    if value.startswith("@"):
        return load_file(value[1:], what)
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise CommandRefused(f"{what}: not valid JSON ({exc.msg} at line {exc.lineno} "
                             f"column {exc.colno})") from None


def raw_bytes(value: str, what: str) -> bytes:
    """The exact bytes given: the text itself, or the bytes of ``@file`` (for the gates,
    which check what the agent produced, byte for byte)."""
    if not value.startswith("@"):
        return value.encode("utf-8")
    try:
        return Path(value[1:]).read_bytes()
    except OSError as exc:
        raise CommandRefused(f"{what}: cannot read {value[1:]} ({exc.strerror})") from None


def text_or_file(value: str, what: str) -> str:
    """``TEXT`` or ``@file``."""
    if value.startswith("@"):
        return _read(value[1:], what)
    return value


def load_file(path: str, what: str) -> Any:
    """A JSON, YAML (.yaml/.yml) or TOML (.toml) document."""
    text = _read(path, what)
    suffix = Path(path).suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            import yaml

            return yaml.safe_load(text)
        if suffix == ".toml":
            return tomllib.loads(text)
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandRefused(f"{what}: {path} is not valid JSON ({exc.msg} at line "
                             f"{exc.lineno} column {exc.colno})") from None
    except tomllib.TOMLDecodeError as exc:
        raise CommandRefused(f"{what}: {path} is not valid TOML ({exc})") from None
    except Exception as exc:  # yaml.YAMLError and friends
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CommandRefused(f"{what}: {path} is not valid YAML ({first})") from None


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CommandRefused(f"{what}: no such file {path}") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise CommandRefused(f"{what}: cannot read {path} ({exc.__class__.__name__})") from None
