"""Split and concat: one tensor into several, several into one, against numpy.

Sources are written by TensorFlow (``tf.raw_ops.SaveV2``, a partitioned variable
among them) and the outputs read back by TensorFlow's own reader; tensors larger than
the chunk budget are assembled tile by tile, with every read call and every piece
handed on within the budget.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tfckpt
from tfckpt.rewrite.permute import Member, assembled_chunks

tf = pytest.importorskip("tensorflow")

RNG = np.random.default_rng(5)
H = 8
SOURCE = {
    "h0/attn/c_attn/w": RNG.standard_normal((H, 3 * H)).astype(np.float32),
    "h0/attn/c_attn/b": RNG.standard_normal((3 * H,)).astype(np.float32),
    "h1/attn/c_attn/w": RNG.standard_normal((H, 3 * H)).astype(np.float32),
    "h1/attn/c_attn/b": RNG.standard_normal((3 * H,)).astype(np.float32),
    "big/w": RNG.standard_normal((300, 600)).astype(np.float32),  # 720 KB: many tiles
    "ids": np.arange(40, dtype=np.int64).reshape(8, 5),
    "rows": RNG.standard_normal((3, 6)).astype(np.float32),
    "vocab": np.array([b"a", b"bc"], dtype=object),
}
PARTITIONED = RNG.standard_normal((10, 6)).astype(np.float32)  # saved as 3 row slices
CHUNK = 64 << 10


def _save(prefix: str) -> None:
    names, specs, tensors = [], [], []
    for name, value in SOURCE.items():
        names.append(name)
        specs.append("")
        tensors.append(tf.constant(value))
    for lo, hi in ((0, 4), (4, 7), (7, 10)):
        names.append("part/w")
        specs.append(f"10 6 {lo},{hi - lo}:-")
        tensors.append(tf.constant(PARTITIONED[lo:hi]))
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=specs, tensors=tensors)


@pytest.fixture()
def source(tmp_path):
    prefix = str(tmp_path / "src" / "model")
    (tmp_path / "src").mkdir()
    _save(prefix)
    return prefix


def tf_read(prefix) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(prefix)
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}


QKV = [(r"h(\d)/attn/c_attn/(w|b)$", -1, [r"h\1/q/\2", r"h\1/k/\2", r"h\1/v/\2"])]


def test_split_cuts_along_an_axis_and_tensorflow_reads_the_pieces(source, tmp_path):
    dst = str(tmp_path / "out" / "model")
    sm = tfckpt.convert(
        source,
        dst,
        "float16",
        split=[
            *QKV,
            ("^big/w$", 1, ["big/a", "big/b"], [100, 500]),
            ("^part/w$", 0, ["part/top", "part/bottom"], [5, 5]),  # across its slices
            ("^ids$", 0, ["ids/even", "ids/odd"]),
        ],
        chunk_bytes=CHUNK,
    )
    got = tf_read(dst)
    for i in range(2):
        for j, n in enumerate("qkv"):
            w = SOURCE[f"h{i}/attn/c_attn/w"][:, j * H : (j + 1) * H]
            assert got[f"h{i}/{n}/w"].tobytes() == w.astype(np.float16).tobytes()
            b = SOURCE[f"h{i}/attn/c_attn/b"][j * H : (j + 1) * H]
            assert np.array_equal(got[f"h{i}/{n}/b"], b.astype(np.float16))
    assert np.array_equal(got["big/a"], SOURCE["big/w"][:, :100].astype(np.float16))
    assert np.array_equal(got["big/b"], SOURCE["big/w"][:, 100:].astype(np.float16))
    assert np.array_equal(got["part/top"], PARTITIONED[:5].astype(np.float16))
    assert np.array_equal(got["part/bottom"], PARTITIONED[5:].astype(np.float16))
    assert np.array_equal(got["ids/even"], SOURCE["ids"][:4])
    assert list(got["vocab"]) == [b"a", b"bc"]
    assert "h0/attn/c_attn/w" not in got and sm.kept == len(got)


def test_concat_joins_and_composes_with_split_and_permute(source, tmp_path):
    dst = str(tmp_path / "out" / "model")
    tfckpt.select(
        source,
        dst,
        exclude=["^ids$", "c_attn/b$"],
        split=[*QKV, ("^big/w$", 0, ["big/top", "big/bottom"], [150, 150])],
        concat=[
            # per layer: the first regex's groups name the others and the result
            (r"h\1/kv", -1, [r"h(\d)/k/w", r"h\1/v/w"]),
            # the pieces of a split, joined the other way round (then transposed)
            ("big/swapped", 0, [r"big/bottom", r"big/top"]),
            # a partitioned tensor beside a stored one
            ("part/more", 0, [r"rows", r"part/w"]),
        ],
        permute=[("^big/swapped$", (1, 0)), (r"/kv$", (1, 0))],
        chunk_bytes=CHUNK,
    )
    got = tf_read(dst)
    for i in range(2):
        w = SOURCE[f"h{i}/attn/c_attn/w"]
        assert np.array_equal(got[f"h{i}/kv"], w[:, H:].T)
        assert np.array_equal(got[f"h{i}/q/w"], w[:, :H])
    big = SOURCE["big/w"]
    assert np.array_equal(got["big/swapped"], np.concatenate([big[150:], big[:150]]).T)
    assert np.array_equal(got["part/more"], np.concatenate([SOURCE["rows"], PARTITIONED]))
    assert sorted(got) == [
        "big/swapped",
        "h0/kv",
        "h0/q/w",
        "h1/kv",
        "h1/q/w",
        "part/more",
        "vocab",
    ]


@pytest.mark.parametrize("chunk", [CHUNK, 4 << 20])
def test_export_writes_them_and_reads_within_the_budget(source, tmp_path, chunk, monkeypatch):
    st_numpy = pytest.importorskip("safetensors.numpy")
    from tfckpt.checkpoint.reader import Checkpoint

    largest = []
    real = Checkpoint.read_elements

    def counted(self, name, start, count, *rest):
        largest.append(count)
        return real(self, name, start, count, *rest)

    monkeypatch.setattr(Checkpoint, "read_elements", counted)
    out = str(tmp_path / "hf" / "model.safetensors")
    tfckpt.export(
        source,
        out,
        exclude=["vocab"],
        split=[("^big/w$", 1, ["big/a", "big/b", "big/c"])],
        concat=[("big/cab", 1, ["big/c", "big/a", "big/b"])],
        permute=[("^big/cab$", (1, 0))],
        chunk_bytes=chunk,
    )
    got = st_numpy.load_file(out)
    big = SOURCE["big/w"]
    assert np.array_equal(got["big/cab"], np.concatenate([big[:, 400:], big[:, :400]], 1).T)
    if chunk == CHUNK:  # assembled in tiles: no read over half the budget
        assert largest and max(largest) <= chunk // 2 // 4
    else:  # small enough to be read whole (its checksum checked), not in pieces
        assert not largest


@st.composite
def assemblies(draw):
    k = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=k, max_size=k)))
    axis = draw(st.integers(0, k - 1))
    cuts = sorted(set(draw(st.lists(st.integers(0, shape[axis]), max_size=3))))
    perm = tuple(draw(st.permutations(range(k))))
    chunk = draw(st.integers(8, 400))
    return shape, axis, cuts, perm, chunk


class Stored:
    """What reads like a checkpoint of whole tensors held in memory (for the tiles)."""

    def __init__(self, tensors):
        self.tensors = tensors

    def info(self, name):
        v = self.tensors[name]
        return tfckpt.TensorInfo(name, "float32", v.shape, v.nbytes, 0, 0, None)

    def __getitem__(self, name):
        return self.tensors[name].copy()

    def read_elements(self, name, start, count):
        return self.tensors[name].reshape(-1)[start : start + count].copy()

    def iter_chunks(self, name, nbytes, buffers=None):
        yield self.tensors[name].reshape(-1)


@settings(max_examples=200, deadline=None)
@given(assemblies())
def test_pieces_swapped_and_permuted_match_numpy(case):
    shape, axis, cuts, perm, chunk = case
    value = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    other = -value - 1
    store = Stored({"a": value, "b": other})
    bounds = [0, *cuts, shape[axis]]
    members, at = [], 0
    # Each piece of ``a`` between the cuts, in reverse order, then all of ``b``.
    for lo, hi in reversed(list(zip(bounds, bounds[1:]))):
        box = tuple((lo, hi) if d == axis else (0, n) for d, n in enumerate(shape))
        place = tuple(at if d == axis else 0 for d in range(len(shape)))
        members.append(Member("a", box, place, lo == 0))
        at += hi - lo
    members.append(
        Member(
            "b",
            tuple((0, n) for n in shape),
            tuple(at if d == axis else 0 for d in range(len(shape))),
        )
    )
    pieces = [np.take(value, range(lo, hi), axis) for lo, hi in zip(bounds, bounds[1:])]
    want = np.concatenate([*reversed(pieces), other], axis)
    out_shape = want.shape
    got = list(assembled_chunks(store, members, out_shape, perm, chunk, 64))
    assert np.array_equal(np.concatenate(got), np.transpose(want, perm).reshape(-1))
    if value.nbytes * 2 > chunk // 2:  # in tiles: each within half the budget
        assert max(g.size for g in got) <= max(1, chunk // 2 // 4)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(split=[("^ids$", 1, ["a", "b"])]), "does not split into 2 equal parts"),
        (dict(split=[("^ids$", 0, ["a", "b"], [3, 4])]), "do not add up to axis 0"),
        (dict(split=[("^ids$", 2, ["a", "b"])]), "axis 2 is not one of shape [8, 5]"),
        (dict(split=[("^vocab$", 0, ["a", "b"])]), "numeric and bool tensors, not string"),
        (dict(split=[("^ids$", 0, ["a"])]), "two tensors or more"),
        (dict(split=[("^ids$", 0, ["rows", "x"])]), "would both be named 'rows'"),
        (dict(split=[("(", 0, ["a", "b"])]), "bad split pattern"),
        (dict(concat=[("x", 0, ["rows", "ids"])]), "does not join 'rows' [3, 6]"),
        (dict(concat=[("x", 0, ["rows", "nothing"])]), "no tensor named 'nothing'"),
        (dict(concat=[("x", 0, ["rows", "h./attn/c_attn/w"])]), "2 tensors named"),
        (
            dict(concat=[("x", 0, ["part/w", "rows"]), ("y", 0, ["h0/attn/c_attn/b", "rows"])]),
            "no tensor named 'rows'",  # joined already
        ),
        (
            dict(concat=[("x", 0, ["rows", "part/w"])], cast="float16", keep_dtype=["rows"]),
            "'part/w' is float32 -> float16, 'rows' float32 -> float32",
        ),
    ],
)
def test_what_cannot_be_split_or_joined_is_an_error(source, tmp_path, changes, message):
    with pytest.raises(tfckpt.CheckpointError, match=".*" + message.replace("[", r"\[")):
        tfckpt.plan(source, str(tmp_path / "out"), **changes)


def test_a_tf2_output_average_and_import_refuse_them(tmp_path):
    root = tf.train.Checkpoint(v=tf.Variable(np.ones((4, 2), np.float32)))
    prefix = root.write(str(tmp_path / "tf2" / "ckpt"))
    with pytest.raises(tfckpt.CheckpointError, match="TF2 object graph"):
        tfckpt.select(prefix, str(tmp_path / "out"), split=[("VARIABLE", 0, ["a", "b"])])
    out = str(tmp_path / "v.safetensors")
    tfckpt.export(prefix, out, split=[("^v$", 0, ["a", "b"])])  # an export has no graph
    got = pytest.importorskip("safetensors.numpy").load_file(out)
    assert sorted(got) == ["a", "b"] and got["a"].shape == (2, 2)
    with pytest.raises(tfckpt.CheckpointError, match="average does not take split"):
        tfckpt.average([prefix, prefix], str(tmp_path / "avg"), split=[("v", 0, ["a", "b"])])
    with pytest.raises(tfckpt.CheckpointError, match="import takes no split"):
        tfckpt.import_(out, str(tmp_path / "imp"), concat=[("v", 0, ["a", "b"])])


def test_rules_files_flags_and_the_plan_show_them(source, tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text(
        """
exclude = ['^big/', '^part/', '^ids$', '^rows$', '^vocab$']
[[split]]
match = 'h(\\d)/attn/c_attn/(w|b)$'
axis = -1
into = ['h\\1/q/\\2', 'h\\1/k/\\2', 'h\\1/v/\\2']
[[concat]]
name = 'h\\1/kv/\\2'
axis = -1
parts = ['h(\\d)/k/(w|b)', 'h\\1/v/\\2']
"""
    )
    dst = str(tmp_path / "cli" / "model")
    cmd = [sys.executable, "-m", "tfckpt", "select", source, dst, "--rules", str(rules)]
    run = subprocess.run([*cmd, "--dry-run", "--json"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    rows = {t["new_name"]: t for t in json.loads(run.stdout)["tensors"]}
    assert sorted(rows) == [f"h{i}/{n}/{x}" for i in "01" for n in ("kv", "q") for x in "bw"]
    assert rows["h0/kv/w"]["made_of"] == [
        {"name": "h0/attn/c_attn/w", "box": [[0, H], [H, 2 * H]], "at": [0, 0]},
        {"name": "h0/attn/c_attn/w", "box": [[0, H], [2 * H, 3 * H]], "at": [0, H]},
    ]
    assert rows["h0/kv/w"]["shape"] == [H, 2 * H]
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    got = tf_read(dst)
    assert np.array_equal(got["h1/kv/b"], SOURCE["h1/attn/c_attn/b"][H:])
    flags = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfckpt",
            "select",
            source,
            dst + "2",
            "--include",
            "^h0/",
            "--split",
            r"c_attn/(w|b)$=-1:q/\1,k/\1,v/\1",
            "--concat",
            r"qk=0:q/w,k/w",
        ],
        capture_output=True,
        text=True,
    )
    assert flags.returncode == 0, flags.stderr
    assert sorted(tf_read(dst + "2")) == ["k/b", "q/b", "qk", "v/b", "v/w"]
    for bad, message in [
        (["--split", "ids=x:a,b"], "--split takes REGEX=AXIS:NEW1,NEW2"),
        (["--concat", "x=0:ids"], "--concat takes NEW=AXIS:REGEX1,REGEX2"),
        (["--split", "^ids$=1:a,b"], "does not split into 2 equal parts"),
    ]:
        run = subprocess.run(
            [sys.executable, "-m", "tfckpt", "select", source, dst + "3", *bad],
            capture_output=True,
            text=True,
        )
        assert run.returncode != 0 and len(run.stderr.splitlines()) == 1, run.stderr
        assert message in run.stderr
