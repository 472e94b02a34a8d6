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
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

import jmespath.exceptions
import msgspec

from commands.names import check_relative_path, inside, looks_like_path
from commands.runner.confine import program_files
from commands.runner.process import output_cap, run_command, tree_digest
from commands.runner.results import RESULT_SCHEMA
from ledger.canonical import canonical_json
from ledger.events import (
    CompensationCompleted,
    SkillDefined,
    ToolRegistered,
    ValidationRegistered,
)
from ledger.intake import InputError, parse_json, read_bytes
from ledger.verify import verify_store
from projections.states import PlanState, ToolState

from .attachments import attach
from .confinement import config_policy, plan_policy, require_confinement, work_confinement
from .core import CommandRefused, Plane, StreamState
from .graph import Node, compile_expression, run_graph
from .lifecycle import apply_plan, complete_apply, record_fix
from .phases import enter_execute, record_strategy
from .planfile import Attempt, OutputSchemaOf, PlanFile, Step, load_plan_file, located
from .plans import create_plan, parse_global_config, plan_state
from .registry import define_skill, register_tool, register_validation
from .runs import MAX_PARALLEL, call_tool
from .validation_runs import ValidationReport, validate_plan

Say = Callable[[str, str], None]  # (stage, message)


@dataclass
class RunSummary:
    plan_id: str
    outcome: str | None
    state: str  # plans.plan_state: applied | compensated | failed | escalated | halted | open
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
    pf = load_plan_file(path, _registered_output(plane))
    plan_id = plan_id or pf.plan.id
    base = path.parent
    resources = []
    for i, resource in enumerate(pf.plan.resources):
        with located(path, ("plan", "resources", i)):
            resources.append(_resource(resource, base))
    plane.projections.catch_up()
    if plane.projections.document("plans", plan_id) is not None:
        raise CommandRefused(
            f"plan {plan_id!r} already exists: continue it with "
            f"`evidence run --resume {plan_id}` or give --plan-id"
        )
    _preflight(plane, pf, plan_id, resources, base, path)
    # Every run starts programs: refused here, before the ledger sees anything, where
    # the kernel cannot confine them and the plan does not opt out.
    require_confinement(config_policy(parse_global_config(pf.plan.global_config)))
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
    pf = load_plan_file(Path(plan_file), _registered_output(plane))
    start = plane.store.head().size
    plan = plane.state(f"plan:{plan_id}").of(PlanState)
    if plan is not None and plan.applying is not None:  # killed during Apply
        return _applied(plane, plan_id, complete_apply(plane, plan_id), start, say)
    require_confinement(plan_policy(plan))
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
    """A resource naming a path relative to the plan file becomes that absolute path;
    one written as a path (``looks_like_path``) must exist."""
    candidate = (base / os.path.expanduser(value)).resolve()
    if candidate.exists():
        return str(candidate)
    if looks_like_path(value):
        raise CommandRefused(f"resource {value!r} is a path that does not exist ({candidate})")
    return value


def _declare(
    plane: Plane,
    pf: PlanFile,
    plan_id: str,
    resources: list[str],
    base: Path,
    say: Say,
    path: Path | None = None,
) -> None:
    """Registrations, the plan and its attachments, as the file declares them. With the
    file's ``path``, a refusal names the file, the entry's key and its line."""
    _register(plane, pf, say, path)
    with located(path, ("plan",)):
        create_plan(
            plane,
            plan_id,
            project=pf.plan.project,
            resources=resources,
            config=pf.plan.global_config,
            skills=pf.plan.skills,
        )
    say("plan", f"{plan_id} created (project {pf.plan.project})")
    for i, entry in enumerate(pf.attachments):
        with located(path, ("attachments", i, "resource")):
            resource = _resource(entry.resource, base)
        with located(path, ("attachments", i)):
            _attach_once(
                plane,
                entry.validation,
                resource,
                entry.scope,
                pf.plan.project,
                plan_id,
                entry.args,
                say,
            )


def _preflight(
    plane: Plane, pf: PlanFile, plan_id: str, resources: list[str], base: Path, path: Path
) -> None:
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
        _declare(scratch, pf, plan_id, resources, base, _quiet, path)


def _register(plane: Plane, pf: PlanFile, say: Say, path: Path | None = None) -> None:
    for i, spec in enumerate(pf.tools):
        with located(path, ("tools", i)):
            done = register_tool(plane, spec)
        say(
            "register",
            f"tool {done.name} v{done.version}" + ("" if done.changed else " (unchanged)"),
        )
    for i, spec in enumerate(pf.validations):
        with located(path, ("validations", i)):
            done = register_validation(plane, spec)
        say(
            "register",
            f"validation {done.name} v{done.version}" + ("" if done.changed else " (unchanged)"),
        )
    for i, spec in enumerate(pf.skills):
        with located(path, ("skills", i)):
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
        if attempt.is_graph:
            went_on = _run_graph(plane, pf, plan_id, attempt, sandbox, say)
        else:
            went_on = all(
                _run_step(plane, pf, plan_id, step, sandbox, say) for step in attempt.steps
            )
        if not went_on:
            if _plan(plane, plan_id).phase == "strategize":
                continue  # the attempt's iterations were spent: the failure loop revised it
            return _summary(plane, plan_id, _plan(plane, plan_id), start)
        if _plan(plane, plan_id).needs_fix:
            # The file scripts no fix for the failed attempt: this attempt's steps are the
            # agent's fix, and the failure loop records one before it re-validates.
            names = ", ".join(step.step for step in attempt.steps) or "no steps"
            record_fix(plane, plan_id, f"attempt {doc.attempt}: re-ran {names}")
            say("fix", f"re-ran {names}")
        report = validate_plan(plane, plan_id, sandbox=sandbox)
        _say_results(report, say)
        if report.outcome == "pass":
            return _apply(plane, plan_id, report.token or "", start, say)
        if report.outcome != "blocker":
            return _summary(plane, plan_id, _plan(plane, plan_id), start)
        doc = _plan(plane, plan_id)
        if doc.phase == "execute" and doc.pending_decision is None and attempt.fix:
            _apply_fix(plane, plan_id, attempt.fix.note, attempt.fix.files, doc, sandbox)
            say("fix", attempt.fix.note)


def _say_results(report: ValidationReport, say: Say) -> None:
    """Each validation's verdict, then the run's outcome."""
    for r in report.results:
        verdict = (
            ("pass" if r.verdict else "FAIL")
            if r.verdict is not None
            else f"no verdict ({r.cause})"
        )
        message = f" — {r.message}" if r.message else ""
        say("validate", f"{r.validation} [{r.mode}]: {verdict}{message}")
    say("outcome", report.outcome)


def _run_step(
    plane: Plane, pf: PlanFile, plan_id: str, step: Step, sandbox: dict[str, Path], say: Say
) -> bool:
    """One step of a linear attempt. False when the plan cannot go on."""
    status, _output = _call_step(plane, plan_id, step, step.params, sandbox, say)
    if status == "compensation":
        _compensate(plane, plan_id, pf.agent.compensation, sandbox, say)
    return status == "ok"


def _call_step(
    plane: Plane,
    plan_id: str,
    step: Step,
    params: dict[str, Any],
    sandbox: dict[str, Path],
    say: Say,
    stop: threading.Event | None = None,
) -> tuple[str, bytes | None]:
    """One step through both gates; the critique loop re-proposes it until it passes or
    the plane halts the plan (or, in a graph, another node stopped it: ``stop``).
    (``ok``, the output that passed) or (``stopped`` | ``compensation``, None)."""
    output_schema = step.output  # else the tool's (a validation's structured return)
    while True:
        if stop is not None and stop.is_set():
            return "stopped", None
        report = call_tool(
            plane,
            plan_id,
            step.tool,
            params,
            step=step.step,
            output_schema=output_schema,
            sandbox=sandbox,
        )
        if report.ok:
            say("step", f"{step.step}: {step.tool} passed both gates")
            return "ok", report.output
        if report.tool_failed:  # the tool's own error: not a deviation to critique
            say("halt", f"{step.step}: {step.tool} answered with an error of its own")
            return "stopped", None
        gate = report.input_gate if not report.input_gate.passed else report.output_gate
        if report.halt is not None or gate is None:
            say("halt", report.halt.reason if report.halt else "the call could not run")
            return "stopped", None
        say(
            "step",
            f"{step.step}: {gate.check.gate} gate failed "
            f"({len(gate.check.deviations)} deviation(s)), routed {gate.routed}",
        )
        if gate.routed == "compensation":
            return "compensation", None
        if gate.routed in ("revised", "escalated"):
            return "stopped", None  # the attempt's iterations are spent: the loop decides


def _registered_output(plane: Plane) -> OutputSchemaOf:
    """A registered tool's output schema as the output gate of a step calling it checks
    it, for the plan file's check of what ``from`` expressions read."""

    def output_schema_of(tool: str) -> Any:
        found = plane.log().tool(tool)
        if found is None:
            return None
        return RESULT_SCHEMA if found.kind == "validation" else found.spec.output_schema

    return output_schema_of


# -- actor graphs ------------------------------------------------------------------------


def _run_graph(
    plane: Plane,
    pf: PlanFile,
    plan_id: str,
    attempt: Attempt,
    sandbox: dict[str, Path],
    say: Say,
) -> bool:
    """The attempt's steps as an actor graph: a step runs once every step it needs has
    passed both gates, with its ``from`` parameters taken from their outputs;
    independent steps run concurrently. Each call is gated and recorded as a linear
    step's is. False when the plan cannot go on (no further step starts then; the ones
    running finish first).

    Concurrency, and why it is safe:
    - each worker thread appends through its own ``Plane`` on the same ledger (the
      ledger's lock orders the appends; every decision folds the plan inside it);
    - a validation is read-only (it runs in its own copy, writes void its result);
    - a tool that declares ``writes: true`` runs alone, in the sandbox;
    - any other tool runs in a private copy of the sandbox, thrown away afterwards: a
      tool that says it does not write must not change what the others see (nor can a
      failed call's restore of the sandbox undo another call's work)."""
    steps = {step.step: step for step in attempt.steps}
    log = plane.log()
    kinds = {name: _node_kind(log.tool(step.tool)) for name, step in steps.items()}
    nodes = [
        Node(name, frozenset(step.depends_on()), exclusive=kinds[name] == "writer")
        for name, step in steps.items()
    ]
    outputs: dict[str, Any] = {}
    stop, compensate = threading.Event(), threading.Event()
    lock = threading.Lock()
    workers = _WorkerPlanes(plane)

    def say_one(stage: str, message: str) -> None:
        with lock:  # lines from concurrent steps are never interleaved
            say(stage, message)

    def run(name: str) -> bool:
        step = steps[name]
        params = {**step.params, **_from_values(step, outputs, say_one)}
        worker = workers.get()
        try:
            with _node_sandbox(step, kinds[name], sandbox, say_one) as copies:
                status, output = _call_step(worker, plan_id, step, params, copies, say_one, stop)
        except CommandRefused:
            # Another step ended the plan while this one ran: the plan takes no event
            # after its end, so this call's record was refused. Anything else is an error.
            doc = worker.state(f"plan:{plan_id}").of(PlanState)
            if doc is None or (doc.terminal is None and doc.pending_decision is None):
                raise
            status, output = "stopped", None
        if status == "ok" and output is not None:
            outputs[name] = msgspec.json.decode(output)  # it passed the gate: JSON
            return True
        stop.set()
        if status == "compensation":
            compensate.set()
        return False

    try:
        went_on = run_graph(nodes, run, max_workers=MAX_PARALLEL if workers.parallel else 1)
    finally:
        workers.close()
    if compensate.is_set():  # once, after every running step finished
        _compensate(plane, plan_id, pf.agent.compensation, sandbox, say)
    return went_on


def _node_kind(tool: ToolState | None) -> str:
    """``validation`` (read-only), ``writer`` (declares ``writes: true``: runs alone) or
    ``reader`` (runs in a private copy of the sandbox); an unknown tool is a reader
    (its input gate refuses the call before anything runs)."""
    if tool is None:
        return "reader"
    if tool.kind == "validation":
        return "validation"
    return "writer" if tool.spec.writes else "reader"


class _WorkerPlanes:
    """One ``Plane`` per worker thread (a Plane is not shared across threads), opened on
    the same ledger as the run's and closed when the graph is done. An in-memory
    SQLite ledger cannot be opened twice: its graph runs on the run's own plane, one
    step at a time."""

    def __init__(self, plane: Plane) -> None:
        self.plane = plane
        self.url = plane.store.engine.url.render_as_string(hide_password=False)
        self.parallel = plane.store.url != "sqlite:///:memory:"
        self._local = threading.local()
        self._opened: list[Plane] = []
        self._lock = threading.Lock()

    def get(self) -> Plane:
        if not self.parallel:
            return self.plane
        worker: Plane | None = getattr(self._local, "plane", None)
        if worker is None:
            worker = Plane.open(self.url, create=False)
            worker.sandboxes = self.plane.sandboxes
            self._local.plane = worker
            with self._lock:
                self._opened.append(worker)
        return worker

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, []
        for worker in opened:
            worker.close()


def _from_values(step: Step, outputs: dict[str, Any], say: Say) -> dict[str, Any]:
    """The step's ``from`` parameters, each its expression over the outputs of the steps
    it needs. A null result is passed as null, and an expression that fails on these
    outputs (a function given the wrong type) gives null too, said here: the step's
    input gate judges the value, and a deviation is recorded, never hidden."""
    data = {"steps": {name: {"output": outputs[name]} for name in step.depends_on()}}
    values: dict[str, Any] = {}
    for param, expression in step.from_.items():
        try:
            values[param] = compile_expression(expression).search(data)
        except (jmespath.exceptions.JMESPathError, TypeError, ValueError) as exc:
            why = " ".join(str(exc).split())
            say("step", f"{step.step}: `from.{param}` failed ({why}); passed as null")
            values[param] = None
    return values


@contextmanager
def _node_sandbox(
    step: Step, kind: str, sandbox: dict[str, Path], say: Say
) -> Iterator[dict[str, Path]]:
    """Where a graph step works: the sandbox itself for a validation or a declared
    writer; a private copy of it for any other tool, removed afterwards (a change made
    there is said, and dropped: a tool declares ``writes: true`` to change the sandbox)."""
    if kind != "reader":
        yield sandbox
        return
    scratch = Path(tempfile.mkdtemp(prefix="evidence-node-"))
    try:
        copies = {resource: scratch / path.name for resource, path in sandbox.items()}
        for resource, copy in copies.items():
            shutil.copytree(sandbox[resource], copy, symlinks=True)
        before = {resource: tree_digest(copy) for resource, copy in copies.items()}
        yield copies
        if any(tree_digest(copy) != before[resource] for resource, copy in copies.items()):
            say(
                "step",
                f"{step.step}: {step.tool} changed its copy of the sandbox but does not "
                "declare `writes: true`: the change is dropped",
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


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
    # Confined as the plan's tools are: its sandbox writable, nothing else.
    confinement = work_confinement(plane, _plan(plane, plan_id), sandbox.values(), "compensations")
    codes, output = [], b""
    for argv in commands:
        # Bounded like every program the plane runs (the output cap, the process group
        # killed on timeout); what was cut is noted in the recorded output.
        done = run_command(
            argv,
            cwd=cwd,
            timeout_s=120,
            max_output_bytes=output_cap(),
            confinement=confinement.adding(read=program_files(argv)),
        )
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
    state = plan_state(doc)  # the words `plan list/show`, the report and stats use
    report = verify_store(plane.store)
    return RunSummary(
        plan_id=plan_id,
        outcome=doc.outcome,  # the canonical outcome, as `plan list/show` give it
        state=state,
        decision_id=doc.pending_decision.decision_id if doc.pending_decision else None,
        halt=msgspec.to_builtins(doc.halt),
        positions=[start + 1, report.size],
        verify_ok=report.ok,
        tree_head=f"{report.size}:{report.root}",
        ledger=plane.store.url,
    )
