"""The documentation a newcomer reads: it explains ideas in its own words, its links lead
somewhere, and the code it shows runs.

Users never read the design documents the semantics came from, so a doc that says
"seed 001" or names an upstream tool (``fusion_validate``) without explaining it tells
them nothing. docs/concepts.md explains every idea; the other pages link to it.
"""

from __future__ import annotations

import re
import runpy
import typing
from pathlib import Path

import msgspec
import pytest

import ledger
from ledger.events import GlobalConfig
from ledger.events.validation import Outcome

ROOT = Path(__file__).resolve().parent.parent
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
CONCEPTS = ROOT / "docs" / "concepts.md"

# Names of the sources the semantics came from, which no reader can look up.
INTERNAL_NAMES = ("seed 00", "fusion_validate")

# Where naming an origin is fine, and how often: docs/reviews.md may say once that the
# advisory review contract follows an upstream tool of that name, and must show the
# `validation` name a linked review's result carries in a plan (it is stored in ledgers).
ORIGIN_NOTES: dict[tuple[str, str], int] = {("docs/reviews.md", "fusion_validate"): 2}

# Lines excused while someone rewrites them in our own words: each entry excuses the lines
# that contain it, and a test fails when an entry matches nothing any more (none now).
PENDING: dict[str, tuple[str, ...]] = {}


def _name(doc: Path) -> str:
    return doc.relative_to(ROOT).as_posix()


def _unexplained(text: str, name: str) -> list[str]:
    """The lines of a doc that name a source readers cannot look up, beyond the origin
    notes allowed there (none unless ORIGIN_NOTES says so)."""
    excused = PENDING.get(name, ())
    found: dict[str, list[str]] = {n: [] for n in INTERNAL_NAMES}
    for number, line in enumerate(text.splitlines(), 1):
        if any(entry in line for entry in excused):
            continue
        for internal in INTERNAL_NAMES:
            found[internal] += [f"{name}:{number}: {line.strip()}"] * line.lower().count(internal)
    return [
        line
        for internal, lines in found.items()
        if len(lines) > ORIGIN_NOTES.get((name, internal), 0)
        for line in lines
    ]


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_no_doc_names_a_source_readers_cannot_look_up(doc: Path) -> None:
    unexplained = _unexplained(doc.read_text(), _name(doc))
    assert not unexplained, (
        "say what the idea is in our own words (docs/concepts.md), not where it came from:\n"
        + "\n".join(unexplained)
    )


def test_every_pending_excuse_still_matches_a_line() -> None:
    for name, entries in PENDING.items():
        text = (ROOT / name).read_text()
        for entry in entries:
            assert entry in text, f"{name} no longer says {entry!r}: remove it from PENDING"


def test_the_check_finds_a_seed_number_and_counts_origin_notes() -> None:
    assert _unexplained("# New\n\nAs Seed 001 says, a blocker is final.\n", "docs/new.md") == [
        "docs/new.md:3: As Seed 001 says, a blocker is final."
    ]
    note = "The contract follows `fusion_validate`.\n"
    assert _unexplained(note * 2, "docs/reviews.md") == []
    assert len(_unexplained(note * 3, "docs/reviews.md")) == 3
    assert len(_unexplained(note, "docs/concepts.md")) == 1


# -- links ----------------------------------------------------------------------------


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped,
    spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _anchors(doc: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", _prose(doc.read_text()), re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_every_relative_link_leads_to_a_file_and_heading(doc: Path) -> None:
    broken = []
    for match in re.finditer(r"\]\(([^)\s]+)\)", _prose(doc.read_text())):
        target = match.group(1)
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path) if path else doc
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no such heading in {_name(linked)}")
    assert not broken, f"{_name(doc)}: " + "; ".join(broken)


def test_the_readme_links_the_concepts_first() -> None:
    readme = (ROOT / "README.md").read_text()
    docs_section = readme[readme.index("## Documentation") :]
    first_link = re.search(r"\]\(([^)]+)\)", docs_section)
    assert first_link is not None and first_link.group(1) == "docs/concepts.md"
    assert readme.index("docs/concepts.md") < readme.index("## Quickstart")


# -- concepts.md keeps up with the code ------------------------------------------------


def test_concepts_names_every_outcome_and_every_global_config_key() -> None:
    text = CONCEPTS.read_text()
    outcomes = typing.get_args(Outcome)
    assert len(outcomes) == 6
    for outcome in outcomes:
        assert f"| `{outcome}` |" in text, f"concepts.md's outcome table lacks {outcome}"
    for field in msgspec.structs.fields(GlobalConfig):
        assert f"| `{field.name}` |" in text, f"concepts.md's settings lack {field.name}"


# -- the code the docs show runs --------------------------------------------------------


def test_quickstart_takes_a_plan_to_apply_and_the_log_verifies(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """`python examples/quickstart.py` in an empty directory, twice (a rerun makes a new
    plan and project beside the first)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EVIDENCE_DB", db_url)
    for _ in range(2):
        runpy.run_path(str(ROOT / "examples" / "quickstart.py"), run_name="__main__")
        out = capsys.readouterr().out
        assert "input gate: extra_field at '/force'; the call was not made" in out
        assert "validation: blocker" in out and "validation: pass; token minted: True" in out
        assert "verify: ok" in out and "audit: ok" in out, out
    projects = sorted(tmp_path.glob("quickstart-*/greeting.txt"))
    assert len(projects) == 2 and all(p.read_text() == "hello\n" for p in projects)
    with ledger.open(db_url) as store:
        applied = [e for e in store.read_all() if e.type == "plan.applied"]
    assert len(applied) == 2


def test_the_readme_python_api_blocks_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", readme, flags=re.S | re.M)
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("print('hi')\n")
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    assert "plan.created" in out and "verify: True" in out
