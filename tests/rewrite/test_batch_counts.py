"""Cast counts of small tensors cast together: each tensor's, as if cast alone.

Small tensors travel in batches and are cast in one call per run of one cast;
what each of them overflowed, lost to zero or made subnormal is then told apart
from the batch's result (``Caster.count_segments``) instead of casting any
tensor again. Checked against a ``Caster`` per tensor and against ``tf.cast``
on checkpoints TensorFlow writes here, and on random run layouts.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfckpt.cli import main
from tfckpt.format import dtypes as _dt
from tfckpt.rewrite.cast import CAST_ENV, Caster

ROOT = Path(__file__).resolve().parents[2]
F16_TINY = 2.0**-14
# float32 values with an edge for float16 or bfloat16: overflow (at and just below the
# rounding threshold), the largest finite value, ties to zero and to the smallest
# normal, subnormals, NaN of both signs, ±inf, -0.0.
EDGES_F32 = [
    70000.0,
    -1e5,
    65520.0,  # the tie above float16's max: rounds to inf
    65519.996,  # just below it: rounds to the max
    65504.0,
    -65504.0,
    3.4e38,  # beyond bfloat16's range
    3.3895314e38,  # bfloat16's max
    3.4028235e38,
    1e-6,
    -1e-6,
    6.1e-5,  # below float16's smallest normal
    F16_TINY,
    F16_TINY - 2.0**-25,  # the tie below it: rounds up to the smallest normal
    2.0**-24,
    2.0**-25,  # the tie to zero: rounds to (even) zero
    3 * 2.0**-26,
    1e-9,
    -1e-9,
    2.0**-126,
    1e-39,  # float32 subnormals: subnormal or zero in bfloat16
    2.0**-140,
    -1e-45,
    0.0,
    -0.0,
    np.nan,
    -np.nan,
    np.inf,
    -np.inf,
]
# float64 sources round to float32 first: overflow by that rounding, zero by it. No values
# in float32's subnormal range: TensorFlow's CPU cast to bfloat16 flushes them.
EDGES_F64 = [
    65519.99999999,  # rounds to 65520.0 in float32, then to inf in float16
    1e300,
    -1e300,
    1e-50,
    -1e-300,
    1e-6,
    2.0**-25,
    3.4e38,
    65504.0,
    np.nan,
    -np.inf,
    -0.0,
]


def _values(rng, n: int, edges: list, dtype) -> list[np.ndarray]:
    """``n`` small tensors of clean values, every third with a few edges among them."""
    out = []
    for i in range(n):
        v = rng.uniform(0.01, 100.0, 16 + i % 23) * rng.choice([-1.0, 1.0], 16 + i % 23)
        if i % 3 == 0:
            picked = rng.choice(len(edges), rng.integers(1, 6), replace=False)
            at = rng.choice(v.size, picked.size, replace=False)
            v[at] = np.array(edges)[picked]
        out.append(v.astype(dtype))
    return out


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A TF2 checkpoint of 160 small float32 and 30 float64 variables, some with edges."""
    tf = pytest.importorskip("tensorflow")
    import transform_helpers as th

    rng = np.random.default_rng(11)
    f32 = _values(rng, 160, EDGES_F32, np.float32)
    f64 = _values(rng, 30, EDGES_F64, np.float64)
    ckpt = tf.train.Checkpoint(a=[tf.Variable(v) for v in f32], b=[tf.Variable(v) for v in f64])
    prefix = ckpt.write(str(tmp_path_factory.mktemp("batch_counts") / "src" / "ckpt"))
    values = th.tf_reader_values(prefix)
    assert len(values) == len(f32) + len(f64)
    return prefix, values


def _tf_cast_counts(tf, value: np.ndarray, target: str) -> tuple[np.ndarray, tuple[int, int, int]]:
    """``tf.cast``'s result, and its (overflow, to_zero, subnormal) by the values' definitions."""
    want = tf.cast(tf.constant(value), target).numpy()
    w = want.astype(np.float64)
    tiny = float(ml_dtypes.finfo(want.dtype).smallest_normal)
    with np.errstate(invalid="ignore"):
        counts = (
            int(np.sum(np.isfinite(value) & ~np.isfinite(w))),
            int(np.sum((w == 0) & (value != 0))),
            int(np.sum((np.abs(w) < tiny) & (w != 0))),
        )
    return want, counts


def _alone(value: np.ndarray, target: str, overflow: str) -> tuple[int, int, int]:
    """What a cast of this tensor alone counts."""
    c = Caster(_dt.lookup(value.dtype.name), _dt.lookup(target), overflow)
    c(value)
    return c.counts.overflow, c.counts.to_zero, c.counts.subnormal


@pytest.mark.parametrize("overflow", ["inf", "clip", "error"])
@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_batched_tensors_count_as_if_cast_alone(written, target, overflow, tmp_path, capsys):
    """Converted through the command line: each tensor's counts equal a cast of it alone
    and ``tf.cast``'s, the bits equal ``tf.cast`` (saturated under 'clip'), the printed
    totals add them up, and 'error' names exactly the tensors that overflow."""
    tf = pytest.importorskip("tensorflow")
    import transform_helpers as th

    prefix, values = written
    expect = {}
    for name, value in values.items():
        want, expect[name] = _tf_cast_counts(tf, value, target)
        assert _alone(value, target, overflow) == expect[name], name
    assert sum(1 for c in expect.values() if any(c)) > 20  # a few per batch run
    assert sum(1 for c in expect.values() if not any(c)) > 100

    # The same, told apart from one cast of all float32 tensors together (in index order).
    names = sorted(n for n in values if values[n].dtype == np.float32)
    joined = np.concatenate([values[n] for n in names])
    for bits in (False, True):
        c = Caster(_dt.lookup("float32"), _dt.lookup(target), overflow, bits=bits)
        rows = c.count_segments(joined, c(joined), [values[n].size for n in names])
        assert {n: tuple(r) for n, r in zip(names, rows.tolist())} == {n: expect[n] for n in names}

    out = tmp_path / "out" / "ckpt"
    argv = ["convert", prefix, str(out), "--dtype", target, "--overflow", overflow, "--json"]
    overflowed = {n: c[0] for n, c in expect.items() if c[0]}
    if overflow == "error":
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "nothing written" in err
        for name, n in overflowed.items():
            assert f"{name} ({n} values)" in err
        assert err.count(" values)") == len(overflowed)
        assert not out.parent.exists() or not any(out.parent.iterdir())
        return
    assert main(argv) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    for k, key in enumerate(("overflow", "to_zero", "subnormal")):
        assert report[key] == {n: c[k] for n, c in expect.items() if c[k]}, key
    for label, k in (("clipped or overflowed", 0), ("became zero", 1), ("became subnormal", 2)):
        hit = [c[k] for c in expect.values() if c[k]]
        assert hit
        assert f"  {sum(hit)} values {label} in {len(hit)} tensors\n" in captured.err

    got = th.tf_reader_values(out)
    top = float(ml_dtypes.finfo(th.NP_FLOAT[target]).max)
    for name, value in values.items():
        want = tf.cast(tf.constant(value), target).numpy()
        if overflow == "clip":
            over = np.isfinite(value) & np.isinf(want.astype(np.float64))
            want[over] = np.where(np.signbit(value[over]), -top, top)
        bad = th.float_mismatches(got[name], want, value)
        assert not bad, (name, bad[:3])


CONVERT_CHILD = """
import sys
from tfckpt.cli import main
rc = main(sys.argv[1:])
print("ml_dtypes imported:", "ml_dtypes" in sys.modules, file=sys.stderr)
sys.exit(rc)
"""


def _convert_child(argv: list[str]) -> str:
    """Convert in a fresh interpreter; its stderr, which says whether ml-dtypes was imported."""
    env = {**{k: v for k, v in os.environ.items() if k != CAST_ENV}, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", CONVERT_CHILD, *argv], capture_output=True, text=True, env=env
    )
    assert run.returncode == 0, run.stderr
    return run.stderr


def test_float16_counts_need_no_ml_dtypes(written, tmp_path):
    """Counting a float16 batch's subnormals, zeros and overflows takes the limits the
    caster knows: ml-dtypes (slow to import) is not needed for a float16 conversion."""
    prefix, _ = written
    out = str(tmp_path / "out" / "ckpt")
    err = _convert_child(["convert", prefix, out, "--dtype", "float16", "--overflow", "clip"])
    assert "values became subnormal in" in err and "values became zero in" in err
    assert "ml_dtypes imported: False" in err


def test_bfloat16_counts_from_bits_need_no_ml_dtypes(tmp_path):
    """Nor for a bfloat16 batch whose values only become subnormal or zero: the SIMD path
    counts them from the bits it writes."""
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(5)
    values = [rng.standard_normal(20).astype(np.float32) for _ in range(30)]
    values[3][:2] = [1e-39, -(2.0**-140)]  # subnormal, zero
    values[17][5] = 2.0**-127
    prefix = tf.train.Checkpoint(w=[tf.Variable(v) for v in values]).write(
        str(tmp_path / "src" / "ckpt")
    )
    out = str(tmp_path / "out" / "ckpt")
    err = _convert_child(["convert", prefix, out, "--dtype", "bfloat16"])
    assert "  2 values became subnormal in 2 tensors" in err
    assert "  1 values became zero in 1 tensors" in err
    assert "ml_dtypes imported: False" in err


# ---------------------------------------------------------------- the method, on random runs

PAIRS = [
    ("float32", "float16"),
    ("float32", "bfloat16"),
    ("float64", "float32"),
    ("float64", "float16"),
    ("float64", "bfloat16"),
    ("bfloat16", "float16"),
    ("float16", "bfloat16"),
    ("float32", "float8_e4m3fn"),
    ("float32", "float8_e5m2"),
    ("float16", "float32"),  # widening: nothing to count
]


def _pool(source: str, target: str) -> np.ndarray:
    """Source values at the target's edges: around its largest finite value and the
    rounding threshold above it, its smallest normal and subnormal and the ties next to
    them, zeros, NaN and infinities."""
    t = ml_dtypes.finfo(_dt.lookup(target).array_dtype)
    big, tiny, sub = float(t.max), float(t.smallest_normal), float(t.smallest_subnormal)
    ulp = math.ldexp(1.0, math.frexp(big)[1] - 1 - int(t.nmant))
    edges = [big, big + ulp / 2, big + ulp / 2 * 0.999, big + ulp, 2 * big, tiny]
    edges += [tiny * (1 - 2.0**-12), tiny / 2, sub, sub / 2, sub * 0.51, sub * 1.5, sub / 3]
    edges += [1.0, 0.0, np.inf, np.nan, 1e-30, 1e30, 1e-300, 1e300]
    dtype = _dt.lookup(source).array_dtype
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        pool = np.array(edges + [-e for e in edges], dtype=np.float64).astype(dtype)
    bits = pool.view(f"u{dtype.itemsize}")  # and each one's neighbours
    return np.concatenate([pool, (bits + 1).view(dtype), (bits[bits != 0] - 1).view(dtype)])


@pytest.mark.parametrize("rounding", ["default", "reference"])
@pytest.mark.parametrize("source,target", PAIRS, ids=[f"{s}-{t}" for s, t in PAIRS])
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    layout=st.lists(st.tuples(st.integers(0, 40), st.booleans()), min_size=0, max_size=12),
    seed=st.integers(0, 2**32 - 1),
)
def test_count_segments_equals_a_cast_per_run(monkeypatch, rounding, source, target, layout, seed):
    """Random runs, some clean, some with edge values: per-run counts from one cast of them
    all equal a fresh cast of each run, for every policy, values or bits."""
    if rounding == "reference":
        monkeypatch.setenv(CAST_ENV, "reference")
    else:
        monkeypatch.delenv(CAST_ENV, raising=False)
    rng = np.random.default_rng(seed)
    pool = _pool(source, target)
    dtype = _dt.lookup(source).array_dtype
    runs = []
    for size, dirty in layout:
        v = rng.uniform(0.25, 4.0, size).astype(dtype)
        if dirty and size:
            at = rng.choice(size, rng.integers(1, size + 1), replace=False)
            v[at] = pool[rng.integers(0, pool.size, at.size)]
        runs.append(v)
    joined = np.concatenate(runs) if runs else np.zeros(0, dtype)
    sizes = [v.size for v in runs]
    src, dst = _dt.lookup(source), _dt.lookup(target)
    for overflow in ("error", "inf", "clip"):
        want = [_alone(v, target, overflow) for v in runs]
        for bits in (False, True):
            c = Caster(src, dst, overflow, bits=bits)
            rows = c.count_segments(joined, c(joined), sizes)
            assert [tuple(r) for r in rows.tolist()] == want, (overflow, bits)
            totals = (c.counts.overflow, c.counts.to_zero, c.counts.subnormal)
            assert tuple(rows.sum(axis=0).tolist()) == totals


def test_count_segments_wants_runs_that_add_up():
    c = Caster(_dt.lookup("float32"), _dt.lookup("float16"))
    x = np.ones(10, np.float32)
    with pytest.raises(ValueError, match="add up"):
        c.count_segments(x, c(x), [4, 4])
