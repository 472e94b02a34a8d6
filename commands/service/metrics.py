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
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import msgspec

from commands.rules.vocabulary import OUTCOMES
from ledger.events.gates import DeviationKind

DEVIATION_KINDS: tuple[str, ...] = get_args(DeviationKind)
PUBLISH_EVERY_S = 1.0  # how stale another process's counters may be in a fleet's scrape

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

    def snapshot(self) -> list[Any]:
        return [[list(map(list, labels)), value] for labels, value in self.values.items()]

    def absorb(self, snapshot: list[Any]) -> None:
        for labels, value in snapshot:
            self.values[tuple((str(k), str(v)) for k, v in labels)] += float(value)

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

    def snapshot(self) -> list[Any]:
        return [[list(map(list, k)), counts, self.sums[k]] for k, counts in self.counts.items()]

    def absorb(self, snapshot: list[Any]) -> None:
        for labels, counts, total in snapshot:
            key = tuple((str(k), str(v)) for k, v in labels)
            mine = self.counts.setdefault(key, [0] * (len(self.buckets) + 1))
            if len(counts) == len(mine):  # another release's buckets: left out
                self.counts[key] = [a + int(b) for a, b in zip(mine, counts, strict=True)]
                self.sums[key] += float(total)

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


@dataclass(frozen=True)
class Process:
    """One service process's own readings beside its counters: its places in flight, the
    requests waiting for one, its bound, and its group commit's transactions and jobs."""

    in_flight: int = 0
    waiting: int = 0
    limit: int = 0
    commits: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class LedgerReadings:
    """What every process reads alike, from the ledger, at scrape time (None: not read)."""

    head_size: int | None = None
    checkpoint_size: int | None = None
    checkpoint_age_s: float | None = None


class Metrics:
    """Every family the service exports (one set per app)."""

    def __init__(self, routes: Iterable[tuple[str, str]] = ()) -> None:
        self.requests = Counter(
            "evidence_http_requests_total",
            "HTTP requests answered, by route, method and status.",
            zeros=[{"route": r, "method": m, "status": "200"} for r, m in routes],
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
            zeros=[{"gate": g, "kind": k} for g in ("input", "output") for k in DEVIATION_KINDS],
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

    @property
    def families(self) -> tuple[Counter | Histogram, ...]:
        return (
            self.requests,
            self.latency,
            self.gate_checks,
            self.deviations,
            self.validations,
            self.hook_answers,
            self.overloaded,
        )

    def snapshot(self, process: Process) -> dict[str, Any]:
        """This process's counters and readings, as JSON values (``Fleet``)."""
        return {
            "families": {f.name: f.snapshot() for f in self.families},
            "process": [process.in_flight, process.waiting, process.limit, *process.commits],
        }

    def render(self, process: Process, ledger: LedgerReadings) -> str:
        """The exposition; ``process.commits``: the group commit's transactions and the
        jobs they held (their ratio is how many appends share a commit)."""
        lines: list[str] = []
        for family in self.families:
            lines.extend(family.render())
        for name, help_, value in (
            ("evidence_in_flight", "Plane operations in flight now.", process.in_flight),
            ("evidence_waiting", "Requests waiting for a place in flight now.", process.waiting),
            ("evidence_in_flight_limit", "The bound on plane operations in flight.", process.limit),
        ):
            lines.extend(gauge(name, help_, value))
        for name, help_, value in (
            (
                "evidence_group_commits_total",
                "Transactions the group commit made.",
                process.commits[0],
            ),
            (
                "evidence_group_commit_jobs_total",
                "Appends the group commit decided (refused ones included).",
                process.commits[1],
            ),
        ):
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} counter", f"{name} {value}"]
        for name, help_, reading in (
            (
                "evidence_ledger_head_size",
                "Events in the ledger (its tree size) when scraped.",
                ledger.head_size,
            ),
            (
                "evidence_checkpoint_size",
                "The tree size of the latest checkpoint the service published.",
                ledger.checkpoint_size,
            ),
            (
                "evidence_checkpoint_age_seconds",
                "Seconds since the latest checkpoint was published.",
                ledger.checkpoint_age_s,
            ),
        ):
            lines.extend(gauge(name, help_, reading))
        return "\n".join(lines) + "\n"


class Fleet:
    """The processes of one ``evidence serve --workers N``, seen as one service: each
    publishes its snapshot (``Metrics.snapshot``) as ``<pid>.json`` in a directory only
    the service's user can write, at least every ``PUBLISH_EVERY_S`` and whenever it is
    scraped; a scrape of any of them adds every snapshot up. Counters of a process that
    ended still count (a fleet's total never goes back); its in-flight readings do not."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.own = directory / f"{os.getpid()}.json"

    def publish(self, snapshot: dict[str, Any]) -> None:
        partial = self.own.with_suffix(".partial")
        partial.write_bytes(msgspec.json.encode(snapshot))
        os.replace(partial, self.own)  # a reader sees the last whole snapshot

    def gather(self, own: dict[str, Any]) -> tuple[Metrics, Process]:
        """Every process's counters added up, and the live processes' readings."""
        self.publish(own)
        total, readings = Metrics(), [0, 0, 0, 0, 0]
        for path in sorted(self.directory.glob("*.json")):
            try:
                snapshot = msgspec.json.decode(path.read_bytes())
                families, process = snapshot["families"], snapshot["process"]
            except (OSError, msgspec.DecodeError, KeyError, TypeError):
                continue  # gone meanwhile, or not one of ours
            for family in total.families:
                family.absorb(families.get(family.name, []))
            live = _alive(int(path.stem)) if path.stem.isdigit() else False
            for i, value in enumerate(process[:5]):
                if live or i >= 3:  # group commit counts are counters: always added
                    readings[i] += int(value)
        in_flight, waiting, limit, batches, jobs = readings
        return total, Process(in_flight, waiting, limit, commits=(batches, jobs))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
