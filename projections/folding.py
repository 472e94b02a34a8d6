"""The one way every projection dispatches on an event's type.

``Steps`` maps event payload types to step functions, registered with a decorator
beside each other (one small function per event type). A payload's step is found by
its type, or the nearest base type registered (``ValidationRegistered`` takes the step
of ``ToolRegistered``); an event with no step is left alone.

``StreamFold`` is the fold of one stream kind built on it: ``(state, payload) ->
state`` with ``None`` for "no document yet". Steps registered with ``on`` only ever see
an existing state (an event before the stream's creation leaves ``None`` as it is);
steps registered with ``on_any`` see ``None`` too (creation events). Folds are pure and
total: an event the state cannot take returns the state unchanged.

The analytics projection registers its row-writing steps in a ``Steps`` of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ledger.events import EventPayload

__all__ = ["Steps", "StreamFold"]

F = TypeVar("F", bound=Callable[..., Any])
S = TypeVar("S")
P = TypeVar("P", bound=EventPayload)


class Steps(Generic[F]):
    """Event payload type -> step function."""

    def __init__(self) -> None:
        self._steps: dict[type, F] = {}
        self._resolved: dict[type, F | None] = {}

    def register(self, *types: type[EventPayload]) -> Callable[[F], F]:
        def add(step: F) -> F:
            for t in types:
                if t in self._steps:
                    raise ValueError(f"two steps for {t.__name__}")
                self._steps[t] = step
            self._resolved.clear()
            return step

        return add

    def lookup(self, t: type) -> F | None:
        """The step of payload type ``t`` (or of its nearest registered base)."""
        try:
            return self._resolved[t]
        except KeyError:
            found = next((self._steps[c] for c in t.__mro__ if c in self._steps), None)
            self._resolved[t] = found
            return found

    def types(self) -> tuple[type, ...]:
        return tuple(self._steps)


class StreamFold(Generic[S]):
    """The pure fold of one stream kind's typed state (see the module docstring)."""

    def __init__(self, kind: str, state: type[S]) -> None:
        self.kind = kind
        self.state = state
        self._steps: Steps[Callable[[Any, Any], S | None]] = Steps()

    def on(self, *types: type[P]) -> Callable[[Callable[[S, P], S]], Callable[[S, P], S]]:
        """Register the step of ``types`` for an existing state."""

        def add(step: Callable[[S, P], S]) -> Callable[[S, P], S]:
            def existing(state: S | None, payload: P) -> S | None:
                return None if state is None else step(state, payload)

            self._steps.register(*types)(existing)
            return step

        return add

    def on_any(
        self, *types: type[P]
    ) -> Callable[[Callable[[S | None, P], S | None]], Callable[[S | None, P], S | None]]:
        """Register the step of ``types`` that also takes ``None`` (no document yet)."""

        def add(step: Callable[[S | None, P], S | None]) -> Callable[[S | None, P], S | None]:
            self._steps.register(*types)(step)
            return step

        return add

    def __call__(self, state: S | None, payload: EventPayload) -> S | None:
        if state == {}:
            state = None  # the plain empty document: no document yet
        step = self._steps.lookup(type(payload))
        return state if step is None else step(state, payload)

    def fold_all(self, payloads: Any) -> S | None:
        state: S | None = None
        for payload in payloads:
            state = self(state, payload)
        return state
