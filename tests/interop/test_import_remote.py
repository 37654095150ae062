"""``tfckpt import`` and state files on object storage (moto S3 on loopback, behind the
fault proxy of ``s3_helpers.py``): names from a file's contents stay on the
storage and in the bucket of that file, and a fault mid-run is one error line that
leaves nothing behind.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
fsspec = pytest.importorskip("fsspec")
pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

import cli_helpers as ch  # noqa: E402
from s3_helpers import on, proxy, s3, s3_server  # noqa: E402,F401  (the proxy fixtures)

import tfckpt  # noqa: E402
from tfckpt.io import paths  # noqa: E402

OTHER_BUCKET = "tfckpt-other-bucket"


def shards(d, n: int = 3, size: int = 1 << 16) -> dict[str, dict[str, np.ndarray]]:
    """``n`` safetensors shards of ``size`` float32 elements each, written by the package."""
    d.mkdir(parents=True, exist_ok=True)
    out = {}
    for k in range(n):
        tensors = {f"layer{k}/w": np.full(size, k, np.float32), f"layer{k}/b": np.arange(4.0)}
        safetensors_numpy.save_file(tensors, str(d / f"model-{k}.safetensors"))
        out[f"model-{k}.safetensors"] = tensors
    return out


def _range_start(headers) -> int:
    """Where the bytes a GET asks for start (0 without a Range)."""
    ranged = str(headers.get("Range") or "bytes=0-")
    return int(ranged.split("=")[1].split("-")[0] or 0)


def put_dir(s3, local, sub: str) -> str:
    for f in sorted(local.iterdir()):
        s3.direct.put_file(str(f), f"{s3.url[5:]}/{sub}/{f.name}")
    return f"{s3.url}/{sub}"


def test_index_on_s3_never_reads_a_local_file(s3, tmp_path):
    local = tmp_path / "secret.safetensors"
    safetensors_numpy.save_file({"secret": np.arange(8, dtype=np.float32)}, str(local))
    hf = tmp_path / "hf"
    shards(hf, 1)
    for ref in (str(local), f"file://{local}", "../hf/model-0.safetensors"):
        (hf / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"layer0/w": "model-0.safetensors", "secret": ref}})
        )
        src = put_dir(s3, hf, "hf")
        proc = ch.run_text("import", f"{src}/model.safetensors.index.json", f"{s3.url}/out/m")
        ch.assert_cli_error(proc, f"{src}/model.safetensors.index.json", "'secret'")
        assert s3.files("out") == {}  # nothing uploaded, nothing left


def test_state_file_on_s3_leads_only_into_its_own_bucket(s3, s3_server, tmp_path):
    """A state file's paths resolve on the storage it is on: from an object store, only a
    URL of its own bucket, never a local path, another bucket, or a ``..`` climb; any
    other name is taken as the file name beside the state file (as for a moved directory)."""
    prefix = tmp_path / "ckpt" / "model.ckpt-1"
    tf.raw_ops.SaveV2(
        prefix=str(prefix), tensor_names=["v"], shape_and_slices=[""], tensors=[np.ones(3)]
    )
    beside = put_dir(s3, prefix.parent, "run")
    s3.direct.mkdir(OTHER_BUCKET)
    for f in sorted(prefix.parent.iterdir()):
        s3.direct.put_file(str(f), f"{OTHER_BUCKET}/run/{f.name}")
    elsewhere = {
        "another bucket": f"s3://{OTHER_BUCKET}/run/model.ckpt-1",
        "a local path": str(prefix),
        "a file URL": f"file://{prefix}",
        "a climb": "../../" + OTHER_BUCKET + "/run/model.ckpt-1",
        "a climb in a URL": f"{s3.url}/run/../../../{OTHER_BUCKET}/run/model.ckpt-1",
    }
    for what, name in elsewhere.items():
        state = f'model_checkpoint_path: "{name}"\n'.encode()
        s3.direct.pipe_file(f"{beside[5:]}/{paths.STATE_FILENAME}", state)
        s3_server.s3fs.S3FileSystem.clear_instance_cache()
        with pytest.warns(tfckpt.CheckpointPathWarning):
            got = paths.resolve_prefix(beside)
        assert got == f"{beside}/model.ckpt-1", what
    # A URL into its own bucket is honoured, as an absolute local path is locally.
    (tmp_path / "ckpt" / "checkpoint").write_text(f'model_checkpoint_path: "{prefix}"\n')
    assert paths.resolve_prefix(str(tmp_path / "ckpt")) == str(prefix)
    own = f"{s3.url}/copy/model.ckpt-1"
    for f in sorted(prefix.parent.iterdir()):
        s3.direct.put_file(str(f), f"{s3.url[5:]}/copy/{f.name}")
    s3.direct.pipe_file(
        f"{beside[5:]}/{paths.STATE_FILENAME}", f'model_checkpoint_path: "{own}"\n'.encode()
    )
    s3_server.s3fs.S3FileSystem.clear_instance_cache()
    assert paths.resolve_prefix(beside) == own


@pytest.mark.parametrize("fault", [500, "die"])
def test_import_to_s3_with_a_fault_mid_run(s3, tmp_path, monkeypatch, fault):
    monkeypatch.setenv("TFCKPT_REMOTE_RETRIES", "0")
    hf = tmp_path / "hf"
    shards(hf, 1, size=1 << 20)  # 4 MiB: an upload in several parts
    src = hf / "model-0.safetensors"
    dst = f"{s3.url}/out/m"
    # The data object's upload fails (every request of it: parts and their completion).
    s3.proxy.rules.append(lambda m, p, h: fault if m in ("PUT", "POST") and ".data-" in p else None)
    proc = ch.run_text("import", src, dst, "--chunk-bytes", "256K")
    ch.assert_cli_error(proc, s3.url)
    s3.proxy.reset()
    left = s3.files("out")
    assert not any(name.endswith(".index") for name in left)  # nothing committed
    if fault != "die":  # a dead server also keeps what the clean-up could not delete
        assert left == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


@pytest.mark.parametrize("fault", [503, "die"])
@pytest.mark.parametrize("where", ["index", "header", "data"])
def test_import_from_s3_with_a_fault_mid_run(s3, tmp_path, monkeypatch, where, fault):
    """The index, a shard's header or (mid-run) a shard's data cannot be read: to a local
    destination and to S3, one line naming the object, no temporaries, no directory made."""
    monkeypatch.setenv("TFCKPT_REMOTE_RETRIES", "0")
    hf = tmp_path / "hf"
    shards(hf, 3)
    weight_map = {f"layer{k}/w": f"model-{k}.safetensors" for k in range(3)}
    (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    src = put_dir(s3, hf, "hf")
    target = "model.safetensors.index.json" if where == "index" else "model-2.safetensors"

    def rule(method, path, headers):
        if method != "GET" or target not in path:
            return None
        if where != "index" and (_range_start(headers) >= 1024) != (where == "data"):
            return None
        return fault

    s3.proxy.rules.append(rule)
    for dst in (tmp_path / "new" / "m", f"{s3.url}/out/m"):
        proc = ch.run_text(
            "import", f"{src}/model.safetensors.index.json", dst, "--chunk-bytes", "64K"
        )
        ch.assert_cli_error(proc, f"{src}/{target}")
        s3.proxy.dead = False  # back for the next run and the checks
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    assert s3.files("out") == {}
