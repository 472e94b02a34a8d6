"""INV1 and the escalation order, at each ``plan.token_minted``: a token only from the
plan's latest completed, passing, unsuperseded run of its whole binding set, every
required member passed, its results digest bound, signed by the plane key, its
evidence still there, and after any escalation only from a run after a revise."""

from __future__ import annotations

from collections.abc import Iterable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from commands.rules.trust import token_signed
from commands.rules.verdicts import results_digest
from ledger import LogReader
from ledger.events import TokenMinted
from ledger.events.validation import ResolvedAttachment

from .findings import Findings, Reporting
from .walk import PlanWalk, Run

__all__ = ["TokenChecks", "members"]


def members(binding: Iterable[ResolvedAttachment]) -> str:
    shown = [
        f"{b.validation} v{b.validation_version} {b.mode} ({b.attachment_id})" for b in binding
    ]
    return "[" + ", ".join(shown) + "]"


class TokenChecks(Reporting):
    def __init__(
        self, findings: Findings, store: LogReader, plane_public_key: Ed25519PublicKey | None
    ) -> None:
        super().__init__(findings)
        self.store = store
        self.plane_public_key = plane_public_key

    def check_token(self, plan_id: str, pos: int, walk: PlanWalk, p: TokenMinted) -> None:
        self.count("token_from_passing_run")
        if p.token_id in walk.minted:  # a replayed mint would revive a superseded token
            self.violation(
                pos,
                plan_id,
                "ordering",
                f"token {p.token_id} is minted once",
                f"it was minted at position {walk.minted[p.token_id]} already",
            )
        walk.minted.setdefault(p.token_id, pos)
        run = walk.runs.get(p.run_id)
        if run is None or run.completed is None:
            self.violation(
                pos,
                plan_id,
                "token_from_passing_run",
                "a token is minted from a completed run",
                f"run {p.run_id} {'never started' if run is None else 'is open'}",
            )
            return
        self.check_token_run(plan_id, pos, walk, p, run)
        self.check_token_results(plan_id, pos, p, run)
        self.check_token_binding(plan_id, pos, walk, p, run)
        self.check_token_signature(plan_id, pos, p)
        self.check_evidence(plan_id, pos, run)
        self.check_escalation_order(plan_id, pos, walk, p, run)

    def check_token_run(
        self, plan_id: str, pos: int, walk: PlanWalk, p: TokenMinted, run: Run
    ) -> None:
        """The token's run is the plan's latest, passing (no blocker after it), not
        superseded, of the token's and the plan's attempt."""
        assert run.completed is not None  # check_token's precondition
        last = walk.last_completed
        if run is not last:
            self.violation(
                pos,
                plan_id,
                "token_from_passing_run",
                "a token is minted from the plan's latest run",
                f"run {p.run_id} is not the latest completed run",
            )
        if last is not None and last.completed is not None and last.completed.outcome == "blocker":
            self.violation(
                pos,
                plan_id,
                "blocker_not_overridable",
                "no token after a blocker without a later passing run",
                f"the latest run {last.run_id} is a blocker",
            )
        elif run.completed.outcome != "pass":
            self.violation(
                pos,
                plan_id,
                "token_from_passing_run",
                "a token only from a passing run",
                f"run {p.run_id} completed with outcome {run.completed.outcome}",
            )
        if run.invalidated_at is not None:
            self.violation(
                pos,
                plan_id,
                "token_from_passing_run",
                "nothing invalidates the run before the token",
                f"position {run.invalidated_at} superseded run {p.run_id}",
            )
        plan_attempt = walk.doc.attempt if walk.doc is not None else None
        if p.attempt != run.attempt or p.attempt != plan_attempt:
            self.violation(
                pos,
                plan_id,
                "token_from_passing_run",
                f"the token's attempt {p.attempt} is the run's and the plan's",
                f"run attempt {run.attempt}, plan attempt {plan_attempt}",
            )

    def check_token_results(self, plan_id: str, pos: int, p: TokenMinted, run: Run) -> None:
        """The token binds its run's results digest, the digest of the recorded results,
        among which every required member's passing real result."""
        assert run.completed is not None  # check_token's precondition
        if p.results_digest != run.completed.results_digest:
            self.violation(
                pos,
                plan_id,
                "token_from_passing_run",
                "the token binds the run's results digest",
                f"{p.results_digest} != {run.completed.results_digest}",
            )
        if results_digest(run.results) != run.completed.results_digest:
            self.violation(
                pos,
                plan_id,
                "token_from_passing_run",
                "the run's results digest is the digest of its recorded results",
                "it is not",
            )
        passing = {r.attachment_id for r in run.results if r.verdict is True and r.cause is None}
        for r in run.resolved:
            if r.mode == "required" and r.attachment_id not in passing:
                self.violation(
                    pos,
                    plan_id,
                    "token_from_passing_run",
                    f"required attachment {r.attachment_id} "
                    f"({r.validation}) has a passing real result in run {p.run_id}",
                    "it has none",
                )

    def check_token_binding(
        self, plan_id: str, pos: int, walk: PlanWalk, p: TokenMinted, run: Run
    ) -> None:
        """The token's run ran the plan's whole binding set, a required member among it
        (unless the plan opted out)."""
        doc = walk.doc
        binding = list(doc.binding) if doc is not None else []
        if run.resolved != binding:
            self.violation(
                pos,
                plan_id,
                "binding",
                f"the token's run ran the plan's whole binding set {members(binding)}",
                members(run.resolved),
            )
        self.count("no_vacuous_pass")
        opted_out = doc is not None and not doc.global_config.require_validation
        if not any(r.mode == "required" for r in run.resolved) and not opted_out:
            self.violation(
                pos,
                plan_id,
                "no_vacuous_pass",
                "a token from a run in which a required validation ran (the plan did not opt out)",
                f"run {p.run_id} ran no required validation",
            )

    def check_token_signature(self, plan_id: str, pos: int, p: TokenMinted) -> None:
        if self.plane_public_key is None:
            return  # not checkable without the plane's public key
        self.count("token_signature")
        if not token_signed(p, self.plane_public_key):
            self.violation(
                pos,
                plan_id,
                "token_signature",
                f"token {p.token_id} signed by the plane key",
                "its signature does not verify",
            )

    def check_evidence(self, plan_id: str, pos: int, run: Run) -> None:
        """Every raw output the token's results were judged on is still there."""
        for r in run.results:
            if r.raw_output_sha256 is None:
                continue
            self.count("evidence")
            if self.store.get_blob(r.raw_output_sha256) is None:
                self.violation(
                    pos,
                    plan_id,
                    "evidence",
                    f"the raw output of {r.validation} (run {run.run_id}) is in the blob store",
                    f"blob {r.raw_output_sha256} is missing",
                )

    def check_escalation_order(
        self, plan_id: str, pos: int, walk: PlanWalk, p: TokenMinted, run: Run
    ) -> None:
        """The escalation order: escalate -> decision -> re-validation -> token."""
        esc = walk.last_escalation
        if esc is None:
            return
        self.count("ordering")
        decided = walk.decided.get(esc)
        if decided is None or decided[1] != "revise":
            self.violation(
                pos,
                plan_id,
                "ordering",
                f"escalation {esc} is decided (revise) before a token",
                "no such decision before the token",
            )
        elif run.position < decided[0]:
            self.violation(
                pos,
                plan_id,
                "ordering",
                f"the token's run started after the decision at position {decided[0]}",
                f"run {p.run_id} started at position {run.position}",
            )
