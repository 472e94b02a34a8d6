"""RFC 8785 JSON Canonicalization Scheme (JCS).

The hashed bytes of every event are the JCS form of its envelope, so any third party
with the RFC can recompute them. JCS is: no insignificant whitespace, object members
sorted by their UTF-16 code units, strings escaped as ECMAScript's JSON.stringify
does, and numbers printed as ECMAScript prints an IEEE-754 double.

Integers are accepted only inside the interoperable range +-(2**53 - 1) (I-JSON,
RFC 7493): beyond it a double cannot hold the value and two parties could disagree.
NaN and the infinities have no JSON form and are rejected.

What the log stores obeys one more rule (``safe_numbers``, as ``Store.append`` encodes
payloads and deltas): an integral float beyond that range and below 1e21 (``8e15 +
8e15``) is refused too. JCS writes it as integer digits, which every reader reads back as
an integer beyond the range: the input layer's rule (``ledger.intake``), for every path.
"""

from __future__ import annotations

import base64
import binascii
import operator
import typing
from collections.abc import Callable
from typing import Any

import msgspec

__all__ = [
    "CanonicalizationError",
    "canonical_json",
    "canonical_number",
    "canonical_struct",
    "strict_b64decode",
]

MAX_SAFE_INTEGER = 2**53 - 1

# msgspec escapes strings exactly as ECMAScript does (short escapes for \b \t \n \f \r
# \" \\, \u00XX lowercase for other controls, everything else verbatim), which is what
# RFC 8785 section 3.2.2.2 requires; the test suite checks this against the oracle.
_encode_str = msgspec.json.encode


class CanonicalizationError(ValueError):
    """The value has no RFC 8785 form (NaN, an unsafe integer, a non-JSON type)."""


# msgspec's sorted encoding is RFC 8785 exactly when the value is "plain": no floats
# (their format differs, and NaN/Infinity would become null), integers within the safe
# range, object keys whose UTF-16 order equals code-point order, and nothing JSON has
# no type for. Plain values (the usual case) take that one C call; others the exact,
# slower serialiser below.
_encode_sorted = msgspec.json.Encoder(order="sorted").encode


def canonical_json(value: Any, *, safe_numbers: bool = False) -> bytes:
    """Return the RFC 8785 canonical UTF-8 bytes of a JSON-compatible value. With
    ``safe_numbers`` (what the log stores), an integral float outside ±(2^53 - 1) and
    below 1e21 is refused: its canonical form would read back as an unsafe integer."""
    if _is_plain(value):
        return _encode(value)
    return _exact(value, safe_numbers)


def canonical_struct(struct: msgspec.Struct) -> bytes:
    """RFC 8785 bytes of a Struct's JSON form (what ``msgspec.to_builtins`` gives).

    Only the fields whose declared type admits a number or free-form JSON are inspected
    in Python; the rest is encoded by msgspec in one C call. msgspec does not check
    types on construction, so the caller validates the result by decoding it. Numbers
    obey the log's rule (``canonical_json(..., safe_numbers=True)``).
    """
    return struct_encoder(type(struct))(struct)


_STRUCT_ENCODERS: dict[type, Callable[[Any], bytes]] = {}


def struct_encoder(cls: type[msgspec.Struct]) -> Callable[[Any], bytes]:
    """``canonical_struct`` for instances of ``cls``, its per-class lookups done once
    (the store keeps it for every payload class it appends)."""
    known = _STRUCT_ENCODERS.get(cls)
    if known is not None:
        return known
    check = _plain_struct_check(cls)

    def encode(struct: Any) -> bytes:
        if check(struct):
            try:
                return _encode_sorted(struct)
            except UnicodeEncodeError as exc:  # a lone surrogate has no UTF-8 form
                raise CanonicalizationError(str(exc)) from None
        return _exact(msgspec.to_builtins(struct), True)

    _STRUCT_ENCODERS[cls] = encode
    return encode


def _encode(value: Any) -> bytes:
    try:
        return _encode_sorted(value)
    except UnicodeEncodeError as exc:  # a lone surrogate has no UTF-8 form
        raise CanonicalizationError(str(exc)) from None


_CHECKED_FIELDS: dict[type, tuple[str, ...]] = {}


def _checked_fields(cls: type[msgspec.Struct]) -> tuple[str, ...]:
    """Fields whose declared type admits a number or any JSON value, at any depth."""
    fields = _CHECKED_FIELDS.get(cls)
    if fields is None:
        hints = typing.get_type_hints(cls)
        fields = tuple(f for f in cls.__struct_fields__ if _needs_check(hints[f]))
        _CHECKED_FIELDS[cls] = fields
    return fields


def _needs_check(tp: Any) -> bool:
    if tp is Any or tp is float or tp is int:
        return True
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return bool(_checked_fields(tp))
    return any(_needs_check(arg) for arg in typing.get_args(tp) if not isinstance(arg, str))


_STRUCT_CHECKS: dict[type, Callable[[Any], bool]] = {}


def _plain_struct_check(cls: type[msgspec.Struct]) -> Callable[[Any], bool]:
    """``_is_plain`` for instances of ``cls``, made once per class: one C call fetches
    the checked fields, an int (the usual number) is range-checked inline, and only
    other values go through ``_is_plain``. Every payload pays this, so it is lean."""
    check = _STRUCT_CHECKS.get(cls)
    if check is not None:
        return check
    fields = _checked_fields(cls)
    if not fields:
        check = _no_checked_fields
    else:
        # attrgetter of several names gives a tuple (of one, the bare value): a lone
        # field is named twice.
        values = operator.attrgetter(*(fields if len(fields) > 1 else fields * 2))
        unset = msgspec.UNSET

        def check(struct: Any) -> bool:
            for value in values(struct):
                if type(value) is int:
                    if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
                        return False
                # An UNSET field is left out of the encoding (msgspec and to_builtins).
                elif value is not None and value is not unset and not _is_plain(value):
                    return False
            return True

    _STRUCT_CHECKS[cls] = check
    return check


def _no_checked_fields(struct: Any) -> bool:
    return True


def _is_plain(value: Any) -> bool:
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or not _is_plain(item):
                return False
            # UTF-16 order differs from code-point order only at or above U+E000.
            if not key.isascii() and max(key) >= "\ue000":
                return False
        return True
    if kind is list or kind is tuple:
        return all(_is_plain(item) for item in value)
    if isinstance(value, msgspec.Struct):
        return _plain_struct_check(kind)(value)
    return False


def _exact(value: Any, safe_numbers: bool = False) -> bytes:
    parts: list[bytes] = []
    _emit(value, parts.append, safe_numbers)
    return b"".join(parts)


def _unsafe_integral(value: float) -> bool:
    """An integral float that JCS writes as integer digits beyond ±(2^53 - 1)."""
    return MAX_SAFE_INTEGER < abs(value) < 1e21 and value.is_integer()


def canonical_number(value: int | float) -> str:
    """Serialise a number as ECMAScript's Number.prototype.toString does."""
    if type(value) is int:
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return str(value)
        raise CanonicalizationError(
            f"integer {value} is outside the interoperable range +-(2**53 - 1)"
        )
    if value != value or value in (float("inf"), float("-inf")):
        raise CanonicalizationError(f"{value!r} has no JSON representation")
    if value == 0:
        return "0"  # also -0.0
    if value < 0:
        return "-" + _positive_double(-value)
    return _positive_double(value)


def _positive_double(value: float) -> str:
    # repr() gives the shortest digit string that round-trips, as ECMAScript requires;
    # only the placement of the decimal point and the exponent differ.
    text = repr(value)
    mantissa, _, exp = text.partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = whole + frac
    point = len(whole) + (int(exp) if exp else 0)
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0") or "0"
    k, n = len(digits), point
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + digits
    e = n - 1
    sign = "+" if e >= 0 else "-"
    head = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{head}e{sign}{abs(e)}"


def _utf16_key(key: str) -> bytes:
    return key.encode("utf-16-be")


def _emit(value: Any, out: Any, safe_numbers: bool = False) -> None:
    """Write ``value`` canonically (RFC 8785) through ``out``.

    Kept whole: one type dispatch per JSON value of every event hashed; a function
    per type would add a call per value."""
    kind = type(value)
    if kind is str:
        out(_encode_str(value))
    elif kind is dict:
        keys = list(value)
        for key in keys:
            if type(key) is not str:
                raise CanonicalizationError(f"object key {key!r} is not a string")
        # Code-point order equals UTF-16 order unless a key holds a character at or
        # above U+E000 (surrogate pairs sort below U+E000..U+FFFF in UTF-16).
        if keys and max("".join(keys), default="\x00") >= "\ue000":
            keys.sort(key=_utf16_key)
        else:
            keys.sort()
        out(b"{")
        first = True
        for key in keys:
            if not first:
                out(b",")
            first = False
            out(_encode_str(key))
            out(b":")
            _emit(value[key], out, safe_numbers)
        out(b"}")
    elif kind is list or kind is tuple:
        out(b"[")
        first = True
        for item in value:
            if not first:
                out(b",")
            first = False
            _emit(item, out, safe_numbers)
        out(b"]")
    elif value is None:
        out(b"null")
    elif value is True:
        out(b"true")
    elif value is False:
        out(b"false")
    elif kind is int or kind is float:
        if safe_numbers and kind is float and _unsafe_integral(value):
            raise CanonicalizationError(
                f"{value!r} is an integer outside the interoperable range +-(2**53 - 1) "
                "(its canonical form is integer digits, read back as such an integer)"
            )
        out(canonical_number(value).encode("ascii"))
    else:
        raise CanonicalizationError(f"{kind.__name__} is not a JSON type")


def strict_b64decode(text: str) -> bytes | None:
    """Standard base64, or None. Only the canonical encoding is accepted, so one value
    has exactly one textual form (no malleability through padding bits or whitespace):
    what is signed or hashed cannot be re-spelled."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, AttributeError):
        return None
    return raw if base64.b64encode(raw).decode("ascii") == text else None
