"""Log2Histogram, which the HTML reports draw: exact bins for every dtype a checkpoint holds
(read from the exponent bits of float16/32/64, widened for the others, subnormals through
frexp), the same whichever way the values are cut into chunks."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tfckpt.inspection.histograms import Log2Histogram


def reference(values: np.ndarray) -> dict:
    """The bins by numpy.frexp on float64, value by value."""
    x = np.abs(values.astype(np.float64))
    finite, nonzero = np.isfinite(x), x != 0
    zeros, nonfinite = int(np.count_nonzero(~nonzero & finite)), int(np.count_nonzero(~finite))
    y = x[finite & nonzero]
    if not y.size:
        return {"first": None, "counts": [], "zeros": zeros, "nonfinite": nonfinite}
    k = np.frexp(y)[1] - 1
    counts = np.bincount(k - k.min())
    return {
        "first": int(k.min()),
        "counts": counts.tolist(),
        "zeros": zeros,
        "nonfinite": nonfinite,
    }


@pytest.mark.parametrize(
    "dtype",
    [
        np.float16,
        np.float32,
        np.float64,
        ml_dtypes.bfloat16,
        ">f4",
        ">f8",
        np.int32,
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e5m2,
    ],
)
def test_bins_are_exact(dtype):
    rng = np.random.default_rng(7)
    edges = [
        0.0,
        -0.0,
        np.inf,
        -np.inf,
        np.nan,
        1e-40,
        1e-310,
        5e-324,
        2.0**-25,
        2.0**-14,
        65504.0,
        65520.0,
        1e300,
    ]
    wide = np.concatenate([rng.standard_normal(4000) * 10.0 ** rng.integers(-45, 40, 4000), edges])
    with np.errstate(all="ignore"):
        values = wide.astype(np.dtype(dtype))
    h = Log2Histogram()
    for part in np.array_split(values, 7):
        h.add(part)
    assert h.result() == reference(values)


def test_empty_and_doc_example():
    h = Log2Histogram()
    h.add(np.zeros(0, np.float32))
    assert h.result() == {"first": None, "counts": [], "zeros": 0, "nonfinite": 0}
    h.add(np.array([0.0, 0.3, 1.0, 1.5, 3.0, np.inf]))
    assert h.result() == {"first": -2, "counts": [1, 0, 2, 1], "zeros": 1, "nonfinite": 1}
