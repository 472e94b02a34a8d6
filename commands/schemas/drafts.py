"""The JSON Schema drafts a tool may declare, and their translation to 2020-12.

Real tool servers declare schemas in every draft since draft-04 (the official MCP
servers, through zod-to-json-schema, in draft-07). The ledger accepts draft-04,
draft-06, draft-07, 2019-09 and 2020-12, chosen by the root ``$schema`` (see
:data:`DRAFT_OF_URI`); a schema without one is 2020-12, as the MCP specification says.

Design: the declared schema is checked against its OWN draft's meta-schema (so a
problem is reported as that draft defines it, at its pointer in the declared
document), then :func:`upgrade` rewrites it into an equivalent 2020-12 document.
Everything after that (references, closing, the digest, the checker and its fast path)
sees 2020-12 only: one set of strictness rules, one engine, however the tool declared
it. The declared form is recorded as declared; the upgraded one is what is closed.

What the upgrade translates (each a case of the specifications' own changes):

- ``items: [...]`` -> ``prefixItems``, and ``additionalItems`` -> ``items`` next to it
  (``additionalItems`` beside a single ``items`` schema, or none, is ignored by every
  draft that has it, so it is dropped).
- ``dependencies`` -> ``dependentRequired`` (array values) / ``dependentSchemas``
  (schema values). 2019-09 no longer defines ``dependencies``, but its meta-schema
  still constrains it and implementations keep asserting it for compatibility; so
  does the checker's engine in 2020-12, so it is translated there too.
- draft-04's boolean ``exclusiveMaximum``/``exclusiveMinimum``: ``true`` turns the
  paired ``maximum``/``minimum`` into the numeric exclusive bound; ``false`` is dropped.
- draft-04's ``id`` is ``$id``. A plain-name fragment (``"#foo"``, in draft-04/06/07)
  names a location, not a base URI: it becomes ``$anchor: foo``. Any other identifier
  stays ``$id`` and is refused as it is in 2020-12 (one self-contained document).
- draft-04/06/07: the siblings of ``$ref`` are ignored by those drafts, so only the
  ``$ref`` is kept (with ``definitions``/``$defs``, so what references target stays).
- 2019-09: ``$recursiveRef`` is ``$ref`` and ``$recursiveAnchor`` is dropped. In one
  document without ``$id`` there is one schema resource, so the dynamic scope holds
  nothing else the recursion could land on.
- keywords the declared draft does not define but 2020-12 gives meaning to
  (``const`` in draft-04, ``if`` in draft-06, ``prefixItems`` in 2019-09, ...) are
  dropped: under their own draft they are unknown words without effect.
- a local ``$ref`` JSON pointer through a renamed keyword is rewritten
  (``#/items/0`` -> ``#/prefixItems/0``, ``#/dependencies/a`` ->
  ``#/dependentSchemas/a``, ``#/additionalItems`` -> ``#/items``).

Problems found after the upgrade are reported at their pointer in the DECLARED schema
(:meth:`Upgraded.declared_pointer`).
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable
from enum import Enum
from typing import Any
from urllib.parse import quote, unquote

import jsonschema_rs

__all__ = [
    "DRAFT_OF_URI",
    "META_SCHEMA_URIS",
    "Draft",
    "Upgraded",
    "draft_of",
    "meta_validator",
    "upgrade",
]


class Draft(Enum):
    DRAFT4 = "draft-04"
    DRAFT6 = "draft-06"
    DRAFT7 = "draft-07"
    DRAFT2019_09 = "2019-09"
    DRAFT2020_12 = "2020-12"


# Each draft's meta-schema URI as its specification writes it.
META_SCHEMA_URIS: dict[Draft, str] = {
    Draft.DRAFT4: "http://json-schema.org/draft-04/schema#",
    Draft.DRAFT6: "http://json-schema.org/draft-06/schema#",
    Draft.DRAFT7: "http://json-schema.org/draft-07/schema#",
    Draft.DRAFT2019_09: "https://json-schema.org/draft/2019-09/schema",
    Draft.DRAFT2020_12: "https://json-schema.org/draft/2020-12/schema",
}


def _spellings(uri: str) -> list[str]:
    # Generators write them with and without the empty fragment, over http and https.
    rest = uri.rstrip("#").split("://", 1)[1]
    return [f"{scheme}://{rest}{tail}" for scheme in ("http", "https") for tail in ("", "#")]


DRAFT_OF_URI: dict[str, Draft] = {
    spelling: draft for draft, uri in META_SCHEMA_URIS.items() for spelling in _spellings(uri)
}

_OLD = frozenset({Draft.DRAFT4, Draft.DRAFT6, Draft.DRAFT7})  # $ref ignores its siblings


def draft_of(schema: Any) -> Draft | None:
    """The draft the root ``$schema`` names (2020-12 without one); None for any other."""
    if not isinstance(schema, dict) or "$schema" not in schema:
        return Draft.DRAFT2020_12
    uri = schema["$schema"]
    return DRAFT_OF_URI.get(uri) if isinstance(uri, str) else None


_VALIDATOR_CLASSES: dict[Draft, Any] = {
    Draft.DRAFT4: jsonschema_rs.Draft4Validator,
    Draft.DRAFT6: jsonschema_rs.Draft6Validator,
    Draft.DRAFT7: jsonschema_rs.Draft7Validator,
    Draft.DRAFT2019_09: jsonschema_rs.Draft201909Validator,
    Draft.DRAFT2020_12: jsonschema_rs.Draft202012Validator,
}


@functools.cache
def meta_validator(draft: Draft) -> Any:
    """A validator of schemas against ``draft``'s meta-schema. jsonschema-rs bundles each
    draft's meta-schemas in the registry of that draft's validator class (offline, so
    nothing is ever fetched)."""
    uri = META_SCHEMA_URIS[draft]
    return _VALIDATOR_CLASSES[draft]({"$schema": uri, "$ref": uri}, offline=True)


# --- the keywords -------------------------------------------------------------------------

# What jsonschema-rs's 2020-12 validator gives meaning to (assertions, applicators,
# identifiers and references; its compatibility ``dependencies`` included). A keyword
# here that the declared draft does not define is dropped: kept, it would start to count.
_MEANINGFUL_2020 = frozenset(
    {
        "$id", "$anchor", "$dynamicAnchor", "$ref", "$dynamicRef", "$recursiveRef",
        "$recursiveAnchor", "$vocabulary", "allOf", "anyOf", "oneOf", "not", "if", "then",
        "else", "dependentSchemas", "dependencies", "prefixItems", "items", "additionalItems",
        "contains", "properties", "patternProperties", "additionalProperties",
        "propertyNames", "unevaluatedItems", "unevaluatedProperties", "type", "const", "enum",
        "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
        "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems",
        "maxContains", "minContains", "maxProperties", "minProperties", "required",
        "dependentRequired", "format", "contentSchema", "contentEncoding", "contentMediaType",
    }
)  # fmt: skip

_DRAFT4 = frozenset(
    {
        "id", "$ref", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
        "exclusiveMinimum", "maxLength", "minLength", "pattern", "additionalItems", "items",
        "maxItems", "minItems", "uniqueItems", "maxProperties", "minProperties", "required",
        "additionalProperties", "definitions", "properties", "patternProperties",
        "dependencies", "enum", "type", "format", "allOf", "anyOf", "oneOf", "not",
    }
)  # fmt: skip
_DRAFT6 = (_DRAFT4 - {"id"}) | {"$id", "const", "contains", "propertyNames"}
_DRAFT7 = _DRAFT6 | {"if", "then", "else", "contentMediaType", "contentEncoding"}
_DRAFT2019 = (_MEANINGFUL_2020 - {"$dynamicAnchor", "$dynamicRef", "prefixItems"}) | {"definitions"}
# ``$defs`` is kept in every draft: it is where definitions are looked up by pointer,
# and a definition has no effect unless a ``$ref`` applies it.
_KNOWN: dict[Draft, frozenset[str]] = {
    Draft.DRAFT4: _DRAFT4 | {"$defs"},
    Draft.DRAFT6: _DRAFT6 | {"$defs"},
    Draft.DRAFT7: _DRAFT7 | {"$defs"},
    Draft.DRAFT2019_09: _DRAFT2019 | {"$defs"},
}

# Keywords whose value holds subschemas, by shape (in every draft that has them).
_SINGLE = frozenset(
    {
        "additionalProperties", "contains", "propertyNames", "not", "if", "then", "else",
        "unevaluatedItems", "unevaluatedProperties", "contentSchema",
    }
)  # fmt: skip
_MAPS = frozenset({"properties", "patternProperties", "definitions", "$defs", "dependentSchemas"})
_ARRAYS = frozenset({"allOf", "anyOf", "oneOf"})

# A 2020-12 anchor; a draft-04/06/07 plain-name fragment outside it stays an (refused) $id.
_ANCHOR = re.compile(r"[A-Za-z_][-A-Za-z0-9._]*")

_EXCLUSIVE = {"maximum": "exclusiveMaximum", "minimum": "exclusiveMinimum"}

Path = tuple[str, ...]
# Where a translated keyword goes: (the schema object that holds it, that object's path).
_Slot = Callable[[str, str], tuple[dict[str, Any], Path]]


class Upgraded:
    """A declared schema as the equivalent 2020-12 document, with the way back from a
    place in that document to the place in the declared one."""

    def __init__(
        self, draft: Draft, document: Any, back: dict[Path, tuple[Path, dict[str, str]]]
    ) -> None:
        self.draft = draft  # as declared
        self.document = document
        # upgraded schema position -> (declared position, {upgraded keyword: declared})
        self._back = back

    def declared_path(self, path: list[str | int] | tuple[str | int, ...]) -> Path:
        """Where a place in the upgraded document comes from in the declared schema."""
        tokens = tuple(str(t) for t in path)
        for cut in range(len(tokens), -1, -1):
            hit = self._back.get(tokens[:cut])
            if hit is None:
                continue
            declared, renamed = hit
            rest = tokens[cut:]
            if rest:
                rest = (renamed.get(rest[0], rest[0]), *rest[1:])
            return declared + rest
        return tokens

    def declared_pointer(self, path: list[str | int] | tuple[str | int, ...]) -> str:
        return "".join(
            "/" + t.replace("~", "~0").replace("/", "~1") for t in self.declared_path(path)
        )


def upgrade(schema: Any, draft: Draft) -> Upgraded:
    """``schema`` (valid against ``draft``'s meta-schema) as an equivalent 2020-12
    document; the input is not mutated. A 2020-12 schema is returned as it is, but a
    root ``$schema`` spelled otherwise than the two forms 2020-12 schemas were always
    accepted with is written canonically."""
    if draft is Draft.DRAFT2020_12:
        uri = META_SCHEMA_URIS[draft]
        if isinstance(schema, dict) and schema.get("$schema", uri) not in (uri, uri + "#"):
            schema = {**schema, "$schema": uri}
        return Upgraded(draft, schema, {})
    return _Upgrade(draft).run(schema)


class _Upgrade:
    def __init__(self, draft: Draft) -> None:
        self.draft = draft
        self.known = _KNOWN[draft]
        self.back: dict[Path, tuple[Path, dict[str, str]]] = {}  # see Upgraded
        self.forth: dict[Path, Path] = {}  # declared schema position -> upgraded
        self.references: list[dict[str, Any]] = []  # upgraded schema objects with a $ref

    def run(self, schema: Any) -> Upgraded:
        document = self.node(schema, (), ())
        self._rewrite_references()
        if isinstance(document, dict):
            # The root names the draft the document now is (nested ones were dropped).
            document = {"$schema": META_SCHEMA_URIS[Draft.DRAFT2020_12], **document}
        return Upgraded(self.draft, document, self.back)

    def node(self, node: Any, declared: Path, upgraded: Path) -> Any:
        if not isinstance(node, dict):
            return node  # a boolean schema (the meta-schema refused anything else)
        place = _Place(self, node, declared, upgraded)
        out, renamed, slot = place.out, place.renamed, place.slot
        # The translations that rename a keyword are here, in their order; the keywords
        # kept under their own name (a subschema by shape, a value), or dropped, are
        # looked up in _KEYWORDS (anything else is copied as it is).
        for key in place.keys:
            value = node[key]
            if key == "$schema" or key not in self.known:
                self._undefined(place, key, value)
            elif key == "items" and isinstance(value, list):
                renamed["prefixItems"] = key
                out["prefixItems"] = [
                    self.node(v, (*declared, key, str(i)), (*upgraded, "prefixItems", str(i)))
                    for i, v in enumerate(value)
                ]
            elif key == "dependencies" and isinstance(value, dict):
                self._dependencies(value, declared, slot)
            elif key in ("maximum", "minimum") and node.get(_EXCLUSIVE[key]) is True:
                renamed[_EXCLUSIVE[key]] = key
                out[_EXCLUSIVE[key]] = copy.deepcopy(value)
            elif key == "$recursiveRef":
                holder, _ = slot("$ref", key)
                holder["$ref"] = copy.deepcopy(value)
            else:
                _KEYWORDS.get(key, _Upgrade._copy)(self, place, key, value)
        return place.finish()

    def _undefined(self, place: _Place, key: str, value: Any) -> None:
        """``$schema``, or a keyword the declared draft does not define."""
        if key == "$schema":
            if not place.declared:
                return  # the root's is set by run()
            if isinstance(value, str) and DRAFT_OF_URI.get(value) is self.draft:
                return  # restates the document's draft
            place.out[key] = copy.deepcopy(value)  # another draft: refused (Upgraded.draft)
        elif key not in _MEANINGFUL_2020:
            place.out[key] = copy.deepcopy(value)  # an annotation under both drafts

    def _copy(self, place: _Place, key: str, value: Any) -> None:
        place.out[key] = copy.deepcopy(value)

    def _drop(self, place: _Place, key: str, value: Any) -> None:
        """draft-04's boolean exclusive bounds (folded into their bound by ``node``, or
        false), and 2019-09's ``$recursiveAnchor``."""
        if key == "$recursiveAnchor" or isinstance(value, bool):
            return
        place.out[key] = copy.deepcopy(value)

    def _additional_items(self, place: _Place, key: str, value: Any) -> None:
        if isinstance(place.node.get("items"), list):  # otherwise ignored by its draft
            place.renamed["items"] = key
            place.out["items"] = self.node(
                value, (*place.declared, key), (*place.upgraded, "items")
            )

    def _single(self, place: _Place, key: str, value: Any) -> None:
        place.out[key] = self.node(value, (*place.declared, key), (*place.upgraded, key))

    def _map(self, place: _Place, key: str, value: Any) -> None:
        if not isinstance(value, dict):
            place.out[key] = copy.deepcopy(value)
            return
        declared, upgraded = place.declared, place.upgraded
        place.out[key] = {
            name: self.node(v, (*declared, key, name), (*upgraded, key, name))
            for name, v in value.items()
        }

    def _array(self, place: _Place, key: str, value: Any) -> None:
        if not isinstance(value, list):
            place.out[key] = copy.deepcopy(value)
            return
        declared, upgraded = place.declared, place.upgraded
        place.out[key] = [
            self.node(v, (*declared, key, str(i)), (*upgraded, key, str(i)))
            for i, v in enumerate(value)
        ]

    def _identifier(self, place: _Place, key: str, value: Any) -> None:
        keyword, translated = "$id", copy.deepcopy(value)
        if isinstance(value, str) and value.startswith("#") and self.draft in _OLD:
            # Before 2019-09 a plain-name fragment was how a location got a name.
            name = unquote(value[1:])
            if name and _ANCHOR.fullmatch(name):
                keyword, translated = "$anchor", name
        place.out[keyword] = translated
        if keyword != key:
            place.renamed[keyword] = key

    def _dependencies(self, value: dict[str, Any], declared: Path, slot: _Slot) -> None:
        required = {k: copy.deepcopy(v) for k, v in value.items() if isinstance(v, list)}
        if required:
            holder, _ = slot("dependentRequired", "dependencies")
            holder["dependentRequired"] = required
        schemas = {k: v for k, v in value.items() if not isinstance(v, list)}
        if schemas:
            holder, where = slot("dependentSchemas", "dependencies")
            holder["dependentSchemas"] = {
                name: self.node(
                    v, (*declared, "dependencies", name), (*where, "dependentSchemas", name)
                )
                for name, v in schemas.items()
            }

    def _rewrite_references(self) -> None:
        """Local JSON-pointer references whose target moved now point where it is."""
        for holder in self.references:
            ref = holder["$ref"]
            if not (isinstance(ref, str) and ref.startswith("#/")):
                continue
            tokens = tuple(
                t.replace("~1", "/").replace("~0", "~") for t in unquote(ref[2:]).split("/")
            )
            moved = self.forth.get(tokens)
            if moved is not None and moved != tokens:
                pointer = "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in moved)
                # Percent-encoded as a URI fragment: "%" in a name must not read as an escape.
                holder["$ref"] = "#" + quote(pointer, safe="/~!$&'()*+,;=:@-._")


class _Place:
    """One schema object being upgraded: what it becomes (``out``), where it is in both
    documents, and which keywords it renames (recorded in ``back`` for the way back)."""

    __slots__ = (
        "base",
        "declared",
        "keys",
        "node",
        "out",
        "parts",
        "renamed",
        "upgrade",
        "upgraded",
    )

    def __init__(
        self, upgrade: _Upgrade, node: dict[str, Any], declared: Path, upgraded: Path
    ) -> None:
        self.upgrade = upgrade
        self.node = node
        self.declared = declared
        self.upgraded = upgraded
        self.renamed: dict[str, str] = {}
        upgrade.back[upgraded] = (declared, self.renamed)
        upgrade.forth[declared] = upgraded
        keys = list(node)
        if upgrade.draft in _OLD and "$ref" in node:
            # "All other properties in a $ref object MUST be ignored" (draft-04 to 07).
            keys = [k for k in keys if k in ("$ref", "definitions", "$defs")]
        self.keys = keys
        self.out: dict[str, Any] = {}
        # A translated keyword whose 2020-12 name the node declares too (2019-09's
        # ``$recursiveRef`` beside ``$ref``, ``dependencies`` beside ``dependentSchemas``)
        # goes into an allOf part appended after the declared ones: applied in place,
        # as it was.
        self.parts: list[dict[str, Any]] = []
        declared_parts = node.get("allOf") if "allOf" in keys else None
        self.base = len(declared_parts) if isinstance(declared_parts, list) else 0

    def slot(self, keyword: str, source: str) -> tuple[dict[str, Any], Path]:
        """Where the translation of ``source`` into ``keyword`` goes (see _Slot)."""
        if keyword in self.node and keyword in self.upgrade.known:
            part: dict[str, Any] = {}
            where = (*self.upgraded, "allOf", str(self.base + len(self.parts)))
            self.parts.append(part)
            self.upgrade.back[where] = (self.declared, {keyword: source})
            return part, where
        self.renamed[keyword] = source
        return self.out, self.upgraded

    def finish(self) -> dict[str, Any]:
        out, parts = self.out, self.parts
        if parts:
            out.setdefault("allOf", []).extend(parts)
        self.upgrade.references.extend(h for h in (out, *parts) if "$ref" in h)
        return out


# The keywords ``_Upgrade.node`` hands on by name (the others are copied as they are).
_Keyword = Callable[[_Upgrade, _Place, str, Any], None]
_KEYWORDS: dict[str, _Keyword] = {
    "additionalItems": _Upgrade._additional_items,
    "exclusiveMaximum": _Upgrade._drop,
    "exclusiveMinimum": _Upgrade._drop,
    "$recursiveAnchor": _Upgrade._drop,
    "id": _Upgrade._identifier,
    "$id": _Upgrade._identifier,
    **dict.fromkeys(_SINGLE | {"items"}, _Upgrade._single),
    **dict.fromkeys(_MAPS, _Upgrade._map),
    **dict.fromkeys(_ARRAYS, _Upgrade._array),
}
