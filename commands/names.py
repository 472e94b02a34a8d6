"""Syntax of the names users give: plan, project, resource, tool and skill names."""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from .errors import CommandRefused

# A resource is named by a string without whitespace: "repo:api", "./src".
_NO_SPACE = re.compile(r"\S{1,512}")
# Identifiers (plans, projects, tools, skills): letters, digits and . _ - : /
_IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")


def check_resource(value: str) -> str:
    """The resource's one identity, whatever its spelling: a filesystem path (absolute,
    starting with ``./``, ``../`` or ``~``, or naming an existing file or directory) is
    its canonical absolute path — symlinks resolved, no ``.``/``..`` segment, no
    trailing slash — so ``repo``, ``repo/``, ``repo/.`` and a symlink to it are one
    resource and get the same validations; anything else (``repo:api``) is a name, kept
    as given."""
    if not _NO_SPACE.fullmatch(value or ""):
        raise CommandRefused(
            f"invalid resource {value!r}: a resource is a non-empty name without whitespace"
        )
    if _is_path(value):
        try:
            return os.path.realpath(os.path.expanduser(value))
        except (OSError, ValueError) as exc:
            raise CommandRefused(f"invalid resource {value!r}: {exc}") from None
    return value


# A URI-like scheme prefix (RFC 3986): `repo:api/x` is a name, whatever its slashes.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def looks_like_path(value: str) -> bool:
    """Whether a resource is *written* as a filesystem path: absolute, starting with
    ``./``, ``../`` or ``~``, ``.`` or ``..``, or holding a ``/`` without a ``scheme:``
    prefix (``src/api``). Anything else is a name (``repo:api``, ``repo:api/x``,
    ``project``): a bare word names a path only when one exists."""
    if value.startswith(("/", "./", "../", "~")) or value in (".", ".."):
        return True
    return "/" in value and not _SCHEME.match(value)


def check_plan_resource(value: str) -> str:
    """``check_resource`` for a resource a plan works on: one written as a path
    (``looks_like_path``) must exist, as a file or a directory; a name is never looked
    up. The plan copies a path into its sandbox at Execute: a typo must not silently
    become a name with no files and no sandbox."""
    resource = check_resource(value)
    if looks_like_path(value) and not os.path.exists(resource):
        raise CommandRefused(
            f"resource {value!r} is a path that does not exist ({resource}): create it, or "
            "name the resource without a path's form (repo:api)"
        )
    return resource


def _is_path(value: str) -> bool:
    if value.startswith(("/", "./", "../", "~")) or value in (".", ".."):
        return True
    try:
        return os.path.lexists(value)
    except (OSError, ValueError):
        return False


def check_identifier(value: str, what: str) -> str:
    if not _IDENTIFIER.fullmatch(value or "") or _dot_segment(value):
        raise CommandRefused(
            f"invalid {what} {value!r}: use letters, digits and . _ - : / "
            "(starting with a letter or digit, at most 128 characters, no empty, `.` or "
            "`..` segment between slashes)"
        )
    return value


def _dot_segment(value: str) -> bool:
    """A name is never a path (directories are named by digests), but a name that reads
    like one that climbs (``x/../../victim``) is refused outright."""
    return "/" in value and any(part in ("", ".", "..") for part in value.split("/"))


def check_relative_path(value: str, what: str) -> PurePosixPath:
    """A path inside a directory: relative, no ``..``, no control characters. (A symlink
    inside the directory that points out is caught where the path is used.)"""
    path = PurePosixPath(value)
    if (
        not value
        or path.is_absolute()
        or ".." in path.parts
        or "\\" in value
        or any(ord(c) < 32 or ord(c) == 127 for c in value)
    ):
        raise CommandRefused(
            f"invalid {what} {value!r}: a relative path inside the "
            "resource, with no `..`, backslash or control character"
        )
    return path


def inside(root: Path, relative: PurePosixPath | str) -> Path:
    """``root / relative``, refused when it resolves outside ``root`` (through ``..`` or a
    symlink anywhere on the way)."""
    target = (root / relative).resolve()
    base = root.resolve()
    if target != base and base not in target.parents:
        raise CommandRefused(f"path {str(relative)!r} leaves {root}")
    return target
