"""Kafka record batches (magic 2) as bytes: split a fetch, rebuild destination batches.

Pure functions over bytes, no Kafka client: `relay.clients.batch_fetch` brings the bytes,
`relay.clients.batch_produce` hands the rebuilt batches to kafka-python's sender. The work is per
batch (one decompress, one compress, one CRC); per record only a few varints are read, and a
record is re-framed only where its offset or timestamp delta must change. A rebuilt batch's last
record carries its provenance (`relay.provenance.header` has the format).
"""

from relay.batches.build import DestBatch, Origin, Rebuilt, rebuild
from relay.batches.format import (
    BatchHeader,
    SourceBatch,
    UnsupportedBatch,
    split_batches,
    stamp_producer,
)
from relay.batches.transactions import drop_aborted

__all__ = [
    "BatchHeader",
    "DestBatch",
    "Origin",
    "Rebuilt",
    "SourceBatch",
    "UnsupportedBatch",
    "drop_aborted",
    "rebuild",
    "split_batches",
    "stamp_producer",
]
