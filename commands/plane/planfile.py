"""The plan file: everything ``evidence run`` needs, in one YAML or TOML document.

Validated strictly with pydantic (unknown keys and wrong types are errors, nothing is
coerced); an error names the file, the key path and, for YAML, the line. An attempt whose
steps say ``needs`` or ``from`` is an actor graph, checked here as a whole before
anything runs (see ``commands.plane.graph``). See docs/plan-files.md for the format with
an annotated example.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from commands.names import check_relative_path
from commands.runner.results import RESULT_SCHEMA
from commands.schemas.prepare import InvalidSchemaError, prepare_schema
from ledger.intake import parse_toml, parse_yaml, read_text

from .core import CommandRefused
from .graph import compile_expression, field_paths, impossible_field
from .plans import parse_global_config

JSON = Any


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class PlanSection(_Strict):
    id: str
    project: str
    resources: list[str] = Field(min_length=1)  # relative paths: to the plan file
    global_config: dict[str, JSON] = {}
    skills: list[str] = []  # the plan may call only these skills' members (none: any)


class AttachmentEntry(_Strict):
    validation: str
    resource: str
    scope: Literal["direct", "project", "plan"] = "direct"
    args: dict[str, JSON] = {}


class Step(_Strict):
    step: str
    tool: str
    params: dict[str, JSON] = {}
    output: dict[str, JSON] | None = None  # the step's output declaration (a JSON Schema)
    # An actor graph (commands/plane/graph.py): the steps this one runs after, and its
    # parameters taken from their outputs (param -> JMESPath over {steps: {NAME: {output}}}).
    needs: list[str] = []
    from_: dict[str, str] = Field(default={}, alias="from")

    def depends_on(self) -> list[str]:
        """Every step this one needs: ``needs``, then the steps its ``from`` names."""
        named = [
            path[1]
            for expression in self.from_.values()
            for path in field_paths(compile_expression(expression))
            if len(path) > 1 and path[0] == "steps"
        ]
        return list(dict.fromkeys([*self.needs, *named]))


class Fix(_Strict):
    note: str
    files: dict[str, str] = {}  # path (relative to the first resource) -> new content

    @field_validator("files")
    @classmethod
    def _confined(cls, files: dict[str, str]) -> dict[str, str]:
        for path in files:
            try:
                check_relative_path(path, "fix path")
            except CommandRefused as exc:
                raise ValueError(str(exc)) from None
        return files


class Attempt(_Strict):
    steps: list[Step] = []
    fix: Fix | None = None  # applied in the sandbox when this attempt's validation fails

    @property
    def is_graph(self) -> bool:
        """Whether the steps form an actor graph (a step says `needs` or `from`, if only
        ``needs: []``); else they run one after the other, in the file's order."""
        return any({"needs", "from_"} & step.model_fields_set for step in self.steps)


class Strategy(_Strict):
    strategy: str
    attempts: list[Attempt] = Field(min_length=1)


class Agent(_Strict):
    strategies: list[Strategy] = Field(min_length=1)
    compensation: list[list[str]] = []  # argv lists, run when the plan is compensated


class PlanFile(_Strict):
    plan: PlanSection
    tools: list[dict[str, JSON]] = []  # registry files, as for `evidence tool register`
    validations: list[dict[str, JSON]] = []
    skills: list[dict[str, JSON]] = []
    attachments: list[AttachmentEntry] = []
    agent: Agent


# A registered tool's output schema as its output gate checks it (a validation's: its
# structured return); None when the registry has no such tool or it declares none.
OutputSchemaOf = Callable[[str], Any]


def load_plan_file(path: Path, output_schema_of: OutputSchemaOf | None = None) -> PlanFile:
    """Parse and validate; refuse with file, key path and line on any mistake.

    The steps of an attempt that form an actor graph are checked too (unknown or
    duplicate steps, cycles, expressions), and with ``output_schema_of`` every field a
    ``from`` expression reads is walked through its producer's output schema: the
    step's ``output``, else the schema of a tool or validation the file declares, else
    ``output_schema_of`` the registered tool."""
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml"):
        raise CommandRefused(f"{path}: a plan file is .yaml, .yml or .toml")
    is_yaml = suffix != ".toml"
    text = read_text(path, "document")
    raw = (parse_yaml if is_yaml else parse_toml)(text, str(path))
    if not isinstance(raw, dict):
        raise CommandRefused(f"{path}: a plan file is a mapping with plan, agent, …")
    try:
        pf = PlanFile.model_validate(raw)
    except ValidationError as exc:
        # An unknown key usually explains a "missing" one (a typo): name it first.
        error = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
        where = ".".join(str(part) for part in error["loc"])
        line = _yaml_line(text, error["loc"]) if is_yaml else None
        at = f" (line {line})" if line else ""
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        message = {"extra_forbidden": "unknown key"}.get(error["type"], error["msg"])
        raise CommandRefused(f"{path}: key `{where}`{at}: {message}{more}") from None
    with located(path, ("plan", "global_config")):
        parse_global_config(pf.plan.global_config)
    _check_graphs(pf, path, text if is_yaml else None, output_schema_of)
    return pf


# -- naming where a mistake is --------------------------------------------------------------

_KEY = re.compile(r"key `([^`]+)`")
_AT = re.compile(r" - at `\$([^`]*)`")  # msgspec's "... - at `$.retry_limit`"
_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _key_path(text: str) -> tuple[str | int, ...]:
    """``command[3]`` -> ("command", 3); ``a.b`` -> ("a", "b")."""
    return tuple(int(index) if index else name for name, index in _PART.findall(text))


class PlanFileError(CommandRefused):
    """A refusal that already names its place in the plan file."""


def plan_file_error(path: Path, loc: tuple[str | int, ...], message: str) -> PlanFileError:
    """A mistake found at ``loc`` of the plan file (by a handler that knows nothing of
    files: registering its tools, creating its plan, attaching), named as
    ``load_plan_file`` names one: the file, the key path (``loc`` refined by the key the
    message names, such as ``key `timeout` ``) and, for YAML, the line."""
    more: tuple[str | int, ...] = ()
    rest = message.removeprefix("invalid global_config: ")
    if found := _KEY.search(rest):
        more = _key_path(found[1])
        if rest.startswith(found[0] + ": "):
            rest = rest[len(found[0]) + 2 :]
    elif found := _AT.search(rest):
        more = _key_path(found[1])
        rest = rest[: found.start()] + rest[found.end() :]
    full = (*loc, *more)
    line = None
    if path.suffix.lower() != ".toml":
        try:
            line = _yaml_line(read_text(path, "document"), full)
        except (CommandRefused, OSError):
            line = None
    at = f" (line {line})" if line else ""
    where = ".".join(str(part) for part in full)
    return PlanFileError(f"{path}: key `{where}`{at}: {rest}")


@contextmanager
def located(path: Path | None, loc: tuple[str | int, ...]) -> Iterator[None]:
    """Refusals inside are the plan file's at ``loc`` (``plan_file_error``); without a
    ``path`` they pass as they are."""
    try:
        yield
    except PlanFileError:
        raise  # placed already, more precisely
    except CommandRefused as exc:
        if path is None:
            raise
        raise plan_file_error(path, loc, str(exc)) from None


def _check_graphs(
    pf: PlanFile, path: Path, yaml_text: str | None, output_schema_of: OutputSchemaOf | None
) -> None:
    """Refuse the first mistake in an attempt's actor graph, naming the file, the step,
    its key and (YAML) the line."""
    for i, strategy in enumerate(pf.agent.strategies):
        for j, attempt in enumerate(strategy.attempts):
            if not attempt.is_graph:
                continue  # a linear attempt: its steps run in the file's order, as named
            problem = _graph_problem(pf, attempt.steps, output_schema_of)
            if problem is None:
                continue
            k, key, name, message = problem
            loc = ("agent", "strategies", i, "attempts", j, "steps", k, *key)
            line = _yaml_line(yaml_text, loc) if yaml_text is not None else None
            at = f", line {line}" if line else ""
            where = ".".join(map(str, loc))
            raise CommandRefused(f"{path}: step `{name}` (key `{where}`{at}): {message}")


# (index of the step, key path inside it, its name, what is wrong)
_Problem = tuple[int, tuple[str | int, ...], str, str]


def _graph_problem(
    pf: PlanFile, steps: list[Step], output_schema_of: OutputSchemaOf | None
) -> _Problem | None:
    """The first mistake in an actor graph, or None."""
    index = {}
    for k, step in enumerate(steps):
        if step.step in index:
            return k, ("step",), step.step, "a step of this attempt already has this name"
        index[step.step] = k
    for k, step in enumerate(steps):
        for n, need in enumerate(step.needs):
            if need not in index:
                return (
                    k,
                    ("needs", n),
                    step.step,
                    f"needs `{need}`, which is no step of its attempt",
                )
        for param, expression in step.from_.items():
            key: tuple[str | int, ...] = ("from", param)
            if param in step.params:
                return k, key, step.step, f"parameter `{param}` is in both `params` and `from`"
            try:
                paths = field_paths(compile_expression(expression))
            except ValueError as exc:
                return k, key, step.step, str(exc)
            for fields in paths:
                wrong = _reference_problem(pf, fields, steps, index, output_schema_of)
                if wrong is not None:
                    return k, key, step.step, wrong
    graph = {step.step: step.depends_on() for step in steps}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        cycle: list[str] = list(reversed(exc.args[1]))  # each step, then the one it needs
        first = cycle[0]
        return (
            index[first],
            (),
            first,
            f"the steps need each other in a cycle: {' -> '.join(cycle)}",
        )
    return None


def _reference_problem(
    pf: PlanFile,
    fields: tuple[str, ...],
    steps: list[Step],
    index: dict[str, int],
    output_schema_of: OutputSchemaOf | None,
) -> str | None:
    """Why the field path an expression reads can never hold a value, or None."""
    shown = ".".join(fields)
    if fields[0] != "steps":
        return f"`{shown}` reads `{fields[0]}`, but the expression sees only `steps`"
    if len(fields) < 2:
        return None
    if fields[1] not in index:
        return f"`{shown}` names step `{fields[1]}`, which is no step of its attempt"
    if len(fields) < 3:
        return None
    if fields[2] != "output":
        return f"`{shown}`: a step's entry has only `output`"
    producer = steps[index[fields[1]]]
    schema = _output_schema(pf, producer, output_schema_of)
    if schema is None or len(fields) < 4:
        return None
    try:
        closed = prepare_schema(schema).normalised  # closed, as the output gate checks it
    except InvalidSchemaError:
        return None  # refused where it is used (registration, the output gate)
    why = impossible_field(closed, fields[3:])
    if why is None:
        return None
    return f"`{shown}`: in the output of step `{producer.step}` (tool {producer.tool}), {why}"


def _output_schema(pf: PlanFile, step: Step, output_schema_of: OutputSchemaOf | None) -> Any:
    """What the output gate of ``step`` checks its output against (None: unknown)."""
    if step.output is not None:
        return step.output
    if any(spec.get("name") == step.tool for spec in pf.validations):
        return RESULT_SCHEMA
    declared = [spec for spec in pf.tools if spec.get("name") == step.tool]
    if declared:
        return declared[-1].get("output_schema")
    return output_schema_of(step.tool) if output_schema_of is not None else None


def _yaml_line(text: str, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of the node at ``loc`` (or the deepest parent found)."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if match is None:
                break
            line, node = match[0].start_mark.line + 1, match[1]
        elif (
            isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value)
        ):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line
