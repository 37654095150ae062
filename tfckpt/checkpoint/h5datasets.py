"""One HDF5 dataset's values, read in bounded pieces: :class:`Dataset`.

A dataset is checked when the file is opened: its element type must be one of the
plain types (IEEE floats, integers, h5py's bool, complex pairs, Keras 2's bfloat16),
its values stored in the file itself (no external storage, no virtual dataset), and
its size possible for the file: contiguous bytes must lie in it, a chunked dataset
may claim at most what its largest compression ratio allows. Then reads take flat
ranges of elements, row-major, in the file's own byte order:

- contiguous: positioned reads of exactly those bytes (or a view of the mapped file);
- chunked: each chunk it meets decoded here (:mod:`tfckpt.format.h5chunks`), never more
  than one chunk's declared bytes at a time, a few recent ones kept;
- compact (a few bytes stored in the object header): read whole by h5py, once.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from math import prod
from typing import Any

import numpy as np
from h5py import h5d, h5t

from tfckpt.errors import CorruptCheckpointError, UnsupportedCheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.format.h5chunks import KNOWN, Filter, decode_chunk, stored_limit
from tfckpt.io.storage import Reader

# The largest chunk decoded at once, and how much of the recent ones is kept.
MAX_CHUNK_BYTES = 16 << 20
CHUNK_CACHE_BYTES = 16 << 20
# No deflate stream inflates more than about 1032 times; a chunked dataset claiming
# more than this many times its file's size cannot be what the file holds.
MAX_RATIO = 1100

_FLOATS = [
    ("IEEE_F16LE", "<f2", "float16"),
    ("IEEE_F16BE", ">f2", "float16"),
    ("IEEE_F32LE", "<f4", "float32"),
    ("IEEE_F32BE", ">f4", "float32"),
    ("IEEE_F64LE", "<f8", "float64"),
    ("IEEE_F64BE", ">f8", "float64"),
]
_INTS = [
    (f"STD_{k}{bits}{order}", f"{'<' if order == 'LE' else '>'}{k.lower()}{bits // 8}", name)
    for k, prefix in (("I", "int"), ("U", "uint"))
    for bits in (8, 16, 32, 64)
    for order in ("LE", "BE")
    for name in [f"{prefix}{bits}"]
]


def element_type(tid) -> tuple[_dt.DType, np.dtype] | str:
    """The tfckpt dtype of an HDF5 element type and the numpy dtype of its bytes in the
    file (byte order included); or, for a type tfckpt does not read, what it is."""
    cls = tid.get_class()
    if cls in (h5t.FLOAT, h5t.INTEGER):
        for std, spec, name in _FLOATS if cls == h5t.FLOAT else _INTS:
            if tid.equal(getattr(h5t, std)):
                return _dt.lookup(name), np.dtype(spec)
        return f"a nonstandard {'float' if cls == h5t.FLOAT else 'integer'} type"
    if cls == h5t.ENUM and _is_bool(tid):
        return _dt.lookup("bool"), np.dtype("u1")
    if cls == h5t.COMPOUND:
        found = _complex(tid)
        return found if found is not None else "a compound type"
    if cls == h5t.OPAQUE and tid.get_size() == 2 and not tid.get_tag():
        # Keras 2 writes bfloat16 weights as untagged 2-byte opaque values (numpy's
        # bfloat16 has no HDF5 type), in the writing machine's byte order: little.
        return _dt.lookup("bfloat16"), np.dtype("<u2")
    kinds = {h5t.STRING: "strings", h5t.VLEN: "variable-length values", h5t.REFERENCE: "references"}
    return kinds.get(cls, f"an HDF5 type of class {cls}")


def _is_bool(tid) -> bool:
    """h5py's bool: an enum of int8 with FALSE = 0 and TRUE = 1."""
    if tid.get_nmembers() != 2 or tid.get_super().get_size() != 1:
        return False
    if tid.get_super().get_class() != h5t.INTEGER:
        return False
    members = {tid.get_member_name(i): tid.get_member_value(i) for i in range(2)}
    return members == {b"FALSE": 0, b"TRUE": 1}


def _complex(tid) -> tuple[_dt.DType, np.dtype] | None:
    """h5py's complex numbers: a compound ``r``, ``i`` of one IEEE float type, packed."""
    if tid.get_nmembers() != 2 or [tid.get_member_name(i) for i in range(2)] != [b"r", b"i"]:
        return None
    part = element_type(tid.get_member_type(0))
    if isinstance(part, str) or part[0].name not in ("float32", "float64"):
        return None
    size = part[1].itemsize
    if not tid.get_member_type(1).equal(tid.get_member_type(0)):
        return None
    if (tid.get_member_offset(0), tid.get_member_offset(1), tid.get_size()) != (0, size, 2 * size):
        return None
    name = "complex64" if size == 4 else "complex128"
    return _dt.lookup(name), np.dtype(f"{part[1].byteorder}c{2 * size}")


class Dataset:
    """One dataset of a file opened through ``reader``: checked, then read by flat
    element ranges (:meth:`read_flat`) in its file byte order (``file_dtype``)."""

    def __init__(self, ds: Any, where: str, path: str, reader: Reader, tensor: str):
        self.where, self.path, self.tensor = where, path, tensor
        self._ds, self._reader = ds, reader
        found = element_type(ds.id.get_type())
        if isinstance(found, str):
            raise self._unsupported(f"its elements are {found}")
        self.dtype, self.file_dtype = found
        shape = ds.shape
        if shape is None:
            raise self._unsupported("it has no dataspace (an HDF5 null dataset)")
        self.shape: tuple[int, ...] = tuple(int(n) for n in shape)
        self.size = prod(self.shape)
        self.itemsize = self.file_dtype.itemsize
        self.nbytes = self.size * self.itemsize
        dcpl = ds.id.get_create_plist()
        layout = dcpl.get_layout()
        if layout == h5d.VIRTUAL:
            raise self._unsupported("it is a virtual dataset (its values are in other datasets)")
        if dcpl.get_external_count():
            raise self._unsupported("its values are stored in another file (external storage)")
        self.offset: int | None = None
        self.chunks: tuple[int, ...] | None = None
        self.filters: tuple[Filter, ...] = ()
        self._whole: np.ndarray | None = None
        self._cache: OrderedDict[tuple[int, ...], np.ndarray] = OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()
        fill = np.zeros((), dtype=ds.dtype)
        if self.nbytes:
            dcpl.get_fill_value(fill)
        self._fill = np.frombuffer(fill.tobytes()[: self.itemsize], dtype=self.file_dtype)[0]
        if layout == h5d.CHUNKED:
            self._check_chunked(dcpl)
        elif layout == h5d.CONTIGUOUS:
            self._check_contiguous()
        elif layout == h5d.COMPACT:
            if self.nbytes > 1 << 16:
                raise self._corrupt(f"a compact dataset of {self.nbytes} bytes")
        else:
            raise self._unsupported(f"HDF5 layout {layout} is not one tfckpt reads")
        self.layout = {h5d.CHUNKED: "chunked", h5d.CONTIGUOUS: "contiguous"}.get(layout, "compact")

    def _unsupported(self, what: str) -> UnsupportedCheckpointError:
        return UnsupportedCheckpointError(
            f"dataset {self.where}: {what}", path=self.path, tensor=self.tensor
        )

    def _corrupt(self, what: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(
            f"dataset {self.where}: {what}", path=self.path, tensor=self.tensor
        )

    def _check_contiguous(self) -> None:
        file_size = self._reader.size
        if self.nbytes > file_size:
            raise self._corrupt(
                f"declares {self.nbytes} bytes ({list(self.shape)} x {self.itemsize}), more "
                f"than the whole file's {file_size}"
            )
        self.offset = self._ds.id.get_offset() if self.nbytes else None
        if self.offset is not None and self.offset + self.nbytes > file_size:
            raise self._corrupt(
                f"bytes [{self.offset}, {self.offset + self.nbytes}) lie past the end of the "
                f"file ({file_size} bytes); the file is truncated"
            )

    def _check_chunked(self, dcpl) -> None:
        self.chunks = tuple(int(n) for n in dcpl.get_chunk())
        if len(self.chunks) != len(self.shape) or min(self.chunks, default=1) < 1:
            raise self._corrupt(f"chunks {list(self.chunks)} do not fit its shape")
        filters = []
        for i in range(dcpl.get_nfilters()):
            code, _, params, _ = dcpl.get_filter(i)
            filters.append(Filter(int(code), tuple(int(p) for p in params)))
        self.filters = tuple(filters)
        unknown = [f.name for f in filters if f.code not in KNOWN]
        if unknown:
            raise self._unsupported(
                f"compressed with {', '.join(unknown)}; tfckpt decodes deflate (gzip), "
                "shuffle and fletcher32 only"
            )
        self.chunk_nbytes = prod(self.chunks) * self.itemsize
        if self.chunk_nbytes > MAX_CHUNK_BYTES:
            raise self._unsupported(
                f"chunks of {self.chunk_nbytes} bytes: more than the {MAX_CHUNK_BYTES} tfckpt "
                "decodes at once"
            )
        limit = MAX_RATIO * max(self._reader.size, 1)
        if self.nbytes > limit:
            raise self._corrupt(
                f"declares {self.nbytes} bytes, more than a file of {self._reader.size} bytes "
                "can hold, compressed or not"
            )

    # -- reads

    def read_flat(self, start: int, count: int, out: np.ndarray, verify: bool) -> None:
        """Elements ``[start, start + count)``, row-major, into ``out`` (uint8, their bytes
        in the file's byte order)."""
        if not count:
            return
        n = count * self.itemsize
        if self.layout == "contiguous":
            if self.offset is None:
                out.view(self.file_dtype)[:count] = self._fill
                return
            self._pread(out[:n], self.offset + start * self.itemsize)
        elif self.layout == "compact":
            whole = self._compact()
            out[:n] = whole[start * self.itemsize : start * self.itemsize + n]
        else:
            pos = 0
            for lo, hi in flat_boxes(self.shape, start, start + count):
                box = self._read_box(lo, hi, verify)
                out[pos : pos + box.nbytes] = box.reshape(-1).view(np.uint8)
                pos += box.nbytes

    def view(self) -> np.ndarray | None:
        """The whole dataset's bytes as a read-only view of the mapped file, when it is a
        local file and the bytes are stored contiguously; else None."""
        if self.layout != "contiguous" or self.offset is None or not hasattr(self._reader, "view"):
            return None
        return self._reader.view(self.offset, self.nbytes)

    def _pread(self, buf: np.ndarray, offset: int) -> None:
        done, total = 0, len(buf)
        view = buf.data
        while done < total:
            try:
                n = self._reader.readinto(view[done:], offset + done)
            except OSError as e:
                raise self._corrupt(f"read failed: {e.strerror or e}") from None
            if n <= 0:
                raise self._corrupt("unexpected end of file (the file shrank since it was opened)")
            done += n

    def _compact(self) -> np.ndarray:
        if self._whole is None:
            values = np.empty(self.shape, dtype=self._ds.dtype)
            try:
                self._ds.read_direct(values)
            except (OSError, RuntimeError, ValueError, TypeError) as e:
                raise self._corrupt(f"cannot be read: {e}") from None
            self._whole = np.frombuffer(values.tobytes(), np.uint8)
        return self._whole

    def _read_box(self, lo: tuple[int, ...], hi: tuple[int, ...], verify: bool) -> np.ndarray:
        """The elements of the box ``lo <= index < hi`` from the chunks it meets."""
        assert self.chunks is not None
        out = np.empty([b - a for a, b in zip(lo, hi)], dtype=self.file_dtype)
        grid = [range(a // c, (b - 1) // c + 1) for a, b, c in zip(lo, hi, self.chunks)]
        for cell in itertools.product(*grid):
            origin = tuple(i * c for i, c in zip(cell, self.chunks))
            chunk = self._chunk(origin, verify)
            first = [max(a, o) for a, o in zip(lo, origin)]
            last = [min(b, o + c) for b, o, c in zip(hi, origin, self.chunks)]
            out[tuple(slice(x - a, y - a) for x, y, a in zip(first, last, lo))] = chunk[
                tuple(slice(x - o, y - o) for x, y, o in zip(first, last, origin))
            ]
        return out

    def _chunk(self, origin: tuple[int, ...], verify: bool) -> np.ndarray:
        assert self.chunks is not None
        with self._lock:
            found = self._cache.get(origin)
            if found is not None:
                self._cache.move_to_end(origin)
                return found
            chunk = self._decode(origin, verify)
            self._cache[origin] = chunk
            self._cached += chunk.nbytes
            while self._cached > max(CHUNK_CACHE_BYTES, chunk.nbytes) and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._cached -= old.nbytes
            return chunk

    def _decode(self, origin: tuple[int, ...], verify: bool) -> np.ndarray:
        assert self.chunks is not None
        at = f"the chunk at {list(origin)}"
        try:
            info = self._ds.id.get_chunk_info_by_coord(origin)
        except (OSError, RuntimeError, ValueError) as e:
            raise self._corrupt(f"{at} cannot be located: {e}") from None
        if info.byte_offset is None:  # never written: the fill value
            return np.full(self.chunks, self._fill, dtype=self.file_dtype)
        limit = stored_limit(self.chunk_nbytes, self.filters)
        if info.size > limit:
            raise self._corrupt(f"{at} stores {info.size} bytes, more than its {limit}")
        try:
            mask, stored = self._ds.id.read_direct_chunk(origin)
        except (OSError, RuntimeError, ValueError) as e:
            raise self._corrupt(f"{at} cannot be read: {e}") from None
        if len(stored) > limit:
            raise self._corrupt(f"{at} stores {len(stored)} bytes, more than its {limit}")
        try:
            raw = decode_chunk(stored, self.filters, mask, self.chunk_nbytes, verify=verify)
        except ValueError as e:
            raise self._corrupt(f"{at}: {e}") from None
        return raw.view(self.file_dtype).reshape(self.chunks)


def flat_boxes(
    shape: tuple[int, ...], start: int, stop: int
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The row-major element range ``[start, stop)`` of an array of ``shape`` as boxes
    ``(lo, hi)``, in order: each box's elements, row-major, are the next ones of the
    range (at most two boxes per axis, and one of whole rows between them)."""
    if start >= stop:
        return []
    if not shape:
        return [((), ())]
    inner = prod(shape[1:])
    r0, o0 = divmod(start, inner)
    r1, o1 = divmod(stop, inner)

    def within(row: int, a: int, b: int):
        return [((row,) + lo, (row + 1,) + hi) for lo, hi in flat_boxes(shape[1:], a, b)]

    if r0 == r1:
        return within(r0, o0, o1)
    out = []
    if o0:
        out += within(r0, o0, inner)
        r0 += 1
    if r1 > r0:
        out.append(((r0,) + (0,) * (len(shape) - 1), (r1,) + tuple(shape[1:])))
    if o1:
        out += within(r1, 0, o1)
    return out
