"""The plane as a service (``evidence serve``, docs/service.md): an ASGI app that holds
the plane key and the database, and lets an agent reach its plan over HTTP with a
credential an operator issued for that plan. Below the CLI, above the plane: it imports
no click, and calls only the plane's Python API."""

from __future__ import annotations

from .app import DEFAULT_MAX_IN_FLIGHT, Service, create_app

__all__ = ["DEFAULT_MAX_IN_FLIGHT", "Service", "create_app"]
