"""Object storage at network speed: ``convert`` S3 -> S3 against a plain download + upload.

    python benchmarks/s3_throughput.py [--repeat 3] [--concurrency 10] [--out benchmarks/out]
                                       [--big-mib 512 --medium 64 --medium-mib 8]

An S3-compatible server (moto's, the one the tests use) runs on 127.0.0.1 in a process of
its own; the 1 GiB float32 input of ``benchmarks/run.py`` (written by TensorFlow) is
uploaded to it once. Then, in turn and ``--repeat`` times, each in a fresh process
measured from the outside (wall time, peak RSS via wait4):

- ``tfckpt convert s3://.../src/model s3://.../out/model --dtype float16``;
- ``fsspec get + put``: the same client (s3fs) downloads the source objects to a local
  directory and uploads them again (``fs.get``/``fs.put`` with their batch size and
  s3fs's ``max_concurrency`` parts in flight per object): what a user would do around a
  local conversion, minus the conversion;
- the server alone: the data object read with ``--concurrency`` range GETs in flight
  (bodies dropped), and as many bytes uploaded as multipart parts with as many in flight.

Throughput is source bytes / whole-process wall time; the ratio is taken in each round
(contenders of a round run back to back) and its median reported. Both clients use
the same ``max_concurrency``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import run as harness  # noqa: E402  (benchmarks/run.py: inputs and measuring)

BUCKET = "tfckpt-bench"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "NO_PROXY": "127.0.0.1,localhost",
}
_SERVER = """
import sys, logging
logging.disable(logging.CRITICAL)
from moto.server import ThreadedMotoServer
s = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
s.start()
print(s.get_host_and_port()[1], flush=True)
sys.stdin.read()
s.stop()
"""


def start_server(server: str, work: str) -> tuple[subprocess.Popen, str]:
    """The S3 server in a process of its own; (process, endpoint URL). ``server``:
    ``moto`` (its threaded server, objects in memory), or the path of an ``s3rver``
    executable (npm's s3rver: Node.js, objects in files under ``work``)."""
    if server == "moto":
        proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        port = int(proc.stdout.readline())
    else:
        root = os.path.join(work, "s3rver")
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        proc = subprocess.Popen(
            [server, "-d", root, "-a", "127.0.0.1", "-p", "0", "--no-vhost-buckets"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            # its listing hashes with an algorithm OpenSSL 3 keeps as legacy
            env=dict(os.environ, NODE_OPTIONS="--openssl-legacy-provider"),
        )
        line = ""
        while "listening" not in line:
            line = proc.stdout.readline()
            if not line:
                sys.exit("s3rver did not start")
        port = int(line.rsplit(":", 1)[1])
        # Its request log, kept (a pipe nobody reads would stall it).
        threading.Thread(
            target=shutil.copyfileobj,
            args=(proc.stdout, open(os.path.join(work, "s3rver.log"), "w")),
            daemon=True,
        ).start()
    return proc, f"http://127.0.0.1:{port}"


def _fs(concurrency: int):
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True, max_concurrency=concurrency)


# ---------------------------------------------------------------- contenders (own process)


def role_getput(src: str, dst: str, work: str, concurrency: str) -> None:
    """Download the objects under ``src`` to ``work``, upload them under ``dst``."""
    fs = _fs(int(concurrency))
    t = time.perf_counter()
    local = os.path.join(work, "getput")
    shutil.rmtree(local, ignore_errors=True)
    os.makedirs(local)
    names = fs.ls(src, detail=False)
    fs.get(names, local + "/")
    fs.put([os.path.join(local, os.path.basename(n)) for n in names], dst.rstrip("/") + "/")
    seconds = time.perf_counter() - t
    shutil.rmtree(local, ignore_errors=True)
    print(json.dumps({"seconds": seconds, "bytes": 0}))


async def _get_range(fs, bucket: str, key: str, start: int, end: int) -> int:
    resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
    try:
        return len(await resp["Body"].read())
    finally:
        resp["Body"].close()


def _bounded(n: int, coros) -> list:
    """Run ``coros`` (coroutine functions) with ``n`` at most in flight; their results."""
    import asyncio

    async def run():
        sem = asyncio.Semaphore(n)

        async def one(c):
            async with sem:
                return await c()

        return await asyncio.gather(*(one(c) for c in coros))

    return run


def role_server_get(data: str, concurrency: str, part_mib: str = "8") -> None:
    """The server's GET throughput: range GETs of ``data``, ``concurrency`` in flight,
    bodies dropped."""
    from fsspec.asyn import sync

    fs = _fs(int(concurrency))
    size, part = fs.size(data), int(part_mib) << 20
    bucket, key = data.split("/", 1)
    coros = [
        (lambda s=s: _get_range(fs, bucket, key, s, min(s + part, size)))
        for s in range(0, size, part)
    ]
    t = time.perf_counter()
    got = sum(sync(fs.loop, _bounded(int(concurrency), coros)))
    seconds = time.perf_counter() - t
    if got != size:
        sys.exit(f"read {got} of {size} bytes")
    print(json.dumps({"seconds": seconds, "bytes": size, "throughput": size / seconds}))


def role_server_put(scratch: str, nbytes: str, concurrency: str, part_mib: str = "8") -> None:
    """The server's PUT throughput: ``nbytes`` as multipart parts, ``concurrency`` in
    flight (the upload left unfinished)."""
    from fsspec.asyn import sync

    fs = _fs(int(concurrency))
    size, part = int(nbytes), int(part_mib) << 20
    bucket, key = scratch.split("/", 1)
    body = os.urandom(part)
    mpu = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)

    def upload(i: int):
        return fs._call_s3(
            "upload_part",
            Bucket=bucket,
            Key=key,
            PartNumber=i + 1,
            UploadId=mpu["UploadId"],
            Body=body,
        )

    coros = [(lambda i=i: upload(i)) for i in range(-(-size // part))]
    t = time.perf_counter()
    sync(fs.loop, _bounded(int(concurrency), coros))
    seconds = time.perf_counter() - t
    # Left unfinished: the parts were the measure (s3rver can neither abort an upload nor
    # complete a large one within a client's timeout; the server's folder goes at the end).
    print(json.dumps({"seconds": seconds, "bytes": size, "throughput": size / seconds}))


ROLES = {"getput": role_getput, "server_get": role_server_get, "server_put": role_server_put}


# ---------------------------------------------------------------- the harness


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--role":
        ROLES[argv[1]](*argv[2:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=10, help="s3fs max_concurrency")
    p.add_argument("--out", default=os.path.join(HERE, "out"))
    p.add_argument("--big-mib", type=int, default=harness.SIZES["big_mib"])
    p.add_argument("--medium", type=int, default=harness.SIZES["medium"])
    p.add_argument("--medium-mib", type=int, default=harness.SIZES["medium_mib"])
    p.add_argument("--dtype", default="float16")
    p.add_argument(
        "--server", default="moto", help="moto, or the path of an s3rver executable (npm)"
    )
    p.add_argument("--convert-flag", action="append", default=[], help="passed to convert")
    a = p.parse_args(argv)
    sizes = dict(harness.SIZES, big_mib=a.big_mib, medium=a.medium, medium_mib=a.medium_mib)
    os.makedirs(a.out, exist_ok=True)
    prefix = harness.Inputs(os.path.join(a.out, "inputs"), sizes).path("big")
    files = [
        os.path.join(os.path.dirname(prefix), f)
        for f in os.listdir(os.path.dirname(prefix))
        if f.startswith(os.path.basename(prefix) + ".")
    ]
    nbytes = sum(os.path.getsize(f) for f in files)
    server, endpoint = start_server(a.server, a.out)
    os.environ.update(CREDENTIALS, FSSPEC_S3_ENDPOINT_URL=endpoint)
    if a.server != "moto":  # s3rver's one account
        os.environ.update(AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER")
    os.environ["FSSPEC_S3_MAX_CONCURRENCY"] = str(a.concurrency)
    try:
        import fsspec

        fsspec.config.conf.setdefault("s3", {}).update(
            endpoint_url=endpoint, max_concurrency=a.concurrency
        )
        fs = _fs(a.concurrency)
        fs.mkdir(BUCKET)
        fs.put(files, f"{BUCKET}/src/")
        data = next(f"{BUCKET}/src/{os.path.basename(f)}" for f in files if ".data-" in f)
        work = tempfile.mkdtemp(dir=a.out)
        conc = str(a.concurrency)
        rounds: list[dict] = []
        me = [sys.executable, __file__, "--role"]
        contenders = {
            "tfckpt convert": [
                sys.executable,
                os.path.join(HERE, "contenders.py"),
                "tfckpt_convert",
                f"s3://{BUCKET}/src/model",
                f"s3://{BUCKET}/out/model",
                a.dtype,
                *a.convert_flag,
            ],
            "fsspec get + put": [*me, "getput", f"{BUCKET}/src", f"{BUCKET}/copy", work, conc],
            "server alone: GET": [*me, "server_get", data, conc],
            "server alone: PUT": [*me, "server_put", f"{BUCKET}/scratch", str(nbytes), conc],
        }
        for _ in range(a.repeat):
            r = {}
            for name, args in contenders.items():
                for left in (f"{BUCKET}/out", f"{BUCKET}/copy"):
                    fs.invalidate_cache()
                    for f in fs.find(left):  # one by one: s3rver's batch delete races
                        fs.rm_file(f)
                r[name] = harness.measure(args)
            rounds.append(r)
            print(
                json.dumps(
                    {k: {kk: round(v[kk], 2) for kk in ("wall", "rss")} for k, v in r.items()}
                ),
                flush=True,
            )
        shutil.rmtree(work, ignore_errors=True)
    finally:
        server.stdin.close()
        if a.server != "moto":
            server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(os.path.join(a.out, "s3rver"), ignore_errors=True)
    report = summary(rounds, nbytes, a)
    print(report)
    with open(os.path.join(a.out, "s3_throughput.md"), "w") as f:
        f.write(report + "\n")
    return 0


def summary(rounds: list[dict], nbytes: int, a) -> str:
    """The table: medians over the rounds, ratios taken within each round."""

    def med(name, key):
        return statistics.median(r[name][key] for r in rounds)

    gb = nbytes / 1e9
    lines = [
        f"{nbytes / 2**20:.0f} MiB float32 source, S3 ({os.path.basename(a.server)}) on "
        "127.0.0.1, "
        f"max_concurrency {a.concurrency}, {a.repeat} rounds (medians)",
        "",
        "| contender | wall | source GB/s | peak RSS |",
        "|---|---|---|---|",
    ]
    for name in rounds[0]:
        lines.append(
            f"| {name} | {med(name, 'wall'):.2f} s | {gb / med(name, 'wall'):.3f} | "
            f"{med(name, 'rss') / 2**20:.0f} MiB |"
        )
    ratio = statistics.median(
        r["fsspec get + put"]["wall"] / r["tfckpt convert"]["wall"] for r in rounds
    )
    lines += [
        "",
        f"- convert's throughput / get + put's (ratio in each round, median): {ratio:.2f}×",
        "- the server alone (in-process GB/s of the bytes moved): "
        f"GET {_rate(rounds, 'server alone: GET')}, PUT {_rate(rounds, 'server alone: PUT')}",
    ]
    return "\n".join(lines)


def _rate(rounds: list[dict], name: str) -> str:
    return f"{statistics.median(r[name]['throughput'] for r in rounds) / 1e9:.3f} GB/s"


if __name__ == "__main__":
    sys.exit(main())
