"""A tool that fabricates a field nobody declared (`confidence`): the kind of output a
best-effort system would silently drop."""

import json
import pathlib

text = pathlib.Path("notes.md").read_text()
print(json.dumps({"summary": text.splitlines()[0].lstrip("# "), "confidence": 0.93}))
