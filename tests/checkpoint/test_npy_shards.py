"""The original OpenAI GPT release's numpy shards (``model/params_shapes.json`` and
``params_0.npy`` ... ``params_9.npy``) read as a checkpoint: the values train.py's own
loading makes of the files, by every read and every read-only command; hostile files
are one error naming the file.

numpy writes the release during the test (``tests/openai_gpt_release.py``: ten
consecutive pieces of the concatenated parameters, so that parameters straddle shards).
"""

from __future__ import annotations

import json
import os

import numpy as np
import openai_gpt_release
import pytest
from cli_helpers import assert_cli_error, in_process

import tfckpt
from tfckpt.format import npyshards


@pytest.fixture
def release(tmp_path) -> str:
    return openai_gpt_release.write(str(tmp_path / "model"))


def train_py_values(directory: str) -> dict[str, np.ndarray]:
    """What train.py's loader makes of the files, by the release's names."""
    names = [n for n, _ in openai_gpt_release.parameters()]
    return dict(zip(names, openai_gpt_release.load(directory)))


def test_every_read_gives_what_train_py_loads(release):
    want = train_py_values(release)
    for mmap in (True, False):
        with tfckpt.open(release, mmap=mmap) as ckpt:
            assert ckpt.format == "OpenAI GPT numpy shards" and len(ckpt.data_files) == 10
            assert ckpt.keys() == list(want)
            for name, value in want.items():
                info = ckpt.info(name)
                assert (info.dtype, info.shape) == ("float32", value.shape), name
                assert np.array_equal(ckpt[name], value), name
                flat = value.reshape(-1)
                chunks = list(ckpt.iter_chunks(name, 40))  # 10 elements at a time
                assert np.array_equal(np.concatenate(chunks), flat), name
                assert np.array_equal(ckpt.read_elements(name, 3, 20), flat[3:23]), name
            big = "model/h1/mlp/c_fc/w"
            assert np.array_equal(ckpt.get_slice(big)[0, 5::3, 7:40], want[big][0, 5::3, 7:40])
            bytes_ = ckpt.read_bytes("model/we/tokens")
            assert bytes_ == want["model/we/tokens"].astype("<f4").tobytes()
            together = ckpt.read_together(["model/h0/ln_1/g", "model/h1/ln_2/b"])
            assert np.array_equal(together[1], want["model/h1/ln_2/b"])
    # Parameters that begin in one shard and end in another were among those read.
    files = [os.path.join(release, f"params_{k}.npy") for k in range(10)]
    cuts = np.cumsum([np.load(f).size for f in files])
    ends = np.cumsum([v.size for v in want.values()])
    assert ends[-1] == cuts[-1]
    straddling = [n for n, e in zip(want, ends) if any(e - want[n].size < c < e for c in cuts)]
    assert len(straddling) >= 5, straddling


def test_the_shapes_file_and_a_shard_open_the_release_too(release):
    for path in ("params_shapes.json", "params_4.npy"):
        with tfckpt.open(os.path.join(release, path)) as ckpt:
            assert ckpt.prefix == release and len(ckpt) == 26


def test_read_only_commands_and_rewrites_take_the_release(release, tmp_path):
    want = train_py_values(release)
    rc, out, err = in_process("dump", release)
    assert rc == 0 and "format      OpenAI GPT numpy shards\n" in out, err
    assert "model/we/tokens" in out and "[1,24,72]" in out
    rc, out, err = in_process("dump", release, "--json")
    assert sorted(t["name"] for t in json.loads(out)["tensors"]) == sorted(want)
    rc, out, err = in_process("stats", release)
    assert rc == 0 and "model/h1/ln_2/g" in out, err
    rc, out, err = in_process("verify", release)
    assert rc == 0 and out.startswith("ok:") and "every shard read" in out, (out, err)
    assert in_process("convert", release, str(tmp_path / "c") + "/", "--dtype", "float16")[0] == 0
    with tfckpt.open(str(tmp_path / "c" / "model")) as out_ckpt:  # named after the directory
        for name, value in want.items():
            assert np.array_equal(out_ckpt[name], value.astype(np.float16)), name
    st = str(tmp_path / "all.safetensors")
    assert in_process("export", release, st)[0] == 0
    from safetensors.numpy import load_file

    for name, value in load_file(st).items():
        assert np.array_equal(value, want[name]), name
    rc, out, err = in_process("diff", release, str(tmp_path / "c" / "model"))
    assert rc == 1 and "changed dtype" in out, (out, err)


def test_a_url_reads_as_a_local_path(release):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for name in os.listdir(release):
        with open(os.path.join(release, name), "rb") as f:
            fs.pipe(f"/gpt-remote/model/{name}", f.read())
    try:
        with tfckpt.open("memory://gpt-remote/model") as remote, tfckpt.open(release) as local:
            assert remote.keys() == local.keys()
            for name in local.keys():
                assert np.array_equal(remote[name], local[name]), name
    finally:
        fs.rm("/gpt-remote", recursive=True)


def test_big_endian_shards_read_as_little_endian_ones(release, tmp_path):
    want = train_py_values(release)
    swapped = str(tmp_path / "big")
    os.makedirs(swapped)
    for name in os.listdir(release):
        src = os.path.join(release, name)
        if name.endswith(".npy"):
            np.save(os.path.join(swapped, name), np.load(src).astype(">f4"))
        else:
            with open(src, "rb") as f, open(os.path.join(swapped, name), "wb") as g:
                g.write(f.read())
    with tfckpt.open(swapped) as ckpt:
        for name, value in want.items():
            got = ckpt[name]
            assert got.dtype == np.float32 and np.array_equal(got, value), name


# -- hostile files: one error naming the file, on the command line one line


def _shapes(release: str) -> list:
    with open(os.path.join(release, "params_shapes.json")) as f:
        return json.load(f)


def _write_shapes(release: str, shapes) -> None:
    with open(os.path.join(release, "params_shapes.json"), "w") as f:
        json.dump(shapes, f)


def _refused(release: str, cls, file: str, *fragments: str) -> None:
    path = os.path.join(release, file)
    with pytest.raises(cls) as e:
        tfckpt.open(release)
    assert e.value.path == path, e.value
    for fragment in fragments:
        assert fragment in e.value.detail, e.value
    assert_cli_error(in_process("dump", release), f"{path}: ", *fragments)


def test_a_missing_shard_is_named(release):
    os.remove(os.path.join(release, "params_4.npy"))
    _refused(release, tfckpt.CheckpointNotFoundError, "params_4.npy", "the shard is missing")


def test_a_missing_last_shard_leaves_values_the_shapes_need(release):
    last = os.path.join(release, "params_9.npy")
    short = np.load(last).size
    held = sum(np.load(os.path.join(release, f"params_{k}.npy")).size for k in range(9))
    os.remove(last)
    what = f"the 9 shards hold {held}, {short} fewer"
    _refused(release, tfckpt.CorruptCheckpointError, "params_shapes.json", what)


def test_shards_holding_more_than_the_shapes_take(release):
    np.save(os.path.join(release, "params_10.npy"), np.zeros(5, np.float32))
    _refused(release, tfckpt.CorruptCheckpointError, "params_shapes.json", "5 more")


def test_an_array_of_python_objects_is_never_unpickled(release, tmp_path):
    marker = tmp_path / "unpickled"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    values = np.empty(3, dtype=object)
    values[:] = [Evil(), 1.0, 2.0]
    np.save(os.path.join(release, "params_2.npy"), values, allow_pickle=True)
    _refused(release, tfckpt.UnsupportedCheckpointError, "params_2.npy", "Python objects")
    assert not marker.exists()


@pytest.mark.parametrize(
    "change, fragment",
    [
        (lambda s: s[:-1], "25 shapes: train.py's model has 2 embeddings"),
        (lambda s: [*s[:2], s[3], s[2], *s[4:]], "shape 2 (model/h0/attn/c_attn/w) is [72]"),
        (lambda s: [s[0], [40, 25], *s[2:]], "[16, 24] and [40, 25] are not"),
        (lambda s: [*s[:5], [-1], *s[6:]], "shape 5 is [-1], not a list of non-negative"),
        (lambda s: {"shapes": s}, "expected a JSON list of shapes"),
    ],
)
def test_a_shapes_file_that_lies_is_named(release, change, fragment):
    _write_shapes(release, change(_shapes(release)))
    _refused(release, tfckpt.CorruptCheckpointError, "params_shapes.json", fragment)


def test_sizes_that_add_up_to_what_the_shards_hold_but_not_train_py_s(release):
    shapes = _shapes(release)
    shapes[0], shapes[1] = [8, 24], [48, 24]  # the same total, other embeddings
    _write_shapes(release, shapes)
    with tfckpt.open(release) as ckpt:  # a model train.py makes (another n_ctx, n_vocab)
        assert ckpt.info("model/we/positions").shape == (8, 24)
    shapes[2], shapes[3] = [1, 24, 71], [96]  # the same total, not train.py's c_attn
    _write_shapes(release, shapes)
    _refused(release, tfckpt.CorruptCheckpointError, "params_shapes.json", "makes it [1, 24, 72]")


def test_a_shapes_file_that_is_no_json(release):
    with open(os.path.join(release, "params_shapes.json"), "w") as f:
        f.write("[[16, 24], [40")
    _refused(release, tfckpt.CorruptCheckpointError, "params_shapes.json", "not valid JSON")


def test_a_truncated_shard_is_named(release):
    path = os.path.join(release, "params_6.npy")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 8)
    _refused(release, tfckpt.CorruptCheckpointError, "params_6.npy", "the file is truncated")


@pytest.mark.parametrize(
    "value, cls, fragment",
    [
        (np.zeros((2, 3), np.float32), tfckpt.CorruptCheckpointError, "one-dimensional"),
        (np.zeros(3, np.float64), tfckpt.UnsupportedCheckpointError, "float64, params_0.npy's"),
        (np.zeros(3, [("a", "<f4")]), tfckpt.UnsupportedCheckpointError, "not a numeric one"),
        (np.array(["ab"]), tfckpt.UnsupportedCheckpointError, "not a numeric one"),
    ],
)
def test_a_shard_of_another_kind_is_named(release, value, cls, fragment):
    np.save(os.path.join(release, "params_3.npy"), value)
    _refused(release, cls, "params_3.npy", fragment)


def test_a_file_that_is_no_npy_is_named(release):
    with open(os.path.join(release, "params_1.npy"), "wb") as f:
        f.write(b"PK\x03\x04 not an array")
    _refused(release, tfckpt.CorruptCheckpointError, "params_1.npy", "not a readable .npy file")


def test_the_format_layer_refuses_a_header_past_numpy_s_limit():
    head = b"\x93NUMPY\x01\x00" + (60000).to_bytes(2, "little") + b"{" + b" " * 100
    with pytest.raises(tfckpt.CorruptCheckpointError, match="not a readable .npy"):
        npyshards.npy_header(head, 10**6, "params_0.npy")
