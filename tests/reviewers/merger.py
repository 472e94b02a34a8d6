"""A deterministic merger for the review host's tests (docs/reviews.md, "The reviewer
programs"): no tools, it summarises the report the host rendered.

    merger.py [--mode ok|invalid|crash]
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="ok")
    args = parser.parse_args()
    given = json.loads(sys.stdin.read())
    if args.mode == "crash":
        sys.exit(3)
    report = given["report"]
    if args.mode == "invalid":
        print(json.dumps({"schema_version": "fusion-validation-merger.v1", "summary": ""}))
        return
    severities = [group["severity"] for group in report["findings"]]
    summary = (
        f"{len(report['findings'])} finding group(s), {len(report['exclusions'])} "
        f"exclusion(s); most severe: {severities[0] if severities else 'none'}"
    )
    print(json.dumps({"schema_version": "fusion-validation-merger.v1", "summary": summary}))


if __name__ == "__main__":
    main()
