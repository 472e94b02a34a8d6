"""The structural gates: input gate before a call, output gate before its result counts.

Deviation is failure: nothing is coerced, dropped or filled, and every check — pass or
fail — is a ``gate.checked`` event with every deviation, the schema's SHA-256 and the
digest of the exact bytes checked (kept in the blob store with the schema, so an auditor
can re-run the check). A failure is routed in the same append, by the plan's
``strict_mode`` (fixed in its global_config):

- off: the iteration fails (``plan.attempt_failed``, class ``model_behavior``) and the
  critique loop retries in the next iteration while the iteration is below
  ``max_iterations``. At the bound the attempt has failed, and the failure loop takes
  it as it takes a failed validation past its retries: a strategy revision (back to
  Strategize, fresh iterations) while ``max_strategy_revisions`` allow, then an
  escalation to a human (a pending decision and a non-terminal ``escalate`` halt).
  Never a terminal halt: only ``strict_mode`` makes a deviation terminal.
- on: the first deviation is terminal: ``plan.compensation_requested`` and a halt (raw
  ``structural_deviation``, canonical ``blocker``).

Checks happen only in Execute; anywhere else the command is refused and nothing is
appended.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from commands.rules.verdicts import truncated_deviation
from commands.schemas.checker import check, json_type
from commands.schemas.prepare import InvalidSchemaError, prepare_schema
from ledger import RecordedEvent
from ledger.canonical import canonical_json
from ledger.events import (
    AttemptFailed,
    CompensationRequested,
    Deviation,
    EventPayload,
    GateChecked,
    PlanHalted,
    StrategyRevisionRequested,
    ToolCalled,
    Truncation,
)
from ledger.intake import check_json_value
from projections.states import PlanState, StepState

from . import tracing
from .authority import Authority
from .core import CommandRefused, Plane, StreamState
from .failure_loop import after_iterations
from .phases import require_execute, require_no_pending_decision, require_plan

# retry: the next iteration; revised: back to Strategize; escalated: a human decides;
# compensation: strict_mode ended the plan.
Routed = Literal["retry", "revised", "escalated", "compensation"]

# A tool that declares no input schema takes no parameters: its gate is the closed empty
# object (the registry closes schemas; "nothing declared" must not mean "anything").
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass
class GateOutcome:
    """What a gate check decided and how a failure was routed."""

    check: GateChecked
    routed: Routed | None
    events: list[RecordedEvent] = field(default_factory=list)
    # Iterations the attempt has left after this check (the critique loop's bound).
    iterations_left: int | None = None
    # False for a check found in the log rather than appended by this call (a post-tool
    # hook's input gate is its pre-tool hook's check).
    recorded: bool = True

    @property
    def passed(self) -> bool:
        return self.check.verdict == "pass"

    def to_json(self) -> dict[str, Any]:
        return {
            **msgspec.to_builtins(self.check),
            "routed": self.routed,
            "iterations_left": self.iterations_left,
            "positions": [e.position for e in self.events],
        }


def routing_line(outcome: GateOutcome) -> str:
    """How a failed check was routed, as people read it (with what is left of the
    critique loop's iterations): the last line of the CLI's, the hooks' and the MCP
    proxy's refusal alike, so one function says it for all of them."""
    if outcome.routed == "compensation":
        return "routed: strict_mode; compensation requested, the plan halted (blocker)"
    if outcome.routed == "revised":
        return (
            "routed: the attempt's iterations are spent (max_iterations); the plan is back "
            "in Strategize for a strategy revision"
        )
    if outcome.routed == "escalated":
        return (
            "routed: the attempt's iterations and the strategy revisions are spent; "
            "escalated, a human decides (evidence authorize)"
        )
    left = outcome.iterations_left or 0
    return f"routed: retry in the next iteration ({left} iteration(s) left in this attempt)"


def as_bytes(value: bytes | str | Any) -> bytes:
    """The exact bytes to check: raw JSON as produced, or a Python value encoded."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")  # a lone surrogate: not UTF-8
    try:  # msgspec writes NaN as null: refuse what has no JSON form instead
        return msgspec.json.encode(check_json_value(value, "the value to check"))
    except (TypeError, RecursionError) as exc:
        raise CommandRefused(f"the value to check has no JSON form ({exc})") from None


def gate_input(
    plane: Plane,
    plan_id: str,
    tool: str,
    params: bytes | str | Any,
    *,
    step: str | None = None,
    actor: str = "agent",
    call_follows: bool = False,
) -> GateOutcome:
    """Tool identity and parameters against the tool's registered (closed) schema.

    ``call_follows``: the caller makes the call when the check passes and records it
    at once (``call_tool``, the MCP doors): a passing check is then flushed to disk
    with that record, one flush a call (``Plane.run``'s ``deferrable``)."""
    started = tracing.now_ns()
    raw = as_bytes(params)
    found = plane.log().tool(tool)  # the registered schema, from the log
    refine: Refine | None = None
    if found is None:
        deviations = [
            Deviation(
                pointer="",
                kind="invented_tool",
                expected=("a registered tool"),
                actual_type="absent",
            )
        ]
        schema, digest, version = None, None, None
    else:
        spec = found.spec
        # As registered, booleans and {} included (`false`: nothing passes); no schema at
        # all: no parameters.
        schema = NO_PARAMETERS if spec.input_schema is None else spec.input_schema
        digest = spec.input_schema_sha256 if spec.input_schema is not None else None
        digest = digest or _sha256_of(schema)
        version = found.version
        deviations = check(schema, raw, schema_sha256=digest)
        registered = found.version

        def refine(plan: PlanState) -> tuple[Any, dict[str, Any]] | None:
            # Outside the plan's skills: refused whatever its parameters (judged under
            # the ledger lock, from the plan the check is appended to).
            if plan.may_call(tool):
                return None
            return None, {
                "tool_version": registered,
                "schema_sha256": None,
                "deviations": [not_in_skill(plan)],
            }

    return _record(
        plane,
        plan_id,
        raw,
        schema,
        actor=actor,
        fields={
            "gate": "input",
            "tool": tool,
            "tool_version": version,
            "step": step,
            "schema_sha256": digest,
            "deviations": deviations,
        },
        refine=refine,
        started_ns=started,
        call_follows=call_follows,
    )


def not_in_skill(plan: PlanState) -> Deviation:
    """The input gate's deviation for a registered tool outside the plan's skills."""
    skills = sorted(plan.skill_pins) if plan.skill_pins is not msgspec.UNSET else []
    return Deviation(
        pointer="",
        kind="not_in_skill",
        expected=f"a tool or validation of the plan's skills ({', '.join(skills) or 'none'})",
        actual_type="absent",
    )


def gate_output(
    plane: Plane,
    plan_id: str,
    step: str,
    output: bytes | str | Any,
    *,
    schema: Any = None,
    actor: str = "agent",
    truncated: Truncation | None = None,
    call: ToolCalled | None = None,
    call_blobs: Sequence[bytes] = (),
    instead_of_registered: bool = False,
) -> GateOutcome:
    """The returned structure against the output schema of the tool the step's input
    gate passed, then against ``schema`` when the step declares one: a step's schema
    only narrows (two checks, each recorded; the first that fails is the answer).
    ``instead_of_registered``: ``schema`` alone judges (the caller checked the registered
    one already, or judges a tool's own error as the MCP result it is).

    ``call``: the call that returned ``output``, appended in the same transaction just
    before the check (with ``call_blobs``): a call is never on the record without the
    verdict on its output.

    ``truncated``: ``output`` is the kept prefix of a tool's stdout that went over its
    cap. It is never parsed — a prefix may happen to be a valid document that is not the
    one printed — and fails as not JSON (``truncated_deviation``); the event records it
    (``checked_truncated``) so an auditor re-derives the same verdict."""
    started = tracing.now_ns()
    raw = as_bytes(output)
    log = plane.log()
    plan = log.state(f"plan:{plan_id}").of(PlanState)
    step_tool: StepState | None = plan.steps.get(step) if plan is not None else None
    first: GateOutcome | None = None
    narrows = schema is not None and not instead_of_registered
    if narrows and _tool_output_schema(log, step_tool)[0] is not None:
        first = gate_output(
            plane, plan_id, step, raw, actor=actor, truncated=truncated,
            call=call, call_blobs=call_blobs,
        )  # fmt: skip
        if not first.passed:
            return first
        call, call_blobs = None, ()
    tool = step_tool.tool if step_tool is not None else ""
    digest: str | None
    if schema is not None:
        try:
            prepared = prepare_schema(schema)
        except InvalidSchemaError as exc:
            raise CommandRefused(f"--schema: {exc}") from None
        declared, digest = prepared.normalised, prepared.sha256
    else:
        declared, digest = _tool_output_schema(log, step_tool)
    if declared is None:
        deviations = [
            Deviation(
                pointer="",
                kind="no_output_declaration",
                expected=f"an output declaration for step {step!r}",
                actual_type="invalid_json" if truncated else _json_type_of(raw),
            )
        ]
    elif truncated is not None:
        deviations = [truncated_deviation(truncated)]
    else:
        deviations = check(declared, raw, schema_sha256=digest)
    extra = {} if truncated is None else {"checked_truncated": truncated}
    outcome = _record(
        plane,
        plan_id,
        raw,
        declared,
        actor=actor,
        before=[call] if call is not None else [],
        blobs=call_blobs,
        fields={
            "gate": "output",
            "tool": tool,
            "tool_version": step_tool.tool_version if step_tool is not None else None,
            "step": step,
            "schema_sha256": digest,
            "deviations": deviations,
            **extra,
        },
        started_ns=started,
    )
    if first is not None:  # what this call appended: both checks
        outcome = dataclasses.replace(outcome, events=[*first.events, *outcome.events])
    return outcome


def _tool_output_schema(log: Authority, step_tool: StepState | None) -> tuple[Any, str | None]:
    if step_tool is None:
        return None, None
    spec = log.tool_version(step_tool.tool, step_tool.tool_version)
    if spec is None:
        return None, None
    if spec.output_schema is None:
        return None, None
    return spec.output_schema, spec.output_schema_sha256


# What the plan under the ledger lock changes of a check prepared before it: the schema
# the check used and the fields it replaces (None: nothing).
Refine = Callable[[PlanState], "tuple[Any, dict[str, Any]] | None"]


def _record(
    plane: Plane,
    plan_id: str,
    raw: bytes,
    schema: Any,
    *,
    actor: str,
    fields: dict[str, Any],
    before: Sequence[EventPayload] = (),
    blobs: Sequence[bytes] = (),
    refine: Refine | None = None,
    started_ns: int = 0,
    call_follows: bool = False,
) -> GateOutcome:
    """Append the check (after ``before``, in one transaction) and what it routes to,
    each routed event caused by the check. ``refine`` sees the plan as the transaction
    folds it, and may replace the check's schema and fields. Traced as ``gate input``
    or ``gate output`` (``tracing``), from ``started_ns``."""
    with tracing.operation(
        f"gate {fields['gate']}",
        lambda: {
            "evidence.operation": f"gate_{fields['gate']}",
            "evidence.plan.id": plan_id,
            "evidence.step": fields["step"],
            "gen_ai.tool.name": fields["tool"] or None,
        },
        records=GateChecked.type_name(),
        started_ns=started_ns,
    ) as op:
        outcome = _append_check(
            plane, plan_id, raw, schema, actor=actor, fields=fields, before=before,
            blobs=blobs, refine=refine, call_follows=call_follows,
        )  # fmt: skip
        if op is not None:
            op.set(
                {
                    "evidence.gate.verdict": outcome.check.verdict,
                    "evidence.gate.deviations": len(outcome.check.deviations),
                    "evidence.gate.routed": outcome.routed,
                }
            )
        return outcome


def _append_check(
    plane: Plane,
    plan_id: str,
    raw: bytes,
    schema: Any,
    *,
    actor: str,
    fields: dict[str, Any],
    before: Sequence[EventPayload],
    blobs: Sequence[bytes],
    refine: Refine | None,
    call_follows: bool,
) -> GateOutcome:
    decided: dict[str, Any] = {}

    def decide(state: StreamState) -> list[EventPayload]:
        doc = require_plan(state, plan_id)
        require_no_pending_decision(doc, plan_id)
        require_execute(doc, plan_id, "gate checks happen")
        used, found = schema, fields
        changed = refine(doc) if refine is not None else None
        if changed is not None:
            used, found = changed[0], {**fields, **changed[1]}
        verdict: Literal["pass", "fail"] = "fail" if found["deviations"] else "pass"
        config = doc.global_config
        attempt, iteration = doc.attempt, doc.iteration
        checked = GateChecked(
            plan_id=plan_id,
            verdict=verdict,
            attempt=attempt,
            iteration=iteration,
            strict_mode=config.strict_mode,
            checked_sha256=sha256_hex(raw),
            **found,
        )
        tool_error = any(isinstance(e, ToolCalled) and e.tool_error is True for e in before)
        routed, events = _route(checked, doc, len(found["deviations"]), tool_error)
        left = config.max_iterations - iteration if routed == "retry" else 0
        decided.update(
            check=checked,
            routed=routed,
            left=None if routed is None else left,
            kept=[*blobs, raw] if used is None else [*blobs, raw, canonical_json(used)],
        )
        return [*before, checked, *events]

    recorded = plane.run(
        f"plan:{plan_id}",
        decide,
        actor=actor,
        blobs=lambda: decided["kept"],
        caused_by=len(before),
        # A passing input check whose call follows reaches the disk with the call's
        # record (one flush a call); anything routed, or a check no call follows, now.
        deferrable=(lambda _: decided["routed"] is None) if call_follows else None,
    )
    return GateOutcome(
        decided["check"], decided["routed"], recorded[len(before) :], decided["left"]
    )


def _route(
    checked: GateChecked, doc: PlanState, count: int, tool_error: bool = False
) -> tuple[Routed | None, list[EventPayload]]:
    """What a check leads to: nothing for a pass; a failed iteration for a deviation —
    or for a call whose tool answered an error of its own (``isError``), which passes
    its gate as the MCP result it is but fails the call: every failure spends from the
    attempt's ``max_iterations``, so no error is an endless try."""
    if checked.verdict == "pass" and not tool_error:
        return None, []
    config = doc.global_config
    plan_id, attempt, iteration = checked.plan_id, checked.attempt, checked.iteration
    where = f"{checked.gate} gate ({checked.tool or checked.step})"
    if checked.verdict == "pass":
        reason = f"the tool answered an error of its own (isError) at the {where}"
    else:
        reason = f"{count} structural deviation(s) at the {where}"
    if config.strict_mode and checked.verdict != "pass":
        return "compensation", [
            CompensationRequested(plan_id=plan_id, reason=reason),
            PlanHalted(
                plan_id=plan_id,
                halt_type="blocker",
                final_decision="blocker",
                raw_halt_type="structural_deviation",
                reason=reason + " (strict_mode)",
                phase="execute",
                attempt=attempt,
                terminal=True,
            ),
        ]
    failed = AttemptFailed(
        plan_id=plan_id,
        attempt=attempt,
        iteration=iteration,
        failure_class="model_behavior",
        reason=reason,
    )
    if iteration < config.max_iterations:
        return "retry", [failed]
    # The attempt's iterations are spent: the failure loop decides what comes next.
    exhausted = f"{reason}; iteration {iteration} of max_iterations {config.max_iterations}"
    loop = after_iterations(doc, exhausted)
    routed: Routed = "revised" if isinstance(loop[0], StrategyRevisionRequested) else "escalated"
    return routed, [failed, *loop]


def sha256_hex(data: bytes) -> str:
    """The SHA-256 of ``data``, in hex: how the gates' and calls' records name bytes."""
    return hashlib.sha256(data).hexdigest()


def _sha256_of(schema: Any) -> str:
    return sha256_hex(canonical_json(schema))


def _json_type_of(raw: bytes) -> str:
    try:
        return json_type(msgspec.json.decode(raw))
    except (msgspec.DecodeError, RecursionError):
        return "invalid_json"
