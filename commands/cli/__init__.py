"""The ``evidence`` command: click verbs, one module per area, over the plane's handlers.

Each verb parses its options (through ``inputs``), calls a handler, and renders the
result (``common``, ``terminal``). Nothing below this package imports it.
"""

from .main import cli, main

__all__ = ["cli", "main"]
