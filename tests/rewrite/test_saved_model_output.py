"""A SavedModel in, a SavedModel out (tfckpt.rewrite.savedmodel), on SavedModels TensorFlow
writes during the run: a tf.Module with a lookup table over a vocabulary file (an asset)
and a signature, a tf.keras 2 model (keras_metadata.pb), and a TF1 SavedModel (a Saver
that restores by name).

- convert / select / rename / edit / merge of a SavedModel directory into a directory
  write a SavedModel: ``tf.saved_model.load`` of the output (the source deleted by then)
  gives the signature's outputs of the source, or of the edited values; no
  ``fingerprint.pb``, as the summary and the docs say.
- What the graph would not restore (a cast, a variable left out, a reshape, a TF1
  rename, no object graph) is refused before anything is written, and TensorFlow's
  loader does fail on the cast one; ``--checkpoint-only`` or a prefix writes the
  variables alone, which restore into a float16 model as the note says.
- The directory appears whole or not at all: a failed write (a full disk) leaves no
  output and no temporary, a failed ``--overwrite`` the old SavedModel as it was; a
  destination that holds other files is refused, with ``--overwrite`` too.
- Sources are never modified.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import cli_helpers as ch  # noqa: E402
from cli_helpers import in_process  # noqa: E402

import tfckpt  # noqa: E402
from tfckpt.io import storage as _storage  # noqa: E402
from tfckpt.io.temporaries import TMP_MARK  # noqa: E402

VOCAB = ["alpha", "beta", "gamma"]
X = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 0.0]], np.float32)
WORDS = np.array([b"gamma", b"zeta", b"alpha"])


class Served(tf.Module):
    """Variables of three dtypes, a 64 KiB one, a vocabulary table, a signature."""

    def __init__(self, vocab: str, dtype=np.float32):
        super().__init__()
        rng = np.random.default_rng(38)
        self.w = tf.Variable(rng.standard_normal((3, 2)).astype(dtype))
        self.b = tf.Variable(np.array([0.5, -0.25], dtype))
        self.big = tf.Variable(rng.standard_normal(16384).astype(dtype))
        self.steps = tf.Variable(np.int64(7))
        init = tf.lookup.TextFileInitializer(
            vocab,
            tf.string,
            tf.lookup.TextFileIndex.WHOLE_LINE,
            tf.int64,
            tf.lookup.TextFileIndex.LINE_NUMBER,
        )
        self.table = tf.lookup.StaticHashTable(init, -1)

    @tf.function(
        input_signature=[tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None], tf.string)]
    )
    def serve(self, x, words):
        return {
            "y": tf.matmul(x, self.w) + self.b + tf.reduce_sum(self.big[:4]),
            "ids": self.table.lookup(words),
            "steps": self.steps + 0,
        }


def served(directory) -> dict:
    """The outputs of the ``serving_default`` signature of the SavedModel ``directory``."""
    loaded = tf.saved_model.load(str(directory))
    out = loaded.signatures["serving_default"](x=tf.constant(X), words=tf.constant(WORDS))
    return {k: v.numpy() for k, v in out.items()}


def digest(directory) -> dict[str, str]:
    """Every file under ``directory`` and the hash of its bytes."""
    out = {}
    for root, _, files in os.walk(directory):
        for f in files:
            path = os.path.join(root, f)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, directory)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def temporaries(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if TMP_MARK in n)


@pytest.fixture(scope="module")
def module_sm(tmp_path_factory):
    """The tf.Module's SavedModel; its vocabulary file deleted once saved (the SavedModel's
    assets/ holds the copy TensorFlow made)."""
    d = tmp_path_factory.mktemp("served")
    vocab = d / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    m = Served(str(vocab))
    sm = d / "sm"
    tf.saved_model.save(m, str(sm), signatures=m.serve)
    vocab.unlink()
    assert (sm / "assets" / "vocab.txt").is_file() and (sm / "fingerprint.pb").is_file()
    return sm, served(sm), digest(sm)


@pytest.fixture
def sm(module_sm, tmp_path):
    """A copy of the SavedModel of the test's own (deleted before the output is loaded,
    so nothing is read from it), its expected outputs; checked unmodified afterwards."""
    src, expected, digests = module_sm
    copy = tmp_path / "src"
    shutil.copytree(src, copy)
    yield copy, expected
    if copy.exists():
        assert digest(copy) == digests  # the source, never modified
    assert digest(src) == digests


def test_convert_writes_a_saved_model_tensorflow_loads(sm, tmp_path):
    src, expected = sm
    out = tmp_path / "out"
    rc, _, err = in_process("convert", src, f"{out}/")
    assert rc == 0, err
    assert sorted(digest(out)) == [
        "assets/vocab.txt",
        "saved_model.pb",
        "variables/variables.data-00000-of-00001",
        "variables/variables.index",
    ]
    assert digest(out)["saved_model.pb"] == digest(src)["saved_model.pb"]
    lines = err.splitlines()
    assert lines[0].startswith(f"wrote SavedModel {out}: 4 tensors kept"), err
    assert f"tf.saved_model.load('{out}') loads it" in err
    assert "fingerprint.pb not copied" in err
    assert temporaries(tmp_path) == []
    shutil.rmtree(src)  # nothing of the output comes from the source any more
    got = served(out)
    assert got.keys() == expected.keys()
    for k in expected:
        np.testing.assert_array_equal(got[k], expected[k])
    assert got["ids"].tolist() == [2, -1, 0]  # the vocabulary: the copied asset
    # As the docs say: no fingerprint, and TensorFlow says so when asked for one.
    with pytest.raises(FileNotFoundError):
        tf.saved_model.experimental.read_fingerprint(str(out))


@pytest.mark.parametrize(
    "argv,check",
    [
        (["select", "{src}", "{out}/", "--include", "."], "same"),
        (["merge", "{src}", "-o", "{out}/"], "same"),
        (["rename", "{src}", "{out}/", "--map", "^w/=weights/"], "same"),
        (["edit", "{src}", "{out}/", "--scale", "w=2"], "w doubled"),
        (["edit", "{src}", "{out}/", "--set", "steps=11"], "steps 11"),
    ],
)
def test_rewrites_that_keep_dtypes_and_shapes_write_a_loadable_saved_model(
    sm, tmp_path, argv, check
):
    src, expected = sm
    out = tmp_path / "out"
    rc, _, err = in_process(*[a.format(src=src, out=out) for a in argv])
    assert rc == 0, err
    assert err.startswith(f"wrote SavedModel {out}:"), err
    if argv[0] == "rename":  # the object graph re-keyed: the loader follows it
        with tfckpt.open(str(out / "variables" / "variables")) as c:
            assert "weights/.ATTRIBUTES/VARIABLE_VALUE" in c.keys()
    shutil.rmtree(src)
    got = served(out)
    want = dict(expected)
    if check == "w doubled":
        w = tf.train.load_checkpoint(str(out / "variables" / "variables")).get_tensor(
            "w/.ATTRIBUTES/VARIABLE_VALUE"
        )
        b = expected["y"] - X @ (w / 2)  # what the signature adds besides x @ w
        want["y"] = X @ w + b
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-6, atol=1e-6)
        got["y"] = want["y"]
    if check == "steps 11":
        want["steps"] = np.int64(11)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (
            ["convert", "{src}", "{out}/", "--dtype", "float16"],
            "w/.ATTRIBUTES/VARIABLE_VALUE: float32 -> float16",
        ),
        (
            ["select", "{src}", "{out}/", "--exclude", "^big/"],
            "big/.ATTRIBUTES/VARIABLE_VALUE: left out",
        ),
        (["convert", "{src}", "{out}/", "--reshape", "^w/=2,3"], "shape [3, 2] -> [2, 3]"),
        (["edit", "{src}", "{out}/", "--resize", "^big/=8"], "shape [16384] -> [8]"),
        (["edit", "{src}", "{out}/", "--delete", "^b/"], "b/.ATTRIBUTES/VARIABLE_VALUE: left out"),
        (["edit", "{src}", "{out}/", "--as-tf1"], "the object graph is left out"),
    ],
)
def test_what_the_graph_would_not_restore_is_refused(sm, tmp_path, argv, fragment):
    src, _ = sm
    out = tmp_path / "out"
    proc = ch.run(*[a.format(src=src, out=out) for a in argv])
    ch.assert_cli_error(proc, fragment, "would not match", "--checkpoint-only", str(out))
    assert sorted(os.listdir(tmp_path)) == ["src"]  # nothing written
    rc, _, err = in_process(*[a.format(src=src, out=out) for a in argv], "--checkpoint-only")
    assert rc == 0, err
    assert sorted(os.listdir(out)) == [
        "checkpoint",
        "variables.data-00000-of-00001",
        "variables.index",
    ]
    assert "not a SavedModel" in err


def test_tensorflow_cannot_load_the_cast_saved_model_that_is_refused(sm, tmp_path):
    """Why the cast is refused: the source's graph with float16 variables does not load."""
    src, _ = sm
    rc, _, err = in_process("convert", src, tmp_path / "half", "--dtype", "float16")
    assert rc == 0, err
    made = tmp_path / "made"
    shutil.copytree(src, made)
    for f in os.listdir(made / "variables"):
        os.remove(made / "variables" / f)
    for f in os.listdir(tmp_path):
        if f.startswith("half."):
            shutil.copy(tmp_path / f, made / "variables" / f.replace("half", "variables", 1))
    with pytest.raises(tf.errors.InvalidArgumentError, match="expected dtype float"):
        tf.saved_model.load(str(made))


def test_cast_as_a_checkpoint_restores_into_a_float16_model(sm, tmp_path):
    """What the note says: the variables alone, read by tf.train.Checkpoint into a model
    built for float16 (and by tfckpt.restore); a prefix writes the same."""
    src, _ = sm
    out = tmp_path / "out"
    rc, _, err = in_process("convert", src, f"{out}/", "--dtype", "float16", "--checkpoint-only")
    assert rc == 0, err
    prefix = str(out / "variables")
    assert err.startswith(f"wrote {prefix}: 4 tensors kept"), err
    note = next(line for line in err.splitlines() if line.startswith("tfckpt: note:"))
    assert note.startswith(f"tfckpt: note: {prefix} is the variables of the SavedModel"), err
    assert "not a SavedModel" in note and f"tf.train.Checkpoint(model).read('{prefix}')" in note
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    want = Served(str(vocab))
    half = Served(str(vocab), np.float16)
    for v in (half.w, half.b, half.big):
        v.assign(tf.zeros_like(v))
    tf.train.Checkpoint(half).read(prefix).assert_existing_objects_matched()
    for a, b in [(half.w, want.w), (half.b, want.b), (half.big, want.big)]:
        assert a.dtype == tf.float16
        np.testing.assert_array_equal(a.numpy(), b.numpy().astype(np.float16))
    assert int(half.steps.numpy()) == 7
    rc, _, err = in_process("convert", src, tmp_path / "model", "--dtype", "float16")
    assert rc == 0 and "not a SavedModel" in err, err
    assert (tmp_path / "model.index").is_file()
    # The library names the option as Python spells it.
    with pytest.raises(tfckpt.CheckpointError, match=r"checkpoint_only=True"):
        tfckpt.convert(str(src), f"{tmp_path}/lib/", "float16")
    assert not (tmp_path / "lib").exists()


def test_dry_run_says_what_it_would_write(sm, tmp_path):
    src, _ = sm
    out = tmp_path / "out"
    rc, stdout, err = in_process("convert", src, f"{out}/", "--dry-run")
    assert rc == 0, err
    assert f"SavedModel {out} (new): assets/ (1 file), saved_model.pb copied from {src}" in stdout
    assert "fingerprint.pb left out" in stdout
    rc, stdout, err = in_process("convert", src, f"{out}/", "--dry-run", "--json")
    assert rc == 0, err
    assert json.loads(stdout)["saved_model"] == {
        "source": str(src),
        "directory": str(out),
        "copied": ["assets/", "assets/vocab.txt", "saved_model.pb"],
        "left_out": ["fingerprint.pb"],
        "replaces": False,
    }
    assert sorted(os.listdir(tmp_path)) == ["src"]


def _limited(limit: int):
    def preexec():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


def test_a_failed_write_leaves_nothing_and_the_old_saved_model_as_it_was(sm, tmp_path):
    src, expected = sm
    new = tmp_path / "a" / "b" / "out"
    proc = ch.run_text("convert", src, f"{new}/", preexec_fn=_limited(16 << 10))
    ch.assert_cli_error(proc, "write")
    assert sorted(os.listdir(tmp_path)) == ["src"]  # a/, a/b/ and the stage removed again
    out = tmp_path / "out"
    rc, _, err = in_process("edit", src, f"{out}/", "--set", "steps=3")
    assert rc == 0, err
    before = digest(out)
    proc = ch.run_text("convert", src, f"{out}/", "--overwrite", preexec_fn=_limited(16 << 10))
    ch.assert_cli_error(proc, "write")
    assert digest(out) == before
    assert temporaries(tmp_path) == []
    assert int(served(out)["steps"]) == 3
    # Without --overwrite the SavedModel there is refused; with it, replaced whole.
    ch.assert_cli_error(ch.run("convert", src, f"{out}/"), "already exists", "--overwrite")
    assert digest(out) == before
    rc, _, err = in_process("convert", src, f"{out}/", "--overwrite")
    assert rc == 0, err
    assert sorted(digest(out)) == sorted(before)
    assert temporaries(tmp_path) == []
    assert int(served(out)["steps"]) == int(expected["steps"]) == 7


def test_overwrite_where_the_directory_cannot_be_swapped_in_one_step(sm, tmp_path, monkeypatch):
    """Without renameat2 (not Linux, or a file system without it) the old directory is
    moved aside, the new one in, the old one removed: the same result."""
    src, _ = sm
    out = tmp_path / "out"
    rc, _, err = in_process("edit", src, f"{out}/", "--set", "steps=3")
    assert rc == 0, err
    monkeypatch.setattr(_storage, "_RENAMEAT2", [None])
    rc, _, err = in_process("convert", src, f"{out}/", "--overwrite")
    assert rc == 0, err
    assert sorted(os.listdir(tmp_path)) == ["out", "src"]
    assert int(served(out)["steps"]) == 7


def test_a_destination_holding_other_files_is_refused(sm, tmp_path):
    src, _ = sm
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    for extra in ([], ["--overwrite"]):
        ch.assert_cli_error(
            ch.run("convert", src, f"{out}/", *extra), "not empty", "notes.txt", "--checkpoint-only"
        )
    rc, _, err = in_process("convert", src, f"{out}/", "--overwrite")
    assert rc == 2
    # A SavedModel there with a file of the user's beside it: --overwrite would delete it.
    (out / "notes.txt").unlink()
    rc, _, err = in_process("convert", src, f"{out}/")
    assert rc == 0, err
    (out / "notes.txt").write_text("mine")
    ch.assert_cli_error(ch.run("convert", src, f"{out}/", "--overwrite"), "notes.txt")
    assert (out / "notes.txt").read_text() == "mine"
    # An empty directory is taken; the source itself, or a place inside it, is not.
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = in_process("convert", src, empty)
    assert rc == 0 and (empty / "saved_model.pb").is_file(), err
    ch.assert_cli_error(ch.run("convert", src, f"{src}/", "--overwrite"), "is the source")
    ch.assert_cli_error(ch.run("convert", src, f"{src}/inner/"), "inside the source")


def test_a_destination_made_meanwhile_is_refused_unless_empty(sm, tmp_path):
    src, _ = sm
    out = tmp_path / "out"
    p = tfckpt.plan(str(src), f"{out}/")
    out.mkdir()
    (out / "saved_model.pb").write_bytes(b"another run's")
    with pytest.raises(tfckpt.CheckpointWriteError, match="another run wrote here meanwhile"):
        tfckpt.execute(p)
    assert os.listdir(out) == ["saved_model.pb"]
    assert (out / "saved_model.pb").read_bytes() == b"another run's"
    assert temporaries(tmp_path) == []
    (out / "saved_model.pb").unlink()  # an empty directory made meanwhile is taken
    p = tfckpt.plan(str(src), f"{tmp_path}/other/")
    (tmp_path / "other").mkdir()
    tfckpt.execute(p)
    assert int(served(tmp_path / "other")["steps"]) == 7


def test_a_keras_saved_model_keeps_its_keras_metadata(tmp_path):
    tf_keras = pytest.importorskip("tf_keras")
    tf_keras.utils.set_random_seed(4)
    model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(2)])
    src = tmp_path / "keras"
    model.save(str(src), save_format="tf")
    assert (src / "keras_metadata.pb").is_file()
    before = digest(src)
    out = tmp_path / "out"
    rc, _, err = in_process("convert", src, f"{out}/")
    assert rc == 0, err
    assert "keras_metadata.pb" in os.listdir(out) and "fingerprint.pb" not in os.listdir(out)
    assert digest(out)["keras_metadata.pb"] == before["keras_metadata.pb"]
    loaded = tf_keras.models.load_model(str(out))
    np.testing.assert_array_equal(loaded.predict(X, verbose=0), model.predict(X, verbose=0))
    assert digest(src) == before


def test_a_tf1_saved_model_restores_by_name(tmp_path):
    from graph_files import tf1_saved_model

    src = tf1_saved_model(tmp_path / "tf1")
    before = digest(src)
    out = tmp_path / "out"
    rc, _, err = in_process("convert", src, f"{out}/")
    assert rc == 0, err
    v1 = tf.compat.v1

    def logits(directory) -> np.ndarray:
        with tf.Graph().as_default(), v1.Session() as sess:
            v1.saved_model.loader.load(sess, ["serve"], str(directory))
            return sess.run("logits:0", {"x:0": np.ones((1, 4), np.float32)})

    np.testing.assert_array_equal(logits(out), logits(src))
    proc = ch.run("rename", src, f"{tmp_path}/renamed/", "--map", "^dense/=layer/")
    ch.assert_cli_error(proc, "dense/w: renamed layer/w (a TF1 graph restores by name)")
    assert digest(src) == before


def test_an_object_store_destination_is_refused_unless_checkpoint_only(sm):
    """An object store cannot rename a directory into place: the SavedModel is refused
    there, its variables alone are written as any checkpoint is."""
    src, _ = sm
    url = f"memory://sm38-{os.getpid()}/out/"
    with pytest.raises(tfckpt.CheckpointError, match=r"object store.*checkpoint_only=True"):
        tfckpt.convert(str(src), url, "float32")
    summary = tfckpt.convert(str(src), url, "float32", checkpoint_only=True)
    assert summary.saved_model is None and summary.dst == url + "variables"
    assert "not a SavedModel" in summary.notes[0]
    with tfckpt.open(summary.dst) as c:
        assert len(c.keys()) == 5  # four variables and the object graph


# Killed (SIGKILL) as its variables are committed inside the stage.
KILLED_IN_STAGE = """
import os, signal, sys
def kill_at_index(fn):
    def call(src, dst, *a, **k):
        if os.fspath(dst).endswith("variables.index"):
            os.kill(os.getpid(), signal.SIGKILL)
        return fn(src, dst, *a, **k)
    return call
os.link, os.replace, os.rename = map(kill_at_index, (os.link, os.replace, os.rename))
from tfckpt.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_killed_run_leaves_no_saved_model_and_the_next_run_clears_its_stage(sm, tmp_path):
    import subprocess
    import sys

    src, _ = sm
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_IN_STAGE, "convert", str(src), f"{out}/"],
        env=ch.user_env(),
    )
    assert proc.returncode == -9
    assert not out.exists()
    stages = temporaries(tmp_path)
    assert len(stages) == 1 and (tmp_path / stages[0] / "variables").is_dir(), stages
    rc, _, err = in_process("convert", src, f"{out}/")
    assert rc == 0, err
    assert temporaries(tmp_path) == []
    assert int(served(out)["steps"]) == 7


@pytest.mark.parametrize(
    "argv,whose",
    [
        (
            ["merge", "{src}", "{src2}", "-o", "{out}", "--prefer", "last"],
            "made of the variables of the SavedModels",
        ),
        (["average", "{src}", "{src2}", "-o", "{out}"], "made of the variables of the SavedModels"),
        (["graft", "{src}", "{src2}", "-o", "{out}"], "made of the variables of the SavedModels"),
        (["flatten", "{src}", "{out}"], "the variables of the SavedModel"),
    ],
)
def test_every_rewrite_of_saved_models_into_a_checkpoint_says_what_it_wrote(
    sm, tmp_path, argv, whose
):
    """A rewrite of several SavedModels (merge, average, graft) or one that drops the
    object graph (flatten) writes a checkpoint to a prefix, and says so."""
    src, _ = sm
    src2 = tmp_path / "src2"
    shutil.copytree(src, src2)
    out = tmp_path / "out" / "model"
    args = [a.format(src=src, src2=src2, out=out) for a in argv]
    rc, _, err = in_process(*args)
    assert rc == 0, err
    note = next(line for line in err.splitlines() if line.startswith("tfckpt: note:"))
    assert note.startswith(f"tfckpt: note: {out} is {whose}"), note
    assert "not a SavedModel" in note and f"tf.train.Checkpoint(model).read('{out}')" in note
    assert (tmp_path / "out" / "model.index").is_file()
