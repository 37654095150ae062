"""TensorFlow as the judge: its own reader and its own ``tf.cast`` against tfckpt's output."""

from __future__ import annotations

import numpy as np

from tfckpt.checkpoint.opening import open_checkpoint
from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.format import dtypes as _dt
from tfckpt.io.storage import StorageOptions
from tfckpt.rewrite.cast import Caster
from tfckpt.tf._tf import tensorflow


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


_F32_TINY = float(np.finfo(np.float32).tiny)


def _cast_compare(
    ours: np.ndarray, theirs: np.ndarray, reference: np.ndarray, source: str, target: str
) -> tuple[bool, int, int]:
    """tfckpt's cast against ``tf.cast``'s: (equal apart from the documented
    differences, subnormal results TensorFlow flushes to zero, NaNs of other bits).

    Where the bits differ, tfckpt's value must be its own documented result (IEEE
    754 rounding; the target's quiet NaN with the source's sign) and TensorFlow's
    either a NaN too — its casts carry NaN sign and payload differently on
    different code paths — or a zero where the exact result is a value below
    float32's normal range, which TensorFlow's CPU kernels flush to zero.
    """
    if ours.dtype != theirs.dtype or ours.shape != theirs.shape:
        return False, 0, 0
    width = np.dtype(f"u{ours.dtype.itemsize}")
    differ = ours.reshape(-1).view(width) != theirs.reshape(-1).view(width)
    if not differ.any():
        return True, 0, 0
    if not (_dt.lookup(source).is_floating and _dt.lookup(target).is_floating):
        return False, 0, 0
    mine, tfs = ours.reshape(-1)[differ], theirs.reshape(-1)[differ]
    ref = reference.reshape(-1)[differ]
    documented = Caster(_dt.lookup(source), _dt.lookup(target), "inf")(ref)
    if documented.view(width).tobytes() != mine.view(width).tobytes():
        return False, 0, 0
    wide_tf = tfs.astype(np.float64)
    nan = np.isnan(wide_tf) & np.isnan(mine.astype(np.float64))
    with np.errstate(invalid="ignore"):
        magnitude = np.abs(ref.astype(np.float64))
    flushed = (wide_tf == 0) & (magnitude < _F32_TINY) & (magnitude > 0)
    return bool((nan | flushed).all()), int(np.count_nonzero(flushed)), int(np.count_nonzero(nan))


def _tf_slice(tf, prefix: str, name: str, info, extents) -> np.ndarray:
    """TensorFlow's RestoreV2 of one stored slice, asked for as its partitioned variable asks."""
    full = " ".join(str(d) for d in info.shape)
    spec = ":".join("-" if n is None else f"{s},{n}" for s, n in extents)
    return tf.raw_ops.RestoreV2(
        prefix=prefix,
        tensor_names=[name],
        shape_and_slices=[f"{full} {spec}"],
        dtypes=[tf.as_dtype(info.dtype)],
    )[0].numpy()


def _tf_value(tf, reader, prefix: str, name: str, info, ckpt: Checkpoint) -> np.ndarray:
    """TensorFlow's reading of a tensor; partitioned ones slice by slice with RestoreV2,
    since TensorFlow's reader cannot assemble every dtype (float16, strings, ...)."""
    if not info.slices:
        return np.asarray(reader.get_tensor(name), dtype=object if info.dtype == "string" else None)
    dtype = _dt.lookup(info.dtype).numpy
    out = np.empty(info.shape, dtype=object if dtype is None else dtype)
    for extents in info.slices:
        value = _tf_slice(tf, prefix, name, info, extents)
        index = tuple(slice(None) if n is None else slice(s, s + n) for s, n in extents)
        out[index] = value
    return out


def verify_with_tf(path, *, reference=None, storage_options: StorageOptions | None = None) -> dict:
    """Read every tensor with TensorFlow's own reader and compare it bit-exactly with tfckpt's.

    With ``reference`` (the checkpoint a conversion started from), every tensor
    whose dtype differs from the reference's must also equal TensorFlow's own
    ``tf.cast`` of the reference value, apart from two documented differences
    reported, per tensor, in ``cast_differences`` (information, not mismatches):
    subnormal results TensorFlow's CPU kernels flush to zero, and NaNs whose sign
    or payload differs from TensorFlow's.
    Returns ``{"prefix", "tensors", "cast_checked", "cast_differences": [{"tensor",
    "cast", "subnormals_tf_flushes", "nans_other_bits"}], "mismatches": [str]}``.
    """
    tf = tensorflow()
    mismatches: list[str] = []
    differences: list[dict] = []
    cast_checked = 0
    with open_checkpoint(path, storage_options=storage_options) as ckpt:
        try:
            reader = tf.train.load_checkpoint(ckpt.tf_path)
            tf_names = sorted(reader.get_variable_to_shape_map())
        except (tf.errors.OpError, ValueError) as e:  # TensorFlow's reader refused it
            refused = f"{ckpt.prefix}: TensorFlow cannot open it: {str(e).splitlines()[0][:200]}"
            return {
                "prefix": ckpt.prefix,
                "tensors": len(ckpt),
                "cast_checked": 0,
                "cast_differences": [],
                "mismatches": [refused],
            }
        if tf_names != ckpt.keys():
            only_tf = sorted(set(tf_names) - set(ckpt.keys()))
            only_us = sorted(set(ckpt.keys()) - set(tf_names))
            mismatches.append(
                f"{ckpt.prefix}: names differ: only TensorFlow lists "
                f"{only_tf[:5]}, only tfckpt lists {only_us[:5]}"
            )
        mismatches += _value_mismatches(tf, reader, ckpt)
        if reference is not None:
            cast_checked, wrong_casts, differences = _cast_checks(
                tf, ckpt, reference, storage_options
            )
            mismatches += wrong_casts
        return {
            "prefix": ckpt.prefix,
            "tensors": len(ckpt),
            "cast_checked": cast_checked,
            "cast_differences": differences,
            "mismatches": mismatches,
        }


def _value_mismatches(tf, reader, ckpt) -> list[str]:
    """Where ``ckpt``'s tensors differ from what TensorFlow's ``reader`` of it says."""
    mismatches: list[str] = []
    dtypes = reader.get_variable_to_dtype_map()
    for name in ckpt.keys():
        if name not in dtypes:
            continue
        info = ckpt.info(name)
        if dtypes[name].name != info.dtype:
            mismatches.append(
                f"{ckpt.prefix}: {name}: TensorFlow says {dtypes[name].name}, "
                f"tfckpt says {info.dtype}"
            )
            continue
        if info.dtype in ("variant", "resource"):
            continue
        if info.partial:  # pre-sliced: only its slices exist, for TensorFlow too
            try:
                same = all(
                    _same_bits(ckpt.read_slice(name, e), _tf_slice(tf, ckpt.tf_path, name, info, e))
                    for e in info.slices
                )
            except Exception as e:
                mismatches.append(
                    f"{ckpt.prefix}: {name}: TensorFlow cannot read a stored "
                    f"slice: {str(e).splitlines()[0][:200]}"
                )
                continue
            if not same:
                mismatches.append(f"{ckpt.prefix}: {name}: values differ from TensorFlow's reader")
            continue
        try:
            theirs = _tf_value(tf, reader, ckpt.tf_path, name, info, ckpt)
        except Exception as e:  # TensorFlow's own reader refused it
            mismatches.append(
                f"{ckpt.prefix}: {name}: TensorFlow cannot read it: {str(e).splitlines()[0][:200]}"
            )
            continue
        if not _same_bits(ckpt[name], theirs):
            mismatches.append(f"{ckpt.prefix}: {name}: values differ from TensorFlow's reader")
    return mismatches


def _cast_checks(
    tf, ckpt, reference, storage_options: StorageOptions | None
) -> tuple[int, list[str], list[dict]]:
    """The tensors of ``ckpt`` cast from ``reference`` compared with ``tf.cast``: how many,
    the mismatches, and the documented differences (see :func:`verify_with_tf`)."""
    mismatches: list[str] = []
    differences: list[dict] = []
    cast_checked = 0
    with open_checkpoint(reference, storage_options=storage_options) as ref:
        for name in ckpt.keys():
            if name not in ref:
                continue
            old, new = ref.info(name), ckpt.info(name)
            if old.dtype == new.dtype or old.shape != new.shape:
                continue
            # A pre-sliced tensor exists only as its slices, for TensorFlow too.
            pairs = (
                [
                    (
                        lambda e=e, n=name: ckpt.read_slice(n, e),
                        lambda e=e, n=name: ref.read_slice(n, e),
                    )
                    for e in new.slices
                ]
                if new.partial
                else [(lambda n=name: ckpt[n], lambda n=name: ref[n])]
            )
            cast_checked += 1
            equal, flushed, nans = True, 0, 0
            for ours, source in pairs:
                src = source()
                expected = tf.cast(tf.constant(src), new.dtype).numpy()
                ok, f, n = _cast_compare(ours(), np.asarray(expected), src, old.dtype, new.dtype)
                equal, flushed, nans = equal and ok, flushed + f, nans + n
            if not equal:
                mismatches.append(
                    f"{ckpt.prefix}: {name}: differs from tf.cast of the "
                    f"reference ({old.dtype} -> {new.dtype})"
                )
            elif flushed or nans:
                differences.append(
                    {
                        "tensor": name,
                        "cast": f"{old.dtype} -> {new.dtype}",
                        "subnormals_tf_flushes": flushed,
                        "nans_other_bits": nans,
                    }
                )
    return cast_checked, mismatches, differences
