"""The size and complexity targets of the product's code (docs/architecture.md, "Rooms
of one concept"): no module over 900 lines, no function over cyclomatic complexity 20
(radon's measure) or 100 lines, unless its docstring says why it must be, in a sentence
that starts with ``Kept whole:`` (a hot loop measured whole, say).

The test reports every function or module over a target without that sentence, so a
change that grows one past it says so in CI, with its measure.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from radon.complexity import cc_visit

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ledger", "projections", "commands")
MAX_MODULE_LINES = 900
MAX_COMPLEXITY = 20
MAX_FUNCTION_LINES = 100
KEPT = "Kept whole:"


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _docstrings(tree: ast.Module) -> dict[tuple[str, int], str]:
    """Each function's docstring by (name, first line) as radon numbers them."""
    found: dict[tuple[str, int], str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found[(node.name, node.lineno)] = ast.get_docstring(node) or ""
    return found


def _over(path: Path, root: Path = ROOT) -> dict[str, str]:
    """What of ``path`` is over a target without saying why: ``PATH`` (the module) or
    ``PATH NAME`` (a function) -> its measures."""
    text = path.read_text()
    tree = ast.parse(text)
    where = str(path.relative_to(root))
    over = {}
    lines = text.count("\n")
    if lines > MAX_MODULE_LINES and KEPT not in (ast.get_docstring(tree) or ""):
        over[where] = f"{lines} lines (at most {MAX_MODULE_LINES})"
    docstrings = _docstrings(tree)
    for function in cc_visit(text):
        if hasattr(function, "methods"):  # a class: its methods come on their own
            continue
        length = function.endline - function.lineno + 1
        measures = []
        if function.complexity > MAX_COMPLEXITY:
            measures.append(f"CC {function.complexity} (at most {MAX_COMPLEXITY})")
        if length > MAX_FUNCTION_LINES:
            measures.append(f"{length} lines (at most {MAX_FUNCTION_LINES})")
        if measures and KEPT not in docstrings.get((function.name, function.lineno), ""):
            over[f"{where} {function.fullname}"] = ", ".join(measures)
    return over


def test_every_module_and_function_is_within_the_targets_or_says_why() -> None:
    over = [
        f"{key}: {measure}" for path in _modules() for key, measure in sorted(_over(path).items())
    ]
    assert over == [], "over a target, without a sentence saying why:\n" + "\n".join(over)


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("def f(x):\n" + "".join(f"    if x == {i}: return {i}\n" for i in range(25)), "CC 26"),
        ("def f():\n" + "    x = 1\n" * 101, "102 lines"),
        ("x = 1\n" * 901, "901 lines"),
    ],
)
def test_the_check_finds_what_is_over(tmp_path: Path, source: str, found: str) -> None:
    module = tmp_path / "probe.py"
    module.write_text(source)
    assert any(found in measure for measure in _over(module, tmp_path).values())
    kept = source.replace("def f(x):\n", f'def f(x):\n    """{KEPT} a probe."""\n')
    kept = kept.replace("def f():\n", f'def f():\n    """{KEPT} a probe."""\n')
    if kept.startswith("x = 1"):
        kept = f'"""{KEPT} a probe."""\n' + kept
    module.write_text(kept)
    assert _over(module, tmp_path) == {}
