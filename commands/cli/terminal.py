"""Text the agent controls, made inert for a terminal.

The agent the plane governs writes many of the strings the CLI prints: strategies,
reasons, tool descriptions, validation messages, file names. Printed raw, an escape
sequence in one clears the screen or retitles the window, a carriage return or a bidi
override disguises a line; printed through rich with markup on, ``[/x]`` crashes the
command and ``[bold]`` restyles it. Human output passes such text through ``inert`` and
prints it with markup off; ``--json`` carries the exact text.

The rules live in ``commands.text``, shared with the HTML report (the page shows the same
escapes as the terminal).
"""

from __future__ import annotations

import os

from commands.text import inert, json_inert

__all__ = ["inert", "json_inert", "no_color"]


def no_color() -> bool:
    """``NO_COLOR`` is set and not empty (https://no-color.org): the CLI then writes no
    ANSI style at all — no colour, and no bold or dim either — on a terminal as when
    piped."""
    return bool(os.environ.get("NO_COLOR"))
