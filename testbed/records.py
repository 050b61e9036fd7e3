"""Records in and out of a Kafka-protocol cluster with kafka-python (never the code under
test): produce with acks=all and check every acknowledgement, read a topic back to its real end.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord

from testbed.topics import describe_topic


class Record(NamedTuple):
    """A record to produce; dicts and plain tuples with these fields are accepted too."""

    key: bytes | str | None = None
    value: bytes | str | None = None
    headers: Sequence[tuple[str, bytes]] = ()
    partition: int | None = None
    timestamp_ms: int | None = None


RecordLike = Record | Mapping[str, Any] | Sequence[Any]


def _as_record(item: RecordLike) -> Record:
    if isinstance(item, Record):
        return item
    if isinstance(item, Mapping):
        return Record(**item)
    return Record(*item)


def _as_bytes(data: bytes | str | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[RecordLike],
    *,
    timeout: float = 30.0,
    **producer_config: Any,
) -> int:
    """Produce ``records`` with acks=all, flush, raise if any failed; returns how many were sent.

    ``producer_config`` overrides KafkaProducer settings (e.g. linger_ms, batch_size,
    compression_type) for tests that care how records are batched.
    """
    producer = KafkaProducer(bootstrap_servers=bootstrap, **{"acks": "all", **producer_config})
    try:
        futures = []
        for item in records:
            record = _as_record(item)
            futures.append(
                producer.send(
                    topic,
                    key=_as_bytes(record.key),
                    value=_as_bytes(record.value),
                    headers=list(record.headers),
                    partition=record.partition,
                    timestamp_ms=record.timestamp_ms,
                )
            )
        producer.flush(timeout=timeout)
        for future in futures:
            future.get(timeout=timeout)
    finally:
        producer.close(timeout=timeout)
    return len(futures)


def read_all(
    bootstrap: str, topic: str, *, timeout: float = 10.0, **client_config: Any
) -> dict[int, list[ConsumerRecord]]:
    """Every record of every partition of ``topic``, from the beginning to its real end.

    The real end is the high watermark a fetch returns, not end_offsets(): Tansu's ListOffsets
    reports the last batch's base offset + 1 (docs/development.md). assign/seek only, no group.
    ``client_config``: more kafka-python settings (TLS, say) for the admin client and consumer.
    """
    described = describe_topic(bootstrap, topic, **client_config)
    if described is None:
        raise LookupError(f"topic {topic!r} does not exist on {bootstrap}")
    partitions = len(described["partitions"])
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    records: dict[int, list[ConsumerRecord]] = {p: [] for p in range(partitions)}
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
        **client_config,
    )
    try:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout
        while not _at_high_watermark(consumer, tps):
            if time.monotonic() > deadline:
                progress = {
                    tp.partition: (consumer.position(tp), consumer.highwater(tp)) for tp in tps
                }
                raise TimeoutError(
                    f"read_all({topic!r}) did not reach the end within {timeout}s; "
                    f"{{partition: (position, highwater)}} = {progress}"
                )
            for tp, batch in consumer.poll(timeout_ms=200).items():
                records[tp.partition].extend(batch)
    finally:
        consumer.close()
    return records


def _at_high_watermark(consumer: KafkaConsumer, tps: list[TopicPartition]) -> bool:
    # highwater() is None until a fetch for that partition has returned.
    for tp in tps:
        highwater = consumer.highwater(tp)
        if highwater is None or consumer.position(tp) < highwater:
            return False
    return True


def record_count(bootstrap: str, topic: str, *, timeout: float = 30.0, **client_config: Any) -> int:
    """How many records ``topic`` holds, read to its real end (`read_all`); 0 while it does not
    exist (a test waiting for a copy to grow may ask before the topic is there)."""
    try:
        found = read_all(bootstrap, topic, timeout=timeout, **client_config)
    except LookupError:
        return 0
    return sum(len(records) for records in found.values())
