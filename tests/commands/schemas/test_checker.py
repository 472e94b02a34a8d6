"""The strict structural checker (seed 003): every deviation, one per offending field,
nothing coerced, dropped or filled, and no instance value ever copied out."""

from __future__ import annotations

import copy
import math
import types
from typing import Any

import hypothesis.internal.conjecture.utils as conjecture_utils
import hypothesis_jsonschema._from_schema as hjs_from_schema
import jsonschema
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from commands.schemas import checker
from commands.schemas.checker import check, json_type
from commands.schemas.prepare import (
    InvalidSchemaError,
    normalise_closed,
    prepare_schema,
    schema_sha256,
)
from ledger.events.gates import Deviation
from ledger.intake import InputError, check_json_value
from tests.commands.schemas.test_schemas import FUSION_VALIDATE

SECRET = "hunter2-SECRET-TOKEN"


class _LegacyMany:
    """hypothesis-jsonschema 0.23 (the latest) draws object members with the old
    ``many(...).more()`` loop; newer Hypothesis made ``many`` a context manager and
    iterator. This adapter drives the new one through the old interface, for
    hypothesis-jsonschema only (Hypothesis itself keeps using its own ``many``)."""

    _DONE = object()

    def __init__(self, data: Any, **kwargs: Any) -> None:
        self._many = conjecture_utils.many(data, **kwargs)
        self._many.__enter__()
        self._elements = iter(self._many)

    def more(self) -> bool:
        if next(self._elements, self._DONE) is self._DONE:
            self._many.__exit__(None, None, None)
            return False
        return True

    def reject(self, why: str | None = None) -> None:
        self._many.reject(why)


if not hasattr(conjecture_utils.many, "more"):
    hjs_from_schema.cu = types.SimpleNamespace(many=_LegacyMany)  # type: ignore[attr-defined]


def closed(schema: Any) -> Any:
    return prepare_schema(schema).normalised


def summary(deviations: list[Deviation]) -> list[tuple[str, str]]:
    return [(d.pointer, d.kind) for d in deviations]


PERSON = closed(
    {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "string"},
            "c": {"type": "boolean"},
        },
        "required": ["a", "b"],
    }
)

VALID_FUSION = {
    "objective": "check the fix",
    "background": ["a bug"],
    "changeSummary": "fixed it",
    "scope": ["src/"],
    "acceptanceCriteria": ["tests pass"],
    "verification": {"status": "provided", "evidence": [{"check": "pytest", "outcome": "ok"}]},
}


# --- seed 003's table: the plane's column -----------------------------------------------------


@pytest.mark.parametrize("as_bytes", [True, False])
@pytest.mark.parametrize(
    ("instance", "expected"),
    [
        # Extra field in output: failure, recorded (not silently dropped).
        ({"a": 1, "b": "x", "extra": 1}, [("/extra", "extra_field")]),
        # Missing required field: failure, recorded (not null-filled, not passed through).
        ({"a": 1}, [("/b", "missing_required")]),
        # Wrong scalar type: failure, recorded (not coerced if plausible).
        ({"a": "5", "b": "x"}, [("/a", "wrong_type")]),
        ({"a": 1, "b": 5}, [("/b", "wrong_type")]),
        ({"a": 1, "b": "x", "c": "true"}, [("/c", "wrong_type")]),
        ({"a": 1, "b": "x", "c": 1}, [("/c", "wrong_type")]),
    ],
)
def test_seed_003_deviation_is_failure(
    instance: dict[str, Any], expected: list[tuple[str, str]], as_bytes: bool
) -> None:
    before = copy.deepcopy(instance)
    given_value = msgspec.json.encode(instance) if as_bytes else instance
    assert summary(check(PERSON, given_value)) == expected
    assert instance == before  # nothing dropped, filled or coerced in place


def test_a_conforming_instance_has_no_deviations() -> None:
    assert check(PERSON, {"a": 1, "b": "x"}) == []
    assert check(PERSON, b'{"a": 1, "b": "x", "c": false}') == []
    assert check(closed(FUSION_VALIDATE), msgspec.json.encode(VALID_FUSION)) == []


def test_deviation_fields() -> None:
    (extra,) = check(PERSON, {"a": 1, "b": "x", "extra": [1]})
    assert extra == Deviation(
        pointer="/extra",
        kind="extra_field",
        expected="no such property",
        actual_type="array",
        schema_pointer="/additionalProperties",
    )
    (missing,) = check(PERSON, {"a": 1})
    assert missing == Deviation(
        pointer="/b",
        kind="missing_required",
        expected="required string",
        actual_type="absent",
        schema_pointer="/required",
    )
    (wrong,) = check(PERSON, {"a": "5", "b": "x"})
    assert wrong == Deviation(
        pointer="/a",
        kind="wrong_type",
        expected="integer",
        actual_type="string",
        schema_pointer="/properties/a/type",
    )


def test_every_deviation_not_only_the_first() -> None:
    deviations = check(PERSON, {"a": "5", "c": None, "d": 1, "e": {}})
    assert summary(deviations) == [
        ("/a", "wrong_type"),
        ("/b", "missing_required"),
        ("/c", "wrong_type"),
        ("/d", "extra_field"),
        ("/e", "extra_field"),
    ]


def test_two_extra_fields_are_two_deviations() -> None:
    deviations = check(PERSON, {"a": 1, "b": "x", "c": True, "d": 1, "e": "y"})
    assert summary(deviations) == [("/d", "extra_field"), ("/e", "extra_field")]
    assert [d.actual_type for d in deviations] == ["integer", "string"]


# --- pointers ---------------------------------------------------------------------------------

NESTED = closed(
    {
        "type": "object",
        "properties": {
            "list": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"a/b": {"type": "integer"}, "m~n": {"type": "string"}},
                    "required": ["a/b"],
                },
            },
        },
    }
)


def test_nested_pointers_with_indexes_and_escaping() -> None:
    instance = {"list": [{"a/b": 1}, {"a/b": "x", "m~n": 2, "x/~y": 0}, {"m~n": "ok"}]}
    assert summary(check(NESTED, instance)) == [
        ("/list/1/a~1b", "wrong_type"),
        ("/list/1/m~0n", "wrong_type"),
        ("/list/1/x~1~0y", "extra_field"),
        ("/list/2/a~1b", "missing_required"),
    ]
    schema_pointers = [d.schema_pointer for d in check(NESTED, instance)]
    assert schema_pointers[0] == "/properties/list/items/properties/a~1b/type"
    assert schema_pointers[3] == "/properties/list/items/required"


def test_pointers_resolve_to_the_offending_values() -> None:
    instance = {"list": [{"a/b": "x", "m~n": 2, "x/~y": 0}]}
    for deviation in check(NESTED, instance):
        if deviation.kind != "missing_required":
            tokens = [
                t.replace("~1", "/").replace("~0", "~") for t in deviation.pointer[1:].split("/")
            ]
            node: Any = instance
            for token in tokens:
                node = node[int(token)] if isinstance(node, list) else node[token]
            assert json_type(node) == deviation.actual_type


# --- no coercion ---------------------------------------------------------------------------------

INTEGER = closed({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})


@pytest.mark.parametrize(
    ("raw", "actual"),
    [
        (b'{"n": "5"}', "string"),
        (b'{"n": true}', "boolean"),
        (b'{"n": 1.0}', "number"),
        (b'{"n": 1e2}', "number"),
        (b'{"n": -0.0}', "number"),
        (b'{"n": 1.5}', "number"),
        (b'{"n": null}', "null"),
        (b'{"n": [5]}', "array"),
    ],
)
def test_no_coercion_to_integer(raw: bytes, actual: str) -> None:
    (deviation,) = check(INTEGER, raw)
    assert (deviation.pointer, deviation.kind, deviation.expected) == (
        "/n",
        "wrong_type",
        "integer",
    )
    assert deviation.actual_type == actual
    assert deviation.schema_pointer == "/properties/n/type"


@pytest.mark.parametrize("raw", [b'{"n": 5}', b'{"n": -0}', b'{"n": 9007199254740991}'])
def test_integer_tokens_are_integers(raw: bytes) -> None:
    assert check(INTEGER, raw) == []


@pytest.mark.parametrize(
    "raw",
    [
        b'{"n": 9007199254740992}',
        b'{"n": -9007199254740992}',
        b'{"n": 123456789012345678901234567890}',
    ],
)
def test_integers_beyond_2_53_are_not_usable_json(raw: bytes) -> None:
    # No JSON reader is bound to represent them exactly: the gate judges them, at /n.
    [deviation] = check(INTEGER, raw)
    assert (deviation.pointer, deviation.actual_type) == ("/n", "invalid_json")
    assert "2^53" in deviation.expected


@pytest.mark.parametrize("depth", [65, 2_000, 200_000])
def test_nesting_beyond_the_cap_is_not_usable_json(depth: int) -> None:
    [deviation] = check({}, b"[" * depth + b"]" * depth)
    assert deviation.actual_type == "invalid_json" and "nested deeper" in deviation.expected
    assert check({}, b"[" * 64 + b"]" * 64) == []


def test_integer_token_rule_for_decoded_values_and_other_types() -> None:
    assert summary(check(INTEGER, {"n": 1.0})) == [("/n", "wrong_type")]
    assert check(INTEGER, {"n": 1}) == []
    number = {"type": "number"}
    assert check(number, b"1.0") == [] and check(number, b"1") == []
    nullable = {"type": ["integer", "null"]}
    assert [d.expected for d in check(nullable, b"2.0")] == ["integer or null"]
    assert check(nullable, b"null") == []
    either = {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert [(d.kind, d.expected) for d in check(either, b"2.0")] == [
        ("wrong_type", "integer or null")
    ]
    # Inside a composition the rule changes the verdict, not only the report.
    assert check({"not": {"type": "integer"}}, b"2.0") == []
    # An integral float reported once even when a bound also fails.
    assert summary(check({"type": "integer", "minimum": 5}, b"3.0")) == [("", "wrong_type")]


def test_integral_floats_are_numbers_where_numbers_are_declared() -> None:
    schema = closed(
        {"properties": {"id": {"type": "integer"}, "score": {"type": "number"}}, "required": ["id"]}
    )
    assert check(schema, b'{"id": 1, "score": 3.0}') == []
    assert check(schema, {"id": 1, "score": 3.0}) == []
    assert summary(check(schema, b'{"id": 1.0, "score": 3}')) == [("/id", "wrong_type")]


def test_null_is_not_a_missing_field_and_a_missing_field_is_not_null() -> None:
    (present_null,) = check(PERSON, {"a": 1, "b": None})
    assert (present_null.kind, present_null.actual_type) == ("wrong_type", "null")
    (absent,) = check(PERSON, {"a": 1})
    assert (absent.kind, absent.actual_type) == ("missing_required", "absent")
    nullable = closed({"properties": {"b": {"type": ["string", "null"]}}, "required": ["b"]})
    assert check(nullable, {"b": None}) == []
    assert summary(check(nullable, {})) == [("/b", "missing_required")]


# --- enum, const, constraints -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "instance", "kind", "expected"),
    [
        ({"enum": ["a", "b"]}, "c", "enum_mismatch", 'one of ["a","b"]'),
        ({"enum": [1, None]}, 2, "enum_mismatch", "one of [1,null]"),
        ({"const": "x"}, "y", "const_mismatch", 'equal to "x"'),
        ({"const": 1}, True, "const_mismatch", "equal to 1"),
        ({"minimum": 3}, 2, "constraint", ">= 3"),
        ({"maximum": 3}, 4, "constraint", "<= 3"),
        ({"exclusiveMinimum": 3}, 3, "constraint", "> 3"),
        ({"exclusiveMaximum": 3}, 3, "constraint", "< 3"),
        ({"multipleOf": 4}, 6, "constraint", "multiple of 4"),
        ({"minLength": 2}, "a", "constraint", "length >= 2"),
        ({"maxLength": 2}, "abc", "constraint", "length <= 2"),
        ({"pattern": "^[a-z]+$"}, "A1", "constraint", 'matching "^[a-z]+$"'),
        ({"format": "date-time"}, "yesterday", "constraint", "format date-time"),
        ({"format": "email"}, "nobody", "constraint", "format email"),
        ({"minItems": 2}, [1], "constraint", "at least 2 items"),
        ({"maxItems": 1}, [1, 2], "constraint", "at most 1 items"),
        ({"uniqueItems": True}, [1, 1], "constraint", "unique items"),
        ({"contains": {"type": "string"}}, [1], "constraint", "an item matching contains"),
        (
            {"minProperties": 1, "additionalProperties": True},
            {},
            "constraint",
            "at least 1 properties",
        ),
        ({"not": {"type": "string"}}, "s", "constraint", "not matching the schema under not"),
        (
            {"oneOf": [{"minimum": 0}, {"maximum": 10}]},
            5,
            "constraint",
            "exactly one matching alternative",
        ),
        (False, 1, "constraint", "no value allowed here"),
    ],
)
def test_kinds_and_expected_texts(schema: Any, instance: Any, kind: str, expected: str) -> None:
    (deviation,) = check(schema, instance)
    assert (deviation.pointer, deviation.kind, deviation.expected) == ("", kind, expected)
    assert deviation.actual_type == json_type(instance)


def test_a_wrong_type_is_reported_once_not_again_as_enum_or_constraint() -> None:
    schema = {"type": "string", "enum": ["a"], "minLength": 3}
    assert summary(check(schema, 5)) == [("", "wrong_type")]
    assert summary(check(schema, "zz")) == [("", "constraint"), ("", "enum_mismatch")]


def test_constraints_on_fields() -> None:
    schema = closed(
        {
            "properties": {
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "code": {"type": "string", "pattern": "^[A-Z]{3}$", "minLength": 3},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            },
        }
    )
    deviations = check(schema, {"age": 200, "code": "ab", "tags": []})
    assert [(d.pointer, d.expected) for d in deviations] == [
        ("/age", "<= 150"),
        ("/code", "length >= 3"),
        ("/code", 'matching "^[A-Z]{3}$"'),
        ("/tags", "at least 1 items"),
    ]


def test_false_subschemas_and_property_names() -> None:
    schema = {"type": "object", "properties": {"gone": False}, "additionalProperties": True}
    (deviation,) = check(schema, {"gone": 1})
    assert (deviation.pointer, deviation.kind) == ("/gone", "extra_field")
    (bad_name,) = check(
        {"type": "object", "propertyNames": {"maxLength": 3}, "additionalProperties": True},
        {"ok": 1, "toolong": 2},
    )
    assert (bad_name.pointer, bad_name.kind, bad_name.expected) == (
        "/toolong",
        "constraint",
        "property name length <= 3",
    )
    items = {"type": "array", "prefixItems": [{"type": "string"}], "items": False}
    assert summary(check(items, ["a", 1, 2])) == [("/1", "constraint"), ("/2", "constraint")]


# --- compositions and unevaluatedProperties ---------------------------------------------------

COMPOSED = closed(
    {
        "$defs": {
            "base": {
                "type": "object",
                "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
                "required": ["id"],
            }
        },
        "type": "object",
        "properties": {
            "item": {
                "allOf": [
                    {"$ref": "#/$defs/base"},
                    {"properties": {"flag": {"type": "boolean"}}},
                ]
            },
            "ref": {"$ref": "#/$defs/base"},
            "choice": {
                "type": "object",
                "anyOf": [
                    {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                    {"properties": {"b": {"type": "string"}}, "required": ["b"]},
                ],
            },
        },
    }
)


@pytest.mark.parametrize(
    ("instance", "expected"),
    [
        ({"item": {"id": 1, "name": "n", "flag": True}, "ref": {"id": 2}}, []),
        (
            {"item": {"id": 1, "x": 1, "y": 2}},
            [("/item/x", "extra_field"), ("/item/y", "extra_field")],
        ),
        ({"ref": {"id": 1, "q": 2}}, [("/ref/q", "extra_field")]),
        # The $ref fails on id: name and flag are declared, so not reported as extra.
        ({"item": {"id": "s", "name": "n", "flag": False}}, [("/item/id", "wrong_type")]),
        (
            {"ref": {"id": 1.5, "name": "n", "zz": 1}},
            [("/ref/id", "wrong_type"), ("/ref/zz", "extra_field")],
        ),
        ({"ref": {"name": "n"}}, [("/ref/id", "missing_required")]),
        ({"choice": {"a": 1}}, []),
        ({"choice": {"a": 1, "b": "x"}}, []),
        # Only the alternative that matched evaluated its properties.
        ({"choice": {"a": 1, "b": 2}}, [("/choice/b", "extra_field")]),
        ({"choice": {"a": "x", "c": 1}}, [("/choice", "constraint"), ("/choice/c", "extra_field")]),
    ],
)
def test_compositions(instance: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    deviations = check(COMPOSED, instance)
    assert summary(deviations) == expected
    assert (deviations == []) == jsonschema.Draft202012Validator(COMPOSED).is_valid(instance)


def test_recursive_schemas_through_ref() -> None:
    tree = closed(
        {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                    },
                    "required": ["name"],
                }
            },
            "$ref": "#/$defs/node",
        }
    )
    instance = {
        "name": "a",
        "children": [{"name": "b", "children": [{"name": "c", "x": 1}]}, {"nam": "d"}],
    }
    assert summary(check(tree, instance)) == [
        ("/children/0/children/0/x", "extra_field"),
        ("/children/1/nam", "extra_field"),
        ("/children/1/name", "missing_required"),
    ]
    assert check(tree, {"name": "a", "children": [{"name": "b", "children": []}]}) == []


# --- what never reaches the log ---------------------------------------------------------------


def test_instance_values_never_appear_in_deviations() -> None:
    schema = closed(
        {
            "properties": {
                "token": {"type": "integer"},
                "mode": {"enum": ["a", "b"]},
                "fixed": {"const": "c"},
                "code": {"type": "string", "pattern": "^x", "maxLength": 3, "format": "uuid"},
                "nested": {"type": "object", "properties": {}},
                "items": {"type": "array", "prefixItems": [{}], "unevaluatedItems": False},
                "alt": {"anyOf": [{"type": "integer"}, {"minLength": 100}]},
                "ok": {"type": "string"},
            },
            "required": ["ok"],
        }
    )
    instance = {
        "token": SECRET,
        "mode": SECRET,
        "fixed": SECRET,
        "code": SECRET,
        "nested": {"k": SECRET},
        "items": [SECRET, SECRET, {"s": SECRET}],
        "alt": SECRET,
        "extra": SECRET,
        "ok": [SECRET],
    }
    raw = msgspec.json.encode(instance)
    for given_value in (instance, raw, raw.replace(b'"extra"', b'"token"')):
        deviations = check(schema, given_value)
        assert len(deviations) >= 9
        encoded = msgspec.json.encode(deviations)
        assert SECRET.encode() not in encoded
        assert b"hunter2" not in encoded


def test_deviations_round_trip_as_event_data() -> None:
    deviations = check(PERSON, {"a": "5", "z": 1})
    decoded = msgspec.json.decode(msgspec.json.encode(deviations), type=list[Deviation])
    assert decoded == deviations


# --- bytes: invalid JSON and duplicate member names --------------------------------------------


@pytest.mark.parametrize("raw", [b"", b"{", b"{'a': 1}", b"NaN", b'{"n": 1e400}', b"\xff"])
def test_bytes_that_are_not_json(raw: bytes) -> None:
    assert check(PERSON, raw) == [
        Deviation(
            pointer="", kind="wrong_type", expected="a JSON document", actual_type="invalid_json"
        )
    ]


def test_a_duplicate_member_name_is_a_deviation() -> None:
    raw = b'{"a": 1, "b": "x", "a": "%s"}' % SECRET.encode()
    deviations = check(PERSON, raw)
    assert ("/a", "extra_field") in summary(deviations)
    assert SECRET.encode() not in msgspec.json.encode(deviations)
    nested = b'{"a": 1, "b": "x", "c": true, "d": [{"k": 1, "k": 2}]}'
    assert ("/d/0/k", "extra_field") in summary(check(PERSON, nested))
    # A compact document that re-encodes identically takes the fast path.
    assert check(PERSON, b'{"a":1,"b":"x"}') == []
    assert check(PERSON, b'{ "a" : 1 , "b" : "x:\\"a\\":" }') == []


def test_decoded_instances_must_be_json() -> None:
    with pytest.raises(ValueError):
        check(PERSON, {"a": math.nan, "b": "x"})
    with pytest.raises(TypeError):
        check(PERSON, {"a": {1, 2}, "b": "x"})
    with pytest.raises(TypeError):
        check(PERSON, {1: 1})


# --- schemas, cache and json_type ---------------------------------------------------------------


def test_boolean_schemas() -> None:
    assert check(True, b'{"anything": [1]}') == []
    assert summary(check(False, b"null")) == [("", "constraint")]


def test_an_uncompilable_schema_is_an_invalid_schema_error() -> None:
    with pytest.raises(InvalidSchemaError) as info:
        check({"properties": {"a": {"pattern": "("}}}, b"{}")
    assert info.value.problems[0].pointer == "/properties/a/pattern"


def test_validators_are_compiled_once_per_schema_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    checker.clear_cache()
    calls: list[Any] = []
    real = checker.compile_schema

    def counting(schema: Any, **kwargs: Any) -> Any:
        if kwargs.get("integer_tokens", True) is False:  # one plain compile per schema
            calls.append(schema)
        return real(schema, **kwargs)

    monkeypatch.setattr(checker, "compile_schema", counting)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    same = {"properties": {"a": {"type": "integer"}}, "type": "object"}
    for _ in range(3):
        check(schema, {"a": 1})
    check(same, {"a": "x"})
    check(schema, {"a": 1}, schema_sha256=schema_sha256(schema))
    assert len(calls) == 1
    # LRU: the least recently used digest is evicted first.
    monkeypatch.setattr(checker, "CACHE_SIZE", 2)
    check({"type": "string"}, "x")
    check({"type": "number"}, 1)
    check({"type": "string"}, "x")
    assert len(calls) == 3
    check(schema, {"a": 1})
    assert len(calls) == 4
    checker.clear_cache()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({}, "object"),
        ([], "array"),
        ((), "array"),
        ("", "string"),
        (0, "integer"),
        (1.0, "number"),
        (True, "boolean"),
        (None, "null"),
    ],
)
def test_json_type(value: Any, expected: str) -> None:
    assert json_type(value) == expected


def test_json_type_refuses_non_json() -> None:
    with pytest.raises(TypeError):
        json_type({1})


# --- property tests ---------------------------------------------------------------------------

PROPERTY_SCHEMAS: dict[str, Any] = {
    "fusion_validate": closed(FUSION_VALIDATE),
    "nested": closed(
        {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 0},
                "name": {"type": "string", "maxLength": 8},
                "score": {"type": "number"},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                "meta": {
                    "type": "object",
                    "properties": {
                        "a/b": {"type": "boolean"},
                        "m~n": {"type": ["integer", "null"]},
                        "inner": {
                            "type": "object",
                            "properties": {"level": {"type": "string", "enum": ["lo", "hi"]}},
                            "required": ["level"],
                        },
                    },
                    "required": ["a/b", "inner"],
                },
                "rows": {
                    "type": "array",
                    "maxItems": 3,
                    "items": {
                        "type": "object",
                        "properties": {"k": {"type": "string"}, "v": {"type": "integer"}},
                        "required": ["k", "v"],
                    },
                },
            },
            "required": ["id", "meta", "rows"],
        }
    ),
}

SCALAR_TYPES = {"string", "integer", "number", "boolean", "null"}


def locations(
    schema: Any, value: Any, path: tuple[Any, ...] = ()
) -> list[tuple[tuple[Any, ...], Any, Any]]:
    """(path, subschema, value) for every instance location, for schemas made of
    properties and items only."""
    found = [(path, schema, value)]
    if isinstance(value, dict):
        for key, item in value.items():
            found += locations(schema.get("properties", {}).get(key, {}), item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += locations(schema.get("items", {}), item, (*path, index))
    return found


def pointer(path: tuple[Any, ...]) -> str:
    return "".join("/" + str(t).replace("~", "~0").replace("/", "~1") for t in path)


def set_at(instance: Any, path: tuple[Any, ...], value: Any) -> None:
    node = instance
    for token in path[:-1]:
        node = node[token]
    node[path[-1]] = value


schema_names = st.sampled_from(sorted(PROPERTY_SCHEMAS))


def _within_input_rules(instance: Any) -> bool:
    try:
        check_json_value(instance, "instance")
    except InputError:
        return False
    return True


def usable(schema: Any) -> st.SearchStrategy[Any]:
    """Instances of ``schema`` an input may carry (integers within ±(2^53 - 1), ...)."""
    return from_schema(schema).filter(_within_input_rules)


FAST = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


@FAST
@given(data=st.data(), name=schema_names)
def test_generated_instances_pass(data: st.DataObject, name: str) -> None:
    schema = PROPERTY_SCHEMAS[name]
    instance = data.draw(usable(schema))
    assert check(schema, instance) == []
    assert check(schema, msgspec.json.encode(instance)) == []


@FAST
@given(data=st.data(), name=schema_names)
def test_one_unknown_field_at_any_object_depth(data: st.DataObject, name: str) -> None:
    schema = PROPERTY_SCHEMAS[name]
    instance = data.draw(usable(schema))
    objects = [(p, s) for p, s, v in locations(schema, instance) if isinstance(v, dict)]
    path, _ = data.draw(st.sampled_from(objects))
    field = data.draw(st.sampled_from(["zz", "x/y", "t~1", "", "extra field"]))
    node = instance
    for token in path:
        node = node[token]
    node[field] = data.draw(st.sampled_from([SECRET, 1, None, [], {}]))
    (deviation,) = check(schema, msgspec.json.encode(instance))
    assert (deviation.pointer, deviation.kind) == (pointer((*path, field)), "extra_field")


@FAST
@given(data=st.data(), name=schema_names)
def test_one_dropped_required_field(data: st.DataObject, name: str) -> None:
    schema = PROPERTY_SCHEMAS[name]
    instance = data.draw(usable(schema))
    candidates = [
        (p, key)
        for p, s, v in locations(schema, instance)
        if isinstance(v, dict)
        for key in s.get("required", [])
    ]
    path, key = data.draw(st.sampled_from(candidates))
    node = instance
    for token in path:
        node = node[token]
    del node[key]
    (deviation,) = check(schema, instance)
    assert (deviation.pointer, deviation.kind) == (pointer((*path, key)), "missing_required")
    assert deviation.actual_type == "absent"


OTHER_TYPED_VALUES = ["5", 5, 5.0, 5.5, True, None, [], {}]


def admitted(types: set[str], value: Any) -> bool:
    actual = json_type(value)
    return actual in types or (actual == "integer" and "number" in types)


@FAST
@given(data=st.data(), name=schema_names)
def test_one_scalar_of_another_type(data: st.DataObject, name: str) -> None:
    schema = PROPERTY_SCHEMAS[name]
    instance = data.draw(usable(schema))
    scalars = []
    for path, sub, value in locations(schema, instance):
        declared = sub.get("type")
        types = {declared} if isinstance(declared, str) else set(declared or [])
        if path and types and types <= SCALAR_TYPES and json_type(value) in SCALAR_TYPES:
            scalars.append((path, types))
    path, types = data.draw(st.sampled_from(scalars))
    replacement = data.draw(
        st.sampled_from([v for v in OTHER_TYPED_VALUES if not admitted(types, v)])
    )
    set_at(instance, path, replacement)
    (deviation,) = check(schema, msgspec.json.encode(instance))
    assert (deviation.pointer, deviation.kind) == (pointer(path), "wrong_type")
    assert deviation.actual_type == json_type(replacement)


# --- differential test against python-jsonschema -----------------------------------------------

DIFFERENTIAL_SCHEMAS: dict[str, Any] = {
    **PROPERTY_SCHEMAS,
    "composed": COMPOSED,
    "scalars": closed(
        {
            "type": "object",
            "properties": {
                "i": {"type": "integer", "minimum": -3, "maximum": 3},
                "n": {"type": ["number", "null"], "exclusiveMinimum": 0},
                "s": {"type": "string", "pattern": "^[a-c]*$", "minLength": 1},
                "e": {"enum": ["x", 1, None, [1]]},
                "c": {"const": {"k": [True]}},
                "u": {"type": "array", "uniqueItems": True, "items": {"type": "integer"}},
                "o": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
            },
        }
    ),
}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0.0, -0.0, 1.0, 3.0, 2.5])
    | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["i", "n", "s", "e", "c", "k", "id", "zz"]), inner, max_size=3
        )
    ),
    max_leaves=8,
)


@st.composite
def mutated(draw: st.DrawFn, schema: Any) -> Any:
    instance = draw(st.one_of(usable(schema), json_values))
    for _ in range(draw(st.integers(0, 2))):
        containers = [(p, v) for p, _, v in locations({}, instance) if isinstance(v, dict | list)]
        if not containers:
            break
        _, node = draw(st.sampled_from(containers))
        if isinstance(node, dict):
            if node and draw(st.booleans()):
                del node[draw(st.sampled_from(sorted(node)))]
            else:
                node[draw(st.sampled_from(["i", "s", "k", "id", "zz", "name"]))] = draw(json_values)
        elif node:
            node[draw(st.integers(0, len(node) - 1))] = draw(json_values)
        else:
            node.append(draw(json_values))
    return instance


def integral_float_at_integer(schema: Any, instance: Any, deviation: Deviation) -> bool:
    """The documented difference: an integral float where an integer is declared."""
    tokens = [t.replace("~1", "/").replace("~0", "~") for t in deviation.pointer.split("/")[1:]]
    node = instance
    for token in tokens:
        node = node[int(token)] if isinstance(node, list) else node[token]
    return (
        deviation.kind == "wrong_type"
        and "integer" in deviation.expected
        and type(node) is float
        and node.is_integer()
    )


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), name=st.sampled_from(sorted(DIFFERENTIAL_SCHEMAS)))
def test_verdicts_agree_with_python_jsonschema(data: st.DataObject, name: str) -> None:
    schema = DIFFERENTIAL_SCHEMAS[name]
    instance = data.draw(mutated(normalise_closed(schema)))
    deviations = check(schema, msgspec.json.encode(instance))
    oracle_valid = jsonschema.Draft202012Validator(schema).is_valid(instance)
    if oracle_valid and deviations:
        assert all(integral_float_at_integer(schema, instance, d) for d in deviations)
    else:
        assert (deviations == []) == oracle_valid
