"""The audit's own application of a recorded delta (``commands.auditor.deltas``) gives
``jsonpatch``'s answer on every patch: the same document, or a refusal where it refuses,
on patches the plane writes and on hostile ones (bad pointers, bad indexes, missing
members, operations it never writes). And what ``==`` cannot see (``true`` is ``1`` to
Python): a value a patch placed is another JSON value than the fold's, never a false
alarm on what a patch really placed."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commands.auditor.deltas import DeltaError, apply_delta, misplaced
from projections.documents import delta

KEYS = ["a", "b", "a/b", "~", "m~n", "", "0", "-"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)
    ),
    max_leaves=10,
)
documents = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=4)
tokens = st.sampled_from(
    ["a", "b", "a~1b", "~0", "m~0n", "", "0", "1", "2", "01", "-", "~", "~2", "x", "-1", " 1"]
)
pointers = st.lists(tokens, max_size=3).map(lambda ts: "".join("/" + t for t in ts))
operations = st.one_of(
    st.fixed_dictionaries(
        {"op": st.sampled_from(["add", "replace"]), "path": pointers, "value": json_values}
    ),
    st.fixed_dictionaries({"op": st.just("remove"), "path": pointers}),
    st.fixed_dictionaries(
        {"op": st.sampled_from(["add", "replace"]), "path": pointers}
    ),  # no value
    st.fixed_dictionaries(
        {"op": st.sampled_from(["move", "copy"]), "from": pointers, "path": pointers}
    ),
    st.fixed_dictionaries({"op": st.just("test"), "path": pointers, "value": json_values}),
    st.fixed_dictionaries({"op": st.just("bogus"), "path": pointers}),
)


def _exact(value: Any) -> bytes:
    return msgspec.json.encode(value, order="sorted")


def _theirs(doc: Any, patch: list[Any]) -> bytes | None:
    try:
        return _exact(jsonpatch.apply_patch(copy.deepcopy(doc), patch, in_place=False))
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException):
        return None


def _ours(doc: Any, patch: list[Any]) -> bytes | None:
    try:
        return _exact(apply_delta(copy.deepcopy(doc), copy.deepcopy(patch)))
    except DeltaError:
        return None


@settings(max_examples=600)
@given(documents, st.lists(operations, min_size=1, max_size=4))
def test_any_patch_gives_jsonpatchs_answer(doc: dict, patch: list) -> None:
    assert _ours(doc, patch) == _theirs(doc, patch)


@given(documents, documents)
def test_the_planes_own_deltas_rebuild_the_document(before: dict, after: dict) -> None:
    assert _ours(before, delta(before, after)) == _exact(after)


@settings(max_examples=600)
@given(documents, st.lists(operations, min_size=1, max_size=4))
def test_what_a_patch_placed_is_never_misplaced(doc: dict, patch: list) -> None:
    try:
        applied = apply_delta(copy.deepcopy(doc), copy.deepcopy(patch))
    except DeltaError:
        return
    assert misplaced(patch, applied) is None


def _as_numbers(value: Any) -> Any:
    """``value`` with each boolean written as the number Python takes it for."""
    if type(value) is bool:
        return int(value)
    if isinstance(value, dict):
        return {k: _as_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_numbers(v) for v in value]
    return value


@given(documents, documents)
def test_a_boolean_written_as_a_number_is_found(before: dict, after: dict) -> None:
    honest = delta(before, after)
    forged = [{**op, "value": _as_numbers(op["value"])} if "value" in op else op for op in honest]
    assert misplaced(honest, after) is None
    assert (misplaced(forged, after) is None) == (
        forged == honest and _exact(forged) == _exact(honest)
    )


@pytest.mark.parametrize(
    ("doc", "patch"),
    [
        ({"a": 1}, [{"op": "remove", "path": ""}]),
        ({"a": [1]}, [{"op": "add", "path": "/a/01", "value": 2}]),
        ({"a": [1]}, [{"op": "replace", "path": "/a/-", "value": 2}]),
        ({"a": [1]}, [{"op": "add", "path": "/a/2", "value": 2}]),
        ({"a": 1}, [{"op": "add", "path": "/a/b", "value": 2}]),
        ({"a": 1}, [{"op": "add", "path": "a", "value": 2}]),
        ({"a~": 1}, [{"op": "remove", "path": "/a~"}]),
        ({"a~2": 1}, [{"op": "remove", "path": "/a~2"}]),
        ({"a": 1}, [{"op": "replace", "path": "/b", "value": 2}]),
        ({"a": 1}, "not a list"),
    ],
)
def test_hostile_patches_are_refused(doc: Any, patch: Any) -> None:
    with pytest.raises(DeltaError):
        apply_delta(doc, patch)
    if isinstance(patch, list):  # and jsonpatch refuses them too
        assert _theirs(doc, patch) is None


def test_the_whole_document_can_be_replaced() -> None:
    assert apply_delta({"a": 1}, [{"op": "replace", "path": "", "value": [1]}]) == [1]


def test_the_patch_is_left_as_it_was() -> None:
    """A bundle's events are read again by the next audit: the document patched later
    never shares a container with the patch."""
    patch = [
        {"op": "add", "path": "/a", "value": {"b": []}},
        {"op": "add", "path": "/a/b/-", "value": 1},
        {"op": "replace", "path": "/c", "value": [{"d": 1}]},
        {"op": "add", "path": "/c/0/e", "value": 2},
    ]
    before = copy.deepcopy(patch)
    assert apply_delta({"c": 0}, patch) == {"a": {"b": [1]}, "c": [{"d": 1, "e": 2}]}
    assert patch == before
