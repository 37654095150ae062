"""Natural order of names: the shortcut for names whose digit runs all have one length
must give exactly the order the natural key sorts in."""

from __future__ import annotations

import random

import pytest

from tfckpt.format.natural import in_natural_order, natural_key

# Characters around the digits in code point order ('/' and ':' border them, ';' follows
# the character a natural key gives a run of 11 digits).
_OTHERS = "/:;_.-aZz~ \u00e9"


def _name(rng: random.Random, run_length) -> str:
    parts = []
    for k in range(rng.randint(0, 4)):
        parts.append("".join(rng.choice(_OTHERS) for _ in range(rng.randint(1, 3))))
        parts.append("".join(rng.choice("0123456789") for _ in range(run_length(rng, k))))
    return "".join(parts)


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize(
    "lengths", ["uniform", "uniform9", "uniform10", "uniform11", "by_index", "mixed"]
)
def test_in_natural_order_equals_the_natural_sort(seed, lengths):
    rng = random.Random(seed)
    fixed = {"uniform": rng.randint(1, 4), "uniform9": 9, "uniform10": 10, "uniform11": 11}.get(
        lengths
    )

    by_index = [rng.randint(1, 9) for _ in range(4)]  # the k-th run's length

    def run_length(r: random.Random, k: int) -> int:
        if lengths == "by_index":
            return by_index[k]
        return fixed if fixed is not None else r.randint(1, 11)

    names = sorted({_name(rng, run_length) for _ in range(300)})
    assert in_natural_order(names) == sorted(names, key=natural_key)


def test_examples():
    assert in_natural_order(["v/1", "v/10", "v/2"]) == ["v/1", "v/2", "v/10"]
    assert in_natural_order(["s_0001/v_07", "s_0001/v_08", "s_0002/v_00"]) == [
        "s_0001/v_07",
        "s_0001/v_08",
        "s_0002/v_00",
    ]
    assert in_natural_order(["b", "a"]) == ["b", "a"]  # an order of their own stays


def test_a_run_longer_than_nine_digits_takes_the_natural_key():
    """11 digits: the key's length character (';') sorts after ':', a digit before it."""
    names = sorted(["a:", "a" + "1" * 11])
    assert in_natural_order(names) == sorted(names, key=natural_key) == ["a:", "a" + "1" * 11]


def test_runs_of_one_length_by_their_place_in_the_name():
    names = ["s_0001/v_07", "s_0001/v_10", "s_0002/v_00"]
    assert in_natural_order(names) == names
    names = sorted(["s_1/v_2", "s_10/v_1", "s_9/v_3"])
    assert in_natural_order(names) == ["s_1/v_2", "s_9/v_3", "s_10/v_1"]


def test_digits_of_other_scripts_take_the_natural_key():
    names = sorted(["a\u0663", "a\u0661\u0660", "a2"])  # Arabic-Indic 3, then 10
    assert in_natural_order(names) == sorted(names, key=natural_key)
