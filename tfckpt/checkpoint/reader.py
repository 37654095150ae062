"""Reading a checkpoint: :class:`Checkpoint`, a read-only mapping of tensor names to arrays.

The class is the public face; its parts live beside it, one concept each:
:mod:`~tfckpt.checkpoint.index` (the index: header, names, entries and their checks,
``TensorInfo`` / ``TensorTable``), :mod:`~tfckpt.checkpoint.shards` (data shards,
positioned reads, checksums, whole values) and :mod:`~tfckpt.checkpoint.streaming`
(chunks, runs of small tensors, string pieces). Here: opening, the mapping, metadata,
and the reads of a tensor's value, bytes, slices and regions.
"""

from __future__ import annotations

import collections.abc
from collections.abc import Iterator, Sequence

import numpy as np

from tfckpt.checkpoint.index import BundleIndex, Entry
from tfckpt.checkpoint.slicing import (
    Region,
    TensorSlice,
    assemble_region,
    region_counts,
    region_index,
)
from tfckpt.checkpoint.streaming import DEFAULT_CHUNK_BYTES, StreamingReads
from tfckpt.errors import CheckpointNotFoundError, UnsupportedCheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.format.bundle import VARIANT, TensorInfo, TensorTable
from tfckpt.format.framing import VariantFraming
from tfckpt.format.slices import Slice, num_elements, slice_shape
from tfckpt.io import paths
from tfckpt.io.storage import Storage, StorageOptions, normalize, storage_for

# Rows of a lazy slice closer than this are read as one range: a gap costs less to read
# than another request (an object store's latency is worth far more than this).
COALESCE_BYTES = 256 << 10


class Checkpoint(StreamingReads, collections.abc.Mapping):
    """A checkpoint opened for reading; see :func:`tfckpt.open`.

    Acts as a read-only mapping from tensor name to numpy array. Only the index
    is read when opening; tensor bytes are read on demand with positioned reads.
    With ``mmap`` (the default), whole fixed-size tensors of a local checkpoint
    are read-only views of the mapped file instead: zero-copy, but such an array
    dies with SIGBUS when touched after the file was truncated. Everything else
    (chunks, strings, raw bytes) is always read into memory of its own.

    ``get``, ``items`` and ``values`` come with the mapping (each value read on
    demand); two checkpoints are equal only when they are the same object.

    >>> with Checkpoint("train/model.ckpt-7") as ckpt:
    ...     sizes = {name: info.nbytes for name in ckpt for info in [ckpt.info(name)]}
    """

    __eq__ = object.__eq__  # not the mapping's: comparing would read every tensor
    __hash__ = object.__hash__

    format = "bundle v2"
    # Keras's own list of layers and their weights' tensors, in the order Keras pairs them
    # with a model's layers: a Keras HDF5 file has one (see tfckpt.checkpoint.hdf5).
    keras_layers: list[tuple[str, list[str]]] | None = None

    def __init__(
        self,
        path,
        *,
        verify: bool = True,
        mmap: bool = True,
        storage_options: StorageOptions | None = None,
        storage: Storage | None = None,
        resolved: str | None = None,
    ):
        # ``storage``: where ``path`` is (else made from ``storage_options``); ``resolved``:
        # the prefix :func:`~tfckpt.checkpoint.opening.open_checkpoint` found for ``path``
        # already (on object stores each look is a request).
        self.storage = storage or storage_for(normalize(path), storage_options)
        self.prefix = resolved or paths.find_prefix(self.storage, path)
        self.verify = verify
        self.mmap = mmap
        self.index_path = paths.index_filename(self.prefix)
        self._readers = {}
        try:
            data = self.storage.read_bytes(self.index_path)
        except OSError as e:
            raise CheckpointNotFoundError(
                f"cannot read index: {e.strerror or e}", path=self.index_path
            ) from None
        self._index = BundleIndex(data, self.index_path, self.prefix)
        self.header = self._index.header
        # The names in TensorFlow's order (V1Checkpoint sets its own), and the keys of
        # partitioned tensors' slices, which TensorFlow leaves out of its listing.
        self._names = self._index.names
        self._slice_keys = self._index.slice_keys

    # -- mapping interface

    def keys(self) -> list[str]:  # type: ignore[override]  # a list, as TensorFlow lists
        """Full tensor names, sorted as ``tf.train.list_variables`` lists them."""
        return list(self._names)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name) -> bool:
        return self._index.contains(name)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.read(name)

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<tfckpt.Checkpoint {self.prefix!r}: {len(self)} tensors>"

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- metadata

    def info(self, name: str) -> TensorInfo:
        """Dtype, shape, size and location of tensor ``name``."""
        return self._index.info(self._index.full_entry(name))

    def table(self, names: Sequence[str] | None = None) -> TensorTable:
        """:meth:`info` of every tensor (or of ``names``), as columns: one pass in bulk.

        Entries in the common encoding of a whole tensor are decoded and checked all
        at once; the others (partitioned tensors, unusual or broken entries) one by
        one, as :meth:`info` does, with the same errors.
        """
        return self._index.table(names)

    def slice_info(self, name: str) -> list[TensorInfo]:
        """One :class:`TensorInfo` per stored slice of a partitioned tensor (else empty).

        Slices may leave parts of the tensor out (a pre-sliced tensor), but
        overlapping slices are corrupt.
        """
        return self._index.slice_info(name)

    def orphan_slice_keys(self) -> list[bytes]:
        """Slice entries that no partitioned tensor lists (left by a broken writer).

        TensorFlow lists them as tensors (and so does :meth:`keys`). A key counts
        as an orphan when it is exactly a slice key of a partitioned tensor of this
        checkpoint; any other name, even one shaped like the slice key of a tensor
        the checkpoint does not hold, is a name TensorFlow saves and reads as such.
        """
        return self._index.orphan_slice_keys()

    @property
    def tf_path(self) -> str:
        """The path TensorFlow's readers (``tf.train.load_checkpoint``, ``RestoreV2``) open
        this checkpoint by: a bundle's prefix."""
        return self.prefix

    @property
    def stem(self) -> str:
        """The name a rewrite's output takes in a directory given as its destination."""
        return self.storage.basename(self.prefix)

    # -- values

    def read(self, name: str) -> np.ndarray:
        """The value of tensor ``name`` as TensorFlow's reader returns it."""
        entry = self._index.full_entry(name)
        if entry.slices:
            return self._assemble(entry)
        return self._decode(entry)

    def read_bytes(self, name: str, extents: Slice | None = None) -> bytes:
        """The on-disk bytes of tensor ``name`` (or of one of its slices), checksum verified."""
        entry = self._index.stored_entry(name, extents)
        data = self._read_entry_bytes(entry).tobytes()
        if entry.dtype is _dt.STRING:
            self._check_string_bytes(entry, data)
        elif entry.dtype is VARIANT:
            self._check_variant_bytes(entry, data)
        return data

    def variant_elements(self, name: str, extents: Slice | None = None) -> list[bytes]:
        """The serialized ``VariantTensorDataProto`` of each element of a variant tensor."""
        entry = self._index.full_entry(name)
        if entry.dtype is not VARIANT:
            raise UnsupportedCheckpointError(
                f"a {entry.dtype.name} tensor, not a variant", path=self.prefix, tensor=name
            )
        data = self.read_bytes(name, extents)
        shape = entry.shape if extents is None else slice_shape(entry.shape, tuple(extents))
        framing = VariantFraming(data, num_elements(shape), self.header.endianness)
        if not framing.elements:  # no bytes at all: default (empty) elements
            return [b""] * num_elements(shape)
        return [data[pos : pos + n] for pos, n in framing.elements]

    def read_elements(
        self, name: str, start: int, count: int, extents: Slice | None = None
    ) -> np.ndarray:
        """Elements ``[start, start + count)`` (row-major) of a whole, fixed-size tensor,
        or with ``extents`` of one stored slice of a partitioned one.

        For reading a tensor in tiles; no checksum covers a part of a tensor, so
        callers verify it once with :meth:`iter_chunks`.
        """
        entry = self._index.stored_entry(name, extents)
        itemsize = entry.dtype.fixed_itemsize
        if start < 0 or count < 0 or (start + count) * itemsize > entry.proto.size:
            raise ValueError(f"elements [{start}, {start + count}) lie outside {name!r}")
        reader = self._check_extent(entry)
        buf = np.empty(count * itemsize, dtype=np.uint8)
        self._pread_into(reader, buf.data, entry.proto.offset + start * itemsize, entry)
        return self._to_array(buf, entry.dtype, (count,))

    def read_slice(self, name: str, extents: Slice) -> np.ndarray:
        """The value of one stored slice of a partitioned tensor."""
        return self._decode(self._index.slice_entry(self._index.full_entry(name), tuple(extents)))

    def get_slice(self, name: str) -> TensorSlice:
        """Tensor ``name`` as a :class:`~tfckpt.checkpoint.slicing.TensorSlice`: ``shape`` and
        ``dtype`` without reading; indexing it reads only the bytes that cover the
        request (not checksummed unless the request is the whole tensor).

        >>> ckpt.get_slice("emb")[0:10, ::2]
        """
        return TensorSlice(self, name)

    def read_region(self, name: str, region: Region) -> np.ndarray:
        """A region of tensor ``name`` (see :mod:`tfckpt.checkpoint.slicing`): of a partitioned
        tensor, only the slices it meets are read."""
        entry = self._index.full_entry(name)
        if not entry.slices:
            return self._read_entry_region(entry, region)
        self._index.check_disjoint(entry)
        return assemble_region(
            entry.shape,
            entry.dtype,
            entry.slices,
            region,
            lambda extents, local: self._read_entry_region(
                self._index.slice_entry(entry, extents), local
            ),
            path=self.prefix,
            tensor=name,
        )

    def _read_entry_region(self, entry: Entry, region: Region) -> np.ndarray:
        """A region of one stored entry. Each run of rows (axis 0) is one byte range,
        from the region's first element in the run's first row to its last one in the
        last row; rows whose spans lie further apart than :data:`COALESCE_BYTES` are
        runs of their own, and a run holds at most about a chunk."""
        dtype, shape, counts = entry.dtype, entry.shape, region_counts(region)
        if dtype is _dt.STRING or not shape:
            return self._decode(entry)[region_index(region)]
        if dtype.numpy is None:
            return self._decode(entry)  # raises: no numpy form
        out = np.empty(counts, dtype=dtype.numpy)
        if not out.size:
            return out
        reader = self._check_extent(entry)
        itemsize, row = dtype.fixed_itemsize, num_elements(shape[1:])
        inner = region_index(region[1:])
        # The region's first and last element within a row, as flat offsets in the row.
        first = last = 0
        if inner:
            first = int(np.ravel_multi_index([s for s, _, _ in region[1:]], shape[1:]))
            ends = [s + (c - 1) * st for s, c, st in region[1:]]
            last = int(np.ravel_multi_index(ends, shape[1:]))
        start, count, step = region[0]
        # Between two rows' spans lies a gap: read through it when it is small, but
        # never hold more than a chunk of rows at once.
        gap = (step * row - (last - first + 1)) * itemsize
        per_run = (
            1 if gap > COALESCE_BYTES else max(1, DEFAULT_CHUNK_BYTES // (step * row * itemsize))
        )
        for k0 in range(0, count, per_run):
            k1 = min(count, k0 + per_run)
            r0, r1 = start + k0 * step, start + (k1 - 1) * step + 1
            base = r0 * row * itemsize
            lo, hi = (r0 * row + first) * itemsize, ((r1 - 1) * row + last + 1) * itemsize
            buf = np.empty((r1 - r0) * row * itemsize, dtype=np.uint8)
            at = entry.proto.offset + lo
            self._pread_into(reader, buf.data[lo - base : hi - base], at, entry)
            rows = self._to_array(buf, dtype, (r1 - r0,) + shape[1:])
            out[k0:k1] = rows[(slice(None, None, step),) + inner]
        return out
