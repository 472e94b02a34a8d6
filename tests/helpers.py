"""Small builders shared by the tests."""

from __future__ import annotations

from ledger import NewEvent
from ledger.events import PlanCreated, StrategyRecorded


def plan_created(plan_id: str = "P-1", **kw: object) -> NewEvent:
    return NewEvent(
        payload=PlanCreated(plan_id=plan_id, project="proj", resources=["repo:api"]), **kw
    )


def strategy(plan_id: str = "P-1", text: str = "fix the tests", revision: int = 0) -> NewEvent:
    return NewEvent(payload=StrategyRecorded(plan_id=plan_id, revision=revision, strategy=text))
