"""``evidence run``: drive a whole plan from a plan file, with real programs.

Registers what the file declares (idempotently), creates the plan, and in the plan's
**sandbox** (``commands.runner.sandbox``: a copy of each directory resource) drives Strategize
-> Execute (every step through both gates, the tool run in the sandbox) -> validations
(in the sandbox) -> the failure loop
with the file's fixes and strategy revisions -> pass -> token -> **Apply**, which copies
the sandbox back onto the resource only with a valid token. On an escalation it stops;
``resume`` continues after the human decision. The run's own bookkeeping (plan file,
its location) is a small ``run.json`` beside the sandboxes; the plan's state always
comes from the ledger.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

import msgspec

from commands.names import check_relative_path, inside
from commands.runner.process import output_cap, run_command
from ledger.canonical import canonical_json
from ledger.events import (
    CompensationCompleted,
    SkillDefined,
    ToolRegistered,
    ValidationRegistered,
)
from ledger.intake import InputError, parse_json, read_bytes
from ledger.verify import verify_store
from projections.states import PlanState

from .attachments import attach
from .core import CommandRefused, Plane, StreamState
from .lifecycle import apply_plan, complete_apply, record_fix
from .phases import enter_execute, record_strategy
from .planfile import PlanFile, load_plan_file
from .plans import create_plan
from .registry import define_skill, register_tool, register_validation
from .runs import call_tool, validate_plan

Say = Callable[[str, str], None]  # (stage, message)


@dataclass
class RunSummary:
    plan_id: str
    outcome: str | None
    state: str  # applied | escalated | halted | compensated | failed
    token: str | None = None
    decision_id: str | None = None
    halt: dict[str, Any] | None = None
    positions: list[int] = field(default_factory=list)
    verify_ok: bool = False
    tree_head: str = ""
    ledger: str = ""
    changed_paths: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _quiet(_stage: str, _message: str) -> None:
    pass


def run_plan_file(
    plane: Plane, path: Path, *, plan_id: str | None = None, say: Say = _quiet
) -> RunSummary:
    path = path.resolve()
    pf = load_plan_file(path)
    plan_id = plan_id or pf.plan.id
    base = path.parent
    resources = [_resource(r, base) for r in pf.plan.resources]
    plane.projections.catch_up()
    if plane.projections.document("plans", plan_id) is not None:
        raise CommandRefused(
            f"plan {plan_id!r} already exists: continue it with "
            f"`evidence run --resume {plan_id}` or give --plan-id"
        )
    _preflight(plane, pf, plan_id, resources, base)
    start = plane.store.head().size
    _declare(plane, pf, plan_id, resources, base, say)
    run_dir = _run_dir(plane, plan_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps({"plan_file": str(path)}))
    return _drive(plane, pf, plan_id, start, say)


def resume(plane: Plane, plan_id: str, *, say: Say = _quiet) -> RunSummary:
    run_dir = _run_dir(plane, plan_id)
    try:
        state = parse_json(read_bytes(run_dir / "run.json", "document"), "run.json")
        plan_file = state.get("plan_file") if isinstance(state, dict) else None
    except InputError:
        plan_file = None
    if not isinstance(plan_file, str):
        raise CommandRefused(
            f"no run of plan {plan_id!r} under {run_dir.parent} "
            "(give the same --workdir as the run)"
        )
    pf = load_plan_file(Path(plan_file))
    start = plane.store.head().size
    plan = plane.state(f"plan:{plan_id}").of(PlanState)
    if plan is not None and plan.applying is not None:  # killed during Apply
        return _applied(plane, plan_id, complete_apply(plane, plan_id), start, say)
    return _drive(plane, pf, plan_id, start, say)


def _run_dir(plane: Plane, plan_id: str) -> Path:
    """A plan's run bookkeeping (``run.json``), next to the sandboxes, named by the digest
    of its id: a name never becomes a path (``x/../../victim`` stays inside)."""
    return plane.sandboxes / "runs" / sha256(plan_id.encode("utf-8")).hexdigest()[:32]


def _sandbox(plane: Plane, plan_id: str) -> dict[str, Path]:
    return plane.sandbox(_plan(plane, plan_id)).ensure().copies


def _plan(plane: Plane, plan_id: str) -> PlanState:
    return plane.state(f"plan:{plan_id}").existing(PlanState)


def _resource(value: str, base: Path) -> str:
    """A resource naming a path relative to the plan file becomes that absolute path."""
    candidate = (base / value).resolve()
    return str(candidate) if candidate.exists() else value


def _declare(
    plane: Plane, pf: PlanFile, plan_id: str, resources: list[str], base: Path, say: Say
) -> None:
    """Registrations, the plan and its attachments, as the file declares them."""
    _register(plane, pf, say)
    create_plan(
        plane,
        plan_id,
        project=pf.plan.project,
        resources=resources,
        config=pf.plan.global_config,
        skills=pf.plan.skills,
    )
    say("plan", f"{plan_id} created (project {pf.plan.project})")
    for entry in pf.attachments:
        _attach_once(
            plane,
            entry.validation,
            _resource(entry.resource, base),
            entry.scope,
            pf.plan.project,
            plan_id,
            entry.args,
            say,
        )


def _preflight(plane: Plane, pf: PlanFile, plan_id: str, resources: list[str], base: Path) -> None:
    """Declare everything first in a scratch ledger seeded with this ledger's registry:
    a mistake anywhere in the file is refused before the real ledger sees any of it —
    a fix path that would leave its resource (through a symlink in it, say) included."""
    root = next((Path(r) for r in resources if os.path.isdir(r)), None)
    for strategy in pf.agent.strategies:
        for attempt in strategy.attempts:
            if attempt.fix and attempt.fix.files and root is None:
                raise CommandRefused("a fix with files needs a directory resource")
            for relative in attempt.fix.files if attempt.fix else ():
                inside(root, relative)  # type: ignore[arg-type]
    with (
        tempfile.TemporaryDirectory(prefix="evidence-preflight-") as tmp,
        Plane.open(f"sqlite:///{Path(tmp) / 'preflight.db'}") as scratch,
    ):
        for doc in plane.projections.documents("tools"):
            kind = ValidationRegistered if doc.kind == "validation" else ToolRegistered
            payload = msgspec.convert(
                {**msgspec.to_builtins(doc.spec), "name": doc.name, "version": doc.version}, kind
            )
            scratch.append(scratch.state(f"tool:{doc.name}"), [payload])
        for skill in plane.projections.documents("skills"):
            defined = SkillDefined(**msgspec.to_builtins(skill))
            scratch.append(scratch.state(f"skill:{skill.name}"), [defined])
        _declare(scratch, pf, plan_id, resources, base, _quiet)


def _register(plane: Plane, pf: PlanFile, say: Say) -> None:
    for spec in pf.tools:
        done = register_tool(plane, spec)
        say(
            "register",
            f"tool {done.name} v{done.version}" + ("" if done.changed else " (unchanged)"),
        )
    for spec in pf.validations:
        done = register_validation(plane, spec)
        say(
            "register",
            f"validation {done.name} v{done.version}" + ("" if done.changed else " (unchanged)"),
        )
    for spec in pf.skills:
        done = define_skill(plane, spec)
        say("register", f"skill {done.name} v{done.version}")


def _attach_once(
    plane: Plane,
    validation: str,
    resource: str,
    scope: str,
    project: str,
    plan_id: str,
    args: dict[str, Any],
    say: Say,
) -> None:
    """Attach unless an identical attachment is already in force (running a file twice
    must not duplicate them)."""
    digest = sha256(canonical_json(args)).hexdigest()
    wanted = {
        "validation": validation,
        "resource": resource,
        "scope": scope,
        "project": project if scope == "project" else None,
        "plan": plan_id if scope == "plan" else None,
        "args_sha256": digest,
    }
    for doc in plane.projections.documents("attachments", lambda t: t.c.resource == resource):
        if (
            doc is not None
            and doc.status == "attached"
            and all(getattr(doc, k) == v for k, v in wanted.items())
        ):
            say("attach", f"{validation} on {resource} ({scope}) already attached")
            return
    attach(
        plane,
        validation,
        resource=resource,
        args=args,
        project=wanted["project"],
        plan=wanted["plan"],
    )
    say("attach", f"{validation} on {resource} ({scope})")


def _drive(plane: Plane, pf: PlanFile, plan_id: str, start: int, say: Say) -> RunSummary:
    strategies = pf.agent.strategies
    while True:
        doc = _plan(plane, plan_id)
        if doc.terminal is not None or doc.pending_decision is not None:
            return _summary(plane, plan_id, doc, start)
        if doc.phase == "strategize":
            strategy = strategies[min(doc.revision, len(strategies) - 1)]
            record_strategy(plane, plan_id, strategy.strategy)
            doc = enter_execute(plane, plan_id)
            say("strategize", f"revision {doc.revision}: {strategy.strategy}")
        sandbox = _sandbox(plane, plan_id)  # the plan's, as for every entry point
        strategy = strategies[min(doc.revision, len(strategies) - 1)]
        attempt = strategy.attempts[min(doc.retries_used, len(strategy.attempts) - 1)]
        say("execute", f"attempt {doc.attempt}")
        for step in attempt.steps:
            if not _run_step(plane, pf, plan_id, step, sandbox, say):
                return _summary(plane, plan_id, _plan(plane, plan_id), start)
        if _plan(plane, plan_id).needs_fix:
            # The file scripts no fix for the failed attempt: this attempt's steps are the
            # agent's fix, and the failure loop records one before it re-validates.
            names = ", ".join(step.step for step in attempt.steps) or "no steps"
            record_fix(plane, plan_id, f"attempt {doc.attempt}: re-ran {names}")
            say("fix", f"re-ran {names}")
        report = validate_plan(plane, plan_id, sandbox=sandbox)
        for r in report.results:
            verdict = (
                ("pass" if r.verdict else "FAIL")
                if r.verdict is not None
                else f"no verdict ({r.cause})"
            )
            say(
                "validate",
                f"{r.validation} [{r.mode}]: {verdict}" + (f" — {r.message}" if r.message else ""),
            )
        say("outcome", report.outcome)
        if report.outcome == "pass":
            return _apply(plane, plan_id, report.token or "", start, say)
        if report.outcome != "blocker":
            return _summary(plane, plan_id, _plan(plane, plan_id), start)
        doc = _plan(plane, plan_id)
        if doc.phase == "execute" and doc.pending_decision is None and attempt.fix:
            _apply_fix(plane, plan_id, attempt.fix.note, attempt.fix.files, doc, sandbox)
            say("fix", attempt.fix.note)


def _run_step(
    plane: Plane, pf: PlanFile, plan_id: str, step: Any, sandbox: dict[str, Path], say: Say
) -> bool:
    """One step through both gates; the critique loop re-proposes it until it passes or
    the plane halts the plan. False when the plan cannot go on."""
    while True:
        report = call_tool(
            plane,
            plan_id,
            step.tool,
            step.params,
            step=step.step,
            output_schema=step.output,
            sandbox=sandbox,
        )
        if report.ok:
            say("step", f"{step.step}: {step.tool} passed both gates")
            return True
        gate = report.input_gate if not report.input_gate.passed else report.output_gate
        if report.halt is not None or gate is None:
            say("halt", report.halt.reason if report.halt else "the call could not run")
            return False
        say(
            "step",
            f"{step.step}: {gate.check.gate} gate failed "
            f"({len(gate.check.deviations)} deviation(s)), routed {gate.routed}",
        )
        if gate.routed == "compensation":
            _compensate(plane, plan_id, pf.agent.compensation, sandbox, say)
            return False
        if gate.routed == "halted":
            return False


def _apply_fix(
    plane: Plane,
    plan_id: str,
    note: str,
    files: dict[str, str],
    doc: PlanState,
    sandbox: dict[str, Path],
) -> None:
    root = next((sandbox[r] for r in doc.resources if r in sandbox), None)
    diff = []
    for relative, content in sorted(files.items()):
        if root is None:
            raise CommandRefused("a fix with files needs a directory resource")
        target = inside(root, check_relative_path(relative, "fix path"))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        diff.append(f"--- {relative}\n{content}")
    record_fix(plane, plan_id, note, diff="\n".join(diff).encode() if diff else None)


def _compensate(
    plane: Plane, plan_id: str, commands: list[list[str]], sandbox: dict[str, Path], say: Say
) -> None:
    cwd = next(iter(sandbox.values()), None)
    codes, output = [], b""
    for argv in commands:
        # Bounded like every program the plane runs (the output cap, the process group
        # killed on timeout); what was cut is noted in the recorded output.
        done = run_command(argv, cwd=cwd, timeout_s=120, max_output_bytes=output_cap())
        codes.append(done.exit_code if done.exit_code is not None else -1)
        output += done.stdout + done.stderr
        for name, cut in (("stdout", done.stdout_truncated), ("stderr", done.stderr_truncated)):
            if cut is not None:
                output += (
                    f"\n[{argv[0]}: {name} truncated at {cut.kept} of {cut.size} "
                    f"bytes, sha256 {cut.sha256}]\n"
                ).encode()
        if done.error:
            output += f"{argv[0]}: {done.error}\n".encode()
        say("compensate", f"{' '.join(argv)} -> exit {codes[-1]}")

    def decide(state: StreamState) -> list[CompensationCompleted]:
        plan = state.of(PlanState)
        compensation = plan.compensation if plan is not None else None
        if compensation is None or compensation.status != "requested":
            raise CommandRefused(f"plan {plan_id} has no compensation requested")
        return [
            CompensationCompleted(
                plan_id=plan_id,
                succeeded=all(c == 0 for c in codes),
                exit_codes=codes,
                output_sha256=sha256(output).hexdigest(),
            )
        ]

    plane.run(f"plan:{plan_id}", decide, blobs=[output])


def _apply(plane: Plane, plan_id: str, token: str, start: int, say: Say) -> RunSummary:
    """The plane's Apply: the change set recorded first, then the files, then
    ``plan.applied`` (``complete_apply`` finishes one a crash interrupted)."""
    doc = apply_plan(plane, plan_id, token)
    return _applied(plane, plan_id, doc, start, say, token)


def _applied(
    plane: Plane, plan_id: str, doc: PlanState, start: int, say: Say, token: str | None = None
) -> RunSummary:
    changed = sorted(
        f"{Path(f.resource).name}/{f.path}"
        for f in (doc.applied.files if doc.applied is not None else [])
    )
    say("apply", f"{len(changed)} file(s) changed: {', '.join(changed) or '-'}")
    summary = _summary(plane, plan_id, doc, start)
    summary.token, summary.changed_paths = token, changed
    return summary


def _summary(plane: Plane, plan_id: str, doc: PlanState, start: int) -> RunSummary:
    state = (
        "applied"
        if doc.terminal == "applied"
        else "escalated"
        if doc.pending_decision
        else "compensated"
        if doc.compensation
        else "failed"
        if doc.terminal == "failed"
        else "halted"
    )
    report = verify_store(plane.store)
    return RunSummary(
        plan_id=plan_id,
        outcome=doc.last_outcome,
        state=state,
        decision_id=doc.pending_decision.decision_id if doc.pending_decision else None,
        halt=msgspec.to_builtins(doc.halt),
        positions=[start + 1, report.size],
        verify_ok=report.ok,
        tree_head=f"{report.size}:{report.root}",
        ledger=plane.store.url,
    )
