"""Plans: creation in Strategize, strict global_config, list/show; and the projections
commands. CLI runs as a real subprocess on both backends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ledger
from commands.plane import CommandRefused, Plane
from commands.plane.plans import create_plan, get_plan, list_plans
from projections.states import to_json
from tests.helpers import assert_refused, run_cli


def test_create_list_show(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()  # a resource written as a path must exist
    with Plane.open(db_url) as plane:
        doc = create_plan(
            plane,
            "P-17",
            project="api",
            resources=["repo:api", "./src"],
            config={"strict_mode": True, "retry_limit": 5},
        )
        assert doc.phase == "strategize" and doc.revision == 0
        assert to_json(doc)["global_config"] == {
            "strict_mode": True,
            "retry_limit": 5,
            "max_strategy_revisions": 1,
            "max_iterations": 3,
            "require_validation": True,
        }
        create_plan(plane, "P-18", project="web", resources=["repo:web"])
        assert list(list_plans(plane)) == ["P-17", "P-18"]
        assert list(list_plans(plane, project="web")) == ["P-18"]
        assert get_plan(plane, "P-17") == doc
        (event,) = plane.store.read_stream("plan:P-17")
        assert {op["path"] for op in event.delta} >= {"/phase", "/global_config"}


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"plan_id": "P 1"}, "invalid plan id"),
        ({"project": ""}, "invalid project"),
        ({"resources": []}, "at least one"),
        ({"resources": ["a b"]}, "invalid resource"),
        ({"resources": ["a", "a"]}, "listed twice"),
        ({"config": {"strict": True}}, "unknown field `strict`"),
        ({"config": {"strict_mode": "true"}}, "Expected `bool`"),
        ({"config": {"retry_limit": 1.0}}, "Expected `int`"),
        ({"config": {"max_iterations": 0}}, ">= 1"),
    ],
)
def test_refused_plans_append_nothing(db_url: str, kwargs: dict, fragment: str) -> None:
    with Plane.open(db_url) as plane:
        call = {"plan_id": "P-1", "project": "api", "resources": ["repo:api"], **kwargs}
        with pytest.raises(CommandRefused, match=fragment.replace("(", r"\(")):
            create_plan(plane, call.pop("plan_id"), **call)
        assert plane.store.head().size == 0


def test_cli(db_url: str, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"strict_mode": True}))
    made = run_cli(
        "plan",
        "create",
        "P-1",
        "--project",
        "api",
        "--resource",
        "repo:api",
        "--config",
        f"@{config}",
        "--json",
        "--db",
        db_url,
    )
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["plan"]["global_config"]["strict_mode"] is True
    listed = json.loads(run_cli("--db", db_url, "plan", "list", "--json").stdout)
    assert [p["plan_id"] for p in listed["plans"]] == ["P-1"]
    shown = run_cli("plan", "show", "P-1", "--db", db_url)
    assert "strict_mode=true" in shown.stdout and "strategize" in shown.stdout
    status = json.loads(run_cli("projections", "status", "--json", "--db", db_url).stdout)
    assert {p["name"]: p["lag"] for p in status["projections"]} == {
        "tools": 0,
        "skills": 0,
        "attachments": 0,
        "plans": 0,
        "outcomes": 0,
        "approvers": 0,
        "analytics": 0,
    }
    rebuilt = run_cli("projections", "rebuild", "plans", "--db", db_url)
    assert rebuilt.returncode == 0 and "rebuilt plans" in rebuilt.stdout
    for bad, fragment in [
        (["plan", "create", "P-1", "--project", "api", "--resource", "r"], "already exists"),
        (["plan", "create", "P-2", "--project", "api"], "--resource"),
        (
            ["plan", "create", "P-2", "--project", "api", "--resource", "r", "--config", "[]"],
            "JSON object",
        ),
        (
            [
                "plan",
                "create",
                "P-2",
                "--project",
                "api",
                "--resource",
                "r",
                "--config",
                "@/no/such.json",
            ],
            "no such file",
        ),
        (["plan", "show", "P-404"], "unknown plan"),
        (["projections", "rebuild", "nope"], "unknown projection"),
    ]:
        assert_refused(run_cli(*bad, "--db", db_url), fragment)
    with ledger.open(db_url) as store:
        assert store.head().size == 1
