"""A witness policy (C2SP tlog-policy): which logs' checkpoints count, which witnesses,
and the quorum of witnesses whose cosignatures make a checkpoint valid.

    log <vkey> [<url>]
    witness <name> <vkey> [<url>]          # a cosigner key: type 0x04
    group <name> all|any|<k> <member>...   # members defined on earlier lines
    quorum <name>|none

Lines are separated by newlines, items by spaces or tabs; blank lines and ``#`` comments
are ignored. A group or the quorum names only what earlier lines defined, each member at
most once; exactly one quorum line. A checkpoint satisfies the policy when one of its
logs signed it and the quorum witnessed it (a witness by its valid cosignature, a group
by at least ``k`` of its members).
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import Any

from .checkpoints import CheckpointError, VerifierKey, open_note, parse_verifier_key
from .cosignatures import CosignerKey, cosigned_by, parse_cosigner_key

__all__ = ["Policy", "PolicyCheck", "PolicyError", "Witness", "parse_policy"]

_MAX = 32  # logs, witnesses, groups: what the spec asks an implementation to support


class PolicyError(CheckpointError):
    """The policy file is not one (one line: which line and why)."""


@dataclass(frozen=True)
class Witness:
    name: str
    key: CosignerKey
    url: str | None


@dataclass(frozen=True)
class PolicyCheck:
    """A checkpoint held to a policy: the log that signed it (None: none of them), the
    witnesses whose cosignatures verify, and whether the quorum holds."""

    log: str | None
    cosigned: dict[str, int]
    quorum: bool

    @property
    def ok(self) -> bool:
        return self.log is not None and self.quorum

    def to_json(self) -> dict[str, Any]:
        return {"log": self.log, "cosigned": sorted(self.cosigned), "quorum": self.quorum}


@dataclass
class Policy:
    logs: list[tuple[VerifierKey, str | None]] = field(default_factory=list)
    witnesses: dict[str, Witness] = field(default_factory=dict)
    groups: dict[str, tuple[int, list[str]]] = field(default_factory=dict)
    quorum: str | None = None  # "none": no cosignature needed

    def witnessed(self, name: str, cosigned: set[str]) -> bool:
        """Whether witness or group ``name`` witnessed, given who cosigned."""
        if name == "none":
            return True
        if name in self.witnesses:
            return name in cosigned
        k, members = self.groups[name]
        return sum(self.witnessed(m, cosigned) for m in members) >= k

    def check(self, note: str) -> PolicyCheck:
        """``note`` held to this policy."""
        log = None
        for key, _url in self.logs:
            try:
                open_note(note, key)
            except CheckpointError:
                continue
            log = key.name
            break
        found = cosigned_by(note, [w.key for w in self.witnesses.values()])
        cosigned = {w.name: found[w.key] for w in self.witnesses.values() if w.key in found}
        assert self.quorum is not None
        return PolicyCheck(log, cosigned, self.witnessed(self.quorum, set(cosigned)))


def parse_policy(text: str) -> Policy:
    """The policy ``text`` says; ``PolicyError`` naming the first line that is wrong."""
    policy = Policy()
    names: set[str] = set()
    for number, raw in enumerate(text.split("\n"), 1):
        words = raw.replace("\t", " ").split()
        if not words or words[0].startswith("#"):
            continue
        try:
            _line(policy, names, words)
        except (CheckpointError, ValueError) as exc:
            raise PolicyError(f"policy line {number}: {exc}") from None
    if policy.quorum is None:
        raise PolicyError("the policy has no quorum line")
    return policy


def _line(policy: Policy, names: set[str], words: list[str]) -> None:
    kind, args = words[0], words[1:]
    arity, read = _LINES.get(kind, ((), None))
    if read is None or len(args) not in arity:
        raise ValueError(f"not a policy line: {' '.join(words)[:80]!r}")
    read(policy, names, args)
    if max(len(policy.logs), len(policy.witnesses), len(policy.groups)) > _MAX:
        raise ValueError(f"at most {_MAX} logs, witnesses and groups")


def _log(policy: Policy, _names: set[str], args: list[str]) -> None:
    key = parse_verifier_key(args[0])
    if any(k.public_key == key.public_key for k, _ in policy.logs):
        raise ValueError("a log is listed once")
    policy.logs.append((key, args[1] if len(args) == 2 else None))


def _witness(policy: Policy, names: set[str], args: list[str]) -> None:
    name, key = args[0], parse_cosigner_key(args[1])
    _new_name(names, name)
    if any(w.key.public_key == key.public_key for w in policy.witnesses.values()):
        raise ValueError("a witness is listed once")
    policy.witnesses[name] = Witness(name, key, args[2] if len(args) == 3 else None)


def _group(policy: Policy, names: set[str], args: list[str]) -> None:
    name, threshold, members = args[0], args[1], args[2:]
    if len(set(members)) != len(members) or not set(members) <= names:
        raise ValueError("a group's members are defined earlier, each listed once")
    _new_name(names, name)
    k = {"all": len(members), "any": 1}.get(threshold)
    if k is None:
        if not threshold.isdigit() or not 1 <= int(threshold) <= len(members):
            raise ValueError(f"a group's threshold is all, any or 1 to {len(members)}")
        k = int(threshold)
    policy.groups[name] = (k, members)


def _quorum(policy: Policy, names: set[str], args: list[str]) -> None:
    if policy.quorum is not None:
        raise ValueError("one quorum line")
    if args[0] != "none" and args[0] not in names:
        raise ValueError(f"the quorum {args[0]!r} is not defined on an earlier line")
    policy.quorum = args[0]


# kind -> (how many words may follow it, the reader of its line)
_LINES: dict[str, tuple[Container[int], Callable[[Policy, set[str], list[str]], None]]] = {
    "log": ((1, 2), _log),
    "witness": ((2, 3), _witness),
    "group": (range(3, 1000), _group),
    "quorum": ((1,), _quorum),
}


def _new_name(names: set[str], name: str) -> None:
    if name == "none" or name in names:
        raise ValueError(f"the name {name!r} is taken")
    names.add(name)
