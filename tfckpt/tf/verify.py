"""TensorFlow as the judge: its own reader and its own ``tf.cast`` against tfckpt's output."""

from __future__ import annotations

import numpy as np

from ..bundle import Checkpoint
from ._tf import tensorflow


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == object:
        return a.tolist() == b.tolist()
    return a.tobytes() == b.tobytes()


def _nan_aware_equal(ours: np.ndarray, theirs: np.ndarray) -> bool:
    """Bit-equal except that NaNs need only agree in place and sign (payloads differ by path)."""
    if ours.dtype != theirs.dtype or ours.shape != theirs.shape:
        return False
    a = ours.astype(np.float64)
    b = theirs.astype(np.float64)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if not np.array_equal(nan_a, nan_b):
        return False
    if not np.array_equal(np.signbit(a[nan_a]), np.signbit(b[nan_b])):
        return False
    width = np.dtype(f"u{ours.dtype.itemsize}")
    return np.array_equal(ours.view(width)[~nan_a], theirs.view(width)[~nan_b])


def verify_with_tf(path, *, reference=None) -> dict:
    """Read every tensor with TensorFlow's own reader and compare it bit-exactly with tfckpt's.

    With ``reference`` (the checkpoint a conversion started from), every tensor
    whose dtype differs from the reference's must also equal TensorFlow's own
    ``tf.cast`` of the reference value (NaNs: same places and signs).
    Returns ``{"prefix", "tensors", "cast_checked", "mismatches": [str]}``.
    """
    tf = tensorflow()
    mismatches: list[str] = []
    cast_checked = 0
    with Checkpoint(path) as ckpt:
        reader = tf.train.load_checkpoint(ckpt.prefix)
        tf_names = sorted(reader.get_variable_to_shape_map())
        if tf_names != ckpt.keys():
            only_tf = sorted(set(tf_names) - set(ckpt.keys()))
            only_us = sorted(set(ckpt.keys()) - set(tf_names))
            mismatches.append(f"{ckpt.prefix}: names differ: only TensorFlow lists "
                              f"{only_tf[:5]}, only tfckpt lists {only_us[:5]}")
        dtypes = reader.get_variable_to_dtype_map()
        for name in ckpt.keys():
            if name not in dtypes:
                continue
            info = ckpt.info(name)
            if dtypes[name].name != info.dtype:
                mismatches.append(f"{ckpt.prefix}: {name}: TensorFlow says {dtypes[name].name}, "
                                  f"tfckpt says {info.dtype}")
                continue
            if info.dtype in ("variant", "resource"):
                continue
            theirs = np.asarray(reader.get_tensor(name),
                                dtype=object if info.dtype == "string" else None)
            if not _same_bits(ckpt[name], theirs):
                mismatches.append(f"{ckpt.prefix}: {name}: values differ from TensorFlow's reader")
        if reference is not None:
            with Checkpoint(reference) as ref:
                for name in ckpt.keys():
                    if name not in ref:
                        continue
                    old, new = ref.info(name), ckpt.info(name)
                    if old.dtype == new.dtype or old.shape != new.shape:
                        continue
                    expected = tf.cast(tf.constant(ref[name]), new.dtype).numpy()
                    cast_checked += 1
                    if not _nan_aware_equal(ckpt[name], np.asarray(expected)):
                        mismatches.append(f"{ckpt.prefix}: {name}: differs from tf.cast of the "
                                          f"reference ({old.dtype} -> {new.dtype})")
        return {"prefix": ckpt.prefix, "tensors": len(ckpt), "cast_checked": cast_checked,
                "mismatches": mismatches}
