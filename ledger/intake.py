"""Untrusted input, read one way: bounded, strict, and refused by name.

Every byte that enters the ledger or the plane from outside — a command-line option, an
``@file``, a registry or plan file, a tool's or validation's output, a bundle, a kept
checkpoint — is read and parsed here, so one set of rules holds everywhere:

- **size**: each kind of input has a byte cap (``LIMITS``). A file is read through the
  cap, never whole, so ``/dev/zero`` is refused after ``cap + 1`` bytes. A user who needs
  more sets ``EVIDENCE_MAX_<KIND>_BYTES`` (``EVIDENCE_MAX_BUNDLE_BYTES=...``).
- **UTF-8** only, strictly (no replacement characters invented on the way in).
- **depth**: arrays and objects nest at most ``MAX_DEPTH`` deep.
- **numbers**: finite only (no NaN, no Infinity, no ``1e400`` overflowing to one);
  integers within ±(2^53 - 1), the range every JSON reader represents exactly.
- **duplicate keys** are refused (JSON, YAML and TOML): ``{"mode": "required", "mode":
  "informational"}`` has no single meaning, and "the last one wins" would let a reader
  and a writer disagree about what was registered.
- **YAML**: no anchors or aliases (the billion-laughs bomb is an alias tree), no tags
  beyond the JSON types (no timestamps, no ``!!binary``, no ``!!set``); the document must
  be a JSON value.

A refusal is an ``InputError`` naming the source (a file or an option), the RFC 6901
pointer where the rule broke (empty for the whole input), and the rule.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .errors import LedgerError

__all__ = [
    "LIMITS",
    "MAX_DEPTH",
    "MAX_SAFE_INTEGER",
    "InputError",
    "Limit",
    "check_json_value",
    "decode_utf8",
    "limit_bytes",
    "load_document",
    "parse_json",
    "parse_toml",
    "parse_yaml",
    "read_bytes",
    "read_stream",
    "read_text",
]

MAX_SAFE_INTEGER = 2**53 - 1
MAX_DEPTH = 64

_KIB = 1024
_MIB = 1024 * _KIB


@dataclass(frozen=True)
class Limit:
    """The byte cap of one kind of input."""

    kind: str
    default: int
    what: str

    @property
    def env(self) -> str:
        return f"EVIDENCE_MAX_{self.kind.upper()}_BYTES"

    @property
    def cap(self) -> int:
        """The cap in force: the environment's override, else the default."""
        raw = os.environ.get(self.env)
        if raw is None or not raw.strip():
            return self.default
        try:
            value = int(raw)
        except ValueError:
            raise InputError(
                self.env, "", "size", f"{raw!r} is not a whole number of bytes"
            ) from None
        if not 1 <= value <= MAX_SAFE_INTEGER:
            raise InputError(self.env, "", "size", "must be between 1 and 2^53 - 1 bytes")
        return value


# docs/cli.md "Limits" lists these; keep the two in step.
LIMITS: dict[str, Limit] = {
    limit.kind: limit
    for limit in (
        Limit("option", 1 * _MIB, "an option's value or its @file (JSON, text, schema)"),
        Limit("document", 1 * _MIB, "a registry, skill or plan file"),
        Limit(
            "agent",
            16 * _MIB,
            "bytes an agent produced, checked by a gate "
            "(--params, --output, --record-output, --diff)",
        ),
        Limit(
            "output",
            4 * _MIB,
            "a tool's or validation's captured stdout and stderr, each "
            "(a tool or validation sets its own `max_output_bytes`)",
        ),
        Limit("token", 64 * _KIB, "an apply token"),
        Limit("checkpoint", 64 * _KIB, "a kept checkpoint (signed note)"),
        Limit("bundle", 1024 * _MIB, "an offline bundle"),
    )
}


class InputError(LedgerError):
    """Input refused: where (source and pointer), which rule, and why."""

    def __init__(self, source: str, pointer: str, rule: str, detail: str) -> None:
        self.source, self.pointer, self.rule, self.detail = source, pointer, rule, detail
        shown = pointer if len(pointer) <= 80 else pointer[:77] + "..."
        where = f" at {shown}" if pointer else ""
        super().__init__(f"{source}{where}: {detail}")


def env_seconds(name: str, default: float, *, zero: bool = False) -> float:
    """The seconds the environment variable ``name`` sets (more than 0, or 0 too where
    ``zero``; at most an hour), else ``default``; refused (``LedgerError``) otherwise."""
    given = os.environ.get(name, "").strip()
    try:
        seconds = float(given) if given else default
    except ValueError:
        seconds = math.nan
    if not ((seconds >= 0 if zero else seconds > 0) and seconds <= 3600):
        low = "0" if zero else "more than 0"
        raise LedgerError(f"{name} must be a number of seconds from {low} to 3600")
    return seconds


# -- bytes ------------------------------------------------------------------------------


def limit_bytes(data: bytes, kind: str, source: str) -> bytes:
    """``data`` itself when it is within the cap of ``kind``."""
    cap = LIMITS[kind].cap
    if len(data) > cap:
        raise InputError(source, "", "size", _too_large(kind, cap, f"{len(data)} bytes given"))
    return data


def read_bytes(path: str | os.PathLike[str], kind: str, source: str | None = None) -> bytes:
    """The bytes of a file, read through the cap of ``kind``: at most ``cap + 1`` bytes
    are ever read (a device or a pipe that never ends is refused at the cap)."""
    name = source or str(path)
    cap = LIMITS[kind].cap
    try:
        with open(path, "rb") as f:  # a directory raises IsADirectoryError here
            data = _read_upto(f, cap + 1)
    except FileNotFoundError:
        raise InputError(name, "", "read", "cannot read (no such file)") from None
    except IsADirectoryError:
        raise InputError(name, "", "read", "is a directory, not a file") from None
    except OSError as exc:
        raise InputError(name, "", "read", f"cannot read ({exc.strerror or exc})") from None
    if len(data) > cap:
        raise InputError(name, "", "size", _too_large(kind, cap, f"read past {cap} bytes"))
    return data


def read_stream(stream: _Readable, kind: str, source: str) -> bytes:
    """The bytes of an open stream (stdin), read through the cap of ``kind``: at most
    ``cap + 1`` bytes are ever read, so a stream that never ends is refused at the cap."""
    cap = LIMITS[kind].cap
    try:
        data = _read_upto(stream, cap + 1)
    except OSError as exc:
        raise InputError(source, "", "read", f"cannot read ({exc.strerror or exc})") from None
    if len(data) > cap:
        raise InputError(source, "", "size", _too_large(kind, cap, f"read past {cap} bytes"))
    return data


class _Readable(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


def _read_upto(f: _Readable, n: int) -> bytes:
    chunks: list[bytes] = []
    left = n
    while left > 0:
        chunk = f.read(min(left, _MIB))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _too_large(kind: str, cap: int, size: str) -> str:
    return (
        f"larger than the {_size_text(cap)} cap on {LIMITS[kind].what} ({size}; set "
        f"{LIMITS[kind].env} to raise it)"
    )


def _size_text(n: int) -> str:
    for unit, size in (("GiB", 1024 * _MIB), ("MiB", _MIB), ("KiB", _KIB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def decode_utf8(data: bytes, source: str) -> str:
    """Strict UTF-8, or an error naming the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            source, "", "utf8", f"not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None


def _text(data: bytes | str, kind: str | None, source: str) -> str:
    """Text within the cap of ``kind`` (``None``: the caller bounded it already); a
    ``str`` holding a lone surrogate is not UTF-8."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    return decode_utf8(data if kind is None else limit_bytes(data, kind, source), source)


def read_text(path: str | os.PathLike[str], kind: str, source: str | None = None) -> str:
    """A file's text: capped, strict UTF-8."""
    name = source or str(path)
    return decode_utf8(read_bytes(path, kind, name), name)


# -- values -----------------------------------------------------------------------------


def _pointer(path: list[str | int]) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def check_json_value(value: Any, source: str) -> Any:
    """``value`` itself when it is a JSON value within the rules (depth, finite numbers,
    safe integers, string keys); an ``InputError`` at the first node that is not."""
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:
        node, path = stack.pop()
        kind = type(node)
        if kind is dict or kind is list:
            if len(path) >= MAX_DEPTH:
                raise InputError(
                    source, _pointer(path), "depth", f"nested deeper than {MAX_DEPTH} levels"
                )
            if kind is dict:
                for key, item in node.items():
                    if type(key) is not str:
                        raise InputError(
                            source, _pointer(path), "type", f"key {key!r} is not a string"
                        )
                    stack.append((item, [*path, key]))
            else:
                stack.extend((item, [*path, i]) for i, item in enumerate(node))
        elif kind is float:
            if not math.isfinite(node):
                raise InputError(
                    source, _pointer(path), "finite", f"{node!r} is not a finite number"
                )
            # RFC 8785 writes 1e20 as 100000000000000000000: it would be stored, and read
            # back, as an integer beyond the safe range.
            if MAX_SAFE_INTEGER < abs(node) < 1e21 and node.is_integer():
                raise InputError(
                    source,
                    _pointer(path),
                    "integer_range",
                    f"{node!r} is an integer outside ±(2^53 - 1)",
                )
        elif kind is int:
            if not -MAX_SAFE_INTEGER <= node <= MAX_SAFE_INTEGER:
                raise InputError(
                    source, _pointer(path), "integer_range", "integer outside ±(2^53 - 1)"
                )
        elif kind is str:
            if not node.isascii():
                try:
                    node.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise InputError(
                        source,
                        _pointer(path),
                        "utf8",
                        f"a lone surrogate at character {exc.start} is not Unicode text",
                    ) from None
        elif not (node is None or kind is bool):
            raise InputError(
                source, _pointer(path), "type", f"a {kind.__name__} is not a JSON value"
            )
    return value


def _depth_error(source: str) -> InputError:
    return InputError(source, "", "depth", f"nested deeper than {MAX_DEPTH} levels")


def parse_json(data: bytes | str, source: str, kind: str | None = "option") -> Any:
    """Exactly one strict JSON document (whitespace around it allowed), within the cap of
    ``kind`` (``None``: already bounded by the caller, as a tool's capped output is)."""
    text = _text(data, kind, source)

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, item in pairs:
            if key in result:
                raise _Duplicate(key)
            result[key] = item
        return result

    try:
        value = json.loads(
            text,
            object_pairs_hook=unique,
            parse_constant=_no_constant,
            parse_float=_finite_float,
            parse_int=_safe_int,
        )
    except _Duplicate as exc:
        raise InputError(
            source, _duplicate_pointer(text, exc.key), "duplicate_key", f"duplicate key {exc.key!r}"
        ) from None
    except _BadNumber as exc:
        raise InputError(source, "", exc.rule, exc.detail) from None
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":
            detail = "more than one JSON document (or text after it)"
        else:
            detail = f"not valid JSON ({exc.msg})"
        raise InputError(
            source, "", "syntax", f"{detail} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:  # the parser gave up long after MAX_DEPTH
        raise _depth_error(source) from None
    return check_json_value(value, source)


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


class _BadNumber(Exception):
    def __init__(self, rule: str, detail: str) -> None:
        self.rule, self.detail = rule, detail


def _no_constant(name: str) -> Any:
    raise _BadNumber("finite", f"{name} is not a JSON number")


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise _BadNumber("finite", f"number {token[:40]} is out of range (beyond a double)")
    return value


def _safe_int(token: str) -> int:
    # Python refuses to convert integers longer than 4300 digits; stop well before.
    if len(token.lstrip("-")) > 16:
        raise _BadNumber("integer_range", f"integer {token[:40]}… outside ±(2^53 - 1)")
    value = int(token)
    if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        raise _BadNumber("integer_range", f"integer {token} outside ±(2^53 - 1)")
    return value


def _duplicate_pointer(text: str, key: str) -> str:
    """Where the first duplicated key is: parse again, keeping every pair, and find the
    first object holding ``key`` twice."""
    found: list[int] = []

    def pairs(items: list[tuple[str, Any]]) -> Any:
        keys = [k for k, _ in items]
        obj: dict[str, Any] = {}
        for k, v in items:
            obj[k] = v
        if not found and keys.count(key) > 1:
            found.append(id(obj))
        return obj

    tree = json.loads(text, object_pairs_hook=pairs)
    stack: list[tuple[Any, list[str | int]]] = [(tree, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            if found and id(node) == found[0]:
                return _pointer([*path, key])
            stack.extend((v, [*path, k]) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, [*path, i]) for i, v in enumerate(node))
    return ""


# -- YAML -------------------------------------------------------------------------------


def parse_yaml(data: bytes | str, source: str, kind: str = "document") -> Any:
    """One YAML document that is a JSON value: no anchors, aliases or non-JSON tags, no
    duplicate keys, within the depth and number rules."""
    import yaml

    text = _text(data, kind, source)
    loader = None
    try:
        loader = _StrictYamlLoader(text)  # its reader refuses some characters at once
        value = loader.get_single_data()
    except _YamlRefused as exc:
        raise InputError(source, exc.pointer, exc.rule, exc.detail) from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise InputError(source, "", "syntax", f"not valid YAML ({first}){where}") from None
    except RecursionError:
        raise _depth_error(source) from None
    finally:
        if loader is not None:
            loader.dispose()
    return check_json_value(value, source)


class _YamlRefused(Exception):
    def __init__(self, rule: str, detail: str, pointer: str = "") -> None:
        self.rule, self.detail, self.pointer = rule, detail, pointer


class _Mark(Protocol):
    line: int  # 0-based


def _line(mark: _Mark | None) -> int | str:
    """A YAML mark's 1-based line. Events from the parser always carry their marks; the
    YAML types allow None (an event made by hand), shown as "?"."""
    return "?" if mark is None else mark.line + 1


def _yaml_loader() -> type:
    import yaml

    # The JSON types only: null, bool, int, float, str, seq, map. Timestamps, binary,
    # sets, ordered maps and Python tags are not JSON and are refused by name.
    json_tags = {
        "tag:yaml.org,2002:null",
        "tag:yaml.org,2002:bool",
        "tag:yaml.org,2002:int",
        "tag:yaml.org,2002:float",
        "tag:yaml.org,2002:str",
        "tag:yaml.org,2002:seq",
        "tag:yaml.org,2002:map",
    }

    class Loader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent):
                raise _YamlRefused(
                    "yaml_alias",
                    f"YAML alias *{event.anchor} (line "
                    f"{_line(event.start_mark)}): anchors and aliases are "
                    "not allowed",
                )
            anchor = getattr(event, "anchor", None)
            if anchor is not None:
                mark = event.start_mark
                raise _YamlRefused(
                    "yaml_alias",
                    f"YAML anchor &{anchor} (line "
                    f"{mark.line + 1}): anchors and aliases are not allowed",
                )
            if isinstance(event, yaml.CollectionStartEvent):
                self.depth += 1
                if self.depth > MAX_DEPTH:
                    raise _YamlRefused(
                        "depth",
                        f"nested deeper than {MAX_DEPTH} levels (line {_line(event.start_mark)})",
                    )
            try:
                return super().compose_node(parent, index)
            finally:
                if isinstance(event, yaml.CollectionStartEvent):
                    self.depth -= 1

        def construct_object(self, node: Any, deep: bool = False) -> Any:
            if node.tag not in json_tags:
                raise _YamlRefused(
                    "type",
                    f"YAML tag {node.tag} (line {node.start_mark.line + 1}) is not a JSON type",
                )
            return super().construct_object(node, deep=deep)

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise _YamlRefused(
                        "yaml_alias",
                        f"YAML merge key << (line {key_node.start_mark.line + 1}) is not allowed",
                    )
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, str):
                    raise _YamlRefused(
                        "type", f"key {key!r} (line {key_node.start_mark.line + 1}) is not a string"
                    )
                if key in seen:
                    raise _YamlRefused(
                        "duplicate_key",
                        f"duplicate key {key!r} (line {key_node.start_mark.line + 1})",
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return Loader


_loader_class: type | None = None


def _StrictYamlLoader(text: str) -> Any:
    global _loader_class
    if _loader_class is None:
        _loader_class = _yaml_loader()
    return _loader_class(text)


# -- TOML -------------------------------------------------------------------------------


def parse_toml(data: bytes | str, source: str, kind: str = "document") -> Any:
    """One TOML document that is a JSON value (TOML refuses duplicate keys itself; its
    dates and times are not JSON and are refused)."""
    text = _text(data, kind, source)
    try:
        value = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(source, "", "syntax", f"not valid TOML ({exc})") from None
    except RecursionError:
        raise _depth_error(source) from None
    return check_json_value(value, source)


# -- files by extension -----------------------------------------------------------------

_PARSERS: dict[str, Callable[[bytes, str, str], Any]] = {
    ".yaml": parse_yaml,
    ".yml": parse_yaml,
    ".toml": parse_toml,
    ".json": parse_json,
}


def load_document(
    path: str | os.PathLike[str], kind: str = "document", source: str | None = None
) -> Any:
    """A JSON (the default), YAML (``.yaml``/``.yml``) or TOML (``.toml``) file."""
    name = source or str(path)
    parser = _PARSERS.get(Path(path).suffix.lower(), parse_json)
    return parser(read_bytes(path, kind, name), name, kind)
