"""Brokers, topics and data: produce datasets, read topics back record by record, count them.

Everything is read to the high watermark of a fetch, never to end_offsets(): Tansu's
ListOffsets reports the last batch's base offset + 1 (docs/development.md). The brokers
themselves: scripts/bench/brokers.py.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from testbed.topics import create_topic

PROVENANCE_HEADER = "ktm.src"  # relay.spec.PROVENANCE_HEADER: ktm adds it, the source lacks it
FILLER = b"abcdefghijklmnopqrstuvwxyz" * 40
STALL_S = 60  # a read that gets nothing for this long gives up

Digest = dict[int, tuple[int, str]]  # partition -> (records, hash of those records in order)


class Brokers(Protocol):
    """Where the bench's source and destination topics live: `scripts.bench.brokers.Cluster`
    (Tansu) or `.KafkaPair` (Apache Kafka) on loopback, `scripts.bench.measure_links.
    LinkedCluster` (behind delaying proxies), or `scripts.bench.measure_rolling`'s three-node
    destination. `kind`: "tansu" or "kafka"."""

    @property
    def kind(self) -> str: ...

    @property
    def src(self) -> str: ...

    @property
    def dst(self) -> str: ...

    def broker_pids(self) -> dict[str, list[int]]:
        """ "source" and "destination": the pids of their broker processes."""
        ...


def delete_topic(bootstrap: str, topic: str) -> None:
    """Tansu keeps every record in memory: drop each topic as soon as it has served (on Apache
    Kafka this frees the disk, in the background, and is otherwise harmless)."""
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
        try:
            admin.delete_topics([topic])
        finally:
            admin.close()
    except Exception as exc:  # noqa: BLE001 - only broker memory is at stake (or it is gone)
        print(f"  (could not delete topic {topic}: {exc!r})")


@contextmanager
def topic_on(bootstrap: str, prefix: str, partitions: int) -> Iterator[str]:
    """A fresh topic, deleted on the way out."""
    topic = create_topic(bootstrap, f"{prefix}-{uuid.uuid4().hex[:8]}", partitions)
    try:
        yield topic
    finally:
        delete_topic(bootstrap, topic)


@contextmanager
def topic_pair(cluster: Brokers, prefix: str, partitions: int) -> Iterator[tuple[str, str]]:
    """A source topic and a destination topic with the same partition count."""
    with (
        topic_on(cluster.src, prefix, partitions) as source,
        topic_on(cluster.dst, prefix, partitions) as target,
    ):
        yield source, target


def payload(seq: int, size: int) -> bytes:
    """A value that starts with its sequence number, so copies can be told apart."""
    head = b"%012d|" % seq
    return head + FILLER[: max(0, size - len(head))]


def record_fields(seq: int, size: int, partitions: int) -> dict[str, Any]:
    """Key, value, two headers and an explicit partition: what every benchmark record carries."""
    return {
        "key": b"user-%d" % (seq % 1000),
        "value": payload(seq, size),
        "headers": [("trace-id", b"%016x" % seq), ("origin", b"bench")],
        "partition": seq % partitions,
    }


def produce_dataset(bootstrap: str, topic: str, count: int, size: int, partitions: int) -> None:
    """Produce ``count`` records with increasing CreateTimes; raise if any is not acknowledged."""
    base_ms = int(time.time() * 1000) - count
    errors: list[BaseException] = []
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=50, batch_size=512 * 1024
    )
    try:
        for seq in range(count):
            fields = record_fields(seq, size, partitions)
            producer.send(topic, timestamp_ms=base_ms + seq, **fields).add_errback(errors.append)
        producer.flush()
    finally:
        producer.close()
    if errors:
        raise RuntimeError(f"{len(errors)} source records not acknowledged: {errors[0]!r}")


def reader(bootstrap: str, topic: str, partitions: int, **config: Any) -> KafkaConsumer:
    """An assign-only consumer (no group) at the beginning of every partition of ``topic``."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    settings = {"group_id": None, "enable_auto_commit": False, "fetch_max_wait_ms": 100, **config}
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, **settings)
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    return consumer


class EndOffsets:
    """A topic's summed end offsets, asked with ListOffsets: cheap (no record is read), so it
    can be sampled often while a relay writes, but Tansu's answer trails the real end by up to
    the last batch of each partition: good for a rate over many batches, not for a count."""

    def __init__(self, bootstrap: str, topic: str, partitions: int):
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap)
        self.tps = [TopicPartition(topic, p) for p in range(partitions)]

    def __call__(self) -> int:
        return sum(self.consumer.end_offsets(self.tps).values())

    def close(self) -> None:
        self.consumer.close()


def high_watermark_sum(consumer: KafkaConsumer) -> int | None:
    """Records in the assigned partitions per the last fetches; None before every one answered."""
    marks = [consumer.highwater(tp) for tp in consumer.assignment()]
    return None if any(m is None for m in marks) else sum(marks)


def _done(consumer: KafkaConsumer, limits: dict[int, int] | None) -> bool:
    for tp in consumer.assignment():
        end = consumer.highwater(tp)  # None until a fetch for tp has returned
        if end is None:
            return False
        if limits is not None:
            end = min(end, limits[tp.partition])
        if consumer.position(tp) < end:
            return False
    return True


def digest_topic(
    bootstrap: str, topic: str, partitions: int, limits: dict[int, int] | None = None
) -> Digest:
    """Hash every record in order per partition, to the real end or to ``limits[p]`` records."""
    hashes = {p: hashlib.blake2b(digest_size=16) for p in range(partitions)}
    counts = dict.fromkeys(range(partitions), 0)
    consumer = reader(bootstrap, topic, partitions, max_poll_records=10_000)
    try:
        stalled_at = time.monotonic() + STALL_S
        while not _done(consumer, limits):
            if time.monotonic() > stalled_at:
                raise TimeoutError(f"reading {topic} stalled for {STALL_S} s; got {counts}")
            for tp, records in consumer.poll(timeout_ms=200).items():
                p = tp.partition
                for r in records[: None if limits is None else max(0, limits[p] - counts[p])]:
                    hashes[p].update(fingerprint(r))
                    counts[p] += 1
                stalled_at = time.monotonic() + STALL_S
    finally:
        consumer.close()
    return {p: (counts[p], hashes[p].hexdigest()) for p in range(partitions)}


def fingerprint(record: Any) -> bytes:
    """What a copy must keep: key, value, CreateTime, headers (ktm's own header left out)."""
    headers = [(k, v) for k, v in record.headers or () if k != PROVENANCE_HEADER]
    return repr((record.key, record.value, record.timestamp, headers)).encode()


def counts_of(digest: Digest) -> dict[int, int]:
    return {p: count for p, (count, _) in digest.items()}


def compare(expected: Digest, got: Digest) -> str:
    """'ok', or what differs between the source's and the destination's records."""
    if got == expected:
        return "ok"
    if counts_of(got) != counts_of(expected):
        extra = sum(counts_of(got).values()) - sum(counts_of(expected).values())
        return f"WRONG: {extra:+d} records vs the source (per partition {counts_of(got)})"
    bad = sorted(p for p in got if got[p] != expected[p])
    return f"WRONG: different records or order in partitions {bad}"


@dataclass
class Dataset:
    """A source topic already holding ``records`` records, with their digest."""

    topic: str
    partitions: int
    records: int
    expected: Digest


@contextmanager
def dataset(cluster: Brokers, partitions: int, records: int, size: int) -> Iterator[Dataset]:
    """Produce a source topic (not timed), check it holds what was sent; delete it at the end."""
    with topic_on(cluster.src, "bench-src", partitions) as topic:
        began = time.monotonic()
        produce_dataset(cluster.src, topic, records, size, partitions)
        expected = digest_topic(cluster.src, topic, partitions)
        held = sum(counts_of(expected).values())
        print(
            f"  source: {held:,} records in {partitions} partitions, ready in "
            f"{time.monotonic() - began:.1f} s (not timed)",
            flush=True,
        )
        if held != records:
            raise RuntimeError(f"source topic {topic} holds {held} records, not {records}")
        yield Dataset(topic, partitions, records, expected)


def verify_copy(cluster: Brokers, data: Dataset, target: str) -> str:
    return compare(data.expected, digest_topic(cluster.dst, target, data.partitions))


def verify_prefix(cluster: Brokers, source: str, target: str, partitions: int) -> tuple[str, int]:
    """After a stop mid-stream the destination must be, per partition, exactly the first
    records of the source, in order, each once. (verdict, records in the destination)"""
    got = digest_topic(cluster.dst, target, partitions)
    expected = digest_topic(cluster.src, source, partitions, limits=counts_of(got))
    verdict = compare(expected, got)
    return ("ok (a prefix of the source)" if verdict == "ok" else verdict), sum(
        counts_of(got).values()
    )
