"""Asking witnesses to cosign a checkpoint (C2SP tlog-witness's ``add-checkpoint``;
docs/auditing.md, "Witnesses"), and publishing it only when a policy's quorum holds.

A witness keeps, for each log, the largest tree it has cosigned, and cosigns a new one
only with a consistency proof from it: so the request first names the size this client
believes the witness holds (0 when it knows nothing), and a witness that holds another
answers 409 with its size; the request is made again with the proof from that size. What
the witness's answers mean for this log, each told to the operator:

- a size larger than the checkpoint's: the witness saw more of this log than it now
  holds — the log was truncated or rolled back, or this checkpoint is an old one;
- the same size, refused again (another root), or a proof it cannot verify (422): the
  witness saw another tree — the log forked;
- 403 or 404: the witness does not know this log's key or origin.

Every cosignature received is verified against the witness key the policy names before
it is kept; what does not verify is dropped (a witness speaks only with its own key).
"""

from __future__ import annotations

import base64
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ledger.checkpoints import SIGNATURE_PREFIX, CheckpointError, parse_checkpoint
from ledger.merkle import consistency_proof
from ledger.tlog_policy import Policy, PolicyCheck, Witness

__all__ = ["ATTEMPTS", "Asked", "NotCosigned", "Witnessed", "cosigner", "proofs", "witness"]

ATTEMPTS = 3
TIMEOUT_S = 30.0
SIZE_TYPE = "text/x.tlog.size"

Proof = Callable[[int], Sequence[bytes]]  # old size -> the consistency proof to the checkpoint


@dataclass(frozen=True)
class Asked:
    """One witness's answer: its cosignature line, or why there is none."""

    witness: str
    cosignature: str | None = None
    why: str | None = None


@dataclass(frozen=True)
class Witnessed:
    """The checkpoint with every cosignature that verifies, each witness's answer, and
    the checkpoint held to the policy."""

    note: str
    asked: list[Asked]
    check: PolicyCheck


def proofs(read_leaves: Callable[[], Sequence[bytes]]) -> Proof:
    """The consistency proofs of a checkpoint's tree, its leaf hashes read once, and only
    when a witness needs one (none does when the tree it holds is this one)."""
    leaves: list[bytes] = []

    def proof(old: int) -> Sequence[bytes]:
        if not leaves:
            leaves.extend(read_leaves())
        return consistency_proof(leaves, old)

    return proof


def witness(note: str, policy: Policy, proof: Proof, *, timeout: float = TIMEOUT_S) -> Witnessed:
    """Ask each witness of ``policy`` that has a URL to cosign the checkpoint ``note``
    (``proof(old)``: the consistency proof from a tree of ``old`` leaves)."""
    checkpoint, _ = parse_checkpoint(note)
    asked = [
        _ask(w, note, checkpoint.size, proof, timeout)
        for w in policy.witnesses.values()
        if w.url is not None
    ]
    # Every line received, held to the policy once: a line that does not verify under
    # its witness's key counts for nobody, and is not kept.
    check = policy.check(note + "".join(a.cosignature or "" for a in asked))
    final = note + "".join(a.cosignature or "" for a in asked if a.witness in check.cosigned)
    answers = [
        a
        if a.cosignature is None or a.witness in check.cosigned
        else Asked(a.witness, why="its cosignature does not verify under its key")
        for a in asked
    ]
    return Witnessed(final, answers, check)


def _ask(w: Witness, note: str, size: int, proof: Proof, timeout: float) -> Asked:
    old, tried = 0, set()
    for _attempt in range(ATTEMPTS):
        tried.add(old)
        body = f"old {old}\n" + "".join(
            base64.b64encode(h).decode() + "\n" for h in (proof(old) if 0 < old < size else ())
        )
        url = f"{w.url}/add-checkpoint"
        status, content_type, answer = _post(url, body + "\n" + note, timeout)
        if status == 200:
            return _cosignature(w, answer)
        if status != 409:
            return Asked(w.name, why=_refusal(status, old, size, answer))
        theirs = _their_size(content_type, answer)
        if theirs is None or theirs in tried:
            seen = theirs if theirs is not None else old
            return Asked(w.name, why=f"it has cosigned another tree of size {seen}: the log forked")
        if theirs > size:
            return Asked(
                w.name,
                why=f"it has cosigned a larger tree of this log ({theirs} events, this "
                f"checkpoint {size}): the log was truncated or rolled back",
            )
        old = theirs
    return Asked(w.name, why=f"no agreement on the old size after {ATTEMPTS} requests")


def _post(url: str, body: str, timeout: float) -> tuple[int, str, str]:
    request = urllib.request.Request(
        url, data=body.encode(), method="POST", headers={"Content-Type": "text/plain"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.headers.get("Content-Type", ""), _text(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), _text(exc.read())
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return 0, "", f"unreachable ({reason})"


def _text(data: bytes) -> str:
    return data[: 64 * 1024].decode("utf-8", errors="replace")


def _their_size(content_type: str, answer: str) -> int | None:
    if content_type.split(";")[0].strip() != SIZE_TYPE:
        return None
    text = answer.strip()
    return int(text) if text.isdigit() else None


def _refusal(status: int, old: int, size: int, answer: str) -> str:
    if status == 0:
        return answer
    if status == 422:
        return (
            f"it cannot verify this tree ({size}) extends the one it cosigned ({old}): "
            "the log forked"
        )
    known = {
        403: "it does not trust this log's key",
        404: "it does not know this log's origin",
        400: "it refused the request as malformed",
    }
    return f"{known.get(status, 'it answered ' + str(status))}: {answer.strip()[:200]}"


def _cosignature(w: Witness, answer: str) -> Asked:
    """The witness's line in a 200 answer (signature lines; others are ignored)."""
    for line in answer.split("\n"):
        if line.startswith(f"{SIGNATURE_PREFIX}{w.key.name} "):
            return Asked(w.name, cosignature=line + "\n")
    return Asked(w.name, why=f"its answer holds no cosignature by {w.key.name}")


class NotCosigned(CheckpointError):
    """The witnesses' quorum did not cosign the checkpoint (one line: each one's answer)."""


def cosigner(policy: Policy, policy_text: str) -> Callable[[str, list[bytes]], tuple[str, str]]:
    """What writes a cosigned checkpoint into a bundle or a tile directory: the
    checkpoint and the log's leaf hashes in, the checkpoint with the quorum's
    cosignatures and the policy's text out; ``NotCosigned`` without the quorum."""

    def cosign(note: str, leaves: list[bytes]) -> tuple[str, str]:
        done = witness(note, policy, proofs(lambda: leaves))
        if not done.check.ok:
            answers = "; ".join(f"{a.witness}: {a.why or 'cosigned'}" for a in done.asked)
            raise NotCosigned(f"the witnesses' quorum did not cosign ({answers or 'none asked'})")
        return done.note, policy_text

    return cosign
