"""The provenance header of the batch path: one per destination batch, on its last record.

Header `ktm.src`, value `<cluster>/<topic>/<partition>/<first>-<last>`: the source cluster's
name in ktm's config, the source topic and partition, and the first and last source offsets of
the records the destination batch holds (offsets with no record, such as compaction gaps,
transaction markers and records before a mid-batch start, may lie between them).

The rule: a batch is appended atomically, so the destination tail always ends on a record
carrying the range; a source partition's next offset is `last + 1` of the last such header.
Records relayed by older versions (and by the record path) carry `<cluster>/<topic>/
<partition>/<offset>` on every record; that parses as the range `offset-offset`, so the same
rule (next offset = last + 1) resumes them exactly.

The header is the *last* `ktm.src` header of its record: a record relayed twice (A to B to C)
keeps the first hop's header before this hop's. Inside a batch-path destination batch, records
other than the last may carry an *earlier hop's* header as their last one; a resume scan must
therefore either read only the last record of each destination batch (`batch_provenance`), or
accept only headers naming the configured source cluster.
"""

from __future__ import annotations

from typing import NamedTuple

from relay.batches.format import SourceBatch
from relay.batches.records import encode_header, headers_at, last_record_start, parse_at

PROVENANCE_HEADER = "ktm.src"  # the same name as relay.spec.PROVENANCE_HEADER


class Provenance(NamedTuple):
    cluster: str
    topic: str
    partition: int
    first: int  # first source offset the destination batch holds
    last: int  # last source offset it holds

    @property
    def next_offset(self) -> int:
        return self.last + 1


def format_range(cluster: str, topic: str, partition: int, first: int, last: int) -> bytes:
    """The header value; topic names cannot hold '/', cluster names are split off from the
    right so that they may."""
    return f"{cluster}/{topic}/{partition}/{first}-{last}".encode()


def provenance_header(cluster: str, topic: str, partition: int, first: int, last: int) -> bytes:
    """The encoded header (key and value) appended to a destination batch's last record."""
    return encode_header(PROVENANCE_HEADER, format_range(cluster, topic, partition, first, last))


def parse_provenance(value: bytes) -> Provenance | None:
    """A header value of either format, None if it is not ktm's."""
    try:
        cluster, topic, partition, offsets = value.decode().rsplit("/", 3)
        first, dash, last = offsets.partition("-")
        low, high = int(first), int(last if dash else first)
        if not 0 <= low <= high:
            return None
        return Provenance(cluster, topic, int(partition), low, high)
    except (UnicodeDecodeError, ValueError):
        return None


def batch_provenance(batch: SourceBatch) -> Provenance | None:
    """The provenance of one destination batch: the last `ktm.src` header of its last record.
    Decodes that one record only."""
    if batch.header.record_count < 1 or batch.is_control:
        return None
    records = batch.records()
    at = parse_at(records, last_record_start(records, batch.header.record_count))
    values = [value for name, value in headers_at(records, at) if name == PROVENANCE_HEADER]
    return parse_provenance(values[-1]) if values and values[-1] is not None else None
