"""Schema registration helpers: meta-schema problems with their pointers, local-only
references, closing objects (normalise_closed), digests and prepare_schema."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest

from commands.schemas.prepare import (
    META_SCHEMA_URI,
    InvalidSchemaError,
    PreparedSchema,
    SchemaProblem,
    check_schema,
    normalise_closed,
    prepare_schema,
    schema_sha256,
)
from ledger.errors import LedgerError

# Seed 002: the fusion_validate input contract, as its docs give it (already closed).
FUSION_VALIDATE: dict[str, Any] = {
    "additionalProperties": False,
    "properties": {
        "acceptanceCriteria": {
            "items": {"minLength": 1, "type": "string"},
            "minItems": 1,
            "type": "array",
        },
        "background": {"items": {"minLength": 1, "type": "string"}, "type": "array"},
        "changeSummary": {"minLength": 1, "type": "string"},
        "exclusions": {"items": {"minLength": 1, "type": "string"}, "type": "array"},
        "knownLimitations": {"items": {"minLength": 1, "type": "string"}, "type": "array"},
        "objective": {"minLength": 1, "type": "string"},
        "scope": {"items": {"minLength": 1, "type": "string"}, "minItems": 1, "type": "array"},
        "verification": {
            "additionalProperties": False,
            "properties": {
                "evidence": {
                    "items": {
                        "additionalProperties": False,
                        "properties": {
                            "check": {"minLength": 1, "type": "string"},
                            "outcome": {"minLength": 1, "type": "string"},
                        },
                        "required": ["check", "outcome"],
                        "type": "object",
                    },
                    "type": "array",
                },
                "reason": {"minLength": 1, "type": "string"},
                "status": {"enum": ["provided", "not_run"], "type": "string"},
            },
            "required": ["status"],
            "type": "object",
        },
    },
    "required": [
        "acceptanceCriteria",
        "background",
        "changeSummary",
        "objective",
        "scope",
        "verification",
    ],
    "type": "object",
}


def pointers(schema: Any) -> list[str]:
    return [p.pointer for p in check_schema(schema)]


# --- check_schema ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema",
    [
        True,
        False,
        {},
        {"type": "object", "properties": {"a": {"type": ["integer", "null"]}}},
        {"$schema": META_SCHEMA_URI, "type": "string", "format": "date-time"},
        {"$defs": {"x": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/x"}}},
        {"properties": {"a": {"$ref": "#"}}},
        {"$defs": {"x": {"$anchor": "thing", "type": "string"}}, "items": {"$ref": "#thing"}},
        {"$defs": {"a b": {"type": "string"}}, "items": {"$ref": "#/$defs/a%20b"}},
        {"$defs": {"a/b": {"type": "string"}}, "items": {"$ref": "#/$defs/a~1b"}},
        FUSION_VALIDATE,
    ],
)
def test_valid_schemas_have_no_problems(schema: Any) -> None:
    assert check_schema(schema) == []
    jsonschema.Draft202012Validator.check_schema(schema)  # the oracle agrees


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "strng"}, ["/type"]),
        ({"properties": {"a": {"type": "intger"}}}, ["/properties/a/type"]),
        ({"items": {"minimum": "3"}}, ["/items/minimum"]),
        ({"properties": {"a": {"items": {"required": "x"}}}}, ["/properties/a/items/required"]),
        ({"$defs": {"x": {"minLength": -1}}}, ["/$defs/x/minLength"]),
        ({"anyOf": [{"type": "string"}, {"enum": 5}]}, ["/anyOf/1/enum"]),
        ({"required": ["a", "a"]}, ["/required"]),
        ({"properties": {"a/b": {"type": 5}}}, ["/properties/a~1b/type"]),
    ],
)
def test_invalid_schema_problems_point_into_the_schema(schema: Any, expected: list[str]) -> None:
    assert pointers(schema) == expected
    # The oracle finds a problem at the same place.
    oracle = jsonschema.Draft202012Validator(jsonschema.Draft202012Validator.META_SCHEMA)
    oracle_pointers = {
        "".join("/" + str(t).replace("~", "~0").replace("/", "~1") for t in e.absolute_path)
        for e in oracle.iter_errors(schema)
    }
    assert set(expected) <= oracle_pointers
    assert check_schema(schema)[0].message


def test_every_problem_is_reported_not_only_the_first() -> None:
    schema = {"type": "strng", "properties": {"a": {"type": "intger"}, "b": {"minimum": "x"}}}
    assert sorted(pointers(schema)) == ["/properties/a/type", "/properties/b/minimum", "/type"]


@pytest.mark.parametrize("schema", [5, "object", [], None, 1.5])
def test_a_schema_is_an_object_or_a_boolean(schema: Any) -> None:
    assert pointers(schema) == [""]


def test_a_schema_must_be_json() -> None:
    assert pointers({"minimum": float("nan")}) == [""]
    assert pointers({1: {}}) == [""]


@pytest.mark.parametrize(
    ("schema", "pointer"),
    [
        ({"$ref": "https://example.com/schema.json"}, "/$ref"),
        ({"$ref": "other.json#/x"}, "/$ref"),
        ({"$ref": "other.json"}, "/$ref"),
        ({"properties": {"a": {"$ref": "http://example.com/a#/b"}}}, "/properties/a/$ref"),
        ({"items": {"$dynamicRef": "https://example.com/meta#meta"}}, "/items/$dynamicRef"),
        ({"allOf": [{"$ref": "file:///etc/passwd"}]}, "/allOf/0/$ref"),
        ({"$id": "https://example.com/tool.json", "type": "object"}, "/$id"),
        ({"$defs": {"x": {"$id": "x.json"}}}, "/$defs/x/$id"),
        ({"$ref": "#/$defs/missing"}, "/$ref"),
        ({"$ref": "#nowhere"}, "/$ref"),
        ({"properties": {"a": {}}, "items": {"$ref": "#/properties"}}, "/items/$ref"),
        # draft-03 is not accepted (every draft since draft-04 is: test_schema_drafts.py)
        ({"$schema": "http://json-schema.org/draft-03/schema#"}, "/$schema"),
        # one document is one draft
        (
            {"items": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "string"}},
            "/items/$schema",
        ),
    ],
)
def test_references_stay_inside_the_document(schema: dict[str, Any], pointer: str) -> None:
    problems = check_schema(schema)
    assert [p.pointer for p in problems] == [pointer]


def test_a_property_named_ref_is_not_a_reference() -> None:
    assert check_schema({"properties": {"$ref": {"type": "string"}}}) == []


def test_what_only_compiling_finds_is_reported_with_its_pointer() -> None:
    assert pointers({"properties": {"a": {"pattern": "("}}}) == ["/properties/a/pattern"]
    (problem,) = check_schema({"items": {"format": "no-such-format"}})
    assert problem.pointer == "/items/format"
    assert "no-such-format" in problem.message


def test_invalid_schema_error_names_the_first_pointer_and_carries_all() -> None:
    with pytest.raises(InvalidSchemaError) as info:
        prepare_schema({"properties": {"a": {"type": "intger"}, "b": {"$ref": "x.json"}}})
    error = info.value
    assert isinstance(error, LedgerError)
    assert [p.pointer for p in error.problems] == ["/properties/a/type", "/properties/b/$ref"]
    message = str(error)
    assert "/properties/a/type" in message and "\n" not in message
    assert all(isinstance(p, SchemaProblem) for p in error.problems)


def test_a_closed_object_that_requires_an_undeclared_property_is_refused() -> None:
    with pytest.raises(InvalidSchemaError) as info:
        prepare_schema({"type": "object", "properties": {"a": {}}, "required": ["a", "b"]})
    assert [p.pointer for p in info.value.problems] == ["/required/1"]
    # Opening it explicitly is the author's way out.
    prepare_schema({"type": "object", "required": ["b"], "additionalProperties": True})


# --- normalise_closed -------------------------------------------------------------------------

F = False
OBJ = {"type": "object"}
# An empty properties list comes with the closing: each extra member is then its own
# extra_field deviation (test_schema_drafts.py).
CLOSED_OBJ = {"type": "object", "additionalProperties": F, "properties": {}}

NORMALISATION_CASES: list[tuple[str, Any, Any]] = [
    ("bare object", OBJ, CLOSED_OBJ),
    (
        "type list with object",
        {"type": ["object", "null"]},
        {"type": ["object", "null"], "additionalProperties": F, "properties": {}},
    ),
    (
        "properties without type",
        {"properties": {"a": {}}},
        {"properties": {"a": {}}, "additionalProperties": F},
    ),
    (
        "required without type",
        {"required": []},
        {"required": [], "additionalProperties": F, "properties": {}},
    ),
    ("not an object", {"type": "string", "minLength": 1}, {"type": "string", "minLength": 1}),
    ("no type at all", {"minimum": 1}, {"minimum": 1}),
    ("booleans", True, True),
    (
        "nested objects",
        {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": OBJ}}}},
        {
            "type": "object",
            "properties": {
                "a": {"type": "object", "properties": {"b": CLOSED_OBJ}, "additionalProperties": F}
            },
            "additionalProperties": F,
        },
    ),
    (
        "arrays of objects",
        {"type": "array", "items": {"properties": {"k": {}}}, "prefixItems": [OBJ]},
        {
            "type": "array",
            "items": {"properties": {"k": {}}, "additionalProperties": F},
            "prefixItems": [CLOSED_OBJ],
        },
    ),
    (
        "schema-valued additionalProperties, contains, propertyNames",
        {"type": "object", "additionalProperties": OBJ, "properties": {"l": {"contains": OBJ}}},
        {
            "type": "object",
            "additionalProperties": CLOSED_OBJ,
            "properties": {"l": {"contains": CLOSED_OBJ}},
        },
    ),
    (
        "explicitly open: additionalProperties true",
        {"type": "object", "additionalProperties": True},
        {"type": "object", "additionalProperties": True},
    ),
    (
        "explicitly open: additionalProperties schema",
        {"type": "object", "additionalProperties": {"type": "string"}},
        {"type": "object", "additionalProperties": {"type": "string"}},
    ),
    (
        "explicitly open: patternProperties",
        {"type": "object", "patternProperties": {"^x-": OBJ}},
        {"type": "object", "patternProperties": {"^x-": CLOSED_OBJ}},
    ),
    (
        "explicitly open: unevaluatedProperties",
        {"type": "object", "unevaluatedProperties": True},
        {"type": "object", "unevaluatedProperties": True},
    ),
    (
        "$defs are closed where they are used",
        {
            "$defs": {"d": {"type": "object", "properties": {"n": OBJ}}},
            "type": "object",
            "properties": {"x": {"$ref": "#/$defs/d"}},
        },
        {
            "$defs": {"d": {"type": "object", "properties": {"n": CLOSED_OBJ}}},
            "type": "object",
            "properties": {"x": {"$ref": "#/$defs/d", "unevaluatedProperties": F}},
            "additionalProperties": F,
        },
    ),
    (
        "$ref to a non-object definition stays as it is",
        {"$defs": {"s": {"type": "string"}}, "items": {"$ref": "#/$defs/s"}},
        {"$defs": {"s": {"type": "string"}}, "items": {"$ref": "#/$defs/s"}},
    ),
    (
        "allOf members are parts: the composing parent is closed",
        {"type": "object", "allOf": [{"properties": {"a": {}}}, {"properties": {"b": OBJ}}]},
        {
            "type": "object",
            "allOf": [{"properties": {"a": {}}}, {"properties": {"b": CLOSED_OBJ}}],
            "unevaluatedProperties": F,
        },
    ),
    (
        "anyOf alternatives without a typed parent",
        {"anyOf": [{"type": "object", "properties": {"a": {}}}, {"type": "string"}]},
        {
            "anyOf": [{"type": "object", "properties": {"a": {}}}, {"type": "string"}],
            "unevaluatedProperties": F,
        },
    ),
    (
        "oneOf of scalars is not an object",
        {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    ),
    (
        "if/then/else: then and else are parts",
        {
            "type": "object",
            "properties": {"k": {}},
            "if": {"properties": {"k": {"const": 1}}},
            "then": {"required": ["k"]},
        },
        {
            "type": "object",
            "properties": {"k": {}},
            "if": {"properties": {"k": {"const": 1}}},
            "then": {"required": ["k"]},
            "unevaluatedProperties": F,
        },
    ),
    (
        "not is left alone (closing it would loosen the schema)",
        {"type": "object", "properties": {"a": {}}, "not": {"properties": {"b": OBJ}}},
        {
            "type": "object",
            "properties": {"a": {}},
            "not": {"properties": {"b": OBJ}},
            "additionalProperties": F,
        },
    ),
    (
        "a parent that opens itself keeps its parts open",
        {"type": "object", "additionalProperties": True, "allOf": [{"properties": {"a": {}}}]},
        {"type": "object", "additionalProperties": True, "allOf": [{"properties": {"a": {}}}]},
    ),
    (
        "data keywords are not schemas",
        {"type": "string", "enum": [{"type": "object"}], "default": {"properties": {}}},
        {"type": "string", "enum": [{"type": "object"}], "default": {"properties": {}}},
    ),
    (
        "a property named like a keyword",
        {"type": "object", "properties": {"properties": OBJ, "items": OBJ}},
        {
            "type": "object",
            "properties": {"properties": CLOSED_OBJ, "items": CLOSED_OBJ},
            "additionalProperties": F,
        },
    ),
    ("seed 002's contract is already closed", FUSION_VALIDATE, FUSION_VALIDATE),
]


@pytest.mark.parametrize(
    ("schema", "expected"),
    [(s, e) for _, s, e in NORMALISATION_CASES],
    ids=[name for name, _, _ in NORMALISATION_CASES],
)
def test_normalise_closed(schema: Any, expected: Any) -> None:
    before = copy.deepcopy(schema)
    result = normalise_closed(schema)
    assert result == expected
    assert schema == before  # the input is not mutated
    assert normalise_closed(result) == result  # idempotent
    assert check_schema(result) == []


def test_normalised_shares_nothing_with_the_input() -> None:
    schema = {"type": "object", "properties": {"a": {"enum": [[1]], "type": "array"}}}
    result = normalise_closed(schema)
    result["properties"]["a"]["enum"][0].append(2)
    assert schema["properties"]["a"]["enum"] == [[1]]


def test_allof_closing_accepts_the_composition_and_rejects_extras() -> None:
    schema = normalise_closed(
        {
            "$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer"}}}},
            "type": "object",
            "allOf": [{"$ref": "#/$defs/base"}, {"properties": {"name": {"type": "string"}}}],
        }
    )
    oracle = jsonschema.Draft202012Validator(schema)
    assert oracle.is_valid({"id": 1, "name": "n"})  # siblings' properties are not rejected
    assert not oracle.is_valid({"id": 1, "name": "n", "extra": True})


# --- digests and prepare_schema ---------------------------------------------------------------


def test_sha256_is_stable_under_key_order() -> None:
    a = {"type": "object", "properties": {"x": {"type": "integer", "minimum": 1}, "y": {}}}
    b = {"properties": {"y": {}, "x": {"minimum": 1, "type": "integer"}}, "type": "object"}
    assert schema_sha256(a) == schema_sha256(b)
    assert len(schema_sha256(a)) == 64
    assert schema_sha256(a) != schema_sha256({**a, "required": ["x"]})
    assert schema_sha256(True) != schema_sha256(False)


def test_prepare_schema() -> None:
    declared = {"type": "object", "properties": {"a": {"type": "integer"}}}
    prepared = prepare_schema(declared)
    assert isinstance(prepared, PreparedSchema)
    assert prepared.declared == declared
    assert prepared.normalised == {**declared, "additionalProperties": False}
    assert prepared.sha256 == schema_sha256(prepared.normalised)
    assert prepare_schema(dict(reversed(declared.items()))).sha256 == prepared.sha256
