"""The safetensors header, written in pieces, is the bytes of ``json.dumps`` of the whole."""

from __future__ import annotations

import json
import struct

import pytest

from tfckpt.format.tensorfiles import SAFETENSORS_DTYPES, Entry, safetensors_header


@pytest.mark.parametrize("n", [0, 1, 4095, 4096, 4097, 9000])
@pytest.mark.parametrize("metadata", [{}, {"format": "pt", "note": 'é"\\'}])
def test_header_pieces_join_to_the_whole_header(n, metadata):
    entries = [Entry(f'w/{i}é"', ("float16", "float32")[i % 2], (i % 3, 2)) for i in range(n)]
    pieces = safetensors_header(entries, metadata)
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for e in entries:
        end = offset + e.nbytes
        header[e.name] = {
            "dtype": SAFETENSORS_DTYPES[e.dtype],
            "shape": list(e.shape),
            "data_offsets": [offset, end],
        }
        offset = end
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-(len(text) + 8) % 8)
    assert b"".join(pieces) == struct.pack("<Q", len(text)) + text
    assert len(pieces) == 3 + -(-(n + bool(metadata)) // 4096)  # 4096 entries at a time
