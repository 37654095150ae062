"""The values of a ``TensorProto`` as V1 (tensor-slice) checkpoints store them: typed
repeated fields (``float_val``, ``half_val`` ...) or ``tensor_content`` bytes.

Each slice entry of a V1 file holds one (:mod:`tfckpt.checkpoint.v1` reads them).
"""

from __future__ import annotations

import numpy as np

from tfckpt._proto.saved_tensor_slice_pb2 import TensorProto
from tfckpt.format import dtypes as _dt
from tfckpt.format.slices import num_elements

# The repeated field of TensorProto that holds each dtype's values, and the numpy type
# of that field's elements (converted to the tensor's dtype after the count is checked).
_FIELDS: dict[str, tuple[str, np.dtype]] = {
    "float32": ("float_val", np.dtype(np.float32)),
    "float64": ("double_val", np.dtype(np.float64)),
    "int32": ("int_val", np.dtype(np.int32)),
    "uint8": ("int_val", np.dtype(np.int32)),
    "int16": ("int_val", np.dtype(np.int32)),
    "int8": ("int_val", np.dtype(np.int32)),
    "uint16": ("int_val", np.dtype(np.int32)),
    "qint8": ("int_val", np.dtype(np.int32)),
    "quint8": ("int_val", np.dtype(np.int32)),
    "qint16": ("int_val", np.dtype(np.int32)),
    "quint16": ("int_val", np.dtype(np.int32)),
    "qint32": ("int_val", np.dtype(np.int32)),
    "int64": ("int64_val", np.dtype(np.int64)),
    "bool": ("bool_val", np.dtype(np.bool_)),
    "float16": ("half_val", np.dtype(np.int32)),  # the float16's bits
    "bfloat16": ("half_val", np.dtype(np.int32)),
    "complex64": ("scomplex_val", np.dtype(np.float32)),  # real, imaginary, ...
    "complex128": ("dcomplex_val", np.dtype(np.float64)),
    "uint32": ("uint32_val", np.dtype(np.uint32)),
    "uint64": ("uint64_val", np.dtype(np.uint64)),
}


def decode_tensor_proto(proto: TensorProto, dtype: _dt.DType, shape: tuple[int, ...]) -> np.ndarray:
    """The values a V1 slice's TensorProto holds, as an array of ``dtype`` and ``shape``.

    ``ValueError`` when the proto does not hold exactly that many values of that dtype.
    """
    n = num_elements(shape)
    if proto.dtype and proto.dtype != dtype.enum:
        raise ValueError(f"values of dtype {proto.dtype}, the meta says {dtype.name}")
    if dtype is _dt.STRING:
        vals = proto.string_val
        if len(vals) != n:
            raise ValueError(f"{len(vals)} strings for {n} elements")
        out = np.empty(n, dtype=object)
        out[:] = list(vals) if n else []
        return out.reshape(shape)
    if dtype.numpy is None or dtype.name not in _FIELDS:
        raise ValueError(f"{dtype.name} tensors cannot be stored in a V1 checkpoint")
    target = np.dtype(dtype.numpy)
    if proto.tensor_content:
        content = proto.tensor_content
        if len(content) != n * target.itemsize:
            raise ValueError(f"{len(content)} content bytes for {n} {dtype.name} elements")
        return np.frombuffer(content, dtype=target.newbyteorder("<")).astype(target).reshape(shape)
    field, ftype = _FIELDS[dtype.name]
    values = getattr(proto, field)
    per = 2 if dtype.name.startswith("complex") else 1
    if len(values) != n * per:
        raise ValueError(f"{len(values)} values in {field} for {n} {dtype.name} elements")
    arr = np.array(values, dtype=ftype) if n else np.empty(0, dtype=ftype)
    if dtype.name in ("float16", "bfloat16"):
        arr = arr.astype(np.uint16).view(target)
    elif per == 2:
        arr = arr.view(target)
    elif arr.dtype != target:
        arr = arr.astype(target)
    return arr.reshape(shape)
