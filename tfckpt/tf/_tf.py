"""Loading TensorFlow, once, quietly, with a clear error when it is not installed."""

from __future__ import annotations

import os

from tfckpt.errors import CheckpointError, install_hint


def tensorflow():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        import tensorflow as tf
    except ImportError as e:
        raise CheckpointError(
            f"TensorFlow is needed for this; install it with {install_hint('tf')} ({e})"
        ) from None
    return tf
