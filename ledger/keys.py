"""Ed25519 key files: generate, load and encode the keys that sign checkpoints,
decisions and tokens.

No database access and no knowledge of what a key signs: the signed-note checkpoints
here in ``ledger`` and the plane's decisions and tokens (``commands.rules.signing``)
both build on it. Private keys are written mode 0600 from the first byte and refused
when others can read them.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from .canonical import strict_b64decode
from .errors import LedgerError

__all__ = [
    "KeyPair",
    "SigningError",
    "create_key_file",
    "fingerprint",
    "generate_key_pair",
    "load_private_key",
    "load_public_key",
    "private_pem",
    "public_key_b64",
    "public_key_from_b64",
    "public_pem",
    "raw_public_key",
]

_RAW_KEY_LEN = 32
_MAX_KEY_FILE = 64 * 1024  # a PEM Ed25519 key is ~120 bytes; anything huge is not a key


class SigningError(LedgerError):
    """A key, signature or token is missing, malformed, unsafe or does not verify."""


@dataclass(frozen=True)
class KeyPair:
    """A freshly generated key pair and where it was written."""

    private_key: Ed25519PrivateKey = field(repr=False)
    public_key: Ed25519PublicKey
    private_path: Path
    public_path: Path

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)

    @property
    def public_key_b64(self) -> str:
        return public_key_b64(self.public_key)


def generate_key_pair(out: str | os.PathLike[str]) -> KeyPair:
    """Write a new Ed25519 private key to ``out`` (PEM PKCS8, unencrypted, mode 0600) and
    its public key to ``out + ".pub"`` (PEM SubjectPublicKeyInfo, mode 0644).

    Never overwrites: if either file exists, nothing is written.
    """
    private_path = Path(out)
    public_path = Path(f"{private_path}.pub")
    for path in (private_path, public_path):
        if os.path.lexists(path):
            raise SigningError(f"refusing to overwrite existing file {path}")
    key = Ed25519PrivateKey.generate()
    try:
        create_key_file(private_path, private_pem(key), 0o600)
    except FileExistsError:
        raise SigningError(f"refusing to overwrite existing file {private_path}") from None
    try:
        create_key_file(public_path, public_pem(key.public_key()), 0o644)
    except BaseException as exc:
        # Half a key pair is worse than none: the caller can simply retry.
        private_path.unlink(missing_ok=True)
        if isinstance(exc, FileExistsError):
            raise SigningError(f"refusing to overwrite existing file {public_path}") from None
        raise
    return KeyPair(key, key.public_key(), private_path, public_path)


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Load an unencrypted PEM Ed25519 private key, refusing one others can read."""
    data = _read_key_file(Path(path), private=True)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:  # cryptography's signal for "encrypted, and no password given"
        raise SigningError(
            f"{path} is an encrypted private key; only unencrypted PKCS8 PEM is supported"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        if b"-----BEGIN PUBLIC KEY-----" in data:
            raise SigningError(f"{path} is a public key, not a private key") from None
        raise SigningError(f"{path} is not a PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError(f"{path} holds a {_key_kind(key)} key, not an Ed25519 key")
    return key


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    """Load an Ed25519 public key from PEM (SubjectPublicKeyInfo) or raw base64."""
    data = _read_key_file(Path(path), private=False)
    if data.lstrip().startswith(b"-----BEGIN"):
        if b"PRIVATE KEY-----" in data:
            raise SigningError(f"{path} is a private key: give its public key ({path}.pub)")
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, UnsupportedAlgorithm):
            raise SigningError(f"{path} is not a PEM public key") from None
        if not isinstance(key, Ed25519PublicKey):
            raise SigningError(f"{path} holds a {_key_kind(key)} key, not an Ed25519 key")
        return key
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise SigningError(f"{path} is neither a PEM public key nor base64") from None
    try:
        return public_key_from_b64(text)
    except SigningError as exc:
        raise SigningError(f"{path}: {exc}") from None


def public_key_b64(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """Base64 of the raw 32-byte public key (the form ApproverKeyAdded records)."""
    return base64.b64encode(raw_public_key(key)).decode("ascii")


def fingerprint(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """SHA-256 hex of the raw 32-byte public key."""
    return hashlib.sha256(raw_public_key(key)).hexdigest()


def public_key_from_b64(text: str) -> Ed25519PublicKey:
    """The public key whose raw 32 bytes ``text`` encodes (strict standard base64)."""
    raw = strict_b64decode(text)
    if raw is None:
        raise SigningError("public key is not valid base64")
    if len(raw) != _RAW_KEY_LEN:
        raise SigningError(f"public key is {len(raw)} bytes; a raw Ed25519 key is {_RAW_KEY_LEN}")
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as exc:
        raise SigningError(f"not an Ed25519 public key: {exc}") from None


def raw_public_key(key: Ed25519PublicKey | Ed25519PrivateKey) -> bytes:
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _key_kind(key: object) -> str:
    return (
        type(key).__name__.removeprefix("_").replace("PrivateKey", "").replace("PublicKey", "")
        or "non-Ed25519"
    )


def _read_key_file(path: Path, *, private: bool) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise SigningError(f"no key file at {path}") from None
    except IsADirectoryError:
        raise SigningError(f"{path} is a directory, not a key file") from None
    except OSError as exc:
        raise SigningError(f"cannot read key file {path}: {exc.strerror}") from None
    try:
        # fstat the opened file, not the path, so the checked file is the one read.
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise SigningError(f"{path} is a directory, not a key file")
        if not stat.S_ISREG(st.st_mode):
            raise SigningError(f"{path} is not a regular file")
        if private and os.name == "posix" and st.st_mode & 0o077:
            raise SigningError(
                f"private key {path} is accessible by group or others "
                f"(mode {stat.S_IMODE(st.st_mode):04o}): run `chmod 600 {path}`"
            )
        try:
            data = os.read(fd, _MAX_KEY_FILE + 1)
        except OSError as exc:  # a special file that fails to read (/proc/self/mem)
            raise SigningError(f"cannot read key file {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > _MAX_KEY_FILE:
        raise SigningError(f"{path} is too large to be a key file")
    return data


def create_key_file(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` holding ``data`` with ``mode``; FileExistsError if it exists.

    The bytes go to a temporary file created O_EXCL with ``mode`` (never more open than
    that, even briefly), then are hard-linked into place: the link is atomic and never
    replaces an existing file, so a concurrent reader sees no file or a complete one.
    """
    tmp = path.with_name(f".{path.name}.{os.urandom(8).hex()}.tmp")
    _write_new(tmp, data, mode)
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:
        # No hard links here (some network/FUSE filesystems): write in place, still O_EXCL.
        _write_new(path, data, mode)
    finally:
        tmp.unlink(missing_ok=True)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags, mode)
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, mode)  # exact mode whatever the umask (umask can only narrow it)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
