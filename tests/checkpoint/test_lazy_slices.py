"""Lazy slices (``Checkpoint.get_slice``) against TensorFlow, and ``dump --tensor 'emb[0:5]'``.

TensorFlow writes (during the run) a TF1 checkpoint with a big variable, variables
partitioned on each axis by ``fixed_size_partitioner``, bfloat16, string and scalar
tensors, and a V1 (tensor-slice) checkpoint with a partitioned variable. Every index
expression, drawn by hypothesis, must give what numpy indexing of
``tf.train.load_checkpoint(p).get_tensor(name)`` gives. That only the covering bytes
are read is shown by damaging the file TensorFlow wrote outside the request: the
request still reads right, while reading the whole tensor fails its checksum.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import cli_helpers as ch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import tfckpt  # noqa: E402

SHAPES = {
    "big": [300, 40],
    "cube": [6, 5, 7],
    "emb": [10, 4],  # 3 partitions on axis 0: 4, 3, 3 rows
    "wide": [5, 7],  # 2 partitions on axis 1: 4, 3 columns
    "vec": [13],  # 4 partitions
}


def _write_tf1(d: Path, version) -> tuple[str, dict]:
    """The checkpoint's prefix and the session's values of its variables."""
    prefix = str(d / "model.ckpt")
    rng = np.random.default_rng(7)
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        normal = v1.random_normal_initializer(seed=3)
        ints = v1.random_uniform_initializer(-50, 50, seed=5)
        variables = {
            "big": v1.get_variable(
                "big", initializer=rng.standard_normal(SHAPES["big"]).astype(np.float32)
            ),
            "cube": v1.get_variable(
                "cube", initializer=rng.integers(-99, 99, SHAPES["cube"]).astype(np.int64)
            ),
            "emb": v1.get_variable(
                "emb",
                shape=SHAPES["emb"],
                initializer=normal,
                partitioner=v1.fixed_size_partitioner(3),
            ),
            "wide": v1.get_variable(
                "wide",
                shape=SHAPES["wide"],
                dtype=tf.float64,
                initializer=normal,
                partitioner=v1.fixed_size_partitioner(2, axis=1),
            ),
            "vec": v1.get_variable(
                "vec",
                shape=SHAPES["vec"],
                dtype=tf.int32,
                initializer=ints,
                partitioner=v1.fixed_size_partitioner(4),
            ),
            "step": v1.get_variable("step", initializer=np.int64(41)),
        }
        if version == v1.train.SaverDef.V2:
            half = rng.standard_normal((9, 3)).astype(np.float32)
            variables["half"] = v1.get_variable("half", initializer=tf.cast(half, tf.bfloat16))
            words = np.array([[b"a", b"bb"], [b"", b"x" * 300], [b"\xff", b"z"]], dtype=object)
            variables["words"] = v1.get_variable("words", initializer=words)
        saver = v1.train.Saver(write_version=version)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            saver.save(sess, prefix, write_meta_graph=False)
            values = {
                n: sess.run(v.as_tensor() if hasattr(v, "as_tensor") else v)
                for n, v in variables.items()
            }
    return prefix, values


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """{"v2"|"v1": (prefix, {name: value})}: V2 values as TensorFlow's reader returns them;
    V1 values (a sliced V1 file TensorFlow's reader refuses) as the session saved them."""
    out = {}
    for label, version in (
        ("v2", tf.compat.v1.train.SaverDef.V2),
        ("v1", tf.compat.v1.train.SaverDef.V1),
    ):
        prefix, values = _write_tf1(tmp_path_factory.mktemp(f"slices_{label}"), version)
        if label == "v2":
            reader = tf.train.load_checkpoint(prefix)
            values = {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}
        out[label] = (prefix, values)
    return out


def run_ok(*args) -> str:
    rc, out, err = ch.in_process(*args)
    assert rc == 0, err
    return out


def same(got, want) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got, want)
    if want.dtype == object:
        assert got.tolist() == want.tolist()
    else:
        assert got.tobytes() == want.tobytes(), (got, want)


@st.composite
def index_for(draw, shape):
    """A numpy basic index for ``shape``: ints, slices (any step), perhaps ``...``."""
    items = []
    for n in shape[: draw(st.integers(0, len(shape)))]:
        if draw(st.booleans()) and n:
            items.append(draw(st.integers(-n, n - 1)))
        else:
            bound = st.none() | st.integers(-n - 2, n + 2)
            step = st.none() | st.integers(-4, 4).filter(bool)
            items.append(slice(draw(bound), draw(bound), draw(step)))
    if draw(st.booleans()):
        items.insert(draw(st.integers(0, len(items))), Ellipsis)
    return tuple(items) if draw(st.booleans()) or len(items) != 1 else items[0]


@pytest.mark.parametrize("label", ["v2", "v1"])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_slices_index_like_numpy_of_tensorflow(written, label, name):
    prefix, values = written[label]
    want_all = values[name]
    with tfckpt.open(prefix) as ckpt:
        part = ckpt.get_slice(name)
        assert part.shape == want_all.shape and part.get_shape() == list(want_all.shape)
        assert part.dtype == want_all.dtype

        @settings(
            max_examples=40,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture],
        )
        @given(index_for(want_all.shape))
        def check(key):
            try:
                want = want_all[key]
            except IndexError:  # ... moved the ints to other axes
                with pytest.raises(IndexError):
                    part[key]
                return
            same(part[key], want)

        check()


KEYS = [
    (slice(0, 5),),
    (2,),
    (-1, slice(None, None, -2)),
    (Ellipsis, 1),
    (slice(1, None, 2), Ellipsis),
    (slice(None), slice(None)),
    (),
]


@pytest.mark.parametrize(
    "name, key",
    [(n, k) for n in ("half", "words") for k in KEYS] + [("step", ()), ("step", (Ellipsis,))],
)
def test_bfloat16_strings_and_scalars(written, name, key):
    prefix, values = written["v2"]
    with tfckpt.open(prefix) as ckpt:
        part = ckpt.get_slice(name)
        assert part.get_dtype() == {"half": "bfloat16", "words": "string", "step": "int64"}[name]
        same(part[key], values[name][key])


def test_bad_indexes_raise_as_numpy(written):
    prefix, _ = written["v2"]
    with tfckpt.open(prefix) as ckpt:
        part = ckpt.get_slice("emb")
        with pytest.raises(IndexError):
            part[10]
        with pytest.raises(IndexError):
            part[0, 0, 0]
        with pytest.raises(IndexError):
            part[..., ...]
        with pytest.raises(ValueError):
            part[::0]
        with pytest.raises(TypeError):
            part[[0, 1]]
        with pytest.raises(tfckpt.TensorNotFoundError):
            ckpt.get_slice("nope")


def _damage(path: Path, offset: int, n: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        flipped = bytes(b ^ 0xFF for b in f.read(n))
        f.seek(offset)
        f.write(flipped)


def _copy(prefix: str, d: Path) -> str:
    for f in Path(prefix).parent.iterdir():
        shutil.copy(f, d / f.name)
    return str(d / Path(prefix).name)


def test_only_the_covering_bytes_are_read(written, tmp_path):
    """Rows outside the request are damaged: the request reads right, the whole fails."""
    prefix = _copy(written["v2"][0], tmp_path)
    want = written["v2"][1]["big"]
    with tfckpt.open(prefix) as ckpt:
        info = ckpt.info("big")
    data = tmp_path / f"{Path(prefix).name}.data-00000-of-00001"
    row = 40 * 4
    _damage(data, info.offset + 100 * row, 100 * row)  # rows 100..199
    _damage(data, info.offset + 250 * row + 8, 4)  # row 250, element 2
    with tfckpt.open(prefix) as ckpt:
        part = ckpt.get_slice("big")
        same(part[0:100], want[0:100])
        same(part[200:300:7, 5:9], want[200:300:7, 5:9])
        same(part[250, 3:], want[250, 3:])  # the damaged element is before the range
        same(part[-1:-60:-3, ::-1], want[-1:-60:-3, ::-1])
        assert not np.array_equal(part[150], want[150])  # a partial read is not checked
        with pytest.raises(tfckpt.CorruptCheckpointError, match="checksum"):
            part[:]  # the whole tensor is read and checked
        with pytest.raises(tfckpt.CorruptCheckpointError, match="checksum"):
            ckpt["big"]


def test_only_the_partitions_met_are_read(written, tmp_path):
    prefix = _copy(written["v2"][0], tmp_path)
    want = written["v2"][1]["emb"]
    with tfckpt.open(prefix) as ckpt:
        middle = next(s for s in ckpt.slice_info("emb") if s.extents[0] == (4, 3))
    _damage(tmp_path / f"{Path(prefix).name}.data-00000-of-00001", middle.offset, middle.nbytes)
    with tfckpt.open(prefix) as ckpt:
        part = ckpt.get_slice("emb")
        same(part[0:4], want[0:4])
        same(part[7:], want[7:])
        same(part[::7, 1:3], want[::7, 1:3])  # rows 0 and 7: the first and last partition
        with pytest.raises(tfckpt.CorruptCheckpointError, match="checksum"):
            ckpt["emb"]
        assert not np.array_equal(part[4:7], want[4:7])


def test_dump_tensor_slice(written):
    prefix, values = written["v2"]
    out = run_ok("dump", prefix, "--tensor", "emb[0:5]", "--json")
    (t,) = json.loads(out)["tensors"]
    assert (t["name"], t["index"], t["shape"]) == ("emb", "0:5", [5, 4])
    np.testing.assert_array_equal(np.array(t["values"], np.float32), values["emb"][0:5])

    out = run_ok("dump", prefix, "--tensor", "big[-1, ::-10]", "--tensor", "step")
    assert out.splitlines()[0] == "big[-1, ::-10] (float32 [4])"
    assert "step (int64 [])" in out and "41" in out

    ch.assert_cli_error(
        ch.in_process("dump", prefix, "--tensor", "emb[12]"), "cannot index shape [10, 4] with [12]"
    )


def test_dump_tensor_name_with_brackets(tmp_path):
    """An exact name wins; a trailing [...] that does not parse stays a regex."""
    prefix = str(tmp_path / "m")
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=["a[0:1]", "a", "b"],
        shape_and_slices=["", "", ""],
        tensors=[tf.constant([7, 8]), tf.constant([1, 2, 3]), tf.constant([[5, 6]])],
    )
    out = json.loads(run_ok("dump", prefix, "--tensor", "a[0:1]", "--json"))["tensors"]
    assert [(t["name"], t["values"]) for t in out] == [("a[0:1]", [7, 8])]
    out = json.loads(run_ok("dump", prefix, "--tensor", "a[1:]", "--json"))["tensors"]
    assert [(t["name"], t["values"]) for t in out] == [("a", [2, 3])]
    out = json.loads(run_ok("dump", prefix, "--tensor", "b[0, -1]", "--json"))["tensors"]
    assert [(t["name"], t["values"]) for t in out] == [("b", 6)]
    out = json.loads(run_ok("dump", prefix, "--tensor", "^[b]", "--json"))["tensors"]
    assert [t["name"] for t in out] == ["b"]


def test_requests_larger_than_a_chunk(tmp_path):
    """Runs of rows are cut at about a chunk (16 MiB) and read apart; the parts join up."""
    value = np.arange(5000 * 1100, dtype=np.float32).reshape(5000, 1100)
    prefix = str(tmp_path / "huge")
    tf.raw_ops.SaveV2(
        prefix=prefix, tensor_names=["x"], shape_and_slices=[""], tensors=[tf.constant(value)]
    )
    want = tf.train.load_checkpoint(prefix).get_tensor("x")
    with tfckpt.open(prefix) as ckpt:
        part = ckpt.get_slice("x")
        for key in [np.s_[10:4990], np.s_[::3, 7], np.s_[4999:0:-2, 1:-1:5], np.s_[..., -1]]:
            same(part[key], want[key])


def test_variant_tensors_have_no_numpy_form(tmp_path):
    prefix = str(tmp_path / "v")
    tensor_list = tf.raw_ops.TensorListFromTensor(
        tensor=tf.constant([1.0, 2.0]), element_shape=tf.constant([], tf.int32)
    )
    tf.raw_ops.SaveV2(
        prefix=prefix, tensor_names=["tl"], shape_and_slices=[""], tensors=[tensor_list]
    )
    with tfckpt.open(prefix) as ckpt:
        part = ckpt.get_slice("tl")
        assert (part.shape, part.dtype, part.get_dtype()) == ((), None, "variant")
        with pytest.raises(
            tfckpt.UnsupportedCheckpointError, match="variant tensors have no numpy"
        ):
            part[...]


def same_kind(got, want) -> None:
    """``got`` is what ``want`` is: the same type (array, numpy scalar or bytes), dtype,
    shape and bits."""
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, (np.ndarray, np.generic)):
        assert got.shape == want.shape and got.dtype == want.dtype, (got, want)
        if want.dtype == object:
            assert np.asarray(got).tolist() == np.asarray(want).tolist()
        else:
            assert got.tobytes() == want.tobytes(), (got, want)
    else:
        assert got == want


INTS = [int, np.int64, np.int32, np.intp, np.uint8]


@st.composite
def any_basic_index(draw, shape):
    """Every kind of basic index: ints (Python and numpy, in range or not), slices with
    any step, ``None`` anywhere, at most one ``...`` (sometimes two), ``()``."""
    items: list = []
    for n in shape[: draw(st.integers(0, len(shape) + 1))]:  # one more: too many indices
        kind = draw(st.sampled_from(["int", "slice", "newaxis"]))
        if kind == "int":
            value = draw(st.integers(-n - 1, n))  # sometimes out of bounds
            make = draw(st.sampled_from(INTS))
            # a numpy uint8 holds 0..255 only: other values stay Python ints
            items.append(make(value) if make is not np.uint8 or 0 <= value <= 255 else value)
        elif kind == "slice":
            bound = st.none() | st.integers(-n - 2, n + 2)
            step = st.none() | st.integers(-4, 4).filter(bool)
            items.append(slice(draw(bound), draw(bound), draw(step)))
        else:
            items.append(None)
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        items.insert(draw(st.integers(0, len(items))), Ellipsis)
    for _ in range(draw(st.integers(0, 2))):
        items.insert(draw(st.integers(0, len(items))), None)
    if len(items) == 1 and draw(st.booleans()):
        return items[0]
    return tuple(items)


@pytest.mark.parametrize("label", ["v2", "v1"])
def test_every_basic_index_gives_what_numpy_gives(written, label):
    prefix, _ = written[label]
    with tfckpt.open(prefix) as ckpt:
        names = sorted(n for n in ckpt.keys() if n in SHAPES or n in ("step", "half", "words"))
        fulls = {n: ckpt[n] for n in names}

        @settings(
            max_examples=400,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture],
        )
        @given(
            st.sampled_from(names).flatmap(
                lambda n: st.tuples(st.just(n), any_basic_index(fulls[n].shape))
            )
        )
        def check(case):
            name, key = case
            try:
                want = fulls[name][key]
            except (IndexError, TypeError, ValueError) as e:
                with pytest.raises(type(e)):
                    ckpt.get_slice(name)[key]
                return
            same_kind(ckpt.get_slice(name)[key], want)

        check()


@pytest.mark.parametrize(
    "name, key",
    [
        ("step", ()),
        ("step", Ellipsis),
        ("step", None),
        ("step", (None, Ellipsis, None)),
        ("words", (0, 1)),
        ("words", (0, 1, ...)),
        ("words", (None, 2, None, ..., 0)),
        ("emb", (3, ..., 2)),
        ("emb", (np.int64(-1), np.int32(0))),
        ("emb", (np.newaxis, slice(None, None, -3), None)),
        ("half", (8, 2, ...)),
        ("vec", (..., 12)),
    ],
)
def test_zero_d_results_and_newaxis(written, name, key):
    prefix, _ = written["v2"]
    with tfckpt.open(prefix) as ckpt:
        same_kind(ckpt.get_slice(name)[key], ckpt[name][key])


def test_index_types_numpy_refuses_or_lazy_slices_do_not_take(written):
    prefix, _ = written["v2"]
    with tfckpt.open(prefix) as ckpt:
        part, full = ckpt.get_slice("emb"), ckpt["emb"]
        for key in (1.5, "x", object(), (0, 2.0)):
            with pytest.raises(IndexError):
                full[key]
            with pytest.raises(IndexError):
                part[key]
        for key in (slice(0.5, 2), slice("a", None)):
            with pytest.raises(TypeError):
                full[key]
            with pytest.raises(TypeError):
                part[key]
        # Advanced indices numpy takes; a lazy slice says to read the tensor (documented).
        for key in (True, np.True_, [0, 1], np.array([1, 2]), (0, [1])):
            with pytest.raises(TypeError, match="basic indices"):
                part[key]


def test_zero_d_strings_and_add_slice_partitions(tmp_path):
    """A 0-d string TensorFlow writes, and a tensor partitioned on both axes by
    BundleWriter.add_slice, indexed by every kind of basic index."""
    prefix = str(tmp_path / "s" / "ckpt")
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=["word"],
        shape_and_slices=[""],
        tensors=[tf.constant(b"hello")],
    )
    value = np.arange(6 * 5, dtype=np.float32).reshape(6, 5)
    sliced = str(tmp_path / "p" / "ckpt")
    with tfckpt.BundleWriter(sliced) as w:
        for rows, cols in (((0, 4), (0, 2)), ((0, 4), (2, 3)), ((4, 2), (0, None))):
            r, c = slice(rows[0], rows[0] + rows[1]), slice(cols[0], cols[0] + (cols[1] or 5))
            w.add_slice("part", (6, 5), [rows, cols], value[r, c])
    with tfckpt.open(prefix) as ckpt, tfckpt.open(sliced) as parts:
        word = ckpt["word"]
        for key in ((), Ellipsis, None, (None, ...)):
            same_kind(ckpt.get_slice("word")[key], word[key])
        assert ckpt.get_slice("word")[()] == b"hello"
        assert np.array_equal(parts["part"], value)

        @settings(max_examples=200, deadline=None, database=None)
        @given(any_basic_index((6, 5)))
        def check(key):
            try:
                want = value[key]
            except (IndexError, TypeError, ValueError) as e:
                with pytest.raises(type(e)):
                    parts.get_slice("part")[key]
                return
            same_kind(parts.get_slice("part")[key], want)

        check()
