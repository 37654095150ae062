"""``tfckpt stats``: per-tensor statistics in one streaming pass, and what a cast to
float16 or bfloat16 would do to the values."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import numpy as np

from tfckpt.checkpoint.reader import DEFAULT_CHUNK_BYTES, Checkpoint
from tfckpt.format import dtypes as _dt
from tfckpt.format.bundle import TensorInfo
from tfckpt.format.natural import in_natural_order
from tfckpt.inspection.histograms import Log2Histogram
from tfckpt.inspection.reading import match_names, stored_chunks
from tfckpt.inspection.sampling import Sample, stored_count
from tfckpt.rewrite.cast import Caster

# --- stats -------------------------------------------------------------------

CAST_CHECK_TARGETS = ("float16", "bfloat16")


def stats(
    ckpt: Checkpoint,
    *,
    filter: str | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    targets: tuple[str, ...] = CAST_CHECK_TARGETS,
    histograms: bool = False,
    sample: int | None = None,
) -> dict:
    """Per-tensor statistics, streamed in bounded chunks.

    For each numeric tensor: ``min``, ``max`` (over non-NaN values), ``mean``,
    ``std`` (over finite values), ``nan``, ``inf``, ``zeros`` (fraction), and for
    floating-point tensors ``cast``: for each of ``targets`` (float16 and bfloat16),
    how many values would overflow, become zero or become subnormal if cast. A
    pre-sliced tensor's statistics are over its stored elements, counted in
    ``stored_elements``. With ``histograms``, each real tensor also gets
    ``log2_histogram``, its magnitudes per binary exponent
    (:class:`~tfckpt.inspection.histograms.Log2Histogram`), counted in the same pass:
    of every value, or with ``sample`` of at most that many
    (:class:`~tfckpt.inspection.sampling.Sample`; the histogram then says ``"sample"``,
    how many). Everything else is counted over every value.
    """
    out = []
    for name in in_natural_order(match_names(ckpt.keys(), filter)):
        info = ckpt.info(name)
        hist = None
        if histograms:
            hist = SampledHistogram(Sample(stored_count(info), sample) if sample else None)
        out.append(describe(info, partial(stored_chunks, ckpt, name, chunk_bytes), targets, hist))
    return {"prefix": ckpt.prefix, "tensors": out}


class SampledHistogram:
    """A :class:`Log2Histogram` of the values a :class:`Sample` picks from a tensor's
    chunks, given in order (of all of them without one)."""

    def __init__(self, sample: Sample | None = None) -> None:
        self.hist = Log2Histogram()
        self.sample = sample
        self.pos = 0

    def add(self, chunk: np.ndarray) -> None:
        picked = chunk if self.sample is None else self.sample.pick(chunk, self.pos)
        self.pos += len(chunk)
        self.hist.add(picked)

    def result(self) -> dict:
        out = self.hist.result()
        if self.sample is not None and not self.sample.whole:
            out["sample"] = self.sample.values
        return out


def describe(
    info: TensorInfo,
    chunks: Callable[[], Iterable[np.ndarray]],
    targets: tuple[str, ...] = CAST_CHECK_TARGETS,
    histogram: Log2Histogram | SampledHistogram | None = None,
) -> dict:
    """One tensor's record of :func:`stats`, from its values in ``chunks()`` (1-D runs,
    in order; called only for a numeric tensor); ``histogram`` is given each chunk of a
    real tensor, its result stored as ``log2_histogram``."""
    dt = _dt.lookup(info.dtype)
    rec = {"name": info.name, "dtype": info.dtype, "shape": list(info.shape), "elements": info.size}
    if info.partial:
        rec["stored_elements"] = info.stored_elements
    if dt.numpy is None or dt.kind == "string":
        return rec
    acc = _Moments()
    casters = {
        t: Caster(dt, _dt.lookup(t), "inf") for t in targets if dt.is_floating and dt.name != t
    }
    hist = histogram if dt.kind != "complex" else None
    for chunk in chunks():
        if chunk.dtype.fields:
            chunk = chunk.view(chunk.dtype[0])
        with np.errstate(all="ignore"):
            acc.add(chunk)
        for c in casters.values():
            c(chunk)
        if hist is not None:
            hist.add(chunk)
    rec.update(acc.result())
    if hist is not None:
        rec["log2_histogram"] = hist.result()
    if casters:
        rec["cast"] = {
            t: {
                "overflow": c.counts.overflow,
                "to_zero": c.counts.to_zero,
                "subnormal": c.counts.subnormal,
            }
            for t, c in casters.items()
        }
    return rec


class _Moments:
    """Streaming min/max/mean/std (Chan et al.'s pairwise update) and counts."""

    def __init__(self):
        self.n = self.count = self.nan = self.inf = self.zeros = 0
        self.mean = self.m2 = 0.0
        self.min = self.max = None

    def add(self, chunk: np.ndarray) -> None:
        self.count += chunk.size
        if chunk.dtype.kind == "c":
            x = chunk.astype(np.complex128)
            self.nan += int(np.count_nonzero(np.isnan(x)))
            self.inf += int(np.count_nonzero(np.isinf(x)))
            self.zeros += int(np.count_nonzero(x == 0))
            return
        x = chunk.astype(np.float64)
        nan = np.isnan(x)
        self.nan += int(np.count_nonzero(nan))
        finite = np.isfinite(x)
        self.inf += int(np.count_nonzero(~finite & ~nan))
        self.zeros += int(np.count_nonzero(x == 0))
        valid = x[~nan]
        if valid.size:
            lo, hi = valid.min(), valid.max()
            if chunk.dtype.kind in "iub":
                lo, hi = chunk[~nan].min(), chunk[~nan].max()
            self.min = lo if self.min is None else min(self.min, lo)
            self.max = hi if self.max is None else max(self.max, hi)
        f = x[finite]
        if f.size:
            n_b, mean_b = f.size, float(f.mean())
            m2_b = float(((f - mean_b) ** 2).sum())
            if self.n == 0:
                self.n, self.mean, self.m2 = n_b, mean_b, m2_b
                return
            delta = mean_b - self.mean
            total = self.n + n_b
            self.mean += delta * (n_b / total)
            self.m2 += m2_b + delta * delta * (self.n / total) * n_b
            self.n = total

    def result(self) -> dict:
        def py(v):
            return None if v is None else (v.item() if hasattr(v, "item") else v)

        return {
            "min": py(self.min),
            "max": py(self.max),
            "mean": self.mean if self.n else None,
            "std": (self.m2 / self.n) ** 0.5 if self.n else None,
            "nan": self.nan,
            "inf": self.inf,
            "zeros": self.zeros / self.count if self.count else 0.0,
        }
