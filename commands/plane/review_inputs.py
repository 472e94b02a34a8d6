"""What a review host is given, checked before anything runs (docs/reviews.md): the
reviewers configuration (``load_reviewers``: strict, every program runnable) and the
scope (``check_scope``: files and directories inside the repository, none a link), its
digest, and the copy of it a reviewer reads."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from commands.names import check_identifier, check_relative_path, inside
from commands.runner.process import tree_digest
from ledger.intake import load_document

from .core import CommandRefused

MAX_SECONDS = 86_400.0  # the longest a reviewer program may be given


# -- the reviewers configuration -------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class RoleCommand(_Strict):
    """A program: its argv (no shell) and how long it may take (its process group is
    killed after ``timeout_s``)."""

    command: list[str] = Field(min_length=1)
    timeout_s: float = Field(default=300.0, gt=0, le=MAX_SECONDS)

    @field_validator("command")
    @classmethod
    def _argv(cls, argv: list[str]) -> list[str]:
        if not argv[0]:
            raise ValueError("the program (command[0]) must not be empty")
        if any("\0" in arg for arg in argv):
            raise ValueError("an argument contains a NUL character")
        return argv


class CandidateCommand(RoleCommand):
    name: str  # who the reviewer is: kept in the log, never shown to the evaluator
    timeout_s: float = Field(default=600.0, gt=0, le=MAX_SECONDS)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        try:
            return check_identifier(name, "candidate name")
        except CommandRefused as exc:
            raise ValueError(str(exc)) from None


class ReviewersConfig(_Strict):
    """``candidates`` (1 to 16, run in parallel), the ``evaluator``, and optionally a
    ``repair`` program (default: the evaluator, given the repair input) and a
    ``merger`` (its summary goes into the report)."""

    candidates: list[CandidateCommand] = Field(min_length=1, max_length=16)
    evaluator: RoleCommand
    repair: RoleCommand | None = None
    merger: RoleCommand | None = None

    @field_validator("candidates")
    @classmethod
    def _unique(cls, candidates: list[CandidateCommand]) -> list[CandidateCommand]:
        names = [c.name for c in candidates]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"candidate names must be unique: {', '.join(twice)} repeated")
        return candidates

    def normalised(self) -> dict[str, Any]:
        """The configuration as recorded: every default filled in, no null member."""
        return self.model_dump(mode="json", exclude_none=True)


def parse_reviewers(raw: Any, source: str) -> ReviewersConfig:
    """A reviewers configuration from its parsed document; refused (one line naming the
    key) on an unknown key, a missing one or a wrong type: nothing is coerced."""
    if not isinstance(raw, dict):
        raise CommandRefused(f"{source}: a reviewers configuration is a mapping with candidates …")
    try:
        return ReviewersConfig.model_validate(raw)
    except ValidationError as exc:
        # An unknown key usually explains a "missing" one (a typo): name it first.
        error = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
        where = ".".join(str(part) for part in error["loc"]) or "/"
        message = {"extra_forbidden": "unknown key"}.get(error["type"], error["msg"])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise CommandRefused(f"{source}: key `{where}`: {message}{more}") from None


def load_reviewers(path: str | os.PathLike[str]) -> ReviewersConfig:
    """A reviewers file: YAML (``.yaml``/``.yml``), TOML or JSON, read through the input
    layer (size cap, no duplicate keys, no YAML aliases …)."""
    return parse_reviewers(load_document(path, "document"), str(path))


def check_programs(config: ReviewersConfig) -> None:
    """Every program can be found now (a missing one refuses the review before it is
    recorded). A relative path with a slash would be looked up in the program's own
    working directory, which is a copy or an empty directory: refused."""
    roles: list[tuple[str, RoleCommand]] = [(f"candidate {c.name}", c) for c in config.candidates]
    roles += [(r, getattr(config, r)) for r in ("evaluator", "repair", "merger")]
    for what, role in roles:
        if role is None:
            continue
        program = role.command[0]
        if program in ("python", "python3"):
            continue  # run_command runs these with the interpreter running the plane
        if "/" in program and not os.path.isabs(program):
            raise CommandRefused(
                f"{what}: program {program!r} is a relative path; it runs in a copy of the "
                "scope or an empty directory, so give an absolute path or a name on PATH"
            )
        if shutil.which(program) is None:
            raise CommandRefused(f"{what}: program {program!r} is not found or not executable")


# -- the scope ---------------------------------------------------------------------------


def check_scope(repository: Path, scope: list[str]) -> list[str]:
    """The scope's entries as paths relative to the repository, each an existing file or
    directory inside it (not through a symlink out of it): what the candidates read."""
    if not repository.is_dir():
        raise CommandRefused(f"repository {str(repository)!r} is not a directory")
    paths: list[str] = []
    for entry in scope:
        try:
            relative = check_relative_path(entry, "scope entry")
            inside(repository, relative)
        except CommandRefused:
            raise CommandRefused(
                f"scope entry {entry!r} is not a path inside the repository {str(repository)!r}"
                " (relative, no `..`, not leaving it through a symlink)"
            ) from None
        target = repository / relative
        if not (target.is_dir() or target.is_file()):
            raise CommandRefused(
                f"scope entry {entry!r} names no file or directory in {str(repository)!r}"
            )
        paths.append(str(relative))
    return paths


def scope_paths(paths: list[str]) -> list[str]:
    """Sorted, without the entries inside another entry (their directory covers them)."""
    kept: list[str] = []
    for path in sorted(set(paths), key=lambda p: PurePosixPath(p).parts):
        if not any(PurePosixPath(path).is_relative_to(k) for k in kept if k != "."):
            kept.append(path)
    return ["."] if "." in kept else kept


def scope_digest(root: Path, paths: list[str]) -> str:
    """One SHA-256 over the scope's entries under ``root``: each directory's
    ``tree_digest`` (paths, kinds, modes, contents), each file's mode and content."""
    digest = hashlib.sha256()
    for path in scope_paths(paths):
        target = root / path
        try:
            st = os.lstat(target)
            if stat.S_ISDIR(st.st_mode):
                entry = ["dir", tree_digest(target)]
            elif stat.S_ISLNK(st.st_mode):
                entry = ["symlink", os.readlink(target)]
            else:
                entry = ["file", oct(stat.S_IMODE(st.st_mode)), _file_sha256(target)]
        except OSError as exc:
            entry = ["missing", errno.errorcode.get(exc.errno or 0, "?")]
        digest.update(json.dumps([path, *entry]).encode("ascii") + b"\n")
    return digest.hexdigest()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _only_plain(directory: str, names: list[str]) -> set[str]:
    """copytree's ignore: FIFOs, sockets and devices are not part of a review copy (a
    FIFO would block the copy)."""
    skipped = set()
    for name in names:
        mode = os.lstat(os.path.join(directory, name)).st_mode
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            skipped.add(name)
    return skipped


def copy_scope(repository: Path, paths: list[str], into: Path) -> None:
    """The scope's entries at their relative paths under ``into`` (symlinks as symlinks)."""
    into.mkdir()
    for path in scope_paths(paths):
        source, target = repository / path, into / path
        if path == ".":
            shutil.copytree(source, target, symlinks=True, ignore=_only_plain, dirs_exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir() and not source.is_symlink():
            shutil.copytree(source, target, symlinks=True, ignore=_only_plain)
        else:
            shutil.copy2(source, target, follow_symlinks=False)


def remove_copy(root: Path) -> None:
    """Delete a scratch tree, even one a program made unwritable."""

    def retry(function: Any, path: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, 0o700)
            function(path)

    shutil.rmtree(root, onerror=retry)
