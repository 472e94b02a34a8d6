"""Pure folds over the log and the read models built from them. Imports ``ledger`` only,
never ``commands``.

The names below are imported on first use (PEP 562), as ``ledger``'s are: a program that
needs only the pure parts (``projections.states``, ``projections.documents``) does not
pay for the read models' engine and SQLAlchemy under it (``evidence plan --help``, a
completion request).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledger.lazy import lazy_getattr

if TYPE_CHECKING:
    from .documents import delta, fold, fold_all
    from .engine import ProjectionEngine, ProjectionStatus
    from .read_models import ALL_PROJECTIONS, open_projections
    from .shapes import Projection

# name -> submodule: what ``projections.<name>`` imports on first use.
_LAZY: dict[str, str] = {
    "delta": "documents",
    "fold": "documents",
    "fold_all": "documents",
    "Projection": "shapes",
    "ProjectionEngine": "engine",
    "ProjectionStatus": "engine",
    "ALL_PROJECTIONS": "read_models",
    "open_projections": "read_models",
}

if not TYPE_CHECKING:  # for mypy every name above is imported; unknown names stay errors
    __getattr__ = lazy_getattr(__name__, _LAZY, globals(), submodules=True)


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
