"""Several requests of one object in flight (tfckpt.io.remote), on the S3 server of s3_helpers.

Concurrency is proven without clocks: a rule of the fault proxy holds requests at a
barrier that only as many requests at once can pass, so a reader or writer that sent
them one at a time would fail. Failures must still end in one ``CheckpointError`` naming
the object, and an upload that fails stores nothing.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
fsspec = pytest.importorskip("fsspec")
pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

import transform_helpers as th  # noqa: E402
from s3_helpers import on, proxy, s3, s3_server  # noqa: E402,F401  (fixtures)

import tfckpt  # noqa: E402
from tfckpt.io import remote  # noqa: E402
from tfckpt.io.storage import storage_for  # noqa: E402

MiB = 1 << 20


def held_together(parties: int, method: str, match: str):
    """A proxy rule that holds the first ``parties`` matching requests until all of them
    have arrived (60 s at most, a hang detector: then they fail with a 500 and so does the
    test)."""
    barrier = threading.Barrier(parties, timeout=60)
    seen = [0]
    lock = threading.Lock()

    def rule(m, path, headers):
        if m != method or match not in path:
            return None
        with lock:
            seen[0] += 1
            mine = seen[0]
        if mine > parties:
            return None
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return 500
        return None

    return rule


def upload(s3, name: str, data: bytes, piece: int = 3 * MiB) -> str:
    url = f"{s3.url}/{name}"
    store = storage_for(url, None)
    w = store.open_writer(url)
    assert isinstance(w, remote.MultipartUpload)
    for i in range(0, len(data), piece):
        w.write(data[i : i + piece])
    w.close()
    return url


def key(url: str) -> str:
    return url[len("s3://") :]


def test_parts_upload_while_the_writer_goes_on(s3):
    """3 full parts and a last one: the full ones are in flight together before the
    writer closes; the object appears only at the completion."""
    data = np.random.default_rng(0).bytes(3 * remote.PART_BYTES + 2 * MiB + 7)
    s3.proxy.rules.append(held_together(remote.PARTS_IN_FLIGHT, "PUT", "partNumber="))
    url = f"{s3.url}/big.bin"
    w = storage_for(url, None).open_writer(url)
    for i in range(0, len(data), 3 * MiB):
        w.write(data[i : i + 3 * MiB])
    assert not s3.direct.exists(key(url))
    w.close()
    assert s3.direct.cat_file(key(url)) == data
    parts = [p for m, p, _ in s3.proxy.log if m == "PUT" and "partNumber=" in p]
    assert len(parts) == 4
    assert [m for m, p, _ in s3.proxy.log if "uploadId=" in p and m == "POST"] == ["POST"]


def test_small_object_is_one_put(s3):
    url = upload(s3, "small.bin", b"x" * 1000)
    assert s3.direct.cat_file(key(url)) == b"x" * 1000
    assert [(m, a) for m, _, a in s3.proxy.log] == [("PUT", None)]


def test_failed_part_aborts_the_upload_and_stores_nothing(s3):
    data = np.random.default_rng(1).bytes(2 * remote.PART_BYTES + MiB)
    # Part 2 fails each time: tried twice (TFCKPT_REMOTE_RETRIES=1), then the upload fails.
    s3.proxy.rules.append(lambda m, p, h: 500 if m == "PUT" and "partNumber=2" in p else None)
    with pytest.raises(tfckpt.CheckpointError, match="part 2") as e:
        upload(s3, "failed.bin", data)
    assert e.value.path == f"{s3.url}/failed.bin"
    assert not s3.direct.exists(f"{key(s3.url)}/failed.bin")
    assert [m for m, p, _ in s3.proxy.log if "uploadId=" in p and m == "DELETE"] == ["DELETE"]
    bucket, prefix = key(s3.url).split("/", 1)
    pending = s3.direct.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix)
    assert not pending.get("Uploads")


def test_failed_part_is_retried(s3):
    data = np.random.default_rng(2).bytes(2 * remote.PART_BYTES + MiB)
    once = on("PUT", "", 503, times=1)
    s3.proxy.rules.append(lambda m, p, h: once(m, p, h) if "partNumber=2" in p else None)
    url = upload(s3, "retried.bin", data)
    assert s3.direct.cat_file(key(url)) == data
    assert [a for m, p, a in s3.proxy.log if "partNumber=2" in p] == [503, None]


def test_one_read_is_several_ranges_in_flight(s3):
    data = np.random.default_rng(3).bytes(4 * remote.MIN_PART + 5)  # read: 3 ranges
    s3.direct.pipe_file(f"{key(s3.url)}/obj", data)
    s3.proxy.rules.append(held_together(3, "GET", "/obj"))
    reader = storage_for(f"{s3.url}/obj", None).open_reader(f"{s3.url}/obj")
    assert isinstance(reader, remote.ConcurrentReader)
    buf = bytearray(len(data) - 10)
    assert reader.readinto(memoryview(buf), 10) == len(buf)
    assert bytes(buf) == data[10:]
    gets = [p for m, p, _ in s3.proxy.log if m == "GET"]
    assert len(gets) == 3  # each byte fetched once, in three ranges
    # A server that ignores Range: caught on every range, as for one.
    s3.proxy.rules[:] = [lambda m, p, h: "ignore_range" if m == "GET" else None]
    with pytest.raises(tfckpt.CheckpointError, match="instead of") as e:
        reader.readinto(memoryview(buf), 0)
    assert e.value.path == f"{s3.url}/obj"


def test_split_covers_the_range_once():
    assert remote.split(5, 10, 4) == [(5, 15)]  # under MIN_PART: one range
    ranges = remote.split(3, 5 * remote.MIN_PART + 1, 3)
    assert len(ranges) == 3 and ranges[0][0] == 3 and ranges[-1][1] == 3 + 5 * remote.MIN_PART + 1
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A 24 MiB float32 tensor and two small ones, written by TensorFlow's SaveV2."""
    rng = np.random.default_rng(4)
    values = {
        "big/kernel": (rng.standard_normal((6 * 1024, 1024)) * 0.05).astype(np.float32),
        "small/bias": rng.standard_normal(100).astype(np.float32),
        "step": np.int64(7),
    }
    d = tmp_path_factory.mktemp("concurrency")
    return SimpleNamespace(prefix=th.save_v2(d / "model", values), values=values)


def test_convert_s3_to_s3_in_parts_restored_by_tensorflow(s3, big, tmp_path):
    """The 12 MiB float16 output goes up in parts, the source comes in ranges; TensorFlow
    reads the result as the float16 of every float32 value."""
    src = s3.put(big.prefix, "src")
    tfckpt.convert(src, f"{s3.url}/out/", "float16")
    parts = [p for m, p, _ in s3.proxy.log if m == "PUT" and "partNumber=" in p]
    assert len(parts) == 3  # 12 MiB in parts of 5 MiB
    files = s3.files("out")
    for rel, data in files.items():
        (tmp_path / rel).write_bytes(data)
    reader = tf.train.load_checkpoint(str(tmp_path / "model"))
    for name, want in big.values.items():
        got = reader.get_tensor(name)
        want = np.asarray(want)
        want = want.astype(np.float16) if want.dtype.kind == "f" else want
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name


def test_parts_grow_so_that_ten_thousand_hold_a_large_object(s3, monkeypatch):
    """S3 takes 10 000 parts at most: every GROW_EVERY parts, they grow by a part."""
    assert remote.part_bytes(0) == remote.part_bytes(999) == remote.PART_BYTES
    assert remote.part_bytes(1000) == 2 * remote.PART_BYTES
    assert sum(remote.part_bytes(i) for i in range(10_000)) > 250 << 30
    monkeypatch.setattr(remote, "GROW_EVERY", 2)  # 5, 5, 10 MiB parts, then the rest
    data = np.random.default_rng(5).bytes(4 * remote.PART_BYTES + 3)
    url = upload(s3, "grown.bin", data)
    assert s3.direct.cat_file(key(url)) == data
    assert len([p for m, p, _ in s3.proxy.log if m == "PUT" and "partNumber=" in p]) == 4
