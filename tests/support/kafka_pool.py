"""Apache Kafka nodes shared by the tests of one pytest worker (tests/conftest.py).

An Apache Kafka node takes seconds of two busy cores to start, where Tansu takes milliseconds;
a test that asks for a Kafka "cluster" gets a single-node cluster of this pool, started the first
time and lent out again afterwards (tests use uuid topic names, so what one test leaves does not
disturb the next). A lease is exclusive while it lasts: a test may kill, freeze, stop or restart
its nodes, and wipe them (`restart(empty=True)`); the pool brings a node it gets back in any
other state up again before lending it out.

Pool nodes accept group session timeouts from 1 s (stock: 6 s) so that the tests' short
sessions, which make a dead process's partitions move quickly, run unchanged on Kafka; the
tests of the stock minimum start a cluster of their own.
"""

from __future__ import annotations

import time
from pathlib import Path

from kafka.errors import KafkaError

from testbed.kafka import VERSIONS, KafkaCluster

POOL_SETTINGS = {
    "group.min.session.timeout.ms": "1000",
    # not the default 30 s, so a test sees ktm read it (inert on one node: no follower lags)
    "replica.lag.time.max.ms": "25000",
}

KINDS = {"kafka": VERSIONS["4"], "kafka39": VERSIONS["3.9"]}


class KafkaLease:
    """A pool node under the name a test asked for; the face of `testbed.tansu.TansuBroker`."""

    supports_kill = True

    def __init__(self, name: str, cluster: KafkaCluster):
        self.name = name
        self.cluster = cluster

    def __repr__(self) -> str:
        return f"KafkaLease({self.name!r}, {self.cluster!r})"

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    @property
    def is_running(self) -> bool:
        return self.cluster.is_running

    @property
    def pid(self) -> int | None:
        return self.cluster.pid

    @property
    def version(self) -> str:
        return self.cluster.version

    def start(self, timeout: float = 90.0) -> KafkaLease:
        self.cluster.start(timeout)
        return self

    def stop(self, grace: float = 5.0) -> None:
        self.cluster.stop(grace)

    def kill(self) -> None:
        self.cluster.kill()

    def freeze(self) -> None:
        for node in self.cluster.nodes:
            node.freeze()

    def thaw(self) -> None:
        for node in self.cluster.nodes:
            node.thaw()

    def restart(self, timeout: float = 90.0, *, empty: bool = False) -> KafkaLease:
        """kill -9 and start again: the log is kept, as on a real broker, unless `empty`."""
        self.cluster.restart(timeout, empty=empty)
        return self

    def log_tail(self, lines: int = 30) -> str:
        return self.cluster.log_tail(lines)


class KafkaPool:
    def __init__(self, log_dir: Path):
        self._log_dir = log_dir
        self._idle: dict[str, list[KafkaCluster]] = {}
        self._all: list[KafkaCluster] = []

    def lease(self, kind: str, name: str) -> KafkaLease:
        """A started single-node cluster of `kind` ("kafka", "kafka39") nobody else holds."""
        version = KINDS[kind]
        idle = self._idle.setdefault(version, [])
        if idle:
            cluster = idle.pop()
        else:
            cluster = KafkaCluster(
                f"{kind}-{len(self._all)}", version=version, log_dir=self._log_dir,
                settings=POOL_SETTINGS,
            )  # fmt: skip
            self._all.append(cluster)
        _make_ready(cluster)
        return KafkaLease(name, cluster)

    def give_back(self, lease: KafkaLease) -> None:
        self._idle.setdefault(lease.cluster.version, []).append(lease.cluster)

    def close(self) -> None:
        for cluster in self._all:
            cluster.remove()


def _make_ready(cluster: KafkaCluster) -> None:
    """Up and answering, whatever its last test left: frozen, stopped or killed."""
    for node in cluster.nodes:
        node.thaw()
    if not all(node.is_running for node in cluster.nodes):
        cluster.start()
    _warm_group_coordinator(cluster)


def _warm_group_coordinator(cluster: KafkaCluster, timeout: float = 60.0) -> None:
    """A fresh (or wiped) broker creates `__consumer_offsets` at its first group request, which
    takes seconds of a busy machine; a test whose config allows one retry would give up on
    NotCoordinator meanwhile. Asked once here, the topic is there before the test starts."""
    deadline = time.monotonic() + timeout
    admin = cluster.admin()
    try:
        while True:
            try:
                admin.list_group_offsets("ktm-testbed-warm-up")
                return
            except KafkaError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        admin.close()
