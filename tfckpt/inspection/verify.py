"""``tfckpt verify``: every checksum and every shard file of a checkpoint checked."""

from __future__ import annotations

from tfckpt.checkpoint.opening import open_checkpoint
from tfckpt.checkpoint.reader import DEFAULT_CHUNK_BYTES, Checkpoint
from tfckpt.errors import CheckpointError, CheckpointNotFoundError
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY, ObjectGraph
from tfckpt.format.slices import format_slice
from tfckpt.inspection.reading import stored_chunks
from tfckpt.io import paths
from tfckpt.io.storage import StorageOptions

# --- verify ------------------------------------------------------------------


def verify(
    path,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    storage_options: StorageOptions | None = None,
) -> dict:
    """A full integrity check: ``{"prefix", "tensors", "bytes", "problems", "warnings"}``.

    Checks every index block checksum, every tensor's CRC32C, that every entry
    lies inside its shard, the shard files against the header, that slices cover
    each partitioned tensor exactly once, string framing, and that the object
    graph parses and every ``checkpoint_key`` in it exists. Problems are listed,
    one line each, instead of stopping at the first; ``warnings`` lists what is odd
    but harmless (data files of another shard count at the same prefix); ``partial``
    lists, as information, each pre-sliced tensor (slices that leave parts out, as
    TensorFlow writes them on purpose): its stored slices are checked like any other.
    """
    problems: list[str] = []
    try:
        ckpt = open_checkpoint(path, verify=True, storage_options=storage_options)
    except CheckpointNotFoundError:
        raise  # nothing to verify: a usage error, not a finding
    except CheckpointError as e:
        return {
            "prefix": str(path),
            "tensors": 0,
            "bytes": 0,
            "problems": [str(e)],
            "warnings": [],
            "partial": [],
        }
    with ckpt:
        shard_problems, warnings = _check_shard_files(ckpt)
        problems += shard_problems
        checked = nbytes = 0
        partial = []
        for name in ckpt.keys():
            try:
                info = ckpt.info(name)
                if info.dtype == "variant":  # no numpy values: check the framed bytes
                    for extents in info.slices or [None]:
                        ckpt.read_bytes(name, extents)
                else:
                    for _ in stored_chunks(ckpt, name, chunk_bytes):
                        pass
                if info.partial:
                    partial.append(_partial_note(ckpt, info))
                checked += 1
                nbytes += info.nbytes
            except CheckpointError as e:
                problems.append(str(e))
        for key in ckpt.orphan_slice_keys():
            problems.append(f"{ckpt.index_path}: slice entry {key!r} belongs to no tensor")
        if OBJECT_GRAPH_KEY in ckpt:
            try:
                graph = ObjectGraph.of(ckpt)
                for missing in graph.missing_keys(set(ckpt.keys())):
                    problems.append(
                        f"{ckpt.prefix}: the object graph names {missing!r}, which "
                        "the checkpoint lacks"
                    )
            except CheckpointError as e:
                problems.append(str(e))
        other = {"format": ckpt.format} if ckpt.format != Checkpoint.format else {}
        return {
            "prefix": ckpt.prefix,
            **other,
            "tensors": checked,
            "bytes": nbytes,
            "problems": problems,
            "warnings": warnings,
            "partial": partial,
        }


def _partial_note(ckpt: Checkpoint, info) -> str:
    return (
        f"{ckpt.prefix}: tensor {info.name!r}: pre-sliced, {info.stored_elements} of "
        f"{info.size} elements stored in {len(info.slices)} slice(s) "
        f"({' '.join(format_slice(s) for s in info.slices)})"
    )


def _check_shard_files(ckpt: Checkpoint) -> tuple[list[str], list[str]]:
    """The data files on disk against the header's shard count (one directory listing).

    Missing shards are problems; data files of the same prefix with another shard
    count (left by an earlier checkpoint) are only warnings: nothing reads them.
    """
    if ckpt.format != Checkpoint.format:
        return [], []  # a V1 checkpoint's files were all read when it was opened
    store = ckpt.storage
    directory = store.dirname(ckpt.prefix) or "."
    base = store.basename(ckpt.prefix)
    n = ckpt.header.num_shards
    present, problems, warnings = set(), [], []
    for name in sorted(store.listdir(directory)):
        parsed = paths.parse_data_filename(name)
        if not parsed or parsed[0] != base:
            continue
        if parsed[2] != n:
            warnings.append(
                f"{store.join(directory, name)}: data file of a {parsed[2]}-shard "
                f"checkpoint, but the header says {n}; it is not part of this one"
            )
        elif parsed[1] < n:
            present.add(parsed[1])
            path = store.join(directory, name)
            if store.irregular(path):
                problems.append(f"{path}: data shard is not a regular file")
    missing = [i for i in range(min(n, len(present) + 6)) if i not in present]
    for i in missing[:5]:
        problems.append(f"{paths.data_filename(ckpt.prefix, i, n)}: data shard is missing")
    if n - len(present) > 5:
        problems.append(f"{ckpt.prefix}: {n - len(present)} of {n} data shards are missing")
    return problems, warnings
