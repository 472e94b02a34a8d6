"""Each event's structural delta (``projections.documents.delta``): an RFC 6902 patch
that turns the stream document before into the one after — exactly, types included —
whether the states are plain JSON or the state Structs the folds share parts between."""

from __future__ import annotations

from typing import Any

import jsonpatch
import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.events import GateChecked
from projections.documents import delta, fold, new_plan, to_json
from tests.helpers import plan_created

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["a", "b", "a/b", "~0", ""]), inner, max_size=4)
    ),
    max_leaves=12,
)
documents = st.dictionaries(st.sampled_from(["a", "b", "c", "x/y", "m~n"]), json_values)


def _exact(value: Any) -> bytes:
    return msgspec.json.encode(value, order="sorted")


# Two recursive documents per example: on a loaded two-core machine their generation
# alone has tripped the too-slow health check (a timing, not a finding).
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(documents, documents)
def test_the_patch_turns_before_into_after_exactly(before: dict, after: dict) -> None:
    patched = jsonpatch.apply_patch(before, delta(before, after), in_place=False)
    assert _exact(patched) == _exact(after)


@given(st.lists(json_values, max_size=4), st.lists(json_values, max_size=4))
def test_a_list_that_grew_is_patched_with_its_new_items(head: list, tail: list) -> None:
    before, after = {"l": head}, {"l": head + tail}
    ops = delta(before, after)
    assert all(op["op"] == "add" and op["path"] == "/l/-" for op in ops)
    assert _exact(jsonpatch.apply_patch(before, ops, in_place=False)) == _exact(after)


def test_one_and_true_and_one_point_zero_are_different_values() -> None:
    for old, new in [(1, True), (1, 1.0), (0, False), ([1], [True])]:
        assert delta({"v": old}, {"v": new}) == [{"op": "replace", "path": "/v", "value": new}]


def test_a_fold_of_a_long_plan_is_patched_with_what_changed_only() -> None:
    """A plan state with many steps: the next gate check's delta names the new step and
    the counters it moved, not the steps already there."""
    doc = new_plan(plan_created().payload)
    for i in range(200):
        doc = fold("plan:P-1", doc, _check(i))
    after = fold("plan:P-1", doc, _check(200))
    ops = delta(doc, after)
    assert {op["path"] for op in ops if op["path"].startswith("/steps/")} == {"/steps/s200"}
    patched = jsonpatch.apply_patch(to_json(doc), ops, in_place=False)
    assert _exact(patched) == _exact(to_json(after))


def _check(i: int) -> GateChecked:
    return GateChecked(
        plan_id="P-1",
        gate="input",
        verdict="pass",
        tool="read",
        tool_version=1,
        step=f"s{i}",
        attempt=1,
        iteration=0,
        strict_mode=False,
        checked_sha256="0" * 64,
        schema_sha256=None,
        deviations=[],
    )
