"""The instance before any schema: JSON bytes decoded (msgspec, noting a float with a
zero fraction), the input rules (nesting depth, safe integers) checked from the bytes
where that is enough, duplicate member names found, and a decoded value checked to be
JSON (no NaN, no infinity, string keys only).
"""

from __future__ import annotations

import json
import math
import threading
from typing import Any

import msgspec

from ledger.intake import MAX_DEPTH, MAX_SAFE_INTEGER

from .deviations import _deviation, _Found, json_type

_BYTES_TYPES = (bytes, bytearray, memoryview)


# Bytes that could break the input rules msgspec does not enforce (nesting deeper than
# MAX_DEPTH, integers beyond ±(2^53 - 1)) hold many brackets or a long run of digits (or
# an integral float beyond the safe range, which the float hook notes). All are found at C
# speed, so typical inputs skip the walk over the decoded value that names the place.
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGITS = b"0" * 16


def _may_break_rules(data: bytes, instance: Any) -> bool:
    if _seen.unsafe_float or data.translate(_DIGITS_TO_ZERO).find(_LONG_DIGITS) != -1:
        return True
    deep = _nests_too_deep(data)
    return _too_deep(instance) if deep is None else deep


_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')


def _nests_too_deep(data: bytes) -> bool | None:
    """Whether the containers of ``data`` (JSON text msgspec accepted, so well formed)
    nest deeper than MAX_DEPTH, from the bytes alone; None when a string holds brackets.

    Everything but brackets and quotes is dropped: fewer than MAX_DEPTH + 1 opening
    brackets cannot nest that deep. Otherwise escaped backslashes and quotes are removed
    first, so every quote left delimits a string, and then the strings without brackets
    (``""``): if a quote is left, some string held a bracket (pairing adjacent quotes
    from the left leaves the opening quote of the first such string unpaired). Each pass
    of ``replace("[]", "")`` then removes exactly the innermost level of pairs."""
    skeleton = data.translate(_SQUARE, _NOT_STRUCTURE)
    if skeleton.count(b"[") <= MAX_DEPTH:
        return False
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
        skeleton = data.translate(_SQUARE, _NOT_STRUCTURE)
    skeleton = skeleton.replace(b'""', b"")
    if b'"' in skeleton:
        return None
    for _ in range(MAX_DEPTH):
        if not skeleton:
            return False
        skeleton = skeleton.replace(b"[]", b"")
    return bool(skeleton)


def _too_deep(instance: Any) -> bool:
    """Whether containers nest deeper than MAX_DEPTH: level by level, containers only
    (no pointers built; the full walk that names the place runs only when it is)."""
    level = [instance] if type(instance) in (dict, list) else []
    for _ in range(MAX_DEPTH):
        if not level:
            return False
        level = [
            v
            for node in level
            for v in (node.values() if type(node) is dict else node)
            if type(v) is dict or type(v) is list
        ]
    return bool(level)


# Decoding notes whether a float with a zero fraction (1.0, 1e2) occurs: only then can
# the integer-token rule change a verdict. msgspec calls the hook for float literals
# only (integer tokens decode to int without it).
_seen = threading.local()


def _float_hook(text: str) -> float:
    value = float(text)
    if value.is_integer():
        _seen.integral_float = True
        # 1e17 is an integer to RFC 8785 (it writes it 100000000000000000), so beyond
        # ±(2^53 - 1) it breaks the input rules like the digits it stands for.
        if MAX_SAFE_INTEGER < abs(value) < 1e21:
            _seen.unsafe_float = True
    elif value != value or value in (math.inf, -math.inf):
        raise ValueError("Number out of range")  # as msgspec says without a hook
    return value


_decoder = msgspec.json.Decoder(float_hook=_float_hook)


def _ensure_json(value: Any) -> bool:
    """A decoded instance must be JSON: jsonschema-rs would turn NaN into null silently.
    Returns whether it holds a float with a zero fraction."""
    integral_float = False
    stack = [value]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is dict:
            for key, item in node.items():
                if type(key) is not str:
                    raise TypeError(f"object key {key!r} is not a string")
                stack.append(item)
        elif kind is list or kind is tuple:
            stack.extend(node)
        elif kind is float:
            if node != node or node in (math.inf, -math.inf):
                raise ValueError(f"{node!r} has no JSON representation")
            integral_float = integral_float or node.is_integer()
        elif not (node is None or kind is str or kind is int or kind is bool):
            raise TypeError(f"{kind.__name__} is not a JSON type")
    return integral_float


class _Duplicate(Exception):
    pass


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> None:
    if len(pairs) > 1 and len({key for key, _ in pairs}) != len(pairs):
        raise _Duplicate
    return None  # values are not needed, only the verdict


def _duplicate_members(data: bytes, instance: Any) -> list[_Found]:
    # msgspec, like most parsers, keeps the last of duplicate names. Fast path: bytes
    # that re-encode identically, up to whitespace, cannot have held a duplicate (it
    # would be missing). msgspec's formatter keeps every member and token as written.
    encoded = msgspec.json.encode(instance)
    if encoded == data or encoded == msgspec.json.format(data, indent=-1):
        return []
    try:
        json.loads(data, object_pairs_hook=_reject_duplicates)
    except _Duplicate:
        pass
    else:
        return []
    # Rare: parse again keeping track of which objects had which duplicates.
    duplicates: list[tuple[dict[str, Any], str, Any]] = []

    def keep(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for key, value in pairs:
            if key in obj:
                duplicates.append((obj, key, value))
            obj[key] = value
        return obj

    tree = json.loads(data, object_pairs_hook=keep)
    where: dict[int, list[Any]] = {}
    stack: list[tuple[Any, list[Any]]] = [(tree, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            where[id(node)] = path
            stack.extend((v, [*path, k]) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, [*path, i]) for i, v in enumerate(node))
    return [
        _Found(
            _deviation(
                [*where[id(obj)], key],
                "extra_field",
                "no duplicate member name",
                json_type(value),
                [],
            )
        )
        for obj, key, value in duplicates
    ]
