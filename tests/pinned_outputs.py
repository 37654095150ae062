"""Every command's output for fixed inputs, as SHA-256 digests of its files.

:func:`write_all` writes sources with :func:`tfckpt.save` and :class:`tfckpt.BundleWriter`
(numeric dtypes, bfloat16, strings, scalars, empty tensors, a partitioned tensor,
two shards), runs convert, rename, select, merge, average, export (safetensors,
sharded safetensors, npz, permuted) and import on them through the public API, and
gives each output file's digest. The digests recorded in
``tests/rewrite/test_pinned_outputs.py`` were made by the code before the house was
rebuilt (commit 7562ed3); the test runs this module again with today's code.

Run as a script (``python tests/pinned_outputs.py DIR``) it prints the digests as
JSON, so that the code of any commit can make them.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

import tfckpt


def _sources(root: Path) -> tuple[str, str, list[str]]:
    """Two checkpoints, ``a`` (one shard) and ``b`` (two shards, a partitioned tensor),
    and three checkpoints of one run."""
    rng = np.random.default_rng(20261204)
    a = {
        "dense/kernel": rng.standard_normal((6, 5)).astype(np.float32),
        "dense/bias": np.array([1e-9, -2.5, 70000.0, 0.0, 3.25], np.float32),
        "embed/table": rng.standard_normal((11, 4)).astype(np.float64),
        "norm/gamma": rng.standard_normal(4).astype(np.float16),
        "global_step": np.array(7, np.int64),
        "counts": np.arange(12, dtype=np.int32).reshape(3, 4),
        "mask": np.array([True, False, True]),
        "vocab": np.array([b"a", b"", b"long token " * 3], dtype=object),
        "empty": np.zeros((0, 3), np.float32),
        "scalar": np.array(0.5, np.float32),
    }
    tfckpt.save(a, str(root / "a" / "model"))
    # Two shards and a partitioned tensor, written through the writer's API.
    with tfckpt.BundleWriter(str(root / "b" / "model")) as w:
        w.add("dense/kernel", (a["dense/kernel"] * 2).astype(np.float32))
        w.add("extra/w", rng.standard_normal((3, 3)).astype(np.float32), shard=1)
        part = rng.standard_normal((8, 2)).astype(np.float32)
        w.add_slice("part/w", (8, 2), [(0, 5), (0, 2)], part[:5])
        w.add_slice("part/w", (8, 2), [(5, 3), (0, 2)], part[5:], shard=1)
    # Three checkpoints of one "run" to average.
    for k in range(3):
        tfckpt.save(
            {
                "w": (a["dense/kernel"] + k).astype(np.float32),
                "h": (a["norm/gamma"] * (k + 1)).astype(np.float16),
                "step": np.array(k, np.int64),
            },
            str(root / "run" / f"ckpt-{k}"),
        )
    runs = [str(root / "run" / f"ckpt-{k}") for k in range(3)]
    return str(root / "a" / "model"), str(root / "b" / "model"), runs


def write_all(root: Path) -> dict[str, str]:
    """Write the sources and every command's output under ``root``; their digests, by
    path relative to ``root``."""
    a, b, runs = _sources(root)
    out = root / "out"
    tfckpt.convert(a, str(out / "fp16" / "model"), "float16", overflow="clip")
    tfckpt.convert(b, str(out / "bf16" / "model"), "bfloat16")
    tfckpt.convert(
        a, str(out / "packed" / "model"), "float16", max_shard_bytes=200, overflow="clip"
    )
    tfckpt.rename(a, str(out / "renamed" / "model"), {"dense/": "proj/"})
    tfckpt.select(a, str(out / "selected" / "model"), include=["dense/*", "vocab"])
    tfckpt.merge([a, b], str(out / "merged" / "model"), prefer="last")
    tfckpt.average(runs, str(out / "avg" / "model"), weights=[1, 2, 3])
    tfckpt.average(runs, str(out / "avg16" / "model"), cast="float16")
    tfckpt.export(a, str(out / "st" / "model.safetensors"), exclude=["vocab"])
    tfckpt.export(
        a,
        str(out / "sharded" / "model.safetensors"),
        exclude=["vocab"],
        max_shard_bytes=300,
        permute=[("dense/kernel$", (1, 0))],
    )
    tfckpt.export(b, str(out / "npz" / "model.npz"), cast="float16")
    tfckpt.import_(str(out / "st" / "model.safetensors"), str(out / "back" / "model"))
    tfckpt.import_(
        str(out / "sharded" / "model.safetensors.index.json"),
        str(out / "back_sharded" / "model"),
        permute=[("dense/kernel$", (1, 0))],
        cast="float32",
    )
    return {
        path.relative_to(root).as_posix(): hashlib.sha256(_unversioned(path)).hexdigest()
        for path in sorted(out.rglob("*"))
        if path.is_file()
    }


def _unversioned(path: Path) -> bytes:
    """The file's bytes, less the release named in an export's metadata (``producer``):
    a safetensors file's header and an index are read as JSON and written back without it."""
    data = path.read_bytes()
    if path.name.endswith(".index.json"):
        index = json.loads(data)
        index["metadata"].pop("producer")
        return json.dumps(index).encode()
    if path.suffix == ".safetensors":
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + n])
        header["__metadata__"].pop("producer")
        return json.dumps(header).encode() + data[8 + n :]
    return data


if __name__ == "__main__":
    print(json.dumps(write_all(Path(sys.argv[1])), indent=1, sort_keys=True))
