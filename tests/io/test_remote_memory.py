"""What an S3 transfer holds in memory (tfckpt.io.remote), measured in a process of its own.

tracemalloc counts every byte the interpreter, numpy and the client libraries allocate,
so the peak of a transfer, less what was allocated before it, is what the transfer
itself held at its worst: no clock is involved. An upload holds its part buffers and no
copy of them on the way to the socket; a read lands in the caller's buffer and holds
no whole range besides.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("fsspec")
pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from s3_helpers import proxy, s3, s3_server  # noqa: E402,F401  (fixtures)

from tfckpt.io import remote  # noqa: E402

MiB = 1 << 20
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = """
import json, sys, tracemalloc
import numpy as np
from tfckpt.io import remote
from tfckpt.io.storage import storage_for

url, parts = sys.argv[1], int(sys.argv[2])  # parts: of the object uploaded
MiB = 1 << 20
store = storage_for(url, None)
store.write_bytes(f"{url}/warm", b"x")  # the client made and its models loaded first
block = np.random.default_rng(0).bytes(3 * MiB)
view = bytearray(parts * remote.PART_BYTES + 5)
tracemalloc.start()

def held(fn):
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    fn()
    return tracemalloc.get_traced_memory()[1] - base

def upload():
    w = store.open_writer(f"{url}/up.bin")
    left = len(view)
    while left:
        k = min(left, len(block))
        w.write(block[:k])
        left -= k
    w.close()

def read():
    r = store.open_reader(f"{url}/up.bin")
    assert r.readinto(memoryview(view), 0) == len(view)

def convert(dst, chunk_bytes):
    import tfckpt

    tfckpt.convert(f"{url}/src/model", f"{url}/{dst}/", "float16", chunk_bytes=chunk_bytes)

if sys.argv[3] == "transfers":
    print(json.dumps({"upload": held(upload), "read": held(read)}))
else:  # a first run imports what a run needs and warms the client's caches
    chunk_bytes = int(sys.argv[3])
    convert("warm", chunk_bytes)
    print(json.dumps({"convert": held(lambda: convert("out", chunk_bytes))}))
"""


def held(url: str, *args) -> dict[str, int]:
    """The child's peaks, in bytes over what it held before each transfer."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, url, *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_upload_holds_its_parts_and_a_read_its_buffer_only(s3):
    """8 parts of 5 MiB go up, 3 at a time: the upload holds at most 4 part buffers
    (20 MiB) and a few small pieces, never a copy of a part (there were three copies
    of each part in flight when parts went to the client as bytes: 37 MiB held). Reading
    the object back into a buffer holds a few pieces of the responses, no whole range."""
    parts = 8
    got = held(s3.url, parts, "transfers")
    assert got["upload"] <= (remote.PARTS_IN_FLIGHT + 1) * remote.PART_BYTES + 5 * MiB
    assert got["read"] <= 4 * MiB
    assert s3.direct.size(f"{s3.url}/up.bin"[len("s3://") :]) == parts * remote.PART_BYTES + 5


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A 24 MiB float32 tensor and a small one, written by TensorFlow's SaveV2."""
    pytest.importorskip("tensorflow")
    import transform_helpers as th

    rng = np.random.default_rng(4)
    values = {
        "big/kernel": (rng.standard_normal((6 * 1024, 1024)) * 0.05).astype(np.float32),
        "small/bias": rng.standard_normal(100).astype(np.float32),
    }
    return th.save_v2(tmp_path_factory.mktemp("memory") / "model", values), values


def test_convert_s3_to_s3_holds_the_budget_and_the_parts(s3, source, tmp_path):
    """S3 -> S3 at an 8 MiB chunk budget: the run holds no more than its budget (the
    buffer rings) and the output's part buffers, besides a few small pieces (17 MiB
    held; 31 MiB when parts were copied on their way out and rings made every buffer
    they may need up front). TensorFlow reads the output as the float16 of every value."""
    import tensorflow as tf

    prefix, values = source
    s3.put(prefix, "src")
    chunk_bytes = 8 * MiB
    got = held(s3.url, 0, chunk_bytes)
    # The 12 MiB output is 3 parts, all of which may be under way at once.
    parts = min(-(-12 * MiB // remote.PART_BYTES), remote.PARTS_IN_FLIGHT + 1)
    assert got["convert"] <= chunk_bytes + parts * remote.PART_BYTES + 4 * MiB
    for rel, data in s3.files("out").items():
        (tmp_path / rel).write_bytes(data)
    reader = tf.train.load_checkpoint(str(tmp_path / "model"))
    for name, want in values.items():
        assert reader.get_tensor(name).tobytes() == want.astype(np.float16).tobytes(), name
