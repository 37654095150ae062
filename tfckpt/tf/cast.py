"""``tf.cast`` as the rounding step of tfckpt's casts, on the best device TensorFlow sees."""

from __future__ import annotations

import importlib.util

import numpy as np

from ._tf import tensorflow


def best_device() -> str:
    tf = tensorflow()
    return "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"


def sees_gpu() -> bool:
    """True when TensorFlow is installed and sees a GPU (imports TensorFlow only if installed)."""
    if importlib.util.find_spec("tensorflow") is None:
        return False
    return bool(tensorflow().config.list_logical_devices("GPU"))


def converter(device: str | None = None):
    """A ``convert(chunk, numpy_dtype)`` for :class:`tfckpt.cast.Caster` running ``tf.cast``."""
    tf = tensorflow()
    dev = device or best_device()

    def convert(chunk: np.ndarray, target: np.dtype) -> np.ndarray:
        with tf.device(dev):
            return tf.cast(tf.constant(chunk), tf.as_dtype(target)).numpy()

    convert.device = dev
    return convert
