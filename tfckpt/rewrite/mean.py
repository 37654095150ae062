"""The weighted mean of several checkpoints' values, chunk by chunk.

``(w_1 x_1 + ... + w_n x_n) / (w_1 + ... + w_n)`` element-wise, summed in source order
in float64 (complex128), then rounded to the output dtype as ``tf.cast`` rounds: what
:func:`tfckpt.average` writes, through the engine's pipeline (:func:`mean_chunks` is
a mean item's reads).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tfckpt.format import dtypes as _dt
from tfckpt.rewrite.cast import CastCounts, Caster, OverflowPolicy

# Weights whose largest magnitude lies outside this range are scaled by a power of two
# first: their products with values (or their sum) would underflow or overflow, and a
# power of two changes no rounding. Weights inside it are used as given.
WEIGHT_RANGE = (2.0**-100, 2.0**100)


def in_range(weights: Sequence[float]) -> Sequence[float]:
    """``weights`` as given, unless the largest magnitude lies outside
    :data:`WEIGHT_RANGE`: then equal weights become ones (the plain mean, bit for bit)
    and others are scaled by one power of two so the largest lies in [1, 2)."""
    largest = max(abs(w) for w in weights)
    if WEIGHT_RANGE[0] <= largest <= WEIGHT_RANGE[1] or largest == 0:
        return weights
    if all(w == weights[0] for w in weights):
        return [1.0] * len(weights)
    exponent = math.frexp(largest)[1]  # largest = m * 2**exponent, 0.5 <= m < 1
    return [math.ldexp(w, 1 - exponent) for w in weights]


def aligned(chunks: Iterator[np.ndarray], step: int) -> Iterator[np.ndarray]:
    """The elements of ``chunks`` again, in pieces of ``step`` (the last may be shorter).

    Sources may come in pieces of different sizes (a partitioned tensor is read in
    bands of its slices); aligned, the i-th piece of every source covers the same
    elements.
    """
    pending: list[np.ndarray] = []
    have = 0
    for chunk in chunks:
        while chunk.size:
            take = min(step - have, chunk.size)
            pending.append(chunk[:take])
            have += take
            chunk = chunk[take:]
            if have == step:
                yield pending[0] if len(pending) == 1 else np.concatenate(pending)
                pending, have = [], 0
    if have:
        yield pending[0] if len(pending) == 1 else np.concatenate(pending)


def _parts(a: np.ndarray) -> tuple[np.ndarray, ...]:
    """The real arrays to scale: a complex array's real and imaginary parts, each alone
    (a complex product with ``w + 0j`` would turn an infinite part into NaN)."""
    return (a.real, a.imag) if a.dtype.kind == "c" else (a,)


def weighted_mean(parts: Sequence[np.ndarray], weights: Sequence[float], wide) -> np.ndarray:
    """``(w_1 x_1 + ... + w_n x_n) / (w_1 + ... + w_n)`` element-wise, in ``wide``
    (float64 or complex128), summed in source order.

    Where that sum overflows although the mean would not (float64 sources near their
    largest values), those elements are summed again with each weight divided first.
    Weights far from 1 (``5e-324``) are scaled by a power of two first, which changes
    no rounding, so their products do not underflow.
    """
    weights = in_range(weights)
    total = math.fsum(weights)
    acc = np.empty(parts[0].size, dtype=wide)
    term = np.empty_like(acc)
    with np.errstate(all="ignore"):
        for k, (x, weight) in enumerate(zip(parts, weights)):
            target = acc if k == 0 else term
            np.copyto(target, x, casting="unsafe")
            if weight != 1.0:
                for part in _parts(target):
                    part *= weight
            if k:
                acc += term
        for part in _parts(acc):
            part /= total
        over = ~np.isfinite(acc)
        if over.any():
            terms = []
            for x, weight in zip(parts, weights):
                term = x[over].astype(wide)
                for part in _parts(term):
                    part *= weight / total
                terms.append(term)
            again = terms[0]  # not from zeros: -0.0 stays -0.0
            for term in terms[1:]:
                again += term
            acc[over] = again
    return acc


def accumulator(dtype: _dt.DType) -> np.dtype:
    """What a mean of ``dtype`` values is summed in: complex128 or float64."""
    return np.dtype(np.complex128 if dtype.kind == "complex" else np.float64)


def mean_chunks(
    sources: Sequence[Any],
    name: str,
    extents,
    weights: Sequence[float],
    out_dtype: _dt.DType,
    chunk_bytes: int,
) -> Iterator[tuple[np.ndarray, int]]:
    """The weighted mean of tensor ``name`` (or its slice ``extents``) across ``sources``
    (checkpoints, oldest first), in pieces of the accumulator's dtype: (piece, source
    bytes read for it).

    Per piece, each source's part (twice, while it is cut to size), the accumulator,
    one term and the result are alive: the pieces are sized so that this stays within
    a third of ``chunk_bytes``, the pipeline holding up to three at once.
    """
    src = _dt.lookup(sources[0].info(name).dtype)
    wide = accumulator(src)
    n = len(sources)
    per_element = 2 * n * src.fixed_itemsize + 2 * wide.itemsize + out_dtype.fixed_itemsize
    step = max(1, chunk_bytes // 3 // per_element)
    read_bytes = step * src.fixed_itemsize
    readers = [aligned(s.iter_chunks(name, read_bytes, extents=extents), step) for s in sources]
    for parts in zip(*readers, strict=True):
        yield weighted_mean(parts, weights, wide), sum(x.nbytes for x in parts)


class ComplexCaster:
    """complex128 means rounded to complex64 part by part, each part as a float32 is
    (overflow policy and counts included): the :class:`Caster` of a mean's complex
    output."""

    def __init__(self, overflow: OverflowPolicy):
        self._parts = Caster(_dt.lookup("float64"), _dt.lookup("float32"), overflow)
        self.target = _dt.lookup("complex64")

    @property
    def counts(self) -> CastCounts:
        return self._parts.counts

    def __call__(self, acc: np.ndarray) -> np.ndarray:
        result = np.empty(acc.size, self.target.array_dtype)
        result.real = self._parts(np.ascontiguousarray(acc.real))
        result.imag = self._parts(np.ascontiguousarray(acc.imag))
        return result
