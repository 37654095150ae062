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
from tfckpt.format.optimizers import OptimizerState

# tf.compat.v1.train.AdamOptimizer's and Keras' defaults.
ADAM_BETAS = (0.9, 0.999)
# Names a TF1 AdamOptimizer (name="Adam") gives what it keeps besides slots.
BETA_POWERS = ("beta1_power", "beta2_power")
GLOBAL_STEP = "global_step"
# The TF1 slot (``VAR/Adam``) of each role a TF2 optimizer gives a slot (see
# tfckpt.format.optimizers): tf.compat.v1.train.AdamOptimizer's, named "Adam".
TF1_ADAM_SLOTS = {"m": "Adam", "v": "Adam_1", "_momentums": "Adam", "_velocities": "Adam_1"}
# The roles an Adam's optimizer keeps, in each layout (an SGD keeps momentums alone,
# a Keras 3 RMSprop momentums and velocities in the other order).
ADAM_KINDS = (frozenset({"m", "v"}), frozenset({"_momentums", "_velocities"}))


def adam_slot(state: OptimizerState, slot: str) -> str | None:
    """The TF1 Adam slot name (``Adam``, ``Adam_1``) of the TF2 ``slot``; None where its
    optimizer is not an Adam."""
    if state.kinds.get(slot) not in ADAM_KINDS:
        return None
    return TF1_ADAM_SLOTS.get(state.slots[slot][1])


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
            q = dt.type(p * beta)
            if q == p:  # stopped changing (underflow): so it stays
                break
            p = q
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


def tf1_adam_names(
    state: OptimizerState, names: dict[str, str], ckpt, betas=ADAM_BETAS
) -> list[tuple[str, np.ndarray]]:
    """Name a TF2 Adam's state as TF1's AdamOptimizer does, in ``names`` (key → new
    name, every variable's given): each slot its variable's new name and ``/Adam``
    or ``/Adam_1``, the step count ``global_step``. Returns what TF1 keeps besides:
    ``beta1_power`` and ``beta2_power`` after that many steps (read from ``ckpt``)."""
    if not state.slots:
        raise CheckpointError("no optimizer slots to name as TF1 Adam's", path=ckpt.prefix)
    for slot, (var, role) in state.slots.items():
        suffix = adam_slot(state, slot)
        if suffix is None:
            raise CheckpointError(
                f"{slot!r} is its optimizer's {role.strip('_')!r} slot, not an Adam's: "
                "TF1 Adam has none",
                path=ckpt.prefix,
            )
        names[slot] = f"{names[var]}/{suffix}"
    if len(state.steps) != 1:
        raise CheckpointError(
            f"TF1 Adam needs one step count; the object graph has {len(state.steps)}",
            path=ckpt.prefix,
        )
    (step,) = state.steps
    names[step] = GLOBAL_STEP
    count = int(ckpt[step])
    dtype = ckpt.info(next(iter(state.slots))).dtype
    powers = powers_after(count, betas, dtype)
    taken = set(names.values())
    clash = [p for p in BETA_POWERS if p in taken]
    if clash:
        raise CheckpointError(f"{clash[0]!r} would name two tensors", path=ckpt.prefix)
    return [(p, np.array(v, dtype=dtype)) for p, v in zip(BETA_POWERS, powers)]
