"""The four Kafka compression codecs over a batch's records part, in their C libraries.

Imported lazily: a relay whose sources and target are uncompressed needs none of them. The
framings match what Kafka clients write and read: snappy in xerial blocks (what the Java client
writes; plain snappy is also read), LZ4 frames with independent blocks, zstd frames that may lack
a content size (the Java client streams them), gzip members.
"""

from __future__ import annotations

import functools
import gzip
import importlib
import io
import struct
import threading
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # an optional library, imported when a batch needs it
    from zstandard import ZstdCompressor, ZstdDecompressor

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
BY_NAME = {name: codec for codec, name in NAMES.items()}

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024  # the xerial library's default block (uncompressed bytes)
_GZIP_LEVEL = 6  # zlib's default, what the Java client uses; kafka-python's 9 is 3x slower


# zstd contexts are costly to create (most of the time of a one-record batch) and must not be
# shared between threads: one pair per thread.
_local = threading.local()


class CodecUnavailable(RuntimeError):
    """A batch uses a codec whose library is not installed."""


@functools.cache
def _library(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
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
        return _zstd_decode(data)
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
        return bytes(_zstd()[0].compress(data))
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


def _zstd() -> tuple[ZstdCompressor, ZstdDecompressor]:
    contexts: tuple[ZstdCompressor, ZstdDecompressor] | None = getattr(_local, "zstd", None)
    if contexts is None:
        zstandard = _library("zstandard")
        contexts = _local.zstd = (zstandard.ZstdCompressor(), zstandard.ZstdDecompressor())
    return contexts


def _zstd_decode(data: bytes | memoryview) -> bytes:
    zstandard = _library("zstandard")
    dctx = _zstd()[1]
    if zstandard.frame_content_size(data) > 0:  # one call; else the size is not in the frame
        try:
            return bytes(dctx.decompress(data))
        except zstandard.ZstdError:
            pass  # several frames: only the first one's size is known
    with dctx.stream_reader(io.BytesIO(data), read_across_frames=True) as reader:
        return bytes(reader.read())
