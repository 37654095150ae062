"""export's commit, clean-up and refusals: what it removes, what an interruption leaves.

Checkpoints are written by TensorFlow's SaveV2; what an export leaves is read with the
``safetensors`` package and ``numpy.load`` the way a loader would (the single file if
there, else every file the index names). Interruptions are real signals (SIGINT, SIGKILL)
that a child process sends itself at its n-th file operation of the commit.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import cli_helpers as ch
import numpy as np
import pytest
import transform_helpers as th

import tfckpt

tf = pytest.importorskip("tensorflow")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from tfckpt.io.temporaries import TMP_MARK  # noqa: E402

VALUES = {f"layer_{i}/kernel": np.arange(256, dtype=np.float32) * (i + 1) for i in range(6)}
# float32: 1 KiB a tensor, so 2 per shard: 3 shards; float16: 4 per shard: 2 shards.
SHARD = 2 << 10


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("export_safety")
    return th.save_v2(d / "src" / "model", {**VALUES, "global_step": np.int64(7)})


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> str:
    """The same without bookkeeping."""
    return th.save_v2(tmp_path_factory.mktemp("export_weights") / "model", VALUES)


def loaded(out: Path) -> dict[str, np.ndarray]:
    """What a loader reads at ``out``: the single file, else the files its index names."""
    if out.exists():
        return safetensors_numpy.load_file(str(out))
    weight_map = json.loads(out.with_name(out.name + ".index.json").read_text())["weight_map"]
    got: dict[str, np.ndarray] = {}
    for f in set(weight_map.values()):
        got.update(safetensors_numpy.load_file(str(out.parent / f)))
    assert set(got) == set(weight_map)
    return got


def which(got: dict[str, np.ndarray]) -> str:
    """'old' (float32 values) or 'new' (float16), checked whole, bit for bit."""
    assert set(got) == set(VALUES)
    for label, dtype in (("old", np.float32), ("new", np.float16)):
        if all(
            got[k].dtype == dtype and got[k].tobytes() == v.astype(dtype).tobytes()
            for k, v in VALUES.items()
        ):
            return label
    pytest.fail(f"neither the old export nor the new one: {sorted(got)}")


def temporaries(d: Path) -> list[str]:
    return sorted(f for f in os.listdir(d) if TMP_MARK in f)


# Sends itself SIG at its AT-th file operation (before it, or with AFTER=1 after it).
AT_NTH_OPERATION = """
import os, signal, sys
import tfckpt.io.storage as st
count = [0]
at, sig, after = int(os.environ["AT"]), getattr(signal, os.environ["SIG"]), os.environ["AFTER"] == "1"
def counted(fn):
    def call(self, *a, **k):
        count[0] += 1
        if count[0] == at and not after:
            os.kill(os.getpid(), sig)
        result = fn(self, *a, **k)
        if count[0] == at and after:
            os.kill(os.getpid(), sig)
        return result
    return call
for op in ("replace", "rename_noreplace", "remove", "write_new"):
    setattr(st.Storage, op, counted(getattr(st.Storage, op)))
from tfckpt.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _old_export(source: str, out: Path, sharded: bool) -> list[str]:
    """Export the old values over whatever is at ``out``; the files it wrote."""
    sm = tfckpt.export(source, out, overwrite=True, max_shard_bytes=SHARD if sharded else None)
    assert which(loaded(out)) == "old" and temporaries(out.parent) == []
    return sorted(Path(f).name for f in sm.files)


@pytest.mark.parametrize(
    "old_sharded, new_sharded",
    [(True, True), (True, False), (False, True)],
    ids=["sharded-to-sharded", "sharded-to-single", "single-to-sharded"],
)
def test_overwrite_interrupted_at_every_step_of_the_commit(
    weights, tmp_path, old_sharded, new_sharded
):
    """After SIGINT or SIGKILL at any file operation, a loader reads the old export whole
    or the new one; the next export removes every leftover of the killed run, whatever
    shard count either had, and only those."""
    source = weights
    out = tmp_path / "hf" / "model.safetensors"
    new = ["export", source, out, "--dtype", "float16", "--overwrite"]
    new += ["--max-shard-bytes", str(SHARD // 2)] if new_sharded else []  # 4 shards
    seen = set()
    for at in range(1, 12):
        for sig, after in (("SIGINT", "0"), ("SIGKILL", "1")):
            old_files = _old_export(source, out, old_sharded)
            assert sorted(os.listdir(out.parent)) == old_files
            proc = subprocess.run(
                [sys.executable, "-c", AT_NTH_OPERATION, *map(str, new)],
                env=ch.user_env(AT=str(at), SIG=sig, AFTER=after),
                capture_output=True,
                text=True,
                timeout=120,
            )
            what = f"{sig} at operation {at} (after: {after})"
            if sig == "SIGINT" and proc.returncode != 0:
                assert proc.returncode == 130 and proc.stderr.splitlines() == [
                    "tfckpt: interrupted"
                ], what
                assert temporaries(out.parent) == [], what
            seen.add(state := which(loaded(out)))
            if state == "old" and proc.returncode != 0:
                # Nothing of the old export was touched.
                assert set(old_files) <= set(os.listdir(out.parent)), what
            # The next export (the old one again) leaves exactly its own files.
            again = _old_export(source, out, old_sharded)
            assert sorted(os.listdir(out.parent)) == again, what
    assert seen == {"old", "new"}


def test_overwrite_removes_only_what_an_index_of_its_own_names(source, tmp_path):
    """A stale or crafted index naming other files costs none of them: a shard is removed
    only when its name is a shard name of this export."""
    d = tmp_path / "hf"
    d.mkdir()
    (d / "README.md").write_text("keep me")
    (tmp_path / "outside.safetensors").write_text("keep me too")
    src_data = [p for p in th.checkpoint_files(source)]
    crafted = {
        "weight_map": {
            "a": "README.md",
            "b": "../outside.safetensors",
            "c": os.path.relpath(src_data[0], d),
            "d": str(src_data[1]),
            "e": "model-00001-of-00001.safetensors/../README.md",
        }
    }
    (d / "model.safetensors.index.json").write_text(json.dumps(crafted))
    before = th.digests(Path(source).parent)
    tfckpt.export(source, d / "model.safetensors", overwrite=True)
    assert sorted(os.listdir(d)) == ["README.md", "model.safetensors"]
    assert (tmp_path / "outside.safetensors").read_text() == "keep me too"
    assert th.digests(Path(source).parent) == before
    tfckpt.export(source, d / "model.safetensors", overwrite=True, max_shard_bytes=SHARD)
    assert "README.md" in os.listdir(d) and which(loaded(d / "model.safetensors")) == "old"


def _save_v1(path: Path) -> str:
    """A V1 (single file) checkpoint at exactly ``path``, by TensorFlow's V1 Saver."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.Graph().as_default():
        for k, v in VALUES.items():
            tf.compat.v1.get_variable(k, initializer=v)
        saver = tf.compat.v1.train.Saver(write_version=tf.compat.v1.train.SaverDef.V1)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.save(sess, str(path), write_meta_graph=False, write_state=False)
    assert path.is_file()
    return str(path)


@pytest.mark.parametrize(
    "name", ["model.safetensors.index.json", "model-00001-of-00002.safetensors"]
)
def test_a_source_is_never_removed_nor_replaced(tmp_path, name):
    """A V1 source named as an export's index or shard, beside the export: left alone by
    an overwrite, and refused as an output."""
    d = tmp_path / "hf"
    src = _save_v1(d / name)
    if "index" not in name:
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": name}}))
    data = (d / name).read_bytes()
    tfckpt.export(src, d / "model.safetensors", overwrite=True)
    assert (d / name).read_bytes() == data
    assert which(loaded(d / "model.safetensors")) == "old"
    if "index" in name:  # a sharded export would replace it: refused, nothing written
        with pytest.raises(tfckpt.CheckpointError, match="source") as e:
            tfckpt.export(src, d / "model.safetensors", overwrite=True, max_shard_bytes=SHARD)
        assert e.value.path == str(d / name)
        assert (d / name).read_bytes() == data and temporaries(d) == []


def test_concurrent_export_is_refused_not_replaced(weights, tmp_path):
    source = weights
    """An export another run committed while this one was writing stays; this one fails."""
    for sharded in (False, True):
        out = tmp_path / f"s{sharded}" / "model.safetensors"
        other = []

        def progress(n, out=out, other=other):
            if not other:
                other.append(tfckpt.export(source, out, max_shard_bytes=SHARD if sharded else None))

        with pytest.raises(tfckpt.CheckpointWriteError, match="another run") as e:
            tfckpt.export(
                source,
                out,
                cast="float16",
                progress=progress,
                max_shard_bytes=SHARD if sharded else None,
            )
        assert "model" in e.value.path
        assert which(loaded(out)) == "old" and temporaries(out.parent) == []
        files = sorted(os.listdir(out.parent))
        assert files == sorted(Path(f).name for f in other[0].files)


def _limited(limit: int):
    def preexec():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
def test_full_disk_is_one_line(source, tmp_path, fmt):
    out = tmp_path / "out" / f"model.{fmt}"
    proc = ch.run_text("export", source, out, "--dtype", "float64", preexec_fn=_limited(4 << 10))
    ch.assert_cli_error(proc, "write")
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr
    assert os.listdir(tmp_path) == []


# -- names


def _named(tmp_path: Path, name: bytes) -> str:
    prefix = str(tmp_path / "named" / "m")
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=[name, b"plain"],
        shape_and_slices=["", ""],
        tensors=[tf.constant(np.arange(3, dtype=np.float32)), tf.constant(np.ones(2, np.float32))],
    )
    return prefix


@pytest.mark.parametrize(
    "name, formats",
    [
        (b"bad\xffname", ("npz", "safetensors")),
        (b"nul\x00inside", ("npz",)),
        (b"../../escape", ("npz",)),
        (b"/absolute", ("npz",)),
        (b"a\\..\\b", ("npz",)),
        (b"__metadata__", ("safetensors",)),
    ],
)
def test_names_a_format_cannot_hold_are_refused(tmp_path, name, formats):
    prefix = _named(tmp_path, name)
    for fmt in formats:
        out = tmp_path / "out" / f"m.{fmt}"
        for dry in (True, False):
            with pytest.raises(tfckpt.CheckpointError, match="name") as e:
                tfckpt.export(prefix, out, dry_run=dry)
            assert e.value.tensor is not None and e.value.path == str(out)
            assert not (tmp_path / "out").exists()
        ch.assert_cli_error(ch.run("export", prefix, out), "name")


@pytest.mark.parametrize("name", ["a/b/c", "h\u00e9llo/w\u00f6rld", "dots..in.name", "x/./y"])
def test_names_that_round_trip_through_npz(tmp_path, name):
    prefix = _named(tmp_path, name.encode())
    tfckpt.export(prefix, tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz") as z:
        assert sorted(z.files) == sorted([name, "plain"])
        assert z[name].tolist() == [0.0, 1.0, 2.0]
    tfckpt.import_(tmp_path / "m.npz", tmp_path / "back" / "m")
    assert sorted(th.tf_reader_values(str(tmp_path / "back" / "m"))) == sorted([name, "plain"])


# -- bookkeeping


def test_bookkeeping_left_out_with_a_note(source, tmp_path):
    rc, _, err = ch.in_process("export", source, tmp_path / "m.safetensors")
    assert rc == 0, err
    assert "left out global_step: training bookkeeping" in err
    assert set(safetensors_numpy.load_file(str(tmp_path / "m.safetensors"))) == set(VALUES)
    rc, _, err = ch.in_process("export", source, tmp_path / "b.npz", "--with-bookkeeping")
    assert rc == 0 and "global_step" not in err, err
    with np.load(tmp_path / "b.npz") as z:
        assert z["global_step"] == 7 and set(z.files) == set(VALUES) | {"global_step"}


# -- memory


PEAK = """
import re, sys, tfckpt
if sys.argv[1] == "export":
    tfckpt.export(sys.argv[2], sys.argv[3], cast="float16", chunk_bytes=int(sys.argv[4]))
else:
    tfckpt.convert(sys.argv[2], sys.argv[3], "float16", chunk_bytes=int(sys.argv[4]))
print(re.search(r"VmHWM:\\s*(\\d+) kB", open("/proc/self/status").read())[1])
"""


def test_export_memory_is_bounded_like_convert(tmp_path):
    """The peak memory of an export stays within that of a convert of the same input
    with the same chunk budget (VmHWM of each process: its own high-water mark)."""
    prefix = th.save_v2(
        tmp_path / "big" / "m", {"big": np.ones((2048, 8192), np.float32)}
    )  # 64 MiB
    budget = 16 << 20
    peaks = {}
    for how, dst in (("convert", tmp_path / "c" / "m"), ("export", tmp_path / "e.safetensors")):
        proc = subprocess.run(
            [sys.executable, "-c", PEAK, how, prefix, str(dst), str(budget)],
            env=ch.user_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        peaks[how] = int(proc.stdout.split()[-1]) << 10
    assert peaks["export"] <= peaks["convert"] + budget // 2, peaks
    with open(tmp_path / "e.safetensors", "rb") as f:
        assert re.search(rb'"big":\{"dtype":"F16"', f.read(200))


@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
def test_two_concurrent_export_processes_to_one_name(weights, tmp_path, sharded):
    """Two real export processes held at a barrier before their commit, then racing: one
    commits, the other fails with one error line and leaves nothing."""
    from cli_helpers import AT_BARRIER

    out = tmp_path / "hf" / "model.safetensors"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    extra = ["--max-shard-bytes", str(SHARD)] if sharded else []
    procs = {
        dtype: subprocess.Popen(
            [sys.executable, "-c", AT_BARRIER, "export", weights, str(out), "--dtype", dtype]
            + extra,
            env=ch.user_env(BARRIER=str(barrier)),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for dtype in ("float32", "float16")
    }
    done = {dtype: (p.wait(timeout=120), p.stderr.read()) for dtype, p in procs.items()}
    assert len(os.listdir(barrier)) == 2  # both reached the commit before either went on
    winners = [d for d, (code, _) in done.items() if code == 0]
    assert len(winners) == 1, done
    (loser,) = set(done) - set(winners)
    ch.assert_cli_error((done[loser][0], "", done[loser][1]), "another run")
    assert which(loaded(out)) == ("old" if winners == ["float32"] else "new")
    assert temporaries(out.parent) == []
    index = out.with_name(out.name + ".index.json")
    listed = set(json.loads(index.read_text())["weight_map"].values()) if sharded else set()
    assert sorted(os.listdir(out.parent)) == sorted(
        listed | {index.name} if sharded else {out.name}
    )
