"""Archives as sources: checkpoints TensorFlow writes, packed by the test with tarfile and
zipfile, read in place by every command exactly as their extracted files read.

- A tree of three checkpoints (a TF1 Saver's two data shards, a TF2 CheckpointManager's
  directory with its ``checkpoint`` state file, a V1 Saver file) packed as tar, tar.gz,
  zip stored and zip deflated: ``dump --json``, ``verify``, ``stats``, ``diff`` and the
  values read (against TensorFlow's reader of the extracted files), and ``convert``,
  ``select``, ``rename``, ``merge`` and ``export`` outputs byte for byte against the same
  commands on the extracted files; tar.bz2 and tar.xz through dump and convert.
- Bare archives: one checkpoint opens (a BERT-like zip, through ``export --preset``; a
  model-zoo V1 ``.tar.gz``), several are listed in the error, ``dump --all`` lists them.
- Hostile archives through the CLI: one line, exit 2, nothing written; bombs within a
  bound of memory (peak RSS of a process); a checkpoint bigger than the chunk budget in
  a ``.tar.gz`` converts within a bound set by the budget.
- The archive on an S3 server on loopback (moto).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tarfile
import uuid
import warnings
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import bert_release  # noqa: E402  (conftest put tests/ on sys.path)
import v1_checkpoints  # noqa: E402
from cli_helpers import assert_cli_error, in_process, user_env  # noqa: E402
from s3_helpers import BUCKET, s3_server  # noqa: E402,F401  (the moto server fixture)

import tfckpt  # noqa: E402
from tfckpt.io import compressed  # noqa: E402
from tfckpt.io.archives import ArchiveStorage  # noqa: E402
from tfckpt.io.storage import storage_for  # noqa: E402

# The checkpoints of the tree, as members (what ARCHIVE#MEMBER names).
MEMBERS = {
    "sharded": "sharded/sharded.ckpt",  # a TF1 Saver's, two data shards
    "managed": "train",  # a TF2 CheckpointManager's directory: its state file names ckpt-2
    "older": "train/ckpt-1",
    "v1": "v1/model.ckpt",  # a V1 Saver's single file
}
FULL_KINDS = ["tar", "tar.gz", "zip-stored", "zip-deflated"]
STREAM_KINDS = ["tar.bz2", "tar.xz"]


def pack(src: Path, out: Path, kind: str) -> Path:
    """``src``'s files (sorted, as member paths relative to it) into an archive of ``kind``."""
    files = sorted(p for p in src.rglob("*") if p.is_file())
    if kind.startswith("zip"):
        method = zipfile.ZIP_STORED if kind == "zip-stored" else zipfile.ZIP_DEFLATED
        with zipfile.ZipFile(out, "w", method) as z:
            for p in files:
                z.write(p, p.relative_to(src).as_posix())
    else:
        mode = {"tar": "w", "tar.gz": "w:gz", "tar.bz2": "w:bz2", "tar.xz": "w:xz"}[kind]
        with tarfile.open(out, mode) as t:
            for p in files:
                t.add(p, p.relative_to(src).as_posix())
    return out


def name_for(kind: str) -> str:
    return {"zip-stored": "stored.zip", "zip-deflated": "deflated.zip"}.get(kind, f"a.{kind}")


@pytest.fixture(scope="module")
def tree(tf_checkpoints, tmp_path_factory):
    """The extracted tree: checkpoints TensorFlow wrote (state files naming absolute paths
    left out; test_state_file_* keep theirs)."""
    root = tmp_path_factory.mktemp("tree")
    sharded = Path(tf_checkpoints("tf1_sharded").prefix)
    (root / "sharded").mkdir()
    for f in sharded.parent.glob(sharded.name + ".*"):
        shutil.copy(f, root / "sharded" / f.name)
    shutil.copytree(tf_checkpoints("keras_manager").path, root / "train")
    v1_checkpoints.save_v1(v1_checkpoints.build_dtypes_graph, str(root / "v1" / "model.ckpt"))
    (root / "v1" / "checkpoint").unlink()  # the Saver's, naming an absolute path
    return root


@pytest.fixture(scope="module")
def archives(tree, tmp_path_factory):
    d = tmp_path_factory.mktemp("archives")
    return {k: pack(tree, d / name_for(k), k) for k in FULL_KINDS + STREAM_KINDS}


def same_files(a: Path, b: Path) -> None:
    """Two output directories hold the same files, byte for byte."""
    names = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())
    assert names
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n


def cli(*args) -> str:
    rc, out, err = in_process(*args)
    assert rc == 0, err
    return out


# ================================================================ reading as extracted


@pytest.mark.parametrize("member", sorted(MEMBERS))
@pytest.mark.parametrize("kind", FULL_KINDS)
def test_every_command_reads_as_extracted(archives, tree, tmp_path, kind, member):
    archive = archives[kind]
    inside, outside = f"{archive}#{MEMBERS[member]}", str(tree / MEMBERS[member])
    as_extracted = lambda text: text.replace(f"{archive}#", f"{tree}/")  # noqa: E731

    assert as_extracted(cli("dump", "--json", inside)) == cli("dump", "--json", outside)
    assert as_extracted(cli("stats", "--json", inside)) == cli("stats", "--json", outside)
    assert "ok:" in cli("verify", inside)
    cli("diff", inside, outside)

    # The values, against reading the extracted files (and TensorFlow's reader of them,
    # but where its V1 reader refuses: float16, complex, partitioned).
    with tfckpt.open(inside) as ckpt, tfckpt.open(outside) as there:
        assert isinstance(ckpt.storage, ArchiveStorage)
        assert ckpt.keys() == there.keys()
        reader = tf.train.load_checkpoint(there.prefix)
        for name in ckpt.keys():
            got, want = ckpt[name], there[name]
            assert got.dtype == want.dtype and got.shape == want.shape, name
            if got.dtype == object:
                assert got.tolist() == want.tolist(), name
                continue
            assert got.tobytes() == want.tobytes(), name
            try:
                assert got.tobytes() == np.asarray(reader.get_tensor(name)).tobytes(), name
            except tf.errors.UnimplementedError:
                assert member == "v1"

    # (one exclude for every member: some have no step, which the flag allows)
    for verb in (
        ["convert", "--dtype", "float16"],
        ["select", "--exclude", "step", "--allow-unmatched"],
    ):
        for src, out in ((inside, "in"), (outside, "out")):
            cli(*verb[:1], src, f"{tmp_path / verb[0] / out}/", *verb[1:], "--no-fsync")
        same_files(tmp_path / verb[0] / "in", tmp_path / verb[0] / "out")
    for src, out in ((inside, "in"), (outside, "out")):
        cli("export", src, tmp_path / "export" / out / "model.safetensors", "--skip-unsupported")
    same_files(tmp_path / "export" / "in", tmp_path / "export" / "out")


@pytest.mark.parametrize("kind", FULL_KINDS)
def test_rename_and_merge_from_archives(archives, tree, tmp_path, kind):
    a = archives[kind]
    for src, out in ((f"{a}#sharded", "in"), (tree / "sharded", "out")):
        cli(
            "rename",
            src,
            f"{tmp_path / 'rename' / out}/",
            "--map",
            "dev0/w=renamed/w",
            "--no-fsync",
        )
    same_files(tmp_path / "rename" / "in", tmp_path / "rename" / "out")
    inside = [f"{a}#{MEMBERS['sharded']}", f"{a}#{MEMBERS['v1']}"]
    outside = [tree / MEMBERS["sharded"], tree / MEMBERS["v1"]]
    for srcs, out in ((inside, "in"), (outside, "out")):
        cli("merge", *srcs, "-o", tmp_path / "merge" / out / "m", "--no-fsync")
    same_files(tmp_path / "merge" / "in", tmp_path / "merge" / "out")


@pytest.mark.parametrize("kind", STREAM_KINDS)
def test_bzip2_and_xz_tars(archives, tree, tmp_path, kind):
    """No restart points there: reads out of archive order decompress again from the
    start, and give the same bytes."""
    archive = archives[kind]
    for member in ("sharded", "managed", "v1"):
        inside, outside = f"{archive}#{MEMBERS[member]}", str(tree / MEMBERS[member])
        dumped = cli("dump", "--json", inside).replace(f"{archive}#", f"{tree}/")
        assert dumped == cli("dump", "--json", outside)
        cli("convert", inside, f"{tmp_path / member / 'in'}/", "--dtype", "bfloat16", "--no-fsync")
        cli(
            "convert", outside, f"{tmp_path / member / 'out'}/", "--dtype", "bfloat16", "--no-fsync"
        )
        same_files(tmp_path / member / "in", tmp_path / member / "out")


# ================================================================ naming an archive


def test_bare_archive_with_several_checkpoints_lists_them(archives, tree):
    for kind in ("tar.gz", "zip-stored"):
        archive = archives[kind]
        assert_cli_error(
            in_process("dump", archive),
            f"{archive}: the archive holds 3 checkpoints: sharded/sharded.ckpt, "
            "train/ckpt-2, v1/model.ckpt; name one as ARCHIVE#sharded/sharded.ckpt",
        )
        listed = json.loads(cli("dump", "--all", "--json", archive))
        rows = [
            (r["name"], r["latest"], r["in_state_file"], r["state_file"])
            for r in listed["checkpoints"]
        ]
        assert rows == [
            ("sharded/sharded.ckpt", False, False, False),
            ("train/ckpt-1", False, True, True),
            ("train/ckpt-2", True, True, True),
        ]
        assert listed["latest"] == f"{archive}#train/ckpt-2"
        assert tfckpt.list_checkpoints(str(archive)) == listed
        text = cli("dump", "--all", archive)
        assert "train/ckpt-2" in text and "not in the state file" not in text
        # A directory in it lists as a directory would.
        inner = json.loads(cli("dump", "--all", "--json", f"{archive}#train"))
        here = json.loads(cli("dump", "--all", "--json", tree / "train"))
        assert [r["name"] for r in inner["checkpoints"]] == [r["name"] for r in here["checkpoints"]]


@pytest.fixture(scope="module")
def bert_zip(tmp_path_factory):
    """google-research/bert's release layout: one directory with the checkpoint (and the
    Adam slots a training run leaves), its config and vocabulary."""
    root = tmp_path_factory.mktemp("bert")
    d = root / "src" / "uncased_L-2_H-16_A-4"
    d.mkdir(parents=True)
    weights = bert_release.weights("pretraining")
    names = sorted(weights)
    tf.raw_ops.SaveV2(
        prefix=str(d / "bert_model.ckpt"),
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[weights[n] for n in names],
    )
    (d / "bert_config.json").write_text(json.dumps(bert_release.CONFIG))
    (d / "vocab.txt").write_text("\n".join(f"w{i}" for i in range(50)))
    return pack(root / "src", root / "bert.zip", "zip-deflated"), d


def test_bare_zip_of_one_checkpoint_exports_with_a_preset(bert_zip, tmp_path):
    archive, extracted = bert_zip
    out = cli("dump", archive)
    assert f"prefix      {archive}#uncased_L-2_H-16_A-4/bert_model.ckpt" in out
    cli("export", archive, tmp_path / "in", "--preset", "hf-bert")
    cli("export", extracted / "bert_model.ckpt", tmp_path / "out", "--preset", "hf-bert")
    same_files(tmp_path / "in", tmp_path / "out")
    assert (tmp_path / "in" / "config.json").exists()  # bert_config.json from the archive
    member = f"{archive}#uncased_L-2_H-16_A-4/bert_model.ckpt"
    cli("export", member, tmp_path / "m", "--preset", "hf-bert")
    same_files(tmp_path / "m", tmp_path / "out")


def test_model_zoo_v1_tarball_opens_bare(tree, tmp_path):
    """vgg_16_2016_08_28.tar.gz holds vgg_16.ckpt, a V1 file, and nothing else."""
    src = tmp_path / "zoo"
    src.mkdir()
    shutil.copy(tree / "v1" / "model.ckpt", src / "vgg_16.ckpt")
    archive = pack(src, tmp_path / "vgg_16_2016_08_28.tar.gz", "tar.gz")
    assert "format      V1 (tensor slices)" in cli("dump", archive)
    cli("convert", archive, f"{tmp_path}/in/", "--no-fsync")
    cli("convert", src / "vgg_16.ckpt", f"{tmp_path}/out/", "--no-fsync")
    same_files(tmp_path / "in", tmp_path / "out")
    # Named for what it is by its content, whatever its file name.
    download = tmp_path / "download"
    shutil.copy(archive, download)
    assert "format      V1 (tensor slices)" in cli("dump", download)
    assert [r["name"] for r in tfckpt.list_checkpoints(str(download))["checkpoints"]] == []


@pytest.fixture(scope="module")
def keras_h5_dir(tmp_path_factory):
    """A directory as a tf.keras user leaves it: the model's weights (``save_weights``),
    its config beside them, no TensorFlow checkpoint."""
    tf_keras = pytest.importorskip("tf_keras")
    d = tmp_path_factory.mktemp("keras") / "model"
    d.mkdir()
    layers = tf_keras.layers
    model = tf_keras.Sequential([layers.Input((4,)), layers.Dense(3, name="dense")])
    model.save_weights(str(d / "model.h5"))
    (d / "config.json").write_text(model.to_json())
    return d


def _same_outputs(a, b, tmp_path: Path) -> None:
    """convert of ``a`` and ``b`` writes the same bytes, export the same tensors."""
    from safetensors import safe_open

    for src, out in ((a, "a"), (b, "b")):
        cli("convert", src, f"{tmp_path / 'convert' / out}/", "--no-fsync")
        cli("export", src, tmp_path / "export" / f"{out}.safetensors")
    same_files(tmp_path / "convert" / "a", tmp_path / "convert" / "b")
    files = [str(tmp_path / "export" / f"{out}.safetensors") for out in "ab"]
    with safe_open(files[0], "np") as x, safe_open(files[1], "np") as y:
        assert x.keys() == y.keys()
        assert all(x.get_tensor(k).tobytes() == y.get_tensor(k).tobytes() for k in x.keys())


@pytest.mark.parametrize("kind", ["directory", *FULL_KINDS])
def test_one_keras_h5_opens_by_itself(keras_h5_dir, tmp_path, kind):
    """An archive, or a directory, holding one Keras .h5 and no TensorFlow checkpoint is
    that file, for every command that reads it (as a source and as check's target)."""
    file = keras_h5_dir / "model.h5"
    if kind == "directory":
        where, inside = keras_h5_dir, str(file)
    else:
        where = pack(keras_h5_dir, tmp_path / name_for(kind), kind)
        inside = f"{where}#model.h5"
    as_file = lambda text: text.replace(inside, str(file))  # noqa: E731
    assert as_file(cli("dump", "--json", where)) == cli("dump", "--json", file)
    assert as_file(cli("stats", "--json", where)) == cli("stats", "--json", file)
    assert f"ok: {inside}: 2 tensors" in cli("verify", where)
    cli("diff", where, file)
    for args in ((where, "--against", file), (file, "--against", where)):
        data = json.loads(cli("check", *args, "--json"))
        assert data["ok"] is True, data
    assert "Keras HDF5: the model that wrote it" in data["target"]
    with tfckpt.open(where) as ckpt, tfckpt.open(file) as there:
        assert ckpt.keras_layers == there.keras_layers and ckpt.keys() == there.keys()
        assert all(ckpt[k].tobytes() == there[k].tobytes() for k in ckpt.keys())
    _same_outputs(where, file, tmp_path)


def test_several_keras_files_are_listed_and_tf_checkpoints_come_first(
    keras_h5_dir, tf_checkpoints, tmp_path
):
    two = tmp_path / "two"
    shutil.copytree(keras_h5_dir, two)
    shutil.copy(two / "model.h5", two / "other.h5")
    assert_cli_error(
        in_process("dump", two), "the directory holds 2 Keras HDF5 files: model.h5, other.h5"
    )
    archive = pack(two, tmp_path / "two.tar.gz", "tar.gz")
    assert_cli_error(in_process("dump", archive), "the archive holds 2 checkpoints: model.h5")
    # Beside a TensorFlow checkpoint, a .h5 changes nothing: the checkpoint opens.
    both = tmp_path / "both"
    shutil.copytree(keras_h5_dir, both)
    prefix = Path(tf_checkpoints("tf1_sharded").prefix)
    for f in prefix.parent.glob(prefix.name + ".*"):
        shutil.copy(f, both / f.name)
    for where in (both, pack(both, tmp_path / "both.zip", "zip-stored")):
        with tfckpt.open(where) as ckpt:
            assert ckpt.format == "bundle v2" and ckpt.prefix.endswith(prefix.name), where


def test_archive_without_checkpoints_says_what_it_holds(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "README.md").write_text("weights elsewhere")
    archive = pack(src, tmp_path / "docs.tar.gz", "tar.gz")
    assert_cli_error(
        in_process("dump", archive), "no checkpoint in the tar.gz archive (it holds README.md)"
    )
    assert_cli_error(in_process("dump", f"{archive}#model.ckpt"), "no checkpoint found")
    assert_cli_error(in_process("dump", f"{archive}#../x"), "climbs out of the archive")
    assert_cli_error(in_process("dump", tmp_path / "absent.tar.gz#m"), "no such archive")


def test_links_inside_the_archive_are_followed(tree, tmp_path):
    """A symbolic link to a directory (``latest -> train``) and a hard link to a data
    file, as tar keeps them, lead to the members they name."""
    archive = tmp_path / "links.tar"
    with tarfile.open(archive, "w") as t:
        t.add(tree / "train", "train")
        link = tarfile.TarInfo("latest")
        link.type, link.linkname = tarfile.SYMTYPE, "train"
        t.addfile(link)
        for f in sorted((tree / "sharded").iterdir()):
            t.add(f, f"sharded/{f.name}")
        data = "sharded/sharded.ckpt.data-00000-of-00002"
        hard = tarfile.TarInfo("copy/sharded.ckpt.data-00000-of-00002")
        hard.type, hard.linkname = tarfile.LNKTYPE, data
        t.addfile(hard)
        for f in ("sharded.ckpt.index", "sharded.ckpt.data-00001-of-00002"):
            t.add(tree / "sharded" / f, f"copy/{f}")
    with tfckpt.open(f"{archive}#latest") as ckpt:
        assert ckpt.prefix == f"{archive}#latest/ckpt-2"
    cli("convert", f"{archive}#copy/sharded.ckpt", f"{tmp_path}/in/", "--no-fsync")
    cli("convert", tree / "sharded" / "sharded.ckpt", f"{tmp_path}/out/", "--no-fsync")
    same_files(tmp_path / "in", tmp_path / "out")


def test_state_file_with_absolute_paths_finds_the_files_beside_it(tf_checkpoints, tmp_path):
    """A TF1 Saver's state file names absolute paths of the machine that trained: inside
    an archive they never lead out of it; the same names beside the state file do."""
    case = tf_checkpoints("tf1_state_absolute")
    archive = pack(Path(case.path), tmp_path / "run.zip", "zip-deflated")
    with pytest.warns(tfckpt.CheckpointPathWarning, match="beside it"):
        ckpt = tfckpt.open(f"{archive}")
    with ckpt:
        assert ckpt.prefix == f"{archive}#{Path(case.prefix).name}"
        assert ckpt["v"].tolist() == tf.train.load_checkpoint(case.prefix).get_tensor("v").tolist()


def test_archive_in_an_archive(archives, tmp_path):
    inner = archives["tar.gz"]
    outer = tmp_path / "outer.zip"
    with zipfile.ZipFile(outer, "w") as z:
        z.write(inner, "nested/a.tar.gz")
    member = f"{outer}#nested/a.tar.gz#{MEMBERS['sharded']}"
    assert cli("dump", member) == cli("dump", f"{inner}#{MEMBERS['sharded']}").replace(
        f"{inner}#", f"{outer}#nested/a.tar.gz#"
    )


def test_storage_pickles_and_is_shared(archives):
    archive = str(archives["tar.gz"])
    store = storage_for(f"{archive}#train", None)
    assert isinstance(store, ArchiveStorage)
    assert storage_for(archive, None) is store  # one index per archive while in use
    again = pickle.loads(pickle.dumps(store))
    assert again == store and again.isfile(f"{archive}#train/checkpoint")


def test_tasks_in_other_processes_read_the_archive(archives, tree, tmp_path):
    """A task pickles its archive's storage to the archive's path, indexed again there."""
    for kind in ("tar.gz", "zip-deflated"):
        inside = f"{archives[kind]}#{MEMBERS['sharded']}"
        out = tmp_path / kind
        cli("convert", inside, f"{out}/pool/", "--dtype", "float16", "--executor", "processes:2")
        cli("convert", tree / MEMBERS["sharded"], f"{out}/here/", "--dtype", "float16")
        same_files(out / "pool", out / "here")


# ================================================================ never written


def test_destinations_inside_archives_are_refused(archives, tree, tmp_path):
    archive = archives["tar"]
    before = archive.read_bytes()
    st = tmp_path / "w.safetensors"
    cli("export", tree / "sharded" / "sharded.ckpt", st)
    for args in (
        ["convert", tree / "sharded", f"{archive}#out", "--dtype", "float16"],
        ["convert", tree / "sharded", archive],
        ["merge", tree / "sharded", "-o", f"{archive}#m"],
        ["export", tree / "sharded", f"{archive}#w.safetensors"],
        ["import", st, f"{archive}#imported"],
    ):
        assert_cli_error(in_process(*args), "cannot write inside an archive")
    assert archive.read_bytes() == before
    assert sorted(p.name for p in archive.parent.iterdir()) == sorted(
        name_for(k) for k in FULL_KINDS + STREAM_KINDS
    )


# ================================================================ hostile archives


def _tar(path: Path, entries: list[tuple], mode: str = "w") -> Path:
    """Entries (name, type, data or link target), written as given."""
    with tarfile.open(path, mode, format=tarfile.GNU_FORMAT) as t:
        for name, kind, payload in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.REGTYPE:
                info.size = len(payload)
                t.addfile(info, io.BytesIO(payload))
            else:
                info.linkname = payload
                t.addfile(info)
    return path


def _zip(path: Path, names: list[str], data: bytes = b"x") -> Path:
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as z:
        warnings.simplefilter("ignore")  # zipfile's own about a duplicate name
        for n in names:
            z.writestr(zipfile.ZipInfo(n), data)
    return path


def _patched_zip(path: Path, size: int) -> Path:
    """A deflated member whose central directory declares ``size`` bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("model.ckpt.index", b"\0" * (1 << 20))
    raw = bytearray(path.read_bytes())
    at = raw.rfind(b"PK\x01\x02")
    raw[at + 24 : at + 28] = size.to_bytes(4, "little")
    path.write_bytes(raw)
    return path


def _huge_pax(d: Path) -> Path:
    header = tarfile.TarInfo("././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, 1 << 40
    (d / "a.tar").write_bytes(header.tobuf(format=tarfile.GNU_FORMAT) + bytes(1024))
    return d / "a.tar"


REG, SYM, LNK = tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
HOSTILE = {
    "climbing name": (
        lambda p: _tar(p / "a.tar", [("ok", REG, b""), ("../../evil", REG, b"x")]),
        "climbs out of the archive",
    ),
    "absolute name": (
        lambda p: _tar(p / "a.tar", [("/etc/evil", REG, b"x")]),
        "has an absolute name",
    ),
    "symlink to an absolute path": (
        lambda p: _tar(p / "a.tar.gz", [("m.ckpt.index", SYM, "/etc/passwd")], "w:gz"),
        "outside the archive",
    ),
    "symlink climbing out": (
        lambda p: _tar(p / "a.tar", [("d/m.ckpt.index", SYM, "../../x")]),
        "outside the archive",
    ),
    "hard link climbing out": (
        lambda p: _tar(p / "a.tar", [("m.ckpt.index", LNK, "../outside")]),
        "outside the archive",
    ),
    "duplicate tar members": (
        lambda p: _tar(p / "a.tar", [("a", REG, b"1"), ("./a", REG, b"2")]),
        "appears twice",
    ),
    "file over a directory": (
        lambda p: _tar(p / "a.tar", [("d/x", REG, b"1"), ("d", REG, b"2")]),
        "other members lie under it",
    ),
    "duplicate zip entries": (lambda p: _zip(p / "a.zip", ["a", "a"]), "appears twice"),
    "zip backslashes": (lambda p: _zip(p / "a.zip", ["dir\\m.ckpt.index"]), "backslashes"),
    "zip drive letter": (lambda p: _zip(p / "a.zip", ["C:/m.ckpt.index"]), "absolute name"),
    "zip declares more than deflate can make": (
        lambda p: _patched_zip(p / "a.zip", 0xFFFFFFF0),
        "more than deflate can expand to",
    ),
    "zip declares less than it holds": (lambda p: _patched_zip(p / "a.zip", 1000), "deflate data"),
    "tar header of 1 TiB": (_huge_pax, "tfckpt reads at most 1 MiB of it"),
    "tar member past the end": (
        lambda p: (
            p.joinpath("a.tar").write_bytes(
                _tar(p / "t.tar", [("m", REG, b"x" * 600)]).read_bytes()[:1024]
            )
            and p / "a.tar"
        ),
        "past the archive's end",
    ),
    "truncated tar.gz": (
        lambda p: (
            p.joinpath("a.tar.gz").write_bytes(
                gzip.compress(_tar(p / "t.tar", [("m", REG, os.urandom(20000))]).read_bytes())[
                    :9000
                ]
            )
            and p / "a.tar.gz"
        ),
        "truncated",
    ),
    "gzip of no tar": (
        lambda p: (
            p.joinpath("a.tar.gz").write_bytes(gzip.compress(b"not a tar" * 100)) and p / "a.tar.gz"
        ),
        "not a readable tar archive",
    ),
    "not an archive": (
        lambda p: p.joinpath("a.zip").write_bytes(b"plain text") and p / "a.zip",
        "not a tar or zip archive",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_archives_are_one_line_and_write_nothing(tmp_path, case):
    build, fragment = HOSTILE[case]
    made = tmp_path / "made"
    made.mkdir()
    archive = build(made)
    out = tmp_path / "out"
    for args in (["dump", archive], ["convert", archive, f"{out}/"]):
        assert_cli_error(in_process(*args), fragment)
    rc, listed, err = in_process("dump", "--all", "--json", archive)
    if case == "zip declares less than it holds":  # the archive reads; that member does not
        assert rc == 0 and fragment in json.loads(listed)["checkpoints"][0]["error"]
    else:
        assert_cli_error((rc, listed, err), fragment)
    with pytest.raises(tfckpt.CheckpointError, match=re.escape(fragment)):
        tfckpt.open(archive)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["made"]


# The child reports its own high-water mark: ru_maxrss from wait4 would not do, since a
# child started with vfork inherits the high-water mark of this (large) process.
_MEASURED = """
import sys
from tfckpt.cli import main
try:
    rc = main(sys.argv[2:])
finally:
    with open("/proc/self/status") as status:
        peak = next(line for line in status if line.startswith("VmHWM:")).split()[1]
    with open(sys.argv[1], "w") as out:
        out.write(peak)
sys.exit(rc)
"""


def _peak_rss(*args) -> tuple[int, str]:
    """Peak RSS (bytes) of the command line ``tfckpt ARGS`` run as its own process, and its
    stderr."""
    report = Path(os.environ.get("TMPDIR", "/tmp")) / f"peak-{uuid.uuid4().hex}"
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURED, str(report), *map(str, args)],
        capture_output=True,
        text=True,
        env=user_env(),
        timeout=120,
    )
    try:
        return int(report.read_text()) * 1024, proc.stderr
    finally:
        report.unlink()


def _zeros_gzip(path: Path, name: str, size: int) -> Path:
    """A tar.gz of one member of ``size`` zero bytes (a few hundred KiB of gzip), built from
    one compressed MiB repeated: deflate restarts at each full flush."""
    mib = 1 << 20
    header = tarfile.TarInfo(name)
    header.size = size
    tar_head = header.tobuf(format=tarfile.GNU_FORMAT)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = c.compress(tar_head) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(bytes(mib)) + c.flush(zlib.Z_FULL_FLUSH)
    assert size % mib == 0
    crc = zlib.crc32(tar_head)
    zero = bytes(mib)
    for _ in range(size // mib):
        crc = zlib.crc32(zero, crc)
    tail = bytes(1024 + (-(len(tar_head) + size + 1024)) % 10240)
    crc = zlib.crc32(tail, crc)
    end = c.compress(tail) + c.flush()
    total = len(tar_head) + size + len(tail)
    with open(path, "wb") as f:
        f.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + first)
        for _ in range(size // mib):
            f.write(block)
        f.write(end + crc.to_bytes(4, "little") + (total & 0xFFFFFFFF).to_bytes(4, "little"))
    return path


def test_bombs_stay_within_the_chunk_budget(tmp_path):
    """512 MiB of zeros in a tar.gz of half a MiB, and a 256 MiB index in a zip of 256 KiB:
    a clean error each, the process's peak RSS within 32 MiB of a tiny archive's."""
    bomb = _zeros_gzip(tmp_path / "bomb.tar.gz", "zeros", 512 << 20)
    assert bomb.stat().st_size < 1 << 20
    with tarfile.open(bomb) as t:  # a valid archive, as tar reads it
        assert t.getmember("zeros").size == 512 << 20
    index_bomb = tmp_path / "index.zip"
    with zipfile.ZipFile(index_bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("model.ckpt.index", bytes(256 << 20))
    tiny = _tar(tmp_path / "tiny.tar.gz", [("zeros", REG, b"")], "w:gz")
    base, err = _peak_rss("dump", tiny)
    assert "no checkpoint in the tar.gz archive" in err
    for archive, says in ((bomb, "it holds zeros"), (index_bomb, "at most 64 MiB")):
        rss, err = _peak_rss("dump", archive)
        assert says in err and len(err.strip().splitlines()) == 1, err
        assert rss - base < 32 << 20, (archive, rss, base)


def test_checkpoint_bigger_than_the_budget_converts_within_it(tmp_path):
    """A 96 MiB tensor in a .tar.gz, converted with a 4 MiB chunk budget: the process
    stays within 32 MiB of converting a tiny checkpoint the same way (the tensor alone
    would not fit), and writes what converting the extracted files writes."""
    rng = np.random.default_rng(7)
    big = (rng.standard_normal(24 << 20, dtype=np.float32) * 4).reshape(-1, 1024)
    for name, tensors in (
        ("big", {"big/kernel": big, "small": np.arange(9.0)}),
        ("tiny", {"big/kernel": big[:2], "small": np.arange(9.0)}),
    ):
        d = tmp_path / name / "src"
        d.mkdir(parents=True)
        names = sorted(tensors)
        tf.raw_ops.SaveV2(
            prefix=str(d / "model"),
            tensor_names=names,
            shape_and_slices=[""] * 2,
            tensors=[tensors[n] for n in names],
        )
        with tarfile.open(tmp_path / name / "m.tar.gz", "w:gz", compresslevel=1) as t:
            for f in sorted(d.iterdir()):
                t.add(f, f.name)
    flags = ["--dtype", "float16", "--chunk-bytes", "4M", "--no-fsync"]
    base, err = _peak_rss(
        "convert", tmp_path / "tiny" / "m.tar.gz", f"{tmp_path}/tiny/out/", *flags
    )
    assert err.startswith("wrote"), err
    rss, err = _peak_rss("convert", tmp_path / "big" / "m.tar.gz", f"{tmp_path}/big/out/", *flags)
    assert err.startswith("wrote"), err
    assert rss - base < 32 << 20, (rss, base)
    cli("convert", tmp_path / "big" / "src" / "model", f"{tmp_path}/big/extracted/", *flags)
    same_files(tmp_path / "big" / "out", tmp_path / "big" / "extracted")


# ================================================================ object storage


def test_archive_on_s3(s3_server, archives, tree, tmp_path):
    """An archive on an S3-compatible server on loopback: read through range requests of
    the object, no download; the same outputs as the extracted files."""
    fs = s3_server.s3fs.S3FileSystem()
    base = f"{BUCKET}/{uuid.uuid4().hex[:12]}"
    for kind in ("tar.gz", "zip-stored"):
        fs.put_file(str(archives[kind]), f"{base}/{name_for(kind)}")
        url = f"s3://{base}/{name_for(kind)}"
        inside = f"{url}#{MEMBERS['sharded']}"
        dumped = cli("dump", "--json", inside).replace(f"{url}#", f"{tree}/")
        assert dumped == cli("dump", "--json", tree / MEMBERS["sharded"])
        cli("convert", inside, f"{tmp_path / kind}/in/", "--dtype", "float16", "--no-fsync")
        cli(
            "convert",
            tree / MEMBERS["sharded"],
            f"{tmp_path / kind}/out/",
            "--dtype",
            "float16",
            "--no-fsync",
        )
        same_files(tmp_path / kind / "in", tmp_path / kind / "out")
        with tfckpt.open(f"{url}#train") as ckpt:
            assert ckpt.prefix == f"{url}#train/ckpt-2"
        assert_cli_error(
            in_process("convert", inside, f"{url}#copy"), "cannot write inside an archive"
        )


# ================================================================ the streams themselves


class _Bytes:
    def __init__(self, data: bytes):
        self.data, self.size, self.path, self.reads = data, len(data), "mem", 0

    def readinto(self, buf, offset):
        chunk = self.data[offset : offset + len(buf)]
        buf[: len(chunk)] = chunk
        self.reads += 1
        return len(chunk)

    def close(self):
        pass


def _deflate(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


@pytest.mark.parametrize(
    "codec", [compressed.GZIP, compressed.DEFLATE, compressed.BZIP2, compressed.XZ]
)
def test_stream_reads_at_any_offset(monkeypatch, codec):
    """Random reads against the data, restart points every 64 KiB (thinned past 8), and
    concatenated streams (pigz, pbzip2) and zero padding where the format allows."""
    import bz2
    import lzma

    monkeypatch.setattr(compressed, "FIRST_SPAN", 64 << 10)
    monkeypatch.setattr(compressed, "MAX_POINTS", 8)
    rng = np.random.default_rng(3)
    data = rng.integers(0, 12, 3 << 20, dtype=np.uint8).tobytes()
    half = len(data) // 2
    packed = {
        compressed.GZIP: lambda: (
            gzip.compress(data[:half]) + gzip.compress(data[half:]) + bytes(64)
        ),
        compressed.DEFLATE: lambda: _deflate(data),
        compressed.BZIP2: lambda: bz2.compress(data[:half]) + bz2.compress(data[half:]),
        compressed.XZ: lambda: lzma.compress(data[:half]) + lzma.compress(data[half:]),
    }[codec]()
    kw = {"size": len(data), "crc": zlib.crc32(data)} if codec == compressed.DEFLATE else {}
    stream = compressed.Stream(lambda: _Bytes(packed), 0, len(packed), codec, "mem", **kw)
    cursor = stream.cursor()
    assert cursor.drain() == len(data)
    for _ in range(25):
        at = int(rng.integers(0, len(data)))
        n = int(rng.integers(1, 200_000))
        buf = bytearray(n)
        got = cursor.readinto(memoryview(buf), at)
        assert bytes(buf[:got]) == data[at : at + n]
    if stream.copyable:
        assert 4 <= len(stream._points) <= 8 and stream.span > 64 << 10


@pytest.mark.parametrize(
    "damage, says",
    [
        (lambda p: p[:-300], "truncated"),
        (lambda p: p + b"junk", "garbage after the end"),
        (lambda p: p[:100] + bytes([p[100] ^ 0xFF]) + p[101:], "gzip data"),
    ],
)
def test_damaged_gzip_is_an_error(damage, says):
    data = np.random.default_rng(4).integers(0, 9, 1 << 20, dtype=np.uint8).tobytes()
    packed = damage(gzip.compress(data))
    stream = compressed.Stream(lambda: _Bytes(packed), 0, len(packed), compressed.GZIP, "x.tar.gz")
    with pytest.raises(tfckpt.CheckpointError, match=says):
        stream.cursor().drain()
