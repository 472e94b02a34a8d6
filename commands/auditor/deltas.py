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
    one of the same patch touches is not checked (the later one decides what is there)."""
    ops = [op for op in patch if type(op) is dict] if isinstance(patch, list) else []
    for i, op in enumerate(ops):
        path = op.get("path")
        if op.get("op") not in ("add", "replace") or not isinstance(path, str):
            continue
        try:
            found, appends, in_list = _placed(doc, path, ops[i + 1 :])
        except (DeltaError, IndexError, KeyError, TypeError, ValueError):
            continue
        later = (o for o in ops[i + 1 :] if o.get("op") != "add" or o.get("path") != appends)
        if any(_touches(path, o, in_list) for o in later):
            continue
        if not same_json(op.get("value"), found):
            return path
    return None


def _placed(doc: Any, path: str, later: list[dict[str, Any]]) -> tuple[Any, str | None, bool]:
    """What ``doc`` holds where an operation at ``path`` placed its value, the pointer
    of an append to the same array (later appends there move nothing), and whether
    ``path`` names an array's item. An append (``-``) placed its value before the later
    appends to that array."""
    if path == "":
        return doc, None, False
    parent_path, _, last = path.rpartition("/")
    parent = _at(doc, parent_path)
    if type(parent) is not list:
        return _at(doc, path), None, False
    appends = parent_path + "/-"
    if last != "-":
        return _at(doc, path), appends, True
    index = (
        len(parent) - 1 - sum(1 for o in later if o.get("op") == "add" and o.get("path") == appends)
    )
    if index < 0:
        raise IndexError(path)
    return parent[index], appends, True


def _touches(path: str, op: dict[str, Any], in_list: bool) -> bool:
    """``op`` reads or writes ``path``, a place above or below it, or (``path`` naming
    an array's item) another item of that array: an insertion there moves what ``path``
    names."""
    parent = path.rpartition("/")[0]
    for other in (op.get("path"), op.get("from")):
        if not isinstance(other, str):
            continue
        if other == path or other.startswith(path + "/") or path.startswith(other + "/"):
            return True
        if in_list and other.rpartition("/")[0] == parent:
            return True
    return path == ""


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
