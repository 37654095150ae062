"""What a file that is not a TensorFlow checkpoint is, from its name and first bytes: the
one place that names the files people take for checkpoints (safetensors, npz, PyTorch
pickles, ONNX, TensorFlow Lite, Keras archives, graphs), and says which command handles
each. Bytes only: the caller reads the head (:data:`HEAD_BYTES`); nothing is unpickled
or parsed beyond a few magic numbers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

HEAD_BYTES = 512  # what :func:`identify` looks at
ZIP_MAGIC = b"PK\x03\x04"
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
# A pickle of protocol 2 to 5 starts with PROTO n; PyTorch's legacy format is one.
_PICKLE_HEADS = tuple(bytes([0x80, n]) for n in range(2, 6))
_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle")
# Members that begin a Keras 3 .keras zip.
_KERAS_MEMBERS = ("metadata.json", "config.json", "model.weights.h5", "assets/")
# Members that begin a torch.save zip (under the archive's own name).
_TORCH_MEMBERS = ("data.pkl", ".format_version", "byteorder", "version")


@dataclass(frozen=True)
class FileKind:
    """A kind of file, and what to do with it instead of opening it as a checkpoint."""

    name: str  # short: "safetensors", "pytorch", ...
    what: str  # "a safetensors file"
    instead: str  # the command (or library) that handles it

    def message(self) -> str:
        """One line: what the file is, and what handles it."""
        return f"{self.what}, not a TensorFlow checkpoint; {self.instead}"


SAFETENSORS = FileKind(
    "safetensors",
    "a safetensors file",
    "tfckpt import FILE OUT_PREFIX makes a checkpoint of it (tfckpt match maps names onto it)",
)
SAFETENSORS_INDEX = FileKind(
    "safetensors-index",
    "the index of sharded safetensors files",
    "tfckpt import FILE OUT_PREFIX makes one checkpoint of the shards it lists",
)
NPZ = FileKind("npz", "an npz file of arrays", "tfckpt import FILE OUT_PREFIX makes one of it")
PYTORCH = FileKind(
    "pytorch",
    "a PyTorch pickle (torch.save)",
    "tfckpt never unpickles files; save it as safetensors "
    "(safetensors.torch.save_file) and run tfckpt import on that",
)
PICKLE = FileKind(
    "pickle",
    "a Python pickle",
    "tfckpt never unpickles files; save its arrays as safetensors or npz and run "
    "tfckpt import on that",
)
ONNX = FileKind("onnx", "an ONNX model", "tfckpt does not read ONNX (onnx.load does)")
TFLITE = FileKind(
    "tflite",
    "a TensorFlow Lite model (.tflite)",
    "tfckpt does not read it (tf.lite.Interpreter does); convert from the checkpoint "
    "the model was trained from",
)
KERAS = FileKind(
    "keras",
    "a Keras 3 .keras archive",
    "load it with keras.saving.load_model",
)
META_GRAPH = FileKind(
    "meta-graph",
    "a MetaGraphDef (.meta) graph file: it holds no variable values",
    "open the checkpoint beside it (tfckpt dump FILE lists the graph's variables, "
    "tfckpt check CKPT --against FILE what its Saver restores)",
)
SAVED_MODEL = FileKind(
    "saved-model",
    "a SavedModel graph (saved_model.pb)",
    "open the SavedModel directory, whose variables/ hold the values (tfckpt dump FILE "
    "shows the graph, tfckpt check CKPT --against DIR what it restores)",
)
GRAPH = FileKind(
    "graph",
    "a TensorFlow graph file (.pb)",
    "it holds no checkpoint; open the SavedModel directory or the checkpoint",
)
HDF5_WITHOUT_SIGNATURE = FileKind(
    "hdf5-named",
    "a file named as HDF5, but HDF5's signature is not where HDF5 looks for it",
    "tfckpt reads Keras HDF5 weights (model.h5, tf_model.h5) that are HDF5 files",
)
EMPTY = FileKind("empty", "an empty file", "a checkpoint's index is never empty")

KINDS: tuple[FileKind, ...] = (
    SAFETENSORS,
    SAFETENSORS_INDEX,
    NPZ,
    PYTORCH,
    PICKLE,
    ONNX,
    TFLITE,
    KERAS,
    META_GRAPH,
    SAVED_MODEL,
    GRAPH,
)


def identify(name: str, head: bytes, size: int | None = None) -> FileKind | None:
    """The kind of the file named ``name`` (its last component is what counts) that
    begins with ``head`` (up to :data:`HEAD_BYTES`) and holds ``size`` bytes, when it is
    one people take for a checkpoint; None for anything else (a checkpoint, HDF5 with
    its signature, an archive that may hold checkpoints, an unknown file).

    >>> identify("model.safetensors", b"\\x10\\0\\0\\0\\0\\0\\0\\0{...}").name
    'safetensors'
    """
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    lower = base.lower()
    if not head:
        return EMPTY if size in (0, None) else None
    if _is_safetensors(head, size):
        return SAFETENSORS
    if lower.endswith(".safetensors.index.json"):
        return SAFETENSORS_INDEX
    if head.startswith(ZIP_MAGIC):
        return _zip_kind(lower, _first_member(head))
    if head.startswith(_PICKLE_HEADS) or (head[:1] == b"\x80" and lower.endswith(_TORCH_SUFFIXES)):
        return PYTORCH if lower.endswith(_TORCH_SUFFIXES) else PICKLE
    if head[4:8] == b"TFL3":
        return TFLITE
    if lower.endswith(".onnx"):
        return ONNX
    if lower.endswith((".h5", ".hdf5", ".he5", ".hdf")) and not head.startswith(HDF5_MAGIC):
        # The signature may be past a user block: the caller looks there first.
        return HDF5_WITHOUT_SIGNATURE
    if lower.endswith(".meta"):
        return META_GRAPH
    if lower in ("saved_model.pb", "saved_model.pbtxt"):
        return SAVED_MODEL
    if lower.endswith((".pb", ".pbtxt")):
        return GRAPH
    return None


def _is_safetensors(head: bytes, size: int | None) -> bool:
    # An 8-byte little-endian header length, then the JSON header itself.
    if len(head) < 10:
        return False
    (length,) = struct.unpack("<Q", head[:8])
    fits = size is None or 8 + length <= size
    return 2 <= length < (1 << 40) and fits and head[8:9] == b"{" and head[9:10] in b'"}'


def _first_member(head: bytes) -> str:
    # A zip's first local file header: the name's length at offset 26, the name at 30.
    if len(head) < 30:
        return ""
    (length,) = struct.unpack("<H", head[26:28])
    return head[30 : 30 + length].decode("utf-8", "replace")


def _zip_kind(lower: str, member: str) -> FileKind | None:
    # torch.save writes ARCHIVE_NAME/data.pkl (and .format_version, byteorder...) first.
    if member.rsplit("/", 1)[-1] in _TORCH_MEMBERS:
        return PYTORCH
    if lower.endswith(".keras") or member in _KERAS_MEMBERS:
        return KERAS
    if lower.endswith(".npz") or member.endswith(".npy"):
        return NPZ
    if lower.endswith(_TORCH_SUFFIXES):
        return PYTORCH
    return None
