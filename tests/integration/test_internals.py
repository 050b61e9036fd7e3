"""The contract with the libraries' private parts (relay/internals/), on real objects: every
internal ktm uses is found where it was read, on a real producer, consumer and admin client
talking to a real broker, and on the test session's real SparkContext. An upgrade of
kafka-python or PySpark that moves one fails here, naming it."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError
from kafka.net.compat import KafkaNetClient
from kafka.protocol.consumer import FetchRequest

from relay import internals
from relay.clients import admin, committed
from relay.config import ClusterConfig
from testbed.topics import create_topic, unique_topic

pytestmark = [pytest.mark.timeout(120), pytest.mark.brokers("tansu", "kafka")]


def test_every_internal_is_seen_on_the_classes():
    internals.check()  # raises Missing for a required one, warns for one with a fallback
    assert all(internal.present() for internal in internals.INTERNALS)


def test_the_producer_internals(source_broker):
    topic = create_topic(source_broker.bootstrap, unique_topic("internals"), 2)
    producer = KafkaProducer(bootstrap_servers=source_broker.bootstrap, acks="all")
    try:
        acc = internals.accumulator(producer)
        tp = TopicPartition(topic, 1)
        with internals.appending(acc), internals.partition_lock(acc, tp):
            assert len(internals.partition_queue(acc, tp)) == 0
        assert not internals.accumulator_closed(acc)
        other = create_topic(source_broker.bootstrap, unique_topic("internals"), 3)
        internals.know_topics(producer, [topic, other])  # one metadata request for both
        known = producer._metadata.partitions_for_topic  # no wait: there already, or None
        assert known(topic) == {0, 1} and known(other) == {0, 1, 2}
        assert internals.known_partitions(producer, topic) == {0, 1}
        assert not internals.is_transactional(producer)
        failures: list[object] = []
        internals.on_batch_failure(producer, lambda batch, future: failures.append(batch))
        internals.on_batch_split(acc, lambda batch, halves: None)
        internals.several_batches_in_flight(producer)
        seen: list[tuple[str, object]] = []

        def drained(by_node: dict[int, list[object]]) -> None:
            seen.extend(("drained", batch) for batches in by_node.values() for batch in batches)

        internals.on_drain(acc, drained)
        internals.on_answered(producer, lambda batch: seen.append(("answered", batch)))
        internals.on_batch_error(producer, lambda batch, error: error)
        internals.on_reenqueue(acc, lambda batch, now: seen.append(("retried", batch)))
        assert internals.muted_partitions(acc) == set()
        future = producer.send(topic, b"v", partition=1)
        internals.wake_sender(producer)
        future.get(timeout=30)
        deadline = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < deadline:  # answered right after the future
            time.sleep(0.01)
        assert [what for what, _ in seen] == ["drained", "answered"]  # one batch, acknowledged
        assert seen[0][1] is seen[1][1] and internals.batches_in_flight(producer, tp) == []
        batch = next(iter(internals.partition_queue(acc, tp)), None)
        assert batch is None or not internals.still_incomplete(acc, batch)
        assert internals.metadata_config(producer)["allow_auto_create_topics"] in (True, False)
        assert failures == []
    finally:
        internals.stop_sending(producer, KafkaError("test over"))
        internals.sending_ended(producer, 5.0)
        producer.close(timeout=5)


def test_the_consumer_group_and_admin_internals(source_broker):
    topic = create_topic(source_broker.bootstrap, unique_topic("internals"), 1)
    group = unique_topic("internals-group")
    consumer = KafkaConsumer(bootstrap_servers=source_broker.bootstrap, group_id=group,
                             session_timeout_ms=6000, heartbeat_interval_ms=1000)  # fmt: skip
    admin = KafkaAdminClient(bootstrap_servers=source_broker.bootstrap)
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(timeout_ms=200)
        tp = TopicPartition(topic, 0)
        consumer.seek(tp, 5)
        assert internals.position(consumer, tp) == 5
        consumer.seek(tp, 0)
        assert internals.position(consumer, tp) == 0
        while internals.last_heartbeat(consumer) == float("-inf"):  # the first one answered
            assert time.monotonic() < deadline, "no heartbeat answered"
            consumer.poll(timeout_ms=200)
        assert internals.group_member_count(admin, group) == 1
        assert internals.joining(consumer) is False  # stable: no join out
        internals.request_rejoin(consumer)
        consumer.poll(timeout_ms=0)  # sends the JoinGroup, does not wait for it
        assert internals.joining(consumer) is True
        internals.await_join(consumer, 30)
        assert internals.joining(consumer) is False
        assert internals.join_dropped(consumer) is False  # its outcome was taken
        internals.request_rejoin(consumer)
        consumer.poll(timeout_ms=0)
        while internals.joining(consumer):  # it ends with no poll waiting for it
            assert time.monotonic() < deadline, "the join never ended"
            time.sleep(0.05)
        assert internals.join_dropped(consumer) is True
        internals.request_rejoin(consumer)
        consumer.poll(timeout_ms=0)
        internals.await_join(consumer, 30)
        assert not internals.joining(consumer) and not internals.join_dropped(consumer)
        assert internals.metadata_config(consumer)["allow_auto_create_topics"] in (True, False)
        assert internals.metadata_config(admin)["allow_auto_create_topics"] in (True, False)
    finally:
        consumer.close(autocommit=False)
        admin.close()


def test_the_group_coordinator_is_found_and_connected_in_the_background(source_broker):
    """A reader's warm-up starts this and goes on at once; the task's first commit then
    finds the coordinator known and its connection open (one round trip, not three)."""
    group = unique_topic("internals-group")
    consumer = KafkaConsumer(bootstrap_servers=source_broker.bootstrap, group_id=group,
                             enable_auto_commit=False)  # fmt: skip
    try:
        began = time.monotonic()
        internals.find_coordinator_soon(consumer, 30)
        assert time.monotonic() - began < 1.0  # it does not wait for the broker
        coordinator, client = consumer._coordinator, consumer._client
        deadline = time.monotonic() + 30
        while coordinator.coordinator_id is None or not client.is_ready(coordinator.coordinator_id):
            assert time.monotonic() < deadline, "the coordinator was not found and connected"
            time.sleep(0.01)
    finally:
        consumer.close(autocommit=False)


def test_a_clients_metadata_and_api_versions_are_read_and_told(source_broker):
    """The seed a worker's clients are made with (relay.clients.seed): read from a consumer,
    told to a network client that never bootstrapped."""
    consumer = KafkaConsumer(bootstrap_servers=source_broker.bootstrap)
    client = KafkaNetClient(bootstrap_servers=source_broker.bootstrap)
    try:
        versions = internals.api_versions(consumer)
        assert any(key == FetchRequest.API_KEY for key, _, _ in versions)
        assert internals.client_cluster(consumer) is consumer._manager.cluster
        assert internals.api_versions(client) == ()  # not bootstrapped
        internals.know_api_versions(client, versions)
        assert internals.api_versions(client) == versions
    finally:
        consumer.close(autocommit=False)
        client.close()


def test_a_leaders_log_end_is_asked_where_the_broker_offers_it(source_broker):
    """OffsetForLeaderEpoch (relay.clients.committed): Apache Kafka answers each partition's
    log end under its leader's epoch; Tansu does not offer the request, so nothing is asked."""
    topic = create_topic(source_broker.bootstrap, unique_topic("log-ends"), 2)
    producer = KafkaProducer(bootstrap_servers=source_broker.bootstrap, acks="all")
    consumer = KafkaConsumer(bootstrap_servers=source_broker.bootstrap)
    try:
        for i in range(5):
            producer.send(topic, b"%d" % i, partition=0)
        producer.flush()
        consumer.topics()  # the all-topic metadata: leaders and their epochs
        parts = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        ends = internals.log_ends_soon(consumer, parts, 10.0)()
        offered = any(key == 23 for key, _, _ in internals.api_versions(consumer))
        if offered:
            assert {tp: end for tp, (_, end) in ends.items()} == {parts[0]: 5, parts[1]: 0}
            assert all(epoch >= 0 for epoch, _ in ends.values())
        else:
            assert ends == {}
    finally:
        producer.close()
        consumer.close(autocommit=False)


def test_a_tails_wait_for_commits_is_the_brokers_lag_limit_and_a_margin(source_broker, broker_kind):
    """relay.clients.committed waits for a stalled follower as long as the broker keeps it in
    the ISR: Apache Kafka describes its replica.lag.time.max.ms (25 s on the test pool), Tansu
    describes nothing and the default limit holds."""
    cluster = ClusterConfig("tails", (source_broker.bootstrap,))
    described = admin.broker_settings(cluster, ["replica.lag.time.max.ms"], 10.0)
    limit = admin.tail_wait_limit(cluster, 10.0)
    if broker_kind == "tansu":
        assert (described, limit) == ({}, committed.SETTLE_LIMIT)
    else:
        assert (described, limit) == ({"replica.lag.time.max.ms": "25000"}, 40.0)


def test_the_pyspark_internals(spark):
    context = internals.active_spark_context()
    assert context is not None
    internals.quiet_accumulator_server(context, lambda request, address: None)
    assert getattr(context, "_accumulatorServer", None) is not None
    assert internals.gateway_process(spark._gateway) is not None  # the engine owns its JVM


def test_a_missing_internal_is_one_line_naming_the_library_and_version(monkeypatch):
    gone = internals.Internal("Sender.nowhere", "kafka-python", lambda: False, None)
    monkeypatch.setattr(internals, "INTERNALS", (gone,))
    with pytest.raises(internals.Missing) as raised:
        internals.check()
    assert str(raised.value).startswith("kafka-python 3.0 is needed (found 3.0.")
    assert str(raised.value).endswith("Sender.nowhere is missing")
    with pytest.raises(internals.Missing, match="KafkaProducer._accumulator is missing"):
        internals.accumulator(object())
