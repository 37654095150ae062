"""The tf backend on a GPU: ``convert --backend tf`` against the default (SIMD) backend.

    python benchmarks/gpu.py [--repeat 3] [--out benchmarks/out] [--big-mib 512 ...]

Where TensorFlow sees a GPU: converts the 1 GiB float32 input of ``benchmarks/run.py``
to float16 with ``--backend tf`` (every tensor of at least ``--tf-threshold`` through
``tf.cast`` on the GPU, chunk by chunk, double-buffered: see ``tfckpt/tf/cast.py``) and
with the default backend, each in a process of its own, in turn, ``--repeat`` times;
checks that both wrote the same bytes (every file); and reports both times (medians of
the whole process, peak RSS) and the share of the tf backend's cast time that copies
between host and device take (measured in one process: the chunks copied in and their
float16 results copied out, against the converter's whole time on the same chunks).

Where TensorFlow sees no GPU (or is not installed) it says so and exits 0: there is
nothing to measure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import run as harness  # noqa: E402  (benchmarks/run.py: inputs and measuring)

CHUNK = 8 << 20  # bytes per chunk, as the engine reads them at the default budget


def gpus() -> int | None:
    """How many GPUs TensorFlow sees (in a process of its own); None without TensorFlow."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
            "import importlib.util, sys\n"
            "if importlib.util.find_spec('tensorflow') is None: print(-1); sys.exit()\n"
            "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    n = int(proc.stdout.strip().splitlines()[-1])
    return None if n < 0 else n


def role_share(prefix: str, name: str) -> None:
    """In-process: the converter's time on ``name``'s chunks, and the copies' alone."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    import tfckpt
    from tfckpt.tf import cast as tf_cast

    with tfckpt.open(prefix) as ckpt:
        chunks = [c.copy() for c in ckpt.iter_chunks(name, CHUNK)]
    convert = tf_cast.converter("/GPU:0")
    half = np.dtype(np.float16)
    convert(chunks[0], half)  # the first call sets the device up: not timed
    t = time.perf_counter()
    for c in chunks:
        convert(c, half)
    t_convert = time.perf_counter() - t
    with tf.device("/GPU:0"):
        t = time.perf_counter()
        on_device = [tf.identity(tf.constant(c)) for c in chunks]
        float(tf.reduce_sum(on_device[-1][:1]))  # waits for the queued copies
        t_in = time.perf_counter() - t
        results = [tf.cast(x, tf.float16) for x in on_device]
        float(tf.reduce_sum(tf.cast(results[-1][:1], tf.float32)))
        t = time.perf_counter()
        for r in results:
            r.numpy()
        t_out = time.perf_counter() - t
    nbytes = sum(c.nbytes for c in chunks)
    print(
        json.dumps(
            {
                "seconds": t_convert,
                "bytes": nbytes,
                "copy_in": t_in,
                "copy_out": t_out,
                "share": (t_in + t_out) / t_convert,
            }
        )
    )


def same_files(a: str, b: str) -> list[str]:
    """The names of the files that differ (or are missing) between two output folders."""
    names = sorted(set(os.listdir(a)) | set(os.listdir(b)))
    differ = []
    for n in names:
        pa, pb = os.path.join(a, n), os.path.join(b, n)
        if n == "checkpoint":
            continue  # the state file names the folder's own checkpoint
        if not (os.path.exists(pa) and os.path.exists(pb)):
            differ.append(n)
            continue
        with open(pa, "rb") as fa, open(pb, "rb") as fb:
            while True:
                x, y = fa.read(1 << 24), fb.read(1 << 24)
                if x != y:
                    differ.append(n)
                    break
                if not x:
                    break
    return differ


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--role"]:
        role_share(*argv[2:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default=os.path.join(HERE, "out"))
    p.add_argument("--big-mib", type=int, default=harness.SIZES["big_mib"])
    p.add_argument("--medium", type=int, default=harness.SIZES["medium"])
    p.add_argument("--medium-mib", type=int, default=harness.SIZES["medium_mib"])
    p.add_argument("--tf-threshold", default="1M", help="passed to convert --tf-threshold")
    a = p.parse_args(argv)
    n = gpus()
    if not n:
        why = "TensorFlow is not installed" if n is None else "TensorFlow sees no GPU"
        print(f"no GPU: {why}; nothing to measure")
        return 0
    sizes = dict(harness.SIZES, big_mib=a.big_mib, medium=a.medium, medium_mib=a.medium_mib)
    prefix = harness.Inputs(os.path.join(a.out, "inputs"), sizes).path("big")
    work = os.path.join(a.out, "gpu")
    contenders = {
        "default (SIMD)": [],
        "--backend tf (GPU)": ["--backend", "tf", "--tf-threshold", a.tf_threshold],
    }
    rounds = []
    for _ in range(a.repeat):
        r = {}
        for i, (name, flags) in enumerate(contenders.items()):
            dst = os.path.join(work, str(i), "model")
            command = [sys.executable, os.path.join(HERE, "contenders.py"), "tfckpt_convert"]
            r[name] = harness.measure([*command, prefix, dst, "float16", *flags])
        rounds.append(r)
    differ = same_files(os.path.join(work, "0"), os.path.join(work, "1"))
    share = json.loads(
        subprocess.run(
            [sys.executable, __file__, "--role", "share", prefix, "big/kernel"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()[-1]
    )
    print(f"{n} GPU(s); {a.repeat} rounds, medians of the whole process")
    print("| backend | wall | in-process | peak RSS |\n|---|---|---|---|")
    for name in contenders:
        wall = statistics.median(r[name]["wall"] for r in rounds)
        inner = statistics.median(r[name]["inner"] for r in rounds)
        rss = statistics.median(r[name]["rss"] for r in rounds) / 2**20
        print(f"| {name} | {wall:.2f} s | {inner:.2f} s | {rss:.0f} MiB |")
    ratio = statistics.median(
        r["--backend tf (GPU)"]["wall"] / r["default (SIMD)"]["wall"] for r in rounds
    )
    print(f"- tf / default, whole process (ratio in each round, median): {ratio:.2f}×")
    print(
        f"- the tf converter alone on big/kernel's {CHUNK >> 20} MiB chunks: "
        f"{share['seconds']:.2f} s; host->device copies {share['copy_in']:.2f} s, "
        f"device->host {share['copy_out']:.2f} s: {share['share'] * 100:.0f}% of that"
    )
    if differ:
        print(f"DIFFERENT OUTPUT: {', '.join(differ)}")
        return 1
    print("- outputs byte-identical: yes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
