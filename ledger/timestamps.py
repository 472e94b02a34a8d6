"""The one time format of the ledger: RFC 3339 UTC with microseconds and a ``Z``.

Timestamps are hashed (``recorded_at``), signed (decisions, tokens) and compared as
strings, so every module writes them through here.
"""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(moment: datetime) -> str:
    """``2026-11-29T20:07:13.123456Z`` for an aware datetime."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")[:-6] + "Z"


def utc_now() -> str:
    return rfc3339(datetime.now(UTC))
