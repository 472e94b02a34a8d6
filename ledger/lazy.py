"""Names a package imports on first use (PEP 562): the one ``__getattr__`` that
``ledger``, ``projections`` and ``commands.plane`` share, so that a program needing one
light name does not pay for the heavy modules beside it (``evidence --version``, a TAB).
Imports nothing itself."""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from importlib import import_module
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(
    package: str,
    names: Mapping[str, str | tuple[str, str]],
    namespace: MutableMapping[str, Any],
    *,
    submodules: bool = False,
) -> Callable[[str], Any]:
    """The package's ``__getattr__``: a name of ``names`` is imported from its submodule
    (``"module"``, or ``("module", "attribute")`` when it is known by another name there)
    and kept in ``namespace`` (the package's globals), so it is looked up once. With
    ``submodules``, any other identifier that names a submodule is that submodule: the
    ones an eager package imported as a side effect stay reachable as attributes."""

    def getattr_(name: str) -> Any:
        where = names.get(name)
        if where is not None:
            module, attribute = (where, name) if isinstance(where, str) else where
            value = getattr(import_module(f"{package}.{module}"), attribute)
            namespace[name] = value
            return value
        if submodules and name.isidentifier() and not name.startswith("__"):
            try:
                return import_module(f"{package}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return getattr_
