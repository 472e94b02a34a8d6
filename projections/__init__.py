"""Pure folds over the log and the read models built from them. Imports ``ledger`` only,
never ``commands``."""

from .documents import delta, fold, fold_all
from .engine import Projection, ProjectionEngine, ProjectionStatus
from .read_models import ALL_PROJECTIONS, open_projections

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
