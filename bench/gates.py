"""Structural gate checks: the strict checker against jsonschema-rs and python-jsonschema,
µs per check.

    python bench/gates.py [--repeat K] [--number N] [--stat median|best] [--json]
                          [--breakdown] [--profile] [--profile-case CASE]

Three schemas, each prepared for registration (``prepare_schema``) so both sides validate
against the same normalised (closed) schema:

- small: 4 flat properties;
- typical: an MCP-tool-sized schema, 15 properties at the top, a nested object, arrays
  of objects, enums, string patterns and lengths, integer ranges;
- large: a deployment spec 5 object levels deep (root, service, container, resources,
  limits), arrays of objects, ``$defs`` reached through ``$ref``, 101 declared properties.

For each, a valid instance and an invalid one with several deviations (extra fields at
two depths, both at the root for the flat small schema, a wrong type, a missing required
field, an enum mismatch), as the raw JSON
bytes an agent produced. Timed in the same run, the order of the sides rotating on every
repeat:

- ours: ``commands.schemas.checker.check(schema, raw, schema_sha256=sha)``, exactly as a
  gate calls it (it decodes the bytes itself; the compiled validators are cached by the
  digest);
- jsonschema-rs, the engine ours is built on (the floor): ``jsonschema_rs.
  Draft202012Validator(schema)`` built once, then ``validator.is_valid(json.loads(raw))``
  for a valid instance and ``list(validator.iter_errors(json.loads(raw)))`` for an invalid
  one (all errors, as our checker returns all deviations);
- python-jsonschema: ``jsonschema.Draft202012Validator(schema)`` built once, called the
  same way.

Parsing the bytes is inside every timed call. Before timing, the three must agree on
every verdict. Targets: ours at most 1.3x jsonschema-rs (valid and invalid); and, from
the first measurement, valid >= 50x faster than python-jsonschema, invalid >= 10x.
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import json
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import jsonschema_rs
from _common import (  # bench/ is sys.path[0] when run as `python bench/gates.py`
    console,
    err_console,
    machine_info,
    pick,
    print_machine,
    print_profile,
    profile_top,
)
from jsonschema import Draft202012Validator
from rich.table import Table

from commands.schemas.checker import check
from commands.schemas.prepare import iter_subschemas, prepare_schema

TARGET_SPEEDUP = {"valid": 50.0, "invalid": 10.0}  # python-jsonschema µs / ours µs
TARGET_OF_FLOOR = 1.3  # ours µs / jsonschema-rs µs, at most
# --number auto-scales so each timing loop takes about this long. Short loops and many
# repeats: each repeat times the three sides one after the other, so the ratio of two of
# them is taken within a fraction of a second, under about the same load (the machine is
# shared).
MEASURE_SECONDS = 0.05

# --- schemas ----------------------------------------------------------------------------------
# No "format" keywords: python-jsonschema does not assert formats unless given a format
# checker, ours always does; leaving them out keeps the two sides doing the same work.

SMALL: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "minLength": 1},
        "recursive": {"type": "boolean"},
        "depth": {"type": "integer", "minimum": 0, "maximum": 64},
        "encoding": {"enum": ["utf-8", "latin-1", "binary"]},
    },
    "required": ["path", "encoding"],
}

_LOGIN = {"type": "string", "pattern": "^[A-Za-z0-9-]{1,39}$"}

TYPICAL: dict[str, Any] = {
    "type": "object",
    "description": "Create an issue in a repository.",
    "properties": {
        "repo": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$"},
        "title": {"type": "string", "minLength": 1, "maxLength": 256},
        "body": {"type": "string", "maxLength": 65536},
        "labels": {
            "type": "array",
            "items": {"type": "string", "minLength": 1, "maxLength": 50},
            "maxItems": 20,
            "uniqueItems": True,
        },
        "assignees": {"type": "array", "items": _LOGIN, "maxItems": 10},
        "priority": {"enum": ["low", "medium", "high", "urgent"]},
        "estimate_hours": {"type": "number", "minimum": 0, "maximum": 1000},
        "milestone": {"type": "integer", "minimum": 1},
        "draft": {"type": "boolean"},
        "due": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "visibility": {"type": "string", "enum": ["public", "internal", "private"]},
        "notify": {"type": "boolean"},
        "reviewers": {
            "type": "array",
            "maxItems": 10,
            "items": {
                "type": "object",
                "properties": {"login": _LOGIN, "required": {"type": "boolean"}},
                "required": ["login"],
            },
        },
        "links": {
            "type": "array",
            "maxItems": 50,
            "items": {
                "type": "object",
                "properties": {
                    "kind": {"enum": ["blocks", "blocked_by", "duplicates", "relates"]},
                    "issue": {"type": "integer", "minimum": 1, "maximum": 10_000_000},
                },
                "required": ["kind", "issue"],
            },
        },
        "metadata": {
            "type": "object",
            "properties": {
                "source": {"enum": ["agent", "human", "import"]},
                "trace_id": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
                "retries": {"type": "integer", "minimum": 0, "maximum": 10},
            },
            "required": ["source"],
        },
    },
    "required": ["repo", "title", "priority"],
}


def _large_schema() -> dict[str, Any]:
    name = {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"}
    port_number = {"type": "integer", "minimum": 1, "maximum": 65535}
    seconds = {"type": "integer", "minimum": 0, "maximum": 3600}
    return {
        "type": "object",
        "$defs": {
            "quantity": {
                "type": "object",
                "properties": {
                    "cpu_millis": {"type": "integer", "minimum": 1, "maximum": 256_000},
                    "memory_mb": {"type": "integer", "minimum": 4, "maximum": 1_048_576},
                    "gpus": {"type": "integer", "minimum": 0, "maximum": 16},
                    "ephemeral_gb": {"type": "number", "minimum": 0},
                    "hugepages_mb": {"type": "integer", "minimum": 0},
                },
                "required": ["cpu_millis", "memory_mb"],
            },
            "env_var": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "pattern": "^[A-Z_][A-Z0-9_]*$"},
                    "value": {"type": "string", "maxLength": 4096},
                    "secret": {"type": "boolean"},
                },
                "required": ["name", "value"],
            },
            "port": {
                "type": "object",
                "properties": {
                    "name": name,
                    "container_port": port_number,
                    "host_port": port_number,
                    "protocol": {"enum": ["TCP", "UDP"]},
                },
                "required": ["container_port", "protocol"],
            },
            "probe": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "pattern": "^/"},
                    "port": port_number,
                    "scheme": {"enum": ["HTTP", "HTTPS"]},
                    "initial_delay_s": seconds,
                    "period_s": seconds,
                    "timeout_s": seconds,
                    "failure_threshold": {"type": "integer", "minimum": 1, "maximum": 100},
                    "success_threshold": {"type": "integer", "minimum": 1, "maximum": 100},
                },
                "required": ["path", "port"],
            },
            "volume_mount": {
                "type": "object",
                "properties": {
                    "volume": name,
                    "mount_path": {"type": "string", "pattern": "^/"},
                    "read_only": {"type": "boolean"},
                    "sub_path": {"type": "string"},
                },
                "required": ["volume", "mount_path"],
            },
            "container": {
                "type": "object",
                "properties": {
                    "name": name,
                    "image": {"type": "string", "pattern": "^[a-z0-9./-]+$", "maxLength": 255},
                    "tag": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,128}$"},
                    "pull_policy": {"enum": ["Always", "IfNotPresent", "Never"]},
                    "command": {"type": "array", "items": {"type": "string"}},
                    "args": {"type": "array", "items": {"type": "string"}},
                    "working_dir": {"type": "string", "pattern": "^/"},
                    "stdin": {"type": "boolean"},
                    "tty": {"type": "boolean"},
                    "termination_grace_s": seconds,
                    "lifecycle": {
                        "type": "object",
                        "properties": {
                            "post_start": {"type": "array", "items": {"type": "string"}},
                            "pre_stop": {"type": "array", "items": {"type": "string"}},
                        },
                    },
                    "env": {"type": "array", "items": {"$ref": "#/$defs/env_var"}},
                    "ports": {"type": "array", "items": {"$ref": "#/$defs/port"}},
                    "resources": {
                        "type": "object",
                        "properties": {
                            "requests": {"$ref": "#/$defs/quantity"},
                            "limits": {"$ref": "#/$defs/quantity"},
                        },
                        "required": ["requests"],
                    },
                    "liveness": {"$ref": "#/$defs/probe"},
                    "readiness": {"$ref": "#/$defs/probe"},
                    "mounts": {"type": "array", "items": {"$ref": "#/$defs/volume_mount"}},
                    "security": {
                        "type": "object",
                        "properties": {
                            "run_as_user": {"type": "integer", "minimum": 0},
                            "read_only_root": {"type": "boolean"},
                            "privileged": {"type": "boolean"},
                            "capabilities": {
                                "type": "object",
                                "properties": {
                                    "add": {"type": "array", "items": {"type": "string"}},
                                    "drop": {"type": "array", "items": {"type": "string"}},
                                },
                            },
                        },
                    },
                },
                "required": ["name", "image", "resources"],
            },
        },
        "properties": {
            "api_version": {"const": "deploy/v2"},
            "name": name,
            "namespace": name,
            "environment": {"enum": ["dev", "staging", "production"]},
            "region": {"enum": ["eu-west", "eu-central", "us-east", "us-west", "ap-south"]},
            "cost_center": {"type": "string", "pattern": "^CC-[0-9]{4}$"},
            "owner": {"type": "string", "pattern": "^[a-z]+@[a-z.]+$"},
            "description": {"type": "string", "maxLength": 1000},
            "replicas": {"type": "integer", "minimum": 0, "maximum": 1000},
            "strategy": {
                "type": "object",
                "properties": {
                    "kind": {"enum": ["rolling", "recreate", "blue_green"]},
                    "rolling": {
                        "type": "object",
                        "properties": {
                            "max_surge": {"type": "integer", "minimum": 0},
                            "max_unavailable": {"type": "integer", "minimum": 0},
                            "pause_s": seconds,
                        },
                    },
                },
                "required": ["kind"],
            },
            "services": {
                "type": "array",
                "minItems": 1,
                "maxItems": 20,
                "items": {
                    "type": "object",
                    "properties": {
                        "name": name,
                        "tier": {"enum": ["frontend", "backend", "worker", "cron"]},
                        "schedule": {"type": "string", "pattern": "^[0-9*/,-]+( [0-9*/,-]+){4}$"},
                        "priority_class": {"enum": ["low", "normal", "high", "critical"]},
                        "max_restarts": {"type": "integer", "minimum": 0, "maximum": 100},
                        "containers": {
                            "type": "array",
                            "minItems": 1,
                            "items": {"$ref": "#/$defs/container"},
                        },
                        "init_containers": {
                            "type": "array",
                            "items": {"$ref": "#/$defs/container"},
                        },
                        "volumes": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "name": name,
                                    "kind": {"enum": ["empty_dir", "secret", "config", "pvc"]},
                                    "size_gb": {"type": "integer", "minimum": 1},
                                    "source": {"type": "string"},
                                },
                                "required": ["name", "kind"],
                            },
                        },
                        "autoscale": {
                            "type": "object",
                            "properties": {
                                "min": {"type": "integer", "minimum": 0},
                                "max": {"type": "integer", "minimum": 1},
                                "target_cpu_percent": {
                                    "type": "integer",
                                    "minimum": 1,
                                    "maximum": 100,
                                },
                            },
                            "required": ["min", "max"],
                        },
                        "exposure": {
                            "type": "object",
                            "properties": {
                                "public": {"type": "boolean"},
                                "hostnames": {
                                    "type": "array",
                                    "items": {"type": "string", "maxLength": 253},
                                },
                                "tls": {
                                    "type": "object",
                                    "properties": {
                                        "enabled": {"type": "boolean"},
                                        "min_version": {"enum": ["1.2", "1.3"]},
                                        "certificate": {"type": "string"},
                                    },
                                },
                            },
                        },
                    },
                    "required": ["name", "containers"],
                },
            },
            "rollback": {
                "type": "object",
                "properties": {
                    "enabled": {"type": "boolean"},
                    "on_error_rate": {"type": "number", "minimum": 0, "maximum": 1},
                    "window_s": seconds,
                    "max_history": {"type": "integer", "minimum": 1, "maximum": 100},
                },
            },
            "notifications": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "channel": {"enum": ["email", "slack", "pager"]},
                        "target": {"type": "string", "minLength": 1},
                        "mute_minutes": {"type": "integer", "minimum": 0, "maximum": 1440},
                        "on": {
                            "type": "array",
                            "items": {"enum": ["start", "success", "failure", "rollback"]},
                        },
                    },
                    "required": ["channel", "target"],
                },
            },
        },
        "required": ["api_version", "name", "namespace", "environment", "services"],
    }


LARGE = _large_schema()


def declared_properties(schema: Any) -> int:
    """Property declarations in the whole document (each ``$defs`` entry counted once)."""
    return sum(
        len(node["properties"])
        for _, node in iter_subschemas(schema)
        if isinstance(node, dict) and isinstance(node.get("properties"), dict)
    )


def object_depth(schema: Any, defs: dict[str, Any] | None = None) -> int:
    """How many object levels an instance can nest (following local ``$ref``)."""
    defs = schema.get("$defs", {}) if defs is None else defs
    if not isinstance(schema, dict):
        return 0
    if "$ref" in schema:
        return object_depth(defs[schema["$ref"].rsplit("/", 1)[1]], defs)
    below = [object_depth(sub, defs) for sub in schema.get("properties", {}).values()]
    if "items" in schema:
        below.append(object_depth(schema["items"], defs))
    deepest = max(below, default=0)
    return deepest + 1 if "properties" in schema else deepest


# --- instances --------------------------------------------------------------------------------


def small_valid() -> dict[str, Any]:
    return {"path": "src/ledger", "recursive": True, "depth": 3, "encoding": "utf-8"}


def small_invalid() -> dict[str, Any]:
    # Flat schema: the two extra fields are both at the root (there is no second depth).
    doc = small_valid()
    doc["depth"] = "3"  # wrong type
    del doc["path"]  # missing required
    doc["encoding"] = "utf-16"  # enum mismatch
    doc["follow_links"] = True  # extra
    doc["glob"] = "*.py"  # extra
    return doc


def typical_valid() -> dict[str, Any]:
    return {
        "repo": "acme/widgets",
        "title": "Gate check fails on nested enum in reviewers",
        "body": "Steps to reproduce:\n1. register the tool\n2. call it with an unknown "
        "reviewer role\n\nExpected: one deviation. Actual: the call is executed.",
        "labels": ["bug", "gates", "p1"],
        "assignees": ["alice", "bob-b"],
        "priority": "high",
        "estimate_hours": 3.5,
        "milestone": 12,
        "draft": False,
        "due": "2026-12-15",
        "visibility": "internal",
        "notify": True,
        "reviewers": [{"login": "carol", "required": True}, {"login": "dave"}],
        "links": [{"kind": "blocks", "issue": 4711}, {"kind": "relates", "issue": 42}],
        "metadata": {
            "source": "agent",
            "trace_id": "0123456789abcdef0123456789abcdef",
            "retries": 0,
        },
    }


def typical_invalid() -> dict[str, Any]:
    doc = typical_valid()
    doc["milestone"] = "12"  # wrong type
    del doc["title"]  # missing required
    doc["priority"] = "critical"  # enum mismatch
    doc["confidential"] = True  # extra at the root
    doc["reviewers"][1]["team"] = "core"  # extra two levels down
    return doc


def _container(service: int, index: int) -> dict[str, Any]:
    port = 8080 + index
    probe = {
        "path": "/healthz",
        "port": port,
        "scheme": "HTTP",
        "initial_delay_s": 5,
        "period_s": 10,
        "timeout_s": 2,
        "failure_threshold": 3,
    }
    return {
        "name": f"app-{service}-{index}",
        "image": f"registry.example.com/acme/app-{index}",
        "tag": "1.24.3",
        "pull_policy": "IfNotPresent",
        "command": ["/usr/bin/app"],
        "args": ["--listen", f":{port}", "--log-level", "info"],
        "working_dir": "/srv",
        "termination_grace_s": 30,
        "lifecycle": {"pre_stop": ["/usr/bin/app", "drain"]},
        "env": [
            {"name": "APP_MODE", "value": "production"},
            {"name": "DATABASE_URL", "value": "postgres://db:5432/app", "secret": True},
            {"name": "WORKERS", "value": "4"},
        ],
        "ports": [{"name": "http", "container_port": port, "protocol": "TCP"}],
        "resources": {
            "requests": {"cpu_millis": 250, "memory_mb": 256},
            "limits": {"cpu_millis": 1000, "memory_mb": 1024, "gpus": 0, "ephemeral_gb": 2.5},
        },
        "liveness": probe,
        "readiness": dict(probe, path="/ready"),
        "mounts": [{"volume": "cache", "mount_path": "/var/cache/app", "read_only": False}],
        "security": {
            "run_as_user": 1000,
            "read_only_root": True,
            "privileged": False,
            "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
        },
    }


def large_valid() -> dict[str, Any]:
    return {
        "api_version": "deploy/v2",
        "name": "widgets",
        "namespace": "shop",
        "environment": "production",
        "region": "eu-west",
        "cost_center": "CC-0042",
        "owner": "team@acme.example",
        "description": "Widget storefront and its workers.",
        "replicas": 3,
        "strategy": {
            "kind": "rolling",
            "rolling": {"max_surge": 1, "max_unavailable": 0, "pause_s": 30},
        },
        "services": [
            {
                "name": f"svc-{s}",
                "tier": ("frontend", "backend")[s],
                "priority_class": "high",
                "max_restarts": 5,
                "containers": [_container(s, i) for i in range(2)],
                "volumes": [{"name": "cache", "kind": "empty_dir", "size_gb": 1}],
                "autoscale": {"min": 2, "max": 10, "target_cpu_percent": 70},
                "exposure": {
                    "public": s == 0,
                    "hostnames": ["shop.example.com"],
                    "tls": {"enabled": True, "min_version": "1.3"},
                },
            }
            for s in range(2)
        ],
        "rollback": {"enabled": True, "on_error_rate": 0.05, "window_s": 300, "max_history": 10},
        "notifications": [
            {"channel": "slack", "target": "#deploys", "on": ["failure", "rollback"]}
        ],
    }


def large_invalid() -> dict[str, Any]:
    doc = large_valid()
    doc["replicas"] = "3"  # wrong type
    doc["dry_run"] = True  # extra at the root
    container = doc["services"][1]["containers"][0]
    del container["image"]  # missing required (in a $ref'd definition)
    container["ports"][0]["protocol"] = "SCTP"  # enum mismatch, 5 levels down
    container["resources"]["limits"]["burst_millis"] = 2000  # extra, 5 levels down
    return doc


CASES: dict[str, tuple[dict[str, Any], Callable[[], Any], Callable[[], Any]]] = {
    "small": (SMALL, small_valid, small_invalid),
    "typical": (TYPICAL, typical_valid, typical_invalid),
    "large": (LARGE, large_valid, large_invalid),
}


# --- timing -----------------------------------------------------------------------------------


def per_call_us(fn: Callable[[], object], number: int) -> float:
    """µs per call over one loop of ``number`` calls (garbage collection left on, as in a
    gate: both sides pay for what they allocate)."""
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number * 1e6


def auto_number(fn: Callable[[], object], seconds: float = MEASURE_SECONDS) -> int:
    """Calls per timing loop so that one loop takes about ``seconds``."""
    number = 1
    while True:
        elapsed = per_call_us(fn, number) * number / 1e6
        if elapsed >= seconds / 10 or number >= 1 << 24:
            return max(1, round(number * seconds / max(elapsed, 1e-9)))
        number *= 10


def measure(fn: Callable[[], object], number: int, repeat: int, stat: str) -> float:
    return pick([per_call_us(fn, number) for _ in range(repeat)], stat)


def breakdown(
    schema: Any, sha: str, raw: bytes, variant: str, args: argparse.Namespace
) -> dict[str, float] | None:
    """Where the time of one check goes: each step of ``check`` timed on its own, and,
    for an invalid instance, what the slow path (every jsonschema-rs error translated)
    would cost instead of the walk. Uses the checker's internals (so it says so and
    gives up if they have changed)."""
    try:
        from commands.schemas.checker import (
            _check,
            _compiled,
            _decoder,
            _duplicate_members,
            _finish,
            _may_break_rules,
            _seen,
            _slow,
            _walk,
        )
    except ImportError as exc:
        err_console.print(f"[yellow]no breakdown: the checker's internals changed ({exc})[/]")
        return None
    seconds = MEASURE_SECONDS
    _seen.integral_float = _seen.unsafe_float = False
    instance = _decoder.decode(raw)
    compiled = _compiled(schema, sha)
    validator = compiled.strict if _seen.integral_float else compiled.plain
    steps: dict[str, Callable[[], object]] = {
        "decode (msgspec + float hook)": lambda: _decoder.decode(raw),
        "input rules (depth, big numbers) from the bytes": lambda: _may_break_rules(raw, instance),
        "duplicate-member check": lambda: _duplicate_members(raw, instance),
        "compiled-validator lookup": lambda: _compiled(schema, sha),
        "is_valid (jsonschema-rs)": lambda: validator.is_valid(instance),
    }
    found: list[Any] = []
    slow_steps: dict[str, Callable[[], object]] = {}
    if variant == "invalid":
        plan = compiled.plan
        if plan is None:
            err_console.print("[yellow]the fast path does not judge this schema[/]")
            return None

        def walk() -> list[Any]:
            out: list[Any] = []
            _walk(plan, instance, "", compiled, out)
            return out

        found = walk()
        steps["walk: structure in Python, values by jsonschema-rs"] = walk
        steps["_finish: filter, dedupe, sort (Python)"] = lambda: _finish(found)
        slow_steps = {
            "(slow path) iter_errors drained (jsonschema-rs)": lambda: list(
                validator.iter_errors(instance)
            ),
            "(slow path) + every error translated": lambda: _slow(validator, instance, compiled),
            "(slow path) check() total": lambda: _check(schema, raw, sha, fast=False),
        }
    times = {
        name: measure(fn, auto_number(fn, seconds), args.repeat, args.stat)
        for name, fn in steps.items()
    }

    def total() -> object:
        return check(schema, raw, schema_sha256=sha)

    times["check() total"] = measure(total, auto_number(total, seconds), args.repeat, args.stat)
    parts = sum(v for k, v in times.items() if k != "check() total")
    times["rest (check minus the steps above)"] = times["check() total"] - parts

    def loads() -> object:
        return json.loads(raw)

    slow_steps["theirs: json.loads"] = loads
    for name, fn in slow_steps.items():
        times[name] = measure(fn, auto_number(fn, seconds), args.repeat, args.stat)
    return times


def error_name(error: Any) -> str:
    return str(error.validator)


def rs_error_name(error: Any) -> str:
    return type(error.kind).__name__


SIDES = ("ours", "rs", "py")


# --- the run ----------------------------------------------------------------------------------


def run_case(
    case: str,
    variant: str,
    schema: Any,
    sha: str,
    validators: dict[str, Any],
    raw: bytes,
    args: argparse.Namespace,
    out: Any,
) -> tuple[dict[str, Any], Callable[[], object]]:
    rs, py = validators["rs"], validators["py"]

    def ours() -> object:
        return check(schema, raw, schema_sha256=sha)  # as a gate calls it

    if variant == "valid":

        def rs_side() -> object:
            return rs.is_valid(json.loads(raw))

        def py_side() -> object:
            return py.is_valid(json.loads(raw))

    else:

        def rs_side() -> object:
            return list(rs.iter_errors(json.loads(raw)))  # all errors, like ours

        def py_side() -> object:
            return list(py.iter_errors(json.loads(raw)))

    calls = {"ours": ours, "rs": rs_side, "py": py_side}

    # Verdicts first (this also fills the compiled-validator cache, as a gate's first call).
    deviations = check(schema, raw, schema_sha256=sha)
    rs_errors = list(rs.iter_errors(json.loads(raw)))
    py_errors = list(py.iter_errors(json.loads(raw)))
    verdicts = {bool(deviations), bool(rs_errors), bool(py_errors), variant == "invalid"}
    if len(verdicts) != 1:
        raise SystemExit(
            f"{case}/{variant}: verdicts disagree: ours {len(deviations)} deviations, "
            f"jsonschema-rs {len(rs_errors)} errors, python-jsonschema {len(py_errors)} errors"
        )
    ours_kinds = dict(Counter(d.kind for d in deviations))
    rs_kinds = dict(Counter(rs_error_name(e) for e in rs_errors))
    py_kinds = dict(Counter(error_name(e) for e in py_errors))
    out.print(
        f"{case}/{variant}: {len(raw):,} bytes, all {'fail' if deviations else 'pass'}; "
        f"ours {len(deviations)} deviations {ours_kinds or ''}, jsonschema-rs "
        f"{len(rs_errors)} errors {rs_kinds or ''}, python-jsonschema {len(py_errors)} "
        f"errors {py_kinds or ''}",
        highlight=False,
    )
    for d in deviations:
        out.print(
            f"    {d.kind:<17} {d.pointer or '(root)'}  expected {d.expected}",
            highlight=False,
            markup=False,
        )

    numbers = {side: args.number or auto_number(fn) for side, fn in calls.items()}
    samples: dict[str, list[float]] = {side: [] for side in SIDES}
    for r in range(args.repeat):
        # Rotate who goes first so drift in machine load hits every side alike.
        for side in SIDES[r % 3 :] + SIDES[: r % 3]:
            samples[side].append(per_call_us(calls[side], numbers[side]))
    us = {side: pick(samples[side], args.stat) for side in SIDES}
    of_floor = [o / f for o, f in zip(samples["ours"], samples["rs"], strict=True)]
    speedups = [p / o for o, p in zip(samples["ours"], samples["py"], strict=True)]
    if args.stat == "median":
        # The median of the per-repeat ratios: each ratio is of two timings taken one
        # after the other, so a change in the machine's load hits both of them.
        ratio_of_floor, speedup = statistics.median(of_floor), statistics.median(speedups)
    else:
        ratio_of_floor, speedup = us["ours"] / us["rs"], us["py"] / us["ours"]
    target = TARGET_SPEEDUP[variant]
    row = {
        "schema": case,
        "instance": variant,
        "declared_properties": declared_properties(schema),
        "object_depth": object_depth(schema),
        "bytes": len(raw),
        "ours_deviations": len(deviations),
        "ours_kinds": ours_kinds,
        "rs_errors": len(rs_errors),
        "rs_kinds": rs_kinds,
        "theirs_errors": len(py_errors),
        "theirs_kinds": py_kinds,
        "ours_us": round(us["ours"], 2),
        "rs_us": round(us["rs"], 2),
        "theirs_us": round(us["py"], 2),
        "of_floor": round(ratio_of_floor, 2),
        "of_floor_range": [round(min(of_floor), 2), round(max(of_floor), 2)],
        "target_of_floor": TARGET_OF_FLOOR,
        "met_of_floor": ratio_of_floor <= TARGET_OF_FLOOR,
        "speedup": round(speedup, 1),
        "per_run_range": [round(min(speedups), 1), round(max(speedups), 1)],
        "target_speedup": target,
        "met": speedup >= target,
        "number_ours": numbers["ours"],
        "number_rs": numbers["rs"],
        "number_theirs": numbers["py"],
        "ours_samples_us": [round(s, 2) for s in samples["ours"]],
        "rs_samples_us": [round(s, 2) for s in samples["rs"]],
        "theirs_samples_us": [round(s, 2) for s in samples["py"]],
    }
    if args.breakdown:
        times = breakdown(schema, sha, raw, variant, args)
        if times is not None:
            row["breakdown_us"] = {k: round(v, 2) for k, v in times.items()}
    return row, ours


def print_results(out: Any, rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    table = Table(
        title=f"structural gate check, µs per check ({args.stat} of {args.repeat}; "
        "every side parses the raw bytes)",
        title_justify="left",
    )
    for col in (
        "schema",
        "instance",
        "props",
        "bytes",
        "dev / rs / py",
        "ours µs",
        "jsonschema-rs µs",
        "python-jsonschema µs",
        "ours ÷ rs",
        "per-run range",
        f"<= {TARGET_OF_FLOOR}x",
        "py ÷ ours",
        "target",
        "met",
    ):
        table.add_column(col, justify="left" if col in ("schema", "instance") else "right")

    def met(ok: bool) -> str:
        return "[green]yes[/]" if ok else "[red]no[/]"

    for r in rows:
        low, high = r["of_floor_range"]
        table.add_row(
            r["schema"],
            r["instance"],
            str(r["declared_properties"]),
            f"{r['bytes']:,}",
            f"{r['ours_deviations']} / {r['rs_errors']} / {r['theirs_errors']}",
            f"{r['ours_us']:.1f}",
            f"{r['rs_us']:.1f}",
            f"{r['theirs_us']:.1f}",
            f"{r['of_floor']:.2f}x",
            f"{low:.2f}-{high:.2f}x",
            met(r["met_of_floor"]),
            f"{r['speedup']:.1f}x",
            f">= {r['target_speedup']:.0f}x",
            met(r["met"]),
        )
    out.print(table)
    with_breakdown = [r for r in rows if "breakdown_us" in r]
    if not with_breakdown:
        return
    keys = [k for r in with_breakdown for k in r["breakdown_us"]]
    last = ("check() total", "rest (check minus the steps above)")
    later = [k for k in dict.fromkeys(keys) if k.startswith("(slow path)")]
    later.append("theirs: json.loads")
    first = [k for k in dict.fromkeys(keys) if k not in last and k not in later]
    steps = first + [k for k in (*last, *later) if k in keys]
    table = Table(
        title="ours, step by step (µs per check; each step timed on its own)", title_justify="left"
    )
    table.add_column("step")
    for r in with_breakdown:
        table.add_column(f"{r['schema']} {r['instance']}", justify="right")
    for step in steps:
        table.add_row(
            step,
            *(
                f"{r['breakdown_us'][step]:.2f}" if step in r["breakdown_us"] else ""
                for r in with_breakdown
            ),
        )
    out.print(table)


def load_average() -> str:
    """The 1/5/15-minute load averages: the machine is shared, so say how busy it was."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=15, help="timing loops per side and case")
    ap.add_argument(
        "--number",
        type=int,
        default=0,
        help=f"calls per timing loop (default: about {MEASURE_SECONDS} s a loop)",
    )
    ap.add_argument("--stat", choices=("median", "best"), default="median")
    ap.add_argument(
        "--json", action="store_true", help="print JSON on stdout (the tables go to stderr)"
    )
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="also time each step of ours on its own (uses checker internals)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also cProfile ours on --profile-case and print the hot spots",
    )
    ap.add_argument(
        "--profile-case",
        default="large-invalid",
        choices=[f"{c}-{v}" for c in CASES for v in ("valid", "invalid")],
    )
    ap.add_argument("--profile-top", type=int, default=12)
    args = ap.parse_args(argv)
    out = err_console if args.json else console

    info = machine_info(None)
    for package in ("jsonschema", "jsonschema_rs"):
        info[package] = importlib.metadata.version(package)
    info["load_before"] = load_average()
    if not args.json:
        print_machine(info)
    out.print(
        "Every side starts from the raw JSON bytes inside the timed call: ours "
        "check(schema, raw, schema_sha256=sha) decodes them (msgspec); jsonschema-rs and "
        "python-jsonschema json.loads(raw), then their Draft202012Validator built once. "
        "Same normalised (closed) schema on every side.",
        highlight=False,
    )

    rows: list[dict[str, Any]] = []
    calls: dict[str, Callable[[], object]] = {}
    for case, (declared, make_valid, make_invalid) in CASES.items():
        prepared = prepare_schema(copy.deepcopy(declared))
        schema, sha = prepared.normalised, prepared.sha256
        validators = {  # built once, reused: their best case
            "rs": jsonschema_rs.Draft202012Validator(schema),
            "py": Draft202012Validator(schema),
        }
        for variant, make in (("valid", make_valid), ("invalid", make_invalid)):
            raw = json.dumps(make(), separators=(",", ":")).encode()  # as an agent sends it
            row, ours = run_case(case, variant, schema, sha, validators, raw, args, out)
            rows.append(row)
            calls[f"{case}-{variant}"] = ours
    print_results(out, rows, args)

    profile: list[dict[str, Any]] = []
    if args.profile:
        fn = calls[args.profile_case]
        n = auto_number(fn, 1.0)  # about a second of calls (more under the profiler)

        def loop() -> None:
            for _ in range(n):
                fn()

        profile = profile_top(loop, args.profile_top)
        print_profile(out, f"cProfile ours, {args.profile_case}, {n:,} checks", profile)
    info["load_after"] = load_average()
    out.print(f"load average before {info['load_before']}, after {info['load_after']}")
    if args.json:
        print(
            json.dumps(
                {
                    "machine": info,
                    "results": rows,
                    "profile": {"case": args.profile_case, "top": profile}
                    if args.profile
                    else None,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
