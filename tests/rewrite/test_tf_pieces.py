"""The tf backend's double-buffered pieces (the GPU path), run on the CPU: the same bits as
one piece and as the default backend, through the converter alone and through convert."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import transform_helpers as th  # noqa: E402

import tfckpt  # noqa: E402
from tfckpt.tf import cast as tf_cast  # noqa: E402


def edge_values(n: int) -> np.ndarray:
    """Random normals with infinities, NaNs, overflow, float32 subnormals and zeros mixed in."""
    rng = np.random.default_rng(29)
    x = rng.standard_normal(n).astype(np.float32)
    specials = np.array(
        [np.inf, -np.inf, np.nan, -np.nan, 7e4, -1e38, 1e-40, -3e-45, 0.0, -0.0, 6e-8, 65519.0],
        np.float32,
    )
    where = rng.choice(n, size=4000, replace=False)
    x[where] = specials[np.arange(where.size) % specials.size]
    return x


@pytest.mark.parametrize("target", [np.float16, tf.bfloat16.as_numpy_dtype])
def test_pieces_give_one_pieces_bits(target):
    x = edge_values(4 * tf_cast.MIN_PIECE + 3).reshape(-1, 1)  # not a multiple of the pieces
    one = tf_cast.converter("/CPU:0", pieces=1)(x, np.dtype(target))
    four = tf_cast.converter("/CPU:0", pieces=4)(x, np.dtype(target))
    assert four.shape == x.shape and four.dtype == np.dtype(target)
    assert four.tobytes() == one.tobytes()
    if target is np.float16:
        finite = ~np.isnan(x)
        with np.errstate(over="ignore"):
            assert four[finite].tobytes() == x[finite].astype(np.float16).tobytes()


def test_convert_with_pieces_writes_the_default_backends_bytes(tmp_path, monkeypatch):
    """convert --backend tf with the GPU's piecing forced on the CPU: the files are
    byte for byte those of the default (SIMD) backend."""
    values = {
        "big": edge_values(3 * tf_cast.MIN_PIECE + 11).reshape(-1, 1),
        "small": np.arange(10, dtype=np.float32),
    }
    src = th.save_v2(tmp_path / "src" / "model", values)
    monkeypatch.setattr(
        tf_cast, "converter", lambda device=None, pieces=None: tf_cast._Converter("/CPU:0", 4)
    )
    tfckpt.convert(
        src, tmp_path / "tf" / "model", "float16", overflow="inf", backend="tf", tf_threshold=0
    )
    tfckpt.convert(src, tmp_path / "simd" / "model", "float16", overflow="inf")
    for name in ("model.index", "model.data-00000-of-00001"):
        assert (
            Path(tmp_path / "tf" / name).read_bytes() == Path(tmp_path / "simd" / name).read_bytes()
        ), name
