"""Helpers shared by the relay's integration tests: config files, provenance, group offsets.

Like the testbed's helpers (testbed/topics.py, testbed/records.py) they use kafka-python directly
and never the code under test, so a bug in the relay cannot hide itself in the checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.serializer import Serializer

from testbed.provenance import PROVENANCE, attributed
from testbed.records import Record, produce
from testbed.topics import create_topic, unique_topic

FAST_RETRIES = 'max_retries = 1\nbackoff_min = "100ms"\nbackoff_max = "200ms"'
# A short group session: joining waits half of it on Tansu, and a dead process's partitions move
# after it (production default: 6s).
FAST_GROUP = 'session_timeout = "2s"'


def write_config(
    path: Path,
    *,
    source: str,
    target: str,
    topics: Mapping[str, str],
    source_name: str = "src",
    app: str = 'metrics_addr = ""',
    spark: str = "",
    extra: str = "",
) -> Path:
    """A ktm config relaying ``topics`` from ``source`` to ``target`` with fast, short retries;
    ``extra`` is TOML appended after the [target] section (a [store], say)."""
    routes = "\n".join(f'"{src}" = "{dst}"' for src, dst in topics.items())
    path.write_text(
        f"[app]\n{app}\n{FAST_GROUP}\n\n[spark]\n{spark}\n\n[topics]\n{routes}\n\n"
        f'[[sources]]\nname = "{source_name}"\nservers = ["{source}"]\n\n'
        f"[source_pool]\n{FAST_RETRIES}\n\n"
        f'[target]\nservers = ["{target}"]\n{FAST_RETRIES}\n{extra}'
    )
    return path


def provenance(record: Any) -> tuple[str, str, int, int]:
    """(source name, topic, partition, offset) of one record carrying the record form (the
    record path: relayed with a filter, or restored)."""
    (found,) = attributed([record])
    return found.source, found.topic, found.partition, found.offset


def relayed_offsets(records: Iterable[Any]) -> dict[tuple[str, int], list[int]]:
    """Source offsets named by the destination records, in destination order, per source
    (topic, partition)."""
    found: dict[tuple[str, int], list[int]] = {}
    for relayed in attributed(records):
        found.setdefault((relayed.topic, relayed.partition), []).append(relayed.offset)
    return found


def without_provenance(headers: Iterable[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    return [(name, value) for name, value in headers if name != PROVENANCE]


def committed_offsets(
    bootstrap: str, group_id: str, topic: str, partitions: int, **client_config: Any
) -> dict[int, int | None]:
    """The group's committed offset per partition (None: never committed). Never joins the group.
    ``client_config``: more kafka-python settings (TLS, say)."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group_id, enable_auto_commit=False, **client_config
    )
    try:
        return {p: consumer.committed(TopicPartition(topic, p)) for p in range(partitions)}
    finally:
        consumer.close(autocommit=False)


def listed_end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """ListOffsets(latest): exact on Apache Kafka, under-reported by Tansu (docs/development.md)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: end for tp, end in consumer.end_offsets(tps).items()}
    finally:
        consumer.close(autocommit=False)


def copy_view(record: Any, offset: int | None = None) -> tuple[Any, ...]:
    """What the relay must keep of a record: source offset, key, value, headers, timestamp."""
    headers = without_provenance(record.headers)
    offset = record.offset if offset is None else offset
    return (offset, record.key, record.value, headers, record.timestamp, record.timestamp_type)


def assert_exact_copy(
    source: Mapping[int, list[Any]], destination: Iterable[Any], topic: str,
    broker_time: bool = False,
) -> None:  # fmt: skip
    """Every record of source ``topic`` once, in order, unchanged, among ``destination``.
    ``broker_time``: the destination is LogAppendTime, its timestamps are its broker's."""
    view_of = copy_view if not broker_time else lambda r, o=None: copy_view(r, o)[:4]
    copied: dict[int, list[tuple[Any, ...]]] = {p: [] for p in source}
    for relayed in attributed(destination):
        if relayed.topic == topic:
            view = view_of(relayed.record, relayed.offset)
            copied.setdefault(relayed.partition, []).append(view)
    for partition, records in source.items():
        expected = [view_of(r) for r in records]
        got = copied[partition]
        assert len(got) == len(expected), f"{topic}[{partition}]: {len(got)} != {len(expected)}"
        assert got == expected, f"{topic}[{partition}] differs from the source"
    assert set(copied) == set(source), f"records of unknown partitions: {set(copied) - set(source)}"


class _NullValue(Serializer):
    """kafka-python refuses send(key=None, value=None) although Kafka allows such a record; the
    check comes before serialization, so a stand-in value that serializes to None gets one."""

    NULL = object()

    def serialize(self, topic: str, headers: Any, data: Any) -> Any:
        return None if data is self.NULL else data


def produce_null_record(bootstrap: str, topic: str, partition: int, timestamp_ms: int) -> None:
    """One record with a null key and a null value (legal in Kafka, e.g. from Java clients)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", value_serializer=_NullValue())
    try:
        future = producer.send(
            topic, value=_NullValue.NULL, partition=partition, timestamp_ms=timestamp_ms
        )
        future.get(timeout=30)
    finally:
        producer.close(timeout=30)


def topic_pair(
    source: str, target: str, prefix: str, partitions: int, *, records: int = 0, value: bytes = b"r"
) -> tuple[str, str]:
    """A fresh source and destination topic, the source holding ``records`` records spread
    round-robin over its partitions (values ``value`` + their index)."""
    src = create_topic(source, unique_topic(f"{prefix}-src"), partitions=partitions)
    dst = create_topic(target, unique_topic(f"{prefix}-dst"), partitions=partitions)
    if records:
        batch = [Record(value=value + b"%d" % i, partition=i % partitions) for i in range(records)]
        produce(source, src, batch)
    return src, dst
