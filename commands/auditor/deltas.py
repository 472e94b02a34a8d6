"""A recorded delta (an RFC 6902 patch) applied to the document the audit rebuilt so far.

The plane writes ``add``, ``remove`` and ``replace`` operations only
(``projections.documents.delta``); those are applied here, in place, one dictionary or
list step per pointer token. Any other operation (``move``, ``copy``, ``test``: a
patch the plane did not write, but a correct one all the same) is applied by
``jsonpatch``, as is everything else the auditor could be given. Why not ``jsonpatch``
for all of it: it builds an operation object and a pointer object per operation and
checks each step against the abstract ``Mapping``/``Sequence`` types; on a log of gate
checks that was half of the audit's time. ``tests/commands/auditor/test_audit_deltas.py`` holds this
module to ``jsonpatch``'s answers, failures included.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

__all__ = ["DeltaError", "apply_delta"]

_BAD_ESCAPE = re.compile("~(?![01])")


class DeltaError(ValueError):
    """The patch does not apply to the document (what ``jsonpatch`` would refuse)."""


def apply_delta(doc: Any, patch: Any) -> Any:
    """``doc`` with ``patch`` applied, changed in place where it is a container (the
    result is returned: a patch may replace the whole document); ``patch`` is left as it
    was. ``DeltaError`` when an operation does not apply; the document may then be half
    patched."""
    if not isinstance(patch, list):
        raise DeltaError(f"a patch is a list of operations, not {type(patch).__name__}")
    for op in patch:
        kind = op.get("op") if type(op) is dict else None
        if kind in ("add", "remove", "replace"):
            doc = _apply(doc, op, kind)
        else:
            doc = _by_jsonpatch(doc, op)
    return doc


def _by_jsonpatch(doc: Any, op: Any) -> Any:
    import jsonpatch  # rarely needed: not on the CLI's start-up path

    try:
        return jsonpatch.JsonPatch([op]).apply(doc, in_place=True)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise DeltaError(str(exc)) from None
    except (TypeError, AttributeError, KeyError) as exc:  # an operation of no known shape
        raise DeltaError(f"invalid operation {op!r}: {exc}") from None


def _apply(doc: Any, op: dict[str, Any], kind: str) -> Any:
    path = op.get("path")
    if not isinstance(path, str):
        raise DeltaError(f"operation {kind!r} has no path")
    if kind != "remove" and "value" not in op:
        raise DeltaError(f"operation {kind!r} at {path!r} has no value")
    value = _copied(op.get("value"))
    if path == "":  # the whole document
        if kind == "remove":
            raise DeltaError("the whole document cannot be removed")
        return value
    tokens = _tokens(path)
    parent = doc
    for token in tokens[:-1]:
        parent = _child(parent, token, path)
    last = tokens[-1]
    if type(parent) is dict:
        if kind != "add" and last not in parent:
            raise DeltaError(f"{path!r}: no member {last!r} to {kind}")
        if kind == "remove":
            del parent[last]
        else:
            parent[last] = value
    elif type(parent) is list:
        _in_list(parent, last, kind, value, path)
    else:
        raise DeltaError(f"{path!r}: the parent is no object or array")
    return doc


def _copied(value: Any) -> Any:
    """A container of the patch copied before it joins the document: later operations
    change the document in place, and the patch is the reader's (a bundle's events are
    read again by the next audit)."""
    if type(value) is dict or type(value) is list:
        return msgspec.json.decode(msgspec.json.encode(value))
    return value


def _in_list(items: list[Any], token: str, kind: str, value: Any, path: str) -> None:
    if kind == "add" and token == "-":
        items.append(value)
        return
    index = _index(token, path)
    if kind == "add":
        if index > len(items):
            raise DeltaError(f"{path!r}: index {index} is past the end ({len(items)})")
        items.insert(index, value)
        return
    if index >= len(items):
        raise DeltaError(f"{path!r}: no item {index} to {kind}")
    if kind == "remove":
        del items[index]
    else:
        items[index] = value


def _child(parent: Any, token: str, path: str) -> Any:
    if type(parent) is dict:
        if token not in parent:
            raise DeltaError(f"{path!r}: no member {token!r}")
        return parent[token]
    if type(parent) is list:
        index = _index(token, path)
        if index >= len(parent):
            raise DeltaError(f"{path!r}: no item {index}")
        return parent[index]
    raise DeltaError(f"{path!r}: {token!r} is inside no object or array")


def _index(token: str, path: str) -> int:
    """An array index as RFC 6901 writes it: digits, no leading zero (``0`` itself)."""
    if not token.isascii() or not token.isdigit() or (token[0] == "0" and token != "0"):
        raise DeltaError(f"{path!r}: {token!r} is no array index")
    return int(token)


def _tokens(path: str) -> list[str]:
    """RFC 6901: ``/``-separated, ``~1`` for ``/`` and ``~0`` for ``~``; nothing else
    may follow a ``~``."""
    if path[0] != "/":
        raise DeltaError(f"{path!r} is no JSON pointer (it must start with '/')")
    tokens = path[1:].split("/")
    if "~" not in path:
        return tokens
    if _BAD_ESCAPE.search(path):
        raise DeltaError(f"{path!r}: an escape other than ~0 or ~1")
    return [token.replace("~1", "/").replace("~0", "~") for token in tokens]
