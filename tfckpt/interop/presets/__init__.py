"""Presets: a research release's checkpoints into a directory Hugging Face loads.

A preset is data: a rules file shipped beside this module (``hf-bert.toml``: which
tensors, their names, their layouts) and a small translator of the release's own
config file (``bert_config.json``) into the ``config.json`` transformers reads, which
also names the architecture the checkpoint's tensors make. :func:`export_preset` runs
an export with them; every tensor the rules do not name is an error listing them all.

>>> tfckpt.interop.presets.export_preset("uncased_L-12_H-768_A-12/bert_model.ckpt", "hf/")
>>> transformers.AutoModelForPreTraining.from_pretrained("hf/")
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tfckpt.checkpoint.opening import open_checkpoint
from tfckpt.errors import CheckpointError
from tfckpt.interop.export import close_opened, plan_export
from tfckpt.io.storage import Storage, StorageOptions, normalize, storage_for
from tfckpt.rewrite.engine import Summary, execute
from tfckpt.rewrite.options import Options
from tfckpt.rewrite.rulesfile import load_rules, with_rules

HERE = os.path.dirname(os.path.abspath(__file__))
Shapes = Mapping[str, tuple[int, ...]]  # new name -> shape written


@dataclass(frozen=True)
class Preset:
    """One family's rules and config translation (see the module's text)."""

    name: str
    description: str
    markers: tuple[str, ...]  # source names that recognise the family (any of them)
    config_files: tuple[str, ...]  # the release's config, looked for beside the checkpoint
    architecture: Callable[[Shapes], str]  # the transformers class the weights make
    translate: Callable[[Mapping[str, Any], Shapes, str], dict]  # -> config.json
    # Per architecture, the source tensors it has no place for (left out): regexes.
    unused: Mapping[str, tuple[str, ...]]

    @property
    def rules_file(self) -> str:
        return os.path.join(HERE, f"{self.name}.toml")

    def rules(self) -> dict[str, Any]:
        """The :class:`~tfckpt.Options` fields of the preset's rules file."""
        return load_rules(self.rules_file)


def _bert_architecture(shapes: Shapes) -> str:
    """The BertFor* class whose weights ``shapes`` (new names) are."""
    if "qa_outputs.weight" in shapes:
        return "BertForQuestionAnswering"
    if "classifier.weight" in shapes:
        return "BertForSequenceClassification"
    if "cls.predictions.bias" in shapes:
        if "cls.seq_relationship.weight" in shapes:
            return "BertForPreTraining"
        return "BertForMaskedLM"
    return "BertModel"


# bert_config.json's keys are BertConfig's own names.
_BERT_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
)
# The release's activations by transformers' names: its "gelu" is the tanh approximation
# (google-research/bert modeling.py), which transformers calls "gelu_new".
_BERT_ACTIVATIONS = {"gelu": "gelu_new", "relu": "relu", "tanh": "tanh"}


def _bert_config(config: Mapping[str, Any], shapes: Shapes, arch: str) -> dict:
    missing = [k for k in _BERT_KEYS[:5] if k not in config]
    if missing:
        raise CheckpointError(f"the BERT config lacks {', '.join(missing)}")
    out: dict[str, Any] = {"architectures": [arch], "model_type": "bert"}
    out.update({k: config[k] for k in _BERT_KEYS if k in config})
    act = config.get("hidden_act", "gelu")
    if act not in _BERT_ACTIVATIONS:
        raise CheckpointError(f"hidden_act {act!r}: not one of {', '.join(_BERT_ACTIVATIONS)}")
    out["hidden_act"] = _BERT_ACTIVATIONS[act]
    out["layer_norm_eps"] = 1e-12  # the release's LayerNorm epsilon
    _check_shapes(
        shapes,
        {
            "bert.embeddings.word_embeddings.weight": (config["vocab_size"], config["hidden_size"]),
            "bert.encoder.layer.0.intermediate.dense.weight": (
                config["intermediate_size"],
                config["hidden_size"],
            ),
        },
    )
    layers = {n.split(".")[3] for n in shapes if n.startswith("bert.encoder.layer.")}
    if len(layers) != config["num_hidden_layers"]:
        raise CheckpointError(
            f"the config says {config['num_hidden_layers']} layers, the checkpoint holds "
            f"{len(layers)}"
        )
    if arch == "BertForSequenceClassification":
        labels = shapes["classifier.weight"][0]
        out["id2label"] = {str(i): f"LABEL_{i}" for i in range(labels)}
        out["label2id"] = {f"LABEL_{i}": i for i in range(labels)}
    return out


def _check_shapes(shapes: Shapes, want: Mapping[str, tuple[int, ...]]) -> None:
    for name, shape in want.items():
        if name in shapes and tuple(shapes[name]) != tuple(shape):
            raise CheckpointError(
                f"the config gives {name} the shape {list(shape)}, the checkpoint "
                f"{list(shapes[name])}"
            )


# hparams.json's keys, by transformers' GPT2Config names.
_GPT2_KEYS = {
    "n_vocab": "vocab_size",
    "n_ctx": "n_positions",
    "n_embd": "n_embd",
    "n_head": "n_head",
    "n_layer": "n_layer",
}


def _gpt2_config(config: Mapping[str, Any], shapes: Shapes, arch: str) -> dict:
    missing = [k for k in _GPT2_KEYS if k not in config]
    if missing:
        raise CheckpointError(f"the GPT-2 hparams lack {', '.join(missing)}")
    out: dict[str, Any] = {"architectures": [arch], "model_type": "gpt2"}
    out.update({new: config[old] for old, new in _GPT2_KEYS.items()})
    # The release's model.py: gelu's tanh approximation, layer norm epsilon 1e-5.
    out.update(activation_function="gelu_new", layer_norm_epsilon=1e-5)
    out.update(bos_token_id=config["n_vocab"] - 1, eos_token_id=config["n_vocab"] - 1)
    n = config["n_embd"]
    _check_shapes(
        shapes,
        {
            "transformer.wte.weight": (config["n_vocab"], n),
            "transformer.wpe.weight": (config["n_ctx"], n),
            "transformer.h.0.attn.c_attn.weight": (n, 3 * n),
        },
    )
    layers = {n.split(".")[2] for n in shapes if n.startswith("transformer.h.")}
    if len(layers) != config["n_layer"]:
        raise CheckpointError(
            f"the hparams say {config['n_layer']} layers, the checkpoint holds {len(layers)}"
        )
    return out


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "hf-bert",
            "Google's BERT (google-research/bert: pretraining, run_classifier, run_squad) "
            "to transformers' BertFor*",
            ("bert/embeddings/word_embeddings",),
            ("bert_config.json",),
            _bert_architecture,
            _bert_config,
            # run_squad's checkpoints keep the pretraining's pooler, which these lack.
            {a: ("^bert/pooler/",) for a in ("BertForQuestionAnswering", "BertForMaskedLM")},
        ),
        Preset(
            "hf-gpt2",
            "OpenAI's GPT-2 (openai/gpt-2) to transformers' GPT2LMHeadModel",
            ("model/wte",),
            ("hparams.json",),
            lambda shapes: "GPT2LMHeadModel",
            _gpt2_config,
            {},
        ),
    )
}


def find(name: str, names: list[str]) -> Preset:
    """The preset called ``name``, or with ``'auto'`` the one whose family the source
    ``names`` are of; an error naming the presets there are."""
    if name == "auto":
        found = [p for p in PRESETS.values() if any(m in names for m in p.markers)]
        if not found:
            raise CheckpointError(
                f"--preset auto: no preset recognises these tensors (presets: {', '.join(PRESETS)})"
            )
        return found[0]
    if name not in PRESETS:
        raise CheckpointError(f"no preset {name!r} (presets: {', '.join(PRESETS)}, auto)")
    return PRESETS[name]


def release_config(
    preset: Preset, config, store: Storage, directory: str, storage_options
) -> tuple[str, dict]:
    """The release's config file: ``config`` if given (a path or URL), else the first of
    the preset's names found in ``directory`` (the checkpoint's, on ``store``); its path
    and contents."""
    if config is not None:
        path = normalize(config)
        candidates = [(storage_for(path, storage_options), path)]
    else:
        candidates = [(store, store.join(directory, n)) for n in preset.config_files]
    for where, path in candidates:
        if config is None and not where.isfile(path):
            continue
        try:
            data = json.loads(where.read_bytes(path))
        except OSError as e:
            raise CheckpointError(f"cannot read the config: {e.strerror}", path=path) from None
        except ValueError as e:
            raise CheckpointError(f"the config is not JSON: {e}", path=path) from None
        if not isinstance(data, dict):
            raise CheckpointError("the config must be a JSON object", path=path)
        return path, data
    raise CheckpointError(
        f"{preset.name} needs the release's config ({' or '.join(preset.config_files)} "
        "beside the checkpoint, or --config)",
        path=directory,
    )


def export_preset(
    src,
    out_dir,
    preset: str = "auto",
    options: Options | None = None,
    *,
    config=None,
    storage_options: StorageOptions | None = None,
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
    **changes,
) -> Summary:
    """Export ``src`` with a preset into ``out_dir``: ``config.json`` and
    ``model.safetensors`` (sharded with ``max_shard_bytes``, with its
    ``model.safetensors.index.json``), committed together, as transformers'
    ``from_pretrained(out_dir)`` loads them.

    ``preset`` names one of :data:`PRESETS`, or ``'auto'``: the family the source's
    names are of. ``config``: the release's config file (by default looked for beside
    the checkpoint). ``options`` and keyword arguments as for :func:`tfckpt.export`
    (``cast``, ``max_shard_bytes``, ``overwrite``, ``allow_unmapped``...): their rules
    are tried before the preset's. The summary's ``warnings`` say which preset and
    architecture were chosen; unmapped tensors left out (``allow_unmapped``) are in
    ``skipped``.

    >>> export_preset("uncased_L-12_H-768_A-12/bert_model.ckpt", "hf/", cast="bfloat16")
    """
    with open_checkpoint(src, storage_options=storage_options) as ckpt:
        names = ckpt.keys()
        store, directory = ckpt.storage, ckpt.storage.dirname(ckpt.prefix)
    chosen = find(preset, names)
    opts = with_rules(Options.of(options, **changes), chosen.rules())
    out_dir = normalize(out_dir)
    out = storage_for(out_dir, storage_options).join(out_dir, "model.safetensors")
    p = plan_export(src, out, opts, storage_options=storage_options, format="safetensors")
    arch = chosen.architecture(_shapes(p))
    unused = chosen.unused.get(arch, ())
    if unused:  # planned again without them
        close_opened(p, src)
        opts = with_rules(opts, {"exclude": list(unused)})
        p = plan_export(src, out, opts, storage_options=storage_options, format="safetensors")
    try:
        shapes = _shapes(p)
        config_path, release = release_config(
            chosen, config, store, directory or ".", storage_options
        )
        try:
            translated = chosen.translate(release, shapes, arch)
        except CheckpointError as e:
            raise CheckpointError(e.detail, path=config_path) from None
        target = p.storage.join(p.storage.dirname(out), "config.json")
        if not opts.overwrite and p.storage.exists(target):
            raise CheckpointError("the output already exists (use overwrite)", path=target)
        p.output.extra = ((target, (json.dumps(translated, indent=2) + "\n").encode()),)
        note = f"preset {preset}: {chosen.name} ({arch})"
        summary = p.output.summary(p) if dry_run else execute(p, progress=progress)
    finally:
        close_opened(p, src)
    summary.warnings.append(note)
    return summary


def _shapes(p) -> dict[str, tuple[int, ...]]:
    """The shape each tensor of an export's plan is written in, by its new name."""
    return {o.pt.new_name: o.shape for _, outs in p.output.files for o in outs}
