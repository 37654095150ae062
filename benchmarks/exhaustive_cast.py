"""Every float32 bit pattern through the SIMD cast and the reference cast: same bits, same counts.

    python benchmarks/exhaustive_cast.py [--targets float16 bfloat16] [--overflow clip inf]
                                         [--chunk-log2 24] [--stride 1]

All 2^32 patterns, in chunks, for each target and overflow policy ('error' writes what
'inf' writes). Not part of the test suite (minutes); tests/rewrite/test_cast_simd.py checks a
dense sample. ``--stride`` samples every n-th chunk for a quick look. Exits 1 on the
first difference, naming the pattern.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from tfckpt.format import dtypes as _dt
from tfckpt.rewrite.cast import CAST_ENV, Caster


def casters(target: str, overflow: str) -> tuple[Caster, Caster]:
    src, tgt = _dt.lookup("float32"), _dt.lookup(target)
    os.environ.pop(CAST_ENV, None)
    simd = Caster(src, tgt, overflow)
    os.environ[CAST_ENV] = "reference"
    ref = Caster(src, tgt, overflow)
    del os.environ[CAST_ENV]
    if simd.rounding != "numkong":
        sys.exit("NumKong's SIMD cast is not available here: nothing to compare")
    return simd, ref


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--targets", nargs="+", default=["float16", "bfloat16"])
    ap.add_argument("--overflow", nargs="+", default=["clip", "inf"])
    ap.add_argument("--chunk-log2", type=int, default=24)
    ap.add_argument("--stride", type=int, default=1, help="check every n-th chunk only")
    args = ap.parse_args(argv)
    chunk = 1 << args.chunk_log2
    for target in args.targets:
        for overflow in args.overflow:
            simd, ref = casters(target, overflow)
            t = time.perf_counter()
            checked = 0
            for start in range(0, 1 << 32, chunk * args.stride):
                values = np.arange(start, start + chunk, dtype=np.uint32).view(np.float32)
                a, b = simd(values), ref(values)
                if a.tobytes() != b.tobytes():
                    at = int(np.flatnonzero(a.view(np.uint16) != b.view(np.uint16))[0])
                    print(
                        f"float32 {start + at:#010x} -> {target} ({overflow}): "
                        f"SIMD {a.view(np.uint16)[at]:#06x}, reference {b.view(np.uint16)[at]:#06x}"
                    )
                    return 1
                checked += chunk
            if simd.counts != ref.counts:
                print(f"{target} ({overflow}): counts differ: {simd.counts} != {ref.counts}")
                return 1
            print(
                f"float32 -> {target} ({overflow}): {checked} patterns identical, "
                f"counts {simd.counts}, {time.perf_counter() - t:.0f} s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
