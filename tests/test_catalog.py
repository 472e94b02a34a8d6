"""The event catalog is complete, self-describing and documented."""

from __future__ import annotations

from pathlib import Path

import msgspec

from ledger.events import ALL_EVENT_TYPES, AnyEvent, GateChecked, PlanHalted
from ledger.events.doc import render

DOCS = Path(__file__).resolve().parent.parent / "docs" / "events.md"


def test_every_type_declares_its_stream_delta_and_version() -> None:
    names = [cls.type_name() for cls in ALL_EVENT_TYPES]
    assert len(names) == len(set(names))
    for cls in ALL_EVENT_TYPES:
        assert cls.STREAM.split(":")[0] in {"tool", "skill", "attachment", "approver",
                                            "plan", "review"}, cls
        assert cls.DELTA and cls.__doc__, cls
        assert cls.SCHEMA_VERSION >= 1


def test_the_mission_vocabulary_is_covered() -> None:
    names = {cls.type_name() for cls in ALL_EVENT_TYPES}
    for needed in [
        "tool.registered", "validation.registered", "skill.defined", "attachment.created",
        "attachment.detached", "plan.created", "plan.execute_entered", "gate.checked",
        "tool.called", "validation.run_started", "validation.result_recorded",
        "validation.run_completed", "plan.fix_recorded", "plan.strategy_revision_requested",
        "plan.escalated", "plan.decision_recorded", "plan.token_minted",
        "plan.token_consumed", "plan.halted", "plan.compensation_requested",
        "plan.applied", "review.started", "review.report_committed", "approver_key.added",
        "approver_key.revoked",
    ]:
        assert needed in names


def test_payloads_decode_through_the_tagged_union() -> None:
    halt = PlanHalted(plan_id="P-1", halt_type="environment_error",
                      final_decision="environment_error", raw_halt_type="coder_missing",
                      reason="pytest not on PATH", hint="pip install pytest",
                      phase="execute", attempt=1)
    gate = GateChecked(plan_id="P-1", gate="input", tool="ghost", verdict="fail",
                       attempt=1, iteration=1, strict_mode=False, checked_sha256="0" * 64)
    for payload in (halt, gate):
        assert msgspec.json.decode(msgspec.json.encode(payload), type=AnyEvent) == payload
    assert halt.default_stream() == "plan:P-1"


def test_docs_events_md_is_generated_from_the_catalog() -> None:
    assert DOCS.read_text() == render(), (
        "docs/events.md is stale: run `python -m ledger.events.doc > docs/events.md`"
    )
