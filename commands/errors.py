"""The plane's refusal: bad input, or a step the plan's state does not allow."""

from __future__ import annotations

from ledger import LedgerError


class CommandRefused(LedgerError):
    """Bad input, or a step the current state does not allow. Nothing was appended."""
