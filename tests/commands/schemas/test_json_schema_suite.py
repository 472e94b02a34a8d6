"""The official JSON-Schema-Test-Suite through registration and the gate, for each of the
five drafts the ledger accepts (docs/json-schema.md).

Each group's schema is registered as a tool would declare it (``prepare_schema``; the
suite writes most schemas without ``$schema`` because its folder names the draft, so
the draft's ``$schema`` is added at the root where it is missing; a boolean schema cannot
carry one and means the same in every draft). Each case's data is checked against the
normalised schema as the gates check a call: JSON bytes through ``check``. The suite's
``valid`` must equal "no deviation".

Every disagreement is a deliberate departure listed in DEPARTURES with its category;
docs/json-schema.md ("Departures from the JSON-Schema-Test-Suite") says why each category
is deliberate. The test fails on a disagreement that is not listed, on a listed one that
no longer occurs (so the table stays exact), and on a listed one whose result is not what
its category says (a refusal for another reason, a deviation of another kind).

The suite is read in place from ../shared/peer-suites/JSON-Schema-Test-Suite (from the
project's root; never copied here). Without it the tests skip and say so.

Not run: each draft's ``optional/`` folder. It holds what the specifications leave to
each implementation (format assertion, numbers beyond 64 bits, regular-expression
dialects, content assertion, references into unknown keywords, mixing drafts). The
ledger makes its own documented choices there (docs/json-schema.md), so that folder
would only restate them as departures, and would test jsonschema-rs's own options more
than the ledger.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from commands.schemas.checker import check
from commands.schemas.drafts import META_SCHEMA_URIS, Draft
from commands.schemas.prepare import InvalidSchemaError, SchemaProblem, prepare_schema
from ledger.events.gates import Deviation
from tests.helpers import REPO

SUITE = REPO.parent / "shared" / "peer-suites" / "JSON-Schema-Test-Suite"

# The suite's folder of each draft, and the short names the table uses.
FOLDERS: dict[str, tuple[str, Draft]] = {
    "4": ("draft4", Draft.DRAFT4),
    "6": ("draft6", Draft.DRAFT6),
    "7": ("draft7", Draft.DRAFT7),
    "2019": ("draft2019-09", Draft.DRAFT2019_09),
    "2020": ("draft2020-12", Draft.DRAFT2020_12),
}
DRAFT_OF_FOLDER = {folder: draft for folder, draft in FOLDERS.values()}

# --- the categories (docs/json-schema.md says why each is deliberate) ------------------------

# Registration refuses the group's schema; every problem it reports is of the kind named.
SELF_CONTAINED = "refused: not self-contained"
META_SCHEMA = "refused: custom meta-schema"
BIG_INTEGER = "refused: integer beyond +-(2^53 - 1)"
CLOSED_DEMAND = "refused: closing forbids a demanded member"
# The suite calls the case valid; the gate fails it, with these deviations only.
CLOSED = "closed objects"
CLOSED_PART = "closed objects in a composition"
INTEGER_TOKEN = "integer tokens"
FORMAT = "formats asserted"

_EXTERNAL = re.compile(
    r"refers outside the document|names a resource outside the document|changes the base URI"
)


def _self_contained(problems: list[SchemaProblem]) -> bool:
    # A reference into a resource that an $id names does not resolve once the $id is
    # refused: it goes with an external problem, never alone.
    messages = [p.message for p in problems]
    return any(_EXTERNAL.search(m) for m in messages) and all(
        _EXTERNAL.search(m) or "does not resolve" in m for m in messages
    )


def _every(pattern: str) -> Callable[[list[SchemaProblem]], bool]:
    return lambda problems: all(re.search(pattern, p.message) for p in problems)


REFUSALS: dict[str, Callable[[list[SchemaProblem]], bool]] = {
    SELF_CONTAINED: _self_contained,
    META_SCHEMA: _every(r"^\$schema .* names no draft the checker accepts"),
    BIG_INTEGER: _every(r"outside the interoperable range"),
    CLOSED_DEMAND: _every(r"closed object"),
}

_COMPOSITIONS = ("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas")


def _composition_failed(d: Deviation) -> bool:
    return d.kind == "constraint" and d.schema_pointer.rsplit("/", 1)[-1] in _COMPOSITIONS


FAILURES: dict[str, Callable[[Deviation], bool]] = {
    CLOSED: lambda d: d.kind == "extra_field",
    CLOSED_PART: lambda d: d.kind == "extra_field" or _composition_failed(d),
    INTEGER_TOKEN: lambda d: d.kind == "wrong_type" and d.expected == "integer",
    FORMAT: lambda d: d.kind == "constraint" and d.expected.startswith("format "),
}

# --- the departures -----------------------------------------------------------------------------

# (drafts, file, group description, case description, category): drafts are short names
# from FOLDERS ("*" for all five); no case description means the whole group (registration
# refused its schema).
# One departure per line, as the suite words it: the table is data, so the formatter
# keeps off it and its lines may be as long as the suite's descriptions.
# ruff: noqa: E501
# fmt: off
DEPARTURES: list[tuple[str, str, str, str | None, str]] = [
    # Refused at registration: not one self-contained document (a $ref outside it, an $id
    # or id that changes the base URI, and the references into such resources).
    ("2019 2020", "anchor.json", "Location-independent identifier with absolute URI", None, SELF_CONTAINED),
    ("2019 2020", "anchor.json", "Location-independent identifier with base URI change in subschema", None, SELF_CONTAINED),
    ("2019 2020", "anchor.json", "same $anchor with different base uri", None, SELF_CONTAINED),
    ("4 6 7", "definitions.json", "validate definition against metaschema", None, SELF_CONTAINED),
    ("2019 2020", "defs.json", "validate definition against metaschema", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "$dynamicRef avoids the root of each schema, but scopes are still registered", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "$dynamicRef skips over intermediate resources - direct reference", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "$ref and $dynamicAnchor are independent of order - $defs first", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "$ref and $dynamicAnchor are independent of order - $ref first", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "$ref to $dynamicRef finds detached $dynamicAnchor", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "A $dynamicRef resolves to the first $dynamicAnchor still in scope that is encountered when the schema is evaluated", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "A $dynamicRef that initially resolves to a schema with a matching $dynamicAnchor resolves to the first $dynamicAnchor in the dynamic scope", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "A $dynamicRef that initially resolves to a schema without a matching $dynamicAnchor behaves like a normal $ref to $anchor", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "A $dynamicRef to a $dynamicAnchor in the same schema resource behaves like a normal $ref to an $anchor", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "A $dynamicRef to an $anchor in the same schema resource behaves like a normal $ref to an $anchor", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "A $dynamicRef with a non-matching $dynamicAnchor in the same schema resource behaves like a normal $ref to $anchor", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "A $dynamicRef with intermediate scopes that don't include a matching $dynamicAnchor does not affect dynamic scope resolution", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "A $dynamicRef without a matching $dynamicAnchor in the same schema resource behaves like a normal $ref to $anchor", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "A $dynamicRef without anchor in fragment behaves identical to $ref", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "A $ref to a $dynamicAnchor in the same schema resource behaves like a normal $ref to an $anchor", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "An $anchor with the same name as a $dynamicAnchor is not used for dynamic scope resolution", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "after leaving a dynamic scope, it is not used by a $dynamicRef", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "multiple dynamic paths to the $dynamicRef keyword", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "strict-tree schema, guards against misspelled properties", None, SELF_CONTAINED),
    ("2020", "dynamicRef.json", "tests for implementation dynamic anchor and reference link", None, SELF_CONTAINED),
    ("2019", "recursiveRef.json", "$recursiveRef with $recursiveAnchor: false works like $ref", None, SELF_CONTAINED),
    ("2019", "recursiveRef.json", "$recursiveRef with nesting", None, SELF_CONTAINED),
    ("2019", "recursiveRef.json", "$recursiveRef with no $recursiveAnchor in the initial target schema resource", None, SELF_CONTAINED),
    ("2019", "recursiveRef.json", "$recursiveRef with no $recursiveAnchor in the outer schema resource", None, SELF_CONTAINED),
    ("2019", "recursiveRef.json", "$recursiveRef with no $recursiveAnchor works like $ref", None, SELF_CONTAINED),
    ("2019", "recursiveRef.json", "$recursiveRef without using nesting", None, SELF_CONTAINED),
    ("2019", "recursiveRef.json", "dynamic $recursiveRef destination (not predictable at schema compile time)", None, SELF_CONTAINED),
    ("2019", "recursiveRef.json", "multiple dynamic paths to the $recursiveRef keyword", None, SELF_CONTAINED),
    ("7 2019 2020", "ref.json", "$id must be resolved against nearest parent, not just immediate parent", None, SELF_CONTAINED),
    ("6 7 2019 2020", "ref.json", "$id with file URI still resolves pointers - *nix", None, SELF_CONTAINED),
    ("6 7 2019 2020", "ref.json", "$id with file URI still resolves pointers - windows", None, SELF_CONTAINED),
    ("6 7", "ref.json", "$ref prevents a sibling $id from changing the base uri", None, SELF_CONTAINED),
    ("4", "ref.json", "$ref prevents a sibling id from changing the base uri", None, SELF_CONTAINED),
    ("2019", "ref.json", "$ref with $recursiveAnchor", None, SELF_CONTAINED),
    ("4 6 7", "ref.json", "Location-independent identifier with base URI change in subschema", None, SELF_CONTAINED),
    ("*", "ref.json", "Recursive references between schemas", None, SELF_CONTAINED),
    ("6 7", "ref.json", "Reference an anchor with a non-relative URI", None, SELF_CONTAINED),
    ("6 7 2019 2020", "ref.json", "URN base URI with NSS", None, SELF_CONTAINED),
    ("6 7 2019 2020", "ref.json", "URN base URI with URN and JSON pointer ref", None, SELF_CONTAINED),
    ("6 7 2019 2020", "ref.json", "URN base URI with URN and anchor ref", None, SELF_CONTAINED),
    ("6 7 2019 2020", "ref.json", "URN base URI with q-component", None, SELF_CONTAINED),
    ("6 7 2019 2020", "ref.json", "URN base URI with r-component", None, SELF_CONTAINED),
    ("2019 2020", "ref.json", "URN ref with nested pointer ref", None, SELF_CONTAINED),
    ("4", "ref.json", "id must be resolved against nearest parent, not just immediate parent", None, SELF_CONTAINED),
    ("4", "ref.json", "id with file URI still resolves pointers - *nix", None, SELF_CONTAINED),
    ("4", "ref.json", "id with file URI still resolves pointers - windows", None, SELF_CONTAINED),
    ("2019 2020", "ref.json", "order of evaluation: $id and $anchor and $ref", None, SELF_CONTAINED),
    ("2019 2020", "ref.json", "order of evaluation: $id and $ref", None, SELF_CONTAINED),
    ("2019 2020", "ref.json", "order of evaluation: $id and $ref on nested schema", None, SELF_CONTAINED),
    ("7 2019 2020", "ref.json", "ref to else", None, SELF_CONTAINED),
    ("7 2019 2020", "ref.json", "ref to if", None, SELF_CONTAINED),
    ("7 2019 2020", "ref.json", "ref to then", None, SELF_CONTAINED),
    ("6 7 2019 2020", "ref.json", "ref with absolute-path-reference", None, SELF_CONTAINED),
    ("6 7 2019 2020", "ref.json", "refs with relative uris and defs", None, SELF_CONTAINED),
    ("6 7 2019 2020", "ref.json", "relative refs with absolute uris and defs", None, SELF_CONTAINED),
    ("*", "ref.json", "remote ref, containing refs itself", None, SELF_CONTAINED),
    ("6 7 2019 2020", "ref.json", "simple URN base URI with $ref via the URN", None, SELF_CONTAINED),
    ("6 7 2019 2020", "ref.json", "simple URN base URI with JSON pointer", None, SELF_CONTAINED),
    ("2019 2020", "refRemote.json", "$ref to $ref finds detached $anchor", None, SELF_CONTAINED),
    ("6 7", "refRemote.json", "$ref to $ref finds location-independent $id", None, SELF_CONTAINED),
    ("*", "refRemote.json", "Location-independent identifier in remote ref", None, SELF_CONTAINED),
    ("2019 2020", "refRemote.json", "anchor within remote ref", None, SELF_CONTAINED),
    ("*", "refRemote.json", "base URI change", None, SELF_CONTAINED),
    ("*", "refRemote.json", "base URI change - change folder", None, SELF_CONTAINED),
    ("*", "refRemote.json", "base URI change - change folder in subschema", None, SELF_CONTAINED),
    ("*", "refRemote.json", "fragment within remote ref", None, SELF_CONTAINED),
    ("*", "refRemote.json", "ref within remote ref", None, SELF_CONTAINED),
    ("2019 2020", "refRemote.json", "remote HTTP ref with different $id", None, SELF_CONTAINED),
    ("2019 2020", "refRemote.json", "remote HTTP ref with different URN $id", None, SELF_CONTAINED),
    ("2019 2020", "refRemote.json", "remote HTTP ref with nested absolute ref", None, SELF_CONTAINED),
    ("*", "refRemote.json", "remote ref", None, SELF_CONTAINED),
    ("6 7", "refRemote.json", "remote ref with ref to definitions", None, SELF_CONTAINED),
    ("2019 2020", "refRemote.json", "remote ref with ref to defs", None, SELF_CONTAINED),
    ("6 7 2019 2020", "refRemote.json", "retrieved nested refs resolve relative to their URI not $id", None, SELF_CONTAINED),
    ("*", "refRemote.json", "root ref in remote ref", None, SELF_CONTAINED),
    ("2020", "unevaluatedItems.json", "unevaluatedItems with $dynamicRef", None, SELF_CONTAINED),
    ("2019", "unevaluatedItems.json", "unevaluatedItems with $recursiveRef", None, SELF_CONTAINED),
    ("2020", "unevaluatedProperties.json", "unevaluatedProperties with $dynamicRef", None, SELF_CONTAINED),
    ("2019", "unevaluatedProperties.json", "unevaluatedProperties with $recursiveRef", None, SELF_CONTAINED),
    # Refused at registration: a custom meta-schema ($schema names no accepted draft).
    ("2019 2020", "vocabulary.json", "ignore unrecognized optional vocabulary", None, META_SCHEMA),
    ("2019 2020", "vocabulary.json", "schema that uses custom metaschema with with no validation vocabulary", None, META_SCHEMA),
    # Refused at registration: a number beyond +-(2^53 - 1) in the schema.
    ("6 7 2019 2020", "const.json", "float and integers are equal up to 64-bit representation limits", None, BIG_INTEGER),
    # Refused at registration: closing forbids a member the schema demands.
    ("*", "items.json", "items and subitems", None, CLOSED_DEMAND),
    ("*", "oneOf.json", "oneOf with required", None, CLOSED_DEMAND),
    ("*", "required.json", "required properties whose names are Javascript object property names", None, CLOSED_DEMAND),
    ("*", "required.json", "required with escaped characters", None, CLOSED_DEMAND),
    # Valid only because an undeclared member is allowed: the gate fails it, with extra_field
    # deviations only.
    ("*", "additionalProperties.json", "additionalProperties are allowed by default", "additional properties are allowed", CLOSED),
    ("4 6 7", "dependencies.json", "dependencies with escaped characters", "valid object 1", CLOSED),
    ("4 6 7", "dependencies.json", "dependencies with escaped characters", "valid object 2", CLOSED),
    ("4 6 7", "dependencies.json", "dependencies with escaped characters", "valid object 3", CLOSED),
    ("4 6 7", "dependencies.json", "dependent subschema incompatible with root", "matches dependency", CLOSED),
    ("4 6 7", "dependencies.json", "dependent subschema incompatible with root", "no dependency", CLOSED),
    ("4 6 7", "dependencies.json", "multiple dependencies subschema", "no dependency", CLOSED),
    ("2019 2020", "dependentSchemas.json", "dependencies with escaped characters", "quoted tab", CLOSED),
    ("2019 2020", "dependentSchemas.json", "dependent subschema incompatible with root", "matches dependency", CLOSED),
    ("2019 2020", "dependentSchemas.json", "dependent subschema incompatible with root", "no dependency", CLOSED),
    ("2019 2020", "dependentSchemas.json", "single dependency", "no dependency", CLOSED),
    ("*", "not.json", "forbidden property", "property absent", CLOSED),
    ("*", "properties.json", "object properties validation", "doesn't invalidate other properties", CLOSED),
    ("*", "type.json", "type: array or object", "object is valid", CLOSED),
    ("*", "type.json", "type: array, object or null", "object is valid", CLOSED),
    # Valid only because a member undeclared in a part is allowed: the part fails, reported
    # as its composition failing (and extra fields).
    ("2019 2020", "unevaluatedProperties.json", "property is evaluated in an uncle schema to unevaluatedProperties", "no extra properties", CLOSED_PART),
    # 1.0 is not an integer: the gate fails it, with a wrong_type integer only.
    ("6 7 2019 2020", "type.json", "integer type matches integers", "a float with zero fractional part is an integer", INTEGER_TOKEN),
    # Formats are asserted: the gate fails it, with format constraints only.
    ("2020", "format.json", "date format", "invalid date string is only an annotation by default", FORMAT),
    ("2020", "format.json", "date-time format", "invalid date-time string is only an annotation by default", FORMAT),
    ("2020", "format.json", "duration format", "invalid duration string is only an annotation by default", FORMAT),
    ("2020", "format.json", "email format", "invalid email string is only an annotation by default", FORMAT),
    ("2020", "format.json", "hostname format", "invalid hostname string is only an annotation by default", FORMAT),
    ("2020", "format.json", "idn-email format", "invalid idn-email string is only an annotation by default", FORMAT),
    ("2020", "format.json", "idn-hostname format", "invalid idn-hostname string is only an annotation by default", FORMAT),
    ("2020", "format.json", "ipv4 format", "invalid ipv4 string is only an annotation by default", FORMAT),
    ("2020", "format.json", "ipv6 format", "invalid ipv6 string is only an annotation by default", FORMAT),
    ("2020", "format.json", "iri format", "invalid iri string is only an annotation by default", FORMAT),
    ("2020", "format.json", "iri-reference format", "invalid iri-reference string is only an annotation by default", FORMAT),
    ("2020", "format.json", "json-pointer format", "invalid json-pointer string is only an annotation by default", FORMAT),
    ("2020", "format.json", "regex format", "invalid regex string is only an annotation by default", FORMAT),
    ("2020", "format.json", "relative-json-pointer format", "invalid relative-json-pointer string is only an annotation by default", FORMAT),
    ("2020", "format.json", "time format", "invalid time string is only an annotation by default", FORMAT),
    ("2020", "format.json", "uri format", "invalid uri string is only an annotation by default", FORMAT),
    ("2020", "format.json", "uri-reference format", "invalid uri-reference string is only an annotation by default", FORMAT),
    ("2020", "format.json", "uri-template format", "invalid uri-template string is only an annotation by default", FORMAT),
    ("2020", "format.json", "uuid format", "invalid uuid string is only an annotation by default", FORMAT),
]
# fmt: on

Key = tuple[str, str, str, str | None]  # folder, file, group, case (None: the group)


def _expand() -> dict[Key, str]:
    table: dict[Key, str] = {}
    for drafts, name, group, case, category in DEPARTURES:
        for short in FOLDERS if drafts == "*" else drafts.split():
            key = (FOLDERS[short][0], name, group, case)
            assert key not in table, f"listed twice: {key}"
            table[key] = category
    return table


LISTED = _expand()


def _files() -> list[Any]:
    if not SUITE.is_dir():
        return [pytest.param(None, None, id="suite-missing")]
    return [
        pytest.param(folder, path.name, id=f"{folder}/{path.name}")
        for folder, _ in FOLDERS.values()
        for path in sorted((SUITE / folder).glob("*.json"))
    ]


def _need_suite() -> None:
    if not SUITE.is_dir():
        pytest.skip(
            f"the JSON-Schema-Test-Suite is not at {SUITE} (the peer suites live beside the "
            "project, in ../shared/peer-suites; see its README.md)"
        )


def _declared(schema: Any, folder: str) -> Any:
    """The schema as a tool would declare it in the folder's draft."""
    if isinstance(schema, dict) and "$schema" not in schema:
        return {"$schema": META_SCHEMA_URIS[DRAFT_OF_FOLDER[folder]], **schema}
    return schema


def _problems_text(problems: list[SchemaProblem]) -> str:
    return "; ".join(f"{p.pointer or '/'}: {p.message}" for p in problems)


@pytest.mark.parametrize(("folder", "name"), _files())
def test_suite_file(folder: str | None, name: str | None) -> None:
    _need_suite()
    assert folder is not None and name is not None
    groups = json.loads((SUITE / folder / name).read_text(encoding="utf-8"))
    assert groups, f"{folder}/{name} holds no groups"
    found: dict[Key, str] = {}  # every disagreement, and what happened
    wrong: list[str] = []  # listed ones that happened another way than their category
    for group in groups:
        key: Key = (folder, name, group["description"], None)
        try:
            prepared = prepare_schema(_declared(group["schema"], folder))
        except InvalidSchemaError as exc:
            found[key] = "refused: " + _problems_text(exc.problems)
            category = LISTED.get(key)
            refused_as = REFUSALS.get(category) if category is not None else None
            if category is not None and (refused_as is None or not refused_as(exc.problems)):
                wrong.append(f"{key}: listed as {category!r}, but {found[key]}")
            continue
        for case in group["tests"]:
            data = json.dumps(case["data"]).encode()
            deviations = check(prepared.normalised, data, schema_sha256=prepared.sha256)
            if (deviations == []) == case["valid"]:
                continue
            case_key: Key = (*key[:3], case["description"])
            found[case_key] = f"suite valid={case['valid']}, deviations {deviations}"
            category = LISTED.get(case_key)
            if category is None:
                continue
            failed_as = FAILURES.get(category)
            # Every case category is stricter than the suite, never looser: the suite
            # says valid, the gate fails it, and only in the category's way.
            if not (
                failed_as is not None
                and case["valid"]
                and deviations
                and all(failed_as(d) for d in deviations)
            ):
                wrong.append(f"{case_key}: listed as {category!r}, but {found[case_key]}")
    listed = {k for k in LISTED if k[:2] == (folder, name)}
    unlisted = [f"{k}: {found[k]}" for k in found if k not in listed]
    gone = [f"{k} ({LISTED[k]})" for k in listed if k not in found]
    assert not unlisted, "disagreements not in DEPARTURES:\n" + "\n".join(unlisted)
    assert not gone, "listed departures that no longer occur:\n" + "\n".join(gone)
    assert not wrong, "\n".join(wrong)


def test_every_listed_departure_is_in_a_file_that_runs() -> None:
    """A row naming a file the suite does not have would never be checked."""
    _need_suite()
    missing = sorted({(k[0], k[1]) for k in LISTED if not (SUITE / k[0] / k[1]).is_file()})
    assert not missing
    assert set(LISTED.values()) <= set(REFUSALS) | set(FAILURES)


def _gate_files() -> list[Any]:
    return [p for p in _files() if p.values[0] in (None, "draft2020-12")]


@pytest.mark.parametrize(("folder", "name"), _gate_files())
def test_suite_file_through_the_real_gate(
    folder: str | None, name: str | None, sqlite_url: str
) -> None:
    """Each group's schema registered as a tool's input schema (``register_tool``) and
    each case's data sent through ``gate_input``: the gate judges exactly as the checker
    judges the registered schema above — no schema dropped, replaced or loosened on the
    way (a boolean ``false`` gated as "no parameters" once passed ``{}``). Draft 2020-12,
    the form every draft is translated to."""
    from commands.plane import CommandRefused, Plane
    from commands.plane.gates import gate_input
    from commands.plane.phases import enter_execute, record_strategy
    from commands.plane.plans import create_plan
    from commands.plane.registry import register_tool

    _need_suite()
    assert folder is not None and name is not None
    groups = json.loads((SUITE / folder / name).read_text(encoding="utf-8"))
    with Plane.open(sqlite_url) as plane:
        plans = iter(range(1, 10_000))

        def new_plan() -> str:
            # Every failed check spends an iteration of the attempt: a fresh plan before
            # the critique loop's bound would send it back to Strategize.
            plan_id = f"P-{next(plans)}"
            create_plan(
                plane, plan_id, project="suite", resources=["repo:x"],
                config={"max_iterations": 1000},
            )  # fmt: skip
            record_strategy(plane, plan_id, "the suite")
            enter_execute(plane, plan_id)
            return plan_id

        plan_id, failures = new_plan(), 0
        for index, group in enumerate(groups):
            declared = _declared(group["schema"], folder)
            try:
                prepared = prepare_schema(declared)
            except InvalidSchemaError:
                continue  # the checker's test above says why it is refused
            tool = f"case-{index}"
            try:
                register_tool(plane, {"name": tool, "command": ["true"], "input_schema": declared})
            except CommandRefused as exc:
                pytest.fail(f"{group['description']}: prepared, but not registered: {exc}")
            for case in group["tests"]:
                data = json.dumps(case["data"]).encode()
                expected = check(prepared.normalised, data, schema_sha256=prepared.sha256)
                outcome = gate_input(plane, plan_id, tool, data, step=f"s{index}")
                where = f"{group['description']} / {case['description']}"
                assert outcome.passed == (expected == []), where
                assert outcome.check.schema_sha256 == prepared.sha256, where
                assert list(outcome.check.deviations) == expected, where
                failures += not outcome.passed
                if failures >= 900:
                    plan_id, failures = new_plan(), 0
