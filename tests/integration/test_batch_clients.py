"""The batch path's client seams against real brokers: records produced by kafka-python (every
codec, multi-record and one-record batches) are fetched as raw batches (batch_fetch), rebuilt
(relay.batches) and produced as built batches (batch_produce) to another cluster, then read back
with a plain KafkaConsumer and compared record by record."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest
from kafka import KafkaProducer

from relay import internals
from relay.batches import DestBatch, Origin, codecs, rebuild, split_batches
from relay.batches.records import record_offsets
from relay.clients import admin
from relay.clients.batch_fetch import BatchFetcher
from relay.clients.batch_produce import BatchDelivery
from relay.clients.producer import Producer
from relay.config import ClusterConfig, TargetConfig
from relay.provenance.header import Provenance, parse_provenance
from testbed.ports import free_port
from testbed.records import Record, produce, read_all
from testbed.topics import create_topic, unique_topic
from tests.conftest import BrokerFactory

pytestmark = [pytest.mark.timeout(120), pytest.mark.brokers("tansu", "kafka")]

T0 = 1_700_000_000_000
# partition: how kafka-python batches it (one record per batch for partition 0)
SOURCE_CODECS = {0: None, 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
PER_PARTITION = 120
MID_BATCH_START = {3: 37}  # a fetch that starts inside a batch: records before 37 are dropped


def source_records(partition: int) -> list[Record]:
    return [
        Record(
            key=b"k%d-%d" % (partition, i) if i % 9 else None,
            value=(b"value %d/%d " % (partition, i)) * 8,
            headers=[("trace", b"t%d" % i), ("app", b"ktm-test")],
            partition=partition,
            timestamp_ms=T0 + partition * 1000 + i,
        )
        for i in range(PER_PARTITION)
    ]


def produce_source(bootstrap: str, topic: str) -> None:
    for partition, codec in SOURCE_CODECS.items():
        settings: dict[str, Any] = {"compression_type": codec, "linger_ms": 50}
        if partition == 0:
            settings = {"batch_size": 1, "linger_ms": 0}  # a low-latency producer
        produce(bootstrap, topic, source_records(partition), **settings)


def fetch_all(
    fetcher: BatchFetcher, starts: dict[tuple[str, int], int], on_batches: Callable[..., int]
) -> None:
    """Fetch every partition from its start to its high watermark, rebuilding as it goes."""
    positions = dict(starts)
    deadline = time.monotonic() + 30
    done: set[tuple[str, int]] = set()
    while len(done) < len(positions):
        assert time.monotonic() < deadline, f"fetching did not reach the end: {positions}"
        wanted = {k: v for k, v in positions.items() if k not in done}
        for key, fetched in fetcher.fetch(wanted, timeout=5).items():
            assert fetched.error is None, fetched.error
            batches, _ = split_batches(fetched.data)
            positions[key] = on_batches(key, batches, positions[key])
            if positions[key] >= fetched.high_watermark:
                done.add(key)


def wait_acked(deliveries: list[BatchDelivery], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(d.done for d in deliveries) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(d.acked() for d in deliveries), [d.error() for d in deliveries if not d.acked()]


def expected_copy(source: list[Record], built: list[DestBatch]) -> list[tuple[Any, ...]]:
    """What the destination must hold: the source records in order, the last of each built
    batch with the provenance range appended to its headers."""
    by_offset = dict(enumerate(source))  # the source partitions start at offset 0
    rows = []
    for dest in built:
        for offset in range(dest.first_offset, dest.last_offset + 1):
            r = by_offset[offset]
            headers = list(r.headers)
            if offset == dest.last_offset:
                prov = b"src/%s/%d/%d-%d" % (b"T", r.partition or 0, dest.first_offset, offset)
                headers.append(("ktm.src", prov))
            rows.append((r.key, r.value, headers, r.timestamp_ms))
    return rows


@pytest.mark.parametrize("target_codec", ["none", "zstd"])
def test_batches_fetched_rebuilt_and_produced_arrive_exactly(
    broker_factory: BrokerFactory, target_codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, target = broker_factory("source"), broker_factory("target")
    topic, dest_topic = unique_topic("batch-src"), unique_topic("batch-dst")
    create_topic(source.bootstrap, topic, len(SOURCE_CODECS))
    create_topic(target.bootstrap, dest_topic, len(SOURCE_CODECS))
    produce_source(source.bootstrap, topic)

    built: dict[int, list[DestBatch]] = {p: [] for p in SOURCE_CODECS}
    seen: dict[int, set[tuple[int, int]]] = {p: set() for p in SOURCE_CODECS}  # (codec, count)

    def on_batches(key: tuple[str, int], batches: list[Any], start: int) -> int:
        origin = Origin("src", "T", key[1])  # "T": the provenance names a fixed topic
        rebuilt = rebuild(batches, start, origin, codecs.BY_NAME[target_codec], budget=4096)
        built[key[1]] += rebuilt.batches
        seen[key[1]].update((b.codec, b.header.record_count) for b in batches)
        return rebuilt.next_offset

    fetcher = BatchFetcher(ClusterConfig("src", (source.bootstrap,)))
    try:
        starts = {(topic, p): MID_BATCH_START.get(p, 0) for p in SOURCE_CODECS}
        fetch_all(fetcher, starts, on_batches)
    finally:
        fetcher.close()
    assert seen[0] == {(codecs.NONE, 1)}
    assert len(built[0]) < PER_PARTITION / 4  # one-record batches were merged
    for p, codec in list(SOURCE_CODECS.items())[1:]:
        assert {c for c, _ in seen[p]} == {codecs.BY_NAME[str(codec)]}
        assert max(n for _, n in seen[p]) > 1

    producer = Producer(TargetConfig(ClusterConfig("dst", (target.bootstrap,))))
    wakeups: list[object] = []
    wake = internals.wake_sender

    def counted(kafka_producer: object) -> None:
        wakeups.append(kafka_producer)
        wake(kafka_producer)

    monkeypatch.setattr(internals, "wake_sender", counted)
    try:
        with producer.held():  # as a task step writes: the sender is woken once, at the end
            deliveries = {p: producer.send_built(dest_topic, p, built[p]) for p in SOURCE_CODECS}
            assert wakeups == []
        assert len(wakeups) == 1
        producer.flush(timeout=30)
        for p, sent in deliveries.items():
            wait_acked(sent, timeout=10)
            bases = [d.base_offset for d in sent]
            counts = [b.count for b in built[p]]
            assert bases == [sum(counts[:i]) for i in range(len(counts))]  # contiguous, from 0
    finally:
        producer.close()

    arrived = read_all(target.bootstrap, dest_topic)
    for p in SOURCE_CODECS:
        wanted = expected_copy(source_records(p), built[p])
        got = [(r.key, r.value, list(r.headers), r.timestamp) for r in arrived[p]]
        assert got == wanted
        assert len(got) == PER_PARTITION - MID_BATCH_START.get(p, 0)
        last = parse_provenance(dict(arrived[p][-1].headers)["ktm.src"])
        runs = ((built[p][-1].first_offset, PER_PARTITION - 1),)
        assert last == Provenance("src", "T", p, runs)


def test_the_sender_stamps_producer_id_and_sequences(broker_factory: BrokerFactory) -> None:
    broker = broker_factory("one")
    topic, dest_topic = unique_topic("stamp-src"), unique_topic("stamp-dst")
    create_topic(broker.bootstrap, topic, 1)
    create_topic(broker.bootstrap, dest_topic, 1)
    produce(broker.bootstrap, topic, [Record(b"k", b"v" * 50, partition=0)] * 60, batch_size=1)
    cluster = ClusterConfig("c", (broker.bootstrap,))
    fetcher = BatchFetcher(cluster)
    try:
        fetched = fetcher.fetch({(topic, 0): 0}, timeout=5)[(topic, 0)]
        built = rebuild(split_batches(fetched.data)[0], 0, Origin("c", topic, 0), budget=1200)
        producer = Producer(TargetConfig(cluster))
        try:
            sent = producer.send_built(dest_topic, 0, built.batches)
            producer.flush(timeout=30)
            wait_acked(sent, timeout=10)
        finally:
            producer.close()
        back = fetcher.fetch({(dest_topic, 0): 0}, timeout=5)[(dest_topic, 0)]
    finally:
        fetcher.close()
    landed, _ = split_batches(back.data)
    assert len(landed) == len(built.batches) > 1
    assert all(b.crc_ok() and b.header.producer_id >= 0 for b in landed)
    assert len({(b.header.producer_id, b.header.producer_epoch) for b in landed}) == 1
    sequences = [b.header.base_sequence for b in landed]
    counts = [b.header.record_count for b in landed]
    assert sequences == [sum(counts[:i]) for i in range(len(counts))]


def test_transaction_markers_never_arrive_and_uncommitted_reads_do(
    broker_factory: BrokerFactory,
) -> None:
    """read_uncommitted: the committed and the aborted transaction's records both arrive, in
    order; the commit and abort markers do not, and the next offset moves past them."""
    broker = broker_factory("txn")
    topic, dest_topic = unique_topic("txn-src"), unique_topic("txn-dst")
    create_topic(broker.bootstrap, topic, 1)
    create_topic(broker.bootstrap, dest_topic, 1)
    source = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=unique_topic())
    try:
        source.init_transactions()
        for values, commit in (([b"c0", b"c1", b"c2"], True), ([b"a0", b"a1"], False)):
            source.begin_transaction()
            for value in values:
                source.send(topic, value, partition=0)
            source.flush()
            source.commit_transaction() if commit else source.abort_transaction()
    finally:
        source.close()
    cluster = ClusterConfig("c", (broker.bootstrap,))
    fetcher = BatchFetcher(cluster)
    producer = Producer(TargetConfig(cluster))
    try:
        fetched = fetcher.fetch({(topic, 0): 0}, timeout=5)[(topic, 0)]
        batches, _ = split_batches(fetched.data)
        assert [b.is_control for b in batches] == [False, True, False, True]
        rebuilt = rebuild(batches, 0, Origin("c", topic, 0), budget=4096)
        assert rebuilt.next_offset == fetched.high_watermark == 7
        sent = producer.send_built(dest_topic, 0, rebuilt.batches)
        producer.flush(timeout=30)
        wait_acked(sent, timeout=10)
        landed, _ = split_batches(
            fetcher.fetch({(dest_topic, 0): 0}, timeout=5)[(dest_topic, 0)].data
        )
    finally:
        producer.close()
        fetcher.close()
    assert not any(b.is_control or b.is_transactional for b in landed)
    arrived = read_all(broker.bootstrap, dest_topic)[0]
    assert [r.value for r in arrived] == [b"c0", b"c1", b"c2", b"a0", b"a1"]
    # the marker at offset 3 is a gap inside the merged batch: the header lists both runs
    assert dict(arrived[-1].headers)["ktm.src"] == b"c/%s/0/0-2,4-5" % topic.encode()


def test_a_fetcher_seeded_with_the_drivers_metadata_reads_without_a_bootstrap(
    broker_factory: BrokerFactory,
) -> None:
    """A worker's fetcher told the driver's metadata (relay.clients.seed) fetches at once: with
    its `servers` a closed port it can never bootstrap, and still reads every record. A seed
    gone stale (its leader's address a closed port) is mended by the fetcher's own metadata
    refresh, as a leader move would be."""
    broker = broker_factory("one")
    topic = create_topic(broker.bootstrap, unique_topic("seeded"), 2)
    sent = [Record(b"k%d" % i, b"v%d" % i, partition=i % 2) for i in range(40)]
    produce(broker.bootstrap, topic, sent)
    real = ClusterConfig("src", (broker.bootstrap,))
    seed = admin.metadata_seed(real, [topic], 10)
    assert seed is not None and seed.of([topic]) == seed

    nowhere = ClusterConfig("src", (f"127.0.0.1:{free_port()}",))
    moved = dataclasses.replace(
        seed, brokers=tuple((n, "127.0.0.1", free_port(), r) for n, _, _, r in seed.brokers)
    )
    for cluster, given in ((nowhere, dataclasses.replace(seed, servers=nowhere.servers)),
                           (real, moved)):  # fmt: skip
        fetcher = BatchFetcher(cluster, 5, seed=given)
        try:
            held = _fetch_offsets(fetcher, {(topic, 0): 0, (topic, 1): 0}, 40)
        finally:
            fetcher.close()
        assert held == [(p, offset) for p in (0, 1) for offset in range(20)]


def _fetch_offsets(
    fetcher: BatchFetcher, positions: dict[tuple[str, int], int], count: int
) -> list[tuple[int, int]]:
    """(partition, offset) of each record fetched from `positions` on until `count` came;
    failed fetches are tried again (a stale leader fails one or two)."""
    found: list[tuple[int, int]] = []
    deadline = time.monotonic() + 30
    while len(found) < count:
        assert time.monotonic() < deadline, f"{len(found)} of {count} fetched"
        for key, fetched in fetcher.fetch(positions, timeout=2).items():
            batches, _ = split_batches(fetched.data) if fetched.error is None else ([], 0)
            for batch in batches:
                found += [(key[1], offset) for offset in record_offsets(batch)]
                positions[key] = batch.next_offset
    return sorted(found)


def test_a_reader_of_many_partitions_fetches_them_in_lanes_taking_turns(
    broker_factory: BrokerFactory,
) -> None:
    """A pipelined fetcher whose lanes hold at most 2 partitions (LANE_PARTITIONS in a relay:
    500) reads a 7-partition topic through 4 lanes, 2 fetches out at a time, each with its own
    session on Apache Kafka: every record once, in order, and no request names more than 2."""
    broker = broker_factory("one")
    topic = create_topic(broker.bootstrap, unique_topic("lanes"), 7)
    produce(broker.bootstrap, topic, [Record(b"k", b"v%d" % i, partition=i % 7) for i in range(70)])
    fetcher = BatchFetcher(
        ClusterConfig("src", (broker.bootstrap,)), 10, lanes=2, lane_partitions=2, sessions=True
    )
    named: list[int] = []  # partitions each request names
    futures: list[Any] = []  # of every request sent
    send = fetcher._client.send

    def recording(node: int, request: Any) -> Any:
        assert sum(not f.is_done for f in futures) < 2  # a third waits for its turn
        named.append(sum(len(t.partitions) for t in request.topics))
        futures.append(send(node, request))
        return futures[-1]

    fetcher._client.send = recording
    positions = {(topic, p): 0 for p in range(7)}
    found: list[tuple[int, int]] = []
    deadline = time.monotonic() + 30
    try:
        while len(found) < 70:
            assert time.monotonic() < deadline, f"{len(found)} of 70 fetched"
            if not fetcher.busy():
                fetcher.send(positions)
            for answer in fetcher.receive(0.5):
                assert answer.fetched.error is None, answer.fetched.error
                for batch in split_batches(answer.fetched.data)[0]:
                    found += [(answer.key[1], o) for o in record_offsets(batch)]
                    positions[answer.key] = batch.next_offset
    finally:
        fetcher.close()
    assert sorted(found) == [(p, o) for p in range(7) for o in range(10)]
    assert len(found) == 70 and named and max(named) <= 2
