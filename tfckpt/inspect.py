"""What is in a checkpoint, as plain data: the library side of ``tfckpt dump``.

Functions here return dicts and lists of JSON-ready values; printing them is the
CLI's job.
"""

from __future__ import annotations

import re
from typing import Iterable

from .bundle import Checkpoint


def scope_of(name: str) -> str:
    """The top-level scope a tensor belongs to (``model`` of ``model/dense/kernel``)."""
    return name.split("/", 1)[0] if "/" in name else name


def _match(names: Iterable[str], pattern: str | None) -> list[str]:
    if pattern is None:
        return list(names)
    rx = re.compile(pattern)
    return [n for n in names if rx.search(n)]


def dump(ckpt: Checkpoint, *, filter: str | None = None) -> dict:
    """Header facts, one record per tensor and bytes per top-level scope.

    Reads only the index. Field names are stable:
    ``{"prefix", "num_shards", "endianness", "version": {...}, "tensor_count",
    "total_bytes", "tensors": [{"name", "dtype", "shape", "bytes", "shard",
    "offset", "crc32c", "slices"}], "scopes": [{"scope", "bytes", "tensors"}]}``.
    ``slices`` lists ``[[start, length_or_null], ...]`` per stored slice; ``shard``,
    ``offset`` and ``crc32c`` are null for partitioned tensors.
    """
    tensors = []
    scopes: dict[str, list[int]] = {}
    for name in _match(ckpt.keys(), filter):
        info = ckpt.info(name)
        tensors.append({
            "name": name,
            "dtype": info.dtype,
            "shape": list(info.shape),
            "bytes": info.nbytes,
            "shard": info.shard,
            "offset": info.offset,
            "crc32c": info.crc32c,
            "slices": [[list(e) for e in s] for s in info.slices],
        })
        acc = scopes.setdefault(scope_of(name), [0, 0])
        acc[0] += info.nbytes
        acc[1] += 1
    h = ckpt.header
    return {
        "prefix": ckpt.prefix,
        "num_shards": h.num_shards,
        "endianness": h.endianness,
        "version": {"producer": h.version.producer, "min_consumer": h.version.min_consumer,
                    "bad_consumers": list(h.version.bad_consumers)},
        "tensor_count": len(tensors),
        "total_bytes": sum(t["bytes"] for t in tensors),
        "tensors": tensors,
        "scopes": [{"scope": s, "bytes": b, "tensors": n}
                   for s, (b, n) in sorted(scopes.items(), key=lambda kv: (-kv[1][0], kv[0]))],
    }
