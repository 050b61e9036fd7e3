"""Kafka's zigzag varints (record fields), read from and written to bytes."""

from __future__ import annotations


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it) of the zigzag varint at `pos`."""
    b = buf[pos]
    if b < 0x80:  # the common case, kept free of the loop
        return (b >> 1) ^ -(b & 1), pos + 1
    value = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _encode(n: int) -> bytes:
    z = ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


# The varints of 0..8191 (one or two bytes), by value, and of -64..-1 (one byte): every length
# of a record under 8 KiB, offset deltas, timestamp deltas under 8 s are a lookup. The merge
# loop (relay.batches.merge) indexes ENCODED itself rather than calling.
TABLE_SIZE = 8192
ENCODED = [_encode(n) for n in range(TABLE_SIZE)]
_NEGATIVE = {n: _encode(n) for n in range(-64, 0)}


def encode_varint(n: int) -> bytes:
    if 0 <= n < TABLE_SIZE:
        return ENCODED[n]
    small = _NEGATIVE.get(n)
    return small if small is not None else _encode(n)
