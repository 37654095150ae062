"""TF1 graph files read without TensorFlow: a ``MetaGraphDef`` (``model.ckpt-N.meta``) or
the ``SavedModel`` of a ``saved_model.pb``, and what they say about the graph's variables,
its Saver, collections, signatures and placeholders, and what the Saver restores.

What the Saver restores is read from the graph itself, as TensorFlow runs it: the restore
ops its ``restore_op_name`` depends on (``RestoreV2``, or the older ``RestoreSlice`` and
``Restore``), the checkpoint names and slice specs in their ``Const`` inputs, their dtypes,
and the ``Assign``/``AssignVariableOp`` each value feeds, which gives the variable, its
shape and whether the assignment checks that shape.

Hostile files are refused cleanly: bytes that do not parse (truncated, nested past
protobuf's depth limit, text that is not UTF-8) and attributes of the wrong kind are
:class:`~tfckpt.CorruptCheckpointError` naming the file and the node; protobuf holds the
parsed file in memory proportional to its size, and every walk here is iterative and
linear in the graph.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError

from tfckpt._proto.meta_graph_pb2 import (
    AttrValue,
    MetaGraphDef,
    NodeDef,
    SavedModel,
    SaverDef,
    VariableDef,
)
from tfckpt._proto.tensor_bundle_pb2 import TensorShapeProto
from tfckpt.errors import CorruptCheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.format.bundle import MAX_RANK
from tfckpt.format.slices import Slice

# The largest message protobuf parses (2 GiB - 1 bytes): a larger graph file cannot be one.
MAX_FILE_BYTES = (1 << 31) - 1

# Collections whose BytesList holds serialized VariableDefs (TensorFlow's GraphKeys).
VARIABLE_COLLECTIONS = (
    "variables",
    "local_variables",
    "trainable_variables",
    "model_variables",
    "moving_average_variables",
    "metric_variables",
    "concatenated_variables",
    "trainable_resource_variables",
)
VARIABLE_OPS = frozenset({"VariableV2", "Variable", "VarHandleOp"})
PLACEHOLDER_OPS = frozenset({"Placeholder", "PlaceholderV2", "PlaceholderWithDefault"})
RESTORE_OPS = frozenset({"RestoreV2", "RestoreSlice", "Restore"})
# The value an assignment's validate_shape has when a graph stripped it as a default.
_VALIDATE_SHAPE_DEFAULT = {"Assign": True, "AssignVariableOp": False}
# Ops a restored value passes through on its way to the assignment.
_PASS_THROUGH = frozenset({"Identity", "IdentityN", "Reshape"})
_REF_OFFSET = 100  # a DataType above this is the reference type of (type - 100)
_REF_VARIABLE_OPS = frozenset({"VariableV2", "Variable", "AutoReloadVariable"})

# The Saver ``import_meta_graph`` builds for a graph without a saver_def (``Saver()``'s
# defaults), over the variables of these collections.
DEFAULT_SAVER = SaverDef(version=SaverDef.V2, max_to_keep=5, keep_checkpoint_every_n_hours=10000.0)
DEFAULT_SAVER_COLLECTIONS = ("variables", "saveable_objects")


@dataclass(frozen=True)
class Partition:
    """Where one partition of a partitioned variable lies in the whole."""

    full_name: str
    full_shape: tuple[int, ...]
    offset: tuple[int, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True)
class GraphVariable:
    """A variable of the graph: its op's name (the checkpoint name, unless partitioned),
    dtype and shape (from its node; None when the node is absent), the collections that
    list it and, for a partition, where it lies in the whole."""

    name: str
    dtype: str | None
    shape: tuple[int | None, ...] | None
    trainable: bool
    resource: bool | None
    partition: Partition | None
    collections: tuple[str, ...]


@dataclass(frozen=True)
class GraphTensor:
    """A tensor of the graph (a placeholder, a signature's input or output)."""

    name: str
    dtype: str | None
    shape: tuple[int | None, ...] | None


@dataclass(frozen=True)
class RestoredValue:
    """One value the Saver restores: the checkpoint tensor it reads (``key``), in which
    dtype, the whole tensor's shape and the part read (``slice``, None: all of it) as its
    slice spec says, and the variable it is assigned to (None for other saveables, such as
    lookup tables), with that variable's shape and whether the assignment checks it."""

    key: str
    dtype: str | None
    full_shape: tuple[int, ...] | None
    slice: Slice | None
    variable: str | None
    shape: tuple[int | None, ...] | None
    validate_shape: bool


def parse_meta_graph(data: bytes, path: str | None = None) -> MetaGraph:
    """The MetaGraphDef serialized in ``data`` (a ``.meta`` file's bytes)."""
    proto = _parse(MetaGraphDef, data, "a MetaGraphDef", path)
    if not proto.HasField("graph_def") and not proto.HasField("meta_info_def"):
        raise CorruptCheckpointError("not a MetaGraphDef: it holds no graph", path=path)
    return MetaGraph(proto, path)


def parse_saved_model(data: bytes, path: str | None = None) -> list[MetaGraph]:
    """The MetaGraphs of a SavedModel (a ``saved_model.pb`` file's bytes), in its order."""
    proto = _parse(SavedModel, data, "a SavedModel", path)
    if not proto.meta_graphs:
        raise CorruptCheckpointError("not a SavedModel: it holds no MetaGraph", path=path)
    return [MetaGraph(m, path) for m in proto.meta_graphs]


def _parse(cls, data: bytes, what: str, path: str | None):
    if len(data) > MAX_FILE_BYTES:
        raise CorruptCheckpointError(
            f"{len(data)} bytes: larger than protobuf's limit of {MAX_FILE_BYTES}, so not {what}",
            path=path,
        )
    if not data:
        raise CorruptCheckpointError(f"the file is empty, not {what}", path=path)
    try:
        return cls.FromString(data)
    except (DecodeError, RecursionError, ValueError) as e:
        raise CorruptCheckpointError(f"not {what} (truncated or damaged): {e}", path=path) from None


def parse_slice_spec(text: str, path: str | None = None, node: str | None = None):
    """A Saver's ``shape_and_slice`` string: ``""`` (the whole tensor, returned as
    ``(None, None)``) or the full shape's dimensions then the slice, one ``start,length``
    or ``-`` per axis, joined by ``:`` (``"10 4 0,5:-"``), as (full shape, extents)."""
    if not text:
        return None, None
    *dims, spec = text.split(" ")
    try:
        full = tuple(int(d) for d in dims)
        extents: list[tuple[int, int | None]] = []
        for part in spec.split(":"):
            if part == "-":
                extents.append((0, None))
            else:
                start, length = part.split(",")
                extents.append((int(start), int(length)))
    except ValueError:
        full, extents = (), []
    fits = len(extents) == len(full) <= MAX_RANK and all(
        d >= 0 and s >= 0 and (n is None or (n >= 0 and s + n <= d))
        for d, (s, n) in zip(full, extents)
    )
    if not full or not fits:
        raise CorruptCheckpointError(
            f"node {node!r}: {text[:80]!r} is no shape-and-slice spec", path=path
        )
    return full, tuple(extents)


class MetaGraph:
    """One parsed MetaGraphDef. ``path`` names the file in error messages.

    >>> graph = parse_meta_graph(open("model.ckpt-900.meta", "rb").read(), "model.ckpt-900.meta")
    >>> [v.name for v in graph.variables()], graph.saver().version
    """

    def __init__(self, proto: MetaGraphDef, path: str | None = None):
        self.proto = proto
        self.path = path
        self._nodes: dict[str, NodeDef] | None = None
        self._default_restores: tuple[list[RestoredValue], str | None] | None = None

    @property
    def tags(self) -> list[str]:
        return list(self.proto.meta_info_def.tags)

    @property
    def tensorflow_version(self) -> str:
        return self.proto.meta_info_def.tensorflow_version

    @property
    def nodes(self) -> dict[str, NodeDef]:
        """The graph's nodes by name (the first of a name, should it repeat)."""
        if self._nodes is None:
            nodes: dict[str, NodeDef] = {}
            for n in self.proto.graph_def.node:
                nodes.setdefault(n.name, n)
            self._nodes = nodes
        return self._nodes

    # --- attributes, checked ------------------------------------------------------

    def _error(self, node: NodeDef | str, what: str) -> CorruptCheckpointError:
        name = node if isinstance(node, str) else node.name
        return CorruptCheckpointError(f"node {name!r}: {what}", path=self.path)

    def _attr(self, node: NodeDef, key: str, kind: str) -> AttrValue | None:
        if key not in node.attr:
            return None
        value = node.attr[key]
        if value.WhichOneof("value") != kind:
            raise self._error(node, f"attribute {key!r} is not a {kind}")
        return value

    def _dtype(self, enum: int, where: NodeDef | str) -> str:
        base = enum - _REF_OFFSET if enum > _REF_OFFSET else enum
        try:
            return _dt.from_enum(base).name
        except Exception:
            raise self._error(where, f"unknown DataType number {enum}") from None

    def _shape(self, proto: TensorShapeProto, where: NodeDef | str):
        if proto.unknown_rank:
            return None
        if len(proto.dim) > MAX_RANK:
            raise self._error(where, f"a shape of rank {len(proto.dim)}, above {MAX_RANK}")
        dims = []
        for d in proto.dim:
            if d.size < -1:
                raise self._error(where, f"a dimension of size {d.size}")
            dims.append(None if d.size == -1 else d.size)
        return tuple(dims)

    def node_dtype(self, node: NodeDef, key: str = "dtype") -> str | None:
        value = self._attr(node, key, "type")
        return None if value is None else self._dtype(value.type, node)

    def node_shape(self, node: NodeDef, key: str = "shape"):
        value = self._attr(node, key, "shape")
        return None if value is None else self._shape(value.shape, node)

    def _strings(self, ref: str, consumer: NodeDef) -> list[str]:
        """The strings of the ``Const`` node ``ref`` names (a restore op's names or specs)."""
        node = self.nodes.get(_node_name(ref))
        if node is None or node.op != "Const":
            raise self._error(consumer, f"input {ref!r} is not a constant")
        value = self._attr(node, "value", "tensor")
        if value is None or value.tensor.dtype != _dt.STRING.enum:
            raise self._error(node, "a restore op's names are not a string constant")
        t = value.tensor
        n = 1
        for d in self._shape(t.tensor_shape, node) or ():
            n *= d or 0
        try:
            strings = [s.decode("utf-8") for s in t.string_val]
        except UnicodeDecodeError:
            raise self._error(node, "a tensor name that is not UTF-8") from None
        if len(strings) > n:
            raise self._error(node, f"{len(strings)} strings in a constant of {n} elements")
        # A TensorProto may list fewer values than elements: the last one repeats.
        return strings + [strings[-1] if strings else ""] * (n - len(strings))

    # --- what the graph holds ------------------------------------------------------

    def saver(self) -> SaverDef | None:
        """The Saver a restore uses: the graph's own ``saver_def``; without one, the
        default Saver ``import_meta_graph`` builds (:data:`DEFAULT_SAVER`: V2, its op
        names chosen as it is built, so empty here); None when it builds none
        (:meth:`no_saver` says why)."""
        if self.proto.HasField("saver_def"):
            return self.proto.saver_def
        return DEFAULT_SAVER if self._default()[1] is None else None

    @property
    def default_saver(self) -> bool:
        """Whether the graph has no ``saver_def``, so that a restore goes through the
        default Saver ``import_meta_graph`` builds over the graph's variables."""
        return not self.proto.HasField("saver_def")

    def no_saver(self) -> str | None:
        """Why a graph without a ``saver_def`` gets no Saver from ``import_meta_graph``
        (no global variable, or collections TensorFlow's ``Saver()`` raises on); None
        when it gets one."""
        return None if not self.default_saver else self._default()[1]

    def _default(self) -> tuple[list[RestoredValue], str | None]:
        if self._default_restores is None:
            self._default_restores = self._default_saver()
        return self._default_restores

    def _default_saver(self) -> tuple[list[RestoredValue], str | None]:
        """What the ``Saver()`` that ``import_meta_graph`` builds without a saver_def
        restores: the variables of the ``variables`` collection (GLOBAL_VARIABLES) and
        of ``saveable_objects``, each under its name (a partition under its whole
        variable's, as its slice), sorted by name; or why TensorFlow builds none."""
        listed: list[GraphVariable] = []
        by_name = {v.name: v for v in self.variables()}
        for key in DEFAULT_SAVER_COLLECTIONS:
            c = self.proto.collection_def.get(key)
            kind = None if c is None else c.WhichOneof("kind")
            if c is None or kind is None:
                continue  # import_meta_graph skips a collection of no kind
            if kind == "bytes_list" and key == "variables":
                defs = self.collection_variables()[key]
                for d in defs:
                    v = by_name[_node_name(d.variable_name)]
                    if v.name not in self.nodes:
                        return [], f"collection {key!r} names {v.name!r}, not in the graph"
                    listed.append(v)
            elif kind == "node_list":
                for ref in c.node_list.value:
                    found = self._variable_of(ref)
                    if found is None:
                        return [], (
                            f"collection {key!r} lists {ref!r}, no variable's tensor "
                            "(TensorFlow's Saver() raises)"
                        )
                    listed.append(found)
            else:
                return [], f"collection {key!r} holds {kind} values (TensorFlow's Saver() raises)"
        if not listed:
            return [], "the graph has no global variable"
        names: dict[str, bool] = {}  # checkpoint name -> partitioned
        seen: set[str] = set()
        out = []
        for v in listed:
            key = v.name if v.partition is None else v.partition.full_name
            if v.name in seen:
                return [], f"the variable {v.name!r} is listed twice (TensorFlow's Saver() raises)"
            if names.get(key, v.partition is not None) != (v.partition is not None):
                return [], f"{key!r} names a variable and a partitioned one (Saver() raises)"
            seen.add(v.name)
            names[key] = v.partition is not None
            full = extents = None
            if v.partition is not None:
                full = v.partition.full_shape
                extents = tuple(zip(v.partition.offset, v.partition.shape))
            # A reference variable's Assign checks a fully known shape; a resource
            # variable's AssignVariableOp checks none.
            validate = not v.resource and v.shape is not None and None not in v.shape
            out.append(RestoredValue(key, v.dtype, full, extents, v.name, v.shape, validate))
        out.sort(key=lambda r: (r.key, r.slice or ()))
        return out, None

    def _variable_of(self, ref: str) -> GraphVariable | None:
        """The variable a ``saveable_objects`` entry names, as TensorFlow's Saver takes
        it: a reference variable's tensor, or a resource variable's read; else None."""
        if ":" not in ref:
            return None  # an operation, not a tensor
        node = self.nodes.get(_node_name(ref))
        if node is None:
            return None
        resource = node.op == "ReadVariableOp"
        if resource:
            node = self.nodes.get(_node_name(node.input[0])) if node.input else None
            if node is None or node.op != "VarHandleOp":
                return None
        elif node.op not in _REF_VARIABLE_OPS:
            return None
        return GraphVariable(
            node.name, self.node_dtype(node), self.node_shape(node), False, resource, None, ()
        )

    def collection_variables(self) -> dict[str, list[VariableDef]]:
        """The VariableDefs each variable collection lists, in its order."""
        out: dict[str, list[VariableDef]] = {}
        for key in VARIABLE_COLLECTIONS:
            if key not in self.proto.collection_def:
                continue
            c = self.proto.collection_def[key]
            if c.WhichOneof("kind") != "bytes_list":
                continue
            defs = []
            for raw in c.bytes_list.value:
                try:
                    defs.append(VariableDef.FromString(raw))
                except DecodeError:
                    raise CorruptCheckpointError(
                        f"collection {key!r}: an entry is not a VariableDef", path=self.path
                    ) from None
            out[key] = defs
        return out

    def variables(self) -> list[GraphVariable]:
        """Every variable: those the collections list (global ones first, in their order),
        then variable ops no collection lists."""
        listed: dict[str, tuple[VariableDef, list[str]]] = {}
        for key, defs in self.collection_variables().items():
            for d in defs:
                name = _node_name(d.variable_name)
                listed.setdefault(name, (d, []))[1].append(key)
        out = []
        for name, (d, keys) in listed.items():
            node = self.nodes.get(name)
            info = d.save_slice_info_def if d.HasField("save_slice_info_def") else None
            partition = None
            if info is not None and info.full_name:
                partition = Partition(
                    info.full_name,
                    self._dims(info.full_shape, name),
                    self._dims(info.var_offset, name),
                    self._dims(info.var_shape, name),
                )
            out.append(
                GraphVariable(
                    name=name,
                    dtype=None if node is None else self.node_dtype(node),
                    shape=None if node is None else self.node_shape(node),
                    trainable="trainable_variables" in keys,
                    resource=(node.op == "VarHandleOp") if node is not None else d.is_resource,
                    partition=partition,
                    collections=tuple(keys),
                )
            )
        seen = set(listed)
        for node in self.proto.graph_def.node:
            if node.op in VARIABLE_OPS and node.name not in seen:
                seen.add(node.name)
                out.append(
                    GraphVariable(
                        node.name,
                        self.node_dtype(node),
                        self.node_shape(node),
                        False,
                        node.op == "VarHandleOp",
                        None,
                        (),
                    )
                )
        return out

    def _dims(self, values, where: str) -> tuple[int, ...]:
        if len(values) > MAX_RANK or any(v < 0 for v in values):
            raise self._error(where, "a partition's shape or offset is out of range")
        return tuple(values)

    def placeholders(self) -> list[tuple[GraphTensor, bool]]:
        """Each placeholder and whether it has a default (``PlaceholderWithDefault``)."""
        return [
            (
                GraphTensor(n.name, self.node_dtype(n), self.node_shape(n)),
                n.op == "PlaceholderWithDefault",
            )
            for n in self.proto.graph_def.node
            if n.op in PLACEHOLDER_OPS
        ]

    def signatures(self) -> dict[str, tuple[str, dict, dict]]:
        """Each signature's method name, inputs and outputs (key → tensor)."""
        out = {}
        for key in sorted(self.proto.signature_def):
            sig = self.proto.signature_def[key]
            out[key] = (
                sig.method_name,
                {k: self._tensor_info(sig.inputs[k], key) for k in sorted(sig.inputs)},
                {k: self._tensor_info(sig.outputs[k], key) for k in sorted(sig.outputs)},
            )
        return out

    def _tensor_info(self, info, signature: str) -> GraphTensor:
        where = f"signature {signature!r}"
        kind = info.WhichOneof("encoding")
        if kind == "coo_sparse":
            name = info.coo_sparse.values_tensor_name
        elif kind == "composite_tensor":
            name = ", ".join(c.name for c in info.composite_tensor.components)
        else:
            name = info.name
        dtype = self._dtype(info.dtype, where) if info.dtype else None
        shape = self._shape(info.tensor_shape, where) if info.HasField("tensor_shape") else None
        return GraphTensor(name, dtype, shape)

    # --- what the Saver restores -----------------------------------------------------

    def restored(self) -> list[RestoredValue]:
        """Every value the Saver's restore op reads, in the order of its restore ops.

        Without a saver_def, what the default Saver ``import_meta_graph`` builds
        restores (an empty list when it builds none); a :class:`CorruptCheckpointError`
        when the Saver's restore op is not in the graph.
        """
        if self.default_saver:
            return self._default()[0]
        saver = self.saver()
        if saver is None or not saver.restore_op_name:
            return []
        start = _node_name(saver.restore_op_name)
        if start not in self.nodes:
            raise self._error(start, "the Saver's restore op is not in the graph")
        restores, assigns = self._restore_subgraph(start)
        targets = self._assigned(assigns)
        out = []
        for node in restores:
            names = self._strings(_input(node, 1, self), node)
            if node.op == "Restore":
                specs = [""] * len(names)
            else:
                specs = self._strings(_input(node, 2, self), node)
            if node.op == "RestoreV2":
                value = self._attr(node, "dtypes", "list")
                dtypes = [] if value is None else [self._dtype(t, node) for t in value.list.type]
            else:
                dtypes = [self.node_dtype(node, "dt") or ""]
            if not len(names) == len(specs) == len(dtypes):
                raise self._error(
                    node, f"{len(names)} names, {len(specs)} slice specs, {len(dtypes)} dtypes"
                )
            for i, (key, spec, dtype) in enumerate(zip(names, specs, dtypes)):
                full, extents = parse_slice_spec(spec, self.path, node.name)
                variable, shape, validate = targets.get((node.name, i), (None, None, False))
                out.append(RestoredValue(key, dtype, full, extents, variable, shape, validate))
        return out

    def _restore_subgraph(self, start: str) -> tuple[list[NodeDef], list[NodeDef]]:
        """The restore ops and assignments the node ``start`` depends on, walked back over
        data and control inputs (each node once)."""
        seen = {start}
        stack = [start]
        restores, assigns = [], []
        while stack:
            node = self.nodes.get(stack.pop())
            if node is None:
                continue
            if node.op in RESTORE_OPS:
                restores.append(node)
            elif node.op in _VALIDATE_SHAPE_DEFAULT:
                assigns.append(node)
            for ref in node.input:
                name = _node_name(ref)
                if name not in seen:
                    seen.add(name)
                    stack.append(name)
        restores.sort(key=lambda n: _natural(n.name))
        return restores, assigns

    def _assigned(self, assigns: list[NodeDef]) -> dict[tuple[str, int], tuple]:
        """(restore op, output) → (variable, its shape, whether the assignment checks it)."""
        defaults = dict(_VALIDATE_SHAPE_DEFAULT)
        for op in self.proto.meta_info_def.stripped_op_list.op:
            for a in op.attr:
                if op.name in defaults and a.name == "validate_shape":
                    defaults[op.name] = a.default_value.b
        out = {}
        for node in assigns:
            if len(node.input) < 2:
                raise self._error(node, f"an {node.op} with {len(node.input)} inputs")
            source = self._source(node.input[1])
            if source is None:
                continue
            variable = self.nodes.get(_node_name(node.input[0]))
            flag = self._attr(node, "validate_shape", "b")
            validate = defaults[node.op] if flag is None else flag.b
            shape = None if variable is None else self.node_shape(variable)
            name = _node_name(node.input[0])
            out[source] = (name, shape, validate)
        return out

    def _source(self, ref: str) -> tuple[str, int] | None:
        """The restore op output ``ref`` carries, through identities; None if none."""
        seen = set()
        while ref not in seen:
            seen.add(ref)
            name, index = _output(ref)
            node = self.nodes.get(name)
            if node is None:
                return None
            if node.op in RESTORE_OPS:
                return name, index
            if node.op not in _PASS_THROUGH or not node.input:
                return None
            ref = node.input[index if node.op == "IdentityN" and index < len(node.input) else 0]
        return None


def _node_name(ref: str) -> str:
    """The node an input or tensor name refers to (``^a``, ``a:1`` and ``a`` → ``a``)."""
    return ref.lstrip("^").split(":", 1)[0]


def _output(ref: str) -> tuple[str, int]:
    name, _, index = ref.lstrip("^").partition(":")
    return name, int(index) if index.isdigit() else 0


def _input(node: NodeDef, i: int, graph: MetaGraph) -> str:
    if len(node.input) <= i:
        raise graph._error(node, f"a {node.op} with {len(node.input)} inputs")
    return node.input[i]


def _natural(name: str) -> tuple:
    """``save/RestoreV2_10`` after ``save/RestoreV2_2``: the order TensorFlow made them."""
    stem, _, n = name.rpartition("_")
    return (stem, int(n)) if n.isdigit() else (name, -1)


def saver_version(saver: SaverDef) -> str:
    """The Saver's checkpoint format: ``LEGACY``, ``V1``, ``V2``, or the number of another."""
    names = SaverDef.CheckpointFormatVersion
    return names.Name(saver.version) if saver.version in names.values() else str(saver.version)
