"""An optimizer's state in a TF2 object graph: which tensor is which variable's slot.

Three layouts, as TensorFlow 2.21 and Keras write them:

- *slot variables* (tf.keras 2's ``tf_keras.optimizers.legacy``, TF2's own
  optimizers): the optimizer's node lists ``slot_variables`` (variable node, slot
  name ``m``/``v``/``momentum``..., slot node); its step is the child ``iter``.
- *Keras 3*: the optimizer's ``_momentums``, ``_velocities``... (every child that is
  a list of variables) are lists whose
  ``N``-th entry is the slot of the ``N``-th entry of its ``_trainable_variables``;
  its step is the child ``_iterations``.
- *tf.keras 2's own optimizers* (``tf_keras.optimizers.Adam``): the same lists
  without ``_trainable_variables``; a slot's variable is the one whose name is the
  slot's less its first two parts (``Adam/m/dense/kernel`` is ``dense/kernel``'s).

Each slot is found by its *role*: the slot's name, or the list's (``_momentums``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tfckpt.format.objectgraph import ObjectGraph

# The local names of an edge to an optimizer (tf.train.Checkpoint(optimizer=...), a model's).
_OPTIMIZER_EDGE = "optimizer"
# A Keras optimizer's lists that hold no slots.
_NOT_SLOTS = frozenset({"_variables", "_trainable_variables", "_trainable_variables_indices"})
# tf.keras 2 names a list's slot SHORT/VARIABLE (see _named_owner); Keras 3 keeps
# every list of slots as its optimizer's child, one entry per trainable variable.
SLOT_NAMES = {
    "momentums": "m",
    "_momentums": "m",
    "_velocities": "v",
    "_accumulators": "accumulator",
    "_linears": "linear",
}
# Children of an optimizer holding its step count.
STEP_CHILDREN = ("iter", "_iterations")
# Children of an optimizer holding its learning rate (a variable, not a schedule).
LEARNING_RATES = ("learning_rate", "_learning_rate")


@dataclass
class OptimizerState:
    """The optimizer tensors of a TF2 checkpoint, by checkpoint key.

    ``slots``: a slot's key → (its variable's key, its role); ``steps``: the keys of
    step counts; ``other``: every other tensor only an optimizer holds (its learning
    rate and other hyperparameters).
    """

    slots: dict[str, tuple[str, str]] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)
    other: set[str] = field(default_factory=set)
    # A slot's key → every role its optimizer keeps, "+order" added where a list's
    # entries for one variable come before the first list's (a Keras 3 RMSprop builds
    # velocities, then momentums; an Adam momentum then velocity, variable by variable).
    kinds: dict[str, frozenset[str]] = field(default_factory=dict)
    # A slot's key → its optimizer's learning rate's key, where it keeps one.
    learning_rates: dict[str, str] = field(default_factory=dict)
    # A slot's key → its optimizer's name (see _optimizer_name).
    names: dict[str, str] = field(default_factory=dict)
    # Listed slots whose variable is unknown (tf.keras 2 names two variables alike).
    untied: set[str] = field(default_factory=set)


def _value_key(node) -> str | None:
    for a in node.attributes:
        if a.name == "VARIABLE_VALUE":
            return a.checkpoint_key
    return None


def _child(node, name: str) -> int | None:
    for c in node.children:
        if c.local_name == name:
            return c.node_id
    return None


def _list_entries(graph: ObjectGraph, node_id: int) -> dict[int, int]:
    """A Keras list's entries: position → node."""
    out = {}
    for c in graph.nodes[node_id].children:
        if c.local_name.isdigit():
            out[int(c.local_name)] = c.node_id
    return out


def optimizer_state(graph: ObjectGraph) -> OptimizerState:
    """Every optimizer's slots and step counts in ``graph`` (see the module's text).

    >>> state = optimizer_state(ObjectGraph.of(tfckpt.open("tf2/ckpt-1")))
    >>> state.slots["optimizer/_variables/2/.ATTRIBUTES/VARIABLE_VALUE"]
    ('optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE', '_momentums')
    """
    nodes = graph.nodes
    state = OptimizerState()
    optimizers = sorted(
        {c.node_id for n in nodes for c in n.children if c.local_name == _OPTIMIZER_EDGE}
    )
    for node in nodes:
        roles = frozenset(s.slot_name for s in node.slot_variables)
        rate = _learning_rate(graph, node)
        name = _optimizer_name(graph, node)
        for s in node.slot_variables:
            slot = _value_key(nodes[s.slot_variable_node_id])
            var = _value_key(nodes[s.original_variable_node_id])
            if slot is not None and var is not None:
                state.slots[slot] = (var, s.slot_name)
                state.kinds[slot] = roles
                state.names[slot] = name
                if rate is not None:
                    state.learning_rates[slot] = rate
    by_name: dict[str, list[str]] | None = None
    for o in optimizers:
        node = nodes[o]
        for name in STEP_CHILDREN:
            step = _child(node, name)
            key = None if step is None else _value_key(nodes[step])
            if key is not None and key not in state.steps:
                state.steps.append(key)
        variables = _child(node, "_trainable_variables")
        owners = {} if variables is None else _list_entries(graph, variables)
        lists = _slot_lists(graph, node)
        kind = _kind(graph, node, lists)
        rate = _learning_rate(graph, node)
        name = _optimizer_name(graph, node)
        for role, listed in lists.items():
            for pos, slot_node in sorted(listed.items()):
                slot = _value_key(nodes[slot_node])
                if slot is None:
                    continue
                if owners:
                    var = _value_key(nodes[owners[pos]]) if pos in owners else None
                else:
                    by_name = by_name if by_name is not None else _variables_by_name(graph)
                    var = _named_owner(nodes[slot_node], role, by_name)
                if var is None:
                    state.untied.add(slot)
                    continue
                state.slots[slot] = (var, role)
                state.names[slot] = name
                state.kinds[slot] = kind
                if rate is not None:
                    state.learning_rates[slot] = rate
    _other_optimizer_tensors(graph, optimizers, state)
    return state


def _learning_rate(graph: ObjectGraph, node) -> str | None:
    for name in LEARNING_RATES:
        child = _child(node, name)
        key = None if child is None else _value_key(graph.nodes[child])
        if key is not None:
            return key
    return None


def _slot_lists(graph: ObjectGraph, node) -> dict[str, dict[int, int]]:
    """A Keras optimizer's lists of slots (role → position → node): every child but
    its lists of all variables whose entries are variables."""
    out = {}
    for c in node.children:
        if c.local_name in _NOT_SLOTS:
            continue
        entries = _list_entries(graph, c.node_id)
        if entries and all(_value_key(graph.nodes[n]) for n in entries.values()):
            out[c.local_name] = entries
    return out


def _kind(graph: ObjectGraph, node, lists: dict[str, dict[int, int]]) -> frozenset[str]:
    """The optimizer's kind, see :class:`OptimizerState`: the roles of its lists,
    ``+order`` where a velocity precedes its momentum among ``_variables``, ``+extra``
    where it holds a variable besides its step, its learning rate and its lists (a
    Keras 3 Nadam's ``_u_product``)."""
    kind = set(lists)
    everything = _child(node, "_variables")
    if everything is not None and {"_momentums", "_velocities"} <= kind:
        order = {n: pos for pos, n in _list_entries(graph, everything).items()}
        for pos, n in lists["_velocities"].items():
            lead = lists["_momentums"].get(pos)
            if lead is not None and order.get(n, 0) < order.get(lead, 0):
                kind.add("+order")
    for c in node.children:
        plain = c.local_name not in (*STEP_CHILDREN, *LEARNING_RATES)
        if plain and _value_key(graph.nodes[c.node_id]) is not None:
            kind.add("+extra")
    return frozenset(kind)


def _variables_by_name(graph: ObjectGraph) -> dict[str, list[str]]:
    """Each variable's name (its value attribute's ``full_name``) → its keys."""
    out: dict[str, list[str]] = {}
    for node in graph.nodes:
        for a in node.attributes:
            if a.name == "VARIABLE_VALUE" and a.full_name:
                out.setdefault(a.full_name, []).append(a.checkpoint_key)
    return out


def _named_owner(slot_node, role: str, by_name: dict[str, list[str]]) -> str | None:
    """tf.keras 2's slot ``[OPTIMIZER/]SHORT/VARIABLE`` (``Adam/m/dense/kernel``, or
    ``m/dense/kernel`` built outside the optimizer's scope): the one variable so named;
    else the one the longest tail of its name names (``velocity/dense/kernel``)."""
    full = next((a.full_name for a in slot_node.attributes if a.name == "VARIABLE_VALUE"), "")
    parts = full.split("/")
    short = SLOT_NAMES.get(role)
    rest = ""
    if short is not None and short in parts[:2]:
        rest = "/".join(parts[parts.index(short) + 1 :])
    if rest not in by_name:
        tails = ("/".join(parts[k:]) for k in range(1, len(parts)))
        rest = next((t for t in tails if t in by_name), "")
    keys = by_name.get(rest, [])
    return keys[0] if len(keys) == 1 else None  # two variables so named: which is unknown


def _optimizer_name(graph: ObjectGraph, node) -> str:
    """The optimizer's name as its step's variable name begins (``Adam/iter``,
    ``adamax/iteration``), lower case; "" where it is not there."""
    for name in STEP_CHILDREN:
        child = _child(node, name)
        if child is not None:
            for a in graph.nodes[child].attributes:
                head, sep, _ = a.full_name.partition("/")
                if sep:
                    return head.lower()
    return ""


def _other_optimizer_tensors(graph: ObjectGraph, optimizers: list[int], state: OptimizerState):
    """The value keys only the optimizers reach, less their slots and steps."""
    nodes = graph.nodes
    seen = set(optimizers)
    todo = list(optimizers)
    while todo:
        node = nodes[todo.pop()]
        for c in node.children:
            if c.node_id not in seen and c.local_name != "_trainable_variables":
                seen.add(c.node_id)
                todo.append(c.node_id)
    model_keys = {
        a.checkpoint_key for i, n in enumerate(nodes) if i not in seen for a in n.attributes
    }
    taken = set(state.slots) | set(state.steps) | {v for v, _ in state.slots.values()}
    taken |= state.untied
    for i in seen:
        for a in nodes[i].attributes:
            key = a.checkpoint_key
            if key not in taken and key not in model_keys:
                state.other.add(key)
