"""``tf.cast`` as the rounding step of tfckpt's casts, on the best device TensorFlow sees."""

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


class _Converter:
    """``tf.cast`` on one device; ``device`` says which."""

    def __init__(self, device: str):
        self.device = device
        self._tf = tensorflow()

    def __call__(self, chunk: np.ndarray, target: np.dtype) -> np.ndarray:
        tf = self._tf
        with tf.device(self.device):
            out = tf.cast(tf.constant(chunk), tf.as_dtype(target)).numpy()
        # TensorFlow's CPU threads flush values below float32's normal range to zero
        # (in and out); those few elements are rounded here instead, as IEEE says.
        with np.errstate(invalid="ignore"):
            tiny = np.abs(chunk) < _F32_TINY
            tiny &= chunk != 0
        if tiny.any():
            out[tiny] = chunk[tiny].astype(target)
        return out


def converter(device: str | None = None) -> _Converter:
    """A ``convert(chunk, numpy_dtype)`` for :class:`tfckpt.rewrite.cast.Caster` running
    ``tf.cast``."""
    return _Converter(device or best_device())
