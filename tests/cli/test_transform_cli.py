"""``tfckpt convert / rename / select / merge`` run as a user runs them (``python -m tfckpt`` in a
separate process) on checkpoints TensorFlow wrote; TensorFlow restores what they write.

Every test checks (autouse fixture) that the source checkpoints are byte-identical afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import tf_checkpoints as tfc  # noqa: E402  (conftest put tests/ on sys.path)
import transform_helpers as th  # noqa: E402
from cli_helpers import assert_cli_error, run_text  # noqa: E402

import tfckpt  # noqa: E402


@pytest.fixture(scope="module")
def src(tmp_path_factory, tf_checkpoints):
    root = tmp_path_factory.mktemp("transform_cli_sources")
    for d in ("tf1", "merge", "ovf"):
        (root / d).mkdir()
    prefix, values = th.write_tf1_float32(root / "tf1")
    merge = th.write_tf1_merge_sources(root / "merge")
    ovf = th.save_v2(
        root / "ovf" / "ovf",
        {
            "w": np.array([1.0, 70000.0, -1e6, 0.5], dtype=np.float32),
            "ok": np.array([1.5, 2.5], dtype=np.float64),
        },
    )
    keras = tf_checkpoints("keras_manager")
    return SimpleNamespace(
        root=root,
        tf1=prefix,
        values=values,
        merge=merge,
        ovf=ovf,
        keras=keras,
        roots=[root, Path(keras.path)],
    )


@pytest.fixture(autouse=True)
def sources_untouched(src):
    before = th.digests(*src.roots)
    yield
    assert th.digests(*src.roots) == before, "a command modified a source checkpoint"


def ok(proc):
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def names(prefix) -> list[str]:
    return [n for n, _ in tf.train.list_variables(str(prefix))]


# ---------------------------------------------------------------- each command


def test_convert(src, tmp_path):
    proc = ok(run_text("convert", src.tf1, f"{tmp_path}/", "--dtype", "float16"))
    out = tmp_path / "model.ckpt-1234"
    assert proc.stdout == ""
    assert proc.stderr.startswith(f"wrote {out}: 5 tensors kept, 0 dropped, 0 renamed, 4 cast")
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(out)
    restored = th.tf1_restore(out, th.specs_of(src.values, tf.float16))
    for name, v in src.values.items():
        want = v if v.dtype == np.int64 else v.astype(np.float16)
        assert restored[name].tobytes() == want.tobytes(), name


def test_rename_with_map_and_map_file(src, tmp_path):
    map_file = tmp_path / "renames.json"
    map_file.write_text(json.dumps({"global_step": "train/step", "conv/biases": "c1/b"}))
    out = tmp_path / "out" / "renamed"
    ok(
        run_text(
            "rename",
            src.tf1,
            out,
            "--map",
            r"(conv|dense)/(\w+)=\1_layer/\2",
            "--map",
            "dense=never",
            "--map-file",
            map_file,
        )
    )
    expected = {
        "train/step": "global_step",
        "c1/b": "conv/biases",  # exact names win
        "conv_layer/weights": "conv/weights",
        "dense_layer/kernel": "dense/kernel",
        "dense_layer/bias": "dense/bias",
    }
    assert names(out) == sorted(expected)
    restored = th.tf1_restore(
        out,
        {
            new: (tf.as_dtype(src.values[old].dtype), src.values[old].shape)
            for new, old in expected.items()
        },
    )
    for new, old in expected.items():
        assert restored[new].tobytes() == src.values[old].tobytes(), new


def test_select(src, tmp_path):
    out = tmp_path / "sel"
    ok(
        run_text(
            "select",
            src.tf1,
            out,
            "--include",
            "^conv/",
            "--include",
            "step",
            "--exclude",
            "biases$",
        )
    )
    assert names(out) == ["conv/weights", "global_step"]
    kept = {k: src.values[k] for k in ("conv/weights", "global_step")}
    restored = th.tf1_restore(out, th.specs_of(kept))
    for k, v in kept.items():
        assert restored[k].tobytes() == v.tobytes()


def test_merge(src, tmp_path):
    (pa, va), (pb, vb), (pc, vc) = (src.merge[k] for k in "abc")
    out = tmp_path / "merged"
    ok(run_text("merge", pa, pb, "-o", out))
    union = {**va, **vb}
    assert names(out) == sorted(union)
    restored = th.tf1_restore(out, th.specs_of(union))
    for k, v in union.items():
        assert restored[k].tobytes() == v.tobytes(), k

    for prefer, winner in (("first", va), ("last", vc)):
        out = tmp_path / f"prefer_{prefer}"
        ok(run_text("merge", pa, pc, "-o", out, "--prefer", prefer))
        restored = th.tf1_restore(out, th.specs_of({**va, **vc}))
        assert restored["enc/kernel"].tobytes() == winner["enc/kernel"].tobytes(), prefer
        assert restored["head/w"].tobytes() == vc["head/w"].tobytes()


def test_every_command_takes_every_option(src, tmp_path):
    """Options are not tied to their namesake command."""
    out = tmp_path / "a" / "m"
    ok(
        run_text(
            "rename",
            src.tf1,
            out,
            "--map",
            "conv/=c/",
            "--dtype",
            "bfloat16",
            "--from",
            "float32,float64",
            "--exclude",
            "^dense/",
            "--max-shard-bytes",
            "100",
        )
    )
    assert names(out) == ["c/biases", "c/weights", "global_step"]
    assert th.tf_dtypes(out) == {
        "c/biases": "bfloat16",
        "c/weights": "bfloat16",
        "global_step": "int64",
    }
    with tfckpt.open(out) as c:
        assert c.header.num_shards == 3  # 16 + 288 + 8 bytes, cut at 100
    w = th.tf_reader_values(out)["c/weights"]
    assert w.tobytes() == tf.cast(src.values["conv/weights"], tf.bfloat16).numpy().tobytes()

    out = tmp_path / "b" / "m"
    ok(
        run_text(
            "select",
            src.tf1,
            out,
            "--include",
            "bias",
            "--map",
            "dense/=d/",
            "--dtype",
            "float64",
            "--overwrite",
        )
    )
    assert th.tf_dtypes(out) == {"conv/biases": "float64", "d/bias": "float64"}

    pa, pb = src.merge["a"][0], src.merge["b"][0]
    out = tmp_path / "c" / "m"
    ok(
        run_text(
            "merge",
            pa,
            pb,
            "-o",
            out,
            "--dtype",
            "float32",
            "--from",
            "float64",
            "--include",
            "kernel",
            "--map",
            "(enc|dec)/=\\1oder/",
        )
    )
    assert th.tf_dtypes(out) == {"encoder/kernel": "float32", "decoder/kernel": "float32"}

    out = tmp_path / "d" / "m"
    ok(
        run_text(
            "convert",
            src.tf1,
            out,
            "--dtype",
            "float16",
            "--include",
            "^dense",
            "--map",
            "dense/=head/",
            "--max-shard-bytes",
            "1M",
        )
    )
    assert th.tf_dtypes(out) == {"head/kernel": "float16", "head/bias": "float16"}


def test_tf_backend_writes_the_same_bytes(src, tmp_path):
    """``--backend tf`` (tf.cast in the CLI process) writes what the default numpy backend
    writes, on values without float32-range subnormals (see test_transform_tf for those)."""
    ok(run_text("convert", src.tf1, tmp_path / "np", "--dtype", "float16"))
    ok(
        run_text(
            "convert",
            src.tf1,
            tmp_path / "tf",
            "--dtype",
            "float16",
            "--backend",
            "tf",
            "--tf-threshold",
            "1",
        )
    )
    for a, b in zip(th.checkpoint_files(tmp_path / "np"), th.checkpoint_files(tmp_path / "tf")):
        assert a.name[:2] == "np" and b.name[:2] == "tf" and a.name[2:] == b.name[2:]
        assert a.read_bytes() == b.read_bytes(), a.name


# ---------------------------------------------------------------- --dry-run and --json


DRY_RUNS = {
    "convert": lambda s, d: ["convert", s.tf1, d, "--dtype", "float16"],
    "rename": lambda s, d: ["rename", s.tf1, d, "--map", "dense/=head/"],
    "select": lambda s, d: ["select", s.tf1, d, "--exclude", "^conv/"],
    "merge": lambda s, d: ["merge", s.merge["a"][0], s.merge["b"][0], "-o", d],
}
PLAN_KWARGS = {
    "convert": lambda s: ([s.tf1], {"cast": "float16"}),
    "rename": lambda s: ([s.tf1], {"rename": [("dense/", "head/")]}),
    "select": lambda s: ([s.tf1], {"exclude": ["^conv/"]}),
    "merge": lambda s: ([s.merge["a"][0], s.merge["b"][0]], {}),
}


@pytest.mark.parametrize("command", list(DRY_RUNS))
def test_dry_run_prints_plan_and_writes_nothing(command, src, tmp_path):
    dst = tmp_path / "out" / "model"
    proc = ok(run_text(*DRY_RUNS[command](src, dst), "--dry-run"))
    assert th.listing(tmp_path) == []
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["SOURCE", "NAME", "NEW"]
    assert f"to {dst}," in lines[-1]
    if command == "convert":
        assert "float32->float16" in proc.stdout and "int64" in proc.stdout
    if command == "rename":
        assert "dense/kernel" in proc.stdout and "head/kernel" in proc.stdout
    if command == "select":
        assert "drop" in proc.stdout and "(excluded)" in proc.stdout

    proc = ok(run_text(*DRY_RUNS[command](src, dst), "--dry-run", "--json"))
    assert th.listing(tmp_path) == []
    data = json.loads(proc.stdout)
    assert set(data) == {
        "dst",
        "sources",
        "tensors",
        "dropped",
        "object_graph",
        "object_graph_copied",
        "bytes_in",
        "bytes_out",
    }
    for t in data["tensors"]:
        assert set(t) == {
            "source",
            "name",
            "new_name",
            "dtype",
            "new_dtype",
            "shape",
            "bytes_in",
            "bytes_out",
        }
    for d in data["dropped"]:
        assert set(d) == {"source", "name", "reason"}
    assert data["dst"] == str(dst) and data["object_graph"] is False
    assert data["bytes_in"] == sum(t["bytes_in"] for t in data["tensors"])
    assert data["bytes_out"] == sum(t["bytes_out"] for t in data["tensors"])
    sources, kwargs = PLAN_KWARGS[command](src)
    assert data == tfckpt.plan(sources, dst, **kwargs).to_dict()
    assert th.listing(tmp_path) == []


def test_dry_run_json_describes_the_cast(src, tmp_path):
    data = json.loads(
        ok(
            run_text(
                "convert",
                src.tf1,
                tmp_path / "o",
                "--dtype",
                "float16",
                "--dry-run",
                "--json",
                "--exclude",
                "bias",
            )
        ).stdout
    )
    by_name = {t["name"]: t for t in data["tensors"]}
    assert sorted(by_name) == ["conv/weights", "dense/kernel", "global_step"]
    assert by_name["conv/weights"]["new_dtype"] == "float16"
    assert by_name["conv/weights"]["bytes_out"] * 2 == by_name["conv/weights"]["bytes_in"]
    assert by_name["global_step"]["new_dtype"] == "int64"
    assert by_name["dense/kernel"]["shape"] == [72, 10]
    assert sorted(d["name"] for d in data["dropped"]) == ["conv/biases", "dense/bias"]
    assert {d["reason"] for d in data["dropped"]} == {"excluded"}


def test_json_summary(src, tmp_path):
    proc = ok(
        run_text(
            "convert", src.ovf, tmp_path / "o", "--dtype", "float16", "--overflow", "clip", "--json"
        )
    )
    data = json.loads(proc.stdout)
    assert set(data) == {
        "dst",
        "kept",
        "dropped",
        "renamed",
        "cast",
        "bytes_in",
        "bytes_out",
        "seconds",
        "overflow",
        "to_zero",
        "subnormal",
        "warnings",
    }
    assert data["dst"] == str(tmp_path / "o")
    assert (data["kept"], data["dropped"], data["renamed"], data["cast"]) == (2, 0, 0, 2)
    assert (data["bytes_in"], data["bytes_out"]) == (16 + 16, 8 + 4)
    assert data["overflow"] == {"w": 2} and data["to_zero"] == {} and data["subnormal"] == {}
    assert isinstance(data["seconds"], float)
    assert "2 values clipped or overflowed in 1 tensors" in proc.stderr
    w = th.tf_reader_values(tmp_path / "o")["w"]
    assert w.tolist() == [1.0, 65504.0, -65504.0, 0.5]


# ---------------------------------------------------------------- errors


def test_error_destination_is_source(src, tmp_path):
    tf1_dir = Path(src.tf1).parent
    assert_cli_error(
        run_text("convert", src.tf1, src.tf1, "--dtype", "float16"), "destination is a source"
    )
    # A directory destination takes the source's name: the source's own directory is refused.
    assert_cli_error(
        run_text("select", src.tf1, f"{tf1_dir}/", "--exclude", "x"), "destination is a source"
    )
    assert_cli_error(
        run_text("merge", src.merge["a"][0], src.tf1, "-o", src.tf1), "destination is a source"
    )
    # The source's .index names the source, as on the source's side (not X.index.index).
    assert_cli_error(
        run_text("convert", src.tf1, f"{src.tf1}.index", "--dtype", "float16", "--overwrite"),
        "destination is a source",
    )


def test_destination_named_by_its_index(src, tmp_path):
    ok(run_text("convert", src.tf1, tmp_path / "m.index", "--dtype", "float16"))
    assert not (tmp_path / "m.index.index").exists()
    assert set(th.tf_dtypes(tmp_path / "m").values()) == {"float16", "int64"}


def test_error_existing_destination(src, tmp_path):
    out = tmp_path / "out"
    ok(run_text("convert", src.tf1, out, "--dtype", "float16"))
    before = th.digests(tmp_path)
    assert_cli_error(
        run_text("convert", src.tf1, out, "--dtype", "bfloat16"), "already exists", "overwrite"
    )
    assert th.digests(tmp_path) == before
    ok(run_text("convert", src.tf1, out, "--dtype", "bfloat16", "--overwrite"))
    assert set(th.tf_dtypes(out).values()) == {"bfloat16", "int64"}


ERRORS = {
    "bad_include_regex": (
        lambda s: ["select", s.tf1, "{dst}", "--include", "conv/("],
        ["bad include pattern 'conv/('"],
    ),
    "bad_map_regex": (
        lambda s: ["rename", s.tf1, "{dst}", "--map", "(dense=x"],
        ["bad rename pattern", "(dense"],
    ),
    "map_without_equals": (
        lambda s: ["rename", s.tf1, "{dst}", "--map", "dense/head/"],
        ["--map takes OLD=NEW", "dense/head/"],
    ),
    "merge_clash": (
        lambda s: ["merge", s.merge["a"][0], s.merge["c"][0], "-o", "{dst}"],
        ["enc/kernel", "prefer"],
    ),
    "overflow": (
        lambda s: ["convert", s.ovf, "{dst}", "--dtype", "float16"],
        ["w (2 values)", "nothing written"],
    ),
    "missing_source": (
        lambda s: ["convert", str(s.root / "nope" / "model"), "{dst}", "--dtype", "float16"],
        ["nope"],
    ),
    "drop_object_tf1": (
        lambda s: ["select", s.tf1, "{dst}", "--drop-object", "optimizer"],
        ["TF2"],
    ),
    "drop_object_unknown": (
        lambda s: ["select", s.keras.prefix, "{dst}", "--drop-object", "no_such_object"],
        ["no_such_object"],
    ),
    "bad_map_file": (
        lambda s: ["rename", s.tf1, "{dst}", "--map-file", str(s.root / "no.json")],
        ["rename map"],
    ),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_errors_one_line_exit_2(case, src, tmp_path):
    make, fragments = ERRORS[case]
    dst = tmp_path / "out" / "model"
    args = [str(a).replace("{dst}", str(dst)) for a in make(src)]
    line = assert_cli_error(run_text(*args), *fragments)
    if case == "merge_clash":
        assert src.merge["a"][0] in line and src.merge["c"][0] in line, line
    assert th.listing(tmp_path) == []  # nothing written, not even a directory


# ---------------------------------------------------------------- TF2 through the CLI


@pytest.fixture(scope="module")
def keras_base():
    model, _ = tfc.make_keras_model()
    return model


def test_tf2_rename_rekeys_object_graph(src, keras_base, tmp_path):
    case = src.keras
    out = tmp_path / "net"
    ok(
        run_text(
            "rename",
            case.prefix,
            out,
            "--map",
            "model/=net/",
            "--map",
            "optimizer/_trainable_variables/=weights/",
        )
    )
    keys = names(out)
    orig = names(case.prefix)
    assert len(keys) == len(orig)
    assert not any(k.startswith(("model/", "optimizer/_trainable_variables/")) for k in keys)
    assert sum(k.startswith("net/") for k in keys) == 2
    assert sum(k.startswith("weights/") for k in keys) == 6
    graph = th.tf_object_graph(out)
    attr_keys = {a.checkpoint_key for n in graph.nodes for a in n.attributes}
    assert attr_keys == set(keys) - {"_CHECKPOINTABLE_OBJECT_GRAPH"}

    model = th.keras_like(keras_base, "float32")
    tf.train.Checkpoint(model=model).restore(str(out)).assert_existing_objects_matched()
    for w, want in zip(model.weights, case.extra["weights"]):
        assert w.numpy().tobytes() == want.tobytes(), w.path
    # Full model + optimizer restore, every value consumed.
    model, optimizer = tfc.make_keras_model()
    optimizer.build(model.trainable_variables)
    tf.train.Checkpoint(model=model, optimizer=optimizer).restore(str(out)).assert_consumed()
    for got, want in zip(optimizer.variables, case.extra["optimizer_variables"]):
        assert np.asarray(got.numpy()).tobytes() == np.asarray(want).tobytes()


def test_tf2_drop_object_and_convert(src, keras_base, tmp_path):
    case = src.keras
    out = tmp_path / "slim"
    proc = ok(
        run_text(
            "select", case.prefix, out, "--drop-object", "optimizer", "--dtype", "float16", "--json"
        )
    )
    data = json.loads(proc.stdout)
    assert data["kept"] == 9 and data["dropped"] == 14 and data["cast"] == 8
    assert not any(
        k.startswith(th_state)
        for k in names(out)
        for th_state in (
            "optimizer/_iterations",
            "optimizer/_learning_rate",
            "optimizer/_variables",
        )
    )
    model = th.keras_like(keras_base, "float16")
    tf.train.Checkpoint(model=model).restore(str(out)).assert_consumed()
    for w, want in zip(model.weights, case.extra["weights"]):
        assert w.numpy().tobytes() == want.astype(np.float16).tobytes(), w.path
