"""Ed25519 signing: approver keys and decisions, the plane key and apply tokens.

No database access here: this is the crypto core the commands build on.

Message format (any third party can recompute it): a signature covers

    b"evidence-ledger/v1/" + domain + b"\\n" + canonical_json(record)

where ``domain`` is ``decision`` (a human decision, signed with an approver key the agent
process never holds), ``token`` (an apply token, signed with the plane key) or
``approver`` (the plane key's endorsement of an approver key: only whoever holds the
plane key — the operator — can make a key an approver). The domain prefix means a
signature made for one use can never verify for another, even if the same key were
(wrongly) used for both.

Tokens (INV1) are compact strings ``evt1.<base64url(claims)>.<base64url(signature)>``:
the claims bind the token to a plan, an attempt and the digest of the real results the
pass was computed from, and carry an expiry. ``verify_token`` checks the signature, the
plan and the validity window. **Single use is not checked here**: the caller must refuse
a token whose ``token_id`` already has a ``TokenConsumed`` event in the plan's stream,
and must compare ``attempt`` / ``results_digest`` with the ``TokenMinted`` event (or
pass them to ``verify_token``). Events record ``token_digest(token)``, never the token.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import msgspec
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from .canonical import CanonicalizationError, canonical_json, strict_b64decode
from .errors import LedgerError
from .timestamps import rfc3339

__all__ = [
    "DECISION_CHOICES",
    "DOMAINS",
    "PLANE_KEY_ENV",
    "TOKEN_PREFIX",
    "Domain",
    "KeyPair",
    "SigningError",
    "TokenClaims",
    "TokenRefused",
    "approver_record",
    "decision_record",
    "fingerprint",
    "generate_key_pair",
    "load_or_create_plane_key",
    "load_private_key",
    "load_public_key",
    "mint_token",
    "plane_key_path",
    "public_key_b64",
    "public_key_from_b64",
    "read_token",
    "sign_record",
    "token_digest",
    "token_signature",
    "url_identity",
    "verify_record",
    "verify_token",
]

Domain = Literal["decision", "token", "approver"]
DOMAINS: tuple[str, ...] = ("decision", "token", "approver")
DECISION_CHOICES: tuple[str, ...] = ("revise", "abandon")  # DecisionRecorded.choice
PLANE_KEY_ENV = "EVIDENCE_PLANE_KEY"
TOKEN_PREFIX = "evt1"

_MESSAGE_PREFIX = b"evidence-ledger/v1/"
_SIGNATURE_LEN = 64
_RAW_KEY_LEN = 32
_MAX_KEY_FILE = 64 * 1024  # a PEM Ed25519 key is ~120 bytes; anything huge is not a key
_MAX_TOKEN_LEN = 4096
# ASCII digits only ("\d" would admit other scripts' digits); "\Z", unlike "$", does not
# match before a trailing newline.
_RFC3339_UTC = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z\Z"
_B64URL = re.compile(r"[A-Za-z0-9_-]*")


class SigningError(LedgerError):
    """A key, signature or token is missing, malformed, unsafe or does not verify."""


class TokenRefused(SigningError):
    """A token did not verify. ``reason`` is one of: ``format``, ``signature``, ``plan``,
    ``attempt``, ``results_digest``, ``expired``, ``not_yet_valid``."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


# --------------------------------------------------------------------------- key files


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
        _create_exclusive(private_path, _private_pem(key), 0o600)
    except FileExistsError:
        raise SigningError(f"refusing to overwrite existing file {private_path}") from None
    try:
        _create_exclusive(public_path, _public_pem(key.public_key()), 0o644)
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
    return base64.b64encode(_raw_public(key)).decode("ascii")


def fingerprint(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """SHA-256 hex of the raw 32-byte public key."""
    return hashlib.sha256(_raw_public(key)).hexdigest()


def public_key_from_b64(text: str) -> Ed25519PublicKey:
    """The public key whose raw 32 bytes ``text`` encodes (strict standard base64)."""
    raw = strict_b64decode(text)
    if raw is None:
        raise SigningError("public key is not valid base64")
    if len(raw) != _RAW_KEY_LEN:
        raise SigningError(
            f"public key is {len(raw)} bytes; a raw Ed25519 key is {_RAW_KEY_LEN}"
        )
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as exc:
        raise SigningError(f"not an Ed25519 public key: {exc}") from None


# ------------------------------------------------------------------------ signed records


def sign_record(private_key: Ed25519PrivateKey, record: dict[str, Any], *,
                domain: Domain) -> str:
    """Base64 Ed25519 signature over the domain-separated canonical record."""
    try:
        message = _message(domain, canonical_json(record))
    except CanonicalizationError as exc:
        raise SigningError(f"record has no canonical JSON form: {exc}") from None
    return base64.b64encode(private_key.sign(message)).decode("ascii")


def verify_record(public_key: Ed25519PublicKey, record: dict[str, Any], signature_b64: str,
                  *, domain: Domain) -> bool:
    """True only if ``signature_b64`` signs ``record`` for ``domain`` with this key.

    Never raises for untrusted input (bad base64, wrong length, a record with no
    canonical form): those are all simply False. An unknown ``domain`` is a programming
    error and raises ValueError.
    """
    _check_domain(domain)
    if not isinstance(signature_b64, str):
        return False
    signature = strict_b64decode(signature_b64)
    if signature is None or len(signature) != _SIGNATURE_LEN:
        return False
    try:
        payload = canonical_json(record)
    except CanonicalizationError:
        return False
    return _verify_raw(public_key, signature, _message(domain, payload))


def decision_record(decision_id: str, plan_id: str, choice: str, guidance: str | None,
                    escalation_hash: str, signed_at: str,
                    reason: str | None = None) -> dict[str, Any]:
    """The record an approver signs (domain ``decision``) to decide an escalation.

    ``escalation_hash`` (the RFC 9162 leaf hash of the Escalated event, which an offline
    bundle carries too) pins the signature to one escalation of one plan, so it cannot
    be replayed elsewhere; the choice, guidance and reason are covered, so none of them
    can be changed after signing.
    """
    if choice not in DECISION_CHOICES:
        raise SigningError(
            f"decision choice must be one of {', '.join(DECISION_CHOICES)}, not {choice!r}"
        )
    for name, value in (("decision_id", decision_id), ("plan_id", plan_id),
                        ("escalation_hash", escalation_hash), ("signed_at", signed_at)):
        if not isinstance(value, str) or not value:
            raise SigningError(f"decision {name} must be a non-empty string")
    for name, text in (("guidance", guidance), ("reason", reason)):
        if text is not None and not isinstance(text, str):
            raise SigningError(f"decision {name} must be a string or null")
    return {
        "decision_id": decision_id,
        "plan_id": plan_id,
        "choice": choice,
        "guidance": guidance,
        "reason": reason,
        "escalation_hash": escalation_hash,
        "signed_at": signed_at,
    }


def approver_record(name: str, public_key: str, fingerprint: str) -> dict[str, Any]:
    """The record the plane key signs (domain ``approver``) to endorse an approver key."""
    return {"name": name, "public_key": public_key, "fingerprint": fingerprint}


# ---------------------------------------------------------------------------- plane key


def plane_key_path(db_url: str) -> Path:
    """Where the plane key (the token-minting key) of the ledger at ``db_url`` lives.

    Never in the events table: ``$EVIDENCE_PLANE_KEY`` if set; for a SQLite file,
    ``<db>.plane-key`` next to it; otherwise (PostgreSQL, in-memory SQLite)
    ``~/.config/evidence-ledger/plane-<sha256(url without password)[:16]>.key``.
    """
    override = os.environ.get(PLANE_KEY_ENV)
    if override:
        return Path(override).expanduser()
    driver, sep, rest = db_url.partition("://")
    if not sep:
        raise SigningError(f"not a database URL: {db_url!r}")
    if driver.split("+", 1)[0] == "sqlite":
        path = rest.split("?", 1)[0]
        if path and not path.startswith("/"):
            raise SigningError(
                f"malformed SQLite URL {db_url!r}: use sqlite:///relative/path "
                "or sqlite:////absolute/path"
            )
        path = path[1:]  # sqlite:///x -> "x", sqlite:////abs/x -> "/abs/x"
        if path and path != ":memory:":
            return Path(os.path.abspath(path + ".plane-key"))
    digest = hashlib.sha256(url_identity(db_url).encode("utf-8")).hexdigest()[:16]
    return _config_dir() / f"plane-{digest}.key"


def _config_dir() -> Path:
    return Path.home() / ".config" / "evidence-ledger"


def load_or_create_plane_key(db_url: str) -> Ed25519PrivateKey:
    """The plane key for ``db_url`` (at ``plane_key_path``), created on first use.

    Created with mode 0600 from the first byte, in the default config directory (made
    0700) or in an existing directory (next to the SQLite file, or the directory of
    ``$EVIDENCE_PLANE_KEY``); a missing directory elsewhere is an error, never made.
    Concurrent first calls converge on one key. The private bytes are never logged.
    """
    path = plane_key_path(db_url)
    if not os.path.lexists(path):
        parent = path.parent
        if parent == _config_dir():
            parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        elif not parent.is_dir():
            raise SigningError(f"cannot create plane key {path}: no directory {parent}")
        # FileExistsError: another process won the race; its key is the one to use.
        with contextlib.suppress(FileExistsError):
            _create_exclusive(path, _private_pem(Ed25519PrivateKey.generate()), 0o600)
    return load_private_key(path)


# -------------------------------------------------------------------------------- tokens


_Id = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
_Time = Annotated[str, msgspec.Meta(pattern=_RFC3339_UTC)]


class TokenClaims(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """What a token asserts. Times are RFC 3339 UTC (``...Z``)."""

    token_id: _Id
    plan_id: _Id
    attempt: Annotated[int, msgspec.Meta(ge=1, le=2**53 - 1)]
    results_digest: _Id
    issued_at: _Time
    expires_at: _Time


def mint_token(plane_key: Ed25519PrivateKey, *, token_id: str, plan_id: str, attempt: int,
               results_digest: str, issued_at: str | datetime,
               expires_at: str | datetime) -> str:
    """A signed apply token. Mint it only from a pass over real results (INV1), and
    record ``TokenMinted`` with the same claims (``read_token`` gives them back)."""
    raw = {
        "token_id": token_id,
        "plan_id": plan_id,
        "attempt": attempt,
        "results_digest": results_digest,
        "issued_at": _as_rfc3339(issued_at),
        "expires_at": _as_rfc3339(expires_at),
    }
    try:
        claims = msgspec.convert(raw, TokenClaims, strict=True)
    except msgspec.ValidationError as exc:
        raise SigningError(f"cannot mint token: {exc}") from None
    _check_window(claims, "cannot mint token")
    record = msgspec.to_builtins(claims)
    payload = canonical_json(record)  # the bytes sign_record signs, carried verbatim
    signature = base64.b64decode(sign_record(plane_key, record, domain="token"))
    return f"{TOKEN_PREFIX}.{_b64url(payload)}.{_b64url(signature)}"


def read_token(text: str) -> TokenClaims:
    """The claims of a well-formed token, WITHOUT checking its signature."""
    return _parse_token(text)[0]


def verify_token(plane_public_key: Ed25519PublicKey, text: str, *, plan_id: str,
                 now: datetime, attempt: int | None = None,
                 results_digest: str | None = None) -> TokenClaims:
    """The claims of a token this plane minted for ``plan_id`` that is valid at ``now``.

    Raises ``TokenRefused`` (a ``SigningError``) with a one-line reason. ``attempt`` and
    ``results_digest``, when given, must match too. Single use is the caller's check
    (no ``TokenConsumed`` for ``claims.token_id`` in the log).
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be a timezone-aware datetime")
    claims, payload, signature = _parse_token(text)
    if not _verify_raw(plane_public_key, signature, _message("token", payload)):
        _refuse("signature", "bad signature (forged or altered, or minted by another "
                "ledger's plane key)")
    if claims.plan_id != plan_id:
        _refuse("plan", f"minted for plan {claims.plan_id!r}, not for plan {plan_id!r}")
    if attempt is not None and claims.attempt != attempt:
        _refuse("attempt", f"minted for attempt {claims.attempt}, but the plan is at "
                f"attempt {attempt}")
    if results_digest is not None and claims.results_digest != results_digest:
        _refuse("results_digest", f"minted for results {claims.results_digest}, not "
                f"{results_digest}")
    at = now.astimezone(UTC)
    if at < _parse_time(claims.issued_at):
        _refuse("not_yet_valid", f"not valid before {claims.issued_at} "
                f"(now {_as_rfc3339(at)})")
    if at >= _parse_time(claims.expires_at):
        _refuse("expired", f"expired at {claims.expires_at} (now {_as_rfc3339(at)})")
    return claims


def token_signature(text: str) -> str:
    """The token's signature (standard base64), as ``TokenMinted`` records it: with the
    claims, what ``verify_record(..., domain="token")`` checks."""
    return base64.b64encode(_parse_token(text)[2]).decode("ascii")


def token_digest(text: str) -> str:
    """SHA-256 hex of the token string: what events record instead of the token."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ------------------------------------------------------------------------------ helpers


def _refuse(reason: str, message: str) -> NoReturn:
    raise TokenRefused(reason, message)


def _check_domain(domain: str) -> None:
    if domain not in DOMAINS:
        raise ValueError(f"unknown signing domain {domain!r}: use one of {DOMAINS}")


def _message(domain: str, payload: bytes) -> bytes:
    _check_domain(domain)
    return _MESSAGE_PREFIX + domain.encode("ascii") + b"\n" + payload


def _verify_raw(key: Ed25519PublicKey, signature: bytes, message: bytes) -> bool:
    try:
        key.verify(signature, message)
    except InvalidSignature:
        return False
    return True


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _b64url_decode(text: str, what: str) -> bytes:
    if not text or not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        raise TokenRefused("format", f"malformed token: {what} is not base64url")
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64url(raw) != text:
        raise TokenRefused("format", f"malformed token: {what} is not canonical base64url")
    return raw


def _parse_token(text: str) -> tuple[TokenClaims, bytes, bytes]:
    if not isinstance(text, str):
        raise TokenRefused("format", "malformed token: not a string")
    if len(text) > _MAX_TOKEN_LEN:
        raise TokenRefused("format", f"malformed token: longer than {_MAX_TOKEN_LEN} chars")
    parts = text.split(".")
    if len(parts) != 3:
        raise TokenRefused(
            "format", f"malformed token: expected {TOKEN_PREFIX}.<claims>.<signature>"
        )
    prefix, claims_part, signature_part = parts
    if prefix != TOKEN_PREFIX:
        raise TokenRefused(
            "format", f"malformed token: unknown prefix {prefix[:16]!r} (expected "
            f"{TOKEN_PREFIX!r})"
        )
    payload = _b64url_decode(claims_part, "claims")
    signature = _b64url_decode(signature_part, "signature")
    if len(signature) != _SIGNATURE_LEN:
        raise TokenRefused(
            "format", f"malformed token: signature is {len(signature)} bytes, not "
            f"{_SIGNATURE_LEN}"
        )
    try:
        claims = msgspec.json.decode(payload, type=TokenClaims, strict=True)
    except msgspec.ValidationError as exc:
        raise TokenRefused("format", f"malformed token claims: {exc}") from None
    except msgspec.DecodeError:
        raise TokenRefused("format", "malformed token: claims are not JSON") from None
    # The signature covers the canonical bytes; requiring them here means one set of
    # claims has exactly one token payload (no duplicate keys, no reordering).
    if canonical_json(msgspec.to_builtins(claims)) != payload:
        raise TokenRefused("format", "malformed token: claims are not canonical JSON")
    try:
        _check_window(claims, "malformed token claims")
    except SigningError as exc:
        raise TokenRefused("format", str(exc)) from None
    return claims, payload, signature


def _check_window(claims: TokenClaims, context: str) -> None:
    try:
        issued, expires = _parse_time(claims.issued_at), _parse_time(claims.expires_at)
    except ValueError as exc:
        raise SigningError(f"{context}: {exc}") from None
    if expires <= issued:
        raise SigningError(f"{context}: expires_at is not after issued_at")


def _parse_time(text: str) -> datetime:
    # The pattern already enforced "...Z"; fromisoformat rejects impossible dates.
    if not re.fullmatch(_RFC3339_UTC, text):
        raise ValueError(f"{text!r} is not an RFC 3339 UTC time (YYYY-MM-DDThh:mm:ss[.f]Z)")
    return datetime.fromisoformat(text[:-1] + "+00:00")


def _as_rfc3339(value: str | datetime) -> str:
    if isinstance(value, str):
        return value
    if value.tzinfo is None or value.utcoffset() is None:
        raise SigningError("token times must be timezone-aware datetimes or RFC 3339 strings")
    # Same form as the store's recorded_at: microseconds, "Z".
    return rfc3339(value)


def _raw_public(key: Ed25519PublicKey | Ed25519PrivateKey) -> bytes:
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _public_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _key_kind(key: object) -> str:
    return type(key).__name__.removeprefix("_").replace("PrivateKey", "").replace(
        "PublicKey", ""
    ) or "non-Ed25519"


def url_identity(db_url: str) -> str:
    """The URL without its password (so ``***`` from a rendered URL maps to the same
    key) and with the driver the store would use."""
    driver, _, rest = db_url.partition("://")
    if driver in ("postgres", "postgresql"):
        driver = "postgresql+psycopg"  # the store's normalisation
    netloc, slash, tail = rest.partition("/")
    userinfo, at, host = netloc.rpartition("@")
    if at:
        netloc = userinfo.split(":", 1)[0] + "@" + host
    return f"{driver}://{netloc}{slash}{tail}"


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


def _create_exclusive(path: Path, data: bytes, mode: int) -> None:
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
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
