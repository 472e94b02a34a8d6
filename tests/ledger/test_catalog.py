"""The event catalog is complete, self-describing and documented."""

from __future__ import annotations

import typing

import msgspec
import pytest

from ledger.canonical import canonical_struct
from ledger.events import (
    ALL_EVENT_TYPES,
    DEFAULT_CATALOG,
    AnyEvent,
    Catalog,
    EventPayload,
    GateChecked,
    PlanHalted,
    ValidationResultRecorded,
)
from ledger.events.doc import render
from tests.helpers import REPO

DOCS = REPO / "docs" / "events.md"


def test_every_type_declares_its_stream_delta_and_version() -> None:
    names = [cls.type_name() for cls in ALL_EVENT_TYPES]
    assert len(names) == len(set(names))
    for cls in ALL_EVENT_TYPES:
        assert cls.STREAM.split(":")[0] in {
            "tool",
            "skill",
            "attachment",
            "approver",
            "plan",
            "review",
            "credential",
            "approval_policy",
            "ledger",
        }, cls
        assert cls.DELTA and cls.__doc__, cls
        assert cls.SCHEMA_VERSION >= 1


def test_the_mission_vocabulary_is_covered() -> None:
    names = {cls.type_name() for cls in ALL_EVENT_TYPES}
    for needed in [
        "tool.registered",
        "validation.registered",
        "skill.defined",
        "attachment.created",
        "attachment.detached",
        "plan.created",
        "plan.execute_entered",
        "gate.checked",
        "tool.called",
        "validation.run_started",
        "validation.result_recorded",
        "validation.run_completed",
        "plan.fix_recorded",
        "plan.strategy_revision_requested",
        "plan.escalated",
        "plan.decision_recorded",
        "plan.token_minted",
        "plan.token_consumed",
        "plan.halted",
        "plan.compensation_requested",
        "plan.applied",
        "review.started",
        "review.report_committed",
        "approver_key.added",
        "approver_key.revoked",
    ]:
        assert needed in names


def test_payloads_decode_through_the_tagged_union() -> None:
    halt = PlanHalted(
        plan_id="P-1",
        halt_type="environment_error",
        final_decision="environment_error",
        raw_halt_type="coder_missing",
        reason="pytest not on PATH",
        hint="pip install pytest",
        phase="execute",
        attempt=1,
    )
    gate = GateChecked(
        plan_id="P-1",
        gate="input",
        tool="ghost",
        verdict="fail",
        attempt=1,
        iteration=1,
        strict_mode=False,
        checked_sha256="0" * 64,
    )
    for payload in (halt, gate):
        assert msgspec.json.decode(msgspec.json.encode(payload), type=AnyEvent) == payload
    assert halt.default_stream() == "plan:P-1"


# Which payload fields name a stored blob, and where the plane stores it (commands/).
# Not listed, though named *_sha256: tool.registered input/output_schema_sha256 (the
# registration stores no blob), attachment.created args_sha256, review.started
# request_sha256, plan.token_minted token_sha256, and the results digests.
BLOB_REFERENCES = {
    "gate.checked": ("schema_sha256", "checked_sha256"),  # gates._record: raw + schema
    # runs.call_tool: params + output, and what an MCP server said meanwhile (proxy)
    "tool.called": ("params_sha256", "output_sha256", "exchange_sha256"),
    "mcp.fetched": ("content_sha256", "given_sha256"),  # proxy.record_fetch: what was read
    # input_rounds: the call's arguments, the server's questions / the agent's answers
    "mcp.input_required": ("params_sha256", "asked_sha256", "exchange_sha256"),
    "mcp.input_given": ("params_sha256", "given_sha256"),
    "validation.result_recorded": ("raw_output_sha256", "stderr_sha256"),  # runs: both streams
    "plan.fix_recorded": ("diff_sha256",),  # lifecycle.record_fix: the diff
    "plan.changes_recorded": ("changes_sha256",),  # lifecycle.apply_plan: the change set
    "plan.execute_entered": ("snapshot_sha256",),  # phases.enter_execute: the snapshot
    "validation.run_started": ("trees_sha256",),  # runs.validate_plan: the trees judged
    "plan.token_minted": ("trees_sha256",),  # the run's trees blob, bound by the token
    "plan.compensation_completed": ("output_sha256",),  # driver._compensate: the output
    "review.report_committed": ("report_sha256",),  # reviews._commit: the report
    "review.role_ran": ("stdout_sha256",),  # review_host: a reviewer program's stdout
}


def test_blob_fields_are_declared_where_the_plane_stores_blobs() -> None:
    declared = {cls.type_name(): cls.BLOB_FIELDS for cls in ALL_EVENT_TYPES if cls.BLOB_FIELDS}
    assert declared == BLOB_REFERENCES
    assert set(DEFAULT_CATALOG.blob_readers()) == set(BLOB_REFERENCES)
    assert "- blob references: `schema_sha256`, `checked_sha256`\n" in render()


def test_every_blob_field_is_a_digest_field_of_its_type() -> None:
    for cls in ALL_EVENT_TYPES:
        fields = {f.name: f for f in msgspec.structs.fields(cls)}
        assert len(set(cls.BLOB_FIELDS)) == len(cls.BLOB_FIELDS), cls
        for name in cls.BLOB_FIELDS:
            assert name in fields, f"{cls.type_name()}: BLOB_FIELDS names no field {name!r}"
            assert name.endswith("_sha256"), (cls, name)
            tp = fields[name].type
            # None, or absent (UNSET: a field added later, so older bytes stay as they were)
            allowed = {str, type(None), msgspec.UnsetType}
            assert set(typing.get_args(tp) or (tp,)) <= allowed, (cls, name, tp)


def test_a_catalog_refuses_a_blob_field_that_is_not_a_field() -> None:
    class Broken(EventPayload, tag="test.broken", kw_only=True):
        """A type whose blob field is misspelt."""

        STREAM = "plan:{plan_id}"
        DELTA = "nothing"
        BLOB_FIELDS = ("output_sha265",)

        plan_id: str
        output_sha256: str

    with pytest.raises(ValueError, match="output_sha265"):
        Catalog([Broken])


def test_blob_refs_from_the_payload_and_from_its_stored_bytes() -> None:
    gate = GateChecked(
        plan_id="P-1",
        gate="input",
        tool="ghost",
        verdict="fail",
        attempt=1,
        iteration=1,
        strict_mode=False,
        checked_sha256="ab" * 32,
    )
    assert gate.blob_refs() == [("checked_sha256", "ab" * 32)]  # None is no reference
    with_schema = msgspec.structs.replace(gate, schema_sha256="cd" * 32)
    assert with_schema.blob_refs() == [("schema_sha256", "cd" * 32), ("checked_sha256", "ab" * 32)]
    for payload in (gate, with_schema):
        assert (
            DEFAULT_CATALOG.blob_refs(
                payload.type_name(), payload.SCHEMA_VERSION, canonical_struct(payload)
            )
            == payload.blob_refs()
        )
    # Only the payload's own fields count: a member of the same name nested in free-form
    # data is no reference.
    result = ValidationResultRecorded(
        plan_id="P-1",
        run_id="r",
        attachment_id="a",
        validation="v",
        mode="required",
        verdict=True,
        data={"raw_output_sha256": "ef" * 32},
        started_at="t",
        ended_at="t",
        duration_ms=0,
    )
    assert result.blob_refs() == []
    assert (
        DEFAULT_CATALOG.blob_refs(
            result.type_name(), result.SCHEMA_VERSION, canonical_struct(result)
        )
        == []
    )
    halt = PlanHalted(
        plan_id="P-1",
        halt_type="blocker",
        final_decision="blocker",
        raw_halt_type="x",
        reason="x",
        phase="execute",
        attempt=1,
    )
    assert halt.blob_refs() == []
    assert DEFAULT_CATALOG.blob_refs("plan.halted", 1, canonical_struct(halt)) == []
    assert DEFAULT_CATALOG.blob_refs("not.a.type", 1, b"{}") == []


def test_blob_refs_of_an_older_payload_are_read_after_upcasting() -> None:
    class FixV2(EventPayload, tag="test.fix", kw_only=True):
        """Version 2 renamed the diff's digest."""

        SCHEMA_VERSION = 2
        STREAM = "plan:{plan_id}"
        DELTA = "nothing"
        BLOB_FIELDS = ("diff_sha256",)

        plan_id: str
        diff_sha256: str | None = None

    catalog = Catalog([FixV2])

    @catalog.upcaster("test.fix", 1)
    def _rename(document: dict) -> dict:
        document["diff_sha256"] = document.pop("patch_sha256")
        return document

    v1 = b'{"patch_sha256":"' + b"ab" * 32 + b'","plan_id":"P-1","type":"test.fix"}'
    assert catalog.blob_refs("test.fix", 1, v1) == [("diff_sha256", "ab" * 32)]


def test_docs_events_md_is_generated_from_the_catalog() -> None:
    assert DOCS.read_text() == render(), (
        "docs/events.md is stale: run `python -m ledger.events.doc > docs/events.md`"
    )
