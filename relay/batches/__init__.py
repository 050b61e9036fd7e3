"""Kafka record batches (magic 2) as bytes: split a fetch, rebuild destination batches, provenance.

Pure functions over bytes, no Kafka client: `relay.clients.batch_fetch` brings the bytes,
`relay.clients.batch_produce` hands the rebuilt batches to kafka-python's sender. The work is per
batch (one decompress, one compress, one CRC); per record only a few varints are read, and a
record is re-framed only where its offset or timestamp delta must change.
"""

from relay.batches.build import DestBatch, Origin, Rebuilt, rebuild
from relay.batches.format import (
    BatchHeader,
    SourceBatch,
    UnsupportedBatch,
    split_batches,
    stamp_producer,
)
from relay.batches.provenance import (
    Provenance,
    format_runs,
    last_provenance,
    parse_provenance,
)
from relay.batches.transactions import drop_aborted

__all__ = [
    "BatchHeader",
    "DestBatch",
    "Origin",
    "Provenance",
    "Rebuilt",
    "SourceBatch",
    "UnsupportedBatch",
    "drop_aborted",
    "format_runs",
    "last_provenance",
    "parse_provenance",
    "rebuild",
    "split_batches",
    "stamp_producer",
]
