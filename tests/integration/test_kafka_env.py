"""The broker fixtures and data helpers, against real brokers; also pins Tansu's offset gaps."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaTimeoutError

from relay.clients import admin
from relay.config import ClusterConfig
from testbed.records import Record, produce, read_all
from testbed.tansu import NO_KILL_REASON, TansuBroker, wait_until_ready
from testbed.topics import create_topic, describe_topic, unique_topic

pytestmark = pytest.mark.timeout(60)

BASE_TIMESTAMP_MS = 1_700_000_000_000


def assigned_consumer(bootstrap: str, topic: str, partitions: int) -> KafkaConsumer:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    return consumer


def test_produce_and_read_all_round_trip(source_broker):
    topic = create_topic(source_broker.bootstrap, unique_topic("roundtrip"), partitions=4)
    records = [
        Record(
            key=f"key-{i}",
            value=f"value-{i}".encode(),
            headers=[("seq", str(i).encode()), ("source", b"test")],
            partition=i % 4,
            timestamp_ms=BASE_TIMESTAMP_MS + i,
        )
        for i in range(1000)
    ]
    # Dicts and plain tuples are accepted as well as Record.
    records[1] = records[1]._asdict()
    records[2] = tuple(records[2])

    assert produce(source_broker.bootstrap, topic, records) == 1000
    got = read_all(source_broker.bootstrap, topic)

    assert sorted(got) == [0, 1, 2, 3]
    for partition, consumed in got.items():
        assert [r.offset for r in consumed] == list(range(250))
        seqs = [int(dict(r.headers)["seq"]) for r in consumed]
        assert seqs == list(range(partition, 1000, 4))  # produce order kept per partition
        for r, i in zip(consumed, seqs, strict=True):
            assert (r.key, r.value) == (f"key-{i}".encode(), f"value-{i}".encode())
            assert r.headers == [("seq", str(i).encode()), ("source", b"test")]
            assert (r.timestamp, r.timestamp_type) == (BASE_TIMESTAMP_MS + i, 0)  # CreateTime


def test_read_all_refuses_a_missing_topic_without_creating_it(source_broker):
    topic = unique_topic("missing")
    with pytest.raises(LookupError, match=topic):
        read_all(source_broker.bootstrap, topic)
    assert describe_topic(source_broker.bootstrap, topic) is None


def test_kill_and_restart_gives_an_empty_broker_on_the_same_port(broker_factory):
    broker = broker_factory("restartable")
    if not broker.supports_kill:
        pytest.skip(NO_KILL_REASON)
    bootstrap = broker.bootstrap
    topic = create_topic(bootstrap, unique_topic("before-kill"), partitions=1)
    produce(bootstrap, topic, [Record(value=b"lost on kill")])
    # A client connected at kill time leaves the broker's side of its socket in TIME_WAIT.
    consumer = assigned_consumer(bootstrap, topic, 1)
    try:
        assert consumer.poll(timeout_ms=2000)
        broker.kill()
    finally:
        consumer.close()  # before restart(): see the next test
    assert not broker.is_running
    with pytest.raises(KafkaTimeoutError):
        wait_until_ready(bootstrap, timeout=0.5)

    broker.restart()

    assert broker.bootstrap == bootstrap
    assert describe_topic(bootstrap, topic) is None
    create_topic(bootstrap, topic, partitions=1)
    produce(bootstrap, topic, [Record(value=b"after restart")])
    assert [r.value for r in read_all(bootstrap, topic)[0]] == [b"after restart"]


def test_a_consumer_alive_across_a_restart_recreates_its_topic(broker_factory):
    """kafka-python's metadata refresh auto-creates the assigned topic on the empty broker."""
    broker = broker_factory("recreates")
    if not broker.supports_kill:
        pytest.skip(NO_KILL_REASON)
    topic = create_topic(broker.bootstrap, unique_topic("recreated"), partitions=1)
    consumer = assigned_consumer(broker.bootstrap, topic, 1)
    try:
        consumer.poll(timeout_ms=500)
        broker.restart()
        deadline = time.monotonic() + 10
        while describe_topic(broker.bootstrap, topic) is None and time.monotonic() < deadline:
            consumer.poll(timeout_ms=200)
    finally:
        consumer.close()
    recreated = describe_topic(broker.bootstrap, topic)
    assert recreated is not None
    assert len(recreated["partitions"]) == 4  # Tansu's default, not the original 1


def test_stop_is_safe_twice(broker_factory):
    broker = broker_factory("stoppable")
    broker.stop()
    broker.stop()
    if isinstance(broker, TansuBroker):
        assert not broker.is_running


@pytest.mark.parametrize(
    ("batch_sizes", "tansu_end_offset"),
    [
        ((250, 250, 250, 250), 751),  # Tansu: base offset of the last batch + 1
        ((999, 1), 1000),  # right only when the last batch holds one record
    ],
)
def test_end_offsets_gap_and_highwater_is_the_real_end(
    source_broker, batch_sizes, tansu_end_offset
):
    topic = create_topic(source_broker.bootstrap, unique_topic("gap"), partitions=1)
    for size in batch_sizes:
        # One produce call = one batch: nothing is sent before flush() with this linger/size.
        batch = [Record(value=b"x" * 100, partition=0) for _ in range(size)]
        produce(source_broker.bootstrap, topic, batch, linger_ms=60_000, batch_size=1 << 20)
    tp = TopicPartition(topic, 0)

    consumer = assigned_consumer(source_broker.bootstrap, topic, 1)
    try:
        end_offset = consumer.end_offsets([tp])[tp]
        assert consumer.highwater(tp) is None  # nothing fetched yet
        consumer.poll(timeout_ms=2000)
        highwater = consumer.highwater(tp)
    finally:
        consumer.close()

    assert highwater == 1000
    assert len(read_all(source_broker.bootstrap, topic)[0]) == 1000
    if isinstance(source_broker, TansuBroker):
        assert end_offset == tansu_end_offset
    else:
        assert end_offset == 1000  # Apache Kafka


def test_real_ends_are_fetched_again_only_where_the_listed_end_moved(source_broker):
    topic = create_topic(source_broker.bootstrap, unique_topic("memo"), partitions=2)
    for size in (250, 250):  # one batch each (see above): Tansu lists 251, the end is 500
        batch = [Record(value=b"x" * 100, partition=0) for _ in range(size)]
        produce(source_broker.bootstrap, topic, batch, linger_ms=60_000, batch_size=1 << 20)
    held, empty = TopicPartition(topic, 0), TopicPartition(topic, 1)
    consumer = KafkaConsumer(bootstrap_servers=source_broker.bootstrap, group_id=None)
    cluster = ClusterConfig("probe", (source_broker.bootstrap,))
    memo: admin.EndMemo = {}
    try:
        begin = {held: 0, empty: 0}
        assert admin.real_end_offsets(cluster, consumer, [held, empty], begin, 10, memo) == {
            held: 500,
            empty: 0,
        }
        listed = memo[held][1]
        assert memo == {held: (0, listed, 500)}  # an empty partition is never fetched anyway
        memo[held] = (0, listed, 499)  # what it says is what comes back: nothing was fetched
        assert admin.real_end_offsets(cluster, consumer, [held], begin, 10, memo)[held] == 499
        produce(source_broker.bootstrap, topic, [Record(value=b"y", partition=0)] * 10,
                linger_ms=60_000, batch_size=1 << 20)  # fmt: skip
        assert admin.real_end_offsets(cluster, consumer, [held], begin, 10, memo)[held] == 510
        assert memo[held][2] == 510 and memo[held][1] > listed
    finally:
        consumer.close()


def test_highwater_of_an_empty_partition_is_zero_once_fetched(source_broker):
    topic = create_topic(source_broker.bootstrap, unique_topic("empty"), partitions=2)
    produce(source_broker.bootstrap, topic, [Record(value=b"only", partition=0)] * 3)
    empty = TopicPartition(topic, 1)

    consumer = assigned_consumer(source_broker.bootstrap, topic, 2)
    try:
        assert consumer.end_offsets([empty])[empty] == 0
        assert consumer.highwater(empty) is None
        # None until a fetch for this very partition returns, which may take more than one poll
        # while another partition is returning records.
        deadline = time.monotonic() + 10
        while consumer.highwater(empty) is None and time.monotonic() < deadline:
            consumer.poll(timeout_ms=200)
        assert consumer.highwater(empty) == 0
        assert consumer.position(empty) == 0
    finally:
        consumer.close()

    got = read_all(source_broker.bootstrap, topic)
    assert {p: len(rs) for p, rs in got.items()} == {0: 3, 1: 0}
