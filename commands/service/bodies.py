"""A request's body as the service takes it: through the input layer, checked against
its route's closed schema (``BadRequest`` with the deviations otherwise)."""

from __future__ import annotations

from typing import Any

from commands.schemas.checker import check
from ledger.events import Deviation
from ledger.intake import parse_json

from .routes import Endpoint

__all__ = ["BODY_SOURCE", "BadRequest", "body_of", "deviations_line"]

BODY_SOURCE = "the request body"


class BadRequest(Exception):
    """The request itself is refused (its query or body): 413 or 422."""

    def __init__(self, status: int, message: str, deviations: list[Deviation] | None = None):
        super().__init__(message)
        self.status, self.deviations = status, deviations or []


def body_of(endpoint: Endpoint, data: bytes) -> dict[str, Any]:
    """The JSON body through the input layer, checked against the route's closed schema
    (an empty body is the empty object: the verbs that take no argument; a route without
    a body schema takes no body)."""
    if endpoint.body is None:  # a GET: its parameters are in the query
        if data:
            raise BadRequest(422, f"{BODY_SOURCE}: {endpoint.method} {endpoint.path} takes none")
        return {}
    value = parse_json(data, BODY_SOURCE, kind=None) if data.strip() else {}
    deviations = check(endpoint.body, value)
    if deviations:
        raise BadRequest(422, deviations_line(BODY_SOURCE, deviations), deviations)
    assert isinstance(value, dict)  # every body schema is a closed object
    return value


def deviations_line(what: str, deviations: list[Deviation]) -> str:
    first = deviations[0]
    more = f" (and {len(deviations) - 1} more)" if len(deviations) > 1 else ""
    return (
        f"{what} does not match its schema: {first.pointer or '/'}: {first.kind} "
        f"(expected {first.expected}; got {first.actual_type}){more}"
    )
