"""The hf-t5 preset: Mesh TensorFlow T5 and T5.1.1 into transformers, checked by transformers.

TensorFlow writes each variant during the test with Mesh TF's names and layouts (with
the Adafactor slots and global_step a training run leaves) and an operative_config.gin,
and computes the decoder's logits from it as mesh_tensorflow.transformer defines them
(``tests/t5_release.py``); tfckpt exports it with the preset; transformers with PyTorch
loads the directory (``tests/hf_consumer.py``): no missing, unexpected or mismatched
keys, and the same logits to within float32 rounding. TensorFlow and PyTorch each run
in a process of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tfckpt
from tfckpt.interop.presets import export_preset

pytest.importorskip("tensorflow")
pytest.importorskip("transformers")
pytest.importorskip("torch")

import t5_release  # noqa: E402

pytestmark = pytest.mark.hf

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASS = "T5ForConditionalGeneration"


def run(*args, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module", params=sorted(t5_release.VARIANTS))
def release(request, tmp_path_factory):
    """(checkpoint prefix, variant): a checkpoint TensorFlow wrote, its gin and logits."""
    directory = str(tmp_path_factory.mktemp(request.param.replace(".", "_")))
    run(os.path.join(TESTS, "t5_release.py"), directory, request.param)
    return os.path.join(directory, "model.ckpt-1000"), request.param


def consume(out_dir: str, tmp) -> tuple[dict, dict]:
    """transformers' loading info and outputs for the release's inputs."""
    inputs = os.path.join(tmp, "inputs.npz")
    np.savez(
        inputs,
        input_ids=t5_release.INPUT_IDS,
        attention_mask=t5_release.ATTENTION_MASK,
        decoder_input_ids=t5_release.DECODER_INPUT_IDS,
    )
    result = os.path.join(tmp, "result.npz")
    run(os.path.join(TESTS, "hf_consumer.py"), out_dir, CLASS, inputs, result)
    got = dict(np.load(result))
    return json.loads(str(got.pop("loading_info"))), got


def test_transformers_loads_every_weight_and_computes_what_mesh_tensorflow_does(release, tmp_path):
    prefix, variant = release
    c = t5_release.VARIANTS[variant]
    out_dir = str(tmp_path / "hf")
    sm = export_preset(prefix, out_dir, "hf-t5")
    assert sorted(os.listdir(out_dir)) == ["config.json", "model.safetensors"]
    config = json.load(open(os.path.join(out_dir, "config.json")))
    assert config["architectures"] == [CLASS] and config["model_type"] == "t5"
    assert config["feed_forward_proj"] == ("gated-gelu" if c["gated"] else "relu")
    assert config["tie_word_embeddings"] is c["tied"]
    assert (config["num_layers"], config["num_decoder_layers"]) == (2, c["decoder_layers"])
    assert (config["num_heads"], config["d_kv"], config["d_ff"]) == (4, c["d_kv"], c["d_ff"])
    # Adafactor's slots and the step are left out, nothing else.
    assert sm.dropped == len([n for n in t5_release.weights(variant) if "_slot_" in n]) + 1
    st = pytest.importorskip("safetensors.numpy").load_file(
        os.path.join(out_dir, "model.safetensors")
    )
    inner = 4 * c["d_kv"]
    assert st["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].shape == (
        32,
        4,
    )
    assert st["decoder.block.1.layer.1.EncDecAttention.q.weight"].shape == (inner, 16)
    assert st["decoder.block.1.layer.1.EncDecAttention.o.weight"].shape == (16, inner)
    assert ("lm_head.weight" in st) is not c["tied"]
    info, got = consume(out_dir, tmp_path)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert info["mismatched_keys"] == []
    want = dict(np.load(os.path.join(os.path.dirname(prefix), "outputs.npz")))
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-4, atol=1e-5)
    # Mesh TF zeroes the encoder's padded positions; transformers does not.
    unpadded = t5_release.ATTENTION_MASK.astype(bool)
    np.testing.assert_allclose(
        got["encoder_last_hidden_state"][unpadded],
        want["encoder_last_hidden_state"][unpadded],
        rtol=1e-4,
        atol=1e-5,
    )


def test_the_command_line_recognises_t5_and_checks_the_config_against_the_shapes(release, tmp_path):
    prefix, variant = release
    args = ["-m", "tfckpt", "export", prefix, str(tmp_path / "cli"), "--preset", "auto"]
    proc = run(*args, "--max-shard-bytes", "20K")
    assert f"preset auto: hf-t5 ({CLASS})" in proc.stderr
    files = sorted(os.listdir(tmp_path / "cli"))
    assert "config.json" in files and "model.safetensors.index.json" in files
    assert len([f for f in files if f.startswith("model-")]) > 1
    # A setting the shapes contradict: one line naming the config file, nothing written.
    bad = [*args[:4], str(tmp_path / "bad"), *args[5:], "--config-value", "d_ff=48"]
    proc = subprocess.run([sys.executable, *bad], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "operative_config.gin" in proc.stderr
    assert (
        "encoder/DenseReluDense.hidden_size = %d_ff = 48 disagrees with the checkpoint"
        in proc.stderr
    )
    assert not os.path.exists(tmp_path / "bad")


@pytest.fixture
def t511(tmp_path):
    """A T5.1.1 checkpoint and its operative_config.gin (no TensorFlow): the prefix."""
    prefix = str(tmp_path / "src" / "model.ckpt-1000")
    tfckpt.save(t5_release.weights("t5.1.1"), prefix)
    (tmp_path / "src" / "operative_config.gin").write_text(t5_release.gin_config("t5.1.1"))
    return prefix


def test_a_config_that_disagrees_with_the_checkpoint_is_an_error_naming_it(t511, tmp_path):
    gin = tmp_path / "src" / "operative_config.gin"
    gin.write_text(gin.read_text().replace("num_heads = 4", "num_heads = 8"))
    out = str(tmp_path / "hf")
    with pytest.raises(tfckpt.CheckpointError, match="num_heads = %num_heads = 8 disagrees") as e:
        export_preset(t511, out, "hf-t5")
    assert "relative_attention_bias.weight's 4 columns make num_heads 4" in str(e.value)
    assert e.value.path == str(gin) and not os.path.exists(out)


ACTIVATION = "encoder/DenseReluDense.activation"


@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"decoder/Unitransformer.shared_embedding_and_softmax_weights": True},
            "= True disagrees with the checkpoint, which has its own decoder/logits/kernel",
        ),
        ({ACTIVATION: "relu"}, "= 'relu' but decoder/DenseReluDense.activation = "),
        (
            {ACTIVATION: "relu", "decoder/DenseReluDense.activation": "relu"},
            "the feed-forward is relu, the checkpoint's is gated",
        ),
        (
            {
                ACTIVATION: ["linear", "gelu"],
                "decoder/DenseReluDense.activation": ["linear", "gelu"],
            },
            "transformers' T5 takes one of relu, gelu, swish",
        ),
        ({"sublayer_rms_norm.epsilon": "small"}, "epsilon = 'small': expected a number"),
        ({"encoder/make_layer_stack.num_layers": 3}, "3 disagrees.*2 encoder blocks"),
        ({"vocab_size": 32128}, "vocab_size = 32128 disagrees.*64 rows"),
        ({"d_kv": "%d_model"}, "d_kv = '%d_model': expected a whole number"),
    ],
)
def test_settings_over_the_gin_are_checked_too(t511, tmp_path, values, message):
    with pytest.raises(tfckpt.CheckpointError, match=message):
        export_preset(t511, str(tmp_path / "hf"), "hf-t5", config_values=values)
    assert not os.path.exists(tmp_path / "hf")


def test_a_macro_the_gin_does_not_set_is_named(t511, tmp_path):
    gin = tmp_path / "src" / "operative_config.gin"
    gin.write_text(gin.read_text().replace("d_kv = 6\n", ""))
    with pytest.raises(tfckpt.CheckpointError, match="refers to %d_kv, which is not set"):
        export_preset(t511, str(tmp_path / "hf"), "hf-t5")


def test_without_the_gin_config_values_stand_in_for_what_shapes_cannot_say(tmp_path):
    prefix = str(tmp_path / "model.ckpt-1000")
    tfckpt.save(t5_release.weights("t5.1.1"), prefix)
    with pytest.raises(tfckpt.CheckpointError, match="needs the release's config"):
        export_preset(prefix, str(tmp_path / "hf"), "hf-t5")
    with pytest.raises(tfckpt.CheckpointError, match="gated.*give feed_forward_proj"):
        export_preset(prefix, str(tmp_path / "hf"), "hf-t5", config_values={"d_model": 16})
    export_preset(
        prefix,
        str(tmp_path / "hf"),
        "hf-t5",
        config_values={"feed_forward_proj": "gated-gelu", "dropout_rate": 0.0},
    )
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["feed_forward_proj"] == "gated-gelu" and config["num_decoder_layers"] == 3
    assert config["vocab_size"] == 64 and config["tie_word_embeddings"] is False


def test_an_unreadable_gin_file_is_an_error_naming_the_line(tmp_path):
    prefix = str(tmp_path / "model.ckpt-1000")
    tfckpt.save(t5_release.weights("t5"), prefix)
    (tmp_path / "operative_config.gin").write_text('d_model = 16\n{"d_ff": 32}\n')
    with pytest.raises(tfckpt.CheckpointError, match="line 2: not a gin binding") as e:
        export_preset(prefix, str(tmp_path / "hf"), "hf-t5")
    assert e.value.path.endswith("operative_config.gin")
    (tmp_path / "operative_config.gin").write_text("d_ff = [32,\n")
    with pytest.raises(tfckpt.CheckpointError, match=r"line 1: '\[' is not closed"):
        export_preset(prefix, str(tmp_path / "hf"), "hf-t5")
