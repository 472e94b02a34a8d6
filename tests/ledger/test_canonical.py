"""RFC 8785 canonicalisation: the RFC's own examples, and the ``rfc8785`` package as an
oracle on generated documents (floats and unicode included)."""

from __future__ import annotations

import json
import struct
import typing

import msgspec
import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.canonical import CanonicalizationError, canonical_json, canonical_struct

# RFC 8785 Appendix B: IEEE-754 bit patterns and their ECMAScript serialisation.
APPENDIX_B = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


def _double(bits: str) -> float:
    return struct.unpack(">d", bytes.fromhex(bits))[0]


@pytest.mark.parametrize(("bits", "expected"), APPENDIX_B)
def test_appendix_b_numbers(bits: str, expected: str) -> None:
    assert canonical_json(_double(bits)) == expected.encode()


@pytest.mark.parametrize("bits", ["7fffffffffffffff", "7ff0000000000000", "fff0000000000000"])
def test_nan_and_infinity_are_refused(bits: str) -> None:
    with pytest.raises(CanonicalizationError):
        canonical_json(_double(bits))


def test_section_3_2_2_example() -> None:
    # RFC 8785 section 3.2.2 input and its canonical output.
    text = (
        '{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
        ' "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",'
        ' "literals": [null, true, false]}'
    )
    expected = (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    assert canonical_json(json.loads(text)) == expected.encode("utf-8")


def test_section_3_2_3_sorting_by_utf16_code_units() -> None:
    document = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    keys = list(json.loads(canonical_json(document)))
    assert keys == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]


@pytest.mark.parametrize("value", [2**53, -(2**53), 10**30])
def test_integers_outside_the_interoperable_range_are_refused(value: int) -> None:
    with pytest.raises(CanonicalizationError):
        canonical_json({"n": value})


@pytest.mark.parametrize("value", [{1: "x"}, {"b": b"bytes"}, {"s": {1, 2}}])
def test_non_json_values_are_refused(value: object) -> None:
    with pytest.raises(CanonicalizationError):
        canonical_json(value)


safe_ints = st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
finite_floats = st.floats(allow_nan=False, allow_infinity=False)
# Any code point except lone surrogates, which have no UTF-8 form.
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | safe_ints | finite_floats | texts,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(texts, children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=600, deadline=None)
@given(json_values)
def test_matches_the_rfc8785_oracle(value: object) -> None:
    assert canonical_json(value) == rfc8785.dumps(value)


@settings(max_examples=2000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_double_matches_the_oracle(value: float) -> None:
    assert canonical_json(value) == rfc8785.dumps(value)


class _Sample(msgspec.Struct, tag_field="type", tag="sample", kw_only=True):
    count: int
    label: str
    data: typing.Any = None
    items: list[dict[str, typing.Any]] = []


@settings(max_examples=400, deadline=None)
@given(
    safe_ints,
    texts,
    json_values,
    st.lists(st.dictionaries(texts, json_values, max_size=3), max_size=3),
)
def test_structs_match_the_oracle(count: int, label: str, data: object, items: list) -> None:
    sample = _Sample(count=count, label=label, data=data, items=items)
    plain = msgspec.to_builtins(sample)
    if _unsafe_integral_float(plain):  # the log's rule: it would read back as an integer
        with pytest.raises(CanonicalizationError, match="interoperable range"):
            canonical_struct(sample)
        return
    assert canonical_struct(sample) == rfc8785.dumps(plain)


def _unsafe_integral_float(value: object) -> bool:
    if isinstance(value, float):
        return 2**53 - 1 < abs(value) < 1e21 and value.is_integer()
    if isinstance(value, dict):
        return any(_unsafe_integral_float(v) for v in value.values())
    if isinstance(value, list):
        return any(_unsafe_integral_float(v) for v in value)
    return False


def test_struct_fields_outside_the_json_domain_are_refused() -> None:
    with pytest.raises(CanonicalizationError):
        canonical_struct(_Sample(count=2**60, label="x"))
    with pytest.raises(CanonicalizationError):
        canonical_struct(_Sample(count=1, label="x", data={"v": float("nan")}))


class _Inner(msgspec.Struct, kw_only=True):
    size: int
    name: str = ""


class _OneNumber(msgspec.Struct, kw_only=True):
    """One checked field (the check names a lone field twice), a nested Struct with a
    number, an optional nested Struct and a field left out when UNSET."""

    count: int
    label: str = ""
    inner: _Inner | None = None
    maybe: _Inner | msgspec.UnsetType = msgspec.UNSET


class _Strings(msgspec.Struct, kw_only=True):
    """No field admits a number: nothing is checked in Python."""

    a: str
    b: list[str] = []


numbers = safe_ints | st.integers() | finite_floats | st.booleans()


@settings(max_examples=400, deadline=None)
@given(
    count=numbers,
    inner=st.none() | st.builds(_Inner, size=numbers, name=texts),
    maybe=st.just(msgspec.UNSET) | st.builds(_Inner, size=numbers, name=texts),
)
def test_struct_fields_of_every_shape_match_the_oracle(
    count: object, inner: object, maybe: object
) -> None:
    # msgspec does not check types on construction: a declared int may hold a float,
    # a bool or an unsafe integer, and the encoding must then be exact or refuse.
    sample = _OneNumber(count=count, inner=inner, maybe=maybe)  # type: ignore[arg-type]
    builtins = msgspec.to_builtins(sample)
    try:
        expected = rfc8785.dumps(builtins)
    except rfc8785.CanonicalizationError:
        expected = None
    if any(type(v) is int and abs(v) > 2**53 - 1 for v in _leaves(builtins)):
        expected = None  # outside I-JSON's range: refused here (RFC 8785 allows it)
    if _unsafe_integral_float(builtins):
        expected = None  # read back as an integer outside that range: refused too
    if expected is None:
        with pytest.raises(CanonicalizationError):
            canonical_struct(sample)
    else:
        assert canonical_struct(sample) == expected


def _leaves(value: object) -> list[object]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    return [value]


@pytest.mark.parametrize("value", [2**53 - 1, -(2**53 - 1)])
def test_the_edges_of_the_safe_range_are_plain(value: int) -> None:
    assert canonical_struct(_OneNumber(count=value)) == rfc8785.dumps(
        {"count": value, "inner": None, "label": ""}
    )


@pytest.mark.parametrize("value", [2**53, -(2**53)])
def test_just_past_the_safe_range_is_refused_at_any_depth(value: int) -> None:
    with pytest.raises(CanonicalizationError):
        canonical_struct(_OneNumber(count=value))
    with pytest.raises(CanonicalizationError):
        canonical_struct(_OneNumber(count=1, inner=_Inner(size=value)))
    with pytest.raises(CanonicalizationError):
        canonical_struct(_OneNumber(count=1, maybe=_Inner(size=value)))


def test_a_struct_without_numbers_matches_the_oracle() -> None:
    sample = _Strings(a="\ue000x", b=["\U0001f600", "z"])
    assert canonical_struct(sample) == rfc8785.dumps(msgspec.to_builtins(sample))
