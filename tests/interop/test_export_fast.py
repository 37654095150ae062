"""Export and import on the engine's fast path: bfloat16 from bits (no ml_dtypes), and
many small tensors exported with the values ``convert`` writes.

The sources are written by TensorFlow; the outputs are read back by safetensors, numpy
and TensorFlow's ``tf.cast`` gives the expected bits.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from cli_helpers import user_env
from transform_helpers import float_mismatches

import tfckpt

tf = pytest.importorskip("tensorflow")
safetensors_numpy = pytest.importorskip("safetensors.numpy")


def _special_values() -> np.ndarray:
    """float32 values that take every branch of a bfloat16 cast: NaNs of both signs,
    infinities, values beyond bfloat16's range, ones rounding to it or to zero,
    subnormal results, and ordinary ones."""
    rng = np.random.default_rng(11)
    ordinary = (rng.standard_normal(4000) * 0.05).astype(np.float32)
    edge = np.array(
        [np.nan, -np.nan, np.inf, -np.inf, 3.4e38, -3.4e38, 3.3961e38, 1e-39, -1e-39, 1e-45,
         -0.0, 0.0, 1.0, -2.5],
        dtype=np.float32,
    )  # fmt: skip
    return np.concatenate([ordinary, edge]).reshape(-1, 2)


@pytest.mark.parametrize("overflow", ["inf", "clip"])
def test_bfloat16_export_never_imports_ml_dtypes(tmp_path, overflow):
    """The export of float32 values with NaN, inf and overflow to bfloat16 safetensors runs
    without importing ml_dtypes (a second of start-up), and writes tf.cast's bits (the
    largest finite value where ``clip`` saturates)."""
    value = _special_values()
    prefix = str(tmp_path / "src" / "model")
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=["w", "steps"],
        shape_and_slices=["", ""],
        tensors=[tf.constant(value), tf.constant(np.int64(3))],
    )
    out = tmp_path / "model.safetensors"
    code = (
        "import sys, tfckpt\n"
        "sm = tfckpt.export(sys.argv[1], sys.argv[2], cast='bfloat16', overflow=sys.argv[3])\n"
        "print(sm.cast_counts['w'].overflow)\n"
        "assert 'ml_dtypes' not in sys.modules, 'ml_dtypes imported'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, prefix, str(out), overflow],
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    want = tf.cast(tf.constant(value), tf.bfloat16).numpy()
    beyond = np.isfinite(value) & np.isinf(want.astype(np.float32))
    assert int(proc.stdout.split()[-1]) == np.count_nonzero(beyond) >= 2

    with open(out, "rb") as f:  # safetensors' numpy API has no bfloat16: its layout
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        start, end = header["w"]["data_offsets"]
        f.seek(8 + n + start)
        got = np.frombuffer(f.read(end - start), "<u2").view(ml_dtypes.bfloat16)
    assert header["w"]["dtype"] == "BF16" and header["w"]["shape"] == list(value.shape)
    if overflow == "clip":
        big = ml_dtypes.finfo(ml_dtypes.bfloat16).max
        want = np.where(beyond, np.where(value < 0, -big, big), want).astype(ml_dtypes.bfloat16)
    assert float_mismatches(got.reshape(value.shape), want, value) == []


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
def test_many_tensors_export_holds_what_convert_writes(tmp_path, fmt):
    """3 000 small float32 tensors (TensorFlow writes them; some with values float16 makes
    subnormal or zero) exported to float16 hold the bits ``convert`` writes, and the
    export's counts per tensor are convert's."""
    rng = np.random.default_rng(5)
    names = [f"scope_{i // 100:03d}/var_{i % 100:02d}" for i in range(3000)]
    values = [(rng.standard_normal(16 + i % 5) * 0.01).astype(np.float32) for i in range(3000)]
    for v in values[::50]:
        v[:2] = [1e-6, 1e-9]  # subnormal, zero
    prefix = str(tmp_path / "src" / "model")
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[tf.constant(v) for v in values],
    )
    out = tmp_path / f"model.{fmt}"
    exported = tfckpt.export(prefix, out, cast="float16")
    converted = tfckpt.convert(prefix, tmp_path / "fp16" / "model", "float16")

    got = safetensors_numpy.load_file(str(out)) if fmt == "safetensors" else dict(np.load(out))
    assert sorted(got) == sorted(names)
    with tfckpt.open(tmp_path / "fp16" / "model") as ckpt:
        want = dict(zip(names, ckpt.read_together(names)))
    for name, v in zip(names, values):
        assert got[name].dtype == np.float16 and want[name].dtype == np.float16
        assert got[name].tobytes() == want[name].tobytes(), name
        assert float_mismatches(got[name], tf.cast(v, tf.float16).numpy(), v) == [], name
    assert exported.cast_counts == converted.cast_counts
    assert sum(c.subnormal for c in exported.cast_counts.values()) >= 60
