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
reports for the whole schema; the fast path (``plan.py``, ``walk.py``) walks the closed
objects registration generates in Python and asks jsonschema-rs only yes/no questions,
so an invalid instance costs about what a valid one does. A property test holds the two
to identical deviation lists.

Where each part lives (this module keeps ``check``, the cache of compiled validators and
every name the gates, the tests and the bench import from it):

- ``instances.py``: decoding the bytes, the input rules, duplicate member names;
- ``deviations.py``: ``json_type``, what a check finds, and ``_finish`` (the filtering,
  dedupe and order every result goes through);
- ``translate.py``: the slow path, a jsonschema-rs error into deviations;
- ``plan.py``: the fast path's plan of a schema (its nodes and their validators);
- ``walk.py``: the fast path's walk of an instance along that plan.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import jsonschema_rs
import msgspec

from ledger.events.gates import Deviation
from ledger.intake import MAX_DEPTH, InputError, check_json_value

# The tests reach these through this module too (and patch ``_prepare.compile_schema``,
# ``_Part.translate``); bench/gates.py's --breakdown imports the steps of ``_check``.
from . import prepare as _prepare  # noqa: F401
from .deviations import _finish, _Found, _not_json, json_type
from .instances import (
    _BYTES_TYPES,
    _decoder,
    _duplicate_members,
    _ensure_json,
    _may_break_rules,
    _nests_too_deep,  # noqa: F401
    _seen,
    _too_deep,  # noqa: F401
)
from .plan import _Node, _Part, _Planner, _Unavailable, _walkable  # noqa: F401 (_Part)
from .prepare import (
    InvalidSchemaError,
    SchemaIndex,
    SchemaProblem,
    compile_schema,
    has_integer_only_types,
    json_pointer,
)
from .prepare import schema_sha256 as _schema_sha256
from .translate import _translate
from .walk import _walk

__all__ = ["CACHE_SIZE", "PLAN_CACHE_SIZE", "check", "clear_cache", "json_type"]

CACHE_SIZE = 4096


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
