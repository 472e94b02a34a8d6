"""The plane's Python API: open a ``Plane`` on a store and call its handlers.

Each handler decides against state folded from the log and appends the events of its
decision; none of them needs click. The handlers an agent calls are re-exported here;
the operator's verbs (``authorize``, approver keys) stay in ``commands.plane.lifecycle``,
so code that drives an agent does not reach them by accident.

    from commands.plane import Plane, create_plan, register_tool, call_tool
"""

from .attachments import attach, detach, resolve_attachments
from .core import CommandRefused, Plane
from .driver import resume, run_plan_file
from .gates import gate_input, gate_output
from .lifecycle import apply_plan, record_fix
from .phases import enter_execute, record_strategy
from .plans import create_plan, get_plan, list_plans
from .registry import define_skill, register_tool, register_validation
from .runs import call_tool, record_halt, validate_plan

__all__ = [
    "CommandRefused",
    "Plane",
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
