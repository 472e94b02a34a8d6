"""A progress bar for long work (verify, catch-up, rebuild): on stderr, only on a
terminal, and only once the work has run for a moment — a quick command prints nothing,
and piped or ``--json`` output is never touched."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .terminal import no_color

Progress = Callable[[int, int], None]  # (done, total)

SHOW_AFTER_S = 1.0


@contextmanager
def progress_bar(what: str, unit: str = "events") -> Iterator[Progress]:
    """A callback ``(done, total)`` that draws ``what``'s bar (done / total, rate in
    ``unit``/s, ETA) once the work has taken more than a second, on a terminal's
    stderr."""
    if not _on_terminal():
        yield _silent
        return
    started = time.monotonic()
    bar: dict[str, Any] = {}

    def update(done: int, total: int) -> None:
        if not bar:
            if time.monotonic() - started < SHOW_AFTER_S:
                return
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            progress = Progress(
                TextColumn(what),
                BarColumn(),
                MofNCompleteColumn(),
                _rate_column(unit),
                TimeRemainingColumn(),
                # a terminal's stderr; under NO_COLOR no ANSI style at all
                console=Console(
                    stderr=True,
                    force_terminal=True,
                    color_system=None if no_color() else "auto",
                ),
                transient=True,
            )
            progress.start()
            bar["progress"], bar["task"] = progress, progress.add_task(what, total=total)
        bar["progress"].update(bar["task"], completed=done, total=total)

    try:
        yield update
    finally:
        if bar:
            bar["progress"].stop()


def _on_terminal() -> bool:
    return sys.stderr.isatty()


def _silent(_done: int, _total: int) -> None:
    pass


def _rate_column(unit: str) -> Any:
    """The rate as ``unit``/s (rich's TransferSpeedColumn reads it as bytes/s)."""
    from rich.progress import ProgressColumn, Task
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            return Text(
                "?" if speed is None else f"{speed:,.0f} {unit}/s", style="progress.data.speed"
            )

    return RateColumn()
