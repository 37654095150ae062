"""Where the time of one ``tfckpt convert`` goes, phase by phase, in one process.

    python benchmarks/breakdown.py SRC_PREFIX [--dtype float16] [--no-fsync] [--floors]
                                   [--out DIR] [--cast-mib 256]

Start-up (interpreter, then importing tfckpt), planning, then the run, whose phases are
timed by wrapping the functions that do them: reading from the page cache into the
ring buffers, the source's CRC32C check, the cast, the output's CRC32C, writing into
the page cache, fsync, the commit. The pipeline overlaps reading, casting and writing on
several threads, so the phases are busy times summed over threads and add up to more
than the run's wall time; the page faults are the process's, over the run. With
``--floors``, the same machine's floors follow, measured the same way in this process:
reading the data files into one reused buffer, CRC32C of as many bytes, writing the
output's size with and without fsync, the cast alone (SIMD and reference), and ``cp``
(``shutil.copyfile``) with and without fsync.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict

T_SCRIPT = time.perf_counter()


def _interpreter_startup() -> float | None:
    """Seconds from this process's start to this script running (Linux; else None)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


STARTUP = _interpreter_startup()

BUSY: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)
_LOCK = threading.Lock()


def timed(owner, attr: str, phase: str) -> None:
    """Wrap ``owner.attr`` so that its time is added to ``phase``."""
    inner = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            dt = time.perf_counter() - t
            with _LOCK:
                BUSY[phase] += dt
                CALLS[phase] += 1

    setattr(owner, attr, wrapper)


def _faults() -> tuple[int, int]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_minflt, ru.ru_majflt


def convert_breakdown(src: str, dst: str, dtype: str, durable: bool) -> list[tuple]:
    t = time.perf_counter()
    import tfckpt
    from tfckpt.checkpoint import reader, writer
    from tfckpt.io import storage
    from tfckpt.rewrite import cast, engine

    rows: list[tuple] = []
    if STARTUP is not None:
        rows.append(("interpreter start-up (to this script)", STARTUP, ""))
    rows.append(("import tfckpt", time.perf_counter() - t, ""))

    timed(storage.LocalReader, "readinto", "read: page cache -> ring buffers (preadv)")
    timed(storage.LocalReader, "view", "read: mapped views")
    timed(reader, "crc32c", "CRC32C of the source")
    timed(cast.Caster, "__post_init__", "cast set-up (the first imports NumKong, ml-dtypes)")
    timed(cast.Caster, "__call__", "cast (rounding and checks)")
    timed(writer, "crc32c", "CRC32C of the output")
    timed(writer.ShardWriter, "_write", "write: into the page cache (with writeback starts)")
    timed(storage.Storage, "writeback", "  of which sync_file_range (start writeback)")
    timed(storage.Storage, "fsync", "fsync of files")
    timed(storage.Storage, "fsync_dir", "fsync of directories")
    timed(engine, "commit_shards", "commit: index, renames (its fsyncs included above)")

    t = time.perf_counter()
    p = tfckpt.plan(src, dst, cast=dtype, overwrite=True, durable=durable)
    rows.append(("open and plan", time.perf_counter() - t, ""))
    minflt, majflt = _faults()
    t = time.perf_counter()
    summary = engine.execute(p)
    run = time.perf_counter() - t
    minflt, majflt = _faults()[0] - minflt, _faults()[1] - majflt
    rows.append(("run (wall)", run, f"{summary.bytes_in / run / 1e9:.2f} GB/s of input"))
    for phase, busy in BUSY.items():
        rows.append((f"  {phase}", busy, f"{CALLS[phase]} calls"))
    rows.append(("  page faults during the run", None, f"{minflt} minor, {majflt} major"))
    rows.append(("  tensors", None, f"{len(p.tensors)}"))
    rows.append(("total, from process start", (STARTUP or 0) + time.perf_counter() - T_SCRIPT, ""))
    rows.append(("(rounding by)", None, _rounding(dtype)))
    return rows


def _rounding(dtype: str) -> str:
    from tfckpt.format import dtypes as _dt
    from tfckpt.rewrite.cast import Caster

    return Caster(_dt.lookup("float32"), _dt.lookup(dtype)).rounding


def _data_files(src: str) -> list[str]:
    d, base = os.path.dirname(src) or ".", os.path.basename(src)
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.startswith(base + ".data-"))


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def floors(src: str, work: str, dtype: str, cast_mib: int) -> list[tuple]:
    import crc32c
    import numpy as np

    from tfckpt.format import dtypes as _dt
    from tfckpt.rewrite.cast import CAST_ENV, Caster

    rows: list[tuple] = []
    files = _data_files(src)
    size = sum(os.path.getsize(f) for f in files)
    buf = bytearray(8 << 20)
    t = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    rows.append(("read the data files (page cache)", time.perf_counter() - t, _gbs(size, t)))

    data = np.frombuffer(os.urandom(8 << 20), np.uint8)
    t = time.perf_counter()
    crc = 0
    for _ in range(size // data.size):
        crc = crc32c.crc32c(data, crc)
    rows.append(("CRC32C of as many bytes", time.perf_counter() - t, _gbs(size, t)))

    half = size // 2
    for durable in (False, True):
        out = os.path.join(work, f"floor-{durable}")
        t = time.perf_counter()
        with open(out, "wb", buffering=0) as f:
            done = 0
            while done < half:
                done += f.write(memoryview(data)[: half - done])
            if durable:
                os.fsync(f.fileno())
        label = "write half as many bytes" + (" + fsync" if durable else "")
        rows.append((label, time.perf_counter() - t, _gbs(half, t)))
        os.remove(out)

    for durable in (False, True):
        out = os.path.join(work, f"cp-{durable}")
        os.makedirs(out)
        t = time.perf_counter()
        for path in files:
            copy = os.path.join(out, os.path.basename(path))
            shutil.copyfile(path, copy)
            if durable:
                _fsync_path(copy)
        if durable:
            _fsync_path(out)
        rows.append(
            (
                "cp of the data files" + (" + fsync" if durable else ""),
                time.perf_counter() - t,
                _gbs(size, t),
            )
        )
        shutil.rmtree(out)

    values = np.random.default_rng(0).standard_normal(cast_mib << 18, dtype=np.float32) * 0.05
    step = 2 << 20  # the engine's chunk: 8 MiB of float32
    ring = [np.empty(step * 2, np.uint8) for _ in range(3)]
    turn = iter(range(1 << 40))

    def buffers(nbytes: int) -> np.ndarray:
        return ring[next(turn) % len(ring)][:nbytes]

    for mode in ("", "reference"):
        os.environ[CAST_ENV] = mode
        caster = Caster(_dt.lookup("float32"), _dt.lookup(dtype), buffers=buffers)
        caster(values[:step])
        t = time.perf_counter()
        for i in range(0, values.size, step):
            caster(values[i : i + step])
        rows.append(
            (
                f"cast alone ({caster.rounding}, {cast_mib} MiB)",
                time.perf_counter() - t,
                _gbs(values.nbytes, t),
            )
        )
    os.environ.pop(CAST_ENV, None)
    return rows


def _gbs(nbytes: int, since: float) -> str:
    return f"{nbytes / (time.perf_counter() - since) / 1e9:.2f} GB/s"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("src", help="prefix of a float32 checkpoint (e.g. the benchmark's input)")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--no-fsync", action="store_true")
    ap.add_argument("--floors", action="store_true")
    ap.add_argument("--out", help="directory for the output (default: a temporary one)")
    ap.add_argument("--cast-mib", type=int, default=256)
    args = ap.parse_args(argv)
    work = args.out or tempfile.mkdtemp(prefix="tfckpt-breakdown-")
    os.makedirs(work, exist_ok=True)
    try:
        rows = convert_breakdown(
            args.src, os.path.join(work, "out", "model"), args.dtype, not args.no_fsync
        )
        if args.floors:
            rows.append(("floors on this machine", None, ""))
            rows += floors(args.src, work, args.dtype, args.cast_mib)
    finally:
        if not args.out:
            shutil.rmtree(work, ignore_errors=True)
    print("| phase | seconds | |")
    print("|---|---:|---|")
    for name, seconds, note in rows:
        print(f"| {name} | {'' if seconds is None else f'{seconds:.3f}'} | {note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
