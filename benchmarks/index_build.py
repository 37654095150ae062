"""A written checkpoint's index entries, kept and encoded: messages vs columns, side by side.

    python benchmarks/index_build.py [--tensors 200000] [--shards 1] [--repeat 3]

For N whole tensors (names like ``scope_0000/var_00``, one shape, offsets growing as a
writer's do), what a writer keeps until its index is written and what writing the index
then costs, two ways, in one process:

- messages: a ``BundleEntryProto`` per tensor (``entry_proto``), merged as shards were
  (shard id set in place), then ``SerializeToString`` and ``TableBuilder.add`` entry by
  entry: what tfckpt did before issue #29;
- columns: :class:`~tfckpt.format.entryrows.EntryRows` (``add`` per tensor),
  ``merge_rows``, then ``EntryRows.table``: what writers do now.

Reported: the memory of the kept entries (the resident set's growth while they are added
in a child process, and what tracemalloc sees of it: not protobuf's arenas), the time to
add them, the time of merge + encode + table (medians of ``--repeat`` runs), and the
peak memory tracemalloc sees during merge + encode + table beyond the table's own bytes
(the columns' are encoded a piece at a time: it should not grow with ``--tensors``),
with the ratios; the two index tables are compared byte for byte.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time
import tracemalloc

from tfckpt.format import dtypes as _dt
from tfckpt.format.bundle import HEADER_KEY, encode_header, entry_proto
from tfckpt.format.entryrows import EntryRows, merge_rows
from tfckpt.format.table import TableBuilder


def _tensors(n: int, shards: int):
    f16 = _dt.lookup("float16")
    per = -(-n // shards)
    return [
        (
            b"scope_%04d/var_%02d" % divmod(i, 100),
            f16,
            (256,),
            i // per,
            (i % per) * 512,
            512,
            (i * 2654435761) & 0xFFFFFFFF,
        )
        for i in range(n)
    ]


def _messages(tensors, shards: int):
    out: list[dict] = [{} for _ in range(shards)]
    for key, dt, shape, shard, offset, size, crc in tensors:
        out[shard][key] = entry_proto(dt, shape, 0, offset, size, crc)
    return out


def _messages_index(kept, header: bytes) -> bytes:
    merged = {}
    for shard_id, entries in enumerate(kept):
        for key, entry in entries.items():
            entry.shard_id = shard_id
            merged[key] = entry
    buf = io.BytesIO()
    table = TableBuilder(buf)
    table.add(HEADER_KEY, header)
    for key in sorted(merged):
        table.add(key, merged[key].SerializeToString())
    table.finish()
    return buf.getvalue()


def _columns(tensors, shards: int):
    out = [EntryRows() for _ in range(shards)]
    for key, dt, shape, shard, offset, size, crc in tensors:
        out[shard].add(key, dt.enum, shape, 0, offset, size, crc)
    return out


def _columns_index(kept, header: bytes) -> bytes:
    return merge_rows(kept).table({HEADER_KEY: header})


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _kept_memory(keep, tensors, shards) -> tuple[int, int]:
    """Traced memory and resident-set growth of the kept entries, in a fresh child
    process (protobuf's messages live in arenas that tracemalloc does not see)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, report, leave
        rss = _rss()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        kept = keep(tensors, shards)
        traced = tracemalloc.get_traced_memory()[0] - before
        os.write(write, f"{traced} {_rss() - rss}".encode())
        del kept
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        traced, grown = map(int, f.read().split())
    os.waitpid(pid, 0)
    return traced, grown


def _measure(keep, index, tensors, shards, header, repeat):
    memory = _kept_memory(keep, tensors, shards)
    adds, builds, out = [], [], b""
    for _ in range(repeat):
        t = time.perf_counter()
        kept = keep(tensors, shards)
        adds.append(time.perf_counter() - t)
        t = time.perf_counter()
        out = index(kept, header)
        builds.append(time.perf_counter() - t)
        del kept
    kept = keep(tensors, shards)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    out = index(kept, header)
    peak = tracemalloc.get_traced_memory()[1] - before - len(out)
    tracemalloc.stop()
    return memory, statistics.median(adds), statistics.median(builds), out, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=200_000)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tensors = _tensors(args.tensors, args.shards)
    header = encode_header(args.shards, "little")
    rows = {}
    for name, keep, index in (
        ("messages", _messages, _messages_index),
        ("columns", _columns, _columns_index),
    ):
        rows[name] = _measure(keep, index, tensors, args.shards, header, args.repeat)
    same = rows["messages"][3] == rows["columns"][3]
    print(
        f"{args.tensors} tensors, {args.shards} shard(s), medians of {args.repeat}; "
        f"load average {os.getloadavg()[0]:.2f}; index tables identical: {same}"
    )
    print(
        "| entries kept as | RSS growth | per tensor | traced (tracemalloc) | add all "
        "| merge + encode + table | its traced peak beyond the table |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, ((traced, grown), add, build, _, peak) in rows.items():
        print(
            f"| {name} | {grown / 2**20:.1f} MiB | {grown / args.tensors:.0f} B | "
            f"{traced / 2**20:.1f} MiB | {add:.3f} s | {build:.3f} s | {peak / 2**20:.1f} MiB |"
        )
    m, c = rows["messages"], rows["columns"]
    print(
        f"ratios messages/columns: RSS growth {m[0][1] / c[0][1]:.1f}×, add {m[1] / c[1]:.1f}×, "
        f"merge + encode + table {m[2] / c[2]:.1f}×, its peak {m[4] / c[4]:.1f}×"
    )
    if not same:
        raise SystemExit("the index tables differ")


if __name__ == "__main__":
    main()
