"""hf-tf2: Hugging Face's TensorFlow models (``tf_model.h5``) into transformers' PyTorch models.

transformers 5 has no TensorFlow classes, so tf.keras builds BERT, GPT-2 and T5 models
nested and named as those classes named them (``tests/hf_tf2_models.py``), with the
config.json transformers' PyTorch config writes, saves them with ``save_weights`` (a
Keras 2 HDF5 file, as ``save_pretrained`` wrote ``tf_model.h5``) and computes their
outputs in TensorFlow; tfckpt exports each with the preset; transformers with PyTorch
loads the directory (``tests/hf_consumer.py``): no missing, unexpected or mismatched
keys, and the same outputs to within float32 rounding. TensorFlow and PyTorch each run
in a process of their own.
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
from tfckpt.interop.presets import export_preset, find
from tfckpt.interop.presets.hf_tf2 import architecture, pytorch_name, source_rules

pytestmark = pytest.mark.hf

transformers = pytest.importorskip("transformers")
pytest.importorskip("tensorflow")
pytest.importorskip("tf_keras")
pytest.importorskip("torch")
pytest.importorskip("h5py")

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BERT = dict(
    vocab_size=50,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=32,
    max_position_embeddings=24,
    hidden_act="gelu",
)
BERT_INPUTS = dict(
    input_ids=np.array([[2, 7, 11, 3, 9, 0], [5, 1, 4, 8, 0, 0]]),
    token_type_ids=np.array([[0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 0, 0]]),
    attention_mask=np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]]),
)
CASES = {
    "bert-mlm": (
        transformers.BertConfig(**BERT, architectures=["BertForMaskedLM"]),
        BERT_INPUTS,
        ["logits"],
    ),
    "bert-base": (
        transformers.BertConfig(**BERT, architectures=["BertModel"]),
        BERT_INPUTS,
        ["last_hidden_state", "pooler_output"],
    ),
    "gpt2": (
        transformers.GPT2Config(
            vocab_size=50, n_positions=16, n_embd=16, n_layer=2, n_head=4,
            architectures=["GPT2LMHeadModel"],
        ),
        dict(input_ids=np.array([[3, 7, 1, 9, 20, 5], [11, 2, 6, 6, 30, 49]])),
        ["logits"],
    ),
    "t5": (
        transformers.T5Config(
            vocab_size=40, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=2,
            num_heads=4, feed_forward_proj="relu", architectures=["T5ForConditionalGeneration"],
        ),
        dict(
            input_ids=np.array([[4, 9, 13, 2, 1, 0], [7, 7, 3, 1, 0, 0]]),
            attention_mask=np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]]),
            decoder_input_ids=np.array([[0, 5, 7, 9], [0, 3, 3, 1]]),
        ),
        ["logits", "encoder_last_hidden_state"],
    ),
}  # fmt: skip


def run(*args) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Each case's directory: config.json, tf_model.h5, inputs.npz, outputs.npz."""
    root = tmp_path_factory.mktemp("hf_tf2")
    for case, (config, inputs, _) in CASES.items():
        (root / case).mkdir()
        config.to_json_file(str(root / case / "config.json"), use_diff=False)
        np.savez(root / case / "inputs.npz", **inputs)
    run(os.path.join(TESTS, "hf_tf2_models.py"), str(root))
    return root


def consume(out_dir, cls: str, inputs: str, tmp) -> tuple[dict, dict]:
    result = os.path.join(tmp, "result.npz")
    run(os.path.join(TESTS, "hf_consumer.py"), str(out_dir), cls, inputs, result)
    got = dict(np.load(result))
    return json.loads(str(got.pop("loading_info"))), got


def test_the_files_hold_the_names_transformers_tf_classes_give(written):
    names = {c: json.loads((written / c / "tf_names.json").read_text()) for c in CASES}
    assert (
        "tf_bert_for_masked_lm/bert/encoder/layer_._1/attention/self/query/kernel:0"
        in names["bert-mlm"]
    )
    assert "tf_bert_for_masked_lm/mlm___cls/predictions/bias:0" in names["bert-mlm"]
    assert "tf_bert_model/bert/embeddings/token_type_embeddings/embeddings:0" in names["bert-base"]
    assert "tfgpt2lm_head_model/transformer/h_._0/attn/c_attn/bias:0" in names["gpt2"]
    assert "shared/shared/embeddings:0" in names["t5"]
    assert (
        "tft5_for_conditional_generation/encoder/block_._0/layer_._0/SelfAttention/"
        "relative_attention_bias/embeddings:0"
    ) in names["t5"]
    with tfckpt.open(written / "t5" / "tf_model.h5") as ckpt:
        # The encoder and decoder list the shared embedding again: one tensor.
        assert ckpt.keys().count("shared/shared/embeddings") == 1
        assert [n for n, ts in ckpt.keras_layers if "shared/shared/embeddings" in ts] == [
            "shared",
            "encoder",
            "decoder",
        ]


@pytest.mark.parametrize("case", sorted(CASES))
def test_transformers_loads_every_weight_and_computes_what_tensorflow_does(written, case, tmp_path):
    config, _, outputs = CASES[case]
    (cls,) = config.architectures
    out_dir = tmp_path / "hf"
    sm = export_preset(str(written / case / "tf_model.h5"), str(out_dir), "hf-tf2")
    assert sorted(os.listdir(out_dir)) == ["config.json", "model.safetensors"]
    assert f"preset hf-tf2: hf-tf2 ({cls})" in sm.warnings
    assert any(w.startswith("verified: ") for w in sm.warnings)
    written_config = json.loads((out_dir / "config.json").read_text())
    assert written_config == json.loads((written / case / "config.json").read_text())
    info, got = consume(out_dir, cls, str(written / case / "inputs.npz"), tmp_path)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [], info
    assert info["mismatched_keys"] == [], info
    want = dict(np.load(written / case / "outputs.npz"))
    for name in outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=2e-5, err_msg=name)


def test_the_command_line_recognises_the_files_and_verifies_against_them(written, tmp_path):
    h5 = str(written / "gpt2" / "tf_model.h5")
    out_dir = str(tmp_path / "cli")
    proc = run("-m", "tfckpt", "export", h5, out_dir, "--preset", "auto", "--dtype", "bfloat16")
    assert "preset auto: hf-tf2 (GPT2LMHeadModel)" in proc.stderr
    st = pytest.importorskip("safetensors.torch").load_file(
        os.path.join(out_dir, "model.safetensors")
    )
    assert tuple(st["transformer.h.0.attn.c_attn.weight"].shape) == (16, 48)  # Conv1D: as stored
    assert tuple(st["transformer.h.0.attn.c_attn.bias"].shape) == (48,)  # [1, 48] made [48]
    proc = run(
        "-m",
        "tfckpt",
        "verify",
        h5,
        "--against",
        out_dir,
        "--preset",
        "hf-tf2",
        "--dtype",
        "bfloat16",
    )
    assert proc.stdout.startswith("ok: "), proc.stdout
    with tfckpt.open(h5) as ckpt:
        assert find("auto", ckpt.keys()).name == "hf-tf2"


def test_a_missing_config_is_named(written, tmp_path):
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "tf_model.h5").write_bytes((written / "bert-mlm" / "tf_model.h5").read_bytes())
    with pytest.raises(
        tfckpt.CheckpointError, match="config.json beside the checkpoint, or --config"
    ):
        export_preset(str(lone / "tf_model.h5"), str(tmp_path / "hf"), "hf-tf2")
    (lone / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(tfckpt.CheckpointError, match="must name one architecture"):
        export_preset(str(lone / "tf_model.h5"), str(tmp_path / "hf"), "hf-tf2")
    assert not (tmp_path / "hf").exists()


def test_the_naming_rules():
    """transformers' converter's rules, one by one (its TF names to its PyTorch names)."""
    assert pytorch_name(
        "tf_bert_for_pre_training/mlm___cls/predictions/transform/LayerNorm/gamma"
    ) == (
        "cls.predictions.transform.LayerNorm.weight",
        None,
    )
    assert pytorch_name("tf_xlnet_model/transformer/layer_._3/ff/layer_1/kernel") == (
        "transformer.layer.3.ff.layer_1.weight",
        "kernel",
    )
    assert pytorch_name("shared/shared/embeddings") == ("shared.weight", None)
    assert pytorch_name("tf_bart_for_conditional_generation/final_logits_bias") == (
        "final_logits_bias",
        None,
    )
    assert pytorch_name("m/conv/depthwise_kernel") == ("conv.depthwise.weight", "reverse")
    assert pytorch_name("m/adaptive_embedding/emb_projs_._0") == (
        "adaptive_embedding.emb_projs.0",
        "reverse",
    )
    assert architecture({"architectures": ["TFBertForMaskedLM"]}) == "BertForMaskedLM"
    rules, arch = source_rules(
        {
            "tf_convnext_model/convnext/stem/kernel": (4, 4, 3, 8),
            "tf_convnext_model/convnext/stem/bias": (8,),
            "tf_convnext_model/convnext/encoder/conv1d/kernel": (3, 8, 5),
        },
        {"architectures": ["ConvNextModel"], "model_type": "convnext"},
    )
    assert arch == "ConvNextModel"
    assert rules["rename_exact"]["tf_convnext_model/convnext/stem/kernel"] == "stem.weight"
    assert sorted(tuple(a) for _, a in rules["permute"]) == [(2, 1, 0), (3, 2, 0, 1)]


# -- Hugging Face's sharded TF weights (tf_model.h5.index.json and its shards)


def _sharded(written, case: str) -> str:
    return str(written / case / "sharded")


def test_the_shards_are_laid_out_as_transformers_writes_them(written):
    h5py = pytest.importorskip("h5py")
    d = written / "bert-mlm" / "sharded"
    index = json.loads((d / "tf_model.h5.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 3 and files[0] == f"tf_model-00001-of-{len(files):05d}.h5"
    name = "tf_bert_for_masked_lm/bert/embeddings/word_embeddings/weight:0"
    with h5py.File(d / index["weight_map"][name], "r") as f:
        # Datasets at the weight's name less the model's scope, listed at the root.
        listed = [n.decode() if isinstance(n, bytes) else n for n in f.attrs["layer_names"]]
        assert "bert/embeddings/word_embeddings/weight:0" in listed
        assert isinstance(f["bert/embeddings/word_embeddings/weight:0"], h5py.Dataset)


@pytest.mark.parametrize("case", sorted(CASES))
def test_sharded_weights_read_as_the_single_file(written, case):
    """The index (or its directory) opens as one checkpoint: the names and values of the
    unsharded tf_model.h5, bit for bit."""
    with tfckpt.open(written / case / "tf_model.h5") as one:
        want = {n: one[n] for n in one.keys()}
    for path in (
        _sharded(written, case),
        os.path.join(_sharded(written, case), "tf_model.h5.index.json"),
    ):
        with tfckpt.open(path) as ckpt:
            assert sorted(ckpt.keys()) == sorted(want)
            for n in ckpt.keys():
                got = ckpt[n]
                assert got.dtype == want[n].dtype and got.tobytes() == want[n].tobytes(), n
            assert ckpt.header.num_shards >= 3 and len(ckpt.data_files) == ckpt.header.num_shards


@pytest.mark.parametrize("case", sorted(CASES))
def test_transformers_loads_the_export_of_sharded_weights(written, case, tmp_path):
    config, _, outputs = CASES[case]
    (cls,) = config.architectures
    out_dir = str(tmp_path / "hf")
    proc = run("-m", "tfckpt", "export", _sharded(written, case), out_dir, "--preset", "hf-tf2")
    assert f"preset hf-tf2: hf-tf2 ({cls})" in proc.stderr and "verified: " in proc.stderr
    info, got = consume(out_dir, cls, str(written / case / "inputs.npz"), tmp_path)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [], info
    assert info["mismatched_keys"] == [], info
    want = dict(np.load(written / case / "outputs.npz"))
    for name in outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=2e-5, err_msg=name)


def test_read_only_commands_and_convert_take_the_sharded_directory(written, tmp_path):
    from cli_helpers import in_process

    d = _sharded(written, "gpt2")
    rc, out, err = in_process("dump", d, "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["num_shards"] >= 3 and data["prefix"].endswith("tf_model.h5.index.json")
    rc, out, err = in_process("diff", d, str(written / "gpt2" / "tf_model.h5"))
    assert rc == 0, (out, err)
    rc, _, err = in_process("convert", d, str(tmp_path / "v2" / "ckpt"))
    assert rc == 0, err
    with tfckpt.open(tmp_path / "v2" / "ckpt") as c, tfckpt.open(d) as s:
        assert sorted(c.keys()) == sorted(s.keys())
        assert all(c[n].tobytes() == s[n].tobytes() for n in s.keys())


def _hostile(written, tmp_path, change) -> str:
    """A copy of BERT's sharded weights with ``change(directory, index)`` applied."""
    import shutil

    d = tmp_path / "hostile"
    shutil.copytree(written / "bert-mlm" / "sharded", d)
    index = json.loads((d / "tf_model.h5.index.json").read_text())
    text = change(d, index)
    (d / "tf_model.h5.index.json").write_text(text if text else json.dumps(index))
    return str(d)


def test_a_hostile_index_is_a_clean_error(written, tmp_path):
    from cli_helpers import assert_cli_error, in_process

    word = "tf_bert_for_masked_lm/bert/embeddings/word_embeddings/weight:0"

    def redirect(target):
        def change(d, index):
            index["weight_map"][word] = target

        return change

    def drop_shard(d, index):
        (d / index["weight_map"][word]).unlink()

    def move(d, index):  # the index puts it in another shard than the one holding it
        files = sorted(set(index["weight_map"].values()))
        index["weight_map"][word] = next(f for f in files if f != index["weight_map"][word])

    def twice(d, index):  # the key twice, pointing at two shards
        body = json.dumps(index)
        files = sorted(set(index["weight_map"].values()))
        return body.replace('"weight_map": {', f'"weight_map": {{"{word}": "{files[-1]}", ', 1)

    def unlisted(d, index):  # a weight the index does not name
        del index["weight_map"][word]

    cases = {
        "outside": (redirect("../tf_model-00001-of-00004.h5"), "in the index's own directory"),
        "absolute": (redirect(str(written / "bert-mlm" / "tf_model.h5")), "own directory"),
        "missing shard": (drop_shard, "cannot be read"),
        "moved": (move, "a weight in two shards"),
        "twice": (twice, "twice"),
        "unlisted": (unlisted, "the index names no such weight"),
        "not json": (lambda d, index: "{", "not an index of shards"),
        "no weight_map": (lambda d, index: json.dumps({"metadata": {}}), "no weight_map"),
    }
    for name, (change, fragment) in cases.items():
        d = _hostile(written, tmp_path / name.replace(" ", "_"), change)
        with pytest.raises(tfckpt.CheckpointError, match=fragment):
            tfckpt.open(d)
        assert_cli_error(in_process("dump", d), fragment)


def test_a_config_transformers_refuses_is_refused_before_anything_is_written(written, tmp_path):
    """config.json is copied: it is checked as transformers' classes take it (heads, sizes,
    finite numbers), then loaded by transformers itself, before a byte is written."""
    from cli_helpers import assert_cli_error, in_process

    copy = tmp_path / "bert"
    shutil.copytree(written / "bert-mlm", copy)
    good = json.loads((copy / "config.json").read_text())
    out = tmp_path / "hf"
    cases = [
        ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer, not 0"),
        ({"num_attention_heads": 3}, "hidden_size 16 is not a multiple of num_attention_heads 3"),
        ({"layer_norm_eps": float("nan")}, "NaN is not a number JSON has"),
        # Past the checks of the presets' own: transformers' BertConfig takes an int or None.
        ({"pad_token_id": "zero"}, "transformers refuses the config.json made of it"),
    ]
    for change, message in cases:
        (copy / "config.json").write_text(json.dumps({**good, **change}))
        before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
        proc = in_process("export", copy / "tf_model.h5", out, "--preset", "hf-tf2")
        assert_cli_error(proc, str(copy / "config.json"), message)
        assert not out.exists()
        assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before
