"""The plane's Python API: open a ``Plane`` on a store and call its handlers.

Each handler decides against state folded from the log and appends the events of its
decision; none of them needs click. The handlers an agent calls are re-exported here;
the operator's verbs (``authorize``, approver keys) stay in ``commands.plane.lifecycle``,
so code that drives an agent does not reach them by accident.

    from commands.plane import Plane, create_plan, register_tool, call_tool

Each name is imported from its module on first use (PEP 562): importing one handler's
module (``commands.plane.gates``) does not load every other one (the plan-file driver
with YAML and pydantic, the runner ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledger.lazy import lazy_getattr

if TYPE_CHECKING:
    from .attachments import attach, detach, resolve_attachments
    from .core import CommandRefused, Plane
    from .driver import resume, run_plan_file
    from .gates import gate_input, gate_output
    from .lifecycle import apply_plan, record_fix
    from .phases import enter_execute, record_strategy
    from .plans import create_plan, get_plan, list_plans
    from .registry import define_skill, register_tool, register_validation
    from .runs import Recorded, call_tool, record_halt
    from .validation_runs import validate_plan

# name -> the module of this package that defines it
_LAZY: dict[str, str] = {
    "CommandRefused": "core",
    "Plane": "core",
    "Recorded": "runs",
    "apply_plan": "lifecycle",
    "attach": "attachments",
    "call_tool": "runs",
    "create_plan": "plans",
    "define_skill": "registry",
    "detach": "attachments",
    "enter_execute": "phases",
    "gate_input": "gates",
    "gate_output": "gates",
    "get_plan": "plans",
    "list_plans": "plans",
    "record_fix": "lifecycle",
    "record_halt": "runs",
    "record_strategy": "phases",
    "register_tool": "registry",
    "register_validation": "registry",
    "resolve_attachments": "attachments",
    "resume": "driver",
    "run_plan_file": "driver",
    "validate_plan": "validation_runs",
}

if not TYPE_CHECKING:  # for mypy every name above is imported; unknown names stay errors
    __getattr__ = lazy_getattr(__name__, _LAZY, globals())


__all__ = [
    "CommandRefused",
    "Plane",
    "Recorded",
    "apply_plan",
    "attach",
    "call_tool",
    "create_plan",
    "define_skill",
    "detach",
    "enter_execute",
    "gate_input",
    "gate_output",
    "get_plan",
    "list_plans",
    "record_fix",
    "record_halt",
    "record_strategy",
    "register_tool",
    "register_validation",
    "resolve_attachments",
    "resume",
    "run_plan_file",
    "validate_plan",
]
