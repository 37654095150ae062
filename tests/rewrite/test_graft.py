"""graft (a name-based checkpoint onto a TF2 template) and flatten (the reverse), proven
with TensorFlow: a TF1 Saver checkpoint grafted onto a Keras template restores with
``assert_consumed()``; a flattened Keras checkpoint restores into a TF1 Saver."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_cli_error, in_process

import tfckpt

tf = pytest.importorskip("tensorflow")

# The TF1 model: names as a TF1 script gives them.
TF1_SHAPES = {
    "simple-conv1/weights": (3, 3, 2, 4),
    "simple-conv1/biases": (4,),
    "simple-fc/weights": (64, 3),
    "simple-fc/biases": (3,),
}
# The same model in Keras 3 (functional): its layers' variables' paths.
KERNEL1, BIAS1 = "model/_operations/1/_kernel", "model/_operations/1/bias"
KERNEL2, BIAS2 = "model/_operations/3/_kernel", "model/_operations/3/bias"
MAP = [
    f"simple-conv1/weights$={KERNEL1}",
    f"simple-conv1/biases$={BIAS1}",
    f"simple-fc/weights$={KERNEL2}",
    f"simple-fc/biases$={BIAS2}",
]
VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


def map_args(rules=MAP) -> list[str]:
    return [a for r in rules for a in ("--map", r)]


def keras_model(dtype="float32", seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    inp = keras.Input((6, 6, 2))
    x = keras.layers.Conv2D(4, 3, name="conv1", dtype=dtype)(inp)
    x = keras.layers.Flatten(dtype=dtype)(x)
    out = keras.layers.Dense(3, name="fc", dtype=dtype)(x)
    return keras.Model(inp, out)


def model_values(model) -> dict[str, np.ndarray]:
    conv, fc = model.get_layer("conv1"), model.get_layer("fc")
    return {
        KERNEL1: conv.kernel.numpy(),
        BIAS1: conv.bias.numpy(),
        KERNEL2: fc.kernel.numpy(),
        BIAS2: fc.bias.numpy(),
    }


@pytest.fixture(scope="module")
def tf1(tmp_path_factory):
    """A TF1 graph-mode Saver checkpoint of the model, and its values (also saved as V1)."""
    rng = np.random.default_rng(11)
    values = {n: rng.standard_normal(s).astype(np.float32) for n, s in TF1_SHAPES.items()}
    d = tmp_path_factory.mktemp("tf1")
    (d / "v1").mkdir()
    prefix = str(d / "model.ckpt")
    with tf.Graph().as_default():
        for name, value in values.items():
            scope, var = name.split("/")
            with tf.compat.v1.variable_scope(scope):
                tf.compat.v1.get_variable(var, initializer=value)
        tf.compat.v1.get_variable("global_step", initializer=np.int64(7), trainable=False)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            tf.compat.v1.train.Saver().save(sess, prefix, write_meta_graph=False)
            v1 = tf.compat.v1.train.Saver(write_version=tf.compat.v1.train.SaverDef.V1)
            v1.save(sess, str(d / "v1" / "model.ckpt"), write_meta_graph=False)
    return prefix, values


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    """TF2 templates of the same model, freshly initialised: float32 and float16.

    Saved with ``save()``, which adds the ``save_counter`` that a restore creates
    and ``assert_consumed()`` wants bound."""
    d = tmp_path_factory.mktemp("templates")
    out = {}
    for dtype in ("float32", "float16"):
        model = keras_model(dtype)
        out[dtype] = tf.train.Checkpoint(model=model).save(str(d / dtype))
    return out


def restored(dst, dtype="float32"):
    """What TensorFlow restores from ``dst`` into a fresh model, every value consumed."""
    model = keras_model(dtype, seed=1)
    tf.train.Checkpoint(model=model).restore(dst).assert_consumed()
    return model_values(model)


def test_graft_tf1_onto_tf2_template_restores(tf1, templates, tmp_path):
    src, values = tf1
    dst = tmp_path / "out" / "model"
    rc, out, err = in_process("graft", templates["float32"], src, "-o", dst, *map_args())
    assert rc == 0, err
    got = restored(str(dst))
    for (tf1_name, want), key in zip(values.items(), (KERNEL1, BIAS1, KERNEL2, BIAS2)):
        np.testing.assert_array_equal(got[key], want, err_msg=tf1_name)
    with tfckpt.open(dst) as ck, tfckpt.open(templates["float32"]) as tpl:
        assert ck.keys() == tpl.keys()  # the template's keys, object graph byte for byte
        assert (
            ck["_CHECKPOINTABLE_OBJECT_GRAPH"].item() == tpl["_CHECKPOINTABLE_OBJECT_GRAPH"].item()
        )


def test_graft_from_a_v1_checkpoint(tf1, templates, tmp_path):
    src, values = tf1
    v1 = src.replace("/model.ckpt", "/v1/model.ckpt")
    assert Path(v1).is_file() and not Path(v1 + ".index").exists()  # a V1 file
    dst = tmp_path / "out"
    rc, _, err = in_process("graft", templates["float32"], v1, "-o", dst, *map_args())
    assert rc == 0, err
    np.testing.assert_array_equal(restored(str(dst))[KERNEL1], values["simple-conv1/weights"])


def test_graft_casts_to_the_template_dtype(tf1, templates, tmp_path):
    src, values = tf1
    dst = str(tmp_path / "fp16")
    rules = dict(r.split("=") for r in MAP)
    summary = tfckpt.graft(templates["float16"], src, dst, rename=rules)
    assert summary.cast == 4
    got = restored(dst, "float16")
    for (tf1_name, want), key in zip(values.items(), (KERNEL1, BIAS1, KERNEL2, BIAS2)):
        assert got[key].dtype == np.float16
        np.testing.assert_array_equal(
            got[key].view(np.uint16), tf.cast(want, tf.float16).numpy().view(np.uint16), tf1_name
        )


def test_graft_missing_source_is_an_error_naming_it(tf1, templates, tmp_path):
    src, _ = tf1
    dst = tmp_path / "out"
    result = in_process("graft", templates["float32"], src, "-o", dst, *map_args(MAP[:3]))
    assert_cli_error(result, repr(BIAS2 + VALUE), "--allow-missing")
    assert not (tmp_path / "out.index").exists()


def test_graft_allow_missing_keeps_the_template_value(tf1, templates, tmp_path):
    src, values = tf1
    dst = str(tmp_path / "out")
    rc, _, err = in_process(
        "graft", templates["float32"], src, "-o", dst, *map_args(MAP[:3]), "--allow-missing"
    )
    assert rc == 0, err
    got = restored(dst)
    with tfckpt.open(templates["float32"]) as tpl:
        np.testing.assert_array_equal(got[BIAS2], tpl[BIAS2 + VALUE])
    np.testing.assert_array_equal(got[KERNEL2], values["simple-fc/weights"])


def test_graft_shape_mismatch_names_both(tf1, templates, tmp_path):
    src, _ = tf1
    rules = [f"simple-conv1/weights$={KERNEL2}", f"simple-fc/weights$={KERNEL1}", *MAP[1::2]]
    result = in_process("graft", templates["float32"], src, "-o", tmp_path / "o", *map_args(rules))
    assert_cli_error(
        result, "shape mismatch", KERNEL1, "[3, 3, 2, 4]", "simple-fc/weights", "[64, 3]"
    )


def test_graft_dry_run_prints_the_pairing(tf1, templates, tmp_path):
    src, _ = tf1
    dst = tmp_path / "out"
    rc, out, err = in_process(
        "graft", templates["float32"], src, "-o", dst, *map_args(), "--dry-run"
    )
    assert rc == 0, err
    pairs = [line.split() for line in out.splitlines()]
    assert any("simple-fc/weights" in p and KERNEL2 + VALUE in p for p in pairs), out
    assert any(p[:1] == ["drop"] and "global_step" in p for p in pairs), out
    rc, out, err = in_process(
        "graft", templates["float32"], src, "-o", dst, *map_args(), "--dry-run", "--json"
    )
    plan = json.loads(out)
    template = templates["float32"]
    assert {(t["source"], t["name"], t["new_name"]) for t in plan["tensors"]} == {
        (src, tf1_name, key + VALUE)
        for tf1_name, key in zip(TF1_SHAPES, (KERNEL1, BIAS1, KERNEL2, BIAS2))
    } | {(template, "save_counter" + VALUE, "save_counter" + VALUE)}  # kept: bookkeeping
    assert [d["name"] for d in plan["dropped"]] == ["global_step"]
    assert not list(tmp_path.iterdir())  # nothing written


def test_graft_a_name_in_two_sources(tf1, templates, tmp_path):
    src, values = tf1
    other = tmp_path / "copy"
    other.mkdir()
    for f in (src + ".index", *tfckpt.open(src).data_files):
        shutil.copy(f, other)
    copy = str(other / "model.ckpt")
    dst = tmp_path / "out"
    result = in_process("graft", templates["float32"], src, copy, "-o", dst, *map_args())
    assert_cli_error(result, "comes from both", "prefer")
    rc, _, err = in_process(
        "graft", templates["float32"], src, copy, "-o", dst, *map_args(), "--prefer", "last"
    )
    assert rc == 0, err
    np.testing.assert_array_equal(restored(str(dst))[KERNEL1], values["simple-conv1/weights"])


def test_graft_onto_a_template_with_its_optimizer(tf1, tmp_path):
    """Keras 3 keys of a model saved with its optimizer run through the optimizer
    (``optimizer/_trainable_variables/0``); the model's paths still find them, and
    the optimizer's slots, which the TF1 checkpoint lacks (no ``VAR/Adam``), are an error
    naming them unless the optimizer is cut from the template."""
    import keras

    src, values = tf1
    model = keras_model()
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    template = tf.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "t"))
    with tfckpt.open(template) as tpl:
        assert "optimizer/_trainable_variables/0" + VALUE in tpl.keys()
    dst = tmp_path / "out"
    result = in_process("graft", template, src, "-o", dst, *map_args())
    assert_cli_error(
        result,
        "no source has the template's optimizer slot 'optimizer/_variables/2" + VALUE,
        "momentums of what 'simple-conv1/weights' fills: no 'simple-conv1/weights/Adam' in",
        "--drop-object",
    )
    rc, _, err = in_process(
        "graft", template, src, "-o", dst, *map_args(), "--drop-object", "optimizer"
    )
    assert rc == 0, err
    np.testing.assert_array_equal(restored(str(dst))[KERNEL2], values["simple-fc/weights"])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_graft_a_partitioned_tf1_variable(tf_checkpoints, tmp_path, dtype):
    """A TF1 partitioned variable becomes one TF2 variable, restored whole: its float16
    cast too, which TensorFlow could not assemble from slices."""
    case = tf_checkpoints("tf1_partitioned")
    table = tf.Variable(tf.zeros([10, 4], dtype=dtype))
    template = tf.train.Checkpoint(table=table).save(str(tmp_path / "t"))
    dst = str(tmp_path / "out")
    tfckpt.graft(template, case.prefix, dst, rename={"emb/table": "table"}, exclude="^(vec|wide)$")
    fresh = tf.Variable(tf.ones([10, 4], dtype=dtype))
    tf.train.Checkpoint(table=fresh).restore(dst).assert_consumed()
    want = tf.cast(tf.train.load_checkpoint(case.prefix).get_tensor("emb/table"), dtype)
    np.testing.assert_array_equal(fresh.numpy(), want.numpy())


@pytest.mark.parametrize(
    "flags",
    [["--dtype", "float16"], ["--dtype-rule", "conv=float16"], ["--keep-dtype", "conv"]],
)
def test_graft_refuses_a_cast_option(tf1, templates, tmp_path, flags):
    src, _ = tf1
    result = in_process(
        "graft", templates["float32"], src, "-o", tmp_path / "o", *map_args(), *flags
    )
    assert_cli_error(result, "dtype from the template")
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- flatten


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A TF2 checkpoint of a Keras model and its optimizer after a training step (its
    slots exist: the tf.keras 2 optimizer records them as slot variables)."""
    tf_keras = pytest.importorskip("tf_keras")
    tf_keras.utils.set_random_seed(3)
    model = tf_keras.Sequential(
        [
            tf_keras.Input((4,)),
            tf_keras.layers.Dense(3, name="d1"),
            tf_keras.layers.Dense(2, name="d2"),
        ]
    )
    optimizer = tf_keras.optimizers.legacy.Adam(0.01)
    model.compile(optimizer=optimizer, loss="mse")
    rng = np.random.default_rng(4)
    model.fit(rng.random((8, 4)), rng.random((8, 2)), epochs=1, batch_size=8, verbose=0)
    prefix = tf.train.Checkpoint(model=model, optimizer=optimizer).write(
        str(tmp_path_factory.mktemp("trained") / "ckpt")
    )
    return prefix


def tf1_restore(prefix: str, specs: dict[str, tuple]) -> dict[str, np.ndarray]:
    """Restore ``prefix`` with a TF1 graph-mode Saver into variables named as given."""
    with tf.Graph().as_default():
        variables = {
            name: tf.compat.v1.get_variable(
                name.replace("/", "_").replace("-", "_"),
                shape=shape,
                dtype=dtype,
                initializer=tf.compat.v1.zeros_initializer(),
            )
            for name, (dtype, shape) in specs.items()
        }
        saver = tf.compat.v1.train.Saver(var_list=variables)
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, prefix)
            return {n: v for n, v in zip(variables, sess.run(list(variables.values())))}


def test_flatten_restores_into_a_tf1_saver(trained, tmp_path):
    dst = str(tmp_path / "flat" / "model.ckpt")
    rc, _, err = in_process("flatten", trained, dst)
    assert rc == 0, err
    with tfckpt.open(dst) as flat, tfckpt.open(trained) as src:
        names = flat.keys()
        specs = {n: (flat.info(n).dtype, flat.info(n).shape) for n in names}
        reader = tf.train.load_checkpoint(trained)
        want = {
            "model/layer_with_weights-0/kernel": "model/layer_with_weights-0/kernel" + VALUE,
            "model/layer_with_weights-1/bias/m": "model/layer_with_weights-1/bias/"
            ".OPTIMIZER_SLOT/optimizer/m" + VALUE,
            "model/layer_with_weights-0/kernel/v": "model/layer_with_weights-0/kernel/"
            ".OPTIMIZER_SLOT/optimizer/v" + VALUE,
            "optimizer/iter": "optimizer/iter" + VALUE,
        }
        assert set(want) <= set(names)
        assert len(names) == len(src.keys()) - 1  # all but the object graph
    assert not any(".ATTRIBUTES" in n or "OPTIMIZER_SLOT" in n for n in names)
    got = tf1_restore(dst, {n: (tf.as_dtype(d), s) for n, (d, s) in specs.items()})
    for name, key in want.items():
        np.testing.assert_array_equal(got[name], reader.get_tensor(key), err_msg=name)
    assert int(got["optimizer/iter"]) == 1


def test_flatten_then_graft_is_the_source(trained, tmp_path):
    flat = str(tmp_path / "flat")
    tfckpt.flatten(trained, flat)
    back = str(tmp_path / "back")
    tfckpt.graft(trained, flat, back)
    rc, out, err = in_process("diff", trained, back)
    assert rc == 0, (out, err)


def test_flatten_needs_a_tf2_checkpoint(tf1, tmp_path):
    result = in_process("flatten", tf1[0], tmp_path / "o")
    assert_cli_error(result, "flatten needs a TF2", tf1[0])
