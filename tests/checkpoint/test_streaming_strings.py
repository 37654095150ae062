"""String tensors stream in bounded memory; sources truncated under a run never crash it.

String tensors TensorFlow wrote go through ``select``/``convert`` with a small
``--chunk-bytes``: the process's peak RSS (from the OS) stays far below the
tensors' size, and the output is byte-identical to what TensorFlow wrote. A
source shard truncated while a run reads it ends the run with a clean error,
never SIGBUS; arrays read with ``mmap=False`` outlive a truncation.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from cli_helpers import assert_cli_error

import tfckpt

CHUNK = "1M"
MANY = 1 << 20  # elements of "many": 0 to 127 bytes each, about 64 MiB in all
BIG = 48 << 20  # one element of "big", far larger than a chunk


def _strings(rng, n: int, max_len: int) -> np.ndarray:
    lengths = rng.integers(0, max_len + 1, n)
    blob = rng.bytes(int(lengths.sum()))
    ends = np.cumsum(lengths).tolist()
    starts = [0] + ends[:-1]
    return np.array([blob[a:b] for a, b in zip(starts, ends)], dtype=object)


def _save_v2(prefix: str, tensors: dict) -> None:
    tf = pytest.importorskip("tensorflow")
    names = list(tensors)
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[tf.constant(tensors[n]) for n in names],
    )


@pytest.fixture(scope="module")
def strings_ckpt(tmp_path_factory):
    """Written by TensorFlow: a tensor of many strings, one with a huge element, and a float."""
    pytest.importorskip("tensorflow")
    rng = np.random.default_rng(7)
    d = tmp_path_factory.mktemp("strings")
    values = {
        "many": _strings(rng, MANY, 127).reshape(1024, -1),
        "big": np.array([b"", rng.bytes(BIG), b"\x00tail", b"x" * 200], dtype=object),
        "kernel": rng.standard_normal((64, 64)).astype(np.float32),
    }
    _save_v2(str(d / "model"), values)
    small = {
        "many": values["many"][:2, :8],
        "big": values["big"][[0, 2]],
        "kernel": values["kernel"],
    }
    _save_v2(str(d / "small"), small)
    return str(d / "model"), str(d / "small"), values


# Runs a command and prints its peak RSS (KiB) and exit status, both from wait4(), from a small
# intermediate process: Linux carries the parent's high-water mark into a child's ru_maxrss
# across fork + exec, so a direct child of this process (TensorFlow loaded) would report ours.
PEAK_RSS = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
print(usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


def _peak_mib(*args) -> float:
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, sys.executable, "-m", "tfckpt", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    peak_kib, rc = map(int, proc.stdout.split())
    assert rc == 0, proc.stderr
    return peak_kib / 1024


def test_string_tensors_stream_in_bounded_memory(strings_ckpt, tmp_path):
    tf = pytest.importorskip("tensorflow")
    src, small, values = strings_ckpt
    out = tmp_path / "out" / "model"
    baseline = _peak_mib("select", small, tmp_path / "base" / "model", "--chunk-bytes", CHUNK)
    peak = _peak_mib("select", src, out, "--chunk-bytes", CHUNK)
    string_mib = os.path.getsize(f"{src}.data-00000-of-00001") >> 20
    assert string_mib > 100
    assert peak < baseline + 24, (
        f"peak RSS {peak:.0f} MiB for {string_mib} MiB of strings (baseline {baseline:.0f} MiB)"
    )
    # The same bytes TensorFlow wrote, and TensorFlow reads them back.
    with (
        open(f"{src}.data-00000-of-00001", "rb") as a,
        open(f"{out}.data-00000-of-00001", "rb") as b,
    ):
        assert a.read() == b.read()
    reader = tf.train.load_checkpoint(str(out))
    for name, value in values.items():
        got = reader.get_tensor(name)
        assert got.shape == value.shape and (got == value).all(), name

    # Cast and strings together, from a big-endian copy (strings framed anew).
    be = str(tmp_path / "be" / "model")
    with tfckpt.open(src) as ckpt:
        tfckpt.save({"big": ckpt["big"], "kernel": ckpt["kernel"]}, be, endianness="big")
    half = tmp_path / "half" / "model"
    peak = _peak_mib("convert", be, half, "--dtype", "float16", "--chunk-bytes", CHUNK)
    assert peak < baseline + 24, f"peak RSS {peak:.0f} MiB (baseline {baseline:.0f} MiB)"
    reader = tf.train.load_checkpoint(str(half))
    assert (reader.get_tensor("big") == values["big"]).all()
    assert (
        reader.get_tensor("kernel").tobytes()
        == tf.cast(values["kernel"], tf.float16).numpy().tobytes()
    )


def test_string_stream_matches_tensorflow_bytes(strings_ckpt, tmp_path):
    """Lengths and bytes cut at awkward places (inside varints, inside elements) give TF's bytes."""
    src, small, values = strings_ckpt
    out = str(tmp_path / "model")
    with tfckpt.open(small) as ckpt, tfckpt.BundleWriter(out) as w:
        for name in sorted(ckpt.keys(), key=lambda n: ckpt.info(n).offset):  # TF's order
            if ckpt.info(name).dtype != "string":
                w.add(name, ckpt[name])
                continue
            with w.stream(name, "string", ckpt.info(name).shape) as s:
                for kind, part, _ in ckpt.iter_string_parts(name, chunk_bytes=3):
                    (s.write_lengths if kind == "lengths" else s.write_data)(part)
    with (
        open(f"{small}.data-00000-of-00001", "rb") as a,
        open(f"{out}.data-00000-of-00001", "rb") as b,
    ):
        assert a.read() == b.read()


# Truncates the first source shard to TRUNCATE_TO bytes as the run reaches the tensor named
# TRUNCATE_AT (after its size was checked against the file), then runs the command line.
TRUNCATE_DURING_RUN = """
import importlib, os, sys
bundle = importlib.import_module("tfckpt.checkpoint.reader")
real_check = bundle.Checkpoint._check_extent
def check_extent(self, entry):
    reader = real_check(self, entry)
    if entry.name == os.environ["TRUNCATE_AT"]:
        os.truncate(self.data_files[0], int(os.environ["TRUNCATE_TO"]))
    return reader
bundle.Checkpoint._check_extent = check_extent
from tfckpt.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", [["select"], ["convert", "--dtype", "bfloat16"]])
def test_source_truncated_during_a_run_is_a_clean_error(strings_ckpt, tmp_path, command):
    src, small, values = strings_ckpt
    tf = pytest.importorskip("tensorflow")
    # Two string tensors: the first is read whole before the shard is cut inside the second.
    copy = str(tmp_path / "src" / "model")
    _save_v2(
        copy,
        {
            "a_words": values["many"][:64].reshape(-1),
            "b_words": values["many"][64:256].reshape(-1),
            "kernel": values["kernel"],
        },
    )
    del tf
    with tfckpt.open(copy) as ckpt:
        at = ckpt.info("b_words")
        first = min(ckpt.info(n).offset for n in ckpt.keys())
    assert at.offset > first
    dst = tmp_path / "out" / "model"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            TRUNCATE_DURING_RUN,
            command[0],
            copy,
            str(dst),
            *command[1:],
            "--chunk-bytes",
            CHUNK,
        ],
        env=dict(os.environ, TRUNCATE_AT="b_words", TRUNCATE_TO=str(at.offset + 4096)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != -signal.SIGBUS, "killed by SIGBUS"
    assert_cli_error(proc, "b_words", "data-00000-of-00001")
    assert not os.path.exists(f"{dst}.index")
    assert not dst.parent.exists() or os.listdir(dst.parent) == []


def test_arrays_read_without_mmap_survive_truncation(strings_ckpt, tmp_path):
    src, small, values = strings_ckpt
    copy = str(tmp_path / "model")
    _save_v2(copy, {"kernel": values["kernel"], "other": values["kernel"] * 2})
    with tfckpt.open(copy, mmap=False) as ckpt:
        kernel = ckpt["kernel"]
        os.truncate(ckpt.data_files[0], 0)
        assert kernel.tobytes() == values["kernel"].tobytes()  # its own memory
        with pytest.raises(tfckpt.CorruptCheckpointError, match="other"):
            ckpt["other"]


# With the default mapping, an array read before the truncation would die when touched (the
# documented caveat); a read after it must be an error, not SIGBUS. In a child: SIGBUS kills.
MAPPED_READ_AFTER_TRUNCATION = """
import os, sys, tfckpt
with tfckpt.open(sys.argv[1]) as ckpt:
    ckpt["kernel"]  # maps the shard
    os.truncate(ckpt.data_files[0], 4096)
    try:
        ckpt["other"]
    except tfckpt.CorruptCheckpointError as e:
        print(e)
"""


def test_mapped_read_after_truncation_is_an_error(strings_ckpt, tmp_path):
    src, small, values = strings_ckpt
    copy = str(tmp_path / "model")
    rng = np.random.default_rng(3)
    _save_v2(
        copy, {"kernel": values["kernel"], "other": rng.standard_normal(1 << 18).astype(np.float32)}
    )
    proc = subprocess.run(
        [sys.executable, "-c", MAPPED_READ_AFTER_TRUNCATION, copy],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"exit status {proc.returncode}: {proc.stderr}"
    assert "other" in proc.stdout


def test_iter_chunks_yields_string_elements_a_chunk_at_a_time(strings_ckpt):
    tf = pytest.importorskip("tensorflow")
    src, small, values = strings_ckpt
    reader = tf.train.load_checkpoint(src)
    chunk = 1 << 20
    with tfckpt.open(src) as ckpt:
        for name in ("many", "big"):
            want = reader.get_tensor(name).reshape(-1)
            chunks = list(ckpt.iter_chunks(name, chunk))
            assert all(c.dtype == object and c.ndim == 1 for c in chunks)
            assert (np.concatenate(chunks) == want).all(), name
            for c in chunks:
                sizes = [len(x) for x in c]
                assert (
                    sum(sizes) <= 2 * chunk or len(c) == 1 or sum(sizes) - max(sizes) <= 2 * chunk
                ), (name, len(c), sum(sizes))
            if name == "many":
                assert len(chunks) > 32
