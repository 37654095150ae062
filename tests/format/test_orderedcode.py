"""OrderedCode slice keys (``tfckpt.format.orderedcode``) against byte vectors TensorFlow wrote.

Expected bytes come from FORMAT.md (keys TensorFlow 2.21 wrote) and from the
encoding rules of TensorFlow's ``orderedcode.cc``, written out by hand.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfckpt.format import orderedcode as oc

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


# --- the keys TensorFlow wrote (FORMAT.md) -----------------------------------------

EMB_ROWS_0_4 = b"\x00" + b"emb\x00\x01" + b"\x01\x02" + b"\x80\x84\x80\x84"
EMB_ROWS_4_7 = b"\x00" + b"emb\x00\x01" + b"\x01\x02" + b"\x84\x83\x80\x84"
EMB_0_4_FULL = b"\x00" + b"emb\x00\x01" + b"\x01\x02" + b"\x80\x84\x80\x7f"


@pytest.mark.parametrize(
    "extents,key",
    [
        (((0, 4), (0, 4)), EMB_ROWS_0_4),
        (((4, 3), (0, 4)), EMB_ROWS_4_7),
        (((0, 4), (0, None)), EMB_0_4_FULL),
    ],
)
def test_tensorflow_slice_keys(extents, key):
    assert oc.encode_slice_key("emb", extents) == key
    assert oc.decode_slice_key(key) == ("emb", extents)


def test_slice_key_parts():
    assert oc.encode_num_increasing(0) == b"\x00"
    assert oc.encode_string(b"emb") == b"emb\x00\x01"
    assert oc.encode_num_increasing(2) == b"\x01\x02"
    assert oc.encode_signed_num_increasing(-1) == b"\x7f"


@pytest.mark.parametrize(
    "value,encoded", [(200, b"\xc0\xc8"), (400, b"\xc1\x90"), (500, b"\xc1\xf4")]
)
def test_tensorflow_two_byte_numbers(value, encoded):
    assert oc.encode_signed_num_increasing(value) == encoded
    assert oc.decode_signed_num_increasing(encoded, 0) == (value, 2)


def test_slice_key_with_two_byte_numbers():
    key = b"\x00" + b"w\x00\x01" + b"\x01\x02" + b"\xc0\xc8\xc1\x90" + b"\xc1\xf4\x7f"
    assert oc.encode_slice_key("w", [(200, 400), (500, None)]) == key
    assert oc.decode_slice_key(key) == ("w", ((200, 400), (500, None)))


def test_slice_keys_sort_before_plain_names():
    key = oc.encode_slice_key("zzz", [(0, 4)])
    assert key[0] == 0
    for name in [b"\x01", b"a", b"_CHECKPOINTABLE_OBJECT_GRAPH", b"zzz"]:
        assert key < name
    # But the header key "" sorts first of all.
    assert key > b""


# --- strings ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw,encoded",
    [
        (b"", b"\x00\x01"),
        (b"a", b"a\x00\x01"),
        (b"\x00", b"\x00\xff\x00\x01"),
        (b"\xff", b"\xff\x00\x00\x01"),
        (b"a\x00b\xffc", b"a\x00\xffb\xff\x00c\x00\x01"),
        (b"\x00\x00\xff\xff", b"\x00\xff\x00\xff\xff\x00\xff\x00\x00\x01"),
        (b"\x01\xfe", b"\x01\xfe\x00\x01"),
    ],
)
def test_string_escaping(raw, encoded):
    assert oc.encode_string(raw) == encoded
    assert oc.decode_string(encoded + b"tail", 0) == (raw, len(encoded))


@pytest.mark.parametrize(
    "bad",
    [
        b"",  # nothing
        b"abc",  # no terminator
        b"abc\x00",  # half a terminator
        b"a\x00\x02",  # 00 followed by neither 01 nor ff
        b"a\xff\x01\x00\x01",  # ff followed by other than 00
        b"a\xff",  # ff at the end
    ],
)
def test_string_malformed(bad):
    with pytest.raises(ValueError):
        oc.decode_string(bad, 0)


@given(st.binary(), st.binary())
def test_string_roundtrip_and_order(a, b):
    ea, eb = oc.encode_string(a), oc.encode_string(b)
    assert oc.decode_string(ea + b"\x07", 0) == (a, len(ea))
    assert (a < b) == (ea < eb)


# --- unsigned numbers --------------------------------------------------------------


@pytest.mark.parametrize(
    "value,encoded",
    [
        (0, b"\x00"),
        (1, b"\x01\x01"),
        (255, b"\x01\xff"),
        (256, b"\x02\x01\x00"),
        (65535, b"\x02\xff\xff"),
        (2**32, b"\x05\x01\x00\x00\x00\x00"),
        (2**64 - 1, b"\x08" + b"\xff" * 8),
    ],
)
def test_num_increasing(value, encoded):
    assert oc.encode_num_increasing(value) == encoded
    assert oc.decode_num_increasing(encoded + b"\x99", 0) == (value, len(encoded))


@pytest.mark.parametrize("value", [-1, 2**64])
def test_num_increasing_range(value):
    with pytest.raises(ValueError):
        oc.encode_num_increasing(value)


@pytest.mark.parametrize("bad", [b"", b"\x01", b"\x03\x01\x02", b"\x09" + b"\x00" * 9])
def test_num_increasing_malformed(bad):
    with pytest.raises(ValueError):
        oc.decode_num_increasing(bad, 0)


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_num_increasing_order(a, b):
    ea, eb = oc.encode_num_increasing(a), oc.encode_num_increasing(b)
    assert oc.decode_num_increasing(ea, 0) == (a, len(ea))
    assert (a < b) == (ea < eb)


# --- signed numbers -----------------------------------------------------------------

# Hand-encoded: an n-byte encoding is n one bits (the length; inverted along with
# everything else for negatives) followed by x in two's complement in the other 7n
# bits, so n bytes cover -2**(7n-1) <= x < 2**(7n-1); 10 bytes cover all of int64.
SIGNED = [
    (0, b"\x80"),
    (1, b"\x81"),
    (63, b"\xbf"),
    (64, b"\xc0\x40"),
    (-1, b"\x7f"),
    (-64, b"\x40"),
    (-65, b"\x3f\xbf"),
    (8191, b"\xdf\xff"),
    (8192, b"\xe0\x20\x00"),
    (-8192, b"\x20\x00"),
    (-8193, b"\x1f\xdf\xff"),
    (2**20 - 1, b"\xef\xff\xff"),
    (2**20, b"\xf0\x10\x00\x00"),
    (2**55 - 1, b"\xff\x7f\xff\xff\xff\xff\xff\xff"),
    (2**55, b"\xff\x80\x80\x00\x00\x00\x00\x00\x00"),
    (2**62 - 1, b"\xff\xbf\xff\xff\xff\xff\xff\xff\xff"),
    (2**62, b"\xff\xc0\x40\x00\x00\x00\x00\x00\x00\x00"),
    (INT64_MAX, b"\xff\xc0\x7f\xff\xff\xff\xff\xff\xff\xff"),
    (-(2**62), b"\x00\x40\x00\x00\x00\x00\x00\x00\x00"),
    (-(2**62) - 1, b"\x00\x3f\xbf\xff\xff\xff\xff\xff\xff\xff"),
    (INT64_MIN, b"\x00\x3f\x80\x00\x00\x00\x00\x00\x00\x00"),
]


@pytest.mark.parametrize("value,encoded", SIGNED)
def test_signed_hand_vectors(value, encoded):
    assert oc.encode_signed_num_increasing(value) == encoded
    assert oc.decode_signed_num_increasing(encoded + b"\x80", 0) == (value, len(encoded))


def _boundaries():
    out = {0, -1, INT64_MIN, INT64_MAX}
    for n in range(1, 10):
        b = 2 ** (7 * n - 1)  # first magnitude that needs n + 1 bytes
        out |= {b - 1, b, -b, -b - 1}
    return sorted(v for v in out if INT64_MIN <= v <= INT64_MAX)


BOUNDARIES = _boundaries()


@pytest.mark.parametrize("value", BOUNDARIES)
def test_signed_length_boundaries(value):
    enc = oc.encode_signed_num_increasing(value)
    magnitude = ~value if value < 0 else value
    n = 1
    while magnitude >= 2 ** (7 * n - 1):
        n += 1
    assert len(enc) == n
    assert oc.decode_signed_num_increasing(enc, 0) == (value, n)
    # Followed by other bytes, decoding stops where the number ends.
    assert oc.decode_signed_num_increasing(b"\x11" + enc + b"\xff\xff", 1) == (value, n + 1)


def test_signed_boundaries_sorted():
    encs = [oc.encode_signed_num_increasing(v) for v in BOUNDARIES]
    assert encs == sorted(encs)
    assert len(set(encs)) == len(encs)


@pytest.mark.parametrize("value", [INT64_MIN - 1, INT64_MAX + 1])
def test_signed_range(value):
    with pytest.raises(ValueError):
        oc.encode_signed_num_increasing(value)


@given(st.integers(INT64_MIN, INT64_MAX), st.integers(INT64_MIN, INT64_MAX))
def test_signed_order_preserving(a, b):
    ea, eb = oc.encode_signed_num_increasing(a), oc.encode_signed_num_increasing(b)
    assert (a < b) == (ea < eb)
    assert (a == b) == (ea == eb)


@given(st.lists(st.integers(INT64_MIN, INT64_MAX), min_size=1, max_size=20))
def test_signed_sorted_lists_sort_bytewise(values):
    values = sorted(set(values))
    encs = [oc.encode_signed_num_increasing(v) for v in values]
    assert encs == sorted(encs)
    # Concatenated, they decode back in sequence.
    buf, pos, got = b"".join(encs), 0, []
    for _ in values:
        v, pos = oc.decode_signed_num_increasing(buf, pos)
        got.append(v)
    assert got == values and pos == len(buf)


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"\xc0",  # 2-byte header, 1 byte
        b"\xff\xc0\x00",  # 10-byte header, 3 bytes
        b"\x3f",  # negative 2-byte header, 1 byte
        b"\xff\xe0" + b"\x00" * 12,  # 11 leading ones: no such length
        b"\xff\xff" + b"\x00" * 16,
        b"\x00\x1f" + b"\x00" * 12,  # the same, negative
    ],
)
def test_signed_malformed(bad):
    with pytest.raises(ValueError):
        oc.decode_signed_num_increasing(bad, 0)


# --- whole slice keys ------------------------------------------------------------------

names = st.text(max_size=12)
extent = st.tuples(
    st.integers(INT64_MIN, INT64_MAX), st.one_of(st.none(), st.integers(0, INT64_MAX))
)


@given(names, st.lists(extent, max_size=8))
def test_slice_key_roundtrip(name, extents):
    key = oc.encode_slice_key(name, extents)
    assert key[0] == 0
    assert oc.decode_slice_key(key) == (name, tuple(extents))


@given(names, st.lists(extent, min_size=1, max_size=4))
def test_slice_key_prefixes_are_malformed(name, extents):
    key = oc.encode_slice_key(name, extents)
    for n in range(len(key)):
        with pytest.raises(ValueError):
            oc.decode_slice_key(key[:n])


def test_slice_keys_order_by_start():
    # Same name and rank: slices sort by their starts, row by row.
    keys = [oc.encode_slice_key("emb", [(s, 2), (0, None)]) for s in (0, 2, 63, 64, 200, 8192)]
    assert keys == sorted(keys)


def test_slice_key_unicode_name():
    key = oc.encode_slice_key("ß/v", [(0, 1)])
    assert key == b"\x00" + "ß/v".encode() + b"\x00\x01" + b"\x01\x01" + b"\x80\x81"
    assert oc.decode_slice_key(key) == ("ß/v", ((0, 1),))


def test_slice_key_rank_zero():
    key = b"\x00" + b"s\x00\x01" + b"\x00"
    assert oc.encode_slice_key("s", []) == key
    assert oc.decode_slice_key(key) == ("s", ())


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"emb",  # a plain tensor name
        b"\x01\x05emb\x00\x01\x00",  # first number is not 0
        b"\x00emb",  # unterminated name
        b"\x00emb\x00\x01",  # no rank
        b"\x00emb\x00\x01\x01\x02\x80\x84\x80",  # rank 2, three numbers
        EMB_ROWS_0_4 + b"\x80",  # trailing bytes
        EMB_ROWS_0_4[:-1] + b"\xff\xe0",  # bad signed header
        b"\x00emb\x00\x01\x08" + b"\xff" * 8,  # absurd rank
        b"\x00emb\x00\x02\x01\x01\x80\x80",  # bad escape in the name
    ],
)
def test_slice_key_malformed(bad):
    with pytest.raises(ValueError):
        oc.decode_slice_key(bad)


@settings(max_examples=500)
@given(st.binary(max_size=40))
def test_slice_key_fuzz_only_value_error(data):
    try:
        name, extents = oc.decode_slice_key(data)
    except ValueError:
        return
    assert isinstance(name, str)
    assert all(isinstance(s, int) for s, _ in extents)


@settings(max_examples=300)
@given(names, st.lists(extent, max_size=4), st.integers(0, 200), st.integers(0, 255))
def test_slice_key_mutation_fuzz(name, extents, pos, byte):
    key = bytearray(oc.encode_slice_key(name, extents))
    key[pos % len(key)] = byte
    try:
        oc.decode_slice_key(bytes(key))
    except ValueError:
        pass


# --- 10-byte encodings beyond int64 -------------------------------------------------------

# TensorFlow's ReadSignedNumIncreasing (core/lib/strings/ordered_code.cc) accepts a
# 10-byte number only when, after undoing the sign, the second byte is exactly 0xc0
# and the third is below 0x80: "either len > 10 or len == 10 and #bits > 63" is an
# error. These are all 10 leading one bits but carry more than 63 bits of value.
BEYOND_INT64 = [
    (b"\xff\xc0\x80" + b"\x00" * 7, 2**63),
    (b"\xff\xc1" + b"\x00" * 8, 2**64),
    (b"\xff\xdf" + b"\xff" * 8, 2**69 - 1),
    (b"\x00\x3f\x7f" + b"\xff" * 7, -(2**63) - 1),
    (b"\x00\x3e" + b"\xff" * 8, -(2**64) - 1),
]


def test_ten_byte_encodings_at_int64_limits_decode():
    # The valid extremes, for contrast.
    assert oc.decode_signed_num_increasing(b"\xff\xc0\x7f" + b"\xff" * 7, 0) == (INT64_MAX, 10)
    assert oc.decode_signed_num_increasing(b"\x00\x3f\x80" + b"\x00" * 7, 0) == (INT64_MIN, 10)


@pytest.mark.parametrize(
    "encoded,wrong_value", BEYOND_INT64, ids=["2**63", "2**64", "2**69-1", "-2**63-1", "-2**64-1"]
)
def test_signed_beyond_int64_rejected(encoded, wrong_value):
    with pytest.raises(ValueError):
        oc.decode_signed_num_increasing(encoded, 0)


def test_slice_key_with_start_beyond_int64_rejected():
    key = b"\x00w\x00\x01\x01\x01" + b"\xff\xc0\x80" + b"\x00" * 7 + b"\x80"
    with pytest.raises(ValueError):
        oc.decode_slice_key(key)
