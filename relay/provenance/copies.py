"""What one destination batch holds: the source offsets its `ktm.src` header names.

The rule, for either header form (`relay.provenance.header`):

- a destination batch whose **last record** carries a **batch-form** header (`.../a-b[,c-d]`,
  the batch path) holds exactly the source offsets that header lists, the i-th record the i-th
  offset; the records before it are never read (they may carry an earlier hop's header);
- any other batch (the record path of older versions) is read record by record: each
  record's last `ktm.src` header of the record form (`.../offset`) names its own source offset.

A compacted destination's log cleaner may remove the record at a batch's last offset, which
carries the batch form's header, and keeps the batch's last offset: such a batch has **lost its
provenance** (`provenance_lost`). What that means for resuming is in `relay.provenance.resume`,
for translating offsets in `relay.provenance.translation`, and how such a batch is told apart
by its records in `relay.provenance.attribution`.
"""

from __future__ import annotations

from relay.batches.format import SourceBatch, split_batches
from relay.batches.records import Decoded, decode_batch, record_offsets
from relay.provenance.header import Provenance, last_provenance
from relay.spec import SourcePartition

Pair = tuple[int, int]  # (destination offset, source offset) of one copy


def origins(batch: SourceBatch) -> list[tuple[Provenance, Decoded]]:
    """What one destination batch holds, by the rule above: (provenance, the destination record
    carrying it) for its last record (batch form) or for each of its records (record form)."""
    last = decode_batch(batch, last_only=True)
    if not last:
        return []
    found = last_provenance(last[0].headers)
    if found is not None and found.batch:
        # this hop's header is on the record at the batch's last offset, or was cleaned away
        return [(found, last[0])] if last[0].offset == batch.last_offset else []
    out = []
    for record in decode_batch(batch):
        found = last_provenance(record.headers)
        if found is not None and not found.batch:
            out.append((found, record))
    return out


def provenance_lost(batch: SourceBatch) -> bool:
    """Whether a data batch lost its provenance to a log cleaner (see above): the record at
    its last offset is gone and no survivor names its own source (the record form), or the
    cleaner left only the batch's header (no record at all)."""
    if batch.is_control:
        return False
    last = decode_batch(batch, last_only=True)
    return not last or (last[0].offset != batch.last_offset and not origins(batch))


def copies_in(batch: SourceBatch, source: SourcePartition) -> list[Pair]:
    """(destination offset, source offset) of each record of `batch` copied from `source`."""
    pairs: list[Pair] = []
    for provenance, record in origins(batch):
        if provenance.origin != source:  # another source partition, or incarnation
            continue
        if not provenance.batch:
            pairs.append((record.offset, provenance.last))
            continue
        sources = [o for first, last in provenance.runs for o in range(first, last + 1)]
        if len(sources) == batch.header.last_offset_delta + 1:
            # a record at each offset delta, the i-th copying the i-th offset listed: what a
            # compacted destination's cleaner left of them keep their deltas
            base = batch.base_offset
            pairs.extend((dest, sources[dest - base]) for dest in record_offsets(batch))
        else:
            pairs.extend(zip(record_offsets(batch), sources, strict=False))
    return pairs


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
