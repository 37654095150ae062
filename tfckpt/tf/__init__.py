"""The TensorFlow bridge: the only part of tfckpt that imports TensorFlow.

Nothing here is imported by ``import tfckpt``; TensorFlow is loaded on the first
call of one of these functions.
"""

from tfckpt.tf.cast import best_device, converter, sees_gpu
from tfckpt.tf.restore import Restored, RestoreReport, check, restore
from tfckpt.tf.verify import verify_with_tf

__all__ = [
    "restore",
    "check",
    "RestoreReport",
    "Restored",
    "verify_with_tf",
    "converter",
    "best_device",
    "sees_gpu",
]
