"""The fast path's plan of a schema: the nodes the walk (``walk.py``) goes along, each a
subschema with a validator of its own compiled on first use, and the validators of its
value keywords, one keyword each.

Why it exists: for every error, jsonschema-rs builds a Python ValidationError (messages,
three paths, a kind object, and the failing value converted back to Python: for an
error at the root, the whole document), about 2 µs each, and translating it into a
deviation costs as much again. Most deviations a gate reports come from the closed
objects registration generates (a missing or extra field, a wrong type, a value out of
its enum or range), and none of those needs an error object to be found.

So for schemas made of such objects the check walks the instance along the schema:
type, ``required``, ``additionalProperties: false`` and the ``unevaluatedProperties:
false`` that closes a ``$ref``'d definition are checked in Python; each member or item
is first asked of jsonschema-rs as a yes/no (``is_valid`` of a validator compiled for
that subschema, which costs no error object), and only a failing one is walked into. A
value keyword (``enum``, ``minimum``, ``pattern``, ``format``, ...) is judged by its own
one-keyword validator; its ``expected`` text depends only on the schema, so it is taken
once from jsonschema-rs's error and kept. Any other subschema is handed to jsonschema-rs
whole, and its errors are translated as in the slow path.

The deviations are identical to the slow path's (property tests hold them to it), and
it is used only where that was shown to hold: schemas whose references are all
``#/$defs/<name>`` (so a subschema compiled with the root's ``$defs`` resolves them as
the whole schema does) and loop only through members or items, and instances without
a float with a zero fraction (the integer-token rule stays with the slow path). A node
jsonschema-rs rejects but the walk finds nothing wrong with is translated from
jsonschema-rs's own errors: a verdict is never lost. One difference is deliberate:
jsonschema-rs 0.61 leaves an empty member name ("") out of the paths it reports, so
the slow path points at the parent object; the walk points at the member.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Set as AbstractSet
from typing import Any

import jsonschema_rs
import msgspec

from ledger.events.gates import Deviation, DeviationKind

from . import prepare as _prepare
from .deviations import _Found, json_type
from .prepare import escape_token, in_place_property_names, iter_subschemas, json_pointer
from .translate import _CompiledView, _required_text, _translate

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

    def translate(
        self, value: Any, pointer: str, compiled: _CompiledView, found: list[_Found]
    ) -> None:
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

    def report(
        self, value: Any, pointer: str, compiled: _CompiledView, found: list[_Found]
    ) -> None:
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
    """A schema position the walk understands (see the module's docstring), or an opaque one."""

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


def _fill_types(node: _Node, schema: dict[str, Any]) -> bool:
    """The node's declared types (none declared: any); False for a ``type`` that is not
    one or a list of JSON type names."""
    declared = schema.get("type")
    if declared is None:
        return True
    names = [declared] if isinstance(declared, str) else declared
    if not (
        isinstance(names, list)
        and names
        and all(isinstance(t, str) and t in _JSON_TYPES for t in names)
    ):
        return False
    node.types, node.admits = _type_sets(tuple(names))
    return True


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

    def __init__(self, compiled: _CompiledView) -> None:
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
        if not set(schema) <= allowed or not _fill_types(node, schema):
            return  # opaque
        if not self._fill_object(node, path, schema):
            return
        if "items" in schema:
            node.items = self.node((*path, "items"), schema["items"])
        node.type_only = node.types is not None and set(schema) - _ANNOTATIONS == {"type"}
        # An array is walked without asking about it first: a validator of the array
        # would be one more compiled copy of its items' (memory), for one question.
        node.direct = node.admits is not None and node.admits <= {list, tuple}
        node.opaque = False

    def _fill_object(self, node: _Node, path: Path, schema: dict[str, Any]) -> bool:
        """An object's members: closed or not, required, each property's node. False
        when the schema says them in a way the walk leaves to jsonschema-rs."""
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        closing = schema.get("additionalProperties", True)
        if not (
            isinstance(properties, dict)
            and isinstance(required, list)
            and all(isinstance(n, str) for n in required)
            and isinstance(closing, bool)
        ):
            return False
        if closing is False:
            if "properties" not in schema or not set(required) <= set(properties):
                # Left to jsonschema-rs, which reports these its own way: the members of
                # a closed object without properties as one false schema at the object
                # (registration adds an empty properties, so that each member is its own
                # extra field); a required name a closed object does not declare
                # (registration refuses it) as missing even when present.
                return False
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
        return True

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
