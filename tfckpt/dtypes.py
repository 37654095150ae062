"""TensorFlow's DataType numbers, their names, and their numpy equivalents."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .errors import UnsupportedCheckpointError


@dataclass(frozen=True)
class DType:
    """One TensorFlow data type as it appears in a checkpoint.

    ``name`` is TensorFlow's (``tf.as_dtype(enum).name``); ``numpy`` is the
    numpy dtype TensorFlow's reader returns, or None when values are not
    fixed-size elements (string, resource, variant). ``itemsize`` is the bytes
    per element on disk, None when variable.
    """

    enum: int
    name: str
    numpy: np.dtype | None
    kind: str  # 'float', 'complex', 'int', 'uint', 'bool', 'quantized', 'string', 'opaque'

    @property
    def itemsize(self) -> int | None:
        return None if self.numpy is None else self.numpy.itemsize

    @property
    def is_floating(self) -> bool:
        return self.kind == "float"

    @property
    def swap_unit(self) -> int:
        """Size of the units a big-endian bundle stores byte-swapped (complex: each part)."""
        size = self.itemsize or 1
        return size // 2 if self.kind == "complex" else size

    def __str__(self) -> str:
        return self.name


def _q(name: str, base: str) -> np.dtype:
    # TensorFlow returns quantized tensors as one-field structured arrays.
    return np.dtype([(name, base)])


_TABLE = [
    (1, "float32", np.float32, "float"),
    (2, "float64", np.float64, "float"),
    (3, "int32", np.int32, "int"),
    (4, "uint8", np.uint8, "uint"),
    (5, "int16", np.int16, "int"),
    (6, "int8", np.int8, "int"),
    (7, "string", None, "string"),
    (8, "complex64", np.complex64, "complex"),
    (9, "int64", np.int64, "int"),
    (10, "bool", np.bool_, "bool"),
    (11, "qint8", _q("qint8", "i1"), "quantized"),
    (12, "quint8", _q("quint8", "u1"), "quantized"),
    (13, "qint32", _q("qint32", "<i4"), "quantized"),
    (14, "bfloat16", ml_dtypes.bfloat16, "float"),
    (15, "qint16", _q("qint16", "<i2"), "quantized"),
    (16, "quint16", _q("quint16", "<u2"), "quantized"),
    (17, "uint16", np.uint16, "uint"),
    (18, "complex128", np.complex128, "complex"),
    (19, "float16", np.float16, "float"),
    (20, "resource", None, "opaque"),
    (21, "variant", None, "opaque"),
    (22, "uint32", np.uint32, "uint"),
    (23, "uint64", np.uint64, "uint"),
    (24, "float8_e5m2", ml_dtypes.float8_e5m2, "float"),
    (25, "float8_e4m3fn", ml_dtypes.float8_e4m3fn, "float"),
    (26, "float8_e4m3fnuz", ml_dtypes.float8_e4m3fnuz, "float"),
    (27, "float8_e4m3b11fnuz", ml_dtypes.float8_e4m3b11fnuz, "float"),
    (28, "float8_e5m2fnuz", ml_dtypes.float8_e5m2fnuz, "float"),
    (29, "int4", ml_dtypes.int4, "int"),
    (30, "uint4", ml_dtypes.uint4, "uint"),
    (31, "int2", ml_dtypes.int2, "int"),
    (32, "uint2", ml_dtypes.uint2, "uint"),
    (33, "float4_e2m1fn", ml_dtypes.float4_e2m1fn, "float"),
]

_BY_ENUM: dict[int, DType] = {
    e: DType(e, name, None if npt is None else np.dtype(npt), kind) for e, name, npt, kind in _TABLE
}
_BY_NAME: dict[str, DType] = {d.name: d for d in _BY_ENUM.values()}
_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "bytes": "string",
            "str": "string", "object": "string"}
_BY_NUMPY: dict[np.dtype, DType] = {d.numpy: d for d in _BY_ENUM.values() if d.numpy is not None}

STRING = _BY_NAME["string"]


def from_enum(enum: int, *, path: str | None = None, tensor: str | None = None) -> DType:
    """The DType of a DataType number; an error for numbers tfckpt does not know."""
    try:
        return _BY_ENUM[enum]
    except KeyError:
        raise UnsupportedCheckpointError(f"unknown DataType number {enum}",
                                         path=path, tensor=tensor) from None


def lookup(spec) -> DType:
    """A DType from a TensorFlow name (``'float16'``, ``'half'``), a number, a numpy dtype, or a DType."""
    if isinstance(spec, DType):
        return spec
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        return from_enum(int(spec))
    if isinstance(spec, str):
        key = _ALIASES.get(spec, spec)
        if key in _BY_NAME:
            return _BY_NAME[key]
    try:
        npd = np.dtype(spec)
    except TypeError:
        npd = None
    if npd is not None:
        if npd.kind in "OSU":
            return STRING
        if npd in _BY_NUMPY:
            return _BY_NUMPY[npd]
        if npd.byteorder == ">" and npd.newbyteorder("=") in _BY_NUMPY:
            return _BY_NUMPY[npd.newbyteorder("=")]
    raise ValueError(f"no TensorFlow dtype for {spec!r}")


def all_dtypes() -> list[DType]:
    return list(_BY_ENUM.values())
