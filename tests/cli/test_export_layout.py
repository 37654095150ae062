"""What an export claims and how a merge shards (issue 28): safetensors metadata says
``"format": "pt"`` only when a preset laid the tensors out as PyTorch's modules hold them;
a merge of small checkpoints writes one data file unless ``--max-shard-bytes`` says
otherwise, and TensorFlow restores either way."""

from __future__ import annotations

import json
import os
import sys

import bert_release
import numpy as np
import pytest
from cli_helpers import in_process

import tfckpt
from tfckpt.interop.presets import export_preset

tf = pytest.importorskip("tensorflow")
safetensors = pytest.importorskip("safetensors")


def _metadata(path) -> dict:
    with safetensors.safe_open(str(path), framework="numpy") as f:
        return f.metadata() or {}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two small TF1 checkpoints TensorFlow's Saver wrote, one data file each."""
    d = tmp_path_factory.mktemp("sources")
    prefixes = []
    for k, scope in enumerate(("tower_a", "tower_b")):
        with tf.Graph().as_default():
            with tf.compat.v1.variable_scope(scope):
                for i in range(3):
                    tf.compat.v1.get_variable(
                        f"layer_{i}/kernel",
                        initializer=np.full((4, 3), k + i, np.float32),
                    )
            saver = tf.compat.v1.train.Saver()
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                prefixes.append(saver.save(sess, str(d / scope / "model.ckpt")))
    return prefixes


def _data_files(prefix) -> list[str]:
    d, base = os.path.split(str(prefix))
    return sorted(f for f in os.listdir(d) if f.startswith(base + ".data-"))


def _tf_values(prefix) -> dict:
    r = tf.train.load_checkpoint(str(prefix))
    return {k: r.get_tensor(k) for k in r.get_variable_to_shape_map()}


def test_a_merge_of_small_sources_writes_one_shard(sources, tmp_path):
    want = {k: v for p in sources for k, v in _tf_values(p).items()}
    out = tmp_path / "merged" / "model.ckpt"
    rc, _, err = in_process("merge", *sources, "-o", out)
    assert rc == 0, err
    assert _data_files(out) == ["model.ckpt.data-00000-of-00001"]
    got = _tf_values(out)
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    packed = tmp_path / "packed" / "model.ckpt"
    rc, _, err = in_process("merge", *sources, "-o", packed, "--max-shard-bytes", "100")
    assert rc == 0, err
    assert len(_data_files(packed)) > 1
    got = _tf_values(packed)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_a_plain_export_claims_no_framework(sources, tmp_path):
    out = tmp_path / "model.safetensors"
    rc, _, err = in_process("export", sources[0], out)
    assert rc == 0, err
    meta = _metadata(out)
    assert "format" not in meta and meta["producer"].startswith("tfckpt ")


@pytest.mark.hf
def test_a_preset_export_says_pytorch_and_transformers_loads_it(tmp_path):
    prefix = str(tmp_path / "src" / "bert_model.ckpt")
    tfckpt.save(bert_release.weights("classifier"), prefix)
    with open(str(tmp_path / "src" / "bert_config.json"), "w") as f:
        json.dump(bert_release.CONFIG, f)
    out_dir = tmp_path / "hf"
    export_preset(prefix, str(out_dir), "hf-bert")
    assert _metadata(out_dir / "model.safetensors")["format"] == "pt"
    pytest.importorskip("transformers")
    code = (
        "import sys, transformers;"
        "m, info = transformers.BertForSequenceClassification.from_pretrained("
        "sys.argv[1], output_loading_info=True);"
        "assert not any(info.values()), info; print('loaded')"
    )
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", code, str(out_dir)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "loaded" in proc.stdout, proc.stderr[-2000:]
