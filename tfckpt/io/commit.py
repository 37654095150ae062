"""Making written files an output: new data files first, the index (or the single file)
last, or nothing appears.

:class:`Commit` is the one commit every writer goes through (checkpoints, imports,
exports): where each new file is written, the order in which they appear, what a
failure removes, whether the commit happened, and the removal of what the new output
replaced. Locally, files are written under temporaries (named by
:mod:`tfckpt.io.temporaries`, which also removes a killed run's) and renamed into
place, the last file's rename being the commit; on an object store, which has no
rename, data files are written under free final names and the last file's upload is the
commit.

What is a checkpoint's own stays here as small helpers: its index table, merging the
entries of shards written separately, choosing a shard count no committed checkpoint
uses, the empty extra shards, and the state file that names the latest checkpoint. File
operations go through :mod:`tfckpt.io.storage`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Mapping, Sequence

from google.protobuf.text_format import MessageToString

from tfckpt._proto.checkpoint_state_pb2 import CheckpointState
from tfckpt._proto.tensor_bundle_pb2 import BundleEntryProto
from tfckpt.errors import CheckpointError, CheckpointWriteError
from tfckpt.format import orderedcode
from tfckpt.format.bundle import HEADER_KEY, encode_header, entry_shape, slice_from_proto
from tfckpt.format.dtypes import Endianness
from tfckpt.format.entryrows import EntryRows, merge_rows
from tfckpt.format.slices import check_slice_cover
from tfckpt.io import paths
from tfckpt.io.storage import Storage
from tfckpt.io.temporaries import TMP_MARK, stale_temporaries, temporary_base


class Commit:
    """One output made visible at once: its data files first, then its last file (a
    checkpoint's index, an export's index or single file), whose appearance is the commit.

    A run asks :meth:`new_file` (or :meth:`last_file`) where to write: locally a
    temporary beside the final name, on an object store the final name itself, which
    must be one no live file has. :meth:`publish` renames the data files into place,
    then the last file: replacing what is there with ``overwrite``, else linked in, so
    an output another run committed meanwhile is refused, never replaced. On an object
    store the last file's upload (:meth:`write_last`, stored at :meth:`publish` in one
    request) is the commit.

    Every file this run made that no reader uses yet is tracked from before it exists:
    after a failure or an interrupt :meth:`discard` removes exactly those (and the
    directories made), unless :meth:`committed` says the commit happened. After the
    commit :meth:`remove_replaced` deletes what the new output replaced.

    >>> c = Commit(store, "out/model.safetensors.index.json", overwrite=True, what="an export")
    >>> write_shard(c.new_file("out/model-00001-of-00001.safetensors"))
    >>> c.write_last(json.dumps(index).encode())
    >>> c.publish(); c.remove_replaced(old_files)
    """

    def __init__(
        self,
        store: Storage,
        last: str,
        *,
        overwrite: bool,
        durable: bool = True,
        what: str = "a checkpoint",
        temporary: str | None = None,
    ):
        self.store = store
        self.last = last  # the file whose appearance is the commit
        self.overwrite = overwrite
        self.durable = durable
        self.what = what  # in the words of the refusal of an output committed meanwhile
        self.renames = store.atomic_rename
        self._last_tmp = (temporary or temporary_base(last)) if self.renames else last
        self._last_data: bytes | None = None  # to upload at publish (object stores)
        self._moves: list[tuple[str, str]] = []  # (written, final), in order
        self._ours: dict[str, None] = {}  # this run's files, none of them live yet
        self._made: list[str] = []  # directories this run created, innermost first
        self._check: Callable[[], bool] | None = None  # did the commit happen?
        self._done = False
        self.retired: str | None = None  # a copy of a replaced index, see publish

    # -- where files are written

    def make_directory(self, directory: str) -> None:
        """Create ``directory`` and its missing parents; :meth:`discard` removes those
        created again (when still empty). ``OSError`` as the file system raises it."""
        self._made = self.store.makedirs(directory) + self._made

    def new_file(self, final: str) -> str:
        """Where to write a new data file that is to appear as ``final`` (a name no live
        file has): a temporary beside it locally, moved into place by :meth:`publish`;
        ``final`` itself on an object store."""
        if not self.renames:
            self.own(final)
            return final
        tmp = temporary_base(final)
        self.own(tmp)
        self._moves.append((tmp, final))
        return tmp

    def last_file(self) -> str:
        """Where to write the last file as a stream (an export's single file): its
        temporary locally; on an object store its final name, whose upload commits."""
        if self.renames:
            self.own(self._last_tmp)
        return self._last_tmp

    def own(self, *files: str) -> None:
        """Count ``files`` (written, or about to be, by this run or its tasks) as this
        run's: :meth:`discard` removes them after a failure."""
        for f in files:
            self._ours[f] = None

    def move(self, written: str, final: str) -> None:
        """Have :meth:`publish` move ``written`` to ``final`` before the last file (a name
        chosen once everything is written: a checkpoint's shard count)."""
        self._moves.append((written, final))

    def write_last(self, data) -> None:
        """The last file's bytes (an index): locally written now under its temporary;
        on an object store kept for :meth:`publish` to store in one request."""
        if not self.renames:
            self._last_data = bytes(data)
            return
        self.own(self._last_tmp)  # before it exists: an interrupt leaves nothing unknown
        self.store.write_new(self._last_tmp, data, durable=self.durable)

    # -- the commit

    def publish(self, *, replace_data: bool = False, retire: str | None = None) -> None:
        """Move the data files into place, then the last file: the commit.

        A data file replaces a file of its name only with ``replace_data`` (else a name
        taken is refused). ``retire``: an index the commit replaces (locally), copied
        under a temporary name of this run first and removed only by
        :meth:`remove_replaced`, so a later run can tell which files a run killed in
        between left. A name taken that may not be replaced is a
        :class:`CheckpointWriteError`; other failures are the ``OSError`` raised.
        """
        try:
            for written, final in self._moves:
                self._move(written, final, replace_data or not self.renames)
            if retire is not None and self.renames:
                self._retire(retire)
            self._move_last()
        except FileExistsError as e:
            raise CheckpointWriteError(
                f"another run wrote {self.what} here meanwhile (pass overwrite to replace it)",
                path=e.filename or self.last,
            ) from None
        self._done = True
        self._ours = {}
        if self.durable:
            self.store.fsync_dir(self.store.dirname(self.last) or ".")

    def _move(self, written: str, final: str, replace: bool) -> None:
        self.own(final)  # before the move: never unlisted
        try:
            if replace:
                self.store.replace(written, final)
            else:
                self.store.rename_noreplace(written, final)
        except FileExistsError:
            del self._ours[final]  # another run's
            raise
        self._ours.pop(written, None)

    def _move_last(self) -> None:
        store = self.store
        if not self.renames:
            data = self._last_data
            if data is not None:  # else the last file's upload was the commit
                self._check = lambda: _holds(store, self.last, data)
                store.write_bytes(self.last, data)  # one request: the commit
            return
        tmp = self._last_tmp
        self._check = lambda: not store.exists(tmp)
        if self.overwrite:
            store.replace(tmp, self.last)
        else:
            store.rename_noreplace(tmp, self.last)

    def _retire(self, index: str) -> None:
        if not self.overwrite or not self.store.isfile(index):
            return
        retired = temporary_base(index)
        self.own(retired)
        self.store.write_new(retired, self.store.read_bytes(index))
        self.retired = retired

    def committed(self) -> bool:
        """Whether the commit happened (also when :meth:`publish` failed part-way or was
        interrupted): what cannot be told counts as committed."""
        if self._done:
            return True
        try:
            return self._check is not None and self._check()
        except BaseException:
            return True  # unknown: keep what may be live

    # -- afterwards

    def discard(self) -> None:
        """After a failure: remove this run's files, unless its commit happened, and the
        directories it made that are empty (best effort; once)."""
        if not self.committed():
            discard(self.store, list(self._ours))
        self._ours = {}
        self.store.remove_dirs(self._made)  # only those still empty
        self._made = []

    def remove_replaced(self, files: Sequence[str]) -> None:
        """After the commit: delete the replaced output's ``files``, then the retired
        index (best effort). An interrupt does not stop it: the file is tried again and
        the rest removed (quick), then the interrupt is raised."""
        interrupted = None
        for stale in [*files, *([self.retired] if self.retired else [])]:
            for _ in range(2):
                try:
                    self.store.remove(stale)
                except (OSError, CheckpointError):
                    pass
                except KeyboardInterrupt as e:
                    interrupted = e
                    continue
                break
        if interrupted is not None:
            raise interrupted


def _holds(store: Storage, path: str, data: bytes) -> bool:
    """Whether the object ``path`` holds ``data``: an upload that failed may have landed."""
    try:
        return store.read_bytes(path) == data
    except FileNotFoundError:
        return False
    except (OSError, CheckpointError):
        return True  # cannot tell: it may


def discard(store: Storage, files: Sequence[str]) -> None:
    """Remove files a failed run wrote on ``store`` (best effort: some may be gone already)."""
    for path in files:
        try:
            store.remove(path)
        except (OSError, CheckpointError):
            pass


class DirectoryCommit:
    """One directory made visible at once (a SavedModel): built whole under a temporary
    name beside it (:attr:`stage`), then renamed into place, the rename being the commit.

    A destination that is not there is taken only if it still is not (another run's
    output is refused, never replaced). An empty directory there is replaced in one step
    (swapped with the stage, then removed: one that filled meanwhile is swapped back and
    refused). With ``overwrite`` a directory there is swapped with the new one in one
    step (Linux; elsewhere see :meth:`~tfckpt.io.storage.Storage.exchange`), then
    removed: until the commit the old directory is untouched, so a failure leaves it as
    it was. Local storage only (object stores cannot rename a directory).

    >>> c = DirectoryCommit(LOCAL, "out/sm", overwrite=False)
    >>> write_everything_under(c.stage); c.publish()
    """

    def __init__(self, store: Storage, final: str, *, overwrite: bool, durable: bool = True):
        if not store.atomic_rename:
            raise CheckpointWriteError(
                "a directory output is renamed into place whole, and this storage cannot "
                "rename one",
                path=final,
            )
        self.store, self.final = store, final
        self.overwrite, self.durable = overwrite, durable
        parent = store.dirname(final) or "."
        for stale in stale_temporaries(store, parent, lambda name: name == store.basename(final)):
            if store.isdir(stale):
                store.remove_tree(stale)  # a killed run's stage
        self._made: list[str] = []
        self._done = False
        try:
            self._made = store.makedirs(parent) if store.dirname(final) else []
            self.stage = temporary_base(final)
            self._made.insert(0, self.stage)
            store.makedirs(self.stage)
        except OSError as e:
            self.store.remove_dirs(self._made)
            raise CheckpointWriteError(
                f"cannot create directory: {e.strerror or e}", path=final
            ) from None

    def publish(self) -> None:
        """Move the stage into place: the commit. A destination another run made meanwhile
        (or, without ``overwrite``, one no longer empty) is a :class:`CheckpointWriteError`,
        and nothing there changes."""
        store, final = self.store, self.final
        try:
            if not store.exists(final):
                store.rename_dir_noreplace(self.stage, final)
                self._done = True
            else:
                store.exchange(self.stage, final)
                self._done = True
                if not self.overwrite:  # the stage holds what was there: empty, or else
                    try:
                        store.remove_dirs([self.stage])
                        if store.exists(self.stage):
                            raise FileExistsError(errno.ENOTEMPTY, "not empty", final)
                    except BaseException:
                        store.exchange(self.stage, final)
                        self._done = False
                        raise
        except FileExistsError:
            raise CheckpointWriteError(
                "another run wrote here meanwhile (pass overwrite to replace it)", path=final
            ) from None
        except OSError as e:
            raise CheckpointWriteError(
                f"cannot move the output into place: {e.strerror or e}", path=final
            ) from None
        if self.durable:
            store.fsync_dir(store.dirname(final) or ".")
        # What it replaced now has the stage's name: removed (an interrupt here leaves it
        # to the next run's clean-up of stale temporaries).
        store.remove_tree(self.stage)
        self._made = []

    def committed(self) -> bool:
        return self._done

    def discard(self) -> None:
        """After a failure before the commit: the stage and what it holds, and the
        directories made for it that are empty (best effort)."""
        if not self._done:
            self.store.remove_tree(self.stage)
        self.store.remove_dirs(self._made[1:])  # the stage's parents, when still empty
        self._made = []


# ---------------------------------------------------------------- checkpoints


def index_bytes(
    entries: Mapping[bytes, BundleEntryProto], num_shards: int, endianness: Endianness
) -> bytes:
    """The index table: the header, then every entry in key order (``entries``: an
    :class:`~tfckpt.format.entryrows.EntryRows` or messages by key)."""
    # Built whole in memory (an index is small), in bulk: then an interrupted run has
    # nothing to store, and an object store gets it in one request or not at all.
    return EntryRows.of(entries).table({HEADER_KEY: encode_header(num_shards, endianness)})


def write_index(
    store: Storage,
    path: str,
    entries: Mapping[bytes, BundleEntryProto],
    num_shards: int,
    endianness: Endianness,
    durable: bool,
) -> None:
    """Write the index table as a new file on ``store`` (see :func:`index_bytes`)."""
    store.write_new(path, index_bytes(entries, num_shards, endianness), durable=durable)


def merge_entries(shards: Sequence[Mapping[bytes, BundleEntryProto]]) -> EntryRows:
    """The index entries of shards written separately: shard ids set, slices joined.

    ``shards[k]`` are the entries :meth:`~tfckpt.checkpoint.writer.ShardWriter.finish` returned
    for shard ``k`` (or messages by key); a partitioned tensor's slices may be spread over
    several. A whole tensor's entry given as a message is taken, not copied: its shard id is
    set in place.
    """
    return merge_rows(shards)


def check_partitions(entries: Mapping[bytes, BundleEntryProto]) -> None:
    """``ValueError`` when a partitioned tensor's slices overlap."""
    for key, entry in EntryRows.of(entries).protos.items():
        if entry.slices:
            check_slice_cover(
                tuple(slice_from_proto(x) for x in entry.slices),
                entry_shape(entry),
                lambda what, key=key: ValueError(
                    f"partitioned tensor {orderedcode.decode_name(key)!r}: {what}"
                ),
            )


def data_files(store: Storage, prefix: str) -> list[str]:
    """Every data file (or object) of ``prefix`` on ``store``, whatever its shard count."""
    directory = store.dirname(prefix) or "."
    base = store.basename(prefix)
    try:
        names = store.listdir(directory)
    except (OSError, CheckpointError):
        return []
    out = []
    for n in names:
        parsed = paths.parse_data_filename(n)
        if parsed and parsed[0] == base:
            out.append(store.join(store.dirname(prefix), n) if store.dirname(prefix) else n)
    return out


def free_shard_count(existing: Sequence[str], count: int) -> int:
    """The least shard count from ``count`` on that no file in ``existing`` was written for.

    Data file names follow from the prefix, the shard id and the shard count, so
    new data under another count can never replace a committed checkpoint's data
    before the new index replaces its own; the extra shards stay empty (TensorFlow
    reads such checkpoints as any other).
    """
    parsed = (paths.parse_data_filename(f) for f in existing)
    taken = {p[2] for p in parsed if p is not None}
    while count in taken:
        count += 1
    return count


def _file_name(path: str) -> str:
    return path.replace(os.sep, "/").rsplit("/", 1)[-1]


def new_shard_paths(store: Storage, prefix: str, count: int) -> list[str]:
    """Where a run writes the ``count`` data shards of ``prefix`` (on ``store``) before its
    commit.

    Where commits rename, temporaries beside the prefix; elsewhere (object stores) the
    final names, under a shard count no committed index uses (see
    :func:`free_shard_count`): the shards past ``count`` are to stay empty.
    """
    if store.atomic_rename:
        base = temporary_base(prefix)
        return [f"{base}.data-{k}" for k in range(count)]
    total = free_shard_count(data_files(store, prefix), count)
    return [paths.data_filename(prefix, k, total) for k in range(total)]


def bundle_commit(
    store: Storage, prefix: str, shard_paths: Sequence[str], *, overwrite: bool, durable: bool
) -> Commit:
    """The :class:`Commit` of a run writing a checkpoint at ``prefix``, its shards at
    ``shard_paths`` (see :func:`new_shard_paths`; written by the run or its tasks),
    with the prefix's directory made: shards and directories are the run's from now
    on, removed after a failure (:meth:`Commit.discard`)."""
    commit = _bundle_commit(store, prefix, _temporary_base(prefix, shard_paths), overwrite, durable)
    commit.own(*shard_paths)
    try:
        commit.make_directory(store.dirname(prefix))
    except OSError as e:
        raise CheckpointWriteError(
            f"cannot create directory: {e.strerror or e}", path=prefix
        ) from None
    return commit


def _bundle_commit(
    store: Storage, prefix: str, base: str, overwrite: bool, durable: bool
) -> Commit:
    """A checkpoint's :class:`Commit`: its index last; ``base`` names the temporary index."""
    return Commit(
        store,
        paths.index_filename(prefix),
        overwrite=overwrite,
        durable=durable,
        temporary=f"{base}.index",
    )


def _temporary_base(prefix: str, shard_paths: Sequence[str]) -> str:
    """What names a run's other temporaries (the index, extra empty shards): the base of
    its shards' (see :func:`new_shard_paths`)."""
    return shard_paths[0].rsplit(".data-", 1)[0] if shard_paths else temporary_base(prefix)


def _add_empty_shards(commit: Commit, shard_paths: list[str], count: int, base: str) -> None:
    """Grow ``shard_paths`` (in place) to ``count`` shards with empty ones named after ``base``."""
    store = commit.store
    try:
        while len(shard_paths) < count:
            path = f"{base}.data-{len(shard_paths)}"
            # Listed before it exists: an interrupt between the two leaves no file the
            # clean-up does not know of.
            shard_paths.append(path)
            commit.own(path)
            f = store.open_writer(path)  # written as any shard is, holding no tensor
            try:
                f.flush()
                if commit.durable:
                    store.fsync(f)
            finally:
                f.close()
    except OSError as e:
        raise CheckpointWriteError(f"cannot create data file: {e.strerror}", path=base) from None


def publish_bundle(
    commit: Commit,
    prefix: str,
    shard_paths: Sequence[str],
    entries: Mapping[bytes, BundleEntryProto],
    *,
    base: str,
    endianness: Endianness = "little",
    count: int | None = None,
) -> list[str]:
    """Make closed data files one checkpoint at ``prefix`` through ``commit``, the index
    last; the data files of the checkpoint it replaced (to remove after).

    ``count``: the shards are already at their final names for that many shards (on an
    object store, see :func:`new_shard_paths`). Otherwise the shard count is chosen now:
    locally, with an index there or without ``overwrite``, one no file there has (a
    link fails on a name taken); leftovers of killed runs, with no index, may be
    replaced by an overwriting run. On an object store, one no committed index uses.
    Extra shards are written empty, named after ``base``.
    """
    check_partitions(entries)
    store = commit.store
    old = data_files(store, prefix)
    if count is None:
        fresh = store.atomic_rename and commit.overwrite and not store.exists(commit.last)
        count = free_shard_count([] if fresh else old, len(shard_paths))
    elif list(shard_paths) != [paths.data_filename(prefix, i, count) for i in range(count)]:
        raise ValueError("remote shards must be written under their final names")
    finals = [paths.data_filename(prefix, i, count) for i in range(count)]
    shard_paths = list(shard_paths)
    _add_empty_shards(commit, shard_paths, count, base)
    for path, final in zip(shard_paths, finals):
        if path != final:
            commit.move(path, final)
    try:
        commit.write_last(index_bytes(entries, count, endianness))
    except OSError as e:
        raise CheckpointWriteError(f"write failed: {e.strerror}", path=prefix) from None
    try:
        commit.publish(replace_data=commit.overwrite)
    except OSError as e:
        if not store.atomic_rename:
            raise CheckpointWriteError(f"write failed: {e.strerror or e}", path=prefix) from None
        raise CheckpointWriteError(
            f"cannot move the checkpoint into place: {e.strerror}", path=prefix
        ) from None
    kept = {_file_name(f) for f in finals}
    return [f for f in old if _file_name(f) not in kept]


def commit(
    store: Storage,
    prefix: str,
    shard_paths: Sequence[str],
    entries: Mapping[bytes, BundleEntryProto],
    *,
    base: str,
    endianness: Endianness = "little",
    durable: bool = True,
    overwrite: bool = True,
) -> str:
    """Make closed temporary data files one checkpoint at ``prefix`` on ``store``, the
    index last (:func:`publish_bundle`), then remove the data the replaced checkpoint used.

    ``base`` names this run's other temporaries (the index, extra empty shards).
    Without ``overwrite`` a checkpoint another run committed meanwhile is an error,
    never replaced. On failure what this call created or moved is removed;
    ``shard_paths`` themselves are the caller's.
    """
    c = _bundle_commit(store, prefix, base, overwrite, durable)
    return _commit_bundle(c, prefix, shard_paths, entries, base, endianness, None)


def commit_shards(
    store: Storage,
    prefix: str,
    shard_paths: Sequence[str],
    entries: Mapping[bytes, BundleEntryProto],
    *,
    endianness: Endianness = "little",
    durable: bool = True,
    overwrite: bool = True,
    commit: Commit | None = None,
) -> str:
    """Make shards written separately one checkpoint at ``prefix`` on ``store``: the index
    goes last.

    Locally, ``shard_paths`` are temporary files renamed into place before the index
    (without ``overwrite``, a checkpoint another run committed meanwhile is an error,
    never replaced); on an object store they already carry their final names (see
    :func:`new_shard_paths`) and writing the index is the commit. The data files of the
    checkpoint it replaced are deleted after. On failure the shards are removed, unless
    the commit happened. ``commit``: the run's :func:`bundle_commit`, when it has one (its
    ``overwrite`` and ``durable`` apply).
    """
    base = _temporary_base(prefix, shard_paths)
    if commit is None:
        commit = _bundle_commit(store, prefix, base, overwrite, durable)
        commit.own(*shard_paths)
    count = None if commit.renames else len(shard_paths)
    return _commit_bundle(commit, prefix, shard_paths, entries, base, endianness, count)


def _commit_bundle(
    c: Commit,
    prefix: str,
    shard_paths: Sequence[str],
    entries: Mapping[bytes, BundleEntryProto],
    base: str,
    endianness: Endianness,
    count: int | None,
) -> str:
    """:func:`publish_bundle`, then the replaced data removed; on failure
    :meth:`Commit.discard`."""
    try:
        replaced = publish_bundle(
            c, prefix, shard_paths, entries, base=base, endianness=endianness, count=count
        )
    except BaseException:
        c.discard()
        raise
    c.remove_replaced(replaced)
    return prefix


def write_state_file(store: Storage, directory: str, prefix_name: str) -> None:
    """Record ``prefix_name`` as the latest checkpoint of ``directory`` on ``store``
    (atomically)."""
    state = paths.read_state_file(store, directory) or CheckpointState()
    state.model_checkpoint_path = prefix_name
    if prefix_name not in state.all_model_checkpoint_paths:
        state.all_model_checkpoint_paths.append(prefix_name)
        del state.all_model_checkpoint_timestamps[:]
    path = store.join(directory, paths.STATE_FILENAME)
    data = MessageToString(state).encode("utf-8")
    if not store.atomic_rename:
        store.write_bytes(path, data)  # one PUT: all or nothing on an object store
        return
    tmp = f"{path}{TMP_MARK}{os.getpid()}"
    try:
        store.write_bytes(tmp, data)
        store.replace(tmp, path)
    except BaseException:
        try:
            store.remove(tmp)
        except OSError:
            pass
        raise
