"""Traces with receipts (commands/plane/tracing.py, docs/service.md "Traces"): the
plane's spans follow the GenAI conventions for tool execution, each names the ledger
events that record it, and the service continues the caller's trace."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.testclient import TestClient

from commands.plane import (
    Plane,
    apply_plan,
    call_tool,
    create_plan,
    enter_execute,
    record_strategy,
    register_tool,
    register_validation,
    tracing,
    validate_plan,
)
from commands.plane.attachments import attach
from commands.plane.credentials import issue_credential
from commands.service import create_app
from projections.states import PlanState
from tests.helpers import run_cli

SEARCH = {
    "name": "search",
    "input_schema": {
        "type": "object",
        "required": ["query"],
        "properties": {"query": {"type": "string"}},
    },
    "output_schema": {
        "type": "object",
        "required": ["hits"],
        "properties": {"hits": {"type": "array", "items": {"type": "string"}}},
    },
}
STATUS_CHECK = """
import json
ok = open("status.txt").read().strip() == "good"
print(json.dumps({"passed": ok, "message": "status is good" if ok else "status is bad"}))
"""
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The plane traced into memory (its own provider: the global one is left alone)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    try:
        yield exporter
    finally:
        tracing.use(None)
        provider.shutdown()


def _plan(plane: Plane, root: Path, plan_id: str) -> Path:
    project = root / "projects" / plan_id
    project.mkdir(parents=True)
    (project / "status.txt").write_text("bad\n")
    create_plan(plane, plan_id, project=plan_id, resources=[str(project)])
    attach(plane, "status", resource=str(project))
    record_strategy(plane, plan_id, "make the status good")
    enter_execute(plane, plan_id)
    return project


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    (tmp_path / "check.py").write_text(STATUS_CHECK)
    with Plane.open(f"sqlite:///{tmp_path / 'evidence.db'}") as opened:
        register_tool(opened, SEARCH)
        register_validation(
            opened,
            {
                "name": "status",
                "mode": "required",
                "command": [sys.executable, str(tmp_path / "check.py")],
            },
        )
        yield opened


def _named(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    found = {s.name: s for s in exporter.get_finished_spans()}
    assert len(found) == len(exporter.get_finished_spans()), "one span per name here"
    return found


def _check_receipt(plane: Plane, span: ReadableSpan) -> None:
    """Every event the span names is in the log, as named (the check an auditor makes)."""
    attrs = span.attributes or {}
    positions = list(attrs["evidence.ledger.positions"])  # type: ignore[arg-type]
    hashes = list(attrs["evidence.event.hashes"])  # type: ignore[arg-type]
    types = list(attrs["evidence.event.types"])  # type: ignore[arg-type]
    stream = attrs["evidence.stream"]
    by_position = {e.position: e for e in plane.store.read_stream(str(stream))}
    for position, leaf, kind in zip(positions, hashes, types, strict=True):
        event = by_position[position]
        assert (event.leaf_hash.hex(), event.type) == (leaf, kind), span.name
    main = by_position[attrs["evidence.ledger.position"]]  # type: ignore[index]
    assert main.leaf_hash.hex() == attrs["evidence.event.hash"]
    assert main.type == attrs["evidence.event.type"]
    assert main.event_id == attrs["evidence.event.id"]


def test_a_gated_call_is_traced_with_receipts(
    plane: Plane, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    _plan(plane, tmp_path, "T-1")
    report = call_tool(plane, "T-1", "search", {"query": "x"}, recorded_output={"hits": ["a"]})
    assert report.ok
    named = _named(spans)
    assert set(named) == {"execute_tool search", "gate input", "run search", "gate output"}
    call = named["execute_tool search"]
    assert report.call is not None
    assert call.attributes is not None
    assert {k: call.attributes[k] for k in ("gen_ai.operation.name", "gen_ai.tool.name")} == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "search",
    }
    assert call.attributes["gen_ai.tool.call.id"] == report.call.call_id
    assert call.attributes["evidence.plan.id"] == "T-1"
    assert call.attributes["evidence.event.type"] == "tool.called"
    assert call.attributes["evidence.call.ok"] is True and "error.type" not in call.attributes
    for name in ("gate input", "run search", "gate output"):
        child = named[name]
        assert child.parent is not None and child.parent.span_id == call.context.span_id
        assert child.context.trace_id == call.context.trace_id
    assert named["gate input"].attributes["evidence.event.type"] == "gate.checked"  # type: ignore[index]
    assert named["gate input"].attributes["evidence.gate.verdict"] == "pass"  # type: ignore[index]
    assert named["run search"].attributes["evidence.event.type"] == "tool.called"  # type: ignore[index]
    assert named["gate output"].attributes["evidence.event.type"] == "gate.checked"  # type: ignore[index]
    # The receipts are the ledger's events: positions, leaf hashes and types as stored.
    for span in named.values():
        _check_receipt(plane, span)
    recorded = list(plane.store.read_stream("plan:T-1"))
    assert call.attributes["evidence.ledger.positions"] == tuple(e.position for e in recorded[-3:])
    assert [e.position for e in report.input_gate.events] == [
        named["gate input"].attributes["evidence.ledger.position"]  # type: ignore[index]
    ]


def test_a_refused_call_says_why(plane: Plane, tmp_path: Path, spans: InMemorySpanExporter) -> None:
    _plan(plane, tmp_path, "T-2")
    report = call_tool(plane, "T-2", "search", {"query": 7}, recorded_output={"hits": []})
    assert not report.ok
    named = _named(spans)
    assert set(named) == {"execute_tool search", "gate input"}
    call, gate = named["execute_tool search"], named["gate input"]
    assert call.attributes is not None and gate.attributes is not None
    assert call.attributes["error.type"] == "input_gate"
    assert gate.attributes["evidence.gate.verdict"] == "fail"
    assert gate.attributes["evidence.gate.deviations"] == 1
    # The check and the failure it routes to are the gate's events, the check first.
    types = gate.attributes["evidence.event.types"]
    assert types[0] == "gate.checked" and "plan.attempt_failed" in types  # type: ignore[index]
    _check_receipt(plane, gate)
    _check_receipt(plane, call)


def test_validation_and_apply_are_traced(
    plane: Plane, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    project = _plan(plane, tmp_path, "T-3")
    doc = plane.state("plan:T-3").of(PlanState)
    assert doc is not None
    copy = plane.sandbox(doc).ensure().copies[str(project)]
    (copy / "status.txt").write_text("good\n")
    report = validate_plan(plane, "T-3")
    assert report.outcome == "pass" and report.token is not None
    apply_plan(plane, "T-3", report.token)
    named = _named(spans)
    run, applied = named["validation run"], named["apply"]
    assert run.attributes is not None and applied.attributes is not None
    assert run.attributes["evidence.event.type"] == "validation.run_completed"
    assert run.attributes["evidence.validation.outcome"] == "pass"
    assert run.attributes["evidence.validation.run_id"] == report.run_id
    assert applied.attributes["evidence.event.type"] == "plan.applied"
    assert "plan.changes_recorded" in applied.attributes["evidence.event.types"]  # type: ignore[operator]
    _check_receipt(plane, run)
    _check_receipt(plane, applied)


def test_untraced_emits_nothing(plane: Plane, tmp_path: Path) -> None:
    """An SDK provider nobody chose is not used: the plane makes no span."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert not tracing.active()
    _plan(plane, tmp_path, "T-4")
    assert call_tool(plane, "T-4", "search", {"query": "x"}, recorded_output={"hits": []}).ok
    assert exporter.get_finished_spans() == ()


def test_without_tracing_nothing_of_opentelemetry_is_imported(tmp_path: Path) -> None:
    """A gated call through the Python API loads no OpenTelemetry module when nobody set
    tracing up, and the service's app not the SDK (as tests/commands/cli/test_startup.py pins lazy
    imports)."""
    code = textwrap.dedent(
        f"""
        import json, sys
        from pathlib import Path
        from commands.plane import (
            Plane, call_tool, create_plan, enter_execute, record_strategy, register_tool,
        )
        from commands.service import create_app
        root = Path({str(tmp_path)!r})
        (root / "p").mkdir()
        with Plane.open(f"sqlite:///{{root / 'e.db'}}") as plane:
            register_tool(plane, json.loads({json.dumps(json.dumps(SEARCH))}))
            create_plan(plane, "P", project="p", resources=[str(root / "p")])
            record_strategy(plane, "P", "s")
            enter_execute(plane, "P")
            assert call_tool(plane, "P", "search", {{"query": "x"}},
                             recorded_output={{"hits": []}}).ok
        called = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        create_app(f"sqlite:///{{root / 'e.db'}}")
        served = sorted(m for m in sys.modules if m.startswith("opentelemetry.sdk"))
        print(json.dumps([called, served]))
        """
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "EVIDENCE_PLANE_KEY": str(tmp_path / "plane.key"),
        "EVIDENCE_STATE_DIR": str(tmp_path / "state"),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    # The app loads the MCP SDK, which loads the OpenTelemetry API (never the SDK).
    assert json.loads(done.stdout) == [[], []]


# -- the service continues the caller's trace ------------------------------------------------


@pytest.fixture
def served(tmp_path: Path, plane: Plane) -> Iterator[tuple[TestClient, dict[str, str]]]:
    _plan(plane, tmp_path, "S-1")
    issued = issue_credential(plane, "S-1", ttl=timedelta(hours=1))
    with TestClient(create_app(plane.store.url, max_in_flight=2)) as client:
        yield client, {"Authorization": f"Bearer {issued.token}"}


def _child_of_caller(span: ReadableSpan, caller: str = CALLER_SPAN) -> None:
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert span.parent is not None and f"{span.parent.span_id:016x}" == caller
    assert span.parent.is_remote


def test_a_route_continues_the_traceparent(
    served: tuple[TestClient, dict[str, str]], plane: Plane, spans: InMemorySpanExporter
) -> None:
    client, auth = served
    answer = client.post(
        "/v1/gate/input",
        headers={**auth, "traceparent": TRACEPARENT},
        json={"tool": "search", "params": {"query": "x"}, "step": "s1"},
    )
    assert answer.status_code == 200, answer.text
    gate = _named(spans)["gate input"]
    _child_of_caller(gate)
    _check_receipt(plane, gate)
    # No traceparent: a trace of its own.
    spans.clear()
    client.post("/v1/gate/input", headers=auth, json={"tool": "search", "params": {"query": "x"}})
    assert _named(spans)["gate input"].parent is None


def _tools_call(meta: dict[str, Any] | None = None) -> bytes:
    params: dict[str, Any] = {"name": "nowhere", "arguments": {}}
    if meta is not None:
        params["_meta"] = meta
    return json.dumps(
        {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}
    ).encode()


def test_mcp_continues_the_meta_traceparent(
    served: tuple[TestClient, dict[str, str]], plane: Plane, spans: InMemorySpanExporter
) -> None:
    """``params._meta.traceparent`` (the MCP semantic conventions' propagation) is the
    parent; it comes before the HTTP header's."""
    client, auth = served
    other = f"00-{TRACE_ID}-{'1' * 16}-01"
    answer = client.post(
        "/mcp",
        headers={**auth, **ACCEPT, "traceparent": other},
        content=_tools_call({"traceparent": TRACEPARENT}),
    )
    assert answer.status_code == 200, answer.text
    named = _named(spans)
    call = named["execute_tool nowhere"]
    _child_of_caller(call)
    assert named["gate input"].parent.span_id == call.context.span_id  # type: ignore[union-attr]
    _check_receipt(plane, named["gate input"])
    # Only the HTTP header: its context is the parent.
    spans.clear()
    answer = client.post(
        "/mcp", headers={**auth, **ACCEPT, "traceparent": other}, content=_tools_call()
    )
    assert answer.status_code == 200, answer.text
    _child_of_caller(_named(spans)["execute_tool nowhere"], "1" * 16)


def test_a_decision_is_a_span_whose_receipt_is_the_decision(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """A human's signed decision on an escalation: its span names the decision's event
    (and the plan's end it causes), as the log holds them."""
    from commands.plane.lifecycle import authorize
    from tests.commands.plane.test_lifecycle import _escalate
    from tests.helpers import status_plan

    with Plane.open(f"sqlite:///{tmp_path / 'decided.db'}") as plane:
        status_plan(plane, tmp_path, {"retry_limit": 1, "max_strategy_revisions": 1})
        decision_id = _escalate(plane)
        spans.clear()
        authorize(plane, decision_id, tmp_path / "alice.key", choice="abandon", reason="no")
        [decided] = [s for s in spans.get_finished_spans() if s.name == "decision"]
        attrs = decided.attributes or {}
        assert attrs["evidence.event.type"] == "plan.decision_recorded"
        assert "plan.decision_recorded" in attrs["evidence.event.types"]
        assert attrs["evidence.plan.id"] == "P-1"
        _check_receipt(plane, decided)


def _otlp_value(value: Any) -> dict[str, Any]:
    """An attribute value as OTLP JSON's ``AnyValue`` (an int64 as a string: proto3 JSON)."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list | tuple):
        return {"arrayValue": {"values": [_otlp_value(v) for v in value]}}
    return {"stringValue": str(value)}


def _otlp_line(spans: list[ReadableSpan]) -> str:
    """The spans as one OTLP JSON document, as the Collector's `file` exporter writes it."""
    encoded = [
        {
            "name": s.name,
            "attributes": [
                {"key": k, "value": _otlp_value(v)} for k, v in (s.attributes or {}).items()
            ],
        }
        for s in spans
    ]
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": encoded}]}]})


def test_verify_trace_checks_each_receipt_against_the_log(
    plane: Plane, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """`evidence verify --trace FILE`: every span's receipt is in the log as named (exit
    0); a span naming another hash, or a position the log does not hold, is found
    (exit 1)."""
    _plan(plane, tmp_path, "T-1")
    assert call_tool(plane, "T-1", "search", {"query": "x"}, recorded_output={"hits": []}).ok
    finished = list(spans.get_finished_spans())
    trace = tmp_path / "trace.json"
    trace.write_text(_otlp_line(finished) + "\n" + _otlp_line(finished[:1]) + "\n")
    db = ["--db", plane.store.url]
    good = run_cli("verify", "--trace", str(trace), "--json", *db)
    assert good.returncode == 0, good.stdout + good.stderr
    checked = json.loads(good.stdout)
    assert checked["ok"] and checked["receipted"] == checked["spans"] == len(finished) + 1
    assert checked["checked"] == 3  # the gate check, the call, the output verdict
    head = plane.store.head().size

    def forged(key: str, value: dict[str, Any]) -> str:
        """The first span's receipt with one list's first item replaced."""
        document = json.loads(_otlp_line(finished[:1]))
        [span] = document["resourceSpans"][0]["scopeSpans"][0]["spans"]
        [found] = [a for a in span["attributes"] if a["key"] == key]
        found["value"]["arrayValue"]["values"][0] = value
        return json.dumps(document)

    for changed in (
        forged("evidence.event.hashes", {"stringValue": "00" * 32}),  # another hash
        forged("evidence.ledger.positions", {"intValue": str(head + 100)}),  # no event
        forged("evidence.event.types", {"stringValue": "plan.applied"}),  # another type
    ):
        trace.write_text(changed + "\n")
        bad = run_cli("verify", "--trace", str(trace), *db)
        assert bad.returncode == 1, bad.stdout + bad.stderr
        assert "not in the log as named" in bad.stdout
