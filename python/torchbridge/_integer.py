"""Integers as torch takes them: Python's, numpy's and anything else with ``__index__``, but not a
bool (an ``int`` to Python, rarely meant as a count or a seed)."""

import operator


def as_integer(value) -> "int | None":
    """``value`` as an int, or None when it is not an integer."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None
