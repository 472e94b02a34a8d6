"""A deterministic blind evaluator for the review host's tests (docs/reviews.md, "The
reviewer programs"): it accounts for every source finding exactly once. Findings with
the same summary go into one group; minor ones are excluded.

    evaluator.py [--mode MODE] [--record FILE]

MODE: ok (default); broken (always leaves the last source finding undecided: both the
first attempt and the repair are rejected); broken-once (broken as the evaluator, right
as the repair); crash (exit 3); garbage (not JSON). --record FILE: append what it was
given (its input, its working directory's files) to FILE, one JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def account(sources: list[dict]) -> dict:
    decisions, groups, group_of = [], [], {}
    for finding in sources:
        if finding["severity"] == "minor":
            decisions.append(
                {
                    "finding": finding["id"],
                    "decision": "exclude",
                    "rationale": f"{finding['id']} is minor: outside the acceptance criteria",
                }
            )
            continue
        group = group_of.get(finding["summary"])
        if group is None:
            group = group_of[finding["summary"]] = {
                "id": f"G{len(groups) + 1}",
                "members": [],
                "rationale": "the same summary",
            }
            groups.append(group)
        group["members"].append(finding["id"])
        decisions.append(
            {
                "finding": finding["id"],
                "decision": "include",
                "group": group["id"],
                "rationale": f"{finding['id']} is confirmed by its evidence",
            }
        )
    return {
        "schema_version": "fusion-validation-accounting.v1",
        "validation_accounting": {
            "source_findings": sources,
            "decisions": decisions,
            "groups": groups,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="ok")
    parser.add_argument("--record")
    args = parser.parse_args()
    given = json.loads(sys.stdin.read())
    if args.record:
        with open(args.record, "a") as out:
            out.write(json.dumps({"input": given, "files": sorted(os.listdir("."))}) + "\n")
    if args.mode == "crash":
        print("evaluator crashed on purpose", file=sys.stderr)
        sys.exit(3)
    if args.mode == "garbage":
        print("{not json")
        return
    answer = account(given["source_findings"])
    broken = args.mode == "broken" or (args.mode == "broken-once" and given["role"] != "repair")
    if broken:
        answer["validation_accounting"]["decisions"].pop()  # a finding left undecided
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
