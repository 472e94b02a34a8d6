"""Signed tree heads in the C2SP ``tlog-checkpoint`` format, and checking the log against one.

A checkpoint is a C2SP signed note (https://c2sp.org/signed-note) whose body is
(https://c2sp.org/tlog-checkpoint)::

    <origin>\\n
    <tree size, decimal>\\n
    <base64 of the RFC 9162 root hash>\\n
    \\n
    — <key name> <base64(key hash[4] || Ed25519 signature[64])>\\n

The signature covers the body exactly (the three lines, each ending in a newline). The
key hash is ``SHA-256(key name || 0x0A || 0x01 || raw public key)[:4]`` (0x01 is the
Ed25519 signature type of signed notes). The key name defaults to the origin, as the
transparency-dev tools do. Any tool that reads checkpoints (``note.Open`` in Go) can
check one printed here with the public key, and the reverse.

A reader is configured with a **verifier key** (C2SP signed-note, Go's ``NewVerifier``):
``<name>+<key hash, 8 hex digits>+<base64(0x01 || raw Ed25519 public key)>``
(``VerifierKey``). ``open_note`` accepts a note only when a signature line carries
exactly that name and key hash and verifies; lines by any other (name, key hash) are
ignored, as ``note.Open`` ignores unknown signers, and a known line that does not verify
fails the note. A bare public key given to check a *checkpoint* stands for the verifier
key named after the checkpoint's origin (the name this module signs under), never for
"any name".

``verify_against_checkpoint`` is the auditor's check: the note is signed by the given key,
and the current log extends the tree head it names (an RFC 9162 consistency proof from
that head to the current one, computed from the stored leaves, and ``verify_store`` over
every stored byte with the kept head as ``against``).
"""

from __future__ import annotations

import base64
import hashlib
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import sqlalchemy as sa
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from . import tables
from .canonical import MAX_SAFE_INTEGER, strict_b64decode
from .errors import LedgerError
from .keys import raw_public_key
from .merkle import (
    EMPTY_ROOT,
    consistency_proof,
    inclusion_proof,
    root_of,
    verify_consistency,
)
from .store import Store
from .verify import Problem, TreeHeadRef, VerifyReport, verify_store

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointReport",
    "InclusionProof",
    "Signature",
    "Verifier",
    "VerifierKey",
    "consistency_with",
    "format_signature",
    "inclusion_from_leaves",
    "key_hash",
    "open_note",
    "parse_checkpoint",
    "parse_note",
    "parse_verifier_key",
    "prove_inclusion",
    "sign_checkpoint",
    "sign_note",
    "stored_leaves",
    "verifier_key",
    "verify_against_checkpoint",
    "verify_checkpoint_signature",
]

SIGNATURE_PREFIX = "\u2014 "  # an em dash and a space start every signature line
_ED25519_TYPE = b"\x01"
_MAX_NOTE = 64 * 1024
_MAX_SIGNATURES = 100  # note.Open refuses a note with more signature lines
_HEX8 = re.compile(r"[0-9a-fA-F]{8}")
_SIZE_RE = re.compile(r"(0|[1-9][0-9]{0,19})")


class CheckpointError(LedgerError):
    """A checkpoint that cannot be parsed (or a key that cannot sign one)."""


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def body(self) -> str:
        lines = [
            self.origin,
            str(self.size),
            base64.b64encode(self.root).decode("ascii"),
            *self.extensions,
        ]
        return "".join(f"{line}\n" for line in lines)


class Signature(msgspec.Struct, frozen=True):
    name: str
    key_hash: bytes
    signature: bytes


def _check_name(name: str, what: str) -> None:
    # C2SP: non-empty, no spaces or '+'. Control and format characters are refused too: a
    # name is printed wherever the checkpoint is shown, and must be inert there.
    if (
        not name
        or len(name) > 255
        or "+" in name
        or any(c.isspace() or unicodedata.category(c) in ("Cc", "Cf", "Cs") for c in name)
    ):
        raise CheckpointError(
            f"{what} {name!r} must be 1 to 255 characters, with no "
            "spaces, control characters or '+'"
        )


def key_hash(name: str, key: Ed25519PublicKey | Ed25519PrivateKey) -> bytes:
    """The 4-byte key id of a signed-note Ed25519 key."""
    return _key_hash(name, _ED25519_TYPE + raw_public_key(key))


def _key_hash(name: str, encoded_key: bytes) -> bytes:
    # SHA-256(name || "\n" || encoded key)[:4], the encoded key starting with its type byte.
    return hashlib.sha256(name.encode("utf-8") + b"\n" + encoded_key).digest()[:4]


def _valid_signer_name(name: str) -> bool:
    """A signed-note key name as ``note.Open`` reads one: non-empty, no Unicode space
    (Go's ``unicode.IsSpace``), no ``+``."""
    return (
        bool(name)
        and "+" not in name
        and not any(
            c in "\t\n\v\f\r \x85\xa0" or unicodedata.category(c) in ("Zs", "Zl", "Zp")
            for c in name
        )
    )


@dataclass(frozen=True)
class VerifierKey:
    """A C2SP signed-note verifier key: the one (name, key hash, Ed25519 key) whose
    signature lines a reader accepts. ``str()`` is its text form
    ``<name>+<hash hex>+<base64(0x01 || public key)>``."""

    name: str
    key_hash: bytes
    public_key: Ed25519PublicKey

    @classmethod
    def of(cls, name: str, key: Ed25519PublicKey | Ed25519PrivateKey) -> VerifierKey:
        """The verifier key of ``key`` under ``name``."""
        if not _valid_signer_name(name):
            raise CheckpointError(f"key name {name!r} must be non-empty, with no spaces or '+'")
        public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
        return cls(name, key_hash(name, public), public)

    def __str__(self) -> str:
        encoded = base64.b64encode(_ED25519_TYPE + raw_public_key(self.public_key))
        return f"{self.name}+{self.key_hash.hex()}+{encoded.decode('ascii')}"

    @property
    def id(self) -> str:
        """``name+hash``: how a signature line names its key."""
        return f"{self.name}+{self.key_hash.hex()}"


# What a checkpoint is checked with: a verifier key, or a bare public key standing for the
# verifier key named after the checkpoint's origin.
Verifier = VerifierKey | Ed25519PublicKey


def verifier_key(name: str, key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """The text verifier key of ``key`` under ``name`` (Go's ``NewEd25519VerifierKey``)."""
    return str(VerifierKey.of(name, key))


def parse_verifier_key(text: str) -> VerifierKey:
    """A verifier key ``<name>+<hash>+<keydata>``, by the rules of Go's
    ``note.NewVerifier``: a valid name, exactly 8 hex digits, standard base64 key data
    of the Ed25519 type byte (0x01) and a 32-byte key, and the hash equal to the key hash
    of that name and key (else the key names another key)."""
    text = text.strip()
    name, _, rest = text.partition("+")
    hash_hex, _, encoded = rest.partition("+")
    data = strict_b64decode(encoded) if encoded else None
    if not _valid_signer_name(name) or not _HEX8.fullmatch(hash_hex) or not data:
        raise CheckpointError(
            f"{text[:80]!r} is not a verifier key <name>+<8 hex digits>+<base64 key> "
            "(C2SP signed-note)"
        )
    if data[0] != _ED25519_TYPE[0]:
        raise CheckpointError(
            f"verifier key {name}+{hash_hex}: unknown signature type 0x{data[0]:02x} "
            "(only Ed25519, 0x01, is supported)"
        )
    if len(data) != 1 + 32:
        raise CheckpointError(
            f"verifier key {name}+{hash_hex}: an Ed25519 key is 32 bytes, got {len(data) - 1}"
        )
    if _key_hash(name, data) != bytes.fromhex(hash_hex):
        raise CheckpointError(
            f"verifier key {name}+{hash_hex}: the key hash is not the hash of this name and "
            f"key (that is {_key_hash(name, data).hex()})"
        )
    return VerifierKey(name, bytes.fromhex(hash_hex), Ed25519PublicKey.from_public_bytes(data[1:]))


def sign_note(text: str, key: Ed25519PrivateKey, name: str) -> str:
    """A C2SP signed note: ``text`` (non-empty lines, ending in a newline), a blank
    line, and one Ed25519 signature line by ``name``."""
    _check_name(name, "key name")
    if not text.endswith("\n") or "\n\n" in text or text.startswith("\n"):
        raise CheckpointError("note text must be non-empty lines, each ending in a newline")
    signature = key.sign(text.encode("utf-8"))
    return text + "\n" + format_signature(Signature(name, key_hash(name, key), signature))


def format_signature(sig: Signature) -> str:
    blob = base64.b64encode(sig.key_hash + sig.signature).decode("ascii")
    return f"{SIGNATURE_PREFIX}{sig.name} {blob}\n"


def sign_checkpoint(
    checkpoint: Checkpoint, key: Ed25519PrivateKey, *, name: str | None = None
) -> str:
    """The signed note text of ``checkpoint`` (key name: ``name``, else the origin)."""
    _check_name(checkpoint.origin, "origin")
    if len(checkpoint.root) != 32:
        raise CheckpointError("a checkpoint root hash is 32 bytes")
    return sign_note(checkpoint.body(), key, name or checkpoint.origin)


def parse_note(note: str) -> tuple[str, list[Signature]]:
    """Split a signed note into its text and its signature lines, as ``note.Open``
    does: UTF-8 with no control character but newline; the text ends at the *last*
    blank line; every line after it is ``— <name> <base64(key hash || signature)>``
    with a valid name and at least 5 bytes; at most 100 of them."""
    if len(note) > _MAX_NOTE:
        raise CheckpointError("checkpoint is too large")
    try:
        note.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate (a str from anywhere)
        raise CheckpointError(
            f"checkpoint is not Unicode text (a lone surrogate at character {exc.start})"
        ) from None
    if "\r" in note or not note.endswith("\n"):
        raise CheckpointError("checkpoint must use \\n line endings and end with a newline")
    control = next((c for c in note if c < " " and c != "\n"), None)
    if control is not None:
        raise CheckpointError(
            f"checkpoint holds the control character 0x{ord(control):02x} "
            "(a signed note has none but newline)"
        )
    text, sep, sig_block = note.rpartition("\n\n")
    if not sep:
        raise CheckpointError("checkpoint has no blank line before its signatures")
    lines = sig_block[:-1].split("\n")
    if len(lines) > _MAX_SIGNATURES:
        raise CheckpointError(f"checkpoint has more than {_MAX_SIGNATURES} signature lines")
    signatures = []
    for line in lines:
        if not line.startswith(SIGNATURE_PREFIX):
            raise CheckpointError(f"malformed signature line {line[:60]!r}")
        name, space, encoded = line[len(SIGNATURE_PREFIX) :].partition(" ")
        raw = strict_b64decode(encoded) if space else None
        if not _valid_signer_name(name) or raw is None or len(raw) < 5:
            raise CheckpointError(f"malformed signature line {line[:60]!r}")
        signatures.append(Signature(name, raw[:4], raw[4:]))
    return text + "\n", signatures


def open_note(note: str, verifier: VerifierKey) -> str:
    """The note's text, if a signature line carries the verifier key's name and key
    hash and verifies (``note.Open`` with that one verifier); raises
    ``CheckpointError`` otherwise. Lines under any other name or key hash are ignored
    (co-signers, witnesses); the first line under this one decides: it verifies, or the
    note fails (a repeated line by the same key is dropped, as ``note.Open`` drops it)."""
    text, signatures = parse_note(note)
    for sig in signatures:
        if sig.name != verifier.name or sig.key_hash != verifier.key_hash:
            continue
        try:
            verifier.public_key.verify(sig.signature, text.encode("utf-8"))
        except InvalidSignature:
            raise CheckpointError(
                f"the signature by {verifier.id} does not verify: the checkpoint was "
                "altered or signed by another key"
            ) from None
        return text  # a later line under the same key is dropped unread, as Go does
    others = sorted({f"{s.name}+{s.key_hash.hex()}" for s in signatures})
    raise CheckpointError(
        f"no signature line on the checkpoint is by the verifier key {verifier.id} "
        f"(its signature lines are by {', '.join(others)})"
    )


def parse_checkpoint(note: str) -> tuple[Checkpoint, list[Signature]]:
    """Parse a signed checkpoint note strictly (signatures not checked)."""
    text, signatures = parse_note(note)
    lines = text[:-1].split("\n")
    if len(lines) < 3:
        raise CheckpointError("checkpoint body needs origin, tree size and root hash lines")
    origin, size_text, root_text, *extensions = lines
    if not origin:
        raise CheckpointError("checkpoint origin line is empty")
    if any(not line for line in extensions):
        raise CheckpointError("checkpoint body has an empty line")
    if not _SIZE_RE.fullmatch(size_text):
        raise CheckpointError(f"checkpoint tree size {size_text[:40]!r} is not a decimal number")
    if int(size_text) > MAX_SAFE_INTEGER:
        raise CheckpointError(
            f"checkpoint tree size {size_text} is beyond 2^53 - 1: no log "
            "this evidence reads is that large"
        )
    root = strict_b64decode(root_text)
    if root is None or len(root) != 32:
        raise CheckpointError("checkpoint root hash is not base64 of 32 bytes")
    checkpoint = Checkpoint(
        origin=origin, size=int(size_text), root=root, extensions=tuple(extensions)
    )
    return checkpoint, signatures


def verify_checkpoint_signature(note: str, verifier: Verifier) -> Checkpoint:
    """The checkpoint, if it is signed under ``verifier`` (see ``open_note``); a bare
    public key stands for the verifier key named after the checkpoint's origin."""
    checkpoint = parse_checkpoint(note)[0]
    if not isinstance(verifier, VerifierKey):
        verifier = VerifierKey.of(checkpoint.origin, verifier)
    open_note(note, verifier)
    return checkpoint


# --------------------------------------------------------------------------- the store


def stored_leaves(store: Store, size: int | None = None) -> list[bytes]:
    """The stored leaf hashes in position order (the first ``size`` of them), read in
    one statement.

    They are what proofs are built from; ``verify_store`` is what shows each one is the
    hash of its row."""
    ev = tables.events.c
    query = sa.select(ev.leaf_hash).order_by(ev.position)
    if size is not None:
        query = query.limit(size)
    with store.engine.connect() as conn:
        return [bytes(leaf) for (leaf,) in conn.execute(query)]


class InclusionProof(msgspec.Struct, kw_only=True):
    position: int
    leaf_index: int
    tree_size: int
    leaf_hash: str
    root: str
    proof: list[str]


def prove_inclusion(store: Store, position: int, size: int | None = None) -> InclusionProof:
    """RFC 9162 inclusion proof of the event at ``position`` (1-based) in the tree of the
    first ``size`` events (default: the whole log)."""
    head = store.head().size
    size = head if size is None else size
    if not 0 < size <= head:
        raise CheckpointError(f"tree size {size} is not within 1..{head}")
    return inclusion_from_leaves(stored_leaves(store, size), position)


def inclusion_from_leaves(leaves: Sequence[bytes], position: int) -> InclusionProof:
    """The inclusion proof of the leaf at 1-based ``position`` in the tree of ``leaves``."""
    if not 0 < position <= len(leaves):
        raise CheckpointError(f"position {position} is not within 1..{len(leaves)}")
    return InclusionProof(
        position=position,
        leaf_index=position - 1,
        tree_size=len(leaves),
        leaf_hash=leaves[position - 1].hex(),
        root=root_of(leaves).hex(),
        proof=[p.hex() for p in inclusion_proof(leaves, position - 1)],
    )


def consistency_with(
    checkpoint: Checkpoint, leaves: Sequence[bytes]
) -> tuple[bool | None, list[bytes], Problem | None]:
    """Whether the tree of ``leaves`` extends the checkpoint's tree head: (consistent or
    None if it cannot be checked, the RFC 9162 consistency proof, the problem if any)."""
    if checkpoint.size > len(leaves):
        return (
            None,
            [],
            Problem(
                None,
                "checkpoint_truncated",
                f"the checkpoint covers {checkpoint.size} events but the log "
                f"holds {len(leaves)}: the log was truncated",
            ),
        )
    proof: list[bytes] = []
    if checkpoint.size == 0:
        consistent = checkpoint.root == EMPTY_ROOT
    else:
        proof = consistency_proof(leaves, checkpoint.size)
        consistent = verify_consistency(
            checkpoint.size, len(leaves), checkpoint.root, root_of(leaves), proof
        )
    if consistent:
        return True, proof, None
    return (
        False,
        proof,
        Problem(
            None,
            "checkpoint_inconsistent",
            f"no consistency proof from the checkpoint's tree head {checkpoint.size}:"
            f"{checkpoint.root.hex()} to the current log: events at or before position "
            f"{checkpoint.size} were rewritten since it was signed",
        ),
    )


class CheckpointHead(msgspec.Struct, kw_only=True):
    origin: str
    size: int
    root: str  # hex
    signature_ok: bool
    consistent: bool | None  # None: not checked (a bad signature, or a truncated log)
    consistency_proof: list[str]


class CheckpointReport(msgspec.Struct, kw_only=True):
    ok: bool
    checkpoint: CheckpointHead | None
    verify: VerifyReport
    problems: list[Problem]  # about the checkpoint; the log's own are in verify.problems


def verify_against_checkpoint(
    store: Store, checkpoint_text: str, public_key: Verifier
) -> CheckpointReport:
    """Check the note's signature, then that the current log extends its tree head: an
    RFC 9162 consistency proof from it to the current head, and ``verify_store`` of every
    stored byte (with the kept head as ``against``). ``ok`` only if all of that holds."""
    problems: list[Problem] = []
    try:
        checkpoint, _ = parse_checkpoint(checkpoint_text)
    except CheckpointError as exc:
        problems.append(Problem(None, "checkpoint_malformed", str(exc)))
        return CheckpointReport(
            ok=False, checkpoint=None, verify=verify_store(store), problems=problems
        )
    signature_ok = True
    try:
        verify_checkpoint_signature(checkpoint_text, public_key)
    except CheckpointError as exc:
        signature_ok = False
        problems.append(Problem(None, "checkpoint_signature", str(exc)))
    kept = TreeHeadRef(size=checkpoint.size, root=checkpoint.root.hex())
    report = verify_store(store, against=kept)
    consistent, proof, problem = consistency_with(checkpoint, stored_leaves(store))
    if problem is not None:
        problems.append(problem)
    head = CheckpointHead(
        origin=checkpoint.origin,
        size=checkpoint.size,
        root=checkpoint.root.hex(),
        signature_ok=signature_ok,
        consistent=consistent,
        consistency_proof=[p.hex() for p in proof],
    )
    return CheckpointReport(
        ok=report.ok and not problems, checkpoint=head, verify=report, problems=problems
    )
