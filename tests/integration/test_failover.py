"""Failover mode on real brokers: identical source nodes, kill -9, lag, empty comebacks.

"Identical nodes" are separate Tansu brokers fed the same records in the same order per
partition, so their offsets match (two brokers sharing one storage would need S3; see "The test
broker" in docs/development.md). The relay runs in-process on the shared SparkSession (in a
thread, stopped with its stop event) or, where the exit code matters, as the real `ktm` command.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient

from testbed.ktm_process import ktm
from testbed.provenance import attributed
from testbed.records import Record, produce, read_all, record_count
from testbed.tansu import NO_KILL_REASON, brokers_are_external
from testbed.topics import create_topic, unique_topic, wait_until
from tests.support.inprocess import Background, assert_verified, verify_once
from tests.support.relay import assert_exact_copy

pytestmark = [
    pytest.mark.brokers("tansu", "kafka"),
    pytest.mark.timeout(150),
    pytest.mark.skipif(brokers_are_external(), reason=NO_KILL_REASON),
]

PARTITIONS = 6  # more partitions than the 2 task slots of the shared local[2] Spark


def failover_config(
    path: Path,
    nodes: Sequence[Any],
    target: str,
    topic: str,
    dest: str,
    *,
    threshold: int = 100,
    max_retries: int = 30,
    on_mismatch: str = "stop",
) -> Path:
    sources = "".join(
        f'[[sources]]\nname = "{n.name}"\nservers = ["{n.bootstrap}"]\n\n' for n in nodes
    )
    path.write_text(
        f'[app]\nmetrics_addr = ""\nsession_timeout = "2s"\n\n'
        f'[topics]\n"{topic}" = "{dest}"\n\n{sources}'
        f'[source_pool]\nhealthcheck_interval = "500ms"\nrequest_timeout = "500ms"\n'
        f"offset_lag_threshold = {threshold}\nmax_retries = {max_retries}\n"
        f'backoff_min = "200ms"\nbackoff_max = "500ms"\non_mismatch = "{on_mismatch}"\n\n'
        f'[target]\nservers = ["{target}"]\nmax_retries = 2\nbackoff_min = "100ms"\n'
        f'backoff_max = "200ms"\n'
    )
    return path


def records(start: int, count: int, tag: str = "same") -> list[Record]:
    """Deterministic records, so two nodes fed the same range hold the same data."""
    return [
        Record(
            key=b"k%d" % i,
            value=(b"%s-%08d-" % (tag.encode(), i)).ljust(100, b"x"),
            headers=[("seq", str(i).encode())],
            partition=i % PARTITIONS,
            timestamp_ms=1_700_000_000_000 + i,
        )
        for i in range(start, start + count)
    ]


def feed(nodes: Sequence[Any], topic: str, batch: list[Record]) -> None:
    for node in nodes:
        produce(node.bootstrap, topic, batch)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    wait_until(predicate, timeout, what, every=0.2)


@pytest.fixture
def cluster(broker_factory, tmp_path):
    """Two identical source nodes and a destination, each topic with PARTITIONS partitions."""
    node1, node2, target = broker_factory("node1"), broker_factory("node2"), broker_factory("dst")
    topic, dest = unique_topic("fo"), unique_topic("fo-copy")
    for node in (node1, node2):
        create_topic(node.bootstrap, topic, PARTITIONS)
    create_topic(target.bootstrap, dest, PARTITIONS)
    return node1, node2, target, topic, dest


@pytest.mark.brokers("kafka")  # long: proved on Apache Kafka alone, the broker users run
def test_kill_9_of_the_active_node_mid_stream_loses_and_repeats_nothing(cluster, tmp_path, spark):
    node1, node2, target, topic, dest = cluster
    feed([node1, node2], topic, records(0, 2000))
    config = failover_config(tmp_path / "c.toml", [node1, node2], target.bootstrap, topic, dest)
    relay = Background(config)
    try:
        wait_for(lambda: record_count(target.bootstrap, dest) >= 2000, 60, "the first records")
        sent = 2000
        for chunk in range(8):  # the stream goes on; node1 dies in the middle of it
            alive = [node2] if chunk >= 3 else [node1, node2]
            feed(alive, topic, records(sent, 300))
            sent += 300
            if chunk == 2:
                node1.kill()
                killed_at = time.monotonic()
            time.sleep(0.2)
        first_from_node2 = _wait_first_from(target.bootstrap, dest, "node2", 60)
        wait_for(lambda: record_count(target.bootstrap, dest) >= sent, 60, "every record")
    finally:
        relay.finish()
    assert relay.error is None, relay.error
    assert_exact_copy(read_all(node2.bootstrap, topic), _all(target.bootstrap, dest), topic)
    assert relay.failovers("down") == 1 and relay.active("node2") == 1
    # ktm verify in failover mode: against the node that is up, the copy of both is exact
    assert_verified(verify_once(config, spark, failover=True), sent)
    print(
        f"\nfailover time (kill -9 -> first record from node2): {first_from_node2 - killed_at:.2f}s"
    )


@pytest.mark.brokers("kafka")
def test_a_failover_into_a_log_append_time_destination_is_exact(cluster, tmp_path, spark):
    """A destination topic with message.timestamp.type=LogAppendTime stamps every copy with
    its broker's append time. The continuity check at the failover compares key, value and
    headers of the destination's copy with the new node's record, not that timestamp: the
    relay goes on, exact, and ktm verify finds it exact."""
    node1, node2, target, topic, _ = cluster
    dest = create_topic(target.bootstrap, unique_topic("fo-lat"), PARTITIONS,
                        configs={"message.timestamp.type": "LogAppendTime"})  # fmt: skip
    feed([node1, node2], topic, records(0, 1200))
    config = failover_config(tmp_path / "c.toml", [node1, node2], target.bootstrap, topic, dest)
    relay = Background(config)
    try:
        wait_for(lambda: record_count(target.bootstrap, dest) >= 1200, 60, "the first records")
        sent = 1200
        for chunk in range(6):
            alive = [node2] if chunk >= 3 else [node1, node2]
            feed(alive, topic, records(sent, 300))
            sent += 300
            if chunk == 2:
                node1.kill()
            time.sleep(0.2)
        _wait_first_from(target.bootstrap, dest, "node2", 60)
        wait_for(lambda: record_count(target.bootstrap, dest) >= sent, 60, "every record")
    finally:
        relay.finish()
    assert relay.error is None, relay.error
    assert relay.failovers("down") == 1 and relay.active("node2") == 1
    copied = _all(target.bootstrap, dest)
    assert {r.timestamp_type for r in copied} == {1}  # the broker's time on every copy
    assert min(r.timestamp for r in copied) > 1_700_000_000_000 + sent
    assert_exact_copy(read_all(node2.bootstrap, topic), copied, topic, broker_time=True)
    assert_verified(verify_once(config, spark, failover=True), sent)


def test_lagging_active_node_is_left_for_the_most_advanced_one(cluster, tmp_path):
    node1, node2, target, topic, dest = cluster
    feed([node1, node2], topic, records(0, 1000))
    config = failover_config(tmp_path / "c.toml", [node1, node2], target.bootstrap, topic, dest)
    relay = Background(config)
    try:
        wait_for(lambda: record_count(target.bootstrap, dest) >= 1000, 60, "the first records")
        # node1 stops receiving: 200 behind per partition, over the threshold of 100
        feed([node2], topic, records(1000, 200 * PARTITIONS))
        wait_for(
            lambda: record_count(target.bootstrap, dest) >= 1000 + 200 * PARTITIONS,
            60,
            "the records only node2 has",
        )
    finally:
        relay.finish()
    assert relay.error is None, relay.error
    assert_exact_copy(read_all(node2.bootstrap, topic), _all(target.bootstrap, dest), topic)
    assert relay.failovers("lag") == 1 and relay.active("node2") == 1


def test_a_dead_node_that_comes_back_empty_is_never_used(cluster, tmp_path):
    node1, node2, target, topic, dest = cluster
    feed([node1, node2], topic, records(0, 1000))
    relay = Background(
        failover_config(tmp_path / "c.toml", [node1, node2], target.bootstrap, topic, dest)
    )
    try:
        wait_for(lambda: record_count(target.bootstrap, dest) >= 1000, 60, "the first records")
        node1.kill()
        wait_for(lambda: relay.active("node2") == 1, 30, "the switch to node2")
        node1.restart(empty=True)  # a new broker in its place: it comes back with nothing
        create_topic(node1.bootstrap, topic, PARTITIONS)
        feed([node1], topic, records(0, 50, tag="reborn"))  # up, but far behind
        feed([node2], topic, records(1000, 400))
        wait_for(lambda: record_count(target.bootstrap, dest) >= 1400, 60, "the new records")
        time.sleep(2)  # several health checks with node1 up and behind
    finally:
        relay.finish()
    assert relay.error is None, relay.error
    assert_exact_copy(read_all(node2.bootstrap, topic), _all(target.bootstrap, dest), topic)
    assert relay.failovers() == 1 and relay.active("node2") == 1


PROBED_SECONDS = 10.0  # 20 health checks at the tests' 500 ms interval, readers reconnected


@pytest.mark.brokers("kafka")  # long: proved on Apache Kafka alone, the broker users run
def test_a_node_restarted_empty_and_probed_by_a_running_relay_gets_no_topic(cluster, tmp_path):
    """ktm's health checks, offset reads and its executors' cached readers (which reconnect)
    never create a topic on a source (issue 18.5): the node stays empty."""
    node1, node2, target, topic, dest = cluster
    feed([node1, node2], topic, records(0, 600))
    relay = Background(
        failover_config(tmp_path / "c.toml", [node1, node2], target.bootstrap, topic, dest)
    )
    try:
        wait_for(lambda: record_count(target.bootstrap, dest) >= 600, 60, "the first records")
        active, other = (node1, node2) if relay.active("node1") == 1 else (node2, node1)
        # A crash and an immediate restart: the relay's reader and probes of this node are
        # connected when it goes and reconnect to it empty (a new broker in its place).
        active.restart(empty=True)
        wait_for(lambda: relay.active(other.name) == 1, 30, f"the switch to {other.name}")
        deadline = time.monotonic() + PROBED_SECONDS
        while time.monotonic() < deadline:
            assert topics_on(active.bootstrap) == [], "ktm created a topic on the empty node"
            time.sleep(1.0)
        feed([other], topic, records(600, 60))
        wait_for(
            lambda: record_count(target.bootstrap, dest) >= 660, 60, "records after the restart"
        )
    finally:
        relay.finish()
    assert relay.error is None, relay.error
    assert topics_on(active.bootstrap) == []
    create_topic(active.bootstrap, topic, PARTITIONS)  # what failed before: it already existed


def topics_on(bootstrap: str) -> list[str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        # all topics (names none); Kafka's internal ones (__consumer_offsets) are not data
        found = (t["name"] for t in admin.describe_topics())
        return sorted(name for name in found if not name.startswith("__"))
    finally:
        admin.close()


def test_continuity_mismatch_stops_without_skipping(cluster, tmp_path):
    node1, node2, target, topic, dest = cluster
    feed([node1, node2], topic, records(0, 100))
    feed([node1], topic, records(100, 100, tag="node1"))
    feed([node2], topic, records(100, 100, tag="node2"))  # same offsets, different records
    relay = Background(
        failover_config(tmp_path / "c.toml", [node1, node2], target.bootstrap, topic, dest)
    )
    try:
        wait_for(lambda: record_count(target.bootstrap, dest) >= 200, 60, "node1's records")
        node1.kill()
        relay.thread.join(60)
    finally:
        relay.finish()
    assert relay.error is not None and "continuity check failed" in str(relay.error)
    assert "node2" in str(relay.error)
    copied = _all(target.bootstrap, dest)
    assert all(relayed.source == "node1" for relayed in attributed(copied))
    assert len(copied) == 200 and _per_partition_exact(copied, 200 // PARTITIONS)


@pytest.mark.brokers("kafka")  # long: proved on Apache Kafka alone, the broker users run
def test_stop_at_end_in_failover_mode_survives_the_active_node_dying(cluster, tmp_path):
    node1, node2, target, topic, dest = cluster
    feed([node1, node2], topic, records(0, 30_000))
    config = failover_config(tmp_path / "c.toml", [node1, node2], target.bootstrap, topic, dest)
    with ktm(tmp_path, "--config", str(config), "--mode", "failover", "--stop-at-end") as relay:
        wait_for(lambda: record_count(target.bootstrap, dest) >= 1000, 90, "the relay to start")
        node1.kill()
        run = relay.wait(timeout=120)
    assert run.returncode == 0, run.stderr
    assert_exact_copy(read_all(node2.bootstrap, topic), _all(target.bootstrap, dest), topic)


@pytest.mark.brokers("tansu")  # ktm's own behaviour, the same on any broker: nodes that are gone
def test_all_nodes_down_exits_1_naming_the_nodes(cluster, tmp_path):
    node1, node2, target, topic, dest = cluster
    feed([node1, node2], topic, records(0, 500))
    config = failover_config(
        tmp_path / "c.toml", [node1, node2], target.bootstrap, topic, dest, max_retries=2
    )
    with ktm(tmp_path, "--config", str(config), "--mode", "failover") as relay:
        wait_for(lambda: record_count(target.bootstrap, dest) >= 500, 90, "the relay to start")
        node1.kill()
        node2.kill()
        run = relay.wait(timeout=90)
    errors = run.error_lines()
    assert run.returncode == 1, run.stderr
    assert len(errors) == 1 and "node1" in errors[0] and "node2" in errors[0], run.stderr
    assert errors[0].startswith("ktm: error: "), run.stderr
    assert "Traceback" not in run.stderr


def _per_partition_exact(copied: list[Any], per_partition: int) -> bool:
    """Each partition's records, in order, from offset 0 (200 records over 6 partitions: the
    first two partitions hold one more)."""
    seen: dict[int, list[int]] = {}
    for relayed in attributed(copied):
        seen.setdefault(relayed.partition, []).append(relayed.offset)
    return all(offsets == list(range(len(offsets))) for offsets in seen.values()) and all(
        len(offsets) in (per_partition, per_partition + 1) for offsets in seen.values()
    )


def _all(bootstrap: str, topic: str) -> list[Any]:
    return [r for rs in read_all(bootstrap, topic, timeout=20).values() for r in rs]


def _wait_first_from(bootstrap: str, topic: str, node: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(relayed.source == node for relayed in attributed(_all(bootstrap, topic))):
            return time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"no record from {node} within {timeout}s")
