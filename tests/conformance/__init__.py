"""The official MCP conformance suite (npm ``@modelcontextprotocol/conformance``) run from
pytest: a fixture MCP server written here with the official Python SDK
(fixture_server.py) and the harness that points the suite at a URL (harness.py)."""
