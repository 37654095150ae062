"""PackedBytes reads as the list of bytes it packs; the bulk decoders give the same from it."""

from __future__ import annotations

import bisect
import dataclasses
import random

import numpy as np
import pytest

from tfckpt._proto.tensor_bundle_pb2 import BundleEntryProto
from tfckpt.format.bundle import decode_entries
from tfckpt.format.orderedcode import decode_names
from tfckpt.format.packed import PackedBytes


def _strings(rng: random.Random, n: int, alphabet: bytes = b"ab/_\x00\xff\xc3\xa9") -> list[bytes]:
    return [bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 9))) for _ in range(n)]


@pytest.mark.parametrize("seed", range(5))
def test_reads_as_the_list_it_packs(seed):
    rng = random.Random(seed)
    items = _strings(rng, rng.randrange(0, 60))
    packed = PackedBytes()
    half = len(items) // 2
    packed.extend(items[:half])
    for item in items[half:]:
        packed.append(item)
    for p in (packed, packed.frozen()):
        assert len(p) == len(items) and list(p) == items
        assert [p[i] for i in range(len(items))] == items
        assert all(type(p[i]) is bytes for i in range(len(items)))
        if items:
            assert p[-1] == items[-1]
        for a in range(len(items) + 1):
            b = rng.randrange(a, len(items) + 1)
            view = p[a:b]
            assert list(view) == items[a:b] and view.joined() == b"".join(items[a:b])
            rows = [rng.randrange(len(view)) for _ in range(rng.randrange(0, 7))] if view else []
            assert list(view.take(rows)) == [items[a:b][r] for r in rows]
        ordered = PackedBytes.of(sorted(set(items))).frozen()
        for probe in _strings(rng, 20):
            assert bisect.bisect_left(ordered, probe) == bisect.bisect_left(
                sorted(set(items)), probe
            )


@pytest.mark.parametrize("alphabet", [b"ab/_c", b"ab/\xc3\xa9\xff", b"a\x00b"])
def test_names_decode_from_a_packed_column_as_from_a_list(alphabet):
    items = _strings(random.Random(7), 500, alphabet)
    packed = PackedBytes.of(items).frozen()
    assert decode_names(packed) == decode_names(items)
    assert decode_names(packed[3:40]) == decode_names(items[3:40])
    assert decode_names(packed[5:5]) == []


def test_entries_decode_from_a_packed_column_as_from_a_list():
    rng = np.random.default_rng(3)
    raws = []
    for i in range(300):
        e = BundleEntryProto(dtype=1 + i % 3, shard_id=i % 2, offset=int(rng.integers(1 << 40)))
        e.size = 4 * (i % 5)
        for d in rng.integers(0, 9, size=i % 4):
            e.shape.dim.add(size=int(d))
        e.crc32c = int(rng.integers(1 << 32))
        raws.append(e.SerializeToString())
    raws.append(b"\x08")  # broken: a tag without its value
    packed = PackedBytes.of(raws).frozen()
    for got, want in (
        (decode_entries(packed), decode_entries(raws)),
        (decode_entries(packed[10:200]), decode_entries(raws[10:200])),
        (
            decode_entries(packed.take([299, 300, 0])),
            decode_entries([raws[299], raws[300], raws[0]]),
        ),
    ):
        for f in dataclasses.fields(got):
            np.testing.assert_array_equal(getattr(got, f.name), getattr(want, f.name))
