"""Histograms of magnitudes on a log2 scale, accumulated chunk by chunk.

One bin per binary exponent: bin ``k`` counts the magnitudes in ``[2**k, 2**(k+1))``.
The bins are exact (``numpy.frexp`` gives the exponent of every float without rounding),
so the boundaries of every IEEE format's normal and subnormal ranges, which are powers
of two, fall on bin edges; and the memory a tensor needs is one counter per exponent
its values use, whatever its size. ``stats`` keeps one for the values of each tensor,
``compare_values`` one for the relative errors.
"""

from __future__ import annotations

import numpy as np

# frexp's exponents of float64, subnormals included, lie in [-1073, 1024].
_OFFSET = 1100
_BINS = 2200
_BLOCK = 1 << 16  # elements per bincount
# Per IEEE type read directly: its bits as unsigned integers, the mantissa's width, the
# exponent field's mask and its bias. Other types are widened exactly to one of these.
_LAYOUTS = {
    np.dtype(np.float16): (np.uint16, 10, 0x1F, 15),
    np.dtype(np.float32): (np.uint32, 23, 0xFF, 127),
    np.dtype(np.float64): (np.uint64, 52, 0x7FF, 1023),
}


class Log2Histogram:
    """Counts of magnitudes per binary exponent, plus zeros and non-finite values.

    >>> h = Log2Histogram()
    >>> h.add(np.array([0.0, 0.3, 1.0, 1.5, 3.0, np.inf]))
    >>> h.result()
    {'first': -2, 'counts': [1, 0, 2, 1], 'zeros': 1, 'nonfinite': 1}
    """

    def __init__(self) -> None:
        self._counts: np.ndarray | None = None  # allocated when a finite non-zero comes
        self.zeros = 0
        self.nonfinite = 0  # inf and NaN

    def add(self, values: np.ndarray) -> None:
        """Count the magnitudes of ``values`` (any real floating-point or integer array)."""
        x = values.reshape(-1)
        if x.dtype not in _LAYOUTS:  # integers, bfloat16, float8, other byte orders
            wide = x.dtype.kind in "iub" or x.dtype.itemsize > 4
            x = x.astype(np.float64 if wide else np.float32)
        bits, mantissa, mask, bias = _LAYOUTS[x.dtype]
        raw = x.view(bits)
        # A normal number's exponent field is its bin: no arithmetic on the values. In
        # blocks that stay in the cache (bincount widens its input to 64-bit integers).
        per_field = np.zeros(mask + 1, np.int64)
        for a in range(0, raw.size, _BLOCK):
            field = (raw[a : a + _BLOCK] >> bits(mantissa)) & bits(mask)
            per_field += np.bincount(
                field.view(np.int64) if x.itemsize == 8 else field, minlength=mask + 1
            )
        self.nonfinite += int(per_field[mask])
        if per_field[1:mask].any():
            self._bins()[_OFFSET + 1 - bias : _OFFSET + mask - bias] += per_field[1:mask]
        if per_field[0]:  # zeros and subnormals: the exponent field is 0
            small = x[(raw & bits(mask << mantissa)) == 0]
            small = small[small != 0]
            self.zeros += int(per_field[0]) - small.size
            if small.size:
                _, exponent = np.frexp(small.astype(np.float64))  # |x| = m * 2**e, m in [0.5, 1)
                self._bins()[:] += np.bincount(exponent - 1 + _OFFSET, minlength=_BINS)

    def _bins(self) -> np.ndarray:
        if self._counts is None:
            self._counts = np.zeros(_BINS, np.int64)
        return self._counts

    def result(self) -> dict:
        """``{"first": k, "counts": [...], "zeros", "nonfinite"}``: ``counts[i]`` is the
        number of magnitudes in ``[2**(k+i), 2**(k+i+1))``, trimmed to the bins in use
        (``first`` is None and ``counts`` empty when there is none)."""
        first: int | None = None
        counts: list[int] = []
        if self._counts is not None:
            used = np.flatnonzero(self._counts)
            lo, hi = int(used[0]), int(used[-1])
            first = lo - _OFFSET
            counts = [int(c) for c in self._counts[lo : hi + 1]]
        return {"first": first, "counts": counts, "zeros": self.zeros, "nonfinite": self.nonfinite}
