"""RFC 9162 (Certificate Transparency v2) Merkle tree over the event log.

Leaf hash ``SHA256(0x00 || leaf)``, interior node ``SHA256(0x01 || left || right)``;
the tree of n leaves splits at the largest power of two smaller than n (section 2.1.1).

``Frontier`` is the incremental form kept in the ledger head: the roots of the perfect
subtrees that make up the tree, left to right (one per set bit of the size). Appending
a leaf merges at most log2(n) of them, so the head never needs to re-read the log.
Proof generation and verification follow sections 2.1.3 and 2.1.4.
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import sha256

__all__ = [
    "EMPTY_ROOT",
    "Frontier",
    "consistency_proof",
    "inclusion_proof",
    "leaf_hash",
    "node_hash",
    "root_of",
    "verify_consistency",
    "verify_inclusion",
]

HASH_SIZE = 32
EMPTY_ROOT = sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    return sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return sha256(b"\x01" + left + right).digest()


def merge_up(hashes: list[bytes], carry: int) -> None:
    """The one merge step of the compact range (the tree's right edge): a node was just
    pushed onto ``hashes``; merge it with each perfect subtree of its height that it
    completes — one per trailing 1 bit of ``carry``, the tree's size before it counted
    in nodes of its size. ``Frontier.append`` and ``extend``, the store's append and
    verify's scan all grow a tree with it."""
    while carry & 1:
        right = hashes.pop()
        hashes[-1] = sha256(b"\x01" + hashes[-1] + right).digest()
        carry >>= 1


class Frontier:
    """The compact right edge of a Merkle tree: enough to append and to compute the root."""

    __slots__ = ("hashes", "size")

    def __init__(self, size: int = 0, hashes: Sequence[bytes] = ()) -> None:
        if len(hashes) != size.bit_count():
            raise ValueError(f"a frontier of size {size} has {size.bit_count()} hashes")
        self.size = size
        self.hashes = list(hashes)

    @classmethod
    def from_bytes(cls, size: int, packed: bytes) -> Frontier:
        hashes = [packed[i : i + HASH_SIZE] for i in range(0, len(packed), HASH_SIZE)]
        return cls(size, hashes)

    def to_bytes(self) -> bytes:
        return b"".join(self.hashes)

    def copy(self) -> Frontier:
        return Frontier(self.size, self.hashes)

    def append(self, leaf: bytes) -> None:
        """Add one leaf hash (already ``leaf_hash``-ed)."""
        self.hashes.append(leaf)
        merge_up(self.hashes, self.size)
        self.size += 1

    def extend(self, other: Frontier) -> None:
        """Append the ``other.size`` leaves ``other`` was built from, from its perfect
        subtrees alone (how parts of a log hashed apart are joined). Each subtree must
        start at a multiple of its size: ``self.size`` a multiple of the largest."""
        if not other.size:
            return
        largest = 1 << (other.size.bit_length() - 1)
        if self.size % largest:
            raise ValueError(
                f"a frontier of {other.size} leaves cannot follow {self.size}: its subtree "
                f"of {largest} would not be aligned"
            )
        hashes = self.hashes
        levels = [k for k in range(other.size.bit_length() - 1, -1, -1) if other.size >> k & 1]
        for level, subtree in zip(levels, other.hashes, strict=True):
            hashes.append(subtree)
            merge_up(hashes, self.size >> level)  # as ``append``, from its height up
            self.size += 1 << level

    def root(self) -> bytes:
        if not self.hashes:
            return EMPTY_ROOT
        root = self.hashes[-1]
        for left in reversed(self.hashes[:-1]):
            root = node_hash(left, root)
        return root


def _split(n: int) -> int:
    """Largest power of two strictly smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def root_of(leaves: Sequence[bytes]) -> bytes:
    """MTH(D[n]) over leaf hashes.

    Level by level rather than by RFC 9162's recursive split (which copies the list at
    every level): pairing neighbours and carrying an odd last node up unchanged builds
    the same tree, since the split's left part is always the largest perfect subtree."""
    if not leaves:
        return EMPTY_ROOT
    level = list(leaves)
    while len(level) > 1:
        pairs = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) & 1:
            pairs.append(level[-1])
        level = pairs
    return level[0]


def inclusion_proof(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """PATH(m, D[n]) for the leaf at 0-based ``index`` in the tree of ``leaves``."""
    n = len(leaves)
    if not 0 <= index < n:
        raise ValueError(f"leaf index {index} is outside a tree of size {n}")
    if n == 1:
        return []
    k = _split(n)
    if index < k:
        return [*inclusion_proof(leaves[:k], index), root_of(leaves[k:])]
    return [*inclusion_proof(leaves[k:], index - k), root_of(leaves[:k])]


def consistency_proof(leaves: Sequence[bytes], old_size: int) -> list[bytes]:
    """PROOF(m, D[n]): shows the tree of the first ``old_size`` leaves is a prefix."""
    n = len(leaves)
    if not 0 < old_size <= n:
        raise ValueError(f"old size {old_size} is not within 1..{n}")
    return _subproof(old_size, leaves, True)


def _subproof(m: int, leaves: Sequence[bytes], complete: bool) -> list[bytes]:
    n = len(leaves)
    if m == n:
        return [] if complete else [root_of(leaves)]
    k = _split(n)
    if m <= k:
        return [*_subproof(m, leaves[:k], complete), root_of(leaves[k:])]
    return [*_subproof(m - k, leaves[k:], False), root_of(leaves[:k])]


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> bool:
    """RFC 9162 section 2.1.3.2, with ``leaf`` already hashed."""
    if not 0 <= index < size:
        return False
    fn, sn = index, size - 1
    r = leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """RFC 9162 section 2.1.4.2."""
    if old_size == new_size:
        return not proof and old_root == new_root
    if not 0 < old_size < new_size or not proof:
        return False
    path = list(proof)
    if old_size & (old_size - 1) == 0:  # a power of two: the old root is the first node
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == old_root and sr == new_root
