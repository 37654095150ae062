"""Which objects of a TF2 checkpoint restore into which objects of another object graph,
matched as ``tf.train.Checkpoint.restore`` matches them: from the roots, a child by its
local name, and a slot variable by its optimizer, its variable and its slot's name.

The other graph stands for the live program (a template checkpoint, a SavedModel's
variables): :func:`match_graphs` pairs its nodes with the checkpoint's.
"""

from __future__ import annotations

from collections import deque

from tfckpt.format.objectgraph import ObjectGraph


def match_graphs(live: ObjectGraph, saved: ObjectGraph) -> dict[int, int]:
    """``{live node: saved node}`` for every pair a restore binds, the roots included.

    Breadth-first from the roots; a node is bound once on either side (the first
    path to it wins, as a restore binds an object once). Slot variables are bound
    when their optimizer and their variable are: the pair of slot references with
    the same slot name and bound variables. Linear in the graphs' size.
    """
    refs: dict[int, list[tuple[int, int]]] = {}  # live node -> (optimizer, slot ref index)
    for i, node in enumerate(live.nodes):
        for k, s in enumerate(node.slot_variables):
            refs.setdefault(i, []).append((i, k))
            refs.setdefault(s.original_variable_node_id, []).append((i, k))
    saved_slots: dict[int, dict[tuple[int, str], int]] = {}
    pairs: dict[int, int] = {}
    taken: set[int] = set()
    queue: deque[int] = deque()

    def bind(i: int, j: int) -> None:
        pairs[i] = j
        taken.add(j)
        queue.append(i)

    bind(0, 0)
    while queue:
        i = queue.popleft()
        names: dict[str, int] = {}
        for c in saved.nodes[pairs[i]].children:
            names.setdefault(c.local_name, c.node_id)
        for c in live.nodes[i].children:
            j = names.get(c.local_name)
            if j is not None and c.node_id not in pairs and j not in taken:
                bind(c.node_id, j)
        for optimizer, k in refs.get(i, ()):
            s = live.nodes[optimizer].slot_variables[k]
            original = pairs.get(s.original_variable_node_id)
            if optimizer not in pairs or original is None or s.slot_variable_node_id in pairs:
                continue
            j = pairs[optimizer]
            if j not in saved_slots:
                saved_slots[j] = {
                    (r.original_variable_node_id, r.slot_name): r.slot_variable_node_id
                    for r in saved.nodes[j].slot_variables
                }
            found = saved_slots[j].get((original, s.slot_name))
            if found is not None and found not in taken:
                bind(s.slot_variable_node_id, found)
    return pairs
