"""The order people read names in: ``layer_2`` before ``layer_10``."""

from __future__ import annotations

import re

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple:
    """A sort key ordering the runs of digits in names by their value:
    ``_variables/2`` before ``_variables/10`` (a plain sort puts ``10`` first).

    >>> sorted(["v/10", "v/2", "v/1"], key=natural_key)
    ['v/1', 'v/2', 'v/10']
    """
    # Text and numbers alternate from a text part (maybe ""): equal positions compare
    # like with like. Leading zeros keep names that differ only by them apart.
    parts = _DIGITS.split(name)
    return tuple((int(p), p) if i % 2 else p for i, p in enumerate(parts))
