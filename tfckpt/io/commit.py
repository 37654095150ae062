"""Making written data files a checkpoint: the index goes last, or nothing appears.

Writes the index table (temporaries and their clean-up after a killed run are
:mod:`tfckpt.io.temporaries`), merging the entries of shards written
separately, choosing a shard count no committed checkpoint uses, the commit
itself (locally: renames, the index's the last, refusing to replace a checkpoint
unless asked to; on an object store: the index written last) and removing the
data the replaced checkpoint used. The state file that names the latest
checkpoint is committed here too. File operations go through
:mod:`tfckpt.io.storage`.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence

from google.protobuf.text_format import MessageToString

from tfckpt._proto.checkpoint_state_pb2 import CheckpointState
from tfckpt._proto.tensor_bundle_pb2 import BundleEntryProto
from tfckpt.errors import CheckpointError, CheckpointWriteError
from tfckpt.format import orderedcode
from tfckpt.format.bundle import HEADER_KEY, encode_header, entry_shape, slice_from_proto
from tfckpt.format.dtypes import Endianness
from tfckpt.format.slices import check_slice_cover
from tfckpt.format.table import TableBuilder
from tfckpt.io import paths
from tfckpt.io.storage import Storage
from tfckpt.io.temporaries import TMP_MARK, temporary_base


def write_index(
    store: Storage,
    path: str,
    entries: Mapping[bytes, BundleEntryProto],
    num_shards: int,
    endianness: Endianness,
    durable: bool,
) -> None:
    """Write the index table (a new file on ``store``): the header, then every entry in key
    order."""
    # Built whole in memory first (an index is small): then an interrupted run has
    # nothing to store, and an object store gets it in one request or not at all.
    buf = io.BytesIO()
    table = TableBuilder(buf)
    table.add(HEADER_KEY, encode_header(num_shards, endianness))
    for key in sorted(entries):
        table.add(key, entries[key].SerializeToString())
    table.finish()
    store.write_new(path, buf.getbuffer(), durable=durable)


def merge_entries(shards: Sequence[Mapping[bytes, BundleEntryProto]]) -> dict:
    """The index entries of shards written separately: shard ids set, slices joined.

    ``shards[k]`` are the entries :meth:`~tfckpt.checkpoint.writer.ShardWriter.finish` returned
    for shard ``k``; a partitioned tensor's slices may be spread over several. A whole
    tensor's entry is taken, not copied: its shard id is set in place.
    """
    merged: dict[bytes, BundleEntryProto] = {}
    for shard_id, entries in enumerate(shards):
        for key, entry in entries.items():
            if entry.slices:  # a partitioned tensor's own entry: holds no bytes
                known = merged.get(key)
                if known is None:
                    known = merged[key] = BundleEntryProto()
                    known.CopyFrom(entry)
                    del known.slices[:]
                    # Holds no bytes, yet records the shard it was first written to, as
                    # TensorFlow's merge of bundles shifts every entry's shard id.
                    known.shard_id = shard_id
                known.slices.extend(entry.slices)
                continue
            if key in merged:
                raise ValueError(f"tensor {orderedcode.decode_name(key)!r} written to two shards")
            entry.shard_id = shard_id
            merged[key] = entry
    return merged


def check_partitions(entries: Mapping[bytes, BundleEntryProto]) -> None:
    """``ValueError`` when a partitioned tensor's slices overlap."""
    for key, entry in entries.items():
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


def remove_replaced_data(store: Storage, old: Sequence[str], keep: Sequence[str]) -> None:
    """After a commit: delete the data files the replaced checkpoint used (best effort)."""
    kept = {_file_name(k) for k in keep}
    for stale in old:
        if _file_name(stale) in kept:
            continue
        try:
            store.remove(stale)
        except (OSError, CheckpointError):
            pass


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


def discard(store: Storage, files: Sequence[str]) -> None:
    """Remove files a failed run wrote on ``store`` (best effort: some may be gone already)."""
    for path in files:
        try:
            store.remove(path)
        except (OSError, CheckpointError):
            pass


def _empty_shard(store: Storage, path: str, durable: bool) -> None:
    """An extra shard, written as any shard is, that holds no tensor."""
    f = store.open_writer(path)
    try:
        f.flush()
        if durable:
            store.fsync(f)
    finally:
        f.close()


def _add_empty_shards(
    store: Storage, shard_paths: list[str], count: int, base: str, durable: bool
) -> None:
    """Grow ``shard_paths`` (in place) to ``count`` shards with empty ones named after ``base``."""
    try:
        while len(shard_paths) < count:
            path = f"{base}.data-{len(shard_paths)}"
            # Listed before it exists: an interrupt between the two leaves no file the
            # clean-up does not know of.
            shard_paths.append(path)
            _empty_shard(store, path, durable)
    except OSError as e:
        raise CheckpointWriteError(f"cannot create data file: {e.strerror}", path=base) from None


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
    index last.

    ``base`` names this run's other temporaries (the index, extra empty shards).
    Locally the files are renamed into place and the index's rename commits;
    without ``overwrite`` they are linked in instead, which fails on a name already
    taken, so a checkpoint another run committed meanwhile is an error, never
    replaced. On an object store the data objects move to names no committed index
    uses, and the index written after them commits. Either way the data files of
    the replaced checkpoint are deleted after. On failure what this call created
    or moved is removed; ``shard_paths`` themselves are the caller's.
    """
    check_partitions(entries)
    index = paths.index_filename(prefix)
    shard_paths = list(shard_paths)
    given = len(shard_paths)
    old_shards = data_files(store, prefix)
    if store.atomic_rename:
        # Leftovers of killed runs, with no index, may be replaced by an overwriting
        # run; a run that may not replace anything links its files in, and a link
        # fails on any name already taken, so it picks names no file has.
        avoid = old_shards if store.exists(index) or not overwrite else []
    else:
        avoid = old_shards
    num_shards = free_shard_count(avoid, given)
    finals = [paths.data_filename(prefix, i, num_shards) for i in range(num_shards)]
    index_tmp = f"{base}.index"
    placed: list[str] = []  # ours at their final names
    try:
        _add_empty_shards(store, shard_paths, num_shards, base, durable)
        if store.atomic_rename:
            _place(
                store,
                prefix,
                shard_paths,
                finals,
                index_tmp,
                entries,
                endianness,
                durable,
                overwrite,
                placed,
            )
        else:
            try:
                for path, final in zip(shard_paths, finals):
                    store.replace(path, final)
                    placed.append(final)
                write_index(store, index, entries, num_shards, endianness, durable)
            except OSError as e:
                raise CheckpointWriteError(
                    f"write failed: {e.strerror or e}", path=prefix
                ) from None
    except BaseException:
        discard(
            store,
            placed
            + shard_paths[max(given, len(placed)) :]
            + ([index_tmp] if store.atomic_rename else []),
        )
        raise
    if durable:
        store.fsync_dir(store.dirname(prefix) or ".")
    remove_replaced_data(store, old_shards, finals)
    return prefix


def _place(
    store: Storage,
    prefix: str,
    shard_paths: list[str],
    finals: list[str],
    index_tmp: str,
    entries,
    endianness: Endianness,
    durable: bool,
    overwrite: bool,
    placed: list[str],
) -> None:
    """Write the index beside the data, then rename them all into place, the index last."""
    index = paths.index_filename(prefix)
    try:
        write_index(store, index_tmp, entries, len(finals), endianness, durable)
    except OSError as e:
        raise CheckpointWriteError(f"write failed: {e.strerror}", path=prefix) from None
    try:
        for path, final in zip(shard_paths + [index_tmp], finals + [index]):
            # The index's move is the commit: one atomic rename or link.
            if overwrite:
                store.replace(path, final)
            else:
                store.rename_noreplace(path, final)
            placed.append(final)
    except FileExistsError as e:  # a name taken meanwhile was never replaced
        raise CheckpointWriteError(
            "another run wrote a checkpoint here meanwhile (pass overwrite to replace it)",
            path=e.filename or index,
        ) from None
    except OSError as e:
        raise CheckpointWriteError(
            f"cannot move the checkpoint into place: {e.strerror}", path=prefix
        ) from None


def commit_shards(
    store: Storage,
    prefix: str,
    shard_paths: Sequence[str],
    entries: dict,
    *,
    endianness: Endianness = "little",
    durable: bool = True,
    overwrite: bool = True,
) -> str:
    """Make shards written separately one checkpoint at ``prefix`` on ``store``: the index
    goes last.

    Locally, ``shard_paths`` are temporary files renamed into place before the index
    (as :func:`commit` does; without ``overwrite``, a checkpoint another run
    committed meanwhile is an error, never replaced); on an object store they already
    carry their final names (see :func:`free_shard_count`), writing the index is the
    commit, and the data objects of the checkpoint it replaced are deleted after it.
    On failure the shards are removed.
    """
    num_shards = len(shard_paths)
    if not store.atomic_rename:
        check_partitions(entries)
        finals = [paths.data_filename(prefix, i, num_shards) for i in range(num_shards)]
        if list(shard_paths) != finals:
            raise ValueError("remote shards must be written under their final names")
        old_shards = data_files(store, prefix)
        write_index(store, paths.index_filename(prefix), entries, num_shards, endianness, durable)
        remove_replaced_data(store, old_shards, finals)
        return prefix
    # Extra (empty) shards go beside the ones written.
    base = shard_paths[0].rsplit(".data-", 1)[0] if shard_paths else temporary_base(prefix)
    try:
        return commit(
            store,
            prefix,
            shard_paths,
            entries,
            base=base,
            endianness=endianness,
            durable=durable,
            overwrite=overwrite,
        )
    except BaseException:
        discard(store, shard_paths)
        raise


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
