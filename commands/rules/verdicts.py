"""What a verdict is made of, as the plane records it and the auditor re-derives it:
the digest a token binds a run's results by, and the one deviation of an output that
went over its cap (a truncated output is never parsed)."""

from __future__ import annotations

import hashlib

from ledger.canonical import canonical_json
from ledger.events import Deviation, Truncation, ValidationResultRecorded

__all__ = ["results_digest", "truncated_deviation"]


def results_digest(results: list[ValidationResultRecorded]) -> str:
    """SHA-256 over what the verdicts were made of: a token binds to this (audit:
    ``token_from_passing_run``)."""
    return hashlib.sha256(
        canonical_json(
            sorted(
                (
                    [r.attachment_id, r.validation, r.mode, r.verdict, r.cause, r.raw_output_sha256]
                    for r in results
                ),
                key=lambda row: row[0],
            )
        )
    ).hexdigest()


def truncated_deviation(truncated: Truncation) -> Deviation:
    """The output gate's deviation for a truncated output: not JSON (``invalid_json``,
    as for any output that is no JSON document), saying where it was cut."""
    return Deviation(
        pointer="",
        kind="wrong_type",
        actual_type="invalid_json",
        expected=f"a JSON document (the output was truncated at "
        f"{truncated.kept} bytes of {truncated.size}, over its cap "
        "`max_output_bytes`; a truncated output is never parsed)",
    )
