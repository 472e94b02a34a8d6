"""Write REPORT.md from what the other steps of the graph found (a tool that writes)."""

import json
import pathlib
import sys

files, lines, long_lines, tests_passed, tests_message = sys.argv[1:6]
pathlib.Path("REPORT.md").write_text(
    "# Project report\n\n"
    f"- Python files: {files} ({lines} lines)\n"
    f"- lines over 60 characters: {long_lines}\n"
    f"- tests passed: {tests_passed} ({tests_message})\n"
)
print(json.dumps({"written": "REPORT.md"}))
