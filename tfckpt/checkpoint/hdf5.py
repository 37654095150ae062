"""Keras HDF5 weights (``model.h5``, Hugging Face's ``tf_model.h5``) read through the
:class:`~tfckpt.checkpoint.reader.Checkpoint` API: :class:`HDF5Checkpoint`.

Which datasets hold which weights is :mod:`~tfckpt.checkpoint.kerash5`; how one
dataset's values are checked and read in bounded pieces is
:mod:`~tfckpt.checkpoint.h5datasets`. The file is read through the storage it is on
(h5py is handed a file object over it), so a URL reads as a local path does.

Tensors are named as Keras names the weights, without the ``:0`` TensorFlow appends
(``dense/kernel:0`` is ``dense/kernel``). A weight several layers list (a layer they
share) is one tensor, read from the first layer listing it; reading it with ``verify``
checks that every copy holds the same bytes. Weights of one name but another shape or
dtype are different weights: each is named after its layer too (``layer/dense/kernel``).
The optimizer's state of a whole-model file is a group of its own:
``model.h5/optimizer_weights`` opens it; any group's path inside the file opens that
group the same way.

Hugging Face's sharded TF weights (``tf_model.h5.index.json`` beside
``tf_model-0000K-of-0000N.h5``) are one :class:`HFShardedCheckpoint`, named as the single
``tf_model.h5`` would be.

>>> with tfckpt.open("tf_model.h5") as ckpt:
...     ckpt.info("tf_bert_model/bert/embeddings/word_embeddings/weight").shape
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence

import h5py
import numpy as np

from tfckpt.checkpoint.h5datasets import Dataset
from tfckpt.checkpoint.kerash5 import Layout, Weight, read_layout, read_shard
from tfckpt.checkpoint.reader import DEFAULT_CHUNK_BYTES, Checkpoint
from tfckpt.checkpoint.slicing import Region, region_counts, region_index
from tfckpt.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    TensorNotFoundError,
    UnsupportedCheckpointError,
)
from tfckpt.format.bundle import NATIVE, Header, TensorInfo, TensorTable, Version
from tfckpt.format.hfindex import (
    INDEX_SUFFIX,
    MAX_INDEX_BYTES,
    ShardIndex,
    dataset_name,
    parse_index,
)
from tfckpt.format.slices import Slice, num_elements
from tfckpt.io.storage import Reader, ReaderFile, Storage, StorageOptions, normalize, storage_for

FORMAT_NAME = "Keras HDF5"
_H5_ERRORS = (OSError, RuntimeError, ValueError, KeyError, TypeError)


class HDF5Checkpoint(Checkpoint):
    """A Keras HDF5 weights file (or a group in one), read through the same API as a bundle.

    Created by :func:`tfckpt.open` for a path to an HDF5 file (``model.h5``) or to a
    group inside one (``model.h5/optimizer_weights``). ``keras_layers`` lists the
    file's layers in order, each with the names of its weights' tensors: what Keras
    pairs with a model's layers when it loads the file (weights a model holds outside
    its layers last, as ``top_level_model_weights``). ``keras_version`` is the writer's.
    """

    format = FORMAT_NAME

    def __init__(
        self,
        path,
        *,
        verify: bool = True,
        mmap: bool = True,
        storage_options: StorageOptions | None = None,
        storage: Storage | None = None,
        resolved: tuple[str, str] | None = None,
    ):
        # ``resolved``: the file and the group path inside it that open_checkpoint found.
        self.storage = storage or storage_for(normalize(path), storage_options)
        if resolved is None:
            raise CheckpointNotFoundError("no HDF5 file found", path=normalize(path))
        self.file, self.group = resolved
        self.prefix = normalize(path)
        self.index_path = self.file
        self.verify = verify
        self.mmap = mmap
        self._readers = {}  # the base class's data shards: none here
        self._h5: h5py.File | None = None
        self.header = Header(1, "little", Version(0, 0))
        self._closed = True
        try:
            self._reader: Reader = self.storage.open_reader(self.file)
        except OSError as e:
            raise CheckpointNotFoundError(
                f"cannot read: {e.strerror or e}", path=self.file
            ) from None
        self._closed = False
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        try:
            self._h5 = h5py.File(ReaderFile(self._reader), "r")
        except _H5_ERRORS as e:
            raise CorruptCheckpointError(f"not a readable HDF5 file: {e}", path=self.file) from None
        try:
            layout = read_layout(self._h5, self.group, self.file)
        except CheckpointError:
            raise
        except _H5_ERRORS as e:  # HDF5's own error while it walks the structure
            raise CorruptCheckpointError(
                f"unreadable HDF5 structure: {e}", path=self.file
            ) from None
        self.keras_version = layout.keras_version
        if layout.keras_version:  # what wrote it, for dump
            self.format = f"{FORMAT_NAME} (Keras {layout.keras_version})"
        self._datasets: dict[str, Dataset] = {}
        self._copies: dict[str, list[Dataset]] = {}
        self.keras_layers = []
        self._name_all(layout)

    def _name_all(self, layout: Layout) -> None:
        """Each weight's tensor name: Keras's, less ``:0``; with its layer's in front when
        another weight of that name has another shape or dtype."""
        # Each layer once (a repeated entry is the same layer again), each dataset once.
        distinct = dict(layout.layers)
        by_name: dict[str, dict[str, Weight]] = {}
        for weights in distinct.values():
            for w in weights:
                by_name.setdefault(_plain(w.name), {}).setdefault(w.path, w)
        opened: dict[str, Dataset] = {}  # dataset path -> its Dataset
        plain_of: dict[str, str] = {}  # tensor name -> the weight name it stands for
        tensor_of: dict[str, str] = {}  # dataset path -> tensor name
        for plain, listed in by_name.items():
            weights = list(listed.values())
            found = [opened.get(w.path) or self._checked(w, plain) for w in weights]
            opened.update((w.path, d) for w, d in zip(weights, found))
            shared = len({(d.dtype.name, d.shape) for d in found}) == 1
            for w, d in zip(weights, found):
                name = plain if shared else f"{w.layer}/{plain}".lstrip("/")
                first = self._datasets.get(name)
                if first is None:
                    d.tensor = name
                    self._datasets[name] = d
                    plain_of[name] = plain
                elif first is not d:
                    if not shared or plain_of[name] != plain:
                        raise UnsupportedCheckpointError(
                            f"datasets {first.where} and {d.where} would both be named "
                            f"{name!r}: open each layer's group apart ({self.file}/LAYER)",
                            path=self.file,
                        )
                    self._copies.setdefault(name, []).append(d)
                tensor_of[w.path] = name
        named = {name: (name, [tensor_of[w.path] for w in ws]) for name, ws in distinct.items()}
        self.keras_layers = [named[name] for name, _ in layout.layers]
        # In the order the layers list them, each once.
        self._names = list(dict.fromkeys(t for _, ts in named.values() for t in ts))

    def _checked(self, w: Weight, name: str) -> Dataset:
        try:
            return Dataset(w.dataset, w.path, self.file, self._reader, name)
        except CheckpointError:
            raise
        except _H5_ERRORS as e:
            raise CorruptCheckpointError(
                f"dataset {w.path}: unreadable: {e}", path=self.file, tensor=name
            ) from None

    def __repr__(self) -> str:
        return f"<tfckpt.Checkpoint {self.prefix!r} (Keras HDF5): {len(self)} tensors>"

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and name in self._datasets

    @property
    def stem(self) -> str:
        """The file's name without its extension: an output directory's checkpoint name."""
        base = self.storage.basename(self.file)
        return base.rsplit(".", 1)[0] if "." in base.lstrip(".") else base

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        h5, self._h5 = self._h5, None
        if h5 is not None:
            try:
                h5.close()
            except _H5_ERRORS:
                pass
        self._reader.close()

    # -- metadata

    def _dataset(self, name: str) -> Dataset:
        d = self._datasets.get(name) if isinstance(name, str) else None
        if d is None:
            raise TensorNotFoundError(
                f"no tensor {name!r} in checkpoint", path=self.prefix, tensor=name
            )
        if self._closed:
            raise CheckpointError("the checkpoint is closed", path=self.file, tensor=name)
        return d

    def info(self, name: str) -> TensorInfo:
        d = self._dataset(name)
        return TensorInfo(
            name,
            d.dtype.name,
            d.shape,
            d.size * d.dtype.fixed_itemsize,
            0,
            d.offset,
            None,
            stored_elements=d.size,
        )

    def table(self, names: Sequence[str] | None = None) -> TensorTable:
        return TensorTable.of([self.info(n) for n in (self.keys() if names is None else names)])

    def dataset_path(self, name: str) -> str:
        """The HDF5 path of the dataset tensor ``name`` is read from."""
        return self._dataset(name).where

    def slice_info(self, name: str) -> list[TensorInfo]:
        self._dataset(name)
        return []

    def orphan_slice_keys(self) -> list[bytes]:
        return []

    @property
    def tf_path(self) -> str:
        return self.file

    @property
    def data_files(self) -> list[str]:
        return []

    def check_shard_files(self, shard_ids) -> None:
        pass  # one file, open

    # -- values

    def _native(self, d: Dataset, raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """Raw bytes of ``d`` (its file byte order) as an array of its dtype, native order."""
        if d.dtype.kind == "bool" and raw.size and int(raw.max()) > 1:
            raise CorruptCheckpointError(
                f"dataset {d.where}: bool values other than 0 and 1",
                path=d.path,
                tensor=d.tensor,
            )
        order = d.file_dtype.byteorder
        if order in "<>" and order != ("<" if NATIVE == "little" else ">"):
            if not raw.flags.writeable:
                raw = raw.copy()
            unit = d.dtype.swap_unit
            raw.view(np.dtype(f"u{unit}")).byteswap(inplace=True)
        return raw.view(d.dtype.array_dtype).reshape(shape)

    def _raw(self, d: Dataset, start: int, count: int, buf: np.ndarray | None = None):
        out = np.empty(count * d.itemsize, np.uint8) if buf is None else buf
        try:
            d.read_flat(start, count, out, self.verify)
        except CheckpointError:
            raise
        except _H5_ERRORS as e:
            raise CorruptCheckpointError(
                f"dataset {d.where}: read failed: {e}", path=d.path, tensor=d.tensor
            ) from None
        if self.verify and d.tensor in self._copies:
            self._check_copies(d, start, count, out)
        return out

    def _check_copies(self, d: Dataset, start: int, count: int, raw: np.ndarray) -> None:
        """Every other layer's copy of a shared weight holds the bytes ``raw`` holds."""
        mine = _native_bytes(d, raw)
        for other in self._copies[d.tensor]:
            theirs = np.empty(count * other.itemsize, np.uint8)
            other.read_flat(start, count, theirs, True)
            if not np.array_equal(_native_bytes(other, theirs), mine):
                raise CorruptCheckpointError(
                    f"layers list it as {d.where} and as {other.where}, which hold different "
                    f"values: open one layer's group at a time ({self.file}/LAYER)",
                    path=self.file,
                    tensor=d.tensor,
                )

    def read(self, name: str) -> np.ndarray:
        d = self._dataset(name)
        if self.mmap and not (self.verify and name in self._copies):
            view = d.view()
            if view is not None:
                return self._native(d, view, d.shape)
        return self._native(d, self._raw(d, 0, d.size), d.shape)

    def read_bytes(self, name: str, extents: Slice | None = None) -> bytes:
        """The tensor's bytes as a bundle stores them (little-endian)."""
        self._no_slices(name, extents)
        value = self.read(name)
        return np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<")).tobytes()

    def read_slice(self, name: str, extents: Slice) -> np.ndarray:
        self._dataset(name)
        raise TensorNotFoundError(
            "an HDF5 dataset is stored whole, in no slices", path=self.prefix, tensor=name
        )

    def _no_slices(self, name: str, extents: Slice | None) -> None:
        self._dataset(name)
        if extents is not None:
            raise TensorNotFoundError(
                "an HDF5 dataset is stored whole, in no slices", path=self.prefix, tensor=name
            )

    def variant_elements(self, name: str, extents: Slice | None = None) -> list[bytes]:
        raise UnsupportedCheckpointError(
            f"a {self._dataset(name).dtype.name} tensor, not a variant",
            path=self.prefix,
            tensor=name,
        )

    def read_elements(
        self, name: str, start: int, count: int, extents: Slice | None = None
    ) -> np.ndarray:
        """Elements ``[start, start + count)`` (row-major) of tensor ``name``."""
        self._no_slices(name, extents)
        d = self._dataset(name)
        if start < 0 or count < 0 or start + count > d.size:
            raise ValueError(f"elements [{start}, {start + count}) lie outside {name!r}")
        raw = np.empty(count * d.itemsize, np.uint8)
        try:
            d.read_flat(start, count, raw, self.verify)
        except _H5_ERRORS as e:
            raise CorruptCheckpointError(
                f"dataset {d.where}: read failed: {e}", path=d.path, tensor=name
            ) from None
        return self._native(d, raw, (count,))

    def read_region(self, name: str, region: Region) -> np.ndarray:
        """A region of a tensor, read a band of rows at a time (at most about a chunk)."""
        d = self._dataset(name)
        if not d.shape:
            return self.read(name)
        out = np.empty(region_counts(region), dtype=d.dtype.array_dtype)
        if not out.size:
            return out
        row = num_elements(d.shape[1:])
        start, count, step = region[0]
        per_band = max(1, DEFAULT_CHUNK_BYTES // max(1, step * row * d.itemsize))
        inner = region_index(region[1:])
        for k0 in range(0, count, per_band):
            k1 = min(count, k0 + per_band)
            r0, r1 = start + k0 * step, start + (k1 - 1) * step + 1
            raw = self._raw(d, r0 * row, (r1 - r0) * row)
            rows = self._native(d, raw, (r1 - r0,) + d.shape[1:])
            out[k0:k1] = rows[(slice(None, None, step),) + inner]
        return out

    def read_together(self, names, *, buffers=None) -> list[np.ndarray]:
        """Whole tensors as 1-D arrays, in one buffer (``buffers``, as for
        :meth:`iter_chunks`), each read on its own."""
        found = [self._dataset(n) for n in names]
        total = sum(d.nbytes for d in found)
        buf = np.empty(total, dtype=np.uint8) if buffers is None else buffers(total)
        out, pos = [], 0
        for d in found:
            part = buf[pos : pos + d.nbytes]
            self._raw(d, 0, d.size, part)
            out.append(self._native(d, part, (d.size,)))
            pos += d.nbytes
        return out

    def iter_chunks(
        self,
        name: str,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        extents: Slice | None = None,
        *,
        buffers: Callable[[int], np.ndarray] | None = None,
    ) -> Iterator[np.ndarray]:
        """Tensor ``name`` as 1-D arrays of about ``chunk_bytes``, in order."""
        self._no_slices(name, extents)
        d = self._dataset(name)
        step = max(1, chunk_bytes // d.itemsize)
        if not d.size:
            yield np.empty(0, dtype=d.dtype.array_dtype)
            return
        for start in range(0, d.size, step):
            count = min(step, d.size - start)
            n = count * d.itemsize
            buf = np.empty(n, dtype=np.uint8) if buffers is None else buffers(n)
            yield self._native(d, self._raw(d, start, count, buf), (count,))

    def iter_string_parts(
        self, name: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES, extents: Slice | None = None
    ) -> Iterator[tuple[str, np.ndarray, int]]:
        raise TypeError(f"{name!r} is a {self._dataset(name).dtype.name} tensor, not strings")


class HFShardedCheckpoint(HDF5Checkpoint):
    """Hugging Face's sharded TF weights (``tf_model.h5.index.json`` and its
    ``tf_model-0000K-of-0000N.h5`` shards, see :mod:`tfckpt.format.hfindex`) read as one
    checkpoint, each tensor named as the index names its weight, less ``:0``: the names
    the unsharded ``tf_model.h5`` gives. Created by :func:`tfckpt.open` for the index or
    a directory holding it; ``prefix`` is the index's path. Every shard is opened and
    checked first: a missing shard, a weight the index puts in one shard and a shard
    lists too (or lacks), is an error naming the file.
    """

    format = "Hugging Face sharded TF weights (Keras HDF5)"
    keras_layers = None  # transformers loads these by name, not by layer order

    def __init__(
        self,
        path,
        *,
        verify: bool = True,
        mmap: bool = True,
        storage_options: StorageOptions | None = None,
        storage: Storage | None = None,
        index_file: str | None = None,
    ):
        self.storage = storage or storage_for(normalize(path), storage_options)
        self.file = self.prefix = self.index_path = index_file or normalize(path)
        self.group = ""
        self.verify, self.mmap = verify, mmap
        self._readers = {}
        self.header = Header(1, "little", Version(0, 0))
        self.keras_version = None
        self._shards: list[tuple[Reader, h5py.File | None]] = []
        self._datasets = {}
        self._copies = {}
        self._shard_of: dict[str, int] = {}
        self._closed = False
        try:
            self._open_all()
        except BaseException:
            self.close()
            raise

    def _open_all(self) -> None:
        index = parse_index(self._index_bytes(), self.file)
        directory = self.storage.dirname(self.file)
        owner: dict[tuple[str, str], str] = {}  # (shard, dataset path) -> its weight
        for weight, file in index.weight_map.items():
            owner.setdefault((file, dataset_name(weight)), weight)
        found: dict[str, Dataset] = {}
        shard_of = {file: k for k, file in enumerate(index.files)}
        for file in index.files:
            shard = self.storage.join(directory, file) if directory else file
            for w, d in self._open_shard(shard, file, index):
                listed = owner.get((file, w.name))
                if listed is None or index.weight_map.get(listed) != file:
                    elsewhere = [
                        k for k, f in index.weight_map.items() if dataset_name(k) == w.name
                    ]
                    why = (
                        f"the index puts {elsewhere[0]!r} in {index.weight_map[elsewhere[0]]}"
                        if elsewhere
                        else "the index names no such weight"
                    )
                    raise CorruptCheckpointError(
                        f"the shard lists the dataset {w.path}, and {why}: "
                        "a weight in two shards, or a shard of another model",
                        path=shard,
                    )
                if listed in found:
                    raise CorruptCheckpointError(
                        f"the shard lists the dataset {w.path} twice", path=shard
                    )
                d.tensor = _plain(listed)
                found[listed] = d
        for weight, file in index.weight_map.items():
            if weight not in found:
                raise CorruptCheckpointError(
                    f"the index puts {weight!r} in {file}, which does not list it "
                    f"(as {dataset_name(weight)!r})",
                    path=self.file,
                    tensor=_plain(weight),
                )
        for weight in index.weight_map:
            name = _plain(weight)
            if name in self._datasets:
                raise CorruptCheckpointError(
                    f"the index names {name!r} twice (with and without :0)", path=self.file
                )
            self._datasets[name] = found[weight]
            self._shard_of[name] = shard_of[index.weight_map[weight]]
        self._names = list(self._datasets)
        self.header = Header(len(index.files), "little", Version(0, 0))

    def _index_bytes(self) -> bytes:
        """The index file's bytes, refused unread above :data:`MAX_INDEX_BYTES`."""
        try:
            reader = self.storage.open_reader(self.file)
        except OSError as e:
            raise CheckpointNotFoundError(
                f"cannot read: {e.strerror or e}", path=self.file
            ) from None
        try:
            if reader.size > MAX_INDEX_BYTES:
                raise CorruptCheckpointError(
                    f"{reader.size} bytes: more than an index of weights takes", path=self.file
                )
            buf = bytearray(reader.size)
            done = 0
            while done < reader.size:
                n = reader.readinto(memoryview(buf)[done:], done)
                if n <= 0:
                    raise CorruptCheckpointError("the file ended early", path=self.file)
                done += n
            return bytes(buf)
        finally:
            reader.close()

    def _open_shard(self, shard: str, file: str, index: ShardIndex):
        """``(weight, dataset)`` of each weight the shard ``shard`` lists."""
        try:
            reader = self.storage.open_reader(shard)
        except (OSError, CheckpointError) as e:
            detail = e.strerror if isinstance(e, OSError) else e.detail
            raise CheckpointNotFoundError(
                f"the index names the shard {file}, which cannot be read: {detail or e}",
                path=shard,
            ) from None
        self._shards.append((reader, None))
        try:
            h5 = h5py.File(ReaderFile(reader), "r")
        except _H5_ERRORS as e:
            raise CorruptCheckpointError(f"not a readable HDF5 file: {e}", path=shard) from None
        self._shards[-1] = (reader, h5)
        try:
            weights = read_shard(h5, shard)
            return [(w, Dataset(w.dataset, w.path, shard, reader, _plain(w.name))) for w in weights]
        except CheckpointError:
            raise
        except _H5_ERRORS as e:
            raise CorruptCheckpointError(f"unreadable HDF5 structure: {e}", path=shard) from None

    def __repr__(self) -> str:
        return (
            f"<tfckpt.Checkpoint {self.prefix!r} (Hugging Face sharded TF weights, "
            f"{len(self._shards)} shards): {len(self)} tensors>"
        )

    def info(self, name: str) -> TensorInfo:
        """As :meth:`HDF5Checkpoint.info`, ``shard`` the tensor's shard file's place in
        the index (the first file it names is 0)."""
        return dataclasses.replace(super().info(name), shard=self._shard_of[name])

    @property
    def stem(self) -> str:
        base = self.storage.basename(self.file)
        return base[: -len(INDEX_SUFFIX)] if base.endswith(INDEX_SUFFIX) else base

    @property
    def data_files(self) -> list[str]:
        return [r.path for r, _ in self._shards]

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        shards, self._shards = self._shards, []
        for reader, h5 in shards:
            if h5 is not None:
                try:
                    h5.close()
                except _H5_ERRORS:
                    pass
            reader.close()


def _native_bytes(d: Dataset, raw: np.ndarray) -> np.ndarray:
    values = raw.view(d.file_dtype)
    return values.astype(d.file_dtype.newbyteorder("="), copy=False).view(np.uint8)


def _plain(weight: str) -> str:
    """A weight's name as tfckpt lists it: TensorFlow's output suffix ``:0`` dropped."""
    return weight[:-2] if weight.endswith(":0") else weight
