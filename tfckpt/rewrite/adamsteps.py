"""TF1 Adam's step count from its ``beta1_power`` and ``beta2_power``, and back.

``tf.compat.v1.train.AdamOptimizer`` keeps no step: it starts ``beta1_power`` at
``beta1`` and multiplies it by ``beta1`` after each update (in the variables' dtype,
float32), likewise ``beta2_power``; after ``n`` updates they hold ``beta1**(n+1)``
and ``beta2**(n+1)`` as those ``n`` roundings leave them. A Keras optimizer counts
``iterations`` = ``n`` and corrects its next update with ``beta**(iterations+1)``.
Both powers are replayed here, rounding as TensorFlow rounds, to find ``n``.
"""

from __future__ import annotations

import numpy as np

from tfckpt.errors import CheckpointError

# tf.compat.v1.train.AdamOptimizer's and Keras' defaults.
ADAM_BETAS = (0.9, 0.999)
# Names a TF1 AdamOptimizer (name="Adam") gives what it keeps besides slots.
BETA_POWERS = ("beta1_power", "beta2_power")


def powers_after(steps: int, betas=ADAM_BETAS, dtype="float32") -> tuple[float, float]:
    """``beta1_power`` and ``beta2_power`` after ``steps`` updates, rounded as TF1 Adam
    rounds them in ``dtype``.

    >>> powers_after(2)  # 0.9**3, 0.999**3 in float32
    """
    dt = np.dtype(dtype)
    out = []
    for b in betas:
        beta = dt.type(b)
        p = beta
        for _ in range(steps):
            p = dt.type(p * beta)
        out.append(float(p))
    return out[0], out[1]


def steps_from_powers(
    beta1_power: float, beta2_power: float, betas=ADAM_BETAS, dtype="float32"
) -> list[int]:
    """Every update count ``n`` after which TF1 Adam holds these powers: none when they
    are not ``betas``' powers, one as a rule, and ``[n, -1]`` when they stopped
    changing (underflow) at ``n``, so any later count holds them too."""
    dt = np.dtype(dtype)
    b1, b2 = dt.type(betas[0]), dt.type(betas[1])
    want1, want2 = dt.type(beta1_power), dt.type(beta2_power)
    if not (0 < betas[0] < 1 and 0 < betas[1] < 1):
        raise CheckpointError(f"Adam's betas must lie between 0 and 1, not {betas}")
    p1, p2, n = b1, b2, 0
    found: list[int] = []
    while p1 >= want1 and p2 >= want2:
        if p1 == want1 and p2 == want2:
            found.append(n)
        q1, q2 = dt.type(p1 * b1), dt.type(p2 * b2)
        if q1 == p1 and q2 == p2:  # both stopped changing: every later n matches too
            return [*found, -1] if found else found
        p1, p2, n = q1, q2, n + 1
    return found
