"""A stock three-broker Apache Kafka cluster (replication factor 3): ktm's defaults start on it,
and a group session it refuses is named. Then the faults only a real cluster has: a source
broker killed with -9 and restarted while its partitions are relayed from the new leaders, a
broker of each side frozen past the request timeouts, and a follower of both sides frozen while
batches expire (what the destination leaders appended waits uncommitted). Each copy ends
proven exact by `ktm verify`, with no partition stuck; the rounds each fault cost are printed
(`-s`). Last, a real unclean leader election: a stale follower elected leader below what ktm
already copied.

The source and destination topics live on one cluster, each led by a node of its own (the
destination's by another node than the source's), so a fault of a leader hits one side (and,
with acks=all, a follower's both). The
relay is held to a records/s cap so that the fault lands mid-stream."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from relay.clients.consumer import SourceReader
from relay.config import ClusterConfig
from relay.losses import TRUNCATED, Loss
from testbed.kafka import KafkaCluster
from testbed.ktm_process import assert_one_error_line, run_ktm
from testbed.provenance import attributed
from testbed.records import Record, produce, read_all
from testbed.topics import create_topic, unique_topic, wait_until
from tests.support.inprocess import Background, assert_verified, verify_once
from tests.support.relay import assert_exact_copy

pytestmark = pytest.mark.timeout(300)

PARTITIONS = 6
RECORDS = 60_000
CAP = 6_000  # records/s: ten seconds of relaying, the fault in the middle
SOURCE_LEADER, TARGET_LEADER, FOLLOWER = 1, 2, 3
FREEZE = 12.0  # seconds: past every request timeout below, and the broker's 9 s session


def config(
    path: Path, trio: KafkaCluster, src: str, dst: str, target: str = "", target_timeout: str = "5s"
) -> Path:
    """`target`: the destination's bootstrap, when it is not the trio."""
    servers = ", ".join(f'"{node.bootstrap}"' for node in trio.nodes)
    targets = f'"{target}"' if target else servers
    path.write_text(
        f'[app]\nmetrics_addr = ""\nsession_timeout = "6s"\n\n[topics]\n"{src}" = "{dst}"\n\n'
        f'[[sources]]\nname = "trio"\nservers = [{servers}]\n\n'
        '[source_pool]\nrequest_timeout = "2s"\nfetch_timeout = "5s"\n'
        'backoff_min = "200ms"\nbackoff_max = "1s"\n\n'
        f'[target]\nservers = [{targets}]\nrequest_timeout = "{target_timeout}"\n'
        'backoff_min = "200ms"\nbackoff_max = "1s"\n\n'
        f"[limits]\nrecords_per_second = {CAP}\n"
    )
    return path


def test_the_defaults_start_on_a_stock_broker_and_a_refused_session_is_named(kafka_trio, tmp_path):
    src = kafka_trio.create_topic(unique_topic("stock-src"), 3)
    dst = kafka_trio.create_topic(unique_topic("stock-dst"), 3)
    produce(
        kafka_trio.bootstrap, src, [Record(value=b"%d" % i, partition=i % 3) for i in range(300)]
    )
    servers = ", ".join(f'"{node.bootstrap}"' for node in kafka_trio.nodes)
    conf = tmp_path / "c.toml"
    base = (f'[topics]\n"{src}" = "{dst}"\n\n[[sources]]\nname = "trio"\nservers = [{servers}]\n\n'
            f"[target]\nservers = [{servers}]\n")  # fmt: skip
    conf.write_text(f'[app]\nmetrics_addr = ""\n\n{base}')  # every other key: its default

    done = run_ktm(tmp_path, "--config", str(conf), "--stop-at-end", timeout=120)

    assert done.returncode == 0, done.stderr
    copied = [r for rs in read_all(kafka_trio.bootstrap, dst).values() for r in rs]
    assert_exact_copy(read_all(kafka_trio.bootstrap, src), copied, src)

    conf.write_text(f'[app]\nmetrics_addr = ""\nsession_timeout = "2s"\n\n{base}')
    refused = run_ktm(tmp_path, "--config", str(conf), "--stop-at-end", timeout=120)
    line = assert_one_error_line(refused, 2, "[app].session_timeout = 2s")
    assert "group.min.session.timeout.ms = 6000" in line


def copy_through(
    trio: KafkaCluster,
    tmp_path: Path,
    spark: Any,
    fault: Callable[[], None],
    target_timeout: str = "5s",
) -> None:
    src = trio.create_topic(unique_topic("cf-src"), PARTITIONS, led_by=SOURCE_LEADER)
    dst = trio.create_topic(unique_topic("cf-dst"), PARTITIONS, led_by=TARGET_LEADER)
    records = [
        Record(key=b"k%d" % i, value=b"%08d" % i + b"." * 92, partition=i % PARTITIONS)
        for i in range(RECORDS)
    ]
    produce(trio.bootstrap, src, records)
    conf = config(tmp_path / "c.toml", trio, src, dst, target_timeout=target_timeout)
    relay = Background(conf, stop_at_end=True, failover=False)
    try:
        deadline = time.monotonic() + 60
        while relay.produced() < RECORDS / 4:
            assert time.monotonic() < deadline and relay.error is None, relay.error
            time.sleep(0.2)
        fault()
        relay.thread.join(180)  # --stop-at-end: done once every partition reached its end
        assert not relay.thread.is_alive(), "a partition is stuck: the relay did not finish"
    finally:
        relay.finish()
    assert relay.error is None, relay.error
    print(f"\nrounds by reason: {relay.rounds()}")
    copied = [r for rs in read_all(trio.bootstrap, dst, timeout=30).values() for r in rs]
    assert_exact_copy(read_all(trio.bootstrap, src, timeout=30), copied, src)
    assert_verified(verify_once(conf, spark), RECORDS)


def test_a_source_leader_killed_and_restarted_mid_stream(kafka_trio, tmp_path, spark):
    def kill_and_restart() -> None:
        node = kafka_trio.node(SOURCE_LEADER)
        node.kill()
        time.sleep(3)  # relayed from the new leaders meanwhile (once the node is fenced)
        node.launch()
        kafka_trio.wait_ready()

    copy_through(kafka_trio, tmp_path, spark, kill_and_restart)
    kafka_trio.wait_in_sync()


@pytest.mark.parametrize(
    ("node", "target_timeout"),
    [(SOURCE_LEADER, "5s"), (TARGET_LEADER, "5s"), (FOLLOWER, "1s")],
    ids=["source", "target", "follower"],
)
def test_a_broker_frozen_past_the_request_timeouts(
    kafka_trio, tmp_path, spark, node, target_timeout
):
    """ "follower": a follower of every partition (neither side's leader), its fencing past.
    acks=all waits on it, so what the destination leaders appended stays uncommitted; with a
    1 s request timeout batches expire first and the round ends. The next round must not
    resume from the high watermark while those records can still commit (once the frozen node
    is fenced and leaves the ISR), or they are copied twice: seen in CI as 10,229 records of
    10,000 after a source leader's kill, 10,282 here before the wait (relay.clients.committed)."""

    def freeze() -> None:
        frozen = kafka_trio.node(node)
        frozen.freeze()
        try:
            time.sleep(FREEZE)
        finally:
            frozen.thaw()

    copy_through(kafka_trio, tmp_path, spark, freeze, target_timeout)
    kafka_trio.wait_in_sync()


UNCLEAN = {"min.insync.replicas": "1", "unclean.leader.election.enable": "true"}
IN_SYNC, ALONE, AFTER = 100, 50, 60  # records: acks=all to both replicas, acks=1 to the leader


def unclean_topic(trio: KafkaCluster, leader: int, follower: int) -> str:
    """One partition on two replicas (leader first) that may elect an out-of-sync one: a
    replication factor of 3 could not shrink its ISR to the leader, since stopping two nodes
    of the trio (each a controller too) leaves no controller quorum to record it."""
    name = unique_topic("unclean-src")
    admin = trio.admin()
    try:
        admin.create_topics({name: {"assignments": {0: [leader, follower]}, "configs": UNCLEAN}})
    finally:
        admin.close()
    wait_until(lambda: led_by(trio, name) == leader, 30, f"{name} is led by node {leader}")
    return name


def led_by(trio: KafkaCluster, topic: str) -> int | None:
    """The leader of partition 0 as a running node says (None while none answers)."""
    running = ",".join(node.bootstrap for node in trio.nodes if node.is_running)
    try:
        admin = KafkaAdminClient(bootstrap_servers=running, request_timeout_ms=3000)
    except KafkaError:
        return None
    try:
        (described,) = admin.describe_topics([topic])
        return {p["partition_index"]: p["leader_id"] for p in described["partitions"]}.get(0)
    except KafkaError:
        return None
    finally:
        admin.close()


def read_to(trio: KafkaCluster, topic: str, end: int) -> SourceReader:
    """A reader of the record path (kafka-python's consumer) that read up to `end`: it knows the
    leader epoch of what it read, as a relay's reader would."""
    cluster = ClusterConfig("trio", tuple(node.bootstrap for node in trio.nodes))
    reader = SourceReader(cluster, "unclean-record-path", 5.0)
    reader.assign({(topic, 0): 0})
    deadline = time.monotonic() + 30
    while reader.positions([(topic, 0)])[(topic, 0)] < end:
        assert time.monotonic() < deadline, f"the record path did not read up to {end}"
        reader.poll(0.2)
    return reader


def first_losses(reader: SourceReader, timeout: float = 30) -> list[Loss]:
    """The losses the reader's polls find first; it reads no record meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert reader.poll(0.2) == {}, "the record path read past the truncation"
        found = reader.take_losses()
        if found:
            return found
    raise TimeoutError(f"the record path found no loss within {timeout}s")


@pytest.mark.brokers("kafka")
def test_an_unclean_leader_election_below_the_copy_halts_the_partition_and_counts_the_lost(
    kafka_trio: KafkaCluster, target_broker: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Offsets 0-99 in sync on nodes 1 and 2; node 2 stops, 100-149 go to node 1 alone (acks=1)
    and are copied; node 1 is killed and node 2 comes back, stale, and the broker elects it
    uncleanly (the topic's config): the source log parts from the copy at 100, and takes 60 new
    records at once, past 150, before the relay's next fetch (so no fetch is out of range: the
    leader's diverging epoch tells). The running relay halts the partition at 150 in one ERROR
    line naming offsets 100-149, counted as truncated, and copies none of the new records. A
    reader of the record path, at 150 too, finds the same loss (kafka-python's validation).

    The destination is a node of its own: with leader and follower down at once the trio has
    one controller of three, no quorum, until the follower is back; the relay's group (on the
    destination) would lose its coordinator meanwhile, and kafka-python's member was seen to
    spin on the dead one for over a minute after (2 runs of 6)."""
    leader, follower = SOURCE_LEADER, 2
    src = unclean_topic(kafka_trio, leader, follower)
    dst = create_topic(target_broker.bootstrap, unique_topic("unclean-dst"), partitions=1)
    old = [Record(value=b"in-sync %d" % i, partition=0) for i in range(IN_SYNC)]
    old += [Record(value=b"leader alone %d" % i, partition=0) for i in range(ALONE)]
    produce(kafka_trio.bootstrap, src, old[:IN_SYNC])
    conf = config(tmp_path / "c.toml", kafka_trio, src, dst, target_broker.bootstrap)
    relay = Background(conf, failover=False)
    halts, reader = relay.relay.status.halts, None
    try:
        wait_until(lambda: relay.produced() >= IN_SYNC, 60, "the in-sync records are copied")
        kafka_trio.node(follower).stop()  # a controlled shutdown: out of the ISR at once
        produce(kafka_trio.bootstrap, src, old[IN_SYNC:], acks=1)
        wait_until(lambda: relay.produced() >= len(old), 60, "the leader's own are copied")
        reader = read_to(kafka_trio, src, len(old))
        kafka_trio.node(leader).kill()
        kafka_trio.node(follower).launch()  # with node 3: a controller quorum again
        wait_until(lambda: led_by(kafka_trio, src) == follower, 60,
                   "the stale follower is elected uncleanly")  # fmt: skip
        produce(kafka_trio.bootstrap, src, [Record(value=b"new", partition=0)] * AFTER)
        wait_until(lambda: bool(halts.all()), 60, "the partition halts")
        assert first_losses(reader) == [Loss((src, 0), IN_SYNC, len(old), TRUNCATED, len(old))]
        time.sleep(2)  # a few fetches' time: none copies the new leader's records
    finally:
        try:
            relay.finish()
        finally:  # the trio whole again for the module's other tests
            if reader is not None:
                reader.close()
            for node in (follower, leader):
                kafka_trio.node(node).launch()
            kafka_trio.wait_ready()
            kafka_trio.wait_in_sync()
    assert relay.error is None, relay.error
    (halt,) = halts.all()
    assert (halt.route.key, halt.offset) == ((src, 0), len(old))
    assert relay.summary is not None and relay.summary.records_lost == ALONE
    assert [(h["source_topic"], h["offset"]) for h in relay.summary.halted] == [(src, len(old))]
    said = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"
            and "source log truncated below what was copied" in r.getMessage()]  # fmt: skip
    assert len(said) == 1, said
    assert re.search(rf"topic={src} partition=0 offsets=100-149 \(50 records the copy holds",
                     said[0]), said[0]  # fmt: skip
    labels = {"source_topic": src, "source_partition": "0", "cause": "truncated"}
    lost = relay.metrics.registry.get_sample_value("ktm_source_records_lost_total", labels)
    assert lost == ALONE
    now = [r.value for r in read_all(kafka_trio.bootstrap, src, timeout=30)[0]]
    assert now == [r.value for r in old[:IN_SYNC]] + [b"new"] * AFTER  # 100-149 are gone
    copied = attributed(read_all(target_broker.bootstrap, dst, timeout=30)[0])
    assert [(r.partition, r.offset) for r in copied] == [(0, o) for o in range(len(old))]
    assert [r.record.value for r in copied] == [record.value for record in old]
