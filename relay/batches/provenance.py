"""The provenance header: which source records a destination record or batch holds.

Header `ktm.src`, two forms (the rule that reads them is in `relay.resume`):
- **batch**: `<cluster>/<topic>/<partition>/<a>-<b>[,<c>-<d>...]`, once per destination batch,
  on its last record: the runs of consecutive source offsets whose records the batch holds, in
  order (one run unless a compaction gap, a transaction marker, a filtered record or a mid-batch
  start lies between them; every run is written `a-b`, also when a == b). The batch's i-th record
  is the i-th offset of the runs, so a source offset maps to a destination offset exactly.
- **record**: `<cluster>/<topic>/<partition>/<offset>` on every record (the record path of
  older versions, and the fallback when the batch path is unavailable): the record's own source
  offset.

The cluster is ktm's name for the source in its config. Topic names cannot hold '/'; the cluster
is split off from the right so that it may.

The header of a hop is the *last* `ktm.src` header of its record: a record relayed twice (A to B
to C) keeps the first hop's header before this hop's. Inside a batch-form destination batch,
records other than the last may carry an *earlier hop's* header as their last one; a reader
therefore takes a batch-form header only from the last record of a destination batch
(`relay.resume.origins`) and never reads the records before it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from relay.batches.format import split_batches
from relay.batches.records import Decoded, decode_batch, encode_header

PROVENANCE_HEADER = "ktm.src"  # the same name as relay.spec.PROVENANCE_HEADER

Runs = tuple[tuple[int, int], ...]  # (first, last) source offsets, inclusive, ascending


class Provenance(NamedTuple):
    cluster: str
    topic: str
    partition: int
    runs: Runs
    batch: bool = True  # the batch form; False: one record's own offset (the record form)

    @property
    def first(self) -> int:
        return self.runs[0][0]

    @property
    def last(self) -> int:
        return self.runs[-1][1]

    @property
    def next_offset(self) -> int:
        return self.last + 1

    @property
    def records(self) -> int:
        return sum(last - first + 1 for first, last in self.runs)

    def index_at_or_after(self, offset: int) -> int | None:
        """The position, among the records this header covers, of the first one whose source
        offset is >= `offset`; None when all of them lie before it."""
        index = 0
        for first, last in self.runs:
            if offset <= last:
                return index + max(0, offset - first)
            index += last - first + 1
        return None


def format_runs(cluster: str, topic: str, partition: int, runs: Iterable[tuple[int, int]]) -> bytes:
    """The batch form's header value."""
    offsets = ",".join(f"{first}-{last}" for first, last in runs)
    return f"{cluster}/{topic}/{partition}/{offsets}".encode()


def provenance_header(
    cluster: str, topic: str, partition: int, runs: Iterable[tuple[int, int]]
) -> bytes:
    """The encoded header (key and value) appended to a destination batch's last record."""
    return encode_header(PROVENANCE_HEADER, format_runs(cluster, topic, partition, runs))


def parse_provenance(value: bytes) -> Provenance | None:
    """A header value of either form, None if it is not ktm's."""
    try:
        cluster, topic, partition, offsets = value.decode().rsplit("/", 3)
        if "-" not in offsets:
            offset = int(offsets)
            return Provenance(cluster, topic, int(partition), ((offset, offset),), False)
        runs = []
        previous = -1
        for run in offsets.split(","):
            low, high = (int(part) for part in run.split("-"))  # exactly two, else ValueError
            if not previous < low <= high:
                return None
            runs.append((low, high))
            previous = high
        return Provenance(cluster, topic, int(partition), tuple(runs))
    except (UnicodeDecodeError, ValueError):
        return None


def last_provenance(headers: Iterable[tuple[str, bytes | None]]) -> Provenance | None:
    """The last `ktm.src` header of a record's headers, parsed (this hop's)."""
    last = None
    for name, value in headers:
        if name == PROVENANCE_HEADER:
            last = value
    return parse_provenance(last) if last is not None else None


def sourced_records(payload: bytes | bytearray) -> list[Decoded]:
    """The records of one destination batch this hop built (a whole batch as bytes), each
    with the source offset its provenance names (the i-th record is the i-th offset listed),
    or its offset inside the batch where the batch carries no provenance."""
    batches, _ = split_batches(payload)
    records = [r for batch in batches for r in decode_batch(batch)]
    found = last_provenance(records[-1].headers) if records else None
    if found is None or not found.batch or found.records != len(records):
        return records
    offsets = [o for first, last in found.runs for o in range(first, last + 1)]
    return [r._replace(offset=o) for r, o in zip(records, offsets, strict=True)]
