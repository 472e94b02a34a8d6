"""Reading structured input given on the command line: ``JSON``, ``@file`` or a file path
(JSON, YAML or TOML by extension). Everything is read through ``ledger.intake`` (size,
depth, number, duplicate-key and UTF-8 rules); every mistake is a one-line refusal that
names the option or file, the pointer and the rule."""

from __future__ import annotations

from typing import Any

from ledger.intake import (
    decode_utf8,
    limit_bytes,
    load_document,
    parse_json,
    read_bytes,
    read_text,
)


def json_or_file(value: str, what: str) -> Any:
    """``'{"a": 1}'`` or ``@path/to/file.json`` (or ``.yaml``/``.toml``)."""
    if value.startswith("@"):
        return load_file(value[1:], what, kind="option")
    return parse_json(value, what)


def raw_bytes(value: str, what: str) -> bytes:
    """The exact bytes given: the text itself, or the bytes of ``@file`` (for the gates,
    which check what the agent produced, byte for byte; they judge its JSON)."""
    if not value.startswith("@"):
        return limit_bytes(value.encode("utf-8", "surrogateescape"), "agent", what)
    return read_bytes(value[1:], "agent", f"{what} {value[1:]}")


def text_or_file(value: str, what: str, kind: str = "option") -> str:
    """``TEXT`` or ``@file``: UTF-8 text within the cap of ``kind``."""
    if value.startswith("@"):
        return read_text(value[1:], kind, f"{what} {value[1:]}")
    return decode_utf8(limit_bytes(value.encode("utf-8", "surrogateescape"), kind, what),
                       what)


def load_file(path: str, what: str, kind: str = "document") -> Any:
    """A JSON, YAML (.yaml/.yml) or TOML (.toml) document."""
    return load_document(path, kind, f"{what} {path}")
