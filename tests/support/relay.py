"""Helpers shared by the relay's integration tests: config files, provenance, group offsets.

Like tests/support/kafka.py they use kafka-python directly and never the code under test, so a
bug in the relay cannot hide itself in the checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.serializer import Serializer

from tests.support.kafka import Record, create_topic, produce, unique_topic

PROVENANCE = "ktm.src"  # the provenance header (relay.batches.provenance has its two forms)
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


class Relayed(NamedTuple):
    """A destination record and the source record it copies."""

    record: Any
    source: str
    topic: str
    partition: int
    offset: int


def attributed(records: Iterable[Any]) -> list[Relayed]:
    """Each destination record with the source record it copies, read from the ktm.src headers
    in destination order (per destination topic and partition):
    - the record form, `<source>/<topic>/<p>/<offset>` on a record, names that record's own;
    - the batch form, `<source>/<topic>/<p>/<a>-<b>[,<c>-<d>...]` on the last record of a
      destination batch, lists the offsets of that batch's records in order: the records since
      the previous header, and itself.
    Every record must be accounted for, exactly."""
    out: list[Relayed] = []
    waiting: dict[tuple[str, int], list[Any]] = {}
    for record in records:
        stream = waiting.setdefault((record.topic, record.partition), [])
        values = [value for name, value in record.headers if name == PROVENANCE]
        stream.append(record)
        if not values:
            continue
        source, topic, partition, offsets = values[-1].decode().rsplit("/", 3)
        numbers = [int(offsets)] if "-" not in offsets else _offsets_of_runs(offsets)
        assert len(numbers) == len(stream), f"{values[-1]!r} does not cover {len(stream)} records"
        out += [
            Relayed(r, source, topic, int(partition), o)
            for r, o in zip(stream, numbers, strict=True)
        ]
        stream.clear()
    left = {key: len(stream) for key, stream in waiting.items() if stream}
    assert not left, f"records with no provenance after them: {left}"
    return out


def _offsets_of_runs(runs: str) -> list[int]:
    offsets: list[int] = []
    for run in runs.split(","):
        first, last = run.split("-")
        offsets += range(int(first), int(last) + 1)
    return offsets


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
    bootstrap: str, group_id: str, topic: str, partitions: int
) -> dict[int, int | None]:
    """The group's committed offset per partition (None: never committed). Never joins the group."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group_id, enable_auto_commit=False
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
    source: Mapping[int, list[Any]], destination: Iterable[Any], topic: str
) -> None:
    """Every record of source ``topic`` once, in order, unchanged, among ``destination``."""
    copied: dict[int, list[tuple[Any, ...]]] = {p: [] for p in source}
    for relayed in attributed(destination):
        if relayed.topic == topic:
            view = copy_view(relayed.record, relayed.offset)
            copied.setdefault(relayed.partition, []).append(view)
    for partition, records in source.items():
        expected = [copy_view(r) for r in records]
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
