"""The outcome contract: classifying a validation run and mapping halts.

Six canonical outcomes, each saying who acts next (``NEXT_ACTION``; docs/concepts.md,
"Outcomes: who acts next"): ``pass``; two verdicts about the work, ``blocker`` and
``escalate``; three non-verdicts, ``validator_error``, ``internal_error`` and
``environment_error``.

Pure and versioned. ``classify`` turns one run's results into a canonical outcome;
``canonical_halt`` maps a raw halt type to its canonical value. The ``outcomes``
projection re-classifies every plan's last run with the *current* rules, next to the
outcome recorded when the run completed, so a rules change shows up on rebuild as drift
(``evidence audit`` reports it).

Precedence when several apply, and why:

1. ``blocker`` — any required validation failed **with a verdict**. It is a verdict
   about the work: the agent can act on it now; re-validating re-runs the others anyway.
2. ``internal_error`` — an engine defect while running a required validation (cause
   ``internal``): nothing about the work, and the other no-verdict results may share the
   defect.
3. ``validator_error`` — a required validation produced no verdict (timeout, crash,
   malformed return, missing program, read-only violation). Operator: retry / inspect;
   it never advises ``authorize``.
4. ``validator_error`` (raw ``no_required_validation``) — no required validation ran
   at all: there is no verdict to pass on, and a token minted from nothing would let
   unjudged work through (fail open). The operator attaches a required
   validation; only a plan created with ``require_validation: false`` passes such a run,
   and its Apply is marked unvalidated.
5. ``pass`` — every required validation passed. Informational results never block;
   their failures are listed.

``environment_error`` is reached only when a tool call cannot invoke its program (a
validation that cannot run is a validator without a verdict: ``validator_error``);
``escalate`` only through the failure loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
from msgspec import UNSET
from msgspec.structs import replace

from ledger.events import (
    PlanCreated,
    PlanHalted,
    ValidationResultRecorded,
    ValidationRunCompleted,
    ValidationRunStarted,
)
from ledger.events.validation import Outcome

from .folding import StreamFold
from .states import OutcomeHalt, OutcomeResult, OutcomeState, RecordedOutcome

RULES_VERSION = 2  # 2: a run with no required validation is no pass

VERDICTS = frozenset({"escalate", "blocker"})  # verdicts about the work
NON_VERDICTS = frozenset({"validator_error", "internal_error", "environment_error"})

# Who acts and what happens next, per canonical outcome (shown with every run and halt).
NEXT_ACTION: dict[str, tuple[str, str]] = {
    "pass": ("agent", "a token is minted from these results; proceed to Apply"),
    "escalate": ("human", "`evidence authorize DECISION_ID`, then re-validate"),
    "blocker": ("agent -> human", "fix the work (or revise the strategy), then re-validate"),
    "validator_error": (
        "operator",
        "retry / inspect the validator's logs; nothing is wrong with the work",
    ),
    "internal_error": ("operator", "retry / inspect logs: an engine defect"),
    "environment_error": (
        "operator",
        "install the missing program where the plan runs, then re-run unchanged",
    ),
}

# Known raw halt types -> canonical outcome. Anything else falls into the non-verdict
# branch (internal_error: an operator inspects), never into blocker.
RAW_HALT_TYPES: dict[str, Outcome] = {
    "validation_failed": "blocker",
    "max_iterations": "blocker",
    "structural_deviation": "blocker",
    "escalated": "escalate",
    "needs_decision": "escalate",
    "timeout": "validator_error",
    "crash": "validator_error",
    "malformed": "validator_error",
    "missing_program": "validator_error",
    "read_only_violation": "validator_error",
    "validator_error": "validator_error",
    "no_required_validation": "validator_error",
    "internal": "internal_error",
    "engine_exception": "internal_error",
    "program_missing": "environment_error",
    "coder_missing": "environment_error",
    "container_runtime_missing": "environment_error",
    "backend_unavailable": "environment_error",
    # an MCP server's declaration of a tool is no longer the one registered
    "schema_drift": "environment_error",
}


def canonical_halt(raw_halt_type: str) -> Outcome:
    """The canonical value of a raw halt type; unknown ones are non-verdicts."""
    return RAW_HALT_TYPES.get(raw_halt_type, "internal_error")


def classify(
    results: Iterable[Mapping[str, Any]], *, require_validation: bool = True
) -> tuple[Outcome, str, str]:
    """(outcome, raw halt type, reason) for one run's results (mode, verdict, cause,
    validation). The raw type of a pass is ``pass``."""
    required = [r for r in results if r["mode"] == "required"]
    if not required:
        if require_validation:
            return (
                "validator_error",
                "no_required_validation",
                "no required validation ran: attach one to the plan's resources "
                "(evidence attach VALIDATION --resource R) before it enters Execute",
            )
        return (
            "pass",
            "pass",
            "no required validation ran; the plan opted out "
            "(require_validation: false), so its Apply is unvalidated",
        )
    failed = [r["validation"] for r in required if r["verdict"] is False]
    if failed:
        return "blocker", "validation_failed", f"required validation(s) failed: {_names(failed)}"
    broken = [r for r in required if r["verdict"] is None]
    internal = [r["validation"] for r in broken if r["cause"] == "internal"]
    if internal:
        return "internal_error", "internal", f"engine error running {_names(internal)}"
    if broken:
        causes = sorted({r["cause"] or "unknown" for r in broken})
        raw = causes[0] if len(causes) == 1 else "validator_error"
        return (
            "validator_error",
            raw,
            "no verdict from required validation(s) "
            f"{_names(r['validation'] for r in broken)} ({', '.join(causes)})",
        )
    return "pass", "pass", "every required validation passed"


def _names(names: Iterable[str]) -> str:
    return ", ".join(sorted(set(names)))


fold_outcome: StreamFold[OutcomeState] = StreamFold("plan", OutcomeState)
"""``outcomes`` read model: the plan's last run, re-classified by the current rules."""


def _require(doc: OutcomeState | None) -> bool:
    found = doc.require_validation if doc is not None else UNSET
    return True if found is UNSET else found


@fold_outcome.on_any(PlanCreated)
def _created(doc: OutcomeState | None, p: PlanCreated) -> OutcomeState:
    return replace(doc or OutcomeState(), require_validation=p.global_config.require_validation)


@fold_outcome.on_any(ValidationRunStarted)
def _run_started(doc: OutcomeState | None, p: ValidationRunStarted) -> OutcomeState:
    halt = doc.halt if doc is not None and doc.halt is not UNSET else None
    return OutcomeState(
        plan_id=p.plan_id,
        run_id=p.run_id,
        attempt=p.attempt,
        results={},
        recorded=None,
        halt=halt,
        require_validation=_require(doc),
    )


@fold_outcome.on(ValidationResultRecorded)
def _result(doc: OutcomeState, p: ValidationResultRecorded) -> OutcomeState:
    if doc.run_id != p.run_id or doc.results is UNSET:
        return doc
    return replace(
        doc,
        results={
            **doc.results,
            p.attachment_id: OutcomeResult(
                validation=p.validation, mode=p.mode, verdict=p.verdict, cause=p.cause
            ),
        },
    )


@fold_outcome.on(ValidationRunCompleted)
def _run_completed(doc: OutcomeState, p: ValidationRunCompleted) -> OutcomeState:
    if doc.run_id != p.run_id or doc.results is UNSET:
        return doc
    outcome, raw, _reason = classify(
        (msgspec.to_builtins(r) for r in doc.results.values()), require_validation=_require(doc)
    )
    return replace(
        doc,
        recorded=RecordedOutcome(outcome=p.outcome, rules_version=p.rules_version),
        outcome=outcome,
        raw_halt_type=raw,
        rules_version=RULES_VERSION,
        drift=p.outcome != outcome,
    )


@fold_outcome.on_any(PlanHalted)
def _halted(doc: OutcomeState | None, p: PlanHalted) -> OutcomeState:
    return replace(
        doc or OutcomeState(),
        plan_id=p.plan_id,
        halt=OutcomeHalt(
            halt_type=p.halt_type,
            raw_halt_type=p.raw_halt_type,
            reclassified=canonical_halt(p.raw_halt_type),
        ),
    )
