"""The bench's two clusters, of either kind (`--brokers`): one Tansu broker each (memory storage,
starts in milliseconds), or one single-node Apache Kafka 4.4 cluster each (testbed/kafka.py, full
JIT: these are measurements); and the brokers' own CPU, read apart from the contenders'.

Both kinds are started on entry and stopped on exit whatever happened; Apache Kafka's files are
removed too. Apache Kafka is warmed before the first section: its JIT compiles the produce and
fetch paths in the first seconds of traffic, which would otherwise fall on the first contender.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

import psutil
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from scripts.bench.data import Brokers, delete_topic, digest_topic, produce_dataset
from testbed.kafka import VERSIONS, KafkaCluster
from testbed.tansu import BrokerPair, TansuBroker
from testbed.topics import create_topic

BROKER_KINDS = ("tansu", "kafka")
BROKER_NAMES = {"tansu": "Tansu", "kafka": "Apache Kafka"}
KAFKA_VERSION = VERSIONS["4"]
WARM_RECORDS = 200_000  # per broker: C2 had compiled the hot paths well before (server.log)
SIDES = ("source", "destination")


class Cluster(BrokerPair[TansuBroker]):
    """One source and one destination Tansu broker, stopped on exit whatever happened."""

    kind = "tansu"

    def __init__(self, log_dir: Path):
        source = TansuBroker("bench-source", log_dir=log_dir)
        super().__init__(source, TansuBroker("bench-target", log_dir=log_dir))

    def broker_pids(self) -> dict[str, list[int]]:
        return {"source": _pids(self.source.pid), "destination": _pids(self.target.pid)}

    def fresh_target(self) -> None:
        """An empty destination broker on the same port: Tansu (memory storage) slows from
        copy to copy even with the copies' topics deleted (see measure_scale)."""
        self.target.restart()

    def fresh_source(self) -> None:
        self.source.restart()


class KafkaPair(BrokerPair[KafkaCluster]):
    """One single-node Apache Kafka cluster as the source, another as the destination, with
    the testbed's settings and the full JIT; stopped and their files removed on exit."""

    kind = "kafka"

    def __init__(self, log_dir: Path):
        source = bench_kafka("bench-source", log_dir)
        super().__init__(source, bench_kafka("bench-target", log_dir))

    def __enter__(self) -> Self:
        super().__enter__()
        try:
            for cluster in (self.source, self.target):
                warm(cluster.bootstrap)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        try:
            super().__exit__()
        finally:
            self.source.remove()
            self.target.remove()

    def broker_pids(self) -> dict[str, list[int]]:
        return {"source": nodes_pids(self.source), "destination": nodes_pids(self.target)}

    def fresh_target(self) -> None:
        """An empty destination cluster on the same port, as for Tansu: every contender of the
        scale section then starts from the same broker state (its JIT cold, for each alike)."""
        self.target.restart(empty=True)
        warm(self.target.bootstrap)

    def fresh_source(self) -> None:
        """An empty source cluster: a repeat of 10,000 partitions next to the previous one's
        topics, still being deleted, ran the broker out of file descriptors (20,000 here)."""
        self.source.restart(empty=True)
        warm(self.source.bootstrap)


def bench_kafka(name: str, log_dir: Path, size: int = 1) -> KafkaCluster:
    return KafkaCluster(name, size=size, version=KAFKA_VERSION, log_dir=log_dir, quick_jit=False)


def open_brokers(kind: str, log_dir: Path) -> Cluster | KafkaPair:
    """The pair of `kind`, not started yet (use it as a context manager)."""
    return KafkaPair(log_dir) if kind == "kafka" else Cluster(log_dir)


@contextmanager
def one_broker(kind: str, name: str, log_dir: Path) -> Iterator[tuple[str, list[int]]]:
    """A single started broker of `kind` (Apache Kafka: warmed) for the block: (bootstrap,
    pids); stopped (and its files removed) on the way out."""
    broker: TansuBroker | KafkaCluster
    if kind == "kafka":
        broker = bench_kafka(name, log_dir)
        try:
            broker.start()
            warm(broker.bootstrap)
            yield broker.bootstrap, nodes_pids(broker)
        finally:
            broker.stop()
            broker.remove()
    else:
        broker = TansuBroker(name, log_dir=log_dir).start()
        try:
            yield broker.bootstrap, _pids(broker.pid)
        finally:
            broker.stop()


def describe(kind: str) -> str:
    """The header's line about the brokers."""
    if kind == "kafka":
        return (
            f"Apache Kafka {KAFKA_VERSION} (KRaft, one node each, testbed settings, full JIT, log "
            f"on local disk; each warmed with {WARM_RECORDS:,} records), one source and one "
            "destination cluster on this machine, sharing its CPUs with the contenders"
        )
    return (
        "Tansu (memory storage), one source and one destination broker on this machine, sharing "
        "its CPUs with the contenders"
    )


def warm(bootstrap: str) -> None:
    """Produce and read back WARM_RECORDS records and commit a group's offset (which creates
    the offsets topic, otherwise the first contender's cost), then drop the topic."""
    began = time.monotonic()
    topic = create_topic(bootstrap, f"bench-warm-{uuid.uuid4().hex[:8]}", 4)
    try:
        produce_dataset(bootstrap, topic, WARM_RECORDS, 100, 4)
        digest_topic(bootstrap, topic, 4)
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=f"bench-warm-{topic}")
        try:
            consumer.commit({TopicPartition(topic, 0): OffsetAndMetadata(1, "", -1)})
        finally:
            consumer.close()
    finally:
        delete_topic(bootstrap, topic)
    print(f"  broker {bootstrap} warmed in {time.monotonic() - began:.1f} s", flush=True)


def nodes_pids(cluster: KafkaCluster) -> list[int]:
    return [pid for node in cluster.nodes if (pid := node.pid) is not None]


def _pids(pid: int | None) -> list[int]:
    return [] if pid is None else [pid]


class BrokerCpu:
    """CPU seconds (user + system) each side's broker processes have used, read with psutil on
    their pids: the brokers' work, apart from the contenders'. The pids are read once: make a
    new one after a broker restarted."""

    def __init__(self, cluster: Brokers):
        self.procs = {
            side: [psutil.Process(pid) for pid in pids]
            for side, pids in cluster.broker_pids().items()
        }

    def seconds(self) -> dict[str, float]:
        return {side: sum(_cpu(p) for p in procs) for side, procs in self.procs.items()}

    def millis(self, side: str) -> int:
        """One side's CPU ms: a `Sampler`'s read."""
        return int(sum(_cpu(p) for p in self.procs[side]) * 1000)


def _cpu(proc: psutil.Process) -> float:
    try:
        times = proc.cpu_times()
    except psutil.Error:  # gone (a restarted node): its CPU no longer counts
        return 0.0
    return times.user + times.system


def used_since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {side: after[side] - before[side] for side in before}
