"""Casting floating-point chunks between dtypes exactly as TensorFlow's ``tf.cast`` does.

Finite values round to nearest, ties to even; ±inf, NaN and -0.0 are kept.
A float64 value cast to a type narrower than float32 is first rounded to
float32, then to the target, because that is what TensorFlow computes (a
single direct rounding differs in rare ties). A NaN comes out as the target's
quiet NaN with the source's sign: payload bits are not carried, because
TensorFlow itself carries them differently on different paths.

The rounding itself is pluggable (``convert``): numpy/ml-dtypes by default,
``tf.cast`` on an accelerator from :mod:`tfckpt.tf`; everything after it
(overflow policy, NaNs, counts) is shared, so both give the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import dtypes as _dt

OVERFLOW_POLICIES = ("error", "clip", "inf")
CAST_TARGETS = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2")


@dataclass
class CastCounts:
    """What a cast did to the values of one tensor."""

    overflow: int = 0   # finite values beyond the target's range
    to_zero: int = 0    # non-zero values that became zero
    subnormal: int = 0  # values that became subnormal in the target
    elements: int = 0

    def add(self, other: "CastCounts") -> None:
        self.overflow += other.overflow
        self.to_zero += other.to_zero
        self.subnormal += other.subnormal
        self.elements += other.elements


@dataclass
class Caster:
    """Casts chunks of one source dtype to one target dtype, counting what happened.

    ``overflow``: ``'error'`` and ``'inf'`` both produce IEEE results (±inf, or
    NaN for float8 types without infinities) and count them; ``'clip'``
    saturates to the largest finite value of the target, keeping the sign.
    """

    source: _dt.DType
    target: _dt.DType
    overflow: str = "error"
    counts: CastCounts = field(default_factory=CastCounts)
    convert: Callable[[np.ndarray, np.dtype], np.ndarray] | None = None

    def __post_init__(self):
        if self.overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow policy must be one of {OVERFLOW_POLICIES}")
        self._via32 = (self.source.name == "float64" and self.target.itemsize < 4)
        src, dst = _finfo(self.source.numpy), _finfo(self.target.numpy)
        self._max = self.target.numpy.type(dst.max)
        self._tiny = self.target.numpy.type(dst.smallest_normal)
        self._nan = np.array(np.nan, dtype=self.target.numpy)
        # Widening casts are exact: nothing to count.
        self._exact = float(dst.max) >= float(src.max) and \
            float(dst.smallest_subnormal) <= float(src.smallest_subnormal) and \
            dst.nmant >= src.nmant

    def __call__(self, chunk: np.ndarray) -> np.ndarray:
        c = self.counts
        c.elements += chunk.size
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            src = chunk.astype(np.float32) if self._via32 else chunk
            if self.convert is None:
                out = src.astype(self.target.numpy)
            else:
                out = self.convert(src, self.target.numpy)
            nan = np.isnan(out)
            if nan.any():
                out[nan] = np.where(np.signbit(chunk[nan]), -self._nan, self._nan)
            if self._exact:
                return out
            # Boolean temporaries only (one byte per element), compared in native dtypes.
            over = np.isfinite(chunk)
            over &= ~np.isfinite(out)
            n_over = int(np.count_nonzero(over))
            if n_over:
                c.overflow += n_over
                if self.overflow == "clip":
                    out[over] = np.where(np.signbit(chunk[over]), -self._max, self._max)
            mask = out == 0
            mask &= chunk != 0
            c.to_zero += int(np.count_nonzero(mask))
            mag = np.abs(out)
            np.less(mag, self._tiny, out=mask)
            mask &= mag > 0
            c.subnormal += int(np.count_nonzero(mask))
        return out


def _finfo(npdtype: np.dtype):
    try:
        return np.finfo(npdtype)
    except ValueError:
        import ml_dtypes
        return ml_dtypes.finfo(npdtype)


def should_cast(dtype: _dt.DType, target: _dt.DType | None,
                cast_from: frozenset[str] | None) -> bool:
    """Whether the default cast rule applies to a tensor of ``dtype``."""
    if target is None or dtype is target or not dtype.is_floating:
        return False
    return cast_from is None or dtype.name in cast_from
