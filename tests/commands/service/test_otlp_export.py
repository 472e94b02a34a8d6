"""The service's spans over the wire (docs/service.md, "Traces"): `evidence serve` with the
`otel` extra and ``OTEL_EXPORTER_OTLP_ENDPOINT`` exports each gated call's span over
OTLP/HTTP to a receiver on loopback (a plain HTTP server here, decoding the protobuf
with OpenTelemetry's own message types), continuing the caller's ``traceparent``; the
spans received, written as the Collector's ``file`` exporter writes them, verify against
the log with ``evidence verify --trace``."""

from __future__ import annotations

import base64
import json
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from commands.plane import Plane
from tests.commands.service.test_service import Server, _new_plan, _setup_ledger
from tests.helpers import run_cli

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otel extra's exporter")

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[bytes]]]:
    """An OTLP/HTTP traces receiver on loopback: its URL and the bodies it received."""
    received: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/v1/traces":
                received.append(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def test_the_service_exports_spans_with_receipts_that_verify(
    sqlite_url: str, tmp_path: Path, receiver: tuple[str, list[bytes]]
) -> None:
    endpoint, received = receiver
    _setup_ledger(sqlite_url, tmp_path)
    with Plane.open(sqlite_url) as plane:
        agent = _new_plan(plane, tmp_path, "O-1")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    server = Server(sqlite_url, env)
    try:
        request = urllib.request.Request(
            server.base + "/v1/gate/input",
            data=json.dumps({"tool": "search", "params": {"query": "x"}}).encode(),
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {agent.token}",
                "traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01",
            },
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert answer.status == 200
    finally:
        assert server.stop() == 0  # the exporter flushes as the process ends
    spans = [
        span
        for body in received
        for resource in MessageToDict(ExportTraceServiceRequest.FromString(body))["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]
    receipted = [
        s for s in spans if any(a["key"] == "evidence.ledger.positions" for a in s["attributes"])
    ]
    assert receipted, spans
    assert {base64.b64decode(s["traceId"]).hex() for s in receipted} == {TRACE_ID}
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "\n".join(
            json.dumps(MessageToDict(ExportTraceServiceRequest.FromString(b))) for b in received
        )
        + "\n"
    )
    checked = run_cli("verify", "--trace", str(trace), "--db", sqlite_url, "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout)
    assert report["receipted"] >= 1 and report["ok"] is True
