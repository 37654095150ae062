"""The command line, run as a user runs it: a separate process."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from cli_helpers import assert_cli_error, run_text

import tfckpt
from tfckpt.demo import example_tensors


def run(*args, check_rc=None):
    proc = run_text(*args)
    if check_rc is not None:
        assert proc.returncode == check_rc, proc.stderr
    return proc


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("cli") / "model.ckpt-7")
    tfckpt.save(example_tensors(), prefix)
    return prefix


def test_dump_table(example):
    out = run("dump", example, check_rc=0).stdout
    assert "tensors     21" in out
    assert "simple-conv2/weights" in out and "[3,3,32,64]" in out and "72.0 KiB" in out
    # Scopes are listed largest first.
    scopes = out.split("SCOPE")[1].splitlines()[1:]
    assert [line.split()[0] for line in scopes] == [
        "simple-conv2",
        "logits",
        "simple-conv1",
        "global_step",
    ]


def test_dump_json_matches_library(example):
    data = json.loads(run("dump", example, "--json", check_rc=0).stdout)
    with tfckpt.open(example) as ckpt:
        assert [t["name"] for t in data["tensors"]] == ckpt.keys()
        for t in data["tensors"]:
            info = ckpt.info(t["name"])
            assert (t["dtype"], tuple(t["shape"]), t["bytes"], t["offset"], t["crc32c"]) == (
                info.dtype,
                info.shape,
                info.nbytes,
                info.offset,
                info.crc32c,
            )
    assert data["total_bytes"] == sum(v.nbytes for v in example_tensors().values())
    assert data["num_shards"] == 1 and data["version"]["producer"] == 1


def test_dump_filter_and_values(example):
    data = json.loads(run("dump", example, "--json", "--filter", "^logits/", check_rc=0).stdout)
    assert {t["name"] for t in data["tensors"]} == {
        "logits/weights",
        "logits/biases",
        "logits/weights/Adam",
        "logits/weights/Adam_1",
        "logits/biases/Adam",
        "logits/biases/Adam_1",
    }
    out = run("dump", example, "--tensor", "global_step", check_rc=0).stdout
    assert out.splitlines() == ["global_step (int64 [])", "7"]
    bias = example_tensors()["logits/biases"]
    out = run("dump", example, "--tensor", "^logits/biases$", "--full", check_rc=0).stdout
    printed = out.split("\n", 1)[1].replace("[", "").replace("]", "").split()
    np.testing.assert_array_equal(np.array(printed, dtype=np.float32), bias)


@pytest.mark.parametrize(
    "args",
    [
        ["dump", "/nonexistent/model.ckpt"],
        ["dump", "{example}", "--tensor", "no-such-tensor"],
        ["dump", "{example}", "--filter", "("],
    ],
)
def test_errors_are_one_line(example, args):
    assert_cli_error(run(*[a.format(example=example) for a in args]))


def test_corrupt_index_is_one_line(example, tmp_path):
    prefix = str(tmp_path / "bad")
    tfckpt.save({"a": np.arange(4, dtype=np.float32)}, prefix)
    with open(prefix + ".index", "r+b") as f:
        f.seek(3)
        byte = f.read(1)
        f.seek(3)
        f.write(bytes([byte[0] ^ 0x40]))
    assert_cli_error(run("dump", prefix), "checksum mismatch", prefix + ".index")


def test_library_and_dump_never_import_tensorflow(example):
    code = (
        "import sys, tfckpt, tfckpt.cli, io, contextlib\n"
        f"ckpt = tfckpt.open({example!r})\n"
        "[ckpt[k] for k in ckpt]\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    tfckpt.cli.main(['dump', {example!r}])\n"
        f"    tfckpt.cli.main(['dump', '--json', {example!r}])\n"
        "sys.exit(3 if 'tensorflow' in sys.modules else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_demo_runs(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "tfckpt.demo", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "tensors     21" in proc.stdout
    assert os.path.exists(tmp_path / "out" / "model.ckpt-7.index")
