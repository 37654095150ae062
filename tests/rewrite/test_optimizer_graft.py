"""graft carries TF1 optimizer state onto a TF2 optimizer, proven by training: a TF1
graph trains a few steps with ``tf.compat.v1.train.AdamOptimizer`` (Momentum, Adagrad)
and saves (graph mode, in a ``tf.Graph`` of its own), then takes one more step; the
Keras model and optimizer restored from the grafted checkpoint take the same step
(tf.keras 2's slot variables, its own optimizer's lists, Keras 3's lists). flatten
--tf1-slots the other way: a Keras run's next step is the one the TF1 graph restored
from it takes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import assert_cli_error, in_process

import tfckpt

tf = pytest.importorskip("tensorflow")

LR, BETA1, BETA2, EPS, MOMENTUM = 0.01, 0.8, 0.99, 1e-7, 0.9
TF1_SLOT = {"momentum": "Momentum", "adagrad": "Adagrad", "rmsprop": "RMSProp", "ftrl": "Ftrl"}
TF1_SLOT |= {"rmsprop_centered": "RMSProp_2", "adadelta": "Adadelta_1", "adam_named": "MyAdam_1"}
RHO_ADADELTA = 0.95
STEPS = 3  # before the save
VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


def batch(i: int):
    rng = np.random.default_rng(i)
    xs = rng.standard_normal((5, 3)).astype(np.float32)
    return xs, rng.standard_normal((5, 2)).astype(np.float32)


def tf1_optimizer(which: str):
    """TF1's optimizer ``which`` (``tf.compat.v1.train``), built in the current graph."""
    v1 = tf.compat.v1.train
    if which == "adam":
        return v1.AdamOptimizer(LR, BETA1, BETA2, EPS)
    if which == "adam_named":  # its slots named after it: dense/kernel/MyAdam, MyAdam_1
        return v1.AdamOptimizer(LR, BETA1, BETA2, EPS, name="MyAdam")
    if which == "adadelta":
        return v1.AdadeltaOptimizer(LR, RHO_ADADELTA, EPS)
    if which in ("rmsprop", "rmsprop_centered"):
        return v1.RMSPropOptimizer(LR, 0.9, MOMENTUM, EPS, centered=which == "rmsprop_centered")
    if which == "adagrad":
        return v1.AdagradOptimizer(LR)
    if which == "ftrl":
        return v1.FtrlOptimizer(LR)
    return v1.MomentumOptimizer(LR, MOMENTUM)


def run_tf1(out, with_step: bool, restore: str = "", which="adam") -> dict[str, np.ndarray]:
    """A TF1 training run in a graph of its own (graph mode: placeholders, a Session, a
    Saver; its bytes and steps are those of a process with eager execution off):
    dense/kernel and dense/bias, STEPS steps of ``which`` on the batches 0..STEPS-1,
    saved at ``out/model.ckpt`` (or everything the Saver saves restored from
    ``restore``); then one step on batch STEPS, whose weights (and Adam's powers before
    it) it returns."""
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        x = v1.placeholder(tf.float32, [None, 3])
        y = v1.placeholder(tf.float32, [None, 2])
        init = np.random.default_rng(100).standard_normal((3, 2)).astype(np.float32)
        with v1.variable_scope("dense"):
            k = v1.get_variable("kernel", initializer=init)
            b = v1.get_variable("bias", initializer=np.full(2, 0.5, np.float32))
        loss = tf.reduce_mean(tf.square(tf.matmul(x, k) + b - y))
        opt = tf1_optimizer(which)
        step = [v1.train.get_or_create_global_step()] if with_step else []
        train = opt.minimize(loss, *step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            if restore:  # everything the Saver saves: weights, slots, powers, global_step
                v1.train.Saver().restore(sess, restore)
            else:
                for i in range(STEPS):
                    xs, ys = batch(i)
                    sess.run(train, {x: xs, y: ys})
                v1.train.Saver().save(sess, f"{out}/model.ckpt", write_meta_graph=False)
            adam = which in ("adam", "adam_named")
            powers = sess.run(opt._get_beta_accumulators()) if adam else [0, 0]
            xs, ys = batch(STEPS)
            sess.run(train, {x: xs, y: ys})
            return {"kernel": sess.run(k), "bias": sess.run(b), "powers": np.asarray(powers)}


@pytest.fixture(scope="module", params=["global_step", "powers"])
def tf1_run(request, tmp_path_factory):
    """The TF1 run's checkpoint and its next step's weights; with a global_step, or
    with none (the step comes from beta1_power and beta2_power)."""
    d = tmp_path_factory.mktemp("tf1adam")
    flag = "1" if request.param == "global_step" else "0"
    want = run_tf1(d, flag == "1")
    with tfckpt.open(str(d / "model.ckpt")) as c:
        assert ("global_step" in c.keys()) == (flag == "1")
        assert "dense/kernel/Adam_1" in c.keys()
    return str(d / "model.ckpt"), want


@pytest.fixture(scope="module")
def tf1_adam(tmp_path_factory):
    """A TF1 Adam run's checkpoint (with a global_step), for the refusals."""
    d = tmp_path_factory.mktemp("tf1adam_refused")
    run_tf1(d, True)
    return str(d / "model.ckpt")


def keras_optimizer(optimizers, which: str):
    """The Keras optimizer like TF1's ``which`` (Adagrad: no epsilon to speak of)."""
    if which == "momentum":
        return optimizers.SGD(LR, MOMENTUM)
    if which == "adagrad":
        return optimizers.Adagrad(LR, initial_accumulator_value=0.1, epsilon=1e-30)
    if which == "ftrl":
        return optimizers.Ftrl(LR)
    if which == "rmsprop":
        return optimizers.RMSprop(LR, rho=0.9, momentum=MOMENTUM, epsilon=EPS)
    if which == "rmsprop_centered":
        return optimizers.RMSprop(LR, rho=0.9, momentum=MOMENTUM, epsilon=EPS, centered=True)
    if which == "adadelta":
        return optimizers.Adadelta(LR, rho=RHO_ADADELTA, epsilon=EPS)
    return optimizers.Adam(LR, BETA1, BETA2, EPS)


def tf_keras_legacy(which="adam"):
    tf_keras = pytest.importorskip("tf_keras")
    model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(2, name="d")])
    opt = keras_optimizer(tf_keras.optimizers.legacy, which)
    opt._create_all_weights(model.trainable_variables)  # its slots and step, as training makes
    return model, opt, {"dense/": "model/layer_with_weights-0/"}


def tf_keras_own(which="adam"):
    tf_keras = pytest.importorskip("tf_keras")
    model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(2, name="d")])
    opt = keras_optimizer(tf_keras.optimizers, which)
    opt.build(model.trainable_variables)
    return model, opt, {"dense/": "model/layer_with_weights-0/"}


def keras3(which="adam"):
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")])
    opt = keras_optimizer(keras.optimizers, which)
    opt.build(model.trainable_variables)
    # Keras 3 keys the model's variables through the optimizer: graft finds them by path.
    return (
        model,
        opt,
        {
            "dense/kernel": "model/_functional/_operations/1/_kernel",
            "dense/bias": "model/_functional/_operations/1/bias",
        },
    )


KINDS = {"tf_keras legacy": tf_keras_legacy, "tf_keras": tf_keras_own, "keras 3": keras3}


def resumed_step(kind: str, prefix: str, which="adam") -> tuple[dict[str, np.ndarray], int]:
    """A fresh model and optimizer of ``kind`` restored from ``prefix`` (everything
    consumed), after one step on the TF1 run's next batch; and the step it restored."""
    model, opt, _ = KINDS[kind](which)
    tf.train.Checkpoint(model=model, optimizer=opt).restore(prefix).assert_consumed()
    restored = int(opt.iterations.numpy())
    xs, ys = batch(STEPS)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xs) - ys))
    variables = model.trainable_variables
    opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
    layer = model.get_layer("d")
    return {"kernel": np.asarray(layer.kernel), "bias": np.asarray(layer.bias)}, restored


def grafted(kind: str, src: str, tmp_path, which="adam", **changes) -> str:
    model, opt, rename = KINDS[kind](which)
    template = tf.train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "t" / "t"))
    dst = str(tmp_path / "out" / "ckpt")
    tfckpt.graft(template, src, dst, rename=rename, adam_betas=(BETA1, BETA2), **changes)
    return dst


@pytest.mark.parametrize("kind", list(KINDS))
def test_grafted_adam_takes_the_tf1_runs_next_step(tf1_run, kind, tmp_path):
    src, want = tf1_run
    got, step = resumed_step(kind, grafted(kind, src, tmp_path))
    assert step == STEPS
    for name in ("kernel", "bias"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_graft_cli_takes_adams_betas(tf1_run, tmp_path):
    src, want = tf1_run
    model, opt, rename = keras3()
    template = tf.train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "t"))
    dst = str(tmp_path / "out")
    maps = [a for old, new in rename.items() for a in ("--map", f"{old}={new}")]
    args = ["graft", template, src, "-o", dst, *maps]
    with tfckpt.open(src) as c:
        counted = "global_step" in c.keys()
    if not counted:  # Adam's powers, read with the defaults, are not this run's
        assert_cli_error(in_process(*args), "beta1_power and beta2_power", "--adam-betas")
    rc, out, err = in_process(*args, "--adam-betas", f"{BETA1},{BETA2}", "--dry-run", "--json")
    assert rc == 0, err
    (step,) = [t for t in json.loads(out)["tensors"] if "value" in t]
    assert (step["new_name"], step["value"]) == ("optimizer/_iterations" + VALUE, STEPS)
    rc, _, err = in_process(*args, "--adam-betas", f"{BETA1},{BETA2}")
    assert rc == 0, err
    got, step = resumed_step("keras 3", dst)
    assert step == STEPS
    np.testing.assert_allclose(got["kernel"], want["kernel"], rtol=1e-6, atol=1e-7)


def test_swapped_moments_take_another_step(tf1_run, tmp_path):
    """The proof can fail: Adam's moments swapped take another step; powers read with
    other betas are refused."""
    src, want = tf1_run
    swapped = str(tmp_path / "swapped" / "model.ckpt")
    tfckpt.rename(
        src,
        swapped,
        {},
        rename_exact={
            f"dense/{v}/{a}": f"dense/{v}/{b}"
            for v in ("kernel", "bias")
            for a, b in (("Adam", "Adam_1"), ("Adam_1", "Adam"))
        },
    )
    got, _ = resumed_step("keras 3", grafted("keras 3", swapped, tmp_path / "a"))
    assert not np.allclose(got["kernel"], want["kernel"], rtol=1e-4, atol=1e-6)
    # Adam's powers read with other betas give another step count, or none.
    with pytest.raises(tfckpt.CheckpointError, match="beta"):
        model, opt, rename = keras3()
        tpl = tf.train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "b" / "t"))
        tfckpt.graft(tpl, src, str(tmp_path / "b" / "o"), rename=rename, exclude="^global_step$")


# ---------------------------------------------------------------- flatten


def trained(kind: str, prefix: str, which="adam") -> dict[str, np.ndarray]:
    """A Keras model and its Adam of ``kind`` after STEPS steps, saved at ``prefix``;
    and its weights after one more step on the next batch."""
    model, opt, _ = KINDS[kind](which)
    layer = model.get_layer("d")
    layer.kernel.assign(np.random.default_rng(100).standard_normal((3, 2)).astype(np.float32))

    def step(i: int) -> None:
        xs, ys = batch(i)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xs) - ys))
        variables = model.trainable_variables
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))

    for i in range(STEPS):
        step(i)
    tf.train.Checkpoint(model=model, optimizer=opt).write(prefix)
    step(STEPS)
    return {"kernel": np.asarray(layer.kernel), "bias": np.asarray(layer.bias)}


@pytest.mark.parametrize("kind", list(KINDS))
def test_flattened_adam_takes_the_keras_next_step_in_tf1(kind, tmp_path):
    """Keras' Adam state flattened with ``--tf1-slots`` restores into a TF1 graph's
    AdamOptimizer (Saver.restore of every variable), whose next step is Keras' next."""
    prefix = str(tmp_path / "tf2" / "ckpt")
    want = trained(kind, prefix)
    flat = str(tmp_path / "flat" / "model.ckpt")
    maps = [a for old, new in flat_rename(kind).items() for a in ("--map", f"{old}={new}")]
    rc, _, err = in_process(
        "flatten", prefix, flat, "--tf1-slots", "--adam-betas", f"{BETA1},{BETA2}", *maps
    )
    assert rc == 0, err
    with tfckpt.open(flat) as c:
        assert int(c["global_step"]) == STEPS
        assert {"dense/kernel/Adam", "dense/kernel/Adam_1", "beta1_power"} <= set(c.keys())
    got = run_tf1(tmp_path, True, flat)
    np.testing.assert_allclose(got["powers"], [BETA1 ** (STEPS + 1), BETA2 ** (STEPS + 1)], 1e-6)
    for name in ("kernel", "bias"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)


def flat_rename(kind: str) -> dict[str, str]:
    """The flat names of ``kind``'s dense layer → the TF1 run's names."""
    _, _, graft_rename = KINDS[kind]()
    return {
        new + ("$" if new.endswith(("kernel", "bias")) else ""): old
        for old, new in graft_rename.items()
    }


# ---------------------------------------------------------------- step counts and refusals


def test_adams_powers_give_the_step_until_they_underflow():
    from tfckpt.rewrite.tf1slots import powers_after, steps_from_powers

    for n in (0, 1, 7, 500):
        assert steps_from_powers(*powers_after(n)) == [n]
    assert steps_from_powers(*powers_after(7), betas=(0.8, 0.99)) == []
    # beta1_power stops at the smallest float32 (0.9 x it rounds back to it), beta2_power
    # much later: past there every step count holds the same powers.
    late = steps_from_powers(*powers_after(200_000))
    assert len(late) == 2 and late[-1] == -1 and late[0] < 200_000


def test_graft_refuses_a_global_step_adams_powers_contradict(tf1_run, tmp_path):
    src, _ = tf1_run
    with tfckpt.open(src) as c:
        values = {n: c[n] for n in c.keys()}
    values["global_step"] = np.int64(STEPS + 1)
    bad = tfckpt.save(values, str(tmp_path / "bad" / "model.ckpt"))
    model, opt, rename = keras3()
    tpl = tf.train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "t"))
    with pytest.raises(tfckpt.CheckpointError, match=f"global_step of .* is {STEPS + 1}, but"):
        tfckpt.graft(tpl, bad, str(tmp_path / "o"), rename=rename, adam_betas=(BETA1, BETA2))
    # Told to trust the powers, it takes their count.
    dst = str(tmp_path / "o2")
    tfckpt.graft(tpl, bad, dst, rename=rename, adam_betas=(BETA1, BETA2), exclude="^global_step$")
    assert resumed_step("keras 3", dst)[1] == STEPS


@pytest.mark.parametrize("optimizer", ["Nadam", "Adamax", "Lion"])
def test_other_optimizers_slots_are_refused(tf1_adam, tmp_path, optimizer):
    """A template whose optimizer has no TF1 counterpart (Nadam, with a _u_product beside
    Adam's lists; Adamax; Lion) is refused, naming it; nor does flatten --tf1-slots
    name its slots."""
    import keras

    src = tf1_adam
    model, _, rename = keras3()
    opt = getattr(keras.optimizers, optimizer)(0.1)
    opt.build(model.trainable_variables)
    tpl = tf.train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "t"))
    with pytest.raises(
        tfckpt.CheckpointError,
        match=f"of what 'dense/kernel' fills: a {optimizer} slot: TF1 .* has no {optimizer}",
    ):
        tfckpt.graft(tpl, src, str(tmp_path / "o"), rename=rename, adam_betas=(BETA1, BETA2))
    result = in_process("flatten", tpl, tmp_path / "f", "--tf1-slots")
    assert_cli_error(
        result, f"slot, a {optimizer} slot: TF1 (tf.compat.v1.train) has no {optimizer}"
    )


def test_tf_keras_slots_are_tied_by_their_names_after_fit(tmp_path):
    """tf.keras 2's own Adam keeps no list of its variables: a slot's is the one its
    name names, ``Adam/m/d1/kernel`` after ``fit`` (``m/d1/kernel`` when built outside)."""
    from tfckpt.format.objectgraph import ObjectGraph
    from tfckpt.format.optimizers import optimizer_state

    tf_keras = pytest.importorskip("tf_keras")
    model = tf_keras.Sequential(
        [tf_keras.Input((3,)), tf_keras.layers.Dense(4, name="d1"), tf_keras.layers.Dense(2)]
    )
    model.compile(tf_keras.optimizers.Adam(), "mse")
    model.fit(np.ones((4, 3)), np.zeros((4, 2)), verbose=0)
    prefix = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(str(tmp_path / "c"))
    with tfckpt.open(prefix) as c:
        graph = ObjectGraph.of(c)
    names = {a.checkpoint_key: a.full_name for n in graph.nodes for a in n.attributes}
    slots = optimizer_state(graph).slots
    assert len(slots) == 8
    for slot, (var, role) in slots.items():
        short = {"_momentums": "m", "_velocities": "v"}[role]
        assert names[slot] == f"Adam/{short}/{names[var]}", (slot, var)


# ---------------------------------------------------------------- momentum, adagrad, rmsprop, ftrl


OTHERS = ["momentum", "adagrad", "rmsprop", "ftrl", "rmsprop_centered", "adadelta", "adam_named"]


@pytest.fixture(scope="module", params=OTHERS)
def tf1_other(request, tmp_path_factory):
    """A TF1 run with MomentumOptimizer, AdagradOptimizer, RMSPropOptimizer (centred or
    not), AdadeltaOptimizer, FtrlOptimizer or an AdamOptimizer named ``MyAdam`` (and a
    global_step)."""
    d = tmp_path_factory.mktemp("tf1" + request.param)
    want = run_tf1(d, True, which=request.param)
    with tfckpt.open(str(d / "model.ckpt")) as c:
        assert f"dense/kernel/{TF1_SLOT[request.param]}" in c.keys()
    return request.param, str(d / "model.ckpt"), want


@pytest.mark.parametrize("kind", list(KINDS))
def test_grafted_other_optimizers_take_the_tf1_runs_next_step(tf1_other, kind, tmp_path):
    """TF1's Momentum accumulates gradients, Keras' momentum the updates (-lr times):
    graft scales it, and Keras' next step is TF1's; Adagrad's, RMSProp's (centred: its
    mean gradient RMSProp_1 is Keras' average gradient), Adadelta's and Ftrl's slots are
    the same; an Adam named MyAdam keeps its slots as MyAdam and MyAdam_1."""
    which, src, want = tf1_other
    got, step = resumed_step(kind, grafted(kind, src, tmp_path, which=which), which=which)
    assert step == STEPS
    for name in ("kernel", "bias"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize(
    ("kind", "which"),
    [(k, w) for w in ("momentum", "adagrad", "rmsprop") for k in KINDS]
    + [(k, w) for w in ("rmsprop_centered", "adadelta") for k in KINDS]
    + [("keras 3", "ftrl")],
)
def test_flattened_other_optimizers_take_the_keras_next_step_in_tf1(kind, which, tmp_path):
    prefix = str(tmp_path / "tf2" / "ckpt")
    want = trained(kind, prefix, which=which)
    flat = str(tmp_path / "flat" / "model.ckpt")
    rename = {new: old for old, new in flat_rename(kind).items()}
    tfckpt.flatten(prefix, flat, tf1_slots=True, rename={v: k for k, v in rename.items()})
    with tfckpt.open(flat) as c:
        assert "beta1_power" not in c.keys()
        assert f"dense/bias/{TF1_SLOT[which]}" in c.keys()
    got = run_tf1(tmp_path, True, flat, which=which)
    for name in ("kernel", "bias"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("optimizer", ["Adamax", "Nadam"])
def test_a_legacy_optimizer_with_adams_slots_is_known_by_name(tf1_adam, tmp_path, optimizer):
    """tf.keras 2's legacy Adamax and Nadam keep Adam's very m and v slots; their
    variables' names after training (``Adamax/iter``) tell them apart."""
    tf_keras = pytest.importorskip("tf_keras")
    src = tf1_adam
    model, _, rename = tf_keras_legacy()
    opt = getattr(tf_keras.optimizers.legacy, optimizer)(LR)
    model.compile(opt, "mse")  # training names its variables Adamax/iter, Adamax/...
    model.fit(np.ones((2, 3)), np.zeros((2, 2)), verbose=0)
    tpl = tf.train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "t"))
    with pytest.raises(
        tfckpt.CheckpointError, match=f"a {optimizer} slot: TF1 .* has no {optimizer} optimizer"
    ):
        tfckpt.graft(tpl, src, str(tmp_path / "o"), rename=rename, adam_betas=(BETA1, BETA2))


def test_centred_and_plain_rmsprop_are_told_apart(tmp_path_factory, tmp_path):
    """A centred TF1 RMSProp keeps three slots (RMSProp_1 its mean gradient), a plain one
    two (RMSProp_1 its momentum): a template of the other kind is refused, not filled
    with the wrong slot."""
    centred = tmp_path_factory.mktemp("centred")
    run_tf1(centred, True, which="rmsprop_centered")
    plain = tmp_path_factory.mktemp("plain")
    run_tf1(plain, True, which="rmsprop")
    for src, which in ((centred, "rmsprop"), (plain, "rmsprop_centered")):
        with pytest.raises(tfckpt.CheckpointError, match="RMSProp optimizer's slots"):
            grafted("keras 3", str(src / "model.ckpt"), tmp_path / which, which=which)
