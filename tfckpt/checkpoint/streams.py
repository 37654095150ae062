"""Tensor streams: one tensor's elements written chunk by chunk into a data file.

:class:`TensorStream` takes a fixed-size tensor's elements in row-major order;
:class:`StringStream` a string tensor as its format lays it out (every element's
length, then the elements' bytes). Each appends to the data file of a
:class:`~tfckpt.checkpoint.writer.ShardWriter` and, once closed, records the tensor's
index entry with the checksum of what it wrote.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from tfckpt.checkpoint.entries import IndexEntries
from tfckpt.format import dtypes as _dt
from tfckpt.format.bundle import NATIVE
from tfckpt.format.dtypes import Endianness
from tfckpt.format.framing import encode_varints, lengths_crc
from tfckpt.format.slices import num_elements
from tfckpt.format.table import crc32c, mask_crc


class DataFile(Protocol):
    """What a stream writes through: a data file being written (a
    :class:`~tfckpt.checkpoint.writer.ShardWriter`), its bytes so far and its entries."""

    endianness: Endianness
    index: IndexEntries
    size: int

    def append(self, data) -> None: ...

    def record(
        self, key: bytes, dtype: _dt.DType, shape: tuple[int, ...], offset: int, size: int, crc: int
    ) -> None: ...

    def abort(self) -> None: ...


def holds(values: np.ndarray, dt: _dt.DType) -> bool:
    """Whether ``values`` are elements of ``dt``: of its numpy type, or a float type's
    bit patterns as native unsigned integers of its size (what a cast to bfloat16 gives
    without importing ml-dtypes; checked first, so that it imports nothing either)."""
    d = values.dtype
    if dt.is_floating and d.kind == "u" and d.isnative and d.itemsize == dt.itemsize:
        return True
    return d == dt.numpy


def data_bytes(values: np.ndarray, dt: _dt.DType, endianness: Endianness) -> np.ndarray:
    """The bytes of fixed-size values in a data file of ``endianness``."""
    data = np.ascontiguousarray(values.reshape(-1)).view(np.uint8)
    if endianness != NATIVE and dt.swap_unit > 1:
        data = data.view(np.dtype(f"u{dt.swap_unit}")).byteswap().view(np.uint8)
    return data


class TensorStream:
    """Receives one fixed-size tensor's elements in row-major order.

    Made by :meth:`ShardWriter.stream <tfckpt.checkpoint.writer.ShardWriter.stream>`;
    leaving its ``with`` block on an exception aborts the writer.
    """

    def __init__(
        self,
        writer: DataFile,
        key: bytes,
        dtype: _dt.DType,
        shape: tuple[int, ...],
        size: int,
        on_close: Callable[[], None] | None,
    ):
        self._w = writer
        self._key = key
        self.dtype = dtype
        self.shape = shape
        self._size = size
        self._offset = writer.size
        self._written = 0
        self._crc = 0
        self._on_close = on_close

    def write(self, chunk) -> None:
        """Append the next elements (of the tensor's dtype, any shape, row-major)."""
        arr = np.asarray(chunk)
        if not holds(arr, self.dtype):
            raise ValueError(f"chunk of {arr.dtype} written to a {self.dtype.name} tensor")
        data = data_bytes(arr, self.dtype, self._w.endianness)
        if self._written + data.nbytes > self._size:
            raise ValueError(
                f"more than the {self._size} bytes of shape {list(self.shape)} "
                f"{self.dtype.name} written"
            )
        self._w.append(data)
        self._crc = crc32c(data, self._crc)
        self._written += data.nbytes

    def close(self) -> None:
        """End the tensor and record its entry; refused unless every byte was written."""
        self._w.index.streaming = False
        if self._written != self._size:
            raise ValueError(f"{self._written} bytes written to a tensor of {self._size} bytes")
        self._end(self._size)

    def _end(self, size: int) -> None:
        self._w.record(self._key, self.dtype, self.shape, self._offset, size, self._crc)
        if self._on_close is not None:
            self._on_close()

    def __enter__(self) -> TensorStream:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._w.index.streaming = False
            self._w.abort()


class StringStream(TensorStream):
    """Receives one string tensor: every element's length, then the elements' bytes.

    Writes the framing and computes the checksums exactly as
    :func:`~tfckpt.format.framing.encode_strings`.
    """

    def __init__(
        self,
        writer: DataFile,
        key: bytes,
        shape: tuple[int, ...],
        on_close: Callable[[], None] | None,
    ):
        super().__init__(writer, key, _dt.STRING, shape, 0, on_close)
        self._count = num_elements(shape)
        self._lengths = 0  # lengths received
        self._expected = 0  # element bytes they add up to
        self._framed = False  # the lengths' checksum is written

    def write_lengths(self, lengths) -> None:
        """Append the next elements' lengths (a 1-D array of non-negative integers)."""
        arr = np.asarray(lengths)
        if (
            arr.ndim != 1
            or arr.dtype.kind not in "ui"
            or (arr.dtype.kind == "i" and len(arr) and int(arr.min()) < 0)
        ):
            raise ValueError("lengths must be a 1-D array of non-negative integers")
        if self._framed or self._lengths + len(arr) > self._count:
            raise ValueError(f"more than the {self._count} lengths of shape {list(self.shape)}")
        arr = arr.astype(np.uint64, copy=False)
        self._w.append(encode_varints(arr))
        self._crc = lengths_crc(arr, self._w.endianness, self._crc)
        self._lengths += len(arr)
        self._expected += int(arr.sum())
        if self._lengths == self._count:
            self._end_lengths()

    def _end_lengths(self) -> None:
        check = mask_crc(self._crc).to_bytes(4, self._w.endianness)
        self._w.append(check)
        self._crc = crc32c(check, self._crc)
        self._framed = True

    def write_data(self, data) -> None:
        """Append the next element bytes, once every length is written; cut anywhere."""
        data = memoryview(data).cast("B")
        if not self._framed:
            if self._lengths != self._count:
                raise ValueError(f"element bytes after {self._lengths} of {self._count} lengths")
            self._end_lengths()
        if self._written + len(data) > self._expected:
            raise ValueError(f"more than the {self._expected} bytes the lengths add up to")
        self._w.append(data)
        self._crc = crc32c(data, self._crc)
        self._written += len(data)

    def write(self, chunk) -> None:
        """Refused: a string tensor takes :meth:`write_lengths` and :meth:`write_data`."""
        raise ValueError("string tensors are streamed with write_lengths and write_data")

    def close(self) -> None:
        """End the tensor and record its entry; refused unless every length and byte was
        written."""
        self._w.index.streaming = False
        if not self._framed and self._lengths == self._count:
            self._end_lengths()
        if self._lengths != self._count or self._written != self._expected:
            raise ValueError(
                f"{self._lengths} of {self._count} lengths and {self._written} of "
                f"{self._expected} element bytes written"
            )
        self._end(self._w.size - self._offset)
