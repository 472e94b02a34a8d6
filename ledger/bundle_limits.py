"""Reading hostile bytes: the rules every record of an offline bundle is held to.

A bundle is a file anyone may have written, so it is read defensively. Every record is
held to the intake rules (nested at most ``MAX_DEPTH`` deep, finite numbers, integers
within +-(2^53 - 1)) and to its canonical form, every count and position to its type and
range, every event's delta to the shape of a JSON Patch; whatever breaks a rule is a
problem named with its line, never an exception. This room holds those rules, how a
value from the file is quoted in a problem, how the file is cut into lines without
holding them all at once, and the scan of a payload's bytes for the blobs it may name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import msgspec

from .bundle_format import _encode_sorted, _json, _Leaf
from .canonical import CanonicalizationError, canonical_json
from .errors import LedgerError
from .intake import MAX_DEPTH, MAX_SAFE_INTEGER, InputError, check_json_value

_SHOWN = 80  # the longest value from a bundle quoted in a problem
_MAX_DETAIL = 400  # the longest problem detail
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ULID = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")  # as ledger.store checks ids
_MAX_STREAM = 512
# An event line with at most MAX_DEPTH brackets cannot nest deeper, and one with no run
# of 16 digits holds no integer beyond 10^15 < 2^53: the usual line is cleared by two
# scans in C; only the rest has its payload and delta checked node by node.
_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 16
# RFC 6902: what each operation needs besides "op" and "path".
_PATCH_OPS: dict[str, str | None] = {
    "add": "value",
    "remove": None,
    "replace": "value",
    "move": "from",
    "copy": "from",
    "test": "value",
}
# What decoding an event's payload with the catalog may raise on hostile bytes: msgspec's
# errors, and what an upcaster meets in a document of the wrong shape.
_PAYLOAD_ERRORS = (
    LedgerError,
    msgspec.MsgspecError,
    RecursionError,
    TypeError,
    ValueError,
    KeyError,
    IndexError,
    AttributeError,
)


def _show(value: Any) -> str:
    """``repr`` of a value read from a bundle, clipped: a problem never quotes a
    megabyte."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


_BROKEN: Any = object()  # a record that could not be read (its problem reported)


class _Malformed(Exception):
    """A record that breaks the input rules; its message completes "line N (record) ..."."""


def _plain(data: bytes) -> Any:
    """``data`` as a plain JSON value within the rules of ``ledger.intake``: no exception
    but ``_Malformed`` escapes, however deep, long or odd the bytes are."""
    if not data.strip():
        raise _Malformed("is empty")
    try:
        value = _json(data)
    except RecursionError:  # msgspec gave up near the interpreter's recursion limit
        raise _Malformed(f"is nested deeper than {MAX_DEPTH} levels") from None
    except msgspec.DecodeError as exc:  # ValidationError too: a number out of range
        raise _Malformed(f"is not JSON: {exc}") from None
    try:
        check_json_value(value, "")
    except InputError as exc:
        pointer = exc.pointer if len(exc.pointer) <= 60 else exc.pointer[:57] + "..."
        where = f" at {pointer}" if pointer else ""
        raise _Malformed(f"breaks the input rules{where}: {exc.detail}") from None
    return value


def _position(position: int) -> int | None:
    """A position as a problem names it: none for one no log has (0, negative, beyond
    2^53 - 1, where a JSON reader would round it); the detail still shows it."""
    return position if 0 < position <= MAX_SAFE_INTEGER else None


def _unlike_a_store(e: _Leaf) -> str | None:
    """What in an event's envelope no ``Store`` appends (``RowEncoder.prepare``): a
    stream name that is empty, longer than 512 or not printable, an id that is not a
    ULID, an empty actor."""
    stream = e.stream
    if not stream or len(stream) > _MAX_STREAM or not stream.isprintable():
        return (
            f"stream {_show(stream)} is not a stream name (1 to {_MAX_STREAM} printable characters)"
        )
    for value, what in (
        (e.event_id, "event id"),
        (e.correlation_id, "correlation id"),
        (e.causation_id, "causation id"),
    ):
        if value is not None and _ULID.fullmatch(value) is None:
            return f"{what} {_show(value)} is not a ULID"
    if not e.actor:
        return "its actor is empty"
    return None


def _suspect(line: bytes) -> bool:
    """Whether an event line might nest deeper than the rules allow, or hold an integer
    beyond them (see ``_DIGITS``)."""
    return line.count(b"[") + line.count(b"{") > MAX_DEPTH or _LONG_NUMBER in line.translate(
        _DIGITS
    )


def _is_patch(delta: Any) -> bool:
    """Whether ``delta`` has the shape of an RFC 6902 JSON Patch."""
    if type(delta) is not list:
        return False
    for op in delta:
        if type(op) is not dict or type(op.get("path")) is not str:
            return False
        name = op.get("op")
        if type(name) is not str or name not in _PATCH_OPS:
            return False
        needs = _PATCH_OPS[name]
        if needs == "from" and type(op.get("from")) is not str:
            return False
        if needs == "value" and "value" not in op:
            return False
    return True


def _canonical(value: Any, data: bytes, encode: Any = canonical_json) -> bool:
    """Whether ``data`` is the RFC 8785 form of ``value`` (read from it)."""
    if _encode_sorted(value) == data:  # no floats: the one C call is the answer
        return True
    try:
        return encode(value) == data
    except (CanonicalizationError, RecursionError):
        return False


def _noncanonical(line: bytes) -> str:
    cr = (
        " (it ends in a carriage return: a bundle's lines end in \\n alone)"
        if line.endswith(b"\r")
        else ""
    )
    return f"is not in canonical form{cr}"


def _unsafe_integer(record: msgspec.Struct) -> str | None:
    """The first integer member of a typed record beyond +-(2^53 - 1) (msgspec reads
    any size into an ``int``), described; None when there is none."""
    for name in record.__struct_fields__:
        value = getattr(record, name)
        if type(value) is int and not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return f"breaks the input rules at /{name}: integer outside ±(2^53 - 1)"
        if isinstance(value, msgspec.Struct):
            inner = _unsafe_integer(value)
            if inner is not None:
                return inner.replace(" at /", f" at /{name}/", 1)
        if type(value) is list:
            for i, item in enumerate(value):
                inner = _unsafe_integer(item) if isinstance(item, msgspec.Struct) else None
                if inner is not None:
                    return inner.replace(" at /", f" at /{name}/{i}/", 1)
    return None


def _lines(data: bytes, start: int = 0) -> Iterator[bytes]:
    """The lines of ``data`` from offset ``start``, one at a time (the last one even with
    no newline after it): a file of a billion newlines is not a list of a billion
    lines."""
    end = len(data)
    find = data.find
    while start < end:
        stop = find(b"\n", start)
        if stop < 0:
            yield data[start:]
            return
        yield data[start:stop]
        start = stop + 1


def _line_ends(data: bytes, start: int, count: int, step: int) -> list[int]:
    """Where (at its newline) every ``step``-th of ``count`` lines from ``start`` ends,
    and the last one: the parts ``verify --bundle --jobs`` checks apart. ``data`` has
    at least ``count`` lines from ``start``."""
    ends = []
    find = data.find
    at = start - 1
    for i in range(1, count + 1):
        at = find(b"\n", at + 1)
        if at < 0:  # the last line, with no newline after it
            at = len(data)
        if i % step == 0 or i == count:
            ends.append(at)
    return ends


# A member ``"<name>_sha256": "<64 hex>"`` of a canonical payload: a digest that may name
# a blob. In RFC 8785 bytes a quote inside a string is escaped, so ``_sha256":"`` only
# occurs where a member name ends and its string value begins. Which blobs an event
# references is its type's ``BLOB_FIELDS`` (what export carries and verify requires);
# this looser match only decides whether a carried blob is one no event names, so a
# bundle from an exporter that carried every stored blob any ``*_sha256`` named still
# verifies.
_BLOB_REF = re.compile(rb'_sha256":"([0-9a-f]{64})"')


def _blob_refs(payload: bytes, found: set[str]) -> None:
    found.update(m.decode("ascii") for m in _BLOB_REF.findall(payload))
