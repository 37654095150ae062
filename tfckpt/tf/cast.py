"""``tf.cast`` as the rounding step of tfckpt's casts, on the best device TensorFlow sees.

On a GPU a chunk goes through in pieces, double-buffered: the copy of piece k+1 to the
device and its cast are queued before the result of piece k is copied back, so the
device casts one piece while the link carries the next (TensorFlow runs a GPU's work
asynchronously until a result is read). On the CPU a chunk is one piece; the pieces
give the same bits either way, as the cast is element by element.
"""

from __future__ import annotations

import importlib.util

import numpy as np

from tfckpt.tf._tf import tensorflow

_F32_TINY = np.finfo(np.float32).tiny


def best_device() -> str:
    tf = tensorflow()
    return "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"


def sees_gpu() -> bool:
    """True when TensorFlow is installed and sees a GPU (imports TensorFlow only if installed)."""
    if importlib.util.find_spec("tensorflow") is None:
        return False
    return bool(tensorflow().config.list_logical_devices("GPU"))


# Pieces of a chunk in flight on a GPU: one being copied in and cast while the previous
# one's result is copied back.
GPU_PIECES = 4
MIN_PIECE = 1 << 18  # elements: smaller pieces cost more in dispatch than they overlap


class _Converter:
    """``tf.cast`` on one device; ``device`` says which, ``pieces`` in how many pieces
    a chunk is double-buffered through it (default: :data:`GPU_PIECES` on a GPU, else 1)."""

    def __init__(self, device: str, pieces: int | None = None):
        self.device = device
        self.pieces = pieces or (GPU_PIECES if "GPU" in device.upper() else 1)
        self._tf = tensorflow()

    def __call__(self, chunk: np.ndarray, target: np.dtype) -> np.ndarray:
        tf = self._tf
        flat = chunk.reshape(-1)
        out = np.empty(flat.shape, dtype=target)
        k = max(1, min(self.pieces, flat.size // MIN_PIECE))
        step = -(-flat.size // k) if flat.size else 1
        to = tf.as_dtype(target)
        with tf.device(self.device):
            queued = None  # (where, the piece's result on the device), not yet read
            for start in range(0, flat.size, step):
                # tf.identity under the device: the copy in, queued like the cast.
                cast = tf.cast(tf.identity(tf.constant(flat[start : start + step])), to)
                if queued is not None:
                    out[queued[0]] = queued[1].numpy()
                queued = (slice(start, start + step), cast)
            if queued is not None:
                out[queued[0]] = queued[1].numpy()
        out = out.reshape(chunk.shape)
        # TensorFlow's CPU threads flush values below float32's normal range to zero
        # (in and out); those few elements are rounded here instead, as IEEE says.
        with np.errstate(invalid="ignore"):
            tiny = np.abs(chunk) < _F32_TINY
            tiny &= chunk != 0
        if tiny.any():
            out[tiny] = chunk[tiny].astype(target)
        return out


def converter(device: str | None = None, pieces: int | None = None) -> _Converter:
    """A ``convert(chunk, numpy_dtype)`` for :class:`tfckpt.rewrite.cast.Caster` running
    ``tf.cast`` (``pieces``: see :class:`_Converter`)."""
    return _Converter(device or best_device(), pieces)
