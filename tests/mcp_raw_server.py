"""An MCP server that breaks the protocol, for tests/commands/cli/test_mcp_proxy.py: JSON-RPC on
stdio
written by hand (the SDK's servers keep their wire clean), with one tool, ``garble``,
whose call is answered by a line that is no JSON-RPC message, then silence."""

from __future__ import annotations

import json
import sys
import time

RESULTS = {
    "initialize": lambda params: {
        "protocolVersion": params["protocolVersion"],
        "capabilities": {"tools": {}},
        "serverInfo": {"name": "raw-upstream", "version": "1"},
    },
    "tools/list": lambda params: {
        "tools": [{"name": "garble", "inputSchema": {"type": "object", "properties": {}}}]
    },
}

for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue  # a notification
    if message["method"] == "tools/call":
        sys.stdout.write("this is not JSON-RPC\n")
        sys.stdout.flush()
        time.sleep(30)
        continue
    result = RESULTS.get(message["method"], lambda params: {})(message.get("params"))
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}) + "\n")
    sys.stdout.flush()
