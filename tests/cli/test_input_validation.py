"""Bad input to the command line and the library: a one-line error naming what is wrong
(the file, the tensor, the flag), never a traceback, nothing left at the destination.

Checkpoints are written by TensorFlow; safetensors files by the ``safetensors`` package.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import transform_helpers as th  # noqa: E402  (conftest put tests/ on sys.path)
from cli_helpers import assert_cli_error, in_process, run_text  # noqa: E402

import tfckpt  # noqa: E402

# The moto server behind a fault-injecting proxy, and the checkpoint put there.
pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
from s3_helpers import proxy, s3, s3_server, sharded  # noqa: E402,F401


@pytest.fixture(scope="module")
def tf1(tmp_path_factory):
    d = tmp_path_factory.mktemp("validation_tf1")
    return th.save_v2(
        d / "model",
        {
            "dense/kernel": np.arange(6, dtype=np.float32).reshape(2, 3),
            "dense/bias": np.ones(3, np.float32),
            "names": np.array([b"a", b"b"]),
        },
    )


@pytest.fixture(scope="module")
def tf2(tmp_path_factory):
    """A TF2 object-based checkpoint (for flatten)."""
    v = tf.Variable(np.arange(4, dtype=np.float32))
    root = tf.train.Checkpoint(layer=tf.train.Checkpoint(kernel=v))
    return root.write(str(tmp_path_factory.mktemp("validation_tf2") / "ckpt"))


def nothing_in(directory) -> None:
    assert not directory.exists() or list(directory.iterdir()) == [], list(directory.iterdir())


# ---------------------------------------------------------------- --map-file


def test_deeply_nested_map_file_is_one_line_naming_it(tf1, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    out = tmp_path / "out"
    assert_cli_error(
        run_text("rename", tf1, out / "m", "--map-file", deep), str(deep), "nested too deeply"
    )
    nothing_in(out)


@pytest.mark.parametrize(
    "content, fragments",
    [
        ('["dense/bias", "b"]', ["--map-file", "JSON object", "not an array"]),
        ('"dense/bias"', ["--map-file", "JSON object", "not a string"]),
        ('{"dense/bias": 3}', ["--map-file", "'dense/bias'", "string, not a number"]),
        ('{"dense/bias": {"a": "b"}}', ["--map-file", "'dense/bias'", "not an object"]),
        ('{"dense/bias": null}', ["--map-file", "'dense/bias'", "not null"]),
    ],
)
def test_map_file_of_the_wrong_json_types(tf1, tmp_path, content, fragments):
    f = tmp_path / "map.json"
    f.write_text(content)
    assert_cli_error(
        in_process("rename", tf1, tmp_path / "out" / "m", "--map-file", f), str(f), *fragments
    )
    nothing_in(tmp_path / "out")


# ---------------------------------------------------------------- empty names


def test_rename_to_an_empty_name_is_refused_naming_the_tensor(tf1, tmp_path):
    out = tmp_path / "out"
    assert_cli_error(
        in_process("rename", tf1, out / "m", "--map", "dense/bias="),
        "tensor 'dense/bias'",
        "empty name",
    )
    f = tmp_path / "map.json"
    f.write_text(json.dumps({"dense/kernel": ""}))
    assert_cli_error(
        in_process("rename", tf1, out / "m", "--map-file", f), "tensor 'dense/kernel'", "empty name"
    )
    nothing_in(out)
    with pytest.raises(tfckpt.CheckpointError, match="empty name") as e:
        tfckpt.rename(tf1, out / "m", {"na(m)es": ""})
    assert e.value.tensor == "names"
    nothing_in(out)


def test_flatten_to_an_empty_name_is_refused_naming_the_tensor(tf2, tmp_path):
    out = tmp_path / "out"
    line = assert_cli_error(
        in_process("flatten", tf2, out / "m", "--map", "layer/kernel="), "empty name"
    )
    assert "tensor 'layer/kernel'" in line, line
    nothing_in(out)


def test_import_to_an_empty_name_is_refused_naming_the_tensor(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    src = tmp_path / "in.safetensors"
    safetensors_numpy.save_file(
        {"w": np.arange(4, dtype=np.float32), "b": np.zeros(2, np.float32)}, str(src)
    )
    out = tmp_path / "out"
    assert_cli_error(
        in_process("import", src, out / "m", "--map", "w="), "tensor 'w'", "empty name"
    )
    nothing_in(out)


# ---------------------------------------------------------------- numeric options


@pytest.mark.parametrize(
    "option, value",
    [
        ("chunk_bytes", 0),
        ("chunk_bytes", -1),
        ("chunk_bytes", 1.5),
        ("chunk_bytes", None),
        ("max_shard_bytes", 0),
        ("max_shard_bytes", -100),
        ("max_shard_bytes", True),
        ("tf_threshold", -1),
        ("tf_threshold", "64M"),
    ],
)
def test_numeric_options_out_of_range_are_refused_naming_them(tf1, tmp_path, option, value):
    with pytest.raises(tfckpt.CheckpointError, match=rf"^{option} must be a whole number"):
        tfckpt.Options(**{option: value})
    out = tmp_path / "out"
    with pytest.raises(tfckpt.CheckpointError, match=rf"^{option} must be"):
        tfckpt.convert(tf1, out / "m", "float16", **{option: value})
    nothing_in(out)


def test_numeric_options_in_range_are_taken():
    opts = tfckpt.Options(chunk_bytes=1, max_shard_bytes=np.int64(1), tf_threshold=0)
    assert (opts.chunk_bytes, opts.max_shard_bytes, opts.tf_threshold) == (1, 1, 0)


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--executor", "threads:0"], "--executor threads:0"),
        (["--executor", "processes:-2"], "--executor processes:-2"),
    ],
)
def test_executor_worker_count_below_one(tf1, tmp_path, flags, fragment):
    out = tmp_path / "out"
    assert_cli_error(in_process("convert", tf1, out / "m", *flags), fragment, "at least 1")
    nothing_in(out)


def test_size_too_large_for_a_float_is_not_a_size(tf1, tmp_path):
    rc, out, err = in_process("convert", tf1, tmp_path / "m", "--chunk-bytes", "9" * 400)
    assert rc == 2 and "Traceback" not in err and "--chunk-bytes: not a size" in err, err


# ---------------------------------------------------------------- --permute


def test_permute_errors_name_the_file_and_tensor(tf1, tmp_path):
    out = tmp_path / "o.safetensors"
    assert_cli_error(
        in_process("export", tf1, out, "--permute", "bias$=1,0"),
        f"{tf1}: tensor 'dense/bias'",
        "does not fit shape [3]",
    )
    with pytest.raises(tfckpt.CheckpointError, match="whole numbers"):
        tfckpt.export(tf1, out, permute=[("kernel$", "1,0")], skip_unsupported=True)
    assert not out.exists()


def test_permute_of_an_imported_tensor_names_the_file(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    src = tmp_path / "in.safetensors"
    safetensors_numpy.save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(src))
    assert_cli_error(
        in_process("import", src, tmp_path / "out" / "m", "--permute", "w=2,0,1"),
        f"{src}: tensor 'w'",
        "does not fit shape [2, 3]",
    )
    nothing_in(tmp_path / "out")


# ---------------------------------------------------------------- average --weights


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("validation_average")
    rng = np.random.default_rng(7)
    values = [
        {
            "w": rng.standard_normal((4, 5)).astype(np.float32),
            "d": rng.standard_normal(7) * 1e-3,
            "c": (rng.standard_normal(3) + 1j * rng.standard_normal(3)).astype(np.complex64),
        }
        for _ in range(2)
    ]
    return [th.save_v2(d / f"ckpt-{i}", v) for i, v in enumerate(values)], values


@pytest.mark.parametrize(
    "weights, fragments",
    [
        (["one", "2"], ["--weights must be numbers", "'one'"]),
        (["1", "0x"], ["--weights must be numbers", "'0x'"]),
        (["1", "nan"], ["--weights must be finite"]),
        (["1", "inf"], ["--weights must be finite"]),
        (["1e308", "1e308"], ["--weights", "finite, non-zero sum"]),
        (["0.5", "-0.5"], ["--weights", "non-zero sum"]),
    ],
)
def test_average_weights_that_are_not_weights(pair, tmp_path, weights, fragments):
    (a, b), _ = pair
    out = tmp_path / "out"
    assert_cli_error(
        in_process("average", a, b, "-o", out / "m", "--weights", *weights), *fragments
    )
    nothing_in(out)


def test_average_weights_given_to_the_library_must_be_numbers(pair, tmp_path):
    (a, b), _ = pair
    with pytest.raises(tfckpt.CheckpointError, match="weights must be numbers, not 'x'"):
        tfckpt.average([a, b], tmp_path / "out" / "m", weights=[1, "x"])
    nothing_in(tmp_path / "out")


@pytest.mark.parametrize("tiny", [5e-324, 1e-310, 2.0**-200])
def test_average_with_tiny_equal_weights_is_the_plain_mean(pair, tmp_path, tiny):
    (a, b), _ = pair
    tfckpt.average([a, b], tmp_path / "plain" / "m")
    rc, _, err = in_process(
        "average", a, b, "-o", tmp_path / "tiny" / "m", "--weights", repr(tiny), repr(tiny)
    )
    assert rc == 0, err
    plain = tf.train.load_checkpoint(str(tmp_path / "plain" / "m"))
    small = tf.train.load_checkpoint(str(tmp_path / "tiny" / "m"))
    for name in ("w", "d", "c"):
        want, got = plain.get_tensor(name), small.get_tensor(name)
        assert np.any(want != 0), name
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name


def test_average_with_tiny_unequal_weights_is_the_weighted_mean(pair, tmp_path):
    """5e-324 and 1.5e-323 are 1 and 3 times the smallest float: the mean weighted 1:3."""
    (a, b), values = pair
    tfckpt.average([a, b], tmp_path / "big" / "m", weights=[1, 3])
    tfckpt.average([a, b], tmp_path / "tiny" / "m", weights=[5e-324, 1.5e-323])
    big = tf.train.load_checkpoint(str(tmp_path / "big" / "m"))
    small = tf.train.load_checkpoint(str(tmp_path / "tiny" / "m"))
    for name in ("w", "d", "c"):
        want = (values[0][name].astype(np.complex128) + 3 * values[1][name]) / 4
        got = small.get_tensor(name)
        assert got.tobytes() == big.get_tensor(name).tobytes(), name
        want = want if got.dtype.kind == "c" else want.real
        np.testing.assert_allclose(got, want.astype(got.dtype), rtol=1e-6)


# ---------------------------------------------------------------- S3 requests left behind

ABANDONED = """
import asyncio, gc, sys
import botocore.exceptions, fsspec.asyn
from tfckpt.io.storage import storage_for

store = storage_for("s3://bucket/x", {"endpoint_url": "http://127.0.0.1:9", "key": "k",
                                      "secret": "s"})
kinds = [botocore.exceptions.ConnectionClosedError(endpoint_url="http://127.0.0.1:9"),
         botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
         ConnectionResetError("reset")]

async def fail(e):
    raise e

async def abandon():
    for e in kinds:  # requests whose caller failed first and never looked at them
        asyncio.ensure_future(fail(e))
    await asyncio.sleep(0.05)

fsspec.asyn.sync(store.fs.loop, abandon)
gc.collect()
fsspec.asyn.sync(store.fs.loop, asyncio.sleep, 0.05)
print("done", file=sys.stderr)
"""


def test_abandoned_s3_requests_print_no_traceback():
    """A server gone mid-run fails several concurrent requests: the first failure is the
    error; the others, never looked at, must not print a traceback after it."""
    pytest.importorskip("s3fs")
    import subprocess
    import sys

    from cli_helpers import user_env

    proc = subprocess.run(
        [sys.executable, "-c", ABANDONED],
        capture_output=True,
        text=True,
        env=user_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "done\n", proc.stderr


@pytest.mark.parametrize("last", [0, -1, 1.5, "2", True])
def test_average_last_must_be_a_whole_number(tmp_path, last):
    with pytest.raises(tfckpt.CheckpointError, match="whole number > 0"):
        tfckpt.average(str(tmp_path), tmp_path / "out" / "m", last=last)
    nothing_in(tmp_path / "out")


def test_s3_server_dying_mid_average_and_convert(s3, sharded, monkeypatch):
    """The moto server behind the fault proxy of ``s3_helpers.py`` stops answering
    while the second data object is written: one line, exit status 2; once it is back, the
    next run commits and leaves no temporary object of its own behind (what the dead
    server kept of the failed run, it could not be asked to delete)."""
    monkeypatch.setenv("TFCKPT_REMOTE_RETRIES", "0")
    src = s3.put(sharded.prefix, "src")
    die = lambda m, p, h: "die" if m == "PUT" and ".data-00001-of-" in p else None  # noqa: E731
    for sub, argv in [
        ("avg", ["average", src, src, "-o", f"{s3.url}/avg/"]),
        (
            "cvt",
            ["convert", src, f"{s3.url}/cvt/", "--dtype", "float16", "--executor", "threads:2"],
        ),
    ]:
        s3.proxy.reset()
        s3.proxy.rules.append(die)
        proc = run_text(*argv)
        assert_cli_error(proc, s3.url)
        s3.proxy.reset()
        left = set(s3.files(sub))
        assert "sharded.ckpt.index" not in left
        proc = run_text(*argv)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        files = sorted(s3.files(sub))
        assert "sharded.ckpt.index" in files and "checkpoint" in files, files
        assert not [f for f in files if "tmp" in f and f not in left], files
        with tfckpt.open(f"{s3.url}/{sub}/sharded.ckpt") as got:
            assert sorted(got.keys()) == sorted(tfckpt.open(sharded.prefix).keys())
