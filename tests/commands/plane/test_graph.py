"""Actor graphs in plan files: steps that need other steps and take parameters from
their outputs (JMESPath), validations as nodes, load-time checks, parallel nodes —
through ``evidence run`` on real ledgers with real subprocesses."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import jmespath
import pytest
import yaml

import ledger
from commands.plane import Plane
from commands.plane.driver import run_plan_file
from commands.plane.graph import Node, field_paths, impossible_field, run_graph
from commands.schemas.prepare import prepare_schema
from tests.helpers import assert_refused, run_cli

# -- the scripts the graphs' tools run ----------------------------------------------------

SCRIPTS = {
    # prints the JSON given as its argument, after sleeping the seconds given first
    "emit.py": ("import json, sys, time\ntime.sleep(float(sys.argv[1]))\nprint(sys.argv[2])\n"),
    # prints the parameter it got under `got` (argv holds a string as is, else its JSON)
    "echo.py": (
        "import json, sys\n"
        "try:\n    got = json.loads(sys.argv[1])\n"
        "except ValueError:\n    got = sys.argv[1]\n"
        "print(json.dumps({'got': got}))\n"
    ),
    # writes a file into its working directory, then prints {}
    "scribble.py": (
        "import pathlib, sys\npathlib.Path(sys.argv[1]).write_text('scribbled')\nprint('{}')\n"
    ),
    # a validation: passes, with data
    "check.py": (
        "import json\n"
        "print(json.dumps({'passed': True, 'message': 'fine', 'data': {'count': 3}}))\n"
    ),
}

FILES_SCHEMA = {
    "type": "object",
    "properties": {"files": {"type": "array", "items": {"type": "string"}}},
    "required": ["files"],
}


def emit(name: str, output: dict[str, Any], *, sleep: float = 0.0, **extra: Any) -> dict:
    """A tool that sleeps, then prints ``output`` (its argv is fixed: no parameters)."""
    text = json.dumps(output).replace("{", "{{").replace("}", "}}")
    return {"name": name, "command": ["python", "emit.py", str(sleep), text], **extra}


def echo(name: str, input_schema: dict[str, Any]) -> dict:
    """A tool that prints ``{"got": <its parameters>}``."""
    return {
        "name": name,
        "command": ["python", "echo.py", "{params}"],
        "input_schema": {
            "type": "object",
            "properties": {"params": input_schema},
            "required": ["params"],
        },
        "output_schema": {"type": "object", "properties": {"got": {}}, "required": ["got"]},
    }


def plan_file(
    root: Path,
    steps: list[dict],
    *,
    tools: list[dict] | None = None,
    validations: list[dict] | None = None,
    config: dict | None = None,
    plan_id: str = "graph",
    suffix: str = ".yaml",
) -> Path:
    """A project with the scripts, a validation attached that passes, and a plan file
    whose one attempt has ``steps``."""
    project = root / "project"
    project.mkdir(parents=True, exist_ok=True)
    for name, text in SCRIPTS.items():
        (project / name).write_text(text)
    doc = {
        "plan": {
            "id": plan_id,
            "project": "p",
            "resources": ["project"],
            "global_config": config or {},
        },
        "tools": tools or [],
        "validations": [
            {"name": "always", "mode": "required", "command": ["python", "check.py"]},
            *(validations or []),
        ],
        "attachments": [{"validation": "always", "resource": "project"}],
        "agent": {"strategies": [{"strategy": "go", "attempts": [{"steps": steps}]}]},
    }
    path = root / f"plan{suffix}"
    if suffix == ".toml":
        path.write_text(_toml(doc))
    else:
        plain = json.loads(json.dumps(doc))  # no shared objects: YAML aliases are refused
        path.write_text(yaml.safe_dump(plain, sort_keys=False))
    return path


def _toml(doc: dict) -> str:
    """Just enough TOML for these plan files (inline tables throughout)."""

    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)

    return "".join(f"{key} = {value(v)}\n" for key, v in doc.items())


def run(db_url: str, path: Path) -> dict:
    result = run_cli(
        "run", str(path), "--json", "--db", db_url, "--workdir", str(path.parent / "work")
    )
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)["run"]


def events(db_url: str, plan: str = "graph") -> list[Any]:
    with ledger.open(db_url) as store:
        return list(store.read_stream(f"plan:{plan}"))


def calls(db_url: str, plan: str = "graph") -> dict[str, Any]:
    """Each step's (last) tool.called payload."""
    return {e.payload.step: e.payload for e in events(db_url, plan) if e.type == "tool.called"}


def gate_checks(db_url: str, step_or_tool: str, gate: str, plan: str = "graph") -> list[Any]:
    return [
        e.payload
        for e in events(db_url, plan)
        if e.type == "gate.checked"
        and e.payload.gate == gate
        and step_or_tool in (e.payload.step, e.payload.tool)
    ]


def blob_json(db_url: str, digest: str) -> Any:
    with ledger.open(db_url) as store:
        data = store.get_blob(digest)
    assert data is not None
    return json.loads(data)


def moment(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# -- running graphs through `evidence run` --------------------------------------------------


def test_outputs_flow_downstream_and_validations_are_nodes(db_url: str, tmp_path: Path) -> None:
    """`from` takes a producer's output; a validation's structured return (with data) is
    data downstream, and gates nothing it is not attached for; every node is recorded as
    a step is: input gate, call, output gate, step id = the node's name."""
    tools = [
        emit("look", {"files": ["a.py", "b.py"]}, output_schema=FILES_SCHEMA),
        echo(
            "use",
            {
                "type": "object",
                "properties": {
                    "files": {"type": "array"},
                    "count": {"type": "integer"},
                    "data": {"type": "integer"},
                    "passed": {"type": "boolean"},
                    "fixed": {"type": "string"},
                },
            },
        ),
    ]
    validations = [{"name": "probe", "mode": "informational", "command": ["python", "check.py"]}]
    steps = [
        {"step": "look", "tool": "look"},
        {"step": "probe", "tool": "probe"},
        {
            "step": "use",
            "tool": "use",
            "from": {
                "params": (
                    "{files: steps.look.output.files, count: length(steps.look.output.files),"
                    " data: steps.probe.output.data.count, passed: steps.probe.output.passed}"
                )
            },
        },
    ]
    path = plan_file(tmp_path, steps, tools=tools, validations=validations)
    result = run(db_url, path)
    assert (result["state"], result["outcome"], result["verify_ok"]) == ("applied", "pass", True)
    made = calls(db_url)
    assert set(made) == {"look", "probe", "use"}
    assert made["probe"].executor == "validation"
    params = blob_json(db_url, made["use"].params_sha256)
    assert params == {"params": {"files": ["a.py", "b.py"], "count": 2, "data": 3, "passed": True}}
    assert blob_json(db_url, made["use"].output_sha256) == {"got": params["params"]}
    for step in ("look", "probe", "use"):
        assert [g.verdict for g in gate_checks(db_url, step, "output")] == ["pass"]
    # The validation as a node gates nothing: only the attached one has results.
    results = [
        e.payload.validation for e in events(db_url) if e.type == "validation.result_recorded"
    ]
    assert results == ["always"]
    assert run_cli("audit", "--db", db_url).returncode == 0


@pytest.mark.slow  # tools that sleep to make overlaps measurable
def test_independent_nodes_run_in_parallel(db_url: str, tmp_path: Path) -> None:
    """Two independent nodes of 1 s each take well under 2 s together; their consumer
    starts after both."""
    tools = [
        emit("slow-a", {"files": ["a"]}, sleep=1.0, output_schema=FILES_SCHEMA),
        emit("slow-b", {"files": ["b"]}, sleep=1.0, output_schema=FILES_SCHEMA),
        echo("join", {"type": "array", "items": {"type": "string"}}),
    ]
    steps = [
        {"step": "a", "tool": "slow-a"},
        {"step": "b", "tool": "slow-b"},
        {
            "step": "join",
            "tool": "join",
            "from": {"params": "[steps.a.output.files[0], steps.b.output.files[0]]"},
        },
    ]
    path = plan_file(tmp_path, steps, tools=tools)
    result = run(db_url, path)
    assert result["state"] == "applied"
    made = calls(db_url)
    a, b, join = made["a"], made["b"], made["join"]
    assert a.duration_ms >= 1000 and b.duration_ms >= 1000
    together = max(moment(a.ended_at), moment(b.ended_at)) - min(
        moment(a.started_at), moment(b.started_at)
    )
    assert together < 1.6, together  # serial would be 2 s and more
    assert moment(join.started_at) >= max(moment(a.ended_at), moment(b.ended_at))
    assert blob_json(db_url, join.output_sha256) == {"got": ["a", "b"]}


@pytest.mark.slow  # tools that sleep to make overlaps measurable
def test_a_writer_runs_alone_and_a_reader_cannot_write(db_url: str, tmp_path: Path) -> None:
    """A tool declaring `writes: true` never overlaps another node, and its write
    reaches the sandbox (and Apply); a tool that does not declare it runs in a copy of
    the sandbox: its write is dropped, and said."""
    tools = [
        emit("slow-a", {"files": []}, sleep=0.5, output_schema=FILES_SCHEMA),
        emit("slow-b", {"files": []}, sleep=0.5, output_schema=FILES_SCHEMA),
        {
            "name": "writer",
            "writes": True,
            "command": ["python", "scribble.py", "written.txt"],
            "output_schema": {"type": "object"},
        },
        {
            "name": "sneak",
            "command": ["python", "scribble.py", "sneaked.txt"],
            "output_schema": {"type": "object"},
        },
    ]
    steps = [
        {"step": "a", "tool": "slow-a"},
        {"step": "w", "tool": "writer", "needs": []},
        {"step": "b", "tool": "slow-b"},
        {"step": "s", "tool": "sneak", "needs": ["a"]},
    ]
    path = plan_file(tmp_path, steps, tools=tools)
    result = run_cli(
        "run", str(path), "--db", db_url, "--workdir", str(tmp_path / "work"), cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "s: sneak changed its copy of the sandbox but does not declare `writes: true`" in (
        result.stdout
    )
    made = calls(db_url)
    w = made["w"]
    for other in ("a", "b", "s"):
        o = made[other]
        apart = moment(o.ended_at) <= moment(w.started_at) or moment(w.ended_at) <= moment(
            o.started_at
        )
        assert apart, (other, o.started_at, o.ended_at, w.started_at, w.ended_at)
    assert (tmp_path / "project" / "written.txt").read_text() == "scribbled"  # applied
    assert not (tmp_path / "project" / "sneaked.txt").exists()


def test_a_value_that_does_not_fit_is_a_recorded_input_deviation(
    db_url: str, tmp_path: Path
) -> None:
    """What an expression yields is checked by the consumer's input gate like any
    parameter: a wrong type (and a function that fails on the output, which gives null)
    is a recorded deviation; at max_iterations the attempt fails and the failure loop
    takes it: a strategy revision (a second run of the strategy), then a human decides."""
    tools = [
        emit("look", {"files": ["a.py"]}, output_schema=FILES_SCHEMA),
        echo("count", {"type": "integer"}),
    ]
    steps = [
        {"step": "look", "tool": "look"},
        {"step": "count", "tool": "count", "from": {"params": "steps.look.output.files"}},
    ]
    path = plan_file(tmp_path, steps, tools=tools, config={"max_iterations": 2})
    result = run(db_url, path)
    assert result["halt"]["halt_type"] == "escalate", result
    assert "max_iterations" in result["halt"]["reason"]
    checks = gate_checks(db_url, "count", "input")
    assert [c.verdict for c in checks] == ["fail"] * 4  # two iterations, two strategies
    assert checks[0].deviations[0].pointer == "/params"
    assert checks[0].deviations[0].actual_type == "array"
    assert blob_json(db_url, checks[0].checked_sha256) == {"params": ["a.py"]}
    assert "count" not in calls(db_url)  # never called with a value that does not fit


def test_a_failing_expression_passes_null_to_the_gate(sqlite_url: str, tmp_path: Path) -> None:
    tools = [
        emit("look", {"files": ["a.py"]}, output_schema=FILES_SCHEMA),
        echo("count", {"type": "integer"}),
    ]
    steps = [
        {"step": "look", "tool": "look"},
        # abs() of an array: a JMESPath type error when it runs
        {"step": "count", "tool": "count", "from": {"params": "abs(steps.look.output.files)"}},
    ]
    config = {"max_iterations": 1, "max_strategy_revisions": 0}  # one check, then a human
    path = plan_file(tmp_path, steps, tools=tools, config=config)
    result = run_cli("run", str(path), "--db", sqlite_url, "--workdir", str(tmp_path / "w"))
    assert result.returncode == 1
    assert "count: `from.params` failed" in result.stdout and "passed as null" in result.stdout
    (check,) = gate_checks(sqlite_url, "count", "input")
    assert check.verdict == "fail" and check.deviations[0].actual_type == "null"


@pytest.mark.slow  # tools that sleep to make overlaps measurable
def test_a_failed_producer_stops_the_graph(db_url: str, tmp_path: Path) -> None:
    """Under strict_mode a producer's output deviation ends the plan: its consumer never
    runs; a node already running when it ended is refused its record (nothing follows
    the end of a plan) and its consumer never runs either; compensation runs once."""
    tools = [
        emit("bad", {"nope": 1}, output_schema=FILES_SCHEMA),
        emit("slow", {"files": ["x"]}, sleep=1.0, output_schema=FILES_SCHEMA),
        echo("after-bad", {"type": "array"}),
        echo("after-slow", {"type": "array"}),
    ]
    steps = [
        {"step": "bad", "tool": "bad"},
        {"step": "slow", "tool": "slow"},
        {"step": "after-bad", "tool": "after-bad", "from": {"params": "steps.bad.output.files"}},
        {"step": "after-slow", "tool": "after-slow", "from": {"params": "steps.slow.output.files"}},
    ]
    path = plan_file(tmp_path, steps, tools=tools, config={"strict_mode": True})
    result = run(db_url, path)
    assert result["state"] == "compensated" and result["verify_ok"]
    types = [e.type for e in events(db_url)]
    assert types.count("plan.compensation_completed") == 1
    assert set(calls(db_url)) == {"bad"}
    assert gate_checks(db_url, "slow", "input")  # it started: its input gate is recorded
    for consumer in ("after-bad", "after-slow"):
        assert gate_checks(db_url, consumer, "input") == []
    assert run_cli("audit", "--db", db_url).returncode == 0


def test_a_toml_graph_runs(sqlite_url: str, tmp_path: Path) -> None:
    tools = [
        emit("look", {"files": ["a.py"]}, output_schema=FILES_SCHEMA),
        echo("use", {"type": "string"}),
    ]
    steps = [
        {"step": "look", "tool": "look"},
        {"step": "use", "tool": "use", "from": {"params": "steps.look.output.files[0]"}},
    ]
    path = plan_file(tmp_path, steps, tools=tools, suffix=".toml")
    assert run(sqlite_url, path)["state"] == "applied"
    assert blob_json(sqlite_url, calls(sqlite_url)["use"].output_sha256) == {"got": "a.py"}


def test_an_in_memory_ledger_runs_a_graph_one_node_at_a_time(tmp_path: Path) -> None:
    """A ledger that cannot be opened twice: the graph runs on the run's own plane."""
    tools = [
        emit("look", {"files": ["a.py"]}, output_schema=FILES_SCHEMA),
        echo("use", {"type": "string"}),
    ]
    steps = [
        {"step": "use", "tool": "use", "from": {"params": "steps.look.output.files[0]"}},
        {"step": "look", "tool": "look"},
    ]
    path = plan_file(tmp_path, steps, tools=tools)
    with Plane.open("sqlite://", workdir=tmp_path / "work") as plane:
        summary = run_plan_file(plane, path)
        assert summary.state == "applied"
        made = [
            e.payload.step for e in plane.store.read_stream("plan:graph") if e.type == "tool.called"
        ]
    assert made == ["look", "use"]


# -- refused when the file is loaded: exit 2, nothing appended ------------------------------

LOOK = emit("look", {"files": ["a.py"]}, output_schema=FILES_SCHEMA)
USE = echo("use", {})


@pytest.mark.parametrize(
    ("steps", "fragments"),
    [
        (
            [{"step": "use", "tool": "use", "needs": ["lok"]}],
            ["step `use`", "steps.0.needs.0", "needs `lok`, which is no step of its attempt"],
        ),
        (
            [{"step": "use", "tool": "use", "from": {"params": "steps.lok.output"}}],
            ["step `use`", "from.params", "names step `lok`, which is no step"],
        ),
        (
            [{"step": "look", "tool": "look"}, {"step": "look", "tool": "use", "needs": ["look"]}],
            ["step `look`", "steps.1.step", "already has this name"],
        ),
        (
            [
                {"step": "a", "tool": "use", "needs": ["c"]},
                {"step": "b", "tool": "use", "needs": ["a"]},
                {"step": "c", "tool": "use", "from": {"params": "steps.b.output"}},
            ],
            ["in a cycle:", "a -> c -> b -> a"],  # each step, then the one it needs
        ),
        (
            [{"step": "a", "tool": "use", "needs": ["a"]}],
            ["step `a`", "in a cycle: a -> a"],
        ),
        (
            [
                {"step": "look", "tool": "look"},
                {"step": "u", "tool": "use", "from": {"params": "steps.["}},
            ],
            ["step `u`", "from.params", "not a valid JMESPath expression"],
        ),
        (
            [
                {"step": "look", "tool": "look"},
                {"step": "u", "tool": "use", "from": {"params": "nope(steps)"}},
            ],
            ["step `u`", "unknown JMESPath function nope()"],
        ),
        (
            [
                {"step": "look", "tool": "look"},
                {"step": "u", "tool": "use", "from": {"params": "steps.look.output.file"}},
            ],
            [
                "step `u`",
                "steps.1.from.params",
                "`steps.look.output.file`: in the output of step `look` (tool look)",
                "`file` can never be there",
                "its properties: files",
            ],
        ),
        (
            [
                {"step": "look", "tool": "look"},
                {
                    "step": "u",
                    "tool": "use",
                    "from": {"params": "length(steps.look.output.files.name)"},
                },
            ],
            ["`files.name` can never be there (files is array)"],
        ),
        (
            [
                {
                    "step": "look",
                    "tool": "look",
                    "output": {"type": "object", "properties": {"n": {}}},
                },
                {"step": "u", "tool": "use", "from": {"params": "steps.look.output.files"}},
            ],
            ["`files` can never be there"],  # the step's own `output` is what is checked
        ),
        (
            [
                {"step": "v", "tool": "always"},
                {"step": "u", "tool": "use", "from": {"params": "steps.v.output.verdict"}},
            ],
            ["`verdict` can never be there", "its properties: data, message, passed"],
        ),
        (
            [
                {"step": "look", "tool": "look"},
                {"step": "u", "tool": "use", "from": {"params": "steps.look.files"}},
            ],
            ["a step's entry has only `output`"],
        ),
        (
            [
                {"step": "look", "tool": "look"},
                {"step": "u", "tool": "use", "from": {"params": "look.output"}},
            ],
            ["reads `look`, but the expression sees only `steps`"],
        ),
        (
            [
                {"step": "look", "tool": "look"},
                {
                    "step": "u",
                    "tool": "use",
                    "params": {"params": 1},
                    "from": {"params": "steps.look.output"},
                },
            ],
            ["parameter `params` is in both `params` and `from`"],
        ),
        (
            [{"step": "u", "tool": "use", "form": {"params": "steps"}}],
            ["key `agent.strategies.0.attempts.0.steps.0.form`", "unknown key"],
        ),
    ],
)
def test_graph_mistakes_are_refused_before_anything_is_appended(
    sqlite_url: str, tmp_path: Path, steps: list[dict], fragments: list[str]
) -> None:
    path = plan_file(tmp_path, steps, tools=[LOOK, USE])
    result = run_cli("run", str(path), "--db", sqlite_url, "--workdir", str(tmp_path / "w"))
    assert_refused(result, f"{path}:", *fragments)
    with ledger.open(sqlite_url) as store:
        assert store.head().size == 0


def test_the_line_is_named_and_nothing_is_appended_on_postgresql(
    pg_url: str, tmp_path: Path
) -> None:
    steps = [
        {"step": "look", "tool": "look"},
        {"step": "u", "tool": "use", "from": {"params": "steps.look.output.file"}},
    ]
    path = plan_file(tmp_path, steps, tools=[LOOK, USE])
    lines = [text.strip() for text in path.read_text().splitlines()]
    line = lines.index("params: steps.look.output.file") + 1
    result = run_cli("run", str(path), "--db", pg_url)
    assert_refused(result, f"from.params`, line {line})", "`file` can never be there")
    with ledger.open(pg_url) as store:
        assert store.head().size == 0


def test_a_registered_tools_schema_is_checked_too(sqlite_url: str, tmp_path: Path) -> None:
    """A producer the file does not declare is checked against the registry's schema."""
    (tmp_path / "look.json").write_text(json.dumps(LOOK))
    registered = run_cli("tool", "register", str(tmp_path / "look.json"), "--db", sqlite_url)
    assert registered.returncode == 0, registered.stderr
    with ledger.open(sqlite_url) as store:
        size = store.head().size
    steps = [
        {"step": "look", "tool": "look"},
        {"step": "u", "tool": "use", "from": {"params": "steps.look.output.file"}},
    ]
    path = plan_file(tmp_path, steps, tools=[USE])
    result = run_cli("run", str(path), "--db", sqlite_url)
    assert_refused(result, "`file` can never be there")
    with ledger.open(sqlite_url) as store:
        assert store.head().size == size
    path.write_text(path.read_text().replace("steps.look.output.file", "steps.look.output.files"))
    assert run(sqlite_url, path)["state"] == "applied"


def test_a_linear_attempt_keeps_its_order_and_duplicate_names(
    sqlite_url: str, tmp_path: Path
) -> None:
    """No graph keys: the steps run one after the other in the file's order, as before
    (a repeated name included)."""
    steps = [
        {"step": "x", "tool": "look"},
        {"step": "y", "tool": "look"},
        {"step": "x", "tool": "look"},
    ]
    path = plan_file(tmp_path, steps, tools=[LOOK])
    assert run(sqlite_url, path)["state"] == "applied"
    made = [e.payload.step for e in events(sqlite_url) if e.type == "tool.called"]
    assert made == ["x", "y", "x"]


# -- what an expression reads, and what a schema can hold -----------------------------------


@pytest.mark.parametrize(
    ("expression", "paths"),
    [
        ("steps.look.output.files", [("steps", "look", "output", "files")]),
        ("length(steps.a.output.x)", [("steps", "a", "output", "x")]),
        ("steps.a.output.files[0]", [("steps", "a", "output", "files")]),
        ("steps.a.output.files[*].name", [("steps", "a", "output", "files")]),
        ("steps.a.output.files[?x == `1`].y", [("steps", "a", "output", "files")]),
        ("steps.a.output.files[]", [("steps", "a", "output", "files")]),
        ("steps.*.output", [("steps",)]),
        ("steps.a.output | x", [("steps", "a", "output", "x")]),
        ("@.steps.a", [("steps", "a")]),
        ('steps.a.output."x-y"', [("steps", "a", "output", "x-y")]),
        (
            "{n: steps.a.output.x, m: [steps.b.output, `1`]}",
            [("steps", "a", "output", "x"), ("steps", "b", "output")],
        ),
        ("sort_by(steps.a.output.items, &name)", [("steps", "a", "output", "items")]),
        (
            "steps.a.output.x || steps.b.output.y",
            [("steps", "a", "output", "x"), ("steps", "b", "output", "y")],
        ),
        ("steps.{a: a.output.x}", [("steps", "a", "output", "x")]),
        ('`{"a": 1}`', []),
        ("@", []),
    ],
)
def test_field_paths(expression: str, paths: list[tuple[str, ...]]) -> None:
    assert field_paths(jmespath.compile(expression)) == paths


def _closed(schema: Any) -> Any:
    return prepare_schema(schema).normalised


@pytest.mark.parametrize(
    ("schema", "fields", "refused"),
    [
        ({"type": "object", "properties": {"a": {}}}, ["a"], None),
        ({"type": "object", "properties": {"a": {}}}, ["b"], "`b` can never be there"),
        ({"type": "object", "properties": {"a": {"type": "string"}}}, ["a", "b"], "(a is string)"),
        (
            {"type": "object", "properties": {"a": {"type": ["string", "object"]}}},
            ["a", "b"],
            "can never",
        ),
        ({"type": "object", "additionalProperties": True}, ["z", "y"], None),
        (
            {"type": "object", "additionalProperties": {"type": "integer"}},
            ["z", "y"],
            "(z is integer)",
        ),
        ({"type": "object", "patternProperties": {"^x": {}}}, ["ya"], None),  # left open
        (
            {"type": "object", "patternProperties": {"^x": {}}, "additionalProperties": False},
            ["xa"],
            None,
        ),
        (
            {"type": "object", "patternProperties": {"^x": {}}, "additionalProperties": False},
            ["ya"],
            "`ya` can never",
        ),
        (
            {"type": "object", "properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}]},
            ["b"],
            None,
        ),
        ({"anyOf": [{"type": "object"}, {"type": "string"}]}, ["q"], None),
        ({}, ["q", "r"], None),
        (True, ["q"], None),
    ],
)
def test_impossible_field(schema: Any, fields: list[str], refused: str | None) -> None:
    why = impossible_field(_closed(schema), fields)
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why, why


# -- the scheduler ---------------------------------------------------------------------------


class _Trace:
    """A node runner that records, as each node starts, which nodes were running.

    The nodes ``together`` meet at a barrier once started, so none of them returns
    before all of them are running: they overlap by construction, not by timing (a
    scheduler that ran them one at a time would break the barrier, after a generous
    wait, and fail the test). Every other node, and those that ``linger``, then hold for
    ``hold`` seconds, a window in which a node wrongly started beside it (or a caller
    that did not wait for it) is seen: it can hide a bug on a slow machine, never fail a
    correct scheduler."""

    def __init__(
        self,
        fail: frozenset[str] = frozenset(),
        together: frozenset[str] = frozenset(),
        linger: frozenset[str] = frozenset(),
        hold: float = 0.05,
    ) -> None:
        self.fail, self.together, self.linger, self.hold = fail, together, linger, hold
        self.barrier = threading.Barrier(len(together) or 1, timeout=60)
        self.lock = threading.Lock()
        self.running: set[str] = set()
        self.overlaps: list[tuple[str, frozenset[str]]] = []
        self.started: list[str] = []

    def __call__(self, name: str) -> bool:
        with self.lock:
            self.started.append(name)
            self.overlaps.append((name, frozenset(self.running)))
            self.running.add(name)
        if name in self.together:
            self.barrier.wait()
        if name not in self.together or name in self.linger:
            time.sleep(self.hold)
        with self.lock:
            self.running.discard(name)
        if name == "boom":
            raise RuntimeError("boom")
        return name not in self.fail


def test_run_graph_order_exclusivity_and_failure() -> None:
    nodes = [
        Node("a", frozenset()),
        Node("b", frozenset()),
        Node("w", frozenset(), exclusive=True),
        Node("c", frozenset({"a", "b"})),
    ]
    trace = _Trace(together=frozenset({"a", "b"}))
    assert run_graph(nodes, trace, max_workers=4)
    overlaps = dict(trace.overlaps)
    # a and b together: the one that started second saw the first one running
    assert sorted(sorted(overlaps[n]) for n in "ab") in ([[], ["a"]], [[], ["b"]])
    assert overlaps["w"] == set()  # the writer alone, and nothing started beside it
    assert all("w" not in running for running in overlaps.values())
    assert trace.started.index("c") > trace.started.index("w")  # c waited behind w

    failing = _Trace(fail=frozenset({"a"}), together=frozenset({"a", "b"}))
    assert not run_graph(nodes, failing, max_workers=4)
    assert sorted(failing.started) == ["a", "b"]  # b was running; nothing started after a failed

    raising = _Trace(together=frozenset({"boom", "slow"}), linger=frozenset({"slow"}))
    nodes = [Node("boom", frozenset()), Node("slow", frozenset()), Node("x", frozenset({"boom"}))]
    with pytest.raises(RuntimeError, match="boom"):
        run_graph(nodes, raising, max_workers=4)
    assert sorted(raising.started) == ["boom", "slow"] and not raising.running  # waited for slow


def test_validation_data_is_open_downstream(sqlite_url: str, tmp_path: Path) -> None:
    """A validation node's `data` holds any object (a closed empty one would fail the
    output gate of every validation that reports data)."""
    steps = [{"step": "v", "tool": "always"}]
    path = plan_file(tmp_path, steps)
    # not a graph here: a linear step that calls a validation gets the same declaration
    assert run(sqlite_url, path)["state"] == "applied"
    (check,) = gate_checks(sqlite_url, "v", "output")
    assert check.verdict == "pass"
    assert blob_json(sqlite_url, check.checked_sha256) == {
        "passed": True,
        "message": "fine",
        "data": {"count": 3},
    }


def test_which_attempts_are_graphs() -> None:
    """`needs: []` alone makes a graph (independent steps, run together); no graph key
    keeps the file's order."""
    from commands.plane.planfile import Attempt

    def attempt(*steps: dict) -> Attempt:
        return Attempt.model_validate({"steps": list(steps)})

    assert not attempt({"step": "a", "tool": "t"}, {"step": "b", "tool": "t"}).is_graph
    assert attempt({"step": "a", "tool": "t", "needs": []}, {"step": "b", "tool": "t"}).is_graph
    assert attempt({"step": "a", "tool": "t", "from": {}}).is_graph
