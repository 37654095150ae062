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
Where NumKong is installed and the CPU has its SIMD kernels, it rounds the
pairs in ``SIMD_PAIRS`` instead of numpy (whose wheels round half floats in
software, several times slower); ``TFCKPT_CAST=reference`` turns it off.
"""

from __future__ import annotations

import bisect
import math
import os
from array import array
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, get_args

import numpy as np

from tfckpt.errors import CastOverflowError
from tfckpt.format import dtypes as _dt

OverflowPolicy = Literal["error", "clip", "inf"]
CastTarget = Literal["float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2"]
OVERFLOW_POLICIES: tuple[OverflowPolicy, ...] = get_args(OverflowPolicy)
CAST_TARGETS: tuple[CastTarget, ...] = get_args(CastTarget)

# Source and target pairs NumKong rounds (ties to even, subnormals kept) bit for bit
# as numpy/ml-dtypes do for every non-NaN float32 pattern; NaNs are made canonical
# afterwards anyway. A float64 source is rounded to float32 by numpy first.
SIMD_PAIRS: frozenset[tuple[str, str]] = frozenset(
    {
        ("float32", "float16"),
        ("float32", "bfloat16"),
        ("float16", "float32"),
        ("bfloat16", "float32"),
    }
)
CAST_ENV = "TFCKPT_CAST"  # "reference": never the SIMD rounding (tests, benchmarks)


@dataclass
class CastCounts:
    """What a cast did to the values of one tensor."""

    overflow: int = 0  # finite values beyond the target's range
    to_zero: int = 0  # non-zero values that became zero
    subnormal: int = 0  # values that became subnormal in the target
    elements: int = 0

    def add(self, other: CastCounts) -> None:
        """Accumulate another part's counts (elements included)."""
        self.overflow += other.overflow
        self.to_zero += other.to_zero
        self.subnormal += other.subnormal
        self.elements += other.elements


class CastCountTable(Mapping[str, CastCounts]):
    """Each cast tensor's :class:`CastCounts`, by its (output) name, kept as columns.

    A run of 200 000 small tensors casts each once, and nearly every cast changes no
    value: a dict of objects would cost that many objects; these columns keep a name
    and an element count per tensor (16 bytes) and the three counts only of the
    tensors where one is not zero. Filled by the pipeline with :meth:`add` (a tensor's
    pieces one after another: consecutive adds of one name accumulate) and
    :meth:`extend`; read as a mapping (its index made on first lookup) or, without an
    object per tensor, with :meth:`nonzero`.

    >>> t = CastCountTable(); t.add("a", (0, 1, 2, 4)); t.add("a", (0, 0, 1, 4))
    >>> t["a"]
    CastCounts(overflow=0, to_zero=1, subnormal=3, elements=8)
    """

    def __init__(self):
        self.names: list[str] = []
        self._elements = array("q")  # per row
        self._special = array("q")  # the rows with a count not zero, ascending
        self._counts = array("q")  # their overflow, to_zero and subnormal counts
        self._rows: dict[str, int] | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_rows": None}

    def add(self, name: str, counts: Sequence[int]) -> None:
        """Count ``counts`` for ``name``: on its row if it is the last one added, else
        on a new row."""
        overflow, to_zero, subnormal, elements = counts
        if self.names and self.names[-1] == name:
            self._elements[-1] += elements
        else:
            self.names.append(name)
            self._elements.append(elements)
            self._rows = None
        if overflow or to_zero or subnormal:
            row, c = len(self.names) - 1, self._counts
            if self._special and self._special[-1] == row:
                c[-3], c[-2], c[-1] = c[-3] + overflow, c[-2] + to_zero, c[-1] + subnormal
            else:
                self._special.append(row)
                c.extend((overflow, to_zero, subnormal))

    def extend(self, names: list[str], counts: np.ndarray) -> None:
        """New rows: ``names`` with their ``counts`` (an int array of ``len(names)`` x 4)."""
        counts = np.asarray(counts, dtype=np.int64).reshape(-1, 4)
        special = np.flatnonzero(counts[:, :3].any(axis=1))
        self._add_rows(names, counts[:, 3], special, counts[special, :3])

    def _add_rows(self, names: list[str], elements, special: np.ndarray, counts) -> None:
        """Rows ``names`` with their ``elements``; ``special``: those of them (numbered
        from 0) with a count not zero, and their ``counts`` (``len(special)`` x 3)."""
        start = len(self.names)
        self.names += names
        self._elements.frombytes(np.ascontiguousarray(elements, dtype=np.int64).tobytes())
        if len(special):
            self._special.frombytes((special + start).astype(np.int64).tobytes())
            self._counts.frombytes(np.ascontiguousarray(counts, dtype=np.int64).tobytes())
        self._rows = None

    def merged(self, others: list[CastCountTable]) -> CastCountTable:
        """These rows then those of ``others``; a name in several adds up (a tensor
        written in slices to several shards). Without others, this table itself."""
        if not others:
            return self
        out = CastCountTable()
        for t in [self, *others]:
            special = np.frombuffer(t._special, dtype=np.int64)
            out._add_rows(t.names, t._elements, special, t.special_counts())
        if len(set(out.names)) != len(out.names):
            arr, rows = out.array(), dict[str, list[int]]()
            for i, name in enumerate(out.names):
                rows.setdefault(name, []).append(i)
            summed = np.array([arr[r].sum(axis=0) for r in rows.values()], dtype=np.int64)
            out = CastCountTable()
            out.extend(list(rows), summed.reshape(-1, 4))
        return out

    def special_counts(self) -> np.ndarray:
        """The overflow, to_zero and subnormal counts of the rows with one not zero
        (``len(special) x 3``, in row order)."""
        return np.frombuffer(self._counts, dtype=np.int64).reshape(-1, 3)

    def array(self) -> np.ndarray:
        """The counts as an int64 array of ``len(self)`` x 4 (overflow, to_zero,
        subnormal, elements), made when asked for."""
        out = np.zeros((len(self.names), 4), dtype=np.int64)
        out[:, 3] = np.frombuffer(self._elements, dtype=np.int64)
        out[np.frombuffer(self._special, dtype=np.int64), :3] = self.special_counts()
        return out

    def nonzero(self, what: str) -> dict[str, int]:
        """The tensors ``what`` (overflow, to_zero, subnormal) happened to, and how often."""
        col = self.special_counts()[:, ("overflow", "to_zero", "subnormal").index(what)]
        rows = np.flatnonzero(col)
        special = np.frombuffer(self._special, dtype=np.int64)[rows]
        return dict(zip([self.names[i] for i in special.tolist()], col[rows].tolist()))

    def _index(self) -> dict[str, int]:
        if self._rows is None:
            self._rows = {name: i for i, name in enumerate(self.names)}
        return self._rows

    def __getitem__(self, name: str) -> CastCounts:
        i = self._index()[name]
        k = bisect.bisect_left(self._special, i)
        if k < len(self._special) and self._special[k] == i:
            c = self._counts
            return CastCounts(c[3 * k], c[3 * k + 1], c[3 * k + 2], self._elements[i])
        return CastCounts(0, 0, 0, self._elements[i])

    def __contains__(self, name) -> bool:
        return name in self._index()

    def __iter__(self):
        return iter(self._index())

    def __len__(self) -> int:
        return len(self._index())

    def __repr__(self) -> str:
        return f"<CastCountTable: {len(self.names)} tensors>"


@dataclass
class Caster:
    """Casts chunks of one source dtype to one target dtype, counting what happened.

    ``overflow``: ``'error'`` and ``'inf'`` both produce IEEE results (±inf, or
    NaN for float8 types without infinities) and count them; ``'clip'``
    saturates to the largest finite value of the target, keeping the sign.
    With ``buffers``, results are written into ``buffers(nbytes)`` (a uint8
    array, e.g. a ring of reused buffers for streaming consumers) instead of
    fresh memory. With ``bits``, results come as the target's bit patterns
    (unsigned integers of its size): then a cast to bfloat16 on the SIMD path
    needs no ml-dtypes unless a chunk holds NaN, inf or values near overflow.
    """

    source: _dt.DType
    target: _dt.DType
    overflow: OverflowPolicy = "error"
    counts: CastCounts = field(default_factory=CastCounts)
    convert: Callable[[np.ndarray, np.dtype], np.ndarray] | None = None
    buffers: Callable[[int], np.ndarray] | None = None
    bits: bool = False

    def __post_init__(self):
        if self.overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow policy must be one of {OVERFLOW_POLICIES}")
        if self.source.spec is None or self.target.spec is None:
            raise ValueError(f"cannot cast {self.source} to {self.target}: not numeric")
        size = self.target.fixed_itemsize
        self._via32 = self.source.name == "float64" and size < 4
        src, dst = _finfo(self.source), _finfo(self.target)
        # Widening casts are exact: nothing to count.
        self._exact = (
            float(dst.max) >= float(src.max)
            and float(dst.smallest_subnormal) <= float(src.smallest_subnormal)
            and dst.nmant >= src.nmant
        )
        # Magnitudes from max + ulp(max)/2 on round beyond the largest finite value.
        top = float(dst.max)
        self._overflow_at = top + math.ldexp(0.5, math.frexp(top)[1] - 1 - int(dst.nmant))
        self._bits = np.dtype(f"u{size}")
        self._abs_mask = self._bits.type((1 << (8 * size - 1)) - 1)
        self._tiny_bits = self._bits.type(_bit_pattern(dst.smallest_normal, self.target))
        self._max_bits = self._bits.type(_bit_pattern(dst.max, self.target))
        rounded = "float32" if self._via32 else self.source.name
        self._simd: Any = None
        if self.convert is None and (rounded, self.target.name) in SIMD_PAIRS:
            self._simd = _numkong()

    @cached_property
    def _target_np(self) -> np.dtype:
        # Only the general path needs the target's numpy type (for bfloat16 and the
        # float8 types, ml-dtypes, slow to import): the SIMD path works on its bits.
        return self.target.array_dtype

    @cached_property
    def _nan_bits(self) -> Any:
        """The target's quiet NaN (sign clear) as bits."""
        if self.target.name == "bfloat16":  # float32's quiet NaN, upper half
            return self._bits.type(0x7FC0)
        return self._bits.type(_bit_pattern(np.nan, self.target))

    @property
    def rounding(self) -> str:
        """What rounds the values: ``'numkong'`` (SIMD), ``'numpy'`` or ``'convert'``."""
        if self.convert is not None:
            return "convert"
        return "numkong" if self._simd is not None else "numpy"

    def __call__(self, chunk: np.ndarray) -> np.ndarray:
        n = chunk.size
        if self.buffers is not None:
            out = self.buffers(n * self.target.fixed_itemsize).view(self._bits)
        else:
            out = np.empty(n, dtype=self._bits)
        flat = chunk.reshape(-1)
        if self.convert is None and self._simd is None and n >= PARALLEL_MIN and _workers() > 1:
            # numpy's casts release the GIL: split big chunks over the cores. The SIMD
            # cast needs no help: it keeps up with reading on one core, and the other
            # is the pipeline's (reading, checksums, writing).
            step = -(-n // _workers())
            parts = list(
                _pool().map(
                    lambda a: self._part(flat[a : a + step], out[a : a + step], CastCounts()),
                    range(0, n, step),
                )
            )
            for p in parts:
                self.counts.add(p)
        else:
            self._part(flat, out, self.counts)  # many small tensors: no per-call extras
        return (out if self.bits else out.view(self._target_np)).reshape(chunk.shape)

    def _part(self, chunk: np.ndarray, out: np.ndarray, counts: CastCounts) -> CastCounts:
        """Cast ``chunk`` into ``out``, adding to ``counts`` (returned)."""
        counts.elements += chunk.size
        # The SIMD rounding is so fast that the checks after it would dominate, unless
        # they find the block it just wrote still in the core's cache.
        step = _SIMD_BLOCK if self._simd is not None else max(chunk.size, 1)
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            for a in range(0, chunk.size, step):
                self._block(chunk[a : a + step], out[a : a + step], counts)
        return counts

    def _block(self, chunk: np.ndarray, out: np.ndarray, counts: CastCounts) -> None:
        src = chunk.astype(np.float32) if self._via32 else chunk
        self._round(src, out)
        # Fast path: no NaN (min/max would be NaN), no inf, nothing near overflow.
        lo, hi = float(src.min()), float(src.max())
        if -self._overflow_at < lo and hi < self._overflow_at:
            if not self._exact:
                self._count_small(out, chunk, counts)
        else:
            self._special(chunk, out, counts)

    def _round(self, src: np.ndarray, out: np.ndarray) -> None:
        """Round ``src`` (float32 already when via float32) into the bits ``out``: IEEE
        results, NaNs not yet canonical."""
        if self.convert is not None:
            out.view(self._target_np)[...] = self.convert(src, self._target_np)
        elif self._simd is not None and src.dtype.isnative:
            # NaNs come out as anything (inf, even -0.0): _special makes them canonical.
            # NumKong takes aligned arrays only, but a tensor's bytes sit at any offset of
            # a file (so of a batched read), and casts to several widths share an output
            # buffer: misaligned blocks (small ones) go through aligned copies.
            if not src.flags.aligned:
                src = src.copy()
            if out.flags.aligned:
                self._simd.astype(src, self.target.name, out=self._simd_view(out))
            else:
                aligned = np.empty_like(out)
                self._simd.astype(src, self.target.name, out=self._simd_view(aligned))
                out[...] = aligned
        else:
            np.copyto(out.view(self._target_np), src, casting="unsafe")

    def _simd_view(self, out: np.ndarray) -> Any:
        """``out``'s memory as NumKong's array of the target type (it checks the type)."""
        return self._simd.from_pointer(out.ctypes.data, out.shape, self.target.name, owner=out)

    def _count_small(self, out: np.ndarray, chunk: np.ndarray, counts: CastCounts) -> None:
        """Count zeros and subnormals from the output's bits (integer compares only)."""
        mag = np.bitwise_and(out.view(self._bits), self._abs_mask)
        least = mag.min()  # one cheap pass rules out the counting passes below
        if least >= self._tiny_bits:
            return
        small = int(np.count_nonzero(mag < self._tiny_bits))
        zeros = int(np.count_nonzero(mag == 0)) if least == 0 else 0
        counts.subnormal += small - zeros
        if zeros:
            counts.to_zero += zeros - int(np.count_nonzero(chunk == 0))

    def _special(self, chunk: np.ndarray, out: np.ndarray, c: CastCounts) -> None:
        """The general path, for chunks with NaN, inf or values near the overflow point.

        It works on the result's bits, like :meth:`_count_small`: the target's numpy
        type (ml-dtypes for bfloat16) is never needed, and a finite result is one whose
        magnitude's bits are at most the largest finite value's (every target: an inf or
        a NaN is above it)."""
        bits = out.view(self._bits)
        sign = self._bits.type(1 << (8 * self._bits.itemsize - 1))
        nan = np.isnan(chunk)
        if nan.any():
            bits[nan] = np.where(np.signbit(chunk[nan]), self._nan_bits | sign, self._nan_bits)
        if self._exact:
            return
        mag = np.bitwise_and(bits, self._abs_mask)
        over = np.isfinite(chunk)
        over &= mag > self._max_bits
        n_over = int(np.count_nonzero(over))
        if n_over:
            c.overflow += n_over
            if self.overflow == "clip":
                bits[over] = np.where(
                    np.signbit(chunk[over]), self._max_bits | sign, self._max_bits
                )
        mask = mag == 0
        mask &= chunk != 0
        c.to_zero += int(np.count_nonzero(mask))
        np.less(mag, self._tiny_bits, out=mask)
        mask &= mag > 0
        c.subnormal += int(np.count_nonzero(mask))

    def count_segments(self, chunk: np.ndarray, out: np.ndarray, sizes: Any) -> np.ndarray:
        """What casting each run of ``chunk`` alone would count: rows of
        (overflow, to_zero, subnormal), one per run.

        ``out`` is this caster's result for ``chunk`` (values or bits; NaNs canonical,
        overflow clipped or not, as the policy says); ``sizes`` are the element
        counts of the consecutive runs (e.g. the small tensors of a batch). No run is
        cast again: only the few elements that can count (a result below the
        smallest normal, or at least the largest finite) are classified, from the
        result's bits and the caster's limits.

        >>> c = Caster(dtypes.lookup("float32"), dtypes.lookup("float16"))
        >>> c.count_segments(x, c(x), [256] * (x.size // 256))
        """
        sizes = np.asarray(sizes, dtype=np.int64)
        ends = np.cumsum(sizes)
        if (ends[-1] if ends.size else 0) != chunk.size or out.size != chunk.size:
            raise ValueError("the runs' sizes must add up to the chunk's and the result's")
        rows = np.zeros((sizes.size, 3), dtype=np.int64)
        if self._exact or not chunk.size:
            return rows
        flat = chunk.reshape(-1)
        mag = np.bitwise_and(out.reshape(-1).view(self._bits), self._abs_mask)
        # Below the smallest normal or at least the largest finite, in one unsigned
        # compare: the subtraction wraps the small ones to the top.
        mag -= self._tiny_bits
        at = np.flatnonzero(mag >= self._max_bits - self._tiny_bits)
        if not at.size:
            return rows
        mag = mag[at] + self._tiny_bits
        src = flat[at]
        to_zero = (mag == 0) & (src != 0)
        subnormal = (mag != 0) & (mag < self._tiny_bits)
        over = np.isfinite(src)
        if self.overflow != "clip":
            over &= mag > self._max_bits
        else:
            # A saturated value looks like one that rounded to the largest finite
            # value: those few are rounded again to tell them apart.
            over &= mag == self._max_bits
            again = np.flatnonzero(over)
            if again.size:
                bits = np.empty(again.size, dtype=self._bits)
                picked = src[again]
                with np.errstate(over="ignore", invalid="ignore", under="ignore"):
                    self._round(picked.astype(np.float32) if self._via32 else picked, bits)
                over[again] = np.bitwise_and(bits, self._abs_mask) > self._max_bits
        run = np.searchsorted(ends, at, side="right")
        for k, hit in enumerate((over, to_zero, subnormal)):
            rows[:, k] = np.bincount(run[hit], minlength=sizes.size)
        return rows


PARALLEL_MIN = 1 << 20  # elements; smaller chunks are cast on the calling thread
_SIMD_BLOCK = 1 << 17  # elements: input, output and the checks' temporaries fit in L2
_POOL: ThreadPoolExecutor | None = None


def _workers() -> int:
    return min(os.cpu_count() or 1, 8)


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=_workers(), thread_name_prefix="tfckpt-cast")
    return _POOL


_NUMKONG: Any = None  # the module once looked for; False when unusable


def _numkong() -> Any:
    """NumKong, or None when it is missing, turned off or without SIMD kernels here."""
    global _NUMKONG
    if os.environ.get(CAST_ENV, "").lower() == "reference":
        return None
    if _NUMKONG is None:
        try:
            import numkong

            caps = numkong.get_capabilities()
        except (ImportError, AttributeError, OSError):
            _NUMKONG = False
        else:
            # Its portable C kernels are exact too, but no faster than numpy's.
            _NUMKONG = numkong if any(on for k, on in caps.items() if k != "serial") else False
    return _NUMKONG or None


def _finfo(dtype: _dt.DType) -> Any:
    if dtype.name == "bfloat16":
        return _BFLOAT16_INFO
    try:
        return np.finfo(dtype.array_dtype)
    except ValueError:
        import ml_dtypes

        return ml_dtypes.finfo(dtype.array_dtype)


def _float32(bits: int) -> float:
    return float(np.array(bits, np.uint32).view(np.float32))


@dataclass(frozen=True)
class _Limits:
    max: float
    smallest_normal: float
    smallest_subnormal: float
    nmant: int


# bfloat16 is the upper half of float32: its limits are float32 patterns, known
# without importing ml-dtypes.
_BFLOAT16_INFO = _Limits(_float32(0x7F7F0000), _float32(0x00800000), _float32(0x00010000), 7)


def _bit_pattern(value: Any, dtype: _dt.DType) -> int:
    """The bits of ``value`` (exactly representable) as an element of ``dtype``."""
    if dtype.name == "bfloat16":
        return int(np.array(value, np.float32).view(np.uint32)) >> 16
    return int(np.array(value, dtype=dtype.array_dtype).view(f"u{dtype.fixed_itemsize}"))


def should_cast(
    dtype: _dt.DType, target: _dt.DType | None, cast_from: frozenset[str] | None
) -> bool:
    """Whether the default cast rule applies to a tensor of ``dtype``."""
    if target is None or dtype is target or not dtype.is_floating:
        return False
    return cast_from is None or dtype.name in cast_from


def check_overflow(
    overflowed: Mapping[str, int | CastCounts], policy: OverflowPolicy, path: str
) -> None:
    """The overflow policy's verdict on a finished run, before anything is committed: with
    ``'error'``, finite values beyond a target's range (``overflowed``: tensor -> how
    many, or its :class:`CastCounts`; zeros allowed) fail it with a
    :class:`~tfckpt.CastOverflowError` naming them.

    >>> check_overflow({"dense/kernel": 3}, "error", "fp16/model")
    Traceback (most recent call last):
    tfckpt.errors.CastOverflowError: fp16/model: values beyond the target dtype's range ...
    """
    if isinstance(overflowed, CastCountTable):
        hit = overflowed.nonzero("overflow")
    else:
        hit = {}
        for name, c in overflowed.items():
            n = c.overflow if isinstance(c, CastCounts) else c
            if n:
                hit[name] = n
    if policy == "error" and hit:
        raise CastOverflowError(hit, path)
