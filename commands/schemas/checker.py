"""The strict structural checker (the gates' engine): an instance against a JSON Schema 2020-12,
every deviation reported, nothing coerced, dropped or filled.

Shared by attachment arguments and the input/output gates. ``check`` returns ALL
deviations (never only the first), one per offending field, each with the RFC 6901
pointer into the instance, a kind, a short ``expected`` text taken from the schema, the
JSON type of the offending value (``absent`` for a missing field) and the RFC 6901
pointer of the schema keyword that failed.

Decisions:

- No coercion. ``"5"`` and ``true`` are not integers, ``null`` is a present value (not a
  missing field), a missing field is not ``null``.
- "integer" means a JSON integer token: ``1.0`` and ``1e2`` are NOT integers (the JSON
  Schema spec, jsonschema-rs and python-jsonschema accept them). Instance bytes are
  decoded with msgspec, which keeps the distinction (``1`` -> int, ``1.0`` -> float); a
  Python instance is taken as given (a float is never an integer). The compiled
  validator enforces it (see ``commands.schemas.prepare.INTEGER_TOKEN_KEYWORD``), also inside
  ``anyOf``/``oneOf``. ``const``/``enum`` compare numbers by value as the spec says.
- Formats are asserted (``format: date-time`` fails for ``"yesterday"``); schemas with a
  format the checker does not know are refused at registration.
- Instance bytes that are not JSON give one ``wrong_type`` deviation at the root with
  ``actual_type`` ``invalid_json``. A duplicate member name (``{"a":1,"a":2}``) is an
  ``extra_field`` at the member's pointer: most parsers keep the last one silently, and
  two parsers disagreeing on which one counts is how a checked call differs from the
  executed one.
- Instance values are never copied into deviations, only their JSON type: parameters can
  hold secrets, and deviations go to the log. ``expected`` texts come from the schema.
  (Object keys do appear, in pointers: they are structure.)
- ``unevaluatedProperties: false`` violations are ``extra_field``. When a composition
  fails, JSON Schema discards what its parts evaluated, so ``unevaluatedProperties``
  would also name properties the schema does declare; those are not reported as extra
  when the failure that caused it is reported (the verdict is unchanged).
- A value of the wrong type is reported once, as ``wrong_type``: the same schema's
  ``enum``/``const``/constraints failing on it are not repeated.

Compiled validators are cached by the schema's SHA-256 (an LRU of a few thousand).
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, NamedTuple

import jsonschema_rs
import msgspec

from ledger.events.gates import Deviation, DeviationKind
from ledger.intake import MAX_DEPTH, InputError, check_json_value

from .prepare import (
    INTEGER_TOKEN_KEYWORD,
    InvalidSchemaError,
    SchemaIndex,
    SchemaProblem,
    compile_schema,
    has_integer_only_types,
    in_place_property_names,
    json_pointer,
    schema_at,
)
from .prepare import schema_sha256 as _schema_sha256

__all__ = ["CACHE_SIZE", "check", "clear_cache", "json_type"]

CACHE_SIZE = 4096

_BYTES_TYPES = (bytes, bytearray, memoryview)


def json_type(value: Any) -> str:
    """The JSON type of a decoded value: object, array, string, integer, number (any
    float, including 1.0), boolean or null."""
    if value is None:
        return "null"
    kind = type(value)
    if kind is bool:  # before int: bool is an int subclass in Python
        return "boolean"
    if kind is int:
        return "integer"
    if kind is float:
        return "number"
    if kind is str:
        return "string"
    if kind is dict:
        return "object"
    if kind is list or kind is tuple:
        return "array"
    raise TypeError(f"{kind.__name__} is not a JSON type")


# --- compiled validators ---------------------------------------------------------------------


class _Compiled:
    """The compiled validators of one schema and what is needed to explain their errors.

    ``plain`` is the schema as is; ``strict`` adds the integer-token rule, whose check is
    a Python call per integer-typed value: it is used only for instances that hold a
    float with a zero fraction (the only values on which the two can disagree)."""

    __slots__ = ("_index", "plain", "schema", "strict")

    def __init__(self, schema: Any) -> None:
        self.schema = schema
        self.plain = compile_schema(schema, integer_tokens=False)
        self.strict = compile_schema(schema) if has_integer_only_types(schema) else self.plain
        self._index: SchemaIndex | None = None

    @property
    def index(self) -> SchemaIndex:
        if self._index is None:  # only needed to explain some errors
            self._index = SchemaIndex(self.schema)
        return self._index


_cache: OrderedDict[str, _Compiled] = OrderedDict()
_cache_lock = threading.Lock()


def _compiled(schema: Any, sha256: str | None) -> _Compiled:
    key = sha256 if sha256 is not None else _schema_sha256(schema)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    try:
        compiled = _Compiled(schema)
    except jsonschema_rs.ValidationError as exc:
        raise InvalidSchemaError(
            [SchemaProblem(pointer=json_pointer(list(exc.instance_path)), message=exc.message)]
        ) from None
    with _cache_lock:
        _cache[key] = compiled
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return compiled


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


# --- the check ---------------------------------------------------------------------------


class _Found(NamedTuple):
    deviation: Deviation
    # For unevaluatedProperties reports: the object's pointer, the pointer of the schema
    # that holds the keyword, and whether that schema declares the name in some part.
    unevaluated_in: tuple[str, str] | None = None
    declared: bool = False


def check(
    schema: dict[str, Any] | bool,
    instance_json: bytes | Any,
    *,
    schema_sha256: str | None = None,
) -> list[Deviation]:
    """Every deviation of an instance from ``schema`` (empty when it conforms).

    ``instance_json`` is JSON bytes (``bytes``/``bytearray``/``memoryview``) or an
    already decoded value (a ``str`` is a JSON string value, not JSON text).
    ``schema_sha256``, when given, must be the digest of ``schema`` (it keys the cache of
    compiled validators). Raises ``InvalidSchemaError`` for a schema that cannot be
    compiled, ``TypeError``/``ValueError`` for a decoded instance that is not JSON.
    """
    found: list[_Found] = []
    if isinstance(instance_json, _BYTES_TYPES):
        data = bytes(instance_json)
        _seen.integral_float = False
        try:
            instance = _decoder.decode(data)
        except msgspec.DecodeError:
            return [_not_json("a JSON document")]
        except RecursionError:
            return [_not_json(f"a JSON document (nested deeper than {MAX_DEPTH} levels)")]
        if _may_break_rules(data, instance):
            try:
                check_json_value(instance, "instance")
            except InputError as exc:
                return [_not_json(f"a JSON document ({exc.detail})", exc.pointer)]
        found.extend(_duplicate_members(data, instance))
        integral_float = _seen.integral_float
    else:
        instance = instance_json
        integral_float = _ensure_json(instance)
    compiled = _compiled(schema, schema_sha256)
    validator = compiled.strict if integral_float else compiled.plain
    if not found and validator.is_valid(instance):
        return []
    for error in validator.iter_errors(instance):
        found.extend(_translate(error, instance, compiled))
    return _finish(found)


def _not_json(expected: str, pointer: str = "") -> Deviation:
    return Deviation(
        pointer=pointer, kind="wrong_type", expected=expected, actual_type="invalid_json"
    )


# Bytes that could break the input rules msgspec does not enforce (nesting deeper than
# MAX_DEPTH, integers beyond ±(2^53 - 1)) hold many brackets or a long run of digits;
# both are counted at C speed, so typical inputs skip the walk over the decoded value.
_LONG_DIGITS = re.compile(rb"[0-9]{16}")


def _may_break_rules(data: bytes, instance: Any) -> bool:
    if _LONG_DIGITS.search(data) is not None:
        return True
    return data.count(b"[") + data.count(b"{") >= MAX_DEPTH and _too_deep(instance)


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


def _finish(found: list[_Found]) -> list[Deviation]:
    plain = [f.deviation for f in found if f.unevaluated_in is None]
    kept: list[Deviation] = list(plain)
    for f in found:
        if f.unevaluated_in is None:
            continue
        if f.declared and _explained(f.unevaluated_in, plain):
            continue  # a declared property whose part failed: that failure is reported
        kept.append(f.deviation)
    # One report per wrong-typed value: drop the same schema's other verdicts on it.
    wrong = {(d.pointer, _parent(d.schema_pointer)) for d in kept if d.kind == "wrong_type"}
    result: dict[tuple[str, str, str], Deviation] = {}
    for d in kept:
        if d.kind in _VALUE_KINDS and (d.pointer, _parent(d.schema_pointer)) in wrong:
            continue
        result.setdefault((d.pointer, d.kind, d.expected), d)
    return sorted(result.values(), key=lambda d: (d.pointer, d.kind, d.schema_pointer))


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


# --- translating jsonschema-rs errors --------------------------------------------------------


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


def _translate(error: Any, instance: Any, compiled: _Compiled) -> Iterator[_Found]:
    path = list(error.instance_path)
    spath = list(error.schema_path)
    kind = error.kind
    name = type(kind).__name__
    value = _value_at(instance, path)

    if name in ("AdditionalProperties", "UnevaluatedProperties"):
        # jsonschema-rs reports all unexpected names of one object in one error; the
        # ledger reports each field on its own, with its own pointer.
        names = [n for n in kind.unexpected if isinstance(value, dict) and n in value]
        declared: set[str] | None = set()
        where = None
        if name == "UnevaluatedProperties":
            holder = schema_at(compiled.schema, spath[:-1])
            declared = in_place_property_names(holder, compiled.index)
            where = (json_pointer(path), json_pointer(spath[:-1]))
        if not names:  # cannot happen for an object; never lose the verdict
            yield _Found(_deviation(path, "constraint", "no such property", "object", spath))
        for field in names:
            yield _Found(
                _deviation(
                    [*path, field],
                    "extra_field",
                    "no such property",
                    json_type(value[field]),
                    spath,
                ),
                unevaluated_in=where,
                declared=declared is None or field in declared,
            )
        return
    if name == "Required":
        field = kind.property
        holder = schema_at(compiled.schema, spath[:-1])
        declared_type = None
        if isinstance(holder, dict) and isinstance(holder.get("properties"), dict):
            declared_type = _type_text(holder["properties"].get(field))
        expected = f"required {declared_type}" if declared_type else "required"
        yield _Found(_deviation([*path, field], "missing_required", expected, "absent", spath))
        return

    actual = json_type(value) if value is not _MISSING else "absent"
    if name == "Type":
        yield _Found(_deviation(path, "wrong_type", " or ".join(kind.types), actual, spath))
    elif name == "Custom" and kind.keyword == INTEGER_TOKEN_KEYWORD:
        type_spath = [*spath[:-1], "type"]
        expected = _type_text(schema_at(compiled.schema, spath[:-1])) or "integer"
        yield _Found(_deviation(path, "wrong_type", expected, actual, type_spath))
    elif name == "Enum":
        yield _Found(
            _deviation(path, "enum_mismatch", "one of " + _text(kind.options), actual, spath)
        )
    elif name == "Constant":
        yield _Found(
            _deviation(
                path, "const_mismatch", "equal to " + _text(kind.expected_value), actual, spath
            )
        )
    elif name == "FalseSchema":
        if len(spath) >= 2 and spath[-2] in ("properties", "patternProperties"):
            yield _Found(_deviation(path, "extra_field", "no such property", actual, spath))
        else:
            yield _Found(_deviation(path, "constraint", "no value allowed here", actual, spath))
    elif name in ("AnyOf", "OneOfNotValid"):
        types = _branch_types(kind.context, path)
        if types:
            yield _Found(_deviation(path, "wrong_type", " or ".join(types), actual, spath))
        else:
            how = "any" if name == "AnyOf" else "exactly one"
            expected = f"{how} of {len(kind.context)} alternatives"
            yield _Found(_deviation(path, "constraint", expected, actual, spath))
    elif name == "PropertyNames":
        inner = kind.error
        key = inner.instance  # a property name: structure, shown in pointers anyway
        expected = "property name " + _constraint_text(inner, compiled)
        yield _Found(_deviation([*path, key], "constraint", expected, "string", spath))
    else:
        expected = _constraint_text(error, compiled)
        yield _Found(_deviation(path, "constraint", expected, actual, spath))


def _constraint_text(error: Any, compiled: _Compiled) -> str:
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


# --- instances ---------------------------------------------------------------------------------


# Decoding notes whether a float with a zero fraction (1.0, 1e2) occurs: only then can
# the integer-token rule change a verdict. msgspec calls the hook for float literals
# only (integer tokens decode to int without it).
_seen = threading.local()


def _float_hook(text: str) -> float:
    value = float(text)
    if value.is_integer():
        _seen.integral_float = True
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
