"""Peak memory and time of exporting Hugging Face's sharded TF weights to safetensors.

    python benchmarks/h5_shards_memory.py [--big-mib 512] [--medium 64] [--medium-mib 8]
                                          [--max-shard-mib 200] [--chunk-bytes 64M]
                                          [--out benchmarks/out]

The input is run.py's 1 GiB checkpoint (written by TensorFlow, reused when present: one
512 MiB float32 tensor, 64 of 8 MiB and a step), saved with h5py, a chunk at a time, as
transformers' TF ``save_pretrained(..., max_shard_size=...)`` laid out its shards
(``tf_model-0000K-of-0000N.h5``, each listing its datasets in ``layer_names``, and
``tf_model.h5.index.json``; see tests/hf_tf2_models.py ``save_sharded``). Each
contender, a process of its own, writes every weight to one safetensors file:

- ``tfckpt export DIR out.safetensors --no-fsync`` (the chunk budget given);
- what transformers' own loading does with h5py (``load_tf_sharded_weights``): each
  shard's datasets read whole, one shard after the other, every weight kept (a model
  holds them all), then ``safetensors``' ``save_file``.

Peak RSS (from the OS, wait4) is set against that of the same interpreter importing
what the contender imports, and against tfckpt's bound (the chunk budget plus 16 MiB of
the interpreter's own growth); times and peaks side by side as ratios to tfckpt's. Both
must write the same tensors. Preparation as in h5_export_memory.py. Results go to
OUT/h5_shards_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from average_memory import peak_rss  # noqa: E402
from h5_export_memory import _check_same, _read_through, _touch  # noqa: E402
from run import SIZES, Inputs  # noqa: E402

_H5PY = """
import json, os, sys, h5py, numpy as np
from safetensors.numpy import save_file
directory = sys.argv[1]
with open(os.path.join(directory, "tf_model.h5.index.json")) as f:
    weight_map = json.load(f)["weight_map"]
values = {}
for shard in sorted(set(weight_map.values())):
    with h5py.File(os.path.join(directory, shard), "r") as f:
        for name in f.attrs["layer_names"]:
            name = name.decode() if isinstance(name, bytes) else name
            values[name] = np.asarray(f[name])
scoped = {"/".join(k.split("/")[1:]) if "/" in k and "model." not in k else k: k
          for k in weight_map}
save_file({scoped[k][: -len(":0")]: v for k, v in values.items()}, sys.argv[2])
"""


def write_shards(src: str, directory: str, max_shard: int, chunk: int) -> None:
    """The checkpoint ``src`` as Hugging Face's sharded TF weights of a model named
    ``tf_model``: weight ``tf_model/<tensor>/kernel:0`` per tensor, in the checkpoint's
    order, cut before a weight that would take a shard past ``max_shard`` bytes; written
    a chunk at a time. Reused while ``src`` and ``max_shard`` are the same."""
    import h5py
    import numpy as np

    import tfckpt

    stamp = os.path.join(directory, "input.json")
    spec = {"src": src, "max_shard": max_shard}
    if os.path.exists(stamp):
        with open(stamp) as f:
            if json.load(f) == spec:
                return
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    with tfckpt.open(src) as ckpt:
        names = [n for n in ckpt.keys()]
        blocks: list[list[str]] = [[]]
        size = 0
        for n in names:
            nbytes = ckpt.info(n).nbytes
            if size + nbytes > max_shard and blocks[-1]:
                blocks.append([])
                size = 0
            blocks[-1].append(n)
            size += nbytes
        weight_map = {}
        for k, block in enumerate(blocks):
            file = f"tf_model-{k + 1:05d}-of-{len(blocks):05d}.h5"
            with h5py.File(os.path.join(directory, file), "w") as f:
                listed = []
                for n in sorted(block):
                    info = ckpt.info(n)
                    name = f"{n.split('/')[0]}/kernel:0"
                    d = f.create_dataset(name, shape=info.shape, dtype=info.dtype)
                    start = 0
                    for piece in ckpt.iter_chunks(n, chunk):
                        if not info.shape:
                            d[()] = piece[0]
                            continue
                        rows = piece.reshape((-1, *info.shape[1:]))
                        d[start : start + len(rows)] = rows
                        start += len(rows)
                    listed.append(name.encode())
                    weight_map[f"tf_model/{name}"] = file
                f.attrs["layer_names"] = np.array(listed)
    with open(os.path.join(directory, "tf_model.h5.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
    with open(stamp, "w") as f:
        json.dump(spec, f)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big-mib", type=int, default=512)
    ap.add_argument("--medium", type=int, default=64)
    ap.add_argument("--medium-mib", type=int, default=8)
    ap.add_argument("--max-shard-mib", type=int, default=200)
    ap.add_argument("--chunk-bytes", default="64M")
    ap.add_argument("--prefault-mib", type=int, default=4096)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--write", nargs=3, help=argparse.SUPPRESS)  # steps run apart
    ap.add_argument("--same", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.write:
        write_shards(args.write[0], args.write[1], int(args.write[2]), 16 << 20)
        return 0
    if args.same:
        _check_same(*args.same, "h5py")
        return 0
    from tfckpt.cli import parse_size

    budget = parse_size(args.chunk_bytes)
    sizes = dict(SIZES, big_mib=args.big_mib, medium=args.medium, medium_mib=args.medium_mib)
    src = Inputs(os.path.join(args.out, "inputs"), sizes).path("big")
    shards = os.path.join(os.path.dirname(src), "hf_shards")
    write = [sys.executable, __file__, "--write", src, shards, str(args.max_shard_mib << 20)]
    subprocess.run(write, check=True)
    work = os.path.join(args.out, "h5_shards")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    out = {k: os.path.join(work, f"{k}.safetensors") for k in ("tfckpt", "h5py")}
    contenders = {
        "tfckpt export": (
            [sys.executable, "-m", "tfckpt", "export", shards, out["tfckpt"]]
            + ["--chunk-bytes", str(budget), "--no-fsync"],
            "import tfckpt, tfckpt.interop.export, tfckpt.checkpoint.hdf5, numpy",
        ),
        "h5py shard by shard + safetensors": (
            [sys.executable, "-c", _H5PY, shards, out["h5py"]],
            "import h5py, safetensors.numpy, numpy",
        ),
    }
    rows = {}
    files = [os.path.join(shards, n) for n in sorted(os.listdir(shards)) if n.endswith(".h5")]
    for name, (command, imports) in contenders.items():
        for path in files:
            _read_through(path)
        _touch(args.prefault_mib << 20)
        os.sync()
        baseline, _ = peak_rss([sys.executable, "-c", imports])
        rss, wall = peak_rss(command)
        rows[name] = {"wall": wall, "peak_rss": rss, "import_rss": baseline}
        rows[name]["above_imports"] = rss - baseline
    subprocess.run([sys.executable, __file__, "--same", out["tfckpt"], out["h5py"]], check=True)
    mine = rows["tfckpt export"]
    for row in rows.values():
        row["wall_vs_tfckpt"] = row["wall"] / mine["wall"]
        row["above_imports_vs_tfckpt"] = row["above_imports"] / max(mine["above_imports"], 1 << 20)
    source = sum(os.path.getsize(p) for p in files)
    bound = budget + (16 << 20)
    report = {
        "shards": len(files),
        "h5_bytes": source,
        "chunk_bytes": budget,
        "bound": bound,
        "contenders": rows,
        "within_bound": mine["above_imports"] < bound,
    }
    with open(os.path.join(args.out, "h5_shards_memory.json"), "w") as f:
        json.dump(report, f, indent=1)
    mib = 1 << 20
    print(
        f"export of {source / mib:.0f} MiB of Hugging Face TF weights in {len(files)} shards "
        f"to safetensors, chunk budget {budget / mib:.0f} MiB (tfckpt's bound above its "
        f"imports: {bound / mib:.0f} MiB):"
    )
    for name, row in rows.items():
        print(
            f"  {name:36s} {row['wall']:6.2f} s ({row['wall_vs_tfckpt']:.2f}x)  peak RSS "
            f"{row['peak_rss'] / mib:6.0f} MiB, {row['above_imports'] / mib:6.0f} MiB above "
            f"its imports ({row['above_imports_vs_tfckpt']:.2f}x)"
        )
    shutil.rmtree(work, ignore_errors=True)
    return 0 if report["within_bound"] else 1


if __name__ == "__main__":
    sys.exit(main())
