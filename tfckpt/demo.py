"""The built-in example: ``python -m tfckpt.demo [DIR]``.

Writes a small float32 checkpoint laid out like a TF1 training run (two conv
layers with batch norm, a dense head, Adam slots and a global step), converts it
to float16 without the optimizer slots, and shows both with ``tfckpt dump``.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from tfckpt import cli, save


def example_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {
        "simple-conv1/weights": (3, 3, 3, 32),
        "simple-conv1/biases": (32,),
        "simple-conv1/BatchNorm/moving_mean": (32,),
        "simple-conv1/BatchNorm/moving_variance": (32,),
        "simple-conv2/weights": (3, 3, 32, 64),
        "simple-conv2/biases": (64,),
        "logits/weights": (1024, 10),
        "logits/biases": (10,),
    }
    tensors: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        value = rng.standard_normal(shape).astype(np.float32) * 0.1
        tensors[name] = value
        if "BatchNorm" not in name:
            tensors[f"{name}/Adam"] = np.abs(value) * 0.01
            tensors[f"{name}/Adam_1"] = value * value * 0.001
    tensors["global_step"] = np.array(7, dtype=np.int64)
    return tensors


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_dir = argv[0] if argv else "demo-out"
    prefix = os.path.join(out_dir, "model.ckpt-7")
    save(example_tensors(), prefix, overwrite=True)
    print(f"wrote {prefix} (float32)\n\n$ tfckpt dump {prefix}", flush=True)
    cli.main(["dump", prefix])
    fp16 = os.path.join(out_dir, "fp16") + os.sep
    steps = [
        ["convert", prefix, fp16, "--dtype", "float16", "--exclude", "/Adam", "--overwrite"],
        ["dump", fp16],
    ]
    for args in steps:
        print(f"\n$ tfckpt {' '.join(args)}", flush=True)
        rc = cli.main(args)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
