"""A validation's structured result and the transforms that produce one.

Every validation returns ``{passed, message?, data?}`` (``RESULT_SCHEMA``), checked
strictly by ``check_validation_result``. A validation that wraps a tool turns the tool's
output into that shape with a JMESPath ``transform``: ``compile_transform`` checks one at
registration, ``apply_transform`` runs it (pure: it reads its input, builds a new value).
The runner, the registry and the auditor share these, so a result is judged the same
way wherever it is judged.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import jmespath
import jmespath.exceptions
import jmespath.functions
import msgspec

from commands.errors import CommandRefused
from ledger.intake import InputError, check_json_value

__all__ = [
    "RESULT_SCHEMA",
    "TAIL_CHARS",
    "TAIL_LINES",
    "TransformError",
    "apply_transform",
    "check_validation_result",
    "compile_transform",
    "json_type_phrase",
    "output_tails",
]

JSON = Any

# The structured return of every validation. `data` opens itself explicitly:
# schemas are normalised closed, and a closed empty object would only admit `{}`.
RESULT_SCHEMA: dict[str, JSON] = {
    "type": "object",
    "required": ["passed"],
    "properties": {
        "passed": {"type": "boolean"},
        "message": {"type": "string"},
        "data": {"type": "object", "additionalProperties": True},
    },
}
_RESULT_KEYS = frozenset(RESULT_SCHEMA["properties"])


def json_type_phrase(value: Any) -> str:
    """``a string``, ``an object``...: a value's JSON type as a message names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


class TransformError(ValueError):
    """A transform could not produce a well-formed result from a tool's output. The
    runner records this as no verdict (``cause: malformed``, a ``validator_error``) with
    the message."""


def compile_transform(expression: str) -> str:
    """Check a JMESPath transform at registration: its syntax, and that every function it
    calls exists with that many arguments (jmespath only finds those when it runs)."""
    try:
        parsed = jmespath.compile(expression)
    except jmespath.exceptions.JMESPathError as exc:
        raise CommandRefused(f"key `transform`: {_jmespath_message(exc)}") from None
    table = jmespath.functions.Functions().FUNCTION_TABLE
    for node in _ast_nodes(parsed.parsed):
        if node.get("type") != "function_expression":
            continue
        function, argc = node["value"], len(node.get("children", []))
        if function not in table:
            raise CommandRefused(f"key `transform`: unknown JMESPath function {function}()")
        signature = table[function]["signature"]
        variadic = bool(signature) and signature[-1].get("variadic", False)
        if argc < len(signature) or (argc > len(signature) and not variadic):
            wanted = f"at least {len(signature)}" if variadic else str(len(signature))
            raise CommandRefused(
                f"key `transform`: {function}() takes {wanted} argument(s), given {argc}"
            )
    return expression


def _jmespath_message(exc: Exception) -> str:
    first = str(exc).splitlines()[0].removesuffix(", for expression:").rstrip(": ")
    for prefix in ("Invalid jmespath expression: ", "Bad jmespath expression: "):
        first = first.removeprefix(prefix)
    position = getattr(exc, "lex_position", None)
    if position is not None and "column" not in first:
        first += f" at column {position}"
    return f"not a valid JMESPath expression: {first}"


def _ast_nodes(node: Any) -> Iterable[dict[str, Any]]:
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, dict):
            yield current
            stack.extend(current.get("children", []))


@functools.lru_cache(maxsize=256)
def _compiled(expression: str) -> Any:
    return jmespath.compile(expression)


def apply_transform(expression: str, tool_output: JSON) -> dict[str, JSON]:
    """Run a wrapper's transform on its tool's output and return the structured result.

    Pure: JMESPath reads its input and builds a new value, nothing else. Raises
    ``TransformError`` when the expression fails on this output (a type error in a
    function), yields anything but ``{passed: bool, message?: str, data?: object}``, or
    yields a value the input layer would refuse (``ledger.intake.check_json_value``: a
    number beyond ±(2^53 - 1), ``8e15 + 8e15`` say, which the log could not hold).
    """
    try:
        value = _compiled(expression).search(tool_output)
    except jmespath.exceptions.JMESPathError as exc:
        raise TransformError(f"transform failed: {_one_line(str(exc))}") from None
    ok, error = check_validation_result(value)
    if not ok:
        raise TransformError(f"malformed validation result from the transform: {error}")
    try:
        check_json_value(value, "the transform's result")
    except InputError as exc:
        raise TransformError(f"the transform's result cannot be recorded: {exc}") from None
    return value


def check_validation_result(value: Any) -> tuple[bool, str | None]:
    """Strictly ``{passed: bool, message?: str, data?: object}``: (True, None), or
    (False, why). No coercion: ``"true"`` or ``1`` is not a boolean, ``null`` is not an
    absent message, and any other key makes the result malformed."""
    if not isinstance(value, dict):
        return False, f"a result must be an object, got {json_type_phrase(value)}"
    extra = sorted(str(k) for k in value if k not in _RESULT_KEYS)
    if extra:
        return False, f"unexpected key(s) {', '.join(extra)} (allowed: passed, message, data)"
    if "passed" not in value:
        return False, "missing `passed`"
    if type(value["passed"]) is not bool:
        return False, f"`passed` must be a boolean, got {json_type_phrase(value['passed'])}"
    if "message" in value and not isinstance(value["message"], str):
        return False, f"`message` must be a string, got {json_type_phrase(value['message'])}"
    if "data" in value and not isinstance(value["data"], dict):
        return False, f"`data` must be an object, got {json_type_phrase(value['data'])}"
    return True, None


def _one_line(text: str) -> str:
    return " ".join(text.split())


# -- what a failing validation printed ---------------------------------------------------

TAIL_LINES = 20  # the last lines of a stream a failure shows
TAIL_CHARS = 2000  # and at most this many characters of them

_STREAMS = frozenset({"exit_code", "stdout", "stderr"})


def output_tails(raw: bytes | None, stderr: bytes | None = None) -> tuple[str | None, str | None]:
    """(stdout tail, stderr tail) of a validation's recorded raw output (its blob) and
    its recorded stderr (its own blob, when the program wrote any), for a person reading
    why it failed: the last ``TAIL_LINES`` lines, at most ``TAIL_CHARS`` characters, as
    text (UTF-8, undecodable bytes replaced). None for a stream with nothing to show.

    The blob is what the runner kept: a wrapped validation's tool output, which for a
    command that printed no JSON is ``{exit_code, stdout, stderr}`` (both streams); a
    command validation's stdout; a python or MCP validation's return. A blob that is a
    well-formed structured return (``{passed, message?, data?}``) adds nothing to the
    message shown with it: no stdout tail."""
    out, err = _raw_tails(raw)
    if stderr:
        err = _tail(stderr.decode("utf-8", errors="replace"))
    return out, err


def _raw_tails(raw: bytes | None) -> tuple[str | None, str | None]:
    if not raw:
        return None, None
    try:
        value = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        value = None
    if isinstance(value, dict):
        if set(value) == _STREAMS and all(isinstance(value[k], str) for k in ("stdout", "stderr")):
            return _tail(value["stdout"]), _tail(value["stderr"])
        if check_validation_result(value)[0]:
            return None, None
    return _tail(raw.decode("utf-8", errors="replace")), None


def _tail(text: str) -> str | None:
    lines = text.rstrip().splitlines()[-TAIL_LINES:]
    tail = "\n".join(line.rstrip() for line in lines)
    if len(tail) > TAIL_CHARS:
        tail = "…" + tail[-(TAIL_CHARS - 1) :]
    return tail or None
