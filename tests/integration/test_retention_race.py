"""Issue 36: the broker's own retention deletes records while a throttled relay is reading them.

test_source_losses moves the log start with DeleteRecords, at a moment and offset the test picks.
This module lets Apache Kafka's retention do it, as in production: a source node of its own that
checks retention every 500 ms (the pool's nodes keep the 5-minute default), a topic that keeps
records 8 s and rolls a segment every 100 ms, and a relay held to 50 records/s, slower than
retention deletes. Whatever the moment each segment went, the copy and the count must add up:
every offset the copy lacks is below the log start the broker left, and counted once as lost.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from relay.losses import DELETED
from testbed.kafka import KafkaCluster
from testbed.provenance import attributed
from testbed.records import read_all
from testbed.topics import create_topic, unique_topic
from tests.support.inprocess import Background, verify_once
from tests.support.kafka_pool import POOL_SETTINGS
from tests.support.relay import write_config

pytestmark = pytest.mark.brokers("kafka")

RECORDS, PER_SEGMENT = 400, 10
RETENTION = {"retention.ms": "8000", "segment.ms": "100"}


@pytest.fixture(scope="module")
def quick_retention(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    # retention checks every 500 ms from the start (the first waits 30 s by default)
    settings = {**POOL_SETTINGS, "log.retention.check.interval.ms": "500",
                "log.initial.task.delay.ms": "0"}  # fmt: skip
    cluster = KafkaCluster("retention", log_dir=tmp_path_factory.mktemp("retention"),
                           settings=settings)  # fmt: skip
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.remove()


def feed_segments(bootstrap: str, topic: str) -> None:
    """Ten records of 1 kB, a pause past segment.ms, again: a segment per ten records, each
    older by 0.1 s than the next, so retention takes them one by one."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    try:
        for first in range(0, RECORDS, PER_SEGMENT):
            for i in range(first, first + PER_SEGMENT):
                producer.send(topic, key=b"k%d" % i, value=b"v%d." % i + b"." * 1000, partition=0)
            producer.flush()
            time.sleep(0.12)
    finally:
        producer.close()


def log_start(bootstrap: str, topic: str) -> int:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        return consumer.beginning_offsets([TopicPartition(topic, 0)])[TopicPartition(topic, 0)]
    finally:
        consumer.close()


def test_retention_racing_a_throttled_relay_counts_exactly_what_it_deleted_unread(
    quick_retention: KafkaCluster, target_broker: Any, tmp_path: Path, spark: Any
) -> None:
    source = quick_retention.bootstrap
    src = quick_retention.create_topic(unique_topic("retained"), 1, configs=RETENTION)
    dst = create_topic(target_broker.bootstrap, unique_topic("retained-copy"), partitions=1)
    limits = "\n[limits]\nrecords_per_second = 50\n"
    conf = write_config(tmp_path / "c.toml", source=source, target=target_broker.bootstrap,
                        topics={src: dst}, extra=limits)  # fmt: skip
    feed_segments(source, src)
    relay = Background(conf, stop_at_end=True)
    try:
        relay.thread.join(90)
        assert not relay.thread.is_alive() and relay.error is None, relay.error
    finally:
        relay.finish()
    start = log_start(source, src)
    copied = attributed(read_all(target_broker.bootstrap, dst).get(0, []))
    offsets = [r.offset for r in copied]
    assert offsets == sorted(set(offsets)), "a source offset copied twice or out of order"
    assert all(r.record.value == b"v%d." % r.offset + b"." * 1000 for r in copied)
    missing = sorted(set(range(RECORDS)) - set(offsets))
    assert start > 0 and missing, "retention deleted nothing before the relay read it"
    assert max(missing) < start, "an offset the broker still holds is missing in the copy"
    assert relay.summary is not None and relay.summary.records_lost == len(missing)
    labels = {"source_topic": src, "source_partition": "0", "cause": DELETED}
    lost = relay.metrics.registry.get_sample_value("ktm_source_records_lost_total", labels)
    assert lost == len(missing)
    (report,) = verify_once(conf, spark)  # exact; what was deleted told apart from missing
    assert report.exact
    if offsets and offsets[0] == 0:
        assert report.deleted == len([o for o in missing if o < start])
