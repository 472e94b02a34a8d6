"""The plan file: everything ``evidence run`` needs, in one YAML or TOML document.

Validated strictly with pydantic (unknown keys and wrong types are errors, nothing is
coerced); an error names the file, the key path and, for YAML, the line. See
docs/plan-files.md for the format with an annotated example.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from commands.names import check_relative_path
from ledger.intake import parse_toml, parse_yaml, read_text

from .core import CommandRefused

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


def load_plan_file(path: Path) -> PlanFile:
    """Parse and validate; refuse with file, key path and line on any mistake."""
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml"):
        raise CommandRefused(f"{path}: a plan file is .yaml, .yml or .toml")
    is_yaml = suffix != ".toml"
    text = read_text(path, "document")
    raw = (parse_yaml if is_yaml else parse_toml)(text, str(path))
    if not isinstance(raw, dict):
        raise CommandRefused(f"{path}: a plan file is a mapping with plan, agent, …")
    try:
        return PlanFile.model_validate(raw)
    except ValidationError as exc:
        # An unknown key usually explains a "missing" one (a typo): name it first.
        error = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
        where = ".".join(str(part) for part in error["loc"])
        line = _yaml_line(text, error["loc"]) if is_yaml else None
        at = f" (line {line})" if line else ""
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        message = {"extra_forbidden": "unknown key"}.get(error["type"], error["msg"])
        raise CommandRefused(f"{path}: key `{where}`{at}: {message}{more}") from None


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
