"""The produce ceiling: how fast a broker on this machine takes records from the fastest producer
at hand (confluent-kafka, from this process), into a fresh broker of the bench's kind (Tansu, or
a single-node Apache Kafka cluster, warmed first like the bench's), with the CPU of each side.

Not `tansu perf <topic> produce`, Tansu's own generator: on 2 cores it was the bottleneck (1.5
cores for the generator, 0.17 for the broker; ~290k records/s against ~940k for confluent-kafka).
The producer is the bottleneck here too (the broker used ~0.3 cores): the broker row's CPU per
record shows how far the broker itself is from its limit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from scripts.bench.brokers import one_broker
from scripts.bench.contenders import has_confluent, unique
from scripts.bench.data import FILLER
from scripts.bench.wire import high_watermark
from testbed.topics import create_topic

RECORD_BYTES = 100
PRODUCER = {"acks": "all", "linger.ms": 5, "batch.size": 1024 * 1024, "log_level": 3}
FLUSH_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Ceiling:
    records: int
    seconds: float | None  # from the first produce() to the end of flush()
    producer_cpu: float | None  # CPU seconds of this process (the producer's threads)
    broker_cpu: float | None  # CPU seconds of the broker over the same time
    check: str

    @property
    def rate(self) -> float | None:
        return self.records / self.seconds if self.seconds and self.check == "ok" else None


def produce_ceiling(workdir: Path, records: int, kind: str) -> Ceiling:
    """confluent-kafka produces ``records`` RECORD_BYTES-byte values (no key, no headers) into
    one partition of a fresh broker of ``kind`` with acks=all, linger 5 ms and 1 MB batches."""
    if not has_confluent():
        return Ceiling(records, None, None, None, "skipped: pip install confluent-kafka")
    with one_broker(kind, unique("bench-ceiling"), workdir) as (bootstrap, pids):
        topic = create_topic(bootstrap, unique("ceiling"), 1)
        me, brokers = psutil.Process(), [psutil.Process(pid) for pid in pids]
        cpu = [_cpu(me), sum(map(_cpu, brokers))]
        began = time.monotonic()
        left = _produce(bootstrap, topic, records)
        took = time.monotonic() - began
        cpu = [_cpu(me) - cpu[0], sum(map(_cpu, brokers)) - cpu[1]]
        held = high_watermark(bootstrap, topic, 0)
    check = "ok" if held == records and not left else f"WRONG: {held:,} records in the topic"
    return Ceiling(records, took, cpu[0], cpu[1], check)


def _produce(bootstrap: str, topic: str, records: int) -> int:
    """Produce and flush; how many records were left unacknowledged. The producer is gone when
    this returns (it would otherwise try to reconnect to the stopped broker, and say so)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER})
    value = FILLER[:RECORD_BYTES]
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=0)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.01)
    return int(producer.flush(FLUSH_TIMEOUT_S))


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system
