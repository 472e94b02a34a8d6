"""One vocabulary for the same fact: a plan rendered through every reader — the run
summary, `plan list`, `plan show`, `plan history`, the HTML report and `stats` — says
the same words for how it ended and for its outcome. One plan applied after a blocker
(its old halt is history, not its state) and one ended by a strict-mode deviation
(compensated), on both backends."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import REPO, run_cli

EXAMPLES = REPO / "examples"


def _show(url: str, plan_id: str) -> dict[str, str]:
    shown = run_cli("plan", "show", plan_id, "--db", url).stdout
    pairs = [line.split("  ", 1) for line in shown.split("\n\n")[0].splitlines()]
    return {key.strip(): value.strip() for key, value in pairs if len(pairs) and key}


@pytest.mark.parametrize(
    ("example", "state", "outcome"),
    [("green-after-fix", "applied", "pass"), ("strict-output-deviation", "compensated", "blocker")],
)
def test_every_reader_says_the_same_words(
    db_url: str, tmp_path: Path, example: str, state: str, outcome: str
) -> None:
    root = tmp_path / example
    shutil.copytree(EXAMPLES / example, root)
    ran = run_cli("run", str(root / "plan.yaml"), "--db", db_url, "--json")
    summary = json.loads(ran.stdout)["run"]
    plan_id = summary["plan_id"]
    assert (summary["state"], summary["outcome"]) == (state, outcome)

    listed = run_cli("plan", "list", "--db", db_url, "--json")
    (row,) = [p for p in json.loads(listed.stdout)["plans"] if p["plan_id"] == plan_id]
    table = run_cli("plan", "list", "--db", db_url).stdout.splitlines()
    (line,) = [t for t in table if t.startswith(plan_id)]
    assert line.split()[4:6] == [outcome, state]  # outcome, terminal columns

    shown = _show(db_url, plan_id)
    assert (shown["terminal"], shown["outcome"]) == (state, outcome)
    if state == "applied":
        assert shown["halt"] == "-"  # the blocker it got past is history, not its state

    history = json.loads(run_cli("plan", "history", plan_id, "--db", db_url, "--json").stdout)
    assert (history["state"], history["outcome"]) == (state, outcome)
    text = run_cli("plan", "history", plan_id, "--db", db_url).stdout
    assert text.rstrip().endswith(f"state: {state} (outcome {outcome})")

    html = tmp_path / "report.html"
    reported = run_cli("report", plan_id, "--html", str(html), "--db", db_url)
    assert reported.returncode == 0, reported.stderr
    page = html.read_text()
    assert f">{state}<" in page and f">{outcome}<" in page

    stats = json.loads(run_cli("stats", "--db", db_url, "--json").stdout)
    (planned,) = [p for p in stats["plans"] if p["plan"] == plan_id]
    assert planned["outcome"] == outcome
    assert row["outcome"] == outcome
