"""Destination partition leaders move while the relay writes to them, on a three-node Apache
Kafka cluster (replication factor 3) under a steady feed: the preferred leader election, a
controlled shutdown of a node, a rolling restart of every node. Every record must arrive once,
in order (`ktm verify`), no partition may stall, and no round may fail because retried batches
reached the new leader out of sequence order (relay/clients/retry_order.py). Each test prints
the rounds that failed and why."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from relay.engine.metrics import Metrics
from testbed.kafka import KafkaCluster
from testbed.topics import create_topic, unique_topic
from tests.support.feeder import Feeder
from tests.support.inprocess import Background, assert_verified, verify_once

pytestmark = [pytest.mark.timeout(240), pytest.mark.brokers("kafka")]

PARTITIONS = 6  # two led by each node
# The smallest batches ktm allows: a steady feed of a few thousand records a second then keeps
# several batches of every partition in flight, as a relay catching up a backlog does.
TARGET = 'max_retries = 20\nbackoff_min = "200ms"\nbackoff_max = "1s"\nbatch_size = 1024'
SESSION = 'session_timeout = "6s"'  # the stock broker's minimum
OUT_OF_ORDER = "OutOfOrderSequenceNumber"


def total(metrics: Metrics, name: str, **labels: str) -> float:
    found = 0.0
    for metric in metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                found += sample.value
    return found


def wait(condition: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s: {what()}"
        time.sleep(0.2)


def in_sync(trio: KafkaCluster) -> bool:
    """No replica behind (testbed's `under_replicated` reads a key the answer lacks)."""
    admin = trio.admin()
    try:
        described = admin.describe_topics()
    finally:
        admin.close()
    return all(len(p["isr_nodes"]) == len(p["replica_nodes"])
               for t in described for p in t["partitions"])  # fmt: skip


def restart(trio: KafkaCluster, node_id: int) -> None:
    """A controlled shutdown of one node (its leaders move first), a start, every replica
    back in sync: one step of an operator's rolling restart."""
    trio.node(node_id).stop()
    trio.node(node_id).launch()
    trio.wait_ready()
    wait(lambda: in_sync(trio), 90, lambda: "replicas still out of sync")


def leaders(trio: KafkaCluster, topic: str, timeout: float = 30) -> dict[int, int]:
    """Partition -> its leader, asked of the nodes that run, again while the one asked has just
    gone (a killed node stays in the metadata until the controller fences it)."""
    deadline = time.monotonic() + timeout
    while True:
        running = [n.bootstrap for n in trio.nodes if n.is_running]
        try:
            admin = KafkaAdminClient(bootstrap_servers=running)
            try:
                (described,) = admin.describe_topics([topic])
            finally:
                admin.close()
            return {p["partition_index"]: p["leader_id"] for p in described["partitions"]}
        except KafkaError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def busiest_leader(trio: KafkaCluster, topic: str) -> int:
    found = list(leaders(trio, topic).values())
    return max(set(found), key=found.count)


class Ends:
    """End offsets of a topic's partitions (ListOffsets: exact on Apache Kafka)."""

    def __init__(self, servers: list[str], topic: str):
        self.consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
        self.partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]

    def __call__(self) -> dict[int, int]:
        found = self.consumer.end_offsets(self.partitions)
        return {tp.partition: int(end) for tp, end in found.items()}

    def close(self) -> None:
        self.consumer.close(autocommit=False)


class Run:
    """A relay from a pool node into the trio under a steady feed, and what it went through."""

    def __init__(self, source: str, trio: KafkaCluster, tmp_path: Path, caplog: Any):
        self.source, self.trio, self.caplog = source, trio, caplog
        self.src = create_topic(source, unique_topic("moves-src"), PARTITIONS)
        self.dst = create_topic(trio.bootstrap, unique_topic("moves-dst"), PARTITIONS)
        servers = [node.bootstrap for node in trio.nodes]
        self.source_ends, self.dest_ends = Ends([source], self.src), Ends(servers, self.dst)
        servers_list = ", ".join(f'"{server}"' for server in servers)
        self.conf = tmp_path / "moves.toml"
        self.conf.write_text(
            f'[app]\nmetrics_addr = ""\ngroup_id = "{unique_topic("moves")}"\n{SESSION}\n\n'
            f'[topics]\n"{self.src}" = "{self.dst}"\n\n'
            f'[[sources]]\nname = "src"\nservers = ["{source}"]\n\n'
            f"[target]\nservers = [{servers_list}]\n{TARGET}\n"
        )
        self.feeder: Feeder | None = None
        self.relay = Background(self.conf, failover=False)

    def feed(self) -> None:
        """A steady feed (about 3,000-15,000 records/s here), the relay busy with it."""
        self.feeder = Feeder(self.source, self.src, PARTITIONS, per_batch=3000, pause=0)
        wait(lambda: self.produced() > 10_000 or self.relay.error is not None, 90,
             lambda: f"the relay relays ({self.produced():.0f} records)")  # fmt: skip
        assert self.relay.error is None, self.relay.error

    def produced(self) -> float:
        return total(self.relay.metrics, "ktm_messages_produced_total")

    def caught_up(self, timeout: float = 120) -> None:
        """Every destination partition as far as its source was when asked: none stalled."""
        relay, wanted = self.relay, self.source_ends()

        def behind() -> dict[int, tuple[int, int]]:
            found = self.dest_ends()
            return {p: (found[p], end) for p, end in wanted.items() if found[p] < end}

        wait(lambda: relay.error is not None or not behind(), timeout,
             lambda: f"partitions behind (destination, source): {behind()}")  # fmt: skip
        assert relay.error is None, relay.error

    def finish(self, spark: object) -> list[str]:
        """The feed stopped, every record relayed and verified exact; the failures of the
        rounds that failed."""
        assert self.feeder is not None
        written = self.feeder.stop()
        self.caught_up()
        self.relay.finish(60)
        assert self.relay.error is None, self.relay.error
        assert_verified(verify_once(self.conf, spark), written)
        return self.failures()

    def failures(self) -> list[str]:
        """Why tasks failed (the driver's "task failed" lines of the test so far)."""
        records = self.caplog.get_records("call")
        return [r.getMessage() for r in records if "task failed" in r.getMessage()]

    def report(self) -> str:
        rounds = {reason: total(self.relay.metrics, "ktm_rounds_total", reason=reason)
                  for reason in ("error", "membership", "rebalance", "stop")}  # fmt: skip
        failed = "".join(f"\ntask failure: {failure}" for failure in self.failures())
        return f"rounds ended by reason: {rounds}{failed}"


@pytest.fixture
def run(kafka_trio, source_broker, tmp_path, caplog) -> Iterator[Run]:
    caplog.set_level(logging.INFO, logger="relay")
    started = Run(source_broker.bootstrap, kafka_trio, tmp_path, caplog)
    try:
        yield started
    finally:
        if started.feeder is not None:
            started.feeder.stop()
        started.relay.finish(60)
        started.source_ends.close()
        started.dest_ends.close()
        print(f"\n{started.report()}")
        for node in kafka_trio.nodes:  # every node back, for the next test
            node.launch()
        kafka_trio.wait_ready()


def assert_in_order(failures: list[str]) -> None:
    """No round failed because batches reached a leader out of sequence order."""
    assert [f for f in failures if OUT_OF_ORDER in f] == []


def test_the_preferred_leader_election_under_load(run: Run, spark) -> None:
    node = busiest_leader(run.trio, run.dst)
    restart(run.trio, node)  # its leaders moved away, and stay away after the restart
    wait(lambda: node not in leaders(run.trio, run.dst).values(), 30,
         lambda: f"leaders moved from node {node}: {leaders(run.trio, run.dst)}")  # fmt: skip
    run.feed()
    assert run.trio.elect_preferred_leaders(run.dst) > 0  # back to it, mid-stream
    wait(lambda: node in leaders(run.trio, run.dst).values(), 30,
         lambda: f"node {node} leads again: {leaders(run.trio, run.dst)}")  # fmt: skip
    run.caught_up()
    assert_in_order(run.finish(spark))


def test_a_controlled_shutdown_of_a_leader_under_load(run: Run, spark) -> None:
    node = busiest_leader(run.trio, run.dst)
    run.feed()
    run.trio.node(node).stop()  # SIGTERM: its leaders move to the two others first
    wait(lambda: node not in leaders(run.trio, run.dst).values(), 30,
         lambda: f"leaders moved from node {node}: {leaders(run.trio, run.dst)}")  # fmt: skip
    run.caught_up()  # on the two nodes left
    # back on this thread: a node gets SIGKILL when the thread that started it ends
    # (testbed.kafka's PR_SET_PDEATHSIG)
    restart(run.trio, node)
    run.caught_up()
    assert_in_order(run.finish(spark))


def test_a_rolling_restart_under_load(run: Run, spark) -> None:
    run.feed()
    for node in run.trio.nodes:
        restart(run.trio, node.node_id)
        run.caught_up()
    assert_in_order(run.finish(spark))
