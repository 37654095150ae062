"""Checkpoints written by real TensorFlow, for tests that hold tfckpt to TensorFlow's word.

Each ``write_*`` function takes an existing empty directory, writes one kind of checkpoint
into it with TensorFlow and returns a :class:`TFCheckpoint`. ``path`` is what a user would
hand to ``tfckpt.open`` (a prefix, a directory with a ``checkpoint`` state file, or a
SavedModel directory); ``prefix`` is the checkpoint TensorFlow itself resolves it to, the
one to read with ``tf.train.load_checkpoint``.

Only the test suite imports this module, and only after ``conftest.py`` has quietened
TensorFlow's logging.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import ml_dtypes
import numpy as np
import tensorflow as tf

RNG_SEED = 20240611


@dataclasses.dataclass(frozen=True)
class TFCheckpoint:
    name: str
    path: str  # what tfckpt.open is given
    prefix: str  # what it must resolve to; what TensorFlow reads
    extra: dict = dataclasses.field(default_factory=dict, compare=False)


def data_files(prefix: str | os.PathLike) -> list[Path]:
    p = Path(prefix)
    return sorted(p.parent.glob(p.name + ".data-*-of-*"))


def _save_v2(prefix: str, tensors: dict) -> None:
    """One SaveV2 op writing whole (unsliced) tensors."""
    names = list(tensors)
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[tensors[n] for n in names],
    )


# ---------------------------------------------------------------- values with sharp edges


def special_floats(np_dtype) -> np.ndarray:
    """NaN (both signs, with a payload where the type has room), ±inf, ±0, subnormals, extremes."""
    dt = np.dtype(np_dtype)
    fi = ml_dtypes.finfo(dt)
    vals = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        np.inf,
        -np.inf,
        fi.max,
        fi.min,
        fi.tiny,
        fi.smallest_subnormal,
        -fi.smallest_subnormal,
        fi.eps,
    ]
    arr = np.array([float(x) for x in vals]).astype(dt)  # inf becomes NaN in the float8 *fn types
    if dt.itemsize == 1:
        return np.concatenate([arr, np.array([np.nan, -np.nan]).astype(dt)])
    bits = np.dtype(f"u{dt.itemsize}").type
    nan = np.array([np.nan], dtype=dt).view(bits)[0]
    nans = np.array(
        [nan, nan | bits(1), nan | (bits(1) << bits(8 * dt.itemsize - 1))]
    )  # quiet, payload, -NaN
    return np.concatenate([arr, nans.view(dt)])


def random_floats(np_dtype, shape, rng) -> np.ndarray:
    """Random bit patterns (so every class of value appears) with the special values up front."""
    dt = np.dtype(np_dtype)
    n = int(np.prod(shape))
    bits = rng.integers(
        0, 2 ** (8 * dt.itemsize), size=n, dtype=np.uint64 if dt.itemsize == 8 else np.int64
    )
    arr = bits.astype(f"u{dt.itemsize}").view(dt)
    sp = special_floats(dt)
    arr[: min(n, sp.size)] = sp[: min(n, sp.size)]
    return arr.reshape(shape)


def random_ints(np_dtype, shape, rng) -> np.ndarray:
    dt = np.dtype(np_dtype)
    info = np.iinfo(dt)
    arr = rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    flat = arr.reshape(-1)
    edge = np.array([info.min, info.max, 0, -1 if info.min < 0 else 1], dtype=dt)
    flat[: min(flat.size, edge.size)] = edge[: flat.size]
    return arr


def random_complex(np_dtype, shape, rng) -> np.ndarray:
    part = np.float32 if np.dtype(np_dtype) == np.complex64 else np.float64
    out = np.empty(shape, dtype=np_dtype)
    out.real = random_floats(part, shape, rng)
    out.imag = random_floats(part, shape, rng)[::-1]
    return out


STRINGS_1D = [
    b"",
    b"a",
    b"\x00\xff\xfe not utf-8 \x80\x81",
    "h\u00e9llo w\u00f6rld".encode(),
    b"\x00" * 7,
    bytes(range(256)),
    b"x" * 70_000,
    b"b" * 127,
    b"c" * 128,
    b"d" * 16_383,
    b"e" * 16_384,
]


def numpy_values(rng=None) -> dict[str, np.ndarray]:
    """Every dtype TensorFlow can put in a checkpoint, as numpy arrays (key = tensor name).

    Quantized types are numpy's structured dtypes exactly as ``tf.qint8.as_numpy_dtype``.

    What TF 2.21 (CPU) can save, tried with SaveV2 of a ``tf.constant``: every fixed-size dtype
    with a DataType number (float16/bfloat16/32/64, (u)int8..64, bool, complex64/128, the five
    float8s, float4_e2m1fn, int4/uint4, int2/uint2 -- the sub-byte ones one element per byte --
    and qint8/quint8/qint16/quint16/qint32) plus string. Nothing had to be skipped. (``tf.cast``
    to most of the new types is unimplemented on CPU, hence constants.) Not covered: resource
    and variant, which SaveV2 does not take as plain values.
    """
    rng = rng or np.random.default_rng(RNG_SEED)
    v: dict[str, np.ndarray] = {}
    for name in ["float16", "float32", "float64"]:
        v[name] = random_floats(name, (5, 7), rng)
    v["bfloat16"] = random_floats(ml_dtypes.bfloat16, (3, 11), rng)
    for name in ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]:
        v[name] = random_ints(name, (4, 3, 2), rng)
    v["bool"] = rng.integers(0, 2, size=(9,)).astype(bool)
    v["complex64"] = random_complex(np.complex64, (6,), rng)
    v["complex128"] = random_complex(np.complex128, (2, 3), rng)
    v["string"] = np.array(STRINGS_1D, dtype=object)
    v["string_2d"] = np.array([[b"ab", b"", b"\xff"], [b"c" * 300, b"\x00", b"z"]], dtype=object)
    v["string_scalar"] = np.array(b"a scalar \xc3\x28", dtype=object)
    v["string_empty_scalar"] = np.array(b"", dtype=object)
    v["string_zero_size"] = np.array([], dtype=object).reshape(0, 2)
    v["scalar_float32"] = np.array(-0.0, dtype=np.float32)
    v["scalar_int64"] = np.array(-(2**62) - 5, dtype=np.int64)
    v["scalar_bool"] = np.array(True)
    v["scalar_complex128"] = np.array(1.5 - 2.5j)
    v["zero_size_float32"] = np.zeros((0,), dtype=np.float32)
    v["zero_size_int64_3x0"] = np.zeros((3, 0), dtype=np.int64)
    v["zero_size_bfloat16_0x2x0"] = np.zeros((0, 2, 0), dtype=ml_dtypes.bfloat16)
    for name in [
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e4m3b11fnuz",
        "float8_e5m2fnuz",
    ]:
        v[name] = random_floats(getattr(ml_dtypes, name), (4, 5), rng)
    v["float4_e2m1fn"] = rng.integers(0, 16, size=(7,), dtype=np.uint8).view(
        ml_dtypes.float4_e2m1fn
    )
    v["int4"] = np.arange(-8, 8).astype(ml_dtypes.int4).reshape(4, 4)
    v["uint4"] = np.arange(0, 16).astype(ml_dtypes.uint4)
    v["int2"] = np.array([-2, -1, 0, 1, 1, 0], dtype=ml_dtypes.int2)
    v["uint2"] = np.array([0, 1, 2, 3, 3], dtype=ml_dtypes.uint2)
    for q, base in [
        ("qint8", np.int8),
        ("quint8", np.uint8),
        ("qint16", np.int16),
        ("quint16", np.uint16),
        ("qint32", np.int32),
    ]:
        v[q] = random_ints(base, (3, 4), rng).view(tf.as_dtype(q).as_numpy_dtype)
    return v


def tf_dtype_for(arr: np.ndarray) -> tf.dtypes.DType:
    if arr.dtype == object:
        return tf.string
    return tf.as_dtype(arr.dtype)


def to_tf_tensor(arr: np.ndarray) -> tf.Tensor:
    return tf.constant(arr, dtype=tf_dtype_for(arr))


# ---------------------------------------------------------------- the TensorFlow writers


def write_tf1_saver(d: Path) -> TFCheckpoint:
    """TF1 graph-mode Saver: a few variables in nested scopes, dtypes a TF1 model would have."""
    rng = np.random.default_rng(1)
    prefix = str(d / "model.ckpt")
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("encoder"):
            with tf.compat.v1.variable_scope("layer_0"):
                tf.compat.v1.get_variable(
                    "kernel", initializer=random_floats(np.float32, (8, 16), rng)
                )
                tf.compat.v1.get_variable(
                    "bias", initializer=rng.standard_normal(16).astype(np.float32)
                )
            with tf.compat.v1.variable_scope("layer_1/attention"):
                tf.compat.v1.get_variable(
                    "w", initializer=rng.standard_normal((16, 4)).astype(np.float64)
                )
        with tf.compat.v1.variable_scope("embedding"):
            tf.compat.v1.get_variable(
                "table", initializer=rng.standard_normal((50, 3)).astype(np.float16)
            )
        tf.compat.v1.get_variable("global_step", initializer=np.int64(1234), trainable=False)
        tf.compat.v1.get_variable("vocab_flags", initializer=rng.integers(0, 2, 10).astype(bool))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            out = saver.save(sess, prefix, write_meta_graph=False)
    assert out == prefix
    return TFCheckpoint("tf1_saver", prefix, prefix)


def write_tf1_sharded(d: Path) -> TFCheckpoint:
    """Saver(sharded=True) over two CPU devices: one data file per device."""
    rng = np.random.default_rng(2)
    prefix = str(d / "sharded.ckpt")
    with tf.Graph().as_default():
        with tf.device("/cpu:0"):
            tf.compat.v1.get_variable(
                "dev0/w", initializer=rng.standard_normal((20, 10)).astype(np.float32)
            )
            tf.compat.v1.get_variable("dev0/step", initializer=np.int32(7))
        with tf.device("/cpu:1"):
            tf.compat.v1.get_variable(
                "dev1/w", initializer=rng.standard_normal((30,)).astype(np.float64)
            )
            tf.compat.v1.get_variable("dev1/ids", initializer=np.arange(100, dtype=np.int64))
        saver = tf.compat.v1.train.Saver(sharded=True)
        config = tf.compat.v1.ConfigProto(device_count={"CPU": 2})
        with tf.compat.v1.Session(config=config) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            out = saver.save(sess, prefix, write_meta_graph=False)
    assert out == prefix
    files = data_files(prefix)
    assert [f.name for f in files] == [
        "sharded.ckpt.data-00000-of-00002",
        "sharded.ckpt.data-00001-of-00002",
    ], files
    return TFCheckpoint("tf1_sharded", prefix, prefix)


def write_tf1_partitioned(d: Path) -> TFCheckpoint:
    """TF1 partitioned variables: 1-D in 3 parts, 2-D on axis 0 with uneven rows, 2-D on axis 1."""
    prefix = str(d / "partitioned.ckpt")
    with tf.Graph().as_default():
        # Partitioned variables need a full shape and an initializer that works per part.
        normal = tf.compat.v1.random_normal_initializer(seed=3)
        tf.compat.v1.get_variable(
            "vec",
            shape=[12],
            initializer=normal,
            partitioner=tf.compat.v1.fixed_size_partitioner(3),
        )
        tf.compat.v1.get_variable(  # 10 rows in 3 parts: 4, 3, 3
            "emb/table",
            shape=[10, 4],
            initializer=normal,
            partitioner=tf.compat.v1.fixed_size_partitioner(3),
        )
        tf.compat.v1.get_variable(  # axis 1: 7 columns in 2 parts: 4, 3
            "wide",
            shape=[5, 7],
            dtype=tf.int64,
            initializer=tf.compat.v1.random_uniform_initializer(-1000, 1000, seed=4),
            partitioner=tf.compat.v1.fixed_size_partitioner(2, axis=1),
        )
        tf.compat.v1.get_variable("plain", initializer=np.arange(6, dtype=np.int32))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.save(sess, prefix, write_meta_graph=False)
    return TFCheckpoint(
        "tf1_partitioned", prefix, prefix, {"partitioned": ["emb/table", "vec", "wide"]}
    )


WEIRD_NAME = "we\x00ird\x01name/\u00e9"


def write_savev2_slices(d: Path) -> TFCheckpoint:
    """tf.raw_ops.SaveV2 with shape_and_slices: row slices, column slices, a 2x2 grid, and plain tensors."""
    rng = np.random.default_rng(4)
    prefix = str(d / "slices")
    emb = rng.standard_normal((10, 4)).astype(np.float32)
    cols = np.arange(48, dtype=np.int32).reshape(6, 8)
    grid = rng.standard_normal((4, 6)).astype(np.float64)
    cube = rng.standard_normal((3, 4, 5)).astype(ml_dtypes.bfloat16)
    # TF's CheckpointReader cannot reassemble sliced half/uint16/uint32/uint64/string tensors
    # ("Dtype half not supported"); these two are checked against the values written instead.
    half = random_floats(np.float16, (5, 3), rng)
    weird = rng.standard_normal((6, 2)).astype(np.float32)
    strs = np.array([[b"a", b""], [b"\xff" * 3, b"long" * 100], [b"x", b"y"]], dtype=object)
    names, specs, vals = [], [], []

    def add(name, spec, val):
        names.append(name)
        specs.append(spec)
        vals.append(tf.constant(val))

    add("emb", "10 4 0,4:-", emb[0:4])
    add("emb", "10 4 4,6:-", emb[4:10])
    add("cols", "6 8 -:0,3", cols[:, 0:3])
    add("cols", "6 8 -:3,5", cols[:, 3:8])
    for r0, c0 in [(0, 0), (0, 3), (2, 0), (2, 3)]:
        add("grid", f"4 6 {r0},2:{c0},3", grid[r0 : r0 + 2, c0 : c0 + 3])
    add("cube", "3 4 5 -:0,1:-", cube[:, 0:1])
    add("cube", "3 4 5 -:1,3:-", cube[:, 1:4])
    add("half", "5 3 0,2:-", half[0:2])
    add("half", "5 3 2,3:-", half[2:5])
    add("strs", "3 2 -:0,1", strs[:, 0:1])
    add("strs", "3 2 -:1,1", strs[:, 1:2])
    # NUL and other low bytes in a name: escaped in the slice keys (OrderedCode).
    add(WEIRD_NAME, "6 2 0,3:-", weird[0:3])
    add(WEIRD_NAME, "6 2 3,3:-", weird[3:6])
    add("plain\x00nul", "", np.arange(3, dtype=np.uint8))
    add("plain_a", "", rng.standard_normal(5).astype(np.float32))
    add("plain_b", "", np.array([b"x", b"yy"], dtype=object))
    add("plain_scalar", "", np.int64(42))
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=specs, tensors=vals)
    return TFCheckpoint(
        "savev2_slices",
        prefix,
        prefix,
        {
            "partitioned": ["cols", "cube", "emb", "grid", "half", "strs", WEIRD_NAME],
            "full": {
                "emb": emb,
                "cols": cols,
                "grid": grid,
                "cube": cube,
                "half": half,
                "strs": strs,
                WEIRD_NAME: weird,
            },
            "tf_cannot_read": {"half": half, "strs": strs},
        },
    )


def write_all_dtypes(d: Path) -> TFCheckpoint:
    prefix = str(d / "dtypes")
    values = numpy_values()
    _save_v2(prefix, {k: to_tf_tensor(v) for k, v in values.items()})
    return TFCheckpoint("all_dtypes", prefix, prefix, {"values": values})


MANY_TENSORS = 20_000


def many_tensor_names(n=MANY_TENSORS) -> list[str]:
    return [f"tower_{i % 7}/block_{i:05d}/sublayer/kernel" for i in range(n)]


def write_many_tensors(d: Path) -> TFCheckpoint:
    """20 000 small tensors: an index of several data blocks (TF cuts them at ~256 KiB)."""
    prefix = str(d / "many")
    names = many_tensor_names()
    dtypes = [np.int32, np.float32, np.int8, np.float64]
    tensors = [
        tf.constant(np.full((i % 3, 2), i % 101, dtype=dtypes[i % 4])) for i in range(len(names))
    ]
    tf.raw_ops.SaveV2(
        prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
    )
    assert (
        os.path.getsize(prefix + ".index") > 3 * 256 * 1024
    )  # so the index has several data blocks
    return TFCheckpoint("many_tensors", prefix, prefix)


def make_keras_model():
    import keras

    keras.utils.set_random_seed(7)
    model = keras.Sequential(
        [
            keras.Input((6, 6, 2)),
            keras.layers.Conv2D(3, 3, name="conv"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.Flatten(),
            keras.layers.Dense(4, name="dense"),
        ]
    )
    optimizer = keras.optimizers.Adam(1e-2)
    model.compile(optimizer=optimizer, loss="mse")
    return model, optimizer


def write_keras_manager(d: Path) -> TFCheckpoint:
    """TF2 object-based checkpoint of a Keras model + Adam, two CheckpointManager saves."""
    rng = np.random.default_rng(5)
    model, optimizer = make_keras_model()
    x = rng.random((8, 6, 6, 2), dtype=np.float32)
    y = rng.random((8, 4), dtype=np.float32)
    model.fit(x, y, epochs=1, batch_size=4, verbose=0)
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(ckpt, str(d), max_to_keep=5)
    first = manager.save()
    model.fit(x, y, epochs=1, batch_size=4, verbose=0)
    latest = manager.save()
    assert first != latest and tf.train.latest_checkpoint(str(d)) == latest
    state = (d / "checkpoint").read_text()
    assert 'model_checkpoint_path: "ckpt-2"' in state, state  # relative paths
    weights = [v.numpy() for v in model.weights]
    opt_vars = [v.numpy() for v in optimizer.variables]
    return TFCheckpoint(
        "keras_manager",
        str(d),
        latest,
        {"first": first, "weights": weights, "optimizer_variables": opt_vars},
    )


def write_max_shard_policy(d: Path) -> TFCheckpoint:
    """TF2 Checkpoint with MaxShardSizePolicy small enough to split tensors over shards."""
    rng = np.random.default_rng(6)
    variables = {
        "big": tf.Variable(rng.standard_normal(300).astype(np.float32)),
        "matrix": tf.Variable(rng.standard_normal((20, 30)).astype(np.float32)),
        "small": tf.Variable(np.arange(10, dtype=np.int64)),
        "half": tf.Variable(rng.standard_normal((7, 9)).astype(np.float16)),
        "name": tf.Variable(b"a string variable"),
    }
    ckpt = tf.train.Checkpoint(**variables)
    policy = tf.train.experimental.MaxShardSizePolicy(max_shard_size=1000)
    prefix = ckpt.write(
        str(d / "policy"), options=tf.train.CheckpointOptions(experimental_sharding_callback=policy)
    )
    assert len(data_files(prefix)) >= 3, data_files(prefix)
    return TFCheckpoint(
        "max_shard_policy",
        prefix,
        prefix,
        {"partitioned": ["big/.ATTRIBUTES/VARIABLE_VALUE", "matrix/.ATTRIBUTES/VARIABLE_VALUE"]},
    )


class _Module(tf.Module):
    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(8)
        self.w = tf.Variable(rng.standard_normal((2, 3)).astype(np.float32))
        self.b = tf.Variable(np.array([1, 2, 3], dtype=np.int64))
        self.tables = {
            "names": tf.Variable([b"alpha", b"", b"\xff\xfe"]),
            "scale": tf.Variable(0.5),
        }

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    def __call__(self, x):
        return tf.matmul(x, self.w)


def write_saved_model(d: Path) -> TFCheckpoint:
    path = d / "saved_model"
    tf.saved_model.save(_Module(), str(path))
    prefix = str(path / "variables" / "variables")
    assert os.path.exists(prefix + ".index")
    return TFCheckpoint("saved_model", str(path), prefix)


def write_tf1_state_absolute(d: Path) -> TFCheckpoint:
    """TF1 Saver with global_step, saved twice: the state file holds absolute paths."""
    prefix = str(d / "train" / "model.ckpt")
    (d / "train").mkdir()
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("v", initializer=np.zeros(4, np.float32))
        inc = v.assign_add(np.ones(4, np.float32))
        saver = tf.compat.v1.train.Saver(max_to_keep=5)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(inc)
            saver.save(sess, prefix, global_step=1, write_meta_graph=False)
            sess.run(inc)
            latest = saver.save(sess, prefix, global_step=2, write_meta_graph=False)
    state = (d / "train" / "checkpoint").read_text()
    assert f'model_checkpoint_path: "{latest}"' in state and os.path.isabs(latest), state
    return TFCheckpoint("tf1_state_absolute", str(d / "train"), latest)


def write_corruptible(d: Path) -> TFCheckpoint:
    """A few numeric tensors only (no strings), so any flipped data byte lands in tensor values."""
    rng = np.random.default_rng(9)
    prefix = str(d / "numbers")
    _save_v2(
        prefix,
        {
            "a": tf.constant(rng.standard_normal(100).astype(np.float32)),
            "b": tf.constant(rng.integers(0, 1000, (30, 10), dtype=np.int64)),
            "c": tf.constant(rng.standard_normal(50).astype(np.float64)),
        },
    )
    return TFCheckpoint("corruptible", prefix, prefix)


WRITERS = {
    "tf1_saver": write_tf1_saver,
    "tf1_sharded": write_tf1_sharded,
    "tf1_partitioned": write_tf1_partitioned,
    "savev2_slices": write_savev2_slices,
    "all_dtypes": write_all_dtypes,
    "many_tensors": write_many_tensors,
    "keras_manager": write_keras_manager,
    "max_shard_policy": write_max_shard_policy,
    "saved_model": write_saved_model,
    "tf1_state_absolute": write_tf1_state_absolute,
    "corruptible": write_corruptible,
}


# ---------------------------------------------------------------- comparing with TensorFlow


def tf_tensor(reader, key: str, case: TFCheckpoint | None = None, dtype=None) -> np.ndarray:
    """``reader.get_tensor(key)`` as an ndarray: scalars (TF returns numpy scalars, and ``bytes``
    for strings) as 0-d arrays; with ``dtype`` (the TF dtype), quantized values in the structured
    numpy dtype TF names for them (TF's reader returns the plain integer type).

    For the few tensors TensorFlow's reader cannot return, the values ``case`` was written with.
    """
    if case is not None and key in case.extra.get("tf_cannot_read", {}):
        return case.extra["tf_cannot_read"][key]
    value = reader.get_tensor(key)
    if isinstance(value, bytes):
        return np.array(value, dtype=object)
    value = np.asarray(value)
    if dtype is not None and tf.as_dtype(dtype).is_quantized:
        assert value.dtype == numpy_dtype(dtype)[0], (key, value.dtype)
        value = value.view(numpy_dtype(dtype))
    return value


def numpy_dtype(tf_dtype) -> np.dtype:
    """The numpy dtype tfckpt must return for a TF dtype: quantized types as TF's structured dtypes.

    (TF's own reader returns plain ints for those; the bytes are the same.)
    """
    return np.dtype(tf.as_dtype(tf_dtype).as_numpy_dtype)


def mismatch(got, want: np.ndarray, want_dtype: np.dtype) -> str | None:
    """Why ``got`` is not bit-identical to ``want`` (of dtype ``want_dtype``), or None if it is."""
    if not isinstance(got, np.ndarray):
        return f"got a {type(got).__name__}, not a numpy array"
    if got.dtype != want_dtype:
        return f"dtype {got.dtype!r}, expected {want_dtype!r}"
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if want_dtype is object or want_dtype == np.dtype(object):
        g, w = got.ravel().tolist(), want.ravel().tolist()
        bad_types = [type(x).__name__ for x in g if type(x) is not bytes]
        if bad_types:
            return f"string elements must be bytes, got {sorted(set(bad_types))}"
        if g != w:
            i = next(i for i, (a, b) in enumerate(zip(g, w)) if a != b)
            return f"string element {i}: {g[i][:40]!r}... expected {w[i][:40]!r}..."
        return None
    gb, wb = got.tobytes(), want.tobytes()
    if gb != wb:
        i = next(i for i, (a, b) in enumerate(zip(gb, wb)) if a != b)
        elem = i // want_dtype.itemsize
        return (
            f"bytes differ first at byte {i} (flat element {elem}: "
            f"{got.ravel()[elem]!r}, expected {want.ravel()[elem]!r})"
        )
    return None


def report(failures: dict[str, str], what: str) -> str:
    lines = [f"{len(failures)} {what}:"] + [f"  {k!r}: {v}" for k, v in list(failures.items())[:25]]
    if len(failures) > 25:
        lines.append(f"  ... and {len(failures) - 25} more")
    return "\n".join(lines)
