"""TensorFlow's DataType numbers, their names, and their numpy equivalents.

The ml-dtypes types (bfloat16, float8, int4, ...) are resolved on first use:
importing ml-dtypes costs more than everything else tfckpt imports together,
and most commands never meet those types.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Literal, get_args

import numpy as np

from tfckpt.errors import UnknownDTypeError, UnsupportedCheckpointError

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

# How TensorFlow's types group for tfckpt: what a cast, a dump or a diff does with them.
Kind = Literal["float", "complex", "int", "uint", "bool", "quantized", "string", "opaque"]

# Byte order of the elements in a bundle's data shards (the header says which).
Endianness = Literal["little", "big"]
ENDIANNESS: tuple[Endianness, ...] = get_args(Endianness)
NATIVE_ENDIANNESS: Endianness = "little" if np.little_endian else "big"


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
    spec: DTypeLike | None  # a numpy dtype spec, "ml_dtypes:NAME", or None
    kind: Kind
    itemsize: int | None

    @cached_property
    def numpy(self) -> np.dtype | None:
        if self.spec is None:
            return None
        if isinstance(self.spec, str) and self.spec.startswith("ml_dtypes:"):
            import ml_dtypes

            return np.dtype(getattr(ml_dtypes, self.spec.split(":", 1)[1]))
        return np.dtype(self.spec)

    @property
    def fixed_itemsize(self) -> int:
        """``itemsize`` where the code has established a fixed-size dtype."""
        if self.itemsize is None:
            raise TypeError(f"{self.name} elements have no fixed size")
        return self.itemsize

    @property
    def array_dtype(self) -> np.dtype:
        """``numpy`` where the code has established that there is one."""
        if self.numpy is None:
            raise TypeError(f"{self.name} tensors have no numpy form")
        return self.numpy

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


def _q(name: str, base: str) -> list:
    # TensorFlow returns quantized tensors as one-field structured arrays.
    return [(name, base)]


_ML = "ml_dtypes:"
_TABLE: list[tuple[int, str, DTypeLike | None, Kind, int | None]] = [
    (1, "float32", np.float32, "float", 4),
    (2, "float64", np.float64, "float", 8),
    (3, "int32", np.int32, "int", 4),
    (4, "uint8", np.uint8, "uint", 1),
    (5, "int16", np.int16, "int", 2),
    (6, "int8", np.int8, "int", 1),
    (7, "string", None, "string", None),
    (8, "complex64", np.complex64, "complex", 8),
    (9, "int64", np.int64, "int", 8),
    (10, "bool", np.bool_, "bool", 1),
    (11, "qint8", _q("qint8", "i1"), "quantized", 1),
    (12, "quint8", _q("quint8", "u1"), "quantized", 1),
    (13, "qint32", _q("qint32", "<i4"), "quantized", 4),
    (14, "bfloat16", _ML + "bfloat16", "float", 2),
    (15, "qint16", _q("qint16", "<i2"), "quantized", 2),
    (16, "quint16", _q("quint16", "<u2"), "quantized", 2),
    (17, "uint16", np.uint16, "uint", 2),
    (18, "complex128", np.complex128, "complex", 16),
    (19, "float16", np.float16, "float", 2),
    (20, "resource", None, "opaque", None),
    (21, "variant", None, "opaque", None),
    (22, "uint32", np.uint32, "uint", 4),
    (23, "uint64", np.uint64, "uint", 8),
    (24, "float8_e5m2", _ML + "float8_e5m2", "float", 1),
    (25, "float8_e4m3fn", _ML + "float8_e4m3fn", "float", 1),
    (26, "float8_e4m3fnuz", _ML + "float8_e4m3fnuz", "float", 1),
    (27, "float8_e4m3b11fnuz", _ML + "float8_e4m3b11fnuz", "float", 1),
    (28, "float8_e5m2fnuz", _ML + "float8_e5m2fnuz", "float", 1),
    (29, "int4", _ML + "int4", "int", 1),
    (30, "uint4", _ML + "uint4", "uint", 1),
    (31, "int2", _ML + "int2", "int", 1),
    (32, "uint2", _ML + "uint2", "uint", 1),
    (33, "float4_e2m1fn", _ML + "float4_e2m1fn", "float", 1),
]

_BY_ENUM: dict[int, DType] = {
    e: DType(e, name, spec, kind, size) for e, name, spec, kind, size in _TABLE
}
_BY_NAME: dict[str, DType] = {d.name: d for d in _BY_ENUM.values()}
# Other names people write for the same types, lowercase: TensorFlow's own aliases
# (tf.half, tf.float, tf.double), and the usual short forms. numpy's names and type codes
# ("f2", "<f4", "e") are numpy's to read (see :func:`lookup`).
_ALIASES = {
    "half": "float16",
    "float": "float32",
    "double": "float64",
    "fp16": "float16",
    "f16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "f32": "float32",
    "single": "float32",
    "fp64": "float64",
    "f64": "float64",
    "fp8_e4m3": "float8_e4m3fn",
    "e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "e5m2": "float8_e5m2",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "c64": "complex64",
    "c128": "complex128",
    "bytes": "string",
    "str": "string",
    "object": "string",
}

STRING = _BY_NAME["string"]


def from_enum(enum: int, *, path: str | None = None, tensor: str | None = None) -> DType:
    """The DType of a DataType number; an error for numbers tfckpt does not know."""
    try:
        return _BY_ENUM[enum]
    except KeyError:
        raise UnsupportedCheckpointError(
            f"unknown DataType number {enum}", path=path, tensor=tensor
        ) from None


def bulk_itemsizes() -> tuple[np.ndarray, np.ndarray]:
    """Indexed by DataType number: bytes per element (0 when variable) and whether known."""
    return _BULK_ITEMSIZE, _BULK_KNOWN


def bulk_dtypes() -> list[DType | None]:
    """Indexed by DataType number: the DType (None for numbers tfckpt does not know)."""
    return _BULK_DTYPES


def bulk_names() -> list[str]:
    """Indexed by DataType number: the type's name ("" for numbers tfckpt does not know)."""
    return _BULK_NAMES


_BULK_DTYPES = [_BY_ENUM.get(e) for e in range(max(_BY_ENUM) + 1)]
_BULK_NAMES = [d.name if d is not None else "" for d in _BULK_DTYPES]
_BULK_KNOWN = np.array([bool(n) for n in _BULK_NAMES])
_BULK_ITEMSIZE = np.array(
    [(_BY_ENUM[e].itemsize or 0) if e in _BY_ENUM else 0 for e in range(len(_BULK_NAMES))],
    dtype=np.int64,
)


def lookup(spec) -> DType:
    """A DType from a name (TensorFlow's ``'float16'``, ``'half'``; numpy's ``'f2'``;
    short ones ``'fp16'``, ``'bf16'``, any case), a number, a numpy dtype, or a DType.

    Every dtype a user names (the command line's ``--dtype``, ``--from``,
    ``--dtype-rule``, rules files, the library's ``cast=``) is read here; a name it
    does not know is an :class:`~tfckpt.errors.UnknownDTypeError` suggesting the
    nearest one.

    >>> lookup("bf16").name
    'bfloat16'
    """
    if isinstance(spec, DType):
        return spec
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        return from_enum(int(spec))
    if isinstance(spec, str):
        key = spec.strip().lower()
        key = _ALIASES.get(key, key)
        if key in _BY_NAME:
            return _BY_NAME[key]
    try:
        npd = np.dtype(spec) if spec is not None else None
    except TypeError:
        npd = None
    if npd is not None:
        if npd.kind in "OSU":
            return STRING
        # numpy's names agree with TensorFlow's for every type both have, ml-dtypes'
        # included; quantized types are one-field structs named after the type.
        key = npd.names[0] if npd.names and len(npd.names) == 1 else npd.name
        found = _BY_NAME.get(key)
        if (
            found is not None
            and found.numpy is not None
            and found.numpy.newbyteorder("=") == npd.newbyteorder("=")
        ):
            return found
    raise UnknownDTypeError(f"unknown dtype {spec!r}{did_you_mean(spec)}")


def did_you_mean(spec, among=None) -> str:
    """``"; did you mean 'float32'?"`` for the known name nearest ``spec`` (among
    ``among``, default every name and alias); ``""`` when none is near."""
    if not isinstance(spec, str):
        return ""
    names = list(among) if among is not None else [*_BY_NAME, *_ALIASES]
    found = difflib.get_close_matches(spec.strip().lower(), names, n=1)
    if not found:
        return ""
    name = _ALIASES.get(found[0], found[0]) if among is None else found[0]
    return f"; did you mean {name!r}?"


def all_dtypes() -> list[DType]:
    return list(_BY_ENUM.values())
