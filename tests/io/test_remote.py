"""Object storage and distributed execution, on checkpoints TensorFlow wrote.

- ``memory://`` (fsspec's in-process file system), ``file://`` and ``s3://`` (a moto S3 server
  started here on 127.0.0.1) as sources and destinations of ``tfckpt.open``, ``convert`` /
  ``transform`` and the command line.
- Range reads: opening or dumping reads only the index; reading a tensor fetches exactly its
  byte range (``MemoryFileSystem.cat_file`` is wrapped to record every read, and the S3 server's
  request log is checked for the S3 runs).
- Writes to object storage: data objects under their final names, the index last, no rename;
  a failed run leaves no index and removes the data objects it wrote.
- Executors: one task per output shard, run by ``concurrent.futures`` pools, a Dask
  ``LocalCluster`` (library and ``--executor dask://``), with byte-identical output; failing
  tasks and a killed Dask worker fail the run cleanly.

Network traffic stays on 127.0.0.1: the S3 server and the Dask scheduler listen there, and
the S3 client is pointed at it with test credentials (no instance-metadata lookups).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
fsspec = pytest.importorskip("fsspec")

import cli_helpers as ch  # noqa: E402
import tf_checkpoints as tfc  # noqa: E402  (conftest put tests/ on sys.path)
import transform_helpers as th  # noqa: E402
from fsspec.implementations.memory import MemoryFileSystem  # noqa: E402
from s3_helpers import BUCKET, s3_server  # noqa: E402,F401  (the moto server fixture)

import tfckpt  # noqa: E402
from tfckpt import cli  # noqa: E402
from tfckpt import inspection as tinspect  # noqa: E402
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY  # noqa: E402
from tfckpt.io import paths  # noqa: E402
from tfckpt.io.commit import commit_shards, merge_entries  # noqa: E402
from tfckpt.io.temporaries import TMP_MARK  # noqa: E402
from tfckpt.rewrite.engine import execute  # noqa: E402
from tfckpt.rewrite.tasks import ShardTask, run_shard_task, shard_tasks  # noqa: E402

CASES = ("tf1_sharded", "max_shard_policy", "keras_manager")
MEM = MemoryFileSystem.store  # the process-wide memory:// store (path -> MemoryFile)


# ---------------------------------------------------------------- helpers


def case_root(case) -> Path:
    """The directory TensorFlow wrote the case into (holds nothing else)."""
    return Path(case.path) if case.name == "keras_manager" else Path(case.path).parent


def local_files(d) -> dict[str, bytes]:
    d = Path(d)
    if not d.exists():
        return {}
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def mem_files(url: str) -> dict[str, bytes]:
    """Every object under a memory:// URL, relative name -> bytes (read without cat_file)."""
    root = MemoryFileSystem._strip_protocol(url)
    return {p[len(root) + 1 :]: MEM[p].getvalue() for p in sorted(MEM) if p.startswith(root + "/")}


def put_tree(fs, local_dir, dest: str) -> None:
    """Copy every file under ``local_dir`` to ``dest`` (a path in ``fs``)."""
    for p in sorted(Path(local_dir).rglob("*")):
        if p.is_file():
            fs.pipe_file(f"{dest}/{p.relative_to(local_dir).as_posix()}", p.read_bytes())


def same_value(got, want) -> None:
    problem = tfc.mismatch(got, want, want.dtype)
    assert problem is None, problem


def assert_same_checkpoint(got: tfckpt.Checkpoint, want: tfckpt.Checkpoint) -> None:
    """Same tensors, index entries and values (bit for bit)."""
    assert got.keys() == want.keys()
    assert got.header == want.header
    for name in want.keys():
        assert got.info(name) == want.info(name), name
        same_value(got[name], want[name])


def float16_of(value: np.ndarray) -> np.ndarray:
    return value.astype(np.float16) if value.dtype.kind == "f" else value


def assert_no_junk(d: Path) -> None:
    """Nothing at all was left in directory ``d`` (absent or empty)."""
    assert local_files(d) == {}, sorted(local_files(d))


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def cases(tf_checkpoints):
    return {n: tf_checkpoints(n) for n in CASES + ("saved_model",)}


@pytest.fixture(scope="module")
def ovf(tmp_path_factory):
    """A TF-written checkpoint whose last tensor overflows float16; several output shards."""
    d = tmp_path_factory.mktemp("remote_ovf")
    prefix = th.save_v2(
        d / "ovf",
        {
            "a": np.linspace(-3, 3, 100, dtype=np.float32),
            "b": np.linspace(-1, 1, 100).astype(np.float64),
            "z_big": np.array([1.0, 70000.0, -1e6, 0.5], dtype=np.float32),
        },
    )
    return SimpleNamespace(dir=d, prefix=prefix, name="ovf")


@pytest.fixture(scope="module")
def reference(cases, tmp_path_factory):
    """``reference(case_name, **options)``: files of the local -> local conversion to float16."""
    made: dict = {}

    def get(name: str, **options) -> dict[str, bytes]:
        key = (name, tuple(sorted(options.items())))
        if key not in made:
            d = tmp_path_factory.mktemp(f"ref_{name}")
            tfckpt.convert(cases[name].path, f"{d}/", "float16", **options)
            made[key] = local_files(d)
        return made[key]

    return get


@pytest.fixture
def mem():
    """A fresh root in the memory:// file system, removed afterwards."""
    fs = fsspec.filesystem("memory")
    root = f"/t{uuid.uuid4().hex[:12]}"
    yield SimpleNamespace(fs=fs, root=root, url=f"memory:/{root}")
    for p in [p for p in MEM if p.startswith(root + "/")]:
        del MEM[p]
    MemoryFileSystem.pseudo_dirs[:] = [
        d for d in MemoryFileSystem.pseudo_dirs if not (d == root or d.startswith(root + "/"))
    ]


@pytest.fixture
def mem_case(mem, cases):
    """``mem_case(name)`` -> (memory URL of the case's ``path``, URL of its prefix)."""

    def get(name: str) -> tuple[str, str]:
        case = cases[name]
        root = case_root(case)
        dest = f"{mem.root}/{name}"
        put_tree(mem.fs, root, dest)

        def url(p):
            rel = Path(p).relative_to(root).as_posix()
            return f"memory:/{dest}" + ("" if rel == "." else f"/{rel}")

        return url(case.path), url(case.prefix)

    return get


@pytest.fixture
def record(monkeypatch):
    """Record every memory:// read (cat_file ranges), open, removal and copy, in order."""
    log = SimpleNamespace(cats=[], opens=[], removed=[], copied=[], at_index_open={})
    cat_file, _open = MemoryFileSystem.cat_file, MemoryFileSystem._open
    _rm, cp_file = MemoryFileSystem._rm, MemoryFileSystem.cp_file

    def rec_cat(self, path, start=None, end=None, **kw):
        log.cats.append((self._strip_protocol(path), start, end))
        return cat_file(self, path, start=start, end=end, **kw)

    def rec_open(self, path, mode="rb", *args, **kw):
        path = self._strip_protocol(path)
        log.opens.append((path, mode))
        if "w" in mode and path.endswith(".index"):
            # What the store holds the moment the commit (the index) starts.
            log.at_index_open = {
                p: MEM[p].getvalue() for p in MEM if p.startswith(path[: -len(".index")] + ".data-")
            }
        return _open(self, path, mode, *args, **kw)

    def rec_rm(self, path):
        log.removed.append(self._strip_protocol(path))
        return _rm(self, path)

    def rec_cp(self, path1, path2, **kw):
        log.copied.append((path1, path2))
        return cp_file(self, path1, path2, **kw)

    monkeypatch.setattr(MemoryFileSystem, "cat_file", rec_cat)
    monkeypatch.setattr(MemoryFileSystem, "_open", rec_open)
    monkeypatch.setattr(MemoryFileSystem, "_rm", rec_rm)
    monkeypatch.setattr(MemoryFileSystem, "cp_file", rec_cp)

    def clear():
        log.cats.clear()
        log.opens.clear()
        log.removed.clear()
        log.copied.clear()
        log.at_index_open = {}

    log.clear = clear
    return log


def data_reads(log) -> list[tuple[str, int, int]]:
    return [c for c in log.cats if ".data-" in c[0]]


# ================================================================ memory://: reading


@pytest.mark.parametrize(
    "name,form",
    [
        ("tf1_sharded", "prefix"),
        ("tf1_sharded", "index"),
        ("max_shard_policy", "prefix"),
        ("max_shard_policy", "data_file"),
        ("keras_manager", "state_dir"),
        ("keras_manager", "state_dir/"),
        ("saved_model", "saved_model_dir"),
    ],
)
def test_open_memory_url_reads_like_local(cases, mem_case, name, form):
    case = cases[name]
    path_url, prefix_url = mem_case(name)
    url = {
        "prefix": prefix_url,
        "index": prefix_url + ".index",
        "data_file": prefix_url + ".data-00001-of-" + f"{len(tfc.data_files(case.prefix)):05d}",
        "state_dir": path_url,
        "state_dir/": path_url + "/",
        "saved_model_dir": path_url,
    }[form]
    with tfckpt.open(case.prefix) as want, tfckpt.open(url) as got:
        assert got.prefix == prefix_url
        assert got.storage.local is False
        assert_same_checkpoint(got, want)
    if form.startswith("state_dir"):
        assert tfckpt.latest_checkpoint(path_url) == prefix_url


def test_open_missing_memory_checkpoint_is_not_found(mem):
    with pytest.raises(tfckpt.CheckpointNotFoundError, match="no checkpoint found"):
        tfckpt.open(f"{mem.url}/nothing/model.ckpt")


@pytest.mark.parametrize("name", CASES)
def test_dump_reads_only_the_index(cases, mem_case, record, capsys, name):
    path_url, prefix_url = mem_case(name)
    record.clear()
    assert cli.main(["dump", path_url, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert cli.main(["dump", path_url]) == 0
    assert prefix_url in capsys.readouterr().out
    assert data_reads(record) == [], "dump fetched tensor bytes"
    assert not [o for o in record.opens if ".data-" in o[0]], record.opens
    read = {c[0] for c in record.cats}
    index = MemoryFileSystem._strip_protocol(prefix_url) + ".index"
    assert index in read and read <= {
        index,
        MemoryFileSystem._strip_protocol(path_url) + "/checkpoint",
    }, read
    # Same listing as the local dump, but for the prefix.
    assert cli.main(["dump", cases[name].path, "--json"]) == 0
    want = json.loads(capsys.readouterr().out)
    assert got["prefix"] == prefix_url
    got["prefix"] = want["prefix"]
    assert got == want


def test_reading_one_tensor_fetches_only_its_bytes(mem_case, record):
    _, prefix_url = mem_case("tf1_sharded")
    prefix = MemoryFileSystem._strip_protocol(prefix_url)
    with tfckpt.open(prefix_url) as ckpt:
        names = ckpt.keys()
        n = ckpt.header.num_shards
    assert n == 2
    for name in names:
        with tfckpt.open(prefix_url) as ckpt:
            info = ckpt.info(name)
            record.clear()
            ckpt[name]
            assert record.cats == [
                (paths.data_filename(prefix, info.shard, n), info.offset, info.offset + info.nbytes)
            ], name
            assert not [o for o in record.opens if "w" in o[1]]


def test_reading_a_partitioned_tensor_fetches_only_its_slices(mem_case, record):
    _, prefix_url = mem_case("max_shard_policy")
    prefix = MemoryFileSystem._strip_protocol(prefix_url)
    name = "matrix/.ATTRIBUTES/VARIABLE_VALUE"
    with tfckpt.open(prefix_url) as ckpt:
        n = ckpt.header.num_shards
        parts = ckpt.slice_info(name)
        assert len(parts) >= 2  # TensorFlow split it over shards
        want = sorted(
            (paths.data_filename(prefix, s.shard, n), s.offset, s.offset + s.nbytes) for s in parts
        )
        record.clear()
        ckpt[name]
        assert sorted(record.cats) == want
        # Streaming in small chunks: consecutive ranges inside the slices, each byte once.
        record.clear()
        for _ in ckpt.iter_chunks(name, 64):
            pass
        fetched = sorted(record.cats)
        assert sum(e - s for _, s, e in fetched) == sum(s.nbytes for s in parts)
        for path, start, end in fetched:
            assert any(p == path and s <= start and end <= e for p, s, e in want), (
                path,
                start,
                end,
            )
        for (p1, _, e1), (p2, s2, _) in zip(fetched, fetched[1:]):
            assert p1 != p2 or e1 <= s2, "a byte range was fetched twice"


def test_dump_tensor_values_fetches_only_that_tensor(mem_case, record, capsys):
    _, prefix_url = mem_case("tf1_sharded")
    prefix = MemoryFileSystem._strip_protocol(prefix_url)
    with tfckpt.open(prefix_url) as ckpt:
        info = ckpt.info("dev1/ids")
        n = ckpt.header.num_shards
    record.clear()
    assert cli.main(["dump", prefix_url, "--tensor", "dev1/ids", "--full"]) == 0
    out = capsys.readouterr().out
    assert "dev1/ids (int64 [100])" in out and " 99]" in out
    assert data_reads(record) == [
        (paths.data_filename(prefix, info.shard, n), info.offset, info.offset + info.nbytes)
    ]


# ================================================================ memory://: verify


def test_verify_memory_url(mem_case, capsys):
    path_url, prefix_url = mem_case("max_shard_policy")
    report = tinspect.verify(prefix_url)
    assert report["problems"] == [] and report["warnings"] == []
    assert report["tensors"] == len(tfckpt.open(prefix_url))
    assert cli.main(["verify", prefix_url]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {prefix_url}: ")

    # A flipped data byte and a missing data object are found on object storage too.
    prefix = MemoryFileSystem._strip_protocol(prefix_url)
    with tfckpt.open(prefix_url) as ckpt:
        info = ckpt.info("small/.ATTRIBUTES/VARIABLE_VALUE")
        n = ckpt.header.num_shards
    shard = paths.data_filename(prefix, info.shard, n)
    data = bytearray(MEM[shard].getvalue())
    data[info.offset] ^= 0x01
    MEM[shard] = type(MEM[shard])(MEM[shard].fs, shard, bytes(data))
    problems = tinspect.verify(prefix_url)["problems"]
    assert len(problems) == 1 and "checksum mismatch" in problems[0], problems
    assert "small/.ATTRIBUTES/VARIABLE_VALUE" in problems[0]
    assert cli.main(["verify", prefix_url]) == 1
    assert "checksum mismatch" in capsys.readouterr().err

    other = next(k for k in range(n) if k != info.shard)
    del MEM[paths.data_filename(prefix, other, n)]
    problems = tinspect.verify(prefix_url)["problems"]
    assert any(
        p == f"{paths.data_filename(prefix_url, other, n)}: data shard is missing" for p in problems
    ), problems


# ================================================================ memory://: converting


@pytest.mark.parametrize("name", ["tf1_sharded", "max_shard_policy"])
@pytest.mark.parametrize(
    "src_kind,dst_kind", [("memory", "memory"), ("memory", "local"), ("local", "memory")]
)
def test_convert_between_memory_and_local(
    cases, mem, mem_case, reference, tmp_path, name, src_kind, dst_kind
):
    case = cases[name]
    src = mem_case(name)[0] if src_kind == "memory" else case.path
    dst = f"{mem.url}/out/" if dst_kind == "memory" else f"{tmp_path}/out/"
    summary = tfckpt.convert(src, dst, "float16")
    base = Path(case.prefix).name
    assert summary.dst == dst + base
    assert summary.cast >= 1
    got = mem_files(f"{mem.url}/out") if dst_kind == "memory" else local_files(tmp_path / "out")
    want = reference(name)
    assert sorted(got) == sorted(want)
    for f in want:
        assert got[f] == want[f], f"{f} differs from the local -> local conversion"
    # Read back through the URL (or path) it was written to.
    with tfckpt.open(dst) as out, tfckpt.open(case.prefix) as orig:
        assert out.prefix == dst + base
        for k in orig.keys():
            if k != OBJECT_GRAPH_KEY:
                same_value(out[k], float16_of(orig[k]))
    if dst_kind == "local" and name == "tf1_sharded":
        reader = tf.train.load_checkpoint(str(tmp_path / "out"))
        with tfckpt.open(case.prefix) as orig:
            for k in orig.keys():
                same_value(np.asarray(reader.get_tensor(k)), float16_of(orig[k]))


def test_transform_memory_to_memory_reshard_and_select(cases, mem, mem_case, tmp_path):
    src = mem_case("keras_manager")[0]
    options = dict(cast="float16", max_shard_bytes=300, drop_objects=["optimizer"])
    tfckpt.transform(src, f"{mem.url}/out/", **options)
    tfckpt.transform(cases["keras_manager"].path, f"{tmp_path}/", **options)
    got, want = mem_files(f"{mem.url}/out"), local_files(tmp_path)
    assert len([f for f in want if ".data-" in f]) >= 3  # really re-sharded
    assert got == want
    assert tinspect.verify(f"{mem.url}/out")["problems"] == []


def test_convert_memory_writes_final_names_and_the_index_last(mem_case, mem, record):
    src = mem_case("max_shard_policy")[1]
    record.clear()
    tfckpt.convert(src, f"{mem.url}/out/", "float16", max_shard_bytes=600)
    out = mem_files(f"{mem.url}/out")
    prefix = f"{mem.root}/out/policy"
    data = sorted(f for f in out if ".data-" in f)
    n = len(data)
    assert n >= 3 and data == [Path(paths.data_filename(prefix, k, n)).name for k in range(n)]
    writes = [p for p, mode in record.opens if "w" in mode or "x" in mode]
    # Every object is written once, under its final name; the index after every data object;
    # only the state file after the index.
    assert sorted(writes) == sorted(f"{mem.root}/out/{f}" for f in out)
    assert not [p for p in writes if TMP_MARK in p]
    assert writes.index(prefix + ".index") == n and writes[-1] == f"{mem.root}/out/checkpoint"
    # When the index was started, every data object was already complete.
    assert record.at_index_open == {f"{mem.root}/out/{f}": out[f] for f in data}
    assert record.removed == [] and record.copied == []  # no rename, no clean-up


def test_convert_fetches_each_source_byte_once_numeric(mem_case, mem, record):
    """Cost model: a task reads exactly the bytes of its tensors, each once."""
    for name in ("tf1_sharded", "keras_manager"):
        _check_fetches_once(mem_case, mem, record, name)


def test_convert_fetches_each_source_byte_once_with_strings(mem_case, mem, record):
    _check_fetches_once(mem_case, mem, record, "max_shard_policy")


def _check_fetches_once(mem_case, mem, record, name):
    src = mem_case(name)[0]
    p = tfckpt.plan(src, f"{mem.url}/{name}-out/", cast="float16")
    record.clear()
    execute(p)
    fetched = data_reads(record)
    dupes = sorted({c for c in fetched if fetched.count(c) > 1})
    assert dupes == [], f"byte ranges fetched more than once: {dupes}"
    assert sum(e - s for _, s, e in fetched) == p.bytes_in


def test_shard_tasks_and_manual_commit_to_memory(cases, mem, reference, tmp_path):
    """The building blocks an executor runs: picklable tasks, entries merged, index last."""
    src = cases["max_shard_policy"].prefix
    p = tfckpt.plan(src, f"{mem.url}/out/", cast="float16", max_shard_bytes=600)
    tasks = shard_tasks(p)
    n = len(tasks)
    assert n >= 3 and [t.shard_id for t in tasks] == list(range(n))
    assert [t.path for t in tasks] == [paths.data_filename(p.dst, k, n) for k in range(n)]
    assert all(isinstance(t, ShardTask) and pickle.loads(pickle.dumps(t)) == t for t in tasks)
    assert sum(t.object_graph is not None for t in tasks) == 1
    local = shard_tasks(tfckpt.plan(src, f"{tmp_path}/x/", cast="float16", max_shard_bytes=600))
    assert all(TMP_MARK in t.path and t.path.endswith(f".data-{t.shard_id}") for t in local)

    results = [run_shard_task(t) for t in reversed(tasks)][::-1]  # any order
    assert not fsspec.filesystem("memory").exists(f"{mem.root}/out/policy.index")
    entries = merge_entries([r.entries for r in results])
    with pytest.raises(ValueError, match="final names"):
        commit_shards(p.storage, p.dst, [t.path + ".tmp" for t in tasks], entries)
    assert commit_shards(p.storage, p.dst, [t.path for t in tasks], entries) == p.dst
    want = reference("max_shard_policy", max_shard_bytes=600)
    got = mem_files(f"{mem.url}/out")
    assert got == {f: b for f, b in want.items() if f != "checkpoint"}


# ================================================================ file://


def test_file_url_source(cases, reference, tmp_path, capsys):
    for name in ("tf1_sharded", "keras_manager"):
        case = cases[name]
        with tfckpt.open("file://" + case.path) as got, tfckpt.open(case.prefix) as want:
            assert got.prefix == case.prefix
            assert_same_checkpoint(got, want)
        out = tmp_path / name
        tfckpt.convert("file://" + case.path, f"{out}/", "float16")
        assert local_files(out) == reference(name)
    assert cli.main(["dump", "file://" + cases["tf1_sharded"].prefix]) == 0
    assert "dev0/w" in capsys.readouterr().out
    assert tinspect.verify("file://" + cases["tf1_sharded"].prefix)["problems"] == []


def test_file_url_destination(cases, reference, tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # where the misplaced files land, instead of the repository
    out = tmp_path / "out"
    summary = tfckpt.convert(cases["tf1_sharded"].path, f"file://{out}/", "float16")
    assert summary.dst == f"{out}/sharded.ckpt"  # file:// URLs become plain local paths
    assert_no_junk(cwd)
    assert local_files(out) == reference("tf1_sharded")


def test_save_to_memory_url(mem, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    values = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "s": np.array([b"x", b""], dtype=object),
    }
    try:
        assert tfckpt.save(values, f"{mem.url}/saved/model") == f"{mem.url}/saved/model"
    finally:
        assert_no_junk(tmp_path)
    with tfckpt.open(f"{mem.url}/saved/model") as ckpt:
        for k, v in values.items():
            same_value(ckpt[k], v)


# ================================================================ failed runs (memory, local)


@pytest.mark.parametrize("dst_kind", ["memory", "local"])
def test_overflow_error_leaves_nothing(ovf, mem, record, tmp_path, dst_kind):
    dst = f"{mem.url}/out/" if dst_kind == "memory" else f"{tmp_path}/out/"
    record.clear()
    with pytest.raises(tfckpt.CheckpointError, match="z_big") as e:
        tfckpt.convert(ovf.prefix, dst, "float16", max_shard_bytes=200)
    assert "nothing written" in str(e.value)
    if dst_kind == "memory":
        written = sorted(p for p, m in record.opens if "w" in m)
        assert len(written) == 3 and all(".data-" in p for p in written)  # written, then...
        assert sorted(record.removed) == written  # ...removed
        assert mem_files(f"{mem.url}/out") == {}
    else:
        assert_no_junk(tmp_path / "out")
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["memory", "local"])
@pytest.mark.parametrize("workers", [None, 2])
def test_task_fails_when_a_source_shard_is_gone(cases, mem, mem_case, tmp_path, where, workers):
    """The source's last data file disappears between planning and running."""
    if where == "memory":
        src = mem_case("tf1_sharded")[1]
        dst = f"{mem.url}/out/"
    else:
        shutil.copytree(case_root(cases["tf1_sharded"]), tmp_path / "src")
        src, dst = str(tmp_path / "src" / "sharded.ckpt"), f"{tmp_path}/out/"
    p = tfckpt.plan(src, dst, cast="float16")
    gone = paths.data_filename(src, 1, 2)
    if where == "memory":
        del MEM[MemoryFileSystem._strip_protocol(gone)]
    else:
        os.unlink(gone)
    pool = ThreadPoolExecutor(workers) if workers else None
    try:
        with pytest.raises(tfckpt.CheckpointError) as e:
            execute(p, executor=pool)
    finally:
        if pool:
            pool.shutdown()
    assert gone in str(e.value)
    assert_nothing_left(where, mem, tmp_path)


class FailingExecutor:
    """An executor whose every future raises, as a lost worker's would."""

    def __init__(self, error):
        self.error = error
        self.submitted = []

    def submit(self, fn, arg):
        self.submitted.append(arg)
        f = Future()
        f.set_exception(self.error)
        return f


@pytest.mark.parametrize("dst_kind", ["memory", "local"])
def test_executor_whose_futures_raise(cases, mem, tmp_path, dst_kind):
    dst = f"{mem.url}/out/" if dst_kind == "memory" else f"{tmp_path}/out/"
    ex = FailingExecutor(ConnectionResetError("worker lost"))
    with pytest.raises(
        tfckpt.CheckpointError, match="a shard task failed: ConnectionResetError: worker lost"
    ):
        tfckpt.convert(cases["max_shard_policy"].path, dst, "float16", executor=ex)
    # One task per source shard that keeps data: a shard that held only float16
    # slices (written whole, where their first slice was) gets none.
    with tfckpt.open(cases["max_shard_policy"].path) as src:
        assert src.header.num_shards == 4
    assert len(ex.submitted) == 3 and all(isinstance(t, ShardTask) for t in ex.submitted)
    # A CheckpointError from a task reaches the caller as it is.
    err = tfckpt.CorruptCheckpointError("bad bytes", path="somewhere")
    with pytest.raises(tfckpt.CorruptCheckpointError, match="bad bytes"):
        tfckpt.convert(
            cases["max_shard_policy"].path, dst, "float16", executor=FailingExecutor(err)
        )
    assert_nothing_left(dst_kind, mem, tmp_path)


def assert_nothing_left(kind: str, mem, tmp_path) -> None:
    """A failed run left no object (memory) or directory (local) at its destination."""
    if kind == "memory":
        assert mem_files(f"{mem.url}/out") == {}
    else:
        assert not (tmp_path / "out").exists()


class FirstTaskFailsExecutor:
    """Thread pool where shard 0 fails at once while the other shards are still running."""

    def __init__(self, pool):
        self.pool = pool
        self.failed = threading.Event()

    def _run(self, fn, task):
        if task.shard_id == 0:
            raise RuntimeError("shard 0 failed")
        self.failed.wait(timeout=1)  # still running when the failure is reported
        return fn(task)

    def submit(self, fn, task):
        return self.pool.submit(self._run, fn, task)


@pytest.mark.parametrize("dst_kind", ["memory", "local"])
def test_failure_while_other_tasks_still_run_leaves_nothing(cases, mem, tmp_path, dst_kind):
    dst = f"{mem.url}/out/" if dst_kind == "memory" else f"{tmp_path}/out/"
    pool = ThreadPoolExecutor(4)
    ex = FirstTaskFailsExecutor(pool)
    try:
        with pytest.raises(tfckpt.CheckpointError, match="shard 0 failed"):
            tfckpt.convert(cases["max_shard_policy"].path, dst, "float16", executor=ex)
    finally:
        ex.failed.set()
        pool.shutdown(wait=True)
    left = mem_files(f"{mem.url}/out") if dst_kind == "memory" else local_files(tmp_path / "out")
    assert left == {}, sorted(left)


def test_destination_spelled_differently_is_still_the_source(mem, mem_case):
    src = mem_case("tf1_sharded")[1]  # memory://tXXX/tf1_sharded/sharded.ckpt
    before = mem_files(mem.url)
    other = "memory:///" + src[len("memory://") :].rsplit("/", 1)[0] + "/"
    try:
        with pytest.raises(tfckpt.CheckpointError, match="source"):
            tfckpt.convert(src, other, "float16", overwrite=True)
    finally:
        after = mem_files(mem.url)
        assert after == before, (
            f"source objects changed: {sorted(k for k in before if before[k] != after.get(k))}"
        )


# ================================================================ concurrent.futures


@pytest.mark.parametrize(
    "name,max_shard_bytes",
    [("tf1_sharded", None), ("max_shard_policy", None), ("keras_manager", 1000)],
)
def test_thread_pool_output_identical(cases, reference, tmp_path, mem, name, max_shard_bytes):
    with ThreadPoolExecutor(2) as pool:
        tfckpt.convert(
            cases[name].path,
            f"{tmp_path}/",
            "float16",
            executor=pool,
            max_shard_bytes=max_shard_bytes,
        )
        tfckpt.convert(
            cases[name].path,
            f"{mem.url}/out/",
            "float16",
            executor=pool,
            max_shard_bytes=max_shard_bytes,
        )
    want = reference(name, max_shard_bytes=max_shard_bytes)
    assert len([f for f in want if ".data-" in f]) >= 2
    assert local_files(tmp_path) == want
    assert mem_files(f"{mem.url}/out") == want


def test_process_pool_output_identical(s3, cases, reference, tmp_path):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    src = cases["max_shard_policy"].path
    want = reference("max_shard_policy", max_shard_bytes=600)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        tfckpt.convert(src, f"{tmp_path}/", "float16", max_shard_bytes=600, executor=pool)
        tfckpt.convert(src, f"{s3.url}/out/", "float16", max_shard_bytes=600, executor=pool)
    assert local_files(tmp_path) == want
    assert s3.files(f"{s3.url}/out") == want


@pytest.mark.parametrize("spec", ["threads:2", "processes:2"])
def test_cli_pool_executors_output_identical(cases, reference, tmp_path, spec):
    proc = ch.run_text(
        "convert",
        cases["max_shard_policy"].path,
        f"{tmp_path}/",
        "--dtype",
        "float16",
        "--max-shard-bytes",
        "600",
        "--executor",
        spec,
    )
    assert proc.returncode == 0, proc.stderr
    assert local_files(tmp_path) == reference("max_shard_policy", max_shard_bytes=600)


def test_cli_bad_executor_spec(cases, tmp_path):
    proc = ch.run_text(
        "convert",
        cases["tf1_sharded"].path,
        f"{tmp_path}/out/",
        "--dtype",
        "float16",
        "--executor",
        "spark://x",
    )
    ch.assert_cli_error(proc, "unknown --executor 'spark://x'")
    assert not (tmp_path / "out").exists()


# ================================================================ S3 (moto on 127.0.0.1)


@pytest.fixture
def s3(s3_server, cases):
    """A fresh S3 file system instance and a unique key prefix; ``upload(name)`` puts a case
    under ``s3://BUCKET/<id>/<name>/`` and returns (URL of its path, URL of its prefix)."""
    s3_server.s3fs.S3FileSystem.clear_instance_cache()
    fs = fsspec.filesystem("s3")
    base = f"{BUCKET}/{uuid.uuid4().hex[:12]}"

    def upload(name: str) -> tuple[str, str]:
        case = cases[name]
        root = case_root(case)
        for p in sorted(root.rglob("*")):
            if p.is_file():
                fs.put_file(str(p), f"{base}/{name}/{p.relative_to(root).as_posix()}")

        def url(p):
            rel = Path(p).relative_to(root).as_posix()
            return f"s3://{base}/{name}" + ("" if rel == "." else f"/{rel}")

        return url(case.path), url(case.prefix)

    def files(url: str) -> dict[str, bytes]:
        fs.invalidate_cache()
        key = url[len("s3://") :].rstrip("/")
        return {p[len(key) + 1 :]: fs.cat_file(p) for p in fs.find(key)}

    def download(url: str, d: Path) -> Path:
        for rel, data in files(url).items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(data)
        return d

    yield SimpleNamespace(
        fs=fs, url=f"s3://{base}", upload=upload, files=files, download=download, log=s3_server.log
    )
    s3_server.s3fs.S3FileSystem.clear_instance_cache()


def tf2_restore_float16(prefix, orig: tfckpt.Checkpoint) -> None:
    """``tf.train.Checkpoint(...).restore`` of the max_shard_policy variables, floats as
    float16; every value must be the float16 of the original."""
    key = "{}/.ATTRIBUTES/VARIABLE_VALUE".format
    variables = {}
    for name in ("big", "matrix", "small", "half", "name"):
        v = orig[key(name)]
        zero = (
            np.zeros(v.shape, np.float16 if v.dtype.kind == "f" else v.dtype)
            if v.dtype != object
            else b""
        )
        variables[name] = tf.Variable(zero)
    # read(): the source was written with write(), which keeps no save_counter.
    status = tf.train.Checkpoint(**variables).read(str(prefix))
    status.assert_consumed()
    for name, var in variables.items():
        want = orig[key(name)]
        if want.dtype == object:
            assert var.numpy() == want.item()
        else:
            assert var.dtype == (tf.float16 if want.dtype.kind == "f" else tf.as_dtype(want.dtype))
            same_value(var.numpy(), float16_of(want))


def tf1_values_are_float16_of(prefix, orig: tfckpt.Checkpoint) -> None:
    reader = tf.train.load_checkpoint(str(prefix))
    assert sorted(reader.get_variable_to_shape_map()) == sorted(orig.keys())
    for k in orig.keys():
        same_value(np.asarray(reader.get_tensor(k)), float16_of(orig[k]))


def test_s3_open_reads_like_local(s3, cases):
    for name in ("max_shard_policy", "keras_manager"):
        path_url, prefix_url = s3.upload(name)
        with tfckpt.open(path_url) as got, tfckpt.open(cases[name].prefix) as want:
            assert got.prefix == prefix_url
            assert_same_checkpoint(got, want)


@pytest.fixture(scope="module")
def keras_base():
    """An untrained instance of the architecture of the ``keras_manager`` checkpoint."""
    model, _ = tfc.make_keras_model()
    return model


def keras_restore_float16(prefix, case, keras_base) -> None:
    model = th.keras_like(keras_base, "float16")
    assert [w.dtype for w in model.weights] == ["float16"] * len(case.extra["weights"])
    tf.train.Checkpoint(model=model).restore(str(prefix)).assert_existing_objects_matched()
    for w, orig in zip(model.weights, case.extra["weights"]):
        same_value(w.numpy(), orig.astype(np.float16))


@pytest.mark.parametrize("name", ["tf1_sharded", "max_shard_policy", "keras_manager"])
def test_s3_to_s3_float16_restored_by_tensorflow(s3, cases, reference, keras_base, tmp_path, name):
    src, _ = s3.upload(name)  # the keras_manager directory: its state file names ckpt-2
    s3.log.requests.clear()
    summary = tfckpt.convert(src, f"{s3.url}/out/", "float16")
    base = Path(cases[name].prefix).name
    assert summary.dst == f"{s3.url}/out/{base}"
    want = reference(name)
    assert s3.files(f"{s3.url}/out") == want
    # Each object PUT once under its final name, the data objects first, then the index (the
    # commit), then the state file; nothing copied (a rename) or deleted.
    out = "/" + s3.url[len("s3://") :] + "/out/"
    writes = [
        (m, p[len(out) :])
        for m, p, _ in s3.log.requests
        if p.startswith(out) and m not in ("GET", "HEAD")
    ]
    data = sorted(f for f in want if ".data-" in f)
    assert writes[: len(data)] == [("PUT", f) for f in data]  # tasks run in shard order
    assert writes[len(data) :] == [("PUT", base + ".index"), ("PUT", "checkpoint")]
    local = s3.download(f"{s3.url}/out", tmp_path)
    assert tf.train.latest_checkpoint(str(local)) == str(local / base)
    with tfckpt.open(cases[name].prefix) as orig:
        if name == "tf1_sharded":
            tf1_values_are_float16_of(local / base, orig)
        elif name == "max_shard_policy":
            tf2_restore_float16(local / base, orig)
        else:
            keras_restore_float16(local / base, cases[name], keras_base)


def test_s3_cli_convert_and_dump(s3, cases, reference, tmp_path):
    _, src = s3.upload("tf1_sharded")
    s3.log.requests.clear()
    proc = ch.run_text("dump", src)
    assert proc.returncode == 0, proc.stderr
    assert f"prefix      {src}" in proc.stdout and "dev1/ids" in proc.stdout
    touched = [r for r in s3.log.requests if ".data-" in r[1]]
    assert touched == [], f"dump touched data objects: {touched}"
    assert any(m == "GET" and p.endswith("sharded.ckpt.index") for m, p, _ in s3.log.requests)

    proc = ch.run_text("convert", src, f"{s3.url}/cli/", "--dtype", "float16")
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {s3.url}/cli/sharded.ckpt" in proc.stderr
    assert s3.files(f"{s3.url}/cli") == reference("tf1_sharded")
    local = s3.download(f"{s3.url}/cli", tmp_path)
    with tfckpt.open(cases["tf1_sharded"].prefix) as orig:
        tf1_values_are_float16_of(local / "sharded.ckpt", orig)

    proc = ch.run_text("verify", f"{s3.url}/cli")
    assert proc.returncode == 0 and proc.stdout.startswith(f"ok: {s3.url}/cli/sharded.ckpt")


def test_s3_reading_one_tensor_is_one_range_get(s3, cases):
    _, src = s3.upload("tf1_sharded")
    with tfckpt.open(src) as ckpt:
        info = ckpt.info("dev0/w")
        shard = paths.data_filename("sharded.ckpt", info.shard, ckpt.header.num_shards)
        s3.log.requests.clear()
        value = ckpt["dev0/w"]
    with tfckpt.open(cases["tf1_sharded"].prefix) as orig:
        same_value(value, orig["dev0/w"])
    gets = [r for r in s3.log.requests if r[0] == "GET"]
    assert len(gets) == 1 and gets[0][1].endswith("/" + shard) and gets[0][2] == 206, (
        s3.log.requests
    )  # one partial-content GET of the tensor's data object


def test_s3_to_local_and_local_to_s3(s3, cases, reference, tmp_path):
    _, src = s3.upload("max_shard_policy")
    tfckpt.convert(src, f"{tmp_path}/", "float16", max_shard_bytes=600)
    want = reference("max_shard_policy", max_shard_bytes=600)
    assert local_files(tmp_path) == want
    with tfckpt.open(cases["max_shard_policy"].prefix) as orig:
        tf2_restore_float16(tmp_path / "policy", orig)

    tfckpt.convert(cases["max_shard_policy"].path, f"{s3.url}/up/", "float16", max_shard_bytes=600)
    assert s3.files(f"{s3.url}/up") == want


def test_s3_failed_run_leaves_nothing(s3, ovf):
    for i, src in enumerate([ovf.prefix, None]):
        if src is None:  # the same from an S3 source
            s3.fs.put_file(ovf.prefix + ".index", f"{s3.url[5:]}/src/ovf.index")
            s3.fs.put_file(
                paths.data_filename(ovf.prefix, 0, 1),
                f"{s3.url[5:]}/src/{Path(paths.data_filename(ovf.prefix, 0, 1)).name}",
            )
            src = f"{s3.url}/src/ovf"
        with pytest.raises(tfckpt.CheckpointError, match="z_big"):
            tfckpt.convert(src, f"{s3.url}/out{i}/", "float16", max_shard_bytes=200)
        assert s3.files(f"{s3.url}/out{i}") == {}
        puts = [p for m, p, _ in s3.log.requests if m == "PUT" and f"/out{i}/" in p]
        assert len([p for p in puts if ".data-" in p]) == 3 and not [
            p for p in puts if p.endswith(".index")
        ]


# ================================================================ Dask


@pytest.fixture(scope="module")
def dask_cluster(s3_server):
    """Two worker processes on 127.0.0.1 (started after the S3 settings, so they inherit them).
    A task whose worker dies fails at once (allowed_failures=0)."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(
        n_workers=2,
        processes=True,
        threads_per_worker=1,
        dashboard_address=None,
        host="127.0.0.1",
        scheduler_kwargs={"allowed_failures": 0},
    )
    client = distributed.Client(cluster)
    try:
        yield SimpleNamespace(cluster=cluster, client=client, distributed=distributed)
    finally:
        client.close()
        cluster.close()


DASK_RUNS = [
    ("tf1_sharded", None),
    ("max_shard_policy", None),
    ("tf1_sharded", 300),
    ("keras_manager", 1000),
]


@pytest.mark.parametrize("name,max_shard_bytes", DASK_RUNS)
def test_dask_output_identical(dask_cluster, cases, reference, tmp_path, name, max_shard_bytes):
    client = dask_cluster.client
    with dask_cluster.distributed.get_task_stream(client) as stream:
        summary = tfckpt.convert(
            cases[name].path,
            f"{tmp_path}/",
            "float16",
            max_shard_bytes=max_shard_bytes,
            executor=client,
        )
    want = reference(name, max_shard_bytes=max_shard_bytes)
    shards = [f for f in want if ".data-" in f]
    assert len(shards) >= 2
    assert local_files(tmp_path) == want
    assert summary.dst == f"{tmp_path}/{Path(cases[name].prefix).name}"
    ran = [t for t in stream.data if t["key"].startswith("run_shard_task")]
    assert len(ran) == len(shards)  # one task per output shard, run on the workers
    workers = set(client.scheduler_info()["workers"])
    assert {t["worker"] for t in ran} <= workers


def test_dask_cli(dask_cluster, cases, reference, tmp_path):
    address = dask_cluster.cluster.scheduler_address
    assert address.startswith("tcp://127.0.0.1:")
    spec = "dask://" + address[len("tcp://") :]
    for name, msb in [("max_shard_policy", None), ("tf1_sharded", 300)]:
        out = tmp_path / name
        args = ["convert", cases[name].path, f"{out}/", "--dtype", "float16", "--executor", spec]
        if msb:
            args += ["--max-shard-bytes", str(msb)]
        proc = ch.run_text(*args)
        assert proc.returncode == 0, proc.stderr
        assert local_files(out) == reference(name, max_shard_bytes=msb)


def test_dask_s3_to_s3(dask_cluster, s3, reference, tmp_path, cases):
    _, src = s3.upload("max_shard_policy")
    s3.log.requests.clear()
    tfckpt.convert(
        src, f"{s3.url}/out/", "float16", max_shard_bytes=600, executor=dask_cluster.client
    )
    assert s3.files(f"{s3.url}/out") == reference("max_shard_policy", max_shard_bytes=600)
    local = s3.download(f"{s3.url}/out", tmp_path)
    with tfckpt.open(cases["max_shard_policy"].prefix) as orig:
        tf2_restore_float16(local / "policy", orig)


def test_dask_task_fails_when_a_source_shard_is_gone(dask_cluster, cases, tmp_path):
    shutil.copytree(case_root(cases["tf1_sharded"]), tmp_path / "src")
    src = str(tmp_path / "src" / "sharded.ckpt")
    p = tfckpt.plan(src, f"{tmp_path}/out/", cast="float16")
    os.unlink(paths.data_filename(src, 1, 2))
    with pytest.raises(tfckpt.CheckpointError, match="data-00001-of-00002"):
        execute(p, executor=dask_cluster.client)
    assert not (tmp_path / "out").exists()


class KillLastTaskWorker:
    """Runs every task on the Dask client, except that the last one kills its worker process
    (submitted once the others have finished, so no other task is running then)."""

    def __init__(self, client, distributed, n):
        self.client, self.distributed, self.n = client, distributed, n
        self.futures = []

    def submit(self, fn, task):
        if task.shard_id == self.n - 1:
            self.distributed.wait(self.futures)
            f = self.client.submit(os._exit, 1, pure=False)
        else:
            f = self.client.submit(fn, task, pure=False)
        self.futures.append(f)
        return f


# How long a killed worker's replacement may take to join: a nanny starts a Python process
# that imports tfckpt and numpy, seconds on an idle machine, over a minute on a loaded one.
WORKER_START_S = 300


def settle(client, timeout=120.0) -> None:
    """Wait until no task is running anywhere on the cluster."""
    deadline = time.monotonic() + timeout
    while any(client.processing().values()):
        assert time.monotonic() < deadline, client.processing()
        time.sleep(0.05)


@pytest.mark.parametrize("dst_kind", ["local", "s3"])
def test_dask_worker_killed_mid_run(dask_cluster, cases, tmp_path, dst_kind, request):
    client = dask_cluster.client
    if dst_kind == "s3":
        s3 = request.getfixturevalue("s3")
        dst = f"{s3.url}/out/"
    else:
        dst = f"{tmp_path}/out/"
    p = tfckpt.plan(cases["max_shard_policy"].path, dst, cast="float16", max_shard_bytes=600)
    n = len(shard_tasks(p))
    assert n >= 3
    ex = KillLastTaskWorker(client, dask_cluster.distributed, n)
    try:
        # The error is the killed task's KilledWorker, or, when the dead worker also held
        # finished results, that of a task Dask re-ran to recompute them.
        with pytest.raises(tfckpt.CheckpointError):
            execute(p, executor=ex)
        settle(client)  # let every re-run finish before looking
        if dst_kind == "s3":
            assert s3.files(f"{s3.url}/out") == {}
        else:
            assert not (tmp_path / "out").exists()
    finally:
        # The nanny restarts it for the next tests.
        client.wait_for_workers(2, timeout=WORKER_START_S)


class LoseFirstResult:
    """Runs every task on the Dask client; once all have finished, kills the worker holding
    shard 0's result (as a preempted node would), so Dask recomputes that task elsewhere."""

    def __init__(self, client, distributed, n):
        self.client, self.distributed, self.n = client, distributed, n
        self.futures = []
        self.killed = None

    def submit(self, fn, task):
        f = self.client.submit(fn, task, pure=False)
        self.futures.append(f)
        if len(self.futures) == self.n:
            self.distributed.wait(self.futures)
            first = self.futures[0]
            self.killed = self.client.who_has([first])[first.key][0]
            pid = self.client.run(os.getpid, workers=[self.killed])[self.killed]
            os.kill(pid, signal.SIGKILL)  # a worker process of the cluster this module started
            deadline = time.monotonic() + 30
            while self.killed in self.client.who_has([first]).get(first.key, ()):
                assert time.monotonic() < deadline
                time.sleep(0.05)
        return f


@pytest.mark.parametrize(
    "dst_kind",
    [
        "s3",
        "local",
    ],
)
def test_dask_result_lost_with_its_worker_is_recomputed(
    dask_cluster, cases, reference, tmp_path, dst_kind, request
):
    client = dask_cluster.client
    if dst_kind == "s3":
        s3 = request.getfixturevalue("s3")
        dst = f"{s3.url}/out/"
    else:
        dst = f"{tmp_path}/out/"
    p = tfckpt.plan(cases["max_shard_policy"].path, dst, cast="float16", max_shard_bytes=600)
    ex = LoseFirstResult(client, dask_cluster.distributed, len(shard_tasks(p)))
    try:
        execute(p, executor=ex)
        assert ex.killed is not None
        got = s3.files(f"{s3.url}/out") if dst_kind == "s3" else local_files(tmp_path / "out")
        assert got == reference("max_shard_policy", max_shard_bytes=600)
    finally:
        settle(client)
        client.wait_for_workers(2, timeout=WORKER_START_S)
