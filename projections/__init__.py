"""Pure folds over the log and the read models built from them. Imports ``ledger`` only,
never ``commands``.

The names below are imported on first use (PEP 562), as ``ledger``'s are: a program that
needs only the pure parts (``projections.states``, ``projections.documents``) does not
pay for the read models' engine and SQLAlchemy under it (``evidence plan --help``, a
completion request).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .documents import delta, fold, fold_all
    from .engine import Projection, ProjectionEngine, ProjectionStatus
    from .read_models import ALL_PROJECTIONS, open_projections

# name -> submodule: what ``projections.<name>`` imports on first use.
_LAZY: dict[str, str] = {
    "delta": "documents",
    "fold": "documents",
    "fold_all": "documents",
    "Projection": "engine",
    "ProjectionEngine": "engine",
    "ProjectionStatus": "engine",
    "ALL_PROJECTIONS": "read_models",
    "open_projections": "read_models",
}

if not TYPE_CHECKING:  # for mypy every name above is imported; unknown names stay errors

    def __getattr__(name: str) -> Any:
        if name in _LAZY:
            value = getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
            globals()[name] = value
            return value
        if name.isidentifier() and not name.startswith("__"):
            # ``projections.engine`` ...: the submodules the eager package imported as a
            # side effect are still reachable as attributes.
            try:
                return import_module(f"{__name__}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{__name__}.{name}":
                    raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ALL_PROJECTIONS",
    "Projection",
    "ProjectionEngine",
    "ProjectionStatus",
    "delta",
    "fold",
    "fold_all",
    "open_projections",
]
