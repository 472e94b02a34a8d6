"""A recorded delta (an RFC 6902 patch) applied to the document the audit rebuilt so far.

The plane writes ``add``, ``remove`` and ``replace`` operations only
(``projections.documents.delta``); those are applied here, in place, one dictionary or
list step per pointer token. Any other operation (``move``, ``copy``, ``test``: a
patch the plane did not write, but a correct one all the same) is applied by
``jsonpatch``, as is everything else the auditor could be given. Why not ``jsonpatch``
for all of it: it builds an operation object and a pointer object per operation and
checks each step against the abstract ``Mapping``/``Sequence`` types; on a log of gate
checks that was half of the audit's time. ``tests/commands/auditor/test_audit_deltas.py``
holds this module to ``jsonpatch``'s answers, failures included.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

__all__ = ["DeltaError", "apply_delta", "misplaced", "same_json"]

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


def misplaced(patch: Any, doc: Any) -> str | None:
    """The path of the first value an ``add`` or ``replace`` of ``patch`` placed that is
    another JSON value than ``doc`` (the fold) holds there, though Python's ``==`` says
    they are equal: ``true`` against ``1``, ``false`` against ``0``. None when there is
    none. Called once the rebuilt document equals the fold by ``==``: only a value the
    patch placed can differ from it by its JSON type. An operation whose place a later
    one of the same patch touches is not checked (the later one decides what is there).
    One pass from the last operation back: on the audit's every event."""
    ops = [op for op in patch if type(op) is dict] if isinstance(patch, list) else []
    later = _Later(doc)
    first = None
    for op in reversed(ops):
        path = op.get("path")
        if op.get("op") in ("add", "replace") and isinstance(path, str):
            try:
                found = later.placed(path)
            except (DeltaError, IndexError, KeyError, TypeError, ValueError):
                found = _UNCHECKED
            if found is not _UNCHECKED and not same_json(op.get("value"), found):
                first = path
        later.add(op)
    return first


_UNCHECKED = object()


class _Later:
    """What the operations after one have touched: their places (``path`` and ``from``),
    every place above those, the arrays whose items they move, and the appends to each
    array (which move no item before them)."""

    def __init__(self, doc: Any) -> None:
        self.doc = doc
        self.places: set[str] = set()
        self.above: set[str] = set()
        self.moved: set[str] = set()
        self.appends: dict[str, int] = {}

    def add(self, op: dict[str, Any]) -> None:
        for role, other in (("path", op.get("path")), ("from", op.get("from"))):
            if not isinstance(other, str):
                continue
            parent = other.rpartition("/")[0]
            if role == "path" and op.get("op") == "add" and self._appends(other):
                self.appends[parent] = self.appends.get(parent, 0) + 1
            else:
                self.places.add(other)
                self.moved.add(parent)
            while other:
                other = other.rpartition("/")[0]
                self.above.add(other)

    def _appends(self, path: str) -> bool:
        """``path`` (of an ``add``) appends to an array."""
        if not path.endswith("/-"):
            return False
        try:
            return type(_at(self.doc, path[:-2])) is list
        except (DeltaError, IndexError, KeyError, TypeError, ValueError):
            return False

    def placed(self, path: str) -> Any:
        """What ``doc`` holds where an operation at ``path`` placed its value, or
        ``_UNCHECKED`` when a later operation touches that place: the place itself, one
        above or below it, or (an array's item) another item of that array, which moves
        it. An append placed its value before the later appends to that array."""
        if path in self.places or path in self.above:
            return _UNCHECKED
        above = path
        while above:
            above = above.rpartition("/")[0]
            if above in self.places:
                return _UNCHECKED
        if path == "":
            return self.doc
        parent_path, _, last = path.rpartition("/")
        parent = _at(self.doc, parent_path)
        if type(parent) is not list:
            return _at(self.doc, path)
        if parent_path in self.moved:
            return _UNCHECKED
        if last != "-":
            return _at(self.doc, path)
        index = len(parent) - 1 - self.appends.get(parent_path, 0)
        if index < 0:
            raise IndexError(path)
        return parent[index]


def _at(doc: Any, path: str) -> Any:
    if path == "":
        return doc
    for token in _tokens(path):
        doc = doc[-1 if token == "-" else int(token)] if type(doc) is list else doc[token]
    return doc


def same_json(a: Any, b: Any) -> bool:
    """The same JSON value: as ``==``, but a boolean is never a number (an integer and a
    float of the same value are the same JSON number)."""
    if type(a) is bool or type(b) is bool:
        return type(a) is type(b) and a == b
    if type(a) is dict:
        return type(b) is dict and a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if type(a) is list:
        return type(b) is list and len(a) == len(b) and all(map(same_json, a, b))
    return bool(a == b)


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
