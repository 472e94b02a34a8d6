"""The store's ULIDs: python-ulid's format and ordering, made without its objects."""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ulid import ULID

from ledger import ids
from ledger.ids import is_ulid, new_ulid, new_ulids


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Freeze the clock ids read; the test moves it by setting ``[0]`` (nanoseconds)."""
    now = [1_764_000_000_123 * 1_000_000]
    monkeypatch.setattr(ids.time, "time_ns", lambda: now[0])
    monkeypatch.setattr(ids, "_last_ms", -1)  # start a fresh millisecond
    return now


def test_a_new_id_is_a_ulid_of_now() -> None:
    before = ULID().milliseconds
    made = new_ulid()
    after = ULID().milliseconds
    assert is_ulid(made)
    parsed = ULID.from_str(made)
    assert str(parsed) == made
    assert before <= parsed.milliseconds <= after


@settings(max_examples=300, deadline=None)
@given(ms=st.integers(0, 2**48 - 1), random=st.binary(min_size=10, max_size=10))
def test_the_encoding_is_python_ulid_s(ms: int, random: bytes) -> None:
    saved = (ids.time.time_ns, ids.os.urandom, ids._last_ms)
    try:
        ids.time.time_ns = lambda: ms * 1_000_000  # type: ignore[assignment]
        ids.os.urandom = lambda n: random  # type: ignore[assignment]
        ids._last_ms = -1
        made = new_ulid()
    finally:
        ids.time.time_ns, ids.os.urandom, ids._last_ms = saved  # type: ignore[assignment]
    assert made == str(ULID.from_bytes(ms.to_bytes(6, "big") + random))


@settings(max_examples=200, deadline=None)
@given(
    ms=st.integers(0, 2**48 - 1),
    random=st.integers(0, 2**80 - 1).map(lambda r: min(r, 2**80 - 40)),
    count=st.integers(1, 40),
)
def test_ids_made_at_once_are_python_ulid_s(ms: int, random: int, count: int) -> None:
    saved = (ids.time.time_ns, ids.os.urandom, ids._last_ms)
    try:
        ids.time.time_ns = lambda: ms * 1_000_000  # type: ignore[assignment]
        ids.os.urandom = lambda n: random.to_bytes(10, "big")  # type: ignore[assignment]
        ids._last_ms = -1
        made = new_ulids(count)
    finally:
        ids.time.time_ns, ids.os.urandom, ids._last_ms = saved  # type: ignore[assignment]
    expected = [
        str(ULID.from_bytes(ms.to_bytes(6, "big") + (random + k).to_bytes(10, "big")))
        for k in range(count)
    ]
    assert made == expected


def test_ids_of_one_millisecond_increase_by_one(frozen: list[int]) -> None:
    made = [new_ulid() for _ in range(1000)]
    assert made == sorted(made) and len(set(made)) == 1000
    values = [int(ULID.from_str(m)) for m in made]
    assert all(b - a == 1 for a, b in itertools.pairwise(values))
    assert {ULID.from_str(m).milliseconds for m in made} == {frozen[0] // 1_000_000}


def test_ids_made_at_once_continue_the_sequence(frozen: list[int]) -> None:
    """An append makes its ids in one call: the same ids, one by one, as single calls."""
    before = new_ulid()
    batch = new_ulids(500)
    after = new_ulid()
    values = [int(ULID.from_str(m)) for m in [before, *batch, after]]
    assert len(batch) == 500 and all(b - a == 1 for a, b in itertools.pairwise(values))
    assert new_ulids(0) == []


def test_exhausted_randomness_in_a_batch_is_an_error_not_a_repeat(
    frozen: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    new_ulid()
    monkeypatch.setattr(ids, "_last_random", 2**80 - 3)
    with pytest.raises(OverflowError):
        new_ulids(3)
    assert len(new_ulids(2)) == 2  # nothing was taken by the refused call


def test_a_new_millisecond_draws_fresh_randomness(frozen: list[int]) -> None:
    first = new_ulid()
    frozen[0] += 1_000_000
    second = new_ulid()
    assert second[:10] != first[:10] and second > first
    # Not the previous randomness plus one (that chance is 2**-80).
    assert int(ULID.from_str(second)) & (2**80 - 1) != (int(ULID.from_str(first)) & (2**80 - 1)) + 1


def test_exhausted_randomness_is_an_error_not_a_repeat(
    frozen: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    new_ulid()
    monkeypatch.setattr(ids, "_last_random", 2**80 - 1)
    with pytest.raises(OverflowError):
        new_ulid()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_repeat_its_parent_s_ids(frozen: list[int]) -> None:
    new_ulid()  # the parent is inside a millisecond when it forks
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: same clock, same millisecond
        try:
            os.write(write, new_ulid().encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    assert is_ulid(child)
    assert child != new_ulid()


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("01ARZ3NDEKTSV4RRFFQ69G5FAV", True),
        ("7ZZZZZZZZZZZZZZZZZZZZZZZZZ", True),
        ("8ZZZZZZZZZZZZZZZZZZZZZZZZZ", False),  # more than 128 bits
        ("01ARZ3NDEKTSV4RRFFQ69G5FA", False),
        ("01ARZ3NDEKTSV4RRFFQ69G5FAVV", False),
        ("01arz3ndektsv4rrffq69g5fav", False),  # the store's ids are upper case
        ("01ARZ3NDEKTSV4RRFFQ69G5FAI", False),  # I is not Crockford
        ("", False),
    ],
)
def test_is_ulid(value: str, ok: bool) -> None:
    assert is_ulid(value) is ok
