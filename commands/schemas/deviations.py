"""What a check reports: the JSON type of a value, a found deviation, and the last step
of every check (``_finish``): the reports of ``unevaluatedProperties`` a reported
failure explains are dropped, a wrong-typed value is reported once, duplicates go, and
the deviations are sorted by pointer, kind and schema pointer.

Shared by both ways to the deviations (the slow path's translation of jsonschema-rs
errors, ``translate.py``; the fast path's walk, ``walk.py``) and by the instance checks
(``instances.py``), so all of them report alike.
"""

from __future__ import annotations

import operator
from typing import Any

import msgspec

from ledger.events.gates import Deviation, DeviationKind

from .prepare import json_pointer

__all__ = ["json_type"]

# By exact type: bool is an int subclass in Python, but not an integer in JSON.
_JSON_TYPE_OF: dict[type, str] = {
    type(None): "null",
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    dict: "object",
    list: "array",
    tuple: "array",
}


def json_type(value: Any) -> str:
    """The JSON type of a decoded value: object, array, string, integer, number (any
    float, including 1.0), boolean or null."""
    name = _JSON_TYPE_OF.get(type(value))
    if name is None:
        raise TypeError(f"{type(value).__name__} is not a JSON type")
    return name


class _Found(msgspec.Struct, frozen=True):
    deviation: Deviation
    # For unevaluatedProperties reports: the object's pointer, the pointer of the schema
    # that holds the keyword, and whether that schema declares the name in some part.
    unevaluated_in: tuple[str, str] | None = None
    declared: bool = False


def _not_json(expected: str, pointer: str = "") -> Deviation:
    return Deviation(
        pointer=pointer, kind="wrong_type", expected=expected, actual_type="invalid_json"
    )


def _deviation(
    path: list[Any] | tuple[Any, ...], kind: DeviationKind, expected: str, actual: str, spath: Any
) -> Deviation:
    return Deviation(
        pointer=json_pointer(path),
        kind=kind,
        expected=expected,
        actual_type=actual,
        schema_pointer=json_pointer(list(spath)),
    )


def _finish(found: list[_Found]) -> list[Deviation]:
    plain = [f.deviation for f in found if f.unevaluated_in is None]
    kept = plain
    if len(plain) < len(found):
        kept = plain + [
            f.deviation
            for f in found
            if f.unevaluated_in is not None
            # a declared property whose part failed: that failure is reported
            and not (f.declared and _explained(f.unevaluated_in, plain))
        ]
    # One report per wrong-typed value: drop the same schema's other verdicts on it.
    wrong = {(d.pointer, _parent(d.schema_pointer)) for d in kept if d.kind == "wrong_type"}
    result: dict[tuple[str, str, str], Deviation] = {}
    for d in kept:
        if wrong and d.kind in _VALUE_KINDS and (d.pointer, _parent(d.schema_pointer)) in wrong:
            continue
        result.setdefault((d.pointer, d.kind, d.expected), d)
    return sorted(result.values(), key=_ORDER)


_ORDER = operator.attrgetter("pointer", "kind", "schema_pointer")


_VALUE_KINDS = frozenset({"enum_mismatch", "const_mismatch", "constraint"})
_PART_KEYWORDS = frozenset(
    {"allOf", "anyOf", "oneOf", "if", "then", "else", "dependentSchemas", "$ref", "$dynamicRef"}
)


def _explained(where: tuple[str, str], others: list[Deviation]) -> bool:
    """Whether a failure inside the object at ``where[0]`` came from a part applied in
    place by the schema at ``where[1]`` (so its evaluated properties were discarded)."""
    pointer, node = where
    for d in others:
        if not d.schema_pointer:
            continue  # a duplicate member name: not a schema failure
        if not (d.pointer == pointer or d.pointer.startswith(pointer + "/")):
            continue
        if not d.schema_pointer.startswith(node + "/"):
            return True  # reached through a $ref
        if d.schema_pointer[len(node) + 1 :].split("/", 1)[0] in _PART_KEYWORDS:
            return True
    return False


def _parent(pointer: str) -> str:
    return pointer.rsplit("/", 1)[0] if pointer else ""
