"""Benchmarks against TensorFlow's own readers and savers, side by side in one run.

    python benchmarks/run.py [--repeat 3] [--big-mib 512] [--medium 64] [--medium-mib 8]
                             [--small 20000] [--out benchmarks/out]

Inputs are written by TensorFlow itself. Each contender runs as its own process,
in turn, ``--repeat`` times; the table shows medians of the whole-process wall
time and peak RSS (from the OS, via wait4) and of the in-process time after
imports, with ratios to TensorFlow and to ``cp`` of the same files.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CONTENDERS = os.path.join(HERE, "contenders.py")


class ContenderFailed(RuntimeError):
    """A contender exited non-zero: its figures would time a failure, not the work."""


def measure(command: list[str]) -> dict:
    """Run ``command`` in a fresh measuring process, so ru_maxrss is its own; raise
    :class:`ContenderFailed` with its exit status and stderr tail unless it exits 0."""
    code = (
        "import json, os, subprocess, sys, time, resource\n"
        f"args = {json.dumps(command)}\n"
        "t = time.perf_counter()\n"
        "p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)\n"
        "_, status, ru = os.wait4(p.pid, 0)\n"
        "wall = time.perf_counter() - t\n"
        "out = p.stdout.read().decode(); err = p.stderr.read().decode()\n"
        "code = os.waitstatus_to_exitcode(status)\n"
        "print(json.dumps({'wall': wall, 'rss': ru.ru_maxrss * 1024, 'code': code,"
        " 'out': out, 'err': err[-2000:]}))\n"
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    os.sync()  # every contender starts with no dirty pages of the previous one to flush
    res = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, env=env, check=True
        ).stdout
    )
    if res["code"] != 0:
        raise ContenderFailed(
            f"{' '.join(command)} exited with status {res['code']}:\n{res['err'].rstrip()}"
        )
    inner = json.loads(res["out"].strip().splitlines()[-1])
    return {"wall": res["wall"], "rss": res["rss"], "inner": inner["seconds"]}


def measured(args: list[str]) -> dict:
    """One contender of contenders.py, measured."""
    return measure([sys.executable, CONTENDERS, *args])


def make_inputs(root: str, big_mib: int, medium: int, medium_mib: int, small: int) -> dict:
    """Write the benchmark checkpoints with TensorFlow (once; reused when present)."""
    paths = {
        "big": os.path.join(root, "f32", "model"),
        "small": os.path.join(root, "small", "model"),
        "keras": os.path.join(root, "keras"),
    }
    stamp = os.path.join(root, "inputs.json")
    spec = {"big_mib": big_mib, "medium": medium, "medium_mib": medium_mib, "small": small}
    if os.path.exists(stamp) and json.load(open(stamp)) == spec:
        paths["keras"] = open(os.path.join(root, "keras.prefix")).read()
        return paths
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    code = f"""
import os, numpy as np
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf, keras
rng = np.random.default_rng(0)
def floats(n):
    return (rng.standard_normal(n, dtype=np.float32) * 0.05)
names, tensors = ["big/kernel"], [tf.constant(floats({big_mib} << 18).reshape(-1, 1024))]
for i in range({medium}):
    names.append(f"layer_{{i:02d}}/kernel")
    tensors.append(tf.constant(floats({medium_mib} << 18).reshape(-1, 512)))
names.append("global_step"); tensors.append(tf.constant(np.int64(1000)))
tf.raw_ops.SaveV2(prefix={paths["big"]!r}, tensor_names=names,
                  shape_and_slices=[""] * len(names), tensors=tensors)
del tensors
names = [f"scope_{{i // 100:03d}}/var_{{i % 100:02d}}" for i in range({small})]
tf.raw_ops.SaveV2(prefix={paths["small"]!r}, tensor_names=names,
                  shape_and_slices=[""] * len(names),
                  tensors=[tf.constant(floats(16)) for _ in names])
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"),
                          keras.layers.BatchNormalization(), keras.layers.Dense(10)])
model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
model.fit(rng.random((64, 32)), rng.random((64, 10)), epochs=1, verbose=0)
prefix = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save({paths["keras"]!r} + "/ckpt")
open({os.path.join(root, "keras.prefix")!r}, "w").write(prefix)
"""
    subprocess.run([sys.executable, "-c", code], check=True)
    json.dump(spec, open(stamp, "w"))
    paths["keras"] = open(os.path.join(root, "keras.prefix")).read()
    return paths


def machine() -> dict:
    cpu = platform.processor()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    import numpy

    versions = {"python": platform.python_version(), "numpy": numpy.__version__}
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import tensorflow as tf; print(tf.__version__)"],
            capture_output=True,
            text=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        )
        versions["tensorflow"] = out.stdout.strip()
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem / 2**30, 1), **versions}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--big-mib", type=int, default=512)
    ap.add_argument("--medium", type=int, default=64)
    ap.add_argument("--medium-mib", type=int, default=8)
    ap.add_argument("--small", type=int, default=20000)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--only", help="run only cases whose name contains this")
    args = ap.parse_args(argv)
    inputs = make_inputs(
        os.path.join(args.out, "inputs"), args.big_mib, args.medium, args.medium_mib, args.small
    )
    work = os.path.join(args.out, "work")
    big, small, keras_ckpt = inputs["big"], inputs["small"], inputs["keras"]
    cases = {
        "convert float32->float16 (1 GiB)": {
            "tfckpt": ["tfckpt_convert", big, f"{work}/tfckpt16/model", "float16"],
            "tfckpt --no-fsync": [
                "tfckpt_convert",
                big,
                f"{work}/tfckpt16n/model",
                "float16",
                "--no-fsync",
            ],
            "tensorflow": ["tf_convert", big, f"{work}/tf16/model", "float16"],
            "tf1 saver builder": ["tf1_saver_builder_convert", big, f"{work}/tf1/model", "float16"],
            "cp": ["cp_data", big, f"{work}/cp/model"],
        },
        "convert float32->bfloat16 (1 GiB)": {
            "tfckpt": ["tfckpt_convert", big, f"{work}/tfckptbf/model", "bfloat16"],
            "tensorflow": ["tf_convert", big, f"{work}/tfbf/model", "bfloat16"],
        },
        "convert Keras checkpoint to float16": {
            "tfckpt": ["tfckpt_convert", keras_ckpt, f"{work}/k16/ckpt", "float16"],
            "tensorflow": ["tf_convert", keras_ckpt, f"{work}/ktf16/ckpt", "float16"],
        },
        "export to safetensors (1 GiB)": {
            "tfckpt": ["tfckpt_export", big, f"{work}/export/model.safetensors"],
            "tensorflow": ["tf_export", big, f"{work}/tfexport/model.safetensors"],
        },
        "read every tensor (1 GiB)": {
            "tfckpt": ["tfckpt_read_all", big],
            "tensorflow": ["tf_read_all", big],
        },
        "list 20000 tensors": {
            "tfckpt": ["tfckpt_list", small],
            "tensorflow": ["tf_list", small],
        },
        "dump start-up (small checkpoint)": {
            "tfckpt": ["tfckpt_dump", keras_ckpt],
            "tensorflow": ["tf_inspect", keras_ckpt],
        },
    }
    results = {}
    for case, contenders in cases.items():
        if args.only and args.only not in case:
            continue
        runs = {name: [] for name in contenders}
        for _ in range(args.repeat):
            for name, cargs in contenders.items():  # alternate contenders every round
                try:
                    runs[name].append(measured(cargs))
                except ContenderFailed as e:
                    print(f"{case}, {name}: {e}", file=sys.stderr)
                    return 1
        results[case] = {
            name: {k: statistics.median(r[k] for r in rs) for k in ("wall", "inner", "rss")}
            for name, rs in runs.items()
        }
        print(f"done: {case}", file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)
    report = {"machine": machine(), "repeat": args.repeat, "results": results}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(table(report))
    return 0


def table(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; Python "
        f"{m['python']}, numpy {m['numpy']}, TensorFlow {m.get('tensorflow', '?')}; "
        f"medians of {report['repeat']} runs.",
        "",
        "| case | contender | wall (process) | vs TF | vs cp | in-process | peak RSS |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for case, res in report["results"].items():
        tf_wall = res.get("tensorflow", {}).get("wall")
        cp_wall = res.get("cp", {}).get("wall")
        for name, r in res.items():
            vs_tf = f"{r['wall'] / tf_wall:.2f}×" if tf_wall else ""
            vs_cp = f"{r['wall'] / cp_wall:.2f}×" if cp_wall else ""
            lines.append(
                f"| {case} | {name} | {r['wall']:.2f} s | {vs_tf} | {vs_cp} | "
                f"{r['inner']:.3f} s | {r['rss'] / 2**20:.0f} MiB |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
