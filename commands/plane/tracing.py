"""Traces with receipts: OpenTelemetry spans of the plane's operations, each naming the
ledger events that record it (docs/service.md, "Traces").

A gated call (``execute_tool {tool}``: its input gate, the tool's run, its output gate),
a validation run, a decision and an Apply each make a span when tracing is on. Every
event the plane appends while a span is open is that span's: the span ends with its
*receipt*, the position and leaf hash of each (``evidence.ledger.positions``,
``evidence.event.hashes``, ``evidence.event.types``), and of the one event it records
above all (``evidence.ledger.position``, ``evidence.event.hash``,
``evidence.event.type``), which anyone checks against the log with ``evidence event
POSITION --json`` (docs/service.md, "Traces").

Tracing is on when the OpenTelemetry SDK is loaded and its ``TracerProvider`` is the
global one (an application's own setup, ``opentelemetry-instrument``, or ``evidence
serve`` with the ``otel`` extra and ``OTEL_EXPORTER_OTLP_ENDPOINT``). Otherwise this
module imports nothing of OpenTelemetry, and an operation pays one dictionary look-up.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ledger.events import RecordedEvent

__all__ = [
    "TRACER_NAME",
    "Operation",
    "active",
    "configure_from_environment",
    "continued",
    "detach",
    "now_ns",
    "operation",
    "past",
    "recorded",
    "use",
]

TRACER_NAME = "evidence-ledger"
_SDK = "opentelemetry.sdk.trace"  # loaded by whoever set up tracing, never by this module

# Receipt attributes (the ledger's own namespace, ``evidence.``).
POSITION = "evidence.ledger.position"
HASH = "evidence.event.hash"
TYPE = "evidence.event.type"
EVENT_ID = "evidence.event.id"
STREAM = "evidence.stream"
POSITIONS = "evidence.ledger.positions"
HASHES = "evidence.event.hashes"
TYPES = "evidence.event.types"


class _Tracing:
    """What was resolved once tracing is on: the API's modules and the tracer of the
    provider in force (a provider set later is picked up)."""

    chosen: Any = None  # ``use(provider)``: this one, whatever the global one is
    provider: Any = None
    tracer: Any = None
    trace: Any = None
    context: Any = None


_on = _Tracing()
_current: ContextVar[Operation | None] = ContextVar("evidence_trace_operation", default=None)


def use(provider: Any) -> None:
    """Trace the plane's operations with ``provider`` (an SDK ``TracerProvider``)
    rather than the global one; ``use(None)``: the global one again."""
    _on.chosen = provider
    if provider is not None:
        _load()


def _load() -> None:
    if _on.trace is None:
        from opentelemetry import context, trace

        _on.trace, _on.context = trace, context


def _tracer() -> Any | None:
    """The tracer to use, or None when tracing is off (the hot path: two look-ups)."""
    provider = _on.chosen
    if provider is None:
        sdk = sys.modules.get(_SDK)
        if sdk is None:
            return None
        _load()
        provider = _on.trace.get_tracer_provider()
        if not isinstance(provider, sdk.TracerProvider):
            return None
    if provider is not _on.provider:
        import ledger

        _on.tracer = provider.get_tracer(TRACER_NAME, ledger.__version__)
        _on.provider = provider
    return _on.tracer


def active() -> bool:
    """Whether spans are made now."""
    return _tracer() is not None


class Operation:
    """One open span of the plane and the events appended under it."""

    __slots__ = ("_context_token", "_token", "events", "parent", "records", "span")

    def __init__(self, span: Any, records: str | None) -> None:
        self.span = span
        self.records = records
        self.events: list[RecordedEvent] = []
        self.parent: Operation | None = None

    def set(self, attributes: Mapping[str, Any]) -> None:
        self.span.set_attributes({k: v for k, v in attributes.items() if v is not None})

    def __enter__(self) -> Operation:
        self.parent = _current.get()
        self._token = _current.set(self)
        self._context_token = _on.context.attach(_on.trace.set_span_in_context(self.span))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _current.reset(self._token)
        _on.context.detach(self._context_token)
        _finish(self.span, self.events, self.records, exc)


class _Off:
    """The operation when tracing is off: enters as None, does nothing."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_OFF = _Off()


def operation(
    name: str,
    attributes: Callable[[], Mapping[str, Any]],
    *,
    records: str | None = None,
    started_ns: int = 0,
) -> Operation | _Off:
    """A span named ``name`` around a ``with`` block, a child of the current span (the
    caller's, continued by the service). ``attributes`` is asked only when tracing is
    on; ``records`` is the type of the event the span records above all (its receipt:
    the first such event appended in the block; else the first event); ``started_ns``
    (``now_ns()``) when the operation began before the block."""
    tracer = _tracer()
    if tracer is None:
        return _OFF
    span = tracer.start_span(name, attributes=_present(attributes()), start_time=started_ns or None)
    return Operation(span, records)


def recorded(events: Sequence[RecordedEvent]) -> None:
    """Events just appended (``Plane.run``): each open operation of this context keeps
    them for its receipt, the enclosing ones too."""
    op = _current.get()
    while op is not None:
        op.events.extend(events)
        op = op.parent


def past(
    name: str, started_ns: int, ended_ns: int, attributes: Mapping[str, Any], *, records: str
) -> None:
    """A span for what happened before its record was appended (a tool's run, recorded
    with its output gate): made afterwards, with the times it took, under the current
    operation, its receipt the last event of type ``records`` appended under it."""
    tracer = _tracer()
    if tracer is None:
        return
    op = _current.get()
    found = [e for e in (op.events if op is not None else ()) if e.type == records][-1:]
    span = tracer.start_span(name, attributes=_present(attributes), start_time=started_ns)
    _finish(span, found, records, None, ended_ns)


def now_ns() -> int:
    """A span's clock (0 when tracing is off: nothing reads it)."""
    return time.time_ns() if _tracer() is not None else 0


def _present(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attributes.items() if v is not None}


def _finish(
    span: Any,
    events: list[RecordedEvent],
    records: str | None,
    exc: BaseException | None,
    ended_ns: int | None = None,
) -> None:
    if events:
        main = next((e for e in events if e.type == records), events[0])
        span.set_attributes(
            {
                POSITION: main.position,
                HASH: main.leaf_hash.hex(),
                TYPE: main.type,
                EVENT_ID: main.event_id,
                STREAM: main.stream,
                POSITIONS: [e.position for e in events],
                HASHES: [e.leaf_hash.hex() for e in events],
                TYPES: [e.type for e in events],
            }
        )
    if exc is not None:
        span.set_attribute("error.type", type(exc).__qualname__)
        span.set_status(_on.trace.StatusCode.ERROR, str(exc))
    span.end(end_time=ended_ns)


# -- the service: the caller's trace continued ---------------------------------------------


def continued(carrier: Mapping[str, str]) -> Any:
    """Make the caller's W3C trace context (``traceparent``, ``tracestate`` in
    ``carrier``: HTTP headers or an MCP request's ``_meta``) the current one, until the
    token returned is given to ``detach``; None when tracing is off or there is none."""
    if "traceparent" not in carrier or _tracer() is None:
        return None
    from opentelemetry.propagate import extract

    parent = extract(carrier)
    if not _on.trace.get_current_span(parent).get_span_context().is_valid:
        return None
    return _on.context.attach(parent)


def detach(token: Any) -> None:
    if token is not None:
        _on.context.detach(token)


def configure_from_environment() -> bool:
    """``evidence serve``: with the ``otel`` extra installed and an OTLP endpoint in the
    standard variables (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), export spans over OTLP/HTTP (unless
    ``OTEL_SDK_DISABLED=true``, or a provider is already set, e.g. by
    ``opentelemetry-instrument``). True when this configured it."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if not (
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        return False  # the extra is not installed: the service runs untraced
    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return False
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "evidence")})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True
