"""The strict structural checker (the gates' engine): an instance against a JSON Schema 2020-12,
every deviation reported, nothing coerced, dropped or filled. (Registration translates a
schema declared in an earlier draft to 2020-12, so 2020-12 is all the checker sees.)

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
- Instance bytes that are not JSON, or break the input rules (nesting deeper than 64
  levels, an integer beyond ±(2^53 - 1), written as digits or as an integral float such
  as ``1e17``), give one ``wrong_type`` deviation with ``actual_type`` ``invalid_json``.
  A duplicate member name (``{"a":1,"a":2}``) is an
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

Compiled validators are cached by the schema's SHA-256 (an LRU of a few thousand), the
fast path's plans of the schemas that most recently saw invalid input too (a few hundred).

Two ways to the same deviations: the slow path translates every error jsonschema-rs
reports for the whole schema; the fast path (see its section below) walks the closed
objects registration generates in Python and asks jsonschema-rs only yes/no questions,
so an invalid instance costs about what a valid one does. A property test holds the two
to identical deviation lists.
"""

from __future__ import annotations

import functools
import json
import math
import operator
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from typing import Any

import jsonschema_rs
import msgspec

from ledger.events.gates import Deviation, DeviationKind
from ledger.intake import MAX_DEPTH, MAX_SAFE_INTEGER, InputError, check_json_value

from . import prepare as _prepare
from .prepare import (
    INTEGER_TOKEN_KEYWORD,
    InvalidSchemaError,
    SchemaIndex,
    SchemaProblem,
    compile_schema,
    escape_token,
    has_integer_only_types,
    in_place_property_names,
    iter_subschemas,
    json_pointer,
    schema_at,
)
from .prepare import schema_sha256 as _schema_sha256

__all__ = ["CACHE_SIZE", "PLAN_CACHE_SIZE", "check", "clear_cache", "json_type"]

CACHE_SIZE = 4096

_BYTES_TYPES = (bytes, bytearray, memoryview)


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


# --- compiled validators ---------------------------------------------------------------------


class _Compiled:
    """The compiled validators of one schema and what is needed to explain their errors.

    ``plain`` is the schema as is; ``strict`` adds the integer-token rule, whose check is
    a Python call per integer-typed value: it is used only for instances that hold a
    float with a zero fraction (the only values on which the two can disagree)."""

    __slots__ = ("_index", "_plan", "_planned", "plain", "schema", "strict")

    def __init__(self, schema: Any) -> None:
        self.schema = schema
        self.plain = compile_schema(schema, integer_tokens=False)
        self.strict = compile_schema(schema) if has_integer_only_types(schema) else self.plain
        self._index: SchemaIndex | None = None
        self._plan: _Node | None = None
        self._planned = False

    @property
    def index(self) -> SchemaIndex:
        if self._index is None:  # only needed to explain some errors
            self._index = SchemaIndex(self.schema)
        return self._index

    @property
    def plan(self) -> _Node | None:
        """The root node of the fast path (built on the first invalid instance), or None
        when the schema is not one it judges."""
        if not self._planned:
            try:
                walkable = _walkable(self.schema)
                self._plan = _Planner(self).node((), self.schema) if walkable else None
            except RecursionError:  # nested beyond Python's stack: the slow path judges
                self._plan = None
            self._planned = True
        if self._plan is not None:
            _keep_plan(self)
        return self._plan

    def forget_plan(self) -> None:
        """Let the plan and its compiled parts go (built again when next needed)."""
        self._plan, self._planned = None, False

    def drop_plan(self) -> None:
        """Never use the fast path for this schema (a part would not compile alone)."""
        self._plan, self._planned = None, True
        with _cache_lock:
            _planned.pop(id(self), None)


_cache: OrderedDict[str, _Compiled] = OrderedDict()
_cache_lock = threading.Lock()

# The fast path's plan of a schema, with the validators of its parts, can take more
# memory than the schema's own validators (a large schema: about twice as much, see
# docs/performance.md), and only schemas that see invalid instances need one: only the
# plans of the PLAN_CACHE_SIZE schemas that most recently did are kept.
PLAN_CACHE_SIZE = 256
_planned: OrderedDict[int, _Compiled] = OrderedDict()  # by id(): each is held here


def _keep_plan(compiled: _Compiled) -> None:
    key = id(compiled)
    with _cache_lock:
        if key in _planned:
            _planned.move_to_end(key)
            return
        _planned[key] = compiled
        while len(_planned) > PLAN_CACHE_SIZE:
            _planned.popitem(last=False)[1].forget_plan()


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
        for compiled in _planned.values():
            compiled.forget_plan()
        _planned.clear()


# --- the check ---------------------------------------------------------------------------


class _Found(msgspec.Struct, frozen=True):
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
    return _check(schema, instance_json, schema_sha256, fast=True)


def _check(
    schema: dict[str, Any] | bool,
    instance_json: bytes | Any,
    schema_sha256: str | None,
    *,
    fast: bool,
) -> list[Deviation]:
    """``check``; ``fast=False`` never takes the fast path (the tests compare the two)."""
    found: list[_Found] = []
    if isinstance(instance_json, _BYTES_TYPES):
        data = bytes(instance_json)
        _seen.integral_float = _seen.unsafe_float = False
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
    if validator.is_valid(instance):
        return _finish(found) if found else []  # found: duplicate member names only
    plan = compiled.plan if fast and not integral_float else None
    if plan is not None:
        walked: list[_Found] = []
        try:
            _walk(plan, instance, "", compiled, walked)
        except _Unavailable:
            compiled.drop_plan()  # a part would not compile alone: never try again
        except RecursionError:
            pass  # a decoded instance nested beyond Python's stack: the slow path
        else:
            return _finish(found + walked)
    return _finish(found + _slow(validator, instance, compiled))


def _slow(validator: Any, instance: Any, compiled: _Compiled) -> list[_Found]:
    """Every error of the whole schema from jsonschema-rs, translated one by one."""
    found: list[_Found] = []
    for error in validator.iter_errors(instance):
        found.extend(_translate(error, compiled, instance))
    return found


def _not_json(expected: str, pointer: str = "") -> Deviation:
    return Deviation(
        pointer=pointer, kind="wrong_type", expected=expected, actual_type="invalid_json"
    )


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


# --- the fast path: structure walked in Python, values judged by jsonschema-rs -------------
#
# Why it exists: for every error, jsonschema-rs builds a Python ValidationError (messages,
# three paths, a kind object, and the failing value converted back to Python: for an
# error at the root, the whole document), about 2 µs each, and translating it into a
# deviation costs as much again. Most deviations a gate reports come from the closed
# objects registration generates (a missing or extra field, a wrong type, a value out of
# its enum or range), and none of those needs an error object to be found.
#
# So for schemas made of such objects the check walks the instance along the schema:
# type, ``required``, ``additionalProperties: false`` and the ``unevaluatedProperties:
# false`` that closes a ``$ref``'d definition are checked in Python; each member or item
# is first asked of jsonschema-rs as a yes/no (``is_valid`` of a validator compiled for
# that subschema, which costs no error object), and only a failing one is walked into. A
# value keyword (``enum``, ``minimum``, ``pattern``, ``format``, ...) is judged by its own
# one-keyword validator; its ``expected`` text depends only on the schema, so it is taken
# once from jsonschema-rs's error and kept. Any other subschema is handed to jsonschema-rs
# whole, and its errors are translated as in the slow path.
#
# The deviations are identical to the slow path's (property tests hold them to it), and
# it is used only where that was shown to hold: schemas whose references are all
# ``#/$defs/<name>`` (so a subschema compiled with the root's ``$defs`` resolves them as
# the whole schema does) and loop only through members or items, and instances without
# a float with a zero fraction (the integer-token rule stays with the slow path). A node
# jsonschema-rs rejects but the walk finds nothing wrong with is translated from
# jsonschema-rs's own errors: a verdict is never lost. One difference is deliberate:
# jsonschema-rs 0.61 leaves an empty member name ("") out of the paths it reports, so
# the slow path points at the parent object; the walk points at the member.

_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
# Keywords that judge only the value at their own location and fail with one error whose
# kind and expected text depend on the schema alone (and that _finish drops when the
# same schema's type fails, as the walk does).
_VALUE_KEYWORDS = frozenset(
    {
        "enum",
        "const",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minProperties",
        "maxProperties",
    }
)
_STRUCTURE_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "items"})
# The Python types each JSON type admits, by exact type (bool is not an integer). No
# float with a zero fraction reaches the walk, so "integer" is an int there.
_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "null": (type(None),),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
    "string": (str,),
    "object": (dict,),
    "array": (list, tuple),
}
_JSON_TYPES = frozenset(_PYTHON_TYPES)
_UNSUPPORTED_ANYWHERE = (
    "$id",
    "$anchor",
    "$dynamicAnchor",
    "$dynamicRef",
    "$recursiveRef",
    "$recursiveAnchor",
    "definitions",
)

Path = tuple[str | int, ...]


class _Unavailable(Exception):
    """A part of the schema would not compile on its own: the slow path judges."""


class _Part:
    """A subschema with a validator of its own, compiled on first use. ``defs``: the
    root's ``$defs``, compiled beside the subschema when it holds a ``$ref``."""

    __slots__ = ("defs", "path", "schema", "shared", "validator")

    def __init__(
        self, path: Path, schema: Any, defs: dict[str, Any] | None = None, validator: Any = None
    ) -> None:
        self.path = path
        self.schema = schema
        self.defs = defs
        self.shared: _Shared | None = None
        # A plain attribute (the walk reads it for every member it asks about); until
        # first used it holds a stand-in that compiles the real one.
        self.validator: Any = validator if validator is not None else _Uncompiled(self)

    def fragment(self) -> Any:
        """What is compiled: the subschema, with the root's ``$defs`` if it refers."""
        if not self.defs or not _has_ref(self.schema):
            return self.schema
        return {**self.schema, "$defs": self.defs}

    def translate(self, value: Any, pointer: str, compiled: _Compiled, found: list[_Found]) -> None:
        for error in self.validator.iter_errors(value):
            found.extend(_translate(error, compiled, value, pointer, self.path))


class _Uncompiled:
    """A part's validator before its first use: compiles it and takes its place."""

    __slots__ = ("part",)

    def __init__(self, part: _Part) -> None:
        self.part = part

    def _compile(self) -> Any:
        shared = _shared_validator(self.part.fragment())
        self.part.shared = shared  # keeps it alive, and in the table, as long as the part
        self.part.validator = shared.validator
        return shared.validator

    def is_valid(self, value: Any) -> bool:
        return bool(self._compile().is_valid(value))

    def iter_errors(self, value: Any) -> Any:
        return self._compile().iter_errors(value)


class _Shared:
    """A compiled part, shared by every part with the same content (the same pattern in
    many places, a definition closed the same way twice, the same part in another
    version of a schema): a compiled regular expression alone can take 10 KB."""

    __slots__ = ("__weakref__", "validator")

    def __init__(self, validator: Any) -> None:
        self.validator = validator


_shared: weakref.WeakValueDictionary[bytes, _Shared] = weakref.WeakValueDictionary()
_shared_lock = threading.Lock()


def _shared_validator(fragment: Any) -> _Shared:
    key = msgspec.json.encode(fragment)  # the same content as stored, the same bytes
    with _shared_lock:
        hit = _shared.get(key)
    if hit is not None:
        return hit
    try:
        # Through the module, not this module's name for it: a part is not the schema,
        # and the cache of compiled schemas is keyed by the schema alone.
        compiled = _Shared(_prepare.compile_schema(fragment, integer_tokens=False))
    except (jsonschema_rs.ValidationError, ValueError):
        raise _Unavailable from None
    with _shared_lock:
        return _shared.setdefault(key, compiled)


class _Keyword(_Part):
    """One value keyword of a node (or its ``type``), compiled alone."""

    __slots__ = ("_known",)

    def __init__(self, path: Path, schema: Any) -> None:
        super().__init__(path, schema)
        self._known: tuple[DeviationKind, str, str] | None = None

    def report(self, value: Any, pointer: str, compiled: _Compiled, found: list[_Found]) -> None:
        known = self._known
        if known is not None:
            kind, expected, schema_pointer = known
            found.append(
                _Found(
                    Deviation(
                        pointer=pointer,
                        kind=kind,
                        expected=expected,
                        actual_type=json_type(value),
                        schema_pointer=schema_pointer,
                    )
                )
            )
            return
        here: list[_Found] = []
        self.translate(value, pointer, compiled, here)
        if len(here) == 1 and here[0].unevaluated_in is None:
            d = here[0].deviation
            if d.pointer == pointer and d.actual_type == json_type(value):
                self._known = (d.kind, d.expected, d.schema_pointer)
        found.extend(here)


class _Node(_Part):
    """A schema position the walk understands (see above), or an opaque one."""

    __slots__ = (
        "admits",
        "closed",
        "declared",
        "direct",
        "holder",
        "items",
        "keywords",
        "opaque",
        "properties",
        "required",
        "target",
        "type_keyword",
        "type_only",
        "types",
    )

    def __init__(
        self, path: Path, schema: Any, defs: dict[str, Any] | None, validator: Any = None
    ) -> None:
        super().__init__(path, schema, defs, validator)
        self.opaque = True
        self.types: frozenset[str] | None = None
        self.admits: frozenset[type] | None = None  # the Python types of those JSON types
        self.type_only = False
        self.direct = False
        # Built on first use: most nodes of a large schema are never walked into.
        self.type_keyword: _Keyword | None = None
        self.keywords: list[_Keyword] | None = None
        self.properties: dict[str, tuple[str, _Node]] = _NO_PROPERTIES
        self.required: list[tuple[str, str, str, str]] = []  # name, pointer token, text, sp
        self.closed: str | None = None  # additionalProperties: false, its schema pointer
        self.items: _Node | None = None
        # A "$ref" + "unevaluatedProperties: false" node: the definition it applies, the
        # keyword's schema pointer, the node's own, and the names it counts as declared.
        self.target: _Node | None = None
        self.holder: tuple[str, str] = ("", "")
        self.declared: AbstractSet[str] = frozenset()

    def type_check(self) -> _Keyword:
        if self.type_keyword is None:
            self.type_keyword = _Keyword(self.path, {"type": self.schema["type"]})
        return self.type_keyword

    def value_keywords(self) -> list[_Keyword]:
        if self.keywords is None:
            self.keywords = [
                _Keyword(self.path, {key: value})
                for key, value in self.schema.items()
                if key in _VALUE_KEYWORDS
            ]
        return self.keywords


_NO_PROPERTIES: dict[str, tuple[str, _Node]] = {}  # shared, never written to


@functools.cache
def _type_sets(names: tuple[str, ...]) -> tuple[frozenset[str], frozenset[type]]:
    """A declared type list and the Python types it admits (shared by every node)."""
    return frozenset(names), frozenset(t for name in names for t in _PYTHON_TYPES[name])


def _def_name(ref: Any, defs: dict[str, Any]) -> str | None:
    if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
        return None
    name = ref[len("#/$defs/") :]
    if any(c in name for c in "/~%") or name not in defs:
        return None
    return name


def _walkable(schema: Any) -> bool:
    """Whether the fast path may judge ``schema``: an object whose references are all
    ``#/$defs/<name>`` into its own top-level ``$defs`` (so a subschema compiled with
    that ``$defs`` beside it resolves them as the whole document does), none of which
    comes back to itself without going down into the instance (``"a": {"not": {"$ref":
    "#/$defs/a"}}`` means nothing, and jsonschema-rs's answer depends on where it starts
    from)."""
    if not isinstance(schema, dict):
        return False
    defs = schema.get("$defs", {})
    if not isinstance(defs, dict):
        return False
    for path, node in iter_subschemas(schema):
        if not isinstance(node, dict):
            continue
        if any(k in node for k in _UNSUPPORTED_ANYWHERE) or ("$defs" in node and path):
            return False
        if "$ref" in node and _def_name(node["$ref"], defs) is None:
            return False
    return not _loops_in_place(defs)


def _loops_in_place(defs: dict[str, Any]) -> bool:
    """Whether a definition reaches itself through references applied in place."""
    reaches = {name: _in_place_references(definition, defs) for name, definition in defs.items()}
    done: set[str] = set()
    for start in defs:
        path, stack = {start}, [(start, iter(reaches[start]))]
        while stack:
            name, following = stack[-1]
            step = next(following, None)
            if step is None:
                stack.pop()
                path.discard(name)
                done.add(name)
            elif step in path:
                return True
            elif step not in done:
                path.add(step)
                stack.append((step, iter(reaches[step])))
    return False


def _in_place_references(schema: Any, defs: dict[str, Any]) -> set[str]:
    """The definitions ``schema`` refers to in place: from itself or its compositions,
    conditions and negation (not from members or items, which go down a level)."""
    found: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        name = _def_name(node.get("$ref"), defs)
        if name is not None:
            found.add(name)
        for keyword in ("allOf", "anyOf", "oneOf"):
            if isinstance(node.get(keyword), list):
                stack.extend(node[keyword])
        stack.extend(node[k] for k in ("not", "if", "then", "else") if k in node)
        if isinstance(node.get("dependentSchemas"), dict):
            stack.extend(node["dependentSchemas"].values())
    return found


def _has_ref(schema: Any) -> bool:
    return any(isinstance(n, dict) and "$ref" in n for _, n in iter_subschemas(schema))


class _Planner:
    """Builds the nodes of one schema (each position once; cycles through ``$ref``
    share the node)."""

    def __init__(self, compiled: _Compiled) -> None:
        self.compiled = compiled
        self.root = compiled.schema
        self.defs: dict[str, Any] = self.root.get("$defs", {})
        self.nodes: dict[Path, _Node] = {}

    def _new(self, path: Path, schema: Any) -> _Node:
        # The root is compiled already; other positions get the root's $defs if any.
        if not path:
            return _Node(path, schema, None, self.compiled.plain)
        return _Node(path, schema, self.defs or None)

    def node(self, path: Path, schema: Any) -> _Node:
        hit = self.nodes.get(path)
        if hit is not None:
            return hit
        if isinstance(schema, dict) and "$ref" in schema:
            return self._reference(path, schema)
        node = self._new(path, schema)
        self.nodes[path] = node
        if isinstance(schema, dict):
            self._fill(node, path, schema)
        return node

    def _fill(self, node: _Node, path: Path, schema: dict[str, Any]) -> None:
        allowed = _ANNOTATIONS | _VALUE_KEYWORDS | _STRUCTURE_KEYWORDS
        if not path:
            allowed = allowed | {"$defs", "$schema"}
        if not set(schema) <= allowed:
            return  # opaque
        declared = schema.get("type")
        if declared is not None:
            names = [declared] if isinstance(declared, str) else declared
            if not (
                isinstance(names, list)
                and names
                and all(isinstance(t, str) and t in _JSON_TYPES for t in names)
            ):
                return
            node.types, node.admits = _type_sets(tuple(names))
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        closing = schema.get("additionalProperties", True)
        if not (
            isinstance(properties, dict)
            and isinstance(required, list)
            and all(isinstance(n, str) for n in required)
            and isinstance(closing, bool)
        ):
            return
        if closing is False:
            if "properties" not in schema or not set(required) <= set(properties):
                # Left to jsonschema-rs, which reports these its own way: the members of
                # a closed object without properties as one false schema at the object
                # (registration adds an empty properties, so that each member is its own
                # extra field); a required name a closed object does not declare
                # (registration refuses it) as missing even when present.
                return
            node.closed = json_pointer((*path, "additionalProperties"))
        node.required = [
            (
                name,
                "/" + escape_token(name),
                _required_text(schema, name),
                json_pointer((*path, "required")),
            )
            for name in dict.fromkeys(required)
        ]
        if properties:
            node.properties = {
                name: ("/" + escape_token(name), self.node((*path, "properties", name), sub))
                for name, sub in properties.items()
            }
        if "items" in schema:
            node.items = self.node((*path, "items"), schema["items"])
        node.type_only = node.types is not None and set(schema) - _ANNOTATIONS == {"type"}
        # An array is walked without asking about it first: a validator of the array
        # would be one more compiled copy of its items' (memory), for one question.
        node.direct = node.admits is not None and node.admits <= {list, tuple}
        node.opaque = False

    def _reference(self, path: Path, schema: dict[str, Any]) -> _Node:
        name = _def_name(schema["$ref"], self.defs)
        rest = set(schema) - _ANNOTATIONS - {"$ref"}
        if name is not None and not rest:
            # A bare reference: the definition itself (no chain of them loops, as
            # _walkable made sure).
            target = self.node(("$defs", name), self.defs[name])
            self.nodes[path] = target
            return target
        node = self._new(path, schema)
        self.nodes[path] = node
        if name is None or rest != {"unevaluatedProperties"}:
            return node
        if schema["unevaluatedProperties"] is not False:
            return node
        definition = self.defs[name]
        target = self.node(("$defs", name), definition)
        if (
            target.opaque
            or target.closed is not None
            or not isinstance(definition, dict)
            or "additionalProperties" in definition
            or (target.types is not None and "object" not in target.types)
        ):
            return node
        declared = in_place_property_names(schema, self.compiled.index)
        if declared is None:
            return node
        node.target = target
        node.holder = (json_pointer((*path, "unevaluatedProperties")), json_pointer(path))
        node.declared = declared
        node.opaque = False
        return node


def _walk(node: _Node, value: Any, pointer: str, compiled: _Compiled, found: list[_Found]) -> None:
    """Deviations of ``value`` (which ``node``'s validator rejected) at ``pointer``."""
    before = len(found)
    target = node.target
    if target is not None:
        if type(value) is dict:
            properties = target.properties
            spointer, holder = node.holder
            declared = node.declared
            for key, item in value.items():
                if key not in properties:
                    found.append(
                        _Found(
                            Deviation(
                                pointer=pointer + "/" + escape_token(key),
                                kind="extra_field",
                                expected="no such property",
                                actual_type=json_type(item),
                                schema_pointer=spointer,
                            ),
                            unevaluated_in=(pointer, holder),
                            declared=key in declared,
                        )
                    )
        if len(found) == before or not target.validator.is_valid(value):
            _walk_node(target, value, pointer, compiled, found)
    elif not node.opaque:
        _walk_node(node, value, pointer, compiled, found)
    if len(found) == before:  # opaque, or the walk disagrees: jsonschema-rs's own errors
        node.translate(value, pointer, compiled, found)


def _walk_node(
    node: _Node, value: Any, pointer: str, compiled: _Compiled, found: list[_Found]
) -> None:
    admits = node.admits
    if admits is not None and type(value) not in admits:
        node.type_check().report(value, pointer, compiled, found)
        # The same schema's value keywords are not reported on a wrong-typed value.
    else:
        for keyword in node.value_keywords():
            if not keyword.validator.is_valid(value):
                keyword.report(value, pointer, compiled, found)
    kind = type(value)
    if kind is dict:
        for name, token, expected, spointer in node.required:
            if name not in value:
                found.append(
                    _Found(
                        Deviation(
                            pointer=pointer + token,
                            kind="missing_required",
                            expected=expected,
                            actual_type="absent",
                            schema_pointer=spointer,
                        )
                    )
                )
        properties = node.properties
        closed = node.closed
        if not properties and closed is None:
            return
        for key, item in value.items():
            child = properties.get(key)
            if child is None:
                if closed is not None:
                    found.append(
                        _Found(
                            Deviation(
                                pointer=pointer + "/" + escape_token(key),
                                kind="extra_field",
                                expected="no such property",
                                actual_type=json_type(item),
                                schema_pointer=closed,
                            )
                        )
                    )
                continue
            token, sub = child
            if sub.direct:
                _walk_node(sub, item, pointer + token, compiled, found)
                continue
            if sub.type_only:
                assert sub.admits is not None
                if type(item) in sub.admits:
                    continue
            elif sub.validator.is_valid(item):
                continue
            _walk(sub, item, pointer + token, compiled, found)
    elif (kind is list or kind is tuple) and node.items is not None:
        sub = node.items
        for index, item in enumerate(value):
            if sub.direct:
                _walk_node(sub, item, f"{pointer}/{index}", compiled, found)
                continue
            if sub.type_only:
                assert sub.admits is not None
                if type(item) in sub.admits:
                    continue
            elif sub.validator.is_valid(item):
                continue
            _walk(sub, item, f"{pointer}/{index}", compiled, found)


# --- translating jsonschema-rs errors --------------------------------------------------------


def _translate(
    error: Any,
    compiled: _Compiled,
    value_root: Any,
    pointer_prefix: str = "",
    schema_prefix: tuple[str | int, ...] = (),
) -> Iterator[_Found]:
    """The deviations one jsonschema-rs error stands for.

    ``value_root`` is what the validator was given; ``pointer_prefix`` and
    ``schema_prefix`` say where that value and the validator's schema sit in the whole
    instance and schema (empty when the whole schema checked the whole instance; the fast
    path below also hands subschemas to jsonschema-rs). Locations reached through a
    ``$ref`` are reported by jsonschema-rs from the document root (``$defs/...``), so
    they get no schema prefix."""
    rel = list(error.instance_path)
    spath = list(error.schema_path)
    if schema_prefix and not (spath and spath[0] == "$defs"):
        spath = [*schema_prefix, *spath]
    kind = error.kind
    name = type(kind).__name__
    value = _value_at(value_root, rel)

    def deviation(
        tokens: list[Any], kind: DeviationKind, expected: str, actual: str, where: Any
    ) -> Deviation:
        return Deviation(
            pointer=pointer_prefix + json_pointer(tokens),
            kind=kind,
            expected=expected,
            actual_type=actual,
            schema_pointer=json_pointer(list(where)),
        )

    if name in ("AdditionalProperties", "UnevaluatedProperties"):
        # jsonschema-rs reports all unexpected names of one object in one error; the
        # ledger reports each field on its own, with its own pointer.
        names = [n for n in kind.unexpected if isinstance(value, dict) and n in value]
        declared: set[str] | None = set()
        where = None
        if name == "UnevaluatedProperties":
            holder = schema_at(compiled.schema, spath[:-1])
            declared = in_place_property_names(holder, compiled.index)
            where = (pointer_prefix + json_pointer(rel), json_pointer(spath[:-1]))
        if not names:  # cannot happen for an object; never lose the verdict
            yield _Found(deviation(rel, "constraint", "no such property", "object", spath))
        for field in names:
            yield _Found(
                deviation(
                    [*rel, field],
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
        yield _Found(
            deviation(
                [*rel, field],
                "missing_required",
                _required_text(schema_at(compiled.schema, spath[:-1]), field),
                "absent",
                spath,
            )
        )
        return

    actual = json_type(value) if value is not _MISSING else "absent"
    if name == "Type":
        yield _Found(deviation(rel, "wrong_type", " or ".join(kind.types), actual, spath))
    elif name == "Custom" and kind.keyword == INTEGER_TOKEN_KEYWORD:
        type_spath = [*spath[:-1], "type"]
        expected = _type_text(schema_at(compiled.schema, spath[:-1])) or "integer"
        yield _Found(deviation(rel, "wrong_type", expected, actual, type_spath))
    elif name == "Enum":
        yield _Found(
            deviation(rel, "enum_mismatch", "one of " + _text(kind.options), actual, spath)
        )
    elif name == "Constant":
        yield _Found(
            deviation(
                rel, "const_mismatch", "equal to " + _text(kind.expected_value), actual, spath
            )
        )
    elif name == "FalseSchema":
        if len(spath) >= 2 and spath[-2] in ("properties", "patternProperties"):
            yield _Found(deviation(rel, "extra_field", "no such property", actual, spath))
        else:
            yield _Found(deviation(rel, "constraint", "no value allowed here", actual, spath))
    elif name in ("AnyOf", "OneOfNotValid"):
        types = _branch_types(kind.context, rel)
        if types:
            yield _Found(deviation(rel, "wrong_type", " or ".join(types), actual, spath))
        else:
            how = "any" if name == "AnyOf" else "exactly one"
            expected = f"{how} of {len(kind.context)} alternatives"
            yield _Found(deviation(rel, "constraint", expected, actual, spath))
    elif name == "PropertyNames":
        inner = kind.error
        key = inner.instance  # a property name: structure, shown in pointers anyway
        expected = "property name " + _constraint_text(inner, compiled)
        yield _Found(deviation([*rel, key], "constraint", expected, "string", spath))
    else:
        expected = _constraint_text(error, compiled)
        yield _Found(deviation(rel, "constraint", expected, actual, spath))


def _required_text(holder: Any, field: str) -> str:
    """``expected`` of a missing field: ``required`` and the type its schema declares."""
    declared_type = None
    if isinstance(holder, dict) and isinstance(holder.get("properties"), dict):
        declared_type = _type_text(holder["properties"].get(field))
    return f"required {declared_type}" if declared_type else "required"


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
