"""The fast path's walk: an instance along the plan of its schema (``plan.py``), type,
``required``, ``additionalProperties: false`` and a ``$ref``'d definition's
``unevaluatedProperties: false`` checked in Python, each member or item first asked of
jsonschema-rs as a yes/no and walked into only when it fails.
"""

from __future__ import annotations

from typing import Any

from ledger.events.gates import Deviation

from .deviations import _Found, json_type
from .plan import _Node
from .prepare import escape_token
from .translate import _CompiledView


def _walk(
    node: _Node, value: Any, pointer: str, compiled: _CompiledView, found: list[_Found]
) -> None:
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
    node: _Node, value: Any, pointer: str, compiled: _CompiledView, found: list[_Found]
) -> None:
    """The deviations of ``value`` from a walkable node: its type or its value keywords
    (numbers, strings, sizes, enums, formats) here, then its members or items."""
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
        _walk_members(node, value, pointer, compiled, found)
    elif (kind is list or kind is tuple) and node.items is not None:
        _walk_items(node.items, value, pointer, compiled, found)


def _walk_members(
    node: _Node, value: dict[str, Any], pointer: str, compiled: _CompiledView, found: list[_Found]
) -> None:
    """An object: its missing required names, its extra members when closed, and each
    declared member that fails its own schema, walked into."""
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


def _walk_items(
    sub: _Node, value: Any, pointer: str, compiled: _CompiledView, found: list[_Found]
) -> None:
    """An array: each item that fails the ``items`` schema, walked into."""
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
