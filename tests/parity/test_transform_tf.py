"""The transform engine (convert / rename / select / merge) held to real TensorFlow's word:
every result is restored by TensorFlow itself (TF1 ``Saver``, TF2 ``tf.train.Checkpoint``,
Keras 3 models) and compared bit-exactly with what TensorFlow computes (``tf.cast``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import tf_checkpoints as tfc  # noqa: E402  (conftest put tests/ on sys.path)
import transform_helpers as th  # noqa: E402

import tfckpt  # noqa: E402
from tfckpt import CheckpointError  # noqa: E402
from tfckpt.rewrite.cast import CastCounts  # noqa: E402

OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"


@pytest.fixture(scope="module")
def tmp_module(tmp_path_factory):
    return tmp_path_factory.mktemp("transform_tf")


def mkdir(base: Path, name: str) -> Path:
    d = base / name
    d.mkdir()
    return d


# ---------------------------------------------------------------- 1. TF1 float32 -> float16


@pytest.fixture(scope="module")
def tf1_float32(tmp_module):
    return th.write_tf1_float32(mkdir(tmp_module, "tf1_float32"))


def test_tf1_convert_float16_restores_with_plain_saver(tf1_float32, tmp_path):
    prefix, values = tf1_float32
    before = th.digests(Path(prefix).parent)
    out_dir = tmp_path / "fp16"
    summary = tfckpt.convert(prefix, f"{out_dir}/", "float16")

    assert summary.dst == str(out_dir / "model.ckpt-1234")  # the source's name, in the directory
    assert (summary.kept, summary.cast, summary.renamed, summary.dropped) == (5, 4, 0, 0)
    assert tf.train.latest_checkpoint(str(out_dir)) == summary.dst  # state file written
    assert th.tf_dtypes(summary.dst) == {
        k: "int64" if k == "global_step" else "float16" for k in values
    }
    bias_counts = summary.cast_counts["dense/bias"]
    assert (bias_counts.overflow, bias_counts.to_zero, bias_counts.subnormal) == (0, 0, 1)

    restored = th.tf1_restore(summary.dst, th.specs_of(values, tf.float16))
    for name, want in values.items():
        expect = want if want.dtype == np.int64 else want.astype(np.float16)
        assert restored[name].dtype == expect.dtype, name
        assert restored[name].tobytes() == expect.tobytes(), name
    assert int(restored["global_step"]) == 1234
    # The graph really is float16: TF refuses to restore the float32 original into it.
    with pytest.raises(tf.errors.OpError, match="dtype"):
        th.tf1_restore(prefix, th.specs_of(values, tf.float16))
    assert th.digests(Path(prefix).parent) == before


def test_tf1_mixed_dtypes_to_float16_match_tf_cast(tf_checkpoints, tmp_path):
    """The shared TF1 Saver checkpoint (float32 with NaN/inf/extremes, float64, float16, int64,
    bool): converted with overflow='inf', restored into a float16 graph, equal to tf.cast."""
    case = tf_checkpoints("tf1_saver")
    reader = tf.train.load_checkpoint(case.prefix)
    dtypes, shapes = reader.get_variable_to_dtype_map(), reader.get_variable_to_shape_map()
    originals = {k: np.asarray(reader.get_tensor(k)) for k in dtypes}
    summary = tfckpt.convert(case.prefix, tmp_path / "half", "float16", overflow="inf")
    specs = {k: (tf.float16 if dt.is_floating else dt, shapes[k]) for k, dt in dtypes.items()}
    restored = th.tf1_restore(summary.dst, specs)
    for name, src in originals.items():
        got = restored[name]
        if not dtypes[name].is_floating or dtypes[name] == tf.float16:
            assert got.dtype == src.dtype and got.tobytes() == src.tobytes(), name
            continue
        want = tf.cast(tf.constant(src), tf.float16).numpy()
        assert not th.float_mismatches(got, want, src), (name, th.float_mismatches(got, want, src))
        overflowed = np.isfinite(src) & ~np.isfinite(want.astype(np.float64))
        assert summary.cast_counts[name].overflow == int(overflowed.sum()), name
    assert summary.cast_counts["encoder/layer_0/kernel"].overflow >= 2  # float32 max and min


# ---------------------------------------------------------------- 2. Keras 3 -> float16 / bfloat16


@pytest.fixture(scope="module")
def keras_base():
    """An untrained instance of the architecture of the shared ``keras_manager`` checkpoint."""
    model, _ = tfc.make_keras_model()
    return model


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_keras_convert_restores_into_half_model(dtype, tf_checkpoints, keras_base, tmp_path):
    case = tf_checkpoints("keras_manager")
    trained = case.extra["weights"]
    summary = tfckpt.convert(case.prefix, f"{tmp_path}/", dtype)
    assert summary.dst == str(tmp_path / Path(case.prefix).name)
    # Every floating-point tensor (weights and optimizer slots) was cast; the step was
    # not, nor the learning rate: training bookkeeping, float32 in a model of any dtype.
    rate = "optimizer/_learning_rate/.ATTRIBUTES/VARIABLE_VALUE"
    for key, dt in th.tf_dtypes(summary.dst).items():
        assert dt in (dtype, "int64", "string") or (key, dt) == (rate, "float32"), (key, dt)
    assert summary.bookkeeping_kept == {"float32": 1}

    model = th.keras_like(keras_base, dtype)
    assert [w.dtype for w in model.weights] == [dtype] * len(trained)
    tf.train.Checkpoint(model=model).restore(summary.dst).assert_existing_objects_matched()
    for w, orig in zip(model.weights, trained):
        want = (
            orig.astype(np.float16)
            if dtype == "float16"
            else tf.cast(tf.constant(orig), tf.bfloat16).numpy()
        )
        assert w.numpy().dtype == want.dtype and w.numpy().tobytes() == want.tobytes(), w.path

    # The half model really is half: TF refuses the float32 original.
    with pytest.raises(tf.errors.OpError, match="dtype"):
        tf.train.Checkpoint(model=th.keras_like(keras_base, dtype)).restore(case.prefix)


# ---------------------------------------------------------------- 3. select + rename (TF1)


@pytest.fixture(scope="module")
def simple_conv(tmp_module):
    return th.write_tf1_simple_conv(mkdir(tmp_module, "simple_conv"))


COMPLEX = {
    "complex-conv1/weights": "simple-conv1/weights",
    "complex-conv1/biases": "simple-conv1/biases",
}


@pytest.mark.parametrize("how", ["transform", "select_then_rename", "rename_exact"])
def test_tf1_select_and_rename(how, simple_conv, tmp_path):
    prefix, values = simple_conv
    out = str(tmp_path / "new" / "model.ckpt")
    include = [r"^simple-conv1/(weights|biases)$"]
    if how == "transform":
        summary = tfckpt.transform(
            prefix, out, include=include, rename={"simple-conv1/": "complex-conv1/"}
        )
        assert (summary.kept, summary.renamed, summary.dropped) == (2, 2, len(values) - 2)
    elif how == "select_then_rename":
        mid = str(tmp_path / "mid" / "model.ckpt")
        tfckpt.select(prefix, mid, include=include)
        tfckpt.rename(mid, out, [(r"simple-conv(\d)/", r"complex-conv\1/")])
    else:
        tfckpt.transform(
            prefix,
            out,
            include=include,
            rename_exact={old: new for new, old in COMPLEX.items()},
            rename={"simple-conv1/": "wrong/"},
        )  # exact names are tried first

    # The output holds those two tensors and nothing else.
    assert [n for n, _ in tf.train.list_variables(out)] == sorted(COMPLEX)
    specs = {new: (tf.float32, values[old].shape) for new, old in COMPLEX.items()}
    restored = th.tf1_restore(out, specs)
    for new, old in COMPLEX.items():
        assert restored[new].tobytes() == values[old].tobytes(), new
    # A plain Saver fails on a checkpoint that lacks one of its variables: the source.
    with pytest.raises(tf.errors.NotFoundError):
        th.tf1_restore(prefix, specs)


# ---------------------------------------------------------------- 4. merge


@pytest.fixture(scope="module")
def merge_sources(tmp_module):
    return th.write_tf1_merge_sources(mkdir(tmp_module, "merge"))


def test_tf1_merge_by_name(merge_sources, tmp_path):
    (pa, va), (pb, vb) = merge_sources["a"], merge_sources["b"]
    summary = tfckpt.merge([pa, pb], f"{tmp_path}/")
    assert summary.dst == str(tmp_path / "model.ckpt") and summary.kept == 5
    union = {**va, **vb}
    assert [n for n, _ in tf.train.list_variables(summary.dst)] == sorted(union)
    restored = th.tf1_restore(summary.dst, th.specs_of(union))
    for name, want in union.items():
        assert restored[name].dtype == want.dtype and restored[name].tobytes() == want.tobytes()


def test_tf1_merge_clash_refused(merge_sources, tmp_path):
    pa, pc = merge_sources["a"][0], merge_sources["c"][0]
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(CheckpointError) as e:
        tfckpt.merge([pa, pc], out / "merged")
    msg = str(e.value)
    assert pa in msg and pc in msg and "enc/kernel" in msg, msg
    assert th.listing(out) == []


@pytest.mark.parametrize("prefer", ["first", "last"])
def test_tf1_merge_clash_prefer(prefer, merge_sources, tmp_path):
    (pa, va), (pc, vc) = merge_sources["a"], merge_sources["c"]
    summary = tfckpt.merge([pa, pc], tmp_path / "merged", prefer=prefer)
    union = {**va, **vc}
    restored = th.tf1_restore(summary.dst, th.specs_of(union))
    winner = va if prefer == "first" else vc
    assert restored["enc/kernel"].tobytes() == winner["enc/kernel"].tobytes()
    assert va["enc/kernel"].tobytes() != vc["enc/kernel"].tobytes()
    for name in ("enc/bias", "global_step", "head/w"):
        assert restored[name].tobytes() == union[name].tobytes(), name
    assert summary.dropped == 1 and summary.kept == 4


@pytest.fixture(scope="module")
def tf2_pair(tmp_module):
    return th.write_tf2_pair(mkdir(tmp_module, "tf2_pair"))


def test_tf2_merge_restores_with_assert_consumed(tf2_pair, tmp_path):
    pa, pb, va, vb = tf2_pair
    summary = tfckpt.merge([pa, pb], tmp_path / "both" / "ckpt")
    a = tf.Variable(np.zeros_like(va))
    b = tf.Variable(np.zeros_like(vb))
    ckpt = tf.train.Checkpoint(a=a, b=b)
    ckpt.restore(summary.dst).assert_consumed()
    assert a.numpy().tobytes() == va.tobytes() and b.numpy().tobytes() == vb.tobytes()
    assert int(ckpt.save_counter.numpy()) == 1  # the first source's save_counter is kept
    assert tf.train.latest_checkpoint(str(tmp_path / "both")) == summary.dst


PREFER_TF2_BUG = (
    "BUG: prefer='first'/'last' cannot resolve a clash between two TF2 checkpoints whose roots "
    "have a child of the same name: tf.train.Checkpoint(a=..., x=...).save() merged with "
    "tf.train.Checkpoint(a=..., y=...).save() and prefer='last' raises CheckpointError 'both "
    "<src1> and <src2> have a root object named 'a'' (ObjectGraph.merge) instead of taking "
    "'a' from the preferred source; without prefer it asks for prefer."
)


@pytest.mark.parametrize("prefer", ["first", "last"])
def test_tf2_merge_clash_prefer(prefer, tmp_path):
    one = {"a": np.array([1.0, 2.0], np.float32), "x": np.array(3, np.int64)}
    two = {"a": np.array([5.0, 6.0], np.float32), "y": np.array(4, np.int64)}
    p1 = tf.train.Checkpoint(**{k: tf.Variable(v) for k, v in one.items()}).save(
        str(tmp_path / "one" / "ckpt")
    )
    p2 = tf.train.Checkpoint(**{k: tf.Variable(v) for k, v in two.items()}).save(
        str(tmp_path / "two" / "ckpt")
    )
    with pytest.raises(CheckpointError, match="prefer"):
        tfckpt.merge([p1, p2], tmp_path / "refused")
    summary = tfckpt.merge([p1, p2], tmp_path / "merged" / "ckpt", prefer=prefer)
    variables = {k: tf.Variable(np.zeros_like(v)) for k, v in {**one, **two}.items()}
    tf.train.Checkpoint(**variables).restore(summary.dst).assert_consumed()
    winner = one if prefer == "first" else two
    assert variables["a"].numpy().tobytes() == winner["a"].tobytes()
    assert int(variables["x"].numpy()) == 3 and int(variables["y"].numpy()) == 4


def test_merge_tf2_sharded_with_tf2_and_cast(tf2_pair, tf2_sharded, tmp_path):
    """Two TF2 layouts (1 shard + several with slices) merged, cast, restored by TF."""
    pa, _, va, _ = tf2_pair
    prefix, values = tf2_sharded
    summary = tfckpt.merge([pa, prefix], tmp_path / "m" / "ckpt", cast="bfloat16")
    with tfckpt.open(summary.dst) as out, tfckpt.open(prefix) as sharded:
        # The sources' shards laid over one another: the single shard joins the first.
        assert out.header.num_shards == sharded.header.num_shards
    variables = {
        k: tf.Variable(tf.zeros(v.shape, tf.bfloat16 if v.dtype.kind == "f" else v.dtype))
        for k, v in {**values, "a": va}.items()
    }
    tf.train.Checkpoint(**variables).restore(summary.dst).assert_consumed()
    for k, v in {**values, "a": va}.items():
        want = tf.cast(v, tf.bfloat16).numpy() if v.dtype.kind == "f" else v
        assert variables[k].numpy().tobytes() == want.tobytes(), k


# ---------------------------------------------------------------- 5. dropping TF2 objects


OPTIMIZER_STATE = ("optimizer/_iterations/", "optimizer/_learning_rate/", "optimizer/_variables/")


def test_drop_optimizer_keeps_every_model_weight(tf_checkpoints, keras_base, tmp_path):
    case = tf_checkpoints("keras_manager")
    orig_keys = {n for n, _ in tf.train.list_variables(case.prefix)}
    state = {k for k in orig_keys if k.startswith(OPTIMIZER_STATE)}
    # Iterations, learning rate, a momentum and a velocity per trainable weight.
    assert len(state) == 2 + 2 * len(
        [k for k in orig_keys if k.startswith("optimizer/_trainable_variables/")]
    )
    summary = tfckpt.select(case.prefix, f"{tmp_path}/", drop_objects=["optimizer"])

    keys = {n for n, _ in tf.train.list_variables(summary.dst)}
    assert keys == orig_keys - state
    # Keras 3 keys the kernels under the optimizer; they belong to the model and stay.
    assert sum(k.startswith("optimizer/_trainable_variables/") for k in keys) == 6
    graph = th.tf_object_graph(summary.dst)
    assert sorted(c.local_name for c in graph.nodes[0].children) == ["model", "save_counter"]
    assert not any(c.local_name == "optimizer" for n in graph.nodes for c in n.children)

    model = th.keras_like(keras_base, "float32")
    assert any(
        w.numpy().tobytes() != t.tobytes() for w, t in zip(model.weights, case.extra["weights"])
    )
    status = tf.train.Checkpoint(model=model).restore(summary.dst)
    status.assert_existing_objects_matched()
    status.assert_consumed()  # nothing of the optimizer is left over
    for w, want in zip(model.weights, case.extra["weights"]):
        assert w.numpy().tobytes() == want.tobytes(), w.path
    # The original is not consumable by a bare model (its optimizer objects are unmatched).
    with pytest.raises(AssertionError):
        tf.train.Checkpoint(model=th.keras_like(keras_base, "float32")).restore(
            case.prefix
        ).assert_consumed()


def test_exclude_by_key_prefix_would_lose_model_weights(tf_checkpoints, keras_base, tmp_path):
    """The difference drop_objects makes: excluding '^optimizer/' by key drops the kernels."""
    case = tf_checkpoints("keras_manager")
    summary = tfckpt.select(case.prefix, f"{tmp_path}/", exclude=["^optimizer/"])
    keys = {n for n, _ in tf.train.list_variables(summary.dst)}
    assert not any(k.startswith("optimizer/") for k in keys)
    model = th.keras_like(keras_base, "float32")
    init = [w.numpy() for w in model.weights]
    tf.train.Checkpoint(model=model).restore(summary.dst).expect_partial()
    restored = [
        w.path
        for w, t in zip(model.weights, case.extra["weights"])
        if w.numpy().tobytes() == t.tobytes()
    ]
    assert restored == ["bn/moving_mean", "bn/moving_variance"], restored
    unrestored = [w for w, i in zip(model.weights, init) if w.numpy().tobytes() == i.tobytes()]
    assert len(unrestored) == 6  # kernels, biases, gamma, beta: still their initial values


def test_drop_object_path_cuts_only_that_edge(tf_checkpoints, keras_base, tmp_path):
    """``model/optimizer`` cuts one edge; the optimizer is still reached from the root, so
    nothing is dropped. The bare name ``optimizer`` cuts both edges (previous tests)."""
    case = tf_checkpoints("keras_manager")
    orig_keys = {n for n, _ in tf.train.list_variables(case.prefix)}
    src_graph = th.tf_object_graph(case.prefix)
    model_node = next(c.node_id for c in src_graph.nodes[0].children if c.local_name == "model")
    assert "optimizer" in [c.local_name for c in src_graph.nodes[model_node].children]

    summary = tfckpt.select(case.prefix, f"{tmp_path}/", drop_objects=["model/optimizer"])
    assert {n for n, _ in tf.train.list_variables(summary.dst)} == orig_keys
    graph = th.tf_object_graph(summary.dst)
    root = {c.local_name: c.node_id for c in graph.nodes[0].children}
    assert sorted(root) == ["model", "optimizer", "save_counter"]
    assert "optimizer" not in [c.local_name for c in graph.nodes[root["model"]].children]
    model = th.keras_like(keras_base, "float32")
    tf.train.Checkpoint(model=model).restore(summary.dst).assert_existing_objects_matched()
    for w, want in zip(model.weights, case.extra["weights"]):
        assert w.numpy().tobytes() == want.tobytes(), w.path


def test_drop_object_errors(tf_checkpoints, tf1_float32, tmp_path):
    case = tf_checkpoints("keras_manager")
    with pytest.raises(CheckpointError, match="no_such_thing"):
        tfckpt.select(case.prefix, tmp_path / "a", drop_objects=["no_such_thing"])
    with pytest.raises(CheckpointError, match="object"):
        tfckpt.select(tf1_float32[0], tmp_path / "b", drop_objects=["optimizer"])
    assert th.listing(tmp_path) == []


# ---------------------------------------------------------------- 6. sharded TF2 with slices


@pytest.fixture(scope="module")
def tf2_sharded(tmp_module):
    return th.write_tf2_sharded(mkdir(tmp_module, "tf2_sharded"))


HALF_SLICES_BUG = (
    "BUG: tfckpt keeps a partitioned float32 tensor partitioned when casting it to float16, "
    "but TensorFlow cannot restore sliced float16 tensors (RestoreV2 -> BundleReader::"
    "GetSliceValue: 'Dtype half not supported'), so tf.train.Checkpoint.restore of the output "
    "fails. (TF2.21 cannot restore its own sliced float16 saves either.) The output must store "
    "float16 tensors unsliced for TF to read it."
)


@pytest.mark.parametrize("max_shard_bytes", [None, 700], ids=["keep_layout", "reshard"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sharded_tf2_convert(dtype, max_shard_bytes, tf2_sharded, tmp_path):
    prefix, values = tf2_sharded
    key = {name: f"{name}/.ATTRIBUTES/VARIABLE_VALUE" for name in values}
    with tfckpt.open(prefix) as src:
        src_shards = src.header.num_shards
        src_sliced = {k for k in src.keys() if src.info(k).slices}
    assert src_shards >= 3 and src_sliced == {key[n] for n in th.SHARDED_SHAPES}  # as TF wrote

    summary = tfckpt.convert(
        prefix, tmp_path / "out" / "ckpt", dtype, max_shard_bytes=max_shard_bytes
    )
    want = {
        n: tf.cast(tf.constant(v), dtype).numpy() if v.dtype.kind == "f" else v
        for n, v in values.items()
    }
    with tfckpt.open(summary.dst) as out:
        if dtype == "float16":
            # TensorFlow cannot reassemble float16 slices, so TF2 tensors are written whole.
            assert not any(out.info(k).slices for k in out.keys())
        else:
            assert {k for k in out.keys() if out.info(k).slices} == src_sliced
            assert all(len(out.info(k).slices) > 1 for k in src_sliced)
        if max_shard_bytes is None:
            # The source's layout, less the shards that held only slices now written whole.
            used = {part.shard for k in out.keys() for part in (out.slice_info(k) or [out.info(k)])}
            assert used == set(range(out.header.num_shards))
            if dtype == "float16":
                assert out.header.num_shards < src_shards
            else:
                assert out.header.num_shards == src_shards
        else:
            assert out.header.num_shards > 1
            # A shard exceeds the limit only when it holds a single tensor larger than it
            # (float16 tensors are whole here, see above).
            per_shard = {}
            for k in out.keys():
                for part in out.slice_info(k) or [out.info(k)]:
                    per_shard.setdefault(part.shard, []).append(part.nbytes)
            for i, f in enumerate(out.data_files):
                assert os.path.getsize(f) <= max_shard_bytes or len(per_shard[i]) == 1, f
        for n, w in want.items():  # tfckpt's own reading, before asking TensorFlow
            assert out.info(key[n]).dtype == tf.as_dtype(w.dtype).name
            assert out[key[n]].tobytes() == w.tobytes(), n

    variables = {
        n: tf.Variable(tf.zeros(v.shape, dtype=tf.as_dtype(w.dtype)))
        for (n, v), w in zip(values.items(), want.values())
    }
    tf.train.Checkpoint(**variables).restore(summary.dst).assert_consumed()
    for n, v in variables.items():
        assert v.numpy().tobytes() == want[n].tobytes(), n


def test_tf1_partitioned_rename_and_cast(tf_checkpoints, tmp_path):
    """TF1 partitioned variables: slices renamed and cast, restored into partitioned variables."""
    case = tf_checkpoints("tf1_partitioned")
    reader = tf.train.load_checkpoint(case.prefix)
    summary = tfckpt.transform(
        case.prefix, tmp_path / "part", cast="bfloat16", rename={"emb/": "embedding/"}
    )
    with tfckpt.open(summary.dst) as out, tfckpt.open(case.prefix) as src:
        assert out.info("embedding/table").slices == src.info("emb/table").slices
        assert out.info("wide").slices == src.info("wide").slices
    zeros = tf.compat.v1.zeros_initializer()
    with tf.Graph().as_default():
        parts = tf.compat.v1.fixed_size_partitioner
        emb = tf.compat.v1.get_variable(
            "embedding/table",
            shape=[10, 4],
            dtype=tf.bfloat16,
            initializer=zeros,
            partitioner=parts(3),
        )
        vec = tf.compat.v1.get_variable(
            "vec", shape=[12], dtype=tf.bfloat16, initializer=zeros, partitioner=parts(3)
        )
        wide = tf.compat.v1.get_variable(
            "wide", shape=[5, 7], dtype=tf.int64, initializer=zeros, partitioner=parts(2, axis=1)
        )
        plain = tf.compat.v1.get_variable("plain", shape=[6], dtype=tf.int32, initializer=zeros)
        with tf.compat.v1.Session() as sess:
            tf.compat.v1.train.Saver().restore(sess, summary.dst)
            got = sess.run(
                {
                    "emb": tf.concat(list(emb), 0),
                    "vec": tf.concat(list(vec), 0),
                    "wide": tf.concat(list(wide), 1),
                    "plain": plain,
                }
            )
    assert (
        got["emb"].tobytes()
        == tf.cast(reader.get_tensor("emb/table"), tf.bfloat16).numpy().tobytes()
    )
    assert got["vec"].tobytes() == tf.cast(reader.get_tensor("vec"), tf.bfloat16).numpy().tobytes()
    assert got["wide"].tobytes() == reader.get_tensor("wide").tobytes()
    assert got["plain"].tobytes() == reader.get_tensor("plain").tobytes()


def test_sliced_float16_made_readable_by_widening(tf_checkpoints, tmp_path):
    """SaveV2 slices of every kind; TF cannot read its own sliced float16 'half', but can once
    tfckpt has cast it to float32 (the slices are kept)."""
    case = tf_checkpoints("savev2_slices")
    summary = tfckpt.convert(case.prefix, tmp_path / "f32", "float32")
    full = case.extra["full"]
    reader = tf.train.load_checkpoint(summary.dst)
    dtypes = reader.get_variable_to_dtype_map()
    with tfckpt.open(summary.dst) as out:
        assert set(out.info("half").slices) == set(tfckpt.open(case.prefix).info("half").slices)
    for name in ["half", "cube", "grid", "emb", tfc.WEIRD_NAME]:
        src = full[name]
        want = (
            src.astype(np.float32) if src.dtype != np.float64 else tf.cast(src, tf.float32).numpy()
        )
        assert dtypes[name] == tf.float32, name
        got = reader.get_tensor(name)
        assert not th.float_mismatches(got, want, src), (name, th.float_mismatches(got, want, src))
    assert reader.get_tensor("cols").tobytes() == full["cols"].tobytes()


# ---------------------------------------------------------------- 7. casting exactness


@pytest.fixture(scope="module")
def cast_case(tmp_module):
    """Edge values of every float dtype, written by SaveV2; originals as TF reads them back."""
    rng = np.random.default_rng(16)
    tensors = {}
    for s in th.FLOATS:
        tensors[f"{s}/edges"] = th.cast_edge_values(s, rng, f32_subnormals=False)
        tensors[f"{s}/f32_subnormals"] = th.cast_edge_values(s, rng, f32_subnormals=True)
    prefix = th.save_v2(mkdir(tmp_module, "cast_edges") / "edges", tensors)
    originals = th.tf_reader_values(prefix)
    for k, v in tensors.items():
        assert originals[k].tobytes() == v.tobytes(), k
    return prefix, originals


@pytest.fixture(scope="module")
def converted(cast_case, tmp_module):
    """``converted(target)``: the cast_case checkpoint converted (overflow='inf'), read by TF."""
    prefix, _ = cast_case
    done = {}

    def get(target):
        if target not in done:
            summary = tfckpt.convert(
                prefix, tmp_module / f"cast_{target}" / "edges", target, overflow="inf"
            )
            done[target] = th.tf_reader_values(summary.dst), summary
        return done[target]

    return get


PAIRS = [(s, t) for s in th.FLOATS for t in th.FLOATS]


@pytest.mark.parametrize("source,target", PAIRS, ids=[f"{s}-{t}" for s, t in PAIRS])
def test_cast_matches_tf_cast(source, target, cast_case, converted):
    src = cast_case[1][f"{source}/edges"]
    got = converted(target)[0][f"{source}/edges"]
    assert got.dtype == th.NP_FLOAT[target]
    if source == target:
        assert got.tobytes() == src.tobytes()  # untouched, NaN payloads included
        return
    want = tf.cast(tf.constant(src), target).numpy()
    bad = th.float_mismatches(got, want, src)
    assert not bad, "\n".join(bad)


# TF's CPU kernels run with flush-to-zero / denormals-are-zero: a float32 subnormal becomes
# ±0 when converted to float64, and a float64 (or float64 -> float32 -> bfloat16) result in
# float32's subnormal range becomes ±0. tfckpt keeps these values exactly.
FTZ_BUG = (
    "BUG (differs from tf.cast): tf.cast on CPU flushes float32-range subnormals to "
    "±0 ({pair}); tfckpt keeps the exact subnormal value, e.g. {example}"
)
FTZ_EXAMPLES = {
    ("float32", "float64"): "float32 1e-40 -> float64 9.99994610111476e-41, TF gives 0.0",
    ("bfloat16", "float64"): "bfloat16 9.18355e-41 -> float64 9.183549615799121e-41, TF 0.0",
    ("float64", "float32"): "float64 1e-40 -> float32 1e-40 (subnormal), TF gives 0.0",
    ("float64", "bfloat16"): "float64 1e-40 -> bfloat16 9.18355e-41, TF gives 0",
}
SUB_PAIRS = [
    pytest.param(s, t, id=f"{s}-{t}") for s, t in PAIRS if s != t and s != "float16"
]  # float16 has no such values


@pytest.mark.parametrize("source,target", SUB_PAIRS)
def test_cast_float32_subnormals_match_tf_cast(source, target, cast_case, converted):
    """Equal to tf.cast, except where TensorFlow's CPU kernels flush float32-range
    subnormals to zero: there tfckpt gives the IEEE result (documented)."""
    src = cast_case[1][f"{source}/f32_subnormals"]
    assert src.size > 100 and not np.any(src.astype(np.float64) == 0)
    got = converted(target)[0][f"{source}/f32_subnormals"]
    if (source, target) in FTZ_EXAMPLES:
        tgt = tf.as_dtype(target).as_numpy_dtype
        narrow = source == "float64" and np.dtype(tgt).itemsize < 4
        want = (src.astype(np.float32) if narrow else src).astype(tgt)
        assert not np.array_equal(want, tf.cast(tf.constant(src), target).numpy()), (
            "TensorFlow no longer flushes these: compare with tf.cast again"
        )
    else:
        want = tf.cast(tf.constant(src), target).numpy()
    bad = th.float_mismatches(got, want, src)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("part", ["edges", "f32_subnormals"])
@pytest.mark.parametrize("target", th.FLOATS)
def test_tf_backend_gives_the_numpy_backends_bits(
    target, part, cast_case, converted, tmp_module, request
):
    """``backend='tf'`` (tf.cast for every tensor here) must write what the numpy backend
    writes, counts included ("The bits are the same either way", transform.execute)."""
    prefix, originals = cast_case
    out = tmp_module / f"tf_backend_{target}_{part}" / "edges"
    names = [k for k in originals if k.endswith("/" + part)]
    summary = tfckpt.transform(
        prefix,
        out,
        cast=target,
        overflow="inf",
        backend="tf",
        tf_threshold=0,
        include=[f"^{n}$" for n in names],
    )
    via_tf = th.tf_reader_values(summary.dst)
    via_numpy, numpy_summary = converted(target)
    differ = {
        n: f"{via_tf[n].size - int(np.sum(th.bits(via_tf[n]) == th.bits(via_numpy[n])))} elements"
        for n in names
        if via_tf[n].tobytes() != via_numpy[n].tobytes()
    }
    assert not differ, differ
    for n in summary.cast_counts:
        assert summary.cast_counts[n] == numpy_summary.cast_counts[n], n


@pytest.mark.parametrize("target", ["float16", "bfloat16"])
@pytest.mark.parametrize("chunk_bytes", [None, 1 << 20], ids=["parallel", "small_chunks"])
def test_cast_large_tensor_matches_tf_cast(target, chunk_bytes, tmp_path):
    """1.5M float32 elements: cast in parallel parts (one chunk) or in many small chunks; the
    first half has NaN/inf/overflow (general path), the second half none (fast path)."""
    rng = np.random.default_rng(18)
    edges = th.cast_edge_values("float32", rng, f32_subnormals=False)
    limit = 6e4 if target == "float16" else 3e38
    with np.errstate(invalid="ignore"):
        calm = edges[np.abs(np.nan_to_num(edges.astype(np.float64), nan=np.inf)) < limit]
    n = 1_500_000
    value = np.concatenate([np.resize(edges, n // 2), np.resize(calm[::-1], n - n // 2)])
    prefix = th.save_v2(tmp_path / "big", {"x": value})
    kwargs = {} if chunk_bytes is None else {"chunk_bytes": chunk_bytes}
    summary = tfckpt.convert(prefix, tmp_path / "out", target, overflow="inf", **kwargs)
    got = th.tf_reader_values(summary.dst)["x"]
    want = tf.cast(tf.constant(value), target).numpy()
    bad = th.float_mismatches(got, want, value)
    assert not bad, "\n".join(bad)
    w = want.astype(np.float64)
    tiny = float(ml_dtypes.finfo(th.NP_FLOAT[target]).smallest_normal)
    with np.errstate(invalid="ignore"):
        expect = CastCounts(
            overflow=int(np.sum(np.isfinite(value) & ~np.isfinite(w))),
            to_zero=int(np.sum((w == 0) & (value != 0))),
            subnormal=int(np.sum((np.abs(w) < tiny) & (w != 0))),
            elements=n,
        )
    assert summary.cast_counts["x"] == expect


NEAR_MAX = {  # (source, target): values in [max + ulp/2, max * (1 + 2**-(nmant+1))), and 1.0
    ("float32", "float16"): [1.0, 65520.0, -65520.0, 65535.0, 65519.996],
    ("float64", "float16"): [1.0, 65520.0, -65530.0, 65519.99],
    ("float32", "bfloat16"): [1.0, 3.3961775e38, -3.4e38, 3.3895e38],
    ("float64", "float32"): [1.0, 3.4028235677973366e38, -3.40282357e38, 3.4028235e38],
}
NEAR_MAX_BUG = (
    "BUG: values just beyond the target's largest finite value overflow silently. "
    "Caster's fast path (no NaN/inf, |x| < _overflow_at) skips overflow detection, but "
    "_overflow_at = max * (1 + 2**-(nmant+1)) is about max + 1 ulp, while values from max + "
    "ulp/2 already round to inf: e.g. float32 [1.0, 65520.0] -> float16 with the default "
    "overflow='error' writes [1, inf] without error, overflow='clip' writes inf instead of "
    "65504, and cast_counts report overflow=0 (same for float64 65520 -> float16, float32 "
    "3.3961775e38 -> bfloat16, float64 3.4028235677973366e38 -> float32)."
)


@pytest.fixture(scope="module")
def near_max_case(tmp_module):
    tensors = {f"{s}_to_{t}": np.array(v, dtype=th.NP_FLOAT[s]) for (s, t), v in NEAR_MAX.items()}
    prefix = th.save_v2(mkdir(tmp_module, "near_max") / "near", tensors)
    return prefix, th.tf_reader_values(prefix)


@pytest.mark.parametrize("source,target", list(NEAR_MAX), ids=[f"{s}-{t}" for s, t in NEAR_MAX])
def test_overflow_just_beyond_max(source, target, near_max_case, tmp_path):
    prefix, originals = near_max_case
    name = f"{source}_to_{target}"
    value = originals[name]
    want = tf.cast(tf.constant(value), target).numpy()
    over = np.isfinite(value) & ~np.isfinite(want.astype(np.float64))
    assert int(over.sum()) == len(value) - 2  # TensorFlow: all but 1.0 and the last overflow
    only = {"include": [f"^{name}$"], "cast": target}

    summary = tfckpt.transform(prefix, tmp_path / "inf", overflow="inf", **only)
    got = th.tf_reader_values(summary.dst)[name]
    assert not th.float_mismatches(got, want, value)
    assert summary.cast_counts[name].overflow == int(over.sum())

    summary = tfckpt.transform(prefix, tmp_path / "clip", overflow="clip", **only)
    got = th.tf_reader_values(summary.dst)[name].astype(np.float64)
    top = float(ml_dtypes.finfo(th.NP_FLOAT[target]).max)
    assert got[over].tolist() == np.where(np.signbit(value[over]), -top, top).tolist()

    out = tmp_path / "error"
    out.mkdir()
    with pytest.raises(CheckpointError, match=rf"{name} \({int(over.sum())} values\)"):
        tfckpt.transform(prefix, out / "x", **only)
    assert th.listing(out) == []


PLANTED_F32 = [
    70000.0,
    -70000.0,
    65520.0,
    1e5,  # overflow float16: 4
    65504.0,
    65519.99,
    1.0,
    -0.0,  # fine
    2.0**-25,
    1e-9,  # become zero: 2
    3 * 2.0**-25,
    6e-5,  # become subnormal: 2
    np.nan,
    np.inf,
    -np.inf,
]  # not counted
PLANTED_F64 = [1e300, -1e6, 0.5, 65504.0]  # overflow: 2
PLANTED_BF16 = [1e10, 0.5, -3e38]  # overflow: 2


@pytest.fixture(scope="module")
def overflow_case(tmp_module):
    tensors = {
        "a": np.array(PLANTED_F32, dtype=np.float32),
        "b": np.array(PLANTED_F64, dtype=np.float64),
        "c": np.array([1.0, 2.5, -3.0], dtype=np.float32),
        "d": np.array(PLANTED_BF16, dtype=ml_dtypes.bfloat16),
        "h": np.array([65504.0, -1.0, 2.0**-24], dtype=np.float16),
        "i": np.array([2**31 - 1, -5, 0], dtype=np.int32),
        "flag": np.array([True, False]),
        "s": np.array([b"text", b"\xff\x00"], dtype=object),
        "step": np.array(7, dtype=np.int64),
    }
    prefix = th.save_v2(mkdir(tmp_module, "overflow") / "ovf", tensors)
    return prefix, th.tf_reader_values(prefix)


def test_overflow_error_lists_tensors_and_writes_nothing(overflow_case, tmp_path):
    prefix, _ = overflow_case
    before = th.digests(Path(prefix).parent)
    out = tmp_path / "out"
    out.mkdir()
    for dst in (out / "sub" / "model", f"{out}/", out / "model"):
        with pytest.raises(CheckpointError) as e:
            tfckpt.convert(prefix, dst, "float16")
        msg = str(e.value)
        assert "a (4 values)" in msg and "b (2 values)" in msg and "d (2 values)" in msg, msg
        assert "c (" not in msg and "h (" not in msg, msg
        assert th.listing(out) == []  # no data files, no temporaries, no state file, no dirs
    # The bfloat16 tensor also overflows float8; ml_dtypes' float8 casts are plain IEEE ones.
    with pytest.raises(CheckpointError, match=r"a \(\d+ values\)"):
        tfckpt.convert(prefix, out / "f8", "float8_e5m2")
    assert th.listing(out) == []
    assert th.digests(Path(prefix).parent) == before


@pytest.mark.parametrize("policy", ["clip", "inf"])
def test_overflow_clip_and_inf(policy, overflow_case, tmp_path):
    prefix, src = overflow_case
    summary = tfckpt.convert(prefix, tmp_path / "out", "float16", overflow=policy)
    got = th.tf_reader_values(summary.dst)
    big = np.float16(65504.0) if policy == "clip" else np.float16(np.inf)
    for name in ("a", "b", "d"):
        s = src[name]
        want = tf.cast(tf.constant(s), tf.float16).numpy()
        over = np.isfinite(s.astype(np.float64)) & ~np.isfinite(want.astype(np.float64))
        want[over] = np.where(np.signbit(s.astype(np.float64)[over]), -big, big)
        assert not th.float_mismatches(got[name], want, s), (name, got[name], want)
    assert got["a"][:4].tolist() == [float(big), -float(big), float(big), float(big)]
    assert got["a"][-2:].tolist() == [np.inf, -np.inf]  # infinities are not overflow
    assert got["b"][:2].tolist() == [float(big), -float(big)]
    counts = summary.cast_counts
    assert counts["a"] == CastCounts(overflow=4, to_zero=2, subnormal=2, elements=15)
    assert counts["b"] == CastCounts(overflow=2, to_zero=0, subnormal=0, elements=4)
    assert counts["d"] == CastCounts(overflow=2, to_zero=0, subnormal=0, elements=3)
    assert counts["c"] == CastCounts(overflow=0, to_zero=0, subnormal=0, elements=3)
    assert set(counts) == {"a", "b", "c", "d"}  # float16, ints, bool, strings are not cast
    assert summary.to_dict()["overflow"] == {"a": 4, "b": 2, "d": 2}
    assert summary.to_dict()["to_zero"] == {"a": 2}
    assert summary.to_dict()["subnormal"] == {"a": 2}
    for name in ("h", "i", "flag", "s", "step"):
        assert got[name].dtype == src[name].dtype and got[name].tolist() == src[name].tolist()


def test_cast_from_limits_source_dtypes(overflow_case, tmp_path):
    prefix, src = overflow_case
    summary = tfckpt.convert(
        prefix, tmp_path / "out", "float16", cast_from=["float64"], overflow="clip"
    )
    assert summary.cast == 1 and set(summary.cast_counts) == {"b"}
    assert th.tf_dtypes(summary.dst) == {
        "a": "float32",
        "b": "float16",
        "c": "float32",
        "d": "bfloat16",
        "h": "float16",
        "i": "int32",
        "flag": "bool",
        "s": "string",
        "step": "int64",
    }
    got = th.tf_reader_values(summary.dst)
    for name, s in src.items():
        if name != "b":
            assert got[name].dtype == s.dtype, name
            assert (
                (got[name].tolist() == s.tolist())
                if s.dtype == object
                else got[name].tobytes() == s.tobytes()
            ), name


def test_output_next_to_source_keeps_its_state_file(tf_checkpoints, tmp_path):
    case = tf_checkpoints("tf1_state_absolute")
    work = tmp_path / "train"
    work.mkdir()
    for f in Path(case.path).iterdir():  # a private copy: this test writes into the directory
        (work / f.name).write_bytes(f.read_bytes())
    state = (work / "checkpoint").read_bytes()
    src = str(work / Path(case.prefix).name)
    summary = tfckpt.convert(src, work / "half", "float16")
    assert (work / "checkpoint").read_bytes() == state  # the source's state file, untouched
    assert tf.train.latest_checkpoint(str(work)) == case.prefix
    assert th.tf_dtypes(summary.dst) == {"v": "float16"}


def test_overwrite(tf1_float32, tmp_path):
    prefix, values = tf1_float32
    out = tmp_path / "out" / "model"
    tfckpt.convert(prefix, out, "float16", max_shard_bytes=100)
    with tfckpt.open(out) as c:
        assert c.header.num_shards > 2
    before = th.digests(out.parent)
    with pytest.raises(CheckpointError, match="already exists"):
        tfckpt.convert(prefix, out, "bfloat16")
    assert th.digests(out.parent) == before
    tfckpt.convert(prefix, out, "bfloat16", overwrite=True)
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "checkpoint",
        "model.data-00000-of-00001",
        "model.index",
    ]  # no stale shards
    restored = th.tf1_restore(out, th.specs_of(values, tf.bfloat16))
    assert (
        restored["dense/kernel"].tobytes()
        == tf.cast(values["dense/kernel"], tf.bfloat16).numpy().tobytes()
    )


# ---------------------------------------------------------------- 8. bounded memory


# Runs a command and prints its peak RSS (KiB) and exit status, both from wait4(). Measured from
# a small intermediate process because Linux carries the *parent's* memory high-water mark into
# a child's ru_maxrss across vfork/fork + exec (exec_mmap -> setmax_mm_hiwater_rss), so a child
# of this pytest process (TensorFlow loaded) would report at least pytest's own peak RSS.
PEAK_RSS = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
child.returncode = os.waitstatus_to_exitcode(status)
print(usage.ru_maxrss, child.returncode)
"""
HUGE_ELEMENTS = 1 << 28  # float32: 1 GiB
HUGE_STEP = 1 << 23


def huge_values(idx: np.ndarray) -> np.ndarray:
    """Element ``i`` of the 1 GiB tensor: cheap to compute, many distinct float16 roundings."""
    return ((idx % 100_003).astype(np.float32) - np.float32(50_000)) * np.float32(0.37)


def test_convert_1gib_tensor_in_bounded_memory(tmp_path):
    src = tmp_path / "src" / "model"
    with tfckpt.BundleWriter(src) as w:
        w.add("global_step", np.int64(5))
        with w.stream("huge", "float32", (HUGE_ELEMENTS,)) as s:
            for i in range(0, HUGE_ELEMENTS, HUGE_STEP):
                s.write(huge_values(np.arange(i, i + HUGE_STEP, dtype=np.int64)))
    out = tmp_path / "fp16"
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                PEAK_RSS,
                sys.executable,
                "-m",
                "tfckpt",
                "convert",
                str(src),
                f"{out}/",
                "--dtype",
                "float16",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        peak_kib, rc = map(int, proc.stdout.split())
        assert rc == 0, proc.stderr
        peak_mib = peak_kib / 1024  # Linux reports KiB
        assert peak_mib < 400, f"peak RSS of the converting process: {peak_mib:.0f} MiB"

        prefix = str(out / "model")
        with tfckpt.open(prefix) as c:
            assert c.info("huge").dtype == "float16" and c.info("huge").shape == (HUGE_ELEMENTS,)
            assert c.info("huge").nbytes == HUGE_ELEMENTS * 2
        # TensorFlow restores the whole tensor (checking its CRC); spot-check elements.
        huge, step = tf.raw_ops.RestoreV2(
            prefix=prefix,
            tensor_names=["huge", "global_step"],
            shape_and_slices=["", ""],
            dtypes=[tf.float16, tf.int64],
        )
        assert int(step) == 5
        rng = np.random.default_rng(17)
        idx = (
            np.concatenate(
                [
                    rng.integers(0, HUGE_ELEMENTS, 3000),
                    np.arange(0, HUGE_ELEMENTS, HUGE_STEP // 2),
                    np.arange(0, HUGE_ELEMENTS, HUGE_STEP // 2) - 1,
                    [HUGE_ELEMENTS - 1],
                ]
            )
            % HUGE_ELEMENTS
        )
        got = tf.gather(huge, idx).numpy()
        want = huge_values(idx).astype(np.float16)
        assert got.tobytes() == want.tobytes()
        del huge
    finally:
        for d in (src.parent, out):
            for f in d.glob("*") if d.exists() else ():
                f.unlink()
