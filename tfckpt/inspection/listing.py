"""``list_checkpoints``: the checkpoints of a directory, from its state file or its files."""

from __future__ import annotations

from tfckpt.checkpoint.opening import open_in
from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.errors import CheckpointError, CheckpointNotFoundError
from tfckpt.io import paths
from tfckpt.io.archives import ArchiveStorage, archive_at
from tfckpt.io.storage import Storage, StorageOptions, normalize, storage_for

# --- every checkpoint of a directory --------------------------------------------


def checkpoints(directory, *, storage_options: StorageOptions | None = None) -> dict:
    """Every checkpoint in a directory: ``{"directory", "state_file", "latest",
    "checkpoints": [{"prefix", "name", "step", "format", "tensors", "bytes",
    "tensor_bytes", "in_state_file", "state_file", "latest", "error"}]}``.

    Those the ``checkpoint`` state file lists come first, in its order (oldest
    first; their paths found beside the state file when they are from elsewhere,
    with a :class:`~tfckpt.CheckpointPathWarning`), then every other ``.index``
    in the directory, steps in numeric order. ``step`` is the number ending the
    name (``model.ckpt-1000``), ``bytes`` the size of the index and data files
    (of every file, for a V1 checkpoint), ``tensor_bytes`` the bytes of its tensors'
    data in the data files (what ``dump`` totals). Each checkpoint's index is read; one
    that cannot be opened keeps its row, with ``error`` saying why.

    An archive (``model.tar.gz``, or a file that is one by its content) lists every
    directory in it, each as above, rows named by their paths in the archive
    (``state_file`` per row: whether its directory has one); ``ARCHIVE#DIR`` lists
    that directory only.

    >>> [(c["name"], c["step"]) for c in tfckpt.list_checkpoints("train")["checkpoints"]]
    [('model.ckpt-3', 3), ('model.ckpt-4', 4), ('model.ckpt-5', 5)]
    """
    directory = normalize(directory)
    store = storage_for(directory, storage_options)
    if not store.isdir(directory):
        inner = archive_at(store, directory)
        if inner is None:
            raise CheckpointNotFoundError("not a directory", path=directory)
        store, directory = inner, inner.root
    directory = store.dir_path(directory)
    if isinstance(store, ArchiveStorage) and store.is_root(directory):
        return _archive(store)
    return _directory(store, directory)


def _directory(store: Storage, directory: str, name=None) -> dict:
    """The listing of one directory; ``name(prefix)`` names its rows (its base name)."""
    listed = paths.state_file_checkpoints(store, directory)
    in_state, latest = listed if listed is not None else ([], None)
    # A Saver's state file names absolute paths: the directory's own files are the
    # same checkpoints however the directory was named.
    listed_at = {store.realpath(p) for p in in_state}
    others = [
        p for p in paths.bundle_prefixes(store, directory) if store.realpath(p) not in listed_at
    ]
    prefixes = list(dict.fromkeys(in_state + others))
    rows = []
    for prefix in prefixes:
        row: dict = {
            "prefix": prefix,
            "name": name(prefix) if name else store.basename(prefix),
            "step": paths.checkpoint_step(store.basename(prefix)),
            "format": None,
            "tensors": None,
            "bytes": None,
            "tensor_bytes": None,
            "in_state_file": prefix in in_state,
            "state_file": listed is not None,
            "latest": prefix == latest,
            "error": None,
        }
        try:
            with open_in(store, prefix) as ckpt:
                files = (
                    [ckpt.index_path, *ckpt.data_files]
                    if ckpt.format == Checkpoint.format
                    else list(getattr(ckpt, "files", []))
                )
                row.update(
                    format=ckpt.format,
                    tensors=len(ckpt),
                    bytes=_file_bytes(ckpt.storage, files),
                    tensor_bytes=sum(ckpt.table(None).nbytes),
                )
        except (CheckpointError, OSError) as e:
            if isinstance(e, CheckpointError):
                row["error"] = str(e)
            else:  # a data file the index needs, gone or unreadable
                row["error"] = f"{e.filename}: {e.strerror}" if e.filename else str(e)
        rows.append(row)
    return {
        "directory": directory,
        "state_file": listed is not None,
        "latest": latest,
        "checkpoints": rows,
    }


def _archive(store: ArchiveStorage) -> dict:
    """Every directory of an archive, listed as one: rows named by their member paths;
    ``latest`` the latest of the one state file, when there is exactly one."""
    rows, latest = [], []
    for directory in store.directories():
        part = _directory(store, directory, name=store.member)
        rows += part["checkpoints"]
        if part["state_file"]:
            latest.append(part["latest"])
    return {
        "directory": store.root,
        "state_file": bool(latest),
        "latest": latest[0] if len(latest) == 1 else None,
        "checkpoints": rows,
    }


def _file_bytes(store: Storage, files: list[str]) -> int:
    total = 0
    for f in files:
        reader = store.open_reader(f)
        try:
            total += reader.size
        finally:
            reader.close()
    return total
