"""``tfckpt average``: means of checkpoints TensorFlow wrote during a training run,
checked bit for bit against averages computed here from TensorFlow's own reading, and
restored into the models that wrote them."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import average_checkpoints as ac  # noqa: E402
from cli_helpers import assert_cli_error, in_process  # noqa: E402

import tfckpt  # noqa: E402

FLOAT_TF1 = ("dense/kernel", "dense/bias", "emb", "half", "cplx")


@pytest.fixture(scope="module")
def tf1_run(tmp_path_factory):
    return ac.write_tf1_run(tmp_path_factory.mktemp("tf1_run"))


@pytest.fixture(scope="module")
def tf2_run(tmp_path_factory):
    return ac.write_tf2_run(tmp_path_factory.mktemp("tf2_run"))


def expected_mean(values: list[np.ndarray], weights=None) -> np.ndarray:
    """(w1 x1 + ... + wn xn) / (w1 + ... + wn) in float64 (complex128), in source order,
    rounded to the sources' dtype by tf.cast."""
    weights = weights or [1.0] * len(values)
    if np.iscomplexobj(values[0]):  # each part on its own
        real = expected_mean([np.real(v) for v in values], weights)
        imag = expected_mean([np.imag(v) for v in values], weights)
        return (real + 1j * imag).astype(values[0].dtype)
    acc = np.asarray(values[0], dtype=np.float64) * weights[0]
    for v, w in zip(values[1:], weights[1:]):
        acc = acc + np.asarray(v, dtype=np.float64) * w
    acc = acc / sum(weights)
    return tf.cast(acc, tf.as_dtype(values[0].dtype)).numpy()


def tf_values(prefixes: list[str], name: str) -> list[np.ndarray]:
    return [tf.train.load_checkpoint(p).get_tensor(name) for p in prefixes]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def restore_tf1(prefix: str, with_ema: bool) -> dict:
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        variables, _, _ = ac.tf1_graph(with_ema=with_ema)
        with v1.Session() as sess:
            v1.train.Saver().restore(sess, prefix)
            got = sess.run({n: v for n, v in variables.items() if n != "emb"})
            got["emb"] = np.concatenate(sess.run(list(variables["emb"])))
    return got


def test_tf1_last_n_is_the_mean_tensorflow_computes_and_restores(tf1_run, tmp_path):
    rc, _, err = in_process("average", "--last", "3", tf1_run["dir"], "-o", f"{tmp_path}/avg/")
    assert rc == 0, err
    newest3 = tf1_run["prefixes"][-3:]
    out = str(tmp_path / "avg" / "model.ckpt-5")  # the newest's name inside the directory
    assert tf.train.latest_checkpoint(str(tmp_path / "avg")) == out
    reader = tf.train.load_checkpoint(out)
    shadows = ("dense/kernel/ExponentialMovingAverage", "dense/bias/ExponentialMovingAverage")
    expected = {}
    for name in FLOAT_TF1 + shadows:
        expected[name] = expected_mean(tf_values(newest3, name))
        assert same_bits(reader.get_tensor(name), expected[name]), name
    for name in ("global_step", "tag"):  # from the newest source
        assert reader.get_tensor(name) == tf_values(newest3[-1:], name)[0]
    assert reader.get_tensor("tag") == tf1_run["values"][-1]["tag"] != tf1_run["values"][-2]["tag"]
    with tfckpt.open(out) as ck:
        assert len(ck.info("emb").slices) == 2  # still partitioned as the sources
    got = restore_tf1(out, with_ema=True)
    for name in FLOAT_TF1:
        assert same_bits(got[name], expected[name]), name
    assert got["global_step"] == 5
    # Independently of TensorFlow's reading: the values the session held at each save.
    kernels = [v["dense/kernel"].astype(np.float64) for v in tf1_run["values"][-3:]]
    np.testing.assert_allclose(got["dense/kernel"], sum(kernels) / 3, rtol=1e-6)


def test_tf1_weights_and_dtype(tf1_run, tmp_path):
    prefixes = tf1_run["prefixes"][-3:]
    weights = [1.0, 2.0, 5.0]
    sm = tfckpt.average(prefixes, tmp_path / "w/avg", weights=weights, cast="bfloat16")
    assert sm.cast == 6  # dense/kernel, dense/bias, their shadows, emb, half
    reader = tf.train.load_checkpoint(str(tmp_path / "w/avg"))
    for name in ("dense/kernel", "dense/bias", "emb", "half"):
        wide = [v.astype(np.float64) for v in tf_values(prefixes, name)]
        mean = sum(w * v for w, v in zip(weights, wide)) / sum(weights)
        want = tf.cast(mean, tf.bfloat16).numpy()
        assert same_bits(reader.get_tensor(name), want), name
    assert same_bits(reader.get_tensor("cplx"), expected_mean(tf_values(prefixes, "cplx"), weights))


def test_dtype_rules_per_name(tf1_run, tmp_path):
    prefixes = tf1_run["prefixes"][-2:]
    out = tmp_path / "rules" / "avg"
    flags = ["--dtype", "float16", "--keep-dtype", "^emb$", "--dtype-rule", "dense/bias$=bfloat16"]
    rc, text, err = in_process("average", *prefixes, "-o", out, *flags, "--dry-run")
    assert rc == 0, err
    assert "DTYPE BY" in text and "dtype keep ^emb$: 1 tensors" in text
    rc, _, err = in_process("average", *prefixes, "-o", out, *flags)
    assert rc == 0, err
    assert "dtype rule dense/bias$=bfloat16: 1 tensors" in err
    reader = tf.train.load_checkpoint(str(out))
    dtypes = reader.get_variable_to_dtype_map()
    assert dtypes["emb"] == tf.float32
    assert dtypes["dense/bias"] == tf.bfloat16
    assert dtypes["dense/kernel"] == tf.float16
    wide = [v.astype(np.float64) for v in tf_values(prefixes, "dense/bias")]
    want = tf.cast(sum(wide) / 2, tf.bfloat16).numpy()
    assert same_bits(reader.get_tensor("dense/bias"), want)
    assert same_bits(reader.get_tensor("emb"), expected_mean(tf_values(prefixes, "emb")))


def test_tf1_use_ema_writes_the_shadows_as_the_variables(tf1_run, tmp_path):
    newest3 = tf1_run["prefixes"][-3:]
    out = tmp_path / "ema" / "avg"
    rc, _, err = in_process("average", *newest3, "-o", out, "--use-ema", "--chunk-bytes", "64")
    assert rc == 0, err
    names = [n for n, _ in tf.train.list_variables(str(out))]
    assert not [n for n in names if "ExponentialMovingAverage" in n]
    reader = tf.train.load_checkpoint(str(out))
    for name in ("dense/kernel", "dense/bias"):
        want = expected_mean(tf_values(newest3, name + "/ExponentialMovingAverage"))
        assert same_bits(reader.get_tensor(name), want), name
        # the shadows TensorFlow held, averaged
        held = [e[name].astype(np.float64) for e in tf1_run["ema"][-3:]]
        np.testing.assert_allclose(reader.get_tensor(name), sum(held) / 3, rtol=1e-6)
    got = restore_tf1(str(out), with_ema=False)  # a graph without the averages restores it
    assert same_bits(got["dense/kernel"], reader.get_tensor("dense/kernel"))
    assert same_bits(got["emb"], expected_mean(tf_values(newest3, "emb")))


def test_tf2_keras_ema_without_optimizer_restores_into_the_model(tf2_run, tmp_path):
    out = tmp_path / "ema"
    rc, _, err = in_process(
        "average",
        "--last",
        "3",
        tf2_run["dir"],
        "-o",
        f"{out}/",
        "--use-ema",
        "--drop-object",
        "optimizer",
    )
    assert rc == 0, err
    prefix = tf.train.latest_checkpoint(str(out))
    assert prefix.endswith("ckpt-4")
    names = [n for n, _ in tf.train.list_variables(prefix)]
    assert not [n for n in names if n.startswith("optimizer/_variables/")], names
    model, _ = ac.keras_model(use_ema=False, compile=False)
    tf.train.Checkpoint(model=model).restore(prefix).assert_consumed()
    for k, got in enumerate(model.get_weights()):
        want = expected_mean([e[k] for e in tf2_run["ema"][-3:]])
        assert same_bits(got, want), k
        assert not same_bits(got, expected_mean([w[k] for w in tf2_run["weights"][-3:]]))


def test_tf2_plain_average_keeps_the_optimizer(tf2_run, tmp_path):
    prefixes = tf2_run["prefixes"][-3:]
    tfckpt.average(prefixes, f"{tmp_path}/avg/")
    prefix = str(tmp_path / "avg" / "ckpt-4")
    model, opt = ac.keras_model(use_ema=True)
    opt.build(model.trainable_variables)
    tf.train.Checkpoint(model=model, optimizer=opt).restore(prefix).assert_consumed()
    for k, got in enumerate(model.get_weights()):
        assert same_bits(got, expected_mean([w[k] for w in tf2_run["weights"][-3:]])), k
    for k, shadow in enumerate(opt._model_variables_moving_average):
        assert same_bits(shadow.numpy(), expected_mean([e[k] for e in tf2_run["ema"][-3:]]))
    assert int(opt.iterations.numpy()) == tf2_run["iterations"][-1]  # from the newest
    graph = "_CHECKPOINTABLE_OBJECT_GRAPH"
    newest = tf.train.load_checkpoint(prefixes[-1]).get_tensor(graph)
    assert tf.train.load_checkpoint(prefix).get_tensor(graph) == newest


def test_a_failed_run_leaves_nothing(tf1_run, tmp_path):
    calls = []

    def progress(nbytes):
        calls.append(nbytes)
        if len(calls) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tfckpt.average(tf1_run["prefixes"][-3:], tmp_path / "o" / "avg", progress=progress)
    assert list(tmp_path.iterdir()) == []


def test_dry_run_plan(tf1_run, tmp_path):
    rc, out, err = in_process(
        "average", "--last", "2", tf1_run["dir"], "-o", tmp_path / "x", "--dry-run", "--json"
    )
    assert rc == 0, err
    plan = json.loads(out)
    assert plan["sources"] == tf1_run["prefixes"][-2:]
    by_name = {t["new_name"]: t for t in plan["tensors"]}
    assert by_name["dense/kernel"]["averaged"] and not by_name["global_step"]["averaged"]
    assert not (tmp_path / "x.index").exists()


def _save(prefix, tensors: dict) -> str:
    names = list(tensors)
    tf.raw_ops.SaveV2(
        prefix=str(prefix),
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[tensors[n] for n in names],
    )
    return str(prefix)


def test_errors(tf1_run, tmp_path):
    a = _save(tmp_path / "a", {"w": np.zeros((2, 3), np.float32), "s": np.int64(1)})
    b = _save(tmp_path / "b", {"w": np.zeros((3, 2), np.float32), "s": np.int64(2)})
    c = _save(tmp_path / "c", {"v": np.zeros((2, 3), np.float32), "s": np.int64(2)})
    assert_cli_error(in_process("average", a, b, "-o", tmp_path / "o"), "'w'", "[2, 3]", "[3, 2]")
    assert_cli_error(in_process("average", a, c, "-o", tmp_path / "o"), "'v'", "differ")
    assert_cli_error(
        in_process("average", a, a, "-o", tmp_path / "o", "--weights", "1"), "1 weights for 2"
    )
    assert_cli_error(
        in_process("average", a, a, "-o", tmp_path / "o", "--weights", "1", "-1"), "non-zero sum"
    )
    assert_cli_error(
        in_process("average", "--last", "4", tf1_run["dir"], "-o", tmp_path / "o"),
        "asked for the 4 newest",
        "lists 3",
    )
    assert_cli_error(
        in_process("average", a, a, "-o", tmp_path / "o", "--use-ema"), "no exponential moving"
    )
    for options in ({"include": ["w"]}, {"rename": {"w": "v"}}, {"backend": "tf"}):
        with pytest.raises(tfckpt.CheckpointError, match="average does not take"):
            tfckpt.average([a, a], tmp_path / "o", **options)
    assert not list(tmp_path.glob("o*"))


def test_memory_is_bounded_by_the_chunk_budget(tmp_path):
    """5 sources of 8 MiB each (40 MiB), averaged with a 1 MiB budget: the peak of
    everything Python and numpy allocate stays under budget x sources, below one source."""
    rng = np.random.default_rng(5)
    prefixes = [
        _save(tmp_path / f"s{k}", {"big": rng.normal(size=(2048, 1024)).astype(np.float32)})
        for k in range(5)
    ]
    budget = 1 << 20
    tracemalloc.start()
    try:
        tfckpt.average(prefixes, tmp_path / "avg", chunk_bytes=budget)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < budget * len(prefixes), peak
    got = tf.train.load_checkpoint(str(tmp_path / "avg")).get_tensor("big")
    assert same_bits(got, expected_mean(tf_values(prefixes, "big")))


def test_differently_partitioned_and_bfloat16_sources(tmp_path):
    """Sources partitioned differently are averaged row-major and written whole;
    bfloat16 is averaged in float64 and rounded back to the nearest bfloat16."""
    rng = np.random.default_rng(9)
    prefixes, embs, halves = [], [], []
    for k, cuts in enumerate(([0, 5, 10], [0, 3, 10], [0, 10])):
        emb = rng.normal(size=(10, 4)).astype(np.float32)
        b16 = tf.constant(rng.normal(size=(3, 5)), tf.bfloat16)
        names, specs, values = ["b16"], [""], [b16]
        for lo, hi in zip(cuts, cuts[1:]):
            names.append("emb")
            specs.append(f"10 4 {lo},{hi - lo}:-")
            values.append(emb[lo:hi])
        prefix = str(tmp_path / f"p{k}")
        tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=specs, tensors=values)
        prefixes.append(prefix)
        embs.append(emb)
        halves.append(b16.numpy())
    tfckpt.average(prefixes, tmp_path / "avg", chunk_bytes=64)
    reader = tf.train.load_checkpoint(str(tmp_path / "avg"))
    assert same_bits(reader.get_tensor("emb"), expected_mean(embs))
    assert same_bits(reader.get_tensor("b16"), expected_mean(halves))
    with tfckpt.open(tmp_path / "avg") as ck:
        assert not ck.info("emb").slices
    # the same slicing everywhere: averaged slice by slice, still partitioned
    tfckpt.average(prefixes[:1] * 2, tmp_path / "same")
    with tfckpt.open(tmp_path / "same") as ck:
        assert len(ck.info("emb").slices) == 2
        assert same_bits(ck["emb"], embs[0])


def test_every_dtype_averaged_with_itself_is_itself(tf_checkpoints, tmp_path):
    """Every dtype TensorFlow saves, with its sharp values (NaN, ±inf, -0.0, subnormals,
    the largest float64): the mean of a checkpoint and itself is the checkpoint."""
    case = tf_checkpoints("all_dtypes")
    out = str(tmp_path / "avg")
    tfckpt.average([case.path, case.path], out, chunk_bytes=64)
    assert tfckpt.verify_with_tf(out)["mismatches"] == []
    with tfckpt.open(case.path) as a, tfckpt.open(out) as b:
        assert a.keys() == b.keys()
        for name in a.keys():
            x, y = a[name], b[name]
            assert (a.info(name).dtype, x.shape) == (b.info(name).dtype, y.shape), name
            if x.dtype.kind in "fcV" and a.info(name).dtype.startswith(
                ("float", "bfloat", "complex")
            ):
                with np.errstate(invalid="ignore"):  # float8 NaNs
                    wide = x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)
                    back = y.astype(wide.dtype)
                for u, v in ((wide.real, back.real), (wide.imag, back.imag)):
                    nan = np.isnan(u)
                    assert (nan == np.isnan(v)).all(), name
                    assert u[~nan].tobytes() == v[~nan].tobytes(), name
            elif x.dtype == object:
                assert x.tolist() == y.tolist(), name
            else:
                assert x.tobytes() == y.tobytes(), name


def test_overflow_policy_and_nothing_written_on_error(tmp_path):
    """Weights beyond [0, 1] can take a mean out of float16's range: an error naming the
    tensor, with nothing written, unless --overflow clip."""
    a = _save(tmp_path / "a", {"h": np.array([-60000.0, 1.0], np.float16)})
    b = _save(tmp_path / "b", {"h": np.array([60000.0, 2.0], np.float16)})
    args = ("average", a, b, "-o", tmp_path / "out", "--weights", "-1", "2")
    assert_cli_error(in_process(*args), "h (1 values)", "nothing written")
    assert not list(tmp_path.glob("out*"))
    rc, _, err = in_process(*args, "--overflow", "clip")
    assert rc == 0, err
    got = tf.train.load_checkpoint(str(tmp_path / "out")).get_tensor("h")
    assert same_bits(got, np.array([65504.0, 3.0], np.float16))


def test_object_store_sources_and_destination(tf2_run, tmp_path):
    """memory:// as the sources' directory (state file included) and the destination:
    the same bytes as a local run."""
    import uuid

    import fsspec

    fs = fsspec.filesystem("memory")
    root = f"/avg{uuid.uuid4().hex[:12]}"
    try:
        fs.put(tf2_run["dir"], f"{root}/run", recursive=True)
        tfckpt.average(f"memory:/{root}/run", f"memory:/{root}/out/", last=3, use_ema=True)
        tfckpt.average(tf2_run["dir"], f"{tmp_path}/out/", last=3, use_ema=True)
        local = sorted(p.name for p in (tmp_path / "out").iterdir())
        remote = sorted(p.rsplit("/", 1)[1] for p in fs.ls(f"{root}/out", detail=False))
        assert local == remote
        for name in local:
            assert fs.cat_file(f"{root}/out/{name}") == (tmp_path / "out" / name).read_bytes()
    finally:
        fs.rm(root, recursive=True)


def test_small_tensors_are_averaged_in_batches_as_each_alone(tmp_path, monkeypatch):
    """Small tensors are read together from every source and summed a batch at a time
    (one run per dtype): each mean is the one computed for it alone, bit for bit,
    across dtypes mixed in one batch, weights, float64 values whose weighted sum
    overflows, a tensor partitioned in an older source only, and copied integers; cast,
    the counts are each tensor's."""
    from tfckpt.rewrite import streaming

    np.seterr(over="ignore", invalid="ignore")  # float16 sources overflow to inf
    rng = np.random.default_rng(11)
    dtypes = [np.float16, np.float32, np.float64, tf.bfloat16.as_numpy_dtype, np.float32]
    weights = [1.0, 2.0, 5.0]
    values: dict[str, list] = {}
    for k in range(60):
        dtype = dtypes[k % len(dtypes)]
        values[f"t{k:02d}"] = [
            # up to float16's largest values, so that casts overflow
            np.clip(rng.normal(size=(3, k % 7 + 1)) * 3e4, -65504, 65504).astype(dtype)
            for _ in weights
        ]
    big = np.finfo(np.float64).max
    values["huge"] = [
        np.array([big, -big, 1.0]),
        np.array([big / 2, -big, 2.0]),
        np.array([big, 0.0, 3.0]),
    ]
    values["step"] = [np.array(k, np.int64) for k in range(3)]
    prefixes = []
    for s in range(3):
        names = sorted(values)
        tensors = [values[n][s] for n in names]
        specs = [""] * len(names)
        if s == 0:  # "t01" partitioned in the oldest source only
            i = names.index("t01")
            whole = tensors[i]
            names[i : i + 1] = ["t01", "t01"]
            specs[i : i + 1] = ["3 2 0,1:-", "3 2 1,2:-"]
            tensors[i : i + 1] = [whole[:1], whole[1:]]
        prefix = str(tmp_path / f"s{s}")
        tf.raw_ops.SaveV2(
            prefix=prefix, tensor_names=names, shape_and_slices=specs, tensors=tensors
        )
        prefixes.append(prefix)
    tfckpt.average(prefixes, tmp_path / "avg", weights=weights)
    reader = tf.train.load_checkpoint(str(tmp_path / "avg"))
    assert reader.get_tensor("step") == 2
    assert np.isfinite(reader.get_tensor("huge")).all()  # summed again, divided first
    for name, vals in values.items():
        if name not in ("step", "huge"):
            assert same_bits(reader.get_tensor(name), expected_mean(vals, weights)), name

    def written(out: str) -> tuple:
        summary = tfckpt.average(
            prefixes, tmp_path / out, weights=weights, cast="float16", overflow="clip"
        )
        files = sorted(tmp_path.glob(f"{out}.*"))
        return [f.read_bytes() for f in files], dict(summary.cast_counts)

    batches = []
    real = streaming._batch_means
    monkeypatch.setattr(streaming, "_batch_means", lambda *a: batches.append(1) or real(*a))
    batched = written("cast")
    assert batches  # read in batches
    assert any(c.overflow for c in batched[1].values())  # clipped to float16's range
    # Every mean read on its own, never in a batch: the same bytes and counts.
    original = streaming._batch_of
    monkeypatch.setattr(
        streaming, "_batch_of", lambda item, n: None if item.weights else original(item, n)
    )
    assert written("alone") == batched
