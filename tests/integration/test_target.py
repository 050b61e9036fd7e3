"""The destination producer's two paths (bulk append and per-record send) on a real broker, and
what their deliveries say when records were acknowledged, dropped unsent, or never answered."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from kafka import TopicPartition

from relay.batches import Origin
from relay.clients.producer import Delivery, Producer
from relay.config import ClusterConfig, TargetConfig
from testbed.records import read_all
from testbed.tansu import NO_KILL_REASON, TansuBroker, brokers_are_external
from testbed.topics import create_topic, unique_topic

pytestmark = [pytest.mark.timeout(60), pytest.mark.brokers("tansu", "kafka")]
PATHS = pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "send"])


def items(count: int) -> list:
    out = []
    for i in range(count):
        key = None if i % 3 == 0 else b"k%d" % i
        value = None if i % 3 == 0 or i % 5 == 0 else b"v" * (i % 300)  # some null/null records
        headers = [("a", b"1"), ("a", b"2")] if i % 2 else []
        out.append((1_700_000_000_000 + i, key, value, headers))
    return out


def ended(deliveries: list[Delivery], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(d.done for d in deliveries):
        assert time.monotonic() < deadline, "deliveries did not end"
        time.sleep(0.05)


@PATHS
def test_both_paths_write_the_same_records_and_acknowledge_every_segment(target_broker, bulk):
    topic = create_topic(target_broker.bootstrap, unique_topic("target"), 2)
    # A small batch_size forces the bulk path across several producer batches.
    cfg = TargetConfig(ClusterConfig("target", (target_broker.bootstrap,)), batch_size=2048)
    producer = Producer(cfg, bulk=bulk)
    try:
        wanted = items(700)
        segments = producer.send_batch(topic, 1, wanted[:300]) + producer.send_batch(
            topic, 1, wanted[300:]
        )
        producer.flush(timeout=20)
    finally:
        producer.close()
    assert sum(count for count, _ in segments) == 700
    assert all(delivery.acked() and delivery.error() is None for _, delivery in segments)
    if bulk:
        assert 1 < len(segments) < 700  # whole batches, not one future per record
    got = read_all(target_broker.bootstrap, topic)[1]
    assert [(r.timestamp, r.key, r.value, list(r.headers)) for r in got] == wanted


@PATHS
def test_records_dropped_unsent_by_abandon_are_not_acknowledged(target_broker, bulk):
    # kafka-python completes an aborted batch's future successfully (the error is in its
    # value): read naively, these records would count as delivered and be skipped for good.
    topic = create_topic(target_broker.bootstrap, unique_topic("target"), 1)
    cfg = TargetConfig(ClusterConfig("target", (target_broker.bootstrap,)), linger=30.0)
    producer = Producer(cfg, bulk=bulk)
    deliveries = [d for _, d in producer.send_batch(topic, 0, items(50))]
    producer.abandon()  # the lingering batch is never sent
    ended(deliveries, 10)
    assert not any(d.acked() for d in deliveries)
    assert all(d.error() is not None for d in deliveries)
    assert read_all(target_broker.bootstrap, topic)[0] == []


@pytest.mark.skipif(brokers_are_external(), reason=NO_KILL_REASON)
@PATHS
def test_abandon_waits_for_the_requests_already_sent_and_counts_what_they_wrote(tmp_path, bulk):
    """A request on the wire cannot be called back: abandoned unanswered, it lands unseen
    after the destination was read again (a duplicate). Its answer is waited for instead."""
    broker = TansuBroker("busy", log_dir=tmp_path).start()
    pid = broker.pid
    assert pid is not None
    thaw = threading.Timer(1.5, os.kill, (pid, signal.SIGCONT))
    try:
        topic = create_topic(broker.bootstrap, unique_topic("target"), 1)
        producer = Producer(TargetConfig(ClusterConfig("busy", (broker.bootstrap,))), bulk=bulk)
        first = [d for _, d in producer.send_batch(topic, 0, items(10))]
        producer.flush(timeout=10)
        os.kill(pid, signal.SIGSTOP)  # a broker too busy to answer for a while
        sent = [d for _, d in producer.send_batch(topic, 0, items(20))]
        producer.flush(timeout=0.5)  # on the wire now, unanswered
        thaw.start()
        producer.abandon()
        assert all(d.acked() for d in first + sent)
        assert len(read_all(broker.bootstrap, topic)[0]) == 30
    finally:
        thaw.cancel()
        os.kill(pid, signal.SIGCONT)
        broker.kill()


@pytest.mark.skipif(brokers_are_external(), reason=NO_KILL_REASON)
@PATHS
def test_records_a_dead_broker_never_answered_end_failed(tmp_path, bulk):
    broker = TansuBroker("doomed", log_dir=tmp_path).start()
    try:
        topic = create_topic(broker.bootstrap, unique_topic("target"), 1)
        cfg = TargetConfig(ClusterConfig("doomed", (broker.bootstrap,)), request_timeout=1.0)
        producer = Producer(cfg, bulk=bulk)
        first = [d for _, d in producer.send_batch(topic, 0, items(10))]
        producer.flush(timeout=10)
        broker.kill()
        later = [d for _, d in producer.send_batch(topic, 0, items(10))]
        ended(later, 20)  # the delivery timeout: twice the request timeout plus linger
        producer.abandon()
    finally:
        broker.kill()
    assert all(d.acked() for d in first)
    assert not any(d.acked() for d in later)
    assert all(d.error() is not None for d in later)


class Offset:
    """The little of a consumer record KafkaWriter reads."""

    def __init__(self, offset: int):
        self.offset, self.timestamp = offset, 1_700_000_000_000 + offset
        self.key, self.value = b"k%d" % offset, b"v%d" % offset
        self.headers: list[tuple[str, bytes]] = []


def test_a_batch_the_broker_splits_as_too_large_still_completes(target_broker):
    """kafka-python splits a batch a broker refused with MESSAGE_TOO_LARGE and re-sends the
    halves; the bulk path's delivery must complete with them (it used to hang forever, and its
    partition with it). Tansu has no size limit, so the refusal is handed to kafka-python's
    sender exactly where a broker's answer would arrive; the halves go to the real broker."""
    from kafka.errors import MessageSizeTooLargeError

    topic = create_topic(target_broker.bootstrap, unique_topic("split"), 1)
    cfg = TargetConfig(ClusterConfig("target", (target_broker.bootstrap,)), linger=30.0)
    producer = Producer(cfg)
    try:
        [(count, delivery)] = producer.send_batch(topic, 0, items(40))
        acc, sender = producer._producer._accumulator, producer._producer._sender
        tp = delivery._future.topic_partition
        with acc._tp_lock(tp):
            batch = acc._batches[tp].popleft()  # what the sender's drain does
        batch.records.close()
        sender._dispatch_error(batch, MessageSizeTooLargeError(), None)
        sender.wakeup()
        producer.flush(timeout=20)
        ended([delivery], 20)
    finally:
        producer.close()
    assert count == 40 and delivery.acked()
    got = read_all(target_broker.bootstrap, topic)[0]
    assert [(r.timestamp, r.key, r.value, list(r.headers)) for r in got] == items(40)


def test_a_batch_expired_unsent_stops_its_partition_so_no_hole_can_form(target_broker):
    """A batch kafka-python expires before sending it uses no sequence number, so the broker
    would take the next one and the destination would get later records without the failed
    ones. The producer fails what is queued behind it and refuses new records for the
    partition; the writer names the failed records. Other partitions carry on."""
    from relay.engine.executor.failures import TargetFailure
    from relay.pipelines.kafka_target import KafkaWriter
    from relay.spec import PartitionRoute

    topic = create_topic(target_broker.bootstrap, unique_topic("hole"), 2)
    cfg = TargetConfig(
        ClusterConfig("target", (target_broker.bootstrap,)), linger=30.0, batch_size=256
    )
    producer = Producer(cfg)
    shape = (0, 256)  # uncompressed batches of 256 bytes, built by the writer
    route, other_route = PartitionRoute("src", 3, topic, 0), PartitionRoute("src", 4, topic, 1)
    writer = KafkaWriter(producer, route, Origin("c", "src", 3), [], shape)
    other = KafkaWriter(producer, other_route, Origin("c", "src", 4), [], shape)
    acc, tp = producer._producer._accumulator, TopicPartition(topic, 0)
    try:
        # Held back from sending (as when its broker cannot be reached) from the start: full
        # batches are sent at once otherwise (Apache Kafka's producer metadata comes quickly)
        acc.muted.add(tp)
        writer.write([Offset(o) for o in range(100, 120)])  # several batches
        assert len(writer.pending) > 1
        with acc._tp_lock(tp):
            # ... until it is older than the delivery timeout: kafka-python expires it unsent
            acc._batches[tp][0].created -= 3600
        producer._producer._sender.wakeup()
        ended([entry[2] for entry in writer.pending], 20)  # the queued ones fail with it
        acc.muted.discard(tp)
        # refused, naming the records of the batch that failed first
        with pytest.raises(TargetFailure, match=r"did not take src\[3\] offsets 100-"):
            writer.write([Offset(o) for o in range(120, 125)])
        other.write([Offset(o) for o in range(0, 5)])
        producer.flush(timeout=20)
        failure = writer.failure()
        assert other.done_up_to(5) == 5
    finally:
        producer.close()
    assert writer.done_up_to(125) == 100
    assert failure is not None and not failure.hole and failure.key == ("src", 3)
    # never sent: the driver knows these records are not at the destination (no resync passes
    # them, whatever lands after them)
    from relay.spec import NOT_WRITTEN

    assert {state for _, _, state in writer.unacknowledged()} == {NOT_WRITTEN}
    assert "src[3] offsets 100-" in str(failure)
    landed = read_all(target_broker.bootstrap, topic)
    assert landed[0] == []  # nothing behind the expired batch went out: no hole
    assert [r.value for r in landed[1]] == [b"v%d" % o for o in range(5)]
