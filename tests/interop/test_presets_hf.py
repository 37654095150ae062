"""The presets (hf-bert, hf-gpt2): research releases into transformers, checked by transformers.

TensorFlow writes each source during the test with the release's names and layouts
(with the Adam moments and global_step a training run leaves) and computes the model's
outputs from it following the release's definition (``tests/bert_release.py``); tfckpt
exports it with the preset; transformers with PyTorch loads the directory
(``tests/hf_consumer.py``): no missing, unexpected or mismatched keys, and the same
outputs to within float32 rounding. TensorFlow and PyTorch each run in a process of
their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tfckpt
from tfckpt.interop.presets import PRESETS, export_preset

pytest.importorskip("tensorflow")
pytest.importorskip("transformers")
pytest.importorskip("torch")

import bert_release  # noqa: E402
import gpt2_release  # noqa: E402

pytestmark = pytest.mark.hf

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HEADS = {
    "pretraining": ("BertForPreTraining", ["prediction_logits", "seq_relationship_logits"]),
    "classifier": ("BertForSequenceClassification", ["logits"]),
    "squad": ("BertForQuestionAnswering", ["start_logits", "end_logits"]),
}


def run(*args, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module", params=sorted(HEADS))
def release(request, tmp_path_factory):
    """(directory, head): a checkpoint TensorFlow wrote, its config and its outputs."""
    directory = str(tmp_path_factory.mktemp(f"bert_{request.param}"))
    run(os.path.join(TESTS, "bert_release.py"), directory, request.param)
    return directory, request.param


def consume(out_dir: str, cls: str, tmp) -> tuple[dict, dict]:
    """transformers' loading info and outputs for the release's inputs."""
    inputs = os.path.join(tmp, "inputs.npz")
    np.savez(
        inputs,
        input_ids=bert_release.INPUT_IDS,
        token_type_ids=bert_release.TOKEN_TYPES,
        attention_mask=bert_release.MASK,
    )
    result = os.path.join(tmp, "result.npz")
    run(os.path.join(TESTS, "hf_consumer.py"), out_dir, cls, inputs, result)
    got = dict(np.load(result))
    return json.loads(str(got.pop("loading_info"))), got


def test_transformers_loads_every_weight_and_computes_what_tensorflow_does(release, tmp_path):
    directory, head = release
    cls, outputs = HEADS[head]
    out_dir = str(tmp_path / "hf")
    sm = export_preset(os.path.join(directory, "bert_model.ckpt"), out_dir, "hf-bert")
    assert sorted(os.listdir(out_dir)) == ["config.json", "model.safetensors"]
    config = json.load(open(os.path.join(out_dir, "config.json")))
    assert config["architectures"] == [cls] and config["model_type"] == "bert"
    assert config["hidden_act"] == "gelu_new"  # the release's gelu: the tanh approximation
    # The optimizer's moments and the step are left out, and the pooler where the
    # architecture has none (run_squad's checkpoints keep the pretraining's).
    pooler = 2 if head == "squad" else 0
    assert sm.dropped == len([n for n in bert_release.weights(head) if "adam" in n]) + 1 + pooler
    info, got = consume(out_dir, cls, tmp_path)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert info["mismatched_keys"] == []
    want = dict(np.load(os.path.join(directory, "outputs.npz")))
    for name in outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_the_command_line_recognises_the_family_and_shards(release, tmp_path):
    directory, head = release
    cls, _ = HEADS[head]
    out_dir = str(tmp_path / "cli")
    proc = run(
        "-m",
        "tfckpt",
        "export",
        os.path.join(directory, "bert_model.ckpt"),
        out_dir,
        "--preset",
        "auto",
        "--max-shard-bytes",
        "20K",
    )
    assert f"preset auto: hf-bert ({cls})" in proc.stderr
    files = sorted(os.listdir(out_dir))
    assert "config.json" in files and "model.safetensors.index.json" in files
    assert len([f for f in files if f.startswith("model-")]) > 1
    info, _ = consume(out_dir, cls, tmp_path)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []


def test_a_tensor_no_rule_names_is_an_error_listing_every_one(tmp_path):
    prefix = str(tmp_path / "src" / "bert_model.ckpt")
    values = bert_release.weights("classifier")
    values["bert/encoder/layer_0/extra/w"] = np.ones(3, np.float32)
    values["my_head/kernel"] = np.ones((2, 2), np.float32)
    tfckpt.save(values, prefix)
    with open(str(tmp_path / "src" / "bert_config.json"), "w") as f:
        json.dump(bert_release.CONFIG, f)
    with pytest.raises(tfckpt.CheckpointError, match="2 tensor.*no name_map rule") as e:
        export_preset(prefix, str(tmp_path / "hf"), "hf-bert")
    assert "my_head/kernel" in str(e.value) and "layer_0/extra/w" in str(e.value)
    assert not os.path.exists(tmp_path / "hf")
    sm = export_preset(prefix, str(tmp_path / "hf"), "hf-bert", allow_unmapped=True)
    assert {"bert/encoder/layer_0/extra/w", "my_head/kernel"} <= {n for n, _ in sm.skipped}


def test_presets_are_listed_and_a_missing_config_is_named(tmp_path):
    proc = run("-m", "tfckpt", "presets")
    assert all(name in proc.stdout for name in PRESETS)
    prefix = str(tmp_path / "bert_model.ckpt")
    tfckpt.save(bert_release.weights("squad"), prefix)
    with pytest.raises(tfckpt.CheckpointError, match="needs the release's config"):
        export_preset(prefix, str(tmp_path / "hf"), "hf-bert")


def test_an_existing_output_is_replaced_only_with_overwrite(tmp_path):
    prefix = str(tmp_path / "src" / "bert_model.ckpt")
    tfckpt.save(bert_release.weights("classifier"), prefix)
    with open(str(tmp_path / "src" / "bert_config.json"), "w") as f:
        json.dump(bert_release.CONFIG, f)
    out_dir = tmp_path / "hf"
    export_preset(prefix, str(out_dir), "hf-bert", max_shard_bytes=20_000)
    before = {f: (out_dir / f).read_bytes() for f in os.listdir(out_dir)}
    with pytest.raises(tfckpt.CheckpointError, match="already exists"):
        export_preset(prefix, str(out_dir), "hf-bert", cast="float16")
    assert {f: (out_dir / f).read_bytes() for f in os.listdir(out_dir)} == before
    export_preset(prefix, str(out_dir), "hf-bert", cast="float16", overwrite=True)
    assert sorted(os.listdir(out_dir)) == ["config.json", "model.safetensors"]
    st = pytest.importorskip("safetensors.numpy").load_file(str(out_dir / "model.safetensors"))
    assert st["classifier.weight"].dtype == np.float16
    assert json.loads((out_dir / "config.json").read_text())["architectures"] == [
        "BertForSequenceClassification"
    ]


@pytest.fixture(scope="module")
def gpt2_directory(tmp_path_factory):
    """A GPT-2 checkpoint TensorFlow wrote with the release's names, and its logits."""
    directory = str(tmp_path_factory.mktemp("gpt2"))
    run(os.path.join(TESTS, "gpt2_release.py"), directory)
    return directory


def test_gpt2_loads_whole_and_computes_what_tensorflow_does(gpt2_directory, tmp_path):
    out_dir = str(tmp_path / "hf")
    proc = run(
        "-m",
        "tfckpt",
        "export",
        os.path.join(gpt2_directory, "model.ckpt"),
        out_dir,
        "--preset",
        "auto",
    )
    assert "preset auto: hf-gpt2 (GPT2LMHeadModel)" in proc.stderr
    config = json.load(open(os.path.join(out_dir, "config.json")))
    assert config["model_type"] == "gpt2" and config["n_positions"] == 16
    st = pytest.importorskip("safetensors.numpy").load_file(
        os.path.join(out_dir, "model.safetensors")
    )
    assert st["transformer.h.0.attn.c_attn.weight"].shape == (16, 48)  # squeezed, not transposed
    assert not any("Adam" in n or "power" in n or "step" in n for n in st)
    inputs = os.path.join(tmp_path, "inputs.npz")
    np.savez(inputs, input_ids=gpt2_release.INPUT_IDS)
    result = os.path.join(tmp_path, "result.npz")
    run(os.path.join(TESTS, "hf_consumer.py"), out_dir, "GPT2LMHeadModel", inputs, result)
    got = dict(np.load(result))
    info = json.loads(str(got.pop("loading_info")))
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert info["mismatched_keys"] == []
    want = np.load(os.path.join(gpt2_directory, "outputs.npz"))["logits"]
    np.testing.assert_allclose(got["logits"], want, rtol=1e-4, atol=1e-5)


def test_config_values_stand_in_for_the_file_or_override_it(tmp_path):
    prefix = str(tmp_path / "bert_model.ckpt")
    tfckpt.save(bert_release.weights("squad"), prefix)
    values = [f"{k}={json.dumps(v)}" for k, v in bert_release.CONFIG.items()]
    args = ["-m", "tfckpt", "export", prefix, str(tmp_path / "hf"), "--preset", "hf-bert"]
    run(*args, *sum((["--config-value", v] for v in values), []))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["hidden_act"] == "gelu_new"
    with open(str(tmp_path / "bert_config.json"), "w") as f:
        json.dump(bert_release.CONFIG, f)
    proc = subprocess.run(
        [sys.executable, *args[:4], str(tmp_path / "hf2"), *args[5:]]
        + ["--config-value", "num_hidden_layers=3"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "says 3 layers, the checkpoint holds 2" in proc.stderr
    assert proc.stderr.count("\n") == 1 and not os.path.exists(tmp_path / "hf2")
    partial = {k: v for k, v in bert_release.CONFIG.items() if k != "num_attention_heads"}
    (tmp_path / "partial.json").write_text(json.dumps(partial))
    with pytest.raises(tfckpt.CheckpointError, match="lacks num_attention_heads.*--config-value"):
        export_preset(
            prefix, str(tmp_path / "hf3"), "hf-bert", config=str(tmp_path / "partial.json")
        )
    export_preset(
        prefix,
        str(tmp_path / "hf3"),
        "hf-bert",
        config=str(tmp_path / "partial.json"),
        config_values={"num_attention_heads": 4},
    )
    assert json.loads((tmp_path / "hf3" / "config.json").read_text())["num_attention_heads"] == 4
