"""Writing a checkpoint: tensors into data files, and the index entries that find them.

:class:`ShardWriter` turns one data file into index entries, as TensorFlow's
``BundleWriter`` does (whole tensors, raw bytes, slices of partitioned tensors,
chunk by chunk streams, string tensors as lengths then bytes). :class:`BundleWriter`
spreads tensors over several shards and commits them (:mod:`tfckpt.io.commit`);
:func:`save` writes a dict. Byte layouts come from :mod:`tfckpt.format`.

Beside it: :mod:`~tfckpt.checkpoint.entries` (the index entries being built, the checks
on names and slices) and :mod:`~tfckpt.checkpoint.streams` (a tensor written chunk by
chunk).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from tfckpt.checkpoint.entries import IndexEntries
from tfckpt.checkpoint.streams import StringStream, TensorStream, data_bytes, holds
from tfckpt.errors import CheckpointError, CheckpointWriteError, option
from tfckpt.format import dtypes as _dt
from tfckpt.format.bundle import VARIANT
from tfckpt.format.dtypes import Endianness
from tfckpt.format.entryrows import EntryRows
from tfckpt.format.framing import (
    StringFraming,
    VariantFraming,
    as_string_array,
    encode_strings,
    string_tensor_nbytes,
)
from tfckpt.format.orderedcode import encode_name
from tfckpt.format.slices import (
    Extent,
    Slice,
    format_slice,
    is_full_slice,
    num_elements,
    shape_tuple,
    slice_shape,
)
from tfckpt.format.table import crc32c
from tfckpt.io import paths
from tfckpt.io.commit import commit, discard
from tfckpt.io.storage import Storage, StorageOptions, normalize, storage_for
from tfckpt.io.temporaries import remove_stale_temporaries, temporary_base

_WRITEBACK_STEP = 32 << 20


def _infer_dtype(value, dtype) -> _dt.DType:
    if dtype is not None:
        return _dt.lookup(dtype)
    if isinstance(value, (bytes, str)):
        return _dt.STRING
    arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    if arr.dtype == object:
        return _dt.STRING
    return _dt.lookup(arr.dtype)


def _as_array(value, dt: _dt.DType) -> np.ndarray:
    return as_string_array(value) if dt is _dt.STRING else np.asarray(value, dtype=dt.numpy)


def _extents(extents: Sequence[Extent]) -> Slice:
    return tuple((int(s), None if n is None else int(n)) for s, n in extents)


class _Adder:
    """The ways to add a tensor, shared by :class:`ShardWriter` and :class:`BundleWriter`.

    Each refuses what it must before any byte is written, then asks ``_target`` for
    the shard that the tensor's bytes go to (``shard=`` picks one of a
    :class:`BundleWriter`).
    """

    index: IndexEntries
    endianness: Endianness

    def _target(self, nbytes: int, shard: int | None) -> ShardWriter:
        raise NotImplementedError

    def add(self, name: str, value, dtype=None, *, shard: int | None = None) -> None:
        """Add a whole tensor. ``dtype`` (a TensorFlow name) overrides the inferred one."""
        key = encode_name(name)
        self.index.check_open(key, name)
        dt = _infer_dtype(value, dtype)
        if dt is not _dt.STRING and dt.numpy is None:
            raise ValueError(f"{dt.name} tensors can only be added as raw bytes (add_raw)")
        arr = _as_array(value, dt)
        self._target(_nbytes(arr, dt), shard)._add(key, dt, arr)

    def add_raw(
        self,
        name: str,
        dtype,
        shape,
        data,
        *,
        extents: Slice | None = None,
        full_shape=None,
        shard: int | None = None,
    ) -> None:
        """Add a tensor (or a slice, with ``extents`` and ``full_shape``) from its on-disk bytes.

        The bytes are written as they are and must already be in this writer's
        byte order; this is how dtypes without a numpy form (variant, resource)
        are carried through.
        """
        dt = _dt.lookup(dtype)
        shape = shape_tuple(shape)
        data = memoryview(data).cast("B")
        if dt.itemsize is not None and len(data) != num_elements(shape) * dt.itemsize:
            raise ValueError(f"{len(data)} bytes do not hold {list(shape)} of {dt.name}")
        if extents is not None:
            extents = tuple(extents)
            key = self.index.slice_key(name, dt, full_shape, extents, shape)
        else:
            key = encode_name(name)
        self.index.check_open(key, name)
        if dt is _dt.STRING:
            crc = StringFraming(data.tobytes(), num_elements(shape), self.endianness).crc
        elif dt is VARIANT:
            framing = VariantFraming(data.tobytes(), num_elements(shape), self.endianness)
            if framing.bad_element is not None:
                raise ValueError(
                    f"variant element {framing.bad_element[0]} of {name!r} has a wrong checksum"
                )
            crc = framing.crc
        else:
            crc = crc32c(data)
        self._target(len(data), shard)._add_bytes(key, dt, shape, data, crc)
        if extents is not None:
            self.index.register_slice(name, dt, full_shape, extents)

    def add_slice(
        self,
        name: str,
        full_shape,
        extents: Sequence[Extent],
        value,
        dtype=None,
        *,
        shard: int | None = None,
    ) -> None:
        """Add one slice of a partitioned tensor.

        ``extents`` has one ``(start, length)`` per axis; a length of None takes
        the whole axis. The slices of a tensor must not overlap; they may leave parts
        of it out (a pre-sliced tensor, which TensorFlow restores slice by slice).
        """
        full_shape = shape_tuple(full_shape)
        extents = _extents(extents)
        dt = _infer_dtype(value, dtype)
        if is_full_slice(full_shape, extents):
            return self.add(name, value, dt.name, shard=shard)
        shape = slice_shape(full_shape, extents)
        arr = _as_array(value, dt)
        if arr.shape != shape:
            raise ValueError(
                f"slice {format_slice(extents)} of {list(full_shape)} has shape "
                f"{list(shape)}, value has {list(arr.shape)}"
            )
        key = self.index.slice_key(name, dt, full_shape, extents, shape)
        self.index.check_open(key, name)
        if dt is not _dt.STRING and dt.numpy is None:
            raise ValueError(f"{dt.name} tensors can only be added as raw bytes (add_raw)")
        self._target(_nbytes(arr, dt), shard)._add(key, dt, arr)
        self.index.register_slice(name, dt, full_shape, extents)

    def stream(self, name: str, dtype, shape, *, shard: int | None = None) -> TensorStream:
        """Add a tensor chunk by chunk: ``with w.stream(...) as s: s.write(chunk)``.

        A ``string`` tensor is streamed as its format lays it out instead: every
        element's length (``s.write_lengths``), then the elements' bytes, cut
        anywhere (``s.write_data``), as :meth:`Checkpoint.iter_string_parts` yields them.
        """
        key = encode_name(name)
        self.index.check_open(key, name)
        dt = _dt.lookup(dtype)
        if dt.spec is None and dt is not _dt.STRING:  # spec: numpy would import ml-dtypes
            raise ValueError(f"{dt.name} tensors cannot be streamed")
        shape = shape_tuple(shape)
        return self._target(_stream_bytes(dt, shape), shard)._stream(key, dt, shape)

    def stream_slice(
        self, name: str, dtype, full_shape, extents: Sequence[Extent], *, shard: int | None = None
    ) -> TensorStream:
        """Like :meth:`stream`, for one slice of a partitioned tensor."""
        dt = _dt.lookup(dtype)
        full_shape = shape_tuple(full_shape)
        extents = _extents(extents)
        shape = slice_shape(full_shape, extents)
        key = self.index.slice_key(name, dt, full_shape, extents, shape)
        self.index.check_open(key, name)
        if dt.spec is None and dt is not _dt.STRING:  # spec: numpy would import ml-dtypes
            raise ValueError(f"{dt.name} tensors cannot be streamed")
        return self._target(_stream_bytes(dt, shape), shard)._stream(
            key, dt, shape, lambda: self.index.register_slice(name, dt, full_shape, extents)
        )


def _nbytes(arr: np.ndarray, dt: _dt.DType) -> int:
    """The bytes a tensor takes in a data file."""
    return string_tensor_nbytes(arr) if dt is _dt.STRING else arr.size * dt.fixed_itemsize


def _stream_bytes(dt: _dt.DType, shape: tuple[int, ...]) -> int:
    return 0 if dt is _dt.STRING else num_elements(shape) * dt.fixed_itemsize  # strings: unknown


class ShardWriter(_Adder):
    """Writes tensors into one data file at ``path`` on ``store`` and builds
    their index entries: :meth:`finish` returns them, for :func:`~tfckpt.io.commit.merge_entries`
    and :func:`~tfckpt.io.commit.commit_shards`.

    Within a :class:`BundleWriter`, the shards share one ``index`` (their entries,
    ``shard_id`` set) and a failed stream aborts the whole checkpoint (``on_abort``).
    Without ``exclusive``, an existing file is rewritten from the start: a shard task
    may run twice (a cluster recomputing a result lost with its worker).
    """

    def __init__(
        self,
        store: Storage,
        path: str,
        *,
        endianness: Endianness = "little",
        durable: bool = True,
        exclusive: bool = False,
        shard_id: int = 0,
        index: IndexEntries | None = None,
        on_abort: Callable[[], None] | None = None,
    ):
        if endianness not in ("little", "big"):
            raise ValueError("endianness must be 'little' or 'big'")
        self.path = path
        self.endianness = endianness
        self.durable = durable
        self.shard_id = shard_id
        self.index = index if index is not None else IndexEntries()
        self.size = 0
        self.storage = store
        self._flushed = 0  # bytes handed to the disk so far
        self._on_abort = on_abort
        self._file = self.storage.open_writer(path, exclusive=exclusive)

    @classmethod
    def create(
        cls, store: Storage, path: str, *, endianness: Endianness = "little", durable: bool = True
    ) -> ShardWriter:
        """A writer of one data shard at ``path`` on ``store`` on its own, its directory
        made if missing.

        Used by tasks that each write one shard of a checkpoint; :meth:`finish`
        returns the index entries, which :func:`~tfckpt.io.commit.commit_shards` commits.
        """
        try:
            store.makedirs(store.dirname(path))
            return cls(store, path, endianness=endianness, durable=durable)
        except OSError as e:
            raise CheckpointWriteError(
                f"cannot create data file: {e.strerror or e}", path=path
            ) from None

    def add_arrays(self, tensors: Sequence[tuple[str, str, tuple[int, ...], np.ndarray]]) -> None:
        """Add whole tensors ``(name, dtype, shape, values)``, back to back.

        The same bytes and entries as a :meth:`stream` and one ``write`` each,
        without setting a stream up per tensor: for runs of many small tensors.

        >>> w.add_arrays([("b0", "float16", (4,), np.zeros(4, np.float16))])
        """
        dtypes: dict[str, _dt.DType] = {}  # a handful of names for any number of tensors
        for name, dtype, shape, values in tensors:
            key = encode_name(name)
            self.index.check_open(key, name)
            dt = dtypes.get(dtype) or dtypes.setdefault(dtype, _dt.lookup(dtype))
            shape = shape_tuple(shape)
            if not holds(values, dt) or values.size != num_elements(shape):
                raise ValueError(
                    f"{values.size} values of {values.dtype} for a {dt.name} tensor of shape "
                    f"{list(shape)}"
                )
            data = data_bytes(values, dt, self.endianness)
            offset = self.size
            self._write(data)
            self.record(key, dt, shape, offset, data.nbytes, crc32c(data))

    # -- the data file

    def _write(self, data) -> None:
        try:
            self._file.write(data)
            self.size += len(memoryview(data).cast("B"))
            # Let the disk work while we compute: the final fsync has little left.
            if (
                self.durable
                and self.size - self._flushed >= _WRITEBACK_STEP
                and self.storage.writeback(self._file, self._flushed, self.size - self._flushed)
            ):
                self._flushed = self.size
        except OSError as e:
            raise CheckpointWriteError(f"write failed: {e.strerror}", path=self.path) from None

    def append(self, data) -> None:
        """Append bytes to the data file with no index entry: a stream's writes, which
        :meth:`record` enters when it is closed."""
        self._write(data)

    def close(self) -> None:
        """Flush and close the data file (fsync'ed when durable)."""
        if self._file is None:
            return
        self._file.flush()
        if self.durable:
            self.storage.fsync(self._file)
        self._file.close()
        self._file = None

    def discard(self) -> None:
        """Close without keeping anything, and remove the file."""
        file, self._file = self._file, None
        try:
            if hasattr(file, "discard"):
                file.discard()  # an upload: closing it would store a part
            elif file is not None:
                file.close()
        except (OSError, CheckpointError):
            pass
        discard(self.storage, [self.path])

    def finish(self) -> EntryRows:
        """Close the data file; the index entries of what it holds."""
        if self.index.streaming:
            self.abort()
            raise ValueError("a tensor stream was not closed")
        try:
            self.close()
        except OSError as e:
            self.abort()
            raise CheckpointWriteError(f"write failed: {e.strerror or e}", path=self.path) from None
        self.index.done = True
        return self.index.entries

    def abort(self) -> None:
        """Discard what was written (with ``on_abort``: the whole checkpoint)."""
        if self._on_abort is not None:
            self._on_abort()
            return
        self.index.done = True
        self.discard()

    # -- what the adding methods (:class:`_Adder`) write with

    def _target(self, nbytes: int, shard: int | None) -> ShardWriter:
        if shard not in (None, self.shard_id):
            raise ValueError(f"this writer writes shard {self.shard_id} only, not {shard}")
        return self

    def record(
        self, key: bytes, dtype: _dt.DType, shape: tuple[int, ...], offset: int, size: int, crc: int
    ) -> None:
        """Enter a tensor whose ``size`` bytes lie at ``offset`` (as a stream does when closed)."""
        self.index.entries.add(key, dtype.enum, shape, self.shard_id, offset, size, crc)

    def _add_bytes(
        self, key: bytes, dtype: _dt.DType, shape: tuple[int, ...], data, crc: int
    ) -> None:
        offset = self.size
        self._write(data)
        self.record(key, dtype, shape, offset, len(data), crc)

    def _add(self, key: bytes, dt: _dt.DType, arr: np.ndarray) -> None:
        if dt is _dt.STRING:
            data, crc = encode_strings(arr, self.endianness)
            self._add_bytes(key, dt, arr.shape, data, crc)
            return
        with self._stream(key, dt, arr.shape) as s:
            s.write(arr)

    def _stream(
        self,
        key: bytes,
        dt: _dt.DType,
        shape: tuple[int, ...],
        on_close: Callable[[], None] | None = None,
    ) -> TensorStream:
        self.index.streaming = True
        if dt is _dt.STRING:  # its size is known only at the end
            return StringStream(self, key, shape, on_close)
        return TensorStream(self, key, dt, shape, num_elements(shape) * dt.fixed_itemsize, on_close)


class BundleWriter(_Adder):
    """Writes a checkpoint under ``prefix``, streaming, committed atomically.

    Each shard is a :class:`ShardWriter` over a temporary file; they share ``index``.

    Tensors are written to temporary data files as they are added; on
    :meth:`finish` (or leaving the ``with`` block cleanly) the data files are
    renamed into place and the index is written last, so no reader ever sees a
    partial checkpoint. On an exception everything written is removed.

    With ``durable`` (the default) every file is fsync'ed before the index is
    renamed into place, so the checkpoint also survives a power cut; without it,
    a killed process still never leaves a partial checkpoint, but the operating
    system's crash may.

    Tensors go to the current shard, and a new shard is started when
    ``max_shard_bytes`` would be exceeded; passing ``shard=`` places a tensor in a
    given shard instead (to keep a source checkpoint's layout).

    ``prefix`` may be an fsspec URL; ``storage_options`` (endpoint, credentials...) go to
    fsspec with it, and the writer keeps the storage made with them (``storage``) until
    it is finished.

    >>> with BundleWriter("out/model") as w:
    ...     w.add("dense/kernel", np.ones((3, 4), np.float16))
    """

    def __init__(
        self,
        prefix,
        *,
        max_shard_bytes: int | None = None,
        overwrite: bool = False,
        endianness: Endianness = "little",
        durable: bool = True,
        storage_options: StorageOptions | None = None,
    ):
        if max_shard_bytes is not None and max_shard_bytes <= 0:
            raise ValueError("max_shard_bytes must be positive")
        if endianness not in ("little", "big"):
            raise ValueError("endianness must be 'little' or 'big'")
        self.prefix = normalize(prefix)
        self.max_shard_bytes = max_shard_bytes
        self.overwrite = overwrite
        self.endianness = endianness
        self.durable = durable
        self.storage = storage_for(self.prefix, storage_options)
        self.storage.check_writable(self.prefix)
        self.index = IndexEntries()
        self._tmp_base = temporary_base(self.prefix)
        self._shards: list[ShardWriter] = []
        self._created_dirs: list[str] = []
        self._current = 0
        remove_stale_temporaries(self.storage, self.prefix)
        index = paths.index_filename(self.prefix)
        if self.storage.isfile(index) and not overwrite:
            raise CheckpointWriteError(
                f"a checkpoint already exists here (use {option('overwrite=True', '--overwrite')} "
                "to replace it)",
                path=index,
            )
        try:
            self._created_dirs = self.storage.makedirs(self.storage.dirname(self.prefix))
            self._shard(0)
        except OSError as e:
            self.abort()
            raise CheckpointWriteError(
                f"cannot create data file: {e.strerror}", path=self._tmp_base
            ) from None

    # -- shards

    def _shard(self, shard_id: int) -> ShardWriter:
        while len(self._shards) <= shard_id:
            self._shards.append(
                ShardWriter(
                    self.storage,
                    f"{self._tmp_base}.data-{len(self._shards)}",
                    endianness=self.endianness,
                    durable=self.durable,
                    exclusive=True,
                    shard_id=len(self._shards),
                    index=self.index,
                    on_abort=self.abort,
                )
            )
        return self._shards[shard_id]

    def _target(self, nbytes: int, shard: int | None) -> ShardWriter:
        """The shard that the next ``nbytes`` go to."""
        if shard is not None:
            if shard < 0:
                raise ValueError(f"negative shard id {shard}")
            try:
                return self._shard(shard)
            except OSError as e:
                raise CheckpointWriteError(
                    f"cannot create data file: {e.strerror}", path=self._tmp_base
                ) from None
        current = self._shards[self._current]
        if (
            self.max_shard_bytes is not None
            and current.size > 0
            and current.size + nbytes > self.max_shard_bytes
        ):
            self._current = len(self._shards)
            return self._target(nbytes, self._current)
        return current

    def reserve_shards(self, count: int) -> None:
        """Make the output have at least ``count`` shards, even if some stay empty."""
        try:
            if count > 0:
                self._shard(count - 1)
        except OSError as e:
            raise CheckpointWriteError(
                f"cannot create data file: {e.strerror}", path=self._tmp_base
            ) from None

    # -- commit

    def __enter__(self) -> BundleWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.abort()

    def abort(self) -> None:
        """Discard everything written; nothing is left at the destination."""
        self.index.done = True
        for shard in self._shards:
            shard.discard()
        discard(self.storage, [f"{self._tmp_base}.index"])
        self.storage.remove_dirs(self._created_dirs)  # only those still empty

    def finish(self) -> str:
        """Write the index and move everything into place; returns the prefix."""
        if self.index.done:
            raise ValueError("the writer is finished")
        if self.index.streaming:
            self.abort()
            raise ValueError("a tensor stream was not closed")
        try:
            try:
                for shard in self._shards:
                    shard.close()
            except OSError as e:
                raise CheckpointWriteError(
                    f"write failed: {e.strerror or e}", path=self.prefix
                ) from None
            commit(
                self.storage,
                self.prefix,
                [s.path for s in self._shards],
                self.index.entries,
                base=self._tmp_base,
                endianness=self.endianness,
                durable=self.durable,
                overwrite=self.overwrite,
            )
        except BaseException:
            self.abort()
            raise
        self.index.done = True
        return self.prefix


def save(
    tensors: Mapping[str, object],
    prefix,
    *,
    max_shard_bytes: int | None = None,
    overwrite: bool = False,
    endianness: Endianness = "little",
    durable: bool = True,
    storage_options: StorageOptions | None = None,
) -> str:
    """Write ``{name: array}`` as a checkpoint that TensorFlow reads bit-for-bit.

    Arrays of numeric dtypes keep their dtype; object arrays of ``bytes`` (or
    ``bytes``/``str`` values) become string tensors. Tensors are written in
    name order, so the same input always gives the same bytes. ``prefix`` may be an
    fsspec URL, opened with ``storage_options`` (as for :class:`BundleWriter`).

    >>> tfckpt.save({"w": np.zeros((2, 3), np.float16)}, "out/model")
    'out/model'
    """
    with BundleWriter(
        prefix,
        max_shard_bytes=max_shard_bytes,
        overwrite=overwrite,
        endianness=endianness,
        durable=durable,
        storage_options=storage_options,
    ) as w:
        for name in sorted(tensors, key=encode_name):
            w.add(name, tensors[name])
    return w.prefix
