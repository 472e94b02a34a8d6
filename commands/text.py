"""Text from the log, made inert for a terminal or a page.

The agent the plane governs writes many of the strings the CLI prints and the HTML
report shows: strategies, reasons, tool descriptions, validation messages, program
output, file names. Shown raw, an escape sequence in one clears the screen or retitles the
window, a bell rings, a carriage return or a bidi override disguises a line. ``inert``
writes every such character as a visible escape; the terminal (``commands.cli.terminal``)
and the HTML report (``commands.auditor.report``) both show text through it, and
``--json`` carries the exact text.
"""

from __future__ import annotations

import re

__all__ = ["inert", "json_inert"]

# Anything but printable ASCII is looked at (and, in multi-line text, but a newline).
_SUSPECT = re.compile(r"[^\x20-\x7e]")
_SUSPECT_MULTILINE = re.compile(r"[^\x20-\x7e\n]")
# What is escaped: every character Python does not call printable (``str.isprintable``):
# controls (C0, DEL, C1), format characters (bidi embeddings, overrides and isolates,
# marks, zero-width spaces, BOM), lone surrogates, private-use and unassigned code
# points, and every separator but the space (line and paragraph separators, no-break and
# other wide spaces, which can disguise a line). One rule, with no table of categories,
# so ``commands.hook_client`` (which may import nothing but the standard library's
# fastest modules) applies exactly the same; tests/commands/cli/test_terminal_text.py
# compares the two on every code point.
# Zero-width (non-)joiners are format characters that some scripts and emoji need.
_JOINERS = frozenset({"\u200c", "\u200d"})
_NAMED = {"\t": r"\t", "\n": r"\n", "\r": r"\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char.isprintable() or char in _JOINERS:
        return char
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return (
        f"\\x{code:02x}"
        if code <= 0xFF
        else f"\\u{code:04x}"
        if code <= 0xFFFF
        else f"\\U{code:08x}"
    )


def inert(text: object, *, multiline: bool = False) -> str:
    """``str(text)`` (as an f-string shows it, ``None`` included) safe to show on a
    terminal: every character Python does not call printable — control characters
    (``\\t``, ``\\r``, ESC, BEL, DEL, C1 ...), bidi controls and other invisible
    formatting, separators but the space — as a visible escape, as Python writes it
    (``\\x1b``, ``\\u202e``); all else unchanged. With ``multiline`` a newline
    stays a newline (never a carriage return).

    Idempotent. Not markup-safe by itself: print the result with rich markup off (or
    through ``rich.markup.escape``)."""
    if not isinstance(text, str):
        text = str(text)
    if text.isprintable():  # no control, format or separator character: the usual case
        return text
    return (_SUSPECT_MULTILINE if multiline else _SUSPECT).sub(_escape, text)


def _json_escape(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\n" or char.isprintable() or char in _JOINERS:
        return char
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as JSON writes a character beyond the BMP
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_inert(data: bytes) -> bytes:
    """JSON text (UTF-8, one document a line) with every invisible or control character
    that ``inert`` would escape written as a JSON ``\\u`` escape instead: the same JSON
    values, exactly, and nothing a terminal acts on (a JSON writer leaves a bidi override
    or a C1 control raw). Newlines between documents stay."""
    if data.isascii():
        return data  # ASCII JSON holds no raw control character but newlines
    text = data.decode("utf-8", "surrogatepass")
    return _SUSPECT_MULTILINE.sub(_json_escape, text).encode("utf-8", "surrogatepass")
