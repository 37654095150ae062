"""Reading a checkpoint inside an archive against extracting it first.

    python benchmarks/archive_read.py [--big-mib 192] [--medium 8] [--medium-mib 8]
                                      [--repeat 3] [--kinds tar tar.gz zip zip-deflated]
                                      [--out benchmarks/out]

The input is run.py's (written by TensorFlow, reused when present), by default 256 MiB
of float32: one 192 MiB tensor and 8 of 8 MiB. It is packed once per kind (reused
while the input stays the same): a tar, a tar.gz (gzip level 6, as ``tar czf``), a zip
of stored members and a deflated zip (as ``zip``). For each kind, each command, in
turn, ``--repeat`` times (medians):

- ``tfckpt dump ARCHIVE`` and ``tfckpt convert ARCHIVE OUT/ --dtype float16
  --no-fsync``, reading the archive in place;
- the same after extracting first: ``tar xf`` / ``unzip`` into a directory, then the
  command on the extracted files (times added, peaks the larger of the two);
- the command on files already extracted, for reference.

Wall time is of the whole process; peak RSS is the process's own high-water mark
(``VmHWM``, read by the process itself as it exits: ``ru_maxrss`` from wait4 would
count this process's memory too), for ``tar`` and ``unzip`` from GNU time where it
exists (else wait4, an upper bound). Every run's pages are synced first, and outputs
and extracted files removed. Ratios are the archive's to extracting first's.
Convert outputs are checked byte for byte against the extracted files' conversion.
Results go to OUT/archive_read.json.
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
import tarfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import run  # noqa: E402
from run import SIZES, Inputs  # noqa: E402

KINDS = {"tar": "model.tar", "tar.gz": "model.tar.gz", "zip": "stored.zip"}
KINDS["zip-deflated"] = "deflated.zip"
# The command line run as its own process, reporting its VmHWM (KiB) to argv[1] on exit.
_MEASURED = """
import sys
from tfckpt.cli import main
try:
    rc = main(sys.argv[2:])
finally:
    with open("/proc/self/status") as status:
        peak = next(line for line in status if line.startswith("VmHWM:")).split()[1]
    with open(sys.argv[1], "w") as out:
        out.write(peak)
sys.exit(rc)
"""


def tfckpt_run(args: list[str], work: str) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of ``tfckpt ARGS`` as its own process."""
    report = os.path.join(work, "peak")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURED, report, *args], env=env, capture_output=True
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"tfckpt {' '.join(args)} failed:\n{proc.stderr.decode()[-2000:]}")
    with open(report) as f:
        peak = int(f.read()) * 1024
    os.unlink(report)
    return wall, peak


def tool_run(command: list[str], work: str) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of an extracting tool: from GNU time where there
    is one, else wait4's, which counts this process's own peak too (an upper bound)."""
    gnu_time = os.path.exists("/usr/bin/time")
    if gnu_time:
        command = ["/usr/bin/time", "-f", "%M", *command]
    errors = os.path.join(work, "stderr")
    start = time.perf_counter()
    with open(errors, "w+b") as err:
        p = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - start
        err.seek(0)
        text = err.read().decode()
    os.unlink(errors)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{text[-2000:]}")
    if gnu_time:
        return wall, int(text.strip().splitlines()[-1]) * 1024
    return wall, usage.ru_maxrss * 1024


def pack(src_dir: str, names: list[str], path: str, kind: str) -> None:
    if kind.startswith("zip"):
        method = zipfile.ZIP_STORED if kind == "zip" else zipfile.ZIP_DEFLATED
        with zipfile.ZipFile(path, "w", method, compresslevel=6) as z:
            for n in names:
                z.write(os.path.join(src_dir, n), n)
    else:
        mode = "w:gz" if kind == "tar.gz" else "w"
        kw = {"compresslevel": 6} if kind == "tar.gz" else {}
        with tarfile.open(path, mode, **kw) as t:
            for n in names:
                t.add(os.path.join(src_dir, n), n)


def archives(prefix: str, root: str, kinds: list[str]) -> dict[str, str]:
    """The input packed as each kind, reused while the input is the same."""
    src_dir, base = os.path.split(prefix)
    names = sorted(n for n in os.listdir(src_dir) if n.startswith(base + "."))
    stamp = {n: os.path.getmtime(os.path.join(src_dir, n)) for n in names}
    out = {}
    for kind in kinds:
        path = os.path.join(root, KINDS[kind])
        marker = path + ".json"
        if not (os.path.exists(marker) and json.load(open(marker)) == stamp):
            pack(src_dir, names, path, kind)
            with open(marker, "w") as f:
                json.dump(stamp, f)
        out[kind] = path
    return out


def extract(kind: str, archive: str, into: str) -> list[str]:
    if kind.startswith("zip"):
        return ["unzip", "-q", "-o", archive, "-d", into]
    return ["tar", "xf", archive, "-C", into]


def fresh(*paths: str) -> None:
    """Remove ``paths``, then start the next run as run.py does: no dirty pages left to
    flush, and freed memory touched again (this VM's guest hands freed pages back to
    the host, and the next process to touch them pays for it)."""
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)
    run._prefault(run.PREFAULT["bytes"])
    os.sync()


CONVERT = ["--dtype", "float16", "--no-fsync"]


class Work:
    """The three ways of running one command on one archive, each a measured run."""

    def __init__(self, kind: str, verb: str, archive: str, work: str, base: str, reference: str):
        self.kind, self.verb, self.archive, self.work = kind, verb, archive, work
        self.reference = reference
        self.extracted, self.converted = os.path.join(work, "x"), os.path.join(work, "c")
        self.prefix = os.path.join(self.extracted, base)
        self.tail = [self.converted + "/", *CONVERT] if verb == "convert" else []

    def in_archive(self) -> dict:
        fresh(self.converted)
        got = tfckpt_run([self.verb, self.archive, *self.tail], self.work)
        if self.verb == "convert":
            _check_same(self.converted, self.reference, f"{self.kind}: {self.verb}")
        return {"in the archive": got}

    def extract_first(self) -> dict:
        fresh(self.converted, self.extracted)
        os.makedirs(self.extracted)
        wall_x, peak_x = tool_run(extract(self.kind, self.archive, self.extracted), self.work)
        wall_c, peak_c = tfckpt_run([self.verb, self.prefix, *self.tail], self.work)
        return {
            "extract, then tfckpt": (wall_x + wall_c, max(peak_x, peak_c)),
            "extraction alone": (wall_x, peak_x),
        }

    def already(self) -> dict:
        if not os.path.exists(self.prefix + ".index"):
            os.makedirs(self.extracted, exist_ok=True)
            subprocess.run(extract(self.kind, self.archive, self.extracted), check=True)
        fresh(self.converted)
        return {"already extracted": tfckpt_run([self.verb, self.prefix, *self.tail], self.work)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big-mib", type=int, default=192)
    ap.add_argument("--medium", type=int, default=8)
    ap.add_argument("--medium-mib", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument(
        "--prefault-mib", type=int, default=1024, help="memory touched and freed before every run"
    )
    args = ap.parse_args(argv)
    run.PREFAULT["bytes"] = args.prefault_mib << 20
    import tfckpt

    # tfckpt's bytecode, as an install compiles it (as run.py does)
    compileall.compile_dir(os.path.dirname(tfckpt.__file__), quiet=1)
    sizes = dict(SIZES, big_mib=args.big_mib, medium=args.medium, medium_mib=args.medium_mib)
    prefix = Inputs(os.path.join(args.out, "inputs"), sizes).path("big")
    store = os.path.join(args.out, "archives")
    os.makedirs(store, exist_ok=True)
    packed = archives(prefix, store, args.kinds)
    work = os.path.join(args.out, "archive_work")
    fresh(work)
    os.makedirs(work)
    base = os.path.basename(prefix)
    rows: dict = {}
    reference = os.path.join(work, "reference")
    tfckpt_run(["convert", prefix, reference + "/", *CONVERT], work)
    for kind, archive in packed.items():
        with open(archive, "rb") as f:  # into the page cache, as the input already is
            while f.read(1 << 24):
                pass
        for verb in ("dump", "convert"):
            w = Work(kind, verb, archive, work, base, reference)
            times: dict[str, list[tuple[float, int]]] = {}
            contenders = [w.in_archive, w.extract_first, w.already]
            for i in range(args.repeat):  # in turn, each first once in every three runs
                for contender in contenders[i % 3 :] + contenders[: i % 3]:
                    for name, got in contender().items():
                        times.setdefault(name, []).append(got)
            fresh(w.converted, w.extracted)
            row = {
                name: {
                    "wall": statistics.median(w for w, _ in runs),
                    "peak_rss": statistics.median(p for _, p in runs),
                }
                for name, runs in times.items()
            }
            first = row["extract, then tfckpt"]
            row["ratio"] = {
                "wall": row["in the archive"]["wall"] / first["wall"],
                "peak_rss": row["in the archive"]["peak_rss"] / first["peak_rss"],
            }
            rows[f"{kind} {verb}"] = row
    fresh(work)
    total = args.big_mib + args.medium * args.medium_mib
    report = {
        "checkpoint_mib": total,
        "archive_bytes": {k: os.path.getsize(p) for k, p in packed.items()},
        "repeat": args.repeat,
        "rows": rows,
    }
    with open(os.path.join(args.out, "archive_read.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(_table(report))
    return 0


def _table(report: dict) -> str:
    mib = 1 << 20
    lines = [
        f"a {report['checkpoint_mib']} MiB checkpoint, medians of {report['repeat']}:",
        "",
        "| archive, command | in the archive | extract, then tfckpt | (extraction alone) "
        "| already extracted | wall ratio | peak ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in report["rows"].items():
        cells = [
            f"{row[k]['wall']:.2f} s, {row[k]['peak_rss'] / mib:.0f} MiB"
            for k in ("in the archive", "extract, then tfckpt", "extraction alone")
        ]
        cells.append(
            f"{row['already extracted']['wall']:.2f} s, "
            f"{row['already extracted']['peak_rss'] / mib:.0f} MiB"
        )
        lines.append(
            f"| {name} | {' | '.join(cells)} | {row['ratio']['wall']:.2f}x "
            f"| {row['ratio']['peak_rss']:.2f}x |"
        )
    return "\n".join(lines)


def _check_same(a: str, b: str, what: str) -> None:
    """Converting in the archive wrote what converting the extracted files writes."""
    names = sorted(os.listdir(a))
    if names != sorted(os.listdir(b)):
        raise SystemExit(f"{what}: different files: {names} / {sorted(os.listdir(b))}")
    for n in names:
        with open(os.path.join(a, n), "rb") as x, open(os.path.join(b, n), "rb") as y:
            while True:
                p, q = x.read(1 << 24), y.read(1 << 24)
                if p != q:
                    raise SystemExit(f"{what}: {n} differs from the extracted files' conversion")
                if not p:
                    break


if __name__ == "__main__":
    sys.exit(main())
