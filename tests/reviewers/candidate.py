"""A deterministic candidate reviewer for the review host's tests (docs/reviews.md, "The
reviewer programs"): it reads its input on stdin, greps the scope's files in its working
directory for PATTERN and answers one finding per matching line.

    candidate.py [--pattern REGEX] [--severity S] [--limitation TEXT] [--mode MODE]
                 [--until FILE] [--target FILE] [--record FILE]

MODE: ok (default); write (writes into its working directory, then answers); write-to
(appends to --target, an absolute path, then answers); crash (exit 3); hang (sleeps);
garbage (not JSON); invalid (JSON outside the candidate schema). --until FILE: wait (at
most 60 s) for FILE to exist before answering. --record FILE: write what it was given
(its input, its working directory and the files there) to FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time


def files_under(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    found = []
    for root, _dirs, names in os.walk(path):
        found += [os.path.relpath(os.path.join(root, n)) for n in names]
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pattern", default=r"while True|TODO")
    parser.add_argument("--severity", default="high")
    parser.add_argument("--limitation", action="append", default=[])
    parser.add_argument("--mode", default="ok")
    parser.add_argument("--until")
    parser.add_argument("--target")
    parser.add_argument("--record")
    args = parser.parse_args()
    given = json.loads(sys.stdin.read())
    if args.record:
        with open(args.record, "w") as out:
            json.dump({"input": given, "cwd": os.getcwd(), "files": files_under(".")}, out)
    if args.until:
        deadline = time.monotonic() + 60
        while not os.path.exists(args.until) and time.monotonic() < deadline:
            time.sleep(0.05)
    if args.mode == "crash":
        print("candidate crashed on purpose", file=sys.stderr)
        sys.exit(3)
    if args.mode == "hang":
        time.sleep(3600)
    if args.mode == "garbage":
        print("this is not JSON")
        return
    if args.mode == "invalid":
        print(json.dumps({"schema_version": "fusion-validation-candidate.v1", "findings": []}))
        return
    if args.mode == "write":
        with open("scribble.txt", "w") as out:
            out.write("a reviewer must not write\n")
    if args.mode == "write-to":
        with open(args.target, "a") as out:
            out.write("# a reviewer wrote here\n")
    findings, read = [], 0
    for entry in given["request"]["scope"]:
        for path in files_under(entry):
            read += 1
            with open(path, encoding="utf-8") as handle:
                for number, line in enumerate(handle, start=1):
                    match = re.search(args.pattern, line)
                    if match:
                        findings.append(
                            {
                                "severity": args.severity,
                                "location": f"{path}:{number}",
                                "evidence": line.strip(),
                                "impact": f"{match.group(0)} left in the code",
                                "summary": f"{match.group(0)} in {path}",
                            }
                        )
    answer = {
        "schema_version": given["answer_schema"]["properties"]["schema_version"]["const"],
        "findings": findings,
        "verified": [f"read {read} file(s) of the scope"],
        "limitations": args.limitation,
    }
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
