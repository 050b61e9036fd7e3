"""The four Kafka compression codecs over a batch's records part, in their C libraries.

Imported lazily: a relay whose sources and target are uncompressed needs none of them. The
framings match what Kafka clients write and read: snappy in xerial blocks (what the Java client
writes; plain snappy is also read), LZ4 frames with independent blocks, zstd frames that may lack
a content size (the Java client streams them), gzip members.
"""

from __future__ import annotations

import gzip
import io
import struct
from typing import Any

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
BY_NAME = {name: codec for codec, name in NAMES.items()}

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024  # the xerial library's default block (uncompressed bytes)
_GZIP_LEVEL = 6  # zlib's default, what the Java client uses; kafka-python's 9 is 3x slower


class CodecUnavailable(RuntimeError):
    """A batch uses a codec whose library is not installed."""


def _library(name: str) -> Any:
    try:
        return __import__(name, fromlist=["_"])
    except ImportError as exc:
        raise CodecUnavailable(f"{name} is needed for this batch's codec: {exc}") from exc


def decompress(codec: int, data: bytes | memoryview) -> bytes:
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return gzip.decompress(data)
    if codec == SNAPPY:
        return _snappy_decode(bytes(data))
    if codec == LZ4:
        return bytes(_library("lz4.frame").decompress(data))
    if codec == ZSTD:
        dctx = _library("zstandard").ZstdDecompressor()
        with dctx.stream_reader(io.BytesIO(data), read_across_frames=True) as reader:
            return bytes(reader.read())
    raise ValueError(f"unknown compression codec {codec}")


def compress(codec: int, data: bytes) -> bytes:
    if codec == NONE:
        return data
    if codec == GZIP:
        return gzip.compress(data, compresslevel=_GZIP_LEVEL, mtime=0)
    if codec == SNAPPY:
        snappy = _library("snappy")
        blocks = [_XERIAL_HEADER]
        for i in range(0, len(data), _XERIAL_BLOCK):
            block = snappy.compress(data[i : i + _XERIAL_BLOCK])
            blocks += (struct.pack(">i", len(block)), block)
        return b"".join(blocks)
    if codec == LZ4:
        return bytes(_library("lz4.frame").compress(data, block_linked=False))
    if codec == ZSTD:
        return bytes(_library("zstandard").ZstdCompressor().compress(data))
    raise ValueError(f"unknown compression codec {codec}")


def _snappy_decode(data: bytes) -> bytes:
    snappy = _library("snappy")
    if not (len(data) > 16 and data.startswith(_XERIAL_MAGIC)):
        return bytes(snappy.decompress(data))
    out = []
    pos = 16
    while pos < len(data):
        (size,) = struct.unpack_from(">i", data, pos)
        out.append(snappy.decompress(data[pos + 4 : pos + 4 + size]))
        pos += 4 + size
    return b"".join(out)
