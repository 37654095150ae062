"""hf-pegasus: PEGASUS's release (google-research/pegasus) into transformers.

TensorFlow writes the source during the test with the release's names and layouts (with
the Adafactor slots and global_step a training run leaves) and computes the model's
outputs from it following the release's definition (``tests/pegasus_release.py``);
tfckpt exports it with the preset; transformers with PyTorch loads the directory
(``tests/hf_consumer.py``): no missing, unexpected or mismatched keys, and the same
outputs to within float32 rounding. transformers' Pegasus fixes its LayerNorms' epsilon
at 1e-5 where the release's is 1e-12: the outputs are compared with the release's
computed with that epsilon, and the whole difference from the release's own is shown to
be the epsilon's. A copy of the rules file broken on purpose loads as cleanly and
computes something else. TensorFlow and PyTorch each run in a process of their own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tfckpt
from tfckpt.interop.export import plan_export
from tfckpt.interop.presets import PRESETS, export_preset, find, pegasus
from tfckpt.interop.proof import verify_against
from tfckpt.rewrite.rulesfile import load_rules

pytest.importorskip("tensorflow")
pytest.importorskip("transformers")
pytest.importorskip("torch")

pytestmark = pytest.mark.hf

import albert_release  # noqa: E402
import bert_release  # noqa: E402
import electra_release  # noqa: E402
import gpt2_release  # noqa: E402
import gpt_neo_release  # noqa: E402
import pegasus_release  # noqa: E402
import t5_release  # noqa: E402

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASS = "PegasusForConditionalGeneration"
HEADS = ["--config-value", f"num_heads={pegasus_release.CONFIG['num_heads']}"]
VALUES = {"num_heads": pegasus_release.CONFIG["num_heads"]}


def run(*args, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def consume(out_dir: str, tmp) -> tuple[dict, dict]:
    """transformers' loading info and outputs for the release's inputs: the decoder's
    input the targets shifted right behind the start token (the padding id, 0)."""
    inputs = os.path.join(tmp, "inputs.npz")
    ids = pegasus_release.INPUT_IDS.astype(np.int64)
    targets = pegasus_release.TARGETS.astype(np.int64)
    start = np.zeros((targets.shape[0], 1), np.int64)
    np.savez(
        inputs,
        input_ids=ids,
        attention_mask=(ids != 0).astype(np.int64),
        decoder_input_ids=np.concatenate([start, targets[:, :-1]], axis=1),
    )
    result = os.path.join(tmp, f"result-{os.path.basename(out_dir)}.npz")
    run(os.path.join(TESTS, "hf_consumer.py"), out_dir, CLASS, inputs, result)
    got = dict(np.load(result))
    return json.loads(str(got.pop("loading_info"))), got


def tolerance(want: np.ndarray) -> float:
    """float32 keeps 24 bits; an encoder of two layers and a decoder of three, sums of
    at most 24 products, softmaxes and norms, done in another order by each framework,
    lose a few of them. 2^-16 of the output's scale leaves 8 bits for that, and is far
    under what a wrong weight does (a swapped or untransposed kernel moves the outputs
    by their own scale)."""
    return 2.0**-16 * max(1.0, float(np.abs(want).max()))


def compared(got: dict, want: dict, prefix: str = "") -> dict[str, np.ndarray]:
    """Each output's difference from the release's, where the release defines it: the
    encoder's at the tokens that are not padding (the release masks them), the logits
    but the padding token's (its embedding row is written zero: see the preset)."""
    keep = pegasus_release.INPUT_IDS != 0
    return {
        "encoder_last_hidden_state": np.abs(
            got["encoder_last_hidden_state"] - want[prefix + "encoder_last_hidden_state"]
        )[keep],
        "logits": np.abs(got["logits"] - want[prefix + "logits"])[..., 1:],
    }


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The release's checkpoint TensorFlow wrote, with its outputs."""
    directory = str(tmp_path_factory.mktemp("pegasus"))
    run(os.path.join(TESTS, "pegasus_release.py"), directory)
    return directory


def test_auto_recognises_pegasus_and_transformers_computes_what_tensorflow_does(release, tmp_path):
    out_dir = str(tmp_path / "hf")
    src = os.path.join(release, pegasus_release.FILE)
    proc = run("-m", "tfckpt", "export", src, out_dir, "--preset", "auto", *HEADS)
    assert f"preset auto: hf-pegasus ({CLASS})" in proc.stderr
    assert "verified:" in proc.stderr
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    c = pegasus_release.CONFIG
    assert config["model_type"] == "pegasus" and config["architectures"] == [CLASS]
    assert (config["vocab_size"], config["d_model"]) == (c["vocab_size"], c["hidden_size"])
    assert (config["encoder_layers"], config["decoder_layers"]) == (2, 3)
    assert config["encoder_attention_heads"] == config["decoder_attention_heads"] == 4
    assert config["encoder_ffn_dim"] == config["decoder_ffn_dim"] == c["filter_size"]
    assert config["activation_function"] == "relu" and config["scale_embedding"] is True
    assert (config["pad_token_id"], config["eos_token_id"]) == (0, 1)
    assert config["max_position_embeddings"] == 1024
    st = pytest.importorskip("safetensors.numpy").load_file(
        os.path.join(out_dir, "model.safetensors")
    )
    assert not any("Adafactor" in n or "step" in n for n in st)
    shared = pegasus_release.weights()["embeddings/weights"]
    assert not st[pegasus.SHARED][0].any()  # the padding token's row, zeroed
    assert np.array_equal(st[pegasus.SHARED][1:], shared[1:])
    assert not st["final_logits_bias"].any()
    assert not st["model.decoder.layers.2.encoder_attn.q_proj.bias"].any()
    info, got = consume(out_dir, tmp_path)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert info["mismatched_keys"] == []
    want = dict(np.load(os.path.join(release, "outputs.npz")))
    assert not got["logits"][..., 0].any()  # the padding token's logit
    # transformers' model (LayerNorm epsilon 1e-5) computes what the release does with
    # that epsilon, to within float32 rounding...
    for name, diff in compared(got, want, "eps_1e-05_").items():
        assert diff.max() <= tolerance(want[name]), name
    # ...and differs from the release's own (1e-12) by no more than the epsilon does.
    for name, diff in compared(got, want).items():
        eps = compared({k: want["eps_1e-05_" + k] for k in compared(want, want)}, want)[name]
        assert diff.max() <= eps.max() + tolerance(want[name]), name


def test_the_position_tables_are_the_releases_timing_signal(release):
    """The preset computes the table as the release's graph does, in float32 steps: it
    equals TensorFlow's own to within the last bit of sine and cosine."""
    want = np.load(os.path.join(release, "outputs.npz"))["timing"]
    got = pegasus.timing_signal(*pegasus_release.TIMING)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=2.0**-24)


@pytest.mark.parametrize(
    "breakage",
    [
        # A transpose removed: the queries' kernels kept [in, out] (square: they load).
        (
            "match = '\\.(q_proj|k_proj|v_proj|out_proj|fc1|fc2)\\.weight$'",
            "match = '\\.(k_proj|v_proj|out_proj|fc1|fc2)\\.weight$'",
        ),
        # A name swapped: the memory attention's queries written as its keys and back.
        (
            "match = 'decoder/layer_(\\d+)/memory_attention/([qkv])_proj/kernel'\n"
            "to = 'model.decoder.layers.\\1.encoder_attn.\\2_proj.weight'",
            "match = 'decoder/layer_(\\d+)/memory_attention/q_proj/kernel'\n"
            "to = 'model.decoder.layers.\\1.encoder_attn.k_proj.weight'\n[[map]]\n"
            "match = 'decoder/layer_(\\d+)/memory_attention/k_proj/kernel'\n"
            "to = 'model.decoder.layers.\\1.encoder_attn.q_proj.weight'\n[[map]]\n"
            "match = 'decoder/layer_(\\d+)/memory_attention/v_proj/kernel'\n"
            "to = 'model.decoder.layers.\\1.encoder_attn.v_proj.weight'",
        ),
    ],
    ids=["transpose-removed", "names-swapped"],
)
def test_a_broken_copy_of_the_rules_file_makes_the_comparison_fail(release, breakage, tmp_path):
    src = os.path.join(release, pegasus_release.FILE)
    good = tmp_path / "good"
    export_preset(src, str(good), "hf-pegasus", config_values=VALUES)
    text = open(PRESETS["hf-pegasus"].rules_file).read()
    old, new = breakage
    assert text.count(old) == 1
    rules = tmp_path / "broken.toml"
    rules.write_text(text.replace(old, new))
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(good / "config.json", bad / "config.json")
    config = json.loads((good / "config.json").read_text())
    p = plan_export(
        src,
        str(bad / "model.safetensors"),
        tfckpt.Options(**load_rules(str(rules)), allow_unmatched=True),
        format="safetensors",
        made=pegasus.PRESET.made(config),
    )
    p.output.framework = "pt"
    try:
        tfckpt.execute(p)
    finally:
        for s in p.sources:
            s.ckpt.close()
    st = pytest.importorskip("safetensors.numpy")
    assert sorted(st.load_file(str(bad / "model.safetensors"))) == sorted(
        st.load_file(str(good / "model.safetensors"))
    )
    info, got = consume(str(bad), tmp_path)
    assert info["missing_keys"] == [] and info["mismatched_keys"] == []  # it loads whole
    want = dict(np.load(os.path.join(release, "outputs.npz")))
    diff = compared(got, want, "eps_1e-05_")["logits"]
    assert diff.max() > 100 * tolerance(want["logits"])


def test_without_the_padding_row_zeroed_the_decoder_starts_elsewhere(release, tmp_path):
    """The zeroed row is what makes the decoder's start the release's zero vector: the
    same export with the row as stored computes other logits."""
    src = os.path.join(release, pegasus_release.FILE)
    good = tmp_path / "good"
    export_preset(src, str(good), "hf-pegasus", config_values=VALUES)
    st = pytest.importorskip("safetensors.numpy")
    values = st.load_file(str(good / "model.safetensors"))
    values[pegasus.SHARED] = pegasus_release.weights()["embeddings/weights"]
    st.save_file(values, str(good / "model.safetensors"), metadata={"format": "pt"})
    _, got = consume(str(good), tmp_path)
    want = dict(np.load(os.path.join(release, "outputs.npz")))
    diff = compared(got, want, "eps_1e-05_")["logits"]
    assert diff.max() > 100 * tolerance(want["logits"])


def test_auto_tells_pegasus_from_every_other_family():
    names = list(pegasus_release.weights())
    assert find("auto", names).name == "hf-pegasus"
    assert [p.name for p in PRESETS.values() if p.knows(names)] == ["hf-pegasus"]
    others = {
        "hf-bert": bert_release.weights("pretraining"),
        "hf-albert": albert_release.weights("pretraining"),
        "hf-electra": electra_release.weights(),
        "hf-gpt2": gpt2_release.weights(),
        "hf-gpt-neo": gpt_neo_release.weights("adam"),
        "hf-t5": t5_release.weights("t5.1.1"),
    }
    for name, weights in others.items():
        assert [p.name for p in PRESETS.values() if p.knows(list(weights))] == [name]
    # Without the shared embedding the layers alone are not taken for PEGASUS's.
    assert not PRESETS["hf-pegasus"].knows([n for n in names if n != "embeddings/weights"])
    with pytest.raises(tfckpt.CheckpointError, match="of hf-bert and of hf-pegasus.*--preset"):
        find("auto", names + list(bert_release.weights("pretraining")))


def test_the_config_defaults_to_the_releases_heads_and_is_checked(release, tmp_path):
    src = os.path.join(release, pegasus_release.FILE)
    sm = export_preset(src, str(tmp_path / "hf"), "hf-pegasus", dry_run=True)
    assert any("hf-pegasus" in w for w in sm.warnings)
    export_preset(src, str(tmp_path / "hf16"), "hf-pegasus")
    config = json.loads((tmp_path / "hf16" / "config.json").read_text())
    assert config["encoder_attention_heads"] == 16  # the release's, which no shape shows
    cases = [
        ({"num_heads": 5}, "hf-pegasus: hidden_size 16 is not a multiple of num_heads 5"),
        ({"hidden_size": 32}, "hf-pegasus: hidden_size 32: the checkpoint's model.shared"),
        ({"filter_size": 8}, "hf-pegasus: filter_size 8: the checkpoint's"),
        ({"num_decoder_layers": 2}, "hf-pegasus: the config says 2 layers, the checkpoint holds 3"),
        ({"encoder_attention_heads": 4}, "encoder_attention_heads: not a setting of the release"),
        ({"dropout": 2}, "hf-pegasus: dropout must be a rate from 0 to 1, not 2"),
        ({"max_position_embeddings": 0}, "max_position_embeddings must be a positive integer"),
    ]
    for values, message in cases:
        with pytest.raises(tfckpt.CheckpointError, match=message):
            export_preset(src, str(tmp_path / "no"), "hf-pegasus", config_values=values)
    assert not os.path.exists(tmp_path / "no")


def test_refusals_name_the_family_the_weights_and_the_reason(tmp_path):
    weights = pegasus_release.weights()
    # A layer without its feed-forward's second kernel.
    cut = {k: v for k, v in weights.items() if not k.startswith("decoder/layer_1/ffn/dense_1/")}
    tfckpt.save(cut, str(tmp_path / "cut" / "model.ckpt-1"))
    with pytest.raises(
        tfckpt.CheckpointError,
        match="hf-pegasus: the checkpoint lacks model.decoder.layers.1.fc2.bias, "
        "model.decoder.layers.1.fc2.weight",
    ):
        export_preset(str(tmp_path / "cut" / "model.ckpt-1"), str(tmp_path / "hf"), "auto")
    # A tensor transformers' Pegasus has no place for: a bias on a projection.
    extra = {**weights, "encoder/layer_0/self_attention/q_proj/bias": np.zeros(16, np.float32)}
    tfckpt.save(extra, str(tmp_path / "extra" / "model.ckpt-1"))
    with pytest.raises(
        tfckpt.CheckpointError,
        match="hf-pegasus: 1 tensor.*no name_map rule.*q_proj/bias",
    ):
        export_preset(str(tmp_path / "extra" / "model.ckpt-1"), str(tmp_path / "hf"), "auto")
    assert not os.path.exists(tmp_path / "hf")


def test_the_made_tensors_and_the_zeroed_row_are_verified_and_cast(release, tmp_path):
    src = os.path.join(release, pegasus_release.FILE)
    sm = export_preset(
        src, str(tmp_path / "hf"), "hf-pegasus", cast="float16", config_values=VALUES
    )
    # Every weight stored, and 35 made: 4 biases per attention (2 of the encoder's
    # layers, 6 of the decoder's), 2 position tables, final_logits_bias.
    stored = len([n for n in pegasus_release.weights() if "Adafactor" not in n]) - 1
    assert any(w.startswith(f"verified: {stored + 35} tensors") for w in sm.warnings), sm.warnings
    st = pytest.importorskip("safetensors.numpy").load_file(
        str(tmp_path / "hf" / "model.safetensors")
    )
    assert st[pegasus.SHARED].dtype == np.float16 and not st[pegasus.SHARED][0].any()
    shared = pegasus_release.weights()["embeddings/weights"].astype(np.float16)
    assert np.array_equal(st[pegasus.SHARED][1:], shared[1:])
    proof = verify_against(src, str(tmp_path / "hf"), preset="hf-pegasus", cast="float16")
    assert proof.ok, proof.problems()
    # The row changed in the output: the check against the source says so.
    values = dict(st)
    values[pegasus.SHARED] = shared
    pytest.importorskip("safetensors.numpy").save_file(
        values, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"}
    )
    proof = verify_against(src, str(tmp_path / "hf"), preset="hf-pegasus", cast="float16")
    assert not proof.ok and [n for n, _ in proof.mismatched] == [pegasus.SHARED]
