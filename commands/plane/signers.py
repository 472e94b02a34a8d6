"""Who signs a command's policy, when it is not this process's operator key
(docs/service.md, "Operators through the service").

The plane signs policy where it will stand (``Place``: ledger, stream, version, type) with
the local operator key (``Plane._operator``). An operator on another machine keeps their
key there, so the service cannot sign for them; instead a command runs twice:

- **asked** (``prepare``): the command's handler runs as usual under an ``Asking``
  signer. Where the plane would sign, it stops: ``Unsigned`` carries each payload and its
  place, and nothing is appended (the refusal comes before any write). The operator's
  client gets them, signs each ``policy_record`` for its place with its own key, and
- **given** (``commit``): the signed payloads come back with the stream version they were
  prepared at, and are appended exactly as signed under a ``Presigned`` signer, which
  checks each signature where the event will stand (an active operator key of the log,
  the named operator, this ledger, this stream and version, the payload unchanged) and
  signs nothing. A stream that moved meanwhile refuses the append (the client prepares
  again); a payload changed after it was prepared no longer verifies.

The private key never reaches the service; what the service appends is what the person
signed, and the plane's own trust (``commands.rules.trust``) judges it as any policy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgspec

from commands.errors import CommandRefused
from commands.rules.signing import Place, SigningError, policy_record, verify_record
from commands.rules.trust import needs_operator
from ledger import EventPayload
from ledger.events import PolicySignature
from ledger.keys import public_key_from_b64

__all__ = [
    "SIGNER",
    "Asking",
    "Prepared",
    "Presigned",
    "Signer",
    "Unsigned",
    "commit",
    "prepare",
]

T = TypeVar("T")


class KeysOf(Protocol):
    """What a signer reads of the log (``Authority``): the approver and operator keys."""

    def approver_keys(self) -> Any: ...


class Signer(Protocol):
    """Signs (or checks the signature of) one policy payload for its place."""

    def sign(self, p: EventPayload, place: Place, log: KeysOf) -> EventPayload: ...

    def done(self, signed: Sequence[tuple[EventPayload, Place]]) -> None:
        """After every payload of the append was signed, before anything is written."""


# The signer of the commands this context runs (None: this process's operator key).
SIGNER: ContextVar[Signer | None] = ContextVar("evidence_signer", default=None)


@dataclass(frozen=True)
class Prepared:
    """A payload to sign: where it will stand, and the payload as the plane decided it."""

    place: Place
    payload: EventPayload

    def to_json(self) -> dict[str, Any]:
        return {
            "place": {
                "ledger": self.place.ledger,
                "stream": self.place.stream,
                "version": self.place.version,
                "type": self.place.type,
            },
            "payload": msgspec.to_builtins(self.payload),
        }


class Unsigned(CommandRefused):
    """The command's policy, decided and unsigned (``Asking``): nothing was appended."""

    def __init__(self, prepared: list[Prepared]) -> None:
        super().__init__("policy prepared for an operator's signature; nothing appended")
        self.prepared = prepared


class Asking:
    """Stops the append where the plane would sign: ``Unsigned`` carries what to sign."""

    def sign(self, p: EventPayload, place: Place, log: KeysOf) -> EventPayload:
        return p

    def done(self, signed: Sequence[tuple[EventPayload, Place]]) -> None:
        raise Unsigned([Prepared(place, p) for p, place in signed])


class Presigned:
    """Appends payloads signed elsewhere, each checked where it will stand."""

    def sign(self, p: EventPayload, place: Place, log: KeysOf) -> EventPayload:
        what = p.type_name()
        signed = getattr(p, "signed", msgspec.UNSET)
        if not isinstance(signed, PolicySignature) or signed.place is msgspec.UNSET:
            raise CommandRefused(f"{what}: an operator's signature bound to its place")
        if Place.signed(signed.place, what) != place:
            raise CommandRefused(
                f"{what} was signed for {signed.place.stream} v{signed.place.version} of "
                f"ledger {signed.place.ledger}; it would stand at {place.stream} "
                f"v{place.version} of {place.ledger}: prepare it again"
            )
        key = log.approver_keys().get(signed.fingerprint)
        if key is None or key.role != "operator" or key.name != signed.operator:
            raise CommandRefused(f"{what}: signed with no operator key of this ledger")
        if key.status != "active":
            raise CommandRefused(f"{what}: signed with an operator key that is not active")
        try:
            public = public_key_from_b64(key.public_key)
            good = verify_record(
                public, policy_record(p), signed.signature, domain="policy", place=place
            )
        except (SigningError, ValueError):
            good = False
        if not good:
            raise CommandRefused(f"{what}: the operator's signature does not verify")
        return p

    def done(self, signed: Sequence[tuple[EventPayload, Place]]) -> None:
        return None


def prepare(command: Callable[[], T]) -> tuple[list[Prepared], T | None]:
    """Run ``command`` (a handler on a plane) asking instead of signing: the policy it
    would append, unsigned, and nothing appended; or, when it appends no policy (an
    unchanged registration), what it returned."""
    token = SIGNER.set(Asking())
    try:
        return [], command()
    except Unsigned as unsigned:
        return unsigned.prepared, None
    finally:
        SIGNER.reset(token)


def commit(
    run: Callable[..., list[Any]],
    stream: str,
    version: int,
    payloads: Sequence[EventPayload],
    *,
    actor: str,
) -> list[Any]:
    """Append ``payloads`` (signed elsewhere, prepared at ``version`` of ``stream``)
    through ``run`` (``Plane.run``): refused when the stream moved, or when any
    signature does not stand where its event would (``Presigned``)."""
    if not payloads or not all(needs_operator(p) for p in payloads):
        raise CommandRefused("only policy an operator signed is given here")

    def decide(state: Any) -> list[EventPayload]:
        if state.version != version:
            raise CommandRefused(
                f"{stream} moved since it was prepared (v{version}, now v{state.version}): "
                "prepare it again"
            )
        return list(payloads)

    token = SIGNER.set(Presigned())
    try:
        return run(stream, decide, actor=actor)
    finally:
        SIGNER.reset(token)
