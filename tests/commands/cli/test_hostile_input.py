"""Hostile input, row by row (issue "Hostile input"): every input refused with one
``error:`` line and exit 2 and nothing appended, or, for bytes an agent produced that a
gate judges, a recorded deviation and exit 1; never a traceback, never unbounded memory
or time."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from commands.plane import Plane
from commands.plane.registry import register_tool, register_validation
from ledger import intake
from ledger.intake import (
    LIMITS,
    MAX_DEPTH,
    MAX_SAFE_INTEGER,
    InputError,
    limit_bytes,
    load_document,
    parse_json,
    parse_yaml,
    read_bytes,
)
from tests.helpers import REPO, invoke, status_plan

DEEP = "[" * 1_000 + "]" * 1_000
# Nine levels of nine: expanded, 9^9 (387 million) strings.
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


def refused(result, *fragments: str) -> str:
    """Exit 2, one ``error:`` line (naming each fragment), no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def plane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv("EVIDENCE_DB", url)
    with Plane.open(url) as p:
        status_plan(p, tmp_path, {})
        register_tool(
            p,
            {
                "name": "echo",
                "command": [sys.executable, "-c", "print('{{}}')"],
                "input_schema": {"type": "object"},
                "output_schema": {"type": "object"},
            },
        )
        register_validation(
            p,
            {
                "name": "lint",
                "mode": "required",
                "command": ["true"],
                "input_schema": {"type": "object", "properties": {"n": {}}},
            },
        )
        yield p


def size(plane: Plane) -> int:
    return plane.store.head().size


# -- deep JSON, NaN, overflow ------------------------------------------------------------


def test_deep_params_are_a_recorded_deviation_not_a_traceback(plane: Plane) -> None:
    before = size(plane)
    result = invoke("gate", "input", "--plan", "P-1", "--tool", "echo", "--params", DEEP, "--json")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    [deviation] = json.loads(result.stdout)["gate"]["deviations"]
    assert deviation["actual_type"] == "invalid_json"
    assert "nested deeper than 64" in deviation["expected"]
    recorded = [e.type for e in plane.store.read_all(from_position=before + 1)]
    assert recorded[0] == "gate.checked"  # judged and recorded, routed like any deviation


def test_a_call_with_deep_recorded_output_judges_it(plane: Plane) -> None:
    result = invoke(
        "call", "P-1", "--tool", "echo", "--params", "{}", "--record-output", DEEP, "--json"
    )
    assert result.exit_code == 1 and "Traceback" not in result.stderr, result.stderr
    assert "nested deeper than 64" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        '{"n": NaN}',
        '{"n": Infinity}',
        '{"n": 1e400}',
        '{"n": 9007199254740992}',
        '{"n": 1, "n": 2}',
        DEEP,
        '{"n": "\\ud800"}',
    ],
)
def test_attach_args_outside_the_json_rules_are_refused(plane: Plane, args: str) -> None:
    before = size(plane)
    refused(invoke("attach", "lint", "--resource", "repo:x", "--args", args), "--args")
    assert size(plane) == before
    assert invoke("attach", "lint", "--resource", "repo:x", "--args", '{"n": 1}').exit_code == 0


def test_a_tool_file_with_an_overflowing_timeout_is_refused(plane: Plane, tmp_path: Path) -> None:
    tool = tmp_path / "t.yaml"
    tool.write_text("name: slow\ncommand: [sh, -c, 'true']\ntimeout: 1e308\n")
    before = size(plane)
    refused(invoke("tool", "register", str(tool)), "timeout")
    assert size(plane) == before


@pytest.mark.parametrize(
    "args",
    [
        ("replay", "P-1", "--as-of", "99999999999999999999"),
        ("stats", "--since", "99999999999999999999"),
        ("events", "--from", "99999999999999999999"),
        ("tail", "--interval", "1e308"),
        ("tail", "--interval", "nan"),
        ("tail", "--interval", "inf"),
        ("prove", "99999999999999999999"),
    ],
)
def test_numbers_beyond_range_are_refused(plane: Plane, args: tuple[str, ...]) -> None:
    before = size(plane)
    refused(invoke(*args))
    assert size(plane) == before


# -- sizes: never read whole ---------------------------------------------------------------


class _Counted:
    """A file whose reads are counted."""

    def __init__(self, f: BinaryIO, sizes: list[int]) -> None:
        self.f, self.sizes = f, sizes

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.sizes.append(len(data))
        return data

    def __enter__(self) -> _Counted:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the reads the input layer makes from the files it opens."""
    sizes: list[int] = []

    def counted(path: Any, mode: str = "r", *args: Any, **kw: Any) -> _Counted:
        return _Counted(open(path, mode, *args, **kw), sizes)

    monkeypatch.setattr(intake, "open", counted, raising=False)
    return sizes


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        (("apply", "P-1", "--token", "@/dev/zero"), "token"),
        (("verify", "--checkpoint", "/dev/zero"), "checkpoint"),
        (("plan", "strategize", "P-1", "--strategy", "@/dev/zero"), "option"),
    ],
)
def test_endless_files_are_refused_at_the_cap(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], kind: str
) -> None:
    """Read through the cap, never whole: at most cap + 1 bytes are taken from a file
    that never ends (counted, not timed)."""
    sizes = _count_reads(monkeypatch)
    before = size(plane)
    refused(invoke(*args), "cap")
    assert 0 < sum(sizes) <= LIMITS[kind].cap + 1, sum(sizes)
    assert size(plane) == before


def test_endless_agent_bytes_are_refused_at_the_cap(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVIDENCE_MAX_AGENT_BYTES", "65536")
    before = size(plane)
    refused(
        invoke("gate", "input", "--plan", "P-1", "--tool", "echo", "--params", "@/dev/urandom"),
        "--params /dev/urandom",
        "64 KiB cap",
        "EVIDENCE_MAX_AGENT_BYTES",
    )
    assert size(plane) == before


def test_read_bytes_reads_no_further_than_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVIDENCE_MAX_TOKEN_BYTES", "10")
    with pytest.raises(InputError) as refusal:
        read_bytes("/dev/zero", "token")
    assert refusal.value.rule == "size"


KIB, MIB = 1024, 1024 * 1024

# The default caps a user relies on (docs/cli.md "Limits"): changing one is a decision,
# made here and in the docs at once.
DEFAULT_CAPS = {
    "option": 1 * MIB,
    "document": 1 * MIB,
    "agent": 16 * MIB,
    "output": 4 * MIB,
    "token": 64 * KIB,
    "checkpoint": 64 * KIB,
    "bundle": 1024 * MIB,
}


def test_the_default_caps_are_pinned_and_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    assert {kind: limit.default for kind, limit in LIMITS.items()} == DEFAULT_CAPS
    assert (MAX_DEPTH, MAX_SAFE_INTEGER) == (64, 2**53 - 1)
    docs = (REPO / "docs" / "cli.md").read_text()
    documented = {
        env: text
        for text, env in re.findall(
            r"\| ([0-9]+ (?:KiB|MiB|GiB)) \| `(EVIDENCE_MAX_[A-Z]+_BYTES)`", docs
        )
    }
    shown = {1 * KIB: "KiB", 1 * MIB: "MiB", 1024 * MIB: "GiB"}
    for kind, cap in DEFAULT_CAPS.items():
        unit = max(u for u in shown if cap % u == 0)
        assert documented[LIMITS[kind].env] == f"{cap // unit} {shown[unit]}", kind
        monkeypatch.delenv(LIMITS[kind].env, raising=False)
        assert LIMITS[kind].cap == cap  # in force when nothing overrides it


@pytest.mark.parametrize("kind", ["option", "document", "agent", "output", "token", "checkpoint"])
def test_the_default_cap_is_the_last_byte_accepted(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(LIMITS[kind].env, raising=False)
    cap = DEFAULT_CAPS[kind]
    assert len(limit_bytes(b"x" * cap, kind, "input")) == cap
    with pytest.raises(InputError) as refusal:
        limit_bytes(b"x" * (cap + 1), kind, "input")
    assert refusal.value.rule == "size"


def test_nesting_is_refused_one_level_past_max_depth() -> None:
    assert parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "deep") is not None
    with pytest.raises(InputError) as refusal:
        parse_json("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "deep")
    assert refusal.value.rule == "depth"


# -- YAML: aliases, duplicate keys, non-JSON types ------------------------------------------


def test_an_alias_bomb_in_a_tool_file_is_refused_at_once(plane: Plane, tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("name: bomb\ncommand: [sh]\n" + ALIAS_BOMB)
    # Refused at its first anchor (line 3), before anything is composed, let alone
    # expanded: the refusal names it.
    refused(invoke("tool", "register", str(bomb)), "bomb.yaml", "anchor &a (line 3)")


def test_an_alias_bomb_inside_a_valid_plan_file_is_refused_at_once(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "plan:\n  id: P\n  project: p\n  resources: [.]\n"
        "agent:\n  strategy: s\n  steps: []\n" + ALIAS_BOMB
    )
    refused(
        invoke("run", str(plan), "--db", f"sqlite:///{tmp_path / 'x.db'}"), "anchor &a (line 8)"
    )


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("v.yaml", "name: v\ncommand: [sh]\nmode: required\nmode: informational\n"),
        ("v.json", '{"name": "v", "command": ["sh"], "mode": "required", "mode": "informational"}'),
        ("v.toml", 'name = "v"\ncommand = ["sh"]\nmode = "required"\nmode = "informational"\n'),
    ],
)
def test_duplicate_keys_in_registry_files_are_refused(
    plane: Plane, tmp_path: Path, name: str, text: str
) -> None:
    (tmp_path / name).write_text(text)
    before = size(plane)
    line = refused(invoke("validation", "register", str(tmp_path / name)), name)
    assert "mode" in line or "overwrite" in line
    assert size(plane) == before


def test_duplicate_keys_in_config_are_refused(plane: Plane) -> None:
    before = size(plane)
    refused(
        invoke(
            "plan",
            "create",
            "P-2",
            "--project",
            "p",
            "--resource",
            "repo:x",
            "--config",
            '{"retry_limit": 1, "retry_limit": 9}',
        ),
        "--config at /retry_limit",
        "duplicate key",
    )
    assert size(plane) == before


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("when: 2020-01-01\n", "type"),
        ("blob: !!binary aGk=\n", "type"),
        ("n: .nan\n", "finite"),
        ("n: .inf\n", "finite"),
        ("<<: {a: 1}\n", "yaml_alias"),
        ("n: 9007199254740993\n", "integer_range"),
        ("? [a]\n: 1\n", "type"),
        ("[" * 100 + "]" * 100, "depth"),
        ("a: !!python/object:os.system {}\n", "type"),
    ],
)
def test_yaml_that_is_not_a_json_value_is_refused(text: str, rule: str) -> None:
    with pytest.raises(InputError) as refusal:
        parse_yaml(text, "f.yaml")
    assert refusal.value.rule == rule


# -- the right name for the broken rule ---------------------------------------------------


@pytest.mark.parametrize("name", ["deep.json", "deep.toml", "deep.yaml"])
def test_too_deep_files_say_too_deep_not_invalid_yaml(
    plane: Plane, tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    nested = "[" * 5_000 + "]" * 5_000
    path.write_text(
        f"a = {nested}\n"
        if name.endswith(".toml")
        else f"a: {nested}\n"
        if name.endswith(".yaml")
        else f'{{"a": {nested}}}'
    )
    line = refused(invoke("tool", "register", str(path)), name, "nested deeper than 64")
    assert "YAML" not in line


def test_a_refusal_names_the_file_the_pointer_and_the_rule(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text('{"input_schema": {"properties": {"a": {}, "a": {}}}}')
    with pytest.raises(InputError) as refusal:
        load_document(path, source=str(path))
    error = refusal.value
    assert (error.source, error.pointer, error.rule) == (
        str(path),
        "/input_schema/properties/a",
        "duplicate_key",
    )
    assert str(error) == f"{path} at /input_schema/properties/a: duplicate key 'a'"


def test_non_utf8_text_is_refused_with_its_byte(tmp_path: Path) -> None:
    with pytest.raises(InputError) as refusal:
        parse_json(b'{"a": "\xff"}', "x")
    assert refusal.value.rule == "utf8" and "byte 7" in str(refusal.value)


@pytest.mark.parametrize("text", ['{"n": 1e20}', '{"n": 9007199254740992.0}', "[-1e16]"])
def test_integral_numbers_the_log_would_store_as_unsafe_integers_are_refused(text: str) -> None:
    # Canonical JSON writes them as digits (100000000000000000000), read back as integers
    # outside ±(2^53 - 1): refused on the way in, like the integer itself.
    with pytest.raises(InputError) as refusal:
        parse_json(text, "x")
    assert refusal.value.rule == "integer_range"
    assert parse_json('{"n": 1e21}', "x") == {"n": 1e21}  # written 1e+21: a number still


# -- what the fuzz suite found ---------------------------------------------------------------


def test_an_argument_that_is_not_utf8_is_refused_before_any_command(plane: Plane) -> None:
    # Python hands undecodable argv bytes over as lone surrogates (surrogateescape).
    before = size(plane)
    refused(
        invoke("plan", "strategize", "P-1", "--strategy", "bad \udcff byte"),
        "argument 5 is not UTF-8 (byte 0xff)",
    )
    refused(invoke("replay", "\udcff"), "argument 2 is not UTF-8")
    assert size(plane) == before


def test_a_path_the_system_cannot_use_is_one_error_line(plane: Plane) -> None:
    refused(invoke("plan", "show", "P-1", "--workdir", "x" * 5_000), "File name too long")


@pytest.mark.parametrize(
    "args",
    [
        ("verify", "--public-key", "/dev/zero"),
        ("audit", "--public-key", "/dev/zero"),
        ("replay", "P-1", "--public-key", "/dev/zero"),
    ],
)
def test_a_public_key_nothing_would_check_is_refused(plane: Plane, args: tuple[str, ...]) -> None:
    refused(invoke(*args), "--public-key")


def test_authorize_options_without_a_decision_are_refused(plane: Plane) -> None:
    refused(invoke("authorize", "--revise", "@/dev/zero"), "DECISION_ID")


@pytest.mark.parametrize("origin", ["\x1b]0;PWNED\x07", "a\u202eb", "x" * 300, ""])
def test_a_checkpoint_origin_is_printable(plane: Plane, origin: str) -> None:
    before = size(plane)
    refused(invoke("checkpoint", "--origin", origin), "origin")
    assert size(plane) == before


def test_run_resume_with_an_empty_id_is_refused(plane: Plane) -> None:
    refused(invoke("run", "--resume", ""))
