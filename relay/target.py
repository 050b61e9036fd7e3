"""Executor-side producing to the destination (kafka-python).

One idempotent producer per target per worker process, reused across epochs. acks=all plus
idempotence means a record is acknowledged once, in order, on every in-sync replica; only then
does its source offset count as done.
"""

from __future__ import annotations

from typing import Any

from kafka import KafkaProducer

from relay.config import TargetConfig
from relay.kafka_io import client_settings

_ACKS = {"all": "all", "1": 1, "0": 0}


def producer_settings(target: TargetConfig) -> dict[str, Any]:
    timeout_ms = int(target.request_timeout * 1000)
    idempotent = target.acks == "all"  # kafka-python requires acks=all for idempotence
    return {
        **client_settings(target.cluster, target.request_timeout),
        "acks": _ACKS[target.acks],
        "enable_idempotence": idempotent,
        "compression_type": None if target.compression == "none" else target.compression,
        "linger_ms": int(target.linger * 1000),
        "batch_size": target.batch_size,
        "request_timeout_ms": timeout_ms,
        # A record not acknowledged within this time fails (and the epoch is retried), instead
        # of the producer retrying forever behind the relay's back.
        "delivery_timeout_ms": 2 * timeout_ms + int(target.linger * 1000),
        "max_block_ms": timeout_ms,
    }


class Producer:
    def __init__(self, target: TargetConfig):
        self._producer = KafkaProducer(**producer_settings(target))
        self._closed = False
        self.send = self._producer.send  # bound once: called per record on the hot path

    def flush(self, timeout: float) -> None:
        self._producer.flush(timeout=timeout)

    def close(self, timeout: float = 5.0) -> None:
        if not self._closed:
            self._closed = True
            self._producer.close(timeout=timeout)
