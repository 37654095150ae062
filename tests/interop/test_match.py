"""tfckpt match: pairing a checkpoint's tensors with a target layout, and the rules file.

The ground truth is the presets': BERT and GPT-2 checkpoints with the releases' names
(``tests/bert_release.py``, ``tests/gpt2_release.py``, written by tfckpt.save: no
TensorFlow) are exported by ``export_preset``; that safetensors file is the target and
the preset's renames are the pairs to find. Copies of the sources under other names
(a consistent scheme, random words with or without the block numbers) and stored in
other orders must pair back as far as names, blocks and order can tell, and say so by
their confidence where they cannot. The rules written are exported and compared with
the preset's file by safetensors' own loader.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import string

import albert_release
import bert_release
import electra_release
import gpt2_release
import numpy as np
import pytest
import t5_release
from cli_helpers import assert_cli_error, in_process

import tfckpt
from tfckpt._proto.trackable_object_graph_pb2 import TrackableObjectGraph
from tfckpt.checkpoint.writer import BundleWriter
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY
from tfckpt.interop.matching import match
from tfckpt.interop.pairing import assign
from tfckpt.interop.presets import export_preset
from tfckpt.rewrite.options import Options
from tfckpt.rewrite.rules import NameRules
from tfckpt.rewrite.rulesfile import load_rules

load_file = pytest.importorskip("safetensors.numpy").load_file

VALUE = ".ATTRIBUTES/VARIABLE_VALUE"


# family: (preset, the release's values, checkpoint file, its config file and text)
RELEASES = {
    "bert": lambda: (
        "hf-bert",
        bert_release.weights("pretraining"),
        "bert_model.ckpt",
        ("bert_config.json", json.dumps(bert_release.CONFIG)),
    ),
    "gpt2": lambda: (
        "hf-gpt2",
        gpt2_release.weights(),
        "model.ckpt",
        ("hparams.json", json.dumps(gpt2_release.HPARAMS)),
    ),
    "albert": lambda: (
        "hf-albert",
        albert_release.weights("classifier"),
        albert_release.FILE,
        ("albert_config.json", json.dumps(albert_release.CONFIGS["classifier"])),
    ),
    "electra": lambda: ("hf-electra", electra_release.weights(), electra_release.FILE, None),
    "t5.1.1": lambda: (
        "hf-t5",
        t5_release.weights("t5.1.1"),
        "model.ckpt-1000",
        ("operative_config.gin", t5_release.gin_config("t5.1.1")),
    ),
}


def released(tmp_path, family: str) -> tuple[str, dict, dict[str, str]]:
    """(prefix, values, preset renames) of a release checkpoint with its config, and the
    preset's export of it as ``tmp_path/hf/model.safetensors``."""
    preset, values, file, config = RELEASES[family]()
    prefix = str(tmp_path / "release" / file)
    tfckpt.save(values, prefix)
    if config is not None:
        (tmp_path / "release" / config[0]).write_text(config[1])
    sm = export_preset(prefix, str(tmp_path / "hf"), preset, dry_run=True)
    export_preset(prefix, str(tmp_path / "hf"), preset)
    return prefix, values, {t["name"]: t["new_name"] for t in sm.tensors}


def stored(values: dict, prefix: str, order: list[str], names: dict[str, str]) -> str:
    """A checkpoint of ``values[n]`` under ``names[n]``, values stored in ``order``."""
    with BundleWriter(prefix) as w:
        for n in order:
            w.add(names[n], values[n])
    return prefix


def found(m, renamed: dict[str, str]) -> dict[str, str]:
    """The pairs as {release name: target}, through the copy's ``renamed`` names."""
    back = {new: old for old, new in renamed.items()}
    return {back[p.source.name]: p.target.name for p in m.pairs}


def assert_same_export(prefix: str, rules: str, tmp_path) -> None:
    """Exporting ``prefix`` with the rules file gives the preset's file, bit for bit."""
    out = str(tmp_path / "out.safetensors")
    tfckpt.export(prefix, out, **load_rules(rules))
    got, want = load_file(out), load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert got[k].tobytes() == want[k].tobytes(), k


def words(rng: random.Random, n: int = 6) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(n))


# ---------------------------------------------------------------- the releases' names


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_release_names_pair_as_the_preset_does_and_export_the_same_file(family, tmp_path):
    prefix, _, truth = released(tmp_path, family)
    m = match(prefix, str(tmp_path / "hf" / "model.safetensors"))
    assert {p.source.name: p.target.name for p in m.pairs} == truth
    assert not m.unpaired and not m.unfilled
    assert min(p.confidence for p in m.pairs) > 0.5
    training = {n for n, _ in m.excluded}
    assert "global_step" in training and all(n not in truth for n in training)
    rules = m.write(tmp_path / "rules.toml")
    text = open(rules).read()
    assert text.count("\n[[map]]") == len(truth) and re.search(r"\n# [01]\.\d\d  shape \[", text)
    if family == "bert":
        assert "'/adam_[mv]$'," in text  # one pattern for a kind of slot
        kernel = next(
            p for p in m.pairs if p.source.name.endswith("layer_0/attention/self/query/kernel")
        )
        assert kernel.permute == (1, 0) and "square, transposed" in kernel.why
    else:
        c_proj = next(p for p in m.pairs if p.source.name == "model/h1/attn/c_proj/w")
        assert c_proj.squeeze and c_proj.permute is None  # [1,16,16]: squeezed, not transposed
        assert "square, kept as stored" in c_proj.why
    assert_same_export(prefix, rules, tmp_path)


@pytest.mark.parametrize("family", ["albert", "electra", "t5.1.1"])
def test_every_preset_source_renamed_and_shuffled_pairs_back(family, tmp_path):
    """Each preset's source, as the release names it and as a copy under other names
    (another separator, a prefix) stored in a shuffled order, pairs with the preset's
    export as the preset maps it, and the rules written export the same file."""
    prefix, values, truth = released(tmp_path, family)
    target = str(tmp_path / "hf" / "model.safetensors")
    m = match(prefix, target)
    assert {p.source.name: p.target.name for p in m.pairs} == truth
    # What the preset leaves out but training state (ELECTRA's generator) is unpaired.
    training = {n for n, _ in m.excluded}
    assert {t.name for t in m.unpaired} == set(values) - set(truth) - training
    assert not m.unfilled
    assert_same_export(prefix, m.write(tmp_path / "rules.toml"), tmp_path)
    renamed = {n: "net." + n.replace("/", ".") for n in values}
    order = sorted(values)
    random.Random(3).shuffle(order)
    copy = stored(values, str(tmp_path / "copy" / "model"), order, renamed)
    m = match(copy, target)
    back = {new: old for old, new in renamed.items()}
    wrong = [p for p in m.pairs if truth[back[p.source.name]] != p.target.name]
    assert len(m.pairs) == len(truth) and not m.unfilled
    # What names cannot tell apart and a shuffled order cannot either (ALBERT's
    # LayerNorm and LayerNorm_1 of one layer: attention's or the feed-forward's) is
    # paired as a guess, and says so: only there, and with a confidence near zero.
    assert all(p.confidence < 0.1 and "close to" in p.why for p in wrong)
    assert {re.sub(r".*\.(LayerNorm(_1)?)\..*", r"\1", p.source.name) for p in wrong} <= {
        "LayerNorm",
        "LayerNorm_1",
    }
    assert bool(wrong) == (family == "albert")


def bert_scheme(name: str) -> str:
    """Another codebase's names for BERT's tensors: other words, blocks from 1."""
    for old, new in [
        ("attention/self/query/", "attn/q/"),
        ("attention/self/key/", "attn/k/"),
        ("attention/self/value/", "attn/v/"),
        ("attention/output/dense/", "attn/o/"),
        ("attention/output/LayerNorm/", "attn_norm/"),
        ("intermediate/dense/", "mlp/up/"),
        ("output/dense/", "mlp/out/"),
        ("output/LayerNorm/", "mlp_norm/"),
        ("embeddings/LayerNorm/", "embed/norm/"),
        ("embeddings/word_embeddings", "embed/word/embedding"),
        ("embeddings/position_embeddings", "embed/pos/embedding"),
        ("embeddings/token_type_embeddings", "embed/segment/embedding"),
        ("cls/predictions/transform/dense/", "lm/transform/linear/"),
        ("cls/predictions/transform/LayerNorm/", "lm/transform/norm/"),
        ("cls/predictions/output_bias", "lm/bias"),
        ("cls/seq_relationship/output_", "nsp/"),
        ("pooler/dense/", "pool/proj/"),
    ]:
        name = name.replace(old, new)
    name = re.sub(r"encoder/layer_(\d+)/", lambda g: f"enc/L{int(g[1]) + 1}/", name)
    name = re.sub(r"/kernel$|/weights$", "/w", name)
    return re.sub(r"/gamma$", "/g", re.sub(r"/beta$|/bias$", "/b", name.replace("bert/", "net/")))


def gpt2_scheme(name: str) -> str:
    name = re.sub(r"model/h(\d+)/", lambda g: f"gpt/blocks/{int(g[1]):03d}/", name)
    for old, new in [
        ("model/wte", "gpt/tokens/embedding"),
        ("model/wpe", "gpt/positions/embedding"),
        ("model/ln_f/", "gpt/final_norm/"),
        ("ln_1/", "norm1/"),
        ("ln_2/", "norm2/"),
        ("attn/c_attn/", "attention/qkv/"),
        ("attn/c_proj/", "attention/proj/"),
        ("mlp/c_fc/", "ffn/fc/"),
        ("mlp/c_proj/", "ffn/proj/"),
    ]:
        name = name.replace(old, new)
    return re.sub(r"/w$", "/kernel", re.sub(r"/g$", "/scale", re.sub(r"/b$", "/bias", name)))


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_names_of_another_scheme_pair_back_whatever_order_blocks_are_stored_in(family, tmp_path):
    prefix, values, truth = released(tmp_path, family)
    scheme = bert_scheme if family == "bert" else gpt2_scheme
    renamed = {n: scheme(n) for n in truth}
    assert len(set(renamed.values())) == len(renamed) and renamed != {n: n for n in truth}
    # Block 1 stored before block 0: the order says one thing, the numbers another.
    order = sorted(truth, key=lambda n: ("layer_0" in n or "/h0/" in n, n))
    copy = stored(values, str(tmp_path / "copy" / "model"), order, renamed)
    m = match(copy, str(tmp_path / "hf" / "model.safetensors"))
    assert found(m, renamed) == truth
    assert not m.excluded and not m.unpaired and not m.unfilled
    assert_same_export(copy, m.write(tmp_path / "rules.toml"), tmp_path)


def test_a_target_of_another_float_dtype_gives_the_cast(tmp_path):
    prefix, _, truth = released(tmp_path, "gpt2")
    export_preset(prefix, str(tmp_path / "hf"), "hf-gpt2", cast="float16", overwrite=True)
    m = match(prefix, str(tmp_path / "hf"))
    assert m.cast == "float16" and {p.target.dtype for p in m.pairs} == {"float16"}
    rules = m.write(tmp_path / "rules.toml")
    assert "\ncast = 'float16'\n" in open(rules).read()
    assert_same_export(prefix, rules, tmp_path)


# ---------------------------------------------------------------- names that say nothing


def test_random_names_stored_in_the_original_order_pair_back_by_order(tmp_path):
    prefix, values, truth = released(tmp_path, "bert")
    rng = random.Random(7)
    renamed = {n: f"{words(rng)}/{words(rng)}" for n in truth}
    copy = stored(values, str(tmp_path / "copy" / "model"), sorted(truth), renamed)
    m = match(copy, str(tmp_path / "hf" / "model.safetensors"))
    assert found(m, renamed) == truth  # order, the tie-breaker, decided the ties
    assert m.order_trust > 0.3
    tied = [p for p in m.pairs if p.source.shape == (16, 16)]
    assert len(tied) == 10 and all("decided by order" in p.why for p in tied)
    assert all(0.1 < p.confidence < 0.5 for p in tied)  # names said nothing, blocks neither
    # Only one of its shape: sure of the pair, not of what the names mean.
    word = next(p for p in m.pairs if p.target.name.endswith("word_embeddings.weight"))
    assert 0.3 < word.confidence < 0.8 and "no other candidate" in word.why
    assert_same_export(copy, m.write(tmp_path / "rules.toml"), tmp_path)


def test_random_names_stored_shuffled_say_which_pairs_are_guesses(tmp_path):
    prefix, values, truth = released(tmp_path, "bert")
    rng = random.Random(11)
    order = sorted(truth)
    rng.shuffle(order)
    plain = {n: f"{words(rng)}/{words(rng)}" for n in truth}
    m = match(
        stored(values, str(tmp_path / "a" / "m"), order, plain),
        str(tmp_path / "hf" / "model.safetensors"),
    )
    pairs = found(m, plain)
    assert m.order_trust < 0.2
    back = {new: old for old, new in plain.items()}
    wrong = [p for p in m.pairs if truth[back[p.source.name]] != p.target.name]
    assert wrong and max(p.confidence for p in wrong) < 0.05
    # A size no other tensor has: the one candidate, whatever the names and order.
    unique = [n for n in truth if sum(values[k].size == values[n].size for k in truth) == 1]
    assert unique and all(pairs[n] == truth[n] for n in unique)
    # With the block numbers kept, the blocks are right even where the rest is a guess.
    numbered = {
        n: re.sub(r".*layer_(\d+)/.*", lambda g: f"{words(rng)}/blk{g[1]}/{words(rng)}", n)
        if "layer_" in n
        else plain[n]
        for n in truth
    }
    m = match(
        stored(values, str(tmp_path / "b" / "m"), order, numbered),
        str(tmp_path / "hf" / "model.safetensors"),
    )
    for old, new in found(m, numbered).items():
        assert re.findall(r"layer_(\d+)", old) == re.findall(r"layer\.(\d+)", new), (old, new)


# ---------------------------------------------------------------- other targets


KERAS_WEIGHTS = [  # [(w.path, list(w.shape)) for w in model.weights] of a Keras 3 model
    ("d1/kernel", [3, 8]),
    ("d1/bias", [8]),
    ("bn/gamma", [8]),
    ("bn/beta", [8]),
    ("bn/moving_mean", [8]),
    ("bn/moving_variance", [8]),
    ("out/kernel", [8, 2]),
    ("out/bias", [2]),
]


def test_a_keras_weight_list_as_json_or_given_in_python(tmp_path):
    rng = np.random.default_rng(1)
    source = {
        "layer1/weights": rng.standard_normal((3, 8)).astype(np.float32),
        "layer1/biases": np.ones(8, np.float32),
        "bn1/gamma": np.full(8, 2, np.float32),
        "bn1/beta": np.full(8, 3, np.float32),
        "bn1/moving_mean": np.full(8, 4, np.float32),
        "bn1/moving_variance": np.full(8, 5, np.float32),
        "layer2/weights": rng.standard_normal((8, 2)).astype(np.float32),
        "layer2/biases": np.ones(2, np.float32),
        "layer2/weights/Momentum": np.zeros((8, 2), np.float32),
    }
    prefix = tfckpt.save(source, str(tmp_path / "tf1" / "model"))
    (tmp_path / "list.json").write_text(json.dumps(KERAS_WEIGHTS))
    (tmp_path / "dict.json").write_text(json.dumps(dict(KERAS_WEIGHTS)))
    given = match(prefix, KERAS_WEIGHTS)
    want = dict(
        zip(
            ["layer1/weights", "layer1/biases", "bn1/gamma", "bn1/beta"],
            [n for n, _ in KERAS_WEIGHTS],
        )
    )
    want |= {"bn1/moving_mean": "bn/moving_mean", "bn1/moving_variance": "bn/moving_variance"}
    want |= {"layer2/weights": "out/kernel", "layer2/biases": "out/bias"}
    for target in (str(tmp_path / "list.json"), str(tmp_path / "dict.json")):
        m = match(prefix, target)
        assert {p.source.name: p.target.name for p in m.pairs} == want
        assert [p.target.name for p in m.pairs] == [n for n, _ in KERAS_WEIGHTS]  # the list's order
        assert m.excluded == [("layer2/weights/Momentum", "training state: optimizer slot")]
    assert [(p.source, p.target.name) for p in given.pairs] == [
        (p.source, p.target.name) for p in m.pairs
    ]
    tfckpt.export(
        prefix, str(tmp_path / "k.safetensors"), **load_rules(m.write(tmp_path / "k.toml"))
    )
    got = load_file(str(tmp_path / "k.safetensors"))
    assert {k: list(v.shape) for k, v in got.items()} == dict(KERAS_WEIGHTS)
    assert got["bn/moving_variance"].tolist() == [5] * 8


def tf2_checkpoint(prefix: str, values: dict[str, np.ndarray]) -> str:
    """A TF2 checkpoint as ``tf.train.Checkpoint(model=m, optimizer=opt)`` writes it for
    a model of two dense layers: the optimizer's step and one slot, the save counter."""
    graph = TrackableObjectGraph()
    spec = [
        ([("model", 1), ("optimizer", 2), ("save_counter", 3)], None, []),
        ([("layer_with_weights-0", 4), ("layer_with_weights-1", 5)], None, []),
        ([("iter", 6)], None, [(7, "m", 10)]),
        ([], "save_counter", []),
        ([("kernel", 7), ("bias", 8)], None, []),
        ([("kernel", 9), ("bias", 11)], None, []),
        ([], "optimizer/iter", []),
        ([], "model/layer_with_weights-0/kernel", []),
        ([], "model/layer_with_weights-0/bias", []),
        ([], "model/layer_with_weights-1/kernel", []),
        ([], "model/layer_with_weights-0/kernel/.OPTIMIZER_SLOT/optimizer/m", []),
        ([], "model/layer_with_weights-1/bias", []),
    ]
    tensors = {OBJECT_GRAPH_KEY: np.array(b"", dtype=object)}
    for children, path, slots in spec:
        node = graph.nodes.add()
        for name, i in children:
            node.children.add(local_name=name, node_id=i)
        for original, slot, i in slots:
            node.slot_variables.add(
                original_variable_node_id=original, slot_name=slot, slot_variable_node_id=i
            )
        if path is not None:
            key = f"{path}/{VALUE}"
            node.attributes.add(name="VARIABLE_VALUE", full_name=path, checkpoint_key=key)
            tensors[key] = values[path]
    tensors[OBJECT_GRAPH_KEY] = np.array(graph.SerializeToString(), dtype=object)
    return tfckpt.save(tensors, prefix)


def test_a_tf2_checkpoint_as_target_and_as_source(tmp_path):
    rng = np.random.default_rng(2)
    w0, w1 = (
        rng.standard_normal((4, 6)).astype(np.float32),
        rng.standard_normal((6, 3)).astype(np.float32),
    )
    tf1 = tfckpt.save(
        {"dense/kernel": w0, "dense/bias": np.ones(6, np.float32), "dense_1/kernel": w1,
         "dense_1/bias": np.ones(3, np.float32), "dense/kernel/Adam": w0, "dense/kernel/Adam_1": w0,
         "beta1_power": np.float32(0.9), "global_step": np.int64(3)},
        str(tmp_path / "tf1" / "model.ckpt"),
    )  # fmt: skip
    p = "model/layer_with_weights-"
    tf2 = tf2_checkpoint(
        str(tmp_path / "tf2" / "ckpt-1"),
        {f"{p}0/kernel": np.zeros((4, 6), np.float32), f"{p}0/bias": np.zeros(6, np.float32),
         f"{p}1/kernel": np.zeros((6, 3), np.float32), f"{p}1/bias": np.zeros(3, np.float32),
         f"{p}0/kernel/.OPTIMIZER_SLOT/optimizer/m": np.zeros((4, 6), np.float32),
         "optimizer/iter": np.int64(9), "save_counter": np.int64(1)},
    )  # fmt: skip
    m = match(tf1, tf2)
    pairs = {pr.source.name: pr.target.name for pr in m.pairs}
    assert pairs == {
        "dense/kernel": f"{p}0/kernel",
        "dense/bias": f"{p}0/bias",
        "dense_1/kernel": f"{p}1/kernel",
        "dense_1/bias": f"{p}1/bias",
    }
    assert not m.unfilled  # the target's optimizer state and counter are not names to fill
    assert {n for n, _ in m.excluded} == {
        "dense/kernel/Adam",
        "dense/kernel/Adam_1",
        "beta1_power",
        "global_step",
    }
    out = str(tmp_path / "tf2names.safetensors")
    tfckpt.export(tf1, out, **load_rules(m.write(tmp_path / "to_tf2.toml")))
    assert {k: v.shape for k, v in load_file(out).items()} == {
        f"{p}0/kernel": (4, 6),
        f"{p}0/bias": (6,),
        f"{p}1/kernel": (6, 3),
        f"{p}1/bias": (3,),
    }
    # The other way: the TF2 checkpoint's optimizer state is left to export, its counter excluded.
    back = match(tf2, out)
    assert {pr.source.name for pr in back.pairs} == set(pairs.values())
    assert dict(back.excluded)["save_counter"] == "training state: step counter"
    assert dict(back.excluded)["optimizer/iter"].startswith("optimizer state")
    tfckpt.export(
        tf2, str(tmp_path / "back.safetensors"), **load_rules(back.write(tmp_path / "back.toml"))
    )
    assert sorted(load_file(str(tmp_path / "back.safetensors"))) == sorted(load_file(out))


# ---------------------------------------------------------------- what does not pair


def test_tensors_nothing_fits_are_excluded_and_listed_and_names_nothing_fills_too(tmp_path):
    prefix, values, truth = released(tmp_path, "bert")
    values = {**values, "extra/adapter": np.ones((7, 5), np.float32)}
    values.pop("cls/predictions/output_bias")
    extra = tfckpt.save(values, str(tmp_path / "extra" / "model"))
    m = match(extra, str(tmp_path / "hf" / "model.safetensors"))
    assert [t.name for t in m.unpaired] == ["extra/adapter"]
    assert [t.name for t in m.unfilled] == ["cls.predictions.bias"]
    assert {p.source.name: p.target.name for p in m.pairs} == {
        k: v for k, v in truth.items() if k in values
    }
    text = open(m.write(tmp_path / "r.toml")).read()
    assert "'^extra/adapter$'," in text
    tail = text[text.index("# Source tensors no target name takes") :]
    assert "#   extra/adapter  [7,5]" in tail and "#   cls.predictions.bias  [50]" in tail
    out = str(tmp_path / "o.safetensors")
    tfckpt.export(extra, out, **load_rules(tmp_path / "r.toml"))
    assert set(load_file(out)) == set(truth.values()) - {"cls.predictions.bias"}


def test_pairs_under_the_confidence_asked_for_are_left_for_review(tmp_path):
    prefix, values, truth = released(tmp_path, "bert")
    rng = random.Random(5)
    renamed = {n: f"{words(rng)}/{words(rng)}" for n in truth}
    copy = stored(values, str(tmp_path / "copy" / "model"), sorted(truth), renamed)
    m = match(copy, str(tmp_path / "hf" / "model.safetensors"))
    held = {p.source.name for p in m.pairs if p.confidence < 0.3}
    assert held and len(held) < len(m.pairs)
    text = m.rules(min_confidence=0.3)
    assert text.count("# [[map]]") == len(held) and text.count("\n[[map]]") == len(m.pairs) - len(
        held
    )
    (tmp_path / "held.toml").write_text(text)
    with pytest.raises(tfckpt.CheckpointError, match="no name_map rule") as e:
        tfckpt.export(copy, str(tmp_path / "o.safetensors"), **load_rules(tmp_path / "held.toml"))
    assert all(n in str(e.value) for n in held)
    best = max(p.confidence for p in m.pairs)
    with pytest.raises(tfckpt.CheckpointError, match=f"no pair reaches confidence .*{best:.2f}"):
        m.rules(min_confidence=min(1.0, best + 0.01))


def test_names_a_toml_file_cannot_take_plainly_are_escaped_and_checked(tmp_path):
    odd = {"it's/a\\b": np.ones((2, 3), np.float32), 'q"uote\tx': np.ones(4, np.float32)}
    prefix = tfckpt.save(odd, str(tmp_path / "odd" / "model"))
    m = match(prefix, [["tab\there", [3, 2]], ["new\nline", [4]]])
    want = {"it's/a\\b": "tab\there", 'q"uote\tx': "new\nline"}
    assert {p.source.name: p.target.name for p in m.pairs} == want
    rules = load_rules(m.write(tmp_path / "odd.toml"))
    naming = NameRules.of(Options(**rules))
    assert {n: naming.new_name(n) for n in want} == want
    comments = [line for line in open(tmp_path / "odd.toml") if line.startswith("#")]
    assert all(line.isprintable() for line in "".join(comments).splitlines())


def test_bad_targets_and_weight_lists_are_errors_naming_them(tmp_path):
    prefix = tfckpt.save({"w": np.ones(2, np.float32)}, str(tmp_path / "m"))
    for data, fragment in [
        ([], "at least one"),
        ([["w", [2, -1]]], "entry 1 is not a name and a shape"),
        ([["w", [True]]], "entry 1"),
        ({"w": "2"}, "entry 1"),
        ([["w", [2]], ["w", [2]]], "names it twice"),
        (42, "at least one"),
    ]:
        with pytest.raises(tfckpt.CheckpointError, match=fragment) as e:
            match(prefix, data)
        assert e.value.path == "the weight list given"
    with pytest.raises(tfckpt.CheckpointError, match="no tensor fits a name of"):
        match(prefix, [["w", [3]]]).rules()
    (tmp_path / "broken.json").write_text("[[")
    with pytest.raises(tfckpt.CheckpointError, match="not a JSON weight list") as e:
        match(prefix, str(tmp_path / "broken.json"))
    assert e.value.path == str(tmp_path / "broken.json")


def test_the_assignment_is_the_best_one():
    rng = np.random.default_rng(3)
    for _ in range(200):
        n, m = (int(k) for k in rng.integers(1, 6, 2))
        score = rng.integers(0, 4, (n, m)).astype(np.float64)
        rows, cols = assign(score)
        k = min(n, m)
        assert len(set(rows.tolist())) == len(set(cols.tolist())) == len(rows) == k
        if n <= m:
            best = max(
                sum(score[i, p[i]] for i in range(n)) for p in itertools.permutations(range(m), n)
            )
        else:
            best = max(
                sum(score[p[j], j] for j in range(m)) for p in itertools.permutations(range(n), m)
            )
        assert score[rows, cols].sum() == best


# ---------------------------------------------------------------- the command line


def test_the_command_prints_the_pairs_writes_the_rules_and_refuses_to_overwrite(tmp_path):
    prefix, _, truth = released(tmp_path, "gpt2")
    target = str(tmp_path / "hf" / "model.safetensors")
    rc, out, err = in_process("match", prefix, target)
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["SOURCE", "TARGET", "CONFIDENCE", "TRANSFORM"]
    row = next(line.split() for line in lines if line.startswith("model/h0/attn/c_attn/w "))
    assert row[1] == "transformer.h.0.attn.c_attn.weight" and row[3] == "squeeze"
    assert f"{len(truth)} pairs (0 under confidence 0.5)" in lines[-1]
    assert any(line.startswith("exclude   ") and "Adam slot" in line for line in lines)
    rules = str(tmp_path / "sub" / "gpt2.toml")  # a directory made for it
    # The directory transformers' save_pretrained writes stands for its model.safetensors.
    rc, out, err = in_process("match", prefix, str(tmp_path / "hf"), "-o", rules, "--json")
    assert rc == 0 and err.startswith(f"wrote {rules}")
    data = json.loads(out)
    assert {p["source"]: p["target"] for p in data["pairs"]} == truth
    before = open(rules).read()
    assert_cli_error(in_process("match", prefix, target, "-o", rules), rules, "already exists")
    assert open(rules).read() == before
    again = ("match", prefix, target, "-o", rules, "--overwrite", "--min-confidence", "0.9")
    assert in_process(*again)[0] == 0
    assert open(rules).read() != before and "# [[map]]" in open(rules).read()
    export = ("export", prefix, str(tmp_path / "o.safetensors"), "--rules", rules, "--dry-run")
    assert_cli_error(in_process(*export), "no name_map rule")


def test_the_command_says_in_one_line_what_is_wrong(tmp_path):
    prefix = tfckpt.save({"w": np.ones(2, np.float32)}, str(tmp_path / "m"))
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    (tmp_path / "bad.json").write_text('{"w": [2, "x"]}')
    for target, fragment in [
        (str(tmp_path / "missing.safetensors"), "no such file"),
        (str(tmp_path / "notes.txt"), "notes.txt"),
        (str(tmp_path / "bad.json"), "bad.json: weight list entry 1"),
    ]:
        assert_cli_error(in_process("match", prefix, target), fragment)
    assert_cli_error(
        in_process("match", prefix, prefix, "--min-confidence", "2"), "--min-confidence"
    )
    assert_cli_error(in_process("match", str(tmp_path / "nope"), prefix), "nope")
