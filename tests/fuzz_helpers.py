"""The fuzz harness and hand-built tables, for the tests of broken and hostile checkpoints.

- :func:`check_case` runs everything a user can do with a checkpoint (:func:`exercise`)
  under a time limit and an allocation bound (a multiple of the files' size): the outcome
  is "ok" or "error" (a ``CheckpointError``); anything else fails the test.
- :func:`table` and the block builders beside it write table files block by block, as
  TensorFlow lays them out, with whatever lies a test wants in them (right checksums).

No TensorFlow here: ``test_fuzz.py`` must skip cleanly where it is absent.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import tracemalloc
from pathlib import Path

import pytest

import tfckpt
from tfckpt import inspection as tfinspect
from tfckpt.format.table import (
    FOOTER_SIZE,
    NO_COMPRESSION,
    BlockHandle,
    Footer,
    crc32c,
    decode_varint,
    encode_varint,
    mask_crc,
    parse_block,
)

TIME_LIMIT_S = 10
U32 = struct.Struct("<I")  # a restart point or count, as the table stores it


# --- the harness ----------------------------------------------------------------


def prefix_files(prefix: str) -> list[str]:
    d, base = os.path.split(prefix)
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.startswith(base + "."))


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def exercise(prefix: str) -> str:
    """Everything a user can do with a checkpoint; returns 'ok' or 'error'."""
    outcome = "ok"
    try:
        ckpt = tfckpt.open(prefix)
    except tfckpt.CheckpointError:
        return "error"
    with ckpt:
        assert ckpt.header.num_shards >= 1
        for name in ckpt.keys():
            try:
                info = ckpt.info(name)
                value = ckpt[name]
                assert value.shape == info.shape
                for _ in ckpt.iter_chunks(name, 64):
                    pass
                ckpt.slice_info(name)
            except tfckpt.CheckpointError:
                outcome = "error"
        try:
            tfinspect.object_graph(ckpt)
        except tfckpt.CheckpointError:
            pass
        try:
            tfinspect.dump(ckpt)
        except tfckpt.CheckpointError:
            outcome = "error"
    report = tfinspect.verify(prefix)
    assert isinstance(report["problems"], list)
    return outcome


def check_case(prefix: str, description: str) -> str:
    """Run ``exercise`` under a time limit and an allocation bound; fail on anything else."""
    budget = sum(os.path.getsize(f) for f in prefix_files(prefix)) * 8 + (16 << 20)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
    tracemalloc.start()
    try:
        outcome = exercise(prefix)
    except _Timeout:
        pytest.fail(f"{description}: took more than {TIME_LIMIT_S} s")
    except Exception as e:  # anything but CheckpointError escaping is a bug
        pytest.fail(f"{description}: {type(e).__name__}: {e}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak <= budget, f"{description}: allocated {peak} bytes for {budget // 8} of files"
    return outcome


# --- building tables block by block ----------------------------------------------


def with_trailer(contents: bytes) -> bytes:
    """A block as it lies in the file: contents, compression type, masked CRC32C."""
    kind = bytes([NO_COMPRESSION])
    return contents + kind + U32.pack(mask_crc(crc32c(kind, crc32c(contents))))


def block(entries, interval: int = 16) -> bytes:
    """Contents of one block holding ``entries`` (key, value), as TensorFlow builds it: each
    key shares its prefix with the key before it, but every ``interval``-th, a restart
    point, which is whole."""
    out, restarts, last = bytearray(), [], b""
    for i, (key, value) in enumerate(entries):
        shared = 0
        if i % interval:
            limit = min(len(last), len(key))
            while shared < limit and last[shared] == key[shared]:
                shared += 1
        else:
            restarts.append(len(out))
        out += encode_varint(shared) + encode_varint(len(key) - shared)
        out += encode_varint(len(value)) + key[shared:] + value
        last = key
    restarts = restarts or [0]
    return bytes(out) + struct.pack(f"<{len(restarts)}I", *restarts) + U32.pack(len(restarts))


def raw_block(items, restarts) -> bytes:
    """Contents from explicit (shared, non-shared key bytes, value) triples and restarts."""
    out = bytearray()
    for shared, tail, value in items:
        out += encode_varint(shared) + encode_varint(len(tail)) + encode_varint(len(value))
        out += tail + value
    return bytes(out) + struct.pack(f"<{len(restarts)}I", *restarts) + U32.pack(len(restarts))


def entry_starts(contents: bytes) -> list[int]:
    """Offset of every entry in a block's contents."""
    (n,) = U32.unpack_from(contents, len(contents) - 4)
    limit, pos, out = len(contents) - 4 - 4 * n, 0, []
    while pos < limit:
        out.append(pos)
        _, pos = decode_varint(contents, pos, limit, 5)
        non_shared, pos = decode_varint(contents, pos, limit, 5)
        value_len, pos = decode_varint(contents, pos, limit, 5)
        pos += non_shared + value_len
    return out


def with_restarts(contents: bytes, restarts) -> bytes:
    """The same entries with another restart array."""
    (n,) = U32.unpack_from(contents, len(contents) - 4)
    limit = len(contents) - 4 - 4 * n
    return contents[:limit] + struct.pack(f"<{len(restarts)}I", *restarts) + U32.pack(len(restarts))


def table(blocks, refs=None, index_items=None) -> bytes:
    """A table file: data blocks [(separator, contents)], metaindex, index block, footer.

    ``refs`` replaces the index block's entries: (separator, block number or a
    BlockHandle of any bytes in the file); ``index_items`` gives them raw instead:
    (shared, non-shared key bytes, block number), with one restart point.
    """
    out = bytearray()
    handles = []
    for _, contents in blocks:
        handles.append(BlockHandle(len(out), len(contents)))
        out += with_trailer(contents)
    meta = block([])
    meta_handle = BlockHandle(len(out), len(meta))
    out += with_trailer(meta)
    if refs is None:
        refs = [(sep, i) for i, (sep, _) in enumerate(blocks)]
    contents = block(
        [(sep, (handles[ref] if isinstance(ref, int) else ref).encode()) for sep, ref in refs], 1
    )
    if index_items is not None:
        contents = raw_block([(n, tail, handles[i].encode()) for n, tail, i in index_items], [0])
    index_handle = BlockHandle(len(out), len(contents))
    out += with_trailer(contents)
    return bytes(out + Footer(meta_handle, index_handle).encode())


def data_blocks(index: bytes) -> list[tuple[bytes, bytes]]:
    """(separator, contents) of every data block of a table file."""
    footer = Footer.decode(index[-FOOTER_SIZE:])
    out = []
    for sep, h in parse_block(index[footer.index.offset : footer.index.offset + footer.index.size]):
        handle, _ = BlockHandle.decode(h, 0, len(h))
        out.append((sep, index[handle.offset : handle.offset + handle.size]))
    return out


def copy_prefix(prefix: str, dest: Path) -> str:
    """Copy a checkpoint's files into ``dest``; returns the copy's prefix."""
    src = Path(prefix)
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.parent.glob(src.name + ".*"):
        shutil.copy(f, dest / f.name)
    return str(dest / src.name)
