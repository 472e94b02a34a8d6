"""The slow path's half of the checker: one jsonschema-rs error translated into the
deviations it stands for (each unexpected member on its own, a missing field with the
type its schema declares, a failed ``anyOf`` of types read as a wrong type, ...), with
``expected`` texts taken from the schema, never from the instance.

The fast path (``plan.py``, ``walk.py``) translates the errors of the subschemas it
hands to jsonschema-rs whole with the same function.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from ledger.events.gates import Deviation, DeviationKind

from .deviations import _Found, json_type
from .prepare import (
    INTEGER_TOKEN_KEYWORD,
    SchemaIndex,
    in_place_property_names,
    json_pointer,
    schema_at,
)


class _CompiledView(Protocol):
    """What the modules below the checker read of a compiled schema (``checker._Compiled``;
    a protocol, so that they need not import the checker)."""

    @property
    def schema(self) -> Any: ...

    @property
    def plain(self) -> Any: ...

    @property
    def index(self) -> SchemaIndex: ...


def _translate(
    error: Any,
    compiled: _CompiledView,
    value_root: Any,
    pointer_prefix: str = "",
    schema_prefix: tuple[str | int, ...] = (),
) -> Iterator[_Found]:
    """The deviations one jsonschema-rs error stands for.

    ``value_root`` is what the validator was given; ``pointer_prefix`` and
    ``schema_prefix`` say where that value and the validator's schema sit in the whole
    instance and schema (empty when the whole schema checked the whole instance; the fast
    path, ``plan.py``, also hands subschemas to jsonschema-rs). Locations reached through a
    ``$ref`` are reported by jsonschema-rs from the document root (``$defs/...``), so
    they get no schema prefix."""
    rel = list(error.instance_path)
    spath = list(error.schema_path)
    if schema_prefix and not (spath and spath[0] == "$defs"):
        spath = [*schema_prefix, *spath]
    name = type(error.kind).__name__
    value = _value_at(value_root, rel)
    made = _Made(pointer_prefix)
    if name in ("AdditionalProperties", "UnevaluatedProperties"):
        yield from _unexpected(error.kind, name, value, rel, spath, compiled, made)
        return
    if name == "Required":
        field = error.kind.property
        expected = _required_text(schema_at(compiled.schema, spath[:-1]), field)
        yield _Found(made([*rel, field], "missing_required", expected, "absent", spath))
        return
    actual = json_type(value) if value is not _MISSING else "absent"
    yield _Found(_of_value(error, name, rel, actual, spath, compiled, made))


@dataclass(frozen=True)
class _Made:
    """Deviations at pointers under ``prefix`` (where the validated value sits)."""

    prefix: str

    def __call__(
        self, tokens: list[Any], kind: DeviationKind, expected: str, actual: str, where: Any
    ) -> Deviation:
        return Deviation(
            pointer=self.prefix + json_pointer(tokens),
            kind=kind,
            expected=expected,
            actual_type=actual,
            schema_pointer=json_pointer(list(where)),
        )


def _unexpected(
    kind: Any,
    name: str,
    value: Any,
    rel: list[Any],
    spath: list[Any],
    compiled: _CompiledView,
    made: _Made,
) -> Iterator[_Found]:
    """Each member an object may not have, on its own. jsonschema-rs reports all the
    unexpected names of one object in one error; the ledger reports each field with its
    own pointer (and, for ``unevaluatedProperties``, whether the schema declares it)."""
    names = [n for n in kind.unexpected if isinstance(value, dict) and n in value]
    declared: set[str] | None = set()
    where = None
    if name == "UnevaluatedProperties":
        holder = schema_at(compiled.schema, spath[:-1])
        declared = in_place_property_names(holder, compiled.index)
        where = (made.prefix + json_pointer(rel), json_pointer(spath[:-1]))
    if not names:  # cannot happen for an object; never lose the verdict
        yield _Found(made(rel, "constraint", "no such property", "object", spath))
    for field in names:
        yield _Found(
            made([*rel, field], "extra_field", "no such property", json_type(value[field]), spath),
            unevaluated_in=where,
            declared=declared is None or field in declared,
        )


def _of_value(
    error: Any,
    name: str,
    rel: list[Any],
    actual: str,
    spath: list[Any],
    compiled: _CompiledView,
    made: _Made,
) -> Deviation:
    """The one deviation of an error about the value itself (its type, its value, a
    constraint on it)."""
    kind = error.kind
    if name == "Type":
        return made(rel, "wrong_type", " or ".join(kind.types), actual, spath)
    if name == "Custom" and kind.keyword == INTEGER_TOKEN_KEYWORD:
        expected = _type_text(schema_at(compiled.schema, spath[:-1])) or "integer"
        return made(rel, "wrong_type", expected, actual, [*spath[:-1], "type"])
    if name == "Enum":
        return made(rel, "enum_mismatch", "one of " + _text(kind.options), actual, spath)
    if name == "Constant":
        expected = "equal to " + _text(kind.expected_value)
        return made(rel, "const_mismatch", expected, actual, spath)
    if name == "FalseSchema":
        if len(spath) >= 2 and spath[-2] in ("properties", "patternProperties"):
            return made(rel, "extra_field", "no such property", actual, spath)
        return made(rel, "constraint", "no value allowed here", actual, spath)
    if name in ("AnyOf", "OneOfNotValid"):
        types = _branch_types(kind.context, rel)
        if types:
            return made(rel, "wrong_type", " or ".join(types), actual, spath)
        how = "any" if name == "AnyOf" else "exactly one"
        return made(rel, "constraint", f"{how} of {len(kind.context)} alternatives", actual, spath)
    if name == "PropertyNames":
        inner = kind.error
        key = inner.instance  # a property name: structure, shown in pointers anyway
        expected = "property name " + _constraint_text(inner, compiled)
        return made([*rel, key], "constraint", expected, "string", spath)
    return made(rel, "constraint", _constraint_text(error, compiled), actual, spath)


def _required_text(holder: Any, field: str) -> str:
    """``expected`` of a missing field: ``required`` and the type its schema declares."""
    declared_type = None
    if isinstance(holder, dict) and isinstance(holder.get("properties"), dict):
        declared_type = _type_text(holder["properties"].get(field))
    return f"required {declared_type}" if declared_type else "required"


def _constraint_text(error: Any, compiled: _CompiledView) -> str:
    kind = error.kind
    name = type(kind).__name__
    limit = getattr(kind, "limit", None)
    texts = {
        "Minimum": f">= {limit}",
        "Maximum": f"<= {limit}",
        "ExclusiveMinimum": f"> {limit}",
        "ExclusiveMaximum": f"< {limit}",
        "MinLength": f"length >= {limit}",
        "MaxLength": f"length <= {limit}",
        "MinItems": f"at least {limit} items",
        "MaxItems": f"at most {limit} items",
        "MinProperties": f"at least {limit} properties",
        "MaxProperties": f"at most {limit} properties",
        "UniqueItems": "unique items",
        "Contains": "an item matching contains",
        "Not": "not matching the schema under not",
        "OneOfMultipleValid": "exactly one matching alternative",
        "UnevaluatedItems": "no items beyond those declared",
        "Type": " or ".join(getattr(kind, "types", ())),
        "Enum": "one of " + _text(getattr(kind, "options", None)),
        "Constant": "equal to " + _text(getattr(kind, "expected_value", None)),
    }
    if name in texts:
        return texts[name]
    if name == "MultipleOf":
        return f"multiple of {kind.multiple_of}"
    if name == "Pattern":
        return "matching " + _text(kind.pattern)
    if name == "Format":
        return f"format {kind.format}"
    spath = list(error.schema_path)
    keyword = next((t for t in reversed(spath) if isinstance(t, str)), "schema")
    return f"satisfying {keyword}"


def _branch_types(context: list[list[Any]], path: list[Any]) -> list[str]:
    """When every alternative failed only on its type at this same location, the union
    of their types (so ``anyOf: [integer, null]`` reads as a wrong type)."""
    types: list[str] = []
    for branch in context:
        if not branch:
            return []
        for error in branch:
            name = type(error.kind).__name__
            if list(error.instance_path) != path:
                return []
            if name == "Type":
                branch_types = list(error.kind.types)
            elif name == "Custom" and error.kind.keyword == INTEGER_TOKEN_KEYWORD:
                branch_types = ["integer"]
            else:
                return []
            types.extend(t for t in branch_types if t not in types)
    return types


def _type_text(subschema: Any) -> str | None:
    if not isinstance(subschema, dict):
        return None
    declared = subschema.get("type")
    if isinstance(declared, str):
        return declared
    if isinstance(declared, list) and all(isinstance(t, str) for t in declared):
        return " or ".join(declared)
    return None


def _text(value: Any, limit: int = 120) -> str:
    """Compact JSON of a schema value for ``expected`` (never of an instance value)."""
    try:
        text = msgspec.json.encode(value).decode()
    except (TypeError, ValueError, msgspec.EncodeError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


_MISSING: Any = object()


def _value_at(instance: Any, path: list[Any]) -> Any:
    node = instance
    for token in path:
        in_object = isinstance(node, dict) and isinstance(token, str) and token in node
        in_array = isinstance(node, list | tuple) and isinstance(token, int) and token < len(node)
        if not (in_object or in_array):
            return _MISSING
        node = node[token]
    return node
