"""Every JSON Schema draft real tool servers declare (draft-04, 06, 07, 2019-09, 2020-12):
chosen by the root ``$schema``, checked against its own meta-schema, translated to
2020-12 and gated with the same strictness; and what closing makes impossible is
refused at registration whichever keyword demands it (docs/json-schema.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from commands.plane import Plane
from commands.plane.gates import gate_input
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool
from commands.schemas import checker
from commands.schemas.checker import check
from commands.schemas.prepare import (
    META_SCHEMA_URI,
    InvalidSchemaError,
    PreparedSchema,
    check_schema,
    normalise_closed,
    prepare_schema,
)
from ledger.events.gates import Deviation

DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT6 = "http://json-schema.org/draft-06/schema#"
DRAFT7 = "http://json-schema.org/draft-07/schema#"
DRAFT2019 = "https://json-schema.org/draft/2019-09/schema"
DRAFT2020 = "https://json-schema.org/draft/2020-12/schema"
OLD_DRAFTS = [DRAFT4, DRAFT6, DRAFT7]  # where $ref ignores its siblings
DRAFTS = [*OLD_DRAFTS, DRAFT2019, DRAFT2020]

# How @modelcontextprotocol/server-filesystem declares read_file (zod-to-json-schema).
FILESYSTEM_READ_FILE: dict[str, Any] = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
    "additionalProperties": False,
    "$schema": DRAFT7,
}


def prepared(schema: Any) -> PreparedSchema:
    result = prepare_schema(schema)
    # Whatever was declared, what is closed, digested and checked is valid 2020-12.
    assert check_schema(result.normalised) == []
    assert result.declared == schema
    return result


def gate(schema: Any, instance: Any) -> list[tuple[str, str]]:
    """The deviations of ``instance`` (as JSON bytes, as a gate gets it), by pointer and
    kind; the fast path and the slow one agree on them."""
    normalised = prepared(schema).normalised
    data = json.dumps(instance).encode()
    deviations = check(normalised, data)
    assert deviations == checker._check(normalised, data, None, fast=False)
    return [(d.pointer, d.kind) for d in deviations]


def problems(schema: Any) -> list[tuple[str, str]]:
    with pytest.raises(InvalidSchemaError) as info:
        prepare_schema(schema)
    return [(p.pointer, p.message) for p in info.value.problems]


def pointers(schema: Any) -> list[str]:
    return [pointer for pointer, _ in problems(schema)]


# --- which draft ----------------------------------------------------------------------------


def _spellings(uri: str) -> list[str]:
    rest = uri.rstrip("#").split("://", 1)[1]
    return [f"{scheme}://{rest}{tail}" for scheme in ("http", "https") for tail in ("", "#")]


@pytest.mark.parametrize("uri", [s for uri in DRAFTS for s in _spellings(uri)])
def test_every_spelling_of_every_draft_registers(uri: str) -> None:
    declared = {"$schema": uri, "type": "object", "properties": {"n": {"type": "integer"}}}
    result = prepared(declared)
    assert result.declared["$schema"] == uri  # stored as declared
    assert result.normalised["$schema"].startswith(META_SCHEMA_URI)  # 2020-12, closed
    assert result.normalised["additionalProperties"] is False
    assert gate(declared, {"n": "1", "x": 0}) == [("/n", "wrong_type"), ("/x", "extra_field")]


def test_without_schema_a_document_is_2020_12() -> None:
    # 2019-09's tuple form of items is an error in 2020-12, where items is one schema.
    assert pointers({"items": [{"type": "string"}]}) == ["/items"]
    assert prepared({"$schema": DRAFT2019, "items": [{"type": "string"}]})
    # A 2020-12 schema is closed as it always was: nothing added, the digest unchanged.
    declared = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert prepare_schema(declared).normalised == normalise_closed(declared)
    assert "$schema" not in prepare_schema(declared).normalised


@pytest.mark.parametrize(
    "uri",
    [
        "http://json-schema.org/draft-03/schema#",
        "http://json-schema.org/schema#",  # "the latest": no draft in particular
        "https://example.com/my-meta-schema",
        "draft-07",
        7,
    ],
)
def test_any_other_schema_uri_is_refused(uri: Any) -> None:
    ((pointer, message),) = problems({"$schema": uri, "type": "string"})
    assert pointer == "/$schema"
    assert DRAFT7 in message and DRAFT2020 in message  # it says what is accepted


def test_one_document_is_one_draft() -> None:
    # Restating the document's draft inside it is harmless; naming another is refused.
    same = {"$schema": DRAFT7, "properties": {"a": {"$schema": DRAFT7 + "", "type": "string"}}}
    assert "$schema" not in prepared(same).normalised["properties"]["a"]
    other = {"$schema": DRAFT7, "properties": {"a": {"$schema": DRAFT2020}}}
    assert pointers(other) == ["/properties/a/$schema"]


# --- each draft against its own meta-schema -----------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "pointer"),
    [
        # Each is valid 2020-12 (an unknown keyword, a boolean schema, a number), and
        # refused by its own draft's rules.
        # draft-04 has no boolean schemas, and its exclusive bounds are booleans
        ({"$schema": DRAFT4, "properties": {"a": True}}, "/properties/a"),
        ({"$schema": DRAFT4, "maximum": 3, "exclusiveMaximum": 3}, "/exclusiveMaximum"),
        ({"$schema": DRAFT6, "additionalItems": 5}, "/additionalItems"),
        ({"$schema": DRAFT7, "definitions": {"a": 5}}, "/definitions/a"),
        ({"$schema": DRAFT2019, "$recursiveRef": 5}, "/$recursiveRef"),
    ],
)
def test_a_schema_is_checked_against_its_own_drafts_meta_schema(
    schema: dict[str, Any], pointer: str
) -> None:
    assert pointers(schema) == [pointer]


def test_problems_found_after_the_translation_point_into_the_declared_schema() -> None:
    # The format is found unknown in the translated document (prefixItems/0), but
    # reported where the author wrote it.
    assert pointers({"$schema": DRAFT7, "items": [{"format": "no-such-format"}]}) == [
        "/items/0/format"
    ]
    assert pointers({"$schema": DRAFT4, "dependencies": {"a": {"$ref": "other.json"}}}) == [
        "/dependencies/a/$ref"
    ]
    assert pointers(
        {"$schema": DRAFT2019, "items": [{}], "additionalItems": {"format": "no-such-format"}}
    ) == ["/additionalItems/format"]


# --- the translations -----------------------------------------------------------------------------


def test_filesystem_read_file_as_the_official_server_declares_it() -> None:
    assert gate(FILESYSTEM_READ_FILE, {"path": "/etc/hosts"}) == []
    assert gate(FILESYSTEM_READ_FILE, {"path": 5, "mode": "r"}) == [
        ("/mode", "extra_field"),
        ("/path", "wrong_type"),
    ]
    assert gate(FILESYSTEM_READ_FILE, {}) == [("/path", "missing_required")]


def test_a_draft_07_tool_registers_and_its_input_gate_reports_every_deviation(
    sqlite_url: str,
) -> None:
    with Plane.open(sqlite_url) as plane:
        register_tool(
            plane,
            {
                "name": "read_file",
                "command": ["cat", "{path}"],
                "input_schema": FILESYSTEM_READ_FILE,
            },
        )
        create_plan(plane, "P-1", project="fs", resources=["repo:fs"])
        record_strategy(plane, "P-1", "read a file")
        enter_execute(plane, "P-1")
        outcome = gate_input(plane, "P-1", "read_file", b'{"path": 5, "mode": "r"}')
        assert not outcome.passed
        assert [(d.pointer, d.kind) for d in outcome.check.deviations] == [
            ("/mode", "extra_field"),
            ("/path", "wrong_type"),
        ]
        assert gate_input(plane, "P-1", "read_file", b'{"path": "/etc/hosts"}').passed


@pytest.mark.parametrize(("bound", "keyword"), [("maximum", "Maximum"), ("minimum", "Minimum")])
def test_draft_04_boolean_exclusive_bounds(bound: str, keyword: str) -> None:
    sign = 1 if bound == "maximum" else -1
    exclusive = {"$schema": DRAFT4, "type": "number", bound: 5 * sign, "exclusive" + keyword: True}
    assert prepared(exclusive).normalised == {
        "$schema": META_SCHEMA_URI,
        "type": "number",
        "exclusive" + keyword: 5 * sign,
    }
    assert gate(exclusive, 5 * sign) == [("", "constraint")]
    assert gate(exclusive, 4.5 * sign) == []
    # false is the inclusive bound, as if it were not written
    inclusive = {**exclusive, "exclusive" + keyword: False}
    assert gate(inclusive, 5 * sign) == []
    assert gate(inclusive, 6 * sign) == [("", "constraint")]


@pytest.mark.parametrize("uri", [DRAFT4, DRAFT6, DRAFT7, DRAFT2019])
def test_the_tuple_form_of_items(uri: str) -> None:
    tuple_of = {
        "$schema": uri,
        "type": "array",
        "items": [{"type": "string"}, {"type": "integer"}],
        "additionalItems": {"type": "boolean"},
    }
    normalised = prepared(tuple_of).normalised
    assert normalised["prefixItems"] == [{"type": "string"}, {"type": "integer"}]
    assert normalised["items"] == {"type": "boolean"}
    assert gate(tuple_of, ["a", 1, True, False]) == []
    assert gate(tuple_of, [1, "a", "b"]) == [
        ("/0", "wrong_type"),
        ("/1", "wrong_type"),
        ("/2", "wrong_type"),
    ]
    closed = {**tuple_of, "additionalItems": False}
    assert gate(closed, ["a", 1]) == [] and gate(closed, ["a", 1, 2]) != []
    # Beside a single items schema (or none), additionalItems is ignored by these drafts.
    single = {"$schema": uri, "items": {"type": "integer"}, "additionalItems": False}
    assert gate(single, [1, 2, 3]) == []
    assert "additionalItems" not in prepared(single).normalised


@pytest.mark.parametrize("uri", [DRAFT4, DRAFT6, DRAFT7, DRAFT2019])
def test_dependencies(uri: str) -> None:
    schema = {
        "$schema": uri,
        "type": "object",
        "properties": {"card": {}, "billing": {}, "amount": {"type": "number"}},
        "dependencies": {
            "card": ["billing"],
            "amount": {"properties": {"amount": {"minimum": 1}}},
        },
    }
    normalised = prepared(schema).normalised
    assert normalised["dependentRequired"] == {"card": ["billing"]}
    assert normalised["dependentSchemas"] == {"amount": {"properties": {"amount": {"minimum": 1}}}}
    assert gate(schema, {"card": 1, "billing": 2, "amount": 5}) == []
    assert gate(schema, {"card": 1}) == [("/billing", "missing_required")]
    assert gate(schema, {"amount": 0}) == [("/amount", "constraint")]
    assert gate(schema, {"amount": 5, "other": 1}) == [("/other", "extra_field")]


@pytest.mark.parametrize("uri", OLD_DRAFTS)
def test_before_2019_09_the_siblings_of_ref_are_ignored(uri: str) -> None:
    schema = {
        "$schema": uri,
        "definitions": {"name": {"type": "string"}},
        "properties": {"n": {"$ref": "#/definitions/name", "maxLength": 2, "type": "integer"}},
    }
    assert prepared(schema).normalised["properties"]["n"] == {"$ref": "#/definitions/name"}
    assert gate(schema, {"n": "a long name"}) == []
    assert gate(schema, {"n": 1}) == [("/n", "wrong_type")]


def test_from_2019_09_the_siblings_of_ref_apply() -> None:
    schema = {
        "$schema": DRAFT2019,
        "$defs": {"name": {"type": "string"}},
        "properties": {"n": {"$ref": "#/$defs/name", "maxLength": 2}},
    }
    assert gate(schema, {"n": "ab"}) == []
    assert gate(schema, {"n": "a long name"}) == [("/n", "constraint")]


def test_2019_09_recursive_references_in_one_document() -> None:
    tree = {
        "$schema": DRAFT2019,
        "$recursiveAnchor": True,
        "type": "object",
        "properties": {
            "value": {"type": "integer"},
            "children": {"type": "array", "items": {"$recursiveRef": "#"}},
        },
        "required": ["value"],
    }
    normalised = prepared(tree).normalised
    assert "$recursiveAnchor" not in normalised
    assert normalised["properties"]["children"]["items"]["$ref"] == "#"
    assert gate(tree, {"value": 1, "children": [{"value": 2, "children": []}]}) == []
    assert gate(tree, {"value": 1, "children": [{"children": [{"value": "x", "y": 0}]}]}) == [
        ("/children/0/children/0/value", "wrong_type"),
        ("/children/0/children/0/y", "extra_field"),
        ("/children/0/value", "missing_required"),
    ]


def test_2019_09_translations_beside_the_keyword_they_become_are_kept_apart() -> None:
    # Both apply, as they did: the translated one goes into an appended allOf part.
    schema = {
        "$schema": DRAFT2019,
        "$defs": {"small": {"maximum": 9}, "int": {"type": "integer"}},
        "$ref": "#/$defs/small",
        "$recursiveRef": "#/$defs/int",
        "allOf": [{"minimum": 0}],
    }
    normalised = prepared(schema).normalised
    assert normalised["allOf"] == [{"minimum": 0}, {"$ref": "#/$defs/int"}]
    assert gate(schema, 5) == []
    assert gate(schema, 10) == [("", "constraint")]
    assert gate(schema, 5.5) == [("", "wrong_type")]
    assert gate(schema, -1) == [("", "constraint")]
    both = {
        "$schema": DRAFT2019,
        "type": "object",
        "properties": {"a": {}, "b": {}, "c": {}},
        "dependentRequired": {"a": ["b"]},
        "dependencies": {"a": ["c"]},
    }
    assert gate(both, {"a": 1}) == [("/b", "missing_required"), ("/c", "missing_required")]
    # A problem in the appended part is reported where the author wrote it.
    remote = {"$schema": DRAFT2019, "$ref": "#", "$recursiveRef": "https://example.com/s"}
    assert pointers(remote) == ["/$recursiveRef"]


@pytest.mark.parametrize(
    ("schema", "target"),
    [
        (
            {"$schema": DRAFT7, "items": [{"type": "string"}, {"$ref": "#/items/0"}]},
            "#/prefixItems/0",
        ),
        (
            {
                "$schema": DRAFT7,
                "items": [{}],
                "additionalItems": {"type": "string"},
                "properties": {"p": {"$ref": "#/additionalItems"}},
            },
            "#/items",
        ),
        (
            {
                "$schema": DRAFT4,
                "dependencies": {"a": {"properties": {"b": {"type": "string"}}}},
                "properties": {"p": {"$ref": "#/dependencies/a/properties/b"}},
            },
            "#/dependentSchemas/a/properties/b",
        ),
    ],
)
def test_references_through_renamed_keywords_follow_them(schema: Any, target: str) -> None:
    normalised = prepared(schema).normalised
    refs = [n["$ref"] for n in _nodes(normalised) if "$ref" in n]
    assert refs == [target]


def _nodes(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        return [value] + [n for v in value.values() for n in _nodes(v)]
    if isinstance(value, list):
        return [n for v in value for n in _nodes(v)]
    return []


def test_draft_04_id() -> None:
    # id is draft-04's $id: refused the same way, and named as the author wrote it.
    ((pointer, message),) = problems({"$schema": DRAFT4, "id": "http://example.com/s.json"})
    assert pointer == "/id" and message.startswith("id names a resource outside the document")
    assert pointers({"$schema": DRAFT4, "definitions": {"a": {"id": "a.json"}}}) == [
        "/definitions/a/id"
    ]
    assert prepared({"$schema": DRAFT4, "id": "#", "type": "string"})
    # A plain-name fragment names a location, as $anchor does since 2019-09.
    named = {
        "$schema": DRAFT4,
        "definitions": {"port": {"id": "#port", "type": "integer"}},
        "properties": {"p": {"$ref": "#port"}},
    }
    assert prepared(named).normalised["definitions"]["port"]["$anchor"] == "port"
    assert gate(named, {"p": "80"}) == [("/p", "wrong_type")]


@pytest.mark.parametrize(
    ("schema", "instance"),
    [
        ({"$schema": DRAFT4, "properties": {"a": {"const": 1}}}, {"a": 2}),
        ({"$schema": DRAFT6, "properties": {"a": {"if": True, "then": False}}}, {"a": 2}),
        ({"$schema": DRAFT7, "properties": {"a": {"dependentRequired": {"a": ["b"]}}}}, {"a": {}}),
        ({"$schema": DRAFT2019, "items": [{"type": "integer"}], "prefixItems": [False]}, [1]),
    ],
)
def test_keywords_the_declared_draft_does_not_define_have_no_effect(
    schema: Any, instance: Any
) -> None:
    assert gate(schema, instance) == []


@pytest.mark.parametrize("uri", DRAFTS)
def test_every_draft_is_gated_as_strictly(uri: str) -> None:
    schema = {
        "$schema": uri,
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "o": {"type": "object", "properties": {"k": {"type": "string"}}},
        },
    }
    assert gate(schema, {"n": 1.0, "o": {"k": "v", "x": None}, "y": "5"}) == [
        ("/n", "wrong_type"),  # 1.0 is not an integer token
        ("/o/x", "extra_field"),  # nested objects are closed
        ("/y", "extra_field"),
    ]
    assert gate(schema, {"n": "1"}) == [("/n", "wrong_type")]  # nothing coerced


# --- registration gaps ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object"},
        {"type": "object", "additionalProperties": False},
        {"$schema": DRAFT7, "type": "object"},
        {"type": "object", "properties": {"o": {"type": "object"}}},
    ],
)
def test_each_member_of_a_closed_object_without_properties_is_its_own_extra_field(
    schema: Any,
) -> None:
    nested = "properties" in schema
    instance = {"o": {"a": 1, "b": [2]}} if nested else {"a": 1, "b": [2]}
    prefix = "/o" if nested else ""
    assert gate(schema, instance) == [
        (prefix + "/a", "extra_field"),
        (prefix + "/b", "extra_field"),
    ]
    normalised = prepared(schema).normalised
    deviations = check(normalised, json.dumps(instance).encode())
    assert [d.actual_type for d in deviations] == ["integer", "array"]
    assert all(isinstance(d, Deviation) and d.expected == "no such property" for d in deviations)


@pytest.mark.parametrize(
    ("schema", "pointer"),
    [
        pytest.param({"required": ["x"]}, "/required/0", id="required, no properties"),
        pytest.param(
            {"type": "object", "properties": {"a": {}}, "dependentRequired": {"a": ["x"]}},
            "/dependentRequired/a/0",
            id="dependentRequired",
        ),
        pytest.param(
            {"$schema": DRAFT7, "properties": {"a": {}}, "dependencies": {"a": ["x"]}},
            "/dependencies/a/0",
            id="draft-07 dependencies",
        ),
        pytest.param(
            {"type": "object", "properties": {"a": {}}, "allOf": [{"required": ["x"]}]},
            "/allOf/0/required/0",
            id="allOf part",
        ),
        pytest.param(
            {"properties": {"a": {}}, "anyOf": [{"required": ["a"]}, {"required": ["x"]}]},
            "/anyOf/1/required/0",
            id="anyOf alternative",
        ),
        pytest.param(
            {"properties": {"a": {}}, "if": {"required": ["a"]}, "then": {"required": ["x"]}},
            "/then/required/0",
            id="then",
        ),
        pytest.param(
            {"properties": {"a": {}}, "dependentSchemas": {"a": {"required": ["x"]}}},
            "/dependentSchemas/a/required/0",
            id="dependentSchemas",
        ),
        pytest.param(
            {
                "$defs": {"base": {"type": "object", "required": ["x"]}},
                "properties": {"p": {"$ref": "#/$defs/base"}},
            },
            "/$defs/base/required/0",
            id="through a $ref",
        ),
        pytest.param(
            {"type": "object", "properties": {"a": {}}, "minProperties": 2},
            "/minProperties",
            id="minProperties beyond the declared",
        ),
        pytest.param(
            {"type": "object", "propertyNames": {"maxLength": 3}, "minProperties": 1},
            "/minProperties",
            id="propertyNames and minProperties",
        ),
        pytest.param(
            {"properties": {"long": {}}, "propertyNames": {"maxLength": 3}, "required": ["long"]},
            "/required/0",
            id="propertyNames forbids a required member",
        ),
        pytest.param(
            {"properties": {"a": False}, "required": ["a"]},
            "/required/0",
            id="a false property required",
        ),
        pytest.param(
            {"type": "object", "properties": {"a": {}}, "const": {"a": 1, "x": 2}},
            "/const",
            id="const",
        ),
        pytest.param(
            {"type": "object", "properties": {"a": {}}, "enum": [{"a": 1}, {"x": 2}]},
            "/enum/1",
            id="enum",
        ),
    ],
)
def test_a_demand_the_closed_object_forbids_is_refused(schema: Any, pointer: str) -> None:
    assert pointers(schema) == [pointer]


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param(
            {"type": "object", "properties": {"a": {}}, "dependentRequired": {"x": ["y"]}},
            id="a trigger the object forbids never fires",
        ),
        pytest.param(
            {"properties": {"a": {}}, "not": {"required": ["x"]}}, id="not is not a demand"
        ),
        pytest.param(
            {"properties": {"a": {}}, "if": {"required": ["x"]}, "then": {"required": ["a"]}},
            id="if is a condition",
        ),
        pytest.param(
            {"allOf": [{"properties": {"x": {}}}, {"required": ["x"]}]},
            id="declared by a sibling part",
        ),
        pytest.param(
            {"type": "object", "patternProperties": {"^x": {}}, "required": ["x1"]},
            id="allowed by a pattern",
        ),
        pytest.param(
            {"type": "object", "required": ["x"], "additionalProperties": True},
            id="opened explicitly",
        ),
        pytest.param(
            {"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 2},
            id="minProperties within the declared",
        ),
    ],
)
def test_demands_the_closed_object_can_meet_register(schema: Any) -> None:
    assert prepared(schema)
