"""The hf-gpt-neo preset: EleutherAI's GPT-Neo (Mesh TensorFlow) into transformers, checked
by transformers.

TensorFlow writes each variant during the test with gpt-neo's names and layouts (with
the optimizer's slots and global_step a training run leaves) and the run's config.json,
and computes the logits from it as models/gpt2/gpt2.py defines them, local attention
included (``tests/gpt_neo_release.py``); tfckpt exports it with the preset; transformers
with PyTorch loads the directory (``tests/hf_consumer.py``): no missing, unexpected or
mismatched keys, and the same logits to within float32 rounding. TensorFlow and PyTorch
each run in a process of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tfckpt
from tfckpt.interop.presets import export_preset, family, find

pytest.importorskip("tensorflow")
pytest.importorskip("transformers")
pytest.importorskip("torch")

pytestmark = pytest.mark.hf

import gpt_neo_release  # noqa: E402

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASS = "GPTNeoForCausalLM"


def run(*args, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module", params=sorted(gpt_neo_release.VARIANTS))
def release(request, tmp_path_factory):
    """(checkpoint prefix, variant): a checkpoint TensorFlow wrote, its config and logits."""
    directory = str(tmp_path_factory.mktemp(request.param))
    run(os.path.join(TESTS, "gpt_neo_release.py"), directory, request.param)
    return os.path.join(directory, "model.ckpt-1000"), request.param


def consume(out_dir: str, tmp) -> tuple[dict, np.ndarray]:
    """transformers' loading info and logits for the release's inputs."""
    inputs = os.path.join(tmp, "inputs.npz")
    np.savez(inputs, input_ids=gpt_neo_release.INPUT_IDS)
    result = os.path.join(tmp, "result.npz")
    run(os.path.join(TESTS, "hf_consumer.py"), out_dir, CLASS, inputs, result)
    got = dict(np.load(result))
    return json.loads(str(got.pop("loading_info"))), got["logits"]


def expected(prefix: str) -> np.ndarray:
    return np.load(os.path.join(os.path.dirname(prefix), "outputs.npz"))["logits"]


# The logits are sums over n_embd (and 4 * n_embd) products of values near 1, through a
# few layers: float32 rounding, in TensorFlow and PyTorch summing in other orders, stays
# well under 1e-4 of them.
TOLERANCE = dict(rtol=1e-4, atol=1e-4)


def test_transformers_loads_every_weight_and_computes_what_mesh_tensorflow_does(release, tmp_path):
    prefix, variant = release
    c = gpt_neo_release.VARIANTS[variant]
    out_dir = str(tmp_path / "hf")
    sm = export_preset(prefix, out_dir, "hf-gpt-neo")
    assert f"preset hf-gpt-neo: hf-gpt-neo ({CLASS})" in sm.warnings
    assert sorted(os.listdir(out_dir)) == ["config.json", "model.safetensors"]
    config = json.load(open(os.path.join(out_dir, "config.json")))
    assert config["architectures"] == [CLASS] and config["model_type"] == "gpt_neo"
    assert config["attention_types"] == c["attention_types"]
    assert config["window_size"] == c["radius"] and config["activation_function"] == "gelu_new"
    assert (config["vocab_size"], config["hidden_size"]) == (c["n_vocab"], c["n_embd"])
    assert (config["num_heads"], config["num_layers"]) == (c["n_head"], c["n_layer"])
    assert config["max_position_embeddings"] == c["n_ctx"] and config["eos_token_id"] == 1
    # The optimizer's slots and the step are left out, nothing else.
    slots = [n for n in gpt_neo_release.weights(variant) if "/adam_" in n or "_slot_" in n]
    assert sm.dropped == len(slots) + 1
    st = pytest.importorskip("safetensors.numpy").load_file(
        os.path.join(out_dir, "model.safetensors")
    )
    n = c["n_embd"]
    assert st["transformer.h.0.mlp.c_fc.weight"].shape == (4 * n, n)
    assert st["transformer.h.0.mlp.c_proj.weight"].shape == (n, 4 * n)
    assert "lm_head.weight" not in st  # tied to wte
    info, logits = consume(out_dir, tmp_path)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert info["mismatched_keys"] == []
    np.testing.assert_allclose(logits, expected(prefix), **TOLERANCE)


def test_the_local_layers_see_less_than_global_ones_would(release, tmp_path):
    """The comparison above depends on the local windows: made global, the model computes
    something else (the inputs are longer than the windows)."""
    prefix, variant = release
    c = gpt_neo_release.VARIANTS[variant]
    out_dir = str(tmp_path / "hf")
    wide = {"local_attention_radius": c["n_ctx"]}
    export_preset(prefix, out_dir, "hf-gpt-neo", config_values=wide)
    assert json.load(open(os.path.join(out_dir, "config.json")))["window_size"] == c["n_ctx"]
    _, logits = consume(out_dir, tmp_path)
    assert not np.allclose(logits, expected(prefix), **TOLERANCE)


def test_the_command_line_recognises_gpt_neo_and_checks_the_config(release, tmp_path):
    prefix, _ = release
    args = ["-m", "tfckpt", "export", prefix, str(tmp_path / "cli"), "--preset", "auto"]
    proc = run(*args, "--max-shard-bytes", "8K")
    assert f"preset auto: hf-gpt-neo ({CLASS})" in proc.stderr
    files = sorted(os.listdir(tmp_path / "cli"))
    assert "config.json" in files and "model.safetensors.index.json" in files
    assert len([f for f in files if f.startswith("model-")]) > 1
    # A setting the model cannot take: one line naming the config file, nothing written.
    bad = [*args[:4], str(tmp_path / "bad"), *args[5:], "--config-value", "n_head=5"]
    proc = subprocess.run([sys.executable, *bad], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "config.json" in proc.stderr and "is not a multiple of n_head 5" in proc.stderr
    assert "(set by --config-value n_head)" in proc.stderr
    assert not os.path.exists(tmp_path / "bad")


def _swap_query_and_key(rules: str) -> str:
    """hf-gpt-neo's rules with the attention's q and k exchanged: the same shapes."""
    swap = (
        "[[map]]\nmatch = 'gpt2/h(\\d+)/attn/q'\n"
        "to = 'transformer.h.\\1.attn.attention.k_proj.weight'\n"
        "[[map]]\nmatch = 'gpt2/h(\\d+)/attn/k'\n"
        "to = 'transformer.h.\\1.attn.attention.q_proj.weight'\n"
    )
    first = rules.index("[[map]]")
    return rules[:first] + swap + rules[first:]


def test_a_broken_rules_file_makes_transformers_compute_something_else(
    release, tmp_path, monkeypatch
):
    """The comparison can fail: a copy of the presets' rules with one name swapped, read
    in place of the shipped ones, exports a model transformers loads whole whose logits
    are not Mesh TF's."""
    prefix, _ = release
    copy = tmp_path / "presets"
    copy.mkdir()
    rules = open(os.path.join(family.HERE, "hf-gpt-neo.toml")).read()
    (copy / "hf-gpt-neo.toml").write_text(_swap_query_and_key(rules))
    monkeypatch.setattr(family, "HERE", str(copy))
    out_dir = str(tmp_path / "hf")
    export_preset(prefix, out_dir, "hf-gpt-neo")
    info, logits = consume(out_dir, tmp_path)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert not np.allclose(logits, expected(prefix), **TOLERANCE)


@pytest.fixture
def neo(tmp_path):
    """The adam variant's checkpoint and config.json (no TensorFlow): the prefix."""
    prefix = str(tmp_path / "src" / "model.ckpt-1000")
    tfckpt.save(gpt_neo_release.weights("adam"), prefix)
    config = gpt_neo_release.config("adam")
    (tmp_path / "src" / "config.json").write_text(json.dumps(config))
    return prefix


@pytest.mark.parametrize(
    "values, message",
    [
        ({"rotary_emb": True}, "rotary_emb = True: the model has rotary position embeddings"),
        ({"no_weight_tie": True}, "no_weight_tie = True: .* an output layer of its own"),
        ({"mlp_glu": True}, "mlp_glu = True: the model has a gated feed-forward"),
        (
            {"attention_types": [[["global", "linear"], 2]]},
            "attention_types has 'linear' layers: transformers' GPT-Neo has global and local",
        ),
        ({"attention_types": [[["global"], 3]]}, "attention_types names 3 layers, n_layer is 4"),
        ({"attention_types": [["global", 4]]}, r"attention_types = .*: expected \[\["),
        ({"activation_function": "elish"}, "activation_function = 'elish': transformers'"),
        ({"n_vocab": 65}, r"gives transformer.wte.weight the shape \[65, 16\]"),
        ({"local_attention_radius": 0}, "local_attention_radius must be a positive integer"),
        ({"res_dropout": 2}, "resid_dropout must be a rate from 0 to 1"),
    ],
)
def test_what_transformers_gpt_neo_cannot_compute_is_refused_naming_it(
    neo, tmp_path, values, message
):
    with pytest.raises(tfckpt.CheckpointError, match=message) as e:
        export_preset(neo, str(tmp_path / "hf"), "hf-gpt-neo", config_values=values)
    assert e.value.path.endswith("config.json")
    assert not os.path.exists(tmp_path / "hf")


def test_a_tensor_transformers_gpt_neo_has_no_place_for_is_refused_naming_the_family(tmp_path):
    """An untied output layer (no_weight_tie: wte_final_linear) has no place in
    transformers' GPT-Neo; the command line says so in one line."""
    values = gpt_neo_release.weights("adam")
    extra = "gpt2/wte_final_linear/conv1d_main/linear_out/kernel"
    values[extra] = np.zeros((16, 64), np.float32)
    prefix = str(tmp_path / "src" / "model.ckpt-1000")
    tfckpt.save(values, prefix)
    (tmp_path / "src" / "config.json").write_text(json.dumps(gpt_neo_release.config("adam")))
    out = tmp_path / "hf"
    proc = subprocess.run(
        [sys.executable, "-m", "tfckpt", "export", prefix, str(out), "--preset", "auto"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"{prefix}: hf-gpt-neo: 1 tensor(s) no name_map rule names" in proc.stderr
    assert f": {extra}, which transformers' model of this family has no place" in proc.stderr
    assert not out.exists()


def test_without_the_config_its_settings_stand_in(tmp_path):
    prefix = str(tmp_path / "model.ckpt-1000")
    tfckpt.save(gpt_neo_release.weights("adafactor"), prefix)
    with pytest.raises(tfckpt.CheckpointError, match="hf-gpt-neo needs the release's config"):
        export_preset(prefix, str(tmp_path / "hf"), "hf-gpt-neo")
    with pytest.raises(tfckpt.CheckpointError, match="lacks n_head, n_layer, attention_types"):
        export_preset(
            prefix,
            str(tmp_path / "hf"),
            "hf-gpt-neo",
            config_values={"n_vocab": 72, "n_ctx": 20, "n_embd": 12},
        )
    config = gpt_neo_release.config("adafactor")
    keys = ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer", "attention_types")
    export_preset(
        prefix, str(tmp_path / "hf"), "hf-gpt-neo", config_values={k: config[k] for k in keys}
    )
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert written["window_size"] == 256  # models/layers.py's default radius
    assert written["num_layers"] == 3 and written["attention_types"] == config["attention_types"]


def test_auto_tells_gpt_neo_from_every_other_family():
    import gpt2_release

    for variant in gpt_neo_release.VARIANTS:
        names = list(gpt_neo_release.weights(variant))
        assert find("auto", names).name == "hf-gpt-neo"  # one preset only, or an error
    assert find("auto", list(gpt2_release.weights())).name == "hf-gpt2"
