"""``tfckpt edit``: values set, filled, scaled, added and deleted, proven by TensorFlow
restoring the output (TF1 ``Saver.restore``, TF2 ``assert_consumed()``) with the values
computed here with numpy; bounded memory for tensors above the chunk budget; ``--in-place``
killed at every step of its commit leaves a checkpoint TensorFlow loads, old or new."""

from __future__ import annotations

import os
import shutil
import signal
import tracemalloc

import numpy as np
import pytest
import tensorflow as tf

import tfckpt
from tests import cli_helpers as ch
from tests.edit_helpers import (
    BIAS,
    ITER,
    KERNEL,
    keras,
    keras_model,
    slot_key,
    tf1_restore,
    tf2_restore,
    tf_values,
    write_tf1,
    write_tf2,
)


@pytest.fixture(scope="module")
def tf1(tmp_path_factory):
    return write_tf1(tmp_path_factory.mktemp("tf1"))


@pytest.fixture(scope="module")
def tf2(tmp_path_factory):
    return write_tf2(tmp_path_factory.mktemp("tf2"))


def test_tf1_edits_restore_with_the_values_computed(tf1, tmp_path):
    src = tf_values(tf1)
    kernel = np.arange(12, dtype=np.float64).reshape(4, 3) / 4  # exact in float32
    np.save(tmp_path / "k.npy", kernel)
    dst = str(tmp_path / "out" / "model.ckpt")
    tfckpt.edit(
        tf1,
        dst,
        set={"global_step": "0", "dense/kernel": f"@{tmp_path / 'k.npy'}"},
        scale={"dense/bias": 0.3},
        fill={"beta1_power": "ones", "emb/Adam": "zeros"},
        delete=["^beta2_power$"],
    )
    want = dict(src)
    del want["beta2_power"]
    want["global_step"] = np.int64(0)
    want["dense/kernel"] = kernel.astype(np.float32)
    want["dense/bias"] = (src["dense/bias"].astype(np.float64) * 0.3).astype(np.float32)
    want["beta1_power"] = np.float32(1)
    want["emb/Adam"] = np.zeros((6, 4), np.float32)
    got = tf_values(dst)
    assert sorted(got) == sorted(want)
    restored = tf1_restore(dst, want)
    for name, value in want.items():
        assert restored[name].dtype == np.asarray(value).dtype, name
        assert np.array_equal(restored[name], value), name


def test_tf2_delete_takes_the_object_and_its_slots(tf2, tmp_path):
    src = tf_values(tf2)
    dst = str(tmp_path / "out" / "ckpt")
    tfckpt.edit(
        tf2,
        dst,
        delete=[r"^extra/\.ATTRIBUTES/"],  # the variable only: its slots go with its node
        scale={"model/layer_with_weights-1/kernel": "2.5"},  # its flat name
        set={ITER: "7"},
    )
    got = tf_values(dst)
    assert not [n for n in got if n.startswith("extra/")]
    model, opt = tf2_restore(dst)  # assert_consumed: nothing left over, nothing missing
    kernel, bias = model.layers[1].kernel, model.layers[1].bias
    want = (src[KERNEL].astype(np.float64) * 2.5).astype(np.float32)
    assert np.array_equal(kernel.numpy(), want)
    assert np.array_equal(bias.numpy(), src[BIAS])
    assert int(opt.iterations.numpy()) == 7
    assert np.array_equal(opt.get_slot(kernel, "m").numpy(), src[slot_key(KERNEL, "m")])
    assert np.array_equal(opt.get_slot(kernel, "v").numpy(), src[slot_key(KERNEL, "v")])


def test_tf2_delete_of_a_slot_alone(tf2, tmp_path):
    dst = str(tmp_path / "out" / "ckpt")
    tfckpt.edit(tf2, dst, delete=[r"^extra/\.OPTIMIZER_SLOT/optimizer/m/"])
    src, got = tf_values(tf2), tf_values(dst)
    assert sorted(got) == sorted(n for n in src if "extra/.OPTIMIZER_SLOT/optimizer/m/" not in n)
    # TensorFlow restores it (the slots made after the read, as training makes them):
    # every other value finds its object, the slot m of ``extra`` stays as made.
    extra = tf.Variable(np.zeros(2, np.float32))
    model = keras_model()
    opt = keras.optimizers.legacy.Adam(0.1)
    status = tf.train.Checkpoint(model=model, optimizer=opt, extra=extra).read(dst)
    opt._create_all_weights([*model.trainable_variables, extra])
    status.assert_nontrivial_match()
    assert np.array_equal(extra.numpy(), src["extra/.ATTRIBUTES/VARIABLE_VALUE"])
    v = "extra/.OPTIMIZER_SLOT/optimizer/v/.ATTRIBUTES/VARIABLE_VALUE"
    assert np.array_equal(opt.get_slot(extra, "v").numpy(), src[v])
    assert not opt.get_slot(extra, "m").numpy().any()


def test_tf2_add_needs_as_tf1(tf2, tmp_path):
    new = np.arange(6, dtype=np.int32).reshape(2, 3)
    np.save(tmp_path / "new.npy", new)
    dst = str(tmp_path / "out" / "ckpt")
    ch.assert_cli_error(
        ch.in_process("edit", tf2, dst, "--add", f"added=@{tmp_path / 'new.npy'}"),
        "object-graph node",
        "--as-tf1",
    )
    assert not os.path.exists(tmp_path / "out")
    rc, _, err = ch.in_process(
        "edit", tf2, dst, "--add", f"added=@{tmp_path / 'new.npy'}", "--as-tf1"
    )
    assert rc == 0, err
    got = tf_values(dst)
    assert np.array_equal(got["added"], new) and got["added"].dtype == np.int32
    assert (
        "_CHECKPOINTABLE_OBJECT_GRAPH"
        not in tf.train.load_checkpoint(dst).get_variable_to_shape_map()
    )
    assert np.array_equal(got[KERNEL], tf_values(tf2)[KERNEL])


def test_edits_above_the_chunk_budget_stay_bounded(tmp_path):
    n = 1 << 20  # 4 MiB of float32 each, the budget 256 KiB
    big = np.linspace(-3, 3, n, dtype=np.float32)
    src = str(tmp_path / "src" / "model")
    tf.raw_ops.SaveV2(
        prefix=src, tensor_names=["big", "other"], shape_and_slices=["", ""], tensors=[big, big]
    )
    replacement = np.arange(n, dtype=np.float32)
    np.save(tmp_path / "r.npy", replacement)
    dst = str(tmp_path / "out" / "model")
    tracemalloc.start()
    try:
        tfckpt.edit(
            src,
            dst,
            scale={"big": 0.5},
            set={"other": f"@{tmp_path / 'r.npy'}"},
            chunk_bytes=256 << 10,
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < big.nbytes / 2, peak
    got = tf_values(dst)
    assert np.array_equal(got["big"], (big.astype(np.float64) * 0.5).astype(np.float32))
    assert np.array_equal(got["other"], replacement)


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--set", "dense/bias=[1,2]"], ["dense/bias", "shape [2]", "[3]"]),
        (["--set", "global_step=1.5"], ["global_step", "without loss"]),
        (["--set", "dense/bias=[1e39,0,0]"], ["dense/bias", "range of float32"]),
        (["--set", "nothere=1"], ["no tensor 'nothere'"]),
        (["--scale", "global_step=2"], ["global_step", "floating-point"]),
        (["--fill", "emb=many"], ["emb", "not a number"]),
        (["--delete", "^nothing$"], ["no tensor matches"]),
        (["--fill", "emb=1", "--scale", "emb=2"], ["emb", "both edit it"]),
        (["--add", "emb=@x.npy"], ["emb", "exists"]),
        # an edit and a delete of one tensor (or of a slot the delete takes) conflict
        (["--set", "emb=0", "--delete", "^emb$"], ["'emb'", "deletes it", "not both"]),
        (["--delete", "^emb$", "--fill", "emb/Adam=0"], ["'emb/Adam'", "slot of emb"]),
        (["--resize", "^emb$=8", "--delete", "^emb$"], ["--resize", "deletes it"]),
    ],
)
def test_cli_errors_are_one_line(tf1, tmp_path, args, fragments):
    np.save(tmp_path / "x.npy", np.zeros(3, np.float32))
    args = [a.replace("@x.npy", f"@{tmp_path / 'x.npy'}") for a in args]
    dst = str(tmp_path / "out" / "m")
    ch.assert_cli_error(ch.in_process("edit", tf1, dst, *args), tf1, *fragments)
    assert not os.path.exists(tmp_path / "out")


def test_destination_named_by_its_index_file(tf1, tmp_path):
    """A destination's ``.index`` (or data file) names its prefix, as a source's does:
    never ``X.index.index``; the source's own ``.index`` is the source, refused even with
    ``--overwrite``, its files byte for byte as they were."""
    out = tmp_path / "out"
    rc, _, err = ch.in_process("edit", tf1, out / "m.index", "--set", "global_step=5")
    assert rc == 0, err
    assert sorted(os.listdir(out)) == ["checkpoint", "m.data-00000-of-00001", "m.index"]
    assert tf_values(str(out / "m"))["global_step"] == 5
    rc, _, err = ch.in_process(
        "edit", tf1, out / "m.data-00000-of-00001", "--set", "global_step=6", "--overwrite"
    )
    assert rc == 0 and tf_values(str(out / "m"))["global_step"] == 6, err
    directory = os.path.dirname(tf1)
    before = _files(directory)
    for dst in (tf1 + ".index", tf1, tf1 + ".data-00000-of-00001"):
        ch.assert_cli_error(
            ch.in_process("edit", tf1, dst, "--overwrite", "--set", "global_step=0"),
            "the destination is a source checkpoint",
            "--in-place",
        )
    assert _files(directory) == before


def test_npy_with_objects_is_never_unpickled(tf1, tmp_path):
    np.save(tmp_path / "o.npy", np.array([1, "x", None], dtype=object), allow_pickle=True)
    ch.assert_cli_error(
        ch.in_process("edit", tf1, str(tmp_path / "o"), "--set", f"dense/bias=@{tmp_path}/o.npy"),
        "never unpickled",
    )


def _files(directory) -> dict[str, bytes]:
    return {f: open(os.path.join(directory, f), "rb").read() for f in sorted(os.listdir(directory))}


KILL_AT_REPLACE = """
import os, signal, sys
real_replace = os.replace
calls = [0]
def replace(src, dst, *a, **k):
    calls[0] += 1
    if calls[0] == int(os.environ["KILL_AT"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst, *a, **k)
os.replace = replace
from tfckpt.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def forker(tmp_path):
    """Each killed run a process of its own, forked from one that started Python and
    imported numpy once (not tfckpt: the patch of os.replace comes first, as in a fresh
    interpreter)."""
    with ch.Forker("numpy", tmp_dir=tmp_path / "forked") as forker:
        yield forker


def test_in_place_killed_at_every_step_leaves_old_or_new(forker, tmp_path):
    """SIGKILL before each rename of an in-place edit (data shards, then the index): until
    the index is replaced TensorFlow loads the old checkpoint, its files byte for byte as
    they were; after, the new one; never a mix."""
    pristine = os.path.dirname(write_tf1(tmp_path / "pristine"))
    old = tf_values(os.path.join(pristine, "model.ckpt-2"))
    before = _files(pristine)
    new = dict(old, global_step=np.int64(0))
    states = []
    for kill_at in range(1, 12):
        directory = str(tmp_path / f"run{kill_at}")
        shutil.copytree(pristine, directory)
        prefix = os.path.join(directory, "model.ckpt-2")
        env = ch.user_env(KILL_AT=str(kill_at))
        args = ["edit", prefix, "--in-place", "--set", "global_step=0", "--max-shard-bytes", "300"]
        proc = forker.run(KILL_AT_REPLACE, *args, env=env)
        if proc.returncode == 0:
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        values = tf_values(prefix)
        state = "old" if values["global_step"] == 2 else "new"
        expected = old if state == "old" else new
        assert sorted(values) == sorted(expected)
        for name, value in expected.items():
            assert np.array_equal(values[name], value), (kill_at, name)
        if state == "old":
            now = _files(directory)
            assert {f: now[f] for f in before} == before, kill_at
        states.append(state)
    else:
        pytest.fail("the in-place edit never completed")
    assert len(states) >= 3 and states[:3] == ["old"] * 3, states  # the data files moving
    assert tf_values(prefix)["global_step"] == 0
    restored = tf1_restore(prefix, new)
    assert all(np.array_equal(restored[n], v) for n, v in new.items())
    # A completed run leaves one checkpoint: no temporaries, no old data files.
    left = [f for f in os.listdir(directory) if f.startswith("model.ckpt-2")]
    assert all(".tfckpt-tmp-" not in f for f in left), left
    data = [f for f in left if ".data-" in f]
    assert {int(f.rsplit("-of-", 1)[1]) for f in data} == {len(data)}, left


def test_literals_in_every_numeric_dtype(tmp_path):
    """Each literal cast to the tensor's dtype as documented, read back by TensorFlow."""
    import ml_dtypes

    tensors = {
        "h": np.zeros(3, np.float16),
        "bf": np.zeros(2, ml_dtypes.bfloat16),
        "d": np.zeros((2, 2), np.float64),
        "i8": np.zeros(2, np.int8),
        "u16": np.zeros(2, np.uint16),
        "b": np.zeros(3, bool),
        "c": np.zeros(2, np.complex64),
    }
    src = str(tmp_path / "src" / "model")
    tf.raw_ops.SaveV2(
        prefix=src,
        tensor_names=list(tensors),
        shape_and_slices=[""] * len(tensors),
        tensors=[tf.constant(v) for v in tensors.values()],
    )
    dst = str(tmp_path / "out" / "model")
    tfckpt.edit(
        src,
        dst,
        set={"h": "[0.1, 65504, -2]", "d": "[[0.1, 1e300], [-0.0, 3]]", "i8": "[-128, 127]"},
        fill={"bf": "0.1", "u16": "65535", "b": "ones", "c": "zeros"},
    )
    got = tf_values(dst)
    assert np.array_equal(got["h"], np.array([0.1, 65504, -2], np.float16))
    assert np.array_equal(got["bf"], np.full(2, 0.1, ml_dtypes.bfloat16).astype(np.float32))
    assert np.array_equal(got["d"], np.array([[0.1, 1e300], [-0.0, 3]]))
    assert np.signbit(got["d"][1, 0])
    assert np.array_equal(got["i8"], np.array([-128, 127], np.int8))
    assert np.array_equal(got["u16"], np.full(2, 65535, np.uint16))
    assert got["b"].all() and not got["c"].any()
    for flag, item, fragment in [
        ("--set", "h=[65520, 0, 0]", "without loss"),  # a whole number float16 rounds
        ("--set", "h=[1e5, 0, 0]", "range of float16"),
        ("--set", "i8=[128, 0]", "without loss"),
        ("--fill", "u16=-1", "without loss"),
        ("--fill", "b=2", "without loss"),
        ("--set", "d=[0.1, 1]", "shape [2]"),
    ]:
        ch.assert_cli_error(
            ch.in_process("edit", src, str(tmp_path / "bad"), flag, item), fragment, item[:1]
        )


def test_partitioned_tensors_are_copied_not_edited(tmp_path):
    from tests.tf_checkpoints import write_tf1_partitioned

    src = write_tf1_partitioned(tmp_path).prefix
    dst = str(tmp_path / "out" / "model")
    ch.assert_cli_error(
        ch.in_process("edit", src, dst, "--scale", "emb/table=2"), "emb/table", "partitioned"
    )
    tfckpt.edit(src, dst, set={"plain": "[5, 4, 3, 2, 1, 0]"})
    before, after = tf_values(src), tf_values(dst)
    assert np.array_equal(after.pop("plain"), np.arange(6, dtype=np.int32)[::-1])
    before.pop("plain")
    assert sorted(after) == sorted(before)
    assert all(np.array_equal(after[n], v) for n, v in before.items())


def test_in_place_takes_a_v2_checkpoint_only(tmp_path):
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("w", initializer=np.ones(3, np.float32))
        saver = tf.compat.v1.train.Saver(write_version=tf.compat.v1.train.SaverDef.V1)
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            prefix = saver.save(s, str(tmp_path / "v1.ckpt"), write_meta_graph=False)
    before = _files(tmp_path)
    ch.assert_cli_error(ch.in_process("edit", prefix, "--in-place", "--fill", "w=0"), "V2")
    ch.assert_cli_error(ch.in_process("edit", prefix, "--fill", "w=0"), "destination")
    assert _files(tmp_path) == before
    rc, _, err = ch.in_process("edit", prefix, str(tmp_path / "v2" / "w"), "--fill", "w=0")
    assert rc == 0, err
    assert not tf_values(str(tmp_path / "v2" / "w"))["w"].any()


def test_in_place_failing_mid_run_leaves_the_source_as_it_was(tmp_path):
    """A value found lossy only while it is written (a .npy of float64 into float32): the
    run fails after other tensors were written, and the source is untouched."""
    prefix = write_tf1(tmp_path / "run")
    directory = os.path.dirname(prefix)
    np.save(tmp_path / "k.npy", np.full((4, 3), 0.1))  # 0.1 is no float32
    before = _files(directory)
    result = ch.in_process(
        "edit",
        prefix,
        "--in-place",
        "--fill",
        "emb=ones",
        "--set",
        f"dense/kernel=@{tmp_path}/k.npy",
    )
    ch.assert_cli_error(result, "dense/kernel", "without loss")
    assert _files(directory) == before
    assert tf_values(prefix)["emb"].any()


def test_in_place_on_an_object_store(tmp_path):
    """Where nothing renames (an fsspec memory:// store), the new index written last is
    the commit and the old data objects go after; TensorFlow reads what is left."""
    fsspec = pytest.importorskip("fsspec")
    prefix = write_tf1(tmp_path / "run")
    fs = fsspec.filesystem("memory")
    root = f"/edit-{os.getpid()}"
    for f in os.listdir(os.path.dirname(prefix)):
        fs.pipe(f"{root}/{f}", (tmp_path / "run" / f).read_bytes())
    try:
        tfckpt.edit(f"memory://{root}/model.ckpt-2", in_place=True, fill={"emb": "ones"})
        names = [p.rsplit("/", 1)[1] for p in fs.ls(root, detail=False)]
        data = [n for n in names if ".data-" in n]
        assert data and all(n.endswith(f"-of-{len(data):05d}") for n in data), names
        local = tmp_path / "back"
        local.mkdir()
        for n in names:
            (local / n).write_bytes(fs.cat_file(f"{root}/{n}"))
    finally:
        fs.rm(root, recursive=True)
    got, old = tf_values(str(local / "model.ckpt-2")), tf_values(prefix)
    assert np.array_equal(got.pop("emb"), np.ones((6, 4), np.float32))
    old.pop("emb")
    assert all(np.array_equal(got[n], v) for n, v in old.items()) and sorted(got) == sorted(old)


def test_tf1_delete_takes_the_variables_optimizer_slots(tf1, tmp_path):
    """``--delete '^emb$'`` removes ``emb``, ``emb/Adam`` and ``emb/Adam_1``; a TF1 Saver
    restores the output, every variable of a graph without ``emb`` (its Adam slots and
    beta powers made by ``minimize``) found with the values it had."""
    src = tf_values(tf1)
    dst = str(tmp_path / "out" / "model.ckpt")
    rc, _, err = ch.in_process("edit", tf1, dst, "--delete", "^emb$")
    assert rc == 0, err
    got = tf_values(dst)
    assert sorted(got) == sorted(n for n in src if n.split("/")[0] != "emb")
    with tf.Graph().as_default():
        k = tf.compat.v1.get_variable("dense/kernel", shape=(4, 3))
        b = tf.compat.v1.get_variable("dense/bias", shape=(3,))
        step = tf.compat.v1.train.get_or_create_global_step()
        loss = tf.reduce_sum((tf.matmul(tf.ones((1, 4)), k) + b) ** 2)
        tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, global_step=step)
        variables = tf.compat.v1.global_variables()
        assert len(variables) == len(got)  # nothing in the graph the output lacks
        with tf.compat.v1.Session() as s:
            tf.compat.v1.train.Saver().restore(s, dst)  # fails on a missing variable
            for v in variables:
                assert np.array_equal(s.run(v), src[v.op.name]), v.op.name
