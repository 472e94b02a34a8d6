"""The plane's signatures: approvers' decisions, the plane key and apply tokens.

No database access here. Key files themselves (generate, load, encode) are
``ledger.keys``; this module says what the plane signs and how it checks it.

Message format (any third party can recompute it; docs/events.md "Signed messages"
has it byte for byte). A signature over an event that stands in the log (policy, a key's
endorsement, the ledger's identification) binds where it stands:

    b"evidence-ledger/v2/" + domain + b"/" + type + b"\\n"
        + canonical_json({"ledger": L, "record": record, "stream": S, "type": T, "version": V})

(the ledger's id, the stream, the event's version in it and its type: a copy anywhere
else does not verify there). Other signatures, and events signed by the first release,
cover

    b"evidence-ledger/v1/" + domain + b"\\n" + canonical_json(record)

where ``domain`` is ``decision`` (a human decision, signed with an approver key the agent
process never holds), ``token`` (an apply token, signed with the plane key), ``review``
(the plane key's word that it ran a hosted review: its report and the chain of the
review's events), ``approver`` / ``operator`` (the plane key's endorsement of an
approver's or an operator's key: only whoever holds the plane key can make a key
either), or ``policy`` (an operator's signature over a policy event: a registration, an
attachment, a skill, an approver key, a setting that weakens a gate), or ``ledger`` (the
plane key's identification of its ledger). The domain prefix means a
signature made for one use can never verify for another, even if the same key were
(wrongly) used for both.

Tokens (minted only from real, passing results: audit's ``token_from_passing_run``) are
compact strings ``evt1.<base64url(claims)>.<base64url(signature)>``: the claims bind the token to a
plan, an attempt and the digest of the real results the pass was computed from, and
carry an expiry. ``verify_token`` checks the signature, the plan and the validity
window. **Single use is not checked here**: the caller must refuse a token whose
``token_id`` already has a ``TokenConsumed`` event in the plan's stream, and must
compare ``attempt`` / ``results_digest`` with the ``TokenMinted`` event (or pass them to
``verify_token``). Events record ``token_digest(token)``, never the token.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, NoReturn, get_args

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from ledger.canonical import CanonicalizationError, canonical_json, strict_b64decode
from ledger.events import ApproverKeyAdded, SignedPlace
from ledger.keys import (
    SigningError,
    create_key_file,
    generate_key_pair,
    load_private_key,
    load_public_key,
    private_pem,
    public_pem,
)
from ledger.store import url_identity
from ledger.timestamps import rfc3339

__all__ = [
    "DECISION_CHOICES",
    "DOMAINS",
    "OPERATOR_KEY_ENV",
    "OPERATOR_NAME_ENV",
    "PLANE_KEY_ENV",
    "TOKEN_PREFIX",
    "Domain",
    "Place",
    "SigningError",
    "TokenClaims",
    "TokenRefused",
    "approver_record",
    "decision_record",
    "endorse_key",
    "expiry_record",
    "identity_record",
    "key_registration",
    "load_or_create_operator_key",
    "load_or_create_plane_key",
    "load_plane_public_key",
    "mint_token",
    "operator_key_path",
    "operator_name",
    "plane_key_path",
    "policy_record",
    "read_token",
    "review_record",
    "sign_record",
    "token_digest",
    "token_signature",
    "verify_record",
    "verify_token",
]

# What a signature is for, bound into what it signs: ``request``, an operator's or an
# approver's request to the service (``commands.service.operator``); ``expiry``, the
# plane's denial of an escalation whose time ran out (``EscalationExpired``).
Domain = Literal[
    "decision", "token", "approver", "operator", "policy", "review", "ledger", "request", "expiry"
]
DOMAINS: tuple[str, ...] = get_args(Domain)
DECISION_CHOICES: tuple[str, ...] = ("revise", "abandon")  # DecisionRecorded.choice
PLANE_KEY_ENV = "EVIDENCE_PLANE_KEY"
OPERATOR_KEY_ENV = "EVIDENCE_OPERATOR_KEY"
OPERATOR_NAME_ENV = "EVIDENCE_OPERATOR"
DEFAULT_OPERATOR = "operator"
TOKEN_PREFIX = "evt1"

_MESSAGE_PREFIX = b"evidence-ledger/v1/"
_BOUND_PREFIX = b"evidence-ledger/v2/"
_SIGNATURE_LEN = 64
_MAX_TOKEN_LEN = 4096
# ASCII digits only ("\d" would admit other scripts' digits); "\Z", unlike "$", does not
# match before a trailing newline.
_RFC3339_UTC = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z\Z"
_B64URL = re.compile(r"[A-Za-z0-9_-]*")


class TokenRefused(SigningError):
    """A token did not verify. ``reason`` is one of: ``format``, ``signature``, ``plan``,
    ``attempt``, ``results_digest``, ``expired``, ``not_yet_valid``."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


# ------------------------------------------------------------------------ signed records


class Place(NamedTuple):
    """Where a signed event stands (what a bound signature covers besides its record):
    the ledger's id, the stream, the event's version in it and its type."""

    ledger: str
    stream: str
    version: int
    type: str

    @classmethod
    def signed(cls, signed: SignedPlace, type_name: str) -> Place:
        return cls(signed.ledger, signed.stream, signed.version, type_name)

    def stated(self) -> SignedPlace:
        """The place as an event states it (its type is the event's own)."""
        return SignedPlace(ledger=self.ledger, stream=self.stream, version=self.version)


def sign_record(
    private_key: Ed25519PrivateKey,
    record: dict[str, Any],
    *,
    domain: Domain,
    place: Place | None = None,
) -> str:
    """Base64 Ed25519 signature over the domain-separated canonical record, bound to
    ``place`` when given (every event the plane signs now is)."""
    try:
        message = _record_message(domain, record, place)
    except CanonicalizationError as exc:
        raise SigningError(f"record has no canonical JSON form: {exc}") from None
    return base64.b64encode(private_key.sign(message)).decode("ascii")


def verify_record(
    public_key: Ed25519PublicKey,
    record: dict[str, Any],
    signature_b64: str,
    *,
    domain: Domain,
    place: Place | None = None,
) -> bool:
    """True only if ``signature_b64`` signs ``record`` for ``domain`` (and ``place``,
    when given: the bound format; without it, the first release's) with this key.

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
        message = _record_message(domain, record, place)
    except CanonicalizationError:
        return False
    return _verify_raw(public_key, signature, message)


def identity_record(ledger_id: str, position: int) -> dict[str, Any]:
    """What the plane key signs (domain ``ledger``, bound to the event's place) to name
    its ledger: the id and the identification's position in the log."""
    return {"ledger_id": ledger_id, "position": position}


def decision_record(
    decision_id: str,
    plan_id: str,
    choice: str,
    guidance: str | None,
    escalation_hash: str,
    signed_at: str,
    reason: str | None = None,
) -> dict[str, Any]:
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
    for name, value in (
        ("decision_id", decision_id),
        ("plan_id", plan_id),
        ("escalation_hash", escalation_hash),
        ("signed_at", signed_at),
    ):
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


def expiry_record(
    decision_id: str, plan_id: str, escalation_hash: str, expired_at: str
) -> dict[str, Any]:
    """The record the plane key signs (domain ``expiry``) to deny a plan whose escalation
    nobody decided in time: the escalation (its leaf hash pins one) and the time."""
    return {
        "decision_id": decision_id,
        "plan_id": plan_id,
        "escalation_hash": escalation_hash,
        "expired_at": expired_at,
    }


def approver_record(name: str, public_key: str, fingerprint: str) -> dict[str, Any]:
    """The record the plane key signs (domain ``approver``) to endorse an approver key;
    an operator key's endorsement signs the same record under domain ``operator``."""
    return {"name": name, "public_key": public_key, "fingerprint": fingerprint}


def endorse_key(
    plane_key: Ed25519PrivateKey, added: ApproverKeyAdded, place: Place
) -> ApproverKeyAdded:
    """A person's key registration, endorsed by the plane key (domain ``approver`` or
    ``operator``, by its role) for the place it will stand at."""
    return msgspec.structs.replace(
        added,
        place=place.stated(),
        endorsement=sign_record(
            plane_key,
            approver_record(added.name, added.public_key, added.fingerprint),
            domain="operator" if added.role == "operator" else "approver",
            place=place,
        ),
    )


def key_registration(
    name: str, public: str, print_: str, role: Literal["approver", "operator"]
) -> ApproverKeyAdded:
    """A key's registration before the plane key endorses it (``endorse_key``, where it
    is appended: the endorsement binds its place)."""
    return ApproverKeyAdded(
        name=name, public_key=public, fingerprint=print_, endorsement="", role=role
    )


def review_record(
    task_id: str, report_sha256: str, earlier: Sequence[msgspec.Struct]
) -> dict[str, Any]:
    """What the plane key signs (domain ``review``) when it commits a review's report:
    the task, the report's digest and the chain of every earlier payload of the review's
    stream (SHA-256 of their canonical JSON, in order)."""
    chain = hashlib.sha256(canonical_json([msgspec.to_builtins(p) for p in earlier])).hexdigest()
    return {"task_id": task_id, "report_sha256": report_sha256, "chain": chain}


def policy_record(payload: msgspec.Struct) -> dict[str, Any]:
    """What an operator signs (domain ``policy``): the event's payload as JSON — its
    ``type`` included — without the ``signed`` field that carries the signature."""
    record = msgspec.to_builtins(payload)
    record.pop("signed", None)
    return dict(record)


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


SINGLE_USER_DOC = 'docs/service.md, "What the single-user developer mode does not protect"'


def single_user_layout(db_url: str) -> Path | None:
    """The plane key's path when the ledger is in the developer's single-user layout,
    else None: the key is where ``evidence init`` puts it unless told otherwise (beside
    the SQLite file, or in ``~/.config/evidence-ledger/``: ``$EVIDENCE_PLANE_KEY`` is not
    set) and belongs to the user running this process. Whatever else runs as that user
    — an agent started by the same developer — reads the keys and signs as the plane and
    the operator; a deployment names its key's place (docs/service.md)."""
    if os.environ.get(PLANE_KEY_ENV):
        return None
    try:
        path = plane_key_path(db_url)
        owner = os.stat(path).st_uid
    except (OSError, SigningError):
        return None
    return path if owner == os.geteuid() else None


def operator_key_path(db_url: str) -> Path:
    """Where this process's operator key for the ledger at ``db_url`` lives: the file
    ``$EVIDENCE_OPERATOR_KEY`` names, else beside the plane key (``plane_key_path``):
    ``evidence.db.plane-key`` -> ``evidence.db.operator-key``, ``plane-<digest>.key`` ->
    ``operator-<digest>.key``, any other ``NAME`` -> ``NAME.operator-key``."""
    override = os.environ.get(OPERATOR_KEY_ENV)
    if override:
        return Path(override).expanduser()
    plane = plane_key_path(db_url)
    if plane.name.endswith(".plane-key"):
        return plane.with_name(plane.name[: -len(".plane-key")] + ".operator-key")
    if plane.name.startswith("plane-") and plane.parent == _config_dir():
        return plane.with_name("operator-" + plane.name[len("plane-") :])
    return plane.with_name(plane.name + ".operator-key")


def operator_name() -> str:
    """The operator this process signs policy as (``$EVIDENCE_OPERATOR``, else
    ``operator``)."""
    return os.environ.get(OPERATOR_NAME_ENV) or DEFAULT_OPERATOR


def load_or_create_operator_key(db_url: str, *, create: bool = True) -> Ed25519PrivateKey | None:
    """This process's operator key (``operator_key_path``); made (0600, its public half
    in FILE.pub for `evidence keys add NAME FILE.pub --role operator`) when ``create``
    and missing — the single-user bootstrap — else None when missing."""
    path = operator_key_path(db_url)
    if not os.path.lexists(path):
        if not create:
            return None
        _make_key_file(path, "operator key", generate_key_pair, SigningError)
    return load_private_key(path)


def load_or_create_plane_key(db_url: str) -> Ed25519PrivateKey:
    """The plane key for ``db_url`` (at ``plane_key_path``), created on first use.

    Created with mode 0600 from the first byte, in the default config directory (made
    0700) or in an existing directory (next to the SQLite file, or the directory of
    ``$EVIDENCE_PLANE_KEY``); a missing directory elsewhere is an error, never made.
    Concurrent first calls converge on one key. The private bytes are never logged.
    """
    path = plane_key_path(db_url)
    if not os.path.lexists(path):
        _make_key_file(path, "plane key", _new_plane_key, FileExistsError)
    return load_private_key(path)


def _new_plane_key(path: Path) -> None:
    """A new plane key at ``path``, and its public half at ``path.pub`` (0644: what
    verifiers elsewhere are given)."""
    key = Ed25519PrivateKey.generate()
    create_key_file(path, private_pem(key), 0o600)
    public = path.with_name(path.name + ".pub")
    with contextlib.suppress(FileExistsError):
        create_key_file(public, public_pem(key.public_key()), 0o644)


def load_plane_public_key(db_url: str) -> Ed25519PublicKey:
    """The plane key's public half, to verify with: from the plane key when this process
    holds it, else from its public half beside it (``PATH.pub``). Never made here: a
    process that only verifies (an operator's, an auditor's) must not mint a plane key
    of its own, under which every endorsement of the real one would read as forged."""
    path = plane_key_path(db_url)
    if os.path.lexists(path):
        return load_private_key(path).public_key()
    public = path.with_name(path.name + ".pub")
    if os.path.lexists(public):
        return load_public_key(public)
    raise SigningError(
        f"no plane key at {path}, nor its public half at {public}: checking the ledger's "
        "signatures needs the plane's public key (copy the service's plane key's .pub "
        "there); only a command that signs as the plane makes a plane key"
    )


def _make_key_file(
    path: Path, what: str, make: Callable[[Path], object], exists: type[Exception]
) -> None:
    """Make a key file in the config directory (made 0700) or in a directory that
    exists; ``exists``: how ``make`` says another process won the race (its key is the
    one to use)."""
    parent = path.parent
    if parent == _config_dir():
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    elif not parent.is_dir():
        raise SigningError(f"cannot create {what} {path}: no directory {parent}")
    with contextlib.suppress(exists):
        make(path)


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
    # The blob of the trees the run judged (``validation.run_started``): the token binds
    # the content Apply may write, not only a plan.
    trees_sha256: _Id | msgspec.UnsetType = msgspec.UNSET


def mint_token(
    plane_key: Ed25519PrivateKey,
    *,
    token_id: str,
    plan_id: str,
    attempt: int,
    results_digest: str,
    issued_at: str | datetime,
    expires_at: str | datetime,
    trees_sha256: str | None = None,
) -> str:
    """A signed apply token. Mint it only from a pass over real results
    (``token_from_passing_run``), and record ``TokenMinted`` with the same claims
    (``read_token`` gives them back)."""
    raw = {
        "token_id": token_id,
        "plan_id": plan_id,
        "attempt": attempt,
        "results_digest": results_digest,
        "issued_at": _as_rfc3339(issued_at),
        "expires_at": _as_rfc3339(expires_at),
    }
    if trees_sha256 is not None:
        raw["trees_sha256"] = trees_sha256
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


def verify_token(
    plane_public_key: Ed25519PublicKey,
    text: str,
    *,
    plan_id: str,
    now: datetime,
    attempt: int | None = None,
    results_digest: str | None = None,
) -> TokenClaims:
    """The claims of a token this plane minted for ``plan_id`` that is valid at ``now``.

    Raises ``TokenRefused`` (a ``SigningError``) with a one-line reason. ``attempt`` and
    ``results_digest``, when given, must match too. Single use is the caller's check
    (no ``TokenConsumed`` for ``claims.token_id`` in the log).
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be a timezone-aware datetime")
    claims, payload, signature = _parse_token(text)
    if not _verify_raw(plane_public_key, signature, _message("token", payload)):
        _refuse(
            "signature",
            "bad signature (forged or altered, or minted by another ledger's plane key)",
        )
    if claims.plan_id != plan_id:
        _refuse("plan", f"minted for plan {claims.plan_id!r}, not for plan {plan_id!r}")
    if attempt is not None and claims.attempt != attempt:
        _refuse(
            "attempt", f"minted for attempt {claims.attempt}, but the plan is at attempt {attempt}"
        )
    if results_digest is not None and claims.results_digest != results_digest:
        _refuse(
            "results_digest", f"minted for results {claims.results_digest}, not {results_digest}"
        )
    at = now.astimezone(UTC)
    if at < _parse_time(claims.issued_at):
        _refuse("not_yet_valid", f"not valid before {claims.issued_at} (now {_as_rfc3339(at)})")
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


def _record_message(domain: str, record: dict[str, Any], place: Place | None) -> bytes:
    """The bytes a signature over ``record`` covers: bound to ``place`` when given."""
    if place is None:
        return _message(domain, canonical_json(record))
    _check_domain(domain)
    ledger, stream, version, type_name = place
    if not isinstance(version, int) or isinstance(version, bool):
        raise CanonicalizationError("a place's version is an integer")
    bound = {
        "ledger": ledger,
        "record": record,
        "stream": stream,
        "type": type_name,
        "version": version,
    }
    return (
        _BOUND_PREFIX
        + domain.encode("ascii")
        + b"/"
        + type_name.encode("utf-8")
        + b"\n"
        + canonical_json(bound)
    )


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
            "format", f"malformed token: unknown prefix {prefix[:16]!r} (expected {TOKEN_PREFIX!r})"
        )
    payload = _b64url_decode(claims_part, "claims")
    signature = _b64url_decode(signature_part, "signature")
    if len(signature) != _SIGNATURE_LEN:
        raise TokenRefused(
            "format", f"malformed token: signature is {len(signature)} bytes, not {_SIGNATURE_LEN}"
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
