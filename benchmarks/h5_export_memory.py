"""Peak memory and time of exporting a Keras HDF5 weights file to safetensors.

    python benchmarks/h5_export_memory.py [--big-mib 512] [--medium 64] [--medium-mib 8]
                                          [--chunk-bytes 64M] [--out benchmarks/out]

The input is run.py's 1 GiB checkpoint (written by TensorFlow, reused when present: one
512 MiB float32 tensor, 64 of 8 MiB and a step), saved as a Keras 2 weights file
``model.h5`` in the layout ``save_weights`` writes (``layer_names``, one group per layer
with its ``weight_names``), with h5py, a chunk at a time. Each contender, a process of
its own, writes every weight to one safetensors file:

- ``tfckpt export model.h5 out.safetensors --no-fsync`` (the chunk budget given; no
  fsync, as the others do none);
- what a user writes with h5py: every dataset read whole, then ``safetensors``'
  ``save_file``;
- what a user writes with Keras: a tf.keras model of the same layers loads the file
  (``load_weights``), then ``save_file`` of its weights.

Peak RSS (from the OS, wait4) is set against that of the same interpreter importing
what the contender imports, and against the chunk budget (tfckpt's bound: the budget
plus 16 MiB of the interpreter's own growth); times and peaks side by side as ratios
to tfckpt's. Every contender must write the same tensors. Before each, the input is
read through (in the page cache for all alike), 4 GiB of memory touched and freed
(``--prefault-mib``: memory a virtual machine's host has backed) and earlier writes
are synced; the
input's writing and the comparison run in processes of their own (a child's peak RSS
includes its parent's at the fork). Results go to OUT/h5_export_memory.json.
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
from run import SIZES, Inputs  # noqa: E402

_H5PY = """
import sys, h5py, numpy as np
from safetensors.numpy import save_file
values = {}
with h5py.File(sys.argv[1], "r") as f:
    for layer in f.attrs["layer_names"]:
        group = f[layer]
        for weight in group.attrs["weight_names"]:
            name = weight.decode() if isinstance(weight, bytes) else weight
            values[name[: -len(":0")]] = np.asarray(group[name][()])
save_file(values, sys.argv[2])
"""
_KERAS = """
import os, sys, json
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import tf_keras as keras
from safetensors.numpy import save_file

class Weight(keras.layers.Layer):
    def __init__(self, shape, dtype, **kw):
        super().__init__(**kw)
        self.value = self.add_weight("kernel", shape=shape, dtype=dtype, initializer="zeros")

    def call(self, x):
        return x

layers = [Weight(tuple(s), d, name=n) for n, s, d in json.loads(sys.argv[3])]
model = keras.Sequential(layers)
model.build((None, 1))
model.load_weights(sys.argv[1])
save_file({l.name + "/kernel": np.asarray(l.value.numpy()) for l in layers}, sys.argv[2])
"""


def write_h5(src: str, path: str, chunk: int) -> list[tuple[str, list[int], str]]:
    """The checkpoint ``src`` as a Keras 2 weights file, written a chunk at a time: one
    layer per tensor (``big``, ``layer_00``...), its one weight ``<layer>/kernel:0``.
    Returns the layers as ``(name, shape, dtype)``; reused while ``src`` is the same."""
    import h5py
    import numpy as np

    import tfckpt

    stamp = path + ".json"
    with tfckpt.open(src) as ckpt:
        tensors = {n.split("/")[0]: n for n in ckpt.keys()}
        layers = [(k, list(ckpt.info(t).shape), ckpt.info(t).dtype) for k, t in tensors.items()]
        if os.path.exists(stamp) and os.path.exists(path):
            with open(stamp) as f:
                if json.load(f) == json.loads(json.dumps({"src": src, "layers": layers})):
                    return layers
        with h5py.File(path, "w") as f:
            f.attrs["layer_names"] = np.array([n.encode() for n in tensors])
            f.attrs["backend"], f.attrs["keras_version"] = b"tensorflow", b"2.21.0"
            for name, shape, dtype in layers:
                g = f.create_group(name)
                g.attrs["weight_names"] = np.array([f"{name}/kernel:0".encode()])
                d = g.create_dataset(f"{name}/kernel:0", shape=shape, dtype=dtype)
                start = 0
                for piece in ckpt.iter_chunks(tensors[name], chunk):
                    if not shape:
                        d[()] = piece[0]
                        continue
                    block = piece.reshape((-1, *shape[1:]))
                    d[start : start + len(block)] = block
                    start += len(block)
    with open(stamp, "w") as f:
        json.dump({"src": src, "layers": layers}, f)
    return layers


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big-mib", type=int, default=512)
    ap.add_argument("--medium", type=int, default=64)
    ap.add_argument("--medium-mib", type=int, default=8)
    ap.add_argument("--chunk-bytes", default="64M")
    ap.add_argument(
        "--prefault-mib",
        type=int,
        default=4096,
        help="memory touched and freed before every run (0: none)",
    )
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--write-h5", nargs=2, help=argparse.SUPPRESS)  # steps run apart
    ap.add_argument("--same", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.write_h5:
        write_h5(*args.write_h5, 16 << 20)
        return 0
    if args.same:
        _check_same(*args.same, os.path.basename(args.same[1]))
        return 0
    from tfckpt.cli import parse_size

    budget = parse_size(args.chunk_bytes)
    sizes = dict(SIZES, big_mib=args.big_mib, medium=args.medium, medium_mib=args.medium_mib)
    src = Inputs(os.path.join(args.out, "inputs"), sizes).path("big")
    h5 = os.path.join(os.path.dirname(src), "model.h5")
    layers_file = h5 + ".json"
    subprocess.run([sys.executable, __file__, "--write-h5", src, h5], check=True)
    with open(layers_file) as f:
        layers = json.load(f)["layers"]
    work = os.path.join(args.out, "h5_export")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    out = {k: os.path.join(work, f"{k}.safetensors") for k in ("tfckpt", "h5py", "keras")}
    contenders = {
        "tfckpt export": (
            [sys.executable, "-m", "tfckpt", "export", h5, out["tfckpt"]]
            + ["--chunk-bytes", str(budget), "--no-fsync"],
            "import tfckpt, tfckpt.interop.export, tfckpt.checkpoint.hdf5, numpy",
        ),
        "h5py read whole + safetensors": (
            [sys.executable, "-c", _H5PY, h5, out["h5py"]],
            "import h5py, safetensors.numpy, numpy",
        ),
        "tf.keras load_weights + safetensors": (
            [sys.executable, "-c", _KERAS, h5, out["keras"], json.dumps(layers)],
            "import os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'; import tf_keras, "
            "safetensors.numpy",
        ),
    }
    rows = {}
    for name, (command, imports) in contenders.items():
        # Alike for each: the input in the page cache, memory the host has backed, no
        # other run's writes in flight.
        _read_through(h5)
        _touch(args.prefault_mib << 20)
        os.sync()
        baseline, _ = peak_rss([sys.executable, "-c", imports])
        rss, wall = peak_rss(command)
        rows[name] = {"wall": wall, "peak_rss": rss, "import_rss": baseline}
        rows[name]["above_imports"] = rss - baseline
    # Only now, in a process of its own: a child's peak RSS counts its parent's at the
    # fork, so this one stays small while they run.
    for key in ("h5py", "keras"):
        subprocess.run([sys.executable, __file__, "--same", out["tfckpt"], out[key]], check=True)
    mine = rows["tfckpt export"]
    for row in rows.values():
        row["wall_vs_tfckpt"] = row["wall"] / mine["wall"]
        # At least a MiB below: at small sizes the difference is the allocator's noise.
        row["above_imports_vs_tfckpt"] = row["above_imports"] / max(mine["above_imports"], 1 << 20)
    source = os.path.getsize(h5)
    bound = budget + (16 << 20)
    report = {
        "h5_bytes": source,
        "chunk_bytes": budget,
        "bound": bound,
        "contenders": rows,
        "within_bound": mine["above_imports"] < bound,
    }
    with open(os.path.join(args.out, "h5_export_memory.json"), "w") as f:
        json.dump(report, f, indent=1)
    mib = 1 << 20
    print(
        f"export of a {source / mib:.0f} MiB Keras HDF5 file to safetensors, chunk budget "
        f"{budget / mib:.0f} MiB (tfckpt's bound above its imports: {bound / mib:.0f} MiB):"
    )
    for name, row in rows.items():
        print(
            f"  {name:38s} {row['wall']:6.2f} s ({row['wall_vs_tfckpt']:.2f}x)  peak RSS "
            f"{row['peak_rss'] / mib:6.0f} MiB, {row['above_imports'] / mib:6.0f} MiB above "
            f"its imports ({row['above_imports_vs_tfckpt']:.2f}x)"
        )
    shutil.rmtree(work, ignore_errors=True)
    return 0 if report["within_bound"] else 1


def _touch(nbytes: int) -> None:
    """Memory touched and freed, in a process of its own. On a virtual machine, memory
    the guest has not touched lately faults in at a fraction of the usual speed; without
    this, the contender that needs the most memory pays for it in time as well."""
    if nbytes:
        code = f"import numpy; numpy.ones({nbytes}, numpy.uint8)"
        subprocess.run([sys.executable, "-c", code], check=True)


def _read_through(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass


def _check_same(mine: str, theirs: str, who: str) -> None:
    """``who`` wrote the same tensors as tfckpt, bit for bit (else its numbers mean
    nothing); one tensor of each file in memory at a time."""
    from safetensors import safe_open

    with safe_open(mine, framework="numpy") as a, safe_open(theirs, framework="numpy") as b:
        if set(a.keys()) != set(b.keys()):
            raise SystemExit(f"{who} wrote other tensors than tfckpt")
        for name in sorted(a.keys()):
            want, got = a.get_tensor(name), b.get_tensor(name)
            if got.dtype != want.dtype or got.tobytes() != want.tobytes():
                raise SystemExit(f"{who} and tfckpt disagree on {name}")


if __name__ == "__main__":
    sys.exit(main())
