"""The agent's first step: look at the project (a read-only tool)."""

import json
import pathlib

print(
    json.dumps(
        {
            "python_files": sorted(
                str(p) for p in pathlib.Path(".").rglob("*.py") if "checks" not in p.parts
            )
        }
    )
)
