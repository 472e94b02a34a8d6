"""Database backends of the store: from a URL to an engine, and from an engine to the
``Backend`` that does what its database does differently (``base.Backend``).

``sqlite`` is the embedded default, ``postgres`` the multi-writer deployment; the store
itself (``ledger.store``) is the same code on both.
"""

from __future__ import annotations

from sqlalchemy.engine import Engine, make_url

from ..errors import LedgerOpenError, LedgerURLError
from .base import Backend, driver_connection
from .postgres import DRIVER as _POSTGRES_DRIVER
from .postgres import PostgresBackend
from .sqlite import SQLiteBackend

__all__ = [
    "Backend",
    "PostgresBackend",
    "SQLiteBackend",
    "backend_for",
    "driver_connection",
    "make_engine",
    "url_identity",
]

_BACKENDS: dict[str, type[Backend]] = {
    SQLiteBackend.name: SQLiteBackend,
    PostgresBackend.name: PostgresBackend,
}


def backend_for(engine: Engine) -> Backend:
    """The backend of an engine's database."""
    try:
        return _BACKENDS[engine.dialect.name]()
    except KeyError:
        raise LedgerOpenError(
            f"unsupported database {engine.dialect.name!r}: use SQLite or PostgreSQL"
        ) from None


def make_engine(url: str, *, must_exist: bool) -> Engine:
    """The engine for a database URL (``sqlite:///PATH`` or ``postgresql+psycopg://...``);
    with ``must_exist``, a SQLite file that is not there is refused, not created."""
    if "://" not in url:
        raise LedgerURLError(
            f"not a database URL: {url!r} (expected sqlite:///PATH or "
            "postgresql+psycopg://USER@HOST/DB)"
        )
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise LedgerURLError(f"malformed database URL {url!r}: {exc}") from None
    name = parsed.get_backend_name()
    if name == "postgres":
        name = PostgresBackend.name
    backend = _BACKENDS.get(name)
    if backend is None:
        raise LedgerURLError(
            f"unsupported database scheme {parsed.drivername!r} in {url!r}: "
            "use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
        )
    return backend.create_engine(parsed, must_exist=must_exist)


def url_identity(db_url: str) -> str:
    """The URL without its password (so ``***`` from a rendered URL maps to the same
    key) and with the driver the store would use."""
    driver, _, rest = db_url.partition("://")
    if driver in ("postgres", "postgresql"):
        driver = _POSTGRES_DRIVER  # the store's normalisation
    netloc, slash, tail = rest.partition("/")
    userinfo, at, host = netloc.rpartition("@")
    if at:
        netloc = userinfo.split(":", 1)[0] + "@" + host
    return f"{driver}://{netloc}{slash}{tail}"
