"""RFC 6962 / 9162 Merkle tree against the published reference vectors."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.merkle import (
    EMPTY_ROOT,
    Frontier,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    root_of,
    verify_consistency,
    verify_inclusion,
)
from tests.helpers import TESTS

VECTORS = json.loads((TESTS / "vectors" / "rfc6962.json").read_text())
LEAVES = [leaf_hash(bytes.fromhex(h)) for h in VECTORS["leaves_hex"]]
ROOTS = {int(k): bytes.fromhex(v) for k, v in VECTORS["roots_by_size"].items()}


def test_empty_tree_root() -> None:
    assert EMPTY_ROOT.hex() == VECTORS["empty_root"]
    assert Frontier().root() == EMPTY_ROOT


def test_incremental_frontier_matches_reference_roots() -> None:
    frontier = Frontier()
    for size, leaf in enumerate(LEAVES, start=1):
        frontier.append(leaf)
        assert frontier.root() == ROOTS[size], size
        assert root_of(LEAVES[:size]) == ROOTS[size]
        # The packed form the head stores round-trips.
        assert Frontier.from_bytes(size, frontier.to_bytes()).root() == ROOTS[size]


@pytest.mark.parametrize("case", VECTORS["inclusion_proofs"], ids=lambda c: str(c))
def test_inclusion_proof_vectors(case: dict) -> None:
    index, size = case["leaf_index"], case["tree_size"]
    proof = inclusion_proof(LEAVES[:size], index)
    assert [p.hex() for p in proof] == case["proof"]
    assert verify_inclusion(LEAVES[index], index, size, proof, ROOTS[size])


@pytest.mark.parametrize("case", VECTORS["consistency_proofs"], ids=lambda c: str(c))
def test_consistency_proof_vectors(case: dict) -> None:
    old, new = case["size1"], case["size2"]
    proof = consistency_proof(LEAVES[:new], old)
    assert [p.hex() for p in proof] == case["proof"]
    assert verify_consistency(old, new, ROOTS[old], ROOTS[new], proof)


def test_tampered_proofs_fail() -> None:
    case = VECTORS["inclusion_proofs"][1]
    proof = [bytes.fromhex(p) for p in case["proof"]]
    bad = [proof[0][:-1] + bytes([proof[0][-1] ^ 1]), *proof[1:]]
    assert not verify_inclusion(LEAVES[0], 0, 8, bad, ROOTS[8])
    assert not verify_inclusion(LEAVES[1], 0, 8, proof, ROOTS[8])  # wrong leaf
    assert not verify_inclusion(LEAVES[0], 1, 8, proof, ROOTS[8])  # wrong index
    assert not verify_inclusion(LEAVES[0], 0, 3, proof, ROOTS[8])  # too long a path
    cons = [bytes.fromhex(p) for p in VECTORS["consistency_proofs"][2]["proof"]]
    assert not verify_consistency(6, 8, ROOTS[5], ROOTS[8], cons)
    assert not verify_consistency(6, 8, ROOTS[6], ROOTS[7], cons)


def test_every_proof_of_small_trees_verifies() -> None:
    leaves = [leaf_hash(os.urandom(8)) for _ in range(33)]
    for n in range(1, len(leaves) + 1):
        root = root_of(leaves[:n])
        for i in range(n):
            assert verify_inclusion(leaves[i], i, n, inclusion_proof(leaves[:n], i), root)
        for m in range(1, n + 1):
            proof = consistency_proof(leaves[:n], m)
            assert verify_consistency(m, n, root_of(leaves[:m]), root, proof), (m, n)


@given(st.integers(0, 70), st.integers(0, 70))
def test_a_frontier_extended_by_an_aligned_part_is_the_whole_tree(a: int, b: int) -> None:
    """``Frontier.extend``: the tree of a + b leaves from the trees of the two parts,
    whenever the second part's subtrees are aligned (verify --jobs joins parts so)."""
    leaves = [leaf_hash(bytes([i])) for i in range(a + b)]
    head, tail = Frontier(), Frontier()
    for leaf in leaves[:a]:
        head.append(leaf)
    for leaf in leaves[a:]:
        tail.append(leaf)
    if b and a % (1 << (b.bit_length() - 1)):
        with pytest.raises(ValueError, match="not be aligned"):
            head.extend(tail)
        return
    head.extend(tail)
    assert (head.size, head.root()) == (a + b, root_of(leaves))
