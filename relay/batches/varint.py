"""Kafka's zigzag varints (record fields), read from and written to bytes."""

from __future__ import annotations

# Zigzag varints of -64..63 are one byte: every offset delta of a small batch and most
# timestamp deltas. A table turns their encoding into one lookup.
_SMALL = {n: bytes([(n << 1) ^ (n >> 63)]) for n in range(-64, 64)}


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


def encode_varint(n: int) -> bytes:
    small = _SMALL.get(n)
    if small is not None:
        return small
    z = ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF
    if z < 0x4000:  # two bytes: offset deltas of merged batches, timestamp deltas in ms
        return bytes((z & 0x7F | 0x80, z >> 7))
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)
