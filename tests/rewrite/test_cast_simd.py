"""The SIMD rounding (NumKong) gives the reference cast's bits and counts, and falls back cleanly.

The reference is the numpy/ml-dtypes path (``TFCKPT_CAST=reference``), itself proven
against ``tf.cast`` in test_transform_tf.py; those tests now run on the SIMD path, and
one check against ``tf.cast`` on a dense pattern sample is here too. All 2^32 float32
patterns: benchmarks/exhaustive_cast.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tfckpt.format import dtypes as _dt
from tfckpt.rewrite.cast import CAST_ENV, OVERFLOW_POLICIES, PARALLEL_MIN, CastCounts, Caster

pytest.importorskip("numkong")

ROOT = Path(__file__).resolve().parents[2]
NP = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def _window(center: int, half: int = 1 << 14) -> np.ndarray:
    lo = max(center - half, 0)
    return np.arange(lo, min(center + half, 1 << 32), dtype=np.uint64)


def float32_patterns() -> np.ndarray:
    """A dense sample of float32 bit patterns, each region that matters in full."""
    parts = [np.arange(0, 1 << 32, 4093, dtype=np.uint64)]  # everywhere, every 4093rd
    for c in [
        0x477FF000,  # float16's overflow threshold (65520), 65504 just below
        0x477FE000,
        0x7F7F8000,  # bfloat16's overflow threshold, then float32's max, inf, NaNs
        0x7F800000,
        0x7FC00000,  # quiet NaNs: payload just above and below the quiet bit
        0x7FFFC000,  # NaNs with all payload bits set
        0x38800000,  # float16's smallest normal, smallest subnormal and half of it
        0x33800000,
        0x33000000,
        0x00800000,  # float32's (and bfloat16's) smallest normal
        0x00010000,  # bfloat16's smallest subnormal
        0x00008000,  # half of it: a tie to zero
        0,
        0x3F800000,  # 1.0
    ]:
        parts.append(_window(c))
    parts.append(np.arange(0x33000000, 0x38800000 + 1, 127, dtype=np.uint64))  # f16 subnormals
    parts.append(np.arange(0, 0x00800000, 61, dtype=np.uint64))  # f32/bf16 subnormals
    k = np.arange(1 << 19, dtype=np.uint64)
    parts += [(k << 13) | 0x1000, (k << 13) | 0x0FFF, (k << 13) | 0x1001]  # float16 ties
    k = np.arange(1 << 16, dtype=np.uint64)
    parts += [(k << 16) | 0x8000, (k << 16) | 0x7FFF]  # bfloat16 ties
    pos = np.concatenate(parts).astype(np.uint32) & np.uint32(0x7FFFFFFF)  # repeats are harmless
    return np.concatenate([pos, pos | np.uint32(0x80000000)])  # and every one negated


@pytest.fixture(scope="module")
def patterns() -> np.ndarray:
    return float32_patterns()


def both(monkeypatch, source: str, target: str, overflow: str) -> tuple[Caster, Caster]:
    """A Caster on the SIMD path and one on the reference path, same pair and policy."""
    src, tgt = _dt.lookup(source), _dt.lookup(target)
    monkeypatch.delenv(CAST_ENV, raising=False)
    simd = Caster(src, tgt, overflow)
    monkeypatch.setenv(CAST_ENV, "reference")
    ref = Caster(src, tgt, overflow)
    monkeypatch.delenv(CAST_ENV)
    assert (simd.rounding, ref.rounding) == ("numkong", "numpy")
    return simd, ref


def assert_same(simd: Caster, ref: Caster, values: np.ndarray, chunk: int) -> None:
    """Cast ``values`` chunk by chunk with both; every bit and every count must agree."""
    for i in range(0, values.size, chunk):
        part = values[i : i + chunk]
        a, b = simd(part), ref(part)
        if a.tobytes() != b.tobytes():
            ab, bb = a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}")
            at = np.flatnonzero(ab != bb)[:5]
            raise AssertionError(
                f"{simd.source}->{simd.target} ({simd.overflow}) differ at "
                + ", ".join(
                    f"{part.view(f'u{part.itemsize}')[j]:#x}: {ab[j]:#x} != {bb[j]:#x}" for j in at
                )
            )
    assert simd.counts == ref.counts


@pytest.mark.parametrize("overflow", OVERFLOW_POLICIES)
@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_float32_patterns_equal_reference(patterns, monkeypatch, target, overflow):
    """In chunks of the engine's size (the reference splits them over the cores), then small."""
    simd, ref = both(monkeypatch, "float32", target, overflow)
    values = patterns.view(np.float32)
    assert values.size > 2 * PARALLEL_MIN
    assert_same(simd, ref, values, 2 * PARALLEL_MIN)
    assert simd.counts.overflow and simd.counts.to_zero and simd.counts.subnormal
    small_simd, small_ref = both(monkeypatch, "float32", target, overflow)
    assert_same(small_simd, small_ref, values[::7], 4099)


@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_misaligned_input_and_output(patterns, monkeypatch, target):
    """A tensor's bytes sit at any offset of a file, so of a batched read, and casts to
    several widths share one output buffer: both sides may be misaligned."""
    values = np.ascontiguousarray(patterns.view(np.float32)[::97][:4099])
    simd, ref = both(monkeypatch, "float32", target, "clip")
    raw = np.zeros(values.nbytes + 3, np.uint8)
    raw[1 : 1 + values.nbytes] = values.view(np.uint8)
    src = raw[1 : 1 + values.nbytes].view(np.float32)
    assert not src.flags.aligned
    space = np.zeros(values.size * 2 + 1, np.uint8)
    simd.buffers = lambda nbytes: space[1 : 1 + nbytes]
    got = simd(src)
    assert not got.flags.aligned
    assert got.tobytes() == ref(values).tobytes()
    assert simd.counts == ref.counts


def test_nan_is_canonical_with_its_sign(monkeypatch):
    """NaNs whose payload sits below the kept bits must not come out as inf, nor those whose
    rounding carries into the sign bit as ±0 (NumKong's bfloat16 gives both)."""
    nan_bits = np.array(
        [0x7F800001, 0x7F800100, 0x7F80FFFF, 0x7FBFFFFF, 0x7FC00000, 0x7FFFFFFF], np.uint32
    )
    values = np.concatenate([nan_bits, nan_bits | np.uint32(0x80000000)]).view(np.float32)
    for target in ("float16", "bfloat16"):
        simd, _ = both(monkeypatch, "float32", target, "error")
        got = simd(values).view(np.uint16)
        quiet = np.array(np.nan, NP[target]).view(np.uint16)[()]
        assert (got[:6] == quiet).all() and (got[6:] == quiet | 0x8000).all(), target
        assert simd.counts == CastCounts(elements=12)


@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_float64_rounds_through_float32_like_reference(monkeypatch, target):
    rng = np.random.default_rng(7)
    random = rng.integers(0, 1 << 64, 1 << 18, dtype=np.uint64).view(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        # Just above and below a tie of the target: where one direct rounding would differ.
        f32 = float32_patterns()[::97].view(np.float32).astype(np.float64)
        near = np.concatenate([np.nextafter(f32, np.inf), np.nextafter(f32, -np.inf), f32])
        values = np.concatenate([random, near, random * 1e-300, near * 1e6])
    for overflow in OVERFLOW_POLICIES:
        simd, ref = both(monkeypatch, "float64", target, overflow)
        assert_same(simd, ref, values, 1 << 21)


@pytest.mark.parametrize("source", ["float16", "bfloat16"])
def test_widening_every_pattern(monkeypatch, source):
    values = np.arange(1 << 16, dtype=np.uint16).view(NP[source])
    simd, ref = both(monkeypatch, source, "float32", "error")
    assert_same(simd, ref, values, 1 << 16)


def test_pairs_without_simd_keep_the_reference(monkeypatch):
    monkeypatch.delenv(CAST_ENV, raising=False)
    for s, t in [("float16", "bfloat16"), ("float64", "float32"), ("float32", "float8_e5m2")]:
        assert Caster(_dt.lookup(s), _dt.lookup(t)).rounding == "numpy", (s, t)


CHILD = """
import hashlib, sys
import numpy as np
{setup}
from tfckpt.format import dtypes as d
from tfckpt.rewrite.cast import Caster
values = np.frombuffer(sys.stdin.buffer.read(), np.float32)
h = hashlib.sha256()
for target in ("float16", "bfloat16"):
    for overflow in ("error", "clip"):
        c = Caster(d.lookup("float32"), d.lookup(target), overflow)
        h.update(c(values).tobytes()); h.update(repr(c.counts).encode())
print(c.rounding, h.hexdigest())
"""


def _child(values: np.ndarray, setup: str = "", extra: dict | None = None) -> list[str]:
    env = {**{k: v for k, v in os.environ.items() if k != CAST_ENV}, "PYTHONPATH": str(ROOT)}
    env.update(extra or {})
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(setup=setup)],
        input=values.tobytes(),
        capture_output=True,
        env=env,
        check=True,
    )
    return out.stdout.decode().split()


@pytest.fixture(scope="module")
def simd_child(patterns):
    return _child(patterns[::9].view(np.float32))


@pytest.mark.parametrize(
    "setup,extra",
    [
        ("sys.modules['numkong'] = None  # not installed", {}),
        (  # a CPU without the SIMD kernels: NumKong would run its portable C code
            "import numkong\n"
            "for k, on in numkong.get_capabilities().items():\n"
            "    if on and k != 'serial': numkong.disable_capability(k)",
            {},
        ),
        ("", {CAST_ENV: "reference"}),
    ],
    ids=["numkong-missing", "no-simd-cpu", "forced-reference"],
)
def test_fallback_gives_the_same_bits(patterns, simd_child, setup, extra):
    simd = simd_child
    fallback = _child(patterns[::9].view(np.float32), setup, extra)
    assert simd[0] == "numkong" and fallback[0] == "numpy"
    assert fallback[1] == simd[1]


def test_simd_path_equals_tf_cast(tmp_path, monkeypatch):
    """Through the whole conversion: a TF-written tensor of the sampled patterns, converted
    on the SIMD path, read back by TensorFlow, equals tf.cast (NaN payloads aside)."""
    tf = pytest.importorskip("tensorflow")
    import transform_helpers as th

    import tfckpt

    monkeypatch.delenv(CAST_ENV, raising=False)
    values = float32_patterns()[::3].view(np.float32)
    prefix = th.save_v2(tmp_path / "src" / "p", {"x": values})
    for target in ("float16", "bfloat16"):
        assert Caster(_dt.lookup("float32"), _dt.lookup(target)).rounding == "numkong"
        summary = tfckpt.convert(prefix, tmp_path / target / "p", target, overflow="inf")
        got = th.tf_reader_values(summary.dst)["x"]
        bad = th.float_mismatches(got, tf.cast(tf.constant(values), target).numpy(), values)
        assert not bad, "\n".join(bad[:5])


CONVERT_CHILD = """
import sys
from tfckpt.cli import main
rc = main(sys.argv[1:])
print("ml_dtypes imported:", "ml_dtypes" in sys.modules, file=sys.stderr)
sys.exit(rc)
"""


def test_bfloat16_conversion_does_not_import_ml_dtypes(tmp_path):
    """ml-dtypes takes longer to import than a conversion of hundreds of MiB takes: the
    SIMD path casts to bfloat16 as bits and writes them, and only NaN, inf or values near
    overflow (the general path) need it. The bytes are the reference path's."""
    pytest.importorskip("tensorflow")
    import transform_helpers as th

    rng = np.random.default_rng(7)
    big = rng.standard_normal(1 << 20).astype(np.float32)  # streamed in chunks
    big[::1000] *= np.float32(1e-38)  # some become subnormal or zero: counted, from the bits
    tensors = {"big": big, "small": rng.standard_normal((30, 7)).astype(np.float32)}
    tensors["zeros"] = np.zeros(5, np.float32)  # small ones are batched
    src = th.save_v2(tmp_path / "src" / "p", tensors)
    env = {**{k: v for k, v in os.environ.items() if k != CAST_ENV}, "PYTHONPATH": str(ROOT)}
    outputs = {}
    for mode, extra in [("simd", {}), ("reference", {CAST_ENV: "reference"})]:
        dst = tmp_path / mode / "p"
        argv = ["convert", src, str(dst), "--dtype", "bfloat16", "--chunk-bytes", "1M"]
        run = subprocess.run(
            [sys.executable, "-c", CONVERT_CHILD, *argv],
            capture_output=True,
            text=True,
            env={**env, **extra},
        )
        assert run.returncode == 0, run.stderr
        outputs[mode] = (run.stderr, [p.read_bytes() for p in sorted(dst.parent.iterdir())])
    assert "ml_dtypes imported: False" in outputs["simd"][0]
    assert "ml_dtypes imported: True" in outputs["reference"][0]
    assert outputs["simd"][1] == outputs["reference"][1]
    import tfckpt

    with tfckpt.open(tmp_path / "simd" / "p") as ckpt:  # read back: ml-dtypes' type, as ever
        got = ckpt["big"]
    assert got.dtype == NP["bfloat16"]
    assert np.array_equal(got, big.astype(NP["bfloat16"]))
