"""Peak memory and time of value transforms on a tensor bigger than the chunk budget.

    python benchmarks/transform_memory.py [--big-mib 512] [--chunk-bytes 64M]
                                          [--out benchmarks/out]

The input is run.py's (written by TensorFlow, reused when present): its one big
float32 tensor ``big/kernel`` ([N, 1024]). Each contender, a process of its own, cuts
it into four column blocks (a fused projection into its parts), transposes each, and
writes them to a safetensors file:

- ``tfckpt export --split ... --permute ...`` (tiles of the chunk budget);
- ``tfckpt convert`` with the same transforms into a V2 checkpoint;
- what a user writes without tfckpt: TensorFlow's reader (``get_tensor``), numpy's
  split and transpose, the ``safetensors`` package's ``save_file``.

Peak RSS (from the OS, wait4) is set against that of the same interpreter importing
what the contender imports, and against a bound set by the chunk budget alone (4 x the
budget + 16 MiB: the pipeline's read and cast rings, a tile and the piece read into
it, the interpreter's own growth), whatever the tensor's size; times and peaks side by
side as ratios to the numpy contender. Results go to OUT/transform_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from average_memory import peak_rss  # noqa: E402
from run import SIZES, Inputs  # noqa: E402

PARTS = ["big/a", "big/b", "big/c", "big/d"]
SPLIT = "^big/kernel$=1:" + ",".join(PARTS)
PERMUTE = "^big/[abcd]$=1,0"
_NUMPY = """
import sys, numpy as np
import tensorflow as tf
from safetensors.numpy import save_file
whole = tf.train.load_checkpoint(sys.argv[1]).get_tensor("big/kernel")
parts = np.split(whole, 4, axis=1)
save_file({{n: np.ascontiguousarray(p.T) for n, p in zip({parts!r}, parts)}}, sys.argv[2])
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big-mib", type=int, default=512)
    ap.add_argument("--chunk-bytes", default="64M")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    args = ap.parse_args(argv)
    from tfckpt.cli import parse_size

    budget = parse_size(args.chunk_bytes)
    sizes = dict(SIZES, big_mib=args.big_mib, medium=1, medium_mib=1)
    src = Inputs(os.path.join(args.out, "inputs"), sizes).path("big")
    work = os.path.join(args.out, "transforms")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    tfckpt = [sys.executable, "-m", "tfckpt"]
    flags = ["--include", "^big/", "--split", SPLIT, "--permute", PERMUTE]
    flags += ["--chunk-bytes", str(budget)]
    contenders = {
        "tfckpt export": (
            [*tfckpt, "export", src, os.path.join(work, "export.safetensors"), *flags],
            "import tfckpt, tfckpt.interop.export, numpy",
        ),
        "tfckpt convert": (
            [*tfckpt, "convert", src, os.path.join(work, "ckpt", "model"), *flags, "--no-fsync"],
            "import tfckpt, tfckpt.rewrite.engine, numpy",
        ),
        "TensorFlow reader + numpy + safetensors": (
            [
                sys.executable,
                "-c",
                _NUMPY.format(parts=PARTS),
                src,
                os.path.join(work, "numpy.safetensors"),
            ],
            "import numpy, tensorflow, safetensors.numpy",
        ),
    }
    rows = {}
    for name, (command, imports) in contenders.items():
        baseline, _ = peak_rss([sys.executable, "-c", imports])
        rss, wall = peak_rss(command)
        rows[name] = {"wall": wall, "peak_rss": rss, "import_rss": baseline}
    _check_same(work)
    numpy_row = rows["TensorFlow reader + numpy + safetensors"]
    for row in rows.values():
        row["above_imports"] = row["peak_rss"] - row["import_rss"]
    for row in rows.values():
        row["wall_vs_numpy"] = row["wall"] / numpy_row["wall"]
        row["above_imports_vs_numpy"] = row["above_imports"] / max(numpy_row["above_imports"], 1)
    tensor = args.big_mib << 20
    bound = 4 * budget + (16 << 20)
    report = {"tensor_bytes": tensor, "chunk_bytes": budget, "bound": bound, "contenders": rows}
    report["within_bound"] = all(
        rows[k]["above_imports"] < bound for k in ("tfckpt export", "tfckpt convert")
    )
    with open(os.path.join(args.out, "transform_memory.json"), "w") as f:
        json.dump(report, f, indent=1)
    mib = 1 << 20
    print(
        f"split into 4 + transpose of one {args.big_mib} MiB tensor, chunk budget "
        f"{budget / mib:.0f} MiB (bound above the imports: {bound / mib:.0f} MiB):"
    )
    for name, row in rows.items():
        print(
            f"  {name:42s} {row['wall']:6.2f} s ({row['wall_vs_numpy']:.2f}x)  peak RSS "
            f"{row['peak_rss'] / mib:6.0f} MiB, {row['above_imports'] / mib:6.0f} MiB above "
            f"its imports ({row['above_imports_vs_numpy']:.2f}x)"
        )
    shutil.rmtree(work, ignore_errors=True)
    return 0 if report["within_bound"] else 1


def _check_same(work: str) -> None:
    """Every contender wrote the same tensors (else its numbers mean nothing)."""
    from safetensors.numpy import load_file

    import tfckpt

    want = load_file(os.path.join(work, "numpy.safetensors"))
    got = load_file(os.path.join(work, "export.safetensors"))
    with tfckpt.open(os.path.join(work, "ckpt", "model")) as ckpt:
        for name in PARTS:
            value = want.pop(name)
            if got[name].tobytes() != value.tobytes() or ckpt[name].tobytes() != value.tobytes():
                raise SystemExit(f"the contenders disagree on {name}")


if __name__ == "__main__":
    sys.exit(main())
