"""What the audit finds: the invariant names, a violation, the report, and the one
place every check of a walk records into (``Findings``, shared through ``Reporting``)."""

from __future__ import annotations

import msgspec

__all__ = ["INVARIANTS", "AuditReport", "Findings", "Reporting", "Violation"]

# The invariant names a violation can carry (docs/auditing.md explains each, with the
# seed's ids as aliases: token_from_passing_run is INV1, blocker_not_overridable INV3).
INVARIANTS = (
    "token_from_passing_run",  # INV1: a token only from a complete, passing, current run
    "blocker_not_overridable",  # INV3: decisions only on escalations; no token past a blocker
    "ordering",  # escalate -> decision -> re-validation -> token; Apply; tokens once
    "gate_rederivation",  # gate check re-run on recorded bytes gives the recorded verdict
    "transform_rederivation",  # wrapped transform re-run on the raw output
    "outcome_drift",  # classification with the current rules differs from the recorded
    "delta_fold",  # a stream rebuilt from its deltas differs from its fold
    "read_only",  # a registered validation that is not read-only
    "gate_routing",  # a failed gate check not routed as the plan's strict_mode says
    "read_model",  # a stored read model differs from a fresh fold up to its position
    "illegal_transition",  # an event its stream's state could not take (plan_rules)
    "binding",  # a binding set is not what applied when it was pinned, or a run's set
    "skills",  # skills not pinned as defined, or an input gate that ignored them
    "no_vacuous_pass",  # a pass / token with no required validation run, not opted out
    "decision_signature",  # a decision not signed by its approver's key in force
    "expiry_signature",  # an escalation's expiry the plane key did not sign
    "approvals",  # an escalation asking fewer approvals than required, or a self-approval
    "token_signature",  # a token not signed by the plane key
    "approver_endorsement",  # an approver key the plane key did not endorse
    "policy_signature",  # policy not signed by an operator key in force: the plane ignores it
    "replayed_signature",  # a genuine signature standing where it was not made: a copy
    "ledger_identity",  # a ledger.identified the plane key did not sign where it stands
    "review_signature",  # a review report the plane key did not vouch for
    "apply_incomplete",  # a change set recorded, the Apply never completed
    "change_set",  # a change set that is not the validated trees' difference from the snapshot
    "files",  # with --files: a resource directory differs from the applied change set
    "evidence",  # a blob a verdict was derived from is missing
)


class Violation(msgspec.Struct, kw_only=True):
    position: int | None
    plan_id: str | None
    invariant: str
    expected: str
    found: str


class AuditReport(msgspec.Struct, kw_only=True):
    ok: bool
    size: int  # the log was audited up to this position
    plans: list[str]
    checked: dict[str, int]  # how many times each check ran
    violations: list[Violation]
    # each read model's check: ok, differs, stale (another version built it: the next
    # open rebuilds it), absent; empty on a bundle, which has none
    read_models: dict[str, str] = {}
    # plans applied after a run in which no required validation ran (they opted out with
    # require_validation: false): not violations, but never to be mistaken for validated
    unvalidated: list[str] = []
    # plans that ran programs unconfined (they opted out with confinement: none): not
    # violations either, but never to be mistaken for confined work
    unconfined: list[str] = []
    # the checks that need the plane's public key, not made without it (a bundle, or a
    # database whose plane key is not on this machine, and no --plane-key): an audit
    # that passed them is never to be mistaken for one that checked the signatures
    unchecked: list[str] = []


# What only the plane's public key can check: who signed tokens, endorsed approvers,
# signed policy (through the operators the plane key endorsed) and vouched for reviews.
NEEDS_PLANE_KEY = (
    "token_signature",
    "expiry_signature",
    "approvals",
    "approver_endorsement",
    "policy_signature",
    "review_signature",
)


class Findings:
    """The violations found so far (at most ``max_violations``) and how many times each
    check ran."""

    def __init__(self, max_violations: int) -> None:
        self.max = max_violations
        self.violations: list[Violation] = []
        self.checked: dict[str, int] = {}


class Reporting:
    """A checker of the walk: it records into the walk's one ``Findings``."""

    def __init__(self, findings: Findings) -> None:
        self.findings = findings

    def violation(
        self, position: int | None, plan_id: str | None, invariant: str, expected: str, found: str
    ) -> None:
        if len(self.findings.violations) < self.findings.max:
            self.findings.violations.append(
                Violation(
                    position=position,
                    plan_id=plan_id,
                    invariant=invariant,
                    expected=expected,
                    found=found,
                )
            )

    def count(self, name: str) -> None:
        checked = self.findings.checked
        checked[name] = checked.get(name, 0) + 1
