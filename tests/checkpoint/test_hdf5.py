"""Keras HDF5 weights as a source: tf.keras writes the files during the test (``save_weights``
to ``.h5``, ``save`` of a whole model); what tfckpt reads equals what h5py reads, bit for
bit, whole, in chunks, by element ranges and by lazy slices; every command takes them,
and TensorFlow reads the conversions back. HDF5 layouts Keras does not write itself
(chunked, compressed, big-endian, compact, after a user block) are written with h5py in
the Keras layout and read the same way.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import assert_cli_error, in_process

import tfckpt
from tfckpt.checkpoint import h5datasets

h5py = pytest.importorskip("h5py")
tf = pytest.importorskip("tensorflow")
tf_keras = pytest.importorskip("tf_keras")
safetensors_numpy = pytest.importorskip("safetensors.numpy")
pytestmark = pytest.mark.filterwarnings("ignore:You are saving your model as an HDF5 file")

DTYPES = [
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
    "complex64",
    "complex128",
]


class Many(tf_keras.layers.Layer):
    """A layer holding a weight of every dtype Keras 2 writes to HDF5."""

    def build(self, input_shape):
        for dt in DTYPES:
            self.add_weight(
                name=f"w_{dt}", shape=(3, 5), dtype=dt, initializer="zeros", trainable=False
            )


def _randomize(model, seed=0):
    rng = np.random.default_rng(seed)
    for w in model.weights:
        v = rng.normal(size=tuple(w.shape)) * 50
        if w.dtype.is_complex:
            v = v + 1j * rng.normal(size=v.shape)
        w.assign(v > 0 if w.dtype.name == "bool" else v.astype(w.dtype.as_numpy_dtype))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """tf.keras's files: every dtype (save_weights), a trained model saved whole (with its
    optimizer), and a model nesting a model whose layer names clash with its own."""
    d = tmp_path_factory.mktemp("h5")
    many = tf_keras.Sequential([tf_keras.Input((2,)), Many(name="many")])
    _randomize(many)
    many.save_weights(str(d / "many.h5"))
    model = tf_keras.Sequential(
        [
            tf_keras.Input((3,)),
            tf_keras.layers.Dense(700, name="wide"),
            tf_keras.layers.BatchNormalization(name="bn"),
            tf_keras.layers.Dense(2, name="out"),
        ]
    )
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((4, 3)), np.ones((4, 2)), epochs=1, verbose=0)
    model.save(str(d / "model.h5"))
    inner = tf_keras.Sequential(
        [tf_keras.Input((4,)), tf_keras.layers.Dense(3, name="dense")], name="inner"
    )
    x = tf_keras.Input((2,))
    outer = tf_keras.Model(x, inner(tf_keras.layers.Dense(4, name="dense")(x)))
    _randomize(outer, 1)
    outer.save_weights(str(d / "nested.h5"))
    return d


def h5_values(path, ckpt) -> dict[str, np.ndarray]:
    """What h5py reads from the dataset of each tensor."""
    with h5py.File(path, "r") as f:
        return {n: f[ckpt.dataset_path(n)][()] for n in ckpt.keys()}


def assert_bits(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert got.tobytes() == want.tobytes(), what


def test_every_dtype_reads_as_h5py_reads_it(files):
    path = files / "many.h5"
    with tfckpt.open(path) as ckpt:
        assert ckpt.keys() == [f"many/w_{dt}" for dt in DTYPES]
        assert "Keras HDF5" in ckpt.format and ckpt.keras_layers[0] == ("many", ckpt.keys())
        want = h5_values(path, ckpt)
        for name in ckpt.keys():
            info = ckpt.info(name)
            dtype = name.split("_", 1)[1]
            assert info.dtype == dtype and info.shape == (3, 5) and info.slices == ()
            assert ckpt[name].dtype.name == dtype
            assert_bits(ckpt[name], want[name], name)
            flat = want[name].reshape(-1)
            assert_bits(np.concatenate(list(ckpt.iter_chunks(name, 16))), flat, name)
            assert_bits(ckpt.read_elements(name, 4, 7), flat[4:11], name)
            assert_bits(ckpt.get_slice(name)[1:, ::2], want[name][1:, ::2], name)
        assert_bits(ckpt.read_together(ckpt.keys()[:3])[2], want["many/w_float32"].reshape(-1), "")
    with tfckpt.open(path, mmap=False) as ckpt:
        assert_bits(ckpt["many/w_float32"], want["many/w_float32"], "mmap=False")


def test_a_whole_model_file_lists_the_model_and_its_optimizer_apart(files):
    path = files / "model.h5"
    with tfckpt.open(path) as ckpt:
        assert ckpt.keys() == [
            "wide/kernel",
            "wide/bias",
            "bn/gamma",
            "bn/beta",
            "bn/moving_mean",
            "bn/moving_variance",
            "out/kernel",
            "out/bias",
        ]
        assert ckpt.dataset_path("wide/kernel") == "/model_weights/wide/wide/kernel:0"
        for name, value in h5_values(path, ckpt).items():
            assert_bits(ckpt[name], value, name)
    with tfckpt.open(f"{path}/optimizer_weights") as opt:
        assert "iteration" in opt and "Adam/m/wide/kernel" in opt
        for name, value in h5_values(path, opt).items():
            assert_bits(opt[name], value, name)
    with tfckpt.open(f"{path}/model_weights/bn") as one_layer:
        assert one_layer.keys() == ["bn/gamma", "bn/beta", "bn/moving_mean", "bn/moving_variance"]


def test_weights_of_one_name_in_two_layers_are_named_after_their_layers(files):
    with tfckpt.open(files / "nested.h5") as ckpt:
        assert ckpt.keys() == [
            "dense/dense/kernel",
            "dense/dense/bias",
            "inner/dense/kernel",
            "inner/dense/bias",
        ]
        assert ckpt.info("inner/dense/kernel").shape == (4, 3)


def test_every_command_takes_an_h5_and_tensorflow_reads_what_they_write(files, tmp_path):
    path = str(files / "model.h5")
    with tfckpt.open(path) as ckpt:
        want = h5_values(path, ckpt)
    rc, out, err = in_process("dump", path)
    assert rc == 0 and "Keras HDF5 (Keras 2." in out and "wide/kernel" in out, err
    rc, out, err = in_process("dump", path, "--json")
    assert [t["name"] for t in json.loads(out)["tensors"]] == list(want)
    rc, out, err = in_process("stats", path)
    assert rc == 0 and "bn/moving_variance" in out, err
    rc, out, err = in_process("verify", path)
    assert rc == 0 and out.startswith("ok:") and "every dataset read" in out, (out, err)

    assert in_process("convert", path, str(tmp_path) + "/", "--dtype", "float16")[0] == 0
    reader = tf.train.load_checkpoint(str(tmp_path / "model"))  # the file's name, less .h5
    for name, value in want.items():
        assert_bits(reader.get_tensor(name), value.astype(np.float16), name)
    rc, out, err = in_process("diff", path, str(tmp_path / "model"))
    assert rc == 1 and "changed dtype" in out, (out, err)

    st = str(tmp_path / "model.safetensors")
    assert in_process("export", path, st)[0] == 0
    for name, value in safetensors_numpy.load_file(st).items():
        assert_bits(value, want[name], name)
    assert in_process("select", path, tmp_path / "s" / "m", "--include", "^bn/")[0] == 0
    reader = tf.train.load_checkpoint(str(tmp_path / "s" / "m"))
    assert sorted(reader.get_variable_to_shape_map()) == sorted(n for n in want if "bn/" in n)
    assert in_process("rename", path, tmp_path / "r" / "m", "--map", "wide/=hidden/")[0] == 0
    reader = tf.train.load_checkpoint(str(tmp_path / "r" / "m"))
    assert_bits(reader.get_tensor("hidden/kernel"), want["wide/kernel"], "renamed")
    rc, out, err = in_process(
        "merge", path, f"{path}/optimizer_weights", "-o", tmp_path / "m" / "m"
    )
    assert rc == 0, err
    reader = tf.train.load_checkpoint(str(tmp_path / "m" / "m"))
    names = reader.get_variable_to_shape_map()
    assert "Adam/v/out/bias" in names and "iteration" in names and "out/bias" in names
    assert_bits(reader.get_tensor("out/bias"), want["out/bias"], "merged")
    assert_cli_error(in_process("dump", f"{path}/no_such_group"), "/no_such_group does not exist")


def test_layouts_keras_does_not_write_read_as_h5py_reads_them(tmp_path):
    """Chunked (deflate, shuffle, fletcher32; edges; chunks never written), big-endian,
    compact, and a file that begins with a user block."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((37, 29)).astype(np.float32)
    layouts = {
        "gzip": (a, dict(chunks=(8, 7), compression="gzip", shuffle=True, fletcher32=True)),
        "plain_chunks": (a.astype(">f8"), dict(chunks=(5, 29))),
        "big_endian": (a.astype(">f4"), {}),
        "ints_be": ((a * 1000).astype(">i4"), dict(chunks=(37, 1), compression="gzip")),
        "compact": (a[:3], dict(compact=True)),
        "scalar": (np.float64(2.5), {}),
        "empty": (np.zeros((0, 4), np.float32), {}),
        "bools": (a > 0, dict(chunks=(4, 4), compression="gzip")),
    }
    path = tmp_path / "layouts.h5"
    with h5py.File(path, "w", userblock_size=1024) as f:
        f.attrs["layer_names"] = np.array([b"layer"])
        g = f.create_group("layer")
        g.attrs["weight_names"] = np.array([f"layer/{k}:0".encode() for k in layouts])
        for name, (value, kw) in layouts.items():
            if kw.pop("compact", False):
                dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
                dcpl.set_layout(h5py.h5d.COMPACT)
                space = h5py.h5s.create_simple(value.shape)
                tid = h5py.h5t.py_create(value.dtype)
                h5py.h5d.create(g.id, f"layer/{name}:0".encode(), tid, space, dcpl=dcpl)
                g[f"layer/{name}:0"][...] = value
            else:
                g.create_dataset(f"layer/{name}:0", data=value, **kw)
        sparse = g.create_dataset("layer/sparse:0", shape=(20, 6), chunks=(5, 3), fillvalue=7.0)
        sparse[5:10, :3] = 1.0  # one chunk written, the others never
    with h5py.File(path, "a") as f:
        names = list(f["layer"].attrs["weight_names"]) + [b"layer/sparse:0"]
        f["layer"].attrs["weight_names"] = np.array(names)
    assert path.read_bytes()[1024:1032] == b"\x89HDF\r\n\x1a\n"
    with tfckpt.open(path) as ckpt:
        want = h5_values(path, ckpt)
        assert ckpt.info("layer/gzip").dtype == "float32"
        assert (
            ckpt.info("layer/ints_be").dtype == "int32" and ckpt.info("layer/bools").dtype == "bool"
        )
        for name, value in want.items():
            got = ckpt[name]
            assert got.dtype == value.dtype.newbyteorder("=") and got.dtype.isnative, name
            assert np.array_equal(got, value) and got.shape == value.shape, name
            flat = value.reshape(-1)
            for start, count in [
                (0, flat.size),
                (3, 40),
                (flat.size // 2, flat.size - flat.size // 2),
            ]:
                start = min(start, flat.size)
                count = max(0, min(count, flat.size - start))
                assert np.array_equal(
                    ckpt.read_elements(name, start, count), flat[start : start + count]
                )
            assert np.array_equal(np.concatenate(list(ckpt.iter_chunks(name, 44))), flat), name
        assert np.array_equal(ckpt.get_slice("layer/gzip")[30:, 5::3], a[30:, 5::3])
    out = tmp_path / "out.safetensors"
    tfckpt.export(str(path), str(out), chunk_bytes=4096)
    for name, value in safetensors_numpy.load_file(str(out)).items():
        assert np.array_equal(value, want[name]), name


def test_an_export_reads_a_large_tensor_within_the_chunk_budget(tmp_path, monkeypatch):
    """A contiguous and a compressed tensor of 4 MiB each, exported with a 256 KiB budget:
    no read holds more than its share, no chunk decodes to more than it declares."""
    value = np.random.default_rng(5).standard_normal((1024, 1024)).astype(np.float32)
    path = tmp_path / "big.h5"
    with h5py.File(path, "w") as f:
        f.attrs["layer_names"] = np.array([b"big"])
        g = f.create_group("big")
        g.attrs["weight_names"] = np.array([b"big/flat:0", b"big/packed:0"])
        g.create_dataset("big/flat:0", data=value)
        g.create_dataset("big/packed:0", data=value, chunks=(64, 256), compression="gzip")
    largest = [0]
    real = h5datasets.Dataset.read_flat

    def counting(self, start, count, out, verify):
        largest[0] = max(largest[0], count * self.itemsize)
        return real(self, start, count, out, verify)

    monkeypatch.setattr(h5datasets.Dataset, "read_flat", counting)
    budget = 256 << 10
    out = tmp_path / "big.safetensors"
    tfckpt.export(str(path), str(out), chunk_bytes=budget, permute=[("packed", (1, 0))])
    assert 0 < largest[0] <= budget // 2, largest[0]
    got = safetensors_numpy.load_file(str(out))
    assert np.array_equal(got["big/flat"], value) and np.array_equal(got["big/packed"], value.T)


def test_the_optimizers_state_and_a_url(files, tmp_path):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    fs.pipe("/h5-remote/model.h5", (files / "model.h5").read_bytes())
    try:
        with tfckpt.open("memory://h5-remote/model.h5") as remote:
            with tfckpt.open(files / "model.h5") as local:
                assert remote.keys() == local.keys()
                for name in local.keys():
                    assert_bits(remote[name], local[name], name)
        tfckpt.convert("memory://h5-remote/model.h5/optimizer_weights", str(tmp_path / "o"), None)
    finally:
        fs.rm("/h5-remote", recursive=True)
    reader = tf.train.load_checkpoint(str(tmp_path / "o"))
    assert int(reader.get_tensor("iteration")) == 1


def test_without_h5py_the_error_says_what_to_install(files):
    code = (
        "import sys; sys.modules['h5py'] = None\n"
        "import tfckpt\n"
        f"try: tfckpt.open({str(files / 'many.h5')!r})\n"
        "except tfckpt.UnsupportedCheckpointError as e: print(e)\n"
    )
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    # From a checkout, the hint names it (tests/cli/test_output_and_help.py: each form).
    assert "needs h5py (pip install " in done.stdout and "[h5]')" in done.stdout, done.stderr


def test_startup_and_non_hdf5_paths_do_not_load_h5py(tmp_path):
    import subprocess
    import sys

    prefix = str(tmp_path / "ckpt")
    tfckpt.save({"a": np.ones(2, np.float32)}, prefix)
    code = f"import sys, tfckpt; tfckpt.open({prefix!r}).keys(); print('h5py' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


def test_not_hdf5_and_keras_3_files_are_named(tmp_path):
    fake = tmp_path / "weights.h5"
    fake.write_bytes(b"not an hdf5 file at all" * 10)
    assert_cli_error(in_process("dump", fake), "HDF5's signature is not where HDF5 looks")
    keras3 = tmp_path / "k3.weights.h5"
    with h5py.File(keras3, "w") as f:
        f.create_group("layers/dense/vars").create_dataset("0", data=np.ones(2))
        f.create_group("vars")
    assert_cli_error(in_process("dump", keras3), "a Keras 3 .weights.h5 file")
    empty = tmp_path / "data.h5"
    with h5py.File(empty, "w") as f:
        f.create_dataset("x", data=np.ones(2))
    assert_cli_error(in_process("dump", empty), "no layer_names, no model_weights")
