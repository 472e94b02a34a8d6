"""Actor graphs in plan files: steps that need other steps and take parameters from
their outputs (a validation can be a node too: its structured return is available to
the nodes downstream, and it gates nothing unless it is attached).

Two halves, both free of the plane's state:

- **What an expression reads**, known before anything runs. A step's ``from`` maps a
  parameter to a JMESPath expression over ``{"steps": {NAME: {"output": ...}}}``;
  ``field_paths`` finds the field paths it reads from that root (``steps.look.output.
  python_files``), following only what is certain (fields, sub-expressions, pipes, the
  arguments of functions, the parts of multi-selects); whatever a projection, a filter or
  an index reads inside an element is not followed. ``impossible_field`` walks one path
  through the producer's (closed) output schema and says why it can never be there.
- **Running the graph**: ``run_graph`` starts each node once every node it needs has
  succeeded, independent nodes concurrently on threads (the work is subprocesses), an
  exclusive node (one that writes the sandbox) alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import jmespath
import jmespath.exceptions
from jmespath.parser import ParsedResult

from commands.errors import CommandRefused
from commands.runner.results import compile_transform

FieldPath = tuple[str, ...]

# Node types whose children are all evaluated against the node's own context.
_SAME_CONTEXT = frozenset(
    {
        "function_expression",
        "multi_select_list",
        "multi_select_dict",
        "key_val_pair",
        "comparator",
        "and_expression",
        "or_expression",
        "not_expression",
    }
)
# Node types whose first child is read in the node's context and whose other children
# run on each element of its result (not followed).
_FIRST_CHILD_ONLY = frozenset(
    {"projection", "value_projection", "filter_projection", "flatten", "index_expression"}
)
# Keywords that make a property's presence depend on more than `properties`: a path
# through a schema using any of them is accepted rather than judged.
_COMPOSED = ("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref", "$dynamicRef")


def compile_expression(expression: str) -> ParsedResult:
    """The compiled expression; ``ValueError`` saying why when it is no valid JMESPath
    (its syntax, and every function it calls existing with that many arguments)."""
    try:
        compile_transform(expression)  # the registry's check of a wrapper's transform
    except CommandRefused as exc:
        raise ValueError(str(exc).removeprefix("key `transform`: ")) from None
    try:
        return jmespath.compile(expression)
    except jmespath.exceptions.JMESPathError as exc:  # pragma: no cover - checked above
        raise ValueError(f"not a valid JMESPath expression: {exc}") from None


def field_paths(parsed: ParsedResult) -> list[FieldPath]:
    """The field paths from the root that the expression certainly reads (each once, in
    the order they appear). ``@`` alone reads the whole root and gives no path."""
    reads, value = _walk(parsed.parsed)
    if value:
        reads.append(value)
    return list(dict.fromkeys(path for path in reads if path))


def _walk(node: Any) -> tuple[list[FieldPath], FieldPath | None]:
    """(paths read relative to the node's context, the path of the node's own value when
    it is one: a chain of fields from the context, else None)."""
    if not isinstance(node, dict):
        return [], None
    kind = node.get("type")
    children = node.get("children", [])
    if kind in ("current", "identity"):
        return [], ()
    if kind == "field":
        return [], (str(node["value"]),)
    if kind in ("subexpression", "pipe"):
        reads: list[FieldPath] = []
        value: FieldPath | None = ()
        for child in children:
            if value is None:  # the rest reads from a value that is no field path
                break
            child_reads, child_value = _walk(child)
            reads += [value + path for path in child_reads]
            value = value + child_value if child_value is not None else None
        return reads, value
    if kind in _FIRST_CHILD_ONLY:
        return _reads_of(children[:1]), None
    if kind in _SAME_CONTEXT:
        return _reads_of(c for c in children if c.get("type") != "expref"), None
    return [], None  # literals, indices, slices, and anything new: nothing certain


def _reads_of(children: Iterable[Any]) -> list[FieldPath]:
    reads: list[FieldPath] = []
    for child in children:
        child_reads, child_value = _walk(child)
        reads += child_reads + ([child_value] if child_value else [])
    return reads


def impossible_field(schema: Any, fields: Sequence[str]) -> str | None:
    """Why the value ``schema`` describes can never have the field path ``fields`` (the
    phrase names the first field that cannot be there), or None when it may. Only the
    certain is refused: a composed schema, a pattern or an open object is accepted."""
    for depth, name in enumerate(fields):
        where = ".".join(fields[: depth + 1])
        if schema is False:
            return f"`{where}` can never be there (its schema admits no value)"
        if not isinstance(schema, Mapping) or any(k in schema for k in _COMPOSED):
            return None
        types = schema.get("type")
        types = [types] if isinstance(types, str) else types
        if isinstance(types, list) and "object" not in types:
            parent = ".".join(fields[:depth]) or "the output"
            return f"`{where}` can never be there ({parent} is {' or '.join(types)})"
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        if name in properties:
            schema = properties[name]
            continue
        patterns = schema.get("patternProperties")
        if isinstance(patterns, Mapping) and any(_matches(p, name) for p in patterns):
            return None
        extra = schema.get("additionalProperties", schema.get("unevaluatedProperties"))
        if extra is False and "dependentSchemas" not in schema:
            known = ", ".join(sorted(properties)) or "none"
            return f"`{where}` can never be there (the object is closed; its properties: {known})"
        if not isinstance(extra, Mapping):
            return None
        schema = extra
    return None


def _matches(pattern: str, name: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error:  # a pattern Python reads differently: assume it may match
        return True


# -- running a graph -------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    name: str
    needs: frozenset[str]
    exclusive: bool = False  # runs with no other node running (it writes the sandbox)


def run_graph(nodes: Sequence[Node], run: Callable[[str], bool], *, max_workers: int) -> bool:
    """Run ``run(name)`` for every node once all the nodes it needs returned True:
    independent nodes concurrently (up to ``max_workers``), an exclusive node alone.
    Ready nodes start in the order given; an exclusive node that is waiting for the
    running ones to finish holds back the nodes after it, so it is never starved.

    After the first node that returns False (or raises), no node starts; the running ones
    are waited for. True when every node returned True; an exception is re-raised once
    every running node has finished. With ``max_workers`` 1 the nodes run one after the
    other on the calling thread."""
    if max_workers == 1:
        return _run_in_order(nodes, run)
    pending = list(nodes)
    succeeded: set[str] = set()
    running: dict[Future[bool], Node] = {}
    failed = False
    error: BaseException | None = None
    with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="graph-node") as pool:
        while True:
            if not failed:
                for node in [n for n in pending if n.needs <= succeeded]:
                    if any(r.exclusive for r in running.values()):
                        break
                    if node.exclusive and running:
                        break
                    pending.remove(node)
                    running[pool.submit(run, node.name)] = node
                    if node.exclusive or len(running) >= max_workers:
                        break
            if not running:
                break
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                node = running.pop(future)
                try:
                    ok = future.result()
                except BaseException as exc:
                    error = error or exc
                    ok = False
                if ok:
                    succeeded.add(node.name)
                else:
                    failed = True
    if error is not None:
        raise error
    return not failed and not pending


def _run_in_order(nodes: Sequence[Node], run: Callable[[str], bool]) -> bool:
    """One node at a time: the first ready one in the order given."""
    pending, succeeded = list(nodes), set[str]()
    while pending:
        node = next((n for n in pending if n.needs <= succeeded), None)
        if node is None:
            raise ValueError(f"the nodes {', '.join(n.name for n in pending)} need each other")
        pending.remove(node)
        if not run(node.name):
            return False
        succeeded.add(node.name)
    return True
