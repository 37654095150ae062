"""The original OpenAI GPT release's weights (``openai/finetune-transformer-lm``: a
``model/`` directory of numpy shards), as bytes: which files, which parameters, where.

The release holds no TensorFlow checkpoint. Its ``model/params_shapes.json`` lists the
shape of each parameter in the order ``train.py`` creates them, and
``model/params_0.npy`` ... ``params_9.npy`` hold all of them, flattened and
concatenated, cut into consecutive pieces: each shard a one-dimensional ``.npy`` array.
``train.py`` loads them by concatenating the shards, splitting the result at the
running sums of the shapes' sizes and reshaping each piece.

The shapes are those of ``train.py``'s model: first the position embeddings
``[n_ctx, n_embd]`` and the token embeddings ``[n_vocab, n_embd]`` (``train.py`` makes
its variable ``model/we`` of the tokens, ``n_special`` fresh rows and the positions, in
that order), then twelve per block ``h<i>``: the attention's ``c_attn`` and ``c_proj``
(weights ``[1, n_in, n_out]``: a width-1 convolution), ``ln_1``, the MLP's ``c_fc`` and
``c_proj``, ``ln_2``. :func:`parameters` names them as ``train.py``'s variables are
named (``model/h0/attn/c_attn/w``, without TensorFlow's ``:0``), the two embeddings as
the pieces of ``model/we`` they are (``model/we/positions``, ``model/we/tokens``), and
refuses shapes its model cannot have. :func:`npy_header` reads a shard's ``.npy``
header with numpy's own parser, never unpickling: an array of Python objects is refused.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

import numpy as np

from tfckpt.errors import CorruptCheckpointError, UnknownDTypeError, UnsupportedCheckpointError
from tfckpt.format.dtypes import DType, Endianness, lookup
from tfckpt.format.tensorfiles import parse_json

SHAPES_NAME = "params_shapes.json"
SHARD_RE = re.compile(r"^params_(0|[1-9][0-9]{0,5})\.npy$")
# The release's shapes file is 1 478 bytes; a model of thousands of blocks stays far under.
MAX_SHAPES_BYTES = 1 << 20
# A .npy header is a few dozen bytes; numpy refuses one over 10 000 unless told otherwise.
MAX_HEADER_BYTES = 10_000
HEAD_BYTES = 12 + MAX_HEADER_BYTES  # magic, version, length, header
POSITIONS, TOKENS = "model/we/positions", "model/we/tokens"
PER_BLOCK = 12
# Each block's parameters in train.py's order: name, and shape in units of n_embd (the
# weights' leading 1 is the convolution's width).
_BLOCK = (
    ("attn/c_attn/w", (None, 1, 3)),
    ("attn/c_attn/b", (3,)),
    ("attn/c_proj/w", (None, 1, 1)),
    ("attn/c_proj/b", (1,)),
    ("ln_1/g", (1,)),
    ("ln_1/b", (1,)),
    ("mlp/c_fc/w", (None, 1, 4)),
    ("mlp/c_fc/b", (4,)),
    ("mlp/c_proj/w", (None, 4, 1)),
    ("mlp/c_proj/b", (1,)),
    ("ln_2/g", (1,)),
    ("ln_2/b", (1,)),
)


def shard_name(k: int) -> str:
    """The file name of shard ``k``: ``params_K.npy``."""
    return f"params_{k}.npy"


def parse_shapes(data: bytes, path: str) -> list[tuple[int, ...]]:
    """``params_shapes.json``'s shapes: a JSON list of lists of non-negative integers."""
    if len(data) > MAX_SHAPES_BYTES:
        raise CorruptCheckpointError(
            f"{len(data)} bytes: more than a list of shapes takes", path=path
        )
    value = parse_json(data, path, "the shapes file")
    if type(value) is not list or not value:  # parse_json's objects are lists of pairs
        raise CorruptCheckpointError(
            "expected a JSON list of shapes (lists of integers)", path=path
        )
    shapes = []
    for i, shape in enumerate(value):
        if type(shape) is not list or not all(type(d) is int and 0 <= d < 1 << 62 for d in shape):
            raise CorruptCheckpointError(
                f"shape {i} is {str(shape)[:60]}, not a list of non-negative integers",
                path=path,
            )
        shapes.append(tuple(shape))
    return shapes


def parameters(shapes: list[tuple[int, ...]], path: str) -> list[str]:
    """The name of each of ``shapes`` (``params_shapes.json``, at ``path``) as
    ``train.py`` names its parameter; an error naming the first shape its model cannot
    have (a count that is no number of blocks, a shape that is not its block's)."""
    if len(shapes) < 2 or (len(shapes) - 2) % PER_BLOCK:
        raise CorruptCheckpointError(
            f"{len(shapes)} shapes: train.py's model has 2 embeddings and {PER_BLOCK} "
            "parameters per block",
            path=path,
        )
    positions, tokens = shapes[0], shapes[1]
    if len(positions) != 2 or len(tokens) != 2 or positions[1] != tokens[1] or not tokens[1]:
        raise CorruptCheckpointError(
            f"the embeddings' shapes {list(positions)} and {list(tokens)} are not "
            "[n_ctx, n_embd] and [n_vocab, n_embd]",
            path=path,
        )
    n = tokens[1]
    names = [POSITIONS, TOKENS]
    for i in range(2, len(shapes)):
        block, k = divmod(i - 2, PER_BLOCK)
        suffix, units = _BLOCK[k]
        name = f"model/h{block}/{suffix}"
        want = tuple(1 if u is None else u * n for u in units)
        if shapes[i] != want:
            raise CorruptCheckpointError(
                f"shape {i} ({name}) is {list(shapes[i])}; train.py's model with n_embd {n} "
                f"makes it {list(want)}",
                path=path,
            )
        names.append(name)
    return names


@dataclass(frozen=True)
class NpyHeader:
    """A shard's ``.npy`` header: its elements' dtype (and byte order), their count, and
    where they start in the file."""

    dtype: DType
    order: Endianness
    count: int
    offset: int

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.fixed_itemsize


def npy_header(head: bytes, size: int, path: str) -> NpyHeader:
    """The header of the ``.npy`` file ``path`` of ``size`` bytes, whose first bytes
    are ``head``: one-dimensional, of a fixed-size numeric dtype, the file holding its
    elements exactly."""
    f = io.BytesIO(head)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dt = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dt = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"unknown .npy version {version}")
    except (ValueError, SyntaxError, TypeError, EOFError) as e:
        raise CorruptCheckpointError(f"not a readable .npy file: {e}", path=path) from None
    offset = f.tell()
    if dt.hasobject:
        raise UnsupportedCheckpointError(
            f"its dtype {dt.str!r} holds Python objects (a pickle), which tfckpt never "
            "loads: a shard of the release holds numbers",
            path=path,
        )
    if dt.names is not None or dt.subdtype is not None or dt.kind not in "biufc":
        raise UnsupportedCheckpointError(
            f"its dtype {str(dt)[:60]!r} is not a numeric one: a shard of the release holds "
            "numbers",
            path=path,
        )
    if len(shape) != 1:
        raise CorruptCheckpointError(
            f"an array of shape {list(shape)[:8]}: a shard of the release is one-dimensional "
            "(the parameters, flattened and concatenated)",
            path=path,
        )
    try:
        dtype = lookup(dt.newbyteorder("="))
    except UnknownDTypeError:
        raise UnsupportedCheckpointError(
            f"dtype {dt.str!r}: not one tfckpt reads", path=path
        ) from None
    big = dt.byteorder == ">" or (dt.byteorder == "=" and not np.little_endian)
    header = NpyHeader(dtype, "big" if big else "little", int(shape[0]), offset)
    if size != offset + header.nbytes:
        raise CorruptCheckpointError(
            f"{size} bytes; its header says {header.count} {dtype.name} elements after "
            f"{offset} bytes of header: {offset + header.nbytes} bytes"
            + ("; the file is truncated" if size < offset + header.nbytes else ""),
            path=path,
        )
    return header
