"""Transactional sources on Apache Kafka: a partition written as exactly-once applications
write it (committed, aborted and still-open transactions interleaved with plain records) is
relayed, backed up and verified read_committed, the default: exactly the committed and plain
records arrive, in order, none of an aborted transaction, and an open one's only once it
commits; `--stop-at-end` ends at the last stable offset captured at start. With
`isolation_level = "read_uncommitted"` every record arrives (the documented choice).

Tansu lists no aborted transaction (docs/development.md, "The test broker"): its cases here
check what ktm does there, the ends and the open transaction's wait."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from relay.batches import split_batches
from relay.clients import admin
from relay.clients.batch_fetch import BatchFetcher
from relay.clients.batch_reader import BatchReader
from relay.clients.consumer import SourceReader
from relay.config import ClusterConfig
from relay.config.model import FetchConfig
from testbed.records import read_all
from testbed.topics import create_topic, unique_topic, wait_until
from tests.support.inprocess import assert_verified, backup, relay_once, verify_once
from tests.support.relay import assert_exact_copy, committed_offsets, write_config

pytestmark = pytest.mark.timeout(240)

COMMITTED_TAGS = (b"plain", b"c1", b"c3", b"c5")  # what read_committed reads, once committed
OPEN = b"c5"  # the transaction left open until the test commits it


class Source(NamedTuple):
    topic: str
    open_txn: KafkaProducer  # its transaction is still open: commit_open() ends it
    stable: int  # the last stable offset: the open transaction's first offset
    kafka: bool  # Apache Kafka (else Tansu)


def tag(record: Any) -> bytes:
    return bytes(record.value).split(b"-", 1)[0]


@contextmanager
def transactional_source(bootstrap: str, kafka: bool = True) -> Iterator[Source]:
    """Partition 0 of a fresh topic: plain records; c1 committed (producer A); c2 aborted (A);
    c3 committed (A again, after its abort marker); c4 aborted (producer B), its records
    interleaved with plain ones; plain; c5 (A) left open; plain records after it. On Kafka,
    waits for the markers (written after a commit or abort returns); Tansu writes them at once
    (measured), and its ListOffsets(READ_COMMITTED) cannot tell."""
    topic = create_topic(bootstrap, unique_topic("txn-src"), partitions=1)
    a = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique_topic("txn-a"))
    b = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique_topic("txn-b"))
    plain = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    counter = iter(range(10_000))

    def send(producer: KafkaProducer, name: bytes, count: int) -> None:
        for i in range(count):
            n = next(counter)
            producer.send(topic, b"%s-%d-%d" % (name, i, n), key=b"k%d" % n, partition=0,
                          headers=[("n", b"%d" % n)])  # fmt: skip
        producer.flush()

    def transaction(producer: KafkaProducer, name: bytes, count: int, commit: bool) -> None:
        producer.begin_transaction()
        send(producer, name, count)
        producer.commit_transaction() if commit else producer.abort_transaction()

    try:
        a.init_transactions()
        b.init_transactions()
        send(plain, b"plain", 20)
        transaction(a, b"c1", 30, commit=True)
        send(plain, b"plain", 10)
        transaction(a, b"c2", 25, commit=False)
        transaction(a, b"c3", 15, commit=True)
        b.begin_transaction()
        send(b, b"c4", 10)
        send(plain, b"plain", 5)
        send(b, b"c4", 10)
        b.abort_transaction()
        send(plain, b"plain", 10)
        a.begin_transaction()
        send(a, OPEN, 12)
        send(plain, b"plain", 8)  # past the last stable offset while c5 is open
        every = read_all(bootstrap, topic)[0]
        stable = next(r.offset for r in every if tag(r) == OPEN)
        if kafka:
            wait_until(lambda: stable_end(bootstrap, topic) == stable, 30, "the markers")
        yield Source(topic, a, stable, kafka)
    finally:
        for producer in (plain, b, a):
            producer.close(timeout=5)


def stable_end(bootstrap: str, topic: str) -> int:
    """The partition's last stable offset (ListOffsets READ_COMMITTED: exact on Kafka)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    try:
        tp = TopicPartition(topic, 0)
        return int(consumer.end_offsets([tp])[tp])
    finally:
        consumer.close()


def commit_open(bootstrap: str, source: Source, commit: bool = True) -> int:
    """Commit (or abort) the open transaction; returns the log end once its marker is there
    (Kafka writes markers after the commit returns)."""
    source.open_txn.commit_transaction() if commit else source.open_txn.abort_transaction()
    end = read_all(bootstrap, source.topic)[0][-1].offset + 2  # the last record, its marker
    if source.kafka:
        wait_until(lambda: stable_end(bootstrap, source.topic) == end, 30, "the commit marker")
    return end


def committed_records(bootstrap: str, topic: str, below: int) -> list[Any]:
    """The records a read_committed consumer reads below `below`, told apart by their tags."""
    every = read_all(bootstrap, topic)[0]
    return [r for r in every if tag(r) in COMMITTED_TAGS and r.offset < below]


def copy_of(target: str, dst: str) -> list[Any]:
    return read_all(target, dst)[0]


def no_markers(bootstrap: str, topic: str) -> bool:
    fetcher = BatchFetcher(ClusterConfig("probe", (bootstrap,)))
    try:
        data = fetcher.fetch({(topic, 0): 0}, timeout=10)[(topic, 0)].data
        return not any(b.is_control or b.is_transactional for b in split_batches(data)[0])
    finally:
        fetcher.close()


@pytest.mark.brokers("kafka", "kafka39")
def test_only_committed_records_are_relayed_and_an_open_transaction_waits_for_its_commit(
    source_broker, target_broker, spark, tmp_path
):
    source, target = source_broker.bootstrap, target_broker.bootstrap
    with transactional_source(source) as src:
        dst = create_topic(target, unique_topic("txn-dst"), partitions=1)
        store = tmp_path / "store"
        conf = write_config(tmp_path / "c.toml", source=source, target=target,
                            topics={src.topic: dst},
                            extra=f'\n[store]\nurl = "{store}"\n')  # fmt: skip

        # (a fresh broker's group coordinator: kafka-python waits for it, the relay's start-up
        # retries only once in the tests' configs)
        assert committed_offsets(source, "ktm", src.topic, 1) == {0: None}

        # --stop-at-end ends at the last stable offset captured at start, not the high
        # watermark: the open transaction does not hold it up
        first, _ = relay_once(conf)

        expected = committed_records(source, src.topic, src.stable)
        assert len(expected) == 20 + 30 + 10 + 15 + 5 + 10
        assert_exact_copy({0: expected}, copy_of(target, dst), src.topic)
        assert first.next_offsets == {(src.topic, 0): src.stable}
        assert committed_offsets(source, "ktm", src.topic, 1) == {0: src.stable}

        end = commit_open(source, src)
        second, _ = relay_once(conf)

        expected = committed_records(source, src.topic, end)
        assert len(expected) == 90 + 12 + 8
        assert_exact_copy({0: expected}, copy_of(target, dst), src.topic)  # c5 once, in order
        assert second.next_offsets == {(src.topic, 0): end}
        assert committed_offsets(source, "ktm", src.topic, 1) == {0: end}
        assert no_markers(target, dst)
        # ktm verify skips the aborted records on the source side as the relay did
        assert_verified(verify_once(conf, spark), len(expected))

        # a backup of the same source holds the same records: ktm verify --store
        assert backup(conf).relayed == len(expected)
        assert_verified(verify_once(conf, spark, "backup"), len(expected))


@pytest.mark.brokers("kafka")
def test_an_open_transaction_that_aborts_is_never_copied(
    source_broker, target_broker, spark, tmp_path
):
    """The first run stops where the open transaction begins; the second resumes there, inside
    what is then an aborted transaction, and copies only the plain records around it."""
    source, target = source_broker.bootstrap, target_broker.bootstrap
    with transactional_source(source) as src:
        dst = create_topic(target, unique_topic("txn-dst"), partitions=1)
        conf = write_config(tmp_path / "c.toml", source=source, target=target,
                            topics={src.topic: dst})  # fmt: skip
        assert committed_offsets(source, "ktm", src.topic, 1) == {0: None}  # the coordinator
        relay_once(conf)

        end = commit_open(source, src, commit=False)
        summary, _ = relay_once(conf)

        expected = [r for r in committed_records(source, src.topic, end) if tag(r) != OPEN]
        assert len(expected) == 90 + 8  # the plain records after the aborted c5 too
        assert_exact_copy({0: expected}, copy_of(target, dst), src.topic)
        assert summary.next_offsets == {(src.topic, 0): end}
        assert_verified(verify_once(conf, spark), len(expected))


@pytest.mark.brokers("kafka")
def test_read_uncommitted_relays_every_record_aborted_and_open_ones_too(
    source_broker, target_broker, spark, tmp_path
):
    source, target = source_broker.bootstrap, target_broker.bootstrap
    with transactional_source(source) as src:
        dst = create_topic(target, unique_topic("txn-dst"), partitions=1)
        conf = write_config(tmp_path / "c.toml", source=source, target=target,
                            topics={src.topic: dst})  # fmt: skip
        text = conf.read_text().replace(
            "[source_pool]\n", '[source_pool]\nisolation_level = "read_uncommitted"\n'
        )
        conf.write_text(text)
        assert committed_offsets(source, "ktm", src.topic, 1) == {0: None}  # the coordinator

        summary, _ = relay_once(conf)

        every = read_all(source, src.topic)[0]
        assert len(every) == 155
        assert_exact_copy({0: every}, copy_of(target, dst), src.topic)
        assert summary.next_offsets == {(src.topic, 0): every[-1].offset + 1}
        assert_verified(verify_once(conf, spark), len(every))


@pytest.mark.brokers("kafka")
def test_a_copy_made_read_uncommitted_past_an_open_transaction_resumes_read_committed(
    source_broker, target_broker, spark, tmp_path
):
    """An older ktm (read_uncommitted) copied the open transaction's records and what follows
    it; read_committed now ends at the stable offset, before them. Not a recreated topic: the
    run resumes after what the destination holds, and nothing arrives twice."""
    source, target = source_broker.bootstrap, target_broker.bootstrap
    with transactional_source(source) as src:
        dst = create_topic(target, unique_topic("txn-dst"), partitions=1)
        conf = write_config(tmp_path / "c.toml", source=source, target=target,
                            topics={src.topic: dst})  # fmt: skip
        committed_config = conf.read_text()
        pool = '[source_pool]\nisolation_level = "read_uncommitted"\n'
        conf.write_text(committed_config.replace("[source_pool]\n", pool))
        assert committed_offsets(source, "ktm", src.topic, 1) == {0: None}  # the coordinator
        relay_once(conf)
        conf.write_text(committed_config)

        summary, _ = relay_once(conf)  # c5 still open: nothing to copy, no refusal

        every = read_all(source, src.topic)[0]
        assert summary.next_offsets == {(src.topic, 0): every[-1].offset + 1}
        assert_exact_copy({0: every}, copy_of(target, dst), src.topic)
        commit_open(source, src)
        assert relay_once(conf)[0].relayed == 0  # only the marker was new


def cluster(bootstrap: str, isolation: str = "read_committed") -> ClusterConfig:
    return ClusterConfig("src", (bootstrap,), isolation_level=isolation)


def poll_all(reader: Any, key: tuple[str, int], upto: int) -> list[Any]:
    """What a reader returns until its position reaches `upto`."""
    got: list[Any] = []

    def reached() -> bool:
        got.extend(reader.poll(0.2).get(key, []))
        return bool(reader.positions([key])[key] >= upto)

    wait_until(reached, 30, f"the reader reaches {upto}")
    return got


@pytest.mark.brokers("kafka")
def test_the_readers_of_sources_skip_aborted_records_and_stop_at_the_stable_offset(
    source_broker,
):
    source = source_broker.bootstrap
    with transactional_source(source) as src:
        key = (src.topic, 0)
        every = read_all(source, src.topic)[0]
        wanted = [r.offset for r in every if tag(r) in COMMITTED_TAGS and r.offset < src.stable]

        # ends: the last stable offset under read_committed, the log end otherwise
        log_end = every[-1].offset + 1
        assert admin.offset_bounds(cluster(source), [key], 10)[1] == {key: src.stable}
        assert admin.offset_bounds(cluster(source, "read_uncommitted"), [key], 10)[1] == {
            key: log_end
        }
        memo: admin.EndMemo = {}
        assert admin.health_end_offsets(cluster(source), [key], 10, memo) == {key: src.stable}

        # the batch path's reader: aborted batches dropped, nothing past the stable offset
        batches = BatchReader(cluster(source), unique_topic("g"), FetchConfig(min_bytes=1))
        try:
            batches.assign({key: 0})
            got = poll_all(batches, key, src.stable)
            offsets = [
                o for b in got if not b.is_control for o in range(b.base_offset, b.next_offset)
            ]
            assert offsets == wanted
            assert batches.highwater(key) == src.stable  # an open transaction is not lag
            assert (
                batches.poll(0.5).get(key, []) == [] and batches.positions([key])[key] == src.stable
            )
        finally:
            batches.close()

        # the record path's consumer (kafka-python's read_committed)
        records = SourceReader(cluster(source), unique_topic("g"))
        try:
            records.assign({key: 0})
            assert [r.offset for r in poll_all(records, key, src.stable)] == wanted
        finally:
            records.close()

        end = commit_open(source, src)
        assert admin.health_end_offsets(cluster(source), [key], 10, memo) == {key: end}


@pytest.mark.brokers("tansu")
def test_tansu_reports_the_stable_offset_but_no_aborted_transaction(source_broker):
    """Tansu's ListOffsets(READ_COMMITTED) answers 0 while a transaction is open; the fetch's
    last stable offset is right, so the ends are; aborted records still arrive there."""
    source = source_broker.bootstrap
    with transactional_source(source, kafka=False) as src:
        key = (src.topic, 0)
        assert admin.offset_bounds(cluster(source), [key], 10)[1] == {key: src.stable}
        end = commit_open(source, src)
        assert admin.offset_bounds(cluster(source), [key], 10)[1] == {key: end}
        # no aborted list: c2 and c4 are read (docs/development.md, "The test broker")
        fetcher = BatchFetcher(cluster(source))
        try:
            fetched = fetcher.fetch({key: 0}, timeout=10)[key]
        finally:
            fetcher.close()
        assert fetched.aborted == () and fetched.end == end
