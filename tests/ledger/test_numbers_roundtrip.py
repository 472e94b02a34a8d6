"""Every number that reaches the log obeys the input layer's rule, whatever the path:
an integral float between 2^53 and 1e21 (which RFC 8785 writes as integer digits, read
back as an integer beyond ±(2^53 - 1)) is refused by ``Store.append``, is no verdict
(``validator_error``) when a validation's transform computes one, and so a bundle
exported from any ledger the project wrote verifies."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import ledger
from commands.plane import Plane
from commands.plane.attachments import attach
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool, register_validation
from commands.plane.validation_runs import validate_plan
from commands.runner.results import TransformError, apply_transform
from ledger import NewEvent
from ledger.canonical import CanonicalizationError, canonical_json
from ledger.errors import InvalidEventError
from ledger.events import ValidationResultRecorded
from tests.helpers import run_cli

BIG = 8e15 + 8e15  # 1.6e16: integral, beyond 2^53 - 1, below 1e21


@pytest.mark.parametrize("value", [BIG, -BIG, 2.0**53, 9.99e20, {"a": [1, {"b": BIG}]}])
def test_the_logs_encoding_refuses_integral_floats_beyond_the_safe_range(value: object) -> None:
    # RFC 8785 itself writes them (Appendix B: 2^53 is "9007199254740992"); what the log
    # stores may not hold them.
    canonical_json(value)
    with pytest.raises(CanonicalizationError, match="outside the interoperable range"):
        canonical_json(value, safe_numbers=True)


@pytest.mark.parametrize("value", [1e21, 2.0**53 - 1, 1.5, -0.0, 4503599627370495.5, 123456.75])
def test_numbers_that_round_trip_are_kept(value: float) -> None:
    assert json.loads(canonical_json(value, safe_numbers=True)) == value


def _result(data: dict) -> ValidationResultRecorded:
    return ValidationResultRecorded(
        plan_id="P",
        run_id="01J00000000000000000000000",
        attachment_id="01J00000000000000000000001",
        validation="v",
        mode="required",
        verdict=True,
        message=None,
        data=data,
        cause=None,
        error=None,
        changed_paths=[],
        raw_output_sha256=None,
        started_at="2024-01-01T00:00:00Z",
        ended_at="2024-01-01T00:00:00Z",
        duration_ms=1,
    )


def test_store_append_refuses_such_a_number_in_a_json_field(store: ledger.Store) -> None:
    """The Python Store API: before, the float was stored as 16000000000000000 and read
    back as an unsafe integer."""
    with pytest.raises(InvalidEventError, match="outside the interoperable range"):
        store.append("plan:P", [NewEvent(payload=_result({"x": BIG}))])
    # in a delta too (a JSON Patch is JSON-typed)
    delta = [{"op": "add", "path": "/x", "value": BIG}]
    with pytest.raises(InvalidEventError, match="outside the interoperable range"):
        store.append("plan:P", [NewEvent(payload=_result({"x": 1}), delta=delta)])
    assert store.head().size == 0
    store.append("plan:P", [NewEvent(payload=_result({"x": 1.5, "y": 2**53 - 1}))])
    assert store.read_stream("plan:P")[0].payload.data == {"x": 1.5, "y": 2**53 - 1}


def test_a_transform_computing_such_a_number_raises() -> None:
    expression = "{passed: `true`, data: {total: sum([a, b])}}"
    assert apply_transform(expression, {"a": 1.5, "b": 2})["data"] == {"total": 3.5}
    with pytest.raises(TransformError, match=r"cannot be recorded.*outside"):
        apply_transform(expression, {"a": 8e15, "b": 8e15})


def test_a_transform_summing_two_accepted_floats_is_a_validator_error(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The case of the issue, end to end: a validation's transform sums 8e15 + 8e15 (each
    accepted by the input layer). The result is no verdict, validator_error, and the
    bundle exported from that ledger verifies."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "numbers.py").write_text('print(\'{"a": 8e15, "b": 8e15}\')\n')
    assert run_cli("init", "--db", sqlite_url).returncode == 0
    with Plane.open(sqlite_url) as plane:
        register_tool(
            plane,
            {
                "name": "numbers",
                "description": "prints two floats",
                "command": [sys.executable, "numbers.py"],
            },
        )
        register_validation(
            plane,
            {
                "name": "total",
                "mode": "required",
                "wraps": "numbers",
                "transform": "{passed: `true`, data: {total: sum([a, b])}}",
            },
        )
        create_plan(plane, "P-1", project="api", resources=[str(project)])
        attach(plane, "total", resource=str(project))
        record_strategy(plane, "P-1", "sum")
        enter_execute(plane, "P-1")
        report = validate_plan(plane, "P-1")
        (result,) = report.results
        assert (result.verdict, result.cause) == (None, "malformed"), result
        assert "outside" in (result.error or "")
        assert report.outcome == "validator_error"
    bundle = tmp_path / "all.bundle"
    made = run_cli("export", "--bundle", str(bundle), "--db", sqlite_url)
    assert made.returncode == 0, made.stderr
    checked = run_cli("verify", "--bundle", str(bundle))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    audited = run_cli("audit", "--db", sqlite_url)
    assert audited.returncode == 0, audited.stdout + audited.stderr
