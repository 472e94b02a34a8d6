"""A tiny package whose test suite fails until the agent's fix lands."""


def add(a: int, b: int) -> int:
    return a - b  # the bug the plan fixes


def double(a: int) -> int:
    return add(a, a)
