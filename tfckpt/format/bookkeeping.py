"""Training bookkeeping: the tensors that count or steer training rather than hold the
model, which a cast of the weights leaves in their dtype.

TensorFlow and Keras make these in a dtype of their own, whatever the model's: a float16
Keras model keeps its metrics' totals and counts and its optimizer's learning rate and
other hyperparameters in float32, its step in int64; TF1's ``AdamOptimizer`` makes
``beta1_power`` and ``beta2_power`` float32 whatever its variables' dtype (it casts them
to that dtype where it uses them). TensorFlow restores a variable only from a tensor of
its own dtype, so a checkpoint whose bookkeeping was cast with the weights restores into
no model.

Which tensors they are:

- A TF2 checkpoint, by its object graph:

  - ``save_counter``, the root's child every ``tf.train.Checkpoint.save`` adds;
  - metrics: every object reached through an edge ``metrics`` or ``layer_metrics`` of an
    object reached through an edge ``keras_api`` (a tf.keras 2 SavedModel lists its
    compiled metrics there: ``keras_api/metrics/0/count``), and everything beneath it;
  - an optimizer's own scalars: each scalar only the objects behind an ``optimizer`` edge
    reach that is none of their slots (see :mod:`tfckpt.format.optimizers`): its step
    (``iter``, ``_iterations``), learning rate, ``beta_1``, ``decay``..., a loss scale.
    Not a Nadam's product of momentum factors (``_u_product``; ``momentum_cache`` of a
    legacy one), which Keras makes in the dtype of the variables it trains.

- A checkpoint without one (TF1, name-based): a tensor whose name's last part is
  ``global_step``, ``beta1_power`` or ``beta2_power``, the last two also with the ``_N``
  TensorFlow appends for a second optimizer's (``beta1_power_1``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from tfckpt.format.objectgraph import ObjectGraph, attribute_tensors
from tfckpt.format.optimizers import optimizer_state

SAVE_COUNTER = "save_counter"  # the root's child every tf.train.Checkpoint.save() adds
KERAS_API = "keras_api"  # a tf.keras 2 SavedModel's extra attributes of a layer or model
METRIC_EDGES = frozenset({"metrics", "layer_metrics"})  # a keras_api's metric objects
OPTIMIZER_EDGE = "optimizer"
# A Nadam's running product of momentum factors: made in its variables' dtype.
FOLLOWS_VARIABLES = frozenset({"_u_product", "momentum_cache"})
# TF1: the step, and an AdamOptimizer's powers of its betas (``_N``: a second optimizer's).
TF1_NAME = re.compile(r"(?:^|/)(?:global_step|beta[12]_power(?:_\d+)?)$")


def tf1_bookkeeping(names: Iterable[str]) -> set[str]:
    """The names among ``names`` (of a checkpoint without an object graph) that are
    training bookkeeping (see the module's text).

    >>> sorted(tf1_bookkeeping(["dense/kernel", "global_step", "beta1_power_1"]))
    ['beta1_power_1', 'global_step']
    """
    # A substring test first: most names end in neither, and a regex per name of a
    # checkpoint of many tensors costs more than the rest of its plan.
    return {n for n in names if ("_power" in n or n.endswith("global_step")) and TF1_NAME.search(n)}


def tf2_bookkeeping(
    graph: ObjectGraph, present: set[str], is_scalar: Callable[[str], bool]
) -> set[str]:
    """The tensors among ``present`` (the checkpoint's names) that ``graph``'s structure
    marks as training bookkeeping (see the module's text); ``is_scalar`` tells whether a
    tensor of ``present`` is a scalar."""
    nodes = graph.nodes
    out: set[str] = set()

    def add_tensors_of(node_ids: Iterable[int]) -> None:
        for i in node_ids:
            for a in nodes[i].attributes:
                out.update(t for t in attribute_tensors(a.checkpoint_key, present) if t in present)

    add_tensors_of(c.node_id for c in nodes[0].children if c.local_name == SAVE_COUNTER)
    apis = {c.node_id for n in nodes for c in n.children if c.local_name == KERAS_API}
    metrics = [c.node_id for i in apis for c in nodes[i].children if c.local_name in METRIC_EDGES]
    add_tensors_of(_beneath(graph, metrics))
    state = optimizer_state(graph)
    following = {
        a.checkpoint_key
        for i in _beneath(graph, _optimizers(graph))
        for c in nodes[i].children
        if c.local_name in FOLLOWS_VARIABLES
        for a in nodes[c.node_id].attributes
    }
    for key in [*state.steps, *sorted(state.other)]:
        if key not in following:
            out.update(t for t in attribute_tensors(key, present) if t in present and is_scalar(t))
    return out


def _optimizers(graph: ObjectGraph) -> list[int]:
    return sorted(
        {c.node_id for n in graph.nodes for c in n.children if c.local_name == OPTIMIZER_EDGE}
    )


def _beneath(graph: ObjectGraph, starts: Iterable[int]) -> set[int]:
    """``starts`` and every object they reach, not through an optimizer."""
    nodes = graph.nodes
    seen = set(starts)
    todo = list(seen)
    while todo:
        for c in nodes[todo.pop()].children:
            if c.node_id not in seen and c.local_name != OPTIMIZER_EDGE:
                seen.add(c.node_id)
                todo.append(c.node_id)
    return seen
