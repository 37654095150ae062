"""A TF2 checkpoint written by real TensorFlow for the HTML report tests, with values
chosen to land in every range of float16: normal, subnormal, rounding to zero and
overflowing, in float32 and float64 variables.

Run as a script, ``write OUT``, in a process of its own (see tests/inspection/test_report.py):
``tf.train.Checkpoint`` saves the variables as ``OUT/ckpt/model-1``; ``write_large OUT``
saves instead a tensor larger than a report's sample, the same values planted in it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

# Magnitudes away from every rounding edge of float16 (2**-25, 2**-14, 65504..65520), so
# that the log2 bins they fall in say exactly what the cast does to them.
TO_ZERO = [1e-9, -3e-9, 2e-10, 1e-40]  # below 2**-25: round to 0 (1e-40: float32 subnormal)
SUBNORMAL = [1e-6, -4e-7, 3e-6, 2e-5, -5e-8]  # between 2**-25 and 2**-15
OVERFLOW = [7e4, -1e5]  # beyond 65520: inf


def values() -> dict[str, np.ndarray]:
    """The variables' values, by attribute name."""
    rng = np.random.default_rng(20261204)
    kernel = (rng.standard_normal((32, 64)) * 0.05).astype(np.float32)
    # Keep the random part clear of the edges too: no value under 2**-13 in magnitude.
    kernel = np.where(np.abs(kernel) < 2.0**-13, np.float32(2.0**-13), kernel)
    planted = TO_ZERO + SUBNORMAL + OVERFLOW
    kernel.flat[: len(planted)] = planted
    embedding = rng.uniform(1.0, 2.0, (64, 16)) * 2.0 ** rng.integers(-24, -8, (64, 16))
    embedding = (embedding * rng.choice([-1, 1], embedding.shape)).astype(np.float32)
    return {
        "kernel": kernel,
        "embedding": embedding,
        "bias": np.zeros(64, np.float32),
        "gamma": np.ones(64, np.float32),
        "scale": np.array([1e300, 2.0, 1e-300, 0.5, 0.0], np.float64),
        "step": np.array(7, np.int64),
    }


LARGE = (300, 300)  # more values than a report histograms of one tensor (65 536)


def large_values() -> dict[str, np.ndarray]:
    """A tensor the reports sample, with the planted values spread over it, and a small one."""
    rng = np.random.default_rng(20261207)
    kernel = (rng.standard_normal(LARGE) * 0.05).astype(np.float32)
    kernel = np.where(np.abs(kernel) < 2.0**-13, np.float32(2.0**-13), kernel)
    planted = TO_ZERO + SUBNORMAL + OVERFLOW
    kernel.flat[rng.choice(kernel.size, len(planted), replace=False)] = planted
    return {"kernel": kernel, "bias": np.full(300, 0.25, np.float32)}


def write(out: Path, tensors: dict[str, np.ndarray] | None = None) -> None:
    import tensorflow as tf

    variables = {k: tf.Variable(v) for k, v in (tensors or values()).items()}
    tf.train.Checkpoint(**variables).save(str(out / "ckpt" / "model"))


if __name__ == "__main__":
    role, where = sys.argv[1], Path(sys.argv[2])
    {"write": write, "write_large": lambda d: write(d, large_values())}[role](where)
