"""Restore's records framed into destination batches: what a consumer reads back is what was
stored, and each batch's last record says which stored offsets the batch holds."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from relay.batches import Origin, codecs, split_batches
from relay.batches.encode import encode_records
from relay.batches.records import decode_batch
from relay.provenance.copies import copies_in, origins
from relay.provenance.header import PROVENANCE_HEADER


class Stored(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def stored(offsets: list[int]) -> list[Stored]:
    out = []
    for i, o in enumerate(offsets):
        key = None if i % 5 == 0 else b"k%d" % o
        value = None if i % 7 == 3 else b"value-%d-" % o * 3
        headers = (("h", b"x%d" % o), ("empty", None)) if i % 2 else ()
        # timestamps not in order: a producer may set any
        out.append(Stored(o, 1_700_000_000_000 + (o * 37) % 1000, key, value, headers))
    return out


@pytest.mark.parametrize("codec", ["none", "zstd", "lz4", "gzip"])
def test_encoded_batches_read_back_as_stored_with_their_offsets_in_provenance(codec: str) -> None:
    offsets = [*range(10, 40), *range(45, 60), 70]  # gaps: filtered or compacted at backup
    records = stored(offsets)
    built = encode_records(records, Origin("dc1", "orders", 3), codecs.BY_NAME[codec], 1024)
    assert len(built) > 1 and sum(b.count for b in built) == len(records)
    batches, _ = split_batches(b"".join(bytes(b.payload) for b in built))
    assert len(batches) == len(built) and all(b.crc_ok() for b in batches)
    decoded = [r for b in batches for r in decode_batch(b)]
    got = [(r.timestamp, r.key, r.value, r.headers) for r in decoded]
    # each batch's last record carries one header more: the provenance
    want: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = []
    lasts = {b.last_offset for b in built}
    for r in records:
        headers = list(r.headers)
        if r.offset in lasts:
            headers.append((PROVENANCE_HEADER, decoded[len(want)].headers[-1][1]))
        want.append((r.timestamp, r.key, r.value, headers))
    assert got == want
    covered = []
    for batch in batches:
        ((provenance, _),) = origins(batch)
        assert (provenance.cluster, provenance.topic, provenance.partition) == ("dc1", "orders", 3)
        covered += [o for first, last in provenance.runs for o in range(first, last + 1)]
    assert covered == offsets


def test_a_record_larger_than_the_budget_goes_alone() -> None:
    records = stored([1, 2, 3])
    big = records[1]._replace(value=b"x" * 5000)
    built = encode_records([records[0], big, records[2]], Origin("c", "t", 0), codecs.NONE, 1024)
    assert [b.count for b in built] == [1, 1, 1]


def test_copies_in_a_restored_batch_map_destination_to_stored_offsets() -> None:
    built = encode_records(stored([5, 6, 9]), Origin("c", "t", 0), codecs.NONE)
    (batch,) = split_batches(bytes(built[0].payload))[0]
    assert copies_in(batch, ("t", 0)) == [(0, 5), (1, 6), (2, 9)]
