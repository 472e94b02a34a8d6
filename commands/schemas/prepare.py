"""Preparing a tool's declared JSON Schema for registration.

A registered schema is stored twice: as declared, and normalised ("closed"), with the
SHA-256 of the normalised form. The gates check against the normalised form, so what is
recorded as declared and what is checked can be compared by anyone.

Which drafts: draft-04, draft-06, draft-07, 2019-09 and 2020-12, named by the root
``$schema`` (2020-12 when there is none). A schema in another draft than 2020-12 is
translated into the equivalent 2020-12 document first (``commands.schemas.drafts``);
the normalised form is that document, closed, with ``$schema`` naming 2020-12. So every
rule below, the digest and the checker see 2020-12 only, whatever the tool declared.

What a registrable schema is (:func:`check_schema`):

- a JSON object or boolean that is valid against the meta-schema of its own draft
  (every problem is reported with its RFC 6901 pointer into the declared schema);
- one self-contained document: ``$ref`` and ``$dynamicRef`` must be local (start with
  ``#``) and resolve to a schema inside the document; ``$id`` (draft-04: ``id``) is
  refused (except an empty fragment) because it changes the base URI that ``#``
  references resolve against, and one with a scheme or host names something outside
  the document;
- ``$schema`` names one of the accepted drafts at the root, and the same draft (or
  none) everywhere else: one document is one draft;
- compilable by the checker: every ``pattern`` is a valid regular expression, and every
  ``format`` is one the checker asserts. Decision: an unknown format is refused rather
  than ignored, so a declared format is never silently left unchecked;
- satisfiable once closed: a closed object that demands a member it then forbids
  (through ``required``, ``dependentRequired``, ``minProperties``, ``const``/``enum``,
  or the parts it applies in place) is refused (:func:`prepare_schema`).

Closing (:func:`normalise_closed`): objects are closed unless the schema opens them
explicitly (an extra field is a failure, never silently dropped). See its
docstring for how compositions (``allOf``/``anyOf``/``oneOf``, ``$ref``, ``if``/``then``/
``else``, ``dependentSchemas``) and ``not`` are handled.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any
from urllib.parse import unquote, urlsplit

import jsonschema_rs
import msgspec

from ledger.canonical import CanonicalizationError, canonical_json
from ledger.errors import LedgerError

from .drafts import (
    DRAFT_OF_URI,
    META_SCHEMA_URIS,
    Draft,
    Upgraded,
    draft_of,
    meta_validator,
    upgrade,
)

__all__ = [
    "INTEGER_TOKEN_KEYWORD",
    "META_SCHEMA_URI",
    "InvalidSchemaError",
    "PreparedSchema",
    "SchemaIndex",
    "SchemaProblem",
    "check_schema",
    "compile_schema",
    "escape_token",
    "has_integer_only_types",
    "in_place_property_names",
    "iter_subschemas",
    "json_pointer",
    "normalise_closed",
    "prepare_schema",
    "schema_at",
    "schema_sha256",
]

META_SCHEMA_URI = META_SCHEMA_URIS[Draft.DRAFT2020_12]  # what a normalised schema is

# Keywords that decide an object's openness themselves; such a schema is left alone.
_OPENING_KEYWORDS = ("additionalProperties", "unevaluatedProperties", "patternProperties")


class SchemaProblem(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One reason a schema cannot be registered."""

    pointer: str  # RFC 6901, into the schema
    message: str


class InvalidSchemaError(LedgerError):
    """A declared schema is not a registrable JSON Schema document."""

    def __init__(self, problems: list[SchemaProblem]) -> None:
        self.problems = list(problems)
        first = self.problems[0] if self.problems else SchemaProblem(pointer="", message="?")
        where = f"at {first.pointer}" if first.pointer else "at the root"
        more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        super().__init__(f"invalid JSON Schema {where}: {first.message}{more}")


class PreparedSchema(msgspec.Struct, kw_only=True, frozen=True):
    """A schema ready for registration: as declared, closed, and the digest of the
    closed form (the one the gates check against and record)."""

    declared: Any
    normalised: Any
    sha256: str


# --- RFC 6901 -------------------------------------------------------------------------


def escape_token(token: str | int) -> str:
    """One RFC 6901 reference token (``~`` -> ``~0`` first, then ``/`` -> ``~1``)."""
    return str(token).replace("~", "~0").replace("/", "~1")


def json_pointer(tokens: Iterator[str | int] | tuple[str | int, ...] | list[str | int]) -> str:
    return "".join("/" + escape_token(t) for t in tokens)


def _unescape_token(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


# --- where the subschemas are -----------------------------------------------------------


class Role(Enum):
    """How a subschema relates to the schema that holds it."""

    CHILD = "child"  # applies to a member or item: a standalone object position
    PART = "part"  # applies in place, to the same instance (composition)
    DEFINITION = "definition"  # only reached through a $ref
    INERT = "inert"  # negated or a condition (not, if): closing it would loosen


_SINGLE, _MAP, _ARRAY = "single", "map", "array"

# Every 2020-12 keyword whose value is (or holds) a schema: (shape, role).
_SUBSCHEMA_KEYWORDS: dict[str, tuple[str, Role]] = {
    "additionalProperties": (_SINGLE, Role.CHILD),
    "unevaluatedProperties": (_SINGLE, Role.CHILD),
    "items": (_SINGLE, Role.CHILD),
    "contains": (_SINGLE, Role.CHILD),
    "unevaluatedItems": (_SINGLE, Role.CHILD),
    "propertyNames": (_SINGLE, Role.CHILD),
    "contentSchema": (_SINGLE, Role.CHILD),
    "properties": (_MAP, Role.CHILD),
    "patternProperties": (_MAP, Role.CHILD),
    "prefixItems": (_ARRAY, Role.CHILD),
    "allOf": (_ARRAY, Role.PART),
    "anyOf": (_ARRAY, Role.PART),
    "oneOf": (_ARRAY, Role.PART),
    "then": (_SINGLE, Role.PART),
    "else": (_SINGLE, Role.PART),
    "dependentSchemas": (_MAP, Role.PART),
    "$defs": (_MAP, Role.DEFINITION),
    "definitions": (_MAP, Role.DEFINITION),  # pre-2019 name, still a $ref target
    "not": (_SINGLE, Role.INERT),
    "if": (_SINGLE, Role.INERT),
}

Path = tuple[str | int, ...]


def _children(node: dict[str, Any]) -> Iterator[tuple[Path, Any, Role]]:
    """The direct subschemas of a schema object, with their relative paths and roles.
    Defensive about shapes: a malformed keyword value is simply not descended into."""
    for key, value in node.items():
        spec = _SUBSCHEMA_KEYWORDS.get(key)
        if spec is None:
            continue
        shape, role = spec
        if shape == _SINGLE:
            yield (key,), value, role
        elif shape == _MAP and isinstance(value, dict):
            for name, sub in value.items():
                yield (key, name), sub, role
        elif shape == _ARRAY and isinstance(value, list):
            for index, sub in enumerate(value):
                yield (key, index), sub, role


def iter_subschemas(schema: Any) -> Iterator[tuple[Path, Any]]:
    """Every schema position in the document (the root first, then pre-order), with its
    path from the root. Values of non-schema keywords (``enum``, ``const``, ``default``,
    unknown keywords) are data and are not visited."""
    stack: list[tuple[Path, Any]] = [((), schema)]
    while stack:
        path, node = stack.pop()
        yield path, node
        if isinstance(node, dict):
            found = [(path + rel, sub) for rel, sub, _ in _children(node)]
            stack.extend(reversed(found))


class SchemaIndex:
    """Schema positions by path and by anchor, to resolve local references."""

    def __init__(self, schema: Any) -> None:
        self.by_path: dict[tuple[str, ...], Any] = {}
        self.anchors: dict[str, Any] = {}
        for path, node in iter_subschemas(schema):
            self.by_path[tuple(str(t) for t in path)] = node
            if isinstance(node, dict):
                for keyword in ("$anchor", "$dynamicAnchor"):
                    name = node.get(keyword)
                    if isinstance(name, str):
                        self.anchors.setdefault(name, node)

    def resolve(self, ref: Any) -> tuple[bool, Any]:
        """(found, target) for a local reference ``#``, ``#/json/pointer`` or ``#anchor``."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            return False, None
        fragment = unquote(ref[1:])
        if fragment == "":
            return True, self.by_path[()]
        if fragment.startswith("/"):
            tokens = tuple(_unescape_token(t) for t in fragment[1:].split("/"))
            if tokens in self.by_path:
                return True, self.by_path[tokens]
            return False, None
        if fragment in self.anchors:
            return True, self.anchors[fragment]
        return False, None


def schema_at(schema: Any, path: Iterator[str | int] | list[str | int]) -> Any:
    """The value at a path of tokens (as jsonschema-rs reports them), or None."""
    node = schema
    for token in path:
        if isinstance(node, dict) and isinstance(token, str):
            node = node.get(token)
        elif isinstance(node, list) and isinstance(token, int) and 0 <= token < len(node):
            node = node[token]
        else:
            return None
    return node


def in_place_property_names(node: Any, index: SchemaIndex) -> set[str] | None:
    """The property names ``node`` and the subschemas it applies in place (compositions,
    ``if``/``then``/``else``, ``dependentSchemas``, local references) declare in
    ``properties``: what its ``unevaluatedProperties`` would see evaluated if every part
    passed. None when any name may be evaluated (a part with ``patternProperties`` or a
    non-false ``additionalProperties``/``unevaluatedProperties``)."""
    names: set[str] = set()
    seen: set[int] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if not isinstance(current, dict) or id(current) in seen:
            continue
        seen.add(id(current))
        if current is not node and (
            "patternProperties" in current
            or current.get("additionalProperties", False) is not False
            or current.get("unevaluatedProperties", False) is not False
        ):
            return None
        properties = current.get("properties")
        if isinstance(properties, dict):
            names.update(properties)
        stack.extend(_in_place_parts(current, index))
        stack.append(current.get("if"))
    return names


# --- checking ---------------------------------------------------------------------------


def check_schema(schema: Any) -> list[SchemaProblem]:
    """Every reason ``schema`` cannot be registered (empty when it can)."""
    return _checked(schema)[0]


def _checked(schema: Any) -> tuple[list[SchemaProblem], Upgraded | None]:
    """The problems of ``schema``, or none and its 2020-12 form."""
    if not isinstance(schema, dict | bool):
        return [
            SchemaProblem(pointer="", message="a schema must be a JSON object or boolean")
        ], None
    try:
        canonical_json(schema)
    except CanonicalizationError as exc:
        return [SchemaProblem(pointer="", message=f"not a JSON value: {exc}")], None
    except RecursionError:
        return [SchemaProblem(pointer="", message="nested too deeply")], None
    draft = draft_of(schema)
    if draft is None:
        assert isinstance(schema, dict)  # a boolean schema has no $schema
        return [_unknown_draft("/$schema", schema["$schema"])], None
    problems = _dedupe(_meta_problems(schema, draft))
    if problems and draft is not Draft.DRAFT2020_12:
        return problems, None  # the translation needs a document valid in its draft
    upgraded = upgrade(schema, draft)
    problems.extend(_reference_problems(upgraded))
    if problems:
        return problems, None
    # Last, what only compiling finds: bad regular expressions, unknown formats.
    document = upgraded.document
    try:
        compile_schema(document)
    except jsonschema_rs.ValidationError as exc:
        pointer = upgraded.declared_pointer(list(exc.instance_path))
        message = _one_line(exc.message)
        if message.startswith("Unknown format"):
            message = (
                f"unknown format {schema_at(document, exc.instance_path)!r}: the checker "
                "cannot assert it, and a declared format is never left unchecked"
            )
        return [SchemaProblem(pointer=pointer, message=message)], None
    return [], upgraded


def _unknown_draft(pointer: str, uri: Any) -> SchemaProblem:
    drafts = ", ".join(repr(uri) for uri in META_SCHEMA_URIS.values())
    return SchemaProblem(
        pointer=pointer,
        message=f"$schema {uri!r} names no draft the checker accepts: use one of {drafts} "
        "(http or https, with or without the trailing '#'), or none for 2020-12",
    )


def _meta_problems(schema: Any, draft: Draft) -> Iterator[SchemaProblem]:
    for error in meta_validator(draft).iter_errors(schema):
        path = list(error.instance_path)
        message = _one_line(error.message)
        if path and path[-1] == "type" and type(error.kind).__name__ == "AnyOf":
            # The meta-schema's anyOf message is unhelpful for the commonest mistake.
            message = (
                "type must be one of array, boolean, integer, null, number, object, "
                "string, or a non-empty list of unique ones"
            )
        yield SchemaProblem(pointer=json_pointer(path), message=message)


def _reference_problems(upgraded: Upgraded) -> Iterator[SchemaProblem]:
    schema = upgraded.document
    index = SchemaIndex(schema)

    def at(path: Path, keyword: str) -> tuple[str, str]:
        """The declared pointer and name of a keyword (draft-04 wrote ``$id`` as ``id``)."""
        declared = upgraded.declared_path((*path, keyword))
        return json_pointer(declared), declared[-1]

    for path, node in iter_subschemas(schema):
        if not isinstance(node, dict):
            continue
        if (
            path
            and "$schema" in node
            and not (
                # (The translation of an older draft dropped the nested ones that restate it.)
                upgraded.draft is Draft.DRAFT2020_12
                and DRAFT_OF_URI.get(str(node["$schema"])) is Draft.DRAFT2020_12
            )
        ):
            pointer, _ = at(path, "$schema")
            yield SchemaProblem(
                pointer=pointer,
                message=f"$schema {node['$schema']!r} is not the document's draft: one "
                "document is one draft (write $schema at the root only)",
            )
        if "$id" in node and node["$id"] not in ("", "#"):
            ident = node["$id"]
            parts = urlsplit(ident) if isinstance(ident, str) else None
            outside = parts is not None and bool(parts.scheme or parts.netloc)
            reason = "names a resource outside the document" if outside else "changes the base URI"
            pointer, name = at(path, "$id")
            yield SchemaProblem(
                pointer=pointer,
                message=f"{name} {reason}: a registered schema must be one self-contained "
                f"document without {name}",
            )
        for keyword in ("$ref", "$dynamicRef"):
            if keyword not in node:
                continue
            ref = node[keyword]
            if not isinstance(ref, str):
                continue  # the meta-schema reports it
            pointer, name = at(path, keyword)
            if not ref.startswith("#"):
                yield SchemaProblem(
                    pointer=pointer,
                    message=f"{name} {ref!r} refers outside the document "
                    "(only local references starting with '#' are allowed)",
                )
            elif not index.resolve(ref)[0]:
                yield SchemaProblem(
                    pointer=pointer,
                    message=f"{name} {ref!r} does not resolve to a schema in this document",
                )


def _dedupe(problems: Iterator[SchemaProblem]) -> list[SchemaProblem]:
    # The 2020-12 meta-schema is split in vocabularies; one mistake can be reported by
    # several of them with the same pointer and message.
    seen: set[tuple[str, str]] = set()
    out: list[SchemaProblem] = []
    for problem in problems:
        key = (problem.pointer, problem.message)
        if key not in seen:
            seen.add(key)
            out.append(problem)
    return out


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --- compiling ---------------------------------------------------------------------------

# Decision: "integer" means a JSON integer token. JSON Schema (and jsonschema-rs) accept
# any number with a zero fractional part (1.0, 1e2) as an integer; the ledger does not,
# because accepting 1.0 where an integer is declared is a coercion. jsonschema-rs cannot
# be told so, so every schema position whose type admits "integer" but not "number" gets
# this extra keyword in the compiled copy; it fails for a float instance (a JSON number
# with a fraction or exponent, as decoded). Integrated in the validator rather than
# checked afterwards, it also works inside anyOf/oneOf/not.
INTEGER_TOKEN_KEYWORD = "x-evidence-integer-token"


class _IntegerToken:
    def __init__(self, parent_schema: Any, value: Any, schema_path: list[str | int]) -> None:
        pass

    def validate(self, instance: Any) -> None:
        # Non-integral floats already fail "type": reporting them again would duplicate.
        if type(instance) is float and instance.is_integer():
            raise ValueError("a number with a fraction or exponent is not an integer token")


def _admits_integer_only(type_value: Any) -> bool:
    if type_value == "integer":
        return True
    return isinstance(type_value, list) and "integer" in type_value and "number" not in type_value


def _with_integer_tokens(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    out = _map_children(node, lambda sub, _role: _with_integer_tokens(sub), copy_data=False)
    if _admits_integer_only(node.get("type")):
        out[INTEGER_TOKEN_KEYWORD] = True
    return out


def has_integer_only_types(schema: Any) -> bool:
    """Whether some schema position admits "integer" but not "number"."""
    return any(
        isinstance(node, dict) and _admits_integer_only(node.get("type"))
        for _, node in iter_subschemas(schema)
    )


def compile_schema(schema: Any, *, integer_tokens: bool = True) -> jsonschema_rs.Validator:
    """The compiled Draft 2020-12 validator the gates use: formats asserted (unknown ones
    refused), integer meaning an integer token, never any network access. Raises
    ``jsonschema_rs.ValidationError`` for a schema it cannot compile.

    ``integer_tokens=False`` leaves out the integer-token keyword: equivalent, and
    faster, for an instance that holds no float with a zero fraction."""
    # A registered custom keyword slows every check (~40%), so only the integer-token
    # validator carries it; messages are masked: they are never read, and instance values
    # must not be copied anywhere.
    extra: dict[str, Any] = (
        {"keywords": {INTEGER_TOKEN_KEYWORD: _IntegerToken}} if integer_tokens else {}
    )
    return jsonschema_rs.Draft202012Validator(
        _with_integer_tokens(schema) if integer_tokens else schema,
        validate_formats=True,
        ignore_unknown_formats=False,
        offline=True,
        mask="[value]",
        **extra,
    )


# --- closing -----------------------------------------------------------------------------


def _map_children(
    node: dict[str, Any], fn: Callable[[Any, Role], Any], *, copy_data: bool
) -> dict[str, Any]:
    """A new schema object whose subschemas are ``fn(subschema, role)``; data keywords
    are deep-copied when ``copy_data`` (so the result shares nothing with the input)."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        spec = _SUBSCHEMA_KEYWORDS.get(key)
        shape, role = spec if spec else ("", Role.CHILD)
        if shape == _SINGLE:
            out[key] = fn(value, role)
        elif shape == _MAP and isinstance(value, dict):
            out[key] = {name: fn(sub, role) for name, sub in value.items()}
        elif shape == _ARRAY and isinstance(value, list):
            out[key] = [fn(sub, role) for sub in value]
        else:
            out[key] = copy.deepcopy(value) if copy_data else value
    return out


def _types(node: dict[str, Any]) -> set[str] | None:
    declared = node.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return {t for t in declared if isinstance(t, str)}
    return None


def _in_place_parts(node: dict[str, Any], index: SchemaIndex) -> Iterator[Any]:
    """Subschemas applied to the same instance whose evaluated properties count for this
    node's ``unevaluatedProperties``: compositions, then/else, dependentSchemas, and
    what ``$ref``/``$dynamicRef`` resolve to."""
    for _, sub, role in _children(node):
        if role is Role.PART:
            yield sub
    for keyword in ("$ref", "$dynamicRef"):
        found, target = index.resolve(node.get(keyword))
        if found:
            yield target


def _describes_object(node: Any, index: SchemaIndex, seen: set[int]) -> bool:
    """Whether a part brings object structure (properties) into its parent."""
    if not isinstance(node, dict) or id(node) in seen:
        return False
    seen.add(id(node))
    types = _types(node)
    if types is not None and "object" not in types:
        return False
    if types is not None or any(k in node for k in ("properties", "required", *_OPENING_KEYWORDS)):
        return True
    return any(_describes_object(part, index, seen) for part in _in_place_parts(node, index))


def _closing_keyword(node: dict[str, Any], index: SchemaIndex) -> str | None:
    if any(k in node for k in _OPENING_KEYWORDS):
        return None  # the schema decides its openness itself
    types = _types(node)
    if types is not None and "object" not in types:
        return None  # not an object schema (properties would not apply anyway)
    seen = {id(node)}
    if any(_describes_object(part, index, seen) for part in _in_place_parts(node, index)):
        return "unevaluatedProperties"
    if types is not None or "properties" in node or "required" in node:
        return "additionalProperties"
    return None


def normalise_closed(schema: Any) -> Any:
    """A closed copy of ``schema`` (the input is not mutated): every object schema that
    does not itself declare ``additionalProperties``, ``unevaluatedProperties`` or
    ``patternProperties`` is closed.

    An object schema has ``"type": "object"`` (or a type list with ``object``), or no type
    and ``properties`` or ``required``. Where it is closed depends on how it is applied:

    - Standalone positions (the root, ``properties``/``patternProperties`` values,
      ``items``, ``prefixItems``, ``additionalProperties`` when a schema, ``contains``,
      ...) are where an object is evaluated. A standalone object schema gets
      ``additionalProperties: false``.
    - Composition: members of ``allOf``/``anyOf``/``oneOf``, ``then``/``else``,
      ``dependentSchemas`` values, and ``$defs``/``definitions`` (only reached through
      ``$ref``) are parts of the object their parent evaluates. Closing a part with
      ``additionalProperties: false`` would reject its siblings' properties (``allOf``
      of a base and an extension could never pass), so parts are not closed. Instead
      the standalone schema that applies them in place (directly, or through a
      ``$ref``) gets ``unevaluatedProperties: false``, which sees the properties every
      successful part evaluated. For ``anyOf``/``oneOf`` that means: the object may hold
      the properties of the alternatives that match, nothing else. A part's own
      explicit opening (``additionalProperties: true``, ``patternProperties``) still
      opens it, since the properties it evaluates count.
    - ``not`` and ``if`` subtrees are left alone: closing a negated schema or a condition
      changes what it matches, which loosens or rewires the whole schema, not tightens it.

    Children of parts and definitions (e.g. a ``properties`` value inside an ``allOf``
    member or a ``$defs`` entry) are standalone positions again and are closed.

    An object with ``additionalProperties: false`` and neither ``properties`` nor
    ``patternProperties`` gets ``properties: {}`` (no change in meaning) so that every
    extra member is reported on its own.
    """
    index = SchemaIndex(schema)

    def transform(node: Any, role: Role, inert: bool) -> Any:
        if not isinstance(node, dict):
            return node
        out = _map_children(
            node,
            lambda sub, sub_role: transform(sub, sub_role, inert or sub_role is Role.INERT),
            copy_data=True,
        )
        if role is Role.CHILD and not inert:
            keyword = _closing_keyword(node, index)
            if keyword is not None:
                out[keyword] = False
        if out.get("additionalProperties") is False and not (
            "properties" in out or "patternProperties" in out
        ):
            # The same schema, but jsonschema-rs reports the members of a closed object
            # that lists no properties as ONE failure at the object; with an (empty)
            # list, each member is its own extra_field, as everywhere else.
            out["properties"] = {}
        return out

    return transform(schema, Role.CHILD, False)


# --- digest and registration --------------------------------------------------------------


def schema_sha256(schema: Any) -> str:
    """SHA-256 (hex) of the schema's RFC 8785 canonical bytes: key order does not matter."""
    return hashlib.sha256(canonical_json(schema)).hexdigest()


def prepare_schema(schema: Any) -> PreparedSchema:
    """Check, translate to 2020-12 and close a declared schema; raises
    :class:`InvalidSchemaError` with every problem found (pointers into the declared
    schema)."""
    problems, upgraded = _checked(schema)
    if upgraded is None:
        raise InvalidSchemaError(problems)
    normalised = normalise_closed(upgraded.document)
    problems = [
        SchemaProblem(pointer=upgraded.declared_pointer(path), message=message)
        for path, message in _unsatisfiable(normalised)
    ]
    if problems:
        raise InvalidSchemaError(problems)
    return PreparedSchema(
        declared=copy.deepcopy(schema), normalised=normalised, sha256=schema_sha256(normalised)
    )


# --- what closing makes impossible -----------------------------------------------------------
#
# Closing forbids every member a closed object does not declare. A keyword that demands
# such a member can then never be met: the call it guards always fails (``required``), or
# the branch, condition or declared member that carries it is dead (an ``anyOf``
# alternative, ``then``, a ``dependentRequired`` trigger). Either way closing changed
# what the author wrote, so registration refuses it and says where, rather than gating
# every call against something nobody meant.


def _unsatisfiable(schema: Any) -> list[tuple[Path, str]]:
    """(path, reason) of every demand a closed object of ``schema`` cannot meet."""
    index = SchemaIndex(schema)
    where = {id(node): path for path, node in iter_subschemas(schema)}
    found: dict[Path, str] = {}
    for node in _live_positions(schema):
        names = _allowed_names(node, index)
        if names is None:
            continue
        allowed, declared = names
        for part in _applied_in_place(node, index, allowed):
            for rel, message in _demands(part, allowed, declared):
                found.setdefault((*where[id(part)], *rel), message)
    return list(found.items())


def _live_positions(schema: Any) -> Iterator[dict[str, Any]]:
    """Every schema object outside ``not`` and ``if`` (a demand under them is a
    condition or a negation, not a demand)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(sub for _, sub, role in _children(node) if role is not Role.INERT)


def _allowed_names(node: dict[str, Any], index: SchemaIndex) -> tuple[set[str], set[str]] | None:
    """The member names a closed object allows, and the names it declares (a declared
    name may still be forbidden: a false schema, ``propertyNames``). None when it is not
    closed, or allows names by pattern (a set that cannot be listed)."""
    if "patternProperties" in node:
        return None
    properties = node.get("properties")
    own = properties if isinstance(properties, dict) else {}
    declared: set[str] | None = None
    if node.get("additionalProperties") is False:
        declared = set(own)
    if node.get("unevaluatedProperties") is False:
        names = in_place_property_names(node, index)
        if names is not None:
            declared = names if declared is None else declared & names
    if declared is None:
        return None
    allowed = declared - {name for name, sub in own.items() if sub is False}
    if "propertyNames" in node and allowed:
        accepts = _names_check(node["propertyNames"])
        allowed = {name for name in allowed if accepts(name)}
    return allowed, declared


def _names_check(names: Any) -> Callable[[str], bool]:
    """Whether ``propertyNames`` admits a name; always yes when that cannot be told
    without the rest of the document (a reference inside)."""
    if any(
        isinstance(n, dict) and ("$ref" in n or "$dynamicRef" in n)
        for _, n in iter_subschemas(names)
    ):
        return lambda _name: True
    return compile_schema(names, integer_tokens=False).is_valid


def _applied_in_place(
    node: dict[str, Any], index: SchemaIndex, allowed: set[str]
) -> Iterator[dict[str, Any]]:
    """``node`` and every schema applied to the same object: compositions, then/else,
    the dependentSchemas whose trigger may be present, and what references resolve to."""
    seen: set[int] = set()
    stack: list[Any] = [node]
    while stack:
        current = stack.pop()
        if not isinstance(current, dict) or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for rel, sub, role in _children(current):
            if role is Role.PART and not (rel[0] == "dependentSchemas" and rel[1] not in allowed):
                stack.append(sub)
        for keyword in ("$ref", "$dynamicRef"):
            found, target = index.resolve(current.get(keyword))
            if found:
                stack.append(target)


def _demands(
    part: dict[str, Any], allowed: set[str], declared: set[str]
) -> Iterator[tuple[Path, str]]:
    """The demands of one schema that members outside ``allowed`` would be needed for."""

    def forbidden(name: str) -> str:
        if name in declared:
            return (
                "is declared, but the closed object forbids it (a false schema or "
                "propertyNames): allow it, or drop the demand"
            )
        return (
            "is not declared in properties of a closed object: declare it, or open the "
            "object explicitly"
        )

    required = part.get("required")
    if isinstance(required, list):
        for i, name in enumerate(required):
            if name not in allowed:
                yield ("required", i), f"required property {name!r} {forbidden(name)}"
    dependent = part.get("dependentRequired")
    if isinstance(dependent, dict):
        for trigger, names in dependent.items():
            if trigger not in allowed or not isinstance(names, list):
                continue  # a trigger the object forbids never fires
            for i, name in enumerate(names):
                if name not in allowed:
                    yield (
                        ("dependentRequired", trigger, i),
                        f"{trigger!r} requires {name!r}, which {forbidden(name)}",
                    )
    least = part.get("minProperties")
    if type(least) is int and least > len(allowed):
        yield (
            ("minProperties",),
            f"minProperties {least} is more than the closed object allows "
            f"({len(allowed)}): declare more properties, or open the object explicitly",
        )
    options: list[tuple[Path, Any]] = []
    if "const" in part:
        options.append((("const",), part["const"]))
    if isinstance(part.get("enum"), list):
        options.extend((("enum", i), value) for i, value in enumerate(part["enum"]))
    for rel, value in options:
        extra = sorted(set(value) - allowed) if isinstance(value, dict) else []
        if extra:
            yield rel, f"this value holds member {extra[0]!r}, which {forbidden(extra[0])}"
