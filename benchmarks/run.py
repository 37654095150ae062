"""Benchmarks against TensorFlow's own readers and savers and the machine's floors, in one run.

    python benchmarks/run.py [--repeat 3] [--only CASE ...] [--list] [--out benchmarks/out]
                             [--big-mib 512 --medium 64 --medium-mib 8 ...]  (sizes: --help)

Inputs are written by TensorFlow itself, when a selected case first needs them. Each
contender runs as its own process, in turn, ``--repeat`` times; the table shows medians
of the whole-process wall time and peak RSS (from the OS, via wait4) and of the
in-process time after imports, with ratios to TensorFlow and to a copy of the same
files that is as durable (``cp + fsync`` for tfckpt's default, ``cp`` for
``--no-fsync``), and GB/s where a contender moves a known number of bytes. A quick
smoke run: ``--repeat 1 --big-mib 16 --medium 4 --medium-mib 4 --small 200 --many 2000
--cast-mib 32 --huge-big-mib 64 --huge-medium 4 --huge-medium-mib 16``.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys

import tfckpt

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
    # Both sides start as installed software does, from cached bytecode: TensorFlow's
    # is compiled at install time, and an environment that forbids writing bytecode
    # would have tfckpt (an editable install here) compile its sources at every start.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    _prefault(PREFAULT["bytes"])
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
    got = {"wall": res["wall"], "rss": res["rss"], "inner": inner["seconds"]}
    if "throughput" in inner:  # bytes the in-process time moved (GB/s in the table)
        got["throughput"] = inner["throughput"]
    if "modules" in inner:  # what the contender imported (of those it watches)
        got["modules"] = inner["modules"]
    return got


# Memory touched and freed before every run. On a virtual machine, pages the guest frees
# (a deleted output's page cache) go back to the host and fault in again at a fraction
# of the usual speed; without this, that cost lands on whichever contender follows a
# big deletion, not on the one that caused it.
PREFAULT = {"bytes": 2 << 30}


def _prefault(nbytes: int) -> None:
    if nbytes:
        subprocess.run(
            [sys.executable, "-c", f"import numpy; numpy.ones({nbytes}, numpy.uint8)"],
            check=True,
        )


def measured(args: list[str]) -> dict:
    """One contender of contenders.py, measured."""
    return measure([sys.executable, CONTENDERS, *args])


SIZES = {  # input sizes, all scalable for a quick run (--help)
    "big_mib": 512,  # the 1 GiB input: one tensor of this size ...
    "medium": 64,  # ... and this many ...
    "medium_mib": 8,  # ... of this size
    "huge_big_mib": 2048,  # the 4 GiB input: one 2 GiB tensor and many 16 MiB ones
    "huge_medium": 128,
    "huge_medium_mib": 16,
    "small": 20000,  # small tensors of small_floats float32 each ...
    "many": 200000,  # ... and ten times as many, for linearity
    "small_floats": 256,
    "cast_mib": 256,  # float32 cast in-process for the cast-alone rows
}

_BIG = """
def floats(n):
    return rng.standard_normal(n, dtype=np.float32) * 0.05
names, tensors = ["big/kernel"], [tf.constant(floats({big_mib} << 18).reshape(-1, 1024))]
for i in range({medium}):
    names.append(f"layer_{{i:02d}}/kernel")
    tensors.append(tf.constant(floats({medium_mib} << 18).reshape(-1, 512)))
names.append("global_step"); tensors.append(tf.constant(np.int64(1000)))
tf.raw_ops.SaveV2(prefix=PREFIX, tensor_names=names,
                  shape_and_slices=[""] * len(names), tensors=tensors)
"""
# In parts merged by TensorFlow (its sharded save), so no more than the 2 GiB tensor is
# in memory at once.
_HUGE = """
parts = [PREFIX + "_part0"]
with tf.device("/CPU:0"):
    big = tf.random.stateless_normal([{huge_big_mib} << 8, 1024], seed=[0, 0]) * 0.05
tf.raw_ops.SaveV2(prefix=parts[0], tensor_names=["big/kernel"], shape_and_slices=[""],
                  tensors=[big])
del big
for first in range(0, {huge_medium}, 16):
    names = [f"layer_{{i:03d}}/kernel" for i in range(first, min(first + 16, {huge_medium}))]
    tensors = [tf.random.stateless_normal([{huge_medium_mib} << 9, 512], seed=[1, i]) * 0.05
               for i in range(len(names))]
    parts.append(PREFIX + f"_part{{len(parts)}}")
    tf.raw_ops.SaveV2(prefix=parts[-1], tensor_names=names,
                      shape_and_slices=[""] * len(names), tensors=tensors)
tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=parts, destination_prefix=PREFIX)
"""
_SMALL = """
names = [f"scope_{{i // 100:04d}}/var_{{i % 100:02d}}" for i in range({count})]
tf.raw_ops.SaveV2(prefix=PREFIX, tensor_names=names, shape_and_slices=[""] * len(names),
                  tensors=[tf.constant(rng.standard_normal({small_floats}, dtype=np.float32)
                                       * 0.05) for _ in names])
"""
_KERAS = """
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"),
                          keras.layers.BatchNormalization(), keras.layers.Dense(10)])
model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
model.fit(rng.random((64, 32)), rng.random((64, 10)), epochs=1, verbose=0)
PREFIX = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(PREFIX + "/ckpt")
"""


class Inputs:
    """The benchmark checkpoints, written by TensorFlow on first use (and reused while
    their sizes stay the same): only what the selected cases need."""

    def __init__(self, root: str, sizes: dict):
        self.root, self.sizes = root, sizes

    def path(self, kind: str) -> str:
        spec: dict = {"kind": kind}
        if kind == "big":
            code = _BIG
            spec.update({k: self.sizes[k] for k in ("big_mib", "medium", "medium_mib")})
        elif kind == "huge":
            code = _HUGE
            spec.update({k: self.sizes[k] for k in SIZES if k.startswith("huge_")})
        elif kind in ("small", "many"):
            code = _SMALL
            spec.update(count=self.sizes[kind], small_floats=self.sizes["small_floats"])
        elif kind == "keras":
            code = _KERAS
        else:
            raise ValueError(kind)
        directory = os.path.join(self.root, kind)
        stamp = os.path.join(directory, "input.json")
        if os.path.exists(stamp):
            with open(stamp) as f:
                done = json.load(f)
            if done["spec"] == spec:
                return done["prefix"]
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        prefix = os.path.join(directory, "model" if kind != "keras" else "")
        script = (
            "import os, json, sys, numpy as np\n"
            "os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
            "import tensorflow as tf\n"
            + ("import keras\n" if kind == "keras" else "")
            + f"rng = np.random.default_rng(0)\nPREFIX = {prefix.rstrip('/')!r}\n"
            + code.format(**spec)
            + f"json.dump({{'spec': {spec!r}, 'prefix': PREFIX}}, open({stamp!r}, 'w'))\n"
        )
        subprocess.run([sys.executable, "-c", script], check=True)
        return self.path(kind)


def _mib_label(mib: int) -> str:
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib} MiB"


def _convert(src: str, dst: str, dtype: str, cp: bool = True, tf1: bool = False) -> dict:
    """tfckpt (durable by default) next to a durable copy, --no-fsync next to cp, and
    TensorFlow's way: like compares with like (FLOORS)."""
    c = {
        "tfckpt": ["tfckpt_convert", src, f"{dst}/tfckpt/model", dtype],
        "cp + fsync": ["cp_durable", src, f"{dst}/cpd/model"],
        "tfckpt --no-fsync": ["tfckpt_convert", src, f"{dst}/nofsync/model", dtype, "--no-fsync"],
        "cp": ["cp_data", src, f"{dst}/cp/model"],
        "tensorflow": ["tf_convert", src, f"{dst}/tf/model", dtype],
    }
    if tf1:
        c["tf1 saver builder"] = ["tf1_saver_builder_convert", src, f"{dst}/tf1/model", dtype]
    if not cp:
        for k in ("cp + fsync", "cp", "tfckpt --no-fsync"):
            del c[k]
    return c


def _with_report(src: str, dst: str) -> dict:
    """The same conversion without and with ``--report`` (no fsync either way: the
    difference is the report's own work), side by side: see :func:`beside`."""
    convert = ["tfckpt_convert", src, f"{dst}/out/model", "float16", "--no-fsync"]
    return {
        "tfckpt --no-fsync": convert,
        "tfckpt --no-fsync --report": [*convert, "--report", f"{dst}/report.html"],
    }


# Contenders timed beside another of the same case: (contender, the one it adds to).
BESIDE = [("tfckpt --no-fsync --report", "tfckpt --no-fsync")]


def beside(results: dict) -> list[str]:
    """Per case with both, what a contender adds to the other: the ratio of their wall
    times and the difference."""
    notes = []
    for case, res in results.items():
        for more, base in BESIDE:
            if more in res and base in res:
                a, b = res[more]["wall"], res[base]["wall"]
                notes.append(
                    f"- {case}: {more} / {base}: {a / b:.2f}× the time ({a - b:+.2f} s), "
                    f"peak {res[more]['rss'] / 2**20:.0f} / {res[base]['rss'] / 2**20:.0f} MiB"
                )
    return notes


def cases(inputs: Inputs, work: str, sizes: dict) -> dict:
    """Every case: its name -> a function giving its contenders (inputs made on demand)."""
    one = _mib_label(sizes["big_mib"] + sizes["medium"] * sizes["medium_mib"])
    four = _mib_label(sizes["huge_big_mib"] + sizes["huge_medium"] * sizes["huge_medium_mib"])
    small, many, cast_mib = sizes["small"], sizes["many"], str(sizes["cast_mib"])
    half = str((sizes["big_mib"] + sizes["medium"] * sizes["medium_mib"]) // 2)

    def cast_rows(target: str) -> dict:
        return {
            name: ["cast_alone", how, target, cast_mib]
            for name, how in [
                ("tfckpt (SIMD)", "simd"),
                ("NumKong alone, one core", "simd-1thread"),
                ("NumKong alone, two threads", "simd-2threads"),
                ("tfckpt reference (numpy, two threads)", "reference"),
                ("tf.cast (CPU)", "tf-cast"),
                ("tfckpt --backend tf (CPU)", "tf-backend"),
            ]
        }

    big = lambda: inputs.path("big")  # noqa: E731
    return {
        f"convert float32->float16 ({one})": lambda: _convert(
            big(), f"{work}/f16", "float16", tf1=True
        ),
        f"convert float32->bfloat16 ({one})": lambda: _convert(big(), f"{work}/bf16", "bfloat16"),
        f"convert float32->float16 ({four})": lambda: {
            k: v
            for k, v in _convert(inputs.path("huge"), f"{work}/huge", "float16").items()
            if k != "tensorflow"
        },
        f"convert {small} small tensors to float16": lambda: _convert(
            inputs.path("small"), f"{work}/s16", "float16", cp=False
        ),
        f"convert {many} small tensors to float16": lambda: _convert(
            inputs.path("many"), f"{work}/m16", "float16", cp=False
        ),
        f"dump --json {small} tensors": lambda: {
            "tfckpt": ["tfckpt_list", inputs.path("small")],
            "tensorflow": ["tf_list", inputs.path("small")],
        },
        f"dump --json {many} tensors": lambda: {
            "tfckpt": ["tfckpt_list", inputs.path("many")],
            "tensorflow": ["tf_list", inputs.path("many")],
        },
        f"cast alone float32->float16 ({cast_mib} MiB, in-process)": lambda: cast_rows("float16"),
        f"cast alone float32->bfloat16 ({cast_mib} MiB, in-process)": lambda: cast_rows("bfloat16"),
        f"floors ({one} of float32 in, {_mib_label(int(half))} out)": lambda: {
            "read the data (page cache)": ["read_data", big()],
            "CRC32C of the data": ["crc32c_alone", str(int(half) * 2)],
            "write the output": ["write_data", f"{work}/floor/out", half],
            "write the output + fsync": ["write_data", f"{work}/floor/outd", half, "fsync"],
        },
        "convert Keras checkpoint to float16": lambda: {
            "tfckpt": ["tfckpt_convert", inputs.path("keras"), f"{work}/k16/ckpt", "float16"],
            "tensorflow": ["tf_convert", inputs.path("keras"), f"{work}/ktf16/ckpt", "float16"],
        },
        f"export to safetensors ({one})": lambda: {
            "tfckpt": ["tfckpt_export", big(), f"{work}/export/model.safetensors"],
            "tensorflow": ["tf_export", big(), f"{work}/tfexport/model.safetensors"],
        },
        f"read every tensor ({one})": lambda: {
            "tfckpt": ["tfckpt_read_all", big()],
            "tensorflow": ["tf_read_all", big()],
        },
        f"report: convert float32->float16 ({one})": lambda: _with_report(big(), f"{work}/r16"),
        f"report: convert {small} small tensors to float16": lambda: _with_report(
            inputs.path("small"), f"{work}/rs16"
        ),
        "report: convert Keras checkpoint to float16": lambda: _with_report(
            inputs.path("keras"), f"{work}/rk16"
        ),
        "dump start-up (small checkpoint)": lambda: {
            "tfckpt": ["tfckpt_dump", inputs.path("keras")],
            "tensorflow": ["tf_inspect", inputs.path("keras")],
        },
    }


# Which case's time a case's is compared with, and what linear growth would be.
def scaling(sizes: dict) -> list[tuple[str, str, float]]:
    one = _mib_label(sizes["big_mib"] + sizes["medium"] * sizes["medium_mib"])
    four_mib = sizes["huge_big_mib"] + sizes["huge_medium"] * sizes["huge_medium_mib"]
    one_mib = sizes["big_mib"] + sizes["medium"] * sizes["medium_mib"]
    small, many = sizes["small"], sizes["many"]
    return [
        (
            f"convert float32->float16 ({_mib_label(four_mib)})",
            f"convert float32->float16 ({one})",
            four_mib / one_mib,
        ),
        (
            f"convert {many} small tensors to float16",
            f"convert {small} small tensors to float16",
            many / small,
        ),
        (f"dump --json {many} tensors", f"dump --json {small} tensors", many / small),
    ]


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
    for key, default in SIZES.items():
        ap.add_argument("--" + key.replace("_", "-"), type=int, default=default)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument(
        "--only",
        action="append",
        help="run only cases whose name contains this (repeat for several)",
    )
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument(
        "--prefault-mib",
        type=int,
        default=PREFAULT["bytes"] >> 20,
        help="memory touched and freed before every run (0: none)",
    )
    args = ap.parse_args(argv)
    PREFAULT["bytes"] = args.prefault_mib << 20
    sizes = {k: getattr(args, k) for k in SIZES}
    inputs = Inputs(os.path.join(args.out, "inputs"), sizes)
    work = os.path.join(args.out, "work")
    every = cases(inputs, work, sizes)
    chosen = [c for c in every if not args.only or any(o in c for o in args.only)]
    if args.list:
        print("\n".join(chosen))
        return 0
    # tfckpt's bytecode, as an install compiles it (see measure())
    compileall.compile_dir(os.path.dirname(tfckpt.__file__), quiet=1)
    results = {}
    for case in chosen:
        contenders = every[case]()
        runs: dict[str, list[dict]] = {name: [] for name in contenders}
        for _ in range(args.repeat):
            for name, cargs in contenders.items():  # alternate contenders every round
                try:
                    runs[name].append(measured(cargs))
                except ContenderFailed as e:
                    print(f"{case}, {name}: {e}", file=sys.stderr)
                    return 1
                shutil.rmtree(work, ignore_errors=True)  # outputs would fill the disk
        results[case] = {
            name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            for name, rs in runs.items()
        }
        print(f"done: {case}", file=sys.stderr)
    report = {"machine": machine(), "repeat": args.repeat, "sizes": sizes, "results": results}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(table(report))
    return 0


# Like with like: tfckpt fsyncs its output by default, as a durable copy does.
FLOORS = {"tfckpt": "cp + fsync", "tfckpt --no-fsync": "cp", "tensorflow": "cp"}


def table(report: dict) -> str:
    """The report as a Markdown table, then how the scaled cases grew."""
    m = report["machine"]
    lines = [
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; Python "
        f"{m['python']}, numpy {m['numpy']}, TensorFlow {m.get('tensorflow', '?')}; "
        f"medians of {report['repeat']} runs.",
        "",
        "| case | contender | wall (process) | vs TF | vs copy | in-process | GB/s | peak RSS |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    results = report["results"]
    for case, res in results.items():
        tf_wall = res.get("tensorflow", {}).get("wall")
        for name, r in res.items():
            floor = res.get(FLOORS.get(name, ""), {}).get("wall")
            vs_tf = f"{r['wall'] / tf_wall:.2f}×" if tf_wall else ""
            vs_cp = f"{r['wall'] / floor:.2f}× {FLOORS[name]}" if floor else ""
            rate = f"{r['throughput'] / r['inner'] / 1e9:.2f}" if r.get("throughput") else ""
            lines.append(
                f"| {case} | {name} | {r['wall']:.2f} s | {vs_tf} | {vs_cp} | "
                f"{r['inner']:.3f} s | {rate} | {r['rss'] / 2**20:.0f} MiB |"
            )
    notes = []
    for big, small, linear in scaling(report.get("sizes", SIZES)):
        if big in results and small in results:
            for name in results[big]:
                if name in results[small]:
                    grew = results[big][name]["wall"] / results[small][name]["wall"]
                    notes.append(
                        f"- {big} / {small}, {name}: {grew:.2f}× the time (linear: {linear:g}×)"
                    )
    notes += beside(results)
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
