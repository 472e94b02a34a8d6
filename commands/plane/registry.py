"""Registry handlers: tools, validations (a validation IS-A tool) and skills.

Registration files are parsed strictly (``parse_tool_spec`` and friends): an unknown key
or a wrong type is refused with the key named, nothing is coerced. A handler then checks
what it can without the log (schemas, transform, executor), and decides against the
stream's current document:

- ``tool:{name}`` holds tools *and* validations (one namespace): a name registered as one
  kind cannot be re-registered as the other.
- A registration identical to the current version appends nothing; any change appends
  the next version (the Plane records the delta: the changed spec fields).
- Skills live in ``skill:{name}``; every member must be a registered tool or validation.

Decisions the issue left open (docs/cli.md repeats them for users):

- ``wraps`` must name a plain tool, not a validation: a transform interprets a tool's
  raw output; chaining transforms would hide what is actually checked.
- A validation may not wrap a tool that declares ``writes: true``: running the wrapper
  runs the tool, and a validation is read-only.
- A validation's ``output_schema`` is fixed to the structured result ``{passed, message?,
  data?}`` (``RESULT_SCHEMA``); a file that sets ``output_schema`` is refused.
- A validation runs by exactly one of ``command``, ``python``, ``wraps`` or an MCP
  server the plane can launch. A tool runs by at most one of ``command`` or MCP.
- ``mcp_server`` is the server's name (as the MCP proxy registers it); how the plane
  launches it is ``mcp_command`` (a stdio server's argv, used as it is: no placeholders)
  or ``mcp_url`` (a streamable-HTTP server), at most one, and either needs
  ``mcp_server`` and ``mcp_tool_name``. A tool with ``mcp_server`` and neither can only
  be recorded (``call --record-output``); a validation needs one. A changed launch key
  is a new version.
- ``wraps`` requires ``transform`` and vice versa (no implicit identity transform).
- The wrapper records the wrapped tool's version (``wraps_version``) and copies of its
  inherited fields; re-registering the same file after the tool changed is a change.
- ``python`` is recorded, never imported at registration: registering runs no code.
- Command templates use ``{name}`` placeholders (``{{``/``}}`` for literal braces); only
  their syntax is checked here.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import math
import re
import string
import urllib.parse
import uuid
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from commands.names import check_identifier
from commands.runner.results import (
    RESULT_SCHEMA,
    compile_transform,
    json_type_phrase,
)
from commands.schemas.prepare import InvalidSchemaError, PreparedSchema, prepare_schema
from ledger import RecordedEvent
from ledger.canonical import MAX_SAFE_INTEGER, CanonicalizationError, canonical_json
from ledger.events import NetworkAccess, SkillDefined, ToolRegistered, ValidationRegistered
from projections.documents import Document, fold_skill, to_json, tool_spec
from projections.states import SkillState, ToolState

from .core import CommandRefused, Plane, StreamState

__all__ = [
    "Registered",
    "SkillSpec",
    "ToolSpec",
    "ValidationSpec",
    "define_skill",
    "get_skill",
    "get_tool",
    "get_validation",
    "list_skills",
    "list_tools",
    "list_validations",
    "parse_skill_spec",
    "parse_tool_spec",
    "parse_validation_spec",
    "register_tool",
    "register_validation",
]

JSON = Any
Seconds = Annotated[float, msgspec.Meta(gt=0)]


_NON_JSON_TYPES = (
    bytes,
    bytearray,
    memoryview,
    datetime.datetime,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    decimal.Decimal,
    uuid.UUID,
)
_PYTHON_TARGET = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_PLACEHOLDER = re.compile(r"[A-Za-z_]\w*")
# An MCP tool name the plane calls: printable ASCII without spaces (as the proxy offers).
_MCP_TOOL_NAME = re.compile(r"[!-~]{1,128}")
_URL_TEXT = re.compile(r"[!-~]{1,2048}")  # printable ASCII, no spaces


# -- registration files ----------------------------------------------------------------


class NetworkSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    connect: list[int] = []
    bind: list[int] = []


class _Definition(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Fields shared by tools and validations (a validation has every field a tool has)."""

    name: str
    description: str = ""
    source: str = ""
    capability: str | None = None
    lifecycle: dict[str, JSON] = {}
    code: str | None = None
    command: list[str] | None = None  # argv template, e.g. ["pytest", "-q", "{path}"]
    mcp_server: str | None = None  # the server's name
    mcp_tool_name: str | None = None
    mcp_command: list[str] | None = None  # argv of a stdio server the plane launches
    mcp_url: str | None = None  # a streamable-HTTP server the plane connects to
    idempotent: bool = False
    writes: bool = False
    # A cap in bytes on each of stdout and stderr of its program (default: the plane's,
    # EVIDENCE_MAX_OUTPUT_BYTES or 4 MiB); output beyond it is counted, never kept.
    max_output_bytes: int | None = None
    # The TCP ports its confined program may connect to / bind: {"connect": [443]}.
    # Absent: none (where the kernel has Landlock's TCP rules, ABI 4).
    network: NetworkSpec | None = None


class ToolSpec(_Definition, kw_only=True, forbid_unknown_fields=True):
    """A tool registration file. ``timeout`` is in seconds."""

    input_schema: JSON = None
    output_schema: JSON = None
    resource_slots: list[str] = []
    timeout: Seconds | None = None


class ValidationSpec(_Definition, kw_only=True, forbid_unknown_fields=True):
    """A validation registration file. The fields a wrapper inherits default to UNSET so
    that a file which sets them (even to an empty value) can be told from one that
    does not; ``output_schema`` is UNSET only to refuse it with a clear message."""

    mode: Literal["required", "informational"]
    input_schema: JSON | msgspec.UnsetType = msgspec.UNSET
    output_schema: JSON | msgspec.UnsetType = msgspec.UNSET
    resource_slots: list[str] | msgspec.UnsetType = msgspec.UNSET
    timeout: Seconds | msgspec.UnsetType | None = msgspec.UNSET
    python: str | None = None  # "module:function"
    wraps: str | None = None
    transform: str | None = None  # JMESPath, from the wrapped tool's output to a result
    # Recorded as false/true whatever happens; a file may only state those values.
    checkpointable: bool = False
    read_only: bool = True


class SkillSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A skill definition file: a named bundle of tools and validations."""

    name: str
    description: str = ""
    members: list[str]


SpecT = TypeVar("SpecT", ToolSpec, ValidationSpec, SkillSpec)


def parse_tool_spec(raw: Mapping[str, Any] | ToolSpec) -> ToolSpec:
    return _parse(raw, ToolSpec, "tool")


def parse_validation_spec(raw: Mapping[str, Any] | ValidationSpec) -> ValidationSpec:
    return _parse(raw, ValidationSpec, "validation")


def parse_skill_spec(raw: Mapping[str, Any] | SkillSpec) -> SkillSpec:
    return _parse(raw, SkillSpec, "skill")


def _parse(raw: Any, cls: type[SpecT], what: str) -> SpecT:
    """Strict: unknown keys and wrong types are refused, nothing is coerced. A Struct
    built in Python is checked the same way (msgspec does not check on construction)."""
    if isinstance(raw, msgspec.Struct):
        # UNSET fields are left out, as in a file; values JSON has no type for are kept
        # as they are (to_builtins would turn a date into a string) so they are refused.
        raw = msgspec.to_builtins(raw, builtin_types=_NON_JSON_TYPES)
    if not isinstance(raw, Mapping):
        raise CommandRefused(
            f"a {what} definition must be a mapping of keys to values, not {json_type_phrase(raw)}"
        )
    try:
        return msgspec.convert(dict(raw), cls, strict=True)
    except msgspec.ValidationError as exc:
        raise CommandRefused(_explain(str(exc))) from None


def _explain(message: str) -> str:
    """msgspec's message, phrased in terms of the file's keys."""
    text, _, where = message.partition(" - at `")
    where = where.rstrip("`").removeprefix("$").lstrip(".")
    if m := re.fullmatch(r"Object contains unknown field `(.+)`", text):
        key = f"{where}.{m[1]}" if where else m[1]
        return f"unknown key `{key}`"
    if m := re.fullmatch(r"Object missing required field `(.+)`", text):
        key = f"{where}.{m[1]}" if where else m[1]
        return f"missing required key `{key}`"
    if where:
        return f"key `{where}`: {text[0].lower()}{text[1:]}"
    return text


# -- results of the handlers -----------------------------------------------------------


class Registered(msgspec.Struct, kw_only=True, frozen=True):
    """What a registration did: ``changed`` is false when nothing was appended."""

    kind: Literal["tool", "validation", "skill"]
    name: str
    version: int
    changed: bool
    document: Document  # the tool/validation view (see get_tool) or the skill document


# -- field checks shared by tools and validations --------------------------------------


def _schema_fields(which: str, schema: JSON) -> dict[str, JSON]:
    """declared_<which>_schema, <which>_schema (closed) and its sha256, or all None."""
    if schema is None:
        return {
            f"declared_{which}_schema": None,
            f"{which}_schema": None,
            f"{which}_schema_sha256": None,
        }
    try:
        prepared = prepare_schema(schema)
    except InvalidSchemaError as exc:
        raise CommandRefused(f"{which}_schema: {exc}") from exc  # keeps .problems reachable
    return _prepared_fields(which, prepared)


def _prepared_fields(which: str, prepared: PreparedSchema) -> dict[str, JSON]:
    return {
        f"declared_{which}_schema": prepared.declared,
        f"{which}_schema": prepared.normalised,
        f"{which}_schema_sha256": prepared.sha256,
    }


@functools.cache
def _result_schema() -> PreparedSchema:
    return prepare_schema(RESULT_SCHEMA)


def _timeout_ms(seconds: float | None) -> int | None:
    if seconds is None:
        return None
    if not math.isfinite(seconds) or seconds > MAX_TIMEOUT_S:
        raise CommandRefused(
            f"key `timeout`: must be a number of seconds from 0.001 to {MAX_TIMEOUT_S} (a week)"
        )
    millis = round(seconds * 1000)
    if millis < 1:
        raise CommandRefused("key `timeout`: must be at least 0.001 seconds")
    return millis


MAX_TIMEOUT_S = 7 * 24 * 3600  # a process the plane waits for longer than this is lost


def _check_slots(slots: list[str]) -> list[str]:
    for slot in slots:
        check_identifier(slot, "resource slot")
    if len(set(slots)) != len(slots):
        raise CommandRefused("key `resource_slots`: a slot is listed twice")
    return list(slots)


def _check_command(argv: list[str] | None) -> list[str] | None:
    """An argv template: a program, then arguments with ``{name}`` placeholders."""
    if argv is None:
        return None
    if not argv or not argv[0].strip():
        raise CommandRefused("key `command`: needs at least a program name as first item")
    for index, arg in enumerate(argv):
        try:
            parts = list(string.Formatter().parse(arg))
        except ValueError as exc:
            raise CommandRefused(
                f"key `command[{index}]`: bad template {arg!r} ({exc}; "
                "write {{ and }} for literal braces)"
            ) from None
        for _, field, spec, conversion in parts:
            if field is None:
                continue
            if not _PLACEHOLDER.fullmatch(field) or spec or conversion:
                raise CommandRefused(
                    f"key `command[{index}]`: {arg!r} has a placeholder that "
                    "is not a plain {name}"
                )
    return list(argv)


def _mcp_launch(spec: _Definition) -> dict[str, JSON]:
    """``mcp_command`` or ``mcp_url`` as the event carries it (absent when not set)."""
    if spec.mcp_command is not None and spec.mcp_url is not None:
        raise CommandRefused(
            "keys `mcp_command` and `mcp_url`: the server is launched one way, give one"
        )
    if spec.mcp_command is None and spec.mcp_url is None:
        return {}
    key = "mcp_command" if spec.mcp_command is not None else "mcp_url"
    if spec.mcp_server is None:
        raise CommandRefused(
            f"key `{key}` needs `mcp_server` and `mcp_tool_name` (the server's name "
            "and the name of its tool to call)"
        )
    if spec.command is not None:
        raise CommandRefused(f"keys `command` and `{key}`: it runs one way, give one")
    if not spec.mcp_tool_name or not _MCP_TOOL_NAME.fullmatch(spec.mcp_tool_name):
        raise CommandRefused("key `mcp_tool_name`: 1-128 printable ASCII characters without spaces")
    if spec.mcp_command is not None:
        return {"mcp_command": _mcp_command(spec.mcp_command)}
    return {"mcp_url": _mcp_url(spec.mcp_url or "")}


def _mcp_command(argv: list[str]) -> list[str]:
    """A server's command line: a program name first, no NUL anywhere."""
    if not argv or not argv[0].strip():
        raise CommandRefused("key `mcp_command`: needs at least a program name as first item")
    for index, arg in enumerate(argv):
        if "\0" in arg:
            raise CommandRefused(f"key `mcp_command[{index}]`: contains a NUL character")
    return list(argv)


def _mcp_url(url: str) -> str:
    """A server's URL: http or https, with a host and a valid port, no spaces."""
    try:
        parts = urllib.parse.urlsplit(url) if _URL_TEXT.fullmatch(url) else None
        _port = parts.port if parts is not None else None  # raises on a bad port
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise CommandRefused(
            "key `mcp_url`: must be an http:// or https:// URL with a host, e.g. "
            "http://127.0.0.1:8000/mcp (at most 2048 characters, no spaces)"
        )
    return url


def _check_mcp_input(fields: Mapping[str, JSON]) -> None:
    """An MCP tool the plane calls takes its arguments as an object (MCP's
    ``tools/call``): an input schema it declares must say so."""
    declared = fields.get("declared_input_schema")
    launched = "mcp_command" in fields or "mcp_url" in fields
    if (
        launched
        and declared is not None
        and (not isinstance(declared, dict) or declared.get("type") != "object")
    ):
        raise CommandRefused(
            'key `input_schema`: an MCP tool takes an object of arguments: declare "type": "object"'
        )


def _common_fields(spec: _Definition) -> dict[str, Any]:
    """The ToolRegistered fields every definition sets itself."""
    if (spec.mcp_server is None) != (spec.mcp_tool_name is None):
        raise CommandRefused("keys `mcp_server` and `mcp_tool_name` go together")
    return {
        **_mcp_launch(spec),
        "description": spec.description,
        "source": spec.source,
        "capability": spec.capability,
        "lifecycle": _check_json(dict(spec.lifecycle), "lifecycle"),
        "code": spec.code,
        "command": _check_command(spec.command),
        "mcp_server": spec.mcp_server,
        "mcp_tool_name": spec.mcp_tool_name,
        "idempotent": spec.idempotent,
        **_max_output_bytes(spec.max_output_bytes),
        **_network(spec.network),
    }


def _network(spec: NetworkSpec | None) -> dict[str, Any]:
    """The ``network`` field when the file sets it: each port once, in order (a
    connect port 1-65535; a bind port 0-65535, 0 the kernel's choice)."""
    if spec is None:
        return {}
    found: dict[str, list[int]] = {}
    for key, low in (("connect", 1), ("bind", 0)):
        ports = getattr(spec, key)
        if any(not low <= p <= 65535 for p in ports):
            raise CommandRefused(
                f"key `network.{key}`: a list of TCP port numbers from {low} to 65535"
            )
        found[key] = sorted(set(ports))
    return {"network": NetworkAccess(**found)}


def _max_output_bytes(value: int | None) -> dict[str, int]:
    """The ``max_output_bytes`` field when the file sets it (absent from the event, and
    from its bytes, when it does not)."""
    if value is None:
        return {}
    if not 1 <= value <= MAX_SAFE_INTEGER:
        raise CommandRefused(
            "key `max_output_bytes`: must be a whole number of bytes from 1 to 2^53 - 1"
        )
    return {"max_output_bytes": value}


def _check_json(value: Any, key: str) -> Any:
    """Free-form values must be plain JSON: YAML and TOML can also give dates, NaN or
    integers JSON cannot carry exactly, and those would be coerced or refused later."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif item is not None and not isinstance(item, str | int | float):  # bool is an int
            raise CommandRefused(f"key `{key}`: {type(item).__name__} is not a JSON value")
    try:
        canonical_json(value)
    except CanonicalizationError as exc:
        raise CommandRefused(f"key `{key}`: {exc}") from None
    return value


def _next_version(state: StreamState) -> int:
    doc = state.doc
    return doc.version + 1 if isinstance(doc, ToolState | SkillState) else 1


def _unchanged(state: StreamState, payload: ToolRegistered) -> bool:
    # Canonical bytes, not ==: in Python True == 1, and a schema's `const: true` is not
    # `const: 1`.
    doc = state.of(ToolState)
    return doc is not None and canonical_json(to_json(tool_spec(payload))) == canonical_json(
        to_json(doc.spec)
    )


def _refuse_other_kind(state: StreamState, name: str, kind: str) -> None:
    doc = state.of(ToolState)
    if doc is not None and doc.kind != kind:
        raise CommandRefused(
            f"{name!r} is already registered as a {doc.kind}: tools and "
            f"validations share one namespace, so it cannot be registered as a {kind}"
        )


def _registered(
    plane: Plane,
    kind: Literal["tool", "validation"],
    name: str,
    recorded: list[RecordedEvent],
    seen: StreamState,
) -> Registered:
    """Report the version this call appended or found identical (not whatever is latest
    by the time we read: another writer may have registered a newer one meanwhile)."""
    # What this call appended: a tool.registered or a validation.registered (its subclass).
    appended = recorded[-1].payload if recorded else None
    version = (
        appended.version
        if isinstance(appended, ToolRegistered)
        else seen.existing(ToolState).version
    )
    view = get_tool(plane, name, version=version)
    return Registered(kind=kind, name=name, version=version, changed=bool(recorded), document=view)


# -- tools -----------------------------------------------------------------------------


def register_tool(
    plane: Plane, spec: ToolSpec | Mapping[str, Any], *, actor: str = "system"
) -> Registered:
    """Register a tool, or its next version if it changed; identical appends nothing."""
    parsed = parse_tool_spec(spec)
    name = check_identifier(parsed.name, "tool name")
    fields = _common_fields(parsed)
    if parsed.command is not None and parsed.mcp_server is not None:
        raise CommandRefused("a tool runs one way: `command` or `mcp_server`, not both")
    fields.update(_schema_fields("input", parsed.input_schema))
    fields.update(_schema_fields("output", parsed.output_schema))
    fields.update(
        resource_slots=_check_slots(parsed.resource_slots),
        timeout_ms=_timeout_ms(parsed.timeout),
        writes=parsed.writes,
    )
    _check_mcp_input(fields)

    seen: list[StreamState] = []  # the state of the last decision

    def decide(state: StreamState) -> list[ToolRegistered]:
        seen.append(state)
        _refuse_other_kind(state, name, "tool")
        payload = ToolRegistered(name=name, version=_next_version(state), **fields)
        return [] if _unchanged(state, payload) else [payload]

    recorded = plane.run(f"tool:{name}", decide, actor=actor)
    return _registered(plane, "tool", name, recorded, seen[-1])


def get_tool(plane: Plane, name: str, *, version: int | None = None) -> Document:
    """A tool or validation: ``{name, kind, version, latest_version, spec}`` (``spec`` of
    ``version``, default the latest)."""
    return _view(_tool_document(plane, name, "tool"), version)


def _tool_document(plane: Plane, name: str, what: str) -> ToolState:
    plane.projections.catch_up()
    found = plane.projections.document("tools", name)
    if found is None or found[0] is None:
        raise CommandRefused(f"unknown {what} {name!r}")
    return found[0]


def list_tools(
    plane: Plane, *, kind: Literal["tool", "validation"] | None = None
) -> list[Document]:
    """Every entry of the tool namespace (validations are tools), or one kind of them."""
    plane.projections.catch_up()
    where = () if kind is None else (lambda t: t.c.kind == kind,)
    return [
        _view(doc, None) for doc in plane.projections.documents("tools", *where) if doc is not None
    ]


def _view(doc: ToolState, version: int | None) -> Document:
    """The JSON view of a tool (``get_tool``): ``spec`` as its plain document."""
    latest = int(doc.version)
    wanted = latest if version is None else version
    spec = doc.versions.get(str(wanted))
    if spec is None:
        raise CommandRefused(
            f"{doc.kind} {doc.name!r} has no version {wanted} (versions 1 to {latest})"
        )
    return {
        "name": doc.name,
        "kind": doc.kind,
        "version": wanted,
        "latest_version": latest,
        "spec": to_json(spec),
    }


# -- validations -----------------------------------------------------------------------


def register_validation(
    plane: Plane, spec: ValidationSpec | Mapping[str, Any], *, actor: str = "system"
) -> Registered:
    """Register a validation (read-only, fixed mode, one executor), or its next version."""
    parsed = parse_validation_spec(spec)
    name = check_identifier(parsed.name, "validation name")
    _check_read_only(name, parsed)
    if parsed.output_schema is not msgspec.UNSET:
        raise CommandRefused(
            f"validation {name!r}: key `output_schema` cannot be set: a validation always "
            "returns {passed, message?, data?}"
        )
    executor = _executor(name, parsed)
    fields = _common_fields(parsed)
    fields.update(_prepared_fields("output", _result_schema()))
    fields.update(
        mode=parsed.mode,
        executor=executor,
        python=parsed.python,
        writes=False,
        checkpointable=False,
        read_only=True,
    )
    if executor == "wrapped":
        _refuse_redefinition(name, parsed)
        fields["transform"] = compile_transform(parsed.transform or "")
    else:
        if parsed.transform is not None:
            raise CommandRefused(
                f"validation {name!r}: key `transform` needs `wraps` "
                "(it interprets the wrapped tool's output)"
            )
        fields.update(_schema_fields("input", _or(parsed.input_schema, None)))
        fields.update(
            resource_slots=_check_slots(_or(parsed.resource_slots, [])),
            timeout_ms=_timeout_ms(_or(parsed.timeout, None)),
        )
        _check_mcp_input(fields)

    seen: list[StreamState] = []  # the state of the last decision

    def decide(state: StreamState) -> list[ValidationRegistered]:
        seen.append(state)
        _refuse_other_kind(state, name, "validation")
        inherited = _inherit(state, name, parsed.wraps) if parsed.wraps else {}
        payload = ValidationRegistered(
            name=name, version=_next_version(state), **fields, **inherited
        )
        return [] if _unchanged(state, payload) else [payload]

    recorded = plane.run(f"tool:{name}", decide, actor=actor)
    return _registered(plane, "validation", name, recorded, seen[-1])


def _check_read_only(name: str, spec: ValidationSpec) -> None:
    """Validations are always writes false, checkpointable false, read_only true (so they
    can run in parallel and be retried). A file may restate those values; any other is
    refused, never overridden."""
    if spec.writes:
        raise CommandRefused(
            f"validation {name!r}: `writes: true` is not allowed: a validation is always read-only"
        )
    if spec.checkpointable:
        raise CommandRefused(
            f"validation {name!r}: `checkpointable: true` is not allowed: "
            "a validation is read-only and never checkpointable"
        )
    if not spec.read_only:
        raise CommandRefused(
            f"validation {name!r}: `read_only: false` is not allowed: a "
            "validation is always read-only"
        )


Executor = Literal["command", "python", "wrapped", "mcp"]


def _executor(name: str, spec: ValidationSpec) -> Executor:
    keys = ("command", "python", "wraps", "mcp_server")
    given = [key for key in keys if getattr(spec, key) is not None]
    if len(given) != 1:
        found = " and ".join(f"`{k}`" for k in given) if given else "none"
        raise CommandRefused(
            f"validation {name!r} needs exactly one executor: `command`, `python`, "
            f"`wraps` or an MCP server (`mcp_server`) (found {found})"
        )
    if spec.mcp_server is not None and spec.mcp_command is None and spec.mcp_url is None:
        raise CommandRefused(
            f"validation {name!r}: the plane runs its MCP tool itself, so say how to "
            "reach the server: `mcp_command` (a stdio server) or `mcp_url` (streamable HTTP)"
        )
    if spec.python is not None and not _PYTHON_TARGET.fullmatch(spec.python):
        raise CommandRefused(f'key `python`: {spec.python!r} is not "module:function"')
    if spec.wraps is not None:
        check_identifier(spec.wraps, "wrapped tool name")
    executors: dict[str, Executor] = {
        "command": "command",
        "python": "python",
        "wraps": "wrapped",
        "mcp_server": "mcp",
    }
    return executors[given[0]]


def _refuse_redefinition(name: str, spec: ValidationSpec) -> None:
    """A wrapper inherits these from the wrapped tool and may not redefine them."""
    redefined = [
        key
        for key in ("input_schema", "resource_slots", "timeout")
        if getattr(spec, key) is not msgspec.UNSET
    ] + (["network"] if spec.network is not None else [])
    if redefined:
        keys = ", ".join(f"`{k}`" for k in redefined)
        raise CommandRefused(
            f"validation {name!r} wraps {spec.wraps!r} and inherits input_schema, "
            f"resource_slots, timeout and network from it: remove {keys}"
        )
    if spec.transform is None:
        raise CommandRefused(
            f"validation {name!r}: `wraps` needs a `transform` that maps "
            "the tool's output to {passed, message?, data?}"
        )


def _inherit(state: StreamState, name: str, target: str) -> dict[str, JSON]:
    """The wrapped tool's current input schema, slots and timeout, and its version (read
    from the log, in the registration's transaction)."""
    assert state.log is not None
    doc = state.log.tool(target)
    if doc is None:
        raise CommandRefused(
            f"validation {name!r} wraps unknown tool {target!r} (register the tool first)"
        )
    if doc.kind != "tool":
        raise CommandRefused(
            f"validation {name!r} wraps {target!r}, which is a validation: `wraps` must name a tool"
        )
    spec = doc.spec
    if spec.writes:
        raise CommandRefused(
            f"validation {name!r} cannot wrap {target!r}: that tool writes "
            "(`writes: true`) and a validation is read-only"
        )
    return {
        "wraps": target,
        "wraps_version": doc.version,
        "declared_input_schema": spec.declared_input_schema,
        "input_schema": spec.input_schema,
        "input_schema_sha256": spec.input_schema_sha256,
        "resource_slots": list(spec.resource_slots or []),
        "timeout_ms": spec.timeout_ms,
        **({} if spec.network is msgspec.UNSET else {"network": spec.network}),
    }


def _or(value: Any, default: Any) -> Any:
    return default if value is msgspec.UNSET else value


def get_validation(plane: Plane, name: str, *, version: int | None = None) -> Document:
    doc = _tool_document(plane, name, "validation")
    if doc.kind != "validation":
        raise CommandRefused(f"{name!r} is a tool, not a validation")
    return _view(doc, version)


def list_validations(plane: Plane) -> list[Document]:
    return list_tools(plane, kind="validation")


# -- skills ----------------------------------------------------------------------------


def define_skill(
    plane: Plane, spec: SkillSpec | Mapping[str, Any], *, actor: str = "system"
) -> Registered:
    """Define a skill, or its next version if it changed; identical appends nothing.

    Being in a skill makes a tool or validation callable by the skill's users; it never
    makes a validation a gate (only an attachment does)."""
    parsed = parse_skill_spec(spec)
    name = check_identifier(parsed.name, "skill name")
    if not parsed.members:
        raise CommandRefused(f"skill {name!r} needs at least one member")
    for member in parsed.members:
        check_identifier(member, "skill member")
    if len(set(parsed.members)) != len(parsed.members):
        raise CommandRefused(f"skill {name!r}: a member is listed twice")

    seen: list[StreamState] = []  # the state of the last decision

    def decide(state: StreamState) -> list[SkillDefined]:
        seen.append(state)
        assert state.log is not None
        unknown = [m for m in parsed.members if state.log.tool(m) is None]
        if unknown:
            raise CommandRefused(
                f"skill {name!r}: unknown member(s) {', '.join(unknown)} "
                "(register each tool or validation first)"
            )
        doc = state.of(SkillState)
        if doc is not None and (doc.description, doc.members) == (
            parsed.description,
            parsed.members,
        ):
            return []
        return [
            SkillDefined(
                name=name,
                version=_next_version(state),
                description=parsed.description,
                members=list(parsed.members),
            )
        ]

    recorded = plane.run(f"skill:{name}", decide, actor=actor)
    # The document this call produced or found identical (a skill keeps no old versions).
    before = seen[-1].of(SkillState)
    doc = fold_skill(before, recorded[-1].payload) if recorded else before
    assert doc is not None
    return Registered(
        kind="skill", name=name, version=doc.version, changed=bool(recorded), document=to_json(doc)
    )


def get_skill(plane: Plane, name: str) -> SkillState:
    """``{name, version, description, members}``."""
    plane.projections.catch_up()
    found = plane.projections.document("skills", name)
    if found is None:
        raise CommandRefused(f"unknown skill {name!r}")
    return found[0]


def list_skills(plane: Plane) -> list[SkillState]:
    plane.projections.catch_up()
    return plane.projections.documents("skills")
