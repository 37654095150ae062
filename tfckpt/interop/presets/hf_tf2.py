"""hf-tf2: Hugging Face's TensorFlow models (``tf_model.h5``, ``config.json``) to the
PyTorch model of the same architecture.

transformers' TF classes name every weight after the PyTorch one, by convention rather
than by a list: the model's scope first (``tf_bert_model/``), list items as ``_._N``
(``layer_._0``: PyTorch's ``layer.0``), a component ``a___b`` standing for ``b`` (two
TF layers for one PyTorch module: ``mlm___cls`` is ``cls``), and Keras's leaf names
(``kernel``, ``embeddings``, ``gamma``, ``beta``) for PyTorch's ``weight`` and ``bias``.
So the rules are made from the source's own names and shapes: each name's PyTorch name
(exact renames), each Dense ``kernel`` transposed to PyTorch's ``[out, in]`` (a 3-D or
4-D convolution kernel to ``[out, in, k...]``), and the ``[1, n]`` biases of transformers'
TF ``Conv1D`` (GPT-2's) made ``[n]``. These are the rules of transformers' own
converter (``convert_tf_weight_name_to_pt_weight_name``, up to release 4.57).

The config is the ``config.json`` beside the file, which transformers wrote with the
weights: it is copied, its ``architectures`` named as PyTorch names them (without
``TF``). A base model (``BertModel``, ``GPT2Model``) keeps no scope of its own in
PyTorch: its main layer's name (``bert.``) is cut from every name, as transformers does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tfckpt.errors import CheckpointError
from tfckpt.interop.presets.family import Preset, Shapes

# transformers' convention for a component standing for another, and for list items.
_STANDS_FOR = re.compile(r"/[^/]*___([^/]*)/")
_LEAVES = {"kernel": "weight", "embeddings": "weight", "gamma": "weight", "beta": "bias"}
_SEPARABLE = ("pointwise_kernel", "depthwise_kernel")
# The axes of a TF kernel of each rank in PyTorch's order: (k, in, out) -> (out, in, k);
# (kh, kw, in, out) -> (out, in, kh, kw); a matrix transposed.
_KERNEL_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 2, 0, 1)}
# A PyTorch class with a task head has one of these in its name; the others are base models.
_HEADS = ("For", "Head", "Heads")
_MODEL_SCOPE = re.compile(r"tf[a-z0-9_]*/")


def pytorch_name(name: str) -> tuple[str, str | None]:
    """The PyTorch name of a TF weight ``name`` (without ``:0``), and how its axes change:
    ``"kernel"`` (a Dense or convolution kernel), ``"reverse"`` (separable convolutions'
    kernels, TransfoXL's ``emb_projs``/``out_projs``: all axes reversed) or None.

    >>> pytorch_name("tf_bert_model/bert/encoder/layer_._0/attention/self/query/kernel")
    ('bert.encoder.layer.0.attention.self.query.weight', 'kernel')
    """
    n = _STANDS_FOR.sub(r"/\1/", name)
    n = re.sub(r"//+", "/", n.replace("_._", "/"))
    parts = n.split("/")
    if len(parts) > 1:
        parts = parts[1:]  # the model's own scope
    leaf = parts[-1]
    how = None
    if leaf == "kernel":
        how = "kernel"
    elif leaf in _SEPARABLE or "emb_projs" in parts or "out_projs" in parts:
        how = "reverse"
    if leaf in _LEAVES:
        parts[-1] = _LEAVES[leaf]
    elif leaf in _SEPARABLE:
        parts[-1] = leaf.replace("_kernel", ".weight")
    return ".".join(parts), how


def axes(how: str | None, rank: int) -> tuple[int, ...] | None:
    """The permutation :func:`pytorch_name`'s ``how`` means for a tensor of ``rank`` axes."""
    if how is None or rank < 2:
        return None
    if how == "kernel" and rank in _KERNEL_AXES:
        return _KERNEL_AXES[rank]
    return tuple(reversed(range(rank)))


def architecture(config: Mapping[str, Any]) -> str:
    """The PyTorch class ``config.json`` names (``TFBertForMaskedLM`` is ``BertForMaskedLM``)."""
    archs = config.get("architectures")
    if not isinstance(archs, list) or len(archs) != 1 or not isinstance(archs[0], str):
        raise CheckpointError(
            "config.json must name one architecture (architectures: [...]); give it with "
            "--config-value 'architectures=[\"BertForMaskedLM\"]'"
        )
    arch = archs[0]
    return arch[2:] if arch.startswith("TF") and arch[2:3].isupper() else arch


def is_base_model(arch: str) -> bool:
    """Whether ``arch`` is a family's base model (``BertModel``), which has no task head."""
    return arch.endswith("Model") and not any(h in arch for h in _HEADS)


def source_rules(
    sources: Mapping[str, tuple[int, ...]], config: Mapping[str, Any]
) -> tuple[dict[str, Any], str]:
    """The Options fields that make ``sources`` (TF name -> shape) the PyTorch model's
    tensors, and that model's class: exact renames, permutes and reshapes, by name."""
    arch = architecture(config)
    if not config.get("model_type"):
        raise CheckpointError("config.json has no model_type: not one transformers wrote")
    names = {src: pytorch_name(src) for src in sources}
    firsts = {new.split(".", 1)[0] for new, _ in names.values()}
    cut = ""
    if is_base_model(arch) and len(firsts) == 1 and all("." in n for n, _ in names.values()):
        cut = f"{firsts.pop()}."  # the main layer's scope, which the base model lacks
    renames: dict[str, str] = {}
    by_axes: dict[tuple[int, ...], list[str]] = {}
    reshapes: list[tuple[str, list[int]]] = []
    for src, (new, how) in names.items():
        new = new[len(cut) :] if cut and new.startswith(cut) else new
        if new in renames.values():
            clash = next(s for s, n in renames.items() if n == new)
            raise CheckpointError(f"{clash!r} and {src!r} would both be named {new!r}")
        renames[src] = new
        shape = tuple(sources[src])
        perm = axes(how, len(shape))
        if perm is not None:
            by_axes.setdefault(perm, []).append(new)
        elif new.endswith(".bias") and len(shape) > 1 and all(d == 1 for d in shape[:-1]):
            reshapes.append((f"^{re.escape(new)}$", [shape[-1]]))  # TF Conv1D's [1, n] bias
    permutes = [
        (f"^(?:{'|'.join(re.escape(n) for n in news)})$", list(perm))
        for perm, news in by_axes.items()
    ]
    return {"rename_exact": renames, "permute": permutes, "reshape": reshapes}, arch


def _architecture_from_shapes(shapes: Shapes) -> str:
    raise CheckpointError("hf-tf2 takes its architecture from config.json")  # never asked


def _config(config: Mapping[str, Any], shapes: Shapes, arch: str) -> dict:
    """config.json as transformers wrote it, its architecture named as PyTorch names it."""
    out = dict(config)
    out["architectures"] = [arch]
    return out


def _recognises(names: list[str]) -> bool:
    """Names scoped as transformers' TF models scope them: the model's Keras name first
    (``tf_bert_model``, ``tfgpt2lm_head_model``: its class's, snake-cased), list items as
    ``_._N``."""
    scoped = any(_MODEL_SCOPE.match(n) for n in names)
    return scoped and any("_._" in n for n in names)


PRESET = Preset(
    "hf-tf2",
    "Hugging Face's TensorFlow models (tf_model.h5 and its config.json) to transformers' "
    "PyTorch model of the same architecture",
    (),
    ("config.json",),
    _architecture_from_shapes,
    _config,
    recognises=_recognises,
    from_source=source_rules,
)
