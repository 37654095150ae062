"""The order people read names in: ``layer_2`` before ``layer_10``."""

from __future__ import annotations

import re

_DIGITS = re.compile(r"\d+")
_LONGEST = 74  # digits whose count one character after "0" can say (up to "z")


def _sized(m: re.Match) -> str:
    # A run of digits preceded by its length: shorter numbers first, equal lengths in
    # the order of their value (which is the order of their text).
    return chr(0x30 + min(len(m[0]), _LONGEST)) + m[0]


def natural_key(name: str) -> str:
    """A sort key ordering the runs of digits in names by their value:
    ``_variables/2`` before ``_variables/10`` (a plain sort puts ``10`` first). A string
    (compared in C), so that sorting a hundred thousand names stays quick.

    >>> sorted(["v/10", "v/2", "v/1"], key=natural_key)
    ['v/1', 'v/2', 'v/10']
    """
    return _DIGITS.sub(_sized, name)


def in_natural_order(names: list[str]) -> list[str]:
    """``names`` in natural order when they come sorted (a bundle's, a V1 table's); as
    they are when they come in an order of their own (a Keras HDF5 file's layers)."""
    if any(a > b for a, b in zip(names, names[1:])):
        return list(names)
    if _plain_is_natural(names):
        return list(names)
    return sorted(names, key=natural_key)


def _plain_is_natural(names: list[str]) -> bool:
    """Whether the plain order of ``names`` is their natural order: when the k-th run of
    digits has one length of at most 9 in every name that has one
    (``scope_0001/var_07``, ``scope_0002/var_12``...).

    Then a natural key inserts before the k-th run one character, itself a digit, in
    every name: at the first difference between two names, a run begun before it has
    one length in both (so both runs go on, or both end), and a run begun there
    compares with a non-digit as that digit does, so the names compare as their
    texts do.
    """
    # Each name's runs of digits as runs of "0" between spaces: names of one pattern
    # (nearly all, in a checkpoint) give one such line, checked once.
    joined = "\n".join(names)
    if not joined.isascii():  # digits of other scripts count too: the key decides
        return False
    masked = joined.translate(_MASK)
    length_at: list[int] = []  # the length of the k-th run
    for line in set(masked.split("\n")):
        for k, run in enumerate(line.split()):
            if k == len(length_at):
                if len(run) > 9:
                    return False
                length_at.append(len(run))
            elif length_at[k] != len(run):
                return False
    return True


# ASCII digits to "0", line ends kept, any other character a space (one table: str.translate
# maps ASCII text through it at C speed).
_MASK = {c: "0" if chr(c).isdigit() else " " for c in range(128) if c != ord("\n")}
