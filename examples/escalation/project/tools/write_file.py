"""A tool that writes one file in the working copy (tools may write; validations may not)."""

import json
import pathlib
import sys

path, content = sys.argv[1], sys.argv[2]
pathlib.Path(path).write_text(content)
print(json.dumps({"written": path, "bytes": len(content.encode())}))
