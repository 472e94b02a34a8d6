"""A call keeps what its MCP server said within a budget (commands/runner/said.py): a
flood is counted, not held, and a refusal past the budget still counts."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from commands.plane.runs import exchanged
from commands.runner.mcp_client import refused_meanwhile
from commands.runner.said import Said

ENTRIES = st.lists(
    st.fixed_dictionaries(
        {"kind": st.sampled_from(["log", "progress", "sampling"]), "params": st.text()},
        optional={"refused": st.just(True)},
    ),
    max_size=60,
)


@given(ENTRIES, st.integers(min_value=1, max_value=2000))
def test_every_message_is_counted_and_the_kept_fit_the_budget(
    entries: list[dict[str, Any]], cap: int
) -> None:
    said = Said(cap)
    kept = [e for e in entries if said.keep(e)]
    assert list(said) == kept and len(kept) + said.dropped == len(entries)
    assert len(json.dumps(kept, separators=(",", ":"), ensure_ascii=False).encode()) <= max(cap, 2)
    assert said.counts == Counter(e["kind"] for e in entries)
    assert said.refused == sum(1 for e in entries if e.get("refused"))
    assert bool(said) == bool(entries)


def test_a_refusal_past_the_budget_still_fails_the_call() -> None:
    said = Said(cap=200)
    said.append({"kind": "log", "params": {"data": "x" * 150}})
    refusal = {"kind": "sampling", "request": {"m": "y" * 100}, "refused": True}
    assert said.keep(refusal) is False  # not kept: over the budget
    assert refused_meanwhile(said)
    found = exchanged(said)
    assert found is not None and found.counts.refused == 1 and found.counts.dropped == 1
    assert found.counts.sampling == 1 and len(json.loads(found.messages)) == 1


def test_a_first_message_over_the_budget_is_still_recorded_as_said() -> None:
    said = Said(cap=10)
    said.append({"kind": "log", "params": {"data": "x" * 50}})
    found = exchanged(said)
    assert said == [] and found is not None
    assert (found.counts.log, found.counts.dropped, json.loads(found.messages)) == (1, 1, [])


def test_a_recorded_exchange_is_kept_within_the_budget_too() -> None:
    flood = [{"kind": "log", "params": {"data": "x" * 1000}}] * 3000
    found = exchanged(flood)
    assert found is not None and found.counts.log == 3000 and found.counts.dropped
    assert len(found.messages) <= Said().cap
    assert exchanged([]) is None
