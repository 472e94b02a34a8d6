"""A trace checked against the log (``evidence verify --trace FILE``; docs/service.md,
"Traces"): every span of the plane names the events that record it — their positions,
leaf hashes and types — and each must be in the log as named, its leaf hash recomputed
from its stored bytes.

The file is OTLP JSON, as the OpenTelemetry Collector's ``file`` exporter writes it: one
``{"resourceSpans": …}`` document a line (one document over several lines is read too).
Spans without a receipt (``evidence.ledger.positions``) recorded nothing and are counted,
not checked.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ledger import Store
from ledger.errors import LedgerError
from ledger.proofs import read_stored_event

__all__ = ["Receipt", "TraceReport", "check_trace", "read_receipts"]

POSITIONS, HASHES, TYPES = (
    "evidence.ledger.positions",
    "evidence.event.hashes",
    "evidence.event.types",
)


class TraceError(LedgerError):
    """The file is no OTLP JSON trace (one line: why)."""


@dataclass(frozen=True)
class Receipt:
    """One event a span says recorded it."""

    span: str
    position: int
    leaf_hash: str
    type: str


@dataclass
class TraceReport:
    spans: int = 0  # every span read
    receipted: int = 0  # spans with a receipt
    checked: int = 0  # events checked (each position once)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "spans": self.spans,
            "receipted": self.receipted,
            "checked": self.checked,
            "problems": self.problems,
        }


def read_receipts(text: str, report: TraceReport) -> list[Receipt]:
    """Every receipt of every span in ``text`` (OTLP JSON documents)."""
    found: list[Receipt] = []
    for document in _documents(text):
        for span in _spans(document):
            report.spans += 1
            attrs = {a.get("key"): _value(a.get("value")) for a in span.get("attributes") or []}
            positions = attrs.get(POSITIONS)
            if positions is None:
                continue
            report.receipted += 1
            hashes, types = attrs.get(HASHES), attrs.get(TYPES)
            name = str(span.get("name", "?"))
            if not (
                isinstance(positions, list)
                and isinstance(hashes, list)
                and isinstance(types, list)
                and len(positions) == len(hashes) == len(types)
            ):
                report.problems.append(f"span {name!r}: a receipt of unequal lists")
                continue
            for position, leaf, kind in zip(positions, hashes, types, strict=True):
                try:
                    found.append(Receipt(name, int(position), str(leaf), str(kind)))
                except (TypeError, ValueError):
                    report.problems.append(f"span {name!r}: position {position!r} is no number")
    return found


def check_trace(store: Store, text: str) -> TraceReport:
    """Each receipt's event in the log as the span names it."""
    report = TraceReport()
    seen: dict[int, tuple[str, str]] = {}
    for receipt in read_receipts(text, report):
        named = (receipt.leaf_hash, receipt.type)
        if receipt.position not in seen:
            stored = read_stored_event(store, receipt.position)
            report.checked += 1
            if stored is None:
                seen[receipt.position] = ("", "")
            else:
                good = stored.recomputed_leaf_hash if stored.leaf_ok else "(altered)"
                seen[receipt.position] = (good, str(stored.event["type"]))
        actual = seen[receipt.position]
        if actual != named:
            what = "no event" if actual == ("", "") else f"{actual[1]} {actual[0][:16]}…"
            report.problems.append(
                f"span {receipt.span!r}: position {receipt.position} holds {what}, not "
                f"{receipt.type} {receipt.leaf_hash[:16]}…"
            )
    return report


def _documents(text: str) -> Iterator[dict[str, Any]]:
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, dict):
        yield whole
        return
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            document = json.loads(line)
        except ValueError:
            raise TraceError(f"line {number} is not JSON (an OTLP JSON document a line)") from None
        if not isinstance(document, dict):
            raise TraceError(f"line {number} is not an OTLP JSON document")
        yield document


def _spans(document: dict[str, Any]) -> Iterable[dict[str, Any]]:
    for resource in document.get("resourceSpans") or []:
        for scope in resource.get("scopeSpans") or []:
            yield from scope.get("spans") or []


def _value(value: Any) -> Any:
    """An OTLP ``AnyValue`` as plain JSON (an int64 may be a string, per proto3 JSON)."""
    if not isinstance(value, dict):
        return None
    if "arrayValue" in value:
        return [_value(v) for v in (value["arrayValue"] or {}).get("values") or []]
    for kind in ("stringValue", "boolValue", "doubleValue"):
        if kind in value:
            return value[kind]
    if "intValue" in value:
        return int(value["intValue"])
    return None
