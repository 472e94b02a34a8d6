"""Reading structured input given on the command line: ``JSON``, ``@file`` or a file path
(JSON, YAML or TOML by extension). Everything is read through ``ledger.intake`` (size,
depth, number, duplicate-key and UTF-8 rules); every mistake is a one-line refusal that
names the option or file, the pointer and the rule."""

from __future__ import annotations

import math
from typing import Any

import click

from ledger.intake import (
    MAX_SAFE_INTEGER,
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
    return decode_utf8(limit_bytes(value.encode("utf-8", "surrogateescape"), kind, what), what)


def load_file(path: str, what: str, kind: str = "document") -> Any:
    """A JSON, YAML (.yaml/.yml) or TOML (.toml) document."""
    return load_document(path, kind, f"{what} {path}")


# -- numbers on the command line ---------------------------------------------------------


def whole(min_value: int) -> click.IntRange:
    """A whole number from ``min_value`` up to 2^53 - 1: positions, counts, versions. A
    larger one names no event and would overflow the database's integers."""
    return click.IntRange(min=min_value, max=MAX_SAFE_INTEGER)


class Seconds(click.ParamType):
    """A finite number of seconds within ``[low, high]`` (NaN and infinity refused:
    click's FloatRange lets NaN through, and ``time.sleep(1e308)`` overflows)."""

    name = "seconds"

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = low, high

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(number) or not self.low <= number <= self.high:
            self.fail(
                f"{value!r} is not between {self.low:g} and {self.high:g} seconds", param, ctx
            )
        return number
