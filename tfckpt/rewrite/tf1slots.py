"""TF1 optimizers' slots as TF2 optimizers keep them (Adam, Momentum, Adagrad,
RMSProp, centred RMSProp, Adadelta, Ftrl), and TF1 Adam's step count from its
``beta1_power`` and ``beta2_power``, and back. A TF1 optimizer made with ``name=``
names its slots after that name (``VAR/MyAdam``, ``VAR/MyAdam_1``), not its powers
(``beta1_power`` whatever its name). Keras' Nadam, Adamax, Lion, Lamb and Adafactor
have no TF1 counterpart: their slots are refused, naming them.

``tf.compat.v1.train.AdamOptimizer`` keeps no step: it starts ``beta1_power`` at
``beta1`` and multiplies it by ``beta1`` after each update (in the variables' dtype,
float32), likewise ``beta2_power``; after ``n`` updates they hold ``beta1**(n+1)``
and ``beta2**(n+1)`` as those ``n`` roundings leave them. A Keras optimizer counts
``iterations`` = ``n`` and corrects its next update with ``beta**(iterations+1)``.
Both powers are replayed here, rounding as TensorFlow rounds, to find ``n``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from tfckpt.errors import CheckpointError
from tfckpt.format.optimizers import OptimizerState

# tf.compat.v1.train.AdamOptimizer's and Keras' defaults.
ADAM_BETAS = (0.9, 0.999)
# Names a TF1 AdamOptimizer (name="Adam") gives what it keeps besides slots.
BETA_POWERS = ("beta1_power", "beta2_power")
GLOBAL_STEP = "global_step"


@dataclass(frozen=True)
class TF1Optimizer:
    """A TF1 optimizer's slots as a TF2 optimizer of the same kind keeps them."""

    name: str  # TF1's default name
    kinds: tuple[frozenset[str], ...]  # the TF2 optimizers of its kind, by their roles
    slots: dict[str, str]  # a TF2 role → its TF1 slot (``VAR/<slot>``)
    keras_names: frozenset[str]  # Keras' names of its optimizers of this kind
    # Keras' momentum is -learning_rate times TF1's accumulation (TF1: a = mu a + g,
    # var -= lr a; Keras: m = mu m - lr g, var += m), so its values are scaled.
    scaled_by_learning_rate: bool = False


# An Adam keeps m and v slots, or the lists _momentums and _velocities alone (a Keras 3
# RMSprop keeps the same lists in the other order; see tfckpt.format.optimizers).
ADAM = TF1Optimizer(
    "Adam",
    (frozenset({"m", "v"}), frozenset({"_momentums", "_velocities"})),
    {"m": "Adam", "v": "Adam_1", "_momentums": "Adam", "_velocities": "Adam_1"},
    frozenset({"adam", "adamw"}),
)
MOMENTUM = TF1Optimizer(
    "Momentum",
    (frozenset({"momentum"}), frozenset({"momentums"})),
    {"momentum": "Momentum", "momentums": "Momentum"},
    frozenset({"sgd"}),
    scaled_by_learning_rate=True,
)
# TF1 Adagrad (accumulator initially 0.1, var -= lr g / sqrt(acc)) and Keras' keep the
# same accumulator (Keras adds its epsilon under or after the root).
ADAGRAD = TF1Optimizer(
    "Adagrad",
    (frozenset({"accumulator"}), frozenset({"_accumulators"})),
    {"accumulator": "Adagrad", "_accumulators": "Adagrad"},
    frozenset({"adagrad"}),
)
# TF1 RMSProp (ms = rho ms + (1-rho) g^2; mom = mu mom + lr g / sqrt(ms + eps);
# var -= mom) and Keras' keep the same two (not centered: TF1 names its mg RMSProp_1).
RMSPROP = TF1Optimizer(
    "RMSProp",
    (
        frozenset({"rms", "momentum"}),
        frozenset({"rms"}),
        frozenset({"_velocities", "_momentums", "+order"}),
        frozenset({"_velocities"}),
    ),
    {
        "rms": "RMSProp",
        "momentum": "RMSProp_1",
        "_velocities": "RMSProp",
        "_momentums": "RMSProp_1",
    },
    frozenset({"rmsprop", "rm_sprop"}),
)
# TF1 Ftrl and Keras' (FTRL-proximal) keep the same accumulator and linear term.
FTRL = TF1Optimizer(
    "Ftrl",
    (frozenset({"accumulator", "linear"}), frozenset({"_accumulators", "_linears"})),
    {"accumulator": "Ftrl", "linear": "Ftrl_1", "_accumulators": "Ftrl", "_linears": "Ftrl_1"},
    frozenset({"ftrl"}),
)
# TF1 RMSProp(centered=True) makes its slots rms, mg, momentum in that order: RMSProp,
# RMSProp_1, RMSProp_2; Keras keeps mg as its average gradient.
CENTERED_RMSPROP = TF1Optimizer(
    "RMSProp",
    (
        frozenset({"rms", "mg", "momentum"}),
        frozenset({"rms", "mg"}),
        frozenset({"_velocities", "_average_gradients", "_momentums", "+order"}),
        frozenset({"_velocities", "_average_gradients", "_momentums"}),
        frozenset({"_velocities", "_average_gradients"}),
    ),
    {
        "rms": "RMSProp",
        "mg": "RMSProp_1",
        "momentum": "RMSProp_2",
        "_velocities": "RMSProp",
        "_average_gradients": "RMSProp_1",
        "_momentums": "RMSProp_2",
    },
    frozenset({"rmsprop", "rm_sprop"}),
)
# TF1 Adadelta's accum and accum_update (Adadelta, Adadelta_1) are Keras' accumulated
# gradients and accumulated updates.
ADADELTA = TF1Optimizer(
    "Adadelta",
    (
        frozenset({"accum_grad", "accum_var"}),
        frozenset({"_accumulated_grads", "_accumulated_delta_vars"}),
    ),
    {
        "accum_grad": "Adadelta",
        "accum_var": "Adadelta_1",
        "_accumulated_grads": "Adadelta",
        "_accumulated_delta_vars": "Adadelta_1",
    },
    frozenset({"adadelta"}),
)
TF1_OPTIMIZERS = (ADAM, MOMENTUM, ADAGRAD, RMSPROP, CENTERED_RMSPROP, ADADELTA, FTRL)
TF1_KINDS = "TF1 Adam's, Momentum's, Adagrad's, Adadelta's, RMSProp's or Ftrl's"
# Keras optimizers tf.compat.v1.train has no counterpart of (known by their name, or
# by their lists: Adamax's _m and _u, Nadam's Adam lists beside its _u_product).
NOT_IN_TF1 = {"nadam": "Nadam", "adamax": "Adamax", "lion": "Lion", "lamb": "Lamb"}
NOT_IN_TF1 |= {"adafactor": "Adafactor"}
_KINDS_NOT_IN_TF1 = {
    frozenset({"_m", "_u"}): "Adamax",
    frozenset({"_momentums", "_velocities", "+extra"}): "Nadam",
    frozenset({"_momentums"}): "Lion",
}
# Keras' names of its optimizers (their variables' names begin with them unless the
# user named it): one of another kind is refused though its slots look alike (a
# tf.keras 2 legacy Adamax or Nadam keeps Adam's very m and v).
KERAS_NAMES = frozenset(
    {"adadelta", "adafactor", "adagrad", "adam", "adamax", "adamw", "ftrl", "lamb", "lion"}
    | {"nadam", "rmsprop", "rm_sprop", "sgd"}
)


def _keras_name(state: OptimizerState, slot: str) -> str:
    """The Keras name of ``slot``'s optimizer, less the ``_N`` Keras 3 adds to a second
    one of a kind (``rm_sprop_1``)."""
    return re.sub(r"_[0-9]+$", "", state.names.get(slot, ""))


def tf1_slot(state: OptimizerState, slot: str) -> tuple[TF1Optimizer, str] | None:
    """The TF1 optimizer whose slot the TF2 ``slot`` is, and that slot's name (``Adam``,
    ``Adam_1``, ``Momentum``); None where its optimizer is none of TF1_OPTIMIZERS."""
    kind, name = state.kinds.get(slot), _keras_name(state, slot)
    for opt in TF1_OPTIMIZERS:
        if kind in opt.kinds and (name not in KERAS_NAMES or name in opt.keras_names):
            return opt, opt.slots[state.slots[slot][1]]
    return None


def no_tf1_slot(state: OptimizerState, slot: str) -> str:
    """Why the TF2 ``slot`` is no TF1 optimizer's slot, in words."""
    name = NOT_IN_TF1.get(_keras_name(state, slot)) or _KINDS_NOT_IN_TF1.get(
        state.kinds.get(slot, frozenset())
    )
    if name is not None:
        return f"a {name} slot: TF1 (tf.compat.v1.train) has no {name} optimizer"
    return f"no {TF1_KINDS} slot"


def children(names) -> dict[str, set[str]]:
    """The last parts of ``names`` by the name above them (``dense/kernel/Adam``:
    ``Adam`` below ``dense/kernel``)."""
    out: dict[str, set[str]] = {}
    for name in names:
        head, sep, tail = name.rpartition("/")
        if sep:
            out.setdefault(head, set()).add(tail)
    return out


def slot_suffix(opt: TF1Optimizer, default: str, tails: set[str]) -> str | None:
    """The name a TF1 run gave the slot TF1 names ``default`` (``Adam_1``) by default:
    ``tails`` are the last parts of the names below the variable (``Adam``,
    ``Adam_1``, ``ExponentialMovingAverage``). A TF1 optimizer made with ``name=``
    names its slots after it (``MyAdam``, ``MyAdam_1``); the one name NAME under which
    exactly this optimizer's slots are (NAME, NAME_1, ...) is taken, the default
    first. None where there is no such name, or more than one."""
    index = int(default[len(opt.name) + 1 :] or 0)
    count = len(set(opt.slots.values()))
    bases = [opt.name] + sorted({re.sub(r"_[0-9]+$", "", t) for t in tails} | tails)
    found = []
    for base in dict.fromkeys(bases):
        below = {t for t in tails if t == base or re.fullmatch(re.escape(base) + r"_[0-9]+", t)}
        if below == {base, *(f"{base}_{k}" for k in range(1, count))}:
            found.append(base)
            if base == opt.name:
                break
    if len(found) != 1:
        return None
    return found[0] if index == 0 else f"{found[0]}_{index}"


def learning_rate(state: OptimizerState, slot: str, ckpt) -> float:
    """The learning rate of the TF2 ``slot``'s optimizer, read from ``ckpt``."""
    key = state.learning_rates.get(slot)
    if key is None or key not in ckpt:
        raise CheckpointError(
            f"{slot!r} is a momentum, which Keras keeps scaled by its learning rate: "
            "its optimizer keeps none (a schedule?)",
            path=ckpt.prefix,
        )
    rate = float(ckpt[key])
    if not rate:
        raise CheckpointError(f"{key!r} is 0: no momentum scales by it", path=ckpt.prefix)
    return rate


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


def tf1_names(
    state: OptimizerState, names: dict[str, str], ckpt, betas=ADAM_BETAS
) -> tuple[dict[str, float], list[tuple[str, np.ndarray]]]:
    """Name a TF2 Adam's, momentum SGD's, Adagrad's, RMSprop's or Ftrl's state as TF1's
    optimizers do, in ``names`` (key → new name, every variable's given): each slot
    its variable's new name and its TF1 slot's (``/Adam``, ``/Adam_1``, ``/Momentum``,
    ``/Adagrad``, ``/RMSProp``, ``/RMSProp_1`` (``/RMSProp_2`` centred), ``/Adadelta``,
    ``/Adadelta_1``, ``/Ftrl``, ``/Ftrl_1``), the step count
    ``global_step``. Returns the factors of the slots to scale (a momentum's:
    -1/learning_rate) and what TF1 Adam keeps besides: ``beta1_power`` and
    ``beta2_power`` after that many steps (read from ``ckpt``)."""
    if not state.slots:
        raise CheckpointError("no optimizer slots to name as TF1's", path=ckpt.prefix)
    scales: dict[str, float] = {}
    adam = None
    for slot, (var, role) in state.slots.items():
        found = tf1_slot(state, slot)
        if found is None:
            raise CheckpointError(
                f"{slot!r} is its optimizer's {role.strip('_')!r} slot, {no_tf1_slot(state, slot)}",
                path=ckpt.prefix,
            )
        opt, suffix = found
        names[slot] = f"{names[var]}/{suffix}"
        if opt.scaled_by_learning_rate:
            scales[slot] = -1.0 / learning_rate(state, slot, ckpt)
        if opt is ADAM and adam is None:
            adam = slot
    if len(state.steps) != 1:
        raise CheckpointError(
            f"TF1 needs one step count; the object graph has {len(state.steps)}",
            path=ckpt.prefix,
        )
    (step,) = state.steps
    names[step] = GLOBAL_STEP
    if adam is None:
        return scales, []
    dtype = ckpt.info(adam).dtype
    powers = powers_after(int(ckpt[step]), betas, dtype)
    taken = set(names.values())
    clash = [p for p in BETA_POWERS if p in taken]
    if clash:
        raise CheckpointError(f"{clash[0]!r} would name two tensors", path=ckpt.prefix)
    return scales, [(p, np.array(v, dtype=dtype)) for p, v in zip(BETA_POWERS, powers)]
