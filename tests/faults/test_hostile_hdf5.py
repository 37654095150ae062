"""Hostile HDF5 files, written with h5py: each gets one clean error line naming the file and
the dataset, none is followed out of the file, and none makes tfckpt allocate what a
dataset merely claims (a decompression bomb stays within one chunk's declared size)."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
from cli_helpers import assert_cli_error, in_process, run_text, user_env

import tfckpt

h5py = pytest.importorskip("h5py")


def keras_file(path, weights: dict[str, object] | None = None, **datasets) -> None:
    """A Keras 2 save_weights layout with one layer, ``layer``: ``weights`` name ->
    value (or a callable making the dataset in the layer's group)."""
    with h5py.File(path, "w") as f:
        f.attrs["layer_names"] = np.array([b"layer"])
        g = f.create_group("layer")
        items = dict(weights or {"layer/w:0": np.arange(6, dtype=np.float32)})
        g.attrs["weight_names"] = np.array([n.encode() for n in items])
        for name, value in items.items():
            if callable(value):
                value(g, name)
            else:
                g.create_dataset(name, data=value)


def dump_error(path, *fragments):
    return assert_cli_error(in_process("dump", path), str(path), *fragments)


def test_wrong_and_missing_attributes(tmp_path):
    cases = {
        "ints.h5": (lambda f: f.attrs.__setitem__("layer_names", np.arange(3)), "not a name"),
        "ghost.h5": (
            lambda f: f.attrs.__setitem__("layer_names", np.array([b"layer", b"ghost"])),
            "/ghost does not exist",
        ),
        "no_weight_names.h5": (
            lambda f: f["layer"].attrs.__delitem__("weight_names"),
            "/layer has no weight_names",
        ),
        "group.h5": (
            lambda f: f["layer"].attrs.__setitem__("weight_names", np.array([b"layer"])),
            "is not a dataset",
        ),
        "dotdot.h5": (
            lambda f: f["layer"].attrs.__setitem__("weight_names", np.array([b"../layer/w:0"])),
            "no plain HDF5 path",
        ),
        "2d.h5": (
            lambda f: f.attrs.__setitem__("layer_names", np.array([[b"a", b"b"]])),
            "not a list of names",
        ),
        "not_utf8.h5": (
            lambda f: f.attrs.__setitem__("layer_names", np.array([b"\xff\xfe"])),
            "not UTF-8",
        ),
    }
    for name, (spoil, fragment) in cases.items():
        path = tmp_path / name
        keras_file(path)
        with h5py.File(path, "a") as f:
            spoil(f)
        dump_error(path, fragment)


def test_a_huge_names_attribute_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "huge_attr.h5"
    with h5py.File(path, "w", libver="latest") as f:  # dense attribute storage
        f.attrs["layer_names"] = np.array([b"x" * 1024] * (17 * 1024))  # 17 MiB
    dump_error(path, "attribute layer_names of /", "no list of names")


def test_links_are_never_followed(tmp_path):
    target = tmp_path / "elsewhere.h5"
    keras_file(target)
    ext = tmp_path / "external.h5"
    keras_file(ext)
    with h5py.File(ext, "a") as f:
        del f["layer"]
        f["layer"] = h5py.ExternalLink(str(target), "/layer")
    dump_error(ext, "/layer is an external link (to another file): refused")
    soft = tmp_path / "soft.h5"
    keras_file(soft)
    with h5py.File(soft, "a") as f:
        f["layer/elsewhere:0"] = np.ones(2)
        del f["layer/layer/w:0"]
        f["layer/layer/w:0"] = h5py.SoftLink("/layer/elsewhere:0")
    dump_error(soft, "/layer/layer/w:0 is a soft link: refused")
    whole = tmp_path / "model.h5"
    with h5py.File(whole, "w") as f:
        f["model_weights"] = h5py.ExternalLink(str(target), "/")
    dump_error(whole, "/model_weights is an external link")


def test_virtual_and_external_storage_are_refused(tmp_path):
    raw = tmp_path / "values.bin"
    raw.write_bytes(np.arange(4, dtype=np.float32).tobytes())

    def external(g, name):
        g.create_dataset(name, shape=(4,), dtype="f4", external=[(str(raw), 0, 16)])

    path = tmp_path / "external_storage.h5"
    keras_file(path, {"layer/w:0": external})
    dump_error(path, "dataset /layer/layer/w:0", "stored in another file")

    source = tmp_path / "source.h5"
    with h5py.File(source, "w") as f:
        f["x"] = np.arange(4, dtype=np.float32)

    def virtual(g, name):
        layout = h5py.VirtualLayout(shape=(4,), dtype="f4")
        layout[:] = h5py.VirtualSource(str(source), "x", shape=(4,))
        g.create_virtual_dataset(name, layout)

    path = tmp_path / "virtual.h5"
    keras_file(path, {"layer/w:0": virtual})
    dump_error(path, "dataset /layer/layer/w:0", "virtual dataset")


def test_types_tfckpt_does_not_read_are_named(tmp_path):
    cases = {
        "strings": (np.array([b"ab", b"c"]), "strings"),
        "vlen": (np.array(["ab", "cde"], dtype=h5py.string_dtype()), "strings"),
        "compound": (np.zeros(2, dtype=[("a", "<f4"), ("b", "<i2")]), "compound type"),
        "tagged": (np.zeros(2, dtype=h5py.opaque_dtype(np.dtype("V2"))), "class 5"),
    }
    for name, (value, fragment) in cases.items():
        path = tmp_path / f"{name}.h5"
        keras_file(path, {"layer/w:0": value})
        dump_error(path, "dataset /layer/layer/w:0", fragment)


def test_declared_sizes_the_file_cannot_hold(tmp_path):
    path = tmp_path / "contiguous.h5"
    keras_file(path, {"layer/w:0": lambda g, n: g.create_dataset(n, shape=(1 << 40,), dtype="f4")})
    dump_error(path, "declares 4398046511104 bytes", "more than the whole file's")
    path = tmp_path / "chunked.h5"
    keras_file(
        path,
        {
            "layer/w:0": lambda g, n: g.create_dataset(
                n, shape=(1 << 40,), chunks=(1024,), dtype="f4"
            )
        },
    )
    dump_error(path, "can hold, compressed or not")
    path = tmp_path / "big_chunks.h5"
    keras_file(
        path,
        {
            "layer/w:0": lambda g, n: g.create_dataset(
                n, shape=(4096, 4096), chunks=(4096, 4096), dtype="f4", compression="gzip"
            )
        },
    )
    dump_error(path, "chunks of 67108864 bytes", "decodes at once")


def test_filters_tfckpt_does_not_decode_are_refused(tmp_path):
    path = tmp_path / "lzf.h5"
    keras_file(
        path,
        {
            "layer/w:0": lambda g, n: g.create_dataset(
                n, data=np.ones(100), chunks=(10,), compression="lzf"
            )
        },
    )
    dump_error(path, "compressed with lzf")


def _bomb(path, declared: int, inflated: int) -> None:
    """One chunk declaring ``declared`` bytes whose deflate stream inflates to ``inflated``."""
    packer = zlib.compressobj(9)
    zeros = bytes(1 << 20)
    stream = b"".join(packer.compress(zeros) for _ in range(inflated >> 20)) + packer.flush()
    n = declared // 4

    def make(g, name):
        d = g.create_dataset(name, shape=(n,), chunks=(n,), dtype="f4", compression="gzip")
        d.id.write_direct_chunk((0,), stream)

    keras_file(path, {"layer/w:0": make})


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's VmHWM")
def test_a_decompression_bomb_is_refused_within_its_chunk(tmp_path):
    small = tmp_path / "small.h5"
    _bomb(small, 4096, 1 << 30)  # 1 GiB behind a chunk of 4 KiB: its stream is too long
    assert os.path.getsize(small) < 2 << 20
    assert_cli_error(in_process("stats", small), "the chunk at [0] stores", "more than its 4164")
    path = tmp_path / "bomb.h5"
    _bomb(path, 1 << 20, 1 << 30)  # a stream short enough for its chunk of 1 MiB
    line = assert_cli_error(in_process("stats", path), "inflates past the 1048576 bytes")
    assert "dataset /layer/layer/w:0" in line
    # In a process of its own, the read stays far below what the stream holds. The peak
    # is the process's own (VmHWM): its rusage would count this one's, from the fork.
    code = (
        "import tfckpt\n"
        f"ckpt = tfckpt.open({str(path)!r})\n"
        "try:\n    ckpt['layer/w']\nexcept tfckpt.CorruptCheckpointError as e:\n    print(e)\n"
        "peak = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')]\n"
        "print(int(peak[0].split()[1]) >> 10)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=user_env()
    )
    lines = done.stdout.splitlines()
    assert "inflates past" in lines[0], done.stderr
    assert int(lines[1]) < 300, lines  # MiB: the interpreter, numpy and h5py, no GiB


def test_damaged_chunks_are_named(tmp_path):
    value = np.arange(1000, dtype=np.float32)
    path = tmp_path / "chunks.h5"

    def make(g, name):
        g.create_dataset(name, data=value, chunks=(250,), compression="gzip", fletcher32=True)

    keras_file(path, {"layer/w:0": make})
    with h5py.File(path, "r") as f:
        d = f["layer/layer/w:0"]
        offset = d.id.get_chunk_info(1).byte_offset
        size = d.id.get_chunk_info(1).size
    data = bytearray(path.read_bytes())
    data[offset + size - 6] ^= 0xFF  # in the stream's adler32 / the checksum
    damaged = tmp_path / "damaged.h5"
    damaged.write_bytes(bytes(data))
    assert in_process("dump", damaged)[0] == 0  # the structure is intact
    rc, out, err = in_process("verify", damaged)
    assert rc == 1 and "the chunk at [250]" in err and "dataset /layer/layer/w:0" in err, (out, err)
    with tfckpt.open(damaged, verify=False) as ckpt:  # fletcher32 not checked: zlib's adler is
        with pytest.raises(tfckpt.CorruptCheckpointError, match="chunk at \\[250\\]"):
            ckpt["layer/w"]
    data = bytearray(path.read_bytes())
    data[offset + size - 2] ^= 0xFF  # the fletcher32 checksum alone
    damaged.write_bytes(bytes(data))
    assert_cli_error(in_process("stats", damaged), "fletcher32 checksum mismatch")
    with tfckpt.open(damaged, verify=False) as ckpt:
        assert np.array_equal(ckpt["layer/w"], value)


def test_bools_other_than_0_and_1(tmp_path):
    path = tmp_path / "bools.h5"
    keras_file(path, {"layer/w:0": np.array([True, False, True])})
    with h5py.File(path, "r") as f:
        offset = f["layer/layer/w:0"].id.get_offset()
    data = bytearray(path.read_bytes())
    data[offset + 1] = 2
    path.write_bytes(bytes(data))
    assert_cli_error(in_process("stats", path), "bool values other than 0 and 1")


def test_a_truncated_file(tmp_path):
    path = tmp_path / "whole.h5"
    keras_file(path, {"layer/w:0": np.zeros(1 << 16, np.float32)})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    dump_error(path, "truncated")


def test_copies_of_a_shared_weight_that_differ(tmp_path):
    """Two layers listing one weight name: one tensor, but only while the copies agree."""
    path = tmp_path / "shared.h5"
    with h5py.File(path, "w") as f:
        f.attrs["layer_names"] = np.array([b"a", b"b"])
        for layer, value in (("a", np.ones(3, "f4")), ("b", np.ones(3, "f4"))):
            g = f.create_group(layer)
            g.attrs["weight_names"] = np.array([b"emb/weight:0"])
            g.create_dataset("emb/weight:0", data=value)
    with tfckpt.open(path) as ckpt:
        assert ckpt.keys() == ["emb/weight"] and ckpt.keras_layers == [
            ("a", ["emb/weight"]),
            ("b", ["emb/weight"]),
        ]
        assert np.array_equal(ckpt["emb/weight"], np.ones(3))
    with h5py.File(path, "a") as f:
        f["b/emb/weight:0"][1] = 5
    rc, out, err = in_process("verify", path)
    assert rc == 1 and "/a/emb/weight:0 and as /b/emb/weight:0" in err, (out, err)
    assert_cli_error(in_process("export", path, tmp_path / "o.safetensors"), "different values")
    with tfckpt.open(f"{path}/b") as layer_b:
        assert layer_b["emb/weight"].tolist() == [1, 5, 1]


def test_a_layer_listed_again_and_again_is_read_once(tmp_path):
    """``layer_names`` repeating one layer: Keras' loader pairs each entry with the model's
    next layer (a file listing ``d`` twice loads into two layers), so each entry stays one
    of ``keras_layers``; two million of them are read in time linear in the list, by
    every command (a generous timeout, no clock in the assertions)."""
    tf_keras = pytest.importorskip("tf_keras")
    from tf_keras.src.saving.legacy import hdf5_format

    layers = tf_keras.layers
    model = tf_keras.Sequential([layers.Input((3,)), layers.Dense(3, name="d")])
    twice, path = tmp_path / "twice.h5", tmp_path / "repeated.h5"
    for target, count in ((twice, 2), (path, 2_000_000)):
        model.save_weights(str(target))
        with h5py.File(target, "a") as f:
            del f.attrs["layer_names"]
            hdf5_format.save_attributes_to_hdf5_group(f, "layer_names", [b"d"] * count)
    with h5py.File(path) as f:  # Keras' own split of a long list
        assert "layer_names1" in f.attrs
    two = tf_keras.Sequential([layers.Input((3,)), layers.Dense(3, name="a"), layers.Dense(3)])
    two.load_weights(str(twice))
    want = [w.numpy() for w in model.weights]
    assert all(np.array_equal(w.numpy(), want[k % 2]) for k, w in enumerate(two.weights))
    with tfckpt.open(twice) as ckpt:
        top = ("top_level_model_weights", [])  # tf.keras writes it, empty
        assert ckpt.keras_layers == [("d", ["d/kernel", "d/bias"])] * 2 + [top]
        assert ckpt.keys() == ["d/kernel", "d/bias"]
    for args in (("dump", "--json", path), ("verify", path)):
        proc = run_text(*args, timeout=600)
        assert proc.returncode == 0 and not proc.stderr, (args, proc.stderr[-2000:])
    with tfckpt.open(path) as ckpt:
        assert len(ckpt.keras_layers) == 2_000_001 and ckpt.keys() == ["d/kernel", "d/bias"]
        assert np.array_equal(ckpt["d/kernel"], want[0])
    # A layer's weight_names repeating its weights: each dataset looked up once.
    with h5py.File(path, "a") as f:
        group = f["d"]
        names = [
            n.encode() for n in hdf5_format.load_attributes_from_hdf5_group(group, "weight_names")
        ]
        del group.attrs["weight_names"]
        hdf5_format.save_attributes_to_hdf5_group(group, "weight_names", names * 500_000)
    with tfckpt.open(path) as ckpt:
        assert ckpt.keys() == ["d/kernel", "d/bias"]
        assert len(ckpt.keras_layers[0][1]) == 1_000_000
