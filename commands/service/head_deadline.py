"""A deadline on a request's head: uvicorn's h11 protocol, which gives a client as long
as it likes to send its request line and headers (its keep-alive timer stops at the
first byte), closes the connection when the head is not whole within
``EVIDENCE_HEADER_TIMEOUT`` seconds (default 10) of the connection, or of the previous
answer on a kept-alive one.

Admission (the credential check, the in-flight bound) starts only once the head is in,
so without it a client dripping a byte of headers now and then holds a socket and a
file descriptor for ever; with it, for at most the deadline. The answer is a bare
``408`` and the connection closed: nothing of the app has run.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ledger.intake import env_seconds

HEADER_TIMEOUT_ENV = "EVIDENCE_HEADER_TIMEOUT"
DEFAULT_HEADER_TIMEOUT_S = 10.0
_BODY = b'{"error": "the request head did not arrive within EVIDENCE_HEADER_TIMEOUT seconds"}'
_TOO_SLOW = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_BODY), _BODY)
)


def header_timeout() -> float:
    """``EVIDENCE_HEADER_TIMEOUT`` (seconds, > 0), else ``DEFAULT_HEADER_TIMEOUT_S``."""
    return env_seconds(HEADER_TIMEOUT_ENV, DEFAULT_HEADER_TIMEOUT_S)


def head_deadline_protocol(seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, with the head of each request due within ``seconds``."""

    class HeadDeadline(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the head is in (or the line broke)
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm()  # a kept-alive connection: the next head is due in time too

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(seconds, self._too_slow)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _too_slow(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self.transport.write(_TOO_SLOW)
                self.transport.close()

    return HeadDeadline
