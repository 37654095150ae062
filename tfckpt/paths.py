"""Where a checkpoint's files are: prefixes, file names, state files, SavedModels."""

from __future__ import annotations

import re

from google.protobuf import text_format

from ._proto.checkpoint_state_pb2 import CheckpointState
from .errors import CheckpointNotFoundError, CorruptCheckpointError
from .storage import Storage, StorageOptions, normalize, storage_for, takes_storage_options

STATE_FILENAME = "checkpoint"
_DATA_RE = re.compile(r"^(?P<prefix>.*)\.data-(?P<shard>\d{5,})-of-(?P<num>\d{5,})$")


def index_filename(prefix: str) -> str:
    return f"{prefix}.index"


def data_filename(prefix: str, shard: int, num_shards: int) -> str:
    return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"


def parse_data_filename(path: str) -> tuple[str, int, int] | None:
    """(prefix, shard, num_shards) of a data shard's file name, or None."""
    m = _DATA_RE.match(path)
    if not m:
        return None
    return m["prefix"], int(m["shard"]), int(m["num"])


@takes_storage_options()
def read_state_file(
    directory: str, *, storage_options: StorageOptions | None = None
) -> CheckpointState | None:
    """The ``checkpoint`` state file of ``directory``, or None when there is none."""
    store = storage_for(directory)
    path = store.join(directory, STATE_FILENAME)
    if not store.isfile(path):
        return None
    try:
        return text_format.Parse(store.read_bytes(path).decode("utf-8"), CheckpointState())
    except (text_format.ParseError, UnicodeDecodeError) as e:
        raise CorruptCheckpointError(f"unreadable checkpoint state file: {e}", path=path) from None


@takes_storage_options()
def latest_checkpoint(
    directory: str, *, storage_options: StorageOptions | None = None
) -> str | None:
    """The prefix the state file of ``directory`` names as latest, as
    ``tf.train.latest_checkpoint`` finds it: None when there is no state file or the
    checkpoint it names has no ``.index``. A state file that names no checkpoint or
    cannot be parsed is a :class:`CorruptCheckpointError` (TensorFlow raises for the
    first and logs and returns None for the second).

    >>> tfckpt.latest_checkpoint("train")
    'train/model.ckpt-7'
    """
    prefix = _state_file_latest(directory)
    if prefix is None or not storage_for(directory).isfile(index_filename(prefix)):
        return None
    return prefix


def _state_file_latest(directory: str) -> str | None:
    """The prefix the state file names, whether or not its files exist; None without one."""
    state = read_state_file(directory)
    if state is None:
        return None
    store = storage_for(directory)
    if not state.model_checkpoint_path:
        raise CorruptCheckpointError(
            "the checkpoint state file names no checkpoint (model_checkpoint_path is empty)",
            path=store.join(directory, STATE_FILENAME),
        )
    prefix = state.model_checkpoint_path
    if not store.isabs(prefix):
        prefix = store.join(directory, prefix)
    return prefix


@takes_storage_options()
def resolve_prefix(path, *, storage_options: StorageOptions | None = None) -> str:
    """The checkpoint prefix that ``path`` designates.

    ``path`` may be a prefix, its ``.index`` or a data file, a directory with a
    ``checkpoint`` state file (the latest checkpoint is taken), or a SavedModel
    directory (its ``variables/variables``); a local path or an fsspec URL.
    """
    p = normalize(path)
    store = storage_for(p)
    if store.isfile(index_filename(p)):
        return p
    if p.endswith(".index") and store.isfile(p):
        return p[: -len(".index")]
    parsed = parse_data_filename(p)
    if parsed and store.isfile(p) and store.isfile(index_filename(parsed[0])):
        return parsed[0]
    if store.isdir(p):
        return _resolve_directory(store, store.dir_path(p))
    for index in (index_filename(p), p if p.endswith(".index") else None):
        if index and store.irregular(index):
            return index[: -len(".index")]  # there, but no regular file: opening says why
    looked = [index_filename(p)]
    if p.endswith(".index"):
        looked.append(p)
    raise CheckpointNotFoundError(
        "no checkpoint found; looked for " + ", ".join(looked) + " and a directory", path=p
    )


def _resolve_directory(store: Storage, directory: str) -> str:
    # With a state file, its latest checkpoint or an error: never another .index.
    latest = _state_file_latest(directory)
    if latest is not None:
        if store.isfile(index_filename(latest)):
            return latest
        raise CheckpointNotFoundError(
            f"the state file names {latest!r} as latest, but {index_filename(latest)} "
            "does not exist",
            path=store.join(directory, STATE_FILENAME),
        )
    for candidate in (
        store.join(directory, "variables", "variables"),
        store.join(directory, "variables"),
    ):
        if store.isfile(index_filename(candidate)):
            return candidate
    indexes = sorted(f for f in store.listdir(directory) if f.endswith(".index"))
    if len(indexes) == 1:
        return store.join(directory, indexes[0][: -len(".index")])
    found = f"; found {len(indexes)} .index files: {', '.join(indexes[:5])}" if indexes else ""
    raise CheckpointNotFoundError(
        f"no checkpoint in directory; looked for a '{STATE_FILENAME}' state file, "
        f"a SavedModel's variables/variables.index and a single *.index file{found}",
        path=directory,
    )
