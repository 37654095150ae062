"""The TF2 object graph stored under ``_CHECKPOINTABLE_OBJECT_GRAPH``: parse, prune, re-key, merge.

A TF2 checkpoint is restored by walking this graph from the root (node 0),
matching children by local name to the live objects, then reading each
attribute's ``checkpoint_key``. Keys are labels only, so tensors can be renamed
as long as the attributes are rewritten to match, and one node may be reachable
by several paths (Keras 3 tracks ``model.optimizer``), so dropping is done on
objects, not on key prefixes.

Most attributes are stored as one tensor named by their ``checkpoint_key``; a few
saveables are stored as several tensors named by the key plus a suffix (see
:data:`SPEC_SUFFIXES`).

Hostile graphs are handled in time and memory linear in their size: every walk
is iterative, paths are built once per node from the parent's and cut to
:data:`PATH_CHARS`, and graphs beyond :data:`MAX_ELEMENTS` are refused.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Container, Iterable, Mapping

from google.protobuf.message import DecodeError

from tfckpt._proto.trackable_object_graph_pb2 import TrackableObjectGraph
from tfckpt.errors import CheckpointError, CorruptCheckpointError, UnsupportedCheckpointError

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"

# Saveables TensorFlow stores as several tensors. Each tensor of such a saveable
# is named by the attribute's checkpoint_key plus the tensor's local name, and
# TensorFlow reads exactly those names back: lookup tables (MutableHashTable,
# DenseHashTable) write KEY-keys and KEY-values, tf.data iterators KEY_STATE.
# Only these suffix sets are recognised, and only when KEY itself is not a
# tensor, so a tensor that merely shares a prefix with a key is never claimed.
SPEC_SUFFIXES = (("-keys", "-values"), ("_STATE",))

# Limits for graphs from untrusted files, far above real ones (which have a few
# elements per variable); within them every command stays linear in the graph.
MAX_ELEMENTS = 500_000  # nodes + child edges + attributes + slot variables
PATH_CHARS = 512  # a longer path is shown as "…" and its last characters
SLOT_PATH_SEPARATOR = "/.OPTIMIZER_SLOT/"  # between a slot's variable's and optimizer's paths


def attribute_tensors(key: str, present: Container[str]) -> tuple[str, ...]:
    """The tensors TensorFlow reads for the attribute with checkpoint key ``key``.

    ``key`` itself when it is among ``present``; else the names of the first
    suffix set of :data:`SPEC_SUFFIXES` with a member present (all of them: a
    member not present is missing); else ``(key,)``, missing.
    """
    if key in present:
        return (key,)
    for suffixes in SPEC_SUFFIXES:
        names = tuple(key + s for s in suffixes)
        if any(n in present for n in names):
            return names
    return (key,)


def renamed_key(
    key: str, tensors: Iterable[str], new_names: Mapping[str, str], path: str | None = None
) -> str:
    """The checkpoint key an attribute gets when its tensors are renamed.

    Each tensor ``key + suffix`` must become ``new_key + suffix`` for one
    ``new_key``: TensorFlow finds the tensors from the key alone.
    """
    stems: set[str | None] = set()
    for t in tensors:
        suffix, new = t[len(key) :], new_names[t]
        if not new.endswith(suffix):
            stems.add(None)
        else:
            stems.add(new[: len(new) - len(suffix)] if suffix else new)
    stem = stems.pop() if len(stems) == 1 else None
    if stem is None:
        listed = ", ".join(f"{t!r} -> {new_names[t]!r}" for t in tensors)
        raise CheckpointError(
            f"the tensors of the attribute {key!r} are stored as its key "
            f"plus a suffix and must be renamed alike, not {listed}",
            path=path,
        )
    return stem


def escape_local_name(name: str) -> str:
    """A local name as it appears in an object path: TensorFlow writes ``.`` as ``..``
    and ``/`` as ``.S``, so that ``/`` separates names and ``.ATTRIBUTES`` is no name."""
    return name.replace(".", "..").replace("/", ".S")


def unescape_local_name(text: str) -> str:
    """The local name an escaped path component stands for (``..`` → ``.``, ``.S`` → ``/``)."""
    return re.sub(r"\.([.S])", lambda m: "." if m[1] == "." else "/", text)


def graph_bytes(ckpt, path: str | None = None) -> bytes:
    """The serialized object graph ``ckpt`` (a :class:`~tfckpt.Checkpoint`) stores under
    :data:`OBJECT_GRAPH_KEY`. It must be a scalar string, as TensorFlow writes it;
    anything else is a :class:`CorruptCheckpointError` naming the file (``path``, by
    default the checkpoint's prefix) and the tensor, found from the index alone."""
    info = ckpt.info(OBJECT_GRAPH_KEY)
    if info.dtype != "string" or tuple(info.shape) != ():
        raise CorruptCheckpointError(
            f"the object graph must be a scalar string, not {info.dtype} of shape "
            f"{list(info.shape)}",
            path=ckpt.prefix if path is None else path,
            tensor=OBJECT_GRAPH_KEY,
        )
    return bytes(ckpt[OBJECT_GRAPH_KEY].item())


class ObjectGraph:
    """A mutable TF2 object graph. ``path`` names the checkpoint in error messages."""

    def __init__(self, proto: TrackableObjectGraph, path: str | None = None):
        self.proto = proto
        self.path = path
        self._check_ids()
        self._parsed_from: bytes | None = None

    @classmethod
    def parse(cls, data: bytes, path: str | None = None) -> ObjectGraph:
        try:
            proto = TrackableObjectGraph.FromString(data)
        except DecodeError:
            raise CorruptCheckpointError(
                "the object graph is not a TrackableObjectGraph", path=path, tensor=OBJECT_GRAPH_KEY
            ) from None
        if not proto.nodes:
            raise CorruptCheckpointError(
                "the object graph has no root node", path=path, tensor=OBJECT_GRAPH_KEY
            )
        graph = cls(proto, path)
        graph._parsed_from = data
        return graph

    @classmethod
    def of(cls, ckpt, path: str | None = None) -> ObjectGraph:
        """The object graph of ``ckpt``, checked as :func:`graph_bytes` and :meth:`parse` do.

        >>> ObjectGraph.of(tfckpt.open("train/ckpt-3")).root_children()
        """
        path = ckpt.prefix if path is None else path
        return cls.parse(graph_bytes(ckpt, path), path=path)

    def serialize(self) -> bytes:
        """The graph's bytes: those it was parsed from while it still says the same.

        Protobuf writes fields in its own order; TensorFlow's writers need not, so a
        graph nothing changed is copied byte for byte, not re-encoded.
        """
        if self._parsed_from is not None:
            if TrackableObjectGraph.FromString(self._parsed_from) == self.proto:
                return self._parsed_from
            self._parsed_from = None  # changed: it can never be those bytes again
        return self.proto.SerializeToString()

    @property
    def parsed_from(self) -> bytes | None:
        """The bytes this graph was parsed from, until a :meth:`serialize` finds it changed."""
        return self._parsed_from

    @property
    def nodes(self):
        return self.proto.nodes

    def _check_ids(self) -> None:
        nodes = self.proto.nodes
        n = elements = len(nodes)
        for i, node in enumerate(nodes):
            children, slots = node.children, node.slot_variables
            elements += len(children) + len(node.attributes) + len(slots)
            if elements > MAX_ELEMENTS:
                raise UnsupportedCheckpointError(
                    f"the object graph has more than {MAX_ELEMENTS} elements (nodes, edges, "
                    "attributes, slot variables), more than tfckpt accepts",
                    path=self.path,
                    tensor=OBJECT_GRAPH_KEY,
                )
            for child in children:
                if not 0 <= child.node_id < n:
                    raise CorruptCheckpointError(
                        f"node {i} has child {child.local_name!r} with node id {child.node_id}, "
                        f"but there are {n} nodes",
                        path=self.path,
                        tensor=OBJECT_GRAPH_KEY,
                    )
            for slot in slots:
                for ref in (slot.original_variable_node_id, slot.slot_variable_node_id):
                    if not 0 <= ref < n:
                        raise CorruptCheckpointError(
                            f"node {i} has slot variable {slot.slot_name!r} referring to node "
                            f"{ref}, but there are {n} nodes",
                            path=self.path,
                            tensor=OBJECT_GRAPH_KEY,
                        )

    # -- reading

    def checkpoint_keys(self) -> dict[str, int]:
        """Every attribute's checkpoint key and the node it belongs to."""
        return {
            a.checkpoint_key: i for i, node in enumerate(self.proto.nodes) for a in node.attributes
        }

    def attribute_tensors(self, present: Container[str]) -> dict[str, tuple[str, ...]]:
        """Every attribute's checkpoint key and the tensor names TensorFlow reads for it."""
        return {k: attribute_tensors(k, present) for k in self.checkpoint_keys()}

    def missing_keys(self, keys: Iterable[str]) -> list[str]:
        """Tensors the graph's attributes need that are not among ``keys``."""
        present = keys if isinstance(keys, (set, frozenset, dict)) else set(keys)
        return sorted(
            {
                t
                for names in self.attribute_tensors(present).values()
                for t in names
                if t not in present
            }
        )

    def _tree(self) -> tuple[list[int], dict[int, tuple]]:
        """Breadth-first order of the reachable nodes and how each was first reached.

        ``via[i]`` is ``(parent, local_name)`` for a child edge or ``(original,
        optimizer, slot_name)`` for a slot variable; a slot variable is reached
        once both its variable and the optimizer holding the reference are.
        """
        nodes = self.proto.nodes
        via: dict[int, tuple] = {0: ()}
        order = [0]
        # Slot variables whose optimizer was reached before their variable: they are
        # reached with the variable, however much deeper it lies.
        waiting: dict[int, list[tuple[int, int, str]]] = {}

        def reach(node_id: int, step: tuple) -> None:
            via[node_id] = step
            order.append(node_id)

        head = 0
        while head < len(order):
            i = order[head]
            head += 1
            for slot_id, optimizer, slot_name in waiting.pop(i, ()):
                if slot_id not in via:
                    reach(slot_id, (i, optimizer, slot_name))
            for child in nodes[i].children:
                if child.node_id not in via:
                    reach(child.node_id, (i, child.local_name))
            for slot in nodes[i].slot_variables:
                if slot.slot_variable_node_id in via:
                    continue
                if slot.original_variable_node_id in via:
                    reach(
                        slot.slot_variable_node_id,
                        (slot.original_variable_node_id, i, slot.slot_name),
                    )
                else:
                    waiting.setdefault(slot.original_variable_node_id, []).append(
                        (slot.slot_variable_node_id, i, slot.slot_name)
                    )
        return order, via

    def reachable(self) -> list[int]:
        """The nodes a restore reaches from the root, breadth-first."""
        return self._tree()[0]

    def paths(self, limit: int = PATH_CHARS) -> dict[int, str]:
        """The first path (breadth-first, by local names) to every reachable node.

        A path longer than ``limit`` characters is given as ``…`` and its last
        ``limit - 1`` characters, so the result stays linear in the graph's size
        even when paths double at every slot variable.
        """
        order, via = self._tree()

        def cut(path: str) -> str:
            return path if len(path) <= limit else "…" + path[len(path) - limit + 1 :]

        found = {0: ""}
        for i in order[1:]:
            step = via[i]
            if len(step) == 2:
                parent, name = step
                name = escape_local_name(name)
                found[i] = cut(f"{found[parent]}/{name}" if parent else name)
            else:
                original, optimizer, slot_name = step
                found[i] = cut(
                    f"{found[original]}{SLOT_PATH_SEPARATOR}"
                    f"{found[optimizer]}/{escape_local_name(slot_name)}"
                )
        return found

    def full_paths(self, wanted: Iterable[int], max_chars: int | None = None) -> dict[int, str]:
        """The uncut paths (as :meth:`paths`) of the reachable nodes among ``wanted``.

        Only those are built, so a deep chain costs what its wanted paths hold, not the
        square of its depth. Their lengths are known before any is built: more than
        ``max_chars`` characters in all (by default 32 times the graph's size plus
        1 MiB; slot variables can double a path at every step) is an
        :class:`UnsupportedCheckpointError`.
        """
        order, via = self._tree()
        sep = len(SLOT_PATH_SEPARATOR)
        length = {0: 0}
        for i in order[1:]:
            step = via[i]
            if len(step) == 2:
                parent, name = step
                n = len(escape_local_name(name))
                length[i] = length[parent] + 1 + n if parent else n
            else:
                original, optimizer, slot_name = step
                n = len(escape_local_name(slot_name))
                length[i] = length[original] + sep + length[optimizer] + 1 + n
        targets = sorted({i for i in wanted if i in length})
        budget = 32 * self.proto.ByteSize() + (1 << 20) if max_chars is None else max_chars
        if sum(length[i] for i in targets) > budget:
            raise UnsupportedCheckpointError(
                f"the object graph's paths run to more than {budget} characters: "
                "too long to name its tensors by",
                path=self.path,
                tensor=OBJECT_GRAPH_KEY,
            )
        out = {}
        for target in targets:
            pieces: list[str] = []
            stack: list[int | str] = [target]
            while stack:  # no recursion: chains may be 100 000 deep
                item = stack.pop()
                if isinstance(item, str):
                    pieces.append(item)
                    continue
                step = via[item]
                if len(step) == 2:
                    parent, name = step
                    stack.append(escape_local_name(name))
                    if parent:
                        stack += ["/", parent]
                elif step:
                    original, optimizer, slot_name = step
                    stack += [escape_local_name(slot_name), "/", optimizer]
                    stack += [SLOT_PATH_SEPARATOR, original]
            out[target] = "".join(pieces)
        return out

    # -- rewriting

    def rekey(self, mapping: Mapping[str, str]) -> None:
        """Rewrite attributes' checkpoint keys by ``{old: new}``."""
        for node in self.proto.nodes:
            for attr in node.attributes:
                new = mapping.get(attr.checkpoint_key)
                if new is not None:
                    try:
                        attr.checkpoint_key = new
                    except ValueError:  # proto strings are UTF-8: no name of other bytes
                        raise CheckpointError(
                            f"cannot rename {attr.checkpoint_key!r} to {new!r}: keys of a TF2 "
                            "object graph must be UTF-8 text",
                            path=self.path,
                        ) from None

    def drop_keys(self, keys: Iterable[str]) -> None:
        """Remove the attributes whose checkpoint key is in ``keys``."""
        keys = set(keys)
        for node in self.proto.nodes:
            kept = [a for a in node.attributes if a.checkpoint_key not in keys]
            if len(kept) != len(node.attributes):
                del node.attributes[:]
                node.attributes.extend(kept)

    def drop_objects(self, specs: Iterable[str]) -> set[str]:
        """Cut child edges, then remove every node no longer reachable from the root.

        A bare name removes every edge with that local name anywhere; a path
        ``a/b/c`` removes exactly that edge, found by walking from the root. Names
        are written as in checkpoint keys (``.`` as ``..``, ``/`` as ``.S``).
        Returns the checkpoint keys of the removed nodes' attributes.
        """
        nodes = self.proto.nodes
        for spec in specs:
            parts = [unescape_local_name(p) for p in spec.split("/") if p]
            if not parts:
                raise CheckpointError(f"empty object path {spec!r}", path=self.path)
            if len(parts) == 1:
                hits = 0
                for node in nodes:
                    kept = [c for c in node.children if c.local_name != parts[0]]
                    hits += len(node.children) - len(kept)
                    if len(kept) != len(node.children):
                        del node.children[:]
                        node.children.extend(kept)
                if not hits:
                    raise CheckpointError(
                        f"no object named {parts[0]!r} in the object graph", path=self.path
                    )
                continue
            current = 0
            for depth, name in enumerate(parts):
                children = nodes[current].children
                match = [k for k, c in enumerate(children) if c.local_name == name]
                if not match:
                    raise CheckpointError(
                        f"no object at {'/'.join(parts[: depth + 1])!r} in the object graph",
                        path=self.path,
                    )
                if depth == len(parts) - 1:
                    del children[match[0]]
                else:
                    current = children[match[0]].node_id
        return self.prune()

    def drop_nodes(self, ids: Iterable[int]) -> set[str]:
        """Cut every child edge and slot reference to the nodes ``ids`` (the root excepted),
        then remove every node no longer reachable (their slot variables with them: a slot
        is reached only through its variable); returns the removed attributes' keys."""
        ids = set(ids) - {0}
        for node in self.proto.nodes:
            kept = [c for c in node.children if c.node_id not in ids]
            if len(kept) != len(node.children):
                del node.children[:]
                node.children.extend(kept)
            slots = [
                s
                for s in node.slot_variables
                if s.slot_variable_node_id not in ids and s.original_variable_node_id not in ids
            ]
            if len(slots) != len(node.slot_variables):  # a slot deleted itself
                del node.slot_variables[:]
                node.slot_variables.extend(slots)
        return self.prune()

    def slot_variables_of(self, node_id: int) -> list[tuple[str, int]]:
        """The slot variables of the variable node ``node_id``: ``(slot name, node)``."""
        return [
            (s.slot_name, s.slot_variable_node_id)
            for node in self.proto.nodes
            for s in node.slot_variables
            if s.original_variable_node_id == node_id
        ]

    def prune(self) -> set[str]:
        """Remove unreachable nodes and renumber; returns the removed attributes' keys."""
        nodes = self.proto.nodes
        reachable = set(self.reachable())
        removed_keys = {
            a.checkpoint_key
            for i, node in enumerate(nodes)
            if i not in reachable
            for a in node.attributes
        }
        order = sorted(reachable)
        new_id = {old: new for new, old in enumerate(order)}
        kept = []
        for old in order:
            node = type(nodes[old])()
            node.CopyFrom(nodes[old])
            for child in node.children:
                child.node_id = new_id[child.node_id]
            slots = [
                s
                for s in node.slot_variables
                if s.original_variable_node_id in new_id and s.slot_variable_node_id in new_id
            ]
            del node.slot_variables[:]
            for s in slots:
                s.original_variable_node_id = new_id[s.original_variable_node_id]
                s.slot_variable_node_id = new_id[s.slot_variable_node_id]
                node.slot_variables.append(s)
            kept.append(node)
        del nodes[:]
        nodes.extend(kept)
        self.refresh_has_values()
        return removed_keys

    def refresh_has_values(self) -> None:
        """Recompute ``has_checkpoint_values`` where TensorFlow recorded it."""
        nodes = self.proto.nodes
        parents: dict[int, list[int]] = {i: [] for i in range(len(nodes))}
        for i, node in enumerate(nodes):
            for child in node.children:
                parents[child.node_id].append(i)
            for slot in node.slot_variables:
                parents[slot.slot_variable_node_id].append(i)
        has = {i for i, node in enumerate(nodes) if node.attributes}
        queue = deque(has)
        while queue:
            for p in parents[queue.popleft()]:
                if p not in has:
                    has.add(p)
                    queue.append(p)
        for i, node in enumerate(nodes):
            if node.HasField("has_checkpoint_values"):
                node.has_checkpoint_values.value = i in has

    @classmethod
    def merge(cls, graphs: list[ObjectGraph], names: list[str]) -> ObjectGraph:
        """One graph whose root has the children of every graph's root.

        A local name under two roots is an error naming both sources.
        """
        out = TrackableObjectGraph()
        root = out.nodes.add()
        owner: dict[str, str] = {}
        root_attrs: dict[str, str] = {}
        for graph, name in zip(graphs, names):
            offset = len(out.nodes) - 1  # graph node k > 0 becomes offset + k; its root is 0
            remap = lambda k, offset=offset: 0 if k == 0 else offset + k  # noqa: E731
            src_root = graph.proto.nodes[0]
            for child in src_root.children:
                if child.local_name in owner:
                    raise CheckpointError(
                        f"both {owner[child.local_name]} and {name} have a root object named "
                        f"{child.local_name!r}",
                        path=name,
                    )
                owner[child.local_name] = name
                ref = root.children.add()
                ref.CopyFrom(child)
                ref.node_id = remap(child.node_id)
            for attr in src_root.attributes:
                if attr.name in root_attrs:
                    raise CheckpointError(
                        f"both {root_attrs[attr.name]} and {name} have a root "
                        f"attribute {attr.name!r}",
                        path=name,
                    )
                root_attrs[attr.name] = name
                root.attributes.add().CopyFrom(attr)
            for slot in src_root.slot_variables:
                s = root.slot_variables.add()
                s.CopyFrom(slot)
                s.original_variable_node_id = remap(slot.original_variable_node_id)
                s.slot_variable_node_id = remap(slot.slot_variable_node_id)
            if src_root.HasField("has_checkpoint_values"):
                root.has_checkpoint_values.value = True
            for node in list(graph.proto.nodes)[1:]:
                new = out.nodes.add()
                new.CopyFrom(node)
                for child in new.children:
                    child.node_id = remap(child.node_id)
                for slot in new.slot_variables:
                    slot.original_variable_node_id = remap(slot.original_variable_node_id)
                    slot.slot_variable_node_id = remap(slot.slot_variable_node_id)
        merged = cls(out)
        merged.refresh_has_values()
        return merged

    def drop_root_child(self, local_name: str) -> set[str]:
        """Remove the root's child ``local_name`` (if any) and what only it reached."""
        root = self.proto.nodes[0]
        kept = [c for c in root.children if c.local_name != local_name]
        if len(kept) == len(root.children):
            return set()
        del root.children[:]
        root.children.extend(kept)
        return self.prune()

    def root_children(self) -> list[str]:
        return [c.local_name for c in self.proto.nodes[0].children]
