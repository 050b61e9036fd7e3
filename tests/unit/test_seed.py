"""The driver's metadata handed to a worker's clients (relay.clients.seed): a seeded client knows
its leaders and API versions without a bootstrap, which is what spares the round trips. No
broker here: the clusters' addresses are closed ports, so anything that needed a bootstrap
would fail or wait."""

from __future__ import annotations

import pickle

from kafka import TopicPartition
from kafka.net.compat import KafkaNetClient
from kafka.protocol.consumer import FetchRequest

from relay.clients.consumer import SourceReader
from relay.clients.seed import Seed, seeded
from relay.clients.settings import client_settings
from relay.config import ClusterConfig
from testbed.ports import free_port


def closed_port() -> str:
    """An address nothing listens on."""
    return f"127.0.0.1:{free_port()}"


def a_seed(servers: tuple[str, ...], broker: str) -> Seed:
    host, port = broker.rsplit(":", 1)
    return Seed(
        servers=servers,
        brokers=((7, host, int(port), None),),
        cluster_id="c1",
        controller_id=7,
        topics=(("orders", None, ((0, 7, 4), (1, 7, 4))), ("audit", None, ((0, 7, 1),))),
        api_versions=((FetchRequest.API_KEY, 4, 12), (3, 0, 12), (18, 0, 3)),  # Fetch, Metadata
    )


def test_a_seeded_client_knows_leaders_epochs_and_versions_without_a_bootstrap():
    cluster = ClusterConfig(name="src", servers=(closed_port(),))
    seed = pickle.loads(pickle.dumps(a_seed(cluster.servers, "10.0.0.7:9092")))  # as shipped
    client = KafkaNetClient(**client_settings(cluster, 1.0))
    try:
        seeded(client, seed, cluster.servers)
        metadata = client.cluster
        assert metadata.partitions_for_topic("orders") == {0, 1}
        assert metadata.leader_for_partition(TopicPartition("orders", 1)) == 7
        assert metadata.leader_epoch_for_partition(TopicPartition("orders", 1)) == 4
        broker = metadata.broker_metadata(7)
        assert (broker.host, broker.port) == ("10.0.0.7", 9092)
        assert client.api_version(FetchRequest, max_version=99) == 12  # not "bootstrapped yet?"
    finally:
        client.close()


def test_a_seed_of_another_cluster_is_not_used():
    cluster = ClusterConfig(name="src", servers=(closed_port(),))
    client = KafkaNetClient(**client_settings(cluster, 1.0))
    try:
        seeded(client, a_seed(("elsewhere:9092",), "10.0.0.7:9092"), cluster.servers)
        assert client.cluster.partitions_for_topic("orders") is None
    finally:
        client.close()


def test_a_seed_cut_to_a_tasks_topics_keeps_only_those_and_needs_them_all():
    seed = a_seed(("a:1",), "10.0.0.7:9092")
    cut = seed.of(["audit"])
    assert cut is not None and [name for name, _, _ in cut.topics] == ["audit"]
    assert cut.brokers == seed.brokers and cut.api_versions == seed.api_versions
    assert seed.of(["audit", "unknown"]) is None


def test_a_seeded_consumer_opens_without_its_eager_bootstrap():
    """Unseeded, kafka-python's consumer bootstraps in its constructor: against a closed port
    that raises (after its bootstrap timeout). Seeded, it opens at once and answers from what
    it was told."""
    cluster = ClusterConfig(name="src", servers=(closed_port(),))
    reader = SourceReader(cluster, "ktm", 1.0, a_seed(cluster.servers, closed_port()))
    try:
        assert reader._consumer.partitions_for_topic("orders") == {0, 1}
    finally:
        reader.close()
