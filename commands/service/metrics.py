"""The service's metrics in the Prometheus text exposition format (version 0.0.4),
written here rather than with ``prometheus_client``.

Why by hand: the format is a few lines of text per family and has been stable for
years; the client library keeps its metrics in a process-wide default registry, so two
apps in one process (every in-process test makes one) would share or collide on their
counters unless each carried its own registry through the code; and one dependency less
goes into the plane's process. The cost is this module: counters, one histogram, label
escaping and the ``# HELP`` / ``# TYPE`` lines.

Updated on the event loop's thread only (each handler records after its plane work
returned), so no lock is needed; the text is rendered on the same thread.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

from commands.rules.vocabulary import OUTCOMES

Labels = tuple[tuple[str, str], ...]

# Request latency buckets (seconds): gate checks take milliseconds, tool calls and
# validation runs what their programs take.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _labels(labels: Mapping[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _render_labels(labels: Labels, extra: Iterable[tuple[str, str]] = ()) -> str:
    pairs = [*labels, *extra]
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


class Counter:
    """A counter family; ``zeros``: the label sets it exports from the start, at 0 (a
    rate over a series that does not exist yet is no rate at all)."""

    def __init__(self, name: str, help_: str, zeros: Iterable[Mapping[str, str]] = ()) -> None:
        self.name, self.help = name, help_
        self.values: dict[Labels, float] = defaultdict(float)
        for labels in zeros:
            self.values[_labels(labels)] += 0

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self.values[_labels(labels)] += amount

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        for labels, value in sorted(self.values.items()):
            lines.append(f"{self.name}{_render_labels(labels)} {_number(value)}")
        return lines


class Histogram:
    def __init__(self, name: str, help_: str, buckets: tuple[float, ...] = BUCKETS) -> None:
        self.name, self.help, self.buckets = name, help_, buckets
        self.counts: dict[Labels, list[int]] = {}
        self.sums: dict[Labels, float] = defaultdict(float)

    def observe(self, value: float, **labels: str) -> None:
        key = _labels(labels)
        counts = self.counts.setdefault(key, [0] * (len(self.buckets) + 1))
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                counts[i] += 1
        counts[-1] += 1  # +Inf: every observation
        self.sums[key] += value

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for labels, counts in sorted(self.counts.items()):
            bounds = [*(_number(b) for b in self.buckets), "+Inf"]
            for bound, count in zip(bounds, counts, strict=True):
                lines.append(f"{self.name}_bucket{_render_labels(labels, [('le', bound)])} {count}")
            lines.append(f"{self.name}_sum{_render_labels(labels)} {_number(self.sums[labels])}")
            lines.append(f"{self.name}_count{_render_labels(labels)} {counts[-1]}")
        return lines


def gauge(name: str, help_: str, value: float | None) -> list[str]:
    """A gauge read at scrape time (absent when it could not be read)."""
    lines = [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
    if value is not None:
        lines.append(f"{name} {_number(value)}")
    return lines


class Metrics:
    """Every family the service exports (one set per app)."""

    def __init__(self) -> None:
        self.requests = Counter(
            "evidence_http_requests_total", "HTTP requests answered, by route, method and status."
        )
        self.latency = Histogram(
            "evidence_http_request_duration_seconds",
            "Time from a request's arrival to its answer, by route.",
        )
        self.gate_checks = Counter(
            "evidence_gate_checks_total",
            "Gate checks recorded through the service, by gate and verdict.",
            zeros=[
                {"gate": g, "verdict": v} for g in ("input", "output") for v in ("pass", "fail")
            ],
        )
        self.deviations = Counter(
            "evidence_gate_deviations_total",
            "Deviations in the gate checks recorded through the service, by gate and kind.",
        )
        self.validations = Counter(
            "evidence_validations_total",
            "Validation runs recorded through the service, by outcome.",
            zeros=[{"outcome": outcome} for outcome in OUTCOMES],
        )
        self.hook_answers = Counter(
            "evidence_hook_answers_total",
            "Hook answers given (exit 0 lets a call on, 2 blocks it), by hook and exit.",
            zeros=[{"hook": h, "exit": e} for h in ("pre", "post") for e in ("0", "2")],
        )
        self.overloaded = Counter(
            "evidence_overload_rejections_total",
            "Requests answered 503 because the in-flight bound was reached.",
            zeros=[{}],
        )

    def render(
        self,
        *,
        in_flight: int,
        waiting: int,
        limit: int,
        head_size: int | None,
        commits: tuple[int, int] = (0, 0),
    ) -> str:
        """The exposition; ``commits``: the group commit's transactions and the jobs
        they held (their ratio is how many appends share a commit)."""
        lines: list[str] = []
        for family in (
            self.requests,
            self.latency,
            self.gate_checks,
            self.deviations,
            self.validations,
            self.hook_answers,
            self.overloaded,
        ):
            lines.extend(family.render())
        lines.extend(gauge("evidence_in_flight", "Plane operations in flight now.", in_flight))
        lines.extend(
            gauge("evidence_waiting", "Requests waiting for a place in flight now.", waiting)
        )
        lines.extend(
            gauge("evidence_in_flight_limit", "The bound on plane operations in flight.", limit)
        )
        for name, help_, value in (
            ("evidence_group_commits_total", "Transactions the group commit made.", commits[0]),
            (
                "evidence_group_commit_jobs_total",
                "Appends the group commit decided (refused ones included).",
                commits[1],
            ),
        ):
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} counter", f"{name} {value}"]
        lines.extend(
            gauge(
                "evidence_ledger_head_size",
                "Events in the ledger (its tree size) when scraped.",
                head_size,
            )
        )
        return "\n".join(lines) + "\n"
