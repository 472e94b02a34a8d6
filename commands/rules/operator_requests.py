"""An operator's request to the service, signed where the operator sits
(docs/service.md, "Operators through the service").

The operator routes take no bearer token: each request carries the operator key's
signature over what it asks (domain ``request``: the method, the path, the time and the
body's SHA-256) in ``Authorization: Evidence-Operator key=FINGERPRINT, time=SECONDS,
signature=BASE64``. The service accepts it within ``SKEW_S`` of its own clock, from a key
the ledger holds as an active operator's. The private key never travels, and a request
cannot be altered on the way; replaying one within its minutes asks the same again
(a prepare appends nothing; a commit's events are bound to their places, so a replay
finds its stream moved).
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger.keys import fingerprint

from .signing import sign_record

__all__ = ["SCHEME", "SKEW_S", "authorization", "parse_authorization", "request_record"]

SCHEME = "Evidence-Operator"
SKEW_S = 300  # a request's time within five minutes of the service's clock
_HEADER = re.compile(
    r"Evidence-Operator key=(?P<key>[0-9a-f]{64}), time=(?P<time>[0-9]{1,12}), "
    r"signature=(?P<signature>[A-Za-z0-9+/]{86}==)"
)


def request_record(method: str, path: str, at: int, body: bytes) -> dict[str, Any]:
    """What an operator signs of a request."""
    return {
        "method": method.upper(),
        "path": path,
        "time": at,
        "body_sha256": hashlib.sha256(body).hexdigest(),
    }


def authorization(
    key: Ed25519PrivateKey, method: str, path: str, body: bytes, at: int | None = None
) -> str:
    """The ``Authorization`` header of a request signed with ``key``."""
    at = int(time.time()) if at is None else at
    record = request_record(method, path, at, body)
    signature = sign_record(key, record, domain="request")
    return f"{SCHEME} key={fingerprint(key.public_key())}, time={at}, signature={signature}"


def parse_authorization(header: str | None) -> tuple[str, int, str]:
    """The key's fingerprint, the time and the signature of a request's header
    (``ValueError`` when there is none, or it is malformed)."""
    found = _HEADER.fullmatch((header or "").strip())
    if found is None:
        raise ValueError(f"no `{SCHEME} key=…, time=…, signature=…` authorization")
    return found["key"], int(found["time"]), found["signature"]
