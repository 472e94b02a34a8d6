"""Syntax of the names users give: plan, project, resource, tool and skill names."""

from __future__ import annotations

import re

from .plane import CommandRefused

# A resource is named by a string without whitespace (seed 000): "repo:api", "./src".
_NO_SPACE = re.compile(r"\S{1,512}")
# Identifiers (plans, projects, tools, skills): letters, digits and . _ - : /
_IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")


def check_resource(value: str) -> str:
    if not _NO_SPACE.fullmatch(value or ""):
        raise CommandRefused(
            f"invalid resource {value!r}: a resource is a non-empty name without whitespace"
        )
    return value


def check_identifier(value: str, what: str) -> str:
    if not _IDENTIFIER.fullmatch(value or ""):
        raise CommandRefused(
            f"invalid {what} {value!r}: use letters, digits and . _ - : / "
            "(starting with a letter or digit, at most 128 characters)"
        )
    return value
