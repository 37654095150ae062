"""TensorFlow as the judge: its own reader and its own ``tf.cast`` against tfckpt's output."""

from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..bundle import Checkpoint
from ._tf import tensorflow


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.fields and len(a.dtype.fields) == 1:
        # Quantized types: TensorFlow's reader hands back the plain integers.
        a = a.view(a.dtype[0])
    if b.dtype.fields and len(b.dtype.fields) == 1:
        b = b.view(b.dtype[0])
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == object:
        return a.tolist() == b.tolist()
    return a.tobytes() == b.tobytes()


def _cast_equal(ours: np.ndarray, theirs: np.ndarray, reference: np.ndarray) -> bool:
    """tfckpt's cast against ``tf.cast``'s, bit for bit, with two documented exceptions.

    NaNs need only agree in place: TensorFlow's own casts carry NaN sign and
    payload bits differently on different code paths. Values below float32's
    normal range may differ: TensorFlow's CPU kernels flush them to zero, tfckpt
    rounds them as IEEE 754 says.
    """
    if ours.dtype != theirs.dtype or ours.shape != theirs.shape:
        return False
    nan_ours = np.isnan(ours.astype(np.float64))
    if not np.array_equal(nan_ours, np.isnan(theirs.astype(np.float64))):
        return False
    with np.errstate(invalid="ignore"):
        wide = np.abs(reference.astype(np.float64))
        flushed = (wide < np.finfo(np.float32).tiny) & (wide != 0)
    width = np.dtype(f"u{ours.dtype.itemsize}")
    keep = ~(nan_ours | flushed)
    return np.array_equal(ours.view(width)[keep], theirs.view(width)[keep])


def _tf_slice(tf, prefix: str, name: str, info, extents) -> np.ndarray:
    """TensorFlow's RestoreV2 of one stored slice, asked for as its partitioned variable asks."""
    full = " ".join(str(d) for d in info.shape)
    spec = ":".join("-" if n is None else f"{s},{n}" for s, n in extents)
    return tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[name],
                                shape_and_slices=[f"{full} {spec}"],
                                dtypes=[tf.as_dtype(info.dtype)])[0].numpy()


def _tf_value(tf, reader, prefix: str, name: str, info, ckpt: Checkpoint) -> np.ndarray:
    """TensorFlow's reading of a tensor; partitioned ones slice by slice with RestoreV2,
    since TensorFlow's reader cannot assemble every dtype (float16, strings, ...)."""
    if not info.slices:
        return np.asarray(reader.get_tensor(name),
                          dtype=object if info.dtype == "string" else None)
    dtype = _dt.lookup(info.dtype).numpy
    out = np.empty(info.shape, dtype=object if dtype is None else dtype)
    for extents in info.slices:
        value = _tf_slice(tf, prefix, name, info, extents)
        index = tuple(slice(None) if n is None else slice(s, s + n) for s, n in extents)
        out[index] = value
    return out


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
            if info.partial:  # pre-sliced: only its slices exist, for TensorFlow too
                try:
                    same = all(_same_bits(ckpt.read_slice(name, e),
                                          _tf_slice(tf, ckpt.prefix, name, info, e))
                               for e in info.slices)
                except Exception as e:
                    mismatches.append(f"{ckpt.prefix}: {name}: TensorFlow cannot read a stored "
                                      f"slice: {str(e).splitlines()[0][:200]}")
                    continue
                if not same:
                    mismatches.append(f"{ckpt.prefix}: {name}: values differ from TensorFlow's "
                                      "reader")
                continue
            try:
                theirs = _tf_value(tf, reader, ckpt.prefix, name, info, ckpt)
            except Exception as e:  # TensorFlow's own reader refused it
                mismatches.append(f"{ckpt.prefix}: {name}: TensorFlow cannot read it: "
                                  f"{str(e).splitlines()[0][:200]}")
                continue
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
                    if new.partial:
                        for extents in new.slices:
                            source = ref.read_slice(name, extents)
                            expected = tf.cast(tf.constant(source), new.dtype).numpy()
                            if not _cast_equal(ckpt.read_slice(name, extents),
                                               np.asarray(expected), source):
                                mismatches.append(f"{ckpt.prefix}: {name}: differs from tf.cast "
                                                  f"of the reference ({old.dtype} -> "
                                                  f"{new.dtype})")
                        cast_checked += 1
                        continue
                    source = ref[name]
                    expected = tf.cast(tf.constant(source), new.dtype).numpy()
                    cast_checked += 1
                    if not _cast_equal(ckpt[name], np.asarray(expected), source):
                        mismatches.append(f"{ckpt.prefix}: {name}: differs from tf.cast of the "
                                          f"reference ({old.dtype} -> {new.dtype})")
        return {"prefix": ckpt.prefix, "tensors": len(ckpt), "cast_checked": cast_checked,
                "mismatches": mismatches}
