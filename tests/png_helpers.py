"""Reading what a chart says about itself: the tEXt chunks matplotlib writes into a PNG (its
title among them), each chunk's checksum checked."""

from __future__ import annotations

import struct
import zlib


def png_text(path) -> dict:
    """The tEXt chunks of a PNG (where matplotlib writes the chart's title)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    chunks, pos = {}, 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0]
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            chunks[key.decode()] = value.decode("latin-1")
        pos += 12 + length
    return chunks
