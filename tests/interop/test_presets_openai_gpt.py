"""The hf-openai-gpt preset: the original OpenAI GPT release (numpy shards) into
transformers, checked by transformers.

numpy writes a small release during the test as openai/finetune-transformer-lm ships
it (``params_shapes.json`` and ten ``params_K.npy`` pieces of the concatenated
parameters), and TensorFlow computes train.py's model from those files, loaded as
train.py loads them (``tests/openai_gpt_release.py``); tfckpt exports it with the preset;
transformers with PyTorch loads the directory (``tests/hf_consumer.py``) as
OpenAIGPTLMHeadModel and as OpenAIGPTModel: no missing, unexpected or mismatched keys,
and the same logits and hidden states to within float32 rounding. TensorFlow and
PyTorch each run in a process of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from cli_helpers import assert_cli_error

import tfckpt
from tfckpt.interop.presets import PRESETS, export_preset, family, find

pytest.importorskip("tensorflow")
pytest.importorskip("transformers")
pytest.importorskip("torch")

pytestmark = pytest.mark.hf

import openai_gpt_release  # noqa: E402

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASS, BASE = "OpenAIGPTLMHeadModel", "OpenAIGPTModel"
# The hidden states are layer-normed (of order 1) and the logits sums of n_embd = 24
# products of them, through two blocks: float32 rounding, TensorFlow and PyTorch summing
# in other orders, moves them by a few 1e-7; 1e-5 leaves room, and a weight in the
# wrong place moves them by order 1.
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def run(*args, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> str:
    """The release's ``model/`` directory; ``outputs.npz`` beside it: train.py's outputs."""
    directory = str(tmp_path_factory.mktemp("openai-gpt"))
    run(os.path.join(TESTS, "openai_gpt_release.py"), directory)
    return os.path.join(directory, "model")


def consume(out_dir: str, cls: str, tmp) -> tuple[dict, dict]:
    """transformers' loading info and outputs for the release's inputs."""
    inputs = os.path.join(tmp, "inputs.npz")
    np.savez(inputs, input_ids=openai_gpt_release.INPUT_IDS)
    result = os.path.join(tmp, f"{cls}.npz")
    run(os.path.join(TESTS, "hf_consumer.py"), out_dir, cls, inputs, result)
    got = dict(np.load(result))
    return json.loads(str(got.pop("loading_info"))), got


def expected(release: str) -> dict:
    return dict(np.load(os.path.join(os.path.dirname(release), "outputs.npz")))


def test_transformers_loads_every_weight_and_computes_what_train_py_does(release, tmp_path):
    h = openai_gpt_release.HPARAMS
    out_dir = str(tmp_path / "hf")
    sm = export_preset(release, out_dir, "hf-openai-gpt")
    assert f"preset hf-openai-gpt: hf-openai-gpt ({CLASS})" in sm.warnings
    assert sorted(os.listdir(out_dir)) == ["config.json", "model.safetensors"]
    config = json.load(open(os.path.join(out_dir, "config.json")))
    assert config["architectures"] == [CLASS] and config["model_type"] == "openai-gpt"
    assert (config["vocab_size"], config["n_positions"]) == (h["n_vocab"], h["n_ctx"])
    assert (config["n_embd"], config["n_layer"], config["n_head"]) == (24, 2, 12)
    assert config["afn"] == "gelu" and config["layer_norm_epsilon"] == 1e-5
    st = pytest.importorskip("safetensors.numpy").load_file(
        os.path.join(out_dir, "model.safetensors")
    )
    params = dict(openai_gpt_release.parameters())
    assert np.array_equal(st["transformer.tokens_embed.weight"], params["model/we/tokens"])
    assert np.array_equal(st["transformer.positions_embed.weight"], params["model/we/positions"])
    assert np.array_equal(  # squeezed, not transposed
        st["transformer.h.1.mlp.c_proj.weight"], params["model/h1/mlp/c_proj/w"][0]
    )
    assert "lm_head.weight" not in st and len(st) == len(params)  # tied to the tokens'
    want = expected(release)
    info, got = consume(out_dir, CLASS, tmp_path)
    assert info == {**info, "missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}
    np.testing.assert_allclose(got["logits"], want["logits"], **TOLERANCE)
    info, got = consume(out_dir, BASE, tmp_path)
    assert info == {**info, "missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}
    np.testing.assert_allclose(got["last_hidden_state"], want["hidden"], **TOLERANCE)


def _swap_norms(rules: str) -> str:
    """hf-openai-gpt's rules with each block's two layer norms exchanged: same shapes."""
    swap = "".join(
        f"[[map]]\nmatch = 'model/h(\\d+)/{a}/{p}'\nto = 'transformer.h.\\1.{b}.{q}'\n"
        for a, b in (("ln_1", "ln_2"), ("ln_2", "ln_1"))
        for p, q in (("g", "weight"), ("b", "bias"))
    )
    first = rules.index("[[map]]")
    return rules[:first] + swap + rules[first:]


def test_a_broken_rules_file_makes_transformers_compute_something_else(
    release, tmp_path, monkeypatch
):
    """The comparison can fail: a copy of the preset's rules with two names swapped,
    read in place of the shipped ones, exports a model transformers loads whole whose
    logits are not train.py's."""
    copy = tmp_path / "presets"
    copy.mkdir()
    rules = open(os.path.join(family.HERE, "hf-openai-gpt.toml")).read()
    (copy / "hf-openai-gpt.toml").write_text(_swap_norms(rules))
    monkeypatch.setattr(family, "HERE", str(copy))
    out_dir = str(tmp_path / "hf")
    export_preset(release, out_dir, "hf-openai-gpt")
    info, got = consume(out_dir, CLASS, tmp_path)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert not np.allclose(got["logits"], expected(release)["logits"], **TOLERANCE)


def test_the_command_line_recognises_the_release_and_checks_the_settings(release, tmp_path):
    shapes = os.path.join(release, "params_shapes.json")
    args = ["-m", "tfckpt", "export", shapes, str(tmp_path / "cli"), "--preset", "auto"]
    proc = run(*args, "--max-shard-bytes", "8K")
    assert f"preset auto: hf-openai-gpt ({CLASS})" in proc.stderr
    files = sorted(os.listdir(tmp_path / "cli"))
    assert "config.json" in files and "model.safetensors.index.json" in files
    assert len([f for f in files if f.startswith("model-")]) > 1
    # A setting the model cannot take: one line, nothing written.
    bad = [*args[:4], str(tmp_path / "bad"), *args[5:], "--config-value", "n_head=5"]
    proc = subprocess.run([sys.executable, *bad], capture_output=True, text=True)
    line = assert_cli_error(
        (proc.returncode, proc.stdout, proc.stderr),
        "hf-openai-gpt: n_embd 24 is not a multiple of n_head 5",
        "(set by --config-value n_head)",
    )
    assert os.path.dirname(release) in line  # where a config file would be
    assert not os.path.exists(tmp_path / "bad")


@pytest.fixture
def shards(tmp_path) -> str:
    """The release's files, written by numpy (no TensorFlow)."""
    return openai_gpt_release.write(str(tmp_path / "src" / "model"))


@pytest.mark.parametrize(
    "values, message",
    [
        ({"n_head": 5}, "n_embd 24 is not a multiple of n_head 5"),
        ({"n_head": 0}, "n_head must be a positive integer"),
        ({"afn": "elish"}, "afn 'elish': not one of gelu, relu, swish"),
        ({"embd_pdrop": 2}, "embd_pdrop must be a rate from 0 to 1"),
        ({"n_embd": 32}, "n_embd 32: the checkpoint's shapes make it 24"),
        ({"n_layer": 12}, "n_layer 12: the checkpoint's shapes make it 2"),
    ],
)
def test_what_transformers_openai_gpt_cannot_compute_is_refused_naming_it(
    shards, tmp_path, values, message
):
    with pytest.raises(tfckpt.CheckpointError, match=f"hf-openai-gpt: {message}"):
        export_preset(shards, str(tmp_path / "hf"), "hf-openai-gpt", config_values=values)
    assert not os.path.exists(tmp_path / "hf")


def test_train_py_s_other_settings_are_written(shards, tmp_path):
    values = {"n_head": 4, "afn": "swish", "resid_pdrop": 0.2}
    export_preset(shards, str(tmp_path / "hf"), "hf-openai-gpt", config_values=values)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["n_head"], config["afn"], config["resid_pdrop"]) == (4, "swish", 0.2)


def test_another_family_s_weights_are_refused_naming_the_family(tmp_path):
    """GPT-2's names (the same blocks, other embeddings and a final norm) with this
    preset: one line naming the preset and the tensors it has no place for."""
    import gpt2_release

    prefix = str(tmp_path / "gpt2" / "model.ckpt")
    tfckpt.save(gpt2_release.weights(), prefix)
    out = tmp_path / "hf"
    proc = subprocess.run(
        [sys.executable, "-m", "tfckpt", "export", prefix, str(out)]
        + ["--preset", "hf-openai-gpt"],
        capture_output=True,
        text=True,
    )
    line = assert_cli_error(
        (proc.returncode, proc.stdout, proc.stderr), f"{prefix}: hf-openai-gpt: "
    )
    assert "model/wte" in line and "which transformers' model of this family has no place" in line
    assert not out.exists()


def test_auto_tells_the_release_from_every_other_family():
    import gpt2_release

    names = [n for n, _ in openai_gpt_release.parameters()]
    gpt2 = list(gpt2_release.weights())
    assert [p.name for p in PRESETS.values() if p.knows(names)] == ["hf-openai-gpt"]
    assert find("auto", gpt2).name == "hf-gpt2"  # the same blocks' names
    with pytest.raises(tfckpt.CheckpointError, match="of hf-gpt2 and of hf-openai-gpt"):
        find("auto", names + gpt2)
