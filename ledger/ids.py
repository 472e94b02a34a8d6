"""ULIDs for the ids the store assigns (event ids, the ledger id).

The format is the ULID spec's, as python-ulid writes it: 128 bits, a 48-bit Unix time in
milliseconds then 80 random bits, as 26 Crockford base32 characters (so the first is at
most ``7``). Within one millisecond the ids of a process increase by one, as
python-ulid's default (strict monotonic) generator does, so ids made in one process
sort in the order they were made; a new millisecond draws fresh randomness.

python-ulid builds a ULID object, its bytes and then the string for each id (about
3.6 us); this makes the string directly (about 1 us), and is what every append pays
per event. ``is_ulid`` is the check applied to the ids a caller supplies.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["ULID_ALPHABET", "is_ulid", "new_ulid", "new_ulids"]

ULID_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base32
_ALPHABET_SET = frozenset(ULID_ALPHABET)
# Every pair of characters, indexed by the 10 bits they encode: half the lookups.
_PAIRS = [a + b for a in ULID_ALPHABET for b in ULID_ALPHABET]
_LOW40 = (1 << 40) - 1
_RANDOM_BITS = 80

_lock = threading.Lock()
# The last id made, as (milliseconds, randomness), and the timestamp's 10 characters.
_last_ms = -1
_last_random = 0
_last_prefix = ""


def _reset_after_fork() -> None:
    # A child forked in the parent's millisecond would otherwise continue the parent's
    # sequence, and the two processes would make the same ids.
    global _last_ms
    _last_ms = -1


os.register_at_fork(after_in_child=_reset_after_fork)


def _encode_time(ms: int) -> str:
    pairs = _PAIRS
    # 48 bits in 10 characters: the top character holds the 2 leading zero bits + 3 bits.
    return (
        pairs[ms >> 40]
        + pairs[ms >> 30 & 1023]
        + pairs[ms >> 20 & 1023]
        + pairs[ms >> 10 & 1023]
        + pairs[ms & 1023]
    )


def new_ulid() -> str:
    """A new ULID string, greater than the previous one made in this process within the
    same millisecond."""
    return new_ulids(1)[0]


def new_ulids(count: int) -> list[str]:
    """``count`` new ULID strings in increasing order (as ``new_ulid`` ``count`` times,
    but one clock read and one lock for all: an append makes its events' ids at once)."""
    global _last_ms, _last_random, _last_prefix
    ms = time.time_ns() // 1_000_000
    with _lock:
        if ms == _last_ms:
            first = _last_random + 1
        else:
            first = int.from_bytes(os.urandom(10), "big")
            _last_prefix = _encode_time(ms)
            _last_ms = ms
        last = first + count - 1
        if last >> _RANDOM_BITS:  # 2**80 ids in one millisecond: never, in practice
            raise OverflowError("ULID randomness exhausted within one millisecond")
        _last_random = last
        prefix = _last_prefix
    # (base64.b32encode and a translation would be shorter, but before Python 3.13 it
    # is a loop in Python: slower than these lookups.)
    pairs = _PAIRS
    made = []
    for random in range(first, last + 1):
        high, low = random >> 40, random & _LOW40  # two small ints: cheaper shifts
        made.append(
            prefix
            + pairs[high >> 30]
            + pairs[high >> 20 & 1023]
            + pairs[high >> 10 & 1023]
            + pairs[high & 1023]
            + pairs[low >> 30]
            + pairs[low >> 20 & 1023]
            + pairs[low >> 10 & 1023]
            + pairs[low & 1023]
        )
    return made


def is_ulid(value: str) -> bool:
    """26 Crockford base32 characters (upper case) whose value fits in 128 bits."""
    return len(value) == 26 and _ALPHABET_SET.issuperset(value) and value[0] <= "7"
