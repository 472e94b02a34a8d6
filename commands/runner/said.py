"""What a tool's MCP server said during one call, kept within a budget.

A server the agent steers through its arguments can send log and progress messages, or
requests the gate refuses, as fast as it likes while a call runs. Each is kept for the
call's record (the ``exchange`` blob) and relayed to the agent's client: unbounded, a
flood would grow the service's memory, and the relay queue of every door, without limit.
So a call keeps its server's messages up to ``EXCHANGE_CAP`` bytes (their compact JSON);
past that a message is counted, neither kept nor relayed. The counts by kind, refusals
included, are of every message the server sent, kept or not: a refused request still
makes the call the tool's failure, and ``dropped`` says how many the blob lacks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

EXCHANGE_CAP = 1 << 20  # bytes of a call's kept messages (their compact JSON)


class Said(list[dict[str, Any]]):
    """A call's messages from its server, in order, kept up to ``cap`` bytes; ``counts``
    (by kind), ``refused`` and ``dropped`` are of every message offered."""

    def __init__(self, cap: int = EXCHANGE_CAP) -> None:
        super().__init__()
        self.cap = cap
        self.size = 1  # the kept messages as one JSON array: "[", "]", a comma between two
        self.counts: Counter[str] = Counter()
        self.refused = 0
        self.dropped = 0

    @classmethod
    def of(cls, messages: Iterable[Mapping[str, Any]]) -> Said:
        """``messages`` (a recorded exchange) kept as a call keeps them."""
        said = cls()
        for message in messages:
            said.keep(dict(message))
        return said

    def keep(self, entry: dict[str, Any]) -> bool:
        """Count ``entry`` and keep it if it fits the budget; False when it was dropped
        (then it is not relayed either)."""
        self.counts[str(entry.get("kind"))] += 1
        self.refused += entry.get("refused") is True
        size = len(msgspec.json.encode(entry)) + 1
        if self.size + size > self.cap:
            self.dropped += 1
            return False
        self.size += size
        super().append(entry)
        return True

    def append(self, entry: dict[str, Any]) -> None:
        self.keep(entry)

    def __bool__(self) -> bool:
        """The server said anything: a message kept, or one dropped past the budget."""
        return len(self) > 0 or self.dropped > 0
