"""Peak memory and time of the HTML reports, beside the same commands without them.

    python benchmarks/report_memory.py [--big-mib 512] [--medium 64] [--medium-mib 8]
                                       [--out benchmarks/out]

The input is run.py's 1 GiB checkpoint (written by TensorFlow, reused when present: one
512 MiB float32 tensor, 64 of 8 MiB and a step). Each command runs as a process of its
own, side by side in one run:

- ``tfckpt stats P --json`` and ``tfckpt stats P --json --html FILE`` (the same pass,
  plus the log2 histograms and the page);
- ``tfckpt convert P OUT --dtype float16 --no-fsync`` and the same with ``--report FILE``
  (after the conversion, the tensors of up to 65 536 values read whole and a sample of
  the larger ones, in the source and the output; the cast's counts are the
  conversion's; then the page).

Peak RSS (from the OS, wait4) and wall time, with the ratios of each report's to its
command's without it: the histograms hold one counter per power of two and count at
most the sample, so the peak should stay that of the streaming pass, whatever the
checkpoint's size. Results go to OUT/report_memory.json. The same comparison of times
is run.py's ``report:`` cases.
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for key in ("big_mib", "medium", "medium_mib"):
        ap.add_argument("--" + key.replace("_", "-"), type=int, default=SIZES[key])
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    args = ap.parse_args(argv)
    sizes = dict(SIZES, big_mib=args.big_mib, medium=args.medium, medium_mib=args.medium_mib)
    prefix = Inputs(os.path.join(args.out, "inputs"), sizes).path("big")
    work = os.path.join(args.out, "report_memory")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    tfckpt = [sys.executable, "-m", "tfckpt"]
    html, out = os.path.join(work, "page.html"), os.path.join(work, "fp16", "model")
    convert = [*tfckpt, "convert", prefix, out, "--dtype", "float16", "--no-fsync"]
    runs = {
        "stats --json": [*tfckpt, "stats", prefix, "--json"],
        "stats --json --html": [*tfckpt, "stats", prefix, "--json", "--html", html],
        "convert": [*convert, "--overwrite"],
        "convert --report": [*convert, "--overwrite", "--report", html],
    }
    results = {}
    for name, command in runs.items():
        if os.path.exists(html):
            os.remove(html)
        rss, wall = peak_rss(command)
        results[name] = {"peak_rss_mib": rss / 2**20, "seconds": wall}
    for report, plain in (("stats --json --html", "stats --json"), ("convert --report", "convert")):
        results[report]["rss_ratio"] = (
            results[report]["peak_rss_mib"] / results[plain]["peak_rss_mib"]
        )
        results[report]["time_ratio"] = results[report]["seconds"] / results[plain]["seconds"]
    gib = (args.big_mib + args.medium * args.medium_mib) / 1024
    print(f"input: {gib:.2f} GiB of float32 ({prefix})")
    print(f"{'command':<22}{'peak RSS':>12}{'time':>10}{'RSS ratio':>11}{'time ratio':>12}")
    for name, r in results.items():
        ratios = f"{r['rss_ratio']:>11.2f}{r['time_ratio']:>12.2f}" if "rss_ratio" in r else ""
        print(f"{name:<22}{r['peak_rss_mib']:>9.0f} MiB{r['seconds']:>9.1f}s{ratios}")
    with open(os.path.join(args.out, "report_memory.json"), "w") as f:
        json.dump({"input_gib": gib, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
