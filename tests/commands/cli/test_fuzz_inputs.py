"""The fuzz suite: hostile values for every option, argument and file of every command.

The command surface is read from the click tree (a command added tomorrow is fuzzed
the day it lands); each parameter gets values drawn for its kind — deep, huge, NaN/Inf,
1e400, 2^53, duplicate keys, non-UTF-8, control characters, rich markup, YAML aliases,
``..`` paths, empty — and every invocation, in-process through the real entry point,
must hold:

- no traceback: an exception other than the exit escapes nothing;
- exit 0, 1 (a verdict) or 2 (a refusal); a refusal is one ``error:`` line on stderr
  and leaves the event count unchanged;
- a value that breaks an input rule (bad JSON, a number out of range, a file over its
  cap) is refused — exit 2, or exit 1 where a gate judges bytes an agent produced;
- hostile terminal sequences never reach the output raw.

Peak memory is checked apart, in a subprocess under ``RLIMIT_AS``: endless files
(``/dev/zero``, ``/dev/urandom``) given to every option that reads a file.

Examples are bounded and derandomized under ``CI=true``;
``pytest --hypothesis-profile=deep tests/commands/cli/test_fuzz_inputs.py`` runs many more.
NUL is never put in argv: an operating system cannot pass it (it can be in a file).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commands.cli import cli
from commands.cli.inputs import Seconds
from commands.plane import Plane
from commands.plane.registry import register_tool, register_validation
from tests.conftest import IN_CI
from tests.helpers import invoke, status_plan

FUZZ = settings(
    max_examples=max(300, settings.default.max_examples),
    deadline=None,
    derandomize=IN_CI,
    database=None,
    suppress_health_check=list(HealthCheck),
)

# -- the command surface ------------------------------------------------------------------

# Commands whose success path is long or open-ended; their inputs are fuzzed by the
# explicit cases below rather than by the sweep. `serve` listens until it is stopped:
# its refused starts are tests/commands/service/test_service.py's.
_SKIPPED = {("demo",), ("serve",)}
# Options that name a file the command writes: fuzzed with relative names only, so no
# example writes outside the test's directory.
_WRITES = {"--out", "--html", "--keep", "--bundle@export"}
# Options whose value is bytes an agent produced, judged by a gate (exit 1 is a verdict).
_AGENT_BYTES = {"--params", "--output", "--record-output"}


@dataclass(frozen=True)
class Param:
    command: tuple[str, ...]
    name: str  # "--opt" or the argument's name
    kind: str  # json, number, seconds, path, out_path, text, file, name
    positional: bool

    def __str__(self) -> str:
        return f"{' '.join(self.command)} {self.name}"


def _leaves(
    group: click.Group, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # the lazy group imports each verb here
        command = group.get_command(ctx, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            yield from _leaves(command, (*path, name))
        else:
            yield (*path, name), command


def _kind(command: tuple[str, ...], param: click.Parameter) -> str:
    name = param.opts[0] if isinstance(param, click.Option) else param.name or ""
    metavar = (param.metavar or "") if isinstance(param, click.Option) else ""
    if isinstance(param.type, Seconds):
        return "seconds"
    if isinstance(param.type, click.IntRange):
        return "number"
    if isinstance(param.type, click.Path):
        return "out_path" if name in _WRITES or f"{name}@{command[0]}" in _WRITES else "path"
    if "JSON" in metavar:
        return "json"
    if "@file" in metavar:
        return "text"
    if name in ("file", "pubkey_file"):
        return "file"
    return "name"


def surface() -> list[Param]:
    params = []
    for command, cmd in _leaves(cli):
        if command in _SKIPPED:
            continue
        for p in cmd.params:
            if isinstance(p, click.Option) and (p.is_flag or p.count):
                continue
            if isinstance(p.type, click.Choice) or p.name in ("db", "help"):
                continue
            name = p.opts[0] if isinstance(p, click.Option) else p.name or ""
            params.append(Param(command, name, _kind(command, p), isinstance(p, click.Argument)))
    return params


SURFACE = surface()

# A plausible value for each required parameter, so that the one under test is reached.
BASE = {
    "plan_id": "P-1",
    "--plan": "P-1",
    "--tool": "echo",
    "--params": "{}",
    "--resource": "repo:api",
    "--project": "api",
    "validation": "lint",
    "--step": "s1",
    "--output": "{}",
    "--note": "n",
    "--raw-type": "tool_failure",
    "--reason": "r",
    "--strategy": "s",
    "name": "echo",
    "attachment_id": "A-1",
    "task_id": "T-1",
    "position": "1",
    "--reviewer": "r",
    "--html": "out.html",
    "--out": "out.key",
}


def argv_for(param: Param, value: str, files: Path) -> list[str]:
    _, cmd = next(c for c in _leaves(cli) if c[0] == param.command)
    argv = list(param.command)
    for p in cmd.params:
        name = p.opts[0] if isinstance(p, click.Option) else p.name or ""
        if name == param.name:
            given = value
        elif p.required:
            given = BASE.get(name) or str(files / "tool.json")
            if name == "pubkey_file":
                given = str(files / "alice.key.pub")
        else:
            continue
        argv += [given] if isinstance(p, click.Argument) else [name, given]
    return argv


# -- hostile values -----------------------------------------------------------------------

MAX_SAFE = 2**53 - 1
TERMINAL = [
    "\x1b[2J",
    "\x1b]0;PWNED\x07",
    "[/x]",
    "[bold red]x[/]",
    "\r",
    "\u202e",
    "\x07",
    "\x9b31m",
    "\x7f",
]

deep_json = st.integers(65, 20_000).flatmap(
    lambda n: st.sampled_from(["[" * n + "]" * n, '{"a":' * n + "1" + "}" * n])
)
bad_number = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400"]) | (
    st.integers(MAX_SAFE + 1, 2**200) | st.integers(-(2**200), -MAX_SAFE - 1)
).map(str)
illegal_json = st.one_of(
    deep_json,
    bad_number.map(lambda n: f'{{"n": {n}}}'),
    bad_number.map(lambda n: f"[1, {n}]"),
    st.sampled_from(
        [
            '{"k": 1, "k": 2}',
            '{"a": {"b": [], "b": {}}}',
            '[{"x": 0, "y": 1, "x": 0}]',
            "",
            " ",
            "{",
            "{} {}",
            "\udcff",
            '"\\ud800"',
            "[1,]",
            "{'a': 1}",
        ]
    ),
)
hostile_text = st.lists(
    st.sampled_from(TERMINAL) | st.text(max_size=8).filter(lambda s: "\x00" not in s),
    min_size=1,
    max_size=6,
).map("".join)
hostile_name = hostile_text | st.sampled_from(
    [
        "..",
        "../x",
        "../../etc/passwd",
        "",
        " ",
        "a/../../b",
        "\udcff",
        "-",
        "x" * 5_000,
        "P-1\n",
        "~",
        "%2e%2e",
        "/dev/zero",
        "C:\\x",
    ]
)
bad_whole = st.sampled_from(
    [
        "99999999999999999999",
        str(MAX_SAFE + 1),
        "-99999999999999",
        "1e400",
        "nan",
        "inf",
        "",
        "1.5",
        "0x10",
        "-1",
    ]
)
bad_seconds = st.sampled_from(["nan", "inf", "-inf", "1e308", "1e400", "", "-0.5", "3601", "x"])
read_paths = st.sampled_from(
    [
        "/dev/zero",
        "/dev/urandom",
        "/",
        ".",
        "..",
        "",
        "missing",
        "../missing",
        "x" * 5_000,
        "/proc/self/mem",
        "\udcff",
    ]
)
out_paths = st.sampled_from(["..", ".", "", "x" * 5_000, "a/b/c/missing-dir/x", "\udcff", "-"])

STRATEGIES = {
    "json": illegal_json,
    "number": bad_whole,
    "seconds": bad_seconds,
    "path": read_paths,
    "out_path": out_paths,
    "text": hostile_text,
    "file": read_paths,
    "name": hostile_name,
}
MUST_REFUSE = {"json", "number", "seconds"}


# -- the ledger under attack ----------------------------------------------------------------


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Plane, Path]]:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv("EVIDENCE_DB", url)
    # Small caps keep the over-cap examples cheap; the caps themselves are the same code.
    for kind in ("option", "document", "agent"):
        monkeypatch.setenv(f"EVIDENCE_MAX_{kind.upper()}_BYTES", str(64 * 1024))
    cwd = tmp_path / "cwd" / "a" / "b"  # ".." and "../.." stay inside the test's directory
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    with Plane.open(url) as plane:
        status_plan(plane, tmp_path, {})
        register_tool(
            plane,
            {
                "name": "echo",
                "command": [sys.executable, "-c", "print(1)"],
                "input_schema": {"type": "object"},
                "output_schema": {"type": "object"},
            },
        )
        register_validation(
            plane,
            {
                "name": "lint",
                "mode": "informational",
                "command": ["true"],
                "input_schema": {"type": "object"},
            },
        )
        (tmp_path / "tool.json").write_text('{"name": "other", "command": ["true"]}')
        yield plane, tmp_path


def events(plane: Plane) -> int:
    return plane.store.head().size


def holds(
    result: Result,
    before: int,
    after: int,
    *,
    what: str,
    must_refuse: bool,
    agent: bool,
    data_on_stdout: bool = False,
) -> None:
    """The invariants every invocation keeps. With ``data_on_stdout`` (an option that
    writes a file given ``-``) stdout is that file's exact bytes, as a file would hold
    them (and a terminal is refused): only what the command says goes to stderr."""
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        what,
        repr(result.exception),
    )
    output = result.stdout + result.stderr
    assert "Traceback" not in output, (what, output[-2_000:])
    assert result.exit_code in (0, 1, 2), (what, result.exit_code, output[-2_000:])
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (what, result.stderr)
        assert after == before, (what, "a refused command appended events")
    if must_refuse:
        allowed = (1, 2) if agent else (2,)
        assert result.exit_code in allowed, (what, result.exit_code, output[-2_000:])
    said = result.stderr if data_on_stdout else output
    for sequence in ("\x1b]0;PWNED", "\x1b[2J", "\u202e"):
        assert sequence not in said, (what, "raw terminal sequence in the output")


def attack(plane: Plane, files: Path, param: Param, value: str, *, must_refuse: bool) -> Result:
    argv = argv_for(param, value, files)
    before = events(plane)
    result = invoke(*argv)
    holds(
        result,
        before,
        events(plane),
        what=f"{param} = {value[:80]!r}",
        must_refuse=must_refuse,
        agent=param.name in _AGENT_BYTES or param.command[0] == "review",
        data_on_stdout=param.kind == "out_path" and value == "-",
    )
    return result


@FUZZ
@given(data=st.data())
def test_every_parameter_survives_hostile_values(
    target: tuple[Plane, Path], data: st.DataObject
) -> None:
    plane, files = target
    param = data.draw(st.sampled_from(SURFACE), label="parameter")
    value = data.draw(STRATEGIES[param.kind], label="value")
    attack(plane, files, param, value, must_refuse=param.kind in MUST_REFUSE)


def test_the_surface_is_all_there() -> None:
    """The sweep reaches every kind of input (a regression in the introspection would
    silently fuzz nothing)."""
    kinds = {p.kind for p in SURFACE}
    assert kinds == set(STRATEGIES), kinds
    names = {str(p) for p in SURFACE}
    for expected in (
        "attach --args",
        "gate input --params",
        "tail --interval",
        "replay --as-of",
        "verify --checkpoint",
        "tool register file",
        "plan strategize --strategy",
        "apply --token",
        "export --out",
    ):
        assert expected in names, expected


# -- hostile files ---------------------------------------------------------------------------

# Options and arguments that read a document or bytes from a file.
FILE_INPUTS = [p for p in SURFACE if p.kind in ("json", "text", "file")] + [
    p
    for p in SURFACE
    if p.kind == "path"
    and p.name in ("--checkpoint", "--bundle", "--public-key", "--key", "--plane-key", "plan_file")
]


def _nested_yaml(n: int) -> bytes:
    return ("a: " + "[" * n + "]" * n + "\n").encode()


ALL = frozenset({".json", ".yaml", ".yml", ".toml", ""})
NOT_YAML = frozenset({".json", ".toml", ""})
JSON_ONLY = frozenset({".json", ""})

# (content, the suffixes under which it breaks a rule of the input layer)
hostile_documents = st.one_of(
    st.sampled_from(
        [
            (b"\xff\xfe\x00garbage", ALL),
            (b"a: \xc3\x28\n", ALL),
            (b'{"a": "\xed\xa0\x80"}', ALL),  # an encoded surrogate: not UTF-8
            (b"", JSON_ONLY),
            (b"\n\n", JSON_ONLY),
            (b"\x00\x00\x00", ALL),
            (b"\xef\xbb\xbf{}", frozenset()),
            (b"a: &x [1]\nb: *x\n", ALL),
            (b"<<: {a: 1}\n", ALL),
            (b"a: 1\na: 2\n", ALL),
            (b"a: .nan\n", ALL),
            (b"a: 2001-01-01\n", ALL),
            (b"a: !!binary aGk=\n", ALL),
            (b"a: !!python/name:os.system\n", ALL),
            (b"a: 123456789012345678901234567890\n", ALL),
            (b'{"a": 1, "a": 2}', ALL),
            (b'{"a": NaN}', NOT_YAML),
            (b"a = nan\n", NOT_YAML),
            (b"a = 1979-05-27T07:32:00Z\n", NOT_YAML),
            (b"a = 99999999999999999999\n", NOT_YAML),
            (b"- [\n" * 3, ALL),
            (b"\x1b]0;PWNED\x07\n", ALL),
            (b"[/x]", NOT_YAML),
        ]
    ),
    st.integers(65, 5_000).map(lambda n: (_nested_yaml(n), ALL)),
    deep_json.map(lambda text: (text.encode(), ALL)),
    # 9 levels of 9 aliases: expanded, hundreds of millions of nodes.
    st.just(
        (
            "a: &a [x,x,x,x,x,x,x,x,x]\n"
            + "".join(
                f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n"
                for i in range(8)
            )
        ).encode()
    ).map(lambda bomb: (bomb, ALL)),
    st.integers(64 * 1024 + 1, 200_000).map(lambda n: (b"#" * n, frozenset())),  # over cap
)

_counter = itertools.count()


@FUZZ
@given(data=st.data())
def test_every_file_input_survives_hostile_files(
    target: tuple[Plane, Path], data: st.DataObject
) -> None:
    plane, files = target
    param = data.draw(st.sampled_from(FILE_INPUTS), label="parameter")
    content, illegal_as = data.draw(hostile_documents, label="content")
    suffix = data.draw(st.sampled_from(sorted(ALL)), label="suffix")
    path = files / f"hostile-{next(_counter)}{suffix}"
    path.write_bytes(content)
    value = f"@{path}" if param.kind in ("json", "text") else str(path)
    # Over the fixture's caps (option, document, agent); a bundle's cap is larger.
    over_cap = len(content) > 64 * 1024 and (
        param.kind != "path" or param.name in ("plan_file", "--checkpoint")
    )
    documents = param.kind == "json" or (param.kind == "file" and param.command[0] != "review")
    attack(plane, files, param, value, must_refuse=over_cap or (documents and suffix in illegal_as))


# -- memory: endless files, in a process with a bounded address space -------------------------

_MEMORY_PROBE = textwrap.dedent("""
    import json, resource, sys
    from click.testing import CliRunner
    from commands.cli import main
    import click

    @click.command(context_settings={"ignore_unknown_options": True,
                                     "allow_extra_args": True, "help_option_names": []})
    @click.argument("argv", nargs=-1, type=click.UNPROCESSED)
    def entry(argv):
        main(list(argv))

    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    results = []
    for argv in json.loads(sys.stdin.read()):
        r = CliRunner().invoke(entry, argv)
        results.append({"argv": argv, "code": r.exit_code, "stderr": r.stderr[-300:],
                        "exception": None if r.exception is None
                        or isinstance(r.exception, SystemExit) else repr(r.exception)})
    print(json.dumps(results))
""")


@pytest.mark.slow
def test_endless_files_stay_within_memory(target: tuple[Plane, Path]) -> None:
    """Every option that reads a file, given /dev/zero and /dev/urandom, under an address
    space limit far below what reading them whole would take: refused at the cap."""
    plane, files = target
    cases = []
    for param in FILE_INPUTS:
        for device in ("/dev/zero", "/dev/urandom"):
            value = f"@{device}" if param.kind in ("json", "text") else device
            cases.append(argv_for(param, value, files))
    env = {**os.environ, "EVIDENCE_MAX_BUNDLE_BYTES": str(64 * 1024 * 1024)}
    for kind in ("option", "document", "agent"):  # the defaults, not the fixture's caps
        env.pop(f"EVIDENCE_MAX_{kind.upper()}_BYTES", None)
    limit = 1536 * 1024 * 1024  # 1.5 GiB of address space: the defaults need a few MiB
    before = events(plane)
    run = subprocess.run(
        [sys.executable, "-c", _MEMORY_PROBE, str(limit)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=Path.cwd(),
    )
    assert run.returncode == 0, run.stderr[-3_000:]
    for case in json.loads(run.stdout):
        assert case["exception"] is None, case
        assert case["code"] in (1, 2), case
        assert "MemoryError" not in case["stderr"], case
    assert events(plane) == before
