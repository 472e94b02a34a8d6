"""The list of mutants stays current (docs/testing.md "Mutation testing").

Running the mutants takes minutes (``python -m tests.mutation.run``); checking that the
list still fits the code takes none, so it is part of the quick suite: every mutant's
original snippet occurs exactly once in its file (a check edited without its mutant
fails here, naming the mutant to update), its tests exist, and every transition rule of
``projections/plan_rules.py`` has a mutant that removes it.
"""

from __future__ import annotations

import ast
import inspect

import projections.plan_rules as plan_rules
from tests.mutation.run import ROOT, load, problems


def test_every_mutant_fits_the_code() -> None:
    mutants = load()
    assert len(mutants) >= 40
    assert problems(mutants, ROOT) == []


def test_every_mutant_says_why_and_equivalents_say_why_not() -> None:
    for m in load():
        assert m.why.strip() and m.tests, m.id
        assert "/" in m.id, f"{m.id}: ids are group/name"
        if m.equivalent is not None:
            assert len(m.equivalent) > 40, f"{m.id}: say why no test can kill it"


def test_every_transition_rule_has_its_mutant() -> None:
    """A new rule in plan_rules lands with its mutant (and its case in
    tests/test_plan_rules.py, which checks the other half)."""
    snippets = "\n".join(m.original for m in load() if m.file == "projections/plan_rules.py")
    tree = ast.parse(inspect.getsource(plan_rules))
    unlisted = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Return):
            continue
        for value in (
            (node.value.body, node.value.orelse)
            if isinstance(node.value, ast.IfExp)
            else (node.value,)
        ):
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                text = value.value
            elif isinstance(value, ast.JoinedStr):
                text = max(
                    (str(v.value) for v in value.values if isinstance(v, ast.Constant)), key=len
                )
            else:
                continue
            line = ast.get_source_segment(inspect.getsource(plan_rules), node) or text
            if text.strip() not in snippets and line.strip() not in snippets:
                unlisted.append(text)
    assert not unlisted, (
        f"transition rules without a mutant in tests/mutation/mutants.toml: {unlisted}"
    )
