"""Where a checkpoint's files are: prefixes, file names, state files, SavedModels."""

from __future__ import annotations

import difflib
import fnmatch
import re
import warnings

from google.protobuf import text_format

from tfckpt._proto.checkpoint_state_pb2 import CheckpointState
from tfckpt.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointPathWarning,
    CorruptCheckpointError,
)
from tfckpt.format.natural import natural_key
from tfckpt.io.storage import Storage, StorageOptions, normalize, storage_for
from tfckpt.io.temporaries import TMP_MARK

STATE_FILENAME = "checkpoint"
_DATA_RE = re.compile(r"^(?P<prefix>.*)\.data-(?P<shard>\d{5,})-of-(?P<num>\d{5,})$")
# An absolute path of some machine: POSIX, or Windows with a drive or a UNC share.
_ROOTED_RE = re.compile(r"^(?:[/\\]|[A-Za-z]:[/\\])")
# The step ends the name, before the file pattern of a sharded V1 save, if any.
_STEP_RE = re.compile(r"-(\d+)(?:-\?{5}-of-\d{5,})?$")
SUGGESTIONS = 5  # how many "did you mean" candidates a message lists


def index_filename(prefix: str) -> str:
    return f"{prefix}.index"


def data_filename(prefix: str, shard: int, num_shards: int) -> str:
    return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"


def output_prefix(path: str) -> str:
    """The prefix an output path names, taken as a source's is: a prefix, its ``.index``
    or one of its data files (``out/model.index`` writes ``out/model.index`` and
    ``out/model.data-*``, not ``out/model.index.index``). A name that would leave no
    prefix (``out/.index``) is kept."""
    parsed = parse_data_filename(path)
    prefix = parsed[0] if parsed is not None else path
    if parsed is None and path.endswith(".index"):
        prefix = path[: -len(".index")]
    if not prefix.replace("\\", "/").rsplit("/", 1)[-1]:
        return path
    return prefix


def parse_data_filename(path: str) -> tuple[str, int, int] | None:
    """(prefix, shard, num_shards) of a data shard's file name, or None."""
    m = _DATA_RE.match(path)
    if not m:
        return None
    return m["prefix"], int(m["shard"]), int(m["num"])


def read_state_file(store: Storage, directory: str) -> CheckpointState | None:
    """The ``checkpoint`` state file of ``directory`` (on ``store``), or None when there is
    none."""
    path = store.join(directory, STATE_FILENAME)
    if not store.isfile(path):
        return None
    try:
        return text_format.Parse(store.read_bytes(path).decode("utf-8"), CheckpointState())
    except (text_format.ParseError, UnicodeDecodeError) as e:
        raise CorruptCheckpointError(f"unreadable checkpoint state file: {e}", path=path) from None


def latest_checkpoint(
    directory: str, *, storage_options: StorageOptions | None = None
) -> str | None:
    """The prefix the state file of ``directory`` names as latest, as
    ``tf.train.latest_checkpoint`` finds it: None when there is no state file or the
    checkpoint it names has no ``.index``. A state file that names no checkpoint or
    cannot be parsed is a :class:`CorruptCheckpointError` (TensorFlow raises for the
    first and logs and returns None for the second).

    Where TensorFlow finds nothing because the state file's paths are from elsewhere
    (a moved or downloaded directory), the same file names beside the state file are
    taken, with a :class:`~tfckpt.CheckpointPathWarning`.

    >>> tfckpt.latest_checkpoint("train")
    'train/model.ckpt-7'
    """
    store = storage_for(directory, storage_options)
    prefix = state_file_latest(store, directory)
    if prefix is None or not checkpoint_exists(store, prefix):
        return None
    return prefix


def state_file_latest(store: Storage, directory: str, *, warn: bool = True) -> str | None:
    """The prefix the state file of ``directory`` (on ``store``) names, whether or not its
    files exist; None without one."""
    state = read_state_file(store, directory)
    if state is None:
        return None
    if not state.model_checkpoint_path:
        raise CorruptCheckpointError(
            "the checkpoint state file names no checkpoint (model_checkpoint_path is empty)",
            path=store.join(directory, STATE_FILENAME),
        )
    prefix, moved = _locate(store, directory, state.model_checkpoint_path)
    if moved and warn:
        _warn_moved(store, directory, state.model_checkpoint_path, prefix)
    return prefix


def state_file_checkpoints(store: Storage, directory: str) -> tuple[list[str], str] | None:
    """The checkpoints the state file of ``directory`` (on ``store``) lists, oldest first,
    and the latest (found beside the state file when their paths are from elsewhere, as
    for :func:`latest_checkpoint`); None without a state file."""
    latest = state_file_latest(store, directory, warn=False)
    if latest is None:
        return None
    state = read_state_file(store, directory)
    assert state is not None
    prefixes, moved = [], []
    for name in [*state.all_model_checkpoint_paths, state.model_checkpoint_path]:
        prefix, was_moved = _locate(store, directory, name)
        if was_moved and (name, prefix) not in moved:
            moved.append((name, prefix))
        prefixes.append(prefix)
    if moved:
        _warn_moved(store, directory, *moved[0], more=len(moved) - 1)
    return list(dict.fromkeys(prefixes)), latest


def checkpoint_exists(store: Storage, prefix: str) -> bool:
    # A bundle's .index, the file of a single-file V1 checkpoint, or a file of the
    # pattern a sharded V1 save is named by (model.ckpt-5-?????-of-00002).
    if store.isfile(index_filename(prefix)) or store.isfile(prefix):
        return True
    pattern = store.basename(prefix)
    if "?" not in pattern:
        return False
    try:
        names = store.listdir(store.dirname(prefix) or ".")
    except (OSError, CheckpointError):
        return False
    return any(fnmatch.fnmatchcase(n, pattern) for n in names)


def _locate(store: Storage, directory: str, name: str) -> tuple[str, bool]:
    """The prefix a state file in ``directory`` means by ``name``, and whether it was
    found beside the state file rather than where ``name`` says.

    TensorFlow's ``Saver`` writes absolute paths: a directory moved, copied or
    downloaded elsewhere names checkpoints where they no longer are (or, from
    another machine, where this storage cannot look). The same file name beside
    the state file is then what was meant; where ``name`` still exists, it wins,
    as in TensorFlow.
    """
    if store.isabs(name) and store.may_lead_to(directory, name):
        prefix: str | None = name
    elif store.isabs(name) or _ROOTED_RE.match(name):
        prefix = None  # another machine's absolute path, not one of this storage
    elif not store.may_lead_to(directory, name):
        prefix = None  # out of the state file's directory, maybe its bucket
    else:
        prefix = store.join(directory, name)
    if prefix is not None and checkpoint_exists(store, prefix):
        return prefix, False
    beside = store.join(directory, re.split(r"[/\\]", name)[-1])
    if beside != prefix and checkpoint_exists(store, beside):
        return beside, True
    return (beside if prefix is None else prefix), False


def _warn_moved(store: Storage, directory: str, name: str, prefix: str, more: int = 0) -> None:
    others = f" (and {more} more such paths)" if more else ""
    warnings.warn(
        f"{store.join(directory, STATE_FILENAME)} names {name}, which is not there; "
        f"using {prefix} beside it{others}",
        CheckpointPathWarning,
        stacklevel=4,
    )


def checkpoint_step(prefix: str) -> int | None:
    """The step in a prefix's name (``model.ckpt-1000``, ``ckpt-3``), or None."""
    m = _STEP_RE.search(prefix)
    return int(m[1]) if m else None


def _index_names(store: Storage, directory: str) -> list[str]:
    """The ``.index`` files in ``directory``, but those of a run's temporaries: a run
    killed as it commits leaves one, which no reader may take for a checkpoint."""

    return [n for n in store.listdir(directory) if n.endswith(".index") and TMP_MARK not in n]


def bundle_prefixes(store: Storage, directory: str) -> list[str]:
    """Every prefix with an ``.index`` file in ``directory`` (on ``store``), steps in
    numeric order."""
    names = [n[: -len(".index")] for n in _index_names(store, directory)]
    return [store.join(directory, n) for n in sorted(names, key=natural_key)]


def _did_you_mean(store: Storage, p: str) -> str:
    """The checkpoints beside a missing prefix whose names extend or resemble its own,
    as the tail of an error message ('' when there are none)."""
    directory = store.dirname(p)
    base = store.basename(p)
    if base.endswith(".index"):
        base = base[: -len(".index")]
    try:
        if not base:
            return ""
        if not store.isdir(directory or "."):
            return _missing_directory(store, directory)
        names = sorted(
            (n[: -len(".index")] for n in _index_names(store, directory or ".")),
            key=natural_key,
        )
    except (OSError, CheckpointError):
        return ""  # only a hint: a directory that cannot be listed gives none
    found = [n for n in names if n.startswith(base) and n != base]
    if not found:
        found = sorted(difflib.get_close_matches(base, names, n=SUGGESTIONS), key=natural_key)
    if not found:
        return ""
    # The newest steps are the likeliest wanted.
    more = f" (the last {SUGGESTIONS} of {len(found)})" if len(found) > SUGGESTIONS else ""
    shown = [store.join(directory, n) if directory else n for n in found[-SUGGESTIONS:]]
    return f"; did you mean {', '.join(shown)}{more}?"


def _missing_directory(store: Storage, directory: str) -> str:
    """The tail of an error message for a path whose directory is not there: the
    nearest existing directory's entry that resembles the missing one ('' when none)."""
    missing, parent = store.basename(directory), store.dirname(directory)
    if not missing or parent == directory or not store.isdir(parent or "."):
        return ""
    found = difflib.get_close_matches(missing, store.listdir(parent or "."), n=1)
    if not found:
        return f"; there is no directory {directory}"
    return f"; there is no directory {directory}, did you mean {store.join(parent, found[0])}?"


def resolve_prefix(path, *, storage_options: StorageOptions | None = None) -> str:
    """The checkpoint prefix that ``path`` designates.

    ``path`` may be a prefix, its ``.index`` or a data file, a directory with a
    ``checkpoint`` state file (the latest checkpoint is taken), or a SavedModel
    directory (its ``variables/variables``); a local path or an fsspec URL, opened with
    ``storage_options``. :func:`find_prefix` does the same on a storage at hand.
    """
    p = normalize(path)
    return find_prefix(storage_for(p, storage_options), p)


def find_prefix(store: Storage, path) -> str:
    """The checkpoint prefix that ``path``, on ``store``, designates (see
    :func:`resolve_prefix`)."""
    p = normalize(path)
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
        "no checkpoint found; looked for "
        + ", ".join(looked)
        + " and a directory"
        + _did_you_mean(store, p),
        path=p,
    )


def _resolve_directory(store: Storage, directory: str) -> str:
    # With a state file, its latest checkpoint or an error: never another .index.
    latest = state_file_latest(store, directory)
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
    indexes = sorted(_index_names(store, directory))
    if len(indexes) == 1:
        return store.join(directory, indexes[0][: -len(".index")])
    found = f"; found {len(indexes)} .index files: {', '.join(indexes[:5])}" if indexes else ""
    raise CheckpointNotFoundError(
        f"no checkpoint in directory; looked for a '{STATE_FILENAME}' state file, "
        f"a SavedModel's variables/variables.index and a single *.index file{found}",
        path=directory,
    )
