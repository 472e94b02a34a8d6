"""Signing core: key files, domain-separated signed records, the plane key and apply
tokens. No database: everything here is files and bytes."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import typing
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from commands.rules.signing import (
    DECISION_CHOICES,
    PLANE_KEY_ENV,
    SigningError,
    TokenClaims,
    TokenRefused,
    decision_record,
    load_or_create_plane_key,
    mint_token,
    plane_key_path,
    read_token,
    sign_record,
    token_digest,
    verify_record,
    verify_token,
)
from commands.rules.trust import ApproverKey, decision_problem
from ledger.canonical import canonical_json
from ledger.errors import LedgerError
from ledger.events import DecisionRecorded
from ledger.keys import (
    fingerprint,
    generate_key_pair,
    load_private_key,
    load_public_key,
    public_key_b64,
    public_key_from_b64,
)
from tests.helpers import run_cli

POSIX = os.name == "posix"
posix_only = pytest.mark.skipif(not POSIX, reason="file modes are POSIX")

# RFC 8032 section 7.1, TEST 1.
RFC_SK = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
RFC_PK = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
RFC_SIG = bytes.fromhex(
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701"
    "cf9b46bd25bf5f0595bbe24655141438e7a100b"
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ISSUED = "2026-01-01T00:00:00Z"
EXPIRES = "2026-01-01T00:15:00Z"
DIGEST = "cd" * 32


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _decision(**kw: object) -> dict[str, object]:
    args: dict[str, object] = {
        "decision_id": "D-1",
        "plan_id": "P-1",
        "choice": "revise",
        "guidance": "use the cache",
        "escalation_hash": "ab" * 32,
        "signed_at": "2026-01-02T03:04:05.000000Z",
    }
    args.update(kw)
    return decision_record(**args)  # type: ignore[arg-type]


def _mint(key: Ed25519PrivateKey, **kw: object) -> str:
    args: dict[str, object] = {
        "token_id": "T-1",
        "plan_id": "P-1",
        "attempt": 1,
        "results_digest": DIGEST,
        "issued_at": ISSUED,
        "expires_at": EXPIRES,
    }
    args.update(kw)
    return mint_token(key, **args)  # type: ignore[arg-type]


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@pytest.fixture
def approver() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def plane() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No test may touch the real ~/.config or inherit a plane-key override."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("USERPROFILE", str(home))
    monkeypatch.delenv(PLANE_KEY_ENV, raising=False)
    yield


# ------------------------------------------------------------------- the library itself


def test_rfc8032_vector_1() -> None:
    key = Ed25519PrivateKey.from_private_bytes(RFC_SK)
    raw_pub = key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    assert raw_pub == RFC_PK
    assert key.sign(b"") == RFC_SIG  # Ed25519 is deterministic
    Ed25519PublicKey.from_public_bytes(RFC_PK).verify(RFC_SIG, b"")
    assert public_key_b64(key) == base64.b64encode(RFC_PK).decode()
    assert fingerprint(key.public_key()) == hashlib.sha256(RFC_PK).hexdigest()
    assert (
        public_key_from_b64(public_key_b64(key)).public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        == RFC_PK
    )


def test_message_format_is_recomputable_by_a_third_party() -> None:
    """The signed bytes are exactly prefix + domain + LF + RFC 8785 JSON, pinned by a
    golden signature (Ed25519 is deterministic), so the format cannot drift silently."""
    key = Ed25519PrivateKey.from_private_bytes(RFC_SK)
    record = _decision()
    signature = sign_record(key, record, domain="decision")
    assert signature == (
        "0k6VrvecbBDMaIGPmEu4FDIWCj1wVxPzQ6e8EGC8MVWSOi7jB6Cxs1is1LBuTCG4D+h+GuXUjuyQIf4SUF15AQ=="
    )
    message = (
        b"evidence-ledger/v1/decision\n"
        + json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    )
    Ed25519PublicKey.from_public_bytes(RFC_PK).verify(base64.b64decode(signature), message)


# ------------------------------------------------------------------------------ key files


def test_generate_load_round_trip(tmp_path: Path) -> None:
    pair = generate_key_pair(tmp_path / "alice.key")
    assert pair.private_path == tmp_path / "alice.key"
    assert pair.public_path == tmp_path / "alice.key.pub"
    assert pair.private_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert pair.public_path.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    loaded = load_private_key(pair.private_path)
    assert fingerprint(loaded) == pair.fingerprint == fingerprint(pair.public_key)
    assert fingerprint(load_public_key(pair.public_path)) == pair.fingerprint
    assert len(pair.fingerprint) == 64 and len(base64.b64decode(pair.public_key_b64)) == 32
    assert "PRIVATE" not in repr(pair) and "private_key" not in repr(pair)
    # Raw base64 (as ApproverKeyAdded records it) loads too, with or without a newline.
    raw = tmp_path / "alice.b64"
    raw.write_text(pair.public_key_b64 + "\n")
    assert fingerprint(load_public_key(raw)) == pair.fingerprint
    # Keys sign and verify across the round trip.
    sig = sign_record(loaded, {"a": 1}, domain="decision")
    assert verify_record(load_public_key(pair.public_path), {"a": 1}, sig, domain="decision")


@posix_only
def test_key_file_modes_ignore_umask(tmp_path: Path) -> None:
    old = os.umask(0)  # the most permissive umask: modes must still be exact
    try:
        pair = generate_key_pair(tmp_path / "k")
    finally:
        os.umask(old)
    assert _mode(pair.private_path) == 0o600
    assert _mode(pair.public_path) == 0o644
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary file left behind


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    pair = generate_key_pair(tmp_path / "k")
    before = pair.private_path.read_bytes()
    with pytest.raises(SigningError, match="refusing to overwrite"):
        generate_key_pair(tmp_path / "k")
    assert pair.private_path.read_bytes() == before
    # A stray .pub alone also blocks it, and nothing is written.
    (tmp_path / "j.pub").write_text("stale")
    with pytest.raises(SigningError, match=r"refusing to overwrite .*j\.pub"):
        generate_key_pair(tmp_path / "j")
    assert not (tmp_path / "j").exists()


@posix_only
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_refuses_private_key_readable_by_others(tmp_path: Path, mode: int) -> None:
    pair = generate_key_pair(tmp_path / "k")
    pair.private_path.chmod(mode)
    with pytest.raises(SigningError, match=r"chmod 600"):
        load_private_key(pair.private_path)
    pair.private_path.chmod(0o400)  # read-only for the owner is fine
    load_private_key(pair.private_path)


def test_load_private_key_errors(tmp_path: Path) -> None:
    with pytest.raises(SigningError, match="no key file"):
        load_private_key(tmp_path / "missing")
    with pytest.raises(SigningError, match="directory"):
        load_private_key(tmp_path)

    def private_file(name: str, data: bytes) -> Path:
        path = tmp_path / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    with pytest.raises(SigningError, match="not a PEM private key"):
        load_private_key(private_file("junk", b"hello"))
    pair = generate_key_pair(tmp_path / "k")
    with pytest.raises(SigningError, match="is a public key"):
        load_private_key(private_file("pub", pair.public_path.read_bytes()))
    ec_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with pytest.raises(SigningError, match="not an Ed25519 key"):
        load_private_key(private_file("ec", ec_pem))
    encrypted = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pw"),
    )
    with pytest.raises(SigningError, match="encrypted"):
        load_private_key(private_file("enc", encrypted))
    assert issubclass(SigningError, LedgerError)  # the CLI's exit-2 refusal path


def test_load_public_key_errors(tmp_path: Path) -> None:
    pair = generate_key_pair(tmp_path / "k")
    with pytest.raises(SigningError, match="is a private key"):
        load_public_key(pair.private_path)
    bad = tmp_path / "bad"
    for text, fragment in [
        ("not base64!", "not valid base64"),
        (base64.b64encode(b"x" * 31).decode(), "31 bytes"),
    ]:
        bad.write_text(text)
        with pytest.raises(SigningError, match=fragment):
            load_public_key(bad)
    ec_pub = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    bad.write_bytes(ec_pub)
    with pytest.raises(SigningError, match="not an Ed25519 key"):
        load_public_key(bad)
    with pytest.raises(SigningError, match="no key file"):
        load_public_key(tmp_path / "missing.pub")


def test_public_key_from_b64_is_strict() -> None:
    good = base64.b64encode(RFC_PK).decode()
    public_key_from_b64(good)
    for text in [good.rstrip("="), good + "\n", " " + good, good.replace("/", "_")]:
        with pytest.raises(SigningError):
            public_key_from_b64(text)


# ------------------------------------------------------------------------ signed records


def test_sign_verify(approver: Ed25519PrivateKey) -> None:
    record = _decision()
    signature = sign_record(approver, record, domain="decision")
    assert len(base64.b64decode(signature)) == 64
    assert verify_record(approver.public_key(), record, signature, domain="decision")
    # Key order is irrelevant: the canonical form is what is signed.
    assert verify_record(
        approver.public_key(), dict(reversed(record.items())), signature, domain="decision"
    )


def test_forged_signature_fails(approver: Ed25519PrivateKey) -> None:
    record = _decision()
    raw = bytearray(base64.b64decode(sign_record(approver, record, domain="decision")))
    for index in (0, 31, 32, 63):
        forged = bytearray(raw)
        forged[index] ^= 0x01
        assert not verify_record(
            approver.public_key(), record, base64.b64encode(forged).decode(), domain="decision"
        )


def test_different_key_modified_record_wrong_domain_fail(approver: Ed25519PrivateKey) -> None:
    record = _decision()
    signature = sign_record(approver, record, domain="decision")
    other = Ed25519PrivateKey.generate().public_key()
    assert not verify_record(other, record, signature, domain="decision")
    for change in [
        {"choice": "abandon"},
        {"guidance": None},
        {"plan_id": "P-2"},
        {"escalation_hash": "ac" * 32},
        {"extra": 1},
    ]:
        assert not verify_record(
            approver.public_key(), {**record, **change}, signature, domain="decision"
        )
    assert not verify_record(approver.public_key(), record, signature, domain="token")
    token_sig = sign_record(approver, record, domain="token")
    assert not verify_record(approver.public_key(), record, token_sig, domain="decision")


@pytest.mark.parametrize(
    "signature",
    [
        "",
        "!!!",
        "AAAA",
        "not base64 at all",
        base64.b64encode(b"x" * 63).decode(),
        base64.b64encode(b"x" * 65).decode(),
        None,
        42,
    ],
)
def test_verify_never_raises_on_malformed_signature(
    approver: Ed25519PrivateKey, signature: object
) -> None:
    assert (
        verify_record(
            approver.public_key(),
            _decision(),
            signature,  # type: ignore[arg-type]
            domain="decision",
        )
        is False
    )


def test_only_canonical_base64_verifies(approver: Ed25519PrivateKey) -> None:
    """Unused padding bits give a second spelling of the same bytes: refused, so one
    signature has exactly one textual form."""
    record = _decision()
    signature = sign_record(approver, record, domain="decision")
    assert signature.endswith("==")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = alphabet.index(signature[-3])
    respelled = signature[:-3] + alphabet[last ^ 0x01] + "=="
    assert base64.b64decode(respelled) == base64.b64decode(signature)
    assert not verify_record(approver.public_key(), record, respelled, domain="decision")


def test_verify_false_for_record_without_canonical_form(approver: Ed25519PrivateKey) -> None:
    signature = sign_record(approver, {"a": 1}, domain="decision")
    assert not verify_record(
        approver.public_key(), {"a": float("nan")}, signature, domain="decision"
    )
    with pytest.raises(SigningError, match="canonical"):
        sign_record(approver, {"a": float("nan")}, domain="decision")


def test_unknown_domain_is_a_programming_error(approver: Ed25519PrivateKey) -> None:
    with pytest.raises(ValueError, match="domain"):
        sign_record(approver, {}, domain="apply")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="domain"):
        verify_record(approver.public_key(), {}, "", domain="")  # type: ignore[arg-type]


def test_plane_key_cannot_authorize_a_decision(tmp_path: Path, approver: Ed25519PrivateKey) -> None:
    """The agent side holds the plane key, not the approver's: a decision it signs, in
    either domain, is refused where the plane checks decisions (``decision_problem``,
    against the approver's registered key), where the approver's own signature of the
    very same record is accepted."""
    plane_key = load_or_create_plane_key(f"sqlite:///{tmp_path / 'evidence.db'}")
    record = _decision()
    registered = ApproverKey("alice", public_key_b64(approver), "active")
    leaf = bytes.fromhex(str(record["escalation_hash"]))

    def decided(signature: str) -> DecisionRecorded:
        return DecisionRecorded(
            **record,  # type: ignore[arg-type]
            approver="alice",
            key_fingerprint=fingerprint(approver),
            signature=signature,
        )

    signed = sign_record(approver, record, domain="decision")
    assert decision_problem(decided(signed), leaf, registered) is None
    for domain in ("decision", "token"):
        forged = sign_record(plane_key, record, domain=domain)  # type: ignore[arg-type]
        problem = decision_problem(decided(forged), leaf, registered)
        assert problem is not None and "signature verifies" in problem, problem
    # Nor does the plane key pass for the approver's key: a key registered under the
    # plane's public key is not the named approver's unless it was registered for her.
    as_plane = ApproverKey("alice", public_key_b64(plane_key), "active")
    assert decision_problem(decided(signed), leaf, as_plane) is not None
    # And a token signature of the plane never doubles as a decision signature.
    token = _mint(plane_key)
    claims = msgspec.to_builtins(read_token(token))
    token_sig = base64.b64encode(_unb64url(token.split(".")[2])).decode()
    assert verify_record(plane_key.public_key(), claims, token_sig, domain="token")
    assert not verify_record(plane_key.public_key(), claims, token_sig, domain="decision")


def test_decision_problem_checks_each_condition(approver: Ed25519PrivateKey) -> None:
    """Where the plane and audit check a decision: each condition alone refuses one that
    is otherwise perfectly signed by the approver's registered, active key."""
    record = _decision()
    leaf = bytes.fromhex(str(record["escalation_hash"]))
    alice = ApproverKey("alice", public_key_b64(approver), "active")

    def decided(
        *, escalation_hash: str | None = None, approver_name: str = "alice"
    ) -> DecisionRecorded:
        signed = _decision(escalation_hash=escalation_hash or record["escalation_hash"])
        return DecisionRecorded(
            **signed,  # type: ignore[arg-type]
            approver=approver_name,
            key_fingerprint=fingerprint(approver),
            signature=sign_record(approver, signed, domain="decision"),
        )

    assert decision_problem(decided(), leaf, alice) is None
    refused = [
        ("follows its escalation", decision_problem(decided(), None, alice)),
        # signed (validly) over another escalation's leaf hash
        ("leaf hash", decision_problem(decided(escalation_hash="cd" * 32), leaf, alice)),
        # alice's key, but the decision says bob decided
        ("registered key of 'bob'", decision_problem(decided(approver_name="bob"), leaf, alice)),
        ("registered key of 'alice'", decision_problem(decided(), leaf, None)),
        (
            "active at its position",
            decision_problem(decided(), leaf, ApproverKey("alice", alice.public_key, "revoked")),
        ),
    ]
    for fragment, problem in refused:
        assert problem is not None and fragment in problem, (fragment, problem)


def test_decision_record_shape() -> None:
    record = _decision(guidance=None)
    assert set(record) == {
        "decision_id",
        "plan_id",
        "choice",
        "guidance",
        "reason",
        "escalation_hash",
        "signed_at",
    }
    assert record["guidance"] is None and "guidance" in canonical_json(record).decode()
    # The reason is signed too: one changed after signing no longer verifies.
    key = Ed25519PrivateKey.generate()
    signed = sign_record(key, _decision(reason="staging only"), domain="decision")
    assert verify_record(
        key.public_key(), _decision(reason="staging only"), signed, domain="decision"
    )
    assert not verify_record(
        key.public_key(), _decision(reason="production"), signed, domain="decision"
    )
    with pytest.raises(SigningError, match="choice"):
        _decision(choice="override")  # INV3: there is no "authorise past a blocker"
    with pytest.raises(SigningError, match="escalation_hash"):
        _decision(escalation_hash="")


def test_decision_choices_match_the_event() -> None:
    hints = typing.get_type_hints(DecisionRecorded)
    assert set(typing.get_args(hints["choice"])) == set(DECISION_CHOICES)


# ---------------------------------------------------------------------------- plane key


def test_plane_key_path_sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "data" / "x.db"
    assert plane_key_path(f"sqlite:///{db}") == Path(f"{db}.plane-key")  # sqlite:////abs
    monkeypatch.chdir(tmp_path)
    expected = tmp_path / "x.db.plane-key"
    assert plane_key_path("sqlite:///x.db") == expected  # relative: absolute path
    assert plane_key_path("sqlite+pysqlite:///x.db?timeout=5") == expected
    # In-memory SQLite has no file to sit next to: the per-URL config location.
    memory = plane_key_path("sqlite://")
    assert memory.parent == Path.home() / ".config" / "evidence-ledger"
    with pytest.raises(SigningError, match="malformed SQLite URL"):
        plane_key_path("sqlite://host/x.db")
    with pytest.raises(SigningError, match="not a database URL"):
        plane_key_path("evidence.db")


def test_plane_key_path_postgres() -> None:
    path = plane_key_path("postgresql+psycopg://ledger:s3cret@db.example:5432/evidence")
    identity = "postgresql+psycopg://ledger@db.example:5432/evidence"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    assert path == Path.home() / ".config" / "evidence-ledger" / f"plane-{digest}.key"
    assert "s3cret" not in str(path)
    # The password, masked or not, and the driver alias the store normalises do not
    # change the key; another database does.
    for same in [
        "postgresql://ledger:other@db.example:5432/evidence",
        "postgresql+psycopg://ledger:***@db.example:5432/evidence",
        "postgresql+psycopg://ledger@db.example:5432/evidence",
    ]:
        assert plane_key_path(same) == path
    assert plane_key_path("postgresql+psycopg://ledger@db.example:5432/other") != path


def test_plane_key_path_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    override = tmp_path / "plane.pem"
    monkeypatch.setenv(PLANE_KEY_ENV, str(override))
    assert plane_key_path("sqlite:///x.db") == override
    assert plane_key_path("postgresql://u@h/db") == override
    # The variable wins: an existing key there is used as is ...
    pair = generate_key_pair(override)
    assert fingerprint(load_or_create_plane_key("sqlite:///x.db")) == pair.fingerprint
    assert not (tmp_path / "x.db.plane-key").exists()
    # ... and a missing one is created there (0600), but never a missing directory.
    fresh = tmp_path / "fresh.pem"
    monkeypatch.setenv(PLANE_KEY_ENV, str(fresh))
    key = load_or_create_plane_key("postgresql://u@h/db")
    assert fingerprint(load_private_key(fresh)) == fingerprint(key)
    if POSIX:
        assert _mode(fresh) == 0o600
    monkeypatch.setenv(PLANE_KEY_ENV, str(tmp_path / "no" / "such" / "dir.pem"))
    with pytest.raises(SigningError, match="no directory"):
        load_or_create_plane_key("sqlite:///x.db")


@posix_only
def test_load_or_create_plane_key_stable_and_private(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'evidence.db'}"
    old = os.umask(0)
    try:
        first = load_or_create_plane_key(url)
    finally:
        os.umask(old)
    path = plane_key_path(url)
    assert path == tmp_path / "evidence.db.plane-key"
    assert _mode(path) == 0o600
    assert fingerprint(load_or_create_plane_key(url)) == fingerprint(first)
    assert not list(tmp_path.glob(".*.tmp"))
    # A plane key others can read is refused, like any private key.
    path.chmod(0o644)
    with pytest.raises(SigningError, match="chmod 600"):
        load_or_create_plane_key(url)


@posix_only
def test_plane_key_for_postgres_lives_in_private_config_dir() -> None:
    url = "postgresql+psycopg://ledger:pw@db/evidence"
    key = load_or_create_plane_key(url)
    path = plane_key_path(url)
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    assert fingerprint(load_or_create_plane_key(url)) == fingerprint(key)
    assert b"pw" not in path.read_bytes().split(b"\n")[0]  # sanity: a PEM, not the URL


def test_plane_key_concurrent_creation_converges(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'evidence.db'}"
    with ThreadPoolExecutor(max_workers=8) as pool:
        keys = list(pool.map(lambda _: load_or_create_plane_key(url), range(16)))
    assert len({fingerprint(k) for k in keys}) == 1


def test_plane_key_needs_the_database_directory(tmp_path: Path) -> None:
    with pytest.raises(SigningError, match="no directory"):
        load_or_create_plane_key(f"sqlite:///{tmp_path / 'nope' / 'x.db'}")


# -------------------------------------------------------------------------------- tokens


def test_mint_and_verify(plane: Ed25519PrivateKey) -> None:
    token = _mint(plane)
    assert token.startswith("evt1.") and token.count(".") == 2
    claims = verify_token(
        plane.public_key(),
        token,
        plan_id="P-1",
        now=T0 + timedelta(minutes=5),
        attempt=1,
        results_digest=DIGEST,
    )
    assert claims == TokenClaims(
        token_id="T-1",
        plan_id="P-1",
        attempt=1,
        results_digest=DIGEST,
        issued_at=ISSUED,
        expires_at=EXPIRES,
    )
    assert read_token(token) == claims
    # The payload is the canonical JSON of the claims, exactly what sign_record signs.
    payload = _unb64url(token.split(".")[1])
    assert payload == canonical_json(msgspec.to_builtins(claims))
    # Valid exactly from issued_at (inclusive) to expires_at (exclusive).
    verify_token(plane.public_key(), token, plan_id="P-1", now=T0)
    # Any timezone for now: it is compared in UTC.
    paris = datetime(2026, 1, 1, 1, 5, tzinfo=timezone(timedelta(hours=1)))  # 00:05 UTC
    verify_token(plane.public_key(), token, plan_id="P-1", now=paris)
    _refused(
        plane.public_key(),
        token,
        "expired",
        "expired",
        now=datetime(2026, 1, 1, 1, 15, tzinfo=timezone(timedelta(hours=1))),
    )


def test_mint_accepts_aware_datetimes(plane: Ed25519PrivateKey) -> None:
    token = _mint(plane, issued_at=T0, expires_at=T0 + timedelta(minutes=15))
    claims = read_token(token)
    assert claims.issued_at == "2026-01-01T00:00:00.000000Z"
    assert claims.expires_at == "2026-01-01T00:15:00.000000Z"
    with pytest.raises(SigningError, match="timezone-aware"):
        _mint(plane, issued_at=datetime(2026, 1, 1))


def _refused(
    plane_pub: Ed25519PublicKey,
    token: str,
    reason: str,
    fragment: str,
    *,
    plan_id: str = "P-1",
    now: datetime = T0 + timedelta(minutes=1),
    **kw: object,
) -> None:
    with pytest.raises(TokenRefused, match=fragment) as info:
        verify_token(plane_pub, token, plan_id=plan_id, now=now, **kw)  # type: ignore[arg-type]
    assert info.value.reason == reason
    assert isinstance(info.value, SigningError)
    assert "\n" not in str(info.value)  # one line


def test_another_plans_token(plane: Ed25519PrivateKey) -> None:
    _refused(
        plane.public_key(),
        _mint(plane),
        "plan",
        "minted for plan 'P-1', not for plan 'P-2'",
        plan_id="P-2",
    )


def test_expired_and_not_yet_valid(plane: Ed25519PrivateKey) -> None:
    token = _mint(plane)
    _refused(
        plane.public_key(),
        token,
        "expired",
        "expired at 2026-01-01T00:15:00Z",
        now=T0 + timedelta(minutes=15),
    )
    _refused(plane.public_key(), token, "expired", "expired", now=T0 + timedelta(days=1))
    _refused(
        plane.public_key(),
        token,
        "not_yet_valid",
        "not valid before",
        now=T0 - timedelta(microseconds=1),
    )


def test_wrong_attempt_or_results(plane: Ed25519PrivateKey) -> None:
    token = _mint(plane)
    _refused(
        plane.public_key(), token, "attempt", "attempt 1, but the plan is at attempt 2", attempt=2
    )
    _refused(
        plane.public_key(), token, "results_digest", "minted for results", results_digest="ef" * 32
    )


def test_tampered_claims_keep_old_signature(plane: Ed25519PrivateKey) -> None:
    token = _mint(plane)
    prefix, payload, signature = token.split(".")
    claims = json.loads(_unb64url(payload))
    for change in [
        {"plan_id": "P-2"},
        {"attempt": 2},
        {"expires_at": "2027-01-01T00:00:00Z"},
        {"results_digest": "ef" * 32},
        {"token_id": "T-2"},
    ]:
        forged_payload = _b64url(canonical_json({**claims, **change}))
        forged = f"{prefix}.{forged_payload}.{signature}"
        _refused(
            plane.public_key(),
            forged,
            "signature",
            "bad signature",
            plan_id=str({**claims, **change}["plan_id"]),
        )


def test_token_of_another_plane_key(plane: Ed25519PrivateKey) -> None:
    other = Ed25519PrivateKey.generate()
    _refused(plane.public_key(), _mint(other), "signature", "another ledger's plane key")


def test_forged_token_signature_byte(plane: Ed25519PrivateKey) -> None:
    prefix, payload, signature = _mint(plane).split(".")
    raw = bytearray(_unb64url(signature))
    raw[10] ^= 0x80
    _refused(
        plane.public_key(),
        f"{prefix}.{payload}.{_b64url(bytes(raw))}",
        "signature",
        "bad signature",
    )


def test_approver_signature_is_not_a_token(plane: Ed25519PrivateKey) -> None:
    """A decision-domain signature by the plane key over the same claims is refused."""
    claims = msgspec.to_builtins(read_token(_mint(plane)))
    payload = canonical_json(claims)
    sig = base64.b64decode(sign_record(plane, claims, domain="decision"))
    _refused(
        plane.public_key(), f"evt1.{_b64url(payload)}.{_b64url(sig)}", "signature", "bad signature"
    )


def _claims_token(claims: object, sig: bytes = b"\0" * 64) -> str:
    raw = claims if isinstance(claims, bytes) else canonical_json(claims)
    return f"evt1.{_b64url(raw)}.{_b64url(sig)}"


GOOD = {
    "token_id": "T-1",
    "plan_id": "P-1",
    "attempt": 1,
    "results_digest": DIGEST,
    "issued_at": ISSUED,
    "expires_at": EXPIRES,
}


@pytest.mark.parametrize(
    ("token", "fragment"),
    [
        ("", "expected evt1.<claims>.<signature>"),
        ("evt1.abc", "expected evt1.<claims>.<signature>"),
        ("evt1.a.b.c", "expected evt1.<claims>.<signature>"),
        ("evt2.abc.def", "unknown prefix 'evt2'"),
        ("evt1.a+b/.AAAA", "claims is not base64url"),
        ("evt1.e31.AAAA", "claims is not canonical base64url"),
        (f"evt1.{_b64url(b'{}')}.AAAA", "signature is 3 bytes"),
        (_claims_token(b"not json"), "claims are not JSON"),
        (_claims_token([1]), "Expected `object`"),
        (
            _claims_token({k: v for k, v in GOOD.items() if k != "plan_id"}),
            "missing required field `plan_id`",
        ),
        (_claims_token({**GOOD, "scope": "all"}), "unknown field `scope`"),
        (_claims_token({**GOOD, "attempt": "1"}), r"Expected `int`, got `str` - at `\$.attempt`"),
        (_claims_token({**GOOD, "attempt": True}), r"at `\$.attempt`"),
        (_claims_token({**GOOD, "attempt": 0}), r">= 1 - at `\$.attempt`"),
        (_claims_token({**GOOD, "plan_id": ""}), r"at `\$.plan_id`"),
        (_claims_token({**GOOD, "expires_at": "2026-01-01T00:15:00+00:00"}), r"at `\$.expires_at`"),
        (_claims_token({**GOOD, "expires_at": "2026-01-01T00:15:00Z\n"}), r"at `\$.expires_at`"),
        (_claims_token({**GOOD, "expires_at": "2026-02-30T00:00:00Z"}), "RFC 3339|day"),
        (_claims_token({**GOOD, "expires_at": ISSUED}), "expires_at is not after issued_at"),
        (_claims_token(json.dumps(GOOD, indent=1).encode()), "not canonical JSON"),
        ("evt1." + "A" * 5000 + ".AAAA", "longer than"),
    ],
)
def test_malformed_tokens(plane: Ed25519PrivateKey, token: str, fragment: str) -> None:
    with pytest.raises(TokenRefused, match=fragment) as info:
        read_token(token)
    assert info.value.reason == "format"
    _refused(plane.public_key(), token, "format", fragment)


def test_mint_refuses_bad_claims(plane: Ed25519PrivateKey) -> None:
    with pytest.raises(SigningError, match=r"cannot mint token.*attempt"):
        _mint(plane, attempt=0)
    with pytest.raises(SigningError, match=r"cannot mint token.*expires_at"):
        _mint(plane, expires_at=ISSUED)
    with pytest.raises(SigningError, match=r"cannot mint token.*issued_at"):
        _mint(plane, issued_at="yesterday")


def test_verify_token_needs_aware_now(plane: Ed25519PrivateKey) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        verify_token(
            plane.public_key(), _mint(plane), plan_id="P-1", now=datetime(2026, 1, 1, 0, 1)
        )


def test_token_digest(plane: Ed25519PrivateKey) -> None:
    token = _mint(plane)
    assert token_digest(token) == hashlib.sha256(token.encode()).hexdigest()
    assert token_digest(token) != token_digest(_mint(plane, token_id="T-2"))


def test_keys_generate_says_the_next_step(tmp_path: Path) -> None:
    """A newcomer learns `keys add` from `keys generate`, not from its error."""
    made = run_cli("keys", "generate", "--out", str(tmp_path / "alice.key"))
    assert made.returncode == 0, made.stderr
    assert f"next: evidence keys add NAME {tmp_path / 'alice.key'}.pub" in made.stdout


def test_what_only_verifies_never_makes_a_plane_key(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plane key is made only by what signs as the plane, with its public half beside
    it. A process that only verifies (on another machine, or an operator's) reads the
    public half, and with neither half says so instead of minting a key of its own, under
    which every endorsement of the real one would read as forged."""
    from commands.plane import Plane
    from commands.plane.lifecycle import add_approver_key
    from commands.rules.signing import load_plane_public_key, plane_key_path

    with Plane.open(sqlite_url) as plane:  # the host: signs, so it makes the key
        generate_key_pair(tmp_path / "alice.key")
        add_approver_key(plane, "alice", tmp_path / "alice.key.pub")
        real = plane.plane_public_key()
    host = plane_key_path(sqlite_url)
    assert load_public_key(f"{host}.pub") == real  # its public half, beside it
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("EVIDENCE_PLANE_KEY", str(elsewhere / "plane.key"))
    with pytest.raises(LedgerError, match="public half"):
        load_plane_public_key(sqlite_url)
    assert list(elsewhere.iterdir()) == []  # nothing made
    (elsewhere / "plane.key.pub").write_bytes(Path(f"{host}.pub").read_bytes())
    with Plane.open(sqlite_url, create=False) as plane:  # only the public half here
        keys = plane.log().approver_keys()
        assert keys and all(k.status == "active" for k in keys.values())  # endorsed
    assert sorted(p.name for p in elsewhere.iterdir()) == ["plane.key.pub"]
