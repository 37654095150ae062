"""One door to every checkpoint: a path resolved to a V2 bundle, a V1 checkpoint, Keras
HDF5 weights, Hugging Face's sharded TF weights (their ``tf_model.h5.index.json``, or
a directory holding it), the original OpenAI GPT release's numpy shards (its ``model/``
directory, or its ``params_shapes.json``), or what else the file is.

:func:`open_checkpoint` is what :func:`tfckpt.open` and every command call, with the
storage options given; :func:`open_in` opens a path on a storage at hand (a task's source,
a checkpoint listed in a directory). The readers' own constructors take the storage and
what was resolved, so a path is looked up once.

An archive (:mod:`tfckpt.io.archives`) opens like a directory: ``ARCHIVE#MEMBER`` as
that member's path would; the archive itself (its root) opens the one checkpoint it
holds, or fails listing those it holds (:func:`archive_checkpoints`); a file that is
an archive by its content, whatever its name, opens as that archive. An archive or a
directory holding no TensorFlow checkpoint opens the one Keras HDF5 file it holds
(``model.h5``, or Hugging Face's sharded TF weights' index).
"""

from __future__ import annotations

from tfckpt.checkpoint.npyshards import NpyShardsCheckpoint, find_npy_shards
from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.checkpoint.v1 import V1Checkpoint
from tfckpt.checkpoint.v1files import SHARD_RE, is_table_file, resolve_files
from tfckpt.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    UnsupportedCheckpointError,
    install_hint,
)
from tfckpt.format.filekinds import HEAD_BYTES, FileKind, identify
from tfckpt.format.h5chunks import SIGNATURE, superblock_offsets
from tfckpt.format.hfindex import INDEX_NAME, INDEX_SUFFIX
from tfckpt.io import paths
from tfckpt.io.archives import ArchiveStorage, archive_at
from tfckpt.io.storage import (
    Storage,
    StorageOptions,
    normalize,
    storage_for,
)


def open_checkpoint(
    path,
    *,
    verify: bool = True,
    mmap: bool = True,
    storage_options: StorageOptions | None = None,
) -> Checkpoint:
    """The checkpoint ``path`` designates, V2, V1 or Keras HDF5, read through one API.

    A path that designates no bundle may designate a V1 checkpoint, an HDF5 file of
    Keras weights (``model.h5``) or a group inside one (``model.h5/optimizer_weights``,
    see :mod:`tfckpt.checkpoint.hdf5`); a file that is none of these is an
    :class:`~tfckpt.UnsupportedCheckpointError` saying what it is.

    >>> with open_checkpoint("train/model.ckpt-7", mmap=False) as ckpt:
    ...     names = ckpt.keys()
    """
    return open_in(storage_for(normalize(path), storage_options), path, verify=verify, mmap=mmap)


def open_in(store: Storage, path, *, verify: bool = True, mmap: bool = True) -> Checkpoint:
    """The checkpoint ``path``, on ``store``, designates (see :func:`open_checkpoint`)."""
    if isinstance(store, ArchiveStorage) and store.is_root(path):
        path = the_checkpoint_in(store)
    try:
        prefix = paths.find_prefix(store, path)
    except CheckpointNotFoundError:
        index = find_hf_index(store, path)
        if index is not None:
            return _open_hdf5(store, path, (index, ""), verify, mmap, sharded=True)
        release = find_npy_shards(store, path)
        if release is not None:
            return NpyShardsCheckpoint(
                path, verify=verify, mmap=mmap, storage=store, resolved=release
            )
        h5 = find_hdf5(store, path)
        if h5 is not None:
            return _open_hdf5(store, path, h5, verify, mmap)
        # find_prefix warned already about a state file naming moved paths.
        files = resolve_files(store, path, warn=False)
        if files is not None:
            return V1Checkpoint(path, verify=verify, mmap=mmap, storage=store, resolved=files)
        if store.isdir(normalize(path)):
            lone = the_keras_file_in(store, store.dir_path(normalize(path)))
            if lone is not None:
                return open_in(store, lone, verify=verify, mmap=mmap)
        # Before archives: a PyTorch or Keras zip is no archive of checkpoints.
        why = not_a_checkpoint(store, path)
        if why is not None:
            raise UnsupportedCheckpointError(why, path=normalize(path)) from None
        inner = archive_at(store, normalize(path))
        if inner is not None:
            return open_in(inner, inner.root, verify=verify, mmap=mmap)
        raise
    return Checkpoint(path, verify=verify, mmap=mmap, storage=store, resolved=prefix)


# Names under which an HDF5 file may begin with a user block (the signature further in).
HDF5_SUFFIXES = (".h5", ".hdf5", ".he5", ".hdf")
_DEPTH = 32  # group levels a path inside an HDF5 file may have


def find_hdf5(store: Storage, path) -> tuple[str, str] | None:
    """``(file, group)`` when ``path`` on ``store`` is an HDF5 file (group ``""``) or a
    group inside one (``model.h5/optimizer_weights``); else None."""
    p = normalize(path)
    inner: list[str] = []
    for _ in range(_DEPTH):
        if store.isfile(p):
            return (p, "/".join(reversed(inner))) if is_hdf5(store, p) else None
        parent = store.dirname(p)
        if not parent or parent == p or store.exists(p):
            return None
        inner.append(store.basename(p))
        p = parent
    return None


def is_hdf5(store: Storage, path: str) -> bool:
    """Whether the file ``path`` holds HDF5's signature where HDF5 looks for it (past a
    user block only in a file named as HDF5 files are)."""
    try:
        reader = store.open_reader(path)
    except (OSError, CheckpointError):
        return False
    try:
        offsets = superblock_offsets(reader.size)
        if not path.lower().endswith(HDF5_SUFFIXES):
            offsets = iter([0])
        for offset in offsets:
            buf = bytearray(len(SIGNATURE))
            if reader.readinto(memoryview(buf), offset) == len(buf) and bytes(buf) == SIGNATURE:
                return True
        return False
    except OSError:
        return False
    finally:
        reader.close()


def find_hf_index(store: Storage, path) -> str | None:
    """The index of Hugging Face's sharded TF weights ``path`` designates: the index
    itself (``tf_model.h5.index.json``) or a directory holding it; else None."""
    p = normalize(path)
    if p.endswith(INDEX_SUFFIX) and store.isfile(p):
        return p
    if store.isdir(p):
        index = store.join(store.dir_path(p), INDEX_NAME)
        if store.isfile(index):
            return index
    return None


def _open_hdf5(
    store: Storage, path, found: tuple[str, str], verify: bool, mmap: bool, sharded: bool = False
):
    try:
        from tfckpt.checkpoint.hdf5 import HDF5Checkpoint, HFShardedCheckpoint
    except ModuleNotFoundError as e:
        if e.name != "h5py":
            raise
        raise UnsupportedCheckpointError(
            f"an HDF5 file (Keras weights): reading it needs h5py ({install_hint('h5')})",
            path=found[0],
        ) from None
    if sharded:
        return HFShardedCheckpoint(
            path, verify=verify, mmap=mmap, storage=store, index_file=found[0]
        )
    return HDF5Checkpoint(path, verify=verify, mmap=mmap, storage=store, resolved=found)


def not_a_checkpoint(store: Storage, path) -> str | None:
    """Why ``path``, a file on ``store`` that is no checkpoint, is not one (what it is, and
    what handles it: :func:`tfckpt.format.filekinds.identify`); None when no kind is
    known."""
    kind = file_kind(store, path)
    return None if kind is None else kind.message()


def file_kind(store: Storage, path) -> FileKind | None:
    """The kind of the file ``path`` on ``store`` when it is one people take for a
    checkpoint (see :func:`tfckpt.format.filekinds.identify`); None otherwise."""
    p = normalize(path)
    try:
        if not store.isfile(p):
            return None
        return identify(p, _head(store, p))
    except (OSError, CheckpointError):
        return None


def _head(store: Storage, path: str) -> bytes:
    reader = store.open_reader(path)
    try:
        buf = bytearray(HEAD_BYTES)
        n = reader.readinto(memoryview(buf), 0)
        return bytes(buf[:n])
    finally:
        reader.close()


# Files beside checkpoints that are no V1 table: not worth looking into.
_NOT_TABLES = (".json", ".txt", ".meta", ".pb", ".pbtxt", ".md", ".model", ".vocab", ".h5")
SHOWN = 5  # how many checkpoints or files an error lists


def archive_checkpoints(store: ArchiveStorage) -> list[str]:
    """Every checkpoint in an archive, directory by directory: in a directory with a
    ``checkpoint`` state file, the latest it names; elsewhere each ``.index`` prefix and
    each V1 checkpoint (a table file, or a sharded save's shards)."""
    found: list[str] = []
    for directory in store.directories():
        try:
            latest = paths.state_file_latest(store, directory)
        except CheckpointError:
            latest = None
        if latest is not None:
            found.append(latest)
            continue
        prefixes = paths.bundle_prefixes(store, directory)
        found += prefixes
        bundled = {store.basename(p) for p in prefixes}
        v1: dict[str, None] = {}
        for name in sorted(store.listdir(directory)):
            full = store.join(directory, name)
            parsed = paths.parse_data_filename(name)
            if (
                name.endswith(".index")
                or (parsed is not None and parsed[0] in bundled)
                or name == paths.STATE_FILENAME
                or name.lower().endswith(_NOT_TABLES)
                or not is_table_file(store, full)
            ):
                continue
            m = SHARD_RE.match(name)
            v1[store.join(directory, m["prefix"]) if m else full] = None
        found += v1
    return found


def keras_files(store: Storage, directory: str) -> list[str]:
    """The Keras HDF5 weights in ``directory``: the index of Hugging Face's sharded TF
    weights when it holds one (its shards are part of it), else each HDF5 file named
    as one (``model.h5``, ``.hdf5``...)."""
    names = sorted(store.listdir(directory))
    if INDEX_NAME in names:
        return [store.join(directory, INDEX_NAME)]
    found = []
    for name in names:
        full = store.join(directory, name)
        if name.lower().endswith(HDF5_SUFFIXES) and store.isfile(full) and is_hdf5(store, full):
            found.append(full)
    return found


def the_keras_file_in(store: Storage, directory: str) -> str | None:
    """The Keras HDF5 weights a directory holding no TensorFlow checkpoint (no state
    file, no ``.index``) holds, when it holds one; None when it holds none; an error
    listing them when it holds several."""
    if store.isfile(store.join(directory, paths.STATE_FILENAME)) or paths.bundle_prefixes(
        store, directory
    ):
        return None
    found = keras_files(store, directory)
    if len(found) > 1:
        shown = ", ".join(store.basename(p) for p in found[:SHOWN])
        more = f" (and {len(found) - SHOWN} more)" if len(found) > SHOWN else ""
        raise CheckpointNotFoundError(
            f"the directory holds {len(found)} Keras HDF5 files: {shown}{more}; name one",
            path=directory,
        )
    return found[0] if found else None


def keras_file_within(store: Storage, path) -> tuple[Storage, str] | None:
    """``(storage, file)`` of the one Keras HDF5 file that a directory or an archive
    holding no TensorFlow checkpoint opens as (see :func:`open_in`); None for any
    other path, or one that holds several."""
    p = normalize(path)
    try:
        if isinstance(store, ArchiveStorage) and store.is_root(p):
            inner = store
        elif store.isdir(p):
            try:
                paths.find_prefix(store, p)
                return None
            except CheckpointNotFoundError:
                pass
            if resolve_files(store, p, warn=False) is not None:
                return None
            lone = the_keras_file_in(store, store.dir_path(p))
            return None if lone is None else (store, lone)
        else:
            found_inner = None if not_a_checkpoint(store, p) else archive_at(store, p)
            if found_inner is None:
                return None
            inner = found_inner
        if archive_checkpoints(inner):
            return None
        found = [f for d in inner.directories() for f in keras_files(inner, d)]
        return (inner, found[0]) if len(found) == 1 else None
    except CheckpointError:
        return None


def the_checkpoint_in(store: ArchiveStorage) -> str:
    """The one checkpoint an archive holds (see :func:`archive_checkpoints`); when it
    holds no TensorFlow checkpoint, its one Keras HDF5 file (:func:`keras_files`); an
    error listing them when it holds several, or its files when none."""
    found = archive_checkpoints(store)
    if not found:
        found = [f for d in store.directories() for f in keras_files(store, d)]
    if len(found) == 1:
        return found[0]
    if found:
        shown = ", ".join(store.member(p) for p in found[:SHOWN])
        more = f" (and {len(found) - SHOWN} more)" if len(found) > SHOWN else ""
        raise CheckpointNotFoundError(
            f"the archive holds {len(found)} checkpoints: {shown}{more}; name one as "
            f"ARCHIVE#{store.member(found[0])}",
            path=store.root,
        )
    files = store.names(SHOWN + 1)
    listed = ", ".join(files[:SHOWN]) + (", ..." if len(files) > SHOWN else "")
    raise CheckpointNotFoundError(
        f"no checkpoint in the {store.kind} archive"
        + (f" (it holds {listed})" if files else " (it is empty)"),
        path=store.root,
    )
