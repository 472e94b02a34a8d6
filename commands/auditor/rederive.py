"""Re-derivation: each recorded verdict computed again from its recorded inputs — a
gate check from the checked bytes and the schema, a wrapped tool's result from its raw
output through its transform, a run's outcome from its results with today's rules."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from commands.rules.verdicts import truncated_deviation
from commands.runner.results import TransformError, apply_transform
from commands.schemas.checker import check
from commands.schemas.prepare import InvalidSchemaError
from ledger import LogReader, RecordedEvent
from ledger.events import (
    Deviation,
    GateChecked,
    ValidationResultRecorded,
    ValidationRunCompleted,
)
from projections.outcomes import RULES_VERSION, classify
from projections.states import PlanState, ToolState

from .deltas import same_json
from .findings import Findings, Reporting
from .walk import LogView, PlanWalk, Run

__all__ = ["Rederivation"]

_UNSEEN = object()
_MISSING = object()  # no blob under the digest
_SCHEMAS_KEPT = 1024
_VERDICTS_KEPT = 65536


class Rederivation(Reporting):
    def __init__(self, findings: Findings, store: LogReader, log: LogView) -> None:
        super().__init__(findings)
        self.store = store
        self.log = log
        # Schemas by digest, decoded once: a log's checks share a handful of them.
        self._schemas: dict[str, Any] = {}
        # (schema digest, checked bytes' digest) -> deviations: a call made again with
        # the same parameters is judged once.
        self._verdicts: dict[tuple[str, str], list[Deviation]] = {}

    def schema(self, digest: str) -> Any:
        """The schema stored under ``digest``, decoded (``_MISSING``: no such blob)."""
        found = self._schemas.get(digest, _UNSEEN)
        if found is _UNSEEN:
            data = self.store.get_blob(digest)
            found = _MISSING if data is None else msgspec.json.decode(bytes(data))
            if len(self._schemas) >= _SCHEMAS_KEPT:
                self._schemas.clear()  # digests an editor invented: never many kept
            self._schemas[digest] = found
        return found

    def check_outcome(
        self, plan_id: str, pos: int, run: Run, p: ValidationRunCompleted, doc: PlanState | None
    ) -> None:
        self.count("outcome")
        outcome, _raw, _reason = classify(
            (msgspec.to_builtins(r) for r in run.results),
            require_validation=doc.global_config.require_validation if doc is not None else True,
        )
        if outcome != p.outcome:
            self.violation(
                pos,
                plan_id,
                "outcome_drift",
                f"outcome {outcome} (rules v{RULES_VERSION})",
                f"recorded {p.outcome} (rules v{p.rules_version})",
            )
        vacuous = not any(r.mode == "required" for r in run.results)
        if vacuous != p.vacuous:
            self.violation(
                pos,
                plan_id,
                "no_vacuous_pass",
                f"the run is recorded vacuous={vacuous}",
                f"vacuous={p.vacuous}",
            )

    def check_gate(self, plan_id: str, pos: int, p: GateChecked, walk: PlanWalk) -> None:
        if p.schema_sha256 is None:
            return  # no declaration to check against (an invented tool, no output schema)
        self.count("gate_rederivation")
        deviations = self._rederived(plan_id, pos, p, p.schema_sha256, walk)
        if deviations is None:
            return  # a blob is missing: said
        verdict = "fail" if deviations else "pass"
        if verdict != p.verdict or list(deviations) != list(p.deviations):
            self.violation(
                pos,
                plan_id,
                "gate_rederivation",
                f"verdict {verdict} with {len(deviations)} deviation(s) {_pointers(deviations)}",
                f"recorded {p.verdict} with {len(p.deviations)} deviation(s) "
                f"{_pointers(p.deviations)}",
            )

    def judged(self, schema_sha256: str, checked_sha256: str) -> bool:
        """These bytes were checked against this schema already in the walk."""
        return (schema_sha256, checked_sha256) in self._verdicts

    def _rederived(
        self, plan_id: str, pos: int, p: GateChecked, digest: str, walk: PlanWalk
    ) -> list[Deviation] | None:
        """The deviations of the check's bytes against its schema, computed again (once
        for the same bytes and schema: the check is a function of the two); None when a
        blob is missing."""
        # A truncated output is never parsed: recorded so (checked_truncated), or the kept
        # bytes of a call whose stdout went over its cap, checked as its output.
        truncated = (
            p.checked_truncated
            if p.checked_truncated is not msgspec.UNSET
            else walk.truncated.get((p.step, p.checked_sha256))
            if p.gate == "output"
            else None
        )
        key = (digest, p.checked_sha256)
        if truncated is None and key in self._verdicts:
            return self._verdicts[key]
        schema = self.schema(digest)
        checked = self.store.get_blob(p.checked_sha256) if p.checked_sha256 else None
        if schema is _MISSING or checked is None:
            missing = "schema" if schema is _MISSING else "checked bytes"
            self.violation(
                pos,
                plan_id,
                "gate_rederivation",
                f"the gate's {missing} are in the blob store",
                f"blob {digest if schema is _MISSING else p.checked_sha256} is missing",
            )
            return None
        if truncated is None:
            try:
                deviations = check(schema, bytes(checked), schema_sha256=digest)
            except InvalidSchemaError as exc:  # a forged blob: reported, the walk goes on
                self.violation(
                    pos,
                    plan_id,
                    "gate_rederivation",
                    "the gate's schema is a JSON Schema the checker compiles",
                    f"blob {digest} does not compile: {exc}"[:500],
                )
                return None
            if len(self._verdicts) >= _VERDICTS_KEPT:
                self._verdicts.clear()
            self._verdicts[key] = deviations
            return deviations
        if len(checked) != truncated.kept:
            self.violation(
                pos,
                plan_id,
                "gate_rederivation",
                f"the checked bytes are the {truncated.kept} bytes kept of a truncated output",
                f"{len(checked)} bytes",
            )
        return [truncated_deviation(truncated)]

    def transform_of(self, p: ValidationResultRecorded, run: Run) -> str | None:
        """The transform of the wrapped tool whose result ``p`` is (None: no wrapper)."""
        member = next((r for r in run.resolved if r.attachment_id == p.attachment_id), None)
        tool = self.log.policy_docs().get(f"tool:{p.validation}")
        spec = (
            tool.versions.get(str(member.validation_version))
            if member is not None and isinstance(tool, ToolState)
            else None
        )
        transform = spec.transform if spec is not None and spec.wraps else None
        return transform if isinstance(transform, str) and transform else None

    def check_transform(
        self, plan_id: str, event: RecordedEvent, p: ValidationResultRecorded, run: Run | None
    ) -> None:
        if run is None or p.raw_output_sha256 is None:
            return
        transform = self.transform_of(p, run)
        if transform is None:
            return
        if p.verdict is None and p.cause != "malformed":
            return  # it never reached the transform (timeout, crash, missing program)
        self.count("transform_rederivation")
        if p.stdout_truncated is not msgspec.UNSET:  # never transformed: no verdict
            if p.verdict is not None:
                self.violation(
                    event.position,
                    plan_id,
                    "transform_rederivation",
                    "no verdict: the wrapped tool's stdout was truncated at "
                    f"{p.stdout_truncated.kept} bytes (never transformed)",
                    f"passed={p.verdict} message={p.message!r}",
                )
            return
        raw = self.store.get_blob(p.raw_output_sha256)
        if raw is None:  # the input of the re-derivation is gone: a finding, not a skip
            self.violation(
                event.position,
                plan_id,
                "evidence",
                f"the raw output {p.validation}'s transform ran on is in the blob store",
                f"blob {p.raw_output_sha256} is missing",
            )
            return
        self.rerun_transform(plan_id, event, p, transform, bytes(raw))

    def rerun_transform(
        self,
        plan_id: str,
        event: RecordedEvent,
        p: ValidationResultRecorded,
        transform: str,
        raw: bytes,
    ) -> None:
        """The transform run again on the raw output gives the recorded result."""
        recorded = (
            f"passed={p.verdict} message={p.message!r}"
            if p.verdict is not None
            else f"no verdict ({p.cause})"
        )
        try:
            result = apply_transform(transform, msgspec.json.decode(raw))
        except (TransformError, msgspec.DecodeError) as exc:
            if p.verdict is not None:
                self.violation(
                    event.position,
                    plan_id,
                    "transform_rederivation",
                    f"the transform fails on the raw output ({exc})",
                    recorded,
                )
            return
        derived = (result["passed"], result.get("message"), result.get("data"))
        if not same_json(list(derived), [p.verdict, p.message, p.data]):  # true is no 1
            self.violation(
                event.position,
                plan_id,
                "transform_rederivation",
                f"passed={derived[0]} message={derived[1]!r}",
                recorded,
            )


def _pointers(deviations: Iterable[Any]) -> str:
    found = [f"{d.kind}@{d.pointer or '/'}" for d in deviations]
    return "[" + ", ".join(found[:5]) + (", …" if len(found) > 5 else "") + "]"
