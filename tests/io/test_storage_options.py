"""Storage options: endpoint and credentials given as ``storage_options=`` (library) or
``--storage-option KEY=VALUE`` (command line), and nowhere else.

A moto S3 server runs on 127.0.0.1. Unlike the other S3 tests, nothing points the
client at it from the environment: no ``AWS_*`` credentials or endpoint, no fsspec
configuration, shared config files replaced by ``/dev/null`` and instance-metadata
lookups off (so a client without options fails at once, and nothing leaves this
machine). Checkpoints are written by TensorFlow during the run; tasks run in other
processes (a spawned pool, ``--executor processes:1``) to show the options travel with
them. A lazy slice of a remote tensor is counted in the bytes S3 sent (botocore's own
``after-call`` event of the real client).
"""

from __future__ import annotations

import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
fsspec = pytest.importorskip("fsspec")
s3fs = pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

import cli_helpers as ch  # noqa: E402

import tfckpt  # noqa: E402
from tfckpt import cli  # noqa: E402
from tfckpt.inspection import verify  # noqa: E402

BUCKET = "tfckpt-options"


@pytest.fixture(scope="module")
def s3():
    """The server, and the options that reach it: ``.opts``, ``.url``, ``.fs``."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
    mp = pytest.MonkeyPatch()
    for k in list(os.environ):
        if k.startswith(("AWS_", "FSSPEC_")):
            mp.delenv(k)
    for k, v in {
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "TFCKPT_REMOTE_RETRIES": "0",
    }.items():
        mp.setenv(k, v)
    mp.delitem(fsspec.config.conf, "s3", raising=False)
    s3fs.S3FileSystem.clear_instance_cache()
    opts = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    fs = fsspec.filesystem("s3", **opts)
    try:
        fs.mkdir(BUCKET)
    except FileExistsError:
        pass
    try:
        yield type(
            "S3", (), {"opts": opts, "url": f"s3://{BUCKET}", "fs": fs, "endpoint": endpoint}
        )
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        mp.undo()
        server.stop()


def upload(s3, local_dir: Path, name: str) -> str:
    """The checkpoint files of ``local_dir`` (not the state file: it names local paths)."""
    for p in sorted(Path(local_dir).iterdir()):
        if p.name != "checkpoint":
            s3.fs.put_file(str(p), f"{BUCKET}/{name}/{p.name}")
    return f"{s3.url}/{name}"


def same_checkpoint(got: tfckpt.Checkpoint, want: tfckpt.Checkpoint) -> None:
    assert got.keys() == want.keys()
    for n in want.keys():
        a, b = got[n], want[n]
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes() if a.dtype != object else a.tolist() == b.tolist(), n


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.name != "checkpoint"}


def remote_files(s3, url: str) -> dict[str, bytes]:
    s3.fs.invalidate_cache()
    key = url[len("s3://") :]
    found = {p.rsplit("/", 1)[1]: p for p in s3.fs.find(key)}
    return {n: s3.fs.cat_file(p) for n, p in found.items() if n != "checkpoint"}


def test_open_with_storage_options_only(s3, tf_checkpoints):
    case = tf_checkpoints("tf1_sharded")
    url = upload(s3, Path(case.prefix).parent, "sharded")
    with pytest.raises(tfckpt.CheckpointError, match="NoCredentialsError"):
        tfckpt.open(url)
    with (
        tfckpt.open(url, storage_options=s3.opts) as got,
        tfckpt.open(case.prefix) as want,
    ):
        assert got.prefix == f"{url}/sharded.ckpt"
        same_checkpoint(got, want)
    report = verify(url, storage_options=s3.opts)
    assert report["problems"] == [] and report["tensors"] == 4

    with tfckpt.open(case.prefix) as want:
        variables = {n: tf.Variable(np.zeros_like(want[n])) for n in want.keys()}
        with pytest.raises(tfckpt.CheckpointError, match="NoCredentialsError"):
            tfckpt.restore(variables, url)
        tfckpt.restore(variables, url, storage_options=s3.opts)
        for n, v in variables.items():
            np.testing.assert_array_equal(v.numpy(), want[n])


def test_write_and_transform_with_storage_options(s3, tf_checkpoints, tmp_path):
    """save, convert (tasks in spawned processes), export and import, to and from S3."""
    case = tf_checkpoints("tf1_sharded")
    values = {n: v for n, v in tfckpt.open(case.prefix).items()}
    tfckpt.save(values, f"{s3.url}/saved/m", storage_options=s3.opts)
    tfckpt.save(values, tmp_path / "saved" / "m")
    assert remote_files(s3, f"{s3.url}/saved") == files(tmp_path / "saved")

    tfckpt.convert(tmp_path / "saved" / "m", tmp_path / "fp16" / "m", "float16")
    with pytest.raises(tfckpt.CheckpointError, match="NoCredentialsError"):
        tfckpt.convert(case.prefix, f"{s3.url}/fail/m", "float16")
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        tfckpt.convert(
            f"{s3.url}/saved/m",
            f"{s3.url}/fp16/m",
            "float16",
            executor=pool,
            storage_options=s3.opts,
        )
    assert remote_files(s3, f"{s3.url}/fp16") == files(tmp_path / "fp16")
    with tfckpt.open(f"{s3.url}/saved/m", storage_options=s3.opts) as src:
        tfckpt.convert(src, tmp_path / "again" / "m", "float16")  # the source's options
    assert files(tmp_path / "again") == files(tmp_path / "fp16")
    assert tfckpt.latest_checkpoint(f"{s3.url}/fp16") is None  # fsspec: False on any error
    assert tfckpt.latest_checkpoint(f"{s3.url}/fp16", storage_options=s3.opts) == f"{s3.url}/fp16/m"

    sm = tfckpt.export(f"{s3.url}/fp16/m", f"{s3.url}/st/m.safetensors", storage_options=s3.opts)
    assert len(sm.tensors) == 4
    tfckpt.import_(f"{s3.url}/st/m.safetensors", tmp_path / "back" / "m", storage_options=s3.opts)
    with tfckpt.open(tmp_path / "back" / "m") as got, tfckpt.open(tmp_path / "fp16" / "m") as want:
        same_checkpoint(got, want)


def test_cli_storage_option(s3, tf_checkpoints, tmp_path):
    case = tf_checkpoints("tf1_sharded")
    url = upload(s3, Path(case.prefix).parent, "cli")
    given = [
        "--storage-option",
        f"endpoint_url={s3.endpoint}",
        "--storage-option",
        "key=testing",
        "--storage-option",
        "secret=testing",
        "--storage-option",
        "config_kwargs.connect_timeout=5",
    ]
    rc, out, err = ch.in_process("dump", url, "--json", *given)
    assert rc == 0, err
    assert json.loads(out)["tensor_count"] == 4
    ch.assert_cli_error(ch.in_process("dump", url), "NoCredentialsError")

    # Another process, whose tasks run in processes of their own.
    proc = ch.run_text(
        "convert", url, f"{s3.url}/cli-out/m", "--dtype", "float16",
        "--executor", "processes:1", *given,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    tfckpt.convert(case.prefix, tmp_path / "m", "float16")
    assert remote_files(s3, f"{s3.url}/cli-out") == files(tmp_path)


def test_storage_option_values():
    parse = cli.parse_storage_option
    pairs = [
        parse(t)
        for t in (
            "anon=true",
            "use_ssl=False",
            "endpoint_url=http://127.0.0.1:9000",
            "client_kwargs.region_name=eu-west-1",
            'config_kwargs={"connect_timeout": 5}',
            "config_kwargs.read_timeout=2.5",
            "default_block_size=1048576",
            "profile=prod",
            "requester_pays=null",
        )
    ]
    assert cli.nested_storage_options(pairs) == {
        "anon": True,
        "use_ssl": False,
        "endpoint_url": "http://127.0.0.1:9000",
        "client_kwargs": {"region_name": "eu-west-1"},
        "config_kwargs": {"connect_timeout": 5, "read_timeout": 2.5},
        "default_block_size": 1048576,
        "profile": "prod",
        "requester_pays": None,
    }
    ch.assert_cli_error(ch.in_process("dump", "x", "--storage-option", "no-value"), "KEY=VALUE")
    ch.assert_cli_error(
        ch.in_process("dump", "x", "--storage-option", "a=1", "--storage-option", "a.b=2"),
        "a is set to a value",
    )
    with pytest.raises(TypeError, match="storage_options"):
        tfckpt.open("s3://b/x", storage_options=["anon"])


def test_bad_storage_options_are_refused_naming_them(s3, tf_checkpoints, tmp_path):
    case = tf_checkpoints("tf1_sharded")
    url = upload(s3, Path(case.prefix).parent, "bad-options")
    given = [f"endpoint_url={s3.endpoint}", "key=testing", "secret=testing"]
    for option, fragments in [
        ("a=" + "[" * 100_000, ["--storage-option", "longer than"]),
        ("a=" + "[" * 900 + "]" * 900, ["--storage-option a", "nested more than"]),
        ("a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q=1", ["--storage-option a.b", "nested"]),
        ("loop=1", ["--storage-option loop", "not an option"]),
        ("asynchronous=true", ["--storage-option asynchronous", "not an option"]),
        ("default_block_size=-5", ["--storage-option default_block_size", "> 0, not -5"]),
        ("anon=5", ["--storage-option anon", "true or false"]),
        ("config_kwargs=3", ["--storage-option config_kwargs", "JSON object"]),
        ("client_kwargs.foo=1", ["--storage-option client_kwargs.foo", "'foo'"]),
        ("config_kwargs.retries=3", ["--storage-option", "config_kwargs.retries"]),
    ]:
        argv = [a for o in given for a in ("--storage-option", o)]
        line = ch.assert_cli_error(
            ch.in_process("dump", url, *argv, "--storage-option", option), *fragments
        )
        assert "corrupt" not in line, line
    assert list(tmp_path.iterdir()) == []
    for options, fragment in [
        ({"default_block_size": -5}, "storage option default_block_size"),
        ({"loop": 1}, "storage option loop"),
        ({"client_kwargs": {"foo": 1}}, "storage option client_kwargs.foo"),
    ]:
        with pytest.raises(tfckpt.CheckpointError, match=fragment):
            tfckpt.open(url, storage_options={**s3.opts, **options})


def test_remote_slice_fetches_only_its_bytes(s3, tf_checkpoints, tmp_path):
    big = np.random.default_rng(3).standard_normal((2048, 256)).astype(np.float32)
    tf.raw_ops.SaveV2(
        prefix=str(tmp_path / "big"),
        tensor_names=["emb"],
        shape_and_slices=[""],
        tensors=[tf.constant(big)],
    )
    url = upload(s3, tmp_path, "big")
    parted = tf_checkpoints("tf1_partitioned")
    parted_url = upload(s3, Path(parted.prefix).parent, "parted")
    want = tf.train.load_checkpoint(parted.prefix).get_tensor("emb/table")
    for path, name, key, nbytes, expect in [
        (f"{url}/big", "emb", np.s_[100:110], 10 * 256 * 4, big[100:110]),
        (f"{url}/big", "emb", np.s_[7, 8:24], 16 * 4, big[7, 8:24]),
        (f"{url}/big", "emb", np.s_[2000::-500, 0], 5 * 4, big[2000::-500, 0]),  # 5 requests
        (f"{parted_url}/partitioned.ckpt", "emb/table", np.s_[5], 4 * 4, want[5]),
    ]:
        with tfckpt.open(path, storage_options=s3.opts) as ckpt:
            fetched: list[int] = []

            def count(parsed=None, **_):
                fetched.append(parsed["ContentLength"])

            ckpt.storage.fs.s3.meta.events.register("after-call.s3.GetObject", count)
            try:
                got = ckpt.get_slice(name)[key]
            finally:
                ckpt.storage.fs.s3.meta.events.unregister("after-call.s3.GetObject", count)
        np.testing.assert_array_equal(got, expect)
        assert sum(fetched) == nbytes, (key, fetched)
        assert len(fetched) <= 5, (key, fetched)


def test_average_graft_flatten_and_listing_with_storage_options(s3, tf_checkpoints, tmp_path):
    """The commands that came with their own planners take the options too, and write
    what they write locally."""
    case = tf_checkpoints("keras_manager")
    local = Path(case.prefix)
    url = upload(s3, local.parent, "manager") + "/" + local.name
    with pytest.raises(tfckpt.CheckpointError, match="NoCredentialsError"):
        tfckpt.average([url, url], f"{s3.url}/avg/m")

    tfckpt.average([url, url], f"{s3.url}/avg/m", weights=[1, 3], storage_options=s3.opts)
    tfckpt.average([local, local], tmp_path / "avg" / "m", weights=[1, 3])
    assert remote_files(s3, f"{s3.url}/avg") == files(tmp_path / "avg")

    tfckpt.flatten(url, f"{s3.url}/flat/m", storage_options=s3.opts)
    tfckpt.flatten(local, tmp_path / "flat" / "m")
    assert remote_files(s3, f"{s3.url}/flat") == files(tmp_path / "flat")

    tfckpt.graft(url, [f"{s3.url}/flat/m"], f"{s3.url}/graft/m", storage_options=s3.opts)
    tfckpt.graft(local, [tmp_path / "flat" / "m"], tmp_path / "graft" / "m")
    assert remote_files(s3, f"{s3.url}/graft") == files(tmp_path / "graft")

    listed = tfckpt.list_checkpoints(f"{s3.url}/flat", storage_options=s3.opts)
    assert [c["name"] for c in listed["checkpoints"]] == ["m"]
    assert listed["checkpoints"][0]["bytes"] == sum(
        len(b) for b in files(tmp_path / "flat").values()
    )


# ------------------------------------------------ every command that writes, both ways

# The commands that only read (what they print is their output), and why.
READ_ONLY = {"dump", "diff", "verify", "check", "ls", "presets", "completion", "help"}
# Where a command's parser takes what it writes to (argparse's dest).
WRITTEN_TO = ("dst", "output", "out", "report", "html")


def _written_to() -> set[tuple[str, str]]:
    """(command, dest) of each place a command of the CLI parser writes to."""
    import argparse

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = set()
    for name, p in sub.choices.items():
        dests = {a.dest for a in p._actions}
        if getattr(p, "output_alias", None) is not None:
            dests.discard("output")  # -o/--output: another name of the positional's place
        found |= {(name, d) for d in WRITTEN_TO if d in dests}
        if "in_place" in dests:
            found.add((name, "in_place"))
        if name == "prune":  # rewrites the directory it is given
            found.add((name, "directory"))
        assert found & {(name, d) for d in (*WRITTEN_TO, "in_place", "directory")} or (
            name in READ_ONLY
        ), f"{name}: neither read-only nor writing anywhere the test knows"
    return found


# (command, dest) -> the command line, from {a}, {b} (checkpoints), {run} (a run's
# directory), {st} (a safetensors file) and {out} (where it writes).
COMMANDS = {
    ("convert", "dst"): "convert {a} {out}/m --dtype float16",
    ("convert", "report"): "convert {a} {out}/m --dtype float16 --report {out}/r.html",
    ("rename", "dst"): "rename {a} {out}/m --map v=z",
    ("select", "dst"): "select {a} {out}/m --include ^v/",
    ("merge", "output"): "merge {a} {b} -o {out}/m --prefer last",
    ("graft", "output"): "graft {a} {b} -o {out}/m",
    ("flatten", "dst"): "flatten {a} {out}/m",
    ("average", "output"): "average {a} {b} -o {out}/m",
    ("export", "out"): "export {a} {out}/m.safetensors",
    ("export", "npz"): "export {a} {out}/m.npz",
    ("import", "out"): "import {st} {out}/m",
    ("match", "output"): "match {a} {b} -o {out}/rules.toml",
    ("edit", "dst"): "edit {a} {out}/m --scale v=2",
    ("stats", "html"): "stats {a} --html {out}/stats.html",
    ("cp", "dst"): "cp {a} {out}/m",
    ("cp", "run"): "cp {run} {out}/run",
    ("mv", "dst"): "mv {a} {out}/m",
    ("mv", "run"): "mv {run} {out}/run",
}
# Those that write where they read: run on S3 alone.
IN_PLACE = {
    ("edit", "in_place"): "edit {a} --in-place --scale v=2",
    ("prune", "directory"): "prune {run} --keep-last 1 --min-age 0",
}


def test_every_writing_command_is_tested():
    tested = {(c, "out" if d == "npz" else "dst" if d == "run" else d) for c, d in COMMANDS}
    assert _written_to() == tested | set(IN_PLACE)


@pytest.fixture(scope="module")
def sources(s3, tmp_path_factory):
    """A CheckpointManager run of two tiny checkpoints and a safetensors file, written by
    TensorFlow and safetensors here and put on S3 as they are."""
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("sources")
    v = tf.Variable(np.arange(4, dtype=np.float32))
    w = tf.Variable(np.ones((2, 3), np.float32))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v, w=w), root / "run", None)
    for step in (1, 2):
        v.assign_add(np.full(4, step, np.float32))
        manager.save(checkpoint_number=step)
    save_file({"a": np.arange(3, dtype=np.float32)}, str(root / "t.safetensors"))
    for p in sorted((root / "run").iterdir()):
        s3.fs.put_file(str(p), f"{BUCKET}/sources/run/{p.name}")
    s3.fs.put_file(str(root / "t.safetensors"), f"{BUCKET}/sources/t.safetensors")
    return root


def _places(root, run: str) -> dict[str, str]:
    return {
        "a": f"{run}/ckpt-1",
        "b": f"{run}/ckpt-2",
        "run": run,
        "st": f"{root}/t.safetensors",
    }


def _local_source(sources, tmp_path) -> dict[str, str]:
    """Each case's own copy (mv moves it)."""
    import shutil

    shutil.copytree(sources / "run", tmp_path / "src" / "run")
    return _places(str(sources), str(tmp_path / "src" / "run"))


def _remote_source(s3, name: str) -> dict[str, str]:
    s3.fs.invalidate_cache()
    for key in s3.fs.find(f"{BUCKET}/sources/run"):
        s3.fs.copy(key, key.replace("/sources/run/", f"/{name}/run/"))
    return _places(f"{s3.url}/sources", f"{s3.url}/{name}/run")


def _given(s3) -> list[str]:
    return [a for k, v in s3.opts.items() for a in ("--storage-option", f"{k}={v}")]


def _written(files: dict[str, bytes]) -> dict[str, bytes]:
    """What two runs of a command must agree on: the bytes of tensor files, the names of
    the others (a state file, a page or a rules file name the paths they were made with),
    an npz's arrays (a zip streamed to S3 has data descriptors a local one has not)."""
    import io

    def arrays(b: bytes):
        with np.load(io.BytesIO(b)) as z:
            return {k: (z[k].dtype.str, z[k].shape, z[k].tobytes()) for k in z.files}

    tensors = (".index", ".safetensors", "-of-00001")
    return {
        n: arrays(b) if n.endswith(".npz") else b if n.endswith(tensors) else b""
        for n, b in files.items()
    }


@pytest.mark.parametrize("case", list(COMMANDS), ids="-".join)
def test_each_writing_command_local_to_s3_and_back(s3, sources, tmp_path, case):
    """The command run from local files to S3, then from S3 to local files, with the
    endpoint and credentials given only as --storage-option (nothing else points a client
    at the server, and a client without them fails). Both write the same tensor files."""
    line = COMMANDS[case]
    name = "-".join(case)
    s3.fs.invalidate_cache()
    out = f"{s3.url}/to-s3/{name}"
    argv = line.format(out=out, **_local_source(sources, tmp_path)).split()
    rc, stdout, err = ch.in_process(*argv, *_given(s3))
    assert rc == 0, err
    to_s3 = remote_files(s3, out)

    local = tmp_path / "from-s3"
    argv = line.format(out=local, **_remote_source(s3, f"src-{name}")).split()
    rc, stdout, err = ch.in_process(*argv, *_given(s3))
    assert rc == 0, err
    from_s3 = {
        str(p.relative_to(local)).rsplit("/", 1)[-1]: p.read_bytes()
        for p in sorted(local.rglob("*"))
        if p.is_file() and p.name != "checkpoint"
    }
    assert to_s3 and _written(to_s3) == _written(from_s3)
    if case[0] == "mv":  # the sources went
        s3.fs.invalidate_cache()
        assert not (tmp_path / "src" / "run" / "ckpt-1.index").exists()
        assert not s3.fs.exists(f"{BUCKET}/src-{name}/run/ckpt-1.index")


@pytest.mark.parametrize("case", list(IN_PLACE), ids="-".join)
def test_each_command_writing_in_place_on_s3(s3, sources, tmp_path, case):
    """edit --in-place and prune on S3, given the endpoint only as --storage-option: the
    same result as on a local copy."""
    import shutil

    name = "-".join(case)
    remote = _remote_source(s3, f"in-place-{name}")
    rc, stdout, err = ch.in_process(*IN_PLACE[case].format(**remote).split(), *_given(s3))
    assert rc == 0, err
    shutil.copytree(sources / "run", tmp_path / "run")
    local = _places(str(sources), str(tmp_path / "run"))
    assert ch.in_process(*IN_PLACE[case].format(**local).split())[0] == 0
    assert _written(remote_files(s3, remote["run"])) == _written(files(tmp_path / "run"))


def test_export_to_s3_without_the_options_fails_here(s3, sources, tmp_path):
    """The test above can fail: without --storage-option no client reaches the server
    (nor any other: no credentials), and the command says so in one line."""
    ch.assert_cli_error(
        ch.in_process("export", sources / "run" / "ckpt-1", f"{s3.url}/no/m.safetensors"),
        "NoCredentialsError",
    )
