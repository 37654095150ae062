"""export, import and dump next to convert and TensorFlow, in one run: the targets of the
"every path at the floor" work (docs/performance.md).

    python benchmarks/paths.py [--repeat 3] [--only CASE ...] [--list] [--out benchmarks/out]
                               [--big-mib 512 --medium 64 --medium-mib 8 --many 200000]

The inputs are run.py's (written by TensorFlow on first use, reused while their sizes
stay the same): the 1 GiB checkpoint (one 512 MiB float32 tensor, 64 of 8 MiB, a step)
and the checkpoint of ``--many`` small float32 tensors; the safetensors files an import
reads are those checkpoints exported by tfckpt (float32, made once), and the second
checkpoint of an average is the many-tensor one rewritten by ``tfckpt convert`` (once).
Each contender runs as its own process, in turn, ``--repeat`` times (see run.py's
``measure``: peak RSS from the OS, outputs synced and memory prefaulted before each);
the table gives
medians and, per row, the ratio of its whole-process time to the row it is judged
against (``vs``). Every tfckpt contender is durable (fsync), as ``convert`` is by
default. A quick smoke run: ``--repeat 1 --big-mib 16 --medium 4 --medium-mib 4
--many 2000``. Results go to OUT/paths.json.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import run  # noqa: E402  (the harness: inputs, measuring, the machine)

import tfckpt  # noqa: E402

SIZES = {k: run.SIZES[k] for k in ("big_mib", "medium", "medium_mib", "many", "small_floats")}


def _made_once(root: str, name: str, made_from: str, command: list[str], out: str) -> str:
    """``out``, made by the tfckpt ``command`` from ``made_from`` unless made from it
    already (a stamp beside it says so)."""
    path = os.path.join(root, name, out)
    stamp = path + ".json"
    if os.path.exists(stamp) and json.load(open(stamp)) == {"from": made_from}:
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    subprocess.run([sys.executable, "-m", "tfckpt", *command, path], check=True)
    with open(stamp, "w") as f:
        json.dump({"from": made_from}, f)
    return path


def safetensors_input(inputs: run.Inputs, root: str, kind: str = "big") -> str:
    """A TensorFlow-written input exported as float32 safetensors (once per input)."""
    src = inputs.path(kind)
    name = "big-safetensors" if kind == "big" else f"{kind}-safetensors"
    command = ["export", src, "--overwrite", "--with-bookkeeping"]
    return _made_once(root, name, src, command, "model.safetensors")


def second_checkpoint(inputs: run.Inputs, root: str, kind: str) -> str:
    """A second checkpoint of the same tensors for an average: the TensorFlow-written
    input rewritten by ``tfckpt convert`` (equal values: averaging them is the same work)."""
    src = inputs.path(kind)
    return _made_once(root, f"{kind}-second", src, ["convert", src, "--overwrite"], "model")


def cases(inputs: run.Inputs, root: str, work: str, sizes: dict) -> dict:
    """Each case: name -> (a function giving its contenders, {contender: the one it is
    judged against})."""
    one = run._mib_label(sizes["big_mib"] + sizes["medium"] * sizes["medium_mib"])
    many = sizes["many"]
    big = lambda: inputs.path("big")  # noqa: E731
    lots = lambda: inputs.path("many")  # noqa: E731
    st = f"{work}/export/model.safetensors"
    return {
        f"export {one} float32 -> safetensors": (
            lambda: {
                "convert float16": ["tfckpt_convert", big(), f"{work}/c16/model", "float16"],
                "export float16": ["tfckpt_export_modules", big(), st, "--dtype", "float16"],
                "export bfloat16": ["tfckpt_export_modules", big(), st, "--dtype", "bfloat16"],
                "convert bfloat16": ["tfckpt_convert", big(), f"{work}/cb16/model", "bfloat16"],
                "export float32 (no cast)": ["tfckpt_export_modules", big(), st],
                "cp + fsync": ["cp_durable", big(), f"{work}/cpd/model"],
            },
            {
                "export float16": "convert float16",
                "export bfloat16": "export float16",
                "convert bfloat16": "convert float16",
                "export float32 (no cast)": "cp + fsync",
            },
        ),
        f"import {one} safetensors -> V2 checkpoint": (
            lambda: {
                "convert float16": ["tfckpt_convert", big(), f"{work}/c16/model", "float16"],
                "import float16": [
                    "tfckpt_import",
                    safetensors_input(inputs, root),
                    f"{work}/i16/model",
                    "--dtype",
                    "float16",
                ],
                "import float32 (no cast)": [
                    "tfckpt_import",
                    safetensors_input(inputs, root),
                    f"{work}/i32/model",
                ],
                "cp + fsync": ["cp_durable", big(), f"{work}/cpd/model"],
            },
            {"import float16": "convert float16", "import float32 (no cast)": "cp + fsync"},
        ),
        f"{many} small tensors": (
            lambda: {
                "convert float16": ["tfckpt_convert", lots(), f"{work}/m16/model", "float16"],
                "tensorflow convert": ["tf_convert", lots(), f"{work}/mtf/model", "float16"],
                "export safetensors": [
                    "tfckpt_export_modules",
                    lots(),
                    f"{work}/mst/model.safetensors",
                    "--dtype",
                    "float16",
                ],
                "export npz": [
                    "tfckpt_export_modules",
                    lots(),
                    f"{work}/mnpz/model.npz",
                    "--dtype",
                    "float16",
                ],
                "tensorflow + save_file": ["tf_export", lots(), f"{work}/mtfst/model.safetensors"],
                "import safetensors": [
                    "tfckpt_import",
                    safetensors_input(inputs, root, "many"),
                    f"{work}/mi16/model",
                    "--dtype",
                    "float16",
                ],
                "load_file + tensorflow SaveV2": [
                    "tf_import",
                    safetensors_input(inputs, root, "many"),
                    f"{work}/mtfi/model",
                    "float16",
                ],
                "average of two": [
                    "tfckpt_average",
                    lots(),
                    second_checkpoint(inputs, root, "many"),
                    f"{work}/mavg/model",
                ],
                "tensorflow average": [
                    "tf_average",
                    lots(),
                    second_checkpoint(inputs, root, "many"),
                    f"{work}/mtfavg/model",
                ],
                "dump --json": ["tfckpt_list", lots()],
                "tf.train.list_variables": ["tf_list", lots()],
            },
            {
                "convert float16": "tensorflow convert",
                "export safetensors": "convert float16",
                "export npz": "convert float16",
                "tensorflow + save_file": "convert float16",
                "import safetensors": "convert float16",
                "load_file + tensorflow SaveV2": "import safetensors",
                "average of two": "tensorflow average",
                "dump --json": "tf.train.list_variables",
            },
        ),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=3)
    for key, default in SIZES.items():
        ap.add_argument("--" + key.replace("_", "-"), type=int, default=default)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--only", action="append", help="cases whose name contains this")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument(
        "--prefault-mib",
        type=int,
        default=run.PREFAULT["bytes"] >> 20,
        help="memory touched and freed before every run (0: none)",
    )
    args = ap.parse_args(argv)
    run.PREFAULT["bytes"] = args.prefault_mib << 20
    sizes = dict(run.SIZES, **{k: getattr(args, k) for k in SIZES})
    root = os.path.join(args.out, "inputs")
    inputs = run.Inputs(root, sizes)
    work = os.path.join(args.out, "work")
    every = cases(inputs, root, work, sizes)
    chosen = [c for c in every if not args.only or any(o in c for o in args.only)]
    if args.list:
        print("\n".join(chosen))
        return 0
    compileall.compile_dir(os.path.dirname(tfckpt.__file__), quiet=1)
    results, judged = {}, {}
    for case in chosen:
        make, against = every[case]
        contenders = make()
        runs: dict[str, list[dict]] = {name: [] for name in contenders}
        for _ in range(args.repeat):
            for name, cargs in contenders.items():  # alternate contenders every round
                try:
                    runs[name].append(run.measured(cargs))
                except run.ContenderFailed as e:
                    print(f"{case}, {name}: {e}", file=sys.stderr)
                    return 1
                shutil.rmtree(work, ignore_errors=True)
        results[case] = {
            name: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "modules"}
            | {"modules": sorted({m for r in rs for m in r.get("modules", [])})}
            for name, rs in runs.items()
        }
        judged[case] = against
        print(f"done: {case}", file=sys.stderr)
    report = {
        "machine": run.machine(),
        "load": os.getloadavg(),
        "repeat": args.repeat,
        "sizes": sizes,
        "results": results,
        "against": judged,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "paths.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(table(report))
    return 0


def table(report: dict) -> str:
    """The report as a Markdown table: each row's time as a ratio to the row it is judged
    against, its peak RSS, and what it imported of the watched modules."""
    m = report["machine"]
    lines = [
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; Python "
        f"{m['python']}, numpy {m['numpy']}, TensorFlow {m.get('tensorflow', '?')}; "
        f"medians of {report['repeat']} runs; load average at the end "
        + "/".join(f"{x:.2f}" for x in report["load"])
        + ".",
        "",
        "| case | contender | wall (process) | ratio | in-process | peak RSS | imported |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for case, res in report["results"].items():
        against = report["against"][case]
        for name, r in res.items():
            base = against.get(name)
            ratio = f"{r['wall'] / res[base]['wall']:.2f}× {base}" if base in res else ""
            lines.append(
                f"| {case} | {name} | {r['wall']:.2f} s | {ratio} | {r['inner']:.3f} s | "
                f"{r['rss'] / 2**20:.0f} MiB | {', '.join(r['modules'])} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
