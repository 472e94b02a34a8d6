"""The checker's fast path (structure walked in Python, values judged by jsonschema-rs)
gives exactly the deviations of the slow path (every jsonschema-rs error translated):
same pointers, kinds, expected texts, actual types, schema pointers, same order."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from types import ModuleType
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commands.schemas import checker
from commands.schemas.checker import check
from commands.schemas.prepare import (
    check_schema,
    iter_subschemas,
    normalise_closed,
    prepare_schema,
)
from ledger.events.gates import Deviation
from ledger.intake import MAX_DEPTH
from tests.commands.schemas.test_checker import (
    COMPOSED,
    DIFFERENTIAL_SCHEMAS,
    PROPERTY_SCHEMAS,
    VALID_FUSION,
)
from tests.helpers import REPO

BENCH = REPO / "bench"


def _bench_gates() -> ModuleType:
    """bench/gates.py, whose schemas and instances the timings use (it imports its
    neighbour _common as a top-level module, as when run as a script)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_gates", BENCH / "gates.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


gates = _bench_gates()


def closed(schema: Any) -> Any:
    return prepare_schema(schema).normalised


def slow(schema: Any, instance: Any) -> list[Deviation]:
    return checker._check(schema, instance, None, fast=False)


# --- schemas: the bench's three, the checker tests', and some that reach every branch ----------

MIXED = closed(
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 2, "maxLength": 5, "pattern": "^[a-z]+$"},
            "when": {"type": "string", "format": "date"},
            "n": {"type": ["integer", "null"], "minimum": 0, "exclusiveMaximum": 10},
            "even": {"type": "integer", "multipleOf": 2},
            "x": {"type": "number", "minimum": 0.5, "maximum": 1e3},
            "tags": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "maxItems": 3,
                "uniqueItems": True,
            },
            "mode": {"enum": ["a", "b", 1, None]},
            "fixed": {"const": {"k": [1, "x"]}},
            "opt": {
                "type": ["object", "null"],
                "properties": {"a/b": {"type": "boolean"}, "m~n": {"type": "integer"}},
                "required": ["a/b"],
            },
            "open": {
                "type": "object",
                "additionalProperties": True,
                "properties": {"k": {"type": "string"}},
                "required": ["k", "elsewhere"],
                "minProperties": 2,
                "maxProperties": 3,
            },
            # properties and required on a schema whose type is not object: they still
            # apply to an object, which also fails the type.
            "strange": {"type": "string", "properties": {"p": {"type": "integer"}}},
            "untyped": {"properties": {"q": {"type": "integer"}}, "required": ["q"]},
            "nothing": False,
            "anything": True,
            "choice": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]},
            "grid": {
                "type": "array",
                "items": {"type": "array", "items": {"type": "integer", "maximum": 9}},
            },
            "flags": {"items": {"type": "boolean"}},
            "none": {"type": "array", "items": False},
            "typed_enum": {"type": "string", "enum": ["on", "off"], "title": "a switch"},
        },
        "required": ["name", "n"],
    }
)

REFS = closed(
    {
        "$defs": {
            "label": {"type": "string", "maxLength": 3},
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer"},
                    "y": {"type": "integer"},
                    "label": {"$ref": "#/$defs/label"},
                },
                "required": ["x", "y"],
            },
            "box": {
                "type": "object",
                "properties": {"min": {"$ref": "#/$defs/point"}, "max": {"$ref": "#/$defs/point"}},
                "required": ["min"],
                "minProperties": 1,
            },
            "node": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["name"],
            },
            "either": {"anyOf": [{"$ref": "#/$defs/point"}, {"type": "null"}]},
        },
        "type": "object",
        "properties": {
            "box": {"$ref": "#/$defs/box"},
            "points": {"type": "array", "items": {"$ref": "#/$defs/point"}},
            "tag": {"$ref": "#/$defs/label"},
            "tree": {"$ref": "#/$defs/node"},
            "maybe": {"$ref": "#/$defs/either"},
            "described": {"$ref": "#/$defs/label", "description": "a bare reference"},
        },
        "required": ["box"],
    }
)

# Not judged by the fast path (a reference to the root): the slow path judges it alone.
ROOT_REF = closed(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "next": {"$ref": "#"}},
        "required": ["name"],
    }
)


def _bench_case(case: str) -> tuple[Any, list[Any]]:
    declared, make_valid, make_invalid = gates.CASES[case]
    return closed(copy.deepcopy(declared)), [make_valid(), make_invalid()]


SCHEMAS: dict[str, tuple[Any, list[Any]]] = {
    "bench_small": _bench_case("small"),
    "bench_typical": _bench_case("typical"),
    "bench_large": _bench_case("large"),
    "fusion_validate": (PROPERTY_SCHEMAS["fusion_validate"], [VALID_FUSION]),
    "nested": (
        PROPERTY_SCHEMAS["nested"],
        [
            {
                "id": 1,
                "name": "n",
                "score": 0.5,
                "tags": ["a"],
                "meta": {"a/b": True, "m~n": None, "inner": {"level": "lo"}},
                "rows": [{"k": "a", "v": 1}, {"k": "b", "v": 2}],
            }
        ],
    ),
    "composed": (COMPOSED, [{"item": {"id": 1, "name": "n", "flag": True}, "ref": {"id": 2}}]),
    "scalars": (
        DIFFERENTIAL_SCHEMAS["scalars"],
        [{"i": 1, "n": 0.5, "s": "abc", "e": [1], "c": {"k": [True]}, "u": [1, 2], "o": 3}],
    ),
    "mixed": (
        MIXED,
        [
            {
                "name": "abc",
                "when": "2024-02-29",
                "n": 4,
                "even": 8,
                "x": 2.5,
                "tags": ["a", "b"],
                "mode": None,
                "fixed": {"k": [1, "x"]},
                "opt": {"a/b": True, "m~n": 3},
                "open": {"k": "v", "elsewhere": 1},
                "strange": "s",
                "untyped": {"q": 1},
                "anything": {"z": [1]},
                "choice": "ab",
                "grid": [[1, 2], [3]],
                "flags": [True],
                "none": [],
                "typed_enum": "on",
            }
        ],
    ),
    "refs": (
        REFS,
        [
            {
                "box": {"min": {"x": 1, "y": 2, "label": "a"}, "max": {"x": 3, "y": 4}},
                "points": [{"x": 0, "y": 0}, {"x": 1, "y": 1, "label": "abc"}],
                "tag": "t",
                "tree": {"name": "r", "children": [{"name": "c", "children": [{"name": "d"}]}]},
                "maybe": {"x": 1, "y": 1},
                "described": "d",
            }
        ],
    ),
    "root_ref": (ROOT_REF, [{"name": "a", "next": {"name": "b"}}]),
}

WALKED = sorted(set(SCHEMAS) - {"root_ref"})


def property_names(schema: Any) -> list[str]:
    names: set[str] = set()
    for _, node in iter_subschemas(schema):
        if isinstance(node, dict) and isinstance(node.get("properties"), dict):
            names.update(node["properties"])
    return sorted(names)


# --- instances: valid ones, mutated where it hurts ----------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**6), max_value=10**6)
    | st.sampled_from([0, 1, -1, 2, 9, 10, 65536, 2**53 - 1, -(2**53 - 1)])
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer())
    | st.sampled_from([0.5, -0.5, 2.5, 1e-9])
    | st.text(max_size=5)
    | st.sampled_from(
        ["", "a", "abc", "ABC", "a-b", "x" * 300, "2024-02-29", "2024-13-01", "/x", "TCP", "SCTP"]
    )
)


def json_values(keys: list[str]) -> st.SearchStrategy[Any]:
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(keys), inner, max_size=3)
        ),
        max_leaves=6,
    )


def places(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    found = [(path, value)]
    if isinstance(value, dict):
        for key, item in value.items():
            found += places(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += places(item, (*path, index))
    return found


def replace_at(instance: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    node = instance
    for token in path[:-1]:
        node = node[token]
    node[path[-1]] = value
    return instance


@st.composite
def mutated(draw: st.DrawFn, schema: Any, seeds: list[Any]) -> Any:
    keys = [*property_names(schema), "zz", "a/b", "m~n", "", "~1", "dry_run"]
    values = json_values(keys)
    instance = copy.deepcopy(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, 4))):
        path, node = draw(st.sampled_from(places(instance)))
        op = draw(st.sampled_from(["replace", "delete", "add", "append", "empty"]))
        if op == "delete" and isinstance(node, dict) and node:
            del node[draw(st.sampled_from(sorted(node)))]
        elif op == "add" and isinstance(node, dict):
            node[draw(st.sampled_from(keys))] = draw(values)
        elif op == "append" and isinstance(node, list):
            node.append(copy.deepcopy(draw(st.sampled_from(node))) if node else draw(values))
        elif op == "empty" and isinstance(node, dict | list):
            node.clear()
        else:
            instance = replace_at(instance, path, draw(values))
    return instance


FAST_PATH = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))


@FAST_PATH
@given(data=st.data(), name=st.sampled_from(sorted(SCHEMAS)))
def test_fast_path_deviations_are_the_slow_paths(data: st.DataObject, name: str) -> None:
    schema, seeds = SCHEMAS[name]
    instance = data.draw(mutated(schema, seeds))
    raw = msgspec.json.encode(instance)
    expected = slow(schema, raw)
    assert check(schema, raw) == expected
    assert check(schema, instance) == expected
    assert slow(schema, instance) == expected


@pytest.mark.parametrize("name", WALKED)
def test_the_fast_path_judges_these_schemas(name: str) -> None:
    schema, _ = SCHEMAS[name]
    plan = checker._compiled(schema, None).plan
    assert plan is not None and not plan.opaque
    assert checker._compiled(ROOT_REF, None).plan is None


def test_the_bench_instances_need_no_error_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the schema-only texts are known, the bench's invalid instances are judged
    without a single jsonschema-rs error: that is what the fast path is for."""
    checker.clear_cache()
    cases = []
    for case, (declared, _, make_invalid) in gates.CASES.items():
        schema = closed(copy.deepcopy(declared))
        raw = json.dumps(make_invalid(), separators=(",", ":")).encode()
        first = check(schema, raw)
        assert first == slow(schema, raw) and len(first) == 5, case
        cases.append((schema, raw, first))

    def no_errors(*args: Any) -> None:
        raise AssertionError("a jsonschema-rs error was asked for")

    monkeypatch.setattr(checker._Part, "translate", no_errors)
    monkeypatch.setattr(checker, "_slow", no_errors)
    for schema, raw, first in cases:
        assert check(schema, raw) == first


def test_a_part_is_compiled_once_per_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    checker.clear_cache()
    compiled: list[Any] = []
    real = checker._prepare.compile_schema

    def counting(schema: Any, **kwargs: Any) -> Any:
        compiled.append(schema)
        return real(schema, **kwargs)

    monkeypatch.setattr(checker._prepare, "compile_schema", counting)
    schema, (_, invalid) = _bench_case("typical")
    raw = msgspec.json.encode(invalid)
    first = check(schema, raw)
    parts = len(compiled)
    assert parts > 0
    assert check(schema, raw) == first
    assert check(schema, msgspec.json.decode(raw)) == first
    assert len(compiled) == parts
    checker.clear_cache()


def test_only_the_most_recent_plans_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    checker.clear_cache()
    monkeypatch.setattr(checker, "PLAN_CACHE_SIZE", 1)
    small, (_, small_invalid) = _bench_case("small")
    typical, (_, typical_invalid) = _bench_case("typical")
    expected = {id(small): slow(small, small_invalid), id(typical): slow(typical, typical_invalid)}
    for _ in range(2):
        for schema, instance in ((small, small_invalid), (typical, typical_invalid)):
            assert check(schema, instance) == expected[id(schema)]
            assert checker._compiled(schema, None)._plan is not None
    # The other schema's plan was let go, and is built again when next needed.
    assert checker._compiled(small, None)._plan is None
    assert check(small, small_invalid) == expected[id(small)]
    assert checker._compiled(typical, None)._plan is None
    checker.clear_cache()
    assert checker._planned == {}


EDGES = [
    # Found by the random schemas below; each is judged as jsonschema-rs judges it.
    # A definition that negates itself means nothing: not walked at all.
    (
        {
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/t"}, "b": {"type": "string"}},
            "$defs": {"t": {"not": {"$ref": "#/$defs/t"}}},
        },
        {"a": None, "b": None},
        False,
    ),
    # A definition that is only a reference to itself.
    (
        {"type": "object", "items": {"$ref": "#/$defs/t"}, "$defs": {"t": {"$ref": "#/$defs/t"}}},
        [None],
        False,
    ),
    # A closed object without properties: its members are one false schema at the object.
    (
        {"type": "object", "properties": {"o": {"type": "object", "additionalProperties": False}}},
        {"o": {"a": 1, "b": None}},
        True,
    ),
    # A closed object requiring a name it does not declare: missing even when present.
    (
        {
            "type": "object",
            "properties": {
                "o": {"properties": {}, "required": ["a"], "additionalProperties": False}
            },
        },
        {"o": {"a": None}},
        True,
    ),
]


@pytest.mark.parametrize(("schema", "instance", "walked"), EDGES)
def test_edges_the_walk_leaves_to_jsonschema_rs(schema: Any, instance: Any, walked: bool) -> None:
    assert check(schema, instance) == slow(schema, instance)
    plan = checker._compiled(schema, None).plan
    assert (plan is not None) is walked


def test_a_float_with_a_zero_fraction_takes_the_slow_path() -> None:
    # The integer-token rule lives in the strict validator only: 3.0 is not an integer.
    schema, (valid, _) = _bench_case("small")
    instance = dict(valid, depth=3.0, zz=1)
    deviations = check(schema, msgspec.json.encode(instance))
    assert [(d.pointer, d.kind, d.expected) for d in deviations] == [
        ("/depth", "wrong_type", "integer"),
        ("/zz", "extra_field", "no such property"),
    ]


def test_duplicate_members_and_walked_deviations_together() -> None:
    schema, _ = _bench_case("small")
    raw = b'{"path": "a", "path": "b", "encoding": "utf-16", "zz": 1}'
    deviations = check(schema, raw)
    assert deviations == slow(schema, raw)
    assert [(d.pointer, d.kind) for d in deviations] == [
        ("/encoding", "enum_mismatch"),
        ("/path", "extra_field"),
        ("/zz", "extra_field"),
    ]


def test_a_part_that_will_not_compile_alone_leaves_the_slow_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checker.clear_cache()
    schema, (_, invalid) = _bench_case("typical")
    expected = slow(schema, invalid)

    def refuse(schema: Any, **kwargs: Any) -> Any:
        raise checker.jsonschema_rs.ValidationError(
            "no",
            "no",
            [],
            [],
            [],
            None,
            None,  # type: ignore[arg-type]
        )

    monkeypatch.setattr(checker._prepare, "compile_schema", refuse)
    monkeypatch.setattr(checker, "compile_schema", checker.compile_schema)
    assert check(schema, invalid) == expected
    assert checker._compiled(schema, None).plan is None  # not tried again
    checker.clear_cache()


# --- the input rules, found from the bytes ------------------------------------------------------


def nest(depth: int, inner: bytes = b"1") -> bytes:
    return b'[{"k": ' * depth + inner + b"}]" * depth


@pytest.mark.parametrize("inner", [b"1", b'"]]]]"', b'"[[[["', b'"\\\\"', b'"\\"[\\""', b'""'])
def test_nesting_from_the_bytes_agrees_with_the_walk(inner: bytes) -> None:
    # 32 [{ pairs are 64 levels; a string's brackets and escaped quotes are not structure.
    for depth, too_deep in ((32, False), (33, True)):
        raw = nest(depth, inner)
        instance = msgspec.json.decode(raw)
        assert checker._too_deep(instance) is too_deep
        assert checker._nests_too_deep(raw) in (None, too_deep)
        [*deviations] = check({}, raw)
        assert bool(deviations) is too_deep
        if too_deep:
            assert "nested deeper" in deviations[0].expected


def test_strings_without_brackets_are_judged_from_the_bytes_alone() -> None:
    assert checker._nests_too_deep(nest(33, b'"a\\"b\\\\"')) is True
    assert checker._nests_too_deep(nest(32, b'"a\\"b\\\\"')) is False
    assert checker._nests_too_deep(nest(33, b'"]"')) is None  # left to the walk


keys = st.text(alphabet='[]{}"\\ab', max_size=3)
bracketed = st.recursive(
    st.none() | st.integers(-5, 5) | st.text(alphabet='[]{}"\\ab', max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(value=bracketed, depth=st.integers(0, 70))
def test_nesting_from_the_bytes_never_disagrees(value: Any, depth: int) -> None:
    for _ in range(depth):
        value = [value]
    raw = msgspec.json.encode(value)
    assert checker._nests_too_deep(raw) in (None, checker._too_deep(value))


@pytest.mark.parametrize("raw", [b'{"n": 1e17}', b'{"n": -2e16}', b"[9.007199254740992e15]"])
def test_integral_floats_beyond_2_53_are_not_usable_json(raw: bytes) -> None:
    # As the input layer says: RFC 8785 writes 1e17 as the integer 100000000000000000.
    [deviation] = check({}, raw)
    assert deviation.actual_type == "invalid_json" and "2^53" in deviation.expected
    assert check({}, b'{"n": 1e21}') == check({}, b'{"n": 9007199254740991.0}') == []


def test_a_long_run_of_digits_still_finds_big_integers() -> None:
    [deviation] = check({}, b'{"a": "1234567890123456", "n": 12345678901234567}')
    assert deviation.pointer == "/n" and deviation.actual_type == "invalid_json"
    assert check({}, b'{"a": "1234567890123456"}') == []
    assert MAX_DEPTH == 64


# --- random schemas of the shapes the fast path walks, and of some it does not -----------------

NAMES = ["a", "b", "c/d", "e~f", ""]

value_keywords = st.fixed_dictionaries(
    {},
    optional={
        "minimum": st.sampled_from([0, 1.5, -3]),
        "exclusiveMaximum": st.sampled_from([10, 2.5]),
        "multipleOf": st.sampled_from([2, 0.5]),
        "minLength": st.sampled_from([1, 3]),
        "maxLength": st.sampled_from([2, 4]),
        "pattern": st.sampled_from(["^[a-c]*$", "x"]),
        "format": st.sampled_from(["date", "email"]),
        "enum": st.sampled_from([["a", 1, None], [[1], {"k": 1}]]),
        "const": st.sampled_from(["a", 2, {"k": [True]}]),
        "minItems": st.just(1),
        "maxItems": st.just(2),
        "uniqueItems": st.booleans(),
        "minProperties": st.just(1),
        "maxProperties": st.just(2),
        "title": st.just("t"),
    },
)
types = st.sampled_from(
    ["string", "integer", "number", "boolean", "null", ["integer", "null"], ["string", "object"]]
)


def leaf_schemas() -> st.SearchStrategy[Any]:
    typed = st.builds(lambda t, kw: {"type": t, **kw}, types, value_keywords)
    return typed | value_keywords | st.booleans()


@st.composite
def object_schemas(draw: st.DrawFn, children: st.SearchStrategy[Any], root: bool = False) -> Any:
    size = (1, 4) if root else (0, 3)
    properties = draw(
        st.dictionaries(st.sampled_from(NAMES), children, min_size=size[0], max_size=size[1])
    )
    schema: dict[str, Any] = {"properties": properties}
    kind = draw(st.sampled_from(["object", ["object", "null"], None, "string"]))
    if kind is not None and not root:
        schema["type"] = kind
    names = draw(st.lists(st.sampled_from(NAMES), max_size=2, unique=True))
    if names:
        schema["required"] = names
    closing = draw(st.sampled_from([False, True, None]))
    if closing is not None:
        schema["additionalProperties"] = closing
    return {**schema, **draw(value_keywords)}


def extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    arrays = st.builds(
        lambda items, kw: {"type": "array", "items": items, **kw}, children, value_keywords
    )
    references = st.sampled_from(
        [
            {"$ref": "#/$defs/thing"},
            {"$ref": "#/$defs/word"},
            {"$ref": "#/$defs/thing", "title": "x"},
        ]
    )
    opaque = st.builds(lambda a, b: {"anyOf": [a, b]}, children, children) | st.builds(
        lambda a: {"not": a}, children
    )
    return object_schemas(children) | arrays | references | opaque


subschemas = st.recursive(leaf_schemas(), extend, max_leaves=8)
random_schemas = st.builds(
    lambda root, thing, word: {**root, "type": "object", "$defs": {"thing": thing, "word": word}},
    object_schemas(subschemas, root=True),
    st.recursive(leaf_schemas(), extend, max_leaves=5),
    leaf_schemas(),
)


def has_empty_name(value: Any) -> bool:
    return any(isinstance(v, dict) and "" in v for _, v in places(value))


@st.composite
def shaped(draw: st.DrawFn, schema: Any, defs: dict[str, Any], depth: int = 0) -> Any:
    """An instance that follows ``schema``'s shape (members, items, references), with
    scalars from anywhere: deviations deep down, not only at the root."""
    if isinstance(schema, dict) and depth < 6:
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return draw(shaped(defs[ref.rsplit("/", 1)[1]], defs, depth + 1))
        properties = schema.get("properties")
        if isinstance(properties, dict) and draw(st.integers(0, 4)):
            value = {}
            for name, sub in properties.items():
                if draw(st.integers(0, 3)):
                    value[name] = draw(shaped(sub, defs, depth + 1))
            if not draw(st.integers(0, 3)):
                value[draw(st.sampled_from([*NAMES, "zz"]))] = draw(scalars)
            return value
        if "items" in schema and draw(st.integers(0, 4)):
            count = draw(st.integers(0, 3))
            return [draw(shaped(schema["items"], defs, depth + 1)) for _ in range(count)]
    return draw(json_values([*NAMES, "zz"]))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), declared=random_schemas, close=st.booleans())
def test_random_schemas_fast_and_slow_agree(
    data: st.DataObject, declared: Any, close: bool
) -> None:
    if check_schema(declared):
        return  # not a schema registration would take
    schema = normalise_closed(declared) if close else declared
    instance = data.draw(shaped(schema, schema["$defs"]))
    raw = msgspec.json.encode(instance)
    expected = slow(schema, raw)
    deviations = check(schema, raw)
    assert check(schema, instance) == deviations
    if not has_empty_name(instance):
        assert deviations == expected
        return
    # jsonschema-rs 0.61 drops an empty member name from the paths it reports, so the
    # slow path (and the fast path where it hands a part to jsonschema-rs) can point at
    # the parent: only the verdict is the same (test_an_empty_member_name_is_pointed_at).
    assert bool(deviations) == bool(expected)


def test_an_empty_member_name_is_pointed_at() -> None:
    schema = {"type": "object", "properties": {"x": {"properties": {"": {"type": "integer"}}}}}
    [deviation] = check(schema, b'{"x": {"": "s"}}')
    assert (deviation.pointer, deviation.actual_type) == ("/x/", "string")
    assert deviation.schema_pointer == "/properties/x/properties//type"
    # What jsonschema-rs reports, translated: the parent object, and a schema pointer
    # that names no keyword. The fast path does not read it.
    [reported] = slow(schema, b'{"x": {"": "s"}}')
    assert (reported.pointer, reported.actual_type) == ("/x", "object")
