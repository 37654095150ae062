"""The hf-t5 preset: Mesh TensorFlow T5, T5.1.1, LM-adapted T5.1.1, mT5 and ByT5 into
transformers, checked by transformers.

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
from tfckpt.interop.presets import export_preset, family, find, t5

pytest.importorskip("tensorflow")
pytest.importorskip("transformers")
pytest.importorskip("torch")

import t5_release  # noqa: E402

pytestmark = pytest.mark.hf

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASS = "T5ForConditionalGeneration"
# The class and tokenizer each variant's export names (mT5's its own, as Google's ports).
CLASSES = {"mt5": "MT5ForConditionalGeneration"}
TOKENIZERS = {"mt5": "T5Tokenizer", "byt5": "ByT5Tokenizer"}


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


def consume(out_dir: str, tmp, cls: str = CLASS) -> tuple[dict, dict]:
    """transformers' loading info and outputs for the release's inputs."""
    inputs = os.path.join(tmp, "inputs.npz")
    np.savez(
        inputs,
        input_ids=t5_release.INPUT_IDS,
        attention_mask=t5_release.ATTENTION_MASK,
        decoder_input_ids=t5_release.DECODER_INPUT_IDS,
    )
    result = os.path.join(tmp, "result.npz")
    run(os.path.join(TESTS, "hf_consumer.py"), out_dir, cls, inputs, result)
    got = dict(np.load(result))
    return json.loads(str(got.pop("loading_info"))), got


def test_transformers_loads_every_weight_and_computes_what_mesh_tensorflow_does(release, tmp_path):
    prefix, variant = release
    c = t5_release.VARIANTS[variant]
    cls = CLASSES.get(variant, CLASS)
    out_dir = str(tmp_path / "hf")
    sm = export_preset(prefix, out_dir, "hf-t5")
    assert f"preset hf-t5: hf-t5 ({cls})" in sm.warnings
    assert sorted(os.listdir(out_dir)) == ["config.json", "model.safetensors"]
    config = json.load(open(os.path.join(out_dir, "config.json")))
    assert config["architectures"] == [cls]
    assert config["model_type"] == ("mt5" if variant == "mt5" else "t5")
    assert config.get("tokenizer_class") == TOKENIZERS.get(variant)
    assert config["feed_forward_proj"] == ("gated-gelu" if c["gated"] else "relu")
    assert config["tie_word_embeddings"] is c["tied"] and config["vocab_size"] == c["vocab"]
    assert (config["num_layers"], config["num_decoder_layers"]) == (
        c["layers"],
        c["decoder_layers"],
    )
    assert (config["num_heads"], config["d_kv"], config["d_ff"]) == (
        c["heads"],
        c["d_kv"],
        c["d_ff"],
    )
    # Adafactor's slots and the step are left out, nothing else.
    assert sm.dropped == len([n for n in t5_release.weights(variant) if "_slot_" in n]) + 1
    st = pytest.importorskip("safetensors.numpy").load_file(
        os.path.join(out_dir, "model.safetensors")
    )
    d, inner = c["d_model"], c["heads"] * c["d_kv"]
    bias = st["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
    assert bias.shape == (32, c["heads"])
    assert st["decoder.block.0.layer.1.EncDecAttention.q.weight"].shape == (inner, d)
    assert st["decoder.block.0.layer.1.EncDecAttention.o.weight"].shape == (d, inner)
    assert ("lm_head.weight" in st) is not c["tied"]
    info, got = consume(out_dir, tmp_path, cls)
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


def test_byt5s_export_names_its_tokenizer_which_transformers_makes_from_the_config(tmp_path):
    prefix = str(tmp_path / "src" / "model.ckpt-1000")
    tfckpt.save(t5_release.weights("byt5"), prefix)
    (tmp_path / "src" / "operative_config.gin").write_text(t5_release.gin_config("byt5"))
    export_preset(prefix, str(tmp_path / "hf"), "auto")
    code = (
        "import sys, transformers; t = transformers.AutoTokenizer.from_pretrained(sys.argv[1]);"
        " print(type(t).__name__, t('hé').input_ids)"
    )
    proc = run("-c", code, str(tmp_path / "hf"), env={**os.environ, "HF_HUB_OFFLINE": "1"})
    # UTF-8 bytes shifted past the 3 special ids, then the end token.
    assert proc.stdout.split("\n")[-2] == "ByT5Tokenizer [107, 198, 172, 1]"


def _swap_query_and_key(rules: str) -> str:
    """hf-t5's rules with the self-attention's q and k exchanged: the same shapes."""
    swap = (
        "[[map]]\nmatch = '(encoder|decoder)/block_0*(\\d+)/layer_000/SelfAttention/q'\n"
        "to = '\\1.block.\\2.layer.0.SelfAttention.k.weight'\n"
        "[[map]]\nmatch = '(encoder|decoder)/block_0*(\\d+)/layer_000/SelfAttention/k'\n"
        "to = '\\1.block.\\2.layer.0.SelfAttention.q.weight'\n"
    )
    first = rules.index("[[map]]")
    return rules[:first] + swap + rules[first:]


def test_a_broken_rules_file_makes_transformers_compute_something_else(
    release, tmp_path, monkeypatch
):
    """The comparison can fail: a copy of the presets' rules with one name swapped, read
    in place of the shipped ones, exports a model transformers loads whole whose logits
    are not Mesh TF's."""
    prefix, variant = release
    copy = tmp_path / "presets"
    copy.mkdir()
    rules = open(os.path.join(family.HERE, "hf-t5.toml")).read()
    (copy / "hf-t5.toml").write_text(_swap_query_and_key(rules))
    monkeypatch.setattr(family, "HERE", str(copy))
    out_dir = str(tmp_path / "hf")
    export_preset(prefix, out_dir, "hf-t5")
    info, got = consume(out_dir, tmp_path, CLASSES.get(variant, CLASS))
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    want = dict(np.load(os.path.join(os.path.dirname(prefix), "outputs.npz")))
    assert not np.allclose(got["logits"], want["logits"], rtol=1e-4, atol=1e-5)


def test_the_command_line_recognises_t5_and_checks_the_config_against_the_shapes(release, tmp_path):
    prefix, variant = release
    args = ["-m", "tfckpt", "export", prefix, str(tmp_path / "cli"), "--preset", "auto"]
    proc = run(*args, "--max-shard-bytes", "20K")
    assert f"preset auto: hf-t5 ({CLASSES.get(variant, CLASS)})" in proc.stderr
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


def test_a_tensor_transformers_t5_has_no_place_for_is_refused_naming_the_family(tmp_path):
    """Talking-heads attention (t5.1.th) keeps its projections as dense kernels under the
    attention's scope: no rule names them, and the command line says so in one line."""
    values = t5_release.weights("t5.1.1")
    kernel = "encoder/block_000/layer_000/SelfAttention/q/kernel"
    values[kernel] = values.pop("encoder/block_000/layer_000/SelfAttention/q")
    prefix = str(tmp_path / "th" / "model.ckpt-1000")
    tfckpt.save(values, prefix)
    (tmp_path / "th" / "operative_config.gin").write_text(t5_release.gin_config("t5.1.1"))
    out = tmp_path / "hf"
    proc = subprocess.run(
        [sys.executable, "-m", "tfckpt", "export", prefix, str(out), "--preset", "auto"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"{prefix}: hf-t5: 1 tensor(s) no name_map rule names" in proc.stderr
    assert "--allow-unmapped" in proc.stderr and f": {kernel}, which transformers'" in proc.stderr
    assert "has no place for" in proc.stderr and not out.exists()


def test_layers_of_other_widths_are_refused_naming_the_weight_and_why(tmp_path):
    values = t5_release.weights("t5.1.1")
    values["decoder/block_002/layer_002/DenseReluDense/wi_1/kernel"] = np.zeros((16, 48), "f4")
    prefix = str(tmp_path / "model.ckpt-1000")
    tfckpt.save(values, prefix)
    (tmp_path / "operative_config.gin").write_text(t5_release.gin_config("t5.1.1"))
    with pytest.raises(tfckpt.CheckpointError) as e:
        export_preset(prefix, str(tmp_path / "hf"), "hf-t5")
    assert "decoder.block.2.layer.2.DenseReluDense.wi_1.weight has the shape [48, 16], not" in (
        str(e.value)
    )
    assert "transformers' T5 has the same sizes (heads, d_kv, d_ff) in every layer" in str(e.value)
    assert not os.path.exists(tmp_path / "hf")


def test_a_tied_model_of_mt5s_vocabulary_stays_a_t5_which_scales_as_mesh_tf_does(tmp_path):
    """MT5's class never scales the decoder's output by d_model**-0.5; a tied Mesh TF model
    does, and T5's class with tied embeddings does too."""
    values = t5_release.weights("t5")
    values["shared/embedding"] = np.resize(values["shared/embedding"], (t5.MT5_VOCAB, 16))
    values = {n: v for n, v in values.items() if not n.startswith("shared/embedding_slot")}
    prefix = str(tmp_path / "model.ckpt-1000")
    tfckpt.save(values, prefix)
    (tmp_path / "operative_config.gin").write_text(t5_release.gin_config("t5"))
    sm = export_preset(prefix, str(tmp_path / "hf"), "auto")
    assert "preset auto: hf-t5 (T5ForConditionalGeneration)" in sm.warnings
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "t5" and config["tie_word_embeddings"] is True
    assert "tokenizer_class" not in config


def test_auto_tells_every_t5_variant_apart_from_the_other_families():
    for variant in t5_release.VARIANTS:
        assert find("auto", list(t5_release.weights(variant))).name == "hf-t5"
