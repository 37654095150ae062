"""Peak memory of ``tfckpt average`` over several sources of the 1 GiB benchmark input.

    python benchmarks/average_memory.py [--sources 5] [--chunk-bytes 64M] [--big-mib 512]
                                        [--medium 64] [--medium-mib 8] [--out benchmarks/out]

The input is run.py's (written by TensorFlow, reused when present): one 512 MiB tensor
and 64 tensors of 8 MiB, float32. The sources are that checkpoint under N prefixes
whose files are hard links of it (no extra disk; tfckpt reads every source in full,
with positioned reads, never mapped). ``tfckpt average`` runs as its own process;
its peak RSS comes from the OS (wait4) and is set against the chunk budget × sources,
and against the RSS of the same interpreter doing nothing but importing tfckpt.
Results go to OUT/average_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from run import SIZES, Inputs  # noqa: E402


def peak_rss(command: list[str]) -> tuple[int, float]:
    """Peak RSS (bytes) and wall time of ``command`` run as its own process."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    start = time.perf_counter()
    p = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - start
    assert p.stderr is not None
    err = p.stderr.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{err[-2000:]}")
    return usage.ru_maxrss * 1024, wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sources", type=int, default=5)
    ap.add_argument("--chunk-bytes", default="64M")
    ap.add_argument("--big-mib", type=int, default=512)
    ap.add_argument("--medium", type=int, default=64)
    ap.add_argument("--medium-mib", type=int, default=8)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    args = ap.parse_args(argv)
    from tfckpt.cli import parse_size

    budget = parse_size(args.chunk_bytes)
    sizes = dict(SIZES, big_mib=args.big_mib, medium=args.medium, medium_mib=args.medium_mib)
    big = Inputs(os.path.join(args.out, "inputs"), sizes).path("big")
    work = os.path.join(args.out, "average")
    shutil.rmtree(work, ignore_errors=True)
    sources = []
    for k in range(args.sources):
        prefix = os.path.join(work, f"src{k}", "model")
        os.makedirs(os.path.dirname(prefix))
        for name in os.listdir(os.path.dirname(big)):
            if name.startswith(os.path.basename(big) + "."):
                os.link(
                    os.path.join(os.path.dirname(big), name),
                    os.path.join(os.path.dirname(prefix), name),
                )
        sources.append(prefix)
    size = sum(
        os.path.getsize(os.path.join(os.path.dirname(big), n))
        for n in os.listdir(os.path.dirname(big))
        if n.startswith(os.path.basename(big) + ".data-")
    )
    baseline, _ = peak_rss([sys.executable, "-c", "import tfckpt, tfckpt.rewrite.average, numpy"])
    rss, wall = peak_rss(
        [
            sys.executable,
            "-m",
            "tfckpt",
            "average",
            *sources,
            "-o",
            os.path.join(work, "avg"),
            "--chunk-bytes",
            str(budget),
            "--no-fsync",
        ]
    )
    report = {
        "sources": args.sources,
        "source_bytes": size,
        "chunk_bytes": budget,
        "bound": budget * args.sources,
        "peak_rss": rss,
        "import_rss": baseline,
        "above_imports": rss - baseline,
        "wall": wall,
        "within_bound": rss - baseline < budget * args.sources,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "average_memory.json"), "w") as f:
        json.dump(report, f, indent=1)
    mib = 1 << 20
    print(
        f"average of {args.sources} x {size / mib:.0f} MiB: peak RSS {rss / mib:.0f} MiB "
        f"({(rss - baseline) / mib:.0f} MiB above the {baseline / mib:.0f} MiB of the imports); "
        f"chunk budget x sources = {budget * args.sources / mib:.0f} MiB; {wall:.1f} s"
    )
    shutil.rmtree(work, ignore_errors=True)
    return 0 if report["within_bound"] else 1


if __name__ == "__main__":
    sys.exit(main())
